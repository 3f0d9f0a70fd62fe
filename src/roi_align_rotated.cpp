// RoIAlignRotated entry points: validate every argument (before anything is allocated, launched
// or written), then hand a RoiAlignRotatedCall to the CPU or CUDA backend.
#include "detops/roi_align_rotated.h"

#include <cmath>
#include <cstdint>

#include "internal/backend.h"
#include "internal/common.h"
#include "internal/roi_align_rotated_backend.h"
#include "internal/scratch.h"
#include "internal/validate.h"

namespace detops {

const char* to_string(AngleUnit unit) { return unit == AngleUnit::kRadians ? "radians" : "degrees"; }

namespace {

using internal::check_same_device;
using internal::check_tensor;
using internal::fail;
using internal::is_floating;
using internal::sizes_str;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

constexpr internal::OpBackends<internal::RoiAlignRotatedBackend> kBackends{
    &internal::kRoiAlignRotatedCpu, DETOPS_CUDA_BACKEND(internal::kRoiAlignRotatedCuda)};

const internal::RoiAlignRotatedBackend& backend(const internal::RoiAlignRotatedCall& call) {
  return internal::backend_for(kBackends, call.features.device, call.op);
}

void check_options(const char* op, const RoiAlignRotatedOptions& o) {
  if (o.pooled_height <= 0 || o.pooled_width <= 0)
    fail(kBad, "{}: pooled size is {}x{}; expected pooled_height and pooled_width > 0", op, o.pooled_height,
         o.pooled_width);
  if (!(std::isfinite(o.spatial_scale) && o.spatial_scale > 0))
    fail(kBad, "{}: spatial_scale is {}; expected a finite value > 0", op, o.spatial_scale);
  if (o.angle_unit != AngleUnit::kDegrees && o.angle_unit != AngleUnit::kRadians)
    fail(kBad, "{}: angle_unit {} is unknown; expected degrees or radians", op, static_cast<int>(o.angle_unit));
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

void check_rois_tensor(const char* op, const TensorView& rois, const TensorView& features, const char* fname) {
  check_tensor(op, "rois", rois, 2);
  if (rois.sizes[1] != detail::kRotatedRoiColumns)
    fail(kBad, "{}: rois has sizes {}; expected [K, 6] rows (batch_index, cx, cy, w, h, angle)", op, sizes_str(rois));
  const bool ok_dtype = rois.dtype == features.dtype || rois.dtype == DType::kFloat32 || rois.dtype == DType::kFloat64;
  if (!ok_dtype || !is_floating(rois.dtype))
    fail(kBad, "{}: rois has dtype {}; expected {} (the dtype of {}), float32 or float64", op, dtype_name(rois.dtype),
         dtype_name(features.dtype), fname);
  check_same_device(op, "rois", rois, fname, features);
}

void check_pooled(const char* op, const char* name, const TensorView& v, std::int64_t K, std::int64_t C,
                  const RoiAlignRotatedOptions& o, const TensorView& ref, const char* ref_name) {
  check_tensor(op, name, v, 4);
  if (v.sizes[0] != K || v.sizes[1] != C || v.sizes[2] != o.pooled_height || v.sizes[3] != o.pooled_width)
    fail(kBad, "{}: {} has sizes {}; expected [K, C, PH, PW] = [{}, {}, {}, {}]", op, name, sizes_str(v), K, C,
         o.pooled_height, o.pooled_width);
  if (v.dtype != ref.dtype)
    fail(kBad, "{}: {} has dtype {}; expected {} (the dtype of {})", op, name, dtype_name(v.dtype),
         dtype_name(ref.dtype), ref_name);
  check_same_device(op, name, v, ref_name, ref);
}

detail::RoiAlignRotatedShape make_shape(const TensorView& features, std::int64_t K, const RoiAlignRotatedOptions& o) {
  detail::RoiAlignRotatedShape s{};
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
  s.angle_radians = o.angle_unit == AngleUnit::kRadians;
  s.clockwise = o.clockwise;
  return s;
}

/// Turns a failed roi check into the documented error.
void raise_roi_error(const char* op, const internal::RotatedRoiCheck& c, const detail::RoiAlignRotatedShape& s) {
  using detail::RotatedRoiStatus;
  const double* r = c.row;
  switch (c.status) {
    case RotatedRoiStatus::kOk: return;
    case RotatedRoiStatus::kBatchIndexNotFinite:
    case RotatedRoiStatus::kBatchIndexNotInteger:
    case RotatedRoiStatus::kBatchIndexOutOfRange:
      fail(kBad, "{}: rois[{}] has batch index {}; expected an integer in [0, {})", op, c.bad_row, r[0], s.N);
    case RotatedRoiStatus::kValueNotFinite:
      fail(kBad, "{}: rois[{}] has (cx, cy, w, h, angle) = ({}, {}, {}, {}, {}); expected finite values", op,
           c.bad_row, r[1], r[2], r[3], r[4], r[5]);
    case RotatedRoiStatus::kNegativeSize:
      fail(kBad, "{}: rois[{}] has size (w, h) = ({}, {}); expected w >= 0 and h >= 0 (aligned boxes are not "
           "clamped)", op, c.bad_row, r[3], r[4]);
    case RotatedRoiStatus::kGeometryNotFinite:
      fail(kBad, "{}: rois[{}] = ({}, {}, {}, {}) scaled by spatial_scale {} overflows the accumulation type; "
           "expected values within its range", op, c.bad_row, r[1], r[2], r[3], r[4], s.spatial_scale);
    case RotatedRoiStatus::kTooManySamples:
      fail(ErrorCode::kOutOfMemory,
           "{}: rois[{}] with size (w, h) = ({}, {}) needs an adaptive grid of {}x{} samples per bin ({} bins); "
           "expected at most max_samples_per_roi = {} samples per roi (raise "
           "RoiAlignRotatedOptions::max_samples_per_roi or set a fixed sampling_ratio)", op, c.bad_row, r[3], r[4],
           c.grid_h, c.grid_w, s.PH * s.PW, s.max_samples_per_roi);
  }
}

internal::RotatedRoiCheck check_rois_values(const internal::RoiAlignRotatedCall& call, const RoiAlignRotatedOptions& o,
                                            bool need_total, const Context& ctx) {
  internal::RotatedRoiCheck check;
  if (call.shape.K == 0) {
    check.total_samples = 0;
    return check;
  }
  if (!o.check_rois && !need_total) return check;
  check = backend(call).check_rois(call, need_total, ctx);
  if (o.check_rois) raise_roi_error(call.op, check, call.shape);
  return check;
}

internal::RoiAlignRotatedCall validate_forward(const TensorView& input, const TensorView& rois,
                                               const TensorView& output, const RoiAlignRotatedOptions& o) {
  const char* op = "roi_align_rotated_forward";
  check_options(op, o);
  check_tensor(op, "input", input, 4);
  internal::check_floating(op, "input", input);
  check_rois_tensor(op, rois, input, "input");
  check_pooled(op, "output", output, rois.sizes[0], input.sizes[1], o, input, "input");
  internal::check_outputs(op, {{"output", &output}});
  internal::check_disjoint(op, {"output", &output}, {{"input", &input}, {"rois", &rois}});
  if (rois.sizes[0] > 0 && input.sizes[1] > 0 && (input.sizes[2] == 0 || input.sizes[3] == 0))
    fail(kBad, "{}: input has sizes {}; expected H > 0 and W > 0 when there are rois to pool", op, sizes_str(input));
  return {op, input, rois, output, make_shape(input, rois.sizes[0], o)};
}

internal::RoiAlignRotatedCall validate_backward(const char* op, const TensorView& grad_output, const TensorView& rois,
                                                const TensorView& grad_input, const RoiAlignRotatedOptions& o,
                                                const RoiAlignBackwardOptions& b) {
  check_options(op, o);
  if (b.mode != BackwardMode::kAtomic && b.mode != BackwardMode::kTruncated && b.mode != BackwardMode::kExact)
    fail(kBad, "{}: backward mode {} is unknown; expected atomic, truncated or exact", op, static_cast<int>(b.mode));
  if (b.truncation != TruncationFormat::kFloat16 && b.truncation != TruncationFormat::kBFloat16)
    fail(kBad, "{}: truncation format {} is unknown; expected float16 or bfloat16", op, static_cast<int>(b.truncation));
  check_tensor(op, "grad_input", grad_input, 4);
  internal::check_floating(op, "grad_input", grad_input);
  internal::check_outputs(op, {{"grad_input", &grad_input}});
  check_rois_tensor(op, rois, grad_input, "grad_input");
  check_pooled(op, "grad_output", grad_output, rois.sizes[0], grad_input.sizes[1], o, grad_input, "grad_input");
  internal::check_disjoint(op, {"grad_input", &grad_input}, {{"grad_output", &grad_output}, {"rois", &rois}});
  if (rois.sizes[0] > 0 && grad_input.sizes[1] > 0 && (grad_input.sizes[2] == 0 || grad_input.sizes[3] == 0))
    fail(kBad, "{}: grad_input has sizes {}; expected H > 0 and W > 0 when there are rois", op, sizes_str(grad_input));
  return {op, grad_input, rois, grad_output, make_shape(grad_input, rois.sizes[0], o)};
}

bool needs_total(const internal::RoiAlignRotatedCall& call, const RoiAlignRotatedOptions& o, BackwardMode mode) {
  return backend(call).uses_records(call, mode) && o.sampling_ratio <= 0;
}

/// Bytes of the backward's workspace layout (without the alignment slack).
std::size_t layout_bytes(const internal::RoiAlignRotatedCall& call, const internal::RotatedRoiCheck& check,
                         BackwardMode mode) {
  if (call.shape.K == 0 || call.shape.C == 0) return 0;
  if (backend(call).uses_records(call, mode)) {
    // 4 records per sample; sized in double first so that a huge problem is an error, not an overflow.
    const detail::RoiAlignRotatedShape& s = call.shape;
    const double samples = s.sampling_ratio > 0 ? static_cast<double>(s.K) * static_cast<double>(s.PH) *
                                                      static_cast<double>(s.PW) * static_cast<double>(s.sampling_ratio) *
                                                      static_cast<double>(s.sampling_ratio)
                                                : static_cast<double>(check.total_samples);
    if (4.0 * samples > static_cast<double>(std::int64_t{1} << 40))
      fail(ErrorCode::kOutOfMemory, "{}: the {} mode would need {} records (4 per sample); expected at most 2^40 "
           "(use fewer rois per call or a smaller sampling_ratio)", call.op, to_string(mode), 4.0 * samples);
  }
  return backend(call).backward_workspace(call, check, mode);
}

}  // namespace

void roi_align_rotated_forward(const TensorView& input, const TensorView& rois, const TensorView& output,
                               const RoiAlignRotatedOptions& options, const Context& ctx) {
  const internal::RoiAlignRotatedCall call = validate_forward(input, rois, output, options);
  check_rois_values(call, options, false, ctx);
  if (output.numel() == 0) return;
  backend(call).forward(call, ctx);
}

std::size_t roi_align_rotated_backward_workspace_size(const TensorView& grad_output, const TensorView& rois,
                                                      const TensorView& grad_input,
                                                      const RoiAlignRotatedOptions& options,
                                                      const RoiAlignBackwardOptions& backward, const Context& ctx) {
  const internal::RoiAlignRotatedCall call =
      validate_backward("roi_align_rotated_backward_workspace_size", grad_output, rois, grad_input, options, backward);
  const internal::RotatedRoiCheck check =
      check_rois_values(call, options, needs_total(call, options, backward.mode), ctx);
  return internal::workspace_size_with_slack(layout_bytes(call, check, backward.mode));
}

void roi_align_rotated_backward(const TensorView& grad_output, const TensorView& rois, const TensorView& grad_input,
                                const RoiAlignRotatedOptions& options, const RoiAlignBackwardOptions& backward,
                                const Context& ctx, Workspace workspace) {
  const internal::RoiAlignRotatedCall call =
      validate_backward("roi_align_rotated_backward", grad_output, rois, grad_input, options, backward);
  const internal::RotatedRoiCheck check =
      check_rois_values(call, options, needs_total(call, options, backward.mode), ctx);
  const std::size_t bytes = layout_bytes(call, check, backward.mode);
  const internal::Scratch scratch(call.op, bytes, grad_input.device, ctx, workspace,
                                  {{"grad_output", &grad_output}, {"rois", &rois}, {"grad_input", &grad_input}},
                                  "roi_align_rotated_backward_workspace_size");
  if (grad_input.numel() == 0) return;
  backend(call).backward(call, check, backward, ctx, scratch.workspace(bytes));
}

}  // namespace detops
