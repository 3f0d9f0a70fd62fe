# RoIAlign: torch.ops.detops.roi_align and roi_align_max (bindings/torch/csrc/roi_align.cpp), roi_align, torchvision's RoIAlign and MultiScaleRoIAlign, detectron2's ROIAlign and mmcv's RoIAlign.
"""The binding of one op, in one place: ``_registration`` (its fake kernels; autograd, error types
and the nondeterminism alert for the stable layer), then ``functional``, ``nn``, ``compat``,
whose ``__all__`` the package's namespaces of the same name re-export (``CONVERTERS`` and
``MMCV_LAYERS``, where a part has them, feed ``convert()`` and ``register_mmcv()``)."""
from . import _registration  # noqa: F401  (registers with torch.ops.detops)
from . import functional, nn, compat  # noqa: F401
from .functional import roi_align
from .nn import MultiScaleRoIAlign, RoIAlign

# What ``import detops_torch`` exports from this op.
__all__ = ["roi_align", "RoIAlign", "MultiScaleRoIAlign"]
