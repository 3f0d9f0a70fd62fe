// A float64 reference of deform_conv2d (forward and every gradient) written from the documented
// math (include/detops/deform_conv2d.h, torchvision.ops.deform_conv2d's semantics) rather than
// from the kernels: plain loops over NCHW-ordered vectors, no GEMM, no chunking, no shared code
// with the library.
//
// Per sample s = (n, c, i, j, ho, wo), with g = c's offset group and t = g * kh * kw + i * kw + j:
//   y = ho * stride_h - pad_h + i * dilation_h + offset[n, 2 t, ho, wo]     (x alike, 2 t + 1)
//   m = mask[n, t, ho, wo] (1 without a mask)
//   column(s) = m * bilinear(input[n, c], y, x)
//   output[n, o, ho, wo] = bias[o] + sum over (c, i, j) of o's group of weight[o, c', i, j] column(s)
// and backward, with grad_column(s) = sum over o of c's group of weight[o, c', i, j] grad_output:
//   grad_input   every pixel (yp, xp) of the map with |y - yp| < 1 and |x - xp| < 1 receives
//                m * (1 - |y - yp|) * (1 - |x - xp|) * grad_column(s)
//   grad_offset  m * coordinate_weight(y or x) * grad_column(s), summed over the offset group's
//                channels c in increasing order
//   grad_mask    grad_column(s) * bilinear(input[n, c], y, x), summed alike
//   grad_weight  sum over (n, ho, wo) of grad_output * column(s); grad_bias  sum of grad_output.
//
// The boundary rules are torchvision's, and they are not all one function's derivatives:
//   - bilinear is 0 when y <= -1, y >= H, x <= -1 or x >= W (an early return), otherwise the
//     four corners floor(y), floor(y) + 1 (and x) with weights hh*hw, hh*lw, lh*hw, lh*lw, a
//     corner outside the map reading 0;
//   - coordinate_weight has no early return: only the corners' validity counts. So at y exactly
//     -1 (forward 0) the y derivative is the one from above (row 0 weighted by the x fractions),
//     and at y exactly H - 1 it is -(row H - 1's interpolation) (the row H above reads 0); at an
//     integer y inside the map it is row floor(y) + 1 minus row floor(y), again from above;
//   - grad_input's "|y - yp| < 1" rule gives nothing at y = -1 or y >= H, and at an integer y only
//     the row y itself (weight 1): the same as the forward's weights there.
// mmcv's and detectron2's rule (DeformBorderRule::kMmcv; their get_coordinate_weight returns
// early): coordinate_weight is 0 unless -1 < y < H and -1 < x < W, which differs from the above
// only at a coordinate of exactly -1; everything else is the same.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detops/deform_conv2d.h"

namespace detops {
namespace test {

struct DeformConv2dProblem {
  std::int64_t N, Cin, H, W, Cout, kh, kw, groups, offset_groups;
  DeformConv2dOptions opt;
  bool has_mask, has_bias;
  std::vector<double> input;        // [N, Cin, H, W]
  std::vector<double> weight;       // [Cout, Cin / groups, kh, kw]
  std::vector<double> offset;       // [N, 2 * offset_groups * kh * kw, Ho, Wo]
  std::vector<double> mask;         // [N, offset_groups * kh * kw, Ho, Wo], or empty
  std::vector<double> bias;         // [Cout], or empty
  std::vector<double> grad_output;  // [N, Cout, Ho, Wo] (empty: forward only)
  DeformBorderRule border_rule = DeformBorderRule::kTorchvision;  // grad_offset's rule (see the top)

