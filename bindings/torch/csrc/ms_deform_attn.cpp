// Multi-scale deformable attention kernels of torch.ops.detops: ms_deform_attn and its backward op
// on the CPU, CUDA (when built with it) and their schemas; the classic layer's C++ autograd functions.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

constexpr const char* kForward = "detops::ms_deform_attn";
constexpr const char* kBackward = "detops::_ms_deform_attn_backward";

// Outputs are shaped from these ranks: checked here (torch would fail on size(3) first),
// everything else by detops.
void require_ranks(const char* op, const Tensor& value, const Tensor& sampling_locations,
                   const Tensor& attention_weights) {
  require_dim(op, "value", value, 4, "[B, S, M, D]");
  require_dim(op, "sampling_locations", sampling_locations, 6, "[B, Q, M, L, P, 2]");
  require_dim(op, "attention_weights", attention_weights, 5, "[B, Q, M, L, P]");
}

// [B, Q, M*D] from value [B, S, M, D] and sampling_locations [B, Q, M, L, P, 2].
std::vector<int64_t> output_sizes(const char* op, const Tensor& value, const Tensor& sampling_locations,
                                  const Tensor& attention_weights) {
  require_ranks(op, value, sampling_locations, attention_weights);
  require_float(op, "value", value);
  return {value.size(0), sampling_locations.size(1), value.size(2) * value.size(3)};
}

// The gradients asked for, each like its input; the others are undefined (None in Python) and
// detops gets empty views.
std::tuple<Tensor, Tensor, Tensor> gradients_like(const char* op, const Tensor& grad_output,
                                                  const Tensor& value,
                                                  const Tensor& sampling_locations,
                                                  const Tensor& attention_weights, bool value_grad,
                                                  bool locations_grad, bool weights_grad) {
  require_dim(op, "grad_output", grad_output, 3, "[B, Q, M*D]");
  require_ranks(op, value, sampling_locations, attention_weights);
  auto like = [](const Tensor& t, bool needed) {
    return needed ? empty_on(t, sizes_of(t)) : undefined();
  };
  return std::make_tuple(like(value, value_grad), like(sampling_locations, locations_grad),
                         like(attention_weights, weights_grad));
}

// ---- CPU and CUDA: one kernel each, detops picks its backend from the tensors' device --------
// spatial_shapes and level_start_index may be host tensors in a CUDA call (detops reads them on
// the host either way); the dispatcher then picks the CUDA kernel from the other arguments.

Tensor ms_deform_attn_kernel(const Tensor& value, const Tensor& spatial_shapes,
                             const Tensor& level_start_index, const Tensor& sampling_locations,
                             const Tensor& attention_weights, Str mode) {
  return guarded([&] {
    parse_backward_mode(kForward, mode, kMsDeformAttnCapabilities);
    DeviceGuard guard(value);
    Tensor output =
        empty_on(value, output_sizes(kForward, value, sampling_locations, attention_weights));
    ms_deform_attn_forward(view(value, "value"), view(spatial_shapes, "spatial_shapes"),
                           view(level_start_index, "level_start_index"),
                           view(sampling_locations, "sampling_locations"),
                           view(attention_weights, "attention_weights"),
                           view(output, "output"), context(value));
    return output;
  });
}

std::tuple<Tensor, Tensor, Tensor> ms_deform_attn_backward_kernel(
    const Tensor& grad_output, const Tensor& value, const Tensor& spatial_shapes,
    const Tensor& level_start_index, const Tensor& sampling_locations, const Tensor& attention_weights,
    Str mode, bool value_grad, bool locations_grad, bool weights_grad) {
  return guarded([&] {
    MsDeformAttnBackwardOptions backward;
    backward.mode = parse_backward_mode(kBackward, mode, kMsDeformAttnCapabilities);
    DeviceGuard guard(grad_output);
    if (backward.mode == BackwardMode::kAtomic && value_grad && is_cuda(grad_output)) {
      // grad_value's scatter is the one part whose bits change from run to run (the location and
      // weight gradients have one writer each in either mode).
      alert_not_deterministic("detops::ms_deform_attn backward with backward_mode='atomic' on CUDA");
    }
    auto grads = gradients_like(kBackward, grad_output, value, sampling_locations, attention_weights, value_grad,
                                locations_grad, weights_grad);
    // Workspace (exact mode) comes from torch's allocator through the context.
    ms_deform_attn_backward(view(value, "value"), view(spatial_shapes, "spatial_shapes"),
                            view(level_start_index, "level_start_index"),
                            view(sampling_locations, "sampling_locations"),
                            view(attention_weights, "attention_weights"),
                            view(grad_output, "grad_output"),
                            view(std::get<0>(grads), "grad_value"),
                            view(std::get<1>(grads), "grad_sampling_locations"),
                            view(std::get<2>(grads), "grad_attention_weights"), backward,
                            context(grad_output));
    return grads;
  });
}

#if !DETOPS_TORCH_STABLE
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// ---- Autograd ----------------------------------------------------------------------------------
// As roi_align.cpp: the forward runs the op below the autograd key, the backward calls the
// backward op through the dispatcher, whose own autograd kernel refuses to be differentiated
// again. Gradients: value, sampling_locations and attention_weights, each only when autograd
// needs it (the level tables are integers).

