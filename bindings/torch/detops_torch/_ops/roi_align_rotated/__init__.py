# RoIAlignRotated: torch.ops.detops.roi_align_rotated (bindings/torch/csrc/roi_align_rotated.cpp), roi_align_rotated, detectron2's ROIAlignRotated and mmcv's RoIAlignRotated.
"""The binding of one op, in one place: ``_registration`` (its fake kernels; autograd, error types
and the nondeterminism alert for the stable layer), then ``functional``, ``nn``,
whose ``__all__`` the package's namespaces of the same name re-export (``CONVERTERS`` and
``MMCV_LAYERS``, where a part has them, feed ``convert()`` and ``register_mmcv()``)."""
from . import _registration  # noqa: F401  (registers with torch.ops.detops)
from . import functional, nn  # noqa: F401
from .functional import roi_align_rotated
from .nn import ROIAlignRotated, RoIAlignRotated

# What ``import detops_torch`` exports from this op.
__all__ = ["roi_align_rotated", "ROIAlignRotated", "RoIAlignRotated"]
