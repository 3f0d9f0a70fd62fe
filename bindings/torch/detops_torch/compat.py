# detectron2- and mmcv-compatible modules over the detops ops, and the optional registration into mmcv/mmengine.
"""Drop-in modules with the constructor signatures, defaults and state dicts of detectron2 and
mmcv: each op's ``compat`` part (``detops_torch/_ops/<op>/compat.py``, whose docstring lists its
modules and their anchors), re-exported here. detectron2's ``ROIAlign``, ``FrozenBatchNorm2d``,
``DeformConv`` and ``ModulatedDeformConv``; mmcv's ``RoIAlign``, ``SyncBatchNorm``,
``DeformConv2d`` and ``ModulatedDeformConv2d``.

Neither detectron2 nor mmcv is needed to use them. :func:`register_mmcv` makes them (and the
rotated, deformable-convolution and deformable-attention modules of :mod:`detops_torch.nn`)
nameable from mmdetection and mmrotate configs (``roi_layer=dict(type='DetopsRoIAlign', ...)``,
``norm_cfg=dict(type='DetopsSyncBN')``, ``dcn=dict(type='DetopsDCN', ...)`` or ``'DetopsDCNv2'``).
"""
import importlib
from typing import Dict

from . import _ops

# Each op's compat part (detops_torch/_ops/<op>/compat.py), re-exported.
__all__ = _ops.export(_ops.parts("compat"), globals()) + ["register_mmcv"]

# mmcv 1.x: the registry each kind of layer is looked up in (``"ops"``, the RoI layers, have none).
_MMCV1_REGISTRIES = {
    "norm": ("mmcv.NORM_LAYERS", "mmcv.cnn", "NORM_LAYERS"),
    "conv": ("mmcv.CONV_LAYERS", "mmcv.cnn", "CONV_LAYERS"),
    "attention": ("mmcv.ATTENTION", "mmcv.cnn.bricks.registry", "ATTENTION"),
}


def register_mmcv(force: bool = True) -> Dict[str, object]:
    """Makes the detops layers nameable from mmdetection and mmrotate configs.

    Sets ``mmcv.ops.DetopsRoIAlign`` and ``mmcv.ops.DetopsRoIAlignRotated`` (the RoI extractors of
    mmdetection and mmrotate look layers up with ``getattr(mmcv.ops, type)``). Registers, with mmcv
    2.x, in mmengine's ``MODELS``: ``DetopsSyncBN`` (the detops
    :class:`~detops_torch.SyncBatchNorm`), ``DetopsRoIAlign``, ``DetopsRoIAlignRotated``,
    ``DetopsDCN`` and ``DetopsDCNv2`` (:class:`~detops_torch.DeformConv2dPack` and
    :class:`~detops_torch.ModulatedDeformConv2dPack`, for ``dcn=dict(type='DetopsDCN', ...)``, as
    mmdetection's ``DCN`` and ``DCNv2``) and ``DetopsMultiScaleDeformableAttention``; with mmcv
    1.x, the same names in the registries mmcv 1.x looks them up in: ``NORM_LAYERS``
    (``DetopsSyncBN``, and ``DetopsMMSyncBN``: :class:`SyncBatchNorm`, mmcv's ``MMSyncBN``), ``CONV_LAYERS`` (``DetopsDCN``, ``DetopsDCNv2``) and ``ATTENTION``
    (``DetopsMultiScaleDeformableAttention``). Returns what was registered, by qualified name.

    Raises ImportError, naming the cause, when mmcv is not importable.
    """
    try:
        import mmcv.ops as mmcv_ops  # noqa: F401
    except Exception as exc:  # ImportError, or mmcv's own failure to load its extension
        raise ImportError(
            "detops_torch.compat.register_mmcv() needs mmcv with mmcv.ops (pip install mmcv); "
            f"importing mmcv.ops failed: {type(exc).__name__}: {exc}"
        ) from exc
    layers = {name: cls for name, (cls, _) in _ops.mmcv_layers().items()}
    registered: Dict[str, object] = {}
    for name, (cls, kind) in _ops.mmcv_layers().items():
        if kind == "ops":  # the RoI extractors look layers up with getattr(mmcv.ops, type)
            setattr(mmcv_ops, name, cls)
            registered["mmcv.ops." + name] = cls
    try:  # mmcv 2.x: one registry in mmengine
        from mmengine.registry import MODELS  # type: ignore
        targets = [("mmengine.MODELS", MODELS, list(layers))]
    except Exception:  # mmcv 1.x: a registry per kind of layer (the RoI layers have none)
        targets = []
        for kind, (prefix, where, attr) in _MMCV1_REGISTRIES.items():
            names = [name for name, (_, k) in _ops.mmcv_layers().items() if k == kind]
            try:
                targets.append((prefix, getattr(importlib.import_module(where), attr), names))
            except Exception:
                continue
    for prefix, registry, names in targets:
        for name in names:
            registry.register_module(name=name, module=layers[name], force=force)
            registered[f"{prefix}.{name}"] = layers[name]
    return registered
