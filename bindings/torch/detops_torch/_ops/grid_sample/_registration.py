# grid_sample's fake kernels and (stable layer) autograd: grid_sample and its backward op.
import torch

from ... import _registry as r
from ..._common import GATHER_BACKWARD_MODES
from .functional import GRID_SAMPLE_COORDINATES, GRID_SAMPLE_MODES, GRID_SAMPLE_PADDING_MODES


def check(op, input, grid, interpolation, padding_mode, backward_mode, coordinates):
    r.check_choice(op, "interpolation", interpolation, GRID_SAMPLE_MODES)
    r.check_choice(op, "padding_mode", padding_mode, GRID_SAMPLE_PADDING_MODES)
    r.check_choice(op, "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    r.check_choice(op, "coordinates", coordinates, GRID_SAMPLE_COORDINATES)
    r.require_dim(op, "input", input, 4, "[N, C, H, W]")
    r.require_dim(op, "grid", grid, 4, "[N, Ho, Wo, 2]")


@r.fake("grid_sample")
def _(input, grid, interpolation="bilinear", padding_mode="zeros", align_corners=False, backward_mode="exact",
      coordinates="normalized"):
    op = "detops::grid_sample"
    r.require_meta_or_fake(op, input=input, grid=grid)
    check(op, input, grid, interpolation, padding_mode, backward_mode, coordinates)
    return r.new_empty(input, (input.shape[0], input.shape[1], grid.shape[1], grid.shape[2]),
                       channels_last=r.channels_last(input))


@r.fake("_grid_sample_backward")
def _(grad_output, input, grid, interpolation, padding_mode, align_corners, backward_mode, coordinates, input_grad,
      grid_grad):
    op = "detops::_grid_sample_backward"
    r.require_meta_or_fake(op, grad_output=grad_output, input=input, grid=grid)
    check(op, input, grid, interpolation, padding_mode, backward_mode, coordinates)
    r.require_dim(op, "grad_output", grad_output, 4, "[N, C, Ho, Wo]")
    return (r.empty_like_format(input) if input_grad else None,
            grid.new_empty(grid.shape) if grid_grad else None)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    r.saved(ctx, options=tuple(inputs[2:7]))


def _backward(ctx, needs, grad):
    input, grid = ctx.saved_tensors
    interpolation, padding_mode, align_corners, mode, coordinates = ctx.options
    if mode == "atomic" and needs[0] and grad.is_cuda:
        # grad_input's scatter is the one part whose bits change from run to run (grad_grid has
        # one writer per grid point in either mode).
        r.alert_not_deterministic("detops::grid_sample backward with backward_mode='atomic' on CUDA")
    gi, gg = torch.ops.detops._grid_sample_backward(grad, input, grid, interpolation, padding_mode, align_corners,
                                                    mode, coordinates, needs[0], needs[1])
    return gi, gg, None, None, None, None, None


r.autograd("grid_sample", _setup, _backward)
r.autograd("_grid_sample_backward", double_backward_error="detops::grid_sample: double backward is not supported")
