// What the RoIAlignRotated entry points hand to a backend after validation, and the backend
// table. Shared by src/cpu/roi_align_rotated_cpu.cpp and cuda/roi_align_rotated_cuda.cu.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "detops/context.h"
#include "detops/detail/roi_align_rotated_kernels.h"
#include "detops/roi_align_rotated.h"
#include "internal/common.h"
#include "internal/roi_align_backend.h"  // strides4, roi_source, grad_rounding, truncated_buffer_bytes

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

/// The exact mode's chunks, whole images each (as grid_sample's and ms_deform_attn's): as many
/// images as fit in max(the largest image's records, detail::kGatherChunkRecords), so the
/// workspace stays bounded whatever the batch. A destination belongs to one image, and a chunk
/// enumerates its rois in k order, so every destination's records, and its sum, are the ones
/// of a single chunk: chunking changes no bit.
struct RotatedExactChunks {
  std::int64_t images;     // images per chunk (the last may hold fewer)
  std::int64_t records;    // records of the largest chunk at most (4 per sample): the arrays' capacity
  std::int64_t positions;  // images * H * W: a chunk's keys are below it, and it is the sentinel
};
inline RotatedExactChunks rotated_exact_chunks(const detail::RoiAlignRotatedShape& s, const RoiCheck& check) {
  const std::int64_t total = 4 * std::max<std::int64_t>(check.total_samples, 0);
  const std::int64_t per_image = 4 * std::max<std::int64_t>(check.max_image_samples, 0);
  std::int64_t images = std::max<std::int64_t>(s.N, 1);  // no records: one chunk, which only zero-fills
  if (per_image > 0)
    images = std::max<std::int64_t>(1, std::min(s.N, std::max(per_image, detail::kGatherChunkRecords) / per_image));
  return {images, std::min(total, images * per_image), images * s.H * s.W};
}

/// RoIAlignRotated's plan: the exact mode's chunks of images are sized from the rois (the samples
/// of each image's rois, rotated_exact_chunks), fixed sampling ratio or not, so the check totals
/// them whenever records are enumerated into a non-empty grad_input.
template <class CheckRois, class Bytes>
RoiBackwardPlan plan_rotated_backward(const RoiAlignRotatedCall& call, const RoiAlignBackwardOptions& b,
                                      bool enumerates, CheckRois&& check_rois, Bytes&& bytes) {
  return plan_roi_backward(call.op, call.shape, b, enumerates, enumerates && call.features.numel() > 0, check_rois,
                           bytes);
}

static_assert(detail::kRotatedRoiColumns <= static_cast<int>(sizeof(RoiCheck::row) / sizeof(double)),
              "RoiCheck::row holds a rotated roi row");

/// A RoIAlignRotated backend (internal/backend.h): RoIAlign's table over its call.
using RoiAlignRotatedBackend = RoiBackend<RoiAlignRotatedCall>;
extern const RoiAlignRotatedBackend kRoiAlignRotatedCpu;
extern const RoiAlignRotatedBackend kRoiAlignRotatedCuda;

}  // namespace internal
}  // namespace detops
