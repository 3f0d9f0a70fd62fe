// SyncBatchNorm on CUDA against the CPU backend (label gpu). Plain C++ over the public API,
// built in every configuration; every test skips with a message when no CUDA device is present.
//   - one-call forward and backward, one rank (communicator nullptr) and two ranks of a
//     ThreadGroup (each thread its own half of the batch): y, save_mean, save_invstd, the running
//     statistics, num_batches_tracked, grad_x, grad_weight and grad_bias are the same bytes on the
//     CUDA device as on the CPU, for every dtype, NCHW / NHWC / a strided view, both modes, on
//     shapes with one partial chunk per image, many chunks, H*W = 1, and no element at all;
//   - the phases: the local records (forward and backward) and the exact mode's exponents are
//     the same int64 words on both;
//   - the one-call path with every rank on a non-blocking stream of its own: the same bytes;
//   - the one-call path with caller workspaces of the queried sizes: the same bytes, no
//     allocator call; a workspace one byte short is rejected.
// Selected for compute-sanitizer by the gpu preset (cmake/DetopsGpuCheck.cmake):
// gpu-check sanitizer: All/SyncBnCuda.ForwardAndBackwardEqualCpuBitwise/float32_nhwc_exact:All/SyncBnCuda.ForwardAndBackwardEqualCpuBitwise/bfloat16_strided_default:All/SyncBnCuda.RecordsEqualCpuBitwise/float64_nchw_exact

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_stream.h"
#include "detops/communicator.h"
#include "detops/sync_batch_norm.h"
#include "gpu_test.h"
#include "sync_batch_norm_test_util.h"
#include "test_util.h"

namespace detops {

namespace {

using namespace test::sync_bn;

// One partial chunk per image (221 positions), H*W = 1, an empty image, an odd number of chunks
// per channel (3 per image, the last partial), and a backbone-sized map (13 chunks per image).
constexpr Shape kShapes[] = {{2, 64, 13, 17}, {3, 5, 1, 1}, {1, 3, 0, 4}, {5, 4, 17, 31}, {4, 32, 56, 56}};

/// A 4-d view into a 1-d storage poisoned with 0xCD, on the CPU or the device (make_buf picks
/// the layout's strides).
using Buf = test::StridedBuf;

/// Writes NCHW-ordered values into a CPU view (any strides), rounding to its dtype.
void fill_view(const TensorView& v, const std::vector<double>& values) {
  const std::int64_t N = v.sizes[0], C = v.sizes[1], H = v.sizes[2], W = v.sizes[3];
  std::size_t k = 0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t w = 0; w < W; ++w, ++k) {
          const std::int64_t o = n * v.strides[0] + c * v.strides[1] + h * v.strides[2] + w * v.strides[3];
          const double x = values[k];
          switch (v.dtype) {
            case DType::kFloat32: static_cast<float*>(v.data)[o] = static_cast<float>(x); break;
            case DType::kFloat64: static_cast<double*>(v.data)[o] = x; break;
            case DType::kFloat16: static_cast<Half*>(v.data)[o] = from_double<Half>(x); break;
            case DType::kBFloat16: static_cast<BFloat16*>(v.data)[o] = from_double<BFloat16>(x); break;
            default: break;
          }
        }
}

/// Byte equality of a CPU tensor and a tensor on any device; names the first differing word.
::testing::AssertionResult same_bytes(const Tensor& cpu, const Tensor& other, const std::string& what) {
  const Tensor back = other.to(Device::cpu());
  if (back.nbytes() != cpu.nbytes()) return ::testing::AssertionFailure() << what << ": sizes differ";
  if (cpu.nbytes() == 0 || std::memcmp(back.view().data, cpu.view().data, cpu.nbytes()) == 0)
    return ::testing::AssertionSuccess();
  const auto* a = static_cast<const unsigned char*>(cpu.view().data);
  const auto* b = static_cast<const unsigned char*>(back.view().data);
  std::size_t first = 0, differ = 0;
  const std::size_t es = dtype_size(cpu.view().dtype);
  for (std::size_t i = 0; i < cpu.nbytes(); i += es)
    if (std::memcmp(a + i, b + i, es) != 0) {
      if (differ++ == 0) first = i / es;
    }
  auto f = ::testing::AssertionFailure() << what << ": " << differ << " of " << cpu.nbytes() / es
                                         << " elements differ; first at " << first;
  if (cpu.view().dtype == DType::kFloat64) {
    double x, y;
    std::memcpy(&x, a + first * 8, 8);
    std::memcpy(&y, b + first * 8, 8);
    char buf[96];
    std::snprintf(buf, sizeof buf, " (cpu %.17g, cuda %.17g)", x, y);
    f << buf;
  } else if (cpu.view().dtype == DType::kInt64) {
    long long x, y;
    std::memcpy(&x, a + first * 8, 8);
    std::memcpy(&y, b + first * 8, 8);
    f << " (cpu " << x << ", cuda " << y << ")";
  }
  return f;
}

Tensor vec(const std::vector<double>& v, DType dt, Device dev) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, dt, Device::cpu());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kFloat64) t.data<double>()[i] = v[i];
    else t.data<float>()[i] = static_cast<float>(v[i]);
  }
  return dev.is_cpu() ? std::move(t) : t.to(dev);
}

