# Modules over the detops ops: torchvision's RoIAlign, MultiScaleRoIAlign (the FPN pooler), FrozenBatchNorm2d, DeformConv2d; detectron2's ROIAlignRotated and mmcv's RoIAlignRotated; mmcv's MultiScaleDeformableAttention, DeformConv2dPack, ModulatedDeformConv2dPack and Deformable-DETR's MSDeformAttn.
"""Modules with the anchors' constructor signatures and defaults, computed by detops: each op's
``nn`` part (``detops_torch/_ops/<op>/nn.py``, whose docstring lists its modules and their
anchors), re-exported here. torchvision's ``RoIAlign``, ``MultiScaleRoIAlign``,
``FrozenBatchNorm2d`` and ``DeformConv2d``; detectron2's ``ROIAlignRotated``; mmcv's
``RoIAlignRotated``, ``MultiScaleDeformableAttention``, ``DeformConv2dPack`` and
``ModulatedDeformConv2dPack``; Deformable-DETR's ``MSDeformAttn``.

Every RoI module (rotated or not) also takes the keyword-only ``backward_mode`` (default
``"exact"``) and ``truncation``; the attention and deformable convolution modules take the
keyword-only ``backward_mode`` (``"exact"`` or ``"atomic"``).
"""
from . import _ops

__all__ = _ops.export(_ops.parts("nn"), globals())
