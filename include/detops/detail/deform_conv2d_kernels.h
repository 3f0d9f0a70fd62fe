// deform_conv2d's math and per-thread bodies, shared verbatim by the CPU backend
// (src/cpu/deform_conv2d_cpu.cpp) and the CUDA kernels (cuda/deform_conv2d_cuda.cu, one call into
// a body each); tests/deform_conv2d_emulated_test.cpp runs the bodies over an emulated grid
// against the CPU backend, byte for byte.
//
//   column element     one sample m * bilinear(input[n, c], y, x) of the columns (im2col), in
//                      [R, Q] order (forward) or [Q, R] (backward, for grad_weight's GEMM)
//   gemm element       the fixed-order, FMA-free GEMM: 4 rows of one column of C per thread
//   output element     forward epilogue: bias added, rounded to T, stored with output's strides
//   grad_output element  grad_output of a chunk widened to A, [Cout, Q]
//   offset element     grad_offset and grad_mask of one (n, offset group, tap, ho, wo), summed
//                      over the group's channels in order (one writer)
//   scatter element    atomic grad_input: one grad_columns element adds into its corners
//   enumerate element  exact grad_input, phase 1 of the gather engine: 4 corner records
//   bias element       grad_bias of one output channel, continued across chunks
//
// Names: taps = kh * kw, tap = i * kw + j; R = Cin * taps rows of columns (row c * taps + tap);
// a chunk holds `images` images from n0, Q = images * P columns (P = Ho * Wo, q = b * P + p).
// A = acc_t<T> (float for 16-bit and float32, double for float64); all sums are acc = acc + x in
// a fixed order, and the build has no FMA contraction (-ffp-contract=off, nvcc --fmad=false).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "detops/detail/gather_backward.h"
#include "detops/detail/host_device.h"
#include "detops/detail/strided.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

struct DeformConv2dShape {
  std::int64_t N, Cin, H, W, Cout, kh, kw, Ho, Wo;
  std::int64_t groups, offset_groups;
  std::int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  bool has_mask, has_bias;

  DETOPS_HOST_DEVICE std::int64_t taps() const { return kh * kw; }
  DETOPS_HOST_DEVICE std::int64_t positions() const { return Ho * Wo; }
  DETOPS_HOST_DEVICE std::int64_t rows() const { return Cin * kh * kw; }
  DETOPS_HOST_DEVICE std::int64_t group_in() const { return groups > 0 ? Cin / groups : 0; }
  DETOPS_HOST_DEVICE std::int64_t group_out() const { return groups > 0 ? Cout / groups : 0; }
  DETOPS_HOST_DEVICE std::int64_t offset_group_channels() const { return offset_groups > 0 ? Cin / offset_groups : 0; }
};

/// Where tap (i, j) of output position (ho, wo) samples, in the accumulation type: torchvision's
/// integer base plus the offset, and the modulation.
template <class A>
struct DeformCoord {
  A y, x, m;
};

/// The sampling point's corners: rows y0, y0 + 1 and columns x0, x0 + 1 (floor), their distances
/// ly = y - y0, lx = x - x0, and whether each corner (y0x0, y0x1, y1x0, y1x1) is on the map.
/// `inside`: torchvision's bilinear_interpolate samples (-1 < y < H and -1 < x < W); outside it
/// the sample is 0 but the coordinate derivative still reads the corners on the map, as
/// torchvision's get_coordinate_weight. A coordinate that is infinite, or further than one
/// pixel outside, has no corner at all. A NaN coordinate (`nan`) has no corner either, but its
/// sample and coordinate derivatives are NaN, as torchvision's CPU kernel gives (its floor of
/// NaN is undefined; NaN is what its weights make of it): a NaN offset shows in the output.
template <class A>
struct DeformCorners {
  std::int64_t y0, x0;
  A ly, lx;
  bool valid[4];
  bool inside;
  bool any;
  bool nan;
};

