# detops_torch.convert(): swaps a torchvision/detectron2/mmcv model's RoI, deformable and FrozenBatchNorm2d modules (and BatchNorm2d on request) for detops' in place.
"""Module conversion.

The anchors' classes are recognised by ``(class.__module__, class.__qualname__)``, so converting a
detectron2 or mmcv model needs neither to be importable here, and a subclass (which may change
behaviour) is left alone. Each replacement keeps the original's configuration, parameters and
buffers (the same tensors and submodules: device, dtype and optimizer references unchanged) and
training flag; forward hooks registered on a replaced module are not carried over. Building a
replacement does not advance the global random generator.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

from . import _ops
from ._common import check_roi_options
from ._errors import DetopsError
from ._ops.frozen_batch_norm.nn import convert_frozen_batchnorm

__all__ = ["convert", "TARGETS"]

_BATCHNORM_CHOICES = (None, "frozen", "sync")
_OPTIONS = ("backward_mode", "truncation", "process_group", "mode")

# (module, qualified class name) -> builder of the detops replacement: every op's CONVERTERS
# (detops_torch/_ops/<op>/{nn,compat}.py).
TARGETS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = _ops.converters()


def _replacement(m: nn.Module, opts) -> Optional[nn.Module]:
    cls = type(m)
    build = TARGETS.get((cls.__module__, cls.__qualname__))
    if build is not None:
        return build(m, opts)
    if opts["batchnorm"] == "frozen" and isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm)):
        return convert_frozen_batchnorm(m)
    return None


def _convert(m: nn.Module, opts) -> nn.Module:
    new = _replacement(m, opts)
    if new is not None:
        new.train(m.training)
        m = new  # and its children (e.g. the norm a detectron2 DeformConv carries) converted too
    for name, child in list(m.named_children()):
        new_child = _convert(child, opts)
        if new_child is not child:
            setattr(m, name, new_child)
    return m


def convert(model: nn.Module, batchnorm: Optional[str] = None, **options) -> nn.Module:
    """Swaps, in place, every torchvision ``RoIAlign``, ``MultiScaleRoIAlign``,
    ``FrozenBatchNorm2d`` and ``DeformConv2d``, detectron2 ``ROIAlign``, ``ROIAlignRotated``,
    ``FrozenBatchNorm2d``, ``DeformConv`` and ``ModulatedDeformConv``, mmcv ``RoIAlign``, ``RoIAlignRotated``, ``SyncBatchNorm``, ``DeformConv2d``,
    ``DeformConv2dPack``, ``ModulatedDeformConv2d``, ``ModulatedDeformConv2dPack`` and
    ``MultiScaleDeformableAttention``, and Deformable-DETR ``MSDeformAttn`` in ``model`` for the
    detops module with the same configuration, parameters and buffers.

    Args:
        model: any ``nn.Module``.
        batchnorm: ``None`` (leave BatchNorm layers alone), ``"frozen"`` (``BatchNorm2d`` and
            ``SyncBatchNorm`` become :class:`FrozenBatchNorm2d`) or ``"sync"`` (every BatchNorm
            becomes the detops :class:`SyncBatchNorm`, through :func:`convert_sync_batchnorm`).
        backward_mode: the backward mode (default ``"exact"``). The deformable modules
            (deformable convolution and attention) have no truncated mode: they run ``"exact"``
            under ``"truncated"``.
        truncation: ``"float16"`` or ``"bfloat16"`` for the truncated mode.
        process_group, mode: passed to :func:`convert_sync_batchnorm` (``batchnorm="sync"`` only).

    Returns:
        ``model`` (or its replacement if ``model`` itself is a target module).
    """
    if batchnorm not in _BATCHNORM_CHOICES:
        raise DetopsError(f"convert: batchnorm is {batchnorm!r}; expected None, 'frozen' or 'sync'")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"convert: unexpected option(s) {', '.join(unknown)}; expected some of {', '.join(_OPTIONS)}")
    if batchnorm != "sync" and ("process_group" in options or "mode" in options):
        raise DetopsError("convert: process_group and mode configure SyncBatchNorm; expected batchnorm='sync' with them")
    opts: Dict[str, object] = {
        "batchnorm": batchnorm,
        "backward_mode": options.get("backward_mode", "exact"),
        "truncation": options.get("truncation", "float16"),
    }
    check_roi_options("convert", opts["backward_mode"], opts["truncation"])
    if not isinstance(model, nn.Module):
        raise DetopsError(f"convert: model is a {type(model).__name__}; expected a torch.nn.Module")
    if isinstance(model, torch.jit.ScriptModule):
        raise DetopsError("convert: model is a TorchScript module; expected an eager nn.Module")
    model = _convert(model, opts)
    if batchnorm == "sync":
        from .distributed import convert_sync_batchnorm

        sync_kwargs = {k: options[k] for k in ("process_group", "mode") if k in options}
        model = convert_sync_batchnorm(model, **sync_kwargs)
    return model