  std::int64_t Ho() const { return (H + 2 * opt.pad_h - (opt.dilation_h * (kh - 1) + 1)) / opt.stride_h + 1; }
  std::int64_t Wo() const { return (W + 2 * opt.pad_w - (opt.dilation_w * (kw - 1) + 1)) / opt.stride_w + 1; }
};

struct DeformConv2dResult {
  std::vector<double> output, grad_input, grad_weight, grad_offset;
  std::vector<double> grad_mask;  // empty without a mask
  std::vector<double> grad_bias;  // empty without a bias
};

namespace ref {

/// torchvision's forward bilinear sample of an H x W plane at (y, x).
inline double deform_bilinear(const double* plane, std::int64_t H, std::int64_t W, double y, double x) {
  if (std::isnan(y) || std::isnan(x)) return std::nan("");  // torchvision's weights make NaN of it
  if (y <= -1 || y >= static_cast<double>(H) || x <= -1 || x >= static_cast<double>(W)) return 0.0;
  const double fy = std::floor(y), fx = std::floor(x);
  const auto y0 = static_cast<std::int64_t>(fy), x0 = static_cast<std::int64_t>(fx);
  const double lh = y - fy, lw = x - fx, hh = 1 - lh, hw = 1 - lw;
  auto at = [&](std::int64_t yy, std::int64_t xx) {
    return (yy < 0 || yy >= H || xx < 0 || xx >= W) ? 0.0 : plane[yy * W + xx];
  };
  return hh * hw * at(y0, x0) + hh * lw * at(y0, x0 + 1) + lh * hw * at(y0 + 1, x0) + lh * lw * at(y0 + 1, x0 + 1);
}

/// torchvision's derivative of the sample at (y, x) along y (y_direction) or x: the four corners
/// floor, floor + 1 with those outside the map reading 0, and no early return (see the top).
inline double deform_coordinate_weight(const double* plane, std::int64_t H, std::int64_t W, double y, double x,
                                       bool y_direction) {
  if (std::isnan(y) || std::isnan(x)) return std::nan("");
  const double fy = std::floor(y), fx = std::floor(x);
  // Validity is decided on the doubles, so a far-away coordinate never overflows an integer.
  auto at = [&](double yy, double xx) {
    if (!(yy >= 0 && yy < static_cast<double>(H) && xx >= 0 && xx < static_cast<double>(W))) return 0.0;
    return plane[static_cast<std::int64_t>(yy) * W + static_cast<std::int64_t>(xx)];
  };
  const double v00 = at(fy, fx), v01 = at(fy, fx + 1), v10 = at(fy + 1, fx), v11 = at(fy + 1, fx + 1);
  if (y_direction) {
    const double dx = x - fx;
    return dx * (v11 - v01) + (1 - dx) * (v10 - v00);
  }
  const double dy = y - fy;
  return dy * (v11 - v10) + (1 - dy) * (v01 - v00);
}

/// Forward and, when grad_output is set, every gradient of the problem.
inline DeformConv2dResult deform_conv2d(const DeformConv2dProblem& p) {
  const std::int64_t N = p.N, C = p.Cin, H = p.H, W = p.W, O = p.Cout, kh = p.kh, kw = p.kw;
  const std::int64_t Ho = p.Ho(), Wo = p.Wo(), K = kh * kw, og = p.offset_groups;
  const std::int64_t cpg = C / p.groups, opg = O / p.groups, cpog = C / og;  // per group
  const DeformConv2dOptions& o = p.opt;
  auto sz = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  auto in_plane = [&](std::int64_t n, std::int64_t c) { return &p.input[sz((n * C + c) * H * W)]; };
  auto off_at = [&](std::int64_t n, std::int64_t ch, std::int64_t ho, std::int64_t wo) {
    return sz(((n * 2 * og * K + ch) * Ho + ho) * Wo + wo);
  };
  auto mask_at = [&](std::int64_t n, std::int64_t t, std::int64_t ho, std::int64_t wo) {
    return sz(((n * og * K + t) * Ho + ho) * Wo + wo);
  };
  auto out_at = [&](std::int64_t n, std::int64_t oc, std::int64_t ho, std::int64_t wo) {
    return sz(((n * O + oc) * Ho + ho) * Wo + wo);
  };
  auto w_at = [&](std::int64_t oc, std::int64_t cl, std::int64_t i, std::int64_t j) {
    return sz(((oc * cpg + cl) * kh + i) * kw + j);
  };
  // Sample coordinates and modulation of (n, c, i, j, ho, wo) (they depend on c's offset group only).
  struct Tap {
    double y, x, m;
    std::int64_t t;
  };
  auto tap = [&](std::int64_t n, std::int64_t c, std::int64_t i, std::int64_t j, std::int64_t ho, std::int64_t wo) {
    Tap s;
    s.t = (c / cpog) * K + i * kw + j;
    s.y = static_cast<double>(ho * o.stride_h - o.pad_h + i * o.dilation_h) + p.offset[off_at(n, 2 * s.t, ho, wo)];
    s.x = static_cast<double>(wo * o.stride_w - o.pad_w + j * o.dilation_w) + p.offset[off_at(n, 2 * s.t + 1, ho, wo)];
    s.m = p.has_mask ? p.mask[mask_at(n, s.t, ho, wo)] : 1.0;
    return s;
  };

  // The columns: column[n][c][i][j][ho][wo] = m * bilinear.
  std::vector<double> column(sz(N * C * K * Ho * Wo));
  auto col_at = [&](std::int64_t n, std::int64_t c, std::int64_t i, std::int64_t j, std::int64_t ho, std::int64_t wo) {
    return sz((((n * C + c) * K + i * kw + j) * Ho + ho) * Wo + wo);
  };
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t i = 0; i < kh; ++i)
        for (std::int64_t j = 0; j < kw; ++j)
          for (std::int64_t ho = 0; ho < Ho; ++ho)
            for (std::int64_t wo = 0; wo < Wo; ++wo) {
              const Tap s = tap(n, c, i, j, ho, wo);
              column[col_at(n, c, i, j, ho, wo)] = s.m * deform_bilinear(in_plane(n, c), H, W, s.y, s.x);
            }

