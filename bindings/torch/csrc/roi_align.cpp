// RoIAlign glue of torch.ops.detops: roi_align / roi_align_max and their backward ops (CPU, and
// CUDA when built with it), their schemas, and the classic layer's C++ autograd functions.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

constexpr const char* kForward = "detops::roi_align";
constexpr const char* kBackward = "detops::_roi_align_backward";

RoiAlignOptions make_options(double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                             int64_t sampling_ratio, bool aligned, PoolMode pool) {
  RoiAlignOptions o;
  o.spatial_scale = spatial_scale;
  o.pooled_height = pooled_height;
  o.pooled_width = pooled_width;
  o.sampling_ratio = sampling_ratio;
  o.aligned = aligned;
  o.pool_mode = pool;
  return o;
}

// ---- CPU and CUDA: one kernel each, detops picks its backend from the tensors' device --------

Tensor roi_align_kernel(const Tensor& input, const Tensor& rois, double spatial_scale,
                        int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned,
                        Str backward_mode, Str truncation) {
  return guarded([&] {
    parse_backward_mode(kForward, backward_mode, kRoiAlignCapabilities);
    parse_truncation(kForward, truncation);
    DeviceGuard guard(input);
    Tensor output = empty_on(input, roi_output_sizes(kForward, input, rois, pooled_height, pooled_width, "[K, 5]"));
    roi_align_forward(view(input, "input"), view(rois, "rois"),
                      view(output, "output"),
                      make_options(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, PoolMode::kAvg),
                      context(input));
    return output;
  });
}

std::tuple<Tensor, Tensor> roi_align_max_kernel(const Tensor& input, const Tensor& rois,
                                                double spatial_scale, int64_t pooled_height,
                                                int64_t pooled_width, int64_t sampling_ratio, bool aligned,
                                                Str backward_mode, Str truncation) {
  return guarded([&] {
    const char* op = "detops::roi_align_max";
    parse_backward_mode(op, backward_mode, kRoiAlignCapabilities);
    parse_truncation(op, truncation);
    DeviceGuard guard(input);
    const auto sizes = roi_output_sizes(op, input, rois, pooled_height, pooled_width, "[K, 5]");
    Tensor output = empty_on(input, sizes);
    Tensor argmax = empty_on(input, sizes, DType::kInt32);
    roi_align_forward(view(input, "input"), view(rois, "rois"),
                      view(output, "output"),
                      make_options(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, PoolMode::kMax),
                      context(input), view(argmax, "argmax"));
    return std::make_tuple(output, argmax);
  });
}

Tensor backward_common(const char* op, const Tensor& grad, const Tensor& rois, const Tensor& argmax,
                       double spatial_scale, int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                       int64_t channels, int64_t height, int64_t width, int64_t sampling_ratio, bool aligned,
                       Str backward_mode, Str truncation, bool channels_last, PoolMode pool) {
  return guarded([&] {
    RoiAlignBackwardOptions b;
    b.mode = parse_backward_mode(op, backward_mode, kRoiAlignCapabilities);
    b.truncation = parse_truncation(op, truncation);
    DeviceGuard guard(grad);
    if (b.mode == BackwardMode::kAtomic && is_cuda(grad)) {
      // Atomics on the GPU: the one mode whose bits change from run to run there.
      alert_not_deterministic("detops::roi_align backward with backward_mode='atomic' on CUDA");
    }
    Tensor grad_input = roi_grad_input_like(op, grad, batch_size, channels, height, width, channels_last);
    // Workspace (exact mode) comes from torch's allocator through the context.
    roi_align_backward(view(grad, "grad"), view(rois, "rois"),
                       view(grad_input, "grad_input"),
                       make_options(spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, pool), b,
                       context(grad), view(argmax, "argmax"));
    return grad_input;
  });
}

