// grid_sample's per-thread bodies: the CUDA kernels wrap each in one line, the CPU backend calls
// the same arithmetic (grid_sample_point, grid_sample_interpolate, grid_sample_grad_grid_point),
// and tests/grid_sample_emulated_test.cpp runs them over an emulated grid against the CPU backend.
//
//   forward element        one output element: the point's corners, interpolated in one channel
//   scatter element        atomic backward: one grad_output element adds into its corners
//   grad_grid element      one grid point: the sum over channels, in order, one writer
//   enumerate element      exact backward, phase 1 of the gather engine: one grid point writes
//                          its 4 corner records (1 for nearest) into fixed slots
#pragma once

#include <cstdint>

#include "detops/detail/gather_backward.h"
#include "detops/detail/grid_sample_math.h"
#include "detops/detail/host_device.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

/// What every body reads: the input (or, in the backward, the input the forward read), the grid
/// and the call's scalars; the axes are built once on the host (make_grid_sample_args).
template <class T>
struct GridSampleArgs {
  const T* input;
  GridSampleStrides in;
  const void* grid;       // [N, Ho, Wo, 2], dtype grid_dtype
  DType grid_dtype;
  GridSampleStrides gs;
  GridSampleShape shape;
  GridAxis<acc_t<T>> ax, ay;  // x along W, y along H
};

template <class T>
GridSampleArgs<T> make_grid_sample_args(const T* input, const GridSampleStrides& in, const void* grid, DType grid_dtype,
                                        const GridSampleStrides& gs, const GridSampleShape& shape) {
  GridSampleArgs<T> a{};
  a.input = input;
  a.in = in;
  a.grid = grid;
  a.grid_dtype = grid_dtype;
  a.gs = gs;
  a.shape = shape;
  a.ax = make_grid_axis<acc_t<T>>(shape.W, shape.align_corners);
  a.ay = make_grid_axis<acc_t<T>>(shape.H, shape.align_corners);
  return a;
}

/// The corners and weights of grid point (n, ho, wo). The grid's values are read as double
/// (exact) and converted to the accumulation type once.
template <class T>
DETOPS_HOST_DEVICE inline GridPoint<acc_t<T>> grid_sample_point(const GridSampleArgs<T>& a, std::int64_t n,
                                                                 std::int64_t ho, std::int64_t wo) {
  using A = acc_t<T>;
  const std::int64_t off = n * a.gs.s0 + ho * a.gs.s1 + wo * a.gs.s2;
  const A gx = static_cast<A>(load_grid_value(a.grid, a.grid_dtype, off, a.shape.unit));
  const A gy = static_cast<A>(load_grid_value(a.grid, a.grid_dtype, off + a.gs.s3, a.shape.unit));
  const GridCoord<A> x = grid_source_coord(gx, a.ax, a.shape.padding);
  const GridCoord<A> y = grid_source_coord(gy, a.ay, a.shape.padding);
  return grid_point(x, y, a.shape.H, a.shape.W, a.shape.nearest);
}

/// The value a point samples from one channel's plane (plane = input + n * s0 + c * s1): corners
/// outside the map read as 0, then grid_bilinear_sum; nearest reads its pixel (or 0); a point
/// that samples nothing gives 0.
template <class T, class A>
DETOPS_HOST_DEVICE inline A grid_sample_interpolate(const GridPoint<A>& p, const T* plane, const GridSampleStrides& in) {
  if (p.count == 0) return A(0);
  if (p.count == 1) return p.valid[0] ? to_acc(plane[p.iy[0] * in.s2 + p.ix[0] * in.s3]) : A(0);
  A v[4];
  for (int k = 0; k < 4; ++k) v[k] = p.valid[k] ? to_acc(plane[p.iy[k] * in.s2 + p.ix[k] * in.s3]) : A(0);
  return grid_bilinear_sum(v[0], v[1], v[2], v[3], p.weight[0], p.weight[1], p.weight[2], p.weight[3]);
}

