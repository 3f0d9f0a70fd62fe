// RoIAlignRotated entry points: validate every argument (before anything is allocated, launched
// or written), then hand a RoiAlignRotatedCall to the CPU or CUDA backend.
#include "detops/roi_align_rotated.h"

#include <cstdint>

#include "internal/backend.h"
#include "internal/common.h"
#include "internal/roi_align_rotated_backend.h"
#include "internal/roi_front_end.h"
#include "internal/validate.h"

namespace detops {

const char* to_string(AngleUnit unit) { return unit == AngleUnit::kRadians ? "radians" : "degrees"; }

namespace {

using internal::fail;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

constexpr internal::OpBackends<internal::RoiAlignRotatedBackend> kBackends{
    &internal::kRoiAlignRotatedCpu, DETOPS_CUDA_BACKEND(internal::kRoiAlignRotatedCuda)};

const internal::RoiAlignRotatedBackend& backend(const internal::RoiAlignRotatedCall& call) {
  return internal::backend_for(kBackends, call.features.device, call.op);
}

constexpr const char* kRotatedRoiRow = "(batch_index, cx, cy, w, h, angle)";

void check_options(const char* op, const RoiAlignRotatedOptions& o) {
  internal::check_pooling_options(op, o);
  if (o.angle_unit != AngleUnit::kDegrees && o.angle_unit != AngleUnit::kRadians)
    fail(kBad, "{}: angle_unit {} is unknown; expected degrees or radians", op, static_cast<int>(o.angle_unit));
}

detail::RoiAlignRotatedShape make_shape(const TensorView& features, std::int64_t K, const RoiAlignRotatedOptions& o) {
  detail::RoiAlignRotatedShape s{};
  static_cast<detail::RoiAlignShape&>(s) = internal::pooling_shape(features, K, o);
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
    case RotatedRoiStatus::kBatchIndexOutOfRange: internal::raise_bad_batch_index(op, c.bad_row, r[0], s.N);
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
  return internal::check_roi_values<internal::RotatedRoiCheck>(
      call.shape.K, o.check_rois, need_total, [&] { return backend(call).check_rois(call, need_total, ctx); },
      [&](const internal::RotatedRoiCheck& c) { raise_roi_error(call.op, c, call.shape); });
}

internal::RoiAlignRotatedCall validate_forward(const TensorView& input, const TensorView& rois,
                                               const TensorView& output, const RoiAlignRotatedOptions& o) {
  const char* op = "roi_align_rotated_forward";
  check_options(op, o);
  internal::check_tensor(op, "input", input, 4);
  internal::check_floating(op, "input", input);
  internal::check_rois_tensor(op, rois, detail::kRotatedRoiColumns, kRotatedRoiRow, input, "input");
  internal::check_pooled(op, "output", output, rois.sizes[0], input.sizes[1], o, input.dtype, input, "input");
  internal::check_outputs(op, {{"output", &output}});
  internal::check_disjoint(op, {"output", &output}, {{"input", &input}, {"rois", &rois}});
  internal::check_map_has_pixels(op, "input", input, rois.sizes[0]);
  return {op, input, rois, output, make_shape(input, rois.sizes[0], o)};
}

internal::RoiAlignRotatedCall validate_backward(const char* op, const TensorView& grad_output, const TensorView& rois,
                                                const TensorView& grad_input, const RoiAlignRotatedOptions& o,
                                                const RoiAlignBackwardOptions& b) {
  check_options(op, o);
  internal::check_backward_options(op, b);
  internal::check_tensor(op, "grad_input", grad_input, 4);
  internal::check_floating(op, "grad_input", grad_input);
  internal::check_outputs(op, {{"grad_input", &grad_input}});
  internal::check_rois_tensor(op, rois, detail::kRotatedRoiColumns, kRotatedRoiRow, grad_input, "grad_input");
  internal::check_pooled(op, "grad_output", grad_output, rois.sizes[0], grad_input.sizes[1], o, grad_input.dtype,
                         grad_input, "grad_input");
  internal::check_disjoint(op, {"grad_input", &grad_input}, {{"grad_output", &grad_output}, {"rois", &rois}});
  internal::check_map_has_pixels(op, "grad_input", grad_input, rois.sizes[0]);
  return {op, grad_input, rois, grad_output, make_shape(grad_input, rois.sizes[0], o)};
}

/// The backward decoded once (internal::RoiAlignRotatedPlan): the backend's steps, asked once each.
internal::RoiAlignRotatedPlan plan_backward(const internal::RoiAlignRotatedCall& call, const RoiAlignRotatedOptions& o,
                                            const RoiAlignBackwardOptions& b, const Context& ctx) {
  const internal::RoiAlignRotatedBackend& be = backend(call);
  return internal::plan_rotated_backward(
      call, b, be.enumerates(call, b.mode), [&](bool need_total) { return check_rois_values(call, o, need_total, ctx); },
      [&](const internal::RoiAlignRotatedPlan& plan) { return be.backward_workspace(call, plan); });
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
  return internal::workspace_size_with_slack(plan_backward(call, options, backward, ctx).workspace);
}

void roi_align_rotated_backward(const TensorView& grad_output, const TensorView& rois, const TensorView& grad_input,
                                const RoiAlignRotatedOptions& options, const RoiAlignBackwardOptions& backward,
                                const Context& ctx, Workspace workspace) {
  const internal::RoiAlignRotatedCall call =
      validate_backward("roi_align_rotated_backward", grad_output, rois, grad_input, options, backward);
  const internal::RoiAlignRotatedPlan plan = plan_backward(call, options, backward, ctx);
  internal::run_in_workspace(call.op, plan.workspace, grad_input, ctx, workspace,
                             {{"grad_output", &grad_output}, {"rois", &rois}, {"grad_input", &grad_input}},
                             "roi_align_rotated_backward_workspace_size",
                             [&](Workspace ws) { backend(call).backward(call, plan, ctx, ws); });
}

}  // namespace detops
