// A float64 reference of grid_sample written from the documented math (include/detops/grid_sample.h)
// rather than from the kernels: the textbook unnormalization ((g + 1) * size - 1) / 2, reflection
// by fmod, bilinear weights and their derivatives. Plain loops over NCHW-ordered vectors.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "detops/grid_sample.h"

namespace detops {
namespace test {

struct GridSampleProblem {
  std::int64_t N, C, H, W, Ho, Wo;
  GridSampleOptions opt;
  std::vector<double> input;        // [N, C, H, W]
  std::vector<double> grid;         // [N, Ho, Wo, 2]
  std::vector<double> grad_output;  // [N, C, Ho, Wo]
};

struct GridSampleResult {
  std::vector<double> output, grad_input, grad_grid;
};

namespace ref {

/// Coordinate and d(coordinate)/d(grid) of one axis after unnormalization and padding.
inline void source_coord(double g, std::int64_t size, const GridSampleOptions& o, double* x, double* dx) {
  const bool ac = o.align_corners;
  *x = ac ? (g + 1) / 2 * (size - 1) : ((g + 1) * size - 1) / 2;
  *dx = ac ? (size - 1) / 2.0 : size / 2.0;
  if (o.padding == GridSamplePadding::kZeros) return;
  if (o.padding == GridSamplePadding::kReflection) {
    const double lo = ac ? 0.0 : -0.5, hi = ac ? size - 1.0 : size - 0.5;
    if (hi <= lo) {
      *x = 0;
      *dx = 0;
      return;
    }
    const double span = hi - lo;
    if (!std::isfinite(*x)) *x = std::nan("");  // reflecting an infinity gives NaN (fmod), clipped below
    double d = *x - lo;
    double sign = 1;
    if (d < 0) d = -d, sign = -1;
    const double extra = std::fmod(d, span);
    const auto flips = std::isnan(d) ? std::int64_t{0} : static_cast<std::int64_t>(std::floor(d / span));
    if (flips % 2 == 0) {
      *x = lo + extra;
    } else {
      *x = hi - extra;
      sign = -sign;
    }
    *dx *= sign;
  }
  if (!(*x > 0)) {  // NaN clips to 0, as PyTorch's clip_coordinates
    *x = 0;
    *dx = 0;
  } else if (*x >= size - 1) {
    *x = static_cast<double>(size - 1);
    *dx = 0;
  }
}

}  // namespace ref

/// Forward, grad_input and grad_grid of a problem (grad_output must be set for the backward).
inline GridSampleResult grid_sample_reference(const GridSampleProblem& p) {
  GridSampleResult r;
  const std::int64_t N = p.N, C = p.C, H = p.H, W = p.W, Ho = p.Ho, Wo = p.Wo;
  r.output.assign(static_cast<std::size_t>(N * C * Ho * Wo), 0.0);
  r.grad_input.assign(static_cast<std::size_t>(N * C * H * W), 0.0);
  r.grad_grid.assign(static_cast<std::size_t>(N * Ho * Wo * 2), 0.0);
  const bool backward = !p.grad_output.empty();
  auto in = [&](std::int64_t n, std::int64_t c, std::int64_t y, std::int64_t x) {
    if (y < 0 || y >= H || x < 0 || x >= W) return 0.0;
    return p.input[static_cast<std::size_t>(((n * C + c) * H + y) * W + x)];
  };
  auto add_gi = [&](std::int64_t n, std::int64_t c, std::int64_t y, std::int64_t x, double v) {
    if (y < 0 || y >= H || x < 0 || x >= W) return;
    r.grad_input[static_cast<std::size_t>(((n * C + c) * H + y) * W + x)] += v;
  };
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t ho = 0; ho < Ho; ++ho)
      for (std::int64_t wo = 0; wo < Wo; ++wo) {
        const std::size_t gp = static_cast<std::size_t>(((n * Ho + ho) * Wo + wo) * 2);
        double x, dxm, y, dym;
        if (p.opt.coordinates == GridSampleCoordinates::kUnit) {  // g = 2c - 1: dg/dc = 2
          ref::source_coord(2 * p.grid[gp] - 1, W, p.opt, &x, &dxm);
          ref::source_coord(2 * p.grid[gp + 1] - 1, H, p.opt, &y, &dym);
          dxm *= 2;
          dym *= 2;
        } else {
          ref::source_coord(p.grid[gp], W, p.opt, &x, &dxm);
          ref::source_coord(p.grid[gp + 1], H, p.opt, &y, &dym);
        }
        if (!std::isfinite(x) || !std::isfinite(y)) {
          // (zeros padding) nearest samples nothing; bilinear reads no pixel but weighs the zeros
          // with NaN fractions: a NaN sample, and grad_grid NaN along the axis whose weights use
          // the non-finite coordinate's fraction (x's derivative weighs by y's, and y's by x's)
          if (p.opt.interpolation == GridSampleInterpolation::kNearest) continue;
          for (std::int64_t c = 0; c < C; ++c) r.output[static_cast<std::size_t>(((n * C + c) * Ho + ho) * Wo + wo)] = std::nan("");
          if (backward && C > 0) {
            r.grad_grid[gp] = std::isfinite(y) ? 0.0 : std::nan("");
            r.grad_grid[gp + 1] = std::isfinite(x) ? 0.0 : std::nan("");
          }
          continue;
        }
        double gx = 0, gy = 0;
        for (std::int64_t c = 0; c < C; ++c) {
          const std::size_t o = static_cast<std::size_t>(((n * C + c) * Ho + ho) * Wo + wo);
          const double g = backward ? p.grad_output[o] : 0.0;
          if (p.opt.interpolation == GridSampleInterpolation::kNearest) {
            const auto ix = static_cast<std::int64_t>(std::nearbyint(x)), iy = static_cast<std::int64_t>(std::nearbyint(y));
            r.output[o] = in(n, c, iy, ix);
            add_gi(n, c, iy, ix, g);
            continue;
          }
          const double fx = std::floor(x), fy = std::floor(y);
          const auto x0 = static_cast<std::int64_t>(fx), y0 = static_cast<std::int64_t>(fy);
          const double ax = x - fx, ay = y - fy;
          const double v00 = in(n, c, y0, x0), v01 = in(n, c, y0, x0 + 1), v10 = in(n, c, y0 + 1, x0),
                       v11 = in(n, c, y0 + 1, x0 + 1);
          r.output[o] = v00 * (1 - ax) * (1 - ay) + v01 * ax * (1 - ay) + v10 * (1 - ax) * ay + v11 * ax * ay;
          add_gi(n, c, y0, x0, g * (1 - ax) * (1 - ay));
          add_gi(n, c, y0, x0 + 1, g * ax * (1 - ay));
          add_gi(n, c, y0 + 1, x0, g * (1 - ax) * ay);
          add_gi(n, c, y0 + 1, x0 + 1, g * ax * ay);
          gx += g * ((v01 - v00) * (1 - ay) + (v11 - v10) * ay);
          gy += g * ((v10 - v00) * (1 - ax) + (v11 - v01) * ax);
        }
        r.grad_grid[gp] = gx * dxm;
        r.grad_grid[gp + 1] = gy * dym;
      }
  return r;
}

}  // namespace test
}  // namespace detops
