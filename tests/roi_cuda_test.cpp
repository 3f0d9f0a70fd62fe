// RoIAlign and RoIAlignRotated on CUDA against the CPU backend (label gpu). Plain C++ over the
// public API, built in every configuration; every test skips with a message when no CUDA device
// is present. Both ops, written once over a geometry (tests/roi_test_harness.h):
//   - forward (and max pooling's argmax): CUDA == CPU byte for byte, every dtype x layout x
//     sampling (x pool mode);
//   - exact backward: CUDA == CPU byte for byte, and identical over repeated runs;
//   - truncated backward: float64 (summed in the CPU's order) CUDA == CPU byte for byte; other
//     dtypes as each op promises (CudaPromise below);
//   - atomic backward: within a bound relative to max |cpu| and not all zeros;
//   - empty problems; bad rois in device memory: the documented error, outputs untouched, and
//     unchecked they pool to zero.
// RoIAlign's own: truncated repeatability (20 runs; 100 at full Mask R-CNN scale), float64
// truncated on every run, strided grad_input (gaps untouched), legacy alignment, float64 and
// 16-bit rois, a caller workspace on the device, unchecked rois in adaptive exact mode,
// Context::debug_sync, and a non-blocking stream of the test's own (Context::cuda_stream).
// Selected for compute-sanitizer by the gpu preset (cmake/DetopsGpuCheck.cmake):
// gpu-check sanitizer: RoiAlign/RoiCuda.ForwardAndExactBackwardEqualCpuBitwise/float32_nhwc_avg_sr2:RoiAlign/RoiCuda.TruncatedAndAtomicAgreeWithCpu/float16_nchw_max_adaptive:RoiAlignRotated/RoiCuda.ForwardAndExactBackwardEqualCpuBitwise/float32_nhwc_sr2:RoiCudaContracts/*:RoiAlignCudaCoverage.StridedGradInput:RoiAlignCudaCoverage.CallerWorkspaceOnTheDevice

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_stream.h"
#include "gpu_test.h"
#include "roi_test_harness.h"

