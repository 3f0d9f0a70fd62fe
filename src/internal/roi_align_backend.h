// What the RoIAlign entry points hand to a backend after validation: the views, the scalar
// shape, and what the roi check learned. Shared by src/roi_align_cpu.cpp and
// cuda/roi_align_cuda.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/context.h"
#include "detops/detail/roi_align_kernels.h"
#include "detops/roi_align.h"

namespace detops {
namespace internal {

/// One validated call. For the forward, `features` is the input and `pooled` the output; for
/// the backward, `features` is grad_input and `pooled` grad_output.
struct RoiAlignCall {
  const char* op;
  TensorView features;
  TensorView rois;
  TensorView pooled;
  TensorView argmax;  // absent unless max pooling
  detail::RoiAlignShape shape;
  bool max_pool;
};

/// What checking the rois found: the first invalid row (-1 if none) with its status, and the
/// total number of samples over all rois (-1 if not computed).
struct RoiCheck {
  std::int64_t bad_row = -1;
  detail::RoiStatus status = detail::RoiStatus::kOk;
  double row[5] = {};  // the bad row's values, for the message
  std::int64_t grid_h = 0, grid_w = 0;
  std::int64_t total_samples = -1;
};

inline detail::Strides4 strides4(const TensorView& v) {
  return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
}
inline detail::RoiSource roi_source(const TensorView& r) { return {r.data, r.dtype, r.strides[0], r.strides[1]}; }
inline bool channels_last_order(const TensorView& v) { return v.strides[1] == 1 && v.sizes[1] > 1; }
inline int narrow_code(const RoiAlignBackwardOptions& b) {
  return b.mode != BackwardMode::kTruncated ? 0 : (b.truncation == TruncationFormat::kFloat16 ? 1 : 2);
}

/// Slots the exact mode enumerates: 4 per sample. Known without reading rois for a fixed
/// sampling ratio; otherwise from the check.
inline std::int64_t exact_slot_capacity(const detail::RoiAlignShape& s, const RoiCheck& check) {
  if (s.sampling_ratio > 0) return 4 * s.K * s.PH * s.PW * s.sampling_ratio * s.sampling_ratio;
  return 4 * (check.total_samples < 0 ? 0 : check.total_samples);
}

// CPU backend (src/roi_align_cpu.cpp)
RoiCheck roi_align_check_rois_cpu(const RoiAlignCall& call, bool need_total);
void roi_align_forward_cpu(const RoiAlignCall& call, const Context& ctx);
std::size_t roi_align_backward_workspace_cpu(const RoiAlignCall& call, const RoiCheck& check, BackwardMode mode);
void roi_align_backward_cpu(const RoiAlignCall& call, const RoiCheck& check, const RoiAlignBackwardOptions& opt,
                            const Context& ctx, Workspace ws);

// CUDA backend (cuda/roi_align_cuda.cu, or src/cuda_stub.cpp)
RoiCheck roi_align_check_rois_cuda(const RoiAlignCall& call, bool validate, bool need_total, const Context& ctx);
void roi_align_forward_cuda(const RoiAlignCall& call, const Context& ctx);
std::size_t roi_align_backward_workspace_cuda(const RoiAlignCall& call, const RoiCheck& check, BackwardMode mode);
void roi_align_backward_cuda(const RoiAlignCall& call, const RoiCheck& check, const RoiAlignBackwardOptions& opt,
                             const Context& ctx, Workspace ws);

}  // namespace internal
}  // namespace detops