template <class A>
DETOPS_HOST_DEVICE inline DeformCorners<A> deform_corners(A y, A x, std::int64_t H, std::int64_t W) {
  DeformCorners<A> c{};
  c.nan = !(y == y) || !(x == x);
  c.any = y > A(-2) && y < A(H + 1) && x > A(-2) && x < A(W + 1);  // false for NaN
  if (!c.any) return c;
  c.inside = y > A(-1) && y < A(H) && x > A(-1) && x < A(W);
  c.y0 = static_cast<std::int64_t>(floor(y));
  c.x0 = static_cast<std::int64_t>(floor(x));
  c.ly = y - A(c.y0);
  c.lx = x - A(c.x0);
  const bool r0 = c.y0 >= 0 && c.y0 < H, r1 = c.y0 + 1 >= 0 && c.y0 + 1 < H;
  const bool k0 = c.x0 >= 0 && c.x0 < W, k1 = c.x0 + 1 >= 0 && c.x0 + 1 < W;
  c.valid[0] = r0 && k0;
  c.valid[1] = r0 && k1;
  c.valid[2] = r1 && k0;
  c.valid[3] = r1 && k1;
  return c;
}

/// The four corner values of one channel plane (0 off the map), y0x0, y0x1, y1x0, y1x1.
template <class T, class A>
DETOPS_HOST_DEVICE inline void deform_corner_values(const DeformCorners<A>& c, const T* plane, std::int64_t sy,
                                                    std::int64_t sx, A v[4]) {
  for (int k = 0; k < 4; ++k) {
    const std::int64_t yy = c.y0 + (k >> 1), xx = c.x0 + (k & 1);
    v[k] = c.valid[k] ? to_acc(plane[yy * sy + xx * sx]) : A(0);
  }
}

/// torchvision's bilinear weights of the corners: hy * hx, hy * lx, ly * hx, ly * lx.
template <class A>
DETOPS_HOST_DEVICE inline void deform_bilinear_weights(const DeformCorners<A>& c, A w[4]) {
  const A hy = A(1) - c.ly, hx = A(1) - c.lx;
  w[0] = hy * hx;
  w[1] = hy * c.lx;
  w[2] = c.ly * hx;
  w[3] = c.ly * c.lx;
}

/// The bilinear sum w0 v00 + w1 v01 + w2 v10 + w3 v11, left to right.
template <class A>
DETOPS_HOST_DEVICE inline A deform_bilinear_sum(A w0, A w1, A w2, A w3, A v0, A v1, A v2, A v3) {
  return w0 * v0 + w1 * v1 + w2 * v2 + w3 * v3;
}

/// torchvision's bilinear_interpolate from the corner values: hy * hx * v00 + hy * lx * v01 +
/// ly * hx * v10 + ly * lx * v11, left to right; 0 outside; NaN at a NaN coordinate.
template <class A>
DETOPS_HOST_DEVICE inline A deform_bilinear(const DeformCorners<A>& c, const A v[4]) {
  if (c.nan) return std::numeric_limits<A>::quiet_NaN();
  if (!c.inside) return A(0);
  A w[4];
  deform_bilinear_weights(c, w);
  return deform_bilinear_sum(w[0], w[1], w[2], w[3], v[0], v[1], v[2], v[3]);
}

/// torchvision's get_coordinate_weight: d(bilinear)/dy and d(bilinear)/dx from the corners
/// (both NaN at a NaN coordinate).
template <class A>
DETOPS_HOST_DEVICE inline void deform_coordinate_weights(const DeformCorners<A>& c, const A v[4], A* wy, A* wx) {
  if (c.nan) {
    *wy = *wx = std::numeric_limits<A>::quiet_NaN();
    return;
  }
  *wy = c.lx * (v[3] - v[1]) + (A(1) - c.lx) * (v[2] - v[0]);
  *wx = c.ly * (v[3] - v[2]) + (A(1) - c.ly) * (v[1] - v[0]);
}

/// torchvision's col2im weight of corner k for grad_input: (1 - |y - yp|) * (1 - |x - xp|) for a
/// corner on the map within one pixel on both axes, else 0 (a corner at distance exactly 1 gets
/// nothing: an integer coordinate feeds its own pixel only).
template <class A>
DETOPS_HOST_DEVICE inline A deform_col2im_weight(const DeformCorners<A>& c, A y, A x, int k) {
  if (!c.any || !c.valid[k]) return A(0);
  const A dy = fabs(y - A(c.y0 + (k >> 1))), dx = fabs(x - A(c.x0 + (k & 1)));
  if (!(dy < A(1)) || !(dx < A(1))) return A(0);
  return (A(1) - dy) * (A(1) - dx);
}

