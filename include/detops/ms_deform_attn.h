// Multi-scale deformable attention (Deformable DETR) forward and backward on CPU and CUDA, with
// the semantics of the Deformable-DETR and mmcv kernels (ms_deform_attn_forward / _backward), a
// CPU backward (Deformable-DETR has none), every floating dtype, and two backward modes: atomic
// (grad_value scattered with atomicAdd on CUDA, as the anchors do: not reproducible there) and
// exact (no float atomics: the same bits across runs, CPU thread counts and CPU vs CUDA).
//
// Shapes (any non-negative strides):
//   value               [B, S, M, D]        float32 | float64 | float16 | bfloat16; S = sum of H*W
//   spatial_shapes      [L, 2]              int64 (H, W) per level
//   level_start_index   [L]                 int64, level l's first row of S: the exclusive prefix
//                                           sum of H*W (checked)
//   sampling_locations  [B, Q, M, L, P, 2]  (x, y) in [0, 1]; float32 or float64, or value's dtype
//   attention_weights   [B, Q, M, L, P]     value's dtype
//   output              [B, Q, M*D]         value's dtype
//   grad_output         [B, Q, M*D]         value's dtype
//   grad_value          like value; grad_sampling_locations like sampling_locations;
//   grad_attention_weights like attention_weights: each fully overwritten, each may be empty
//   (not computed).
// spatial_shapes and level_start_index may live on the host for a CUDA call; on the device their
// L rows are copied to the host with one wait on the stream (they must be checked).
//
// Semantics, per (b, q, m, l, p), in the accumulation type (float for 16-bit and float32 values,
// double for float64; locations widened or narrowed to it):
//   x = loc_x * W_l - 0.5, y = loc_y * H_l - 0.5; the sample is skipped (contributes 0, and
//   gets 0 gradients) unless -1 < x < W_l and -1 < y < H_l (the kernels' bounds; a NaN location
//   is skipped too); otherwise bilinear over the four neighbours, a neighbour outside the level
//   contributes 0 (zeros padding).
//   output[b, q, m*D + d] = sum over (l, p) of attention_weights * bilinear(value[b, level l, m, d])
//   in (l, p) order.
//   grad_sampling_locations and grad_attention_weights: one writer each per (b, q, m, l, p),
//   summed over d in order (fixed for any D: no atomics in either mode).
//   grad_value: kAtomic scatters; kExact sums each value row's contributions in the canonical
//   order (q, l, p, corner), in partials of 256 contributions added in order.
//
// Errors (detops::Error, thrown before anything is written, outputs left untouched): wrong ranks,
// sizes, dtypes or devices; spatial_shapes, level_start_index and S that disagree; a negative
// level size or one whose H*W overflows; an output that shares memory with another argument; a
// workspace too small; BackwardMode::kTruncated (not offered).
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/backward_mode.h"
#include "detops/context.h"
#include "detops/tensor.h"

namespace detops {

/// ms_deform_attn offers atomic and exact; its backward takes scratch (the exact mode's), its forward none.
inline constexpr OpCapabilities kMsDeformAttnCapabilities{
    "ms_deform_attn", backward_mode_bits({BackwardMode::kAtomic, BackwardMode::kExact}), false, true};

struct MsDeformAttnBackwardOptions {
  /// kAtomic or kExact (kTruncated is refused).
  BackwardMode mode = BackwardMode::kExact;
};

void ms_deform_attn_forward(const TensorView& value, const TensorView& spatial_shapes,
                            const TensorView& level_start_index, const TensorView& sampling_locations,
                            const TensorView& attention_weights, const TensorView& output, const Context& ctx = {});

/// Bytes of workspace ms_deform_attn_backward needs (0 for kAtomic).
std::size_t ms_deform_attn_backward_workspace_size(const TensorView& value, const TensorView& spatial_shapes,
                                                   const TensorView& level_start_index,
                                                   const TensorView& sampling_locations,
                                                   const TensorView& attention_weights,
                                                   const MsDeformAttnBackwardOptions& backward,
                                                   const Context& ctx = {});

/// The three gradients (each may be an empty view: not computed) from grad_output.
/// `workspace`: caller-provided scratch of at least ms_deform_attn_backward_workspace_size()
/// bytes, or empty to use ctx.allocator.
void ms_deform_attn_backward(const TensorView& value, const TensorView& spatial_shapes,
                             const TensorView& level_start_index, const TensorView& sampling_locations,
                             const TensorView& attention_weights, const TensorView& grad_output,
                             const TensorView& grad_value, const TensorView& grad_sampling_locations,
                             const TensorView& grad_attention_weights, const MsDeformAttnBackwardOptions& backward,
                             const Context& ctx = {}, Workspace workspace = {});

}  // namespace detops
