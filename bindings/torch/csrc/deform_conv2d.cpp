// deform_conv2d kernels of torch.ops.detops: deform_conv2d and its backward op on the CPU, CUDA
// (when built with it) and their schemas; the classic layer's C++ autograd functions.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

constexpr const char* kForward = "detops::deform_conv2d";
constexpr const char* kBackward = "detops::_deform_conv2d_backward";

using Grads5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

[[noreturn]] void bad(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what);
}

/// torchvision's border rule for the offset gradient, or mmcv's (also detectron2's): see
/// include/detops/deform_conv2d.h, DeformBorderRule.
DeformBorderRule parse_border_rule(const char* op, Str s) {
  if (sv(s) == "torchvision") return DeformBorderRule::kTorchvision;
  if (sv(s) == "mmcv") return DeformBorderRule::kMmcv;
  bad_mode(op, "border_rule", s, "'torchvision', 'mmcv'");
}

std::string pair_str(int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

DeformConv2dOptions make_options(const char* op, int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                 int64_t dilation_h, int64_t dilation_w) {
  // Checked here as well as by detops: the output size below divides by the stride.
  if (stride_h <= 0 || stride_w <= 0) {
    bad(op, "stride is " + pair_str(stride_h, stride_w) + "; expected positive values");
  }
  if (dilation_h <= 0 || dilation_w <= 0) {
    bad(op, "dilation is " + pair_str(dilation_h, dilation_w) + "; expected positive values");
  }
  if (pad_h < 0 || pad_w < 0) {
    bad(op, "padding is " + pair_str(pad_h, pad_w) + "; expected values >= 0");
  }
  DeformConv2dOptions o;
  o.stride_h = stride_h;
  o.stride_w = stride_w;
  o.pad_h = pad_h;
  o.pad_w = pad_w;
  o.dilation_h = dilation_h;
  o.dilation_w = dilation_w;
  return o;
}

// The mask detops sees: torchvision's schema passes a mask tensor always and says with use_mask
// whether it counts ([N, 0] when not); here an absent mask is also accepted.
Tensor mask_used(const char* op, const Optional<Tensor>& mask, bool use_mask) {
  if (!use_mask) return undefined();
  if (!mask.has_value() || !mask->defined()) bad(op, "use_mask is True but mask is None; expected a mask tensor");
  return *mask;
}

// [N, Cout, Ho, Wo], after the checks the shaping itself needs: the ranks (torch would fail on
// size(2) first), positive kernel sizes, and the redundant groups and offset_groups of
// torchvision's schema, which detops infers from the shapes and which must agree with them.
// Everything else (sizes against one another, dtypes, devices) is detops' to check.
std::vector<int64_t> output_sizes(const char* op, const Tensor& input, const Tensor& weight,
                                  const Tensor& offset, const Tensor& mask, const DeformConv2dOptions& o,
                                  int64_t groups, int64_t offset_groups) {
  require_dim(op, "input", input, 4, "[N, Cin, H, W]");
  require_float(op, "input", input);
  require_dim(op, "weight", weight, 4, "[Cout, Cin / groups, kh, kw]");
  require_dim(op, "offset", offset, 4, "[N, 2 * offset_groups * kh * kw, Ho, Wo]");
  if (mask.defined()) require_dim(op, "mask", mask, 4, "[N, offset_groups * kh * kw, Ho, Wo]");
  const int64_t cin = input.size(1), per_group = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  if (kh <= 0 || kw <= 0) {
    bad(op, "weight has sizes " + sizes_str(weight) + "; expected [Cout, Cin / groups, kh, kw] with kh, kw > 0");
  }
  // (A weight.sizes[1] that does not divide Cin is detops' to report: no groups fit it.)
  if (per_group > 0 && cin % per_group == 0 && groups * per_group != cin) {
    bad(op, "groups is " + std::to_string(groups) + "; expected Cin / weight.sizes[1] = " + std::to_string(cin) +
                " / " + std::to_string(per_group));
  }
  if (offset_groups * 2 * kh * kw != offset.size(1)) {
    bad(op, "offset_groups is " + std::to_string(offset_groups) + "; expected offset.sizes[1] / (2 * kh * kw) = " +
                std::to_string(offset.size(1)) + " / " + std::to_string(2 * kh * kw));
  }
  // a * b + c without signed overflow (the core's checked_affine; its messages, too): the options
  // come from Python as any int64, and a wrapped size would pass the checks below.
  const auto affine = [](int64_t a, int64_t b, int64_t c, int64_t* out) {
    int64_t product = 0;
    return !__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(product, c, out);
  };
  int64_t span_h = 0, span_w = 0, eff_h = 0, eff_w = 0;
  if (!affine(2, o.pad_h, input.size(2), &span_h) || !affine(2, o.pad_w, input.size(3), &span_w)) {
    bad(op, "padding is " + pair_str(o.pad_h, o.pad_w) + " for input sizes " + sizes_str(input) +
                "; H + 2 * pad_h and W + 2 * pad_w must fit in int64; expected a padded input below 2^63");
  }
  if (!affine(o.dilation_h, kh - 1, 1, &eff_h) || !affine(o.dilation_w, kw - 1, 1, &eff_w)) {
    bad(op, "dilation is " + pair_str(o.dilation_h, o.dilation_w) + " for a " + std::to_string(kh) + "x" +
                std::to_string(kw) + " kernel (weight sizes " + sizes_str(weight) +
                "); dilation * (k - 1) + 1 must fit in int64; expected a dilated kernel below 2^63");
  }
  if (span_h < eff_h || span_w < eff_w) {
    bad(op, "input has sizes " + sizes_str(input) + "; with padding " + pair_str(o.pad_h, o.pad_w) +
                " it is smaller than the dilated kernel " + pair_str(eff_h, eff_w) + ": no output position");
  }
  return {input.size(0), weight.size(0), (span_h - eff_h) / o.stride_h + 1, (span_w - eff_w) / o.stride_w + 1};
}

// The gradients asked for; the others are undefined (None in Python) and detops gets empty views.
Grads5 gradients_like(const char* op, const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                      const Tensor& offset, const Tensor& mask, const DeformConv2dOptions& o, int64_t groups,
                      int64_t offset_groups, bool input_grad, bool weight_grad, bool offset_grad, bool mask_grad,
                      bool bias_grad) {
  require_dim(op, "grad_output", grad_output, 4, "[N, Cout, Ho, Wo]");
  output_sizes(op, input, weight, offset, mask, o, groups, offset_groups);
  if (mask_grad && !mask.defined()) bad(op, "mask_grad is True but there is no mask; expected mask_grad=False");
  return std::make_tuple(
      input_grad ? empty_like_format(input) : undefined(), weight_grad ? empty_like_format(weight) : undefined(),
      offset_grad ? empty_like_format(offset) : undefined(), mask_grad ? empty_like_format(mask) : undefined(),
      bias_grad ? empty_on(weight, {weight.size(0)}) : undefined());
}

// ---- CPU and CUDA: one kernel each, detops picks its backend from the tensors' device --------

Tensor deform_conv2d_kernel(const Tensor& input, const Tensor& weight, const Tensor& offset,
                            const Optional<Tensor>& mask, const Optional<Tensor>& bias, int64_t stride_h,
                            int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                            int64_t groups, int64_t offset_groups, bool use_mask, Str mode, Str border_rule) {
  return guarded([&] {
    // a bad mode or rule fails now, not in the backward
    parse_backward_mode(kForward, mode, kDeformConv2dCapabilities);
    parse_border_rule(kForward, border_rule);
    const DeformConv2dOptions options =
        make_options(kForward, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w);
    const Tensor m = mask_used(kForward, mask, use_mask);
    DeviceGuard guard(input);
    Tensor output = empty_on(input, output_sizes(kForward, input, weight, offset, m, options, groups, offset_groups),
                              kNone, is_channels_last(input));
    // Workspace (the columns) comes from torch's allocator through the context.
    deform_conv2d_forward(view(input, "input"), view(weight, "weight"),
                          view(offset, "offset"), view(m, "mask"),
                          view(value_or_undefined(bias), "bias"), view(output, "output"),
                          options, context(input));
    return output;
  });
}

Grads5 deform_conv2d_backward_kernel(const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                                     const Tensor& offset, const Optional<Tensor>& mask, int64_t stride_h,
                                     int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                                     int64_t dilation_w, int64_t groups, int64_t offset_groups, Str mode,
                                     Str border_rule, bool input_grad, bool weight_grad, bool offset_grad,
                                     bool mask_grad, bool bias_grad) {
  return guarded([&] {
    DeformConv2dBackwardOptions backward;
    backward.mode = parse_backward_mode(kBackward, mode, kDeformConv2dCapabilities);
    backward.border_rule = parse_border_rule(kBackward, border_rule);
    const DeformConv2dOptions options =
        make_options(kBackward, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w);
    const Tensor m = value_or_undefined(mask);
    DeviceGuard guard(grad_output);
    if (backward.mode == BackwardMode::kAtomic && input_grad && is_cuda(grad_output)) {
      // grad_input's scatter is the one part whose bits change from run to run (the other
      // gradients have one writer each, in a fixed order, in either mode).
      alert_not_deterministic("detops::deform_conv2d backward with backward_mode='atomic' on CUDA");
    }
    Grads5 grads = gradients_like(kBackward, grad_output, input, weight, offset, m, options, groups, offset_groups,
                                  input_grad, weight_grad, offset_grad, mask_grad, bias_grad);
    DeformConv2dGrads g;
    g.grad_input = view(std::get<0>(grads), "grad_input");
    g.grad_weight = view(std::get<1>(grads), "grad_weight");
    g.grad_offset = view(std::get<2>(grads), "grad_offset");
    g.grad_mask = view(std::get<3>(grads), "grad_mask");
    g.grad_bias = view(std::get<4>(grads), "grad_bias");
    // Workspace (columns, their gradient, the exact mode's records) from torch's allocator.
    deform_conv2d_backward(view(grad_output, "grad_output"), view(input, "input"),
                           view(weight, "weight"), view(offset, "offset"),
                           view(m, "mask"), g, options, backward, context(grad_output));
    return grads;
  });
}

#if !DETOPS_TORCH_STABLE
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// ---- Autograd ----------------------------------------------------------------------------------
// As grid_sample.cpp: the forward runs the op below the autograd key, the backward calls the
// backward op through the dispatcher, whose own autograd kernel refuses to be differentiated
// again. Gradients: input, weight, offset, mask and bias, each only when autograd needs it.
// An absent mask or bias reaches the Function as c10::nullopt (the Function records every defined
// tensor argument's device, so an undefined tensor cannot pass); needs_input_grad then counts only
// the tensors present.

std::string str(Str s) { return std::string(s.data(), s.size()); }

Optional<Tensor> as_optional(const at::Tensor& t) { return t.defined() ? Optional<Tensor>(t) : c10::nullopt; }

at::Tensor call_deform_conv2d(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
                              const Optional<Tensor>& mask, const Optional<Tensor>& bias, int64_t stride_h,
                              int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                              int64_t groups, int64_t offset_groups, Str mode, Str border_rule) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::deform_conv2d", "")
                       .typed<decltype(deform_conv2d_kernel)>();
  return op.call(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups,
                 offset_groups, mask.has_value(), mode, border_rule);
}

