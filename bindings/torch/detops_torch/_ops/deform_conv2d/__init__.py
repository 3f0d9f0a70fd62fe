# Deformable convolution: torch.ops.detops.deform_conv2d (bindings/torch/csrc/deform_conv2d.cpp), deform_conv2d, torchvision's DeformConv2d, mmcv's four layers and detectron2's two.
"""The binding of one op, in one place: ``_registration`` (its fake kernels; autograd, error types
and the nondeterminism alert for the stable layer), then ``functional``, ``nn``, ``compat``,
whose ``__all__`` the package's namespaces of the same name re-export (``CONVERTERS`` and
``MMCV_LAYERS``, where a part has them, feed ``convert()`` and ``register_mmcv()``)."""
from . import _registration  # noqa: F401  (registers with torch.ops.detops)
from . import functional, nn, compat  # noqa: F401
from .functional import deform_conv2d
from .nn import DeformConv2d, DeformConv2dPack, ModulatedDeformConv2dPack

# What ``import detops_torch`` exports from this op.
__all__ = ["deform_conv2d", "DeformConv2d", "DeformConv2dPack", "ModulatedDeformConv2dPack"]
