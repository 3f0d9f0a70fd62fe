// RoIAlignRotated on CUDA against the CPU backend (label gpu). Plain C++ over the public API,
// built in every configuration; every test skips with a message when no CUDA device is present.
//   - forward and exact backward: CUDA == CPU byte for byte, every dtype x layout x sampling, and
//     the exact backward identical over repeated runs;
//   - truncated backward: float64 (the exact mode's phases, the CPU's order) CUDA == CPU byte for
//     byte; other dtypes within a rounding of the CPU's;
//   - atomic backward: within a bound relative to max |cpu|;
//   - bad rois in device memory: the documented error, grad_input untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;

Tensor on_gpu(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor on_cpu(const Tensor& t) { return t.to(Device::cpu()); }

struct GpuCase {
  Tensor input, rois, grad_output;
  RoiAlignRotatedOptions opt;
  std::int64_t N = 2, C = 32, H = 50, W = 68, K = 256;
};

GpuCase make_case(DType dt, Layout layout, std::int64_t sr) {
  GpuCase c;
  c.opt.spatial_scale = 0.25;
  c.opt.sampling_ratio = sr;
  c.input = make_tensor({c.N, c.C, c.H, c.W}, dt,
                        test::random_values(static_cast<std::size_t>(c.N * c.C * c.H * c.W), 21), layout);
  std::vector<double> r = test::random_values(static_cast<std::size_t>(c.K * 6), 22, 0.0, 1.0);
  for (std::int64_t k = 0; k < c.K; ++k) {
    double* row = &r[static_cast<std::size_t>(k * 6)];
    row[0] = k % c.N, row[1] = 272 * row[1], row[2] = 200 * row[2];
    row[3] = 4 + 120 * row[3], row[4] = 4 + 80 * row[4], row[5] = -90 + 180 * row[5];
  }
  c.rois = make_tensor({c.K, 6}, DType::kFloat32, r);
  c.grad_output = make_tensor({c.K, c.C, 7, 7}, dt,
                              test::random_values(static_cast<std::size_t>(c.K * c.C * 49), 23, -1e-2, 1e-2), layout);
  return c;
}

Tensor forward(const GpuCase& c, DType dt, Layout layout, Device dev) {
  Tensor out = Tensor::empty({c.K, c.C, 7, 7}, dt, dev, layout);
  roi_align_rotated_forward(dev.is_cpu() ? c.input : on_gpu(c.input), dev.is_cpu() ? c.rois : on_gpu(c.rois), out, c.opt);
  return on_cpu(out);
}

Tensor backward(const GpuCase& c, DType dt, Layout layout, Device dev, BackwardMode mode) {
  Tensor gi = Tensor::empty({c.N, c.C, c.H, c.W}, dt, dev, layout);
  RoiAlignBackwardOptions b;
  b.mode = mode;
  roi_align_rotated_backward(dev.is_cpu() ? c.grad_output : on_gpu(c.grad_output),
                             dev.is_cpu() ? c.rois : on_gpu(c.rois), gi, c.opt, b);
  return on_cpu(gi);
}

using Param = std::tuple<DType, Layout, std::int64_t>;
class RoiAlignRotatedCuda : public ::testing::TestWithParam<Param> {};

TEST_P(RoiAlignRotatedCuda, ForwardAndExactBackwardEqualCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  const auto [dt, layout, sr] = GetParam();
  const GpuCase c = make_case(dt, layout, sr);
  EXPECT_TRUE(test::same_bytes(forward(c, dt, layout, Device::cpu()), forward(c, dt, layout, Device::cuda(0))));
  const Tensor cpu = backward(c, dt, layout, Device::cpu(), BackwardMode::kExact);
  for (int run = 0; run < 3; ++run)
    EXPECT_TRUE(test::same_bytes(cpu, backward(c, dt, layout, Device::cuda(0), BackwardMode::kExact))) << run;
}

TEST_P(RoiAlignRotatedCuda, TruncatedAndAtomicAgreeWithCpu) {
  DETOPS_REQUIRE_GPU();
  const auto [dt, layout, sr] = GetParam();
  const GpuCase c = make_case(dt, layout, sr);
  const Tensor cpu_t = backward(c, dt, layout, Device::cpu(), BackwardMode::kTruncated);
  const Tensor gpu_t = backward(c, dt, layout, Device::cuda(0), BackwardMode::kTruncated);
  if (dt == DType::kFloat64) {
    EXPECT_TRUE(test::same_bytes(cpu_t, gpu_t));
  }
  const double peak = test::max_abs(test::to_vector(cpu_t));
  EXPECT_GT(peak, 0.0);
  const double bound = dt == DType::kFloat16 ? 1.0 / 128 : dt == DType::kBFloat16 ? 1.0 / 16 : 1e-5;
  EXPECT_LE(test::max_error_to_peak(test::to_vector(gpu_t), test::to_vector(cpu_t)), bound);
  const Tensor gpu_a = backward(c, dt, layout, Device::cuda(0), BackwardMode::kAtomic);
  EXPECT_LE(test::max_error_to_peak(test::to_vector(gpu_a), test::to_vector(cpu_t)), bound);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dt, layout, sr] = info.param;
  return std::string(dtype_name(dt)) + (layout == Layout::kNHWC ? "_nhwc" : "_nchw") +
         (sr > 0 ? "_sr" + std::to_string(sr) : "_adaptive");
}

INSTANTIATE_TEST_SUITE_P(All, RoiAlignRotatedCuda,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::Values(Layout::kNCHW, Layout::kNHWC),
                                            ::testing::Values(std::int64_t{2}, std::int64_t{0})),
                         param_name);

TEST(RoiAlignRotatedCudaBadInput, NegativeSizeOnTheDeviceLeavesGradInputUntouched) {
  DETOPS_REQUIRE_GPU();
  GpuCase c = make_case(DType::kFloat32, Layout::kNCHW, 2);
  c.rois.data<float>()[5 * 6 + 4] = -3;
  Tensor gi = Tensor::empty({c.N, c.C, c.H, c.W}, DType::kFloat32, Device::cuda(0));
  gi.fill_bytes(0x5A);
  const Tensor before = on_cpu(gi);
  RoiAlignBackwardOptions b;
  try {
    roi_align_rotated_backward(on_gpu(c.grad_output), on_gpu(c.rois), gi, c.opt, b);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rois[5] has size (w, h)"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(test::same_bytes(before, on_cpu(gi)));
}

}  // namespace
}  // namespace detops
