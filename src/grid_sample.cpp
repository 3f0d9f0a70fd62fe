// grid_sample entry points: validate every argument (before anything is allocated, launched or
// written), then hand a GridSampleCall to the CPU or CUDA backend.
#include "detops/grid_sample.h"

#include <cstdint>
#include <initializer_list>

#include "internal/backend.h"
#include "internal/common.h"
#include "internal/grid_sample_backend.h"
#include "internal/scratch.h"
#include "internal/validate.h"

namespace detops {

const char* to_string(GridSampleInterpolation mode) {
  return mode == GridSampleInterpolation::kNearest ? "nearest" : "bilinear";
}
const char* to_string(GridSamplePadding mode) {
  switch (mode) {
    case GridSamplePadding::kZeros: return "zeros";
    case GridSamplePadding::kBorder: return "border";
    case GridSamplePadding::kReflection: return "reflection";
  }
  return "unknown";
}
const char* to_string(GridSampleCoordinates coordinates) {
  return coordinates == GridSampleCoordinates::kUnit ? "unit" : "normalized";
}

namespace {

using internal::check_same_device;
using internal::check_tensor;
using internal::fail;
using internal::is_floating;
using internal::sizes_str;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

constexpr internal::OpBackends<internal::GridSampleBackend> kBackends{
    &internal::kGridSampleCpu, DETOPS_CUDA_BACKEND(internal::kGridSampleCuda)};

const internal::GridSampleBackend& backend(const internal::GridSampleCall& call) {
  return internal::backend_for(kBackends, call.input.device, call.op);
}

void check_options(const char* op, const GridSampleOptions& o) {
  if (o.interpolation != GridSampleInterpolation::kBilinear && o.interpolation != GridSampleInterpolation::kNearest)
    fail(kBad, "{}: interpolation {} is unknown; expected bilinear or nearest", op, static_cast<int>(o.interpolation));
  if (o.padding != GridSamplePadding::kZeros && o.padding != GridSamplePadding::kBorder &&
      o.padding != GridSamplePadding::kReflection)
    fail(kBad, "{}: padding {} is unknown; expected zeros, border or reflection", op, static_cast<int>(o.padding));
  if (o.coordinates != GridSampleCoordinates::kNormalized && o.coordinates != GridSampleCoordinates::kUnit)
    fail(kBad, "{}: coordinates {} is unknown; expected normalized or unit", op, static_cast<int>(o.coordinates));
}

/// input [N, C, H, W] (floating) and grid [N, Ho, Wo, 2] in input's dtype, float32 or float64.
void check_input_and_grid(const char* op, const TensorView& input, const TensorView& grid) {
  check_tensor(op, "input", input, 4);
  internal::check_floating(op, "input", input);
  check_tensor(op, "grid", grid, 4);
  if (grid.sizes[0] != input.sizes[0] || grid.sizes[3] != 2)
    fail(kBad, "{}: grid has sizes {}; expected [N, Ho, Wo, 2] with N = {} (input's batch)", op, sizes_str(grid),
         input.sizes[0]);
  const bool ok_dtype = grid.dtype == input.dtype || grid.dtype == DType::kFloat32 || grid.dtype == DType::kFloat64;
  if (!ok_dtype || !is_floating(grid.dtype))
    fail(kBad, "{}: grid has dtype {}; expected {} (the dtype of input), float32 or float64", op,
         dtype_name(grid.dtype), dtype_name(input.dtype));
  check_same_device(op, "grid", grid, "input", input);
}

/// A [N, C, Ho, Wo] tensor of input's dtype and device (output, grad_output).
void check_sampled(const char* op, const char* name, const TensorView& v, const TensorView& input,
                   const TensorView& grid) {
  check_tensor(op, name, v, 4);
  if (v.sizes[0] != input.sizes[0] || v.sizes[1] != input.sizes[1] || v.sizes[2] != grid.sizes[1] ||
      v.sizes[3] != grid.sizes[2])
    fail(kBad, "{}: {} has sizes {}; expected [N, C, Ho, Wo] = [{}, {}, {}, {}]", op, name, sizes_str(v),
         input.sizes[0], input.sizes[1], grid.sizes[1], grid.sizes[2]);
  if (v.dtype != input.dtype)
    fail(kBad, "{}: {} has dtype {}; expected {} (the dtype of input)", op, name, dtype_name(v.dtype),
         dtype_name(input.dtype));
  check_same_device(op, name, v, "input", input);
}

/// Points to sample need a map to sample from.
void check_map(const char* op, const TensorView& input, const TensorView& grid) {
  const bool points = grid.sizes[0] > 0 && grid.sizes[1] > 0 && grid.sizes[2] > 0;
  if (points && input.sizes[1] > 0 && (input.sizes[2] == 0 || input.sizes[3] == 0))
    fail(kBad, "{}: input has sizes {}; expected H > 0 and W > 0 when the grid has points to sample", op,
         sizes_str(input));
}

detail::GridSampleShape make_shape(const TensorView& input, const TensorView& grid, const GridSampleOptions& o) {
  detail::GridSampleShape s{};
  s.N = input.sizes[0];
  s.C = input.sizes[1];
  s.H = input.sizes[2];
  s.W = input.sizes[3];
  s.Ho = grid.sizes[1];
  s.Wo = grid.sizes[2];
  s.nearest = o.interpolation == GridSampleInterpolation::kNearest;
  s.padding = static_cast<int>(o.padding);
  s.align_corners = o.align_corners;
  s.unit = o.coordinates == GridSampleCoordinates::kUnit;
  return s;
}

internal::GridSampleCall validate_forward(const TensorView& input, const TensorView& grid, const TensorView& output,
                                          const GridSampleOptions& o) {
  const char* op = "grid_sample_forward";
  check_options(op, o);
  check_input_and_grid(op, input, grid);
  check_sampled(op, "output", output, input, grid);
  internal::check_outputs(op, {{"output", &output}});
  internal::check_disjoint(op, {"output", &output}, {{"input", &input}, {"grid", &grid}});
  check_map(op, input, grid);
  internal::GridSampleCall call{};
  call.op = op;
  call.input = input;
  call.grid = grid;
  call.output = output;
  call.shape = make_shape(input, grid, o);
  return call;
}

internal::GridSampleCall validate_backward(const char* op, const TensorView& grad_output, const TensorView& input,
                                           const TensorView& grid, const TensorView& grad_input,
                                           const TensorView& grad_grid, const GridSampleOptions& o,
                                           const GridSampleBackwardOptions& b) {
  check_options(op, o);
  internal::check_backward_mode(op, kGridSampleCapabilities, b.mode);
  check_input_and_grid(op, input, grid);
  check_sampled(op, "grad_output", grad_output, input, grid);
  if (grad_input.defined()) internal::check_like(op, "grad_input", grad_input, "input", input);
  if (grad_grid.defined()) internal::check_like(op, "grad_grid", grad_grid, "grid", grid);
  // The outputs are written while the inputs are read: no shared byte (not even an exact alias).
  internal::check_outputs(op, {{"grad_input", &grad_input}, {"grad_grid", &grad_grid}});
  for (const internal::NamedView out : {internal::NamedView{"grad_input", &grad_input},
                                        internal::NamedView{"grad_grid", &grad_grid}})
    internal::check_disjoint(op, out, {{"grad_output", &grad_output}, {"input", &input}, {"grid", &grid}});
  check_map(op, input, grid);
  internal::GridSampleCall call{};
  call.op = op;
  call.input = input;
  call.grid = grid;
  call.grad_output = grad_output;
  call.grad_input = grad_input;
  call.grad_grid = grad_grid;
  call.shape = make_shape(input, grid, o);
  return call;
}

/// Bytes of the backward's workspace layout (without the alignment slack): the exact mode's
/// records when there is a grad_input with points to scatter into it.
std::size_t layout_bytes(const internal::GridSampleCall& call, BackwardMode mode) {
  const detail::GridSampleShape& s = call.shape;
  if (mode != BackwardMode::kExact || !call.grad_input.defined() || call.grad_input.numel() == 0) return 0;
  if (s.Ho * s.Wo == 0) return 0;
  return backend(call).backward_workspace(call, mode);
}

}  // namespace

void grid_sample_forward(const TensorView& input, const TensorView& grid, const TensorView& output,
                         const GridSampleOptions& options, const Context& ctx) {
  const internal::GridSampleCall call = validate_forward(input, grid, output, options);
  if (output.numel() == 0) return;
  backend(call).forward(call, ctx);
}

std::size_t grid_sample_backward_workspace_size(const TensorView& grad_output, const TensorView& input,
                                                const TensorView& grid, const TensorView& grad_input,
                                                const TensorView& grad_grid, const GridSampleOptions& options,
                                                const GridSampleBackwardOptions& backward, const Context& ctx) {
  (void)ctx;  // the size depends on the shapes, dtypes and layouts (the CPU's exact path), not on ctx
  const internal::GridSampleCall call = validate_backward("grid_sample_backward_workspace_size", grad_output, input,
                                                          grid, grad_input, grad_grid, options, backward);
  return internal::workspace_size_with_slack(layout_bytes(call, backward.mode));
}

void grid_sample_backward(const TensorView& grad_output, const TensorView& input, const TensorView& grid,
                          const TensorView& grad_input, const TensorView& grad_grid, const GridSampleOptions& options,
                          const GridSampleBackwardOptions& backward, const Context& ctx, Workspace workspace) {
  const internal::GridSampleCall call = validate_backward("grid_sample_backward", grad_output, input, grid,
                                                          grad_input, grad_grid, options, backward);
  const std::size_t bytes = layout_bytes(call, backward.mode);
  const internal::Scratch scratch(call.op, bytes, input.device, ctx, workspace,
                                  {{"grad_output", &grad_output}, {"input", &input}, {"grid", &grid},
                                   {"grad_input", &grad_input}, {"grad_grid", &grad_grid}},
                                  "grid_sample_backward_workspace_size");
  const bool gi = grad_input.defined() && grad_input.numel() > 0;
  const bool gg = grad_grid.defined() && grad_grid.numel() > 0;
  if (!gi && !gg) return;
  backend(call).backward(call, backward.mode, ctx, scratch.workspace(bytes));
}

}  // namespace detops
