# Functional entry points of detops_torch: torchvision-compatible roi_align, roi_align_rotated (detectron2's / mmcv's), grid_sample (torch's) and point_sample (detectron2's), ms_deform_attn (Deformable-DETR's / mmcv's), deform_conv2d (torchvision's), FrozenBatchNorm2d's fold/apply over torch.ops.detops.
"""Functional forms of the detops ops.

``roi_align`` has ``torchvision.ops.roi_align``'s signature (boxes as a ``[K, 5]`` tensor or a list
of per-image ``[L, 4]`` tensors) plus trailing options: the backward mode, the truncation
format of the truncated mode and the pooling mode (``"max"`` is mmcv's max pooling).
``roi_align_rotated`` pools rotated boxes ``(batch_index, cx, cy, w, h, angle)`` with detectron2's
``ROIAlignRotated`` semantics (degrees, counter-clockwise) or, through ``angle_unit="radians"``,
``aligned`` and ``clockwise``, mmcv's ``roi_align_rotated``; same trailing options as
``roi_align`` (no max pooling: neither anchor has it).

``grid_sample`` has ``torch.nn.functional.grid_sample``'s signature (4-d input; bilinear and
nearest) plus a trailing ``backward_mode``; ``point_sample`` is detectron2's (and
Mask2Former's) helper over it. ``ms_deform_attn`` takes the arguments of Deformable-DETR's
``MSDeformAttnFunction`` and mmcv's ``MultiScaleDeformableAttnFunction`` (without ``im2col_step``)
plus ``backward_mode``. ``deform_conv2d`` has ``torchvision.ops.deform_conv2d``'s signature (DCNv1,
and DCNv2 with a mask) plus a trailing ``backward_mode``. Their backward modes: ``"exact"`` (bitwise
reproducible, the default) or ``"atomic"`` (the anchors' scatter; not reproducible on GPUs).
The options follow the peer's arguments, positional or keyword (TorchScript compiles no
keyword-only argument with a default), so each function scripts where its peer does.
"""
import warnings
from typing import List, Optional, Tuple, Union

import torch
import torch.fx
from torch import Tensor
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ._errors import DetopsAssertionError, DetopsError, eager, run

__all__ = [
    "BACKWARD_MODES",
    "TRUNCATIONS",
    "POOL_MODES",
    "ANGLE_UNITS",
    "EPILOGUES",
    "GATHER_BACKWARD_MODES",
    "DEFORM_BORDER_RULES",
    "GRID_SAMPLE_MODES",
    "GRID_SAMPLE_PADDING_MODES",
    "roi_align",
    "roi_align_rotated",
    "boxes_to_rois",
    "grid_sample",
    "point_sample",
    "ms_deform_attn",
    "deform_conv2d",
    "frozen_batch_norm",
    "frozen_batch_norm_fold",
]

# The accepted option strings. The ops validate them again in their forward (with detops' own
# message); the modules check them at construction so a typo fails where it was written.
BACKWARD_MODES = ("exact", "truncated", "atomic")
TRUNCATIONS = ("float16", "bfloat16")
POOL_MODES = ("avg", "max")
# roi_align_rotated's angle column: detectron2's degrees, mmcv's radians.
ANGLE_UNITS = ("degrees", "radians")
EPILOGUES = ("none", "relu", "add_relu")
# grid_sample, ms_deform_attn and deform_conv2d have no truncated mode.
GATHER_BACKWARD_MODES = ("exact", "atomic")
# deform_conv2d's offset-gradient border rule: torchvision's, or mmcv's (also detectron2's)
DEFORM_BORDER_RULES = ("torchvision", "mmcv")
GRID_SAMPLE_MODES = ("bilinear", "nearest")
GRID_SAMPLE_PADDING_MODES = ("zeros", "border", "reflection")


def _sizes(t: Tensor) -> str:
    parts: List[str] = []
    for s in t.shape:
        parts.append(str(s))
    return "[" + ", ".join(parts) + "]"