Tensor roi_align_backward_kernel(const Tensor& grad, const Tensor& rois, double spatial_scale,
                                 int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                                 int64_t channels, int64_t height, int64_t width, int64_t sampling_ratio,
                                 bool aligned, Str backward_mode, Str truncation,
                                 bool channels_last) {
  return backward_common(kBackward, grad, rois, undefined(), spatial_scale, pooled_height, pooled_width,
                         batch_size, channels, height, width, sampling_ratio, aligned, backward_mode, truncation,
                         channels_last, PoolMode::kAvg);
}

Tensor roi_align_max_backward_kernel(const Tensor& grad, const Tensor& rois, const Tensor& argmax,
                                     double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                                     int64_t batch_size, int64_t channels, int64_t height, int64_t width,
                                     int64_t sampling_ratio, bool aligned, Str backward_mode,
                                     Str truncation, bool channels_last) {
  return backward_common("detops::_roi_align_max_backward", grad, rois, argmax, spatial_scale, pooled_height,
                         pooled_width, batch_size, channels, height, width, sampling_ratio, aligned, backward_mode,
                         truncation, channels_last, PoolMode::kMax);
}

#if !DETOPS_TORCH_STABLE
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// ---- Autograd ----------------------------------------------------------------------------------
// As torchvision's csrc/ops/autograd/roi_align_kernel.cpp: the forward runs the op below the
// autograd key, the backward calls the backward op through the dispatcher, whose own autograd
// kernel refuses to be differentiated again. Gradients: input only (rois get none).

std::string str(Str s) { return std::string(s.data(), s.size()); }

at::Tensor call_roi_align(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph,
                          int64_t pw, int64_t sr, bool aligned, Str mode, Str truncation) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::roi_align", "")
                       .typed<decltype(roi_align_kernel)>();
  return op.call(input, rois, spatial_scale, ph, pw, sr, aligned, mode, truncation);
}

std::tuple<at::Tensor, at::Tensor> call_roi_align_max(const at::Tensor& input, const at::Tensor& rois,
                                                      double spatial_scale, int64_t ph, int64_t pw, int64_t sr,
                                                      bool aligned, Str mode, Str truncation) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::roi_align_max", "")
                       .typed<decltype(roi_align_max_kernel)>();
  return op.call(input, rois, spatial_scale, ph, pw, sr, aligned, mode, truncation);
}

at::Tensor call_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t ph,
                         int64_t pw, int64_t n, int64_t c, int64_t h, int64_t w, int64_t sr, bool aligned,
                         Str mode, Str truncation, bool channels_last) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_roi_align_backward", "")
                       .typed<decltype(roi_align_backward_kernel)>();
  return op.call(grad, rois, spatial_scale, ph, pw, n, c, h, w, sr, aligned, mode, truncation, channels_last);
}

at::Tensor call_max_backward(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
                             double spatial_scale, int64_t ph, int64_t pw, int64_t n, int64_t c, int64_t h,
                             int64_t w, int64_t sr, bool aligned, Str mode, Str truncation,
                             bool channels_last) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_roi_align_max_backward", "")
                       .typed<decltype(roi_align_max_backward_kernel)>();
  return op.call(grad, rois, argmax, spatial_scale, ph, pw, n, c, h, w, sr, aligned, mode, truncation, channels_last);
}

void save_attributes(AutogradContext* ctx, const at::Tensor& input, double spatial_scale, int64_t ph, int64_t pw,
                     int64_t sr, bool aligned, Str mode, Str truncation) {
  ctx->saved_data["spatial_scale"] = spatial_scale;
  ctx->saved_data["pooled_height"] = ph;
  ctx->saved_data["pooled_width"] = pw;
  ctx->saved_data["sampling_ratio"] = sr;
  ctx->saved_data["aligned"] = aligned;
  ctx->saved_data["backward_mode"] = str(mode);
  ctx->saved_data["truncation"] = str(truncation);
  ctx->saved_data["input_shape"] = input.sizes();
  ctx->saved_data["channels_last"] = is_channels_last(input);
}