/// What the column, offset and scatter bodies read.
template <class T>
struct DeformConv2dArgs {
  const T* input;
  Strides4 in;
  const T* offset;
  Strides4 off;
  const T* mask;  // null without mask
  Strides4 mk;
  DeformConv2dShape s;
};

/// Tap `tap` of offset group g at (n, ho, wo).
template <class T>
DETOPS_HOST_DEVICE inline DeformCoord<acc_t<T>> deform_coord(const DeformConv2dArgs<T>& a, std::int64_t n,
                                                             std::int64_t g, std::int64_t tap, std::int64_t ho,
                                                             std::int64_t wo) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = a.s;
  const std::int64_t i = tap / s.kw, j = tap % s.kw, t = g * s.taps() + tap;
  const T* o = a.offset + n * a.off.s0 + ho * a.off.s2 + wo * a.off.s3;
  DeformCoord<A> c;
  c.y = A(ho * s.stride_h - s.pad_h + i * s.dilation_h) + to_acc(o[(2 * t) * a.off.s1]);
  c.x = A(wo * s.stride_w - s.pad_w + j * s.dilation_w) + to_acc(o[(2 * t + 1) * a.off.s1]);
  c.m = a.mask ? to_acc(a.mask[n * a.mk.s0 + t * a.mk.s1 + ho * a.mk.s2 + wo * a.mk.s3]) : A(1);
  return c;
}

/// One column value: m * bilinear(input[n, c], y, x).
template <class T>
DETOPS_HOST_DEVICE inline acc_t<T> deform_sample(const DeformConv2dArgs<T>& a, const DeformCoord<acc_t<T>>& p,
                                                 const DeformCorners<acc_t<T>>& k, std::int64_t n, std::int64_t c) {
  using A = acc_t<T>;
  A v[4];
  deform_corner_values(k, a.input + n * a.in.s0 + c * a.in.s1, a.in.s2, a.in.s3, v);
  return p.m * deform_bilinear(k, v);
}

/// Columns of a chunk, one element per thread: t in [0, R * Q). transposed = false: t = r * Q + q
/// and col[t] ([R, Q], the forward's B); true: t = q * R + r and col[t] ([Q, R], grad_weight's B).
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_column_element(std::int64_t t, const DeformConv2dArgs<T>& a,
                                                            std::int64_t n0, std::int64_t Q, bool transposed,
                                                            acc_t<T>* col) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = a.s;
  const std::int64_t R = s.rows(), P = s.positions();
  const std::int64_t r = transposed ? t % R : t / Q, q = transposed ? t / R : t % Q;
  const std::int64_t c = r / s.taps(), tap = r % s.taps();
  const std::int64_t n = n0 + q / P, p = q % P, ho = p / s.Wo, wo = p % s.Wo;
  const DeformCoord<A> pt = deform_coord(a, n, c / s.offset_group_channels(), tap, ho, wo);
  col[t] = deform_sample(a, pt, deform_corners(pt.y, pt.x, s.H, s.W), n, c);
}

/// The fixed-order GEMM, G independent products C_g = A_g B_g (M x K times K x N):
///   C(g, m, n) = c[g * c_g + m * c_m + n], A(g, m, k) = a[g * a_g + m * a_m + k * a_k],
///   B(g, k, n) = b[g * b_g + k * b_k + n];
///   acc = accumulate ? C(g, m, n) : 0, then acc = acc + A(g, m, k) * B(g, k, n) for k = 0, 1, ...,
///   each product and sum rounded (never fused), and C(g, m, n) = acc.
/// `accumulate` continues a running sum (grad_weight over chunks of images: the same bits as one
/// chunk). Every backend computes exactly this sequence per element, whatever its blocking.
template <class A>
struct DeformGemmArgs {
  const A* a;
  std::int64_t a_g, a_m, a_k;
  const A* b;
  std::int64_t b_g, b_k;
  A* c;
  std::int64_t c_g, c_m;
  std::int64_t G, M, N, K;
  bool accumulate;
};

/// Rows of C one GEMM thread computes (one load of B serves them all).
constexpr std::int64_t kDeformGemmRows = 4;