def resolve_backward_mode(owner: str, backward_mode: str, mode: Optional[str]) -> str:
    """``backward_mode``, or the value of the deprecated ``mode`` keyword it replaced (0.1.x)."""
    if mode is not None:
        warnings.warn(f"{owner}: the keyword `mode` is now `backward_mode` (its name in every detops op); "
                      "`mode` will be removed", DeprecationWarning, stacklevel=3)
        backward_mode = mode
    check_choice(owner, "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    return backward_mode


def check_choice(owner: str, name: str, value: str, allowed: Tuple[str, ...]) -> None:
    """Raises DetopsError unless ``value`` is one of ``allowed`` (used by the modules' constructors)."""
    if not isinstance(value, str) or value not in allowed:
        raise DetopsError(
            f"{owner}: {name} is {value!r}; expected one of " + ", ".join(repr(a) for a in allowed)
        )


def check_roi_options(owner: str, backward_mode: str, truncation: str) -> None:
    """Raises DetopsError unless backward_mode and truncation are ones detops knows."""
    check_choice(owner, "backward_mode", backward_mode, BACKWARD_MODES)
    check_choice(owner, "truncation", truncation, TRUNCATIONS)


def boxes_to_rois(boxes: List[Tensor]) -> Tensor:
    """Converts per-image ``[L, 4]`` boxes to ``[K, 5]`` rois (batch index first), as torchvision
    does (same dtype and device; the index column is written in the boxes' dtype)."""
    if len(boxes) == 0:
        raise DetopsError("roi_align: boxes is an empty list; expected one [L, 4] tensor per image")
    first = boxes[0]
    for i, b in enumerate(boxes):
        if b.dim() != 2 or b.size(1) != 4:  # torchvision asserts it (its message's words kept)
            raise DetopsAssertionError(
                "roi_align: boxes[" + str(i) + "] has sizes " + _sizes(b)
                + "; expected [L, 4] rows (x1, y1, x2, y2): the shape of the tensor in the boxes list is not"
                + " correct as List[Tensor[L, 4]]"
            )
        if b.dtype != first.dtype:
            raise DetopsError(
                "roi_align: boxes[" + str(i) + "] has dtype " + str(b.dtype)
                + "; expected " + str(first.dtype) + " (the dtype of boxes[0])"
            )
        if b.device != first.device:
            raise DetopsError(
                "roi_align: boxes[" + str(i) + "] is on " + str(b.device)
                + "; expected " + str(first.device) + " (the device of boxes[0])"
            )
    if len(boxes) == 1:
        concat = first
    else:
        concat = torch.cat(boxes, dim=0)
    ids: List[Tensor] = []
    for i, b in enumerate(boxes):
        ids.append(torch.full_like(b[:, :1], i))
    if len(ids) == 1:
        idx = ids[0]
    else:
        idx = torch.cat(ids, dim=0)
    return torch.cat([idx, concat], dim=1)


@torch.fx.wrap
def _roi_align(
    input: Tensor,
    boxes: Union[Tensor, List[Tensor]],
    output_size: BroadcastingList2[int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
    backward_mode: str,
    truncation: str,
    pool_mode: str,
) -> Tensor:
    # All-positional form of roi_align: TorchScript (1.13) rejects keyword-only arguments with
    # defaults, so the modules call this one and stay scriptable.
    if isinstance(boxes, torch.Tensor):
        if boxes.dim() != 2 or boxes.size(1) != 5:  # torchvision asserts it (its message's words kept)
            raise DetopsAssertionError(
                "roi_align: rois has sizes " + _sizes(boxes) + "; expected [K, 5] rows (batch_index, x1, y1, x2, y2):"
                + " the boxes tensor shape is not correct as Tensor[K, 5]"
            )
        rois = boxes
    else:
        rois = boxes_to_rois(boxes)
    size = _pair(output_size)
    if pool_mode == "avg":
        if not torch.jit.is_scripting():
            if eager():  # the op library's errors as detops' types
                return run(torch.ops.detops.roi_align, input, rois, spatial_scale, size[0], size[1], sampling_ratio,
                           aligned, backward_mode, truncation)
        return torch.ops.detops.roi_align(
            input, rois, spatial_scale, size[0], size[1], sampling_ratio, aligned, backward_mode, truncation
        )
    if pool_mode == "max":
        if not torch.jit.is_scripting():
            if eager():
                return run(torch.ops.detops.roi_align_max, input, rois, spatial_scale, size[0], size[1],
                           sampling_ratio, aligned, backward_mode, truncation)[0]
        out, _ = torch.ops.detops.roi_align_max(
            input, rois, spatial_scale, size[0], size[1], sampling_ratio, aligned, backward_mode, truncation
        )
        return out
    raise DetopsError("roi_align: pool_mode is '" + pool_mode + "'; expected one of 'avg', 'max'")


@torch.fx.wrap
def roi_align(
    input: Tensor,
    boxes: Union[Tensor, List[Tensor]],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    backward_mode: str = "exact",
    truncation: str = "float16",
    pool_mode: str = "avg",
) -> Tensor:
    """RoIAlign as ``torchvision.ops.roi_align``, computed by detops.

    Args:
        input: ``[N, C, H, W]`` float32, float64, float16 or bfloat16 (NCHW or channels_last).
        boxes: ``[K, 5]`` rois ``(batch_index, x1, y1, x2, y2)`` or a list of ``[L, 4]`` boxes, one
            tensor per image; float32/float64, or the input's dtype.
        output_size: ``int`` or ``(height, width)`` of the pooled output.
        spatial_scale, sampling_ratio, aligned: as torchvision.
        backward_mode: ``"exact"`` (bitwise reproducible, the default), ``"truncated"`` or
            ``"atomic"`` (torchvision's scatter; not reproducible on GPUs).
        truncation: ``"float16"`` or ``"bfloat16"``, the rounding of the truncated mode.
        pool_mode: ``"avg"`` (torchvision, detectron2) or ``"max"`` (mmcv's max pooling).

    Returns:
        ``[K, C, output_size[0], output_size[1]]`` in the input's dtype. Gradients flow to
        ``input`` only.

    Scriptable with ``torch.jit.script``, as torchvision's (the detops options follow torchvision's
    arguments, positional or keyword: TorchScript compiles no keyword-only argument with a default).
    """
    return _roi_align(input, boxes, output_size, spatial_scale, sampling_ratio, aligned, backward_mode, truncation,
                      pool_mode)


@torch.fx.wrap
def _roi_align_rotated(
    input: Tensor,
    rois: Tensor,
    output_size: BroadcastingList2[int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
    clockwise: bool,
    angle_unit: str,
    backward_mode: str,
    truncation: str,
) -> Tensor:
    # All-positional form of roi_align_rotated, for the modules (TorchScript 1.13 rejects
    # keyword-only arguments with defaults). The op validates the strings.
    size = _pair(output_size)
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.roi_align_rotated, input, rois, spatial_scale, size[0], size[1],
                       sampling_ratio, aligned, clockwise, angle_unit, backward_mode, truncation)
    return torch.ops.detops.roi_align_rotated(
        input, rois, spatial_scale, size[0], size[1], sampling_ratio, aligned, clockwise, angle_unit, backward_mode,
        truncation
    )


@torch.fx.wrap
def roi_align_rotated(
    input: Tensor,
    rois: Tensor,
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = True,
    clockwise: bool = False,
    angle_unit: str = "degrees",
    backward_mode: str = "exact",
    truncation: str = "float16",
) -> Tensor:
    """RoIAlign over rotated boxes, as detectron2's ``ROIAlignRotated`` (the defaults) or mmcv's
    ``roi_align_rotated`` (``angle_unit="radians"``), computed by detops.

    Args:
        input: ``[N, C, H, W]`` float32, float64, float16 or bfloat16 (NCHW or channels_last).
        rois: ``[K, 6]`` rows ``(batch_index, cx, cy, w, h, angle)`` in input-image coordinates;
            float32/float64, or the input's dtype.
        output_size: ``int`` or ``(height, width)`` of the pooled output.
        spatial_scale: factor from image to feature-map coordinates.
        sampling_ratio: samples per bin and axis; ``<= 0``: adaptive, ``ceil(box side / output side)``.
        aligned: half-pixel offset (detectron2 always; mmcv's default). False: mmcv's legacy mode
            (no offset, boxes at least 1x1). With True a negative width or height is an error.
        clockwise: the angle turns clockwise (mmcv's option); default counter-clockwise.
        angle_unit: ``"degrees"`` (detectron2) or ``"radians"`` (mmcv).
        backward_mode: ``"exact"`` (bitwise reproducible, the default), ``"truncated"`` or
            ``"atomic"`` (the anchors' scatter; not reproducible on GPUs, where it raises torch's
            nondeterminism alert).
        truncation: ``"float16"`` or ``"bfloat16"``, the rounding of the truncated mode.

    Returns:
        ``[K, C, output_size[0], output_size[1]]`` in the input's dtype (16-bit inputs run natively,
        computed in float32 and rounded once). Gradients flow to ``input`` only.

    Scriptable with ``torch.jit.script`` (every argument positional or keyword).
    """
    return _roi_align_rotated(input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise, angle_unit,
                              backward_mode, truncation)


def frozen_batch_norm_fold(
    weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, eps: float = 1e-5
) -> Tuple[Tensor, Tensor]:
    """Folds BatchNorm buffers into ``(scale, shift)``: ``scale = weight * (1 / sqrt(running_var + eps))``,
    ``shift = bias - running_mean * scale`` (float64 buffers fold in float64, others in float32)."""
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.frozen_batch_norm_fold, weight, bias, running_mean, running_var, eps)
    scale, shift = torch.ops.detops.frozen_batch_norm_fold(weight, bias, running_mean, running_var, eps)
    return scale, shift


def frozen_batch_norm(
    x: Tensor, scale: Tensor, shift: Tensor, epilogue: str = "none", residual: Optional[Tensor] = None
) -> Tensor:
    """``epilogue(x * scale + shift [+ residual])`` with epilogue ``"none"``, ``"relu"`` or
    ``"add_relu"`` (residual required). Gradients flow to ``x`` (and ``residual``), never to the
    frozen ``scale``/``shift``."""
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.frozen_batch_norm, x, scale, shift, epilogue, residual)
    return torch.ops.detops.frozen_batch_norm(x, scale, shift, epilogue, residual)


