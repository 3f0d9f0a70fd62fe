# grid_sample: torch.ops.detops.grid_sample (bindings/torch/csrc/grid_sample.cpp), grid_sample (torch's signature) and point_sample (detectron2's).
"""The binding of one op, in one place: ``_registration`` (its fake kernels; autograd, error types
and the nondeterminism alert for the stable layer), then ``functional``,
whose ``__all__`` the package's namespaces of the same name re-export (``CONVERTERS`` and
``MMCV_LAYERS``, where a part has them, feed ``convert()`` and ``register_mmcv()``)."""
from . import _registration  # noqa: F401  (registers with torch.ops.detops)
from . import functional  # noqa: F401
from .functional import grid_sample, point_sample

# What ``import detops_torch`` exports from this op.
__all__ = ["grid_sample", "point_sample"]
