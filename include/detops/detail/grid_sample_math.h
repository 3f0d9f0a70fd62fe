// The one copy of grid_sample's math, shared by the CPU backend, the CUDA kernels and the
// emulated-grid tests: unnormalization, the padding modes (border clip, reflection), bilinear
// corners and weights, nearest rounding, and the multipliers of grad_grid.
//
// The operations and their order are those of PyTorch's CPU kernel for 4-d inputs (the vectorized
// one, which float64 uses too), so that a float64 forward, grad_input and grad_grid agree with
// F.grid_sample on the CPU to the bit. That kernel is compiled with floating-point contraction, so
// some of its multiply-adds are fused (measured against torch 1.13.1's x86-64 build: the
// unnormalization without align_corners, the forward's sum of the four corners, and grad_grid's
// per-channel terms); those are written here as explicit fma_() calls. An fma is one correctly
// rounded operation on the host (libm's fma, the instruction where the CPU has it) and on the
// device, so host and device still evaluate the same IEEE operations (the library is built with
// -ffp-contract=off on the host and --fmad=false on the device: no other contraction happens).
// PyTorch's CUDA kernel writes the unnormalization as ((g + 1) * size - 1) / 2 and sums without
// fusing, so it differs from its own CPU kernel in the last bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "detops/detail/host_device.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

/// Element strides of a 4-d tensor (input, grad_output, grid's [N, Ho, Wo, 2]).
struct GridSampleStrides {
  std::int64_t s0, s1, s2, s3;
};

/// The scalars of one call as the bodies see them.
struct GridSampleShape {
  std::int64_t N, C, H, W;  // input
  std::int64_t Ho, Wo;      // grid and output
  bool nearest;             // interpolation: nearest, else bilinear
  int padding;              // 0 zeros, 1 border, 2 reflection (GridSamplePadding's values)
  bool align_corners;
  bool unit;                // coordinates: [0, 1], read as 2c - 1 (GridSampleCoordinates::kUnit)
};

constexpr int kGridPadZeros = 0, kGridPadBorder = 1, kGridPadReflection = 2;

DETOPS_HOST_DEVICE inline float floor_(float v) { return ::floorf(v); }
DETOPS_HOST_DEVICE inline double floor_(double v) { return ::floor(v); }
DETOPS_HOST_DEVICE inline float trunc_(float v) { return ::truncf(v); }
DETOPS_HOST_DEVICE inline double trunc_(double v) { return ::trunc(v); }
DETOPS_HOST_DEVICE inline float fabs_(float v) { return ::fabsf(v); }
DETOPS_HOST_DEVICE inline double fabs_(double v) { return ::fabs(v); }
/// a * b + c rounded once.
DETOPS_HOST_DEVICE inline float fma_(float a, float b, float c) { return ::fmaf(a, b, c); }
DETOPS_HOST_DEVICE inline double fma_(double a, double b, double c) { return ::fma(a, b, c); }
/// Round half to even (the default rounding mode: PyTorch's round for nearest).
DETOPS_HOST_DEVICE inline float nearbyint_(float v) { return ::nearbyintf(v); }
DETOPS_HOST_DEVICE inline double nearbyint_(double v) { return ::nearbyint(v); }
/// Finite: v - v is 0 for finite v and NaN for NaN and infinities.
template <class A>
DETOPS_HOST_DEVICE inline bool grid_finite(A v) {
  return v - v == A(0);
}

/// One spatial axis (x with W, y with H) of a call, in accumulation type A.
template <class A>
struct GridAxis {
  std::int64_t size;
  A scale;       // d(coordinate) / d(grid) of the unnormalization: (size - 1) / 2 or size / 2
  A max_val;     // size - 1: border clipping bound
  A low;         // where reflection starts: 0 (align_corners) or -0.5
  A twice_span;  // reflection period: 2 (size - 1) or 2 size
  bool align_corners;
};

