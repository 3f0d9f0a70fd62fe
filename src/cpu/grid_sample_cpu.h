// What grid_sample's CPU loops share with the kernel file compiled per instruction set
// (grid_sample_cpu_kernels.inc, internal/cpu_isa.h): the bilinear forward in lanes. This is that
// kernel file's whole interface (it has no #includes of its own: it is compiled inside the
// variants' namespaces); everything is internal.
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

/// A block of bilinear grid points in lanes (structure of arrays, B points): point i's x at
/// coord[i] and y at coord[B + i]; corner k's offset in a plane at offset[k * B + i] (-1 when off
/// the map) and its weight at weight[k * B + i]. One per thread, reused across its items.
struct GridLanes {
  std::vector<float> coord;
  std::vector<std::int32_t> offset;
  std::vector<float> weight;
};

/// Whether a forward can run in lanes: float32 input, output and grid, bilinear, a non-empty map
/// whose every pixel offset fits 32 bits, output rows with unit stride. Each lane evaluates the
/// shared math of detail/grid_sample_math.h (grid_source_coord, grid_floor_index,
/// grid_bilinear_weights, grid_corner_index, grid_in_map, grid_bilinear_sum) in the order
/// grid_sample_point and grid_sample_interpolate do, so a lane's result has the same bits; only
/// the index type narrows (the same values, as the offsets fit).
inline bool lanes_apply(const GridSampleCall& call) {
  const detail::GridSampleShape& s = call.shape;
  const TensorView& in = call.input;
  if (in.dtype != DType::kFloat32 || call.grid.dtype != DType::kFloat32 || s.nearest) return false;
  if (s.H < 1 || s.W < 1 || call.output.strides[3] != 1) return false;
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  return (s.H - 1) * in.strides[2] + (s.W - 1) * in.strides[3] < kMax && s.H < kMax && s.W < kMax;
}

struct GridSampleCpuKernels {
  /// The forward of image n for channels [c0, c1) (lanes_apply holds): per block of the image's
  /// points, their lanes once, then each channel's plane sampled from them.
  void (*forward_lanes)(const detail::GridSampleArgs<float>& a, std::int64_t n, std::int64_t c0, std::int64_t c1,
                        float* output, const detail::GridSampleStrides& out, GridLanes& lanes);
};

}  // namespace
}  // namespace internal
}  // namespace detops
