// RoIAlign entry points: validate every argument (before anything is allocated, launched or
// written), then hand a RoiAlignCall to the CPU or CUDA backend.
#include "detops/roi_align.h"

#include <cstdint>

#include "internal/backend.h"
#include "internal/common.h"
#include "internal/roi_align_backend.h"
#include "internal/roi_front_end.h"
#include "internal/validate.h"

namespace detops {

const char* to_string(BackwardMode mode) {
  switch (mode) {
    case BackwardMode::kAtomic: return "atomic";
    case BackwardMode::kTruncated: return "truncated";
    case BackwardMode::kExact: return "exact";
  }
  return "unknown";
}
const char* to_string(PoolMode mode) { return mode == PoolMode::kMax ? "max" : "avg"; }

namespace {

using internal::fail;

constexpr internal::OpBackends<internal::RoiAlignBackend> kBackends{
    &internal::kRoiAlignCpu, DETOPS_CUDA_BACKEND(internal::kRoiAlignCuda)};

const internal::RoiAlignBackend& backend(const internal::RoiAlignCall& call) {
  return internal::backend_for(kBackends, call.features.device, call.op);
}

void check_argmax(const char* op, const TensorView& argmax, const RoiAlignOptions& o, const TensorView& pooled,
                  const char* pooled_name, bool required = true) {
  if (!required && !argmax.defined()) return;  // the workspace query does not read argmax
  if (o.pool_mode != PoolMode::kMax) {
    if (argmax.defined())
      fail(ErrorCode::kInvalidArgument,
           "{}: argmax was given with pool_mode avg; expected no argmax (it is only used by max pooling)", op);
    return;
  }
  if (!argmax.defined())
    fail(ErrorCode::kInvalidArgument, "{}: pool_mode max needs argmax (int32, sizes of {}); none was given", op,
         pooled_name);
  internal::check_pooled(op, "argmax", argmax, pooled.sizes[0], pooled.sizes[1], o, DType::kInt32, pooled,
                         pooled_name);
}

/// pool_mode is an enumerator (PoolMode(7) was once pooled as avg).
void check_pool_mode(const char* op, const RoiAlignOptions& o) {
  if (o.pool_mode != PoolMode::kAvg && o.pool_mode != PoolMode::kMax)
    fail(ErrorCode::kInvalidArgument, "{}: pool_mode {} is unknown; expected avg or max", op,
         static_cast<int>(o.pool_mode));
}

internal::RoiCheck check_rois_values(const internal::RoiAlignCall& call, const RoiAlignOptions& o, bool need_total,
                                     const Context& ctx) {
  return internal::check_roi_values(call.op, internal::kAxisAlignedRois, call.shape, o.check_rois, need_total,
                                    [&] { return backend(call).check_rois(call, need_total, ctx); });
}

internal::RoiAlignCall validate_forward(const TensorView& input, const TensorView& rois, const TensorView& output,
                                        const RoiAlignOptions& o, const TensorView& argmax) {
  const char* op = "roi_align_forward";
  internal::check_pooling_options(op, o);
  check_pool_mode(op, o);
  internal::check_tensor(op, "input", input, 4);
  internal::check_floating(op, "input", input);
  internal::check_rois_tensor(op, rois, internal::kAxisAlignedRois, input, "input");
  internal::check_pooled(op, "output", output, rois.sizes[0], input.sizes[1], o, input.dtype, input, "input");
  check_argmax(op, argmax, o, output, "output");
  // The outputs are written while the inputs are read: no shared byte (not even an exact alias).
  internal::check_outputs(op, {{"output", &output}, {"argmax", &argmax}});
  internal::check_disjoint(op, {"output", &output}, {{"input", &input}, {"rois", &rois}});
  internal::check_disjoint(op, {"argmax", &argmax}, {{"input", &input}, {"rois", &rois}});
  internal::check_map_has_pixels(op, "input", input, rois.sizes[0]);
  return {op, input, rois, output, argmax, internal::pooling_shape(input, rois.sizes[0], o),
          o.pool_mode == PoolMode::kMax};
}

internal::RoiAlignCall validate_backward(const TensorView& grad_output, const TensorView& rois,
                                         const TensorView& grad_input, const RoiAlignOptions& o,
                                         const RoiAlignBackwardOptions& b, const TensorView& argmax,
                                         bool argmax_required = true) {
  const char* op = argmax_required ? "roi_align_backward" : "roi_align_backward_workspace_size";
  internal::check_pooling_options(op, o);
  check_pool_mode(op, o);
  internal::check_backward_options(op, kRoiAlignCapabilities, b);
  internal::check_tensor(op, "grad_input", grad_input, 4);
  internal::check_floating(op, "grad_input", grad_input);
  internal::check_outputs(op, {{"grad_input", &grad_input}});
  internal::check_rois_tensor(op, rois, internal::kAxisAlignedRois, grad_input, "grad_input");
  internal::check_pooled(op, "grad_output", grad_output, rois.sizes[0], grad_input.sizes[1], o, grad_input.dtype,
                         grad_input, "grad_input");
  check_argmax(op, argmax, o, grad_output, "grad_output", argmax_required);
  // grad_input is written while the others are read: no shared byte (not even an exact alias).
  internal::check_disjoint(op, {"grad_input", &grad_input},
                           {{"grad_output", &grad_output}, {"rois", &rois}, {"argmax", &argmax}});
  internal::check_map_has_pixels(op, "grad_input", grad_input, rois.sizes[0]);
  return {op, grad_input, rois, grad_output, argmax, internal::pooling_shape(grad_input, rois.sizes[0], o),
          o.pool_mode == PoolMode::kMax};
}

/// The backward decoded once (internal::RoiBackwardPlan): the backend's steps, asked once each.
internal::RoiBackwardPlan plan_backward(const internal::RoiAlignCall& call, const RoiAlignOptions& o,
                                     const RoiAlignBackwardOptions& b, const Context& ctx) {
  const internal::RoiAlignBackend& be = backend(call);
  return internal::plan_roi_align_backward(
      call, b, be.enumerates(call, b.mode), [&](bool need_total) { return check_rois_values(call, o, need_total, ctx); },
      [&](const internal::RoiBackwardPlan& plan) { return be.backward_workspace(call, plan); });
}

}  // namespace

void roi_align_forward(const TensorView& input, const TensorView& rois, const TensorView& output,
                       const RoiAlignOptions& options, const Context& ctx, const TensorView& argmax) {
  const internal::RoiAlignCall call = validate_forward(input, rois, output, options, argmax);
  check_rois_values(call, options, false, ctx);
  if (output.numel() == 0) return;
  backend(call).forward(call, ctx);
}

std::size_t roi_align_backward_workspace_size(const TensorView& grad_output, const TensorView& rois,
                                              const TensorView& grad_input, const RoiAlignOptions& options,
                                              const RoiAlignBackwardOptions& backward, const Context& ctx) {
  const internal::RoiAlignCall call = validate_backward(grad_output, rois, grad_input, options, backward, {}, false);
  return internal::workspace_size_with_slack(plan_backward(call, options, backward, ctx).workspace);
}

void roi_align_backward(const TensorView& grad_output, const TensorView& rois, const TensorView& grad_input,
                        const RoiAlignOptions& options, const RoiAlignBackwardOptions& backward, const Context& ctx,
                        const TensorView& argmax, Workspace workspace) {
  const internal::RoiAlignCall call = validate_backward(grad_output, rois, grad_input, options, backward, argmax);
  const internal::RoiBackwardPlan plan = plan_backward(call, options, backward, ctx);
  internal::run_in_workspace(call.op, plan.workspace, grad_input, ctx, workspace,
                             {{"grad_output", &grad_output}, {"rois", &rois}, {"grad_input", &grad_input},
                              {"argmax", &argmax}},
                             "roi_align_backward_workspace_size",
                             [&](Workspace ws) { backend(call).backward(call, plan, ctx, ws); });
}

}  // namespace detops
