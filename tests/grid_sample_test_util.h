// Helpers shared by the grid_sample tests: seeded problems, and the op run on tensors of any
// dtype, grid dtype and layout (CPU or a device), results read back as NCHW-ordered doubles.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "detops/detops.h"
#include "reference/grid_sample_reference.h"
#include "test_util.h"

namespace detops {
namespace test {

/// A seeded problem: input and grad_output in [-1, 1]; grid values in [-range, range] (beyond
/// [-1, 1] so padding matters), with every `special`-th point moved to a border case: exactly
/// -1 or 1, the last pixel's centre, or one pixel outside.
inline GridSampleProblem make_grid_problem(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W,
                                           std::int64_t Ho, std::int64_t Wo, const GridSampleOptions& opt,
                                           std::uint64_t seed, double range = 1.3) {
  GridSampleProblem p{N, C, H, W, Ho, Wo, opt, {}, {}, {}};
  p.input = random_values(static_cast<std::size_t>(N * C * H * W), seed);
  p.grid = random_values(static_cast<std::size_t>(N * Ho * Wo * 2), seed + 1, -range, range);
  p.grad_output = random_values(static_cast<std::size_t>(N * C * Ho * Wo), seed + 2);
  const double specials[] = {-1.0, 1.0, 1.0 - 1.0 / static_cast<double>(W), -1.0 - 2.0 / static_cast<double>(W), 0.0};
  for (std::size_t i = 0; i < p.grid.size(); i += 7) p.grid[i] = specials[(i / 7) % 5];
  return p;
}

/// The tensors of one run: CPU (or `dev`) tensors in dtype `dt` (grid in `gdt`), layout `layout`.
struct GridSampleTensors {
  Tensor input, grid, grad_output;
};

inline GridSampleTensors grid_tensors(const GridSampleProblem& p, DType dt, DType gdt, Layout layout) {
  GridSampleTensors t;
  t.input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input, layout);
  t.grid = make_tensor({p.N, p.Ho, p.Wo, 2}, gdt, p.grid);
  t.grad_output = make_tensor({p.N, p.C, p.Ho, p.Wo}, dt, p.grad_output, layout);
  return t;
}

/// The problem as the library sees it after storing in these dtypes (for the reference).
inline GridSampleProblem rounded_problem(const GridSampleProblem& p, DType dt, DType gdt) {
  GridSampleProblem r = p;
  const GridSampleTensors t = grid_tensors(p, dt, gdt, Layout::kNCHW);
  r.input = to_vector(t.input);
  r.grid = to_vector(t.grid);
  r.grad_output = to_vector(t.grad_output);
  return r;
}

/// Forward and backward outputs as tensors (kept for bitwise comparisons).
struct GridSampleRun {
  Tensor output, grad_input, grad_grid;
};

inline GridSampleRun run_grid_sample(const GridSampleProblem& p, DType dt, DType gdt, Layout layout, BackwardMode mode,
                                     int threads, Device dev = Device::cpu(), CpuIsa isa = CpuIsa::kAuto) {
  GridSampleTensors host = grid_tensors(p, dt, gdt, layout);
  Tensor input = host.input.to(dev), grid = host.grid.to(dev), go = host.grad_output.to(dev);
  GridSampleRun r;
  r.output = Tensor::empty({p.N, p.C, p.Ho, p.Wo}, dt, dev, layout);
  r.grad_input = Tensor::empty({p.N, p.C, p.H, p.W}, dt, dev, layout);
  r.grad_grid = Tensor::empty({p.N, p.Ho, p.Wo, 2}, gdt, dev);
  Context ctx;
  ctx.num_threads = threads;
  ctx.cpu_isa = isa;
  grid_sample_forward(input, grid, r.output, p.opt, ctx);
  GridSampleBackwardOptions b;
  b.mode = mode;
  grid_sample_backward(go, input, grid, r.grad_input, r.grad_grid, p.opt, b, ctx);
  if (!dev.is_cpu()) {
    r.output = r.output.to(Device::cpu());
    r.grad_input = r.grad_input.to(Device::cpu());
    r.grad_grid = r.grad_grid.to(Device::cpu());
  }
  return r;
}

/// Every (interpolation, padding, align_corners) combination.
inline std::vector<GridSampleOptions> all_grid_options() {
  std::vector<GridSampleOptions> v;
  for (auto interp : {GridSampleInterpolation::kBilinear, GridSampleInterpolation::kNearest})
    for (auto pad : {GridSamplePadding::kZeros, GridSamplePadding::kBorder, GridSamplePadding::kReflection})
      for (bool ac : {false, true}) v.push_back({interp, pad, ac});
  return v;
}

}  // namespace test
}  // namespace detops
