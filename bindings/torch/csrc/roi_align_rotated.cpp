// RoIAlignRotated kernels of torch.ops.detops: roi_align_rotated and its backward op on the CPU,
// CUDA (when built with it) and their schemas; the classic layer's C++ autograd functions.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

constexpr const char* kForward = "detops::roi_align_rotated";
constexpr const char* kBackward = "detops::_roi_align_rotated_backward";

// The string options are parsed (and so validated) here, by every kernel that takes them.
RoiAlignRotatedOptions make_options(const char* op, double spatial_scale, int64_t pooled_height,
                                    int64_t pooled_width, int64_t sampling_ratio, bool aligned, bool clockwise,
                                    Str angle_unit) {
  RoiAlignRotatedOptions o;
  o.spatial_scale = spatial_scale;
  o.pooled_height = pooled_height;
  o.pooled_width = pooled_width;
  o.sampling_ratio = sampling_ratio;
  o.aligned = aligned;
  o.clockwise = clockwise;
  o.angle_unit = parse_angle_unit(op, angle_unit);
  return o;
}

RoiAlignBackwardOptions make_backward(const char* op, Str backward_mode, Str truncation) {
  RoiAlignBackwardOptions b;
  b.mode = parse_backward_mode(op, backward_mode, kRoiAlignRotatedCapabilities);
  b.truncation = parse_truncation(op, truncation);
  return b;
}

// ---- CPU and CUDA: one kernel each, detops picks its backend from the tensors' device --------

Tensor roi_align_rotated_kernel(const Tensor& input, const Tensor& rois, double spatial_scale,
                                int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned,
                                bool clockwise, Str angle_unit, Str backward_mode,
                                Str truncation) {
  return guarded([&] {
    const RoiAlignRotatedOptions options = make_options(kForward, spatial_scale, pooled_height, pooled_width,
                                                        sampling_ratio, aligned, clockwise, angle_unit);
    make_backward(kForward, backward_mode, truncation);  // a bad mode fails now, not in the backward
    DeviceGuard guard(input);
    Tensor output = empty_on(input, roi_output_sizes(kForward, input, rois, pooled_height, pooled_width, "[K, 6]"));
    roi_align_rotated_forward(view(input, "input"), view(rois, "rois"),
                              view(output, "output"), options, context(input));
    return output;
  });
}

Tensor roi_align_rotated_backward_kernel(const Tensor& grad, const Tensor& rois, double spatial_scale,
                                         int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                                         int64_t channels, int64_t height, int64_t width, int64_t sampling_ratio,
                                         bool aligned, bool clockwise, Str angle_unit,
                                         Str backward_mode, Str truncation, bool channels_last) {
  return guarded([&] {
    const RoiAlignRotatedOptions options = make_options(kBackward, spatial_scale, pooled_height, pooled_width,
                                                        sampling_ratio, aligned, clockwise, angle_unit);
    const RoiAlignBackwardOptions b = make_backward(kBackward, backward_mode, truncation);
    DeviceGuard guard(grad);
    if (b.mode == BackwardMode::kAtomic && is_cuda(grad)) {
      // Atomics on the GPU: the one mode whose bits change from run to run there.
      alert_not_deterministic(
          "detops::roi_align_rotated backward with backward_mode='atomic' on CUDA");
    }
    Tensor grad_input = roi_grad_input_like(kBackward, grad, batch_size, channels, height, width, channels_last);
    // Workspace (exact mode) comes from torch's allocator through the context.
    roi_align_rotated_backward(view(grad, "grad"), view(rois, "rois"),
                               view(grad_input, "grad_input"), options, b,
                               context(grad));
    return grad_input;
  });
}

#if !DETOPS_TORCH_STABLE
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// ---- Autograd ----------------------------------------------------------------------------------
// As roi_align.cpp (after torchvision's csrc/ops/autograd/roi_align_kernel.cpp): the forward runs
// the op below the autograd key, the backward calls the backward op through the dispatcher, whose
// own autograd kernel refuses to be differentiated again. Gradients: input only (rois get none,
// as in detectron2 and mmcv).

std::string str(Str s) { return std::string(s.data(), s.size()); }

at::Tensor call_forward(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                        int64_t sr, bool aligned, bool clockwise, Str angle_unit, Str mode,
                        Str truncation) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(kForward, "")
                       .typed<decltype(roi_align_rotated_kernel)>();
  return op.call(input, rois, spatial_scale, ph, pw, sr, aligned, clockwise, angle_unit, mode, truncation);
}

at::Tensor call_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t ph,
                         int64_t pw, int64_t n, int64_t c, int64_t h, int64_t w, int64_t sr, bool aligned,
                         bool clockwise, Str angle_unit, Str mode, Str truncation,
                         bool channels_last) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(kBackward, "")
                       .typed<decltype(roi_align_rotated_backward_kernel)>();
  return op.call(grad, rois, spatial_scale, ph, pw, n, c, h, w, sr, aligned, clockwise, angle_unit, mode, truncation,
                 channels_last);
}