/// Index t of [N, C, Ho, Wo] in thread order: channel-fastest when channels_last (neighbouring
/// threads then touch neighbouring channels of a channels-last tensor), wo-fastest otherwise.
struct GridSampleIndex {
  std::int64_t n, c, ho, wo;
};
DETOPS_HOST_DEVICE inline GridSampleIndex grid_sample_index(std::int64_t t, const GridSampleShape& s, bool channels_last) {
  GridSampleIndex i;
  if (channels_last) {
    i.c = t % s.C;
    t /= s.C;
    i.wo = t % s.Wo;
    t /= s.Wo;
    i.ho = t % s.Ho;
    i.n = t / s.Ho;
  } else {
    i.wo = t % s.Wo;
    t /= s.Wo;
    i.ho = t % s.Ho;
    t /= s.Ho;
    i.c = t % s.C;
    i.n = t / s.C;
  }
  return i;
}

template <class T>
struct GridSampleForwardArgs {
  GridSampleArgs<T> g;
  T* output;
  GridSampleStrides out;
  bool channels_last;  // thread order (grid_sample_index)
};

/// Forward, one output element per thread: t in [0, N * C * Ho * Wo).
template <class T>
DETOPS_HOST_DEVICE inline void grid_sample_forward_element(std::int64_t t, const GridSampleForwardArgs<T>& a) {
  const GridSampleIndex i = grid_sample_index(t, a.g.shape, a.channels_last);
  const GridPoint<acc_t<T>> p = grid_sample_point(a.g, i.n, i.ho, i.wo);
  const T* plane = a.g.input + i.n * a.g.in.s0 + i.c * a.g.in.s1;
  a.output[i.n * a.out.s0 + i.c * a.out.s1 + i.ho * a.out.s2 + i.wo * a.out.s3] =
      from_acc<T>(grid_sample_interpolate(p, plane, a.g.in));
}

/// The backward's extra views: grad_output, and grad_input's strides (the scatter and the target).
template <class T>
struct GridSampleBackwardArgs {
  GridSampleArgs<T> g;  // g.input: the forward's input (grad_grid reads it)
  const T* grad_output;
  GridSampleStrides go;
  GridSampleStrides gi;  // grad_input's strides
  bool channels_last;    // thread order of the scatter (grid_sample_index)
};

/// Atomic backward, one grad_output element per thread: t in [0, N * C * Ho * Wo); add(offset in
/// grad_input, weight * g) for every corner inside the map, nw, ne, sw, se.
template <class T, class Add>
DETOPS_HOST_DEVICE inline void grid_sample_scatter_element(std::int64_t t, const GridSampleBackwardArgs<T>& a,
                                                           const Add& add) {
  using A = acc_t<T>;
  const GridSampleIndex i = grid_sample_index(t, a.g.shape, a.channels_last);
  const GridPoint<A> p = grid_sample_point(a.g, i.n, i.ho, i.wo);
  const A g = to_acc(a.grad_output[i.n * a.go.s0 + i.c * a.go.s1 + i.ho * a.go.s2 + i.wo * a.go.s3]);
  const std::int64_t base = i.n * a.gi.s0 + i.c * a.gi.s1;
  for (int k = 0; k < p.count; ++k)
    if (p.valid[k]) add(base + p.iy[k] * a.gi.s2 + p.ix[k] * a.gi.s3, g * p.weight[k]);
}

/// d(loss)/d(grid) of one bilinear point: grid_grad_grid_add over the channels in order, then the
/// multipliers; 0 for nearest and for a point that samples nothing.
template <class T>
DETOPS_HOST_DEVICE inline void grid_sample_grad_grid_point(const GridSampleBackwardArgs<T>& a, std::int64_t n,
                                                           std::int64_t ho, std::int64_t wo,
                                                           const GridPoint<acc_t<T>>& p, acc_t<T>* gx_out,
                                                           acc_t<T>* gy_out) {
  using A = acc_t<T>;
  if (p.count != 4) {
    *gx_out = A(0);
    *gy_out = A(0);
    return;
  }
  std::int64_t off[4];
  for (int k = 0; k < 4; ++k) off[k] = p.iy[k] * a.g.in.s2 + p.ix[k] * a.g.in.s3;
  A gx = A(0), gy = A(0);
  const T* go = a.grad_output + n * a.go.s0 + ho * a.go.s2 + wo * a.go.s3;
  for (std::int64_t c = 0; c < a.g.shape.C; ++c) {
    const T* plane = a.g.input + n * a.g.in.s0 + c * a.g.in.s1;
    A v[4];
    for (int k = 0; k < 4; ++k) v[k] = p.valid[k] ? to_acc(plane[off[k]]) : A(0);
    grid_grad_grid_add(v[0], v[1], v[2], v[3], p.dx, p.dy, to_acc(go[c * a.go.s1]), gx, gy);
  }
  *gx_out = gx * p.gx_mult;
  *gy_out = gy * p.gy_mult;
}

