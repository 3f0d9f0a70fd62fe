// grid_sample kernels of torch.ops.detops: grid_sample and its backward op on the CPU, CUDA (when
// built with it) and Meta keys, and the C++ autograd functions.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

constexpr const char* kForward = "detops::grid_sample";
constexpr const char* kBackward = "detops::_grid_sample_backward";

GridSampleOptions make_options(const char* op, string_view interpolation, string_view padding_mode,
                               bool align_corners) {
  GridSampleOptions o;
  o.interpolation = parse_interpolation(op, interpolation);
  o.padding = parse_padding(op, padding_mode);
  o.align_corners = align_corners;
  return o;
}

// Outputs are shaped from these ranks: checked here (torch would fail on size(2) first), the rest
// (N, the last grid size, dtypes) by detops.
void require_ranks(const char* op, const at::Tensor& input, const at::Tensor& grid) {
  require_dim(op, "input", input, 4, "[N, C, H, W]");
  require_dim(op, "grid", grid, 4, "[N, Ho, Wo, 2]");
}

// [N, C, Ho, Wo] from input [N, C, H, W] and grid [N, Ho, Wo, 2].
std::vector<int64_t> output_sizes(const char* op, const at::Tensor& input, const at::Tensor& grid) {
  require_ranks(op, input, grid);
  return {input.size(0), input.size(1), grid.size(1), grid.size(2)};
}

// The output and grad_input take the input's memory format: detops reads and writes NHWC natively.
at::TensorOptions like_input(const at::Tensor& input) { return input.options().memory_format(format_of(input)); }

// The gradients asked for; the others are undefined (None in Python) and detops gets empty views.
std::tuple<at::Tensor, at::Tensor> gradients_like(const char* op, const at::Tensor& grad_output,
                                                  const at::Tensor& input, const at::Tensor& grid, bool input_grad,
                                                  bool grid_grad) {
  require_dim(op, "grad_output", grad_output, 4, "[N, C, Ho, Wo]");
  require_ranks(op, input, grid);
  return std::make_tuple(input_grad ? at::empty(input.sizes(), like_input(input)) : at::Tensor(),
                         grid_grad ? at::empty(grid.sizes(), grid.options()) : at::Tensor());
}

// ---- CPU and CUDA: one kernel each, detops picks its backend from the tensors' device --------

at::Tensor grid_sample_kernel(const at::Tensor& input, const at::Tensor& grid, string_view interpolation,
                              string_view padding_mode, bool align_corners, string_view mode) {
  return detops::torch::guarded([&] {
    const GridSampleOptions options = make_options(kForward, interpolation, padding_mode, align_corners);
    parse_exact_or_atomic(kForward, mode);
    c10::DeviceGuard guard(input.device());
    at::Tensor output = at::empty(output_sizes(kForward, input, grid), like_input(input));
    grid_sample_forward(detops::torch::view(input, "input"), detops::torch::view(grid, "grid"),
                        detops::torch::view(output, "output"), options, detops::torch::context(input));
    return output;
  });
}

std::tuple<at::Tensor, at::Tensor> grid_sample_backward_kernel(const at::Tensor& grad_output,
                                                               const at::Tensor& input, const at::Tensor& grid,
                                                               string_view interpolation, string_view padding_mode,
                                                               bool align_corners, string_view mode, bool input_grad,
                                                               bool grid_grad) {
  return detops::torch::guarded([&] {
    const GridSampleOptions options = make_options(kBackward, interpolation, padding_mode, align_corners);
    GridSampleBackwardOptions backward;
    backward.mode = parse_exact_or_atomic(kBackward, mode);
    c10::DeviceGuard guard(grad_output.device());
    if (backward.mode == BackwardMode::kAtomic && input_grad && grad_output.is_cuda()) {
      // grad_input's scatter is the one part whose bits change from run to run (grad_grid has one
      // writer per grid point in either mode).
      at::globalContext().alertNotDeterministic("detops::grid_sample backward with mode='atomic' on CUDA");
    }
    auto grads = gradients_like(kBackward, grad_output, input, grid, input_grad, grid_grad);
    // Workspace (exact mode) comes from torch's allocator through the context.
    grid_sample_backward(detops::torch::view(grad_output, "grad_output"), detops::torch::view(input, "input"),
                         detops::torch::view(grid, "grid"), detops::torch::view(std::get<0>(grads), "grad_input"),
                         detops::torch::view(std::get<1>(grads), "grad_grid"), options, backward,
                         detops::torch::context(grad_output));
    return grads;
  });
}

// ---- Meta: shapes, dtypes and memory formats only; options validated as in the real kernels ---

at::Tensor grid_sample_meta(const at::Tensor& input, const at::Tensor& grid, string_view interpolation,
                            string_view padding_mode, bool align_corners, string_view mode) {
  return detops::torch::guarded([&] {
    require_meta(kForward, {{"input", &input}, {"grid", &grid}});
    make_options(kForward, interpolation, padding_mode, align_corners);
    parse_exact_or_atomic(kForward, mode);
    return at::empty(output_sizes(kForward, input, grid), like_input(input));
  });
}

std::tuple<at::Tensor, at::Tensor> grid_sample_backward_meta(const at::Tensor& grad_output, const at::Tensor& input,
                                                             const at::Tensor& grid, string_view interpolation,
                                                             string_view padding_mode, bool align_corners,
                                                             string_view mode, bool input_grad, bool grid_grad) {
  return detops::torch::guarded([&] {
    require_meta(kBackward, {{"grad_output", &grad_output}, {"input", &input}, {"grid", &grid}});
    make_options(kBackward, interpolation, padding_mode, align_corners);
    parse_exact_or_atomic(kBackward, mode);
    return gradients_like(kBackward, grad_output, input, grid, input_grad, grid_grad);
  });
}

