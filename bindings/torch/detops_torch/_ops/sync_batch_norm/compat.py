# mmcv's SyncBatchNorm (mmdetection's MMSyncBN): detops' SyncBatchNorm with mmcv's gradient semantics.
"""mmcv ``mmcv.ops.SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
track_running_stats=True, group=None, stats_mode='default')`` (config type ``MMSyncBN``): the
detops :class:`~detops_torch.SyncBatchNorm` with mmcv's gradient semantics."""
from typing import Callable, Dict, Tuple

from torch import nn

from ..._common import _built_quietly, _take, check_choice
from .distributed import SyncBatchNorm as _SyncBatchNorm
from .distributed import _GroupMeanGradient

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_SyncBatchNorm):
    """mmcv's ``SyncBatchNorm`` (``mmcv.ops``; mmdetection's ``MMSyncBN``), computed by detops.

    mmcv's constructor and attributes (``group``, ``group_size``, ``stats_mode``) and mmcv's
    gradients: in training over a group of several ranks, the weight and bias gradients are
    averaged over the group (mmcv all-reduces them and divides by the group size; here they are
    gathered and summed in rank order, so the bits repeat), where torch's and
    :class:`detops_torch.SyncBatchNorm` leave each rank its own. The statistics are detops' (the
    keyword-only ``mode``): the moments of the global batch, each sample weighted alike. That is
    mmcv's ``stats_mode='N'``, and its ``'default'`` (each rank's mean weighted alike) whenever
    every rank holds the same batch size, as data-parallel training does; both values are taken.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, group=None,
                 stats_mode="default", *, mode="default"):
        check_choice("SyncBatchNorm", "stats_mode", stats_mode, ("default", "N"))
        super().__init__(num_features, eps, momentum, affine, track_running_stats, group, mode=mode)
        self.group = group
        self.stats_mode = stats_mode

    @property
    def group_size(self) -> int:
        """The number of ranks in the group (1 without torch.distributed), as mmcv's attribute."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.group if self.group is not None else dist.group.WORLD)

    def _affine(self, group):
        if group is None or self.weight is None:
            return self.weight, self.bias
        return _GroupMeanGradient.apply(self.weight, group), _GroupMeanGradient.apply(self.bias, group)

    def extra_repr(self):
        return super().extra_repr() + f", stats_mode={self.stats_mode!r}"


def _mmcv_sync_bn(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: SyncBatchNorm(m.num_features, m.eps, m.momentum, m.affine,
                                                      m.track_running_stats, m.group, m.stats_mode))
    names = ("weight", "bias") if m.affine else ()
    names += ("running_mean", "running_var", "num_batches_tracked") if m.track_running_stats else ()
    return _take(new, m, names)


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("mmcv.ops.sync_bn", "SyncBatchNorm"): _mmcv_sync_bn,
}

# The names detops_torch.compat.register_mmcv() gives these layers in mmcv's registries: name ->
# (class, kind); kinds: "ops" (also an attribute of mmcv.ops), "norm", "conv", "attention".
MMCV_LAYERS = {
    "DetopsSyncBN": (_SyncBatchNorm, "norm"),
    "DetopsMMSyncBN": (SyncBatchNorm, "norm"),
}
