// RoIAlign on CUDA against the CPU backend (label gpu). Plain C++ over the public API, built in
// every configuration; every test skips with a message when no CUDA device is present.
//   - forward: CUDA == CPU byte for byte (shared math, pinned arithmetic), every dtype x layout x
//     pool mode x sampling;
//   - exact backward: CUDA == CPU byte for byte, and identical over repeated runs;
//   - truncated backward: identical over 20 runs, and within tolerance of the CPU; truncated and
//     exact identical over 100 runs at full Mask R-CNN scale;
//   - atomic backward: within tolerance; how many elements change between runs is reported;
//   - bad rois on device memory: the documented error, outputs untouched;
//   - all of it on a non-blocking stream of the test's own (Context::cuda_stream): the same bits.
// Selected by scripts/gpu-check.sh (compute-sanitizer cases):
// gpu-check sanitizer: All/RoiAlignCuda.ForwardAndExactBackwardEqualCpuBitwise/float32_nhwc_avg_sr2:All/RoiAlignCuda.TruncatedAndAtomicAgreeWithCpu/float16_nchw_max_adaptive:RoiAlignCudaBadInput.*:RoiAlignCudaSemantics.*

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <tuple>

#include "cuda_stream.h"
#include "reference/roi_align_reference.h"
#include "gpu_test.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;

Tensor on_gpu(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor on_cpu(const Tensor& t) { return t.to(Device::cpu()); }

struct GpuCase {
  Tensor input, rois, grad_output;
  RoiAlignOptions opt;
  std::int64_t N, C, H, W, K;
};

GpuCase make_case(DType dt, Layout layout, PoolMode pool, std::int64_t sr, std::int64_t scale_down = 1) {
  GpuCase c;
  c.N = 2, c.C = 32 / scale_down, c.H = 50, c.W = 68, c.K = 256 / scale_down;
  c.opt.pooled_height = c.opt.pooled_width = 7;
  c.opt.spatial_scale = 0.25;
  c.opt.sampling_ratio = sr;
  c.opt.aligned = true;
  c.opt.pool_mode = pool;
  c.input = make_tensor({c.N, c.C, c.H, c.W}, dt,
                        test::random_values(static_cast<std::size_t>(c.N * c.C * c.H * c.W), 21), layout);
  c.rois = make_tensor({c.K, 5}, DType::kFloat32, test::random_rois(c.K, c.N, 200.0, 272.0, 22, 4.0, 160.0));
  c.grad_output = make_tensor({c.K, c.C, 7, 7}, dt,
                              test::random_values(static_cast<std::size_t>(c.K * c.C * 49), 23, -1e-2, 1e-2), layout);
  return c;
}

struct Pooled {
  Tensor out, argmax;
};

/// `stream`: a non-blocking stream for the device call (waited for before the results are read),
/// or nullptr for the legacy default stream.
Pooled forward(const GpuCase& c, DType dt, Layout layout, Device dev, const test::NonBlockingStream* stream = nullptr) {
  Pooled p;
  p.out = Tensor::empty({c.K, c.C, 7, 7}, dt, dev, layout);
  if (c.opt.pool_mode == PoolMode::kMax) p.argmax = Tensor::empty({c.K, c.C, 7, 7}, DType::kInt32, dev, layout);
  const Tensor in = dev.is_cpu() ? on_cpu(c.input) : on_gpu(c.input);
  const Tensor rois = dev.is_cpu() ? on_cpu(c.rois) : on_gpu(c.rois);
  Context ctx;
  if (stream && dev.is_cuda()) ctx.cuda_stream = stream->get();
  roi_align_forward(in, rois, p.out, c.opt, ctx, p.argmax);
  if (stream && dev.is_cuda()) {
    EXPECT_TRUE(stream->synchronize());
  }
  return p;
}

Tensor backward(const GpuCase& c, DType dt, Layout layout, Device dev, BackwardMode mode, const Tensor& argmax,
                const test::NonBlockingStream* stream = nullptr) {
  Tensor gi = Tensor::empty({c.N, c.C, c.H, c.W}, dt, dev, layout);
  const Tensor go = dev.is_cpu() ? on_cpu(c.grad_output) : on_gpu(c.grad_output);
  const Tensor rois = dev.is_cpu() ? on_cpu(c.rois) : on_gpu(c.rois);
  const Tensor am = argmax.numel() ? (dev.is_cpu() ? on_cpu(argmax) : on_gpu(argmax)) : Tensor();
  RoiAlignBackwardOptions b;
  b.mode = mode;
  Context ctx;
  if (stream && dev.is_cuda()) ctx.cuda_stream = stream->get();
  roi_align_backward(go, rois, gi, c.opt, b, ctx, am);
  if (stream && dev.is_cuda()) {
    EXPECT_TRUE(stream->synchronize());
  }
  return on_cpu(gi);
}

std::int64_t differing_elements(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = test::to_vector(a), y = test::to_vector(b);
  std::int64_t n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(double)) != 0;
  return n;
}

using Param = std::tuple<DType, Layout, PoolMode, std::int64_t>;
class RoiAlignCuda : public ::testing::TestWithParam<Param> {};