Grads5 call_backward(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                     const at::Tensor& offset, const Optional<Tensor>& mask, int64_t stride_h, int64_t stride_w,
                     int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
                     int64_t offset_groups, Str mode, Str border_rule, bool input_grad, bool weight_grad,
                     bool offset_grad, bool mask_grad, bool bias_grad) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_deform_conv2d_backward", "")
                       .typed<decltype(deform_conv2d_backward_kernel)>();
  return op.call(grad_output, input, weight, offset, mask, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                 groups, offset_groups, mode, border_rule, input_grad, weight_grad, offset_grad, mask_grad,
                 bias_grad);
}

// The integer options, saved and restored in this order.
constexpr const char* kIntOptions[] = {"stride_h",   "stride_w",   "pad_h",  "pad_w",
                                       "dilation_h", "dilation_w", "groups", "offset_groups"};

class DeformConv2dFunction : public ::torch::autograd::Function<DeformConv2dFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                               const at::Tensor& offset, const Optional<Tensor>& mask,
                               const Optional<Tensor>& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                               int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
                               int64_t offset_groups, Str mode, Str border_rule) {
    const int64_t ints[] = {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups};
    for (size_t i = 0; i < 8; ++i) ctx->saved_data[kIntOptions[i]] = ints[i];
    ctx->saved_data["mode"] = str(mode);
    ctx->saved_data["border_rule"] = str(border_rule);
    ctx->saved_data["has_mask"] = mask.has_value();
    ctx->saved_data["has_bias"] = bias.has_value();
    // The bias is not needed by the backward (its gradient sums grad_output).
    ctx->save_for_backward({input, weight, offset, mask.has_value() ? *mask : at::Tensor()});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_deform_conv2d(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                               dilation_w, groups, offset_groups, mode, border_rule)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto s = ctx->get_saved_variables();
    int64_t v[8];
    for (size_t i = 0; i < 8; ++i) v[i] = ctx->saved_data[kIntOptions[i]].toInt();
    const std::string mode = ctx->saved_data["mode"].toStringRef();
    const std::string border_rule = ctx->saved_data["border_rule"].toStringRef();
    const bool has_mask = ctx->saved_data["has_mask"].toBool();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    // needs_input_grad indexes the tensors present: 0 input, 1 weight, 2 offset, then the mask (if
    // any) and the bias (if any).
    const size_t bias_index = has_mask ? 4 : 3;
    Grads5 g = call_backward(grad_output[0], s[0], s[1], s[2], has_mask ? Optional<Tensor>(s[3]) : c10::nullopt,
                             v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], mode, border_rule,
                             ctx->needs_input_grad(0),
                             ctx->needs_input_grad(1), ctx->needs_input_grad(2), has_mask && ctx->needs_input_grad(3),
                             has_bias && ctx->needs_input_grad(bias_index));
    // One entry per forward argument: the five tensors (undefined for an absent one), then the
    // ten options (no gradient).
    variable_list out = {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g), std::get<4>(g)};
    out.resize(5 + 10);
    return out;
  }
};

