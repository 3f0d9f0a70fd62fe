// What grid_sample's CPU loops share with the kernel file compiled per instruction set
// (grid_sample_cpu_kernels.inc, internal/cpu_isa.h): bilinear points in lanes, for the forward
// and the backward's scatter walks. This is that kernel file's whole interface (it has no
// #includes of its own: it is compiled inside the variants' namespaces); everything is internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "internal/common.h"
#include "internal/cpu_isa.h"
#include "internal/grid_sample_backend.h"

#if DETOPS_X86_ISA_VARIANTS
#include <immintrin.h>  // the gathers of the AVX2 and AVX-512 variants
#endif

namespace detops {
namespace internal {
namespace {

/// Points per block of lanes (40 bytes a point: a block stays in L1 between the passes).
constexpr std::int64_t kLaneBlock = 512;

/// A block of bilinear grid points in lanes (structure of arrays, B = kLaneBlock points): point
/// i's x at coord[i] and y at coord[B + i]; corner k's offset in a plane at offset[k * B + i] (-1
/// when off the map) and its weight at weight[k * B + i]. One per thread, reused across its items.
struct GridLanes {
  std::vector<float> coord;
  std::vector<std::int32_t> offset;
  std::vector<float> weight;

  /// Sized for a block (a no-op once it is; a walk that must not allocate after it starts writing
  /// calls it first).
  void size_for_block() {
    coord.resize(static_cast<std::size_t>(2 * kLaneBlock));
    offset.resize(static_cast<std::size_t>(4 * kLaneBlock));
    weight.resize(static_cast<std::size_t>(4 * kLaneBlock));
  }
};

/// Whether a call's points can be computed in lanes: float32 input and grid, bilinear, a non-empty
/// map whose every pixel offset in `plane` (a view of the map's shape) fits 32 bits. Each lane
/// evaluates the shared math of detail/grid_sample_math.h (grid_source_coord, grid_floor_index,
/// grid_bilinear_weights, grid_corner_index, grid_in_map, grid_bilinear_sum) in the order
/// grid_sample_point and grid_sample_interpolate do, so a lane's result has the same bits; only
/// the index type narrows (the same values, as the offsets fit).
inline bool lanes_fit(const GridSampleCall& call, const TensorView& plane) {
  const detail::GridSampleShape& s = call.shape;
  if (call.input.dtype != DType::kFloat32 || call.grid.dtype != DType::kFloat32 || s.nearest) return false;
  if (s.H < 1 || s.W < 1) return false;
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  return (s.H - 1) * plane.strides[2] + (s.W - 1) * plane.strides[3] < kMax && s.H < kMax && s.W < kMax;
}

/// The forward in lanes: output rows with unit stride.
inline bool lanes_apply(const GridSampleCall& call) {
  return lanes_fit(call, call.input) && call.output.strides[3] == 1;
}

/// The backward's walks over lanes: grad_input's planes dense (row-major), so that a corner's
/// offset is its destination index iy * W + ix.
inline bool backward_lanes_apply(const GridSampleCall& call) {
  const TensorView& gi = call.grad_input;
  return gi.defined() && lanes_fit(call, gi) && gi.strides[3] == 1 && gi.strides[2] == call.shape.W;
}

struct GridSampleCpuKernels {
  /// The forward of image n for channels [c0, c1) (lanes_apply holds): per block of the image's
  /// points, their lanes once, then each channel's plane sampled from them.
  void (*forward_lanes)(const detail::GridSampleArgs<float>& a, std::int64_t n, std::int64_t c0, std::int64_t c1,
                        float* output, const detail::GridSampleStrides& out, GridLanes& lanes);
  /// The lanes of points [t0, t0 + m) of image n (m <= kLaneBlock, grid order), corner offsets
  /// with strides (sh, sw): the backward's walks take their points from here.
  void (*fill_block)(const detail::GridSampleArgs<float>& a, std::int64_t n, std::int64_t t0, std::int64_t m,
                     std::int64_t sh, std::int64_t sw, GridLanes& lanes);
  /// grad_grid: one channel's terms (detail::grid_grad_grid_add) of m bilinear points, corner k's
  /// offset in `plane` at ok[i] (-1 off the map), added to sum_x[i] and sum_y[i].
  void (*grad_grid_lanes)(const float* plane, std::int64_t m, const std::int32_t* o0, const std::int32_t* o1,
                          const std::int32_t* o2, const std::int32_t* o3, const float* dx, const float* dy,
                          const float* g, float* sum_x, float* sum_y);
  /// grad_grid's points [q0, q0 + m) of image n in grid order (rows that continue one another as
  /// one): corner k's offset with strides (sh, sw) at o[k * o_stride + i] (-1 off the map), the
  /// distances dx, dy and the multipliers mx, my, the values grid_sample_point gives; `xy`:
  /// scratch of 2 * m floats.
  void (*grad_grid_points)(const detail::GridSampleArgs<float>& a, std::int64_t n, std::int64_t q0, std::int64_t m,
                           std::int64_t sh, std::int64_t sw, std::int32_t* o, std::int64_t o_stride, float* dx,
                           float* dy, float* mx, float* my, float* xy);
};

}  // namespace
}  // namespace internal
}  // namespace detops