TEST_P(RoiAlignCuda, ForwardAndExactBackwardEqualCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  const auto [dt, layout, pool, sr] = GetParam();
  const GpuCase c = make_case(dt, layout, pool, sr);
  const Pooled cpu = forward(c, dt, layout, Device::cpu());
  const Pooled gpu = forward(c, dt, layout, Device::cuda(0));
  EXPECT_TRUE(test::same_bytes(cpu.out, on_cpu(gpu.out))) << "forward output";
  if (pool == PoolMode::kMax) {
    EXPECT_TRUE(test::same_bytes(cpu.argmax, on_cpu(gpu.argmax))) << "argmax";
  }
  const Tensor exact_cpu = backward(c, dt, layout, Device::cpu(), BackwardMode::kExact, cpu.argmax);
  const Tensor exact_gpu = backward(c, dt, layout, Device::cuda(0), BackwardMode::kExact, cpu.argmax);
  EXPECT_TRUE(test::same_bytes(exact_cpu, exact_gpu)) << differing_elements(exact_cpu, exact_gpu) << " elements differ";
  for (int run = 0; run < 3; ++run)
    EXPECT_TRUE(test::same_bytes(exact_gpu, backward(c, dt, layout, Device::cuda(0), BackwardMode::kExact, cpu.argmax)));
}

TEST_P(RoiAlignCuda, TruncatedAndAtomicAgreeWithCpu) {
  DETOPS_REQUIRE_GPU();
  const auto [dt, layout, pool, sr] = GetParam();
  const GpuCase c = make_case(dt, layout, pool, sr);
  const Pooled cpu = forward(c, dt, layout, Device::cpu());
  const double tol = dt == DType::kFloat64 ? 1e-12 : dt == DType::kFloat32 ? 1e-5 : dt == DType::kFloat16 ? 2e-2 : 1e-1;
  for (BackwardMode mode : {BackwardMode::kTruncated, BackwardMode::kAtomic}) {
    const Tensor a = backward(c, dt, layout, Device::cpu(), mode, cpu.argmax);
    const Tensor b = backward(c, dt, layout, Device::cuda(0), mode, cpu.argmax);
    EXPECT_LE(test::max_rel_error(test::to_vector(b), test::to_vector(a)), tol) << to_string(mode);
  }
}

std::string case_name(const ::testing::TestParamInfo<Param>& i) {
  const auto [dt, layout, pool, sr] = i.param;
  return std::string(dtype_name(dt)) + (layout == Layout::kNHWC ? "_nhwc_" : "_nchw_") + to_string(pool) +
         (sr > 0 ? "_sr2" : "_adaptive");
}

INSTANTIATE_TEST_SUITE_P(
    All, RoiAlignCuda,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(Layout::kNCHW, Layout::kNHWC), ::testing::Values(PoolMode::kAvg, PoolMode::kMax),
                       ::testing::Values<std::int64_t>(0, 2)),
    case_name);

// The same problems on a non-blocking stream of the test's own: the roi check's wait, the
// workspace (cudaMallocAsync), the CUB calls and every kernel must be ordered on it alone.
TEST(RoiAlignCudaStreams, NonBlockingStreamGivesTheSameBits) {
  DETOPS_REQUIRE_GPU();
  const test::NonBlockingStream stream;
  if (!stream.ok()) GTEST_SKIP() << "no CUDA runtime in this test build (DETOPS_TEST_CUDART)";
  for (DType dt : {DType::kFloat32, DType::kFloat16})
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
      for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
        for (std::int64_t sr : {std::int64_t{0}, std::int64_t{2}}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (layout == Layout::kNHWC ? " nhwc " : " nchw ")
                                            << to_string(pool) << " sr " << sr);
          const GpuCase c = make_case(dt, layout, pool, sr);
          const Pooled cpu = forward(c, dt, layout, Device::cpu());
          const Pooled gpu = forward(c, dt, layout, Device::cuda(0), &stream);
          EXPECT_TRUE(test::same_bytes(cpu.out, on_cpu(gpu.out))) << "forward output";
          if (pool == PoolMode::kMax) {
            EXPECT_TRUE(test::same_bytes(cpu.argmax, on_cpu(gpu.argmax))) << "argmax";
          }
          EXPECT_TRUE(test::same_bytes(backward(c, dt, layout, Device::cpu(), BackwardMode::kExact, cpu.argmax),
                                       backward(c, dt, layout, Device::cuda(0), BackwardMode::kExact, cpu.argmax, &stream)))
              << "exact backward";
          const double tol = dt == DType::kFloat32 ? 1e-5 : 2e-2;
          for (BackwardMode mode : {BackwardMode::kTruncated, BackwardMode::kAtomic}) {
            const Tensor a = backward(c, dt, layout, Device::cpu(), mode, cpu.argmax);
            const Tensor b = backward(c, dt, layout, Device::cuda(0), mode, cpu.argmax, &stream);
            EXPECT_LE(test::max_rel_error(test::to_vector(b), test::to_vector(a)), tol) << to_string(mode);
          }
        }
}

