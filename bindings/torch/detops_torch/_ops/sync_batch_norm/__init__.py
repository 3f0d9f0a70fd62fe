# SyncBatchNorm: the phase ops torch.ops.detops.sync_batch_norm_* (bindings/torch/csrc/sync_batch_norm.cpp), detops' SyncBatchNorm over torch.distributed and mmcv's.
"""The binding of one op, in one place: ``_registration`` (its fake kernels; autograd, error types
and the nondeterminism alert for the stable layer), then ``distributed``, ``compat``,
whose ``__all__`` the package's namespaces of the same name re-export (``CONVERTERS`` and
``MMCV_LAYERS``, where a part has them, feed ``convert()`` and ``register_mmcv()``)."""
from . import _registration  # noqa: F401  (registers with torch.ops.detops)
from . import distributed, compat  # noqa: F401
from .distributed import SyncBatchNorm, convert_sync_batchnorm

# What ``import detops_torch`` exports from this op.
__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]
