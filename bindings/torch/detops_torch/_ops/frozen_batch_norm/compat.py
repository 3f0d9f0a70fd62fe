# detectron2's FrozenBatchNorm2d (its initial state, repr and converter classmethod) over detops' FrozenBatchNorm2d.
"""detectron2 ``detectron2.layers.FrozenBatchNorm2d(num_features, eps=1e-5)`` (running_var starts
at ``1 - eps``; ``convert_frozen_batchnorm`` classmethod)."""
from typing import Callable, Dict, Tuple

from torch import nn

from .nn import FrozenBatchNorm2d as _FrozenBatchNorm2d
from .nn import _take_buffers
from .nn import convert_frozen_batchnorm as _convert_frozen_batchnorm

__all__ = ["FrozenBatchNorm2d"]


class FrozenBatchNorm2d(_FrozenBatchNorm2d):
    """detectron2's ``FrozenBatchNorm2d``: the detops module with detectron2's initial state
    (``running_var = 1 - eps``, so that ``running_var + eps`` is 1 up to float32 rounding), its
    ``repr`` and its ``convert_frozen_batchnorm`` classmethod."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__(num_features, eps)
        self.running_var.fill_(1.0).sub_(eps)

    @classmethod
    def convert_frozen_batchnorm(cls, module: nn.Module) -> nn.Module:
        """detectron2's converter: BatchNorm2d / SyncBatchNorm -> this class."""
        return _convert_frozen_batchnorm(module, cls)

    def __repr__(self) -> str:
        return f"FrozenBatchNorm2d(num_features={self.num_features}, eps={self.eps})"


def _d2_frozen_bn(m: nn.Module, opts) -> nn.Module:
    return _take_buffers(FrozenBatchNorm2d(m.num_features, m.eps), m)


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("detectron2.layers.batch_norm", "FrozenBatchNorm2d"): _d2_frozen_bn,
}