// The backward op's autograd: computed below autograd, refused if differentiated again. A custom
// Function's outputs must be defined, so only the gradients asked for pass through it.
class DeformConv2dBackwardFunction : public ::torch::autograd::Function<DeformConv2dBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_output, const at::Tensor& input,
                               const at::Tensor& weight, const at::Tensor& offset, const Optional<Tensor>& mask,
                               int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                               int64_t dilation_w, int64_t groups, int64_t offset_groups, Str mode,
                               Str border_rule, bool input_grad, bool weight_grad, bool offset_grad, bool mask_grad,
                               bool bias_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Grads5 g = call_backward(grad_output, input, weight, offset, mask, stride_h, stride_w, pad_h, pad_w, dilation_h,
                             dilation_w, groups, offset_groups, mode, border_rule, input_grad, weight_grad,
                             offset_grad, mask_grad, bias_grad);
    variable_list defined;
    for (const at::Tensor& t : {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g), std::get<4>(g)}) {
      if (t.defined()) defined.push_back(t);
    }
    return defined;
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "detops::deform_conv2d: double backward is not supported");
    throw std::logic_error("unreachable");
  }
};

at::Tensor deform_conv2d_autograd(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
                                  const Optional<Tensor>& mask, const Optional<Tensor>& bias, int64_t stride_h,
                                  int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                                  int64_t dilation_w, int64_t groups, int64_t offset_groups, bool use_mask,
                                  Str mode, Str border_rule) {
  // use_mask=True without a mask is a ValueError here already (the kernels below would say the same).
  const at::Tensor m = guarded([&] { return mask_used(kForward, mask, use_mask); });
  const at::Tensor b = value_or_undefined(bias);
  return DeformConv2dFunction::apply(input, weight, offset, as_optional(m), as_optional(b), stride_h, stride_w, pad_h,
                                     pad_w, dilation_h, dilation_w, groups, offset_groups, mode, border_rule)[0];
}