@torch.fx.wrap
def _grid_sample(input: Tensor, grid: Tensor, mode: str, padding_mode: str, align_corners: bool,
                 backward_mode: str) -> Tensor:
    # All-positional form of grid_sample (TorchScript 1.13 rejects keyword-only arguments with
    # defaults). The op checks the strings again, under its own argument names.
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.grid_sample, input, grid, mode, padding_mode, align_corners, backward_mode)
    return torch.ops.detops.grid_sample(input, grid, mode, padding_mode, align_corners, backward_mode)


@torch.fx.wrap
def grid_sample(
    input: Tensor,
    grid: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: Optional[bool] = None,
    backward_mode: str = "exact",
) -> Tensor:
    """``torch.nn.functional.grid_sample`` for 4-d inputs, computed by detops.

    Args:
        input: ``[N, C, H, W]`` float32, float64, float16 or bfloat16 (NCHW or channels_last; the
            output and its gradient keep the input's memory format).
        grid: ``[N, Ho, Wo, 2]`` (x, y) in [-1, 1]; the input's dtype, or float32/float64.
        mode: ``"bilinear"`` or ``"nearest"`` (torch's ``"bicubic"`` and 5-d inputs are not offered).
        padding_mode: ``"zeros"``, ``"border"`` or ``"reflection"``.
        align_corners: as torch; None means False, with a warning as torch gives.
        backward_mode: ``"exact"`` (bitwise reproducible, the default) or ``"atomic"`` (a scatter;
            not reproducible on GPUs, where it raises torch's nondeterminism alert).

    Returns:
        ``[N, C, Ho, Wo]`` in the input's dtype. Gradients flow to ``input`` and ``grid`` (zero for
        the grid with ``"nearest"``, as torch's); a NaN coordinate samples 0 and gets 0 gradients.

    Scriptable with ``torch.jit.script``, as torch's.
    """
    if not torch.jit.is_scripting():  # scripted, the op checks them (under its argument names)
        check_choice("grid_sample", "mode", mode, GRID_SAMPLE_MODES)
        check_choice("grid_sample", "padding_mode", padding_mode, GRID_SAMPLE_PADDING_MODES)
        check_choice("grid_sample", "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    if align_corners is None:
        warnings.warn(
            "grid_sample: align_corners is None, which means False (torch's default since 1.3.0); "
            "pass align_corners explicitly to silence this warning",
            stacklevel=2,
        )
        align_corners = False
    return _grid_sample(input, grid, mode, padding_mode, align_corners, backward_mode)


def point_sample(input: Tensor, point_coords: Tensor, **kwargs) -> Tensor:
    """detectron2's (and Mask2Former's) ``point_sample``: samples ``input`` ``[N, C, H, W]`` at
    ``point_coords`` in [0, 1] x [0, 1], given as ``[N, P, 2]`` (result ``[N, C, P]``) or
    ``[N, Ho, Wo, 2]`` (result ``[N, C, Ho, Wo]``). ``kwargs`` go to :func:`grid_sample`
    (``mode``, ``padding_mode``, ``align_corners``, ``backward_mode``)."""
    add_dim = point_coords.dim() == 3
    if add_dim:
        point_coords = point_coords.unsqueeze(2)
    output = grid_sample(input, 2.0 * point_coords - 1.0, **kwargs)
    if add_dim:
        output = output.squeeze(3)
    return output


@torch.fx.wrap
def ms_deform_attn(
    value: Tensor,
    value_spatial_shapes: Tensor,
    value_level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    backward_mode: str = "exact",
) -> Tensor:
    """Multi-scale deformable attention (Deformable DETR), computed by detops.

    Args:
        value: ``[B, S, M, D]`` float32, float64, float16 or bfloat16; ``S`` is the sum of the
            levels' ``H * W``.
        value_spatial_shapes: ``[L, 2]`` int64, ``(H, W)`` per level.
        value_level_start_index: ``[L]`` int64, the first row of each level in ``S``.
        sampling_locations: ``[B, Q, M, L, P, 2]`` (x, y) in [0, 1]; float32/float64 or the value's
            dtype.
        attention_weights: ``[B, Q, M, L, P]``; a floating-point one is cast to the value's dtype first,
            as mmcv's Function does (so float32 weights go with a 16-bit value; their gradient comes
            back in their own dtype). The locations are not cast: they keep their precision.
        backward_mode: ``"exact"`` (bitwise reproducible, the default) or ``"atomic"`` (the
            anchors' scatter of the value gradient; not reproducible on GPUs).

    Returns:
        ``[B, Q, M * D]`` in the value's dtype. Gradients flow to ``value``,
        ``sampling_locations`` and ``attention_weights``, each computed only when needed.
    """
    if attention_weights.dtype != value.dtype and attention_weights.is_floating_point() and value.is_floating_point():
        attention_weights = attention_weights.to(value.dtype)
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.ms_deform_attn, value, value_spatial_shapes, value_level_start_index,
                       sampling_locations, attention_weights, backward_mode)
    return torch.ops.detops.ms_deform_attn(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                                           attention_weights, backward_mode)