Tensor batches(std::int64_t value, Device dev) {
  Tensor t = Tensor::empty({1}, DType::kInt64, Device::cpu());
  t.data<std::int64_t>()[0] = value;
  return dev.is_cpu() ? std::move(t) : t.to(dev);
}

/// Inputs of one problem, on the CPU (the device copies are made from these bytes).
struct Problem {
  Shape s;
  DType dt, pdt;
  Lay lay;
  Buf x, gy;
  std::vector<double> weight, bias, running_mean, running_var;
};

Problem make_problem(const Shape& s, DType dt, Lay lay, std::uint64_t seed) {
  Problem p;
  p.s = s;
  p.dt = dt;
  p.pdt = dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  p.lay = lay;
  const std::size_t n = static_cast<std::size_t>(s.N * s.C * s.H * s.W), C = static_cast<std::size_t>(s.C);
  p.x = make_buf(s, dt, lay, Device::cpu());
  p.gy = make_buf(s, dt, lay, Device::cpu());
  // An offset mean per channel makes the two-pass moments matter; grad_y is centred.
  std::vector<double> xv = test::random_values(n, seed, -3, 3);
  const std::vector<double> off = test::random_values(C, seed + 1, -5, 5);
  for (std::size_t i = 0; i < n; ++i) xv[i] += off[(i / static_cast<std::size_t>(s.H * s.W)) % C];
  fill_view(p.x.view, xv);
  fill_view(p.gy.view, test::random_values(n, seed + 2, -1, 1));
  p.weight = test::random_values(C, seed + 3, 0.5, 2);
  p.bias = test::random_values(C, seed + 4, -1, 1);
  p.running_mean = test::random_values(C, seed + 5, -0.5, 0.5);
  p.running_var = test::random_values(C, seed + 6, 0.5, 1.5);
  return p;
}

/// One rank's outputs (tensors on the run's device).
struct RankOut {
  Tensor save_mean, save_invstd, running_mean, running_var, num_batches, grad_weight, grad_bias;
};
struct RunOut {
  Buf y, gx;
  std::vector<RankOut> ranks;
};

/// Forward then backward over `ranks` ranks (1: communicator nullptr; otherwise a ThreadGroup,
/// rank r taking images [N r / ranks, N (r + 1) / ranks)) on `dev`; with `own_streams` each rank
/// runs on a non-blocking stream of its own (Context::cuda_stream), waited for at its end.
/// Counts the allocations it forwards to the default allocator.
class CountingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device, void* stream) override {
    ++count;
    return default_allocator().allocate(bytes, device, stream);
  }
  void deallocate(void* ptr, std::size_t bytes, Device device, void* stream) override {
    default_allocator().deallocate(ptr, bytes, device, stream);
  }
  std::atomic<int> count{0};
};

/// A workspace of `bytes` on `dev`, 8 bytes past the start of a device allocation.
struct DeviceWorkspace {
  Tensor storage;
  Workspace ws;
  DeviceWorkspace(std::size_t bytes, Device dev)
      : storage(Tensor::empty({static_cast<std::int64_t>(bytes / 8 + 2)}, DType::kInt64, dev)),
        ws{static_cast<unsigned char*>(storage.view().data) + 8, bytes} {}
};

