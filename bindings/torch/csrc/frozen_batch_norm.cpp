// FrozenBatchNorm2d kernels of torch.ops.detops: the fold, the forward with its epilogues and the
// backward, on the CPU, CUDA (when built with it) and Meta keys, and the C++ autograd function.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

constexpr const char* kFold = "detops::frozen_batch_norm_fold";
constexpr const char* kForward = "detops::frozen_batch_norm";
constexpr const char* kBackward = "detops::_frozen_batch_norm_backward";

// detops folds float64 buffers into float64 scale/shift and everything else into float32.
at::Tensor fold_output_like(const at::Tensor& weight) {
  require_dim(kFold, "weight", weight, 1, "[C]");
  const auto dtype = weight.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::empty({weight.size(0)}, weight.options().dtype(dtype));
}

// A residual is given iff the epilogue is add_relu (detops checks it too, but the output is
// allocated first: an early, clear error costs nothing).
void check_residual(FrozenBnEpilogue epilogue, const optional<at::Tensor>& residual) {
  const bool has = residual.has_value() && residual->defined();
  if (epilogue == FrozenBnEpilogue::kAddRelu && !has) {
    throw Error(ErrorCode::kInvalidArgument, std::string(kForward) + ": residual is None; expected a tensor of x's "
                                                                     "shape with epilogue 'add_relu'");
  }
  if (epilogue != FrozenBnEpilogue::kAddRelu && has) {
    throw Error(ErrorCode::kInvalidArgument, std::string(kForward) + ": residual is given with epilogue other than "
                                                                     "'add_relu'; expected None");
  }
}

std::tuple<at::Tensor, at::Tensor> fold_kernel(const at::Tensor& weight, const at::Tensor& bias,
                                               const at::Tensor& running_mean, const at::Tensor& running_var,
                                               double eps) {
  return detops::torch::guarded([&] {
    c10::DeviceGuard guard(weight.device());
    at::Tensor scale = fold_output_like(weight);
    at::Tensor shift = at::empty_like(scale);
    BatchNormState state;
    state.weight = detops::torch::view(weight, "weight");
    state.bias = detops::torch::view(bias, "bias");
    state.running_mean = detops::torch::view(running_mean, "running_mean");
    state.running_var = detops::torch::view(running_var, "running_var");
    state.eps = eps;
    frozen_batch_norm_fold(state, detops::torch::view(scale, "scale"), detops::torch::view(shift, "shift"),
                           detops::torch::context(weight));
    return std::make_tuple(scale, shift);
  });
}

at::Tensor forward_kernel(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                          string_view epilogue, const optional<at::Tensor>& residual) {
  return detops::torch::guarded([&] {
    const FrozenBnEpilogue e = parse_epilogue(kForward, epilogue);
    check_residual(e, residual);
    c10::DeviceGuard guard(x.device());
    require_dim(kForward, "x", x, 4, "[N, C, H, W]");
    at::Tensor y = at::empty_like(x);  // x's memory format (channels_last stays channels_last)
    frozen_batch_norm_forward(detops::torch::view(x, "x"), detops::torch::view(scale, "scale"),
                              detops::torch::view(shift, "shift"), detops::torch::view(y, "y"), e,
                              detops::torch::view(value_or_undefined(residual), "residual"),
                              detops::torch::context(x));
    return y;
  });
}

// grad_residual is undefined (None in Python) unless the epilogue is add_relu.
std::tuple<at::Tensor, at::Tensor> backward_kernel(const at::Tensor& grad_y, const at::Tensor& scale,
                                                   string_view epilogue, const optional<at::Tensor>& y) {
  return detops::torch::guarded([&] {
    const FrozenBnEpilogue e = parse_epilogue(kBackward, epilogue);
    c10::DeviceGuard guard(grad_y.device());
    require_dim(kBackward, "grad_y", grad_y, 4, "[N, C, H, W]");
    at::Tensor grad_x = at::empty_like(grad_y);
    at::Tensor grad_residual = e == FrozenBnEpilogue::kAddRelu ? at::empty_like(grad_y) : at::Tensor();
    frozen_batch_norm_backward(detops::torch::view(grad_y, "grad_y"), detops::torch::view(scale, "scale"),
                               detops::torch::view(grad_x, "grad_x"), e,
                               detops::torch::view(value_or_undefined(y), "y"),
                               detops::torch::view(grad_residual, "grad_residual"), detops::torch::context(grad_y));
    return std::make_tuple(grad_x, grad_residual);
  });
}

// ---- Meta ----------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> fold_meta(const at::Tensor& weight, const at::Tensor& bias,
                                             const at::Tensor& running_mean, const at::Tensor& running_var, double) {
  return detops::torch::guarded([&] {
    require_meta(kFold, {{"weight", &weight}, {"bias", &bias}, {"running_mean", &running_mean},
                         {"running_var", &running_var}});
    at::Tensor scale = fold_output_like(weight);
    return std::make_tuple(scale, at::empty_like(scale));
  });
}

at::Tensor forward_meta(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, string_view epilogue,
                        const optional<at::Tensor>& residual) {
  return detops::torch::guarded([&] {
    const at::Tensor r = value_or_undefined(residual);
    require_meta(kForward, {{"x", &x}, {"scale", &scale}, {"shift", &shift}, {"residual", &r}});
    check_residual(parse_epilogue(kForward, epilogue), residual);
    require_dim(kForward, "x", x, 4, "[N, C, H, W]");
    return at::empty_like(x);
  });
}

