// deform_conv2d on CUDA against the CPU backend: the forward and every gradient of the exact mode
// to the bit (every configuration x dtype, NCHW and NHWC, multi-image chunks), run to run, and the
// atomic mode (grad_input within rounding, the rest to the bit). Label gpu: every test skips
// without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "deform_conv2d_test_util.h"
#include "gpu_test.h"

namespace detops {
namespace {

/// NCHW-ordered values of two tensors compared as bytes (the layouts may differ).
bool same_values(const Tensor& a, const Tensor& b) {
  if (!a.view().defined() && !b.view().defined()) return true;
  const std::vector<double> x = test::to_vector(a), y = test::to_vector(b);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

void expect_same(const test::DeformConv2dRun& gpu, const test::DeformConv2dRun& cpu, const std::string& what,
                 bool grad_input = true) {
  EXPECT_TRUE(same_values(gpu.output, cpu.output)) << what << " output";
  if (grad_input) {
    EXPECT_TRUE(same_values(gpu.grad_input, cpu.grad_input)) << what << " grad_input";
  }
  EXPECT_TRUE(same_values(gpu.grad_weight, cpu.grad_weight)) << what << " grad_weight";
  EXPECT_TRUE(same_values(gpu.grad_offset, cpu.grad_offset)) << what << " grad_offset";
  EXPECT_TRUE(same_values(gpu.grad_mask, cpu.grad_mask)) << what << " grad_mask";
  EXPECT_TRUE(same_values(gpu.grad_bias, cpu.grad_bias)) << what << " grad_bias";
}

TEST(DeformConv2dCuda, ExactMatchesTheCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  const std::vector<test::DeformConv2dConfig> configs = test::deform_configs();
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const test::DeformConv2dProblem p = test::make_deform_problem(configs[i], 60 + i);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const std::string what = "config " + std::to_string(i) + " " + std::string(dtype_name(dt)) +
                                 (layout == Layout::kNHWC ? " nhwc" : " nchw");
        const test::DeformConv2dRun cpu = test::run_deform_conv2d(p, dt, layout, BackwardMode::kExact, 2);
        const test::DeformConv2dRun gpu =
            test::run_deform_conv2d(p, dt, layout, BackwardMode::kExact, 0, Device::cuda(0));
        expect_same(gpu, cpu, what);
        const test::DeformConv2dRun atomic =
            test::run_deform_conv2d(p, dt, layout, BackwardMode::kAtomic, 0, Device::cuda(0));
        expect_same(atomic, cpu, what + " atomic", false);
        EXPECT_LE(test::max_error_to_peak(test::to_vector(atomic.grad_input), test::to_vector(cpu.grad_input)),
                  dt == DType::kFloat16 || dt == DType::kBFloat16 ? 3e-2 : 1e-5)
            << what << " atomic grad_input";
      }
    }
  }
}

TEST(DeformConv2dCuda, ExactIsBitwiseRunToRunAcrossChunks) {
  DETOPS_REQUIRE_GPU();
  // 7 images of 663552 column elements: chunks of 6 and 1 (deform_conv2d_test.cpp's case)
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  const test::DeformConv2dProblem p = test::make_deform_problem({7, 32, 48, 48, 8, 3, 3, 2, 4, o, true, true}, 61);
  const test::DeformConv2dRun cpu = test::run_deform_conv2d(p, DType::kFloat32, Layout::kNHWC, BackwardMode::kExact, 2);
  const test::DeformConv2dRun first =
      test::run_deform_conv2d(p, DType::kFloat32, Layout::kNHWC, BackwardMode::kExact, 0, Device::cuda(0));
  expect_same(first, cpu, "first run");
  for (int run = 0; run < 3; ++run)
    expect_same(test::run_deform_conv2d(p, DType::kFloat32, Layout::kNHWC, BackwardMode::kExact, 0, Device::cuda(0)),
                first, "run " + std::to_string(run));
}

}  // namespace
}  // namespace detops