/// With `caller_workspace`, the one-call directions get workspaces of the queried sizes and the
/// allocator is expected never to be called.
RunOut run(const Problem& p, Device dev, int ranks, const SyncBnOptions& opts, bool own_streams = false,
           bool caller_workspace = false) {
  RunOut out;
  const Buf x = p.x.to(dev), gy = p.gy.to(dev);
  out.y = make_buf(p.s, p.dt, p.lay, dev);
  out.gx = make_buf(p.s, p.dt, p.lay, dev);
  const std::int64_t C = p.s.C;
  const Tensor weight = vec(p.weight, p.pdt, dev), bias = vec(p.bias, p.pdt, dev);
  out.ranks.resize(static_cast<std::size_t>(ranks));
  for (RankOut& r : out.ranks) {
    r.save_mean = Tensor::zeros({C}, DType::kFloat64, dev);
    r.save_invstd = Tensor::zeros({C}, DType::kFloat64, dev);
    r.running_mean = vec(p.running_mean, p.pdt, dev);
    r.running_var = vec(p.running_var, p.pdt, dev);
    r.num_batches = batches(3, dev);
    r.grad_weight = Tensor::zeros({C}, p.pdt, dev);
    r.grad_bias = Tensor::zeros({C}, p.pdt, dev);
  }
  auto body = [&](int rank, Communicator* comm) {
    const std::int64_t n0 = p.s.N * rank / ranks, n1 = p.s.N * (rank + 1) / ranks;
    RankOut& r = out.ranks[static_cast<std::size_t>(rank)];
    SyncBnParams params;
    params.weight = weight;
    params.bias = bias;
    params.running_mean = r.running_mean;
    params.running_var = r.running_var;
    params.num_batches_tracked = r.num_batches;
    std::optional<test::NonBlockingStream> stream;
    Context ctx;
    if (own_streams && dev.is_cuda()) {
      stream.emplace();
      ASSERT_TRUE(stream->ok()) << "cudaStreamCreateWithFlags failed";
      ctx.cuda_stream = stream->get();
    }
    CountingAllocator counting;
    std::optional<DeviceWorkspace> fw, bw;
    if (caller_workspace) {
      ctx.allocator = &counting;
      fw.emplace(sync_batch_norm_forward_workspace_size(x.images(n0, n1), comm, opts), dev);
      bw.emplace(sync_batch_norm_backward_workspace_size(x.images(n0, n1), out.gx.images(n0, n1), comm, opts), dev);
    }
    sync_batch_norm_forward(x.images(n0, n1), params, out.y.images(n0, n1), r.save_mean, r.save_invstd, comm, opts,
                            ctx, fw ? fw->ws : Workspace{});
    sync_batch_norm_backward(gy.images(n0, n1), x.images(n0, n1), weight, r.save_mean, r.save_invstd,
                             out.gx.images(n0, n1), r.grad_weight, r.grad_bias, comm, opts, ctx,
                             bw ? bw->ws : Workspace{});
    if (caller_workspace) {
      EXPECT_EQ(counting.count.load(), 0) << "rank " << rank << ": the allocator was called despite a workspace";
    }
    if (stream) {
      EXPECT_TRUE(stream->synchronize()) << "rank " << rank;
    }
  };
  if (ranks == 1) {
    body(0, nullptr);
    return out;
  }
  ThreadGroup group(ranks, std::chrono::seconds(120));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Communicator> comm = group.communicator(r);
        body(r, comm.get());
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        group.abort("rank " + std::to_string(r) + " failed");
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

void expect_same_run(const RunOut& cpu, const RunOut& gpu) {
  EXPECT_TRUE(same_bytes(cpu.y.storage, gpu.y.storage, "y (whole storage)"));
  EXPECT_TRUE(same_bytes(cpu.gx.storage, gpu.gx.storage, "grad_x (whole storage)"));
  ASSERT_EQ(cpu.ranks.size(), gpu.ranks.size());
  for (std::size_t r = 0; r < cpu.ranks.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    const RankOut &a = cpu.ranks[r], &b = gpu.ranks[r];
    EXPECT_TRUE(same_bytes(a.save_mean, b.save_mean, "save_mean"));
    EXPECT_TRUE(same_bytes(a.save_invstd, b.save_invstd, "save_invstd"));
    EXPECT_TRUE(same_bytes(a.running_mean, b.running_mean, "running_mean"));
    EXPECT_TRUE(same_bytes(a.running_var, b.running_var, "running_var"));
    EXPECT_TRUE(same_bytes(a.num_batches, b.num_batches, "num_batches_tracked"));
    EXPECT_TRUE(same_bytes(a.grad_weight, b.grad_weight, "grad_weight"));
    EXPECT_TRUE(same_bytes(a.grad_bias, b.grad_bias, "grad_bias"));
  }
}

using Param = std::tuple<DType, Lay, SyncBnMode>;
class SyncBnCuda : public ::testing::TestWithParam<Param> {};

TEST_P(SyncBnCuda, ForwardAndBackwardEqualCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  const auto [dt, lay, mode] = GetParam();
  std::uint64_t seed = 7000;
  int index = 0;
  for (const Shape& s : kShapes) {
    seed += 10;
    const Problem p = make_problem(s, dt, lay, seed);
    for (int ranks : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "shape [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "], "
                                        << ranks << " rank(s)");
      SyncBnOptions opts;
      opts.mode = mode;
      // Every other case uses the cumulative average (momentum unset: num_batches_tracked).
      if (index++ % 2) opts.momentum = std::nullopt;
      const RunOut cpu = run(p, Device::cpu(), ranks, opts);
      const RunOut gpu = run(p, Device::cuda(0), ranks, opts);
      expect_same_run(cpu, gpu);
    }
  }
}

