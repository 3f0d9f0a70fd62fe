# RoIAlignRotated's fake kernels and (stable layer) autograd: roi_align_rotated and its backward op.
import torch

from ... import _registry as r
from .functional import ANGLE_UNITS
from ..roi_align._registration import check_modes, grad_input_like, output_sizes


@r.fake("roi_align_rotated")
def _(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned=True, clockwise=False,
      angle_unit="degrees", backward_mode="exact", truncation="float16"):
    op = "detops::roi_align_rotated"
    r.check_choice(op, "angle_unit", angle_unit, ANGLE_UNITS)
    return input.new_empty(output_sizes(op, input, rois, pooled_height, pooled_width, backward_mode, truncation,
                                        "[K, 6]"))


@r.fake("_roi_align_rotated_backward")
def _(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width, sampling_ratio,
      aligned=True, clockwise=False, angle_unit="degrees", backward_mode="exact", truncation="float16",
      channels_last=False):
    op = "detops::_roi_align_rotated_backward"
    r.require_meta_or_fake(op, grad=grad, rois=rois)
    r.check_choice(op, "angle_unit", angle_unit, ANGLE_UNITS)
    check_modes(op, backward_mode, truncation)
    return grad_input_like(op, grad, batch_size, channels, height, width, channels_last)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])
    r.saved(ctx, options=tuple(inputs[2:11]), input_shape=tuple(inputs[0].shape),
            channels_last=r.channels_last(inputs[0]))


def _backward(ctx, needs, grad):
    (rois,) = ctx.saved_tensors
    scale, ph, pw, sr, aligned, clockwise, unit, mode, truncation = ctx.options
    if mode == "atomic" and grad.is_cuda:
        r.alert_not_deterministic("detops::roi_align_rotated backward with backward_mode='atomic' on CUDA")
    n, c, h, w = ctx.input_shape
    gi = torch.ops.detops._roi_align_rotated_backward(grad, rois, scale, ph, pw, n, c, h, w, sr, aligned, clockwise,
                                                      unit, mode, truncation, ctx.channels_last)
    return (gi,) + (None,) * 10


r.autograd("roi_align_rotated", _setup, _backward)
r.autograd("_roi_align_rotated_backward",
           double_backward_error="detops::roi_align_rotated: double backward is not supported")