namespace detops {
namespace {

using namespace test;  // NOLINT: the harness and the helpers it builds on

Tensor on_gpu(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor on_cpu(const Tensor& t) { return t.to(Device::cpu()); }
Tensor on(Device dev, const Tensor& t) { return dev.is_cuda() ? on_gpu(t) : on_cpu(t); }

/// What each op's CUDA backend promises against the CPU beyond a bitwise forward and exact
/// backward (and float64's truncated mode, which runs the exact mode's phases).
template <class G>
struct CudaPromise;
template <>
struct CudaPromise<AxisAlignedRois> {
  // truncated: bitwise at a fixed sampling ratio; adaptive: at most a few elements 1 ulp apart
  static constexpr bool kTruncatedBitwiseAtFixedRatio = true, kTruncatedWithinOneUlp = true;
  static constexpr double kAtomicFloat64 = 1e-12;
};
template <>
struct CudaPromise<RotatedRois> {
  // truncated: within the atomic mode's bound of the CPU's
  static constexpr bool kTruncatedBitwiseAtFixedRatio = false, kTruncatedWithinOneUlp = false;
  static constexpr double kAtomicFloat64 = 1e-5;
};

/// 256 rois of 4 to 160 pixels (in a scaled-down case, a quarter or an eighth of them and of the
/// 32 channels) on two 50 x 68 maps at scale 1/4, pooled 7 x 7, aligned.
template <class G>
Workload<G> make_case(DType dt, Layout layout, PoolMode pool, std::int64_t sr, std::int64_t scale_down = 1) {
  const WorkloadSize size{2, 32 / scale_down, 50, 68, 256 / scale_down, 7, 7, 0.25, 4.0, 160.0, 21, 1e-2, false};
  return make_workload<G>(size, dt, layout, pool, sr);
}

struct Pooled {
  Tensor out, argmax;
};

/// `stream`: a non-blocking stream for the device call (waited for before the results are read),
/// or nullptr for the legacy default stream.
template <class G>
Pooled forward(const Workload<G>& c, DType dt, Layout layout, Device dev, const NonBlockingStream* stream = nullptr) {
  Pooled p;
  p.out = Tensor::empty({c.K(), c.C(), 7, 7}, dt, dev, layout);
  if (G::max_pool(c.opt)) p.argmax = Tensor::empty({c.K(), c.C(), 7, 7}, DType::kInt32, dev, layout);
  Context ctx;
  if (stream && dev.is_cuda()) ctx.cuda_stream = stream->get();
  G::forward(on(dev, c.input), on(dev, c.rois), p.out, c.opt, ctx, p.argmax);
  if (stream && dev.is_cuda()) {
    EXPECT_TRUE(stream->synchronize());
  }
  return p;
}

template <class G>
Tensor backward(const Workload<G>& c, DType dt, Layout layout, Device dev, BackwardMode mode, const Tensor& argmax,
                const NonBlockingStream* stream = nullptr) {
  Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, dt, dev, layout);
  const Tensor am = argmax.numel() ? on(dev, argmax) : Tensor();
  RoiAlignBackwardOptions b;
  b.mode = mode;
  Context ctx;
  if (stream && dev.is_cuda()) ctx.cuda_stream = stream->get();
  G::backward(on(dev, c.grad_output), on(dev, c.rois), gi, c.opt, b, ctx, am);
  if (stream && dev.is_cuda()) {
    EXPECT_TRUE(stream->synchronize());
  }
  return on_cpu(gi);
}

std::int64_t differing_elements(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = to_vector(a), y = to_vector(b);
  std::int64_t n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(double)) != 0;
  return n;
}

/// Atomic mode's bound on |cuda - cpu| relative to max |cpu|: two summation orders, and on CUDA
/// every add rounds to grad_input's dtype (16-bit: the contribution is rounded to it first).
template <class G>
double atomic_bound(DType dt) {
  switch (dt) {
    case DType::kFloat64: return CudaPromise<G>::kAtomicFloat64;
    case DType::kFloat32: return 1e-5;
    case DType::kFloat16: return 1.0 / 128;  // 2^-7
    default: return 1.0 / 16;                // bfloat16: 2^-4
  }
}

/// Truncated mode, CUDA against the CPU. Both add the same double contributions and round each sum
/// once. float64: CUDA adds them in the CPU's order (the exact mode's sorted slots), bitwise
/// equality. Other dtypes: only the order of the double adds differs (atomics vs the CPU's fixed
/// order). RoIAlign: with a fixed sampling_ratio the contributions have few significant bits and
/// the sums come out the same in any order: bitwise equality; with adaptive sampling a reordering
/// can carry a sum across a rounding boundary of the output format (about 1e-7 per element,
/// measured at Mask R-CNN scale): at most 1 ulp, on at most a handful of elements, counted and
/// printed. RoIAlignRotated: within the atomic mode's bound.
template <class G>
void expect_truncated_matches(const Tensor& gpu, const Tensor& cpu, DType dt, std::int64_t sr, const char* what) {
  const std::vector<double> g = to_vector(gpu), c = to_vector(cpu);
  ASSERT_GT(max_abs(c), 0.0) << what << ": the CPU reference is all zeros; the case tests nothing";
  EXPECT_GT(max_abs(g), 0.0) << what << ": all-zero CUDA gradient";
  const UlpDiff d = ulp_diff(g, c, dt);
  if ((sr > 0 && CudaPromise<G>::kTruncatedBitwiseAtFixedRatio) || dt == DType::kFloat64) {
    EXPECT_EQ(d.differing, 0) << what << ": " << d.differing << " elements differ (up to " << d.max_ulps << " ulp)";
    return;
  }
  if (!CudaPromise<G>::kTruncatedWithinOneUlp) {
    EXPECT_LE(max_error_to_peak(g, c), atomic_bound<G>(dt)) << what;
    return;
  }
  const auto allowed = static_cast<std::int64_t>(std::max<std::size_t>(2, g.size() / 50000));
  std::printf("[ truncated ] %s adaptive: %lld of %zu elements 1 ulp from the CPU (reported; at most %lld allowed)\n",
              what, static_cast<long long>(d.differing), g.size(), static_cast<long long>(allowed));
  EXPECT_LE(d.max_ulps, 1) << what;
  EXPECT_LE(d.differing, allowed) << what;
}

/// Atomic mode: within atomic_bound(dt) of the CPU relative to max |cpu|, and not all zeros.
template <class G>
void expect_atomic_close(const Tensor& gpu, const Tensor& cpu, DType dt, const char* what) {
  const std::vector<double> g = to_vector(gpu), c = to_vector(cpu);
  ASSERT_GT(max_abs(c), 0.0) << what << ": the CPU reference is all zeros; the case tests nothing";
  EXPECT_GT(max_abs(g), 0.0) << what << ": all-zero CUDA gradient";
  EXPECT_LE(max_error_to_peak(g, c), atomic_bound<G>(dt)) << what << " (max |cpu| = " << max_abs(c) << ")";
}

/// Runs `call` and returns its detops::Error message ("no error" when it returns).
template <class F>
std::string error_of(F&& call, ErrorCode* code = nullptr) {
  try {
    call();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "no error";
}

/// All of a tensor's bytes (on any device) are `byte`.
::testing::AssertionResult all_bytes(const Tensor& t, unsigned char byte) {
  const Tensor back = on_cpu(t);
  const auto* p = static_cast<const unsigned char*>(back.view().data);
  for (std::size_t i = 0; i < back.nbytes(); ++i)
    if (p[i] != byte) return ::testing::AssertionFailure() << "byte " << i << " was written";
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// Both ops

class RoiCuda : public ::testing::TestWithParam<RoiParam> {};

/// f(c, cpu) with the case of p (a Workload of p's geometry) and the CPU's forward of it.
template <class F>
void with_case(const RoiParam& p, F&& f) {
  with_geometry(p.op, [&](auto g) {
    const auto c = make_case<decltype(g)>(p.dt, p.layout, p.pool, p.sr);
    f(c, forward(c, p.dt, p.layout, Device::cpu()));
  });
}

TEST_P(RoiCuda, ForwardAndExactBackwardEqualCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  const RoiParam& p = GetParam();
  with_case(p, [&](const auto& c, const Pooled& cpu) {
    const Pooled gpu = forward(c, p.dt, p.layout, Device::cuda(0));
    EXPECT_TRUE(same_bytes(cpu.out, on_cpu(gpu.out))) << "forward output";
    if (cpu.argmax.numel() > 0) {
      EXPECT_TRUE(same_bytes(cpu.argmax, on_cpu(gpu.argmax))) << "argmax";
    }
    const Tensor exact_cpu = backward(c, p.dt, p.layout, Device::cpu(), BackwardMode::kExact, cpu.argmax);
    const Tensor exact_gpu = backward(c, p.dt, p.layout, Device::cuda(0), BackwardMode::kExact, cpu.argmax);
    EXPECT_TRUE(same_bytes(exact_cpu, exact_gpu)) << differing_elements(exact_cpu, exact_gpu) << " elements differ";
    for (int run = 0; run < 3; ++run)
      EXPECT_TRUE(same_bytes(exact_gpu, backward(c, p.dt, p.layout, Device::cuda(0), BackwardMode::kExact, cpu.argmax)))
          << "run " << run;
  });
}

TEST_P(RoiCuda, TruncatedAndAtomicAgreeWithCpu) {
  DETOPS_REQUIRE_GPU();
  const RoiParam& p = GetParam();
  with_case(p, [&](const auto& c, const Pooled& cpu) {
    using G = typename std::decay_t<decltype(c)>::Geometry;
    expect_atomic_close<G>(backward(c, p.dt, p.layout, Device::cuda(0), BackwardMode::kAtomic, cpu.argmax),
                           backward(c, p.dt, p.layout, Device::cpu(), BackwardMode::kAtomic, cpu.argmax), p.dt,
                           "atomic");
    expect_truncated_matches<G>(backward(c, p.dt, p.layout, Device::cuda(0), BackwardMode::kTruncated, cpu.argmax),
                                backward(c, p.dt, p.layout, Device::cpu(), BackwardMode::kTruncated, cpu.argmax),
                                p.dt, p.sr, "truncated");
  });
}

const RoiGrid kCudaGrid{kRoiDtypes, kRoiLayouts, {}, kRoiPools, {}, {0, 2}};
DETOPS_ROI_INSTANTIATE(RoiCuda, kCudaGrid);

template <class G>
class RoiCudaContracts : public ::testing::Test {};
TYPED_TEST_SUITE(RoiCudaContracts, RoiGeometries, RoiNames);

TYPED_TEST(RoiCudaContracts, EmptyProblemsAndWorkspaceQuery) {
  DETOPS_REQUIRE_GPU();
  using G = TypeParam;
  const Workload<G> c = make_case<G>(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0, 8);
  Tensor rois = Tensor::empty({0, G::kColumns}, DType::kFloat32, Device::cuda(0));
  Tensor out = Tensor::empty({0, c.C(), 7, 7}, DType::kFloat32, Device::cuda(0));
  G::forward(on_gpu(c.input), rois, out, c.opt);
  Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, DType::kFloat32, Device::cuda(0));
  gi.fill_bytes(0xA5);
  for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    RoiAlignBackwardOptions b;
    b.mode = m;
    G::backward(out, rois, gi, c.opt, b);
    for (double x : to_vector(on_cpu(gi))) ASSERT_EQ(x, 0.0) << to_string(m);
  }
  RoiAlignBackwardOptions b;
  EXPECT_GT(G::workspace_size(on_gpu(c.grad_output), on_gpu(c.rois), gi, c.opt, b), 0u);
}

// Bad rows in device memory (a batch index out of range; where the geometry has them, a negative
// size): the forward and the backward report the documented error and write nothing; unchecked,
// the bad row pools to zeros (and the forward does not wait on the stream).
TYPED_TEST(RoiCudaContracts, DeviceRoisAreValidatedAndOutputsUntouched) {
  DETOPS_REQUIRE_GPU();
  using G = TypeParam;
  const Workload<G> c = make_case<G>(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 2, 8);
  struct BadRow {
    std::int64_t row;
    std::vector<double> rois;
    std::string message;
  };
  std::vector<BadRow> bad;
  std::vector<double> r = to_vector(c.rois);
  r[7 * G::kColumns] = 2.0;  // batch index out of range for N = 2
  bad.push_back({7, r, "rois[7] has batch index 2; expected an integer in [0, 2)"});
  r = to_vector(c.rois);
  if (G::invalid_size(&r[5 * G::kColumns])) bad.push_back({5, r, "rois[5] has size (w, h)"});
  for (const BadRow& b : bad) {
    SCOPED_TRACE(b.message);
    const Tensor rois = on_gpu(make_tensor({c.K(), G::kColumns}, DType::kFloat32, b.rois));
    Tensor out = Tensor::empty({c.K(), c.C(), 7, 7}, DType::kFloat32, Device::cuda(0));
    out.fill_bytes(0xA5);
    std::string what = error_of([&] { G::forward(on_gpu(c.input), rois, out, c.opt); });
    EXPECT_NE(what.find(b.message), std::string::npos) << what;
    EXPECT_TRUE(all_bytes(out, 0xA5)) << "output";
    Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, DType::kFloat32, Device::cuda(0));
    gi.fill_bytes(0x5A);
    what = error_of([&] { G::backward(on_gpu(c.grad_output), rois, gi, c.opt, {}); });
    EXPECT_NE(what.find(b.message), std::string::npos) << what;
    EXPECT_TRUE(all_bytes(gi, 0x5A)) << "grad_input";
    typename G::Options o = c.opt;
    o.check_rois = false;
    G::forward(on_gpu(c.input), rois, out, o);
    const std::vector<double> v = to_vector(on_cpu(out));
    for (std::int64_t i = 0; i < c.C() * 49; ++i) ASSERT_EQ(v[static_cast<std::size_t>(b.row * c.C() * 49 + i)], 0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// RoIAlign's own. Issue 16: float64 truncated is refused on CUDA; and the paths no other GPU test
// takes.

using A = AxisAlignedRois;

// The same problems on a non-blocking stream of the test's own: the roi check's wait, the
// workspace (cudaMallocAsync), the CUB calls and every kernel must be ordered on it alone.
TEST(RoiAlignCudaStreams, NonBlockingStreamGivesTheSameBits) {
  DETOPS_REQUIRE_GPU();
  const NonBlockingStream stream;
  if (!stream.ok()) GTEST_SKIP() << "no CUDA runtime in this test build (DETOPS_TEST_CUDART)";
  for (DType dt : {DType::kFloat32, DType::kFloat16})
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
      for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
        for (std::int64_t sr : {std::int64_t{0}, std::int64_t{2}}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (layout == Layout::kNHWC ? " nhwc " : " nchw ")
                                            << to_string(pool) << " sr " << sr);
          const Workload<A> c = make_case<A>(dt, layout, pool, sr);
          const Pooled cpu = forward(c, dt, layout, Device::cpu());
          const Pooled gpu = forward(c, dt, layout, Device::cuda(0), &stream);
          EXPECT_TRUE(same_bytes(cpu.out, on_cpu(gpu.out))) << "forward output";
          if (pool == PoolMode::kMax) {
            EXPECT_TRUE(same_bytes(cpu.argmax, on_cpu(gpu.argmax))) << "argmax";
          }
          EXPECT_TRUE(same_bytes(backward(c, dt, layout, Device::cpu(), BackwardMode::kExact, cpu.argmax),
                                 backward(c, dt, layout, Device::cuda(0), BackwardMode::kExact, cpu.argmax, &stream)))
              << "exact backward";
          expect_truncated_matches<A>(
              backward(c, dt, layout, Device::cuda(0), BackwardMode::kTruncated, cpu.argmax, &stream),
              backward(c, dt, layout, Device::cpu(), BackwardMode::kTruncated, cpu.argmax), dt, sr, "truncated");
          expect_atomic_close<A>(backward(c, dt, layout, Device::cuda(0), BackwardMode::kAtomic, cpu.argmax, &stream),
                                 backward(c, dt, layout, Device::cpu(), BackwardMode::kAtomic, cpu.argmax), dt,
                                 "atomic");
        }
}

TEST(RoiAlignCudaDeterminism, TruncatedRepeatsAndAtomicDriftIsReported) {
  DETOPS_REQUIRE_GPU();
  const Workload<A> c = make_case<A>(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 2);
  auto run = [&](BackwardMode mode) { return backward(c, DType::kFloat32, Layout::kNCHW, Device::cuda(0), mode, {}); };
  const Tensor first = run(BackwardMode::kTruncated);
  for (int r = 1; r < 20; ++r) ASSERT_TRUE(same_bytes(first, run(BackwardMode::kTruncated))) << "truncated run " << r;
  const Tensor a0 = run(BackwardMode::kAtomic);
  std::int64_t worst = 0;
  for (int r = 1; r < 20; ++r) worst = std::max(worst, differing_elements(a0, run(BackwardMode::kAtomic)));
  std::printf("[ atomic  ] up to %lld of %lld grad_input elements changed between runs (reported, not asserted)\n",
              static_cast<long long>(worst), static_cast<long long>(a0.numel()));
  RecordProperty("atomic_changed_elements", static_cast<int>(worst));
}

// Issue 6: the truncated mode's repeatability at full Mask R-CNN scale, for 100 runs (and the
// exact mode's, which is guaranteed): the P2 level [2, 256, 200, 272] float32, 1024 rois of
// 16-400 px, 7x7, sampling 2, aligned. Cheap on a GPU (a few ms per backward).
TEST(RoiAlignCudaDeterminism, HundredRunsAtMaskRcnnScale) {
  DETOPS_REQUIRE_GPU();
  const std::int64_t N = 2, C = 256, H = 200, W = 272, K = 1024;
  RoiAlignOptions opt;
  opt.spatial_scale = 0.25, opt.sampling_ratio = 2, opt.aligned = true;
  const Tensor rois = on_gpu(make_tensor({K, 5}, DType::kFloat32, random_rois(K, N, 800.0, 1088.0, 31, 16.0, 400.0)));
  const Tensor grad_out = on_gpu(make_tensor(
      {K, C, 7, 7}, DType::kFloat32, random_values(static_cast<std::size_t>(K * C * 49), 32, -1e-2, 1e-2)));
  Tensor grad_in = Tensor::empty({N, C, H, W}, DType::kFloat32, Device::cuda(0));
  for (BackwardMode mode : {BackwardMode::kTruncated, BackwardMode::kExact}) {
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_backward(grad_out, rois, grad_in, opt, b);
    const Tensor first = on_cpu(grad_in);
    int distinct_runs = 0;
    for (int run = 1; run < 100; ++run) {
      roi_align_backward(grad_out, rois, grad_in, opt, b);
      if (!same_bytes(first, on_cpu(grad_in))) ++distinct_runs;  // memcmp: cheaper than hashing 55 MB
    }
    std::printf("[ %-9s ] 100 runs at Mask R-CNN scale: %d differed from the first\n", to_string(mode),
                distinct_runs);
    EXPECT_EQ(distinct_runs, 0) << to_string(mode);
  }
}

// float64 truncated on CUDA sums in the CPU's order (the exact mode's sorted slots), not with
// double atomics: the CPU's bits, on every run, adaptive sampling included.
TEST(RoiAlignCudaDeterminism, TruncatedFloat64IsTheCpuBitsOnEveryRun) {
  DETOPS_REQUIRE_GPU();
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
      for (std::int64_t sr : {0, 2})
        for (TruncationFormat format : {TruncationFormat::kFloat16, TruncationFormat::kBFloat16}) {
          SCOPED_TRACE(::testing::Message() << (layout == Layout::kNHWC ? "nhwc " : "nchw ") << to_string(pool)
                                            << " sr " << sr
                                            << (format == TruncationFormat::kFloat16 ? " float16" : " bfloat16"));
          const Workload<A> c = make_case<A>(DType::kFloat64, layout, pool, sr);
          const Pooled cpu = forward(c, DType::kFloat64, layout, Device::cpu());
          RoiAlignBackwardOptions b;
          b.mode = BackwardMode::kTruncated;
          b.truncation = format;
          auto run = [&](Device dev) {
            Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, DType::kFloat64, dev, layout);
            const Tensor am = cpu.argmax.numel() ? on(dev, cpu.argmax) : Tensor();
            roi_align_backward(on(dev, c.grad_output), on(dev, c.rois), gi, c.opt, b, {}, am);
            return on_cpu(gi);
          };
          const Tensor want = run(Device::cpu()), first = run(Device::cuda(0));
          ASSERT_GT(max_abs(to_vector(want)), 0.0);
          const UlpDiff d = ulp_diff(to_vector(first), to_vector(want), DType::kFloat64);
          EXPECT_EQ(d.differing, 0) << "CUDA vs CPU: up to " << d.max_ulps << " ulp";
          for (int r = 1; r < 5; ++r) EXPECT_TRUE(same_bytes(first, run(Device::cuda(0)))) << "run " << r;
        }
}

void run_backward(const Workload<A>& c, const TensorView& gi, const Tensor& argmax, BackwardMode mode,
                  const Context& ctx = {}) {
  const Device dev = gi.device;
  // defined, not numel: a max-pooling call with no rois still takes its (empty) argmax
  const Tensor am = argmax.view().defined() ? on(dev, argmax) : Tensor();
  RoiAlignBackwardOptions b;
  b.mode = mode;
  roi_align_backward(on(dev, c.grad_output), on(dev, c.rois), gi, c.opt, b, ctx, am);
}

// Strided grad_input (fill_zero_kernel, cast_kernel and the atomics through strides: NCHW rows
// padded by 3, NHWC pixels holding every other channel, so the zero fill cannot be a memset):
// the whole storage, gaps included, against the CPU's. Also with no rois (only the zero fill).
TEST(RoiAlignCudaCoverage, StridedGradInput) {
  DETOPS_REQUIRE_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64})
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
      for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
        for (bool empty : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (layout == Layout::kNHWC ? " nhwc " : " nchw ")
                                            << to_string(pool) << (empty ? " K=0" : ""));
          Workload<A> c = make_case<A>(dt, layout, pool, 2, 4);
          const Pooled cpu = forward(c, dt, layout, Device::cpu());
          Tensor argmax = cpu.argmax;
          if (empty) {
            c.rois = Tensor::empty({0, 5}, DType::kFloat32);
            c.grad_output = Tensor::empty({0, c.C(), 7, 7}, dt, Device::cpu(), layout);
            if (pool == PoolMode::kMax) argmax = Tensor::empty({0, c.C(), 7, 7}, DType::kInt32, Device::cpu(), layout);
          }
          Placement place;
          place.channels_last = layout == Layout::kNHWC;
          if (place.channels_last) place.c_step = 2;
          else place.w_pad = 3;
          const Shape shape{c.N(), c.C(), c.H(), c.W()};
          for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kTruncated, BackwardMode::kAtomic}) {
            const StridedBuf want = StridedBuf::make(shape, place, dt, Device::cpu());
            const StridedBuf got = StridedBuf::make(shape, place, dt, Device::cuda(0));
            run_backward(c, want.view, argmax, mode);
            run_backward(c, got.view, argmax, mode);
            const StridedBuf back = got.to(Device::cpu());
            if (mode == BackwardMode::kAtomic && !empty) {
              const std::vector<double> g = to_vector(back.view), w = to_vector(want.view);
              EXPECT_GT(max_abs(g), 0.0) << "all-zero CUDA gradient";
              EXPECT_LE(max_error_to_peak(g, w), atomic_bound<A>(dt)) << "atomic";
              fill_from(back.view, w);  // the elements now agree: what remains to compare are the gaps
            }
            EXPECT_TRUE(same_bytes(back.storage, want.storage)) << to_string(mode) << ": elements or gaps differ";
          }
        }
}

