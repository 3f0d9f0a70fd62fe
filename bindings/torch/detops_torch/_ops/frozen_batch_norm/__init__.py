# FrozenBatchNorm2d: torch.ops.detops.frozen_batch_norm* (bindings/torch/csrc/frozen_batch_norm.cpp), the fold and apply functions, torchvision's and detectron2's FrozenBatchNorm2d.
"""The binding of one op, in one place: ``_registration`` (its fake kernels; autograd, error types
and the nondeterminism alert for the stable layer), then ``functional``, ``nn``, ``compat``,
whose ``__all__`` the package's namespaces of the same name re-export (``CONVERTERS`` and
``MMCV_LAYERS``, where a part has them, feed ``convert()`` and ``register_mmcv()``)."""
from . import _registration  # noqa: F401  (registers with torch.ops.detops)
from . import functional, nn, compat  # noqa: F401
from .nn import FrozenBatchNorm2d, convert_frozen_batchnorm

# What ``import detops_torch`` exports from this op.
__all__ = ["FrozenBatchNorm2d", "convert_frozen_batchnorm"]