def _deform_groups(input: Tensor, offset: Tensor, weight: Tensor) -> Tuple[int, int]:
    """(groups, offset_groups) inferred from the shapes as torchvision infers them. Shapes that
    give none (wrong ranks, an empty kernel) give 1 and 1: the op then names what is wrong."""
    if input.dim() != 4 or weight.dim() != 4 or offset.dim() != 4:
        return 1, 1
    taps = weight.size(2) * weight.size(3)
    if taps <= 0:
        return 1, 1
    if offset.size(1) <= 0 or offset.size(1) % (2 * taps) != 0:
        raise DetopsError(
            "deform_conv2d: the shape of the offset tensor at dimension 1 is not valid: offset has sizes "
            + _sizes(offset) + "; expected [N, 2 * offset_groups * kh * kw, Ho, Wo] with offset_groups >= 1:"
            + " channels a positive multiple of 2 * kh * kw = " + str(2 * taps)
        )
    groups = 1
    if weight.size(1) > 0:
        groups = input.size(1) // weight.size(1)
    return groups, offset.size(1) // (2 * taps)


@torch.fx.wrap
def _deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: Tuple[int, int],
    padding: Tuple[int, int],
    dilation: Tuple[int, int],
    mask: Optional[Tensor],
    backward_mode: str,
    border_rule: str = "torchvision",
) -> Tensor:
    # All-positional form of deform_conv2d, for the modules (TorchScript 1.13 rejects keyword-only
    # arguments with defaults). The op validates the rest, backward_mode and border_rule included.
    stride_h, stride_w = _pair(stride)
    pad_h, pad_w = _pair(padding)
    dil_h, dil_w = _pair(dilation)
    groups, offset_groups = _deform_groups(input, offset, weight)
    return torch.ops.detops.deform_conv2d(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h,
                                          dil_w, groups, offset_groups, mask is not None, backward_mode, border_rule)