/// The GEMM, one thread per (g, block of kDeformGemmRows rows, n): t in
/// [0, G * ceil(M / kDeformGemmRows) * N), n fastest (neighbouring threads read neighbouring B).
template <class A>
DETOPS_HOST_DEVICE inline void deform_gemm_element(std::int64_t t, const DeformGemmArgs<A>& g) {
  const std::int64_t blocks = (g.M + kDeformGemmRows - 1) / kDeformGemmRows;
  const std::int64_t n = t % g.N, mb = (t / g.N) % blocks, gi = t / (g.N * blocks);
  const std::int64_t m0 = mb * kDeformGemmRows;
  const std::int64_t rows = g.M - m0 < kDeformGemmRows ? g.M - m0 : kDeformGemmRows;
  A acc[kDeformGemmRows];
  A* c = g.c + gi * g.c_g + m0 * g.c_m + n;
  for (std::int64_t i = 0; i < kDeformGemmRows; ++i) acc[i] = (g.accumulate && i < rows) ? c[i * g.c_m] : A(0);
  const A* a = g.a + gi * g.a_g + m0 * g.a_m;
  const A* b = g.b + gi * g.b_g + n;
  for (std::int64_t k = 0; k < g.K; ++k) {
    const A bk = b[k * g.b_k];
    for (std::int64_t i = 0; i < kDeformGemmRows; ++i)
      if (i < rows) acc[i] = acc[i] + a[i * g.a_m + k * g.a_k] * bk;
  }
  for (std::int64_t i = 0; i < rows; ++i) c[i * g.c_m] = acc[i];
}

/// weight widened to A, one element per thread: t in [0, Cout * Rg) (Rg = Cin / groups * taps),
/// w[t] = weight[o, c, i, j] with t = o * Rg + c * taps + i * kw + j (the GEMMs' A).
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_weight_element(std::int64_t t, const T* weight, const Strides4& ws,
                                                            const DeformConv2dShape& s, acc_t<T>* w) {
  const std::int64_t rg = s.group_in() * s.taps(), o = t / rg, r = t % rg, c = r / s.taps(), tap = r % s.taps();
  w[t] = to_acc(weight[o * ws.s0 + c * ws.s1 + (tap / s.kw) * ws.s2 + (tap % s.kw) * ws.s3]);
}

/// grad_weight from its running sums, one element per thread (the inverse of the above).
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_store_weight_element(std::int64_t t, const acc_t<T>* acc,
                                                                  const DeformConv2dShape& s, T* grad_weight,
                                                                  const Strides4& ws) {
  const std::int64_t rg = s.group_in() * s.taps(), o = t / rg, r = t % rg, c = r / s.taps(), tap = r % s.taps();
  grad_weight[o * ws.s0 + c * ws.s1 + (tap / s.kw) * ws.s2 + (tap % s.kw) * ws.s3] = from_acc<T>(acc[t]);
}

/// Forward epilogue, one output element per thread: t in [0, Cout * Q) ([Cout, Q] order):
/// output[n0 + b, o, ho, wo] = T(acc[o, q] + bias[o]) (no bias: T(acc)).
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_output_element(std::int64_t t, const acc_t<T>* acc, std::int64_t Q,
                                                            const T* bias, std::int64_t bias_s, const DeformConv2dShape& s,
                                                            std::int64_t n0, T* out, const Strides4& os) {
  const std::int64_t o = t / Q, q = t % Q, P = s.positions();
  const std::int64_t n = n0 + q / P, p = q % P;
  const acc_t<T> v = bias ? acc[t] + to_acc(bias[o * bias_s]) : acc[t];
  out[n * os.s0 + o * os.s1 + (p / s.Wo) * os.s2 + (p % s.Wo) * os.s3] = from_acc<T>(v);
}

/// grad_output of a chunk widened to A, one element per thread: t in [0, Cout * Q), go[t] in
/// [Cout, Q] order.
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_grad_output_element(std::int64_t t, const T* grad_output,
                                                                 const Strides4& gs, const DeformConv2dShape& s,
                                                                 std::int64_t n0, std::int64_t Q, acc_t<T>* go) {
  const std::int64_t o = t / Q, q = t % Q, P = s.positions();
  const std::int64_t n = n0 + q / P, p = q % P;
  go[t] = to_acc(grad_output[n * gs.s0 + o * gs.s1 + (p / s.Wo) * gs.s2 + (p % s.Wo) * gs.s3]);
}

/// What the backward bodies read beyond DeformConv2dArgs: the chunk's grad_columns ([R, Q]).
template <class T>
struct DeformConv2dBackwardArgs {
  DeformConv2dArgs<T> f;
  const acc_t<T>* grad_col;
  std::int64_t n0, Q;
  /// DeformBorderRule::kMmcv: no coordinate derivative outside -1 < y < H, -1 < x < W.
  bool coord_grad_inside_only;
};

