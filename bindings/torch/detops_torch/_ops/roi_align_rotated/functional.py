# roi_align_rotated: detectron2's ROIAlignRotated semantics, or mmcv's roi_align_rotated through angle_unit.
"""RoIAlignRotated's functional form: ``roi_align_rotated`` pools rotated boxes ``(batch_index,
cx, cy, w, h, angle)`` with detectron2's ``ROIAlignRotated`` semantics (degrees,
counter-clockwise) or, through ``angle_unit="radians"``, ``aligned`` and ``clockwise``, mmcv's
``roi_align_rotated``; the trailing options of ``roi_align`` (no max pooling: neither anchor has
it), positional or keyword."""
import torch
import torch.fx
from torch import Tensor
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ..._errors import eager, run

__all__ = ["ANGLE_UNITS", "roi_align_rotated"]


# roi_align_rotated's angle column: detectron2's degrees, mmcv's radians.
ANGLE_UNITS = ("degrees", "radians")


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