TEST(RoiAlignCudaDeterminism, TruncatedRepeatsAndAtomicDriftIsReported) {
  DETOPS_REQUIRE_GPU();
  const GpuCase c = make_case(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 2);
  const Tensor first = backward(c, DType::kFloat32, Layout::kNCHW, Device::cuda(0), BackwardMode::kTruncated, {});
  for (int run = 1; run < 20; ++run)
    ASSERT_TRUE(test::same_bytes(first, backward(c, DType::kFloat32, Layout::kNCHW, Device::cuda(0),
                                                 BackwardMode::kTruncated, {})))
        << "truncated run " << run;
  const Tensor a0 = backward(c, DType::kFloat32, Layout::kNCHW, Device::cuda(0), BackwardMode::kAtomic, {});
  std::int64_t worst = 0;
  for (int run = 1; run < 20; ++run)
    worst = std::max(worst, differing_elements(a0, backward(c, DType::kFloat32, Layout::kNCHW, Device::cuda(0),
                                                            BackwardMode::kAtomic, {})));
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
  const Tensor rois = on_gpu(make_tensor({K, 5}, DType::kFloat32, test::random_rois(K, N, 800.0, 1088.0, 31, 16.0, 400.0)));
  const Tensor grad_out = on_gpu(make_tensor(
      {K, C, 7, 7}, DType::kFloat32, test::random_values(static_cast<std::size_t>(K * C * 49), 32, -1e-2, 1e-2)));
  Tensor grad_in = Tensor::empty({N, C, H, W}, DType::kFloat32, Device::cuda(0));
  for (BackwardMode mode : {BackwardMode::kTruncated, BackwardMode::kExact}) {
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_backward(grad_out, rois, grad_in, opt, b);
    const Tensor first = on_cpu(grad_in);
    int distinct_runs = 0;
    for (int run = 1; run < 100; ++run) {
      roi_align_backward(grad_out, rois, grad_in, opt, b);
      if (!test::same_bytes(first, on_cpu(grad_in))) ++distinct_runs;  // memcmp: cheaper than hashing 55 MB
    }
    std::printf("[ %-9s ] 100 runs at Mask R-CNN scale: %d differed from the first\n", to_string(mode),
                distinct_runs);
    EXPECT_EQ(distinct_runs, 0) << to_string(mode);
  }
}

TEST(RoiAlignCudaBadInput, DeviceRoisAreValidatedAndOutputsUntouched) {
  DETOPS_REQUIRE_GPU();
  const GpuCase c = make_case(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 2, 8);
  Tensor rois_cpu = make_tensor({c.K, 5}, DType::kFloat32, test::to_vector(c.rois));
  rois_cpu.data<float>()[7 * 5] = 2.0f;  // batch index out of range for N = 2
  const Tensor rois = on_gpu(rois_cpu);
  Tensor out = Tensor::empty({c.K, c.C, 7, 7}, DType::kFloat32, Device::cuda(0));
  out.fill_bytes(0xA5);
  try {
    roi_align_forward(on_gpu(c.input), rois, out, c.opt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rois[7] has batch index 2; expected an integer in [0, 2)"), std::string::npos)
        << e.what();
  }
  const Tensor back = on_cpu(out);
  const auto* p = static_cast<const unsigned char*>(back.view().data);
  for (std::size_t i = 0; i < back.nbytes(); ++i) ASSERT_EQ(p[i], 0xA5) << "byte " << i;
  // Unchecked: no wait on the stream, and the bad row pools to zeros.
  RoiAlignOptions o = c.opt;
  o.check_rois = false;
  roi_align_forward(on_gpu(c.input), rois, out, o);
  const std::vector<double> v = test::to_vector(on_cpu(out));
  for (std::int64_t i = 0; i < c.C * 49; ++i) ASSERT_EQ(v[static_cast<std::size_t>(7 * c.C * 49 + i)], 0.0);
}

TEST(RoiAlignCudaSemantics, EmptyProblemsAndWorkspaceQuery) {
  DETOPS_REQUIRE_GPU();
  const GpuCase c = make_case(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0, 8);
  Tensor rois = Tensor::empty({0, 5}, DType::kFloat32, Device::cuda(0));
  Tensor out = Tensor::empty({0, c.C, 7, 7}, DType::kFloat32, Device::cuda(0));
  roi_align_forward(on_gpu(c.input), rois, out, c.opt);
  Tensor gi = Tensor::empty({c.N, c.C, c.H, c.W}, DType::kFloat32, Device::cuda(0));
  gi.fill_bytes(0xA5);
  for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    RoiAlignBackwardOptions b;
    b.mode = m;
    roi_align_backward(out, rois, gi, c.opt, b);
    for (double x : test::to_vector(on_cpu(gi))) ASSERT_EQ(x, 0.0) << to_string(m);
  }
  RoiAlignBackwardOptions b;
  const Tensor go = on_gpu(c.grad_output), r = on_gpu(c.rois);
  const std::size_t bytes = roi_align_backward_workspace_size(go, r, gi, c.opt, b);
  EXPECT_GT(bytes, 0u);
}

}  // namespace
}  // namespace detops
