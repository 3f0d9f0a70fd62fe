// What the RoIAlignRotated entry points hand to a backend after validation, and the backend
// table. Shared by src/cpu/roi_align_rotated_cpu.cpp and cuda/roi_align_rotated_cuda.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/context.h"
#include "detops/detail/roi_align_rotated_kernels.h"
#include "detops/roi_align_rotated.h"
#include "internal/common.h"
#include "internal/roi_align_backend.h"  // strides4, roi_source, grad_rounding

namespace detops {
namespace internal {

/// One validated call. For the forward, `features` is the input and `pooled` the output; for
/// the backward, `features` is grad_input and `pooled` grad_output.
struct RoiAlignRotatedCall {
  const char* op;
  TensorView features;
  TensorView rois;
  TensorView pooled;
  detail::RoiAlignRotatedShape shape;
};

/// What checking the rois found: the first invalid row (-1 if none) with its status and values,
/// and the total number of samples over all rois (-1 if not computed).
struct RotatedRoiCheck {
  std::int64_t bad_row = -1;
  detail::RotatedRoiStatus status = detail::RotatedRoiStatus::kOk;
  double row[detail::kRotatedRoiColumns] = {};
  std::int64_t grid_h = 0, grid_w = 0;
  std::int64_t total_samples = -1;
};

/// Records of the exact mode (4 per sample): known without reading the rois for a fixed
/// sampling ratio, from the check otherwise.
inline std::int64_t rotated_record_capacity(const detail::RoiAlignRotatedShape& s, const RotatedRoiCheck& check) {
  if (s.sampling_ratio > 0) return 4 * s.K * s.PH * s.PW * s.sampling_ratio * s.sampling_ratio;
  return 4 * (check.total_samples < 0 ? 0 : check.total_samples);
}

/// A RoIAlignRotated backend (internal/backend.h), as RoiAlignBackend.
struct RoiAlignRotatedBackend {
  RotatedRoiCheck (*check_rois)(const RoiAlignRotatedCall& call, bool need_total, const Context& ctx);
  void (*forward)(const RoiAlignRotatedCall& call, const Context& ctx);
  std::size_t (*backward_workspace)(const RoiAlignRotatedCall& call, const RotatedRoiCheck& check, BackwardMode mode);
  void (*backward)(const RoiAlignRotatedCall& call, const RotatedRoiCheck& check, const RoiAlignBackwardOptions& opt,
                   const Context& ctx, Workspace ws);
  /// Whether the backward in `mode` enumerates records, so that its workspace follows the
  /// sample count (the exact mode; on CUDA also the float64 truncated mode).
  bool (*uses_records)(const RoiAlignRotatedCall& call, BackwardMode mode);
};
extern const RoiAlignRotatedBackend kRoiAlignRotatedCpu;
extern const RoiAlignRotatedBackend kRoiAlignRotatedCuda;

}  // namespace internal
}  // namespace detops
