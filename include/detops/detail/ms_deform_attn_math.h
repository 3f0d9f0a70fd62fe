// The math of multi-scale deformable attention, shared by the CPU backend, the CUDA kernels and
// the tests: where a sampling location falls in a level, the kernels' bounds, the bilinear corners
// and their weights, and the gradient of one channel's sample with respect to its location and
// attention weight. Everything is in the accumulation type A (float or double) and written in
// the operation order of the Deformable-DETR / mmcv kernels (ms_deform_attn_im2col_bilinear and
// ms_deform_attn_col2im_bilinear), so a sum of these terms has the same rounding on every backend.
#pragma once

#include <cstdint>

#include "detops/detail/host_device.h"

namespace detops {
namespace detail {

/// One level of the value tensor: H x W rows of S starting at row `start`.
struct MsdaLevel {
  std::int64_t H, W, start;
};

/// The sizes of one call.
struct MsdaShape {
  std::int64_t B, S, M, D, Q, L, P;
};

/// Corners of a sample, in the kernels' order: 0 = (y0, x0), 1 = (y0, x0 + 1),
/// 2 = (y0 + 1, x0), 3 = (y0 + 1, x0 + 1).
constexpr int kMsdaCorners = 4;

/// Where one sample falls in its level. When `valid` is false (outside -1 < x < W, -1 < y < H,
/// or NaN) the sample contributes nothing and receives zero gradients, and nothing else is set.
template <class A>
struct MsdaSample {
  bool valid;
  std::int64_t y0, x0;          // top-left corner, each >= -1
  A ly, lx, hy, hx;             // fractional offsets from it, and 1 minus them
  A w[kMsdaCorners];            // bilinear weights
  bool inside[kMsdaCorners];    // the corner lies in the level (zeros padding otherwise)
  std::int64_t row[kMsdaCorners];  // the corner's row of S (level start + y * W + x); 0 if outside
};

/// Samples level `lv` at the normalized location (loc_x, loc_y): x = loc_x * W - 0.5,
/// y = loc_y * H - 0.5, the kernels' pixel-centre convention (grid_sample's align_corners=False).
template <class A>
DETOPS_HOST_DEVICE inline MsdaSample<A> msda_sample(A loc_x, A loc_y, const MsdaLevel& lv) {
  MsdaSample<A> s{};
  const A x = loc_x * static_cast<A>(lv.W) - A(0.5);
  const A y = loc_y * static_cast<A>(lv.H) - A(0.5);
  // Written so that NaN fails the test (every comparison with NaN is false).
  s.valid = y > A(-1) && x > A(-1) && y < static_cast<A>(lv.H) && x < static_cast<A>(lv.W);
  if (!s.valid) return s;
  // floor on (-1, size): truncation, one lower for the negative fractions
  s.y0 = static_cast<std::int64_t>(y);
  if (static_cast<A>(s.y0) > y) --s.y0;
  s.x0 = static_cast<std::int64_t>(x);
  if (static_cast<A>(s.x0) > x) --s.x0;
  s.ly = y - static_cast<A>(s.y0);
  s.lx = x - static_cast<A>(s.x0);
  s.hy = A(1) - s.ly;
  s.hx = A(1) - s.lx;
  s.w[0] = s.hy * s.hx;
  s.w[1] = s.hy * s.lx;
  s.w[2] = s.ly * s.hx;
  s.w[3] = s.ly * s.lx;
  const bool top = s.y0 >= 0, bottom = s.y0 + 1 <= lv.H - 1;
  const bool left = s.x0 >= 0, right = s.x0 + 1 <= lv.W - 1;
  s.inside[0] = top && left;
  s.inside[1] = top && right;
  s.inside[2] = bottom && left;
  s.inside[3] = bottom && right;
  for (int c = 0; c < kMsdaCorners; ++c) {
    const std::int64_t y = s.y0 + (c >> 1), x = s.x0 + (c & 1);
    s.row[c] = s.inside[c] ? lv.start + y * lv.W + x : 0;
  }
  return s;
}

/// The bilinear value of one channel from its four corner values (0 for a corner outside the
/// level): w0 v0 + w1 v1 + w2 v2 + w3 v3, left to right.
template <class A>
DETOPS_HOST_DEVICE inline A msda_bilinear(const MsdaSample<A>& s, A v0, A v1, A v2, A v3) {
  return s.w[0] * v0 + s.w[1] * v1 + s.w[2] * v2 + s.w[3] * v3;
}

/// One channel's share of the location and attention-weight gradients of a valid sample.
template <class A>
struct MsdaSampleGrad {
  A x, y, attention;
};

/// For one channel with upstream gradient g, attention weight `attn` and corner values v (0 for
/// a corner outside the level), as the anchors' col2im computes it: top = g * attn; the weight
/// gradients along y and x accumulate the four corners in order; d/dx = W * gw * top,
/// d/dy = H * gh * top, d/dattn = g * bilinear. A corner outside the level adds 0 to gh and gw
/// where the anchors skip it: the same sums once the channels are added from zero.
template <class A>
DETOPS_HOST_DEVICE inline MsdaSampleGrad<A> msda_sample_grad(const MsdaSample<A>& s, const MsdaLevel& lv, A g, A attn,
                                                             A v0, A v1, A v2, A v3) {
  const A top = g * attn;
  A gh = A(0), gw = A(0);
  gh = gh - s.hx * v0;
  gw = gw - s.hy * v0;
  gh = gh - s.lx * v1;
  gw = gw + s.hy * v1;
  gh = gh + s.hx * v2;
  gw = gw - s.ly * v2;
  gh = gh + s.lx * v3;
  gw = gw + s.ly * v3;
  MsdaSampleGrad<A> r;
  r.x = static_cast<A>(lv.W) * gw * top;
  r.y = static_cast<A>(lv.H) * gh * top;
  r.attention = g * msda_bilinear(s, v0, v1, v2, v3);
  return r;
}

/// The weight of corner c in the value gradient: its bilinear weight times the attention weight
/// (each record of the exact mode carries it; the atomic mode adds g times it).
template <class A>
DETOPS_HOST_DEVICE inline A msda_corner_weight(const MsdaSample<A>& s, int c, A attn) {
  return s.w[c] * attn;
}

}  // namespace detail
}  // namespace detops
