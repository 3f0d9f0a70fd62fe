// FrozenBatchNorm2d kernels of torch.ops.detops: the fold, the forward with its epilogues and the
// backward, on the CPU, CUDA (when built with it) and their schemas; the classic layer's C++ autograd function.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

constexpr const char* kFold = "detops::frozen_batch_norm_fold";
constexpr const char* kForward = "detops::frozen_batch_norm";
constexpr const char* kBackward = "detops::_frozen_batch_norm_backward";

// detops folds float64 buffers into float64 scale/shift and everything else into float32.
Tensor fold_output_like(const Tensor& weight) {
  require_dim(kFold, "weight", weight, 1, "[C]");
  const DType dtype = view(weight, "weight").dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  return empty_on(weight, {weight.size(0)}, dtype);
}

// A residual is given iff the epilogue is add_relu (detops checks it too, but the output is
// allocated first: an early, clear error costs nothing).
void check_residual(FrozenBnEpilogue epilogue, const Optional<Tensor>& residual) {
  const bool has = has_tensor(residual);
  if (epilogue == FrozenBnEpilogue::kAddRelu && !has) {
    throw Error(ErrorCode::kInvalidArgument, std::string(kForward) + ": residual is None; expected a tensor of x's "
                                                                     "shape with epilogue 'add_relu'");
  }
  if (epilogue != FrozenBnEpilogue::kAddRelu && has) {
    throw Error(ErrorCode::kInvalidArgument, std::string(kForward) + ": residual is given with epilogue other than "
                                                                     "'add_relu'; expected None");
  }
}

std::tuple<Tensor, Tensor> fold_kernel(const Tensor& weight, const Tensor& bias,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       double eps) {
  return guarded([&] {
    DeviceGuard guard(weight);
    Tensor scale = fold_output_like(weight);
    Tensor shift = empty_on(scale, sizes_of(scale));
    BatchNormState state;
    state.weight = view(weight, "weight");
    state.bias = view(bias, "bias");
    state.running_mean = view(running_mean, "running_mean");
    state.running_var = view(running_var, "running_var");
    state.eps = eps;
    frozen_batch_norm_fold(state, view(scale, "scale"), view(shift, "shift"),
                           context(weight));
    return std::make_tuple(scale, shift);
  });
}

Tensor forward_kernel(const Tensor& x, const Tensor& scale, const Tensor& shift,
                      Str epilogue, const Optional<Tensor>& residual) {
  return guarded([&] {
    const FrozenBnEpilogue e = parse_epilogue(kForward, epilogue);
    check_residual(e, residual);
    DeviceGuard guard(x);
    require_dim(kForward, "x", x, 4, "[N, C, H, W]");
    require_float(kForward, "x", x);
    Tensor y = empty_like_format(x);  // x's memory format (channels_last stays channels_last)
    frozen_batch_norm_forward(view(x, "x"), view(scale, "scale"),
                              view(shift, "shift"), view(y, "y"), e,
                              view(value_or_undefined(residual), "residual"),
                              context(x));
    return y;
  });
}

// grad_residual is undefined (None in Python) unless the epilogue is add_relu.
std::tuple<Tensor, Tensor> backward_kernel(const Tensor& grad_y, const Tensor& scale,
                                           Str epilogue, const Optional<Tensor>& y) {
  return guarded([&] {
    const FrozenBnEpilogue e = parse_epilogue(kBackward, epilogue);
    DeviceGuard guard(grad_y);
    require_dim(kBackward, "grad_y", grad_y, 4, "[N, C, H, W]");
    Tensor grad_x = empty_like_format(grad_y);
    Tensor grad_residual = e == FrozenBnEpilogue::kAddRelu ? empty_like_format(grad_y) : undefined();
    frozen_batch_norm_backward(view(grad_y, "grad_y"), view(scale, "scale"),
                               view(grad_x, "grad_x"), e,
                               view(value_or_undefined(y), "y"),
                               view(grad_residual, "grad_residual"), context(grad_y));
    return std::make_tuple(grad_x, grad_residual);
  });
}

#if !DETOPS_TORCH_STABLE
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// ---- Autograd ------------------------------------------------------------------------------

at::Tensor call_forward(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, Str epilogue,
                        const Optional<Tensor>& residual) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::frozen_batch_norm", "")
                       .typed<decltype(forward_kernel)>();
  return op.call(x, scale, shift, epilogue, residual);
}

std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_y, const at::Tensor& scale,
                                                 Str epilogue, const Optional<Tensor>& y) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_frozen_batch_norm_backward", "")
                       .typed<decltype(backward_kernel)>();
  return op.call(grad_y, scale, epilogue, y);
}

class FrozenBatchNormFunction : public ::torch::autograd::Function<FrozenBatchNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& shift, Str epilogue, const Optional<Tensor>& residual) {
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
    Optional<Tensor> y;
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
                               Str epilogue, const Optional<Tensor>& y) {
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
                            Str epilogue, const Optional<Tensor>& residual) {
  return guarded([&] {
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
                                                     Str epilogue, const Optional<Tensor>& y) {
  auto r = FrozenBatchNormBackwardFunction::apply(grad_y, scale, epilogue, y);
  return std::make_tuple(r[0], r.size() > 1 ? r[1] : at::Tensor());
}

#endif  // !DETOPS_TORCH_STABLE

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

DETOPS_LIBRARY_FRAGMENT(m) {
  // FrozenBatchNorm2d.
  m.def("frozen_batch_norm_fold(Tensor weight, Tensor bias, Tensor running_mean, Tensor running_var, "
        "float eps) -> (Tensor scale, Tensor shift)");
  m.def("frozen_batch_norm(Tensor x, Tensor scale, Tensor shift, str epilogue=\"none\", "
        "Tensor? residual=None) -> Tensor");
  m.def("_frozen_batch_norm_backward(Tensor grad_y, Tensor scale, str epilogue, Tensor? y) "
        "-> (Tensor grad_x, Tensor grad_residual)");
}

namespace {
template <class Library>
void kernels(Library& m) {
  m.impl("frozen_batch_norm_fold", DETOPS_KERNEL(ops::fold_kernel));
  m.impl("frozen_batch_norm", DETOPS_KERNEL(ops::forward_kernel));
  m.impl("_frozen_batch_norm_backward", DETOPS_KERNEL(ops::backward_kernel));
}
}  // namespace

DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels)

#if !DETOPS_TORCH_STABLE
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  // The fold is a one-time conversion of frozen buffers: no gradient, autograd passes through
  // (and meta tensors reach the Meta kernel, which torch 1.13 would otherwise refuse).
  m.impl("frozen_batch_norm_fold", ::torch::CppFunction::makeFallthrough());
  m.impl("frozen_batch_norm", TORCH_FN(ops::forward_autograd));
  m.impl("_frozen_batch_norm_backward", TORCH_FN(ops::backward_autograd));
}
#endif