// aligned = false (legacy: no half-pixel shift, rois at least 1x1) and rois in float64 or in the
// input's own dtype: forward, argmax and exact backward bitwise, truncated at a fixed sampling
// ratio bitwise.
TEST(RoiAlignCudaCoverage, LegacyAlignmentAndRoiDtypes) {
  DETOPS_REQUIRE_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kFloat64})
    for (int r = 0; r < 3; ++r)
      for (bool aligned : {false, true})
        for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
          for (std::int64_t sr : {0, 2}) {
            const DType roi_dt = r == 0 ? DType::kFloat32 : r == 1 ? DType::kFloat64 : dt;
            if (r == 2 && dt != DType::kFloat16) continue;        // the input's own dtype: already listed
            if (aligned && roi_dt == DType::kFloat32) continue;   // the parameterized suite's case
            SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rois " << dtype_name(roi_dt)
                                              << (aligned ? " aligned " : " legacy ") << to_string(pool) << " sr " << sr);
            Workload<A> c = make_case<A>(dt, Layout::kNCHW, pool, sr, 4);
            c.opt.aligned = aligned;
            c.rois = make_tensor({c.K(), 5}, roi_dt, to_vector(c.rois));
            const Pooled cpu = forward(c, dt, Layout::kNCHW, Device::cpu());
            const Pooled gpu = forward(c, dt, Layout::kNCHW, Device::cuda(0));
            EXPECT_TRUE(same_bytes(cpu.out, on_cpu(gpu.out))) << "forward output";
            if (pool == PoolMode::kMax) {
              EXPECT_TRUE(same_bytes(cpu.argmax, on_cpu(gpu.argmax))) << "argmax";
            }
            EXPECT_TRUE(same_bytes(backward(c, dt, Layout::kNCHW, Device::cpu(), BackwardMode::kExact, cpu.argmax),
                                   backward(c, dt, Layout::kNCHW, Device::cuda(0), BackwardMode::kExact, cpu.argmax)))
                << "exact backward";
            expect_truncated_matches<A>(
                backward(c, dt, Layout::kNCHW, Device::cuda(0), BackwardMode::kTruncated, cpu.argmax),
                backward(c, dt, Layout::kNCHW, Device::cpu(), BackwardMode::kTruncated, cpu.argmax), dt, sr,
                "truncated");
          }
}