template <class A>
DETOPS_HOST_DEVICE inline GridAxis<A> make_grid_axis(std::int64_t size, bool align_corners) {
  GridAxis<A> a;
  a.size = size;
  a.align_corners = align_corners;
  a.max_val = static_cast<A>(size - 1);
  a.scale = align_corners ? static_cast<A>(size - 1) / A(2) : static_cast<A>(size) / A(2);
  a.low = align_corners ? A(0) : A(-0.5);
  a.twice_span = align_corners ? static_cast<A>(size - 1) * A(2) : static_cast<A>(size) * A(2);
  return a;
}

/// [-1, 1] -> pixel coordinates: (g + 1) * scale, minus 0.5 (fused) without align_corners.
template <class A>
DETOPS_HOST_DEVICE inline A grid_unnormalize(A g, const GridAxis<A>& a) {
  return a.align_corners ? (g + A(1)) * a.scale : fma_(g + A(1), a.scale, A(-0.5));
}

/// A coordinate after padding with the derivative multiplier d(coordinate) / d(grid).
template <class A>
struct GridCoord {
  A value;
  A mult;
};

/// Clips to [0, size - 1]; the derivative is 0 on and beyond the bounds (PyTorch's convention:
/// the borders count as out of bounds). NaN clips to 0, as PyTorch's CPU and CUDA kernels do (so
/// under border and reflection padding a NaN coordinate samples the edge pixel; infinities clip
/// to their edge, and reflection makes NaN of them first, so they too sample at 0).
/// (Selects, not branches: a loop of these vectorizes, the CPU's lanes.)
template <class A>
DETOPS_HOST_DEVICE inline GridCoord<A> grid_clip(A v, const GridAxis<A>& a) {
  const A above = v > A(0) ? v : A(0);  // NaN and -0 too give +0
  return {above >= a.max_val ? a.max_val : above, ((v > A(0)) & (v < a.max_val)) ? A(1) : A(0)};
}

/// Reflects about `low` and `low + twice_span / 2` (PyTorch's vectorized formulation: the
/// distance from low, its remainder modulo the period by truncated division, then the shorter
/// way back); the multiplier is -1 when an odd number of reflections flips the direction.
/// A degenerate axis (align_corners with size 1) maps everything to 0 with derivative 0 (its
/// period is 0: the arithmetic runs and its result is dropped, a select rather than a branch).
template <class A>
DETOPS_HOST_DEVICE inline GridCoord<A> grid_reflect(A v, const GridAxis<A>& a) {
  const bool degenerate = a.align_corners & (a.size <= 1);
  const A from_low = v - a.low;
  const bool negative = from_low < A(0);
  const A dist = fabs_(from_low);
  const A periods = trunc_(dist / a.twice_span);
  const A extra = dist - periods * a.twice_span;
  const A reflected = a.twice_span - extra;
  const bool flip = extra > reflected;
  const A value = (flip ? reflected : extra) + a.low, mult = flip != negative ? A(-1) : A(1);
  return {degenerate ? A(0) : value, degenerate ? A(0) : mult};
}

/// The pixel coordinate of grid value g along axis a after padding, with d(coordinate)/d(g):
/// zeros keeps it; border clips; reflection reflects, then clips.
template <class A>
DETOPS_HOST_DEVICE inline GridCoord<A> grid_source_coord(A g, const GridAxis<A>& a, int padding) {
  const A v = grid_unnormalize(g, a);
  if (padding == kGridPadBorder) {
    const GridCoord<A> c = grid_clip(v, a);
    return {c.value, c.mult == A(0) ? A(0) : a.scale};
  }
  if (padding == kGridPadReflection) {
    const GridCoord<A> r = grid_reflect(v, a);
    const GridCoord<A> c = grid_clip(r.value, a);
    return {c.value, c.mult == A(0) ? A(0) : r.mult * a.scale};
  }
  return {v, a.scale};
}

/// Index of the first of two neighbouring pixels floor(v), v + 1, as an integer, for a finite v;
/// -2 when neither lies in [0, size) (so a huge coordinate never converts out of range). I is
/// std::int64_t, or std::int32_t where size fits it (the CPU's vector lanes): the same value.
template <class I = std::int64_t, class A>
DETOPS_HOST_DEVICE inline I grid_floor_index(A v0, std::int64_t size) {
  // `&`, not `&&`: no branch between the compares, so that a loop of these vectorizes (the CPU's lanes)
  return ((v0 >= A(-1)) & (v0 < static_cast<A>(size))) ? static_cast<I>(v0) : I(-2);
}

