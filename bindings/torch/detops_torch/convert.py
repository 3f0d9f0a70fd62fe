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

from . import compat
from . import nn as _dnn
from ._errors import DetopsError
from .functional import check_roi_options

__all__ = ["convert", "TARGETS"]

_BATCHNORM_CHOICES = (None, "frozen", "sync")
_OPTIONS = ("backward_mode", "truncation", "process_group", "mode")


def _roi_kwargs(opts: Dict[str, object]) -> Dict[str, object]:
    return {"backward_mode": opts["backward_mode"], "truncation": opts["truncation"]}


def _gather_mode(opts: Dict[str, object]) -> str:
    # The deformable ops have two modes: "atomic", or "exact" (also under "truncated", which only
    # the RoI ops have).
    return "atomic" if opts["backward_mode"] == "atomic" else "exact"


def _built_quietly(build: Callable[[], nn.Module]) -> nn.Module:
    # The replacement's constructor draws initial parameters that are then replaced by the
    # original's: the draws must not move the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        return build()


def _take(new: nn.Module, old: nn.Module, names) -> nn.Module:
    for name in names:
        setattr(new, name, getattr(old, name))  # the same Parameter / submodule objects
    return new


def _tv_roi_align(m: nn.Module, opts) -> nn.Module:
    return _dnn.RoIAlign(m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned, **_roi_kwargs(opts))


def _tv_multiscale(m: nn.Module, opts) -> nn.Module:
    new = _dnn.MultiScaleRoIAlign(
        m.featmap_names, m.output_size, m.sampling_ratio,
        canonical_scale=getattr(m, "canonical_scale", 224), canonical_level=getattr(m, "canonical_level", 4),
        **_roi_kwargs(opts),
    )
    # The scales and level mapper are inferred on the first forward; keep them if already there.
    new.scales = m.scales
    new.map_levels = m.map_levels
    return new


def _take_buffers(new: nn.Module, old: nn.Module) -> nn.Module:
    for name in ("weight", "bias", "running_mean", "running_var"):
        setattr(new, name, getattr(old, name))  # same tensors: the checkpoint and device stay
    return new


def _tv_frozen_bn(m: nn.Module, opts) -> nn.Module:
    return _take_buffers(_dnn.FrozenBatchNorm2d(m.weight.shape[0], m.eps), m)


def _d2_roi_align(m: nn.Module, opts) -> nn.Module:
    return compat.ROIAlign(m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned, **_roi_kwargs(opts))


def _d2_frozen_bn(m: nn.Module, opts) -> nn.Module:
    return _take_buffers(compat.FrozenBatchNorm2d(m.num_features, m.eps), m)


def _mmcv_roi_align(m: nn.Module, opts) -> nn.Module:
    return compat.RoIAlign(m.output_size, m.spatial_scale, m.sampling_ratio, m.pool_mode, m.aligned,
                           m.use_torchvision, **_roi_kwargs(opts))


def _mmcv_sync_bn(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: compat.SyncBatchNorm(m.num_features, m.eps, m.momentum, m.affine,
                                                      m.track_running_stats, m.group, m.stats_mode))
    names = ("weight", "bias") if m.affine else ()
    names += ("running_mean", "running_var", "num_batches_tracked") if m.track_running_stats else ()
    return _take(new, m, names)


def _tv_deform_conv2d(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: _dnn.DeformConv2d(
        m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups,
        bias=m.bias is not None, backward_mode=_gather_mode(opts)))
    return _take(new, m, ("weight", "bias"))


def _d2_roi_align_rotated(m: nn.Module, opts) -> nn.Module:
    return _dnn.ROIAlignRotated(m.output_size, m.spatial_scale, m.sampling_ratio, **_roi_kwargs(opts))


def _mmcv_roi_align_rotated(m: nn.Module, opts) -> nn.Module:
    return _dnn.RoIAlignRotated(m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned, m.clockwise,
                                **_roi_kwargs(opts))


def _mmcv_deform_conv(cls, taken: Tuple[str, ...]) -> Callable[[nn.Module, Dict[str, object]], nn.Module]:
    """The builder for one of mmcv's four deformable convolutions: their common constructor
    arguments, then DCNv2's bias flag (its ``taken`` names the bias) or DCNv1's im2col_step; the
    Parameters and submodules in ``taken`` are the old module's."""

    def build(m: nn.Module, opts) -> nn.Module:
        extra = {"bias": m.bias is not None} if "bias" in taken else {"im2col_step": m.im2col_step}
        new = _built_quietly(lambda: cls(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding,
                                         m.dilation, m.groups, m.deform_groups, backward_mode=_gather_mode(opts), **extra))
        return _take(new, m, taken)

    return build