// A caller's workspace in device memory, at an odd address (the library rounds the base up to
// 256 bytes within the reported slack): the same bits as the allocator's. One byte short, or
// overlapping grad_input: kInvalidArgument, grad_input untouched.
TEST(RoiAlignCudaCoverage, CallerWorkspaceOnTheDevice) {
  DETOPS_REQUIRE_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat64})  // float64 truncated: slots with divisors
    for (std::int64_t sr : {0, 2})
      for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kTruncated}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << to_string(mode) << " sr " << sr);
        const Workload<A> c = make_case<A>(dt, Layout::kNCHW, PoolMode::kAvg, sr, 4);
        const Tensor go = on_gpu(c.grad_output), rois = on_gpu(c.rois);
        Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, dt, Device::cuda(0));
        RoiAlignBackwardOptions b;
        b.mode = mode;
        const std::size_t bytes = roi_align_backward_workspace_size(go, rois, gi, c.opt, b);
        ASSERT_GT(bytes, 0u);
        Tensor storage = Tensor::empty({static_cast<std::int64_t>(bytes / 8 + 2)}, DType::kFloat64, Device::cuda(0));
        auto* base = static_cast<unsigned char*>(storage.view().data) + 3;
        roi_align_backward(go, rois, gi, c.opt, b, {}, {}, Workspace{base, bytes});
        const Tensor with_ws = on_cpu(gi);
        const Tensor cpu = backward(c, dt, Layout::kNCHW, Device::cpu(), mode, {});
        if (mode == BackwardMode::kExact) {
          EXPECT_TRUE(same_bytes(with_ws, cpu)) << "caller workspace vs CPU";
        } else {
          expect_truncated_matches<A>(with_ws, cpu, dt, sr, "truncated, caller workspace");
        }
        // float32 adaptive truncated may flip an element between runs
        if (mode == BackwardMode::kExact || sr > 0 || dt == DType::kFloat64) {
          EXPECT_TRUE(same_bytes(with_ws, backward(c, dt, Layout::kNCHW, Device::cuda(0), mode, {})))
              << "caller workspace vs allocator";
        }
        gi.fill_bytes(0xA5);
        ErrorCode code{};
        std::string what = error_of([&] { roi_align_backward(go, rois, gi, c.opt, b, {}, {}, Workspace{base, bytes - 1}); },
                                    &code);
        EXPECT_EQ(code, ErrorCode::kInvalidArgument) << what;
        what = error_of([&] { roi_align_backward(go, rois, gi, c.opt, b, {}, {}, Workspace{gi.view().data, bytes}); },
                        &code);
        EXPECT_EQ(code, ErrorCode::kInvalidArgument) << what;
        EXPECT_NE(what.find("grad_input"), std::string::npos) << what;
        EXPECT_TRUE(all_bytes(gi, 0xA5));
      }
}

