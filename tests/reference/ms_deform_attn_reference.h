// Slow, deliberately simple float64 multi-scale deformable attention reference (forward and the
// three gradients) for tests. It shares nothing with the library: std::vector<double> in
// row-major order, one loop nest per formula, written from include/detops/ms_deform_attn.h.
// tests/ms_deform_attn_golden_test.cpp checks the library against PyTorch's grid_sample
// composition; this reference also covers what the goldens leave out (the -1 boundary).
//
// Per sample (b, q, m, l, p) with level l of H x W rows starting at start_l:
//   x = loc_x * W - 0.5, y = loc_y * H - 0.5; skipped unless -1 < x < W and -1 < y < H
//   x0 = floor(x), y0 = floor(y), fx = x - x0, fy = y - y0
//   corners (y0, x0), (y0, x0+1), (y0+1, x0), (y0+1, x0+1) with weights
//   (1-fy)(1-fx), (1-fy) fx, fy (1-fx), fy fx; a corner outside the level reads 0
//   output[b, q, m*D + d] += attn * bilinear
//   d bilinear / d x = (1-fy)(v1 - v0) + fy (v3 - v2), times W for loc_x (d / d y likewise, times H)
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace detops {
namespace ref {

struct MsdaProblemRef {
  std::int64_t B = 0, S = 0, M = 0, D = 0, Q = 0, L = 0, P = 0;
  std::vector<std::int64_t> shapes;  // L x (H, W)
  std::vector<double> value;         // [B, S, M, D]
  std::vector<double> loc;           // [B, Q, M, L, P, 2]
  std::vector<double> attn;          // [B, Q, M, L, P]

  std::int64_t start(std::int64_t l) const {
    std::int64_t s = 0;
    for (std::int64_t i = 0; i < l; ++i) s += shapes[2 * i] * shapes[2 * i + 1];
    return s;
  }
  std::int64_t sample_index(std::int64_t b, std::int64_t q, std::int64_t m, std::int64_t l, std::int64_t p) const {
    return (((b * Q + q) * M + m) * L + l) * P + p;
  }
  double v(std::int64_t b, std::int64_t s, std::int64_t m, std::int64_t d) const {
    return value[static_cast<std::size_t>(((b * S + s) * M + m) * D + d)];
  }
};

/// One sample's geometry: valid, and for each corner its row of S (-1 outside) and weight.
struct MsdaCornersRef {
  bool valid = false;
  double fx = 0, fy = 0;
  std::int64_t row[4] = {-1, -1, -1, -1};
  double w[4] = {0, 0, 0, 0};
};

inline MsdaCornersRef msda_corners_ref(const MsdaProblemRef& pr, std::int64_t l, double loc_x, double loc_y) {
  MsdaCornersRef c;
  const std::int64_t H = pr.shapes[2 * l], W = pr.shapes[2 * l + 1];
  const double x = loc_x * static_cast<double>(W) - 0.5, y = loc_y * static_cast<double>(H) - 0.5;
  if (!(x > -1.0 && x < static_cast<double>(W) && y > -1.0 && y < static_cast<double>(H))) return c;
  c.valid = true;
  const double x0 = std::floor(x), y0 = std::floor(y);
  c.fx = x - x0;
  c.fy = y - y0;
  for (int k = 0; k < 4; ++k) {
    const std::int64_t yy = static_cast<std::int64_t>(y0) + k / 2, xx = static_cast<std::int64_t>(x0) + k % 2;
    c.w[k] = (k / 2 ? c.fy : 1.0 - c.fy) * (k % 2 ? c.fx : 1.0 - c.fx);
    if (yy >= 0 && yy < H && xx >= 0 && xx < W) c.row[k] = pr.start(l) + yy * W + xx;
  }
  return c;
}

/// output [B, Q, M * D].
inline std::vector<double> msda_forward_ref(const MsdaProblemRef& pr) {
  std::vector<double> out(static_cast<std::size_t>(pr.B * pr.Q * pr.M * pr.D), 0.0);
  for (std::int64_t b = 0; b < pr.B; ++b)
    for (std::int64_t q = 0; q < pr.Q; ++q)
      for (std::int64_t m = 0; m < pr.M; ++m)
        for (std::int64_t l = 0; l < pr.L; ++l)
          for (std::int64_t p = 0; p < pr.P; ++p) {
            const std::int64_t i = pr.sample_index(b, q, m, l, p);
            const MsdaCornersRef c = msda_corners_ref(pr, l, pr.loc[2 * i], pr.loc[2 * i + 1]);
            if (!c.valid) continue;
            for (std::int64_t d = 0; d < pr.D; ++d) {
              double val = 0;
              for (int k = 0; k < 4; ++k)
                if (c.row[k] >= 0) val += c.w[k] * pr.v(b, c.row[k], m, d);
              out[static_cast<std::size_t>(((b * pr.Q + q) * pr.M + m) * pr.D + d)] += pr.attn[i] * val;
            }
          }
  return out;
}

struct MsdaGradsRef {
  std::vector<double> value, loc, attn;
};

/// The three gradients from grad_output [B, Q, M * D].
inline MsdaGradsRef msda_backward_ref(const MsdaProblemRef& pr, const std::vector<double>& grad_out) {
  MsdaGradsRef g;
  g.value.assign(pr.value.size(), 0.0);
  g.loc.assign(pr.loc.size(), 0.0);
  g.attn.assign(pr.attn.size(), 0.0);
  for (std::int64_t b = 0; b < pr.B; ++b)
    for (std::int64_t q = 0; q < pr.Q; ++q)
      for (std::int64_t m = 0; m < pr.M; ++m)
        for (std::int64_t l = 0; l < pr.L; ++l)
          for (std::int64_t p = 0; p < pr.P; ++p) {
            const std::int64_t i = pr.sample_index(b, q, m, l, p);
            const MsdaCornersRef c = msda_corners_ref(pr, l, pr.loc[2 * i], pr.loc[2 * i + 1]);
            if (!c.valid) continue;
            const double H = static_cast<double>(pr.shapes[2 * l]), W = static_cast<double>(pr.shapes[2 * l + 1]);
            for (std::int64_t d = 0; d < pr.D; ++d) {
              const double go = grad_out[static_cast<std::size_t>(((b * pr.Q + q) * pr.M + m) * pr.D + d)];
              double v[4], val = 0;
              for (int k = 0; k < 4; ++k) {
                v[k] = c.row[k] >= 0 ? pr.v(b, c.row[k], m, d) : 0.0;
                val += c.w[k] * v[k];
                if (c.row[k] >= 0)
                  g.value[static_cast<std::size_t>(((b * pr.S + c.row[k]) * pr.M + m) * pr.D + d)] +=
                      go * pr.attn[i] * c.w[k];
              }
              const double dx = (1.0 - c.fy) * (v[1] - v[0]) + c.fy * (v[3] - v[2]);
              const double dy = (1.0 - c.fx) * (v[2] - v[0]) + c.fx * (v[3] - v[1]);
              g.loc[2 * i] += go * pr.attn[i] * dx * W;
              g.loc[2 * i + 1] += go * pr.attn[i] * dy * H;
              g.attn[i] += go * val;
            }
          }
  return g;
}

}  // namespace ref
}  // namespace detops
