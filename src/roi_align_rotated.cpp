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

internal::RoiCheck check_rois_values(const internal::RoiAlignRotatedCall& call, const RoiAlignRotatedOptions& o,
                                     bool need_total, const Context& ctx) {
  return internal::check_roi_values(call.op, internal::kRotatedRois, call.shape, o.check_rois, need_total,
                                    [&] { return backend(call).check_rois(call, need_total, ctx); });
}

internal::RoiAlignRotatedCall validate_forward(const TensorView& input, const TensorView& rois,
                                               const TensorView& output, const RoiAlignRotatedOptions& o) {
  const char* op = "roi_align_rotated_forward";
  check_options(op, o);
  internal::check_tensor(op, "input", input, 4);
  internal::check_floating(op, "input", input);
  internal::check_rois_tensor(op, rois, internal::kRotatedRois, input, "input");
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
  internal::check_backward_options(op, kRoiAlignRotatedCapabilities, b);
  internal::check_tensor(op, "grad_input", grad_input, 4);
  internal::check_floating(op, "grad_input", grad_input);
  internal::check_outputs(op, {{"grad_input", &grad_input}});
  internal::check_rois_tensor(op, rois, internal::kRotatedRois, grad_input, "grad_input");
  internal::check_pooled(op, "grad_output", grad_output, rois.sizes[0], grad_input.sizes[1], o, grad_input.dtype,
                         grad_input, "grad_input");
  internal::check_disjoint(op, {"grad_input", &grad_input}, {{"grad_output", &grad_output}, {"rois", &rois}});
  internal::check_map_has_pixels(op, "grad_input", grad_input, rois.sizes[0]);
  return {op, grad_input, rois, grad_output, make_shape(grad_input, rois.sizes[0], o)};
}

/// The backward decoded once (internal::RoiBackwardPlan): the backend's steps, asked once each.
internal::RoiBackwardPlan plan_backward(const internal::RoiAlignRotatedCall& call, const RoiAlignRotatedOptions& o,
                                            const RoiAlignBackwardOptions& b, const Context& ctx) {
  const internal::RoiAlignRotatedBackend& be = backend(call);
  return internal::plan_rotated_backward(
      call, b, be.enumerates(call, b.mode), [&](bool need_total) { return check_rois_values(call, o, need_total, ctx); },
      [&](const internal::RoiBackwardPlan& plan) { return be.backward_workspace(call, plan); });
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
  const internal::RoiBackwardPlan plan = plan_backward(call, options, backward, ctx);
  internal::run_in_workspace(call.op, plan.workspace, grad_input, ctx, workspace,
                             {{"grad_output", &grad_output}, {"rois", &rois}, {"grad_input", &grad_input}},
                             "roi_align_rotated_backward_workspace_size",
                             [&](Workspace ws) { backend(call).backward(call, plan, ctx, ws); });
}

}  // namespace detops
