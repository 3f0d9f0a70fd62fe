// grid_sample on CUDA against the CPU backend: the forward, grad_grid and the exact backward to
// the bit (every interpolation x padding x align_corners x dtype, NCHW and NHWC, multi-image
// chunks), the exact mode run to run, and the atomic mode within rounding. Label gpu: every test
// skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "grid_sample_test_util.h"

namespace detops {
namespace {

/// NCHW-ordered values of two tensors compared as bytes (the layouts may differ).
bool same_values(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = test::to_vector(a), y = test::to_vector(b);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

TEST(GridSampleCuda, ExactForwardAndGradGridMatchTheCpuBitwise) {
  DETOPS_REQUIRE_GPU();
  for (const GridSampleOptions& o : test::all_grid_options()) {
    const test::GridSampleProblem p = test::make_grid_problem(3, 7, 9, 11, 13, 17, o, 900, 2.0);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const std::string what = std::string(to_string(o.interpolation)) + "/" + to_string(o.padding) + "/ac" +
                                 std::to_string(o.align_corners) + "/" + std::string(dtype_name(dt)) +
                                 (layout == Layout::kNHWC ? "/nhwc" : "/nchw");
        const test::GridSampleRun cpu = test::run_grid_sample(p, dt, dt, layout, BackwardMode::kExact, 2);
        const test::GridSampleRun gpu =
            test::run_grid_sample(p, dt, dt, layout, BackwardMode::kExact, 0, Device::cuda(0));
        EXPECT_TRUE(same_values(gpu.output, cpu.output)) << what << " output";
        EXPECT_TRUE(same_values(gpu.grad_input, cpu.grad_input)) << what << " grad_input";
        EXPECT_TRUE(test::same_bytes(gpu.grad_grid, cpu.grad_grid)) << what << " grad_grid";
      }
    }
  }
}

TEST(GridSampleCuda, ExactIsBitwiseRunToRunAcrossChunks) {
  DETOPS_REQUIRE_GPU();
  // 300k points per image: one image per chunk, three chunks; crowded borders (long runs)
  const GridSampleOptions o{GridSampleInterpolation::kBilinear, GridSamplePadding::kBorder, false};
  const test::GridSampleProblem p = test::make_grid_problem(3, 4, 16, 16, 500, 600, o, 901, 3.0);
  const test::GridSampleRun cpu = test::run_grid_sample(p, DType::kFloat32, DType::kFloat32, Layout::kNHWC,
                                                        BackwardMode::kExact, 2);
  const test::GridSampleRun first = test::run_grid_sample(p, DType::kFloat32, DType::kFloat32, Layout::kNHWC,
                                                          BackwardMode::kExact, 0, Device::cuda(0));
  EXPECT_TRUE(test::same_bytes(first.grad_input, cpu.grad_input));
  for (int run = 0; run < 3; ++run) {
    const test::GridSampleRun again = test::run_grid_sample(p, DType::kFloat32, DType::kFloat32, Layout::kNHWC,
                                                            BackwardMode::kExact, 0, Device::cuda(0));
    EXPECT_TRUE(test::same_bytes(again.grad_input, first.grad_input)) << "run " << run;
  }
}

TEST(GridSampleCuda, AtomicMatchesTheCpuWithinRounding) {
  DETOPS_REQUIRE_GPU();
  for (const GridSampleOptions& o : test::all_grid_options()) {
    const test::GridSampleProblem p = test::make_grid_problem(2, 6, 8, 9, 20, 30, o, 902, 2.0);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
      const test::GridSampleRun cpu = test::run_grid_sample(p, dt, dt, Layout::kNCHW, BackwardMode::kAtomic, 2);
      const test::GridSampleRun gpu =
          test::run_grid_sample(p, dt, dt, Layout::kNCHW, BackwardMode::kAtomic, 0, Device::cuda(0));
      const double tol = dt == DType::kBFloat16 ? 5e-2 : dt == DType::kFloat32 ? 1e-5 : 1e-12;
      EXPECT_LE(test::max_error_to_peak(test::to_vector(gpu.grad_input), test::to_vector(cpu.grad_input)), tol)
          << to_string(o.padding) << " " << dtype_name(dt);
      EXPECT_TRUE(test::same_bytes(gpu.grad_grid, cpu.grad_grid));
    }
  }
}

TEST(GridSampleCuda, WorkspaceQueryAndCallerWorkspace) {
  DETOPS_REQUIRE_GPU();
  const GridSampleOptions o{GridSampleInterpolation::kBilinear, GridSamplePadding::kReflection, true};
  const test::GridSampleProblem p = test::make_grid_problem(2, 3, 8, 8, 10, 12, o, 903);
  const test::GridSampleRun cpu = test::run_grid_sample(p, DType::kFloat32, DType::kFloat32, Layout::kNCHW,
                                                        BackwardMode::kExact, 1);
  test::GridSampleTensors host = test::grid_tensors(p, DType::kFloat32, DType::kFloat32, Layout::kNCHW);
  const Device dev = Device::cuda(0);
  Tensor input = host.input.to(dev), grid = host.grid.to(dev), go = host.grad_output.to(dev);
  Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, DType::kFloat32, dev);
  const std::size_t bytes = grid_sample_backward_workspace_size(go, input, grid, gi, {}, o, {});
  ASSERT_GT(bytes, 0u);
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::kFloat32, dev);  // 4x the bytes: plenty
  grid_sample_backward(go, input, grid, gi, {}, o, {}, {}, Workspace{ws.view().data, bytes});
  EXPECT_TRUE(test::same_bytes(gi.to(Device::cpu()), cpu.grad_input));
}

}  // namespace
}  // namespace detops