def _autocast_args(tensors: List[Optional[Tensor]]) -> List[Optional[Tensor]]:
    """Under torch.autocast, every tensor argument in the autocast dtype, as autocast treats
    torch's conv2d (deform_conv2d is a convolution): detops then computes natively in that dtype
    (float32 accumulation). torchvision instead casts to float32 and returns float32. Outside
    autocast the tensors are returned as they are (mixed dtypes are then a ValueError)."""
    dtype: Optional[torch.dtype] = None
    device_type = tensors[0].device.type  # the input's (never None)
    if device_type not in ("cpu", "cuda"):
        return tensors
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4 (the per-device functions warn there)
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
    elif device_type == "cuda" and torch.is_autocast_enabled():
        dtype = torch.get_autocast_gpu_dtype()
    elif device_type == "cpu" and torch.is_autocast_cpu_enabled():
        dtype = torch.get_autocast_cpu_dtype()
    if dtype is None:
        return tensors
    return [t if t is None or not t.is_floating_point() else t.to(dtype) for t in tensors]


@torch.fx.wrap
@torch.jit.unused
def _deform_conv2d_autocast(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: Tuple[int, int],
    padding: Tuple[int, int],
    dilation: Tuple[int, int],
    mask: Optional[Tensor],
    backward_mode: str,
    border_rule: str = "torchvision",
) -> Tensor:
    # _deform_conv2d after _autocast_args: the eager path of the function and the modules (a
    # scripted module calls _deform_conv2d directly).
    input, offset, weight, bias, mask = _autocast_args([input, offset, weight, bias, mask])
    if eager():  # the op library's errors as detops' types
        return run(_deform_conv2d, input, offset, weight, bias, stride, padding, dilation, mask, backward_mode,
                   border_rule)
    return _deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask, backward_mode, border_rule)