/// The index of a bilinear corner's column (step = k & 1) or row (step = k >> 1) from the nw
/// corner's `first`; -2 (no corner on the map along this axis) stays -2.
template <class I>
DETOPS_HOST_DEVICE inline I grid_corner_index(I first, int step) {
  return first < I(-1) ? first : first + I(step);
}

/// Whether pixel (ix, iy) lies on a map of H x W (sizes of ix's type or wider).
template <class I, class S>
DETOPS_HOST_DEVICE inline bool grid_in_map(I ix, I iy, S H, S W) {
  return (ix >= 0) & (ix < W) & (iy >= 0) & (iy < H);  // `&`: as grid_floor_index
}

/// The bilinear weights nw, ne, sw, se of a point at (dx, dy) = (x - floor(x), y - floor(y)).
template <class A>
DETOPS_HOST_DEVICE inline void grid_bilinear_weights(A dx, A dy, A* w) {
  const A ex = A(1) - dx, sy = A(1) - dy;  // distances to the east and south neighbours
  w[0] = sy * ex;                          // nw
  w[1] = sy * dx;                          // ne
  w[2] = dy * ex;                          // sw
  w[3] = dy * dx;                          // se
}

/// Everything one grid point needs: the up to four corner pixels (nw, ne, sw, se; nearest uses
/// corner 0 only) with validity and weight, the distances for grad_grid, and its multipliers.
/// `count` is 0 when a nearest point samples nothing (a NaN or infinite coordinate after
/// padding: only zeros padding keeps one). A bilinear point with such a coordinate is PyTorch's
/// CPU kernel's: no corner on the map, but weights and distances NaN (floor and fraction of a
/// non-finite value), so its sample is NaN (0 * NaN), its grad_grid NaN along the axis whose
/// weights are (and the other component 0), and grad_input gets nothing from it.
template <class A>
struct GridPoint {
  int count;                 // 0 (nothing), 1 (nearest) or 4 (bilinear)
  std::int64_t ix[4], iy[4];
  bool valid[4];             // inside the map
  A weight[4];
  A dx, dy;                  // x - floor(x), y - floor(y) (bilinear)
  A gx_mult, gy_mult;        // d(x)/d(grid x), d(y)/d(grid y)
};

/// The corners of the pixel coordinates (x, y) (after padding) for a map of H x W.
template <class A>
DETOPS_HOST_DEVICE inline GridPoint<A> grid_point(const GridCoord<A>& x, const GridCoord<A>& y, std::int64_t H,
                                                  std::int64_t W, bool nearest) {
  GridPoint<A> p{};
  p.gx_mult = x.mult;
  p.gy_mult = y.mult;
  if (nearest) {
    if (!grid_finite(x.value) || !grid_finite(y.value)) {
      p.count = 0;
      return p;
    }
    const A xr = nearbyint_(x.value), yr = nearbyint_(y.value);
    p.count = 1;
    p.ix[0] = grid_floor_index(xr, W);
    p.iy[0] = grid_floor_index(yr, H);
    p.valid[0] = grid_in_map(p.ix[0], p.iy[0], H, W);
    p.weight[0] = A(1);
    return p;
  }
  const A x0 = floor_(x.value), y0 = floor_(y.value);
  const std::int64_t ixw = grid_floor_index(x0, W), iyn = grid_floor_index(y0, H);
  p.count = 4;
  p.dx = x.value - x0;
  p.dy = y.value - y0;
  grid_bilinear_weights(p.dx, p.dy, p.weight);
  for (int k = 0; k < 4; ++k) {
    p.ix[k] = grid_corner_index(ixw, k & 1);
    p.iy[k] = grid_corner_index(iyn, k >> 1);
    p.valid[k] = grid_in_map(p.ix[k], p.iy[k], H, W);
  }
  return p;
}

