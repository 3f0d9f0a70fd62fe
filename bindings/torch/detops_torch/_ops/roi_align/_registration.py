# RoIAlign's fake kernels and (stable layer) autograd: roi_align, roi_align_max and their backward ops.
import torch

from ... import _registry as r
from ..._common import BACKWARD_MODES, TRUNCATIONS
from ..._errors import DetopsError


def check_modes(op, backward_mode, truncation):
    r.check_choice(op, "backward_mode", backward_mode, BACKWARD_MODES)
    r.check_choice(op, "truncation", truncation, TRUNCATIONS)


def output_sizes(op, input, rois, pooled_height, pooled_width, backward_mode, truncation, rois_shape):
    """The RoI forwards' checks (as the C++ glue's roi_output_sizes) and [K, C, PH, PW]."""
    r.require_meta_or_fake(op, input=input, rois=rois)
    check_modes(op, backward_mode, truncation)
    r.require_dim(op, "input", input, 4, "[N, C, H, W]")
    r.require_dim(op, "rois", rois, 2, rois_shape)
    return (rois.shape[0], input.shape[1], max(pooled_height, 0), max(pooled_width, 0))


def grad_input_like(op, grad, batch_size, channels, height, width, channels_last):
    r.require_dim(op, "grad", grad, 4, "[K, C, PH, PW]")
    sizes = (batch_size, channels, height, width)
    if any(s < 0 for s in sizes):
        raise DetopsError(f"{op}: input sizes {list(sizes)} have a negative size")
    return r.new_empty(grad, sizes, channels_last=channels_last)


@r.fake("roi_align")
def _(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, backward_mode="exact",
      truncation="float16"):
    op = "detops::roi_align"
    return input.new_empty(output_sizes(op, input, rois, pooled_height, pooled_width, backward_mode, truncation,
                                        "[K, 5]"))


@r.fake("roi_align_max")
def _(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, backward_mode="exact",
      truncation="float16"):
    op = "detops::roi_align_max"
    sizes = output_sizes(op, input, rois, pooled_height, pooled_width, backward_mode, truncation, "[K, 5]")
    return input.new_empty(sizes), input.new_empty(sizes, dtype=torch.int32)


@r.fake("_roi_align_backward")
def _(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width, sampling_ratio,
      aligned, backward_mode="exact", truncation="float16", channels_last=False):
    op = "detops::_roi_align_backward"
    r.require_meta_or_fake(op, grad=grad, rois=rois)
    check_modes(op, backward_mode, truncation)
    return grad_input_like(op, grad, batch_size, channels, height, width, channels_last)


@r.fake("_roi_align_max_backward")
def _(grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
      sampling_ratio, aligned, backward_mode="exact", truncation="float16", channels_last=False):
    op = "detops::_roi_align_max_backward"
    r.require_meta_or_fake(op, grad=grad, rois=rois, argmax=argmax)
    check_modes(op, backward_mode, truncation)
    return grad_input_like(op, grad, batch_size, channels, height, width, channels_last)


# ---- autograd (stable layer): input only, rois get none; the backward ops refuse double backward

def _setup(ctx, inputs, output):
    input, rois = inputs[0], inputs[1]
    ctx.save_for_backward(rois, output[1] if isinstance(output, tuple) else None)
    r.saved(ctx, options=tuple(inputs[2:7]), modes=tuple(inputs[7:9]), input_shape=tuple(input.shape),
            channels_last=r.channels_last(input))


def _backward(ctx, needs, grad, *unused):
    rois, argmax = ctx.saved_tensors
    scale, ph, pw, sr, aligned = ctx.options
    mode, truncation = ctx.modes
    if mode == "atomic" and grad.is_cuda:
        r.alert_not_deterministic("detops::roi_align backward with backward_mode='atomic' on CUDA")
    n, c, h, w = ctx.input_shape
    if argmax is None:
        gi = torch.ops.detops._roi_align_backward(grad, rois, scale, ph, pw, n, c, h, w, sr, aligned, mode,
                                                  truncation, ctx.channels_last)
    else:
        gi = torch.ops.detops._roi_align_max_backward(grad, rois, argmax, scale, ph, pw, n, c, h, w, sr, aligned,
                                                      mode, truncation, ctx.channels_last)
    return (gi,) + (None,) * 8


r.autograd("roi_align", _setup, _backward)
r.autograd("roi_align_max", _setup, _backward)
r.autograd("_roi_align_backward", double_backward_error="detops::roi_align: double backward is not supported")
r.autograd("_roi_align_max_backward", double_backward_error="detops::roi_align: double backward is not supported")


# ---- quantized inputs (both layers): torchvision registers a QuantizedCPU kernel for its roi_align

def _quantized_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                       backward_mode="exact", truncation="float16"):
    """detops::roi_align for a quantized (qint8, quint8, qint32) per-tensor input, with the
    semantics of torchvision's qroi_align: the input (and quantized rois, each with their own
    qparams) dequantized, pooled in float (here by detops' float32 path), and the output quantized
    with the input's scale and zero point, in the input's dtype. One image per batch, as
    torchvision (its batch indices need not be representable in the rois' quantization)."""
    op = "detops::roi_align"
    if input.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        raise DetopsError(f"{op}: quantized input has qscheme {input.qscheme()}; expected a per-tensor quantization "
                          "(as torchvision's quantized roi_align)")
    if input.dim() == 4 and input.size(0) != 1:
        raise DetopsError(f"{op}: quantized input has sizes {list(input.shape)}: Only one image per batch is "
                          "allowed in a quantized roi_align (as torchvision's); expected [1, C, H, W]")
    x = input.dequantize()
    boxes = rois.dequantize() if rois.is_quantized else rois.to(torch.float32)
    out = torch.ops.detops.roi_align(x, boxes, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                                     backward_mode, truncation)
    return torch.quantize_per_tensor(out, input.q_scale(), input.q_zero_point(), input.dtype)


r._library().impl("roi_align", _quantized_forward, "QuantizedCPU")