Grads5 deform_conv2d_backward_autograd(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                                       const at::Tensor& offset, const Optional<Tensor>& mask, int64_t stride_h,
                                       int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                                       int64_t dilation_w, int64_t groups, int64_t offset_groups, Str mode,
                                       Str border_rule, bool input_grad, bool weight_grad, bool offset_grad,
                                       bool mask_grad, bool bias_grad) {
  auto r = DeformConv2dBackwardFunction::apply(
      grad_output, input, weight, offset, as_optional(value_or_undefined(mask)), stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, groups, offset_groups, mode, border_rule, input_grad, weight_grad, offset_grad,
      mask_grad, bias_grad);
  size_t next = 0;
  auto take = [&](bool needed) { return needed ? r.at(next++) : at::Tensor(); };
  at::Tensor gi = take(input_grad);
  at::Tensor gw = take(weight_grad);
  at::Tensor go = take(offset_grad);
  at::Tensor gm = take(mask_grad);
  at::Tensor gb = take(bias_grad);
  return std::make_tuple(gi, gw, go, gm, gb);
}

#endif  // !DETOPS_TORCH_STABLE

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

DETOPS_LIBRARY_FRAGMENT(m) {
  // Deformable convolution (v1; v2 with a mask): torchvision::deform_conv2d's schema and order
  // (groups and offset_groups are redundant with the shapes and must agree with them; mask and
  // bias may also be None), then the backward mode and the offset gradient's border rule
  // ("torchvision", or "mmcv": also detectron2's). The backward op as grid_sample's: the
  // gradients asked for, None for the others (no bias argument: its gradient sums grad_output).
  m.def("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor? mask, Tensor? bias, int stride_h, "
        "int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, int offset_groups, "
        "bool use_mask, str backward_mode=\"exact\", str border_rule=\"torchvision\") -> Tensor");
  m.def("_deform_conv2d_backward(Tensor grad_output, Tensor input, Tensor weight, Tensor offset, Tensor? mask, "
        "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, "
        "int offset_groups, str backward_mode, str border_rule, bool input_grad, bool weight_grad, bool offset_grad, "
        "bool mask_grad, bool bias_grad) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_offset, Tensor grad_mask, "
        "Tensor grad_bias)");
}

namespace {
template <class Library>
void kernels(Library& m) {
  m.impl("deform_conv2d", DETOPS_KERNEL(ops::deform_conv2d_kernel));
  m.impl("_deform_conv2d_backward", DETOPS_KERNEL(ops::deform_conv2d_backward_kernel));
}
}  // namespace

DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels)

#if !DETOPS_TORCH_STABLE
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  m.impl("deform_conv2d", TORCH_FN(ops::deform_conv2d_autograd));
  m.impl("_deform_conv2d_backward", TORCH_FN(ops::deform_conv2d_backward_autograd));
}
#endif