/// grad_offset and grad_mask, one (b, offset group g, tap, p) per thread: t in
/// [0, images * og * taps * P), p fastest. Sums over the group's channels c in order:
///   gy = gy + (m * wy_c) * gc, gx likewise, gm = gm + gc * bilinear_c
/// with gc = grad_columns[c * taps + tap, q] (torchvision's expressions); under mmcv's border rule
/// (a.coord_grad_inside_only) gy and gx stay 0 for a point outside -1 < y < H, -1 < x < W. A NaN
/// coordinate makes all three NaN. Either output may be null (not wanted).
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_offset_element(std::int64_t t, const DeformConv2dBackwardArgs<T>& a,
                                                            T* grad_offset, const Strides4& gos, T* grad_mask,
                                                            const Strides4& gms) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = a.f.s;
  const std::int64_t P = s.positions(), taps = s.taps(), og = s.offset_groups;
  const std::int64_t p = t % P, tap = (t / P) % taps, g = (t / (P * taps)) % og, b = t / (P * taps * og);
  const std::int64_t n = a.n0 + b, ho = p / s.Wo, wo = p % s.Wo, q = b * P + p;
  const DeformCoord<A> pt = deform_coord(a.f, n, g, tap, ho, wo);
  const DeformCorners<A> k = deform_corners(pt.y, pt.x, s.H, s.W);
  A gy = A(0), gx = A(0), gm = A(0);
  const std::int64_t cg = s.offset_group_channels();
  const bool coord = !a.coord_grad_inside_only || k.inside || k.nan;
  if (k.any || k.nan) {
    for (std::int64_t c = g * cg; c < (g + 1) * cg; ++c) {
      A v[4];
      deform_corner_values(k, a.f.input + n * a.f.in.s0 + c * a.f.in.s1, a.f.in.s2, a.f.in.s3, v);
      const A gc = a.grad_col[(c * taps + tap) * a.Q + q];
      if (coord) {
        A wy, wx;
        deform_coordinate_weights(k, v, &wy, &wx);
        gy = gy + pt.m * wy * gc;
        gx = gx + pt.m * wx * gc;
      }
      gm = gm + gc * deform_bilinear(k, v);
    }
  }
  const std::int64_t ch = g * taps + tap;
  if (grad_offset) {
    T* o = grad_offset + n * gos.s0 + ho * gos.s2 + wo * gos.s3;
    o[(2 * ch) * gos.s1] = from_acc<T>(gy);
    o[(2 * ch + 1) * gos.s1] = from_acc<T>(gx);
  }
  if (grad_mask) grad_mask[n * gms.s0 + ch * gms.s1 + ho * gms.s2 + wo * gms.s3] = from_acc<T>(gm);
}

/// Where one sample (n, offset group g, tap, position p) sends its column gradient: the in-plane
/// offsets (strides gi) of the corners with a col2im weight, and those weights times the mask.
template <class A>
struct DeformScatterPoint {
  std::int64_t offset[4];
  A weight[4];  // col2im weight x m
  bool valid[4];  // a col2im weight != 0
};

template <class T>
DETOPS_HOST_DEVICE inline DeformScatterPoint<acc_t<T>> deform_scatter_point(const DeformConv2dArgs<T>& a,
                                                                            std::int64_t n, std::int64_t g,
                                                                            std::int64_t tap, std::int64_t p,
                                                                            const Strides4& gi) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = a.s;
  const DeformCoord<A> pt = deform_coord(a, n, g, tap, p / s.Wo, p % s.Wo);
  const DeformCorners<A> k = deform_corners(pt.y, pt.x, s.H, s.W);
  DeformScatterPoint<A> sp{};
  for (int corner = 0; corner < 4; ++corner) {
    const A w = deform_col2im_weight(k, pt.y, pt.x, corner);
    sp.valid[corner] = w != A(0);
    sp.weight[corner] = w * pt.m;
    sp.offset[corner] = sp.valid[corner] ? (k.y0 + (corner >> 1)) * gi.s2 + (k.x0 + (corner & 1)) * gi.s3 : 0;
  }
  return sp;
}