/// grad_grid, one grid point per thread: t in [0, N * Ho * Wo), writes grad_grid[n, ho, wo, :].
template <class T>
DETOPS_HOST_DEVICE inline void grid_sample_grad_grid_element(std::int64_t t, const GridSampleBackwardArgs<T>& a,
                                                             void* grad_grid, DType grid_dtype,
                                                             const GridSampleStrides& gg) {
  const GridSampleShape& s = a.g.shape;
  const std::int64_t wo = t % s.Wo, ho = (t / s.Wo) % s.Ho, n = t / (s.Wo * s.Ho);
  acc_t<T> gx, gy;
  grid_sample_grad_grid_point(a, n, ho, wo, grid_sample_point(a.g, n, ho, wo), &gx, &gy);
  const std::int64_t off = n * gg.s0 + ho * gg.s1 + wo * gg.s2;
  store_grid_value(grad_grid, grid_dtype, off, gx, s.unit);
  store_grid_value(grad_grid, grid_dtype, off + gg.s3, gy, s.unit);
}

/// Records per grid point in the exact mode: the four corners, or nearest's one pixel.
DETOPS_HOST_DEVICE inline std::int64_t grid_sample_records_per_point(const GridSampleShape& s) {
  return s.nearest ? 1 : 4;
}

/// Exact mode, phase 1 for a chunk of images starting at n0: one grid point per thread, t in
/// [0, images * Ho * Wo). Record t * K + k is corner k (nw, ne, sw, se) of the point: key =
/// (n - n0) * H * W + iy * W + ix (the pixel after padding), weight, source = offset of
/// grad_output[n, 0, ho, wo]; a corner outside the map, or a point that samples nothing, gets
/// the sentinel (the chunk's positions: its capacity in images times H * W).
template <class T>
DETOPS_HOST_DEVICE inline void grid_sample_enumerate_element(std::int64_t t, const GridSampleBackwardArgs<T>& a,
                                                             std::int64_t n0, GatherKey sentinel,
                                                             const GatherRecords<acc_t<T>>& rec) {
  using A = acc_t<T>;
  const GridSampleShape& s = a.g.shape;
  const std::int64_t K = grid_sample_records_per_point(s);
  const std::int64_t wo = t % s.Wo, ho = (t / s.Wo) % s.Ho, n = n0 + t / (s.Wo * s.Ho);
  const GridPoint<A> p = grid_sample_point(a.g, n, ho, wo);
  const std::int64_t source = n * a.go.s0 + ho * a.go.s2 + wo * a.go.s3;
  for (std::int64_t k = 0; k < K; ++k) {
    const std::int64_t j = t * K + k;
    if (p.count > 0 && p.valid[k]) {
      const auto key = static_cast<GatherKey>(((n - n0) * s.H + p.iy[k]) * s.W + p.ix[k]);
      gather_set_record(rec, j, key, p.weight[k], source);
    } else {
      gather_set_record(rec, j, sentinel, A(0), std::int64_t{0});
    }
  }
}

/// The exact mode's destination map (the engine's Target): key -> offset of
/// grad_input[n0 + key / (H * W), 0, iy, ix].
struct GridSampleTarget {
  std::int64_t n0, H, W;
  GridSampleStrides gi;
  DETOPS_HOST_DEVICE std::int64_t operator()(GatherKey key) const {
    const auto k = static_cast<std::int64_t>(key);
    const std::int64_t plane = H * W, r = k % plane;
    return (n0 + k / plane) * gi.s0 + (r / W) * gi.s2 + (r % W) * gi.s3;
  }
};

}  // namespace detail
}  // namespace detops
