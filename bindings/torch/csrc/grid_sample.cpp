// grid_sample kernels of torch.ops.detops: grid_sample and its backward op on the CPU, CUDA (when
// built with it) and their schemas; the classic layer's C++ autograd functions.
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

constexpr const char* kForward = "detops::grid_sample";
constexpr const char* kBackward = "detops::_grid_sample_backward";

GridSampleOptions make_options(const char* op, Str interpolation, Str padding_mode,
                               bool align_corners, Str coordinates) {
  GridSampleOptions o;
  o.interpolation = parse_interpolation(op, interpolation);
  o.padding = parse_padding(op, padding_mode);
  o.align_corners = align_corners;
  o.coordinates = parse_coordinates(op, coordinates);
  return o;
}

// Outputs are shaped from these ranks: checked here (torch would fail on size(2) first), the rest
// (N, the last grid size, dtypes) by detops.
void require_ranks(const char* op, const Tensor& input, const Tensor& grid) {
  require_dim(op, "input", input, 4, "[N, C, H, W]");
  require_dim(op, "grid", grid, 4, "[N, Ho, Wo, 2]");
}

// [N, C, Ho, Wo] from input [N, C, H, W] and grid [N, Ho, Wo, 2].
std::vector<int64_t> output_sizes(const char* op, const Tensor& input, const Tensor& grid) {
  require_ranks(op, input, grid);
  require_float(op, "input", input);
  return {input.size(0), input.size(1), grid.size(1), grid.size(2)};
}

// The output and grad_input take the input's memory format: detops reads and writes NHWC natively.

// The gradients asked for; the others are undefined (None in Python) and detops gets empty views.
std::tuple<Tensor, Tensor> gradients_like(const char* op, const Tensor& grad_output,
                                          const Tensor& input, const Tensor& grid, bool input_grad,
                                          bool grid_grad) {
  require_dim(op, "grad_output", grad_output, 4, "[N, C, Ho, Wo]");
  require_ranks(op, input, grid);
  return std::make_tuple(input_grad ? empty_like_format(input) : undefined(),
                         grid_grad ? empty_on(grid, sizes_of(grid)) : undefined());
}

// ---- CPU and CUDA: one kernel each, detops picks its backend from the tensors' device --------

Tensor grid_sample_kernel(const Tensor& input, const Tensor& grid, Str interpolation,
                          Str padding_mode, bool align_corners, Str mode, Str coordinates) {
  return guarded([&] {
    const GridSampleOptions options =
        make_options(kForward, interpolation, padding_mode, align_corners, coordinates);
    parse_backward_mode(kForward, mode, kGridSampleCapabilities);
    DeviceGuard guard(input);
    Tensor output = empty_on(input, output_sizes(kForward, input, grid), kNone, is_channels_last(input));
    grid_sample_forward(view(input, "input"), view(grid, "grid"),
                        view(output, "output"), options, context(input));
    return output;
  });
}