class RoiAlignRotatedFunction : public ::torch::autograd::Function<RoiAlignRotatedFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rois,
                               double spatial_scale, int64_t ph, int64_t pw, int64_t sr, bool aligned, bool clockwise,
                               Str angle_unit, Str mode, Str truncation) {
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["pooled_height"] = ph;
    ctx->saved_data["pooled_width"] = pw;
    ctx->saved_data["sampling_ratio"] = sr;
    ctx->saved_data["aligned"] = aligned;
    ctx->saved_data["clockwise"] = clockwise;
    ctx->saved_data["angle_unit"] = str(angle_unit);
    ctx->saved_data["backward_mode"] = str(mode);
    ctx->saved_data["truncation"] = str(truncation);
    ctx->saved_data["input_shape"] = input.sizes();
    ctx->saved_data["channels_last"] = is_channels_last(input);
    ctx->save_for_backward({rois});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_forward(input, rois, spatial_scale, ph, pw, sr, aligned, clockwise, angle_unit, mode, truncation)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["input_shape"].toIntVector();
    const std::string angle_unit = ctx->saved_data["angle_unit"].toStringRef();
    const std::string mode = ctx->saved_data["backward_mode"].toStringRef();
    const std::string truncation = ctx->saved_data["truncation"].toStringRef();
    at::Tensor grad_input = call_backward(
        grad_output[0], saved[0], ctx->saved_data["spatial_scale"].toDouble(),
        ctx->saved_data["pooled_height"].toInt(), ctx->saved_data["pooled_width"].toInt(), shape[0], shape[1],
        shape[2], shape[3], ctx->saved_data["sampling_ratio"].toInt(), ctx->saved_data["aligned"].toBool(),
        ctx->saved_data["clockwise"].toBool(), angle_unit, mode, truncation,
        ctx->saved_data["channels_last"].toBool());
    // One entry per forward argument after `input`, none of which has a gradient.
    return {grad_input,   at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class RoiAlignRotatedBackwardFunction : public ::torch::autograd::Function<RoiAlignRotatedBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                               int64_t ph, int64_t pw, int64_t n, int64_t c, int64_t h, int64_t w, int64_t sr,
                               bool aligned, bool clockwise, Str angle_unit, Str mode,
                               Str truncation, bool channels_last) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_backward(grad, rois, spatial_scale, ph, pw, n, c, h, w, sr, aligned, clockwise, angle_unit, mode,
                          truncation, channels_last)};
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "detops::roi_align_rotated: double backward is not supported");
    return {};
  }
};

at::Tensor roi_align_rotated_autograd(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                                      int64_t ph, int64_t pw, int64_t sr, bool aligned, bool clockwise,
                                      Str angle_unit, Str mode, Str truncation) {
  return RoiAlignRotatedFunction::apply(input, rois, spatial_scale, ph, pw, sr, aligned, clockwise, angle_unit, mode,
                                        truncation)[0];
}

at::Tensor roi_align_rotated_backward_autograd(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                                               int64_t ph, int64_t pw, int64_t n, int64_t c, int64_t h, int64_t w,
                                               int64_t sr, bool aligned, bool clockwise, Str angle_unit,
                                               Str mode, Str truncation, bool channels_last) {
  return RoiAlignRotatedBackwardFunction::apply(grad, rois, spatial_scale, ph, pw, n, c, h, w, sr, aligned, clockwise,
                                                angle_unit, mode, truncation, channels_last)[0];
}

#endif  // !DETOPS_TORCH_STABLE

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

DETOPS_LIBRARY_FRAGMENT(m) {
  // RoIAlignRotated: detectron2's positional order (its roi_align_rotated_forward/_backward
  // schemas), then mmcv's options (aligned, clockwise; angle_unit "radians" for its angles) and
  // detops' modes. Rois [K, 6]: (batch_index, cx, cy, w, h, angle).
  m.def("roi_align_rotated(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
        "int sampling_ratio, bool aligned=True, bool clockwise=False, str angle_unit=\"degrees\", "
        "str backward_mode=\"exact\", str truncation=\"float16\") -> Tensor");
  m.def("_roi_align_rotated_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, "
        "int pooled_width, int batch_size, int channels, int height, int width, int sampling_ratio, "
        "bool aligned=True, bool clockwise=False, str angle_unit=\"degrees\", str backward_mode=\"exact\", "
        "str truncation=\"float16\", bool channels_last=False) -> Tensor");
}

namespace {
template <class Library>
void kernels(Library& m) {
  m.impl("roi_align_rotated", DETOPS_KERNEL(ops::roi_align_rotated_kernel));
  m.impl("_roi_align_rotated_backward", DETOPS_KERNEL(ops::roi_align_rotated_backward_kernel));
}
}  // namespace

DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels)

#if !DETOPS_TORCH_STABLE
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  m.impl("roi_align_rotated", TORCH_FN(ops::roi_align_rotated_autograd));
  m.impl("_roi_align_rotated_backward", TORCH_FN(ops::roi_align_rotated_backward_autograd));
}
#endif
