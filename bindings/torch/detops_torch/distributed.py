# SyncBatchNorm over torch.distributed: detops' int64 statistics records all-gathered with any process group.
"""Deterministic SyncBatchNorm for PyTorch: :class:`SyncBatchNorm` and :func:`convert_sync_batchnorm`
(``detops_torch/_ops/sync_batch_norm/distributed.py``, whose docstring describes the phases, the
rank-agreement header and the gradients), re-exported."""
from . import _ops

__all__ = _ops.export(_ops.parts("distributed"), globals())
