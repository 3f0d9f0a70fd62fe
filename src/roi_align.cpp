// RoIAlign entry points: validate every argument (before anything is allocated, launched or
// written), then hand a RoiAlignCall to the CPU or CUDA backend.
#include "detops/roi_align.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>

#include "internal/common.h"
#include "internal/roi_align_backend.h"
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
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

using internal::check_no_partial_overlap;
using internal::check_non_overlapping;
using internal::check_same_device;
using internal::check_tensor;
using internal::is_floating;
using internal::sizes_str;

void check_options(const char* op, const RoiAlignOptions& o) {
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

/// Checks rois (rank, columns, dtype, device) against the features' dtype and device.
void check_rois_tensor(const char* op, const TensorView& rois, const TensorView& features, const char* fname) {
  check_tensor(op, "rois", rois, 2);
  if (rois.sizes[1] != 5) fail(kBad, "{}: rois has sizes {}; expected [K, 5] rows (batch_index, x1, y1, x2, y2)", op, sizes_str(rois));
  const bool ok_dtype = rois.dtype == features.dtype || rois.dtype == DType::kFloat32 || rois.dtype == DType::kFloat64;
  if (!ok_dtype || !is_floating(rois.dtype))
    fail(kBad, "{}: rois has dtype {}; expected {} (the dtype of {}), float32 or float64", op, dtype_name(rois.dtype),
         dtype_name(features.dtype), fname);
  check_same_device(op, "rois", rois, fname, features);
}

void check_pooled(const char* op, const char* name, const TensorView& v, std::int64_t K, std::int64_t C,
                  const RoiAlignOptions& o, DType dtype, const TensorView& ref, const char* ref_name) {
  check_tensor(op, name, v, 4);
  if (v.sizes[0] != K || v.sizes[1] != C || v.sizes[2] != o.pooled_height || v.sizes[3] != o.pooled_width)
    fail(kBad, "{}: {} has sizes {}; expected [K, C, PH, PW] = [{}, {}, {}, {}]", op, name, sizes_str(v), K, C,
         o.pooled_height, o.pooled_width);
  if (v.dtype != dtype)
    fail(kBad, "{}: {} has dtype {}; expected {}", op, name, dtype_name(v.dtype), dtype_name(dtype));
  check_same_device(op, name, v, ref_name, ref);
}

void check_argmax(const char* op, const TensorView& argmax, const RoiAlignOptions& o, const TensorView& pooled,
                  const char* pooled_name, bool write, bool required = true) {
  if (!required && !argmax.defined()) return;  // the workspace query does not read argmax
  if (o.pool_mode != PoolMode::kMax) {
    if (argmax.defined())
      fail(kBad, "{}: argmax was given with pool_mode avg; expected no argmax (it is only used by max pooling)", op);
    return;
  }
  if (!argmax.defined()) fail(kBad, "{}: pool_mode max needs argmax (int32, sizes of {}); none was given", op, pooled_name);
  check_pooled(op, "argmax", argmax, pooled.sizes[0], pooled.sizes[1], o, DType::kInt32, pooled, pooled_name);
  if (write) check_non_overlapping(op, "argmax", argmax);
}

detail::RoiAlignShape make_shape(const TensorView& features, std::int64_t K, const RoiAlignOptions& o) {
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

/// Turns a failed roi check into the documented error.
void raise_roi_error(const char* op, const internal::RoiCheck& c, const detail::RoiAlignShape& s) {
  using detail::RoiStatus;
  const double* r = c.row;
  switch (c.status) {
    case RoiStatus::kOk: return;
    case RoiStatus::kBatchIndexNotFinite:
    case RoiStatus::kBatchIndexNotInteger:
    case RoiStatus::kBatchIndexOutOfRange:
      fail(kBad, "{}: rois[{}] has batch index {}; expected an integer in [0, {})", op, c.bad_row, r[0], s.N);
    case RoiStatus::kCoordinateNotFinite:
      fail(kBad, "{}: rois[{}] has coordinates (x1, y1, x2, y2) = ({}, {}, {}, {}); expected finite values", op,
           c.bad_row, r[1], r[2], r[3], r[4]);
    case RoiStatus::kGeometryNotFinite:
      fail(kBad, "{}: rois[{}] = ({}, {}, {}, {}) scaled by spatial_scale {} overflows the accumulation type; expected "
           "coordinates within its range", op, c.bad_row, r[1], r[2], r[3], r[4], s.spatial_scale);
    case RoiStatus::kTooManySamples:
      fail(ErrorCode::kOutOfMemory,
           "{}: rois[{}] = ({}, {}, {}, {}) needs an adaptive grid of {}x{} samples per bin ({} bins); expected at most "
           "max_samples_per_roi = {} samples per roi (raise RoiAlignOptions::max_samples_per_roi or set a fixed "
           "sampling_ratio)", op, c.bad_row, r[1], r[2], r[3], r[4], c.grid_h, c.grid_w, s.PH * s.PW,
           s.max_samples_per_roi);
  }
}

internal::RoiCheck check_rois_values(const internal::RoiAlignCall& call, const RoiAlignOptions& o, bool need_total,
                                     const Context& ctx) {
  internal::RoiCheck check;
  if (call.shape.K == 0) {
    check.total_samples = 0;
    return check;
  }
  if (call.features.device.is_cpu()) {
    check = internal::roi_align_check_rois_cpu(call, need_total);
  } else {
    if (!o.check_rois && !need_total) return check;
    check = internal::roi_align_check_rois_cuda(call, o.check_rois, need_total, ctx);
  }
  if (o.check_rois) raise_roi_error(call.op, check, call.shape);
  return check;
}

/// Every workspace the backends see starts on a kWorkspaceAlign boundary: the size reported to
/// callers includes kWorkspaceAlign - 1 bytes of slack, and ScopedWorkspace rounds the base up.
constexpr std::size_t kWorkspaceAlign = internal::WorkspaceLayout::kAlign;
std::size_t with_alignment_slack(std::size_t bytes) { return bytes == 0 ? 0 : bytes + (kWorkspaceAlign - 1); }

/// A view of the call, named, for the workspace overlap check.
struct NamedView {
  const char* name;
  const TensorView* view;
};

/// RAII workspace: the caller's buffer, or one from the context's allocator; get() returns it
/// with the base rounded up to kWorkspaceAlign (the slack is part of `need`).
class ScopedWorkspace {
 public:
  /// `views`: the call's tensors; a caller's workspace must not overlap any of them (the backends
  /// write the workspace while reading or writing those, so an overlap would corrupt results).
  ScopedWorkspace(const char* op, Workspace given, std::size_t need, Device device, const Context& ctx,
                  std::initializer_list<NamedView> views)
      : device_(device), ctx_(ctx) {
    if (need == 0) return;
    if (given.data) {
      if (given.bytes < need)
        fail(kBad, "{}: workspace has {} bytes; expected at least {} (see roi_align_backward_workspace_size)", op,
             given.bytes, need);
      // addresses as integers: the buffers are unrelated allocations
      const auto w0 = reinterpret_cast<std::uintptr_t>(given.data);
      for (const NamedView& v : views) {
        if (!v.view->defined() || v.view->numel() == 0 || v.view->device != device) continue;
        const auto v0 = reinterpret_cast<std::uintptr_t>(v.view->data);
        if (w0 < v0 + static_cast<std::uintptr_t>(v.view->span_bytes()) && v0 < w0 + need)
          fail(kBad, "{}: workspace [{}, +{} bytes) overlaps {} in memory; expected disjoint memory", op,
               given.data, need, v.name);
      }
      ws_ = given;
      return;
    }
    alloc_ = ctx.allocator ? ctx.allocator : &default_allocator();
    ws_.data = alloc_->allocate(need, device, ctx.cuda_stream);
    ws_.bytes = need;
  }
  ~ScopedWorkspace() {
    if (alloc_ && ws_.data) alloc_->deallocate(ws_.data, ws_.bytes, device_, ctx_.cuda_stream);
  }
  ScopedWorkspace(const ScopedWorkspace&) = delete;
  ScopedWorkspace& operator=(const ScopedWorkspace&) = delete;
  Workspace get() const {
    if (!ws_.data) return ws_;
    const auto addr = reinterpret_cast<std::uintptr_t>(ws_.data);
    const std::size_t pad = (kWorkspaceAlign - addr % kWorkspaceAlign) % kWorkspaceAlign;
    return Workspace{static_cast<unsigned char*>(ws_.data) + pad, ws_.bytes - pad};
  }

 private:
  Workspace ws_{};
  Allocator* alloc_ = nullptr;
  Device device_;
  const Context& ctx_;
};

internal::RoiAlignCall validate_forward(const TensorView& input, const TensorView& rois, const TensorView& output,
                                        const RoiAlignOptions& o, const TensorView& argmax) {
  const char* op = "roi_align_forward";
  check_options(op, o);
  check_tensor(op, "input", input, 4);
  if (!is_floating(input.dtype)) fail(kBad, "{}: input has dtype {}; expected a floating dtype", op, dtype_name(input.dtype));
  check_rois_tensor(op, rois, input, "input");
  check_pooled(op, "output", output, rois.sizes[0], input.sizes[1], o, input.dtype, input, "input");
  check_non_overlapping(op, "output", output);
  check_argmax(op, argmax, o, output, "output", true);
  // The outputs are written while the inputs are read: no shared byte (not even an exact alias).
  check_no_partial_overlap(op, "output", output, "input", input, false);
  check_no_partial_overlap(op, "output", output, "rois", rois, false);
  check_no_partial_overlap(op, "argmax", argmax, "input", input, false);
  check_no_partial_overlap(op, "argmax", argmax, "rois", rois, false);
  check_no_partial_overlap(op, "argmax", argmax, "output", output, false);
  if (rois.sizes[0] > 0 && input.sizes[1] > 0 && (input.sizes[2] == 0 || input.sizes[3] == 0))
    fail(kBad, "{}: input has sizes {}; expected H > 0 and W > 0 when there are rois to pool", op, sizes_str(input));
  internal::RoiAlignCall call{op, input, rois, output, argmax, make_shape(input, rois.sizes[0], o),
                              o.pool_mode == PoolMode::kMax};
  return call;
}

internal::RoiAlignCall validate_backward(const TensorView& grad_output, const TensorView& rois,
                                         const TensorView& grad_input, const RoiAlignOptions& o,
                                         const RoiAlignBackwardOptions& b, const TensorView& argmax,
                                         bool argmax_required = true) {
  const char* op = argmax_required ? "roi_align_backward" : "roi_align_backward_workspace_size";
  check_options(op, o);
  if (b.mode != BackwardMode::kAtomic && b.mode != BackwardMode::kTruncated && b.mode != BackwardMode::kExact)
    fail(kBad, "{}: backward mode {} is unknown; expected atomic, truncated or exact", op, static_cast<int>(b.mode));
  if (b.truncation != TruncationFormat::kFloat16 && b.truncation != TruncationFormat::kBFloat16)
    fail(kBad, "{}: truncation format {} is unknown; expected float16 or bfloat16", op, static_cast<int>(b.truncation));
  check_tensor(op, "grad_input", grad_input, 4);
  if (!is_floating(grad_input.dtype))
    fail(kBad, "{}: grad_input has dtype {}; expected a floating dtype", op, dtype_name(grad_input.dtype));
  check_non_overlapping(op, "grad_input", grad_input);
  check_rois_tensor(op, rois, grad_input, "grad_input");
  check_pooled(op, "grad_output", grad_output, rois.sizes[0], grad_input.sizes[1], o, grad_input.dtype, grad_input,
               "grad_input");
  check_argmax(op, argmax, o, grad_output, "grad_output", false, argmax_required);
  // grad_input is written while the others are read: no shared byte (not even an exact alias).
  check_no_partial_overlap(op, "grad_input", grad_input, "grad_output", grad_output, false);
  check_no_partial_overlap(op, "grad_input", grad_input, "rois", rois, false);
  check_no_partial_overlap(op, "grad_input", grad_input, "argmax", argmax, false);
  if (rois.sizes[0] > 0 && grad_input.sizes[1] > 0 && (grad_input.sizes[2] == 0 || grad_input.sizes[3] == 0))
    fail(kBad, "{}: grad_input has sizes {}; expected H > 0 and W > 0 when there are rois", op, sizes_str(grad_input));
  internal::RoiAlignCall call{op, grad_input, rois, grad_output, argmax, make_shape(grad_input, rois.sizes[0], o),
                              o.pool_mode == PoolMode::kMax};
  return call;
}

bool needs_total(const RoiAlignOptions& o, const RoiAlignBackwardOptions& b) {
  return b.mode == BackwardMode::kExact && o.sampling_ratio <= 0;
}

std::size_t workspace_bytes(const internal::RoiAlignCall& call, const internal::RoiCheck& check, BackwardMode mode) {
  if (call.shape.K == 0 || call.shape.C == 0) return 0;
  if (mode == BackwardMode::kExact) {
    // Slots are 4 per sample; sized in double first so a huge problem is an error, not an overflow.
    const detail::RoiAlignShape& s = call.shape;
    const double samples = s.sampling_ratio > 0 ? static_cast<double>(s.K) * static_cast<double>(s.PH) *
                                                      static_cast<double>(s.PW) * static_cast<double>(s.sampling_ratio) *
                                                      static_cast<double>(s.sampling_ratio)
                                                : static_cast<double>(check.total_samples);
    if (4.0 * samples > static_cast<double>(std::int64_t{1} << 40))
      fail(ErrorCode::kOutOfMemory, "{}: the exact mode would need {} slots (4 per sample); expected at most 2^40 "
           "(use fewer rois per call or a smaller sampling_ratio)", call.op, 4.0 * samples);
  }
  return with_alignment_slack(call.features.device.is_cpu()
                                  ? internal::roi_align_backward_workspace_cpu(call, check, mode)
                                  : internal::roi_align_backward_workspace_cuda(call, check, mode));
}

}  // namespace

void roi_align_forward(const TensorView& input, const TensorView& rois, const TensorView& output,
                       const RoiAlignOptions& options, const Context& ctx, const TensorView& argmax) {
  const internal::RoiAlignCall call = validate_forward(input, rois, output, options, argmax);
  check_rois_values(call, options, false, ctx);
  if (output.numel() == 0) return;
  if (input.device.is_cpu()) internal::roi_align_forward_cpu(call, ctx);
  else internal::roi_align_forward_cuda(call, ctx);
}

std::size_t roi_align_backward_workspace_size(const TensorView& grad_output, const TensorView& rois,
                                              const TensorView& grad_input, const RoiAlignOptions& options,
                                              const RoiAlignBackwardOptions& backward, const Context& ctx) {
  const internal::RoiAlignCall call = validate_backward(grad_output, rois, grad_input, options, backward, {}, false);
  const internal::RoiCheck check = check_rois_values(call, options, needs_total(options, backward), ctx);
  return workspace_bytes(call, check, backward.mode);
}

void roi_align_backward(const TensorView& grad_output, const TensorView& rois, const TensorView& grad_input,
                        const RoiAlignOptions& options, const RoiAlignBackwardOptions& backward, const Context& ctx,
                        const TensorView& argmax, Workspace workspace) {
  const internal::RoiAlignCall call = validate_backward(grad_output, rois, grad_input, options, backward, argmax);
  const internal::RoiCheck check = check_rois_values(call, options, needs_total(options, backward), ctx);
  const std::size_t need = workspace_bytes(call, check, backward.mode);
  ScopedWorkspace ws(call.op, workspace, need, grad_input.device, ctx,
                     {{"grad_output", &grad_output}, {"rois", &rois}, {"grad_input", &grad_input}, {"argmax", &argmax}});
  if (grad_input.numel() == 0) return;
  if (grad_input.device.is_cpu()) internal::roi_align_backward_cpu(call, check, backward, ctx, ws.get());
  else internal::roi_align_backward_cuda(call, check, backward, ctx, ws.get());
}

}  // namespace detops