/// The phases on one rank: the records and the exponents are the same words.
TEST_P(SyncBnCuda, RecordsEqualCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  const DType dt = std::get<0>(GetParam());
  const Lay lay = std::get<1>(GetParam());
  const SyncBnMode mode = std::get<2>(GetParam());  // a variable, not a binding: the lambda below captures it (C++17)
  const bool exact = mode == SyncBnMode::kExact;
  std::uint64_t seed = 9000;
  for (const Shape& s : kShapes) {
    seed += 10;
    SCOPED_TRACE(::testing::Message() << "shape [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "]");
    const Problem p = make_problem(s, dt, lay, seed);
    const std::int64_t C = s.C, words = sync_batch_norm_record_words(C, mode);
    struct Out {
      Tensor fscales, bscales, frecord, brecord;
    };
    auto phases = [&](Device dev) {
      Out o;
      const Buf x = p.x.to(dev), gy = p.gy.to(dev);
      const Tensor mean = vec(test::random_values(static_cast<std::size_t>(C), seed + 7, -5, 5), DType::kFloat64, dev);
      o.fscales = Tensor::zeros({sync_batch_norm_scale_words(C, false)}, DType::kInt64, dev);
      o.bscales = Tensor::zeros({sync_batch_norm_scale_words(C, true)}, DType::kInt64, dev);
      o.frecord = Tensor::zeros({words}, DType::kInt64, dev);
      o.brecord = Tensor::zeros({words}, DType::kInt64, dev);
      TensorView fs, bs;
      if (exact) {
        sync_batch_norm_local_scales(x.view, TensorView{}, TensorView{}, o.fscales);
        sync_batch_norm_local_scales(x.view, gy.view, mean, o.bscales);
        // One rank: the agreed exponents are this rank's (merge of a [1, words] gather).
        Tensor fm = Tensor::zeros({sync_batch_norm_scale_words(C, false)}, DType::kInt64, dev);
        Tensor bm = Tensor::zeros({sync_batch_norm_scale_words(C, true)}, DType::kInt64, dev);
        TensorView fg(o.fscales.view().data, DType::kInt64, dev, {1, sync_batch_norm_scale_words(C, false)});
        TensorView bg(o.bscales.view().data, DType::kInt64, dev, {1, sync_batch_norm_scale_words(C, true)});
        sync_batch_norm_merge_scales(fg, fm);
        sync_batch_norm_merge_scales(bg, bm);
        sync_batch_norm_local_stats(x.view, o.frecord, mode, fm);
        sync_batch_norm_local_backward(gy.view, x.view, mean, o.brecord, mode, bm);
      } else {
        sync_batch_norm_local_stats(x.view, o.frecord, mode, fs);
        sync_batch_norm_local_backward(gy.view, x.view, mean, o.brecord, mode, bs);
      }
      return o;
    };
    const Out cpu = phases(Device::cpu());
    const Out gpu = phases(Device::cuda(0));
    if (exact) {
      EXPECT_TRUE(same_bytes(cpu.fscales, gpu.fscales, "forward exponents"));
      EXPECT_TRUE(same_bytes(cpu.bscales, gpu.bscales, "backward exponents"));
    }
    EXPECT_TRUE(same_bytes(cpu.frecord, gpu.frecord, "forward record"));
    EXPECT_TRUE(same_bytes(cpu.brecord, gpu.brecord, "backward record"));
  }
}