// Arguments of the forward after (input, rois): none of them has a gradient.
variable_list with_input_grad(const at::Tensor& grad_input) {
  return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
          at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
}

class RoiAlignFunction : public ::torch::autograd::Function<RoiAlignFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rois,
                               double spatial_scale, int64_t ph, int64_t pw, int64_t sr, bool aligned,
                               Str mode, Str truncation) {
    save_attributes(ctx, input, spatial_scale, ph, pw, sr, aligned, mode, truncation);
    ctx->save_for_backward({rois});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_roi_align(input, rois, spatial_scale, ph, pw, sr, aligned, mode, truncation)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["input_shape"].toIntVector();
    const std::string mode = ctx->saved_data["backward_mode"].toStringRef();
    const std::string truncation = ctx->saved_data["truncation"].toStringRef();
    return with_input_grad(call_backward(
        grad_output[0], saved[0], ctx->saved_data["spatial_scale"].toDouble(),
        ctx->saved_data["pooled_height"].toInt(), ctx->saved_data["pooled_width"].toInt(), shape[0], shape[1],
        shape[2], shape[3], ctx->saved_data["sampling_ratio"].toInt(), ctx->saved_data["aligned"].toBool(), mode,
        truncation, ctx->saved_data["channels_last"].toBool()));
  }
};

class RoiAlignMaxFunction : public ::torch::autograd::Function<RoiAlignMaxFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rois,
                               double spatial_scale, int64_t ph, int64_t pw, int64_t sr, bool aligned,
                               Str mode, Str truncation) {
    save_attributes(ctx, input, spatial_scale, ph, pw, sr, aligned, mode, truncation);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto result = call_roi_align_max(input, rois, spatial_scale, ph, pw, sr, aligned, mode, truncation);
    ctx->save_for_backward({rois, std::get<1>(result)});
    ctx->mark_non_differentiable({std::get<1>(result)});
    return {std::get<0>(result), std::get<1>(result)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["input_shape"].toIntVector();
    const std::string mode = ctx->saved_data["backward_mode"].toStringRef();
    const std::string truncation = ctx->saved_data["truncation"].toStringRef();
    return with_input_grad(call_max_backward(
        grad_output[0], saved[0], saved[1], ctx->saved_data["spatial_scale"].toDouble(),
        ctx->saved_data["pooled_height"].toInt(), ctx->saved_data["pooled_width"].toInt(), shape[0], shape[1],
        shape[2], shape[3], ctx->saved_data["sampling_ratio"].toInt(), ctx->saved_data["aligned"].toBool(), mode,
        truncation, ctx->saved_data["channels_last"].toBool()));
  }
};

// The backward ops' autograd: computed below autograd, refused if differentiated again.
[[noreturn]] void no_double_backward() {
  TORCH_CHECK(false, "detops::roi_align: double backward is not supported");
  throw std::logic_error("unreachable");
}

class RoiAlignBackwardFunction : public ::torch::autograd::Function<RoiAlignBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                               int64_t ph, int64_t pw, int64_t n, int64_t c, int64_t h, int64_t w, int64_t sr,
                               bool aligned, Str mode, Str truncation, bool channels_last) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_backward(grad, rois, spatial_scale, ph, pw, n, c, h, w, sr, aligned, mode, truncation,
                          channels_last)};
  }
  static variable_list backward(AutogradContext*, variable_list) { no_double_backward(); }
};

class RoiAlignMaxBackwardFunction : public ::torch::autograd::Function<RoiAlignMaxBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad, const at::Tensor& rois,
                               const at::Tensor& argmax, double spatial_scale, int64_t ph, int64_t pw, int64_t n,
                               int64_t c, int64_t h, int64_t w, int64_t sr, bool aligned, Str mode,
                               Str truncation, bool channels_last) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_max_backward(grad, rois, argmax, spatial_scale, ph, pw, n, c, h, w, sr, aligned, mode, truncation,
                              channels_last)};
  }
  static variable_list backward(AutogradContext*, variable_list) { no_double_backward(); }
};

