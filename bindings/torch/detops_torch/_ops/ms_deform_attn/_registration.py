# Multi-scale deformable attention's fake kernels and (stable layer) autograd: ms_deform_attn and its backward op.
import torch

from ... import _registry as r
from ..._common import GATHER_BACKWARD_MODES


def check(op, value, sampling_locations, attention_weights, backward_mode):
    r.check_choice(op, "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    r.require_dim(op, "value", value, 4, "[B, S, M, D]")
    r.require_dim(op, "sampling_locations", sampling_locations, 6, "[B, Q, M, L, P, 2]")
    r.require_dim(op, "attention_weights", attention_weights, 5, "[B, Q, M, L, P]")


# The level tables (spatial_shapes, level_start_index) may stay host tensors next to meta or CUDA
# ones: detops reads them on the host.
@r.fake("ms_deform_attn")
def _(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, backward_mode="exact"):
    op = "detops::ms_deform_attn"
    r.require_meta_or_fake(op, value=value, sampling_locations=sampling_locations,
                           attention_weights=attention_weights)
    check(op, value, sampling_locations, attention_weights, backward_mode)
    return value.new_empty((value.shape[0], sampling_locations.shape[1], value.shape[2] * value.shape[3]))


@r.fake("_ms_deform_attn_backward")
def _(grad_output, value, spatial_shapes, level_start_index, sampling_locations, attention_weights, backward_mode,
      value_grad, locations_grad, weights_grad):
    op = "detops::_ms_deform_attn_backward"
    r.require_meta_or_fake(op, grad_output=grad_output, value=value, sampling_locations=sampling_locations,
                           attention_weights=attention_weights)
    check(op, value, sampling_locations, attention_weights, backward_mode)
    r.require_dim(op, "grad_output", grad_output, 3, "[B, Q, M*D]")
    return tuple(t.new_empty(t.shape) if needed else None
                 for t, needed in ((value, value_grad), (sampling_locations, locations_grad),
                                   (attention_weights, weights_grad)))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.backward_mode = inputs[5]


def _backward(ctx, needs, grad):
    value, shapes, start, locations, weights = ctx.saved_tensors
    if ctx.backward_mode == "atomic" and needs[0] and grad.is_cuda:
        r.alert_not_deterministic("detops::ms_deform_attn backward with backward_mode='atomic' on CUDA")
    gv, gl, gw = torch.ops.detops._ms_deform_attn_backward(grad, value, shapes, start, locations, weights,
                                                           ctx.backward_mode, needs[0], needs[3], needs[4])
    return gv, None, None, gl, gw, None


r.autograd("ms_deform_attn", _setup, _backward)
r.autograd("_ms_deform_attn_backward",
           double_backward_error="detops::ms_deform_attn: double backward is not supported")
