// RoIAlignRotated forward and backward on CPU and CUDA: RoIAlign over rotated boxes, with the
// semantics of detectron2's ROIAlignRotated (aerial imagery, scene text) and, through options, of
// mmcv's roi_align_rotated (mmrotate). Avg pooling only (neither has max). The same three backward
// modes as RoIAlign, with the same guarantees (detops/backward_mode.h, detops/roi_align.h).
//
// Shapes (any non-negative strides, negative ones are rejected; NCHW and NHWC are both native):
//   input        [N, C, H, W]        float32 | float64 | float16 | bfloat16
//   rois         [K, 6]              (batch_index, cx, cy, w, h, angle) in input-image coordinates;
//                                    float32 or float64 whatever input's dtype, or input's own dtype
//   output       [K, C, PH, PW]      dtype of input
//   grad_output  [K, C, PH, PW]      dtype of input
//   grad_input   [N, C, H, W]        dtype of input; fully overwritten
//
// Semantics (for each output element; A is the accumulation type, float for float32 and 16-bit
// inputs, double for float64):
//   offset = aligned ? 0.5 : 0                 (detectron2: always 0.5)
//   center_w = cx * spatial_scale - offset;  center_h = cy * spatial_scale - offset
//   roi_w = w * spatial_scale;  roi_h = h * spatial_scale   (not clamped when aligned; when not
//                                                            aligned at least 1, as mmcv)
//   bin_w = roi_w / PW;  grid_w = sampling_ratio > 0 ? sampling_ratio : ceil(roi_w / PW)  (same for h)
//   in the box frame: yy = -roi_h/2 + ph*bin_h + (iy + 0.5) * bin_h / grid_h  (xx likewise)
//   on the map:       y = yy*cos(t) - xx*sin(t) + center_h,  x = yy*sin(t) + xx*cos(t) + center_w
//   with t the angle counter-clockwise (degrees by default; clockwise negates it), as detectron2.
//   Each sample is RoIAlign's bilinear sample (0 beyond the one-pixel apron, clamped inside it);
//   the output is the bin's sum / max(grid_h * grid_w, 1).
//   sin(t) and cos(t) are detops' own (detail/roi_align_rotated_math.h: exact reduction of degrees,
//   a double polynomial, then rounded to A) so that every backend has the same bits; they are
//   within an ulp of A of detectron2's (which rounds t to A before calling the C library), and
//   multiples of 90 degrees give exactly 0 and +-1.
//
// Errors (detops::Error, thrown before anything is written, outputs left untouched): wrong ranks
// or sizes, dtypes or devices that do not match, non-positive pooled size or spatial_scale, a batch
// index that is not an integer in [0, N), a non-finite value in a row, a negative width or height
// when `aligned` (detectron2 asserts), a box whose geometry overflows A, a roi whose adaptive grid
// exceeds max_samples_per_roi, a workspace too small, an output that shares memory with another
// argument. K = 0 (or C = 0) succeeds and does nothing (the backward zero-fills grad_input).
//
// Backward modes (RoiAlignBackwardOptions, shared with RoIAlign):
//   kAtomic     atomicAdd on CUDA (not reproducible there); a race-free per-plane scatter on the CPU.
//   kTruncated  RoIAlign's: incoming gradients rounded to float16/bfloat16, contributions summed in
//               double, one rounding per element; float64: bitwise reproducible and the same bits on
//               the CPU and CUDA (CUDA then runs the exact mode's phases, as RoIAlign does).
//   kExact      the gather-backward engine (docs/design.md): records (position, w / count, bin) in
//               the order (roi, bin, sample, corner), a stable sort by position, fixed-order sums in
//               partials of detail::kGatherPartial records, one chunk of whole images at a time
//               (which changes no bit). Bitwise identical across runs, thread counts, layouts, batch
//               compositions (an image gives the same bits alone) and the CPU and CUDA backends.
//
// Workspace (roi_align_rotated_backward_workspace_size): none for kAtomic; kTruncated, a double per
// element of grad_input (float64 on CUDA: the exact mode's arrays, with a divisor per record);
// kExact, the arrays of one chunk: as many whole images as fit in max(the largest image's
// records, 2^19), 4 records per sample of about 40 bytes each on the CPU (80 on CUDA), plus the
// runs and per-roi offsets. It follows the rois of the largest image, not the batch; sizing it
// reads the rois (see CUDA below).
//
// CUDA: work is enqueued on Context::cuda_stream; the roi check waits once on the stream (as
// RoIAlign's; check_rois = false skips it, except in the exact mode and the float64 truncated
// mode, whose workspace depends on the samples of each image's rois), and invalid rows then
// produce zeros.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/backward_mode.h"
#include "detops/context.h"
#include "detops/roi_align.h"
#include "detops/tensor.h"