std::tuple<at::Tensor, at::Tensor> backward_meta(const at::Tensor& grad_y, const at::Tensor& scale,
                                                 string_view epilogue, const optional<at::Tensor>& y) {
  return detops::torch::guarded([&] {
    const at::Tensor yv = value_or_undefined(y);
    require_meta(kBackward, {{"grad_y", &grad_y}, {"scale", &scale}, {"y", &yv}});
    const FrozenBnEpilogue e = parse_epilogue(kBackward, epilogue);
    require_dim(kBackward, "grad_y", grad_y, 4, "[N, C, H, W]");
    return std::make_tuple(at::empty_like(grad_y),
                           e == FrozenBnEpilogue::kAddRelu ? at::empty_like(grad_y) : at::Tensor());
  });
}

// ---- Autograd ------------------------------------------------------------------------------

at::Tensor call_forward(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, string_view epilogue,
                        const optional<at::Tensor>& residual) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::frozen_batch_norm", "")
                       .typed<decltype(forward_kernel)>();
  return op.call(x, scale, shift, epilogue, residual);
}

std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_y, const at::Tensor& scale,
                                                 string_view epilogue, const optional<at::Tensor>& y) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_frozen_batch_norm_backward", "")
                       .typed<decltype(backward_kernel)>();
  return op.call(grad_y, scale, epilogue, y);
}

class FrozenBatchNormFunction : public ::torch::autograd::Function<FrozenBatchNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& shift, string_view epilogue, const optional<at::Tensor>& residual) {
    const FrozenBnEpilogue e = parse_epilogue(kForward, epilogue);
    ctx->saved_data["epilogue"] = std::string(epilogue.data(), epilogue.size());
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      y = call_forward(x, scale, shift, epilogue, residual);
    }
    // The ReLU epilogues mask the gradient by y > 0: keep y (an output: saved without a copy).
    ctx->save_for_backward({scale, e == FrozenBnEpilogue::kNone ? at::Tensor() : y});
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const std::string epilogue = ctx->saved_data["epilogue"].toStringRef();
    optional<at::Tensor> y;
    if (saved[1].defined()) y = saved[1];
    // grad_y may arrive in any layout; the kernel takes any strides.
    auto grads = call_backward(grad_output[0], saved[0], epilogue, y);
    // x, scale, shift (frozen: none), epilogue, residual.
    return {std::get<0>(grads), at::Tensor(), at::Tensor(), at::Tensor(), std::get<1>(grads)};
  }
};

class FrozenBatchNormBackwardFunction : public ::torch::autograd::Function<FrozenBatchNormBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_y, const at::Tensor& scale,
                               string_view epilogue, const optional<at::Tensor>& y) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto grads = call_backward(grad_y, scale, epilogue, y);
    // A custom Function's outputs must be defined: grad_residual only when there is one.
    if (!std::get<1>(grads).defined()) return {std::get<0>(grads)};
    return {std::get<0>(grads), std::get<1>(grads)};
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "detops::frozen_batch_norm: double backward is not supported");
    throw std::logic_error("unreachable");
  }
};

at::Tensor forward_autograd(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                            string_view epilogue, const optional<at::Tensor>& residual) {
  return detops::torch::guarded([&] {
    // Frozen means frozen: a gradient asked of scale or shift would silently be None otherwise.
    for (const auto* t : {&scale, &shift}) {
      if (t->defined() && t->requires_grad()) {
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(kForward) + ": " + (t == &scale ? "scale" : "shift") +
                        " requires grad; expected a frozen buffer (FrozenBatchNorm2d has no parameter gradients: "
                        "detach it or use BatchNorm2d)");
      }
    }
    return FrozenBatchNormFunction::apply(x, scale, shift, epilogue, residual)[0];
  });
}

std::tuple<at::Tensor, at::Tensor> backward_autograd(const at::Tensor& grad_y, const at::Tensor& scale,
                                                     string_view epilogue, const optional<at::Tensor>& y) {
  auto r = FrozenBatchNormBackwardFunction::apply(grad_y, scale, epilogue, y);
  return std::make_tuple(r[0], r.size() > 1 ? r[1] : at::Tensor());
}

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

TORCH_LIBRARY_IMPL(detops, CPU, m) {
  m.impl("frozen_batch_norm_fold", TORCH_FN(ops::fold_kernel));
  m.impl("frozen_batch_norm", TORCH_FN(ops::forward_kernel));
  m.impl("_frozen_batch_norm_backward", TORCH_FN(ops::backward_kernel));
}

#if DETOPS_TORCH_CUDA
TORCH_LIBRARY_IMPL(detops, CUDA, m) {
  m.impl("frozen_batch_norm_fold", TORCH_FN(ops::fold_kernel));
  m.impl("frozen_batch_norm", TORCH_FN(ops::forward_kernel));
  m.impl("_frozen_batch_norm_backward", TORCH_FN(ops::backward_kernel));
}
#endif

TORCH_LIBRARY_IMPL(detops, Meta, m) {
  m.impl("frozen_batch_norm_fold", TORCH_FN(ops::fold_meta));
  m.impl("frozen_batch_norm", TORCH_FN(ops::forward_meta));
  m.impl("_frozen_batch_norm_backward", TORCH_FN(ops::backward_meta));
}

TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  // The fold is a one-time conversion of frozen buffers: no gradient, autograd passes through
  // (and meta tensors reach the Meta kernel, which torch 1.13 would otherwise refuse).
  m.impl("frozen_batch_norm_fold", ::torch::CppFunction::makeFallthrough());
  m.impl("frozen_batch_norm", TORCH_FN(ops::forward_autograd));
  m.impl("_frozen_batch_norm_backward", TORCH_FN(ops::backward_autograd));
}