at::Tensor roi_align_autograd(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph,
                              int64_t pw, int64_t sr, bool aligned, Str mode, Str truncation) {
  return RoiAlignFunction::apply(input, rois, spatial_scale, ph, pw, sr, aligned, mode, truncation)[0];
}

std::tuple<at::Tensor, at::Tensor> roi_align_max_autograd(const at::Tensor& input, const at::Tensor& rois,
                                                          double spatial_scale, int64_t ph, int64_t pw, int64_t sr,
                                                          bool aligned, Str mode, Str truncation) {
  auto r = RoiAlignMaxFunction::apply(input, rois, spatial_scale, ph, pw, sr, aligned, mode, truncation);
  return std::make_tuple(r[0], r[1]);
}

at::Tensor roi_align_backward_autograd(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                                       int64_t ph, int64_t pw, int64_t n, int64_t c, int64_t h, int64_t w, int64_t sr,
                                       bool aligned, Str mode, Str truncation, bool channels_last) {
  return RoiAlignBackwardFunction::apply(grad, rois, spatial_scale, ph, pw, n, c, h, w, sr, aligned, mode,
                                         truncation, channels_last)[0];
}

at::Tensor roi_align_max_backward_autograd(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
                                           double spatial_scale, int64_t ph, int64_t pw, int64_t n, int64_t c,
                                           int64_t h, int64_t w, int64_t sr, bool aligned, Str mode,
                                           Str truncation, bool channels_last) {
  return RoiAlignMaxBackwardFunction::apply(grad, rois, argmax, spatial_scale, ph, pw, n, c, h, w, sr, aligned, mode,
                                            truncation, channels_last)[0];
}

#endif  // !DETOPS_TORCH_STABLE

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

DETOPS_LIBRARY_FRAGMENT(m) {
  // RoIAlign, average pooling: torchvision's positional order, detops' modes trailing.
  m.def("roi_align(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
        "int sampling_ratio, bool aligned, str backward_mode=\"exact\", str truncation=\"float16\") -> Tensor");
  m.def("_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height, "
        "int pooled_width, int batch_size, int channels, int height, int width, int sampling_ratio, "
        "bool aligned, str backward_mode=\"exact\", str truncation=\"float16\", bool channels_last=False) -> Tensor");
  // RoIAlign, max pooling (mmcv pool_mode="max"): argmax is int32, detops' layout.
  m.def("roi_align_max(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
        "int sampling_ratio, bool aligned, str backward_mode=\"exact\", str truncation=\"float16\") "
        "-> (Tensor output, Tensor argmax)");
  m.def("_roi_align_max_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
        "int pooled_height, int pooled_width, int batch_size, int channels, int height, int width, "
        "int sampling_ratio, bool aligned, str backward_mode=\"exact\", str truncation=\"float16\", "
        "bool channels_last=False) -> Tensor");
}

namespace {
template <class Library>
void kernels(Library& m) {
  m.impl("roi_align", DETOPS_KERNEL(ops::roi_align_kernel));
  m.impl("_roi_align_backward", DETOPS_KERNEL(ops::roi_align_backward_kernel));
  m.impl("roi_align_max", DETOPS_KERNEL(ops::roi_align_max_kernel));
  m.impl("_roi_align_max_backward", DETOPS_KERNEL(ops::roi_align_max_backward_kernel));
}
}  // namespace

DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels)

#if !DETOPS_TORCH_STABLE
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  m.impl("roi_align", TORCH_FN(ops::roi_align_autograd));
  m.impl("_roi_align_backward", TORCH_FN(ops::roi_align_backward_autograd));
  m.impl("roi_align_max", TORCH_FN(ops::roi_align_max_autograd));
  m.impl("_roi_align_max_backward", TORCH_FN(ops::roi_align_max_backward_autograd));
}
#endif
