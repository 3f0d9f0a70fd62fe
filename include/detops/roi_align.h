// RoIAlign forward and backward on CPU and CUDA, with the semantics of torchvision.ops.roi_align
// (avg pooling), detectron2 ROIAlign and mmcv RoIAlign (avg and max pooling), and three backward
// modes: atomic (fast, not reproducible on GPUs), truncated (the "round to half, sum in double"
// trick: reproducible in practice for float32/float16/bfloat16, not guaranteed; for float64 the
// same bits on every run and backend) and exact (bitwise reproducible by construction: same bits
// across runs, CPU thread counts, and CPU vs CUDA).
//
// Shapes (any non-negative strides, negative ones are rejected; NCHW and NHWC are both native,
// read from the strides):
//   input        [N, C, H, W]        float32 | float64 | float16 | bfloat16
//   rois         [K, 5]              (batch_index, x1, y1, x2, y2) in input-image coordinates;
//                                    float32 or float64 whatever input's dtype, or input's own
//                                    dtype (float16/bfloat16 rois only with an input of that
//                                    dtype; float32 rois keep a 16-bit input's boxes unrounded)
//   output       [K, C, PH, PW]      dtype of input
//   argmax       [K, C, PH, PW]      int32, max pooling only: the winning sample's index
//                                    (iy * grid_w + ix) in its bin, -1 when the bin had none
//   grad_output  [K, C, PH, PW]      dtype of input
//   grad_input   [N, C, H, W]        dtype of input; fully overwritten
//
// Semantics (for each output element; see docs/design.md for the derivation):
//   offset = aligned ? 0.5 : 0;  start = roi * spatial_scale - offset
//   roi_w = x2' - x1' (when !aligned: at least 1); bin_w = roi_w / PW (same for h)
//   grid_w = sampling_ratio > 0 ? sampling_ratio : ceil(roi_w / PW)     ("adaptive")
//   samples at x = x1' + pw*bin_w + (ix + 0.5) * bin_w / grid_w
//   a sample with y < -1 or y > H (or x < -1 or x > W) is 0 (and counts in the average); other
//   samples are clamped into the map and interpolated bilinearly.
//   avg: sum / max(grid_h*grid_w, 1);  max: largest sample (-inf... see below), as mmcv.
//   max pooling of a bin without samples (adaptive grid of an empty roi) gives 0, argmax -1.
//
// Errors (detops::Error, thrown before anything is written, outputs left untouched):
//   wrong ranks or sizes, dtypes or devices that do not match, non-positive pooled size or
//   spatial_scale, a batch index that is not an integer in [0, N), a non-finite coordinate, a roi
//   whose adaptive grid exceeds RoiAlignOptions::max_samples_per_roi, a workspace too small, an
//   output (output, argmax; grad_input) that shares memory with another argument of the call.
//   K = 0 (or C = 0) succeeds and does nothing (the backward zero-fills grad_input).
//
// CUDA: work is enqueued on Context::cuda_stream. Validating device-resident rois needs their
// values on the host, so with check_rois (the default) a call waits once on its stream for a
// small verdict; with check_rois = false it never waits (except the exact-mode backward, and the
// float64 truncated one, with adaptive sampling, whose workspace size depends on the rois) and
// invalid rows produce zeros.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/backward_mode.h"
#include "detops/context.h"
#include "detops/tensor.h"

namespace detops {

/// RoIAlign offers all three backward modes; its backward takes scratch (exact and truncated), its
/// forward none.
inline constexpr OpCapabilities kRoiAlignCapabilities{
    "roi_align", backward_mode_bits({BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}), false,
    true};

enum class PoolMode : std::uint8_t { kAvg, kMax };

struct RoiAlignOptions {
  std::int64_t pooled_height = 7;
  std::int64_t pooled_width = 7;
  double spatial_scale = 1.0;
  /// > 0: that many samples per bin and axis; <= 0: adaptive, ceil(roi size / pooled size).
  std::int64_t sampling_ratio = -1;
  /// Half-pixel offset (detectron2 ROIAlignV2, mmcv default); false = legacy, roi at least 1x1.
  bool aligned = false;
  PoolMode pool_mode = PoolMode::kAvg;
  /// Guard against runaway adaptive grids: a roi with more samples (PH*PW*grid_h*grid_w) is an
  /// error instead of an endless loop or an exhausted memory.
  std::int64_t max_samples_per_roi = std::int64_t{1} << 22;
  /// Validate rois (batch index, finiteness, grid size). Always done on the CPU; on CUDA it costs
  /// one wait on the stream. When false, invalid rows produce zeros instead of an error.
  bool check_rois = true;
};

struct RoiAlignBackwardOptions {
  BackwardMode mode = BackwardMode::kExact;
  TruncationFormat truncation = TruncationFormat::kFloat16;
};

/// output[k, c, ph, pw] = pooled bilinear samples of input over roi k. For PoolMode::kMax,
/// `argmax` must be given (int32, same sizes as output) and records what backward needs.
void roi_align_forward(const TensorView& input, const TensorView& rois, const TensorView& output,
                       const RoiAlignOptions& options, const Context& ctx = {},
                       const TensorView& argmax = {});

/// Bytes of workspace roi_align_backward needs for these arguments (0 for kAtomic; for kExact,
/// and kTruncated with a float64 grad_input, with adaptive sampling on CUDA this reads the rois
/// and so waits on the stream).
std::size_t roi_align_backward_workspace_size(const TensorView& grad_output, const TensorView& rois,
                                              const TensorView& grad_input, const RoiAlignOptions& options,
                                              const RoiAlignBackwardOptions& backward,
                                              const Context& ctx = {});

/// grad_input = d(loss)/d(input) given grad_output = d(loss)/d(output). grad_input is fully
/// overwritten (positions no roi touches become 0). `argmax` is the forward's, for kMax.
/// `workspace`: caller-provided scratch of at least roi_align_backward_workspace_size() bytes, or
/// empty to use ctx.allocator. Any alignment is accepted: the library rounds the base up to a
/// 256-byte boundary, and the reported size includes those up to 255 bytes of slack.
void roi_align_backward(const TensorView& grad_output, const TensorView& rois, const TensorView& grad_input,
                        const RoiAlignOptions& options, const RoiAlignBackwardOptions& backward,
                        const Context& ctx = {}, const TensorView& argmax = {}, Workspace workspace = {});

/// Name for messages and tables: "avg", "max".
const char* to_string(PoolMode mode);

}  // namespace detops