namespace detops {

/// RoIAlignRotated: as RoIAlign.
inline constexpr OpCapabilities kRoiAlignRotatedCapabilities{
    "roi_align_rotated", backward_mode_bits({BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}),
    false, true};

/// The unit of the rois' angle column.
enum class AngleUnit : std::uint8_t { kDegrees, kRadians };

/// Defaults are detectron2's ROIAlignRotated; mmcv's RoIAlignRotated (mmrotate) is
/// angle_unit = kRadians with its own `aligned` and `clockwise`.
struct RoiAlignRotatedOptions {
  std::int64_t pooled_height = 7;
  std::int64_t pooled_width = 7;
  double spatial_scale = 1.0;
  /// > 0: that many samples per bin and axis; <= 0: adaptive, ceil(roi size / pooled size).
  std::int64_t sampling_ratio = -1;
  AngleUnit angle_unit = AngleUnit::kDegrees;
  /// Half-pixel offset and unclamped sizes (detectron2 always; mmcv's default). false: mmcv's
  /// legacy mode, no offset and boxes of at least 1x1 (negative sizes are then clamped, not errors).
  bool aligned = true;
  /// The angle is clockwise (mmcv's option): it is negated before use.
  bool clockwise = false;
  /// Guard against runaway adaptive grids (as RoiAlignOptions::max_samples_per_roi).
  std::int64_t max_samples_per_roi = std::int64_t{1} << 22;
  /// Validate rois (batch index, finiteness, sizes, grid). When false, invalid rows give zeros.
  bool check_rois = true;
};

/// output[k, c, ph, pw] = average of the bilinear samples of bin (ph, pw) of rotated roi k.
void roi_align_rotated_forward(const TensorView& input, const TensorView& rois, const TensorView& output,
                               const RoiAlignRotatedOptions& options, const Context& ctx = {});

/// Bytes of workspace roi_align_rotated_backward needs (0 for kAtomic; the exact mode's size depends
/// on the samples of each image's rois, which on CUDA costs one wait on the stream).
std::size_t roi_align_rotated_backward_workspace_size(const TensorView& grad_output, const TensorView& rois,
                                                      const TensorView& grad_input,
                                                      const RoiAlignRotatedOptions& options,
                                                      const RoiAlignBackwardOptions& backward, const Context& ctx = {});

/// grad_input = d(loss)/d(input) given grad_output; fully overwritten. `workspace`: caller
/// scratch of at least roi_align_rotated_backward_workspace_size() bytes, or empty to use
/// ctx.allocator (any alignment, as RoIAlign's).
void roi_align_rotated_backward(const TensorView& grad_output, const TensorView& rois, const TensorView& grad_input,
                                const RoiAlignRotatedOptions& options, const RoiAlignBackwardOptions& backward,
                                const Context& ctx = {}, Workspace workspace = {});

/// Name for messages and tables: "degrees", "radians".
const char* to_string(AngleUnit unit);

}  // namespace detops
