// Finite differences in float64: d(loss)/d(input) and d(loss)/d(grid) of loss = <output,
// grad_output> by central differences, against grad_input and grad_grid of both backward modes,
// for every interpolation x padding x align_corners. Grid points are kept away from the kinks
// (pixel centres, where the bilinear weights switch corners, and the clipping bounds), where the
// derivative is one-sided.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "grid_sample_test_util.h"

namespace detops {
namespace {

double loss(const test::GridSampleProblem& p) {
  Tensor input = test::make_tensor({p.N, p.C, p.H, p.W}, DType::kFloat64, p.input);
  Tensor grid = test::make_tensor({p.N, p.Ho, p.Wo, 2}, DType::kFloat64, p.grid);
  Tensor out = Tensor::empty({p.N, p.C, p.Ho, p.Wo}, DType::kFloat64);
  Context ctx;
  ctx.num_threads = 1;  // many tiny calls
  grid_sample_forward(input, grid, out, p.opt, ctx);
  const std::vector<double> o = test::to_vector(out);
  double s = 0;
  for (std::size_t i = 0; i < o.size(); ++i) s += o[i] * p.grad_output[i];
  return s;
}

/// Distance of a coordinate to the nearest kink of its axis (pixel centres; the reflection
/// and clipping bounds are pixel centres or edges, so half-integers too).
double kink_distance(double g, std::int64_t size, bool align_corners) {
  const double x = align_corners ? (g + 1) / 2 * (size - 1) : ((g + 1) * size - 1) / 2;
  const double twice = 2 * x;
  return std::abs(twice - std::nearbyint(twice)) / 2;
}

TEST(GridSampleGradcheck, MatchesFiniteDifferences) {
  const double h = 1e-6;
  for (const GridSampleOptions& o : test::all_grid_options()) {
    test::GridSampleProblem p = test::make_grid_problem(2, 3, 5, 6, 3, 4, o, 700, 1.6);
    // move grid values away from kinks (the test problem's special points sit on them)
    std::mt19937_64 rng(701);
    std::uniform_real_distribution<double> u(-1.6, 1.6);
    for (std::size_t i = 0; i < p.grid.size(); ++i) {
      const std::int64_t size = i % 2 == 0 ? p.W : p.H;
      while (kink_distance(p.grid[i], size, o.align_corners) < 0.02) p.grid[i] = u(rng);
    }
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
      const test::GridSampleRun r = test::run_grid_sample(p, DType::kFloat64, DType::kFloat64, Layout::kNCHW, mode, 2);
      const std::vector<double> gi = test::to_vector(r.grad_input), gg = test::to_vector(r.grad_grid);
      const std::string what = std::string(to_string(o.interpolation)) + "/" + to_string(o.padding) + "/ac" +
                               std::to_string(o.align_corners) + "/" + to_string(mode);
      for (std::size_t i = 0; i < p.input.size(); i += 3) {
        test::GridSampleProblem q = p;
        q.input[i] += h;
        const double up = loss(q);
        q.input[i] -= 2 * h;
        EXPECT_NEAR((up - loss(q)) / (2 * h), gi[i], 1e-6) << what << " input " << i;
      }
      for (std::size_t i = 0; i < p.grid.size(); ++i) {
        test::GridSampleProblem q = p;
        q.grid[i] += h;
        const double up = loss(q);
        q.grid[i] -= 2 * h;
        EXPECT_NEAR((up - loss(q)) / (2 * h), gg[i], 1e-5) << what << " grid " << i;
      }
    }
  }
}

}  // namespace
}  // namespace detops