def _d2_deform_conv(cls, taken: Tuple[str, ...]) -> Callable[[nn.Module, Dict[str, object]], nn.Module]:
    """The builder for detectron2's DeformConv / ModulatedDeformConv: their constructor arguments
    as the old module holds them; the Parameters, norm and activation in ``taken`` are the old
    module's."""

    def build(m: nn.Module, opts) -> nn.Module:
        bias = {} if cls is compat.DeformConv else {"bias": m.bias is not None}
        new = _built_quietly(lambda: cls(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding,
                                         m.dilation, m.groups, m.deformable_groups, norm=m.norm,
                                         activation=m.activation, backward_mode=_gather_mode(opts), **bias))
        return _take(new, m, taken)

    return build


def _mmcv_ms_deform_attn(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: _dnn.MultiScaleDeformableAttention(
        m.embed_dims, m.num_heads, m.num_levels, m.num_points, m.im2col_step, m.dropout.p, m.batch_first,
        getattr(m, "norm_cfg", None), getattr(m, "init_cfg", None), backward_mode=_gather_mode(opts)))
    # value_proj and output_proj come with their shapes (value_proj_ratio is in them)
    return _take(new, m, ("sampling_offsets", "attention_weights", "value_proj", "output_proj", "dropout"))


def _detr_ms_deform_attn(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: _dnn.MSDeformAttn(m.d_model, m.n_levels, m.n_heads, m.n_points,
                                                   backward_mode=_gather_mode(opts)))
    new.im2col_step = m.im2col_step
    return _take(new, m, ("sampling_offsets", "attention_weights", "value_proj", "output_proj"))


# (module, qualified class name) -> builder of the detops replacement.
TARGETS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("torchvision.ops.roi_align", "RoIAlign"): _tv_roi_align,
    ("torchvision.ops.poolers", "MultiScaleRoIAlign"): _tv_multiscale,
    ("torchvision.ops.misc", "FrozenBatchNorm2d"): _tv_frozen_bn,
    ("detectron2.layers.roi_align", "ROIAlign"): _d2_roi_align,
    ("detectron2.layers.batch_norm", "FrozenBatchNorm2d"): _d2_frozen_bn,
    ("mmcv.ops.roi_align", "RoIAlign"): _mmcv_roi_align,
    ("mmcv.ops.sync_bn", "SyncBatchNorm"): _mmcv_sync_bn,
    ("torchvision.ops.deform_conv", "DeformConv2d"): _tv_deform_conv2d,
    ("detectron2.layers.roi_align_rotated", "ROIAlignRotated"): _d2_roi_align_rotated,
    ("mmcv.ops.roi_align_rotated", "RoIAlignRotated"): _mmcv_roi_align_rotated,
    ("mmcv.ops.deform_conv", "DeformConv2d"): _mmcv_deform_conv(compat.DeformConv2d, ("weight",)),
    ("mmcv.ops.deform_conv", "DeformConv2dPack"): _mmcv_deform_conv(_dnn.DeformConv2dPack,
                                                                   ("weight", "conv_offset")),
    ("mmcv.ops.modulated_deform_conv", "ModulatedDeformConv2d"): _mmcv_deform_conv(compat.ModulatedDeformConv2d,
                                                                                   ("weight", "bias")),
    ("mmcv.ops.modulated_deform_conv", "ModulatedDeformConv2dPack"): _mmcv_deform_conv(
        _dnn.ModulatedDeformConv2dPack, ("weight", "bias", "conv_offset")),
    ("mmcv.ops.multi_scale_deform_attn", "MultiScaleDeformableAttention"): _mmcv_ms_deform_attn,
    ("detectron2.layers.deform_conv", "DeformConv"): _d2_deform_conv(compat.DeformConv, ("weight",)),
    ("detectron2.layers.deform_conv", "ModulatedDeformConv"): _d2_deform_conv(compat.ModulatedDeformConv,
                                                                             ("weight", "bias")),
    # Deformable-DETR (and the DETR family that vendors its ops) imports it from models/ops
    ("models.ops.modules.ms_deform_attn", "MSDeformAttn"): _detr_ms_deform_attn,
}


def _replacement(m: nn.Module, opts) -> Optional[nn.Module]:
    cls = type(m)
    build = TARGETS.get((cls.__module__, cls.__qualname__))
    if build is not None:
        return build(m, opts)
    if opts["batchnorm"] == "frozen" and isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm)):
        return _dnn.convert_frozen_batchnorm(m)
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
