# Functional entry points of detops_torch: torchvision-compatible roi_align and FrozenBatchNorm2d's fold/apply over torch.ops.detops.
"""Functional forms of the detops ops.

``roi_align`` has ``torchvision.ops.roi_align``'s signature (boxes as a ``[K, 5]`` tensor or a list
of per-image ``[L, 4]`` tensors) plus keyword-only options: the backward mode, the truncation
format of the truncated mode and the pooling mode (``"max"`` is mmcv's max pooling).
"""
from typing import List, Optional, Tuple, Union

import torch
import torch.fx
from torch import Tensor
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

__all__ = [
    "BACKWARD_MODES",
    "TRUNCATIONS",
    "POOL_MODES",
    "EPILOGUES",
    "roi_align",
    "boxes_to_rois",
    "frozen_batch_norm",
    "frozen_batch_norm_fold",
]

# The accepted option strings. The ops validate them again in their forward (with detops' own
# message); the modules check them at construction so a typo fails where it was written.
BACKWARD_MODES = ("exact", "truncated", "atomic")
TRUNCATIONS = ("float16", "bfloat16")
POOL_MODES = ("avg", "max")
EPILOGUES = ("none", "relu", "add_relu")


def _sizes(t: Tensor) -> str:
    parts: List[str] = []
    for s in t.shape:
        parts.append(str(s))
    return "[" + ", ".join(parts) + "]"


def check_choice(owner: str, name: str, value: str, allowed: Tuple[str, ...]) -> None:
    """Raises ValueError unless ``value`` is one of ``allowed`` (used by the modules' constructors)."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(
            f"{owner}: {name} is {value!r}; expected one of " + ", ".join(repr(a) for a in allowed)
        )


def check_roi_options(owner: str, backward_mode: str, truncation: str) -> None:
    """Raises ValueError unless backward_mode and truncation are ones detops knows."""
    check_choice(owner, "backward_mode", backward_mode, BACKWARD_MODES)
    check_choice(owner, "truncation", truncation, TRUNCATIONS)


def boxes_to_rois(boxes: List[Tensor]) -> Tensor:
    """Converts per-image ``[L, 4]`` boxes to ``[K, 5]`` rois (batch index first), as torchvision
    does (same dtype and device; the index column is written in the boxes' dtype)."""
    if len(boxes) == 0:
        raise ValueError("roi_align: boxes is an empty list; expected one [L, 4] tensor per image")
    first = boxes[0]
    for i, b in enumerate(boxes):
        if b.dim() != 2 or b.size(1) != 4:
            raise ValueError(
                "roi_align: boxes[" + str(i) + "] has sizes " + _sizes(b)
                + "; expected [L, 4] rows (x1, y1, x2, y2)"
            )
        if b.dtype != first.dtype:
            raise ValueError(
                "roi_align: boxes[" + str(i) + "] has dtype " + str(b.dtype)
                + "; expected " + str(first.dtype) + " (the dtype of boxes[0])"
            )
        if b.device != first.device:
            raise ValueError(
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
        rois = boxes
    else:
        rois = boxes_to_rois(boxes)
    size = _pair(output_size)
    if pool_mode == "avg":
        return torch.ops.detops.roi_align(
            input, rois, spatial_scale, size[0], size[1], sampling_ratio, aligned, backward_mode, truncation
        )
    if pool_mode == "max":
        out, _ = torch.ops.detops.roi_align_max(
            input, rois, spatial_scale, size[0], size[1], sampling_ratio, aligned, backward_mode, truncation
        )
        return out
    raise ValueError("roi_align: pool_mode is '" + pool_mode + "'; expected one of 'avg', 'max'")


@torch.fx.wrap
def roi_align(
    input: Tensor,
    boxes: Union[Tensor, List[Tensor]],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    *,
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

    TorchScript does not compile keyword-only arguments; scripted code uses the modules
    (:class:`detops_torch.RoIAlign` and the compat ones script) or ``torch.ops.detops.roi_align``.
    """
    return _roi_align(input, boxes, output_size, spatial_scale, sampling_ratio, aligned, backward_mode, truncation,
                      pool_mode)


def frozen_batch_norm_fold(
    weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, eps: float = 1e-5
) -> Tuple[Tensor, Tensor]:
    """Folds BatchNorm buffers into ``(scale, shift)``: ``scale = weight * (1 / sqrt(running_var + eps))``,
    ``shift = bias - running_mean * scale`` (float64 buffers fold in float64, others in float32)."""
    scale, shift = torch.ops.detops.frozen_batch_norm_fold(weight, bias, running_mean, running_var, eps)
    return scale, shift


def frozen_batch_norm(
    x: Tensor, scale: Tensor, shift: Tensor, epilogue: str = "none", residual: Optional[Tensor] = None
) -> Tensor:
    """``epilogue(x * scale + shift [+ residual])`` with epilogue ``"none"``, ``"relu"`` or
    ``"add_relu"`` (residual required). Gradients flow to ``x`` (and ``residual``), never to the
    frozen ``scale``/``shift``."""
    return torch.ops.detops.frozen_batch_norm(x, scale, shift, epilogue, residual)
