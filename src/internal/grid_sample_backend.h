// What the grid_sample entry points hand to a backend after validation, and the backend table.
// Shared by src/cpu/grid_sample_cpu.cpp and cuda/grid_sample_cuda.cu.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "detops/context.h"
#include "detops/detail/grid_sample_kernels.h"
#include "detops/grid_sample.h"
#include "internal/common.h"
#include "internal/gather_backward_cpu.h"

namespace detops {
namespace internal {

/// One validated call. Forward: input, grid, output. Backward: grad_output, input, grid,
/// grad_input and grad_grid (either may be absent: not computed).
struct GridSampleCall {
  const char* op;
  TensorView input;
  TensorView grid;
  TensorView output;       // forward
  TensorView grad_output;  // backward
  TensorView grad_input;   // backward, may be absent
  TensorView grad_grid;    // backward, may be absent
  detail::GridSampleShape shape;
};

inline detail::GridSampleStrides gs_strides(const TensorView& v) {
  return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
}

template <class T>
detail::GridSampleArgs<T> grid_sample_args(const GridSampleCall& call) {
  return detail::make_grid_sample_args<T>(static_cast<const T*>(call.input.data), gs_strides(call.input),
                                          call.grid.data, call.grid.dtype, gs_strides(call.grid), call.shape);
}

/// The backward's views for the bodies (grad_input's strides are zero when it is absent).
template <class T>
detail::GridSampleBackwardArgs<T> grid_sample_backward_args(const GridSampleCall& call, bool channels_last) {
  detail::GridSampleBackwardArgs<T> a{};
  a.g = grid_sample_args<T>(call);
  a.grad_output = static_cast<const T*>(call.grad_output.data);
  a.go = gs_strides(call.grad_output);
  a.gi = call.grad_input.defined() ? gs_strides(call.grad_input) : detail::GridSampleStrides{0, 0, 0, 0};
  a.channels_last = channels_last;
  return a;
}

/// The exact mode's floor on the records of one chunk: a chunk holds as many whole images as fit
/// in max(one image's records, 2^21) records, which bounds the workspace whatever N is.

/// Records of one image, and images per chunk (at least 1).
inline std::int64_t grid_sample_image_records(const detail::GridSampleShape& s) {
  return s.Ho * s.Wo * detail::grid_sample_records_per_point(s);
}
inline std::int64_t grid_sample_chunk_images(const detail::GridSampleShape& s) {
  const std::int64_t per_image = grid_sample_image_records(s);
  if (per_image == 0) return std::max<std::int64_t>(s.N, 1);
  return std::max<std::int64_t>(1, std::min(s.N, std::max(per_image, detail::kGatherChunkRecords) / per_image));
}

/// A grid_sample backend: one table per device (internal/backend.h), defined at the bottom of
/// src/cpu/grid_sample_cpu.cpp and cuda/grid_sample_cuda.cu.
struct GridSampleBackend {
  void (*forward)(const GridSampleCall& call, const Context& ctx);
  /// Bytes of the backward's WorkspaceLayout (without the alignment slack) for `mode`.
  std::size_t (*backward_workspace)(const GridSampleCall& call, BackwardMode mode);
  /// The backward into call.grad_input and call.grad_grid; ws is the layout's memory,
  /// kWorkspaceAlign-aligned.
  void (*backward)(const GridSampleCall& call, BackwardMode mode, const Context& ctx, Workspace ws);
};
extern const GridSampleBackend kGridSampleCpu;
extern const GridSampleBackend kGridSampleCuda;

/// The CPU backend's exact mode on a given path (internal/gather_backward_cpu.h's CpuExactPath;
/// the backend's own choice goes by layout), for the test that holds the two paths to the same
/// bits: the workspace bytes of that path, and the backward (grad_input and grad_grid).
std::size_t grid_sample_cpu_exact_workspace(const GridSampleCall& call, CpuExactPath path);
void grid_sample_cpu_exact_backward(const GridSampleCall& call, CpuExactPath path, const Context& ctx, Workspace ws);

}  // namespace internal
}  // namespace detops