/// Atomic grad_input, one grad_columns element per thread: t in [0, R * Q) ([R, Q] order);
/// add(offset in grad_input, (w * m) * gc) for each corner with a col2im weight, y0x0 .. y1x1.
template <class T, class Add>
DETOPS_HOST_DEVICE inline void deform_conv2d_scatter_element(std::int64_t t, const DeformConv2dBackwardArgs<T>& a,
                                                             const Strides4& gi, const Add& add) {
  const DeformConv2dShape& s = a.f.s;
  const std::int64_t P = s.positions(), taps = s.taps();
  const std::int64_t r = t / a.Q, q = t % a.Q, c = r / taps, tap = r % taps;
  const std::int64_t n = a.n0 + q / P;
  const DeformScatterPoint<acc_t<T>> sp = deform_scatter_point(a.f, n, c / s.offset_group_channels(), tap, q % P, gi);
  const acc_t<T> gc = a.grad_col[t];
  for (int corner = 0; corner < 4; ++corner)
    if (sp.valid[corner]) add(n * gi.s0 + c * gi.s1 + sp.offset[corner], sp.weight[corner] * gc);
}

/// Exact grad_input, phase 1 for the chunk: one (b, g, tap, p) per thread, t in
/// [0, images * og * taps * P), records 4t .. 4t + 3 = corners y0x0 .. y1x1: key =
/// ((b * og + g) * H + yp) * W + xp, weight w * m, source = row (g * Cog * taps + tap) * Q + q of
/// grad_columns (channel c of the group adds c * taps * Q); corners without a col2im weight get
/// the sentinel.
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_enumerate_element(std::int64_t t, const DeformConv2dBackwardArgs<T>& a,
                                                               GatherKey sentinel,
                                                               const GatherRecords<acc_t<T>>& rec) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = a.f.s;
  const std::int64_t P = s.positions(), taps = s.taps(), og = s.offset_groups;
  const std::int64_t p = t % P, tap = (t / P) % taps, g = (t / (P * taps)) % og, b = t / (P * taps * og);
  const DeformCoord<A> pt = deform_coord(a.f, a.n0 + b, g, tap, p / s.Wo, p % s.Wo);
  const DeformCorners<A> k = deform_corners(pt.y, pt.x, s.H, s.W);
  const std::int64_t source = (g * s.offset_group_channels() * taps + tap) * a.Q + b * P + p;
  for (int corner = 0; corner < 4; ++corner) {
    const A w = deform_col2im_weight(k, pt.y, pt.x, corner);
    if (w == A(0)) {
      gather_set_record(rec, 4 * t + corner, sentinel, A(0), std::int64_t{0});
      continue;
    }
    const std::int64_t yp = k.y0 + (corner >> 1), xp = k.x0 + (corner & 1);
    const auto key = static_cast<GatherKey>(((b * og + g) * s.H + yp) * s.W + xp);
    gather_set_record(rec, 4 * t + corner, key, w * pt.m, source);
  }
}

/// The exact mode's destination map: key -> offset of grad_input[n0 + b, g * Cog, yp, xp].
struct DeformConv2dTarget {
  std::int64_t n0, og, cog, H, W;
  Strides4 gi;
  DETOPS_HOST_DEVICE std::int64_t operator()(GatherKey key) const {
    const auto k = static_cast<std::int64_t>(key);
    const std::int64_t plane = H * W, r = k % plane, bg = k / plane;
    return (n0 + bg / og) * gi.s0 + (bg % og) * cog * gi.s1 + (r / W) * gi.s2 + (r % W) * gi.s3;
  }
};

/// grad_bias, one output channel per thread: t in [0, Cout); acc[t] continues its sum over the
/// chunk's columns in order (acc[t] = 0 before the first chunk); `last`: the final chunk, which
/// also stores grad_bias[t].
template <class T>
DETOPS_HOST_DEVICE inline void deform_conv2d_bias_element(std::int64_t t, const acc_t<T>* go, std::int64_t Q,
                                                          acc_t<T>* acc, bool last, T* grad_bias, std::int64_t gbs) {
  acc_t<T> sum = acc[t];
  for (std::int64_t q = 0; q < Q; ++q) sum = sum + go[t * Q + q];
  acc[t] = sum;
  if (last && grad_bias) grad_bias[t * gbs] = from_acc<T>(sum);
}

}  // namespace detail
}  // namespace detops
