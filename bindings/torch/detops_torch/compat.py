# detectron2- and mmcv-compatible modules over the detops ops, and the optional registration into mmcv/mmengine.
"""Drop-in modules with the constructor signatures, defaults and state dicts of:

* detectron2 ``detectron2.layers.ROIAlign(output_size, spatial_scale, sampling_ratio, aligned=True)``
  (rois cast to the input's dtype, as detectron2 does);
* detectron2 ``detectron2.layers.FrozenBatchNorm2d(num_features, eps=1e-5)`` (running_var starts at
  ``1 - eps``; ``convert_frozen_batchnorm`` classmethod);
* mmcv ``mmcv.ops.RoIAlign(output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode='avg',
  aligned=True, use_torchvision=False)`` (avg and max pooling; ``use_torchvision`` is accepted and
  ignored: detops computes either way);
* mmcv ``mmcv.ops.SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
  track_running_stats=True, group=None, stats_mode='default')`` (config type ``MMSyncBN``): the
  detops :class:`~detops_torch.SyncBatchNorm` with mmcv's gradient semantics;
* mmcv ``mmcv.ops.DeformConv2d`` (DCNv1, ``forward(x, offset)``; RepPoints', VFNet's and Guided
  Anchoring's heads) and ``mmcv.ops.ModulatedDeformConv2d`` (DCNv2, ``forward(x, offset, mask)``;
  DyHead's): the layers without an offset conv of their own (their Packs, which have one, are
  :class:`detops_torch.DeformConv2dPack` and :class:`detops_torch.ModulatedDeformConv2dPack`);
* detectron2 ``detectron2.layers.DeformConv`` and ``ModulatedDeformConv`` (DCNv1 and DCNv2, with
  ``norm`` and ``activation``), under detectron2's offset-gradient border rule, which is mmcv's.

Neither detectron2 nor mmcv is needed to use them. :func:`register_mmcv` makes them (and the
rotated, deformable-convolution and deformable-attention modules of :mod:`detops_torch.nn`)
nameable from mmdetection and mmrotate configs (``roi_layer=dict(type='DetopsRoIAlign', ...)``,
``norm_cfg=dict(type='DetopsSyncBN')``, ``dcn=dict(type='DetopsDCN', ...)`` or ``'DetopsDCNv2'``).
"""
import importlib
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from . import nn as _dnn
from .distributed import SyncBatchNorm as _SyncBatchNorm
from .distributed import _GroupMeanGradient
from ._errors import DetopsAssertionError, DetopsError
from .functional import GATHER_BACKWARD_MODES, POOL_MODES, _deform_conv2d, _roi_align, check_choice, check_roi_options
from .nn import _checked_im2col_step, _checked_rois, _renamed_kwargs

# torch.fx.wrap patches the globals of the module that registers a function: the leaves called
# from here are registered here too.
torch.fx.wrap("_roi_align")
torch.fx.wrap("_checked_rois")
torch.fx.wrap("_checked_im2col_step")
torch.fx.wrap("_deform_conv2d")

__all__ = ["ROIAlign", "RoIAlign", "FrozenBatchNorm2d", "SyncBatchNorm", "DeformConv", "ModulatedDeformConv",
           "register_mmcv"]


class ROIAlign(nn.Module):
    """detectron2's ``ROIAlign`` (note: ``aligned`` defaults to True, unlike torchvision's)."""

    def __init__(self, output_size, spatial_scale, sampling_ratio, aligned=True, *, backward_mode: str = "exact",
                 truncation: str = "float16"):
        super().__init__()
        check_roi_options("ROIAlign", backward_mode, truncation)
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned
        self.backward_mode = backward_mode
        self.truncation = truncation

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        """input: NCHW (or channels_last) features; rois: ``[K, 5]`` (batch index, x1, y1, x2, y2)."""
        rois = _checked_rois("ROIAlign", rois, 5)
        return _roi_align(input, rois.to(dtype=input.dtype), self.output_size, self.spatial_scale,
                          self.sampling_ratio, self.aligned, self.backward_mode, self.truncation, "avg")

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned})"
        )