/// A bilinear sample from its corner values (0 off the map) and weights: nw * w_nw, plus ne * w_ne,
/// sw * w_sw, se * w_se in that order, each a fused multiply-add (as PyTorch's CPU kernel computes it).
template <class A>
DETOPS_HOST_DEVICE inline A grid_bilinear_sum(A v0, A v1, A v2, A v3, A w0, A w1, A w2, A w3) {
  return fma_(v3, w3, fma_(v2, w2, fma_(v1, w1, v0 * w0)));
}

/// One channel's term of a bilinear point's grad_grid, added to (gx, gy): the corner differences
/// weighted by the other axis' distances, times grad_output g (PyTorch's expression, with its CPU
/// kernel's fused multiply-adds); the channels are added in order.
template <class A>
DETOPS_HOST_DEVICE inline void grid_grad_grid_add(A v0, A v1, A v2, A v3, A dx, A dy, A g, A& gx, A& gy) {
  const A ex = A(1) - dx, sy = A(1) - dy;
  gx = fma_(fma_(v3 - v2, dy, (v1 - v0) * sy), g, gx);
  gy = fma_(fma_(v3 - v1, dx, (v2 - v0) * ex), g, gy);
}

/// A unit coordinate c (in [0, 1]) as the normalized one, 2c - 1, computed in float32 or
/// float64 as torch's `2 * c - 1` is: 2c (exact), minus 1 (rounded once; the operations are
/// separate, never fused).
template <class A>
DETOPS_HOST_DEVICE inline A grid_from_unit(A c) {
  const A twice = A(2) * c;
  return twice - A(1);
}

/// The same for a 16-bit grid value v (its float value): torch rounds 2v to the grid's dtype,
/// then that minus 1 (computed in float) again.
template <class T16>
DETOPS_HOST_DEVICE inline float grid_from_unit_16(float v) {
  const float twice = static_cast<float>(T16(2.0f * v));
  return static_cast<float>(T16(twice - 1.0f));
}

/// Grid value at `offset` of a grid in any floating dtype, as double (exact); with `unit`, the
/// normalized value 2c - 1 of a unit coordinate, computed in the grid's dtype (grid_from_unit).
DETOPS_HOST_DEVICE inline double load_grid_value(const void* data, DType dtype, std::int64_t offset,
                                                 bool unit = false) {
  switch (dtype) {
    case DType::kFloat64: {
      const double c = static_cast<const double*>(data)[offset];
      return unit ? grid_from_unit(c) : c;
    }
    case DType::kFloat16: {
      const float c = static_cast<float>(static_cast<const Half*>(data)[offset]);
      return static_cast<double>(unit ? grid_from_unit_16<Half>(c) : c);
    }
    case DType::kBFloat16: {
      const float c = static_cast<float>(static_cast<const BFloat16*>(data)[offset]);
      return static_cast<double>(unit ? grid_from_unit_16<BFloat16>(c) : c);
    }
    default: {
      const float c = static_cast<const float*>(data)[offset];
      return static_cast<double>(unit ? grid_from_unit(c) : c);
    }
  }
}

/// Stores an accumulator into a grid-typed tensor (grad_grid), rounding once; with `unit`, twice
/// the rounded value (the backward of 2c - 1 in the grid's dtype: exact, barring overflow).
template <class A>
DETOPS_HOST_DEVICE inline void store_grid_value(void* data, DType dtype, std::int64_t offset, A v, bool unit = false) {
  switch (dtype) {
    case DType::kFloat64: {
      const double r = static_cast<double>(v);
      static_cast<double*>(data)[offset] = unit ? r * 2.0 : r;
      break;
    }
    case DType::kFloat16: {
      const Half r(static_cast<float>(v));
      static_cast<Half*>(data)[offset] = unit ? Half(static_cast<float>(r) * 2.0f) : r;
      break;
    }
    case DType::kBFloat16: {
      const BFloat16 r(static_cast<float>(v));
      static_cast<BFloat16*>(data)[offset] = unit ? BFloat16(static_cast<float>(r) * 2.0f) : r;
      break;
    }
    default: {
      const float r = static_cast<float>(v);
      static_cast<float*>(data)[offset] = unit ? r * 2.0f : r;
      break;
    }
  }
}

}  // namespace detail
}  // namespace detops