std::tuple<Tensor, Tensor> grid_sample_backward_kernel(const Tensor& grad_output,
                                                       const Tensor& input, const Tensor& grid,
                                                       Str interpolation, Str padding_mode,
                                                       bool align_corners, Str mode, Str coordinates,
                                                       bool input_grad, bool grid_grad) {
  return guarded([&] {
    const GridSampleOptions options =
        make_options(kBackward, interpolation, padding_mode, align_corners, coordinates);
    GridSampleBackwardOptions backward;
    backward.mode = parse_backward_mode(kBackward, mode, kGridSampleCapabilities);
    DeviceGuard guard(grad_output);
    if (backward.mode == BackwardMode::kAtomic && input_grad && is_cuda(grad_output)) {
      // grad_input's scatter is the one part whose bits change from run to run (grad_grid has one
      // writer per grid point in either mode).
      alert_not_deterministic("detops::grid_sample backward with backward_mode='atomic' on CUDA");
    }
    auto grads = gradients_like(kBackward, grad_output, input, grid, input_grad, grid_grad);
    // Workspace (exact mode) comes from torch's allocator through the context.
    grid_sample_backward(view(grad_output, "grad_output"), view(input, "input"),
                         view(grid, "grid"), view(std::get<0>(grads), "grad_input"),
                         view(std::get<1>(grads), "grad_grid"), options, backward,
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
// again. Gradients: input and grid, each only when autograd needs it.

std::string str(Str s) { return std::string(s.data(), s.size()); }

at::Tensor call_grid_sample(const at::Tensor& input, const at::Tensor& grid, Str interpolation,
                            Str padding_mode, bool align_corners, Str mode, Str coordinates) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::grid_sample", "")
                       .typed<decltype(grid_sample_kernel)>();
  return op.call(input, grid, interpolation, padding_mode, align_corners, mode, coordinates);
}

std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& grid, Str interpolation,
                                                 Str padding_mode, bool align_corners, Str mode, Str coordinates,
                                                 bool input_grad, bool grid_grad) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("detops::_grid_sample_backward", "")
                       .typed<decltype(grid_sample_backward_kernel)>();
  return op.call(grad_output, input, grid, interpolation, padding_mode, align_corners, mode, coordinates, input_grad,
                 grid_grad);
}

class GridSampleFunction : public ::torch::autograd::Function<GridSampleFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& grid,
                               Str interpolation, Str padding_mode, bool align_corners,
                               Str mode, Str coordinates) {
    ctx->saved_data["interpolation"] = str(interpolation);
    ctx->saved_data["padding_mode"] = str(padding_mode);
    ctx->saved_data["align_corners"] = align_corners;
    ctx->saved_data["mode"] = str(mode);
    ctx->saved_data["coordinates"] = str(coordinates);
    ctx->save_for_backward({input, grid});
    at::AutoDispatchBelowADInplaceOrView guard;
    return {call_grid_sample(input, grid, interpolation, padding_mode, align_corners, mode, coordinates)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const std::string interpolation = ctx->saved_data["interpolation"].toStringRef();
    const std::string padding_mode = ctx->saved_data["padding_mode"].toStringRef();
    const std::string mode = ctx->saved_data["mode"].toStringRef();
    const std::string coordinates = ctx->saved_data["coordinates"].toStringRef();
    // needs_input_grad indexes the tensor arguments: 0 input, 1 grid.
    auto grads = call_backward(grad_output[0], saved[0], saved[1], interpolation, padding_mode,
                               ctx->saved_data["align_corners"].toBool(), mode, coordinates,
                               ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    // input, grid, then the five options (no gradient).
    return {std::get<0>(grads), std::get<1>(grads), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// The backward op's autograd: computed below autograd, refused if differentiated again. A custom
// Function's outputs must be defined, so only the gradients asked for pass through it.
class GridSampleBackwardFunction : public ::torch::autograd::Function<GridSampleBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_output, const at::Tensor& input,
                               const at::Tensor& grid, Str interpolation, Str padding_mode,
                               bool align_corners, Str mode, Str coordinates, bool input_grad,
                               bool grid_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto grads = call_backward(grad_output, input, grid, interpolation, padding_mode, align_corners, mode,
                               coordinates, input_grad, grid_grad);
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

at::Tensor grid_sample_autograd(const at::Tensor& input, const at::Tensor& grid, Str interpolation,
                                Str padding_mode, bool align_corners, Str mode, Str coordinates) {
  return GridSampleFunction::apply(input, grid, interpolation, padding_mode, align_corners, mode, coordinates)[0];
}

std::tuple<at::Tensor, at::Tensor> grid_sample_backward_autograd(const at::Tensor& grad_output,
                                                                 const at::Tensor& input, const at::Tensor& grid,
                                                                 Str interpolation, Str padding_mode,
                                                                 bool align_corners, Str mode, Str coordinates,
                                                                 bool input_grad, bool grid_grad) {
  auto r = GridSampleBackwardFunction::apply(grad_output, input, grid, interpolation, padding_mode, align_corners,
                                             mode, coordinates, input_grad, grid_grad);
  size_t next = 0;
  at::Tensor grad_input = input_grad ? r.at(next++) : at::Tensor();
  at::Tensor grad_grid = grid_grad ? r.at(next++) : at::Tensor();
  return std::make_tuple(grad_input, grad_grid);
}

#endif  // !DETOPS_TORCH_STABLE

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

DETOPS_LIBRARY_FRAGMENT(m) {
  // grid_sample, 2-d: torch.nn.functional.grid_sample's options (its `mode` is `interpolation`
  // here), then detops' backward_mode, "exact" or "atomic", and the grid's coordinates:
  // "normalized" (torch's [-1, 1]) or "unit" (point_sample's [0, 1], read as 2c - 1 in the grid's
  // dtype, one pass). The backward op computes the gradients asked for (input_grad, grid_grad)
  // and returns None for the others.
  m.def("grid_sample(Tensor input, Tensor grid, str interpolation=\"bilinear\", str padding_mode=\"zeros\", "
        "bool align_corners=False, str backward_mode=\"exact\", str coordinates=\"normalized\") -> Tensor");
  m.def("_grid_sample_backward(Tensor grad_output, Tensor input, Tensor grid, str interpolation, "
        "str padding_mode, bool align_corners, str backward_mode, str coordinates, bool input_grad, "
        "bool grid_grad) -> (Tensor grad_input, Tensor grad_grid)");
}

namespace {
template <class Library>
void kernels(Library& m) {
  m.impl("grid_sample", DETOPS_KERNEL(ops::grid_sample_kernel));
  m.impl("_grid_sample_backward", DETOPS_KERNEL(ops::grid_sample_backward_kernel));
}
}  // namespace

DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels)

#if !DETOPS_TORCH_STABLE
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  m.impl("grid_sample", TORCH_FN(ops::grid_sample_autograd));
  m.impl("_grid_sample_backward", TORCH_FN(ops::grid_sample_backward_autograd));
}
#endif
