// TensorView and Tensor: strides, layouts read from strides, descriptions used in messages,
// layout conversion, and the CPU-only build's answer for CUDA tensors; the CPU parallel loop
// every op runs on.
#include <gtest/gtest.h>

#include <atomic>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "detops/detops.h"
#include "internal/common.h"
#include "test_util.h"

namespace detops {
namespace {

TEST(Tensor, ContiguousAndChannelsLastStrides) {
  Tensor a = Tensor::empty({2, 3, 4, 5}, DType::kFloat32);
  EXPECT_EQ(a.view().strides[0], 60);
  EXPECT_EQ(a.view().strides[3], 1);
  EXPECT_EQ(a.view().layout(), Layout::kNCHW);
  EXPECT_TRUE(a.view().is_contiguous());
  Tensor b = Tensor::empty({2, 3, 4, 5}, DType::kFloat16, Device::cpu(), Layout::kNHWC);
  EXPECT_EQ(b.view().strides[1], 1);
  EXPECT_EQ(b.view().strides[3], 3);
  EXPECT_EQ(b.view().strides[2], 15);
  EXPECT_EQ(b.view().strides[0], 60);
  EXPECT_EQ(b.view().layout(), Layout::kNHWC);
  EXPECT_FALSE(b.view().is_contiguous());
  EXPECT_EQ(b.nbytes(), 240u);
  EXPECT_EQ(b.view().span_bytes(), 240);
}

TEST(Tensor, LayoutConversionKeepsValues) {
  const std::vector<double> v = test::random_values(2 * 3 * 4 * 5, 1);
  Tensor a = test::make_tensor({2, 3, 4, 5}, DType::kFloat32, v);
  Tensor b = a.contiguous(Layout::kNHWC);
  EXPECT_EQ(b.view().layout(), Layout::kNHWC);
  EXPECT_EQ(test::to_vector(a), test::to_vector(b));
  EXPECT_TRUE(test::same_bytes(a, b.contiguous(Layout::kNCHW)));
}

TEST(Tensor, DescribeNamesShapeDtypeDeviceStrides) {
  Tensor a = Tensor::empty({1, 2}, DType::kBFloat16);
  EXPECT_EQ(a.view().describe(), "[1, 2] bfloat16 cpu (strides [2, 1])");
  EXPECT_EQ(to_string(Device::cuda(3)), "cuda:3");
}

TEST(Tensor, EmptyTensorsAndAbsentViews) {
  Tensor z = Tensor::empty({0, 5}, DType::kFloat32);
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.view().span_bytes(), 0);
  TensorView absent;
  EXPECT_FALSE(absent.defined());
  EXPECT_THROW(Tensor::empty({-1}, DType::kFloat32), Error);
}

TEST(Tensor, CudaTensorsWithoutCudaAreAClearError) {
  if (cuda_compiled()) GTEST_SKIP() << "CUDA backend compiled: covered by the CUDA tests";
  try {
    Tensor::empty({4}, DType::kFloat32, Device::cuda(0));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotCompiled);
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos);
  }
}

// cuda_unavailable_reason() says why there is no device, and is empty exactly when there is one.
TEST(Context, CudaUnavailableReasonExplainsAZeroDeviceCount) {
  const std::string why = cuda_unavailable_reason();
  EXPECT_EQ(why.empty(), cuda_device_count() > 0) << why;
  if (!cuda_compiled()) {
    EXPECT_NE(why.find("no CUDA backend"), std::string::npos) << why;
  } else if (cuda_device_count() == 0) {
    EXPECT_NE(why.find("cudaGetDeviceCount"), std::string::npos) << why;  // the runtime's own words
  }
}

TEST(Context, ResolvedThreads) {
  Context c;
  EXPECT_GE(c.resolved_threads(), 1);
  c.num_threads = 3;
  EXPECT_EQ(c.resolved_threads(), 3);
}

// A thread starter that refuses after `allowed` threads, as std::thread does at a resource limit.
// With late_throw it throws after starting that thread (a starter that fails on its way out).
struct StartAtMost {
  int allowed;
  bool bad_alloc = false;
  bool late_throw = false;
  int started = 0;
  template <class Fn>
  void operator()(std::vector<std::thread>& pool, Fn&& fn) {
    if (started == allowed) {
      if (late_throw) {
        ++started;
        pool.emplace_back(std::forward<Fn>(fn));
        throw 42;  // not even a std::exception
      }
      if (bad_alloc) throw std::bad_alloc();
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    }
    ++started;
    pool.emplace_back(std::forward<Fn>(fn));
  }
};

TEST(ParallelFor, ChunksOfThreadsThatCannotStartRunOnTheCaller) {
  constexpr std::int64_t n = 1000;
  for (const int failure : {0, 1, 2})
    for (int allowed = 0; allowed <= 4; ++allowed) {
      std::vector<std::atomic<int>> hits(n);
      StartAtMost start{allowed, failure == 1, failure == 2};
      internal::parallel_for_with(start, n, 1, 5, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
      });
      EXPECT_EQ(start.started, allowed + (failure == 2 && allowed < 4 ? 1 : 0));
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << i << " " << allowed;
    }
}

TEST(ParallelFor, AnErrorOfAnyChunkReachesTheCallerAfterEveryChunkRan) {
  for (int allowed : {0, 2, 4}) {
    std::atomic<int> ran{0};
    StartAtMost start{allowed};
    EXPECT_THROW(internal::parallel_for_with(start, 5, 1, 5,
                                             [&](std::int64_t b, std::int64_t) {
                                               ran++;
                                               if (b == 3) throw std::runtime_error("chunk 3");
                                             }),
                 std::runtime_error);
    EXPECT_EQ(ran.load(), 5);
  }
}

}  // namespace
}  // namespace detops