class FrozenBatchNorm2d(_dnn.FrozenBatchNorm2d):
    """detectron2's ``FrozenBatchNorm2d``: the detops module with detectron2's initial state
    (``running_var = 1 - eps``, so that ``running_var + eps`` is 1 up to float32 rounding), its
    ``repr`` and its ``convert_frozen_batchnorm`` classmethod."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__(num_features, eps)
        self.running_var.fill_(1.0).sub_(eps)

    @classmethod
    def convert_frozen_batchnorm(cls, module: nn.Module) -> nn.Module:
        """detectron2's converter: BatchNorm2d / SyncBatchNorm -> this class."""
        return _dnn.convert_frozen_batchnorm(module, cls)

    def __repr__(self) -> str:
        return f"FrozenBatchNorm2d(num_features={self.num_features}, eps={self.eps})"


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


class RoIAlign(nn.Module):
    """mmcv's ``RoIAlign`` (``pool_mode`` 'avg' or 'max'; ``aligned`` defaults to True;
    ``use_torchvision`` is accepted for compatibility and changes nothing)."""

    @_renamed_kwargs({"out_size": "output_size", "sample_num": "sampling_ratio"}, "RoIAlign")
    def __init__(self, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True,
                 use_torchvision=False, *, backward_mode: str = "exact", truncation: str = "float16"):
        super().__init__()
        check_choice("RoIAlign", "pool_mode", pool_mode, POOL_MODES)
        check_roi_options("RoIAlign", backward_mode, truncation)
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        self.pool_mode = pool_mode
        self.aligned = aligned
        self.use_torchvision = use_torchvision
        self.backward_mode = backward_mode
        self.truncation = truncation

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        """input: NCHW (or channels_last) features; rois: ``[K, 5]`` (batch index, x1, y1, x2, y2)."""
        return _roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned,
                          self.backward_mode, self.truncation, self.pool_mode)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}, pool_mode={self.pool_mode}, aligned={self.aligned}, "
            f"use_torchvision={self.use_torchvision})"
        )


class DeformConv2d(_dnn._MmcvDeformConv2d):
    """mmcv's ``DeformConv2d`` (DCNv1; not torchvision's, which is :class:`detops_torch.DeformConv2d`).

    mmcv's constructor ``(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
    groups=1, deform_groups=1, bias=False, im2col_step=32)`` (``bias`` must be False; the
    deprecated ``deformable_groups`` is accepted with a warning), its Kaiming-uniform (ReLU)
    initialisation, state dict (``weight`` only) and repr; the keyword-only ``backward_mode`` is the
    backward mode. ``forward(x, offset)``: offset ``[N, 2 * deform_groups * kh * kw, Ho, Wo]``,
    (y, x) per tap. Like mmcv, an input smaller than the kernel is padded with zeros at the bottom
    and right (the offset too) and the output cropped back, and the input and weight are cast to
    the offset's dtype."""

    def forward(self, x: Tensor, offset: Tensor) -> Tensor:
        x = _checked_im2col_step("DeformConv2d", x, self.im2col_step)
        padded = _pad_to_kernel(x, offset, self.kernel_size)
        out = self._deform(padded[0], padded[1], None, None)
        return _crop_to_input(out, x, self.kernel_size)