@torch.fx.wrap
def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: Tuple[int, int] = (1, 1),
    padding: Tuple[int, int] = (0, 0),
    dilation: Tuple[int, int] = (1, 1),
    mask: Optional[Tensor] = None,
    backward_mode: str = "exact",
    mode: Optional[str] = None,
    border_rule: str = "torchvision",
) -> Tensor:
    """Deformable convolution, ``torchvision.ops.deform_conv2d``'s signature and semantics,
    computed by detops: DCNv1 without ``mask``, DCNv2 (modulated) with it.

    Args:
        input: ``[N, Cin, H, W]`` float32, float64, float16 or bfloat16 (NCHW or channels_last; the
            output and grad_input keep the input's memory format).
        offset: ``[N, 2 * offset_groups * kh * kw, Ho, Wo]``: channel ``2 * (g * kh * kw + i * kw + j)``
            is the y offset of kernel tap ``(i, j)`` in offset group ``g``, the next one its x offset.
        weight: ``[Cout, Cin / groups, kh, kw]``; ``groups = Cin / weight.shape[1]``.
        bias: ``[Cout]`` or None.
        stride, padding, dilation: ``int`` or ``(h, w)``, as torchvision.
        mask: ``[N, offset_groups * kh * kw, Ho, Wo]`` modulation (DCNv2) or None (DCNv1).
        backward_mode: ``"exact"`` (bitwise reproducible gradients, the default) or ``"atomic"``
            (the anchors' scatter of grad_input; not reproducible on GPUs, where it raises torch's
            nondeterminism alert). The forward and the other gradients are the same in both.
            (``mode``: its deprecated name.)
        border_rule: the offset gradient of a sampling point at exactly -1 (row or column): the
            one-sided derivative (``"torchvision"``, the default) or 0 (``"mmcv"``: mmcv's and
            detectron2's kernels, which zero it unless ``-1 < y < H`` and ``-1 < x < W``). A fresh
            mmcv DCN layer (zero offsets) with padding puts every border tap there, so its first
            step differs; mmcv's stand-ins use ``"mmcv"``. Nothing else depends on it.

    All tensors share the input's dtype and device (under ``torch.autocast`` they are cast to the
    autocast dtype first, as for a convolution). 16-bit inputs run natively (float32 accumulation,
    rounded once), not upcast.

    Returns:
        ``[N, Cout, Ho, Wo]``. Gradients flow to input, offset, weight, mask and bias, each computed
        only when needed.

    Scriptable with ``torch.jit.script``, as torchvision's (``backward_mode`` and ``mode`` follow
    torchvision's arguments, positional or keyword; scripted, ``mode`` gives no warning and autocast
    does not cast, as in the scripted modules).
    """
    if torch.jit.is_scripting():
        if mode is not None:
            backward_mode = mode
        return _deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask, backward_mode, border_rule)
    else:
        backward_mode = resolve_backward_mode("deform_conv2d", backward_mode, mode)
        return _deform_conv2d_autocast(input, offset, weight, bias, stride, padding, dilation, mask, backward_mode,
                                       border_rule)