  DeformConv2dResult r;
  r.output.assign(sz(N * O * Ho * Wo), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t oc = 0; oc < O; ++oc) {
      const std::int64_t g = oc / opg;
      for (std::int64_t ho = 0; ho < Ho; ++ho)
        for (std::int64_t wo = 0; wo < Wo; ++wo) {
          double acc = 0;
          for (std::int64_t cl = 0; cl < cpg; ++cl)
            for (std::int64_t i = 0; i < kh; ++i)
              for (std::int64_t j = 0; j < kw; ++j)
                acc += p.weight[w_at(oc, cl, i, j)] * column[col_at(n, g * cpg + cl, i, j, ho, wo)];
          r.output[out_at(n, oc, ho, wo)] = (p.has_bias ? p.bias[sz(oc)] : 0.0) + acc;
        }
    }
  if (p.grad_output.empty()) return r;

  // grad_column[n][c][i][j][ho][wo] = sum over the output channels of c's group.
  std::vector<double> grad_column(column.size(), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t g = c / cpg, cl = c % cpg;
      for (std::int64_t i = 0; i < kh; ++i)
        for (std::int64_t j = 0; j < kw; ++j)
          for (std::int64_t ho = 0; ho < Ho; ++ho)
            for (std::int64_t wo = 0; wo < Wo; ++wo) {
              double acc = 0;
              for (std::int64_t oc = g * opg; oc < (g + 1) * opg; ++oc)
                acc += p.weight[w_at(oc, cl, i, j)] * p.grad_output[out_at(n, oc, ho, wo)];
              grad_column[col_at(n, c, i, j, ho, wo)] = acc;
            }
    }

  r.grad_input.assign(p.input.size(), 0.0);
  r.grad_offset.assign(p.offset.size(), 0.0);
  if (p.has_mask) r.grad_mask.assign(p.mask.size(), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)  // increasing c: the order grad_offset and grad_mask sum in
      for (std::int64_t i = 0; i < kh; ++i)
        for (std::int64_t j = 0; j < kw; ++j)
          for (std::int64_t ho = 0; ho < Ho; ++ho)
            for (std::int64_t wo = 0; wo < Wo; ++wo) {
              const Tap s = tap(n, c, i, j, ho, wo);
              const double gc = grad_column[col_at(n, c, i, j, ho, wo)];
              const double* plane = in_plane(n, c);
              // grad_input: the pixels within distance < 1 on both axes (candidates: floor, floor + 1).
              if (s.y > -1 && s.y < static_cast<double>(H) && s.x > -1 && s.x < static_cast<double>(W)) {
                const auto y0 = static_cast<std::int64_t>(std::floor(s.y));
                const auto x0 = static_cast<std::int64_t>(std::floor(s.x));
                for (std::int64_t yp = y0; yp <= y0 + 1; ++yp)
                  for (std::int64_t xp = x0; xp <= x0 + 1; ++xp) {
                    const double dy = std::abs(s.y - static_cast<double>(yp));
                    const double dx = std::abs(s.x - static_cast<double>(xp));
                    if (yp < 0 || yp >= H || xp < 0 || xp >= W || !(dy < 1) || !(dx < 1)) continue;
                    r.grad_input[sz((n * C + c) * H * W + yp * W + xp)] += s.m * ((1 - dy) * (1 - dx)) * gc;
                  }
              }
              const bool coord = p.border_rule == DeformBorderRule::kTorchvision || std::isnan(s.y) ||
                                 std::isnan(s.x) ||
                                 (s.y > -1 && s.y < static_cast<double>(H) && s.x > -1 && s.x < static_cast<double>(W));
              if (coord) {
                r.grad_offset[off_at(n, 2 * s.t, ho, wo)] +=
                    s.m * deform_coordinate_weight(plane, H, W, s.y, s.x, true) * gc;
                r.grad_offset[off_at(n, 2 * s.t + 1, ho, wo)] +=
                    s.m * deform_coordinate_weight(plane, H, W, s.y, s.x, false) * gc;
              }
              if (p.has_mask) r.grad_mask[mask_at(n, s.t, ho, wo)] += gc * deform_bilinear(plane, H, W, s.y, s.x);
            }

  r.grad_weight.assign(p.weight.size(), 0.0);
  for (std::int64_t oc = 0; oc < O; ++oc) {
    const std::int64_t g = oc / opg;
    for (std::int64_t cl = 0; cl < cpg; ++cl)
      for (std::int64_t i = 0; i < kh; ++i)
        for (std::int64_t j = 0; j < kw; ++j) {
          double acc = 0;
          for (std::int64_t n = 0; n < N; ++n)
            for (std::int64_t ho = 0; ho < Ho; ++ho)
              for (std::int64_t wo = 0; wo < Wo; ++wo)
                acc += p.grad_output[out_at(n, oc, ho, wo)] * column[col_at(n, g * cpg + cl, i, j, ho, wo)];
          r.grad_weight[w_at(oc, cl, i, j)] = acc;
        }
  }
  if (p.has_bias) {
    r.grad_bias.assign(sz(O), 0.0);
    for (std::int64_t oc = 0; oc < O; ++oc)
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t ho = 0; ho < Ho; ++ho)
          for (std::int64_t wo = 0; wo < Wo; ++wo) r.grad_bias[sz(oc)] += p.grad_output[out_at(n, oc, ho, wo)];
  }
  return r;
}

}  // namespace ref
}  // namespace test
}  // namespace detops