// Every rank on a non-blocking stream of its own: the header exchange, the staged gathers and
// every kernel must be ordered on Context::cuda_stream alone (the legacy default stream of the
// tests above synchronizes with everything and would hide a launch on the wrong stream).
TEST(SyncBnCudaStreams, NonBlockingStreamsGiveTheSameBits) {
  DETOPS_REQUIRE_GPU();
  if (!test::NonBlockingStream().ok()) GTEST_SKIP() << "no CUDA runtime in this test build (DETOPS_TEST_CUDART)";
  std::uint64_t seed = 8000;
  for (DType dt : {DType::kFloat32, DType::kBFloat16})
    for (Lay lay : {Lay::kNchw, Lay::kNhwc})
      for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact})
        for (const Shape& s : {kShapes[0], kShapes[4]}) {
          seed += 10;
          const Problem p = make_problem(s, dt, lay, seed);
          for (int ranks : {1, 2}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << lay_name(lay) << " "
                                              << (mode == SyncBnMode::kExact ? "exact" : "default") << " [" << s.N
                                              << ", " << s.C << ", " << s.H << ", " << s.W << "], " << ranks
                                              << " rank(s)");
            SyncBnOptions opts;
            opts.mode = mode;
            expect_same_run(run(p, Device::cpu(), ranks, opts), run(p, Device::cuda(0), ranks, opts, true));
          }
        }
}

// A caller workspace of the queried size (8 bytes off the allocation's alignment) replaces every
// allocation of the one-call path, the backend's per-chunk partials included, with the same bits.
TEST(SyncBnCudaWorkspace, CallerWorkspaceGivesTheSameBitsWithoutAllocating) {
  DETOPS_REQUIRE_GPU();
  std::uint64_t seed = 9000;
  for (Lay lay : {Lay::kNchw, Lay::kNhwc})
    for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact})
      for (const Shape& s : {kShapes[0], kShapes[2], kShapes[3]}) {
        seed += 10;
        const Problem p = make_problem(s, DType::kFloat32, lay, seed);
        for (int ranks : {1, 2, 3}) {
          SCOPED_TRACE(::testing::Message() << lay_name(lay) << " " << (mode == SyncBnMode::kExact ? "exact" : "default")
                                            << " [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "], "
                                            << ranks << " rank(s)");
          SyncBnOptions opts;
          opts.mode = mode;
          expect_same_run(run(p, Device::cpu(), ranks, opts), run(p, Device::cuda(0), ranks, opts, false, true));
        }
      }
}

TEST(SyncBnCudaWorkspace, TooSmallWorkspaceIsRejected) {
  DETOPS_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Problem p = make_problem(kShapes[0], DType::kFloat32, Lay::kNchw, 9500);
  const Buf x = p.x.to(dev), y = make_buf(p.s, p.dt, p.lay, dev);
  const Tensor mean = Tensor::zeros({p.s.C}, DType::kFloat64, dev), invstd = Tensor::zeros({p.s.C}, DType::kFloat64, dev);
  const std::size_t need = sync_batch_norm_forward_workspace_size(x.view);
  DeviceWorkspace small(need - 1, dev);
  try {
    sync_batch_norm_forward(x.view, SyncBnParams{}, y.view, mean, invstd, nullptr, {}, {}, small.ws);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sync_batch_norm_forward_workspace_size"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(All, SyncBnCuda,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::Values(Lay::kNchw, Lay::kNhwc, Lay::kStrided, Lay::kNhwcStrided),
                                            ::testing::Values(SyncBnMode::kDefault, SyncBnMode::kExact)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const DType dt = std::get<0>(info.param);
                           return std::string(dtype_name(dt)) + "_" + lay_name(std::get<1>(info.param)) + "_" +
                                  (std::get<2>(info.param) == SyncBnMode::kExact ? "exact" : "default");
                         });

}  // namespace
}  // namespace detops