@torch.fx.wrap
def _pad_to_kernel(x: Tensor, offset: Tensor, kernel_size: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
    # mmcv's DCNv1: an input smaller than the kernel (and its offset) padded with zeros at the
    # bottom and right. A leaf under FX (it branches on the input's size).
    pad_h = max(kernel_size[0] - x.size(2), 0)
    pad_w = max(kernel_size[1] - x.size(3), 0)
    if pad_h > 0 or pad_w > 0:
        x = torch.nn.functional.pad(x, [0, pad_w, 0, pad_h], "constant", 0.0)
        offset = torch.nn.functional.pad(offset, [0, pad_w, 0, pad_h], "constant", 0.0)
    return x, offset


@torch.fx.wrap
def _crop_to_input(out: Tensor, x: Tensor, kernel_size: Tuple[int, int]) -> Tensor:
    # The output of _pad_to_kernel's padded input cropped back, as mmcv does.
    pad_h = max(kernel_size[0] - x.size(2), 0)
    pad_w = max(kernel_size[1] - x.size(3), 0)
    if pad_h > 0 or pad_w > 0:
        out = out[:, :, :out.size(2) - pad_h, :out.size(3) - pad_w].contiguous()
    return out


class ModulatedDeformConv2d(_dnn._MmcvModulatedDeformConv2d):
    """mmcv's ``ModulatedDeformConv2d`` (DCNv2 without an offset conv of its own).

    mmcv's constructor ``(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
    groups=1, deform_groups=1, bias=True)`` (the deprecated ``deformable_groups`` is accepted with
    a warning), its initialisation (uniform in +-1 / sqrt(in_channels * kh * kw), zero bias), state
    dict and repr (nn.Module's); the keyword-only ``backward_mode`` is the backward mode.
    ``forward(x, offset, mask)``: offset ``[N, 2 * deform_groups * kh * kw, Ho, Wo]`` ((y, x) per
    tap), mask ``[N, deform_groups * kh * kw, Ho, Wo]``; the input, weight, bias and mask are cast
    to the offset's dtype, as mmcv does."""

    def forward(self, x: Tensor, offset: Tensor, mask: Tensor) -> Tensor:
        return self._deform(x, offset, self.bias, mask)


@torch.fx.wrap
def _d2_deform(x: Tensor, offset: Tensor, mask: Optional[Tensor], weight: Tensor, bias: Optional[Tensor],
               stride: Tuple[int, int], padding: Tuple[int, int], dilation: Tuple[int, int], deformable_groups: int,
               backward_mode: str, owner: str) -> Tensor:
    # detectron2's forward: an empty input gives an empty output of the convolution's shape (its
    # _NewEmptyTensorOp; gradients flow as zeros); otherwise the op under mmcv's border rule, which
    # is detectron2's too (its kernels zero the offset gradient of a sample at exactly -1). A leaf
    # under FX (it branches on the input's size).
    if x.dim() != 4:  # detectron2's _DeformConv: "Expected 4D tensor as input, got {}D tensor instead."
        raise DetopsError(f"{owner}: Expected 4D tensor as input, got {x.dim()}D tensor instead.")
    if x.numel() == 0:
        size = [x.size(0), weight.size(0)] + [(i + 2 * p - (d * (k - 1) + 1)) // s + 1 for i, p, d, k, s in zip(
            x.shape[-2:], padding, dilation, weight.shape[-2:], stride)]
        return x.new_zeros(size) + x.sum() * 0  # empty, and connected to x for autograd
    if x.size(1) % deformable_groups != 0:
        raise DetopsError(owner + ": input channels must divide deformable group size: input has "
                          + str(x.size(1)) + " channels, deformable_groups is " + str(deformable_groups))
    return _deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask, backward_mode, "mmcv")


class _D2DeformConvBase(nn.Module):
    """What detectron2's two deformable convolutions share: the constructor's checks, attributes,
    Kaiming-uniform (ReLU) weight, the optional ``norm`` and ``activation`` applied after the
    convolution, and the repr."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deformable_groups,
                 bias, norm, activation, backward_mode):
        super().__init__()
        owner = type(self).__name__
        if in_channels % groups != 0:  # detectron2's asserts, with its words
            raise DetopsAssertionError(f"in_channels {in_channels} cannot be divisible by groups {groups}")
        if out_channels % groups != 0:
            raise DetopsAssertionError(f"out_channels {out_channels} cannot be divisible by groups {groups}")
        if deformable_groups <= 0:
            raise DetopsError(f"{owner}: deformable_groups is {deformable_groups}; expected a positive count")
        check_choice(owner, "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.groups = groups
        self.deformable_groups = deformable_groups
        self.norm = norm
        self.activation = activation
        self.backward_mode = backward_mode
        self._owner = owner
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        nn.init.kaiming_uniform_(self.weight, nonlinearity="relu")

    def _forward(self, x: Tensor, offset: Tensor, mask: Optional[Tensor]) -> Tensor:
        x = _d2_deform(x, offset, mask, self.weight, self.bias, _pair(self.stride), _pair(self.padding),
                       _pair(self.dilation), self.deformable_groups, self.backward_mode, self._owner)
        if self.norm is not None:
            x = self.norm(x)
        if self.activation is not None:
            x = self.activation(x)
        return x

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"deformable_groups={self.deformable_groups}, bias={self.bias is not None}")


class DeformConv(_D2DeformConvBase):
    """detectron2's ``DeformConv`` (DCNv1): ``(in_channels, out_channels, kernel_size, stride=1,
    padding=0, dilation=1, groups=1, deformable_groups=1, bias=False, norm=None, activation=None)``
    (``bias`` must be False, as detectron2 asserts), ``forward(x, offset)``, its initialisation,
    state dict (``weight``, and the norm's) and repr, under detectron2's (mmcv's) border rule of the
    offset gradient; the keyword-only ``backward_mode`` is the backward mode. Unlike detectron2
    it runs on the CPU too; like mmcv it refuses in the forward an input whose channels
    ``deformable_groups`` does not divide."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, deformable_groups: int = 1, bias: bool = False, norm=None, activation=None, *,
                 backward_mode: str = "exact"):
        if bias:
            raise DetopsAssertionError("DeformConv: bias=True is not supported (detectron2 asserts not bias)")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deformable_groups,
                         bias, norm, activation, backward_mode)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.register_parameter("bias", None)

    def forward(self, x: Tensor, offset: Tensor) -> Tensor:
        return self._forward(x, offset, None)