// check_rois = false with invalid rows: no error, invalid rows pool to zero and scatter nothing.
// Exact mode (and float64 truncated) with adaptive sampling still reads the rois (the workspace
// depends on them): only the total, the need-total-only check. Every mode against the CPU's
// unchecked result.
TEST(RoiAlignCudaCoverage, UncheckedRoisWithAdaptiveExactMode) {
  DETOPS_REQUIRE_GPU();
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kFloat64})  // float64: truncated sized like exact
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
      for (std::int64_t sr : {0, 2}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << to_string(pool) << " sr " << sr);
        Workload<A> c = make_case<A>(dt, Layout::kNCHW, pool, sr, 4);
        const Pooled valid = forward(c, dt, Layout::kNCHW, Device::cpu());  // argmax of the valid rois
        std::vector<double> r = to_vector(c.rois);
        r[3 * 5 + 0] = 2;                                        // batch index out of range
        r[5 * 5 + 0] = 0.5;                                      // not an integer
        r[8 * 5 + 2] = std::numeric_limits<double>::quiet_NaN();  // coordinate not finite
        c.rois = make_tensor({c.K(), 5}, DType::kFloat32, r);
        c.opt.check_rois = false;
        const Pooled cpu = forward(c, dt, Layout::kNCHW, Device::cpu());
        const Pooled gpu = forward(c, dt, Layout::kNCHW, Device::cuda(0));
        EXPECT_TRUE(same_bytes(cpu.out, on_cpu(gpu.out))) << "forward output";
        RoiAlignBackwardOptions b;
        b.mode = BackwardMode::kExact;
        Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, dt, Device::cuda(0));
        EXPECT_GT(roi_align_backward_workspace_size(on_gpu(c.grad_output), on_gpu(c.rois), gi, c.opt, b), 0u);
        auto both = [&](BackwardMode mode) {
          return std::make_pair(backward(c, dt, Layout::kNCHW, Device::cuda(0), mode, valid.argmax),
                                backward(c, dt, Layout::kNCHW, Device::cpu(), mode, valid.argmax));
        };
        const auto exact = both(BackwardMode::kExact), truncated = both(BackwardMode::kTruncated);
        const auto atomic = both(BackwardMode::kAtomic);
        EXPECT_TRUE(same_bytes(exact.second, exact.first)) << "exact backward";
        expect_truncated_matches<A>(truncated.first, truncated.second, dt, sr, "truncated");
        expect_atomic_close<A>(atomic.first, atomic.second, dt, "atomic");
      }
}