// ---- Autograd ----------------------------------------------------------------------------------
// As roi_align.cpp: the forward runs the op below the autograd key, the backward calls the
// backward op through the dispatcher, whose own autograd kernel refuses to be differentiated
// again. Gradients: input and grid, each only when autograd needs it.

std::string str(string_view s) { return std::string(s.data(), s.size()); }

at::Tensor call_grid_sample(const at::Tensor& input, const at::Tensor& grid, string_view interpolation,
                            string_view padding_mode, bool align_corners, string_view mode) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::grid_sample", "")
                       .typed<decltype(grid_sample_kernel)>();
  return op.call(input, grid, interpolation, padding_mode, align_corners, mode);
}

std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& grid, string_view interpolation,
                                                 string_view padding_mode, bool align_corners, string_view mode,
                                                 bool input_grad, bool grid_grad) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_grid_sample_backward", "")
                       .typed<decltype(grid_sample_backward_kernel)>();
  return op.call(grad_output, input, grid, interpolation, padding_mode, align_corners, mode, input_grad, grid_grad);
}

class GridSampleFunction : public ::torch::autograd::Function<GridSampleFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& grid,
                               string_view interpolation, string_view padding_mode, bool align_corners,
                               string_view mode) {
    ctx->saved_data["interpolation"] = str(interpolation);
    ctx->saved_data["padding_mode"] = str(padding_mode);
    ctx->saved_data["align_corners"] = align_corners;
    ctx->saved_data["mode"] = str(mode);
    ctx->save_for_backward({input, grid});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_grid_sample(input, grid, interpolation, padding_mode, align_corners, mode)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const std::string interpolation = ctx->saved_data["interpolation"].toStringRef();
    const std::string padding_mode = ctx->saved_data["padding_mode"].toStringRef();
    const std::string mode = ctx->saved_data["mode"].toStringRef();
    // needs_input_grad indexes the tensor arguments: 0 input, 1 grid.
    auto grads = call_backward(grad_output[0], saved[0], saved[1], interpolation, padding_mode,
                               ctx->saved_data["align_corners"].toBool(), mode, ctx->needs_input_grad(0),
                               ctx->needs_input_grad(1));
    // input, grid, then the four options (no gradient).
    return {std::get<0>(grads), std::get<1>(grads), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The backward op's autograd: computed below autograd, refused if differentiated again. A custom
// Function's outputs must be defined, so only the gradients asked for pass through it.
class GridSampleBackwardFunction : public ::torch::autograd::Function<GridSampleBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_output, const at::Tensor& input,
                               const at::Tensor& grid, string_view interpolation, string_view padding_mode,
                               bool align_corners, string_view mode, bool input_grad, bool grid_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto grads = call_backward(grad_output, input, grid, interpolation, padding_mode, align_corners, mode,
                               input_grad, grid_grad);
    variable_list defined;
    for (const at::Tensor& g : {std::get<0>(grads), std::get<1>(grads)}) {
      if (g.defined()) defined.push_back(g);
    }
    return defined;
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "detops::grid_sample: double backward is not supported");
    throw std::logic_error("unreachable");
  }
};

at::Tensor grid_sample_autograd(const at::Tensor& input, const at::Tensor& grid, string_view interpolation,
                                string_view padding_mode, bool align_corners, string_view mode) {
  return GridSampleFunction::apply(input, grid, interpolation, padding_mode, align_corners, mode)[0];
}

std::tuple<at::Tensor, at::Tensor> grid_sample_backward_autograd(const at::Tensor& grad_output,
                                                                 const at::Tensor& input, const at::Tensor& grid,
                                                                 string_view interpolation, string_view padding_mode,
                                                                 bool align_corners, string_view mode,
                                                                 bool input_grad, bool grid_grad) {
  auto r = GridSampleBackwardFunction::apply(grad_output, input, grid, interpolation, padding_mode, align_corners,
                                             mode, input_grad, grid_grad);
  size_t next = 0;
  at::Tensor grad_input = input_grad ? r.at(next++) : at::Tensor();
  at::Tensor grad_grid = grid_grad ? r.at(next++) : at::Tensor();
  return std::make_tuple(grad_input, grad_grid);
}

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

TORCH_LIBRARY_IMPL(detops, CPU, m) {
  m.impl("grid_sample", TORCH_FN(ops::grid_sample_kernel));
  m.impl("_grid_sample_backward", TORCH_FN(ops::grid_sample_backward_kernel));
}

#if DETOPS_TORCH_CUDA
// The same kernels: detops runs its CUDA backend for CUDA views, on torch's current stream.
TORCH_LIBRARY_IMPL(detops, CUDA, m) {
  m.impl("grid_sample", TORCH_FN(ops::grid_sample_kernel));
  m.impl("_grid_sample_backward", TORCH_FN(ops::grid_sample_backward_kernel));
}
#endif

TORCH_LIBRARY_IMPL(detops, Meta, m) {
  m.impl("grid_sample", TORCH_FN(ops::grid_sample_meta));
  m.impl("_grid_sample_backward", TORCH_FN(ops::grid_sample_backward_meta));
}

TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  m.impl("grid_sample", TORCH_FN(ops::grid_sample_autograd));
  m.impl("_grid_sample_backward", TORCH_FN(ops::grid_sample_backward_autograd));
}
