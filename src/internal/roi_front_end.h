// What the entry points of the roi pooling ops (src/roi_align.cpp, src/roi_align_rotated.cpp)
// share: the checks of the options and tensors both ops take, the roi check's dispatch, the exact
// mode's record budget and the backward's workspace. Each op's file keeps what differs: its rois'
// columns, its own options, the messages for a bad row, and its backend table.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "detops/backward_mode.h"
#include "detops/context.h"
#include "detops/detail/roi_align_math.h"
#include "detops/roi_align.h"
#include "internal/common.h"
#include "internal/roi_align_backend.h"
#include "internal/scratch.h"
#include "internal/validate.h"

namespace detops {
namespace internal {

/// A roi op's geometry as its front end sees it: RoIAlign pools axis-aligned boxes, RoIAlignRotated
/// rotated ones; the rest of the two ops (options, checks, plan, backend table) is one. The
/// geometry's math lives in detail/roi_align{,_rotated}_math.h; here: its rows and their words.
struct RoiGeometry {
  int columns;          // of a rois row, the batch index first
  const char* row;      // the row's columns, for messages
  bool rotated;         // (cx, cy, w, h, angle) rows: a size can be negative, an angle not finite
  const char* options;  // the options struct that holds max_samples_per_roi
};
inline constexpr RoiGeometry kAxisAlignedRois{5, "(batch_index, x1, y1, x2, y2)", false, "RoiAlignOptions"};
inline constexpr RoiGeometry kRotatedRois{6, "(batch_index, cx, cy, w, h, angle)", true, "RoiAlignRotatedOptions"};

/// The options both ops have (RoiAlignOptions, RoiAlignRotatedOptions): a pooled size, a finite
/// positive spatial_scale, max_samples_per_roi in [1, 2^40], and a fixed sampling_ratio whose
/// samples per roi fit max_samples_per_roi.
template <class Options>
void check_pooling_options(const char* op, const Options& o) {
  constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
  if (o.pooled_height <= 0 || o.pooled_width <= 0)
    fail(kBad, "{}: pooled size is {}x{}; expected pooled_height and pooled_width > 0", op, o.pooled_height,
         o.pooled_width);
  if (!(std::isfinite(o.spatial_scale) && o.spatial_scale > 0))
    fail(kBad, "{}: spatial_scale is {}; expected a finite value > 0", op, o.spatial_scale);
  constexpr std::int64_t kMaxSamplesLimit = std::int64_t{1} << 40;  // keeps every product below 2^63
  if (o.max_samples_per_roi <= 0 || o.max_samples_per_roi > kMaxSamplesLimit)
    fail(kBad, "{}: max_samples_per_roi is {}; expected a value in [1, 2^40]", op, o.max_samples_per_roi);
  if (o.sampling_ratio > 0) {
    const double per_roi = static_cast<double>(o.sampling_ratio) * static_cast<double>(o.sampling_ratio) *
                           static_cast<double>(o.pooled_height) * static_cast<double>(o.pooled_width);
    if (per_roi > static_cast<double>(o.max_samples_per_roi))
      fail(kBad, "{}: sampling_ratio {} with pooled size {}x{} takes {} samples per roi; expected at most "
           "max_samples_per_roi = {}", op, o.sampling_ratio, o.pooled_height, o.pooled_width, per_roi,
           o.max_samples_per_roi);
  }
}

/// The backward's mode (one the op offers: `caps`) and truncation format are enumerators this
/// version knows.
inline void check_backward_options(const char* op, const OpCapabilities& caps, const RoiAlignBackwardOptions& b) {
  constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
  check_backward_mode(op, caps, b.mode);
  if (b.truncation != TruncationFormat::kFloat16 && b.truncation != TruncationFormat::kBFloat16)
    fail(kBad, "{}: truncation format {} is unknown; expected float16 or bfloat16", op, static_cast<int>(b.truncation));
}

/// rois: rank 2 with the geometry's columns, in the dtype of `features` (the map, named
/// `features_name`), float32 or float64, on its device.
inline void check_rois_tensor(const char* op, const TensorView& rois, const RoiGeometry& g, const TensorView& features,
                              const char* features_name) {
  constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
  check_tensor(op, "rois", rois, 2);
  if (rois.sizes[1] != g.columns)
    fail(kBad, "{}: rois has sizes {}; expected [K, {}] rows {}", op, sizes_str(rois), g.columns, g.row);
  const bool ok_dtype = rois.dtype == features.dtype || rois.dtype == DType::kFloat32 || rois.dtype == DType::kFloat64;
  if (!ok_dtype || !is_floating(rois.dtype))
    fail(kBad, "{}: rois has dtype {}; expected {} (the dtype of {}), float32 or float64", op, dtype_name(rois.dtype),
         dtype_name(features.dtype), features_name);
  check_same_device(op, "rois", rois, features_name, features);
}

/// A pooled tensor `name` (output, grad_output, argmax): sizes [K, C, PH, PW] of the options'
/// pooled size, `dtype`, on the device of `ref` (named `ref_name`).
template <class Options>
void check_pooled(const char* op, const char* name, const TensorView& v, std::int64_t K, std::int64_t C,
                  const Options& o, DType dtype, const TensorView& ref, const char* ref_name) {
  constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
  check_tensor(op, name, v, 4);
  if (v.sizes[0] != K || v.sizes[1] != C || v.sizes[2] != o.pooled_height || v.sizes[3] != o.pooled_width)
    fail(kBad, "{}: {} has sizes {}; expected [K, C, PH, PW] = [{}, {}, {}, {}]", op, name, sizes_str(v), K, C,
         o.pooled_height, o.pooled_width);
  if (v.dtype != dtype) {
    if (dtype == ref.dtype)
      fail(kBad, "{}: {} has dtype {}; expected {} (the dtype of {})", op, name, dtype_name(v.dtype),
           dtype_name(dtype), ref_name);
    fail(kBad, "{}: {} has dtype {}; expected {}", op, name, dtype_name(v.dtype), dtype_name(dtype));
  }
  check_same_device(op, name, v, ref_name, ref);
}

/// With K rois and channels to pool, the map `name` (input or grad_input) must have pixels.
inline void check_map_has_pixels(const char* op, const char* name, const TensorView& map, std::int64_t K) {
  if (K > 0 && map.sizes[1] > 0 && (map.sizes[2] == 0 || map.sizes[3] == 0))
    fail(ErrorCode::kInvalidArgument, "{}: {} has sizes {}; expected H > 0 and W > 0 when there are rois", op, name,
         sizes_str(map));
}

/// The scalar shape the kernels of both ops read (RoiAlignRotatedShape extends it), from the map
/// (input or grad_input), the roi count and the options.
template <class Options>
detail::RoiAlignShape pooling_shape(const TensorView& features, std::int64_t K, const Options& o) {
  detail::RoiAlignShape s{};
  s.N = features.sizes[0];
  s.C = features.sizes[1];
  s.H = features.sizes[2];
  s.W = features.sizes[3];
  s.K = K;
  s.PH = o.pooled_height;
  s.PW = o.pooled_width;
  s.spatial_scale = o.spatial_scale;
  s.sampling_ratio = o.sampling_ratio;
  s.aligned = o.aligned;
  s.max_samples_per_roi = o.max_samples_per_roi;
  return s;
}

/// Turns a failed roi check into the documented error (nothing if the check passed).
inline void raise_roi_error(const char* op, const RoiGeometry& g, const RoiCheck& c, const detail::RoiAlignShape& s) {
  using detail::RoiStatus;
  constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
  const double* r = c.row;
  switch (c.status) {
    case RoiStatus::kOk: return;
    case RoiStatus::kBatchIndexNotFinite:
    case RoiStatus::kBatchIndexNotInteger:
    case RoiStatus::kBatchIndexOutOfRange:
      fail(kBad, "{}: rois[{}] has batch index {}; expected an integer in [0, {})", op, c.bad_row, r[0], s.N);
    case RoiStatus::kValueNotFinite:
      if (g.rotated)
        fail(kBad, "{}: rois[{}] has (cx, cy, w, h, angle) = ({}, {}, {}, {}, {}); expected finite values", op,
             c.bad_row, r[1], r[2], r[3], r[4], r[5]);
      fail(kBad, "{}: rois[{}] has coordinates (x1, y1, x2, y2) = ({}, {}, {}, {}); expected finite values", op,
           c.bad_row, r[1], r[2], r[3], r[4]);
    case RoiStatus::kNegativeSize:
      fail(kBad, "{}: rois[{}] has size (w, h) = ({}, {}); expected w >= 0 and h >= 0 (aligned boxes are not "
           "clamped)", op, c.bad_row, r[3], r[4]);
    case RoiStatus::kGeometryNotFinite:
      fail(kBad, "{}: rois[{}] = ({}, {}, {}, {}) scaled by spatial_scale {} overflows the accumulation type; "
           "expected {} within its range", op, c.bad_row, r[1], r[2], r[3], r[4], s.spatial_scale,
           g.rotated ? "values" : "coordinates");
    case RoiStatus::kTooManySamples: {
      const std::string box = g.rotated ? fmt::format("with size (w, h) = ({}, {})", r[3], r[4])
                                        : fmt::format("= ({}, {}, {}, {})", r[1], r[2], r[3], r[4]);
      fail(ErrorCode::kOutOfMemory,
           "{}: rois[{}] {} needs an adaptive grid of {}x{} samples per bin ({} bins); expected at most "
           "max_samples_per_roi = {} samples per roi (raise {}::max_samples_per_roi or set a fixed sampling_ratio)",
           op, c.bad_row, box, c.grid_h, c.grid_w, s.PH * s.PW, s.max_samples_per_roi, g.options);
    }
  }
}

/// The roi check of a call: run() (the backend's check_rois) when the options ask to check the
/// rows (check_rois) or the workspace needs the sample totals (need_total), then, when checking,
/// the error for the first bad row. No rois: nothing to read, totals 0.
template <class Run>
RoiCheck check_roi_values(const char* op, const RoiGeometry& g, const detail::RoiAlignShape& s, bool check_rois,
                          bool need_total, Run&& run) {
  RoiCheck check;
  if (s.K == 0) {
    check.total_samples = 0;
    return check;
  }
  if (!check_rois && !need_total) return check;
  check = run();
  if (check_rois) raise_roi_error(op, g, check, s);
  return check;
}

/// The backward's last step: its workspace of `bytes` (the caller's, checked for size and for
/// overlap with `views`, or one from ctx.allocator), then run(workspace) unless grad_input is empty.
template <class Run>
void run_in_workspace(const char* op, std::size_t bytes, const TensorView& grad_input, const Context& ctx,
                      Workspace workspace, std::initializer_list<NamedView> views, const char* size_query, Run&& run) {
  const Scratch scratch(op, bytes, grad_input.device, ctx, workspace, views, size_query);
  if (grad_input.numel() == 0) return;
  run(scratch.workspace(bytes));
}

}  // namespace internal
}  // namespace detops