class ModulatedDeformConv(_D2DeformConvBase):
    """detectron2's ``ModulatedDeformConv`` (DCNv2): ``(in_channels, out_channels, kernel_size,
    stride=1, padding=0, dilation=1, groups=1, deformable_groups=1, bias=True, norm=None,
    activation=None)``, ``forward(x, offset, mask)``, its initialisation (Kaiming-uniform weight,
    zero bias), state dict and repr (stride, padding and dilation kept as given, as detectron2
    keeps them), under detectron2's (mmcv's) border rule; keyword-only ``backward_mode``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, deformable_groups: int = 1, bias: bool = True, norm=None, activation=None, *,
                 backward_mode: str = "exact"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deformable_groups,
                         bias, norm, activation, backward_mode)
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.with_bias = bias
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Tensor, offset: Tensor, mask: Tensor) -> Tensor:
        return self._forward(x, offset, mask)


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
    registered: Dict[str, object] = {}
    for name, cls in (("DetopsRoIAlign", RoIAlign), ("DetopsRoIAlignRotated", _dnn.RoIAlignRotated)):
        setattr(mmcv_ops, name, cls)
        registered["mmcv.ops." + name] = cls

    layers = {"DetopsSyncBN": _SyncBatchNorm, "DetopsMMSyncBN": SyncBatchNorm, "DetopsRoIAlign": RoIAlign,
              "DetopsRoIAlignRotated": _dnn.RoIAlignRotated, "DetopsDCN": _dnn.DeformConv2dPack,
              "DetopsDCNv2": _dnn.ModulatedDeformConv2dPack,
              "DetopsMultiScaleDeformableAttention": _dnn.MultiScaleDeformableAttention}
    try:  # mmcv 2.x: one registry in mmengine
        from mmengine.registry import MODELS  # type: ignore
        targets = [("mmengine.MODELS", MODELS, list(layers))]
    except Exception:  # mmcv 1.x: a registry per kind of layer (the RoI layers have none)
        targets = []
        for prefix, where, attr, names in (("mmcv.NORM_LAYERS", "mmcv.cnn", "NORM_LAYERS",
                                            ["DetopsSyncBN", "DetopsMMSyncBN"]),
                                           ("mmcv.CONV_LAYERS", "mmcv.cnn", "CONV_LAYERS",
                                            ["DetopsDCN", "DetopsDCNv2"]),
                                           ("mmcv.ATTENTION", "mmcv.cnn.bricks.registry", "ATTENTION",
                                            ["DetopsMultiScaleDeformableAttention"])):
            try:
                targets.append((prefix, getattr(importlib.import_module(where), attr), names))
            except Exception:
                continue
    for prefix, registry, names in targets:
        for name in names:
            registry.register_module(name=name, module=layers[name], force=force)
            registered[f"{prefix}.{name}"] = layers[name]
    return registered
