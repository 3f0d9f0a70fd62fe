// TensorView and Tensor: strides, layouts read from strides, descriptions used in messages,
// layout conversion, and the CPU-only build's answer for CUDA tensors; the CPU parallel loop
// every op runs on.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
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
  c.num_threads = 64;  // up to the floor of the cap, a request is taken as it is on any machine
  EXPECT_EQ(c.resolved_threads(), 64);
}

TEST(Context, HugeThreadCountsAreCapped) {
  const unsigned hc = std::thread::hardware_concurrency();
  const int cap = std::max(64, 4 * static_cast<int>(std::max(hc, 1u)));
  Context c;
  for (int n : {cap, cap + 1, 1 << 20, std::numeric_limits<int>::max()}) {
    c.num_threads = n;
    EXPECT_EQ(c.resolved_threads(), std::min(n, cap)) << n << " threads asked";
  }
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

// ---------------------------------------------------------------------------------------------
// Extents that do not fit (issue 14): every count, span and byte size is overflow-checked.

constexpr std::int64_t k2p60 = std::int64_t{1} << 60;
constexpr std::int64_t k2p61 = std::int64_t{1} << 61;
constexpr std::int64_t k2p62 = std::int64_t{1} << 62;

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "expected a detops::Error";
  return ErrorCode::kCudaError;
}

/// A 4-d float32 view over `buf` built by assigning the fields (no constructor checks).
TensorView raw_view(void* buf, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  TensorView v;
  v.data = buf;
  v.dtype = DType::kFloat32;
  v.rank = 4;
  const std::int64_t sz[4] = {n, c, h, w};
  const std::int64_t st[4] = {c * h * w, h * w, w, 1};  // small factors: no overflow here
  std::copy(sz, sz + 4, v.sizes);
  std::copy(st, st + 4, v.strides);
  return v;
}

