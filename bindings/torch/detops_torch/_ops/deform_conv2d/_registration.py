# deform_conv2d's fake kernels and (stable layer) autograd: deform_conv2d and its backward op.
import torch

from ... import _registry as r
from ..._common import GATHER_BACKWARD_MODES
from ..._errors import DetopsError
from .functional import DEFORM_BORDER_RULES


def mask_used(op, mask, use_mask):
    if not use_mask:
        return None
    if mask is None:
        raise DetopsError(f"{op}: use_mask is True but mask is None; expected a mask tensor")
    return mask


def output_sizes(op, input, weight, offset, mask, stride, padding, dilation):
    """The C++ glue's output_sizes (deform_conv2d.cpp): the checks the shaping needs, then
    [N, Cout, Ho, Wo]; the rest is the real kernel's to check."""
    if min(stride) <= 0:
        raise DetopsError(f"{op}: stride is {tuple(stride)}; expected positive values")
    if min(dilation) <= 0:
        raise DetopsError(f"{op}: dilation is {tuple(dilation)}; expected positive values")
    if min(padding) < 0:
        raise DetopsError(f"{op}: padding is {tuple(padding)}; expected values >= 0")
    r.require_dim(op, "input", input, 4, "[N, Cin, H, W]")
    r.require_dim(op, "weight", weight, 4, "[Cout, Cin / groups, kh, kw]")
    r.require_dim(op, "offset", offset, 4, "[N, 2 * offset_groups * kh * kw, Ho, Wo]")
    if mask is not None:
        r.require_dim(op, "mask", mask, 4, "[N, offset_groups * kh * kw, Ho, Wo]")
    kh, kw = weight.shape[2], weight.shape[3]
    sizes = []
    for i, (extent, k) in enumerate(((input.shape[2], kh), (input.shape[3], kw))):
        span, eff = extent + 2 * padding[i], dilation[i] * (k - 1) + 1
        if span < eff:
            raise DetopsError(f"{op}: input has sizes {list(input.shape)}; with padding {tuple(padding)} it is smaller "
                             "than the dilated kernel: no output position")
        sizes.append((span - eff) // stride[i] + 1)
    return (input.shape[0], weight.shape[0], sizes[0], sizes[1])


@r.fake("deform_conv2d")
def _(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups,
      offset_groups, use_mask, backward_mode="exact", border_rule="torchvision"):
    op = "detops::deform_conv2d"
    r.require_meta_or_fake(op, input=input, weight=weight, offset=offset, mask=mask, bias=bias)
    r.check_choice(op, "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    r.check_choice(op, "border_rule", border_rule, DEFORM_BORDER_RULES)
    m = mask_used(op, mask, use_mask)
    sizes = output_sizes(op, input, weight, offset, m, (stride_h, stride_w), (pad_h, pad_w), (dilation_h, dilation_w))
    return r.new_empty(input, sizes, channels_last=r.channels_last(input))


@r.fake("_deform_conv2d_backward")
def _(grad_output, input, weight, offset, mask, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups,
      offset_groups, backward_mode, border_rule, input_grad, weight_grad, offset_grad, mask_grad, bias_grad):
    op = "detops::_deform_conv2d_backward"
    r.require_meta_or_fake(op, grad_output=grad_output, input=input, weight=weight, offset=offset, mask=mask)
    r.check_choice(op, "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    r.check_choice(op, "border_rule", border_rule, DEFORM_BORDER_RULES)
    r.require_dim(op, "grad_output", grad_output, 4, "[N, Cout, Ho, Wo]")
    output_sizes(op, input, weight, offset, mask, (stride_h, stride_w), (pad_h, pad_w), (dilation_h, dilation_w))
    if mask_grad and mask is None:
        raise DetopsError(f"{op}: mask_grad is True but there is no mask; expected mask_grad=False")
    like = r.empty_like_format
    return (like(input) if input_grad else None, like(weight) if weight_grad else None,
            like(offset) if offset_grad else None, like(mask) if mask_grad else None,
            weight.new_empty((weight.shape[0],)) if bias_grad else None)


def _setup(ctx, inputs, output):
    input, weight, offset, mask, bias = inputs[:5]
    m = mask_used("detops::deform_conv2d", mask, inputs[13])
    ctx.save_for_backward(input, weight, offset, m)
    r.saved(ctx, options=tuple(inputs[5:13]), backward_mode=inputs[14], border_rule=inputs[15],
            has_bias=bias is not None)


def _backward(ctx, needs, grad):
    input, weight, offset, mask = ctx.saved_tensors
    if ctx.backward_mode == "atomic" and needs[0] and grad.is_cuda:
        r.alert_not_deterministic("detops::deform_conv2d backward with backward_mode='atomic' on CUDA")
    grads = torch.ops.detops._deform_conv2d_backward(
        grad, input, weight, offset, mask, *ctx.options, ctx.backward_mode, ctx.border_rule, needs[0], needs[1],
        needs[2], mask is not None and needs[3], ctx.has_bias and needs[4])
    return tuple(grads) + (None,) * 11


r.autograd("deform_conv2d", _setup, _backward)
r.autograd("_deform_conv2d_backward",
           double_backward_error="detops::deform_conv2d: double backward is not supported")