// Context::debug_sync: a wait after every launch changes nothing in the results.
TEST(RoiAlignCudaCoverage, DebugSyncGivesTheSameBits) {
  DETOPS_REQUIRE_GPU();
  for (std::int64_t sr : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "sr " << sr);
    const Workload<A> c = make_case<A>(DType::kFloat32, Layout::kNCHW, PoolMode::kMax, sr, 4);
    const Pooled cpu = forward(c, DType::kFloat32, Layout::kNCHW, Device::cpu());
    Context sync;
    sync.debug_sync = true;
    Tensor out = Tensor::empty({c.K(), c.C(), 7, 7}, DType::kFloat32, Device::cuda(0));
    Tensor am = Tensor::empty({c.K(), c.C(), 7, 7}, DType::kInt32, Device::cuda(0));
    roi_align_forward(on_gpu(c.input), on_gpu(c.rois), out, c.opt, sync, am);
    EXPECT_TRUE(same_bytes(cpu.out, on_cpu(out))) << "forward output";
    EXPECT_TRUE(same_bytes(cpu.argmax, on_cpu(am))) << "argmax";
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kTruncated, BackwardMode::kAtomic}) {
      Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, DType::kFloat32, Device::cuda(0));
      run_backward(c, gi.view(), cpu.argmax, mode, sync);
      const Tensor got = on_cpu(gi);
      const Tensor want = backward(c, DType::kFloat32, Layout::kNCHW, Device::cpu(), mode, cpu.argmax);
      if (mode == BackwardMode::kExact) EXPECT_TRUE(same_bytes(got, want)) << "exact";
      else if (mode == BackwardMode::kTruncated) expect_truncated_matches<A>(got, want, DType::kFloat32, sr, "truncated");
      else expect_atomic_close<A>(got, want, DType::kFloat32, "atomic");
    }
  }
}

}  // namespace
}  // namespace detops