std::string str(Str s) { return std::string(s.data(), s.size()); }

at::Tensor call_ms_deform_attn(const at::Tensor& value, const at::Tensor& spatial_shapes,
                               const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                               const at::Tensor& attention_weights, Str mode) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::ms_deform_attn", "")
                       .typed<decltype(ms_deform_attn_kernel)>();
  return op.call(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, mode);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_output, const at::Tensor& value,
                                                             const at::Tensor& spatial_shapes,
                                                             const at::Tensor& level_start_index,
                                                             const at::Tensor& sampling_locations,
                                                             const at::Tensor& attention_weights, Str mode,
                                                             bool value_grad, bool locations_grad,
                                                             bool weights_grad) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_ms_deform_attn_backward", "")
                       .typed<decltype(ms_deform_attn_backward_kernel)>();
  return op.call(grad_output, value, spatial_shapes, level_start_index, sampling_locations, attention_weights, mode,
                 value_grad, locations_grad, weights_grad);
}

class MsDeformAttnFunction : public ::torch::autograd::Function<MsDeformAttnFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& value, const at::Tensor& spatial_shapes,
                               const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                               const at::Tensor& attention_weights, Str mode) {
    ctx->saved_data["mode"] = str(mode);
    ctx->save_for_backward({value, spatial_shapes, level_start_index, sampling_locations, attention_weights});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                mode)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto s = ctx->get_saved_variables();
    const std::string mode = ctx->saved_data["mode"].toStringRef();
    // needs_input_grad indexes the tensor arguments: 0 value, 3 sampling_locations,
    // 4 attention_weights.
    auto grads = call_backward(grad_output[0], s[0], s[1], s[2], s[3], s[4], mode, ctx->needs_input_grad(0),
                               ctx->needs_input_grad(3), ctx->needs_input_grad(4));
    return {std::get<0>(grads), at::Tensor(), at::Tensor(), std::get<1>(grads), std::get<2>(grads), at::Tensor()};
  }
};

// The backward op's autograd: computed below autograd, refused if differentiated again. A custom
// Function's outputs must be defined, so only the gradients asked for pass through it.
class MsDeformAttnBackwardFunction : public ::torch::autograd::Function<MsDeformAttnBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_output, const at::Tensor& value,
                               const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                               const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
                               Str mode, bool value_grad, bool locations_grad, bool weights_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto grads = call_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                               attention_weights, mode, value_grad, locations_grad, weights_grad);
    variable_list defined;
    for (const at::Tensor& g : {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)}) {
      if (g.defined()) defined.push_back(g);
    }
    return defined;
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "detops::ms_deform_attn: double backward is not supported");
    throw std::logic_error("unreachable");
  }
};

at::Tensor ms_deform_attn_autograd(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                   const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                                   const at::Tensor& attention_weights, Str mode) {
  return MsDeformAttnFunction::apply(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                     mode)[0];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward_autograd(
    const at::Tensor& grad_output, const at::Tensor& value, const at::Tensor& spatial_shapes,
    const at::Tensor& level_start_index, const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
    Str mode, bool value_grad, bool locations_grad, bool weights_grad) {
  auto r = MsDeformAttnBackwardFunction::apply(grad_output, value, spatial_shapes, level_start_index,
                                               sampling_locations, attention_weights, mode, value_grad,
                                               locations_grad, weights_grad);
  size_t next = 0;
  at::Tensor grad_value = value_grad ? r.at(next++) : at::Tensor();
  at::Tensor grad_locations = locations_grad ? r.at(next++) : at::Tensor();
  at::Tensor grad_weights = weights_grad ? r.at(next++) : at::Tensor();
  return std::make_tuple(grad_value, grad_locations, grad_weights);
}

#endif  // !DETOPS_TORCH_STABLE

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

DETOPS_LIBRARY_FRAGMENT(m) {
  // Multi-scale deformable attention: the argument order of Deformable-DETR's and mmcv's
  // ms_deform_attn_forward (without im2col_step), then the backward mode; the backward op as
  // grid_sample's (value_grad, locations_grad, weights_grad).
  m.def("ms_deform_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
        "Tensor sampling_locations, Tensor attention_weights, str backward_mode=\"exact\") -> Tensor");
  m.def("_ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, "
        "Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights, str backward_mode, "
        "bool value_grad, bool locations_grad, bool weights_grad) "
        "-> (Tensor grad_value, Tensor grad_sampling_locations, Tensor grad_attention_weights)");
}

namespace {
template <class Library>
void kernels(Library& m) {
  m.impl("ms_deform_attn", DETOPS_KERNEL(ops::ms_deform_attn_kernel));
  m.impl("_ms_deform_attn_backward", DETOPS_KERNEL(ops::ms_deform_attn_backward_kernel));
}
}  // namespace

DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels)

#if !DETOPS_TORCH_STABLE
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  m.impl("ms_deform_attn", TORCH_FN(ops::ms_deform_attn_autograd));
  m.impl("_ms_deform_attn_backward", TORCH_FN(ops::ms_deform_attn_backward_autograd));
}
#endif
