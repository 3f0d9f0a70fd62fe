# roi_align (torchvision's signature; mmcv's max pooling through pool_mode) and boxes_to_rois.
"""RoIAlign's functional form: ``roi_align`` has ``torchvision.ops.roi_align``'s signature (boxes
as a ``[K, 5]`` tensor or a list of per-image ``[L, 4]`` tensors) plus trailing options: the
backward mode, the truncation format of the truncated mode and the pooling mode (``"max"`` is
mmcv's max pooling), positional or keyword, so it scripts where torchvision's does."""
from typing import List, Union

import torch
import torch.fx
from torch import Tensor
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ..._common import BACKWARD_MODES, TRUNCATIONS, _sizes  # noqa: F401  (BACKWARD_MODES, TRUNCATIONS: exported)
from ..._errors import DetopsAssertionError, DetopsError, eager, run

__all__ = ["BACKWARD_MODES", "TRUNCATIONS", "POOL_MODES", "roi_align", "boxes_to_rois"]


POOL_MODES = ("avg", "max")


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
