// What the multi-scale deformable attention entry points hand to a backend after validation:
// the views, the sizes, and the level table read from spatial_shapes / level_start_index and
// checked on the host; and the backend table. Shared by src/cpu/ms_deform_attn_cpu.cpp and
// cuda/ms_deform_attn_cuda.cu.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detops/context.h"
#include "detops/detail/ms_deform_attn_kernels.h"
#include "detops/ms_deform_attn.h"
#include "internal/common.h"
#include "internal/gather_backward_cpu.h"

namespace detops {
namespace internal {

/// One validated call. Absent outputs are default (undefined) views.
struct MsdaCall {
  const char* op;
  TensorView value, spatial_shapes, level_start_index, sampling_locations, attention_weights;
  TensorView output;       // forward
  TensorView grad_output;  // backward
  TensorView grad_value, grad_sampling_locations, grad_attention_weights;
  detail::MsdaShape shape;
  std::vector<detail::MsdaLevel> levels;  // host copy, checked
};

/// Whether any (b, q, m, l, p) sample exists (otherwise grad_value is all zeros).
inline bool msda_has_samples(const detail::MsdaShape& s) { return s.B * s.M * s.Q * s.L * s.P > 0; }
/// The exact mode's records of one (b, m) plane, and the planes of one chunk: as many whole planes
/// as fit in max(one plane, detail::kGatherChunkRecords) records, which bounds the workspace (one
/// DINO encoder plane is Q * L * P * 4 = 1.4M records) while small problems run in one chunk.
inline std::int64_t msda_plane_records(const detail::MsdaShape& s) { return s.Q * s.L * s.P * detail::kMsdaCorners; }
inline std::int64_t msda_chunk_planes(const detail::MsdaShape& s) {
  const std::int64_t per_plane = std::max<std::int64_t>(msda_plane_records(s), 1);
  const std::int64_t planes = std::max<std::int64_t>(1, std::max(per_plane, detail::kGatherChunkRecords) / per_plane);
  return std::min(planes, std::max<std::int64_t>(s.B * s.M, 1));
}

template <class V>
void copy_strides(const TensorView& v, V* out) {
  for (int d = 0; d < v.rank; ++d) out[d] = v.strides[d];
}

/// The kernels' view of the inputs (levels: host or device memory, as the backend needs).
template <class T, class Loc>
detail::MsdaInputs<T, Loc> msda_inputs(const MsdaCall& call, const detail::MsdaLevel* levels) {
  detail::MsdaInputs<T, Loc> in{};
  in.value = static_cast<const T*>(call.value.data);
  copy_strides(call.value, in.vs);
  in.levels = levels;
  in.loc = static_cast<const Loc*>(call.sampling_locations.data);
  copy_strides(call.sampling_locations, in.ls);
  in.attn = static_cast<const T*>(call.attention_weights.data);
  copy_strides(call.attention_weights, in.as);
  in.shape = call.shape;
  return in;
}

template <class T, class Loc>
detail::MsdaBackwardArgs<T, Loc> msda_backward_args(const MsdaCall& call, const detail::MsdaLevel* levels) {
  detail::MsdaBackwardArgs<T, Loc> a{};
  a.in = msda_inputs<T, Loc>(call, levels);
  a.grad_out = static_cast<const T*>(call.grad_output.data);
  copy_strides(call.grad_output, a.gos);
  a.grad_value = static_cast<T*>(call.grad_value.data);
  copy_strides(call.grad_value, a.gvs);
  a.grad_loc = static_cast<Loc*>(call.grad_sampling_locations.data);
  copy_strides(call.grad_sampling_locations, a.gls);
  a.grad_attn = static_cast<T*>(call.grad_attention_weights.data);
  copy_strides(call.grad_attention_weights, a.gas);
  return a;
}

/// The engine's destination map for the chunk starting at plane0.
inline detail::MsdaValueTarget msda_value_target(const MsdaCall& call, std::int64_t plane0) {
  const TensorView& gv = call.grad_value;
  return {plane0, call.shape.S, call.shape.M, gv.strides[0], gv.strides[1], gv.strides[2]};
}

/// Calls f(T{}, Loc{}) with T the value's C++ type and Loc the locations'.
template <class F>
void dispatch_msda(DType value, DType loc, F&& f) {
  dispatch_floating(value, [&](auto t) {
    using T = decltype(t);
    if (loc == DType::kFloat32) {
      f(t, float{});
    } else if (loc == DType::kFloat64) {
      f(t, double{});
    } else {
      f(t, T{});  // validated: value's dtype
    }
  });
}

/// A multi-scale deformable attention backend: one table per device (internal/backend.h).
struct MsdaBackend {
  /// Copies spatial_shapes ([L, 2]) and level_start_index ([L]), on this backend's device, to the
  /// host (row-major) with one wait.
  void (*read_levels)(const MsdaCall& call, std::int64_t* shapes, std::int64_t* starts, const Context& ctx);
  void (*forward)(const MsdaCall& call, const Context& ctx);
  /// Bytes of the backward's WorkspaceLayout (without the alignment slack) for `mode`, grad_value
  /// computed.
  std::size_t (*backward_workspace)(const MsdaCall& call, BackwardMode mode);
  /// The backward into the defined gradients; ws: the layout's memory, kWorkspaceAlign-aligned.
  void (*backward)(const MsdaCall& call, BackwardMode mode, const Context& ctx, Workspace ws);
};
extern const MsdaBackend kMsDeformAttnCpu;
extern const MsdaBackend kMsDeformAttnCuda;

/// The CPU backend's exact mode on a given path (CpuExactPath; the backend's own choice goes by
/// the plane count), for the test that holds the two paths to the same bits: the workspace
/// bytes of that path, and the backward into the call's gradients. call.levels must be read.
std::size_t ms_deform_attn_cpu_exact_workspace(const MsdaCall& call, CpuExactPath path);
void ms_deform_attn_cpu_exact_backward(const MsdaCall& call, CpuExactPath path, const Context& ctx, Workspace ws);

}  // namespace internal
}  // namespace detops
