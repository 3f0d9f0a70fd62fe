# Multi-scale deformable attention: torch.ops.detops.ms_deform_attn (bindings/torch/csrc/ms_deform_attn.cpp), ms_deform_attn, mmcv's MultiScaleDeformableAttention and Deformable-DETR's MSDeformAttn.
"""The binding of one op, in one place: ``_registration`` (its fake kernels; autograd, error types
and the nondeterminism alert for the stable layer), then ``functional``, ``nn``,
whose ``__all__`` the package's namespaces of the same name re-export (``CONVERTERS`` and
``MMCV_LAYERS``, where a part has them, feed ``convert()`` and ``register_mmcv()``)."""
from . import _registration  # noqa: F401  (registers with torch.ops.detops)
from . import functional, nn  # noqa: F401
from .functional import ms_deform_attn
from .nn import MSDeformAttn, MultiScaleDeformableAttention

# What ``import detops_torch`` exports from this op.
__all__ = ["ms_deform_attn", "MultiScaleDeformableAttention", "MSDeformAttn"]
