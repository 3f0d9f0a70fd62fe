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
from . import _ops
from ._common import check_choice, check_roi_options, resolve_backward_mode  # noqa: F401  (the modules' checks)

# Each op's functional part (detops_torch/_ops/<op>/functional.py), re-exported.
__all__ = _ops.export(_ops.parts("functional"), globals())