// Old code: 2^61 + 1 times 8 wrapped to 8 elements, a 32-byte allocation.
TEST(TensorExtent, ElementCountOverflowIsAnErrorFromEmpty) {
  for (auto sizes : {std::vector<std::int64_t>{k2p61 + 1, 8, 1, 1}, std::vector<std::int64_t>{k2p62, 8, 1, 1}}) {
    try {
      Tensor::empty(sizes, DType::kFloat32);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("Tensor::empty"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(sizes[0])), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(code_of([] { Tensor::zeros({k2p61 + 1, 8, 1, 1}, DType::kFloat32); }), ErrorCode::kInvalidArgument);
  // A zero size does not hide an overflowing product of the others.
  EXPECT_EQ(code_of([] { Tensor::empty({0, k2p62, 4}, DType::kFloat32); }), ErrorCode::kInvalidArgument);
  // The count fits but the bytes do not: 2^62 float32 = 2^64 bytes.
  EXPECT_EQ(code_of([] { Tensor::empty({k2p62}, DType::kFloat32); }), ErrorCode::kInvalidArgument);
}

// 2^60 float32 = 2^62 bytes: a valid shape that no machine can allocate (old code: std::bad_alloc).
TEST(TensorExtent, AnAllocationThatFailsIsOutOfMemory) {
  try {
    Tensor::empty({k2p60}, DType::kFloat32);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("4611686018427387904 bytes on cpu"), std::string::npos) << e.what();
  }
}

TEST(TensorExtent, NumelAndSpanBytesThrowInsteadOfWrapping) {
  std::vector<float> buf(64);
  TensorView v = raw_view(buf.data(), 1, 1, 1, 1);
  v.sizes[0] = k2p61 + 1;
  v.sizes[1] = 8;
  EXPECT_EQ(code_of([&] { (void)v.numel(); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { (void)v.span_bytes(); }), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(v.describe().empty());
  EXPECT_FALSE(v.is_contiguous());
  TensorView s = raw_view(buf.data(), 2, 2, 1, 1);
  s.strides[0] = k2p62;
  s.strides[1] = k2p62;
  EXPECT_EQ(s.numel(), 4);
  EXPECT_EQ(code_of([&] { (void)s.span_bytes(); }), ErrorCode::kInvalidArgument);
  s.rank = kMaxRank + 3;  // assigned directly: nothing may read past the arrays
  EXPECT_EQ(code_of([&] { (void)s.numel(); }), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_NE(s.describe().find("rank 9"), std::string::npos) << s.describe();
}

/// Runs roi_align_forward, roi_align_backward and frozen_batch_norm_forward with `bad` as the
/// feature map / grad_input / x and expects kInvalidArgument naming `needle`.
void expect_ops_reject(const TensorView& bad, const std::string& needle) {
  Tensor rois = test::make_tensor({1, 5}, DType::kFloat32, {0, 0, 0, 1, 1});
  Tensor out = Tensor::zeros({1, 8, 2, 2}, DType::kFloat32);
  Tensor scale = Tensor::zeros({8}, DType::kFloat32), shift = Tensor::zeros({8}, DType::kFloat32);
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 2;
  o.sampling_ratio = 1;
  auto check = [&](const char* op, const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << op << " accepted " << bad.describe();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  check("roi_align_forward", [&] { roi_align_forward(bad, rois, out, o); });
  for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kExact}) {
    RoiAlignBackwardOptions b;
    b.mode = m;
    check("roi_align_backward", [&] { roi_align_backward(out, rois, bad, o, b); });
  }
  check("frozen_batch_norm_forward", [&] { frozen_batch_norm_forward(bad, scale, shift, bad); });
}

TEST(TensorExtent, OpsRejectViewsWhoseCountOverflows) {
  std::vector<float> buf(64, 0.0f);  // what the old code read and wrote far beyond
  TensorView v = raw_view(buf.data(), 1, 8, 1, 1);
  v.sizes[0] = k2p61 + 1;  // 8 * (2^61 + 1) wraps to 8
  expect_ops_reject(v, "more elements than int64 counts");
  v.sizes[0] = k2p62;  // wraps to 0: the old FrozenBatchNorm2d silently did nothing
  expect_ops_reject(v, "more elements than int64 counts");
}

TEST(TensorExtent, OpsRejectViewsWhoseSpanOverflows) {
  std::vector<float> buf(64, 0.0f);
  TensorView v = raw_view(buf.data(), 2, 8, 1, 1);
  v.strides[0] = k2p62;  // (2^62 + 7 + 1) * 4 bytes
  expect_ops_reject(v, "spans more than 2^63 - 1 bytes");
}

TEST(TensorExtent, OpsRejectViewsThatWrapTheAddressSpace) {
  TensorView v = raw_view(nullptr, 1, 8, 1, 1);
  v.data = reinterpret_cast<void*>(UINTPTR_MAX - 15);  // 32 bytes from 16 below the top
  expect_ops_reject(v, "past the end of the address space");
  EXPECT_EQ(code_of([&] { TensorView(v.data, DType::kFloat32, Device::cpu(), {1, 8, 1, 1}); }),
            ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Shapes at run time: every constructor checks the same rules.

TEST(TensorView, EveryConstructorBuildsTheSameView) {
  std::vector<float> buf(2 * 3 * 4);
  const std::vector<std::int64_t> sz = {2, 3, 4}, st = {12, 4, 1}, padded = {16, 4, 1};
  const TensorView a(buf.data(), DType::kFloat32, Device::cpu(), {2, 3, 4});
  const TensorView b(buf.data(), DType::kFloat32, Device::cpu(), sz);
  const TensorView c(buf.data(), DType::kFloat32, Device::cpu(), sz, st);
  const TensorView d(buf.data(), DType::kFloat32, Device::cpu(), 3, sz.data());
  const TensorView e(buf.data(), DType::kFloat32, Device::cpu(), 3, sz.data(), st.data());
  for (const TensorView* v : {&b, &c, &d, &e}) {
    EXPECT_EQ(v->describe(), a.describe());
    EXPECT_EQ(v->numel(), 24);
    EXPECT_TRUE(v->is_contiguous());
  }
  const TensorView f(buf.data(), DType::kFloat32, Device::cpu(), 3, sz.data(), padded.data());
  EXPECT_EQ(f.describe(), "[2, 3, 4] float32 cpu (strides [16, 4, 1])");
  EXPECT_EQ(f.span_bytes(), (16 + 8 + 3 + 1) * 4);
  const TensorView scalar(buf.data(), DType::kFloat32, Device::cpu(), 0, nullptr);
  EXPECT_EQ(scalar.numel(), 1);
  // Braced lists pick the initializer_list overloads, {0} included (not rank 4 with null sizes).
  const TensorView broadcast(buf.data(), DType::kFloat32, Device::cpu(), {4}, {0});
  EXPECT_EQ(broadcast.describe(), "[4] float32 cpu (strides [0])");
}

TEST(TensorView, EveryConstructorRejectsInvalidShapes) {
  float x = 0;
  void* p = &x;
  const auto f32 = DType::kFloat32;
  const Device cpu = Device::cpu();
  const std::vector<std::int64_t> seven(7, 1), neg = {2, -1}, two = {2, 2}, negst = {1, -1}, one = {1};
  const std::int64_t huge[2] = {k2p61 + 1, 8}, big_st[2] = {k2p62, k2p62};
  const std::vector<std::function<void()>> bad = {
      [&] { TensorView(p, f32, cpu, seven); },
      [&] { TensorView(p, f32, cpu, seven, seven); },
      [&] { TensorView(p, f32, cpu, 7, seven.data()); },
      [&] { TensorView(p, f32, cpu, -1, nullptr); },
      [&] { TensorView(p, f32, cpu, 2, nullptr); },
      [&] { TensorView(p, f32, cpu, {1, 1, 1, 1, 1, 1, 1}); },
      [&] { TensorView(p, f32, cpu, neg); },
      [&] { TensorView(p, f32, cpu, {2, -1}); },
      [&] { TensorView(p, f32, cpu, 2, neg.data()); },
      [&] { TensorView(p, f32, cpu, two, negst); },  // negative strides are rejected
      [&] { TensorView(p, f32, cpu, {2, 2}, {1, -1}); },
      [&] { TensorView(p, f32, cpu, 2, two.data(), negst.data()); },
      [&] { TensorView(p, f32, cpu, two, one); },  // one stride for two sizes
      [&] { TensorView(p, f32, cpu, {2, 2}, {1}); },
      [&] { TensorView(p, f32, cpu, 2, huge); },
      [&] { TensorView(p, f32, cpu, {k2p61 + 1, 8}); },
      [&] { TensorView(p, f32, cpu, std::vector<std::int64_t>(huge, huge + 2)); },
      [&] { TensorView(p, f32, cpu, 2, two.data(), big_st); },
      [&] { TensorView(p, f32, cpu, {2, 2}, {k2p62, k2p62}); },
      [&] { TensorView(p, f32, cpu, two, std::vector<std::int64_t>(big_st, big_st + 2)); },
      [&] { Tensor::empty(seven, f32); },
      [&] { Tensor::empty(neg, f32); },
      [&] { Tensor::zeros(neg, f32); },
      [&] { Tensor::empty({1, 1, 1, 1, 1, 1, 1}, f32); },
  };
  for (std::size_t i = 0; i < bad.size(); ++i) EXPECT_EQ(code_of(bad[i]), ErrorCode::kInvalidArgument) << "case " << i;
  // A null data pointer is a shape only: allowed by the constructors (the ops reject it).
  EXPECT_EQ(TensorView(nullptr, f32, cpu, two).numel(), 4);
}

TEST(Tensor, EmptyAndZerosFromAVector) {
  const std::vector<std::int64_t> sz = {2, 3, 4, 5};
  Tensor a = Tensor::empty(sz, DType::kFloat16, Device::cpu(), Layout::kNHWC);
  EXPECT_EQ(a.view().layout(), Layout::kNHWC);
  EXPECT_EQ(a.nbytes(), 240u);
  Tensor z = Tensor::zeros(sz, DType::kFloat32);
  EXPECT_TRUE(z.view().is_contiguous());
  for (double v : test::to_vector(z)) EXPECT_EQ(v, 0.0);
  Tensor b = Tensor::empty({2, 3}, DType::kFloat32);  // a braced list still picks the initializer_list overload
  EXPECT_EQ(b.numel(), 6);
  Tensor e = Tensor::empty(std::vector<std::int64_t>{}, DType::kFloat64);
  EXPECT_EQ(e.numel(), 1);
  EXPECT_EQ(e.nbytes(), 8u);
}

// Tensor::empty with DType(200) once returned a 16-byte tensor (4-byte elements assumed): every
// enumeration the caller hands over is checked.
TEST(Tensor, ValuesOutsideTheEnumerationsAreRejected) {
  auto message_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const DType bad_dtype = static_cast<DType>(200);
  const Device bad_device{static_cast<DeviceType>(7), 0};
  const Layout bad_layout = static_cast<Layout>(9);
  EXPECT_EQ(message_of([&] { Tensor::empty({2, 2}, bad_dtype); }),
            "Tensor::empty: dtype is 200, not a DType; expected float32, float64, float16, bfloat16, int32 or int64");
  EXPECT_EQ(message_of([&] { Tensor::zeros(std::vector<std::int64_t>{2, 2}, static_cast<DType>(6)); }),
            "Tensor::empty: dtype is 6, not a DType; expected float32, float64, float16, bfloat16, int32 or int64");
  EXPECT_EQ(message_of([&] { Tensor::empty({2, 2}, DType::kFloat32, bad_device); }),
            "Tensor::empty: device type is 7, not a DeviceType; expected cpu or cuda");
  EXPECT_EQ(message_of([&] { Tensor::empty({1, 2, 3, 4}, DType::kFloat32, Device::cpu(), bad_layout); }),
            "Tensor::empty: layout is 9, not a Layout; expected NCHW or NHWC");
  Tensor t = Tensor::zeros({1, 2, 3, 4}, DType::kFloat32);
  EXPECT_EQ(message_of([&] { (void)t.contiguous(bad_layout); }),
            "Tensor::empty: layout is 9, not a Layout; expected NCHW or NHWC");
  EXPECT_EQ(message_of([&] { (void)t.to(bad_device); }),
            "Tensor::to: device type is 7, not a DeviceType; expected cpu or cuda");
  std::int64_t strides[4];
  const std::int64_t sizes[4] = {1, 2, 3, 4};
  EXPECT_EQ(message_of([&] { contiguous_strides(4, sizes, strides, bad_layout); }),
            "contiguous_strides: layout is 9, not a Layout; expected NCHW or NHWC");
  float cell = 0;
  EXPECT_EQ(message_of([&] { (void)TensorView(&cell, bad_dtype, Device::cpu(), {1}); }),
            "TensorView: dtype is 200, not a DType; expected float32, float64, float16, bfloat16, int32 or int64");
  EXPECT_EQ(message_of([&] { (void)TensorView(&cell, DType::kFloat32, bad_device, {1}); }),
            "TensorView: device type is 7, not a DeviceType; expected cpu or cuda");
  // a view whose fields were assigned: the op's own check
  Tensor yt = Tensor::zeros({1, 2, 3, 4}, DType::kFloat32);
  TensorView x = t.view(), y = yt.view();
  Tensor scale = Tensor::zeros({2}, DType::kFloat32), shift = Tensor::zeros({2}, DType::kFloat32);
  x.device = bad_device;
  EXPECT_EQ(message_of([&] { frozen_batch_norm_forward(x, scale, shift, y); }),
            "frozen_batch_norm_forward: x has device type 7, not a DeviceType; expected cpu or cuda");
}

// A caller's allocator that throws std::bad_alloc (operator new inside it) once passed it through;
// the default allocator's kOutOfMemory did not name the op. Both are kOutOfMemory naming the op.
TEST(Context, AllocatorFailuresAreOutOfMemoryNamingTheOp) {
  struct Throwing final : Allocator {
    bool as_error = false;
    void* allocate(std::size_t bytes, Device, void*) override {
      if (as_error)  // as default_allocator() reports a failure
        throw Error(ErrorCode::kOutOfMemory, "workspace: cannot allocate " + std::to_string(bytes) + " bytes on the CPU");
      throw std::bad_alloc();
    }
    void deallocate(void*, std::size_t, Device, void*) override {}
  } alloc;
  Tensor input = Tensor::zeros({1, 2, 5, 5}, DType::kFloat32), weight = Tensor::zeros({3, 2, 3, 3}, DType::kFloat32);
  Tensor offset = Tensor::zeros({1, 18, 3, 3}, DType::kFloat32), output = Tensor::zeros({1, 3, 3, 3}, DType::kFloat32);
  output.fill_bytes(0xA5);
  const Tensor before = output.to(Device::cpu());
  Context ctx;
  ctx.allocator = &alloc;
  const std::size_t need = deform_conv2d_forward_workspace_size(input, weight, offset, {}, {}, output, {});
  for (bool as_error : {false, true}) {
    alloc.as_error = as_error;
    try {
      deform_conv2d_forward(input, weight, offset, {}, {}, output, {}, ctx);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
      const std::string want = fmt::format("deform_conv2d_forward: workspace: cannot allocate {} bytes on {}", need,
                                           as_error ? "the CPU" : "cpu: the allocator threw std::bad_alloc");
      EXPECT_EQ(std::string(e.what()), want);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a detops::Error: " << e.what();
    }
  }
  EXPECT_TRUE(test::same_bytes(output, before));
}

TEST(Context, NegativeNumThreadsIsAnError) {
  Context c;
  c.num_threads = -3;
  try {
    (void)c.resolved_threads();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "Context: num_threads is -3; expected 0 (all cores) or a positive count");
  }
  Tensor x = Tensor::zeros({1, 2, 3, 3}, DType::kFloat32), y = Tensor::zeros({1, 2, 3, 3}, DType::kFloat32);
  Tensor scale = Tensor::zeros({2}, DType::kFloat32), shift = Tensor::zeros({2}, DType::kFloat32);
  EXPECT_EQ(code_of([&] { frozen_batch_norm_forward(x, scale, shift, y, FrozenBnEpilogue::kNone, {}, c); }),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace detops
