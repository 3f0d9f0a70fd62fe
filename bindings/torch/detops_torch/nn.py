# Modules over the detops ops: torchvision's RoIAlign, MultiScaleRoIAlign (the FPN pooler), FrozenBatchNorm2d, DeformConv2d; detectron2's ROIAlignRotated and mmcv's RoIAlignRotated; mmcv's MultiScaleDeformableAttention, DeformConv2dPack, ModulatedDeformConv2dPack and Deformable-DETR's MSDeformAttn.
"""Modules with the anchors' constructor signatures and defaults, computed by detops.

* ``RoIAlign(output_size, spatial_scale, sampling_ratio, aligned=False)``
* ``MultiScaleRoIAlign(featmap_names, output_size, sampling_ratio, *, canonical_scale=224,
  canonical_level=4)``: torchvision's FPN pooler (its level mapping, its outputs)
* ``FrozenBatchNorm2d(num_features, eps=1e-5)``: the buffers and state dict of torchvision's and
  detectron2's FrozenBatchNorm2d (either checkpoint loads unchanged)
* ``convert_frozen_batchnorm(module)``: BatchNorm2d / SyncBatchNorm -> FrozenBatchNorm2d, as
  detectron2's classmethod of that name.
* ``ROIAlignRotated(output_size, spatial_scale, sampling_ratio)``: detectron2's
  (``detectron2.layers``): rois ``[K, 6]`` ``(batch_index, cx, cy, w, h, angle)``, angles in
  degrees counter-clockwise, always aligned
* ``RoIAlignRotated(output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False)``:
  mmcv's (``mmcv.ops``, used by mmrotate): the same rois with angles in radians; mmcv's deprecated
  ``out_size`` and ``sample_num`` are accepted with a warning
* ``MultiScaleDeformableAttention(embed_dims=256, num_heads=8, num_levels=4, num_points=4,
  im2col_step=64, dropout=0.1, batch_first=False, norm_cfg=None, init_cfg=None,
  value_proj_ratio=1.0)``: mmcv's (its parameters, initialisation and residual forward)
* ``MSDeformAttn(d_model=256, n_levels=4, n_heads=8, n_points=4)``: Deformable-DETR's (no
  residual); the two share their state-dict keys, so a checkpoint of either loads into the other.
* ``DeformConv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
  bias=True)``: torchvision's (its parameters, initialisation, state dict, repr and
  ``forward(input, offset, mask=None)``)
* ``DeformConv2dPack(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
  groups=1, deform_groups=1, bias=False, im2col_step=32)``: mmcv's DCNv1 layer (``mmcv.ops``,
  config type ``DCN``): its own zero-initialised ``conv_offset`` predicts the offsets
* ``ModulatedDeformConv2dPack(in_channels, out_channels, kernel_size, stride=1, padding=0,
  dilation=1, groups=1, deform_groups=1, bias=True)``: mmcv's DCNv2 layer (``mmcv.ops``, config
  type ``DCNv2``): its own zero-initialised ``conv_offset`` predicts offsets and mask; an mmcv
  checkpoint loads unchanged and gives the same output.

Every RoI module (rotated or not) also takes the keyword-only ``backward_mode`` (default
``"exact"``) and ``truncation``; the attention and deformable convolution modules take the
keyword-only ``backward_mode`` (``"exact"`` or ``"atomic"``).
"""
import copy
import functools
import math
import warnings
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.fx
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from ._errors import DetopsAssertionError, DetopsError, eager, run
from .functional import (GATHER_BACKWARD_MODES, _deform_conv2d, _deform_conv2d_autocast, _roi_align,
                         _roi_align_rotated, boxes_to_rois, check_choice, check_roi_options, ms_deform_attn,
                         resolve_backward_mode)

# torch.fx.wrap patches a function in the globals of the module that registers it; these
# (leaves of a traced graph: they branch on shapes, autocast state or box lists) are called from
# here.
torch.fx.wrap("_deform_conv2d")
torch.fx.wrap("_deform_conv2d_autocast")
torch.fx.wrap("_roi_align")
torch.fx.wrap("_roi_align_rotated")
torch.fx.wrap("ms_deform_attn")

__all__ = [
    "RoIAlign",
    "MultiScaleRoIAlign",
    "FrozenBatchNorm2d",
    "convert_frozen_batchnorm",
    "ROIAlignRotated",
    "RoIAlignRotated",
    "MultiScaleDeformableAttention",
    "MSDeformAttn",
    "DeformConv2d",
    "DeformConv2dPack",
    "ModulatedDeformConv2dPack",
]

# torchvision's level mapping and scale inference are reused when torchvision is importable, so
# the pooler assigns every roi to the level torchvision assigns it to. The fallbacks below follow
# the same formulas (FPN paper, eq. 1) for installations without torchvision.
try:
    from torchvision.ops.poolers import LevelMapper, _setup_scales  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - torchvision is installed wherever the tests run

    class LevelMapper:  # type: ignore[no-redef]
        """The FPN level of each box: floor(k0 + log2(sqrt(area) / s0) + eps), clamped."""

        def __init__(self, k_min: int, k_max: int, canonical_scale: int = 224, canonical_level: int = 4,
                     eps: float = 1e-6):
            self.k_min = k_min
            self.k_max = k_max
            self.s0 = canonical_scale
            self.lvl0 = canonical_level
            self.eps = eps

        def __call__(self, boxlists: List[Tensor]) -> Tensor:
            areas = [(b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) for b in boxlists]
            s = torch.sqrt(torch.cat(areas))
            lvls = torch.floor(self.lvl0 + torch.log2(s / self.s0) + torch.tensor(self.eps, dtype=s.dtype))
            lvls = torch.clamp(lvls, min=self.k_min, max=self.k_max)
            return (lvls.to(torch.int64) - self.k_min).to(torch.int64)

    def _infer_scale(feature: Tensor, original_size: List[int]) -> float:
        approx = float(feature.shape[-2]) / float(original_size[0])
        return 2 ** float(torch.tensor(approx).log2().round())

    def _setup_scales(features: List[Tensor], image_shapes: List[Tuple[int, int]], canonical_scale: int,
                      canonical_level: int) -> Tuple[List[float], LevelMapper]:
        if not image_shapes:
            raise ValueError("images list should not be empty")
        max_x = max(s[0] for s in image_shapes)
        max_y = max(s[1] for s in image_shapes)
        scales = [_infer_scale(f, [max_x, max_y]) for f in features]
        lvl_min = -torch.log2(torch.tensor(scales[0], dtype=torch.float32)).item()
        lvl_max = -torch.log2(torch.tensor(scales[-1], dtype=torch.float32)).item()
        return scales, LevelMapper(int(lvl_min), int(lvl_max), canonical_scale, canonical_level)


torch.fx.wrap("_setup_scales")


def _is_proxy(value) -> bool:
    """Whether ``value`` is an FX proxy (symbolic tracing: the module must not keep it as state)."""
    return isinstance(value, torch.fx.Proxy)


def _roi_options_repr(module: nn.Module) -> str:
    """", backward_mode=..., truncation=..." for the options that are not the defaults (so a default
    module's repr is its peer's)."""
    parts = ""
    if module.backward_mode != "exact":
        parts += f", backward_mode={module.backward_mode!r}"
    if module.truncation != "float16":
        parts += f", truncation={module.truncation!r}"
    return parts


class RoIAlign(nn.Module):
    """torchvision's ``RoIAlign`` (see :func:`detops_torch.roi_align`)."""

    def __init__(
        self,
        output_size,
        spatial_scale: float,
        sampling_ratio: int,
        aligned: bool = False,
        *,
        backward_mode: str = "exact",
        truncation: str = "float16",
    ):
        super().__init__()
        check_roi_options(type(self).__name__, backward_mode, truncation)
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned
        self.backward_mode = backward_mode
        self.truncation = truncation

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return _roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned,
                          self.backward_mode, self.truncation, "avg")

    def __repr__(self) -> str:
        # torchvision's, then the detops options that are not their defaults.
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}{_roi_options_repr(self)})"
        )


@torch.fx.wrap
def _filter_input(x: Dict[str, Tensor], featmap_names: List[str]) -> List[Tensor]:
    # torchvision keeps the dict's order, not featmap_names' order; so do we.
    x_filtered = []
    for k, v in x.items():
        if k in featmap_names:
            x_filtered.append(v)
    return x_filtered


@torch.fx.wrap
def _multiscale_roi_align(
    x_filtered: List[Tensor],
    boxes: List[Tensor],
    output_size: List[int],
    sampling_ratio: int,
    scales: Optional[List[float]],
    mapper: Optional[LevelMapper],
    backward_mode: str,
    truncation: str,
) -> Tensor:
    # The same steps as torchvision's _multiscale_roi_align (same rois, same level per roi, same
    # zero-initialised result written per level), so the forward has torchvision's bits.
    if scales is None or mapper is None:
        raise DetopsError("MultiScaleRoIAlign: scales and mapper should not be None")
    num_levels = len(x_filtered)
    rois = boxes_to_rois(boxes)  # torchvision's roi format, with the boxes checked
    if num_levels == 1:
        return _roi_align(x_filtered[0], rois, output_size, scales[0], sampling_ratio, False, backward_mode,
                          truncation, "avg")
    levels = mapper(boxes)
    num_rois = len(rois)
    num_channels = x_filtered[0].shape[1]
    dtype, device = x_filtered[0].dtype, x_filtered[0].device
    result = torch.zeros([num_rois, num_channels, output_size[0], output_size[1]], dtype=dtype, device=device)
    for level, (feature, scale) in enumerate(zip(x_filtered, scales)):
        idx_in_level = torch.where(levels == level)[0]
        pooled = _roi_align(feature, rois[idx_in_level], output_size, scale, sampling_ratio, False, backward_mode,
                            truncation, "avg")
        # Under autocast the levels may come in different dtypes; match result's, as torchvision.
        result[idx_in_level] = pooled.to(result.dtype)
    return result


@torch.fx.wrap
@torch.jit.unused
def _multiscale_roi_align_setup(x_filtered: List[Tensor], boxes: List[Tensor], image_shapes: List[Tuple[int, int]],
                                output_size: List[int], sampling_ratio: int, canonical_scale: int,
                                canonical_level: int, backward_mode: str, truncation: str) -> Tensor:
    # One leaf for a traced MultiScaleRoIAlign whose scales are not yet known: they are inferred
    # on each run of the graph, as the eager module infers them on its first forward.
    scales, mapper = _setup_scales(x_filtered, image_shapes, canonical_scale, canonical_level)
    return _multiscale_roi_align(x_filtered, boxes, output_size, sampling_ratio, scales, mapper, backward_mode,
                                 truncation)


class MultiScaleRoIAlign(nn.Module):
    """torchvision's ``MultiScaleRoIAlign``: pools each box from the FPN level given by eq. 1 of
    the FPN paper (``canonical_level`` for a box of ``canonical_scale`` squared area)."""

    __annotations__ = {"scales": Optional[List[float]], "map_levels": Optional[LevelMapper]}

    def __init__(
        self,
        featmap_names: List[str],
        output_size: Union[int, Tuple[int], List[int]],
        sampling_ratio: int,
        *,
        canonical_scale: int = 224,
        canonical_level: int = 4,
        backward_mode: str = "exact",
        truncation: str = "float16",
    ):
        super().__init__()
        check_roi_options(type(self).__name__, backward_mode, truncation)
        if isinstance(output_size, int):
            output_size = (output_size, output_size)
        self.featmap_names = featmap_names
        self.sampling_ratio = sampling_ratio
        self.output_size = tuple(output_size)
        self.scales = None
        self.map_levels = None
        self.canonical_scale = canonical_scale
        self.canonical_level = canonical_level
        self.backward_mode = backward_mode
        self.truncation = truncation

    def forward(self, x: Dict[str, Tensor], boxes: List[Tensor], image_shapes: List[Tuple[int, int]]) -> Tensor:
        x_filtered = _filter_input(x, self.featmap_names)
        if self.scales is None or self.map_levels is None:
            if not torch.jit.is_scripting():
                if _is_proxy(x_filtered):  # FX: the scales come from the traced shapes, in the graph
                    return _multiscale_roi_align_setup(x_filtered, boxes, image_shapes, self.output_size,
                                                       self.sampling_ratio, self.canonical_scale,
                                                       self.canonical_level, self.backward_mode, self.truncation)
            self.scales, self.map_levels = _setup_scales(
                x_filtered, image_shapes, self.canonical_scale, self.canonical_level
            )
        return _multiscale_roi_align(
            x_filtered, boxes, self.output_size, self.sampling_ratio, self.scales, self.map_levels,
            self.backward_mode, self.truncation,
        )

    def __repr__(self) -> str:
        # torchvision's, then the detops options that are not their defaults.
        return (
            f"{self.__class__.__name__}(featmap_names={self.featmap_names}, output_size={self.output_size}, "
            f"sampling_ratio={self.sampling_ratio}{_roi_options_repr(self)})"
        )


@torch.fx.wrap
def _fold_buffers(weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, eps: float,
                  dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    # FrozenBatchNorm2d's fold for inputs of ``dtype`` (float64 folds in float64, the rest in
    # float32); a leaf under FX, where the dtype is a proxy.
    param_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return torch.ops.detops.frozen_batch_norm_fold(weight.detach().to(param_dtype), bias.detach().to(param_dtype),
                                                   running_mean.detach().to(param_dtype),
                                                   running_var.detach().to(param_dtype), eps)


def _tracing() -> bool:
    """Under torch.compile, torch.export or FX tracing: what reads Python object identity or
    version counters (the fold cache) steps aside, so the module traces without graph breaks."""
    compiler = getattr(torch, "compiler", None)
    for name in ("is_compiling", "is_exporting"):
        check = getattr(compiler, name, None)
        if check is not None and check():
            return True
    is_fx_tracing = getattr(torch.fx._symbolic_trace, "is_fx_tracing", None)
    return bool(is_fx_tracing and is_fx_tracing())


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine parameters, computed by detops.

    Its state is torchvision's and detectron2's: four buffers ``weight``, ``bias``,
    ``running_mean``, ``running_var`` (no parameters, no ``num_batches_tracked``), so checkpoints of
    either load unchanged, and its own state dict loads into either. Loading drops a
    ``num_batches_tracked`` entry (a BatchNorm2d checkpoint), as torchvision does, and fills a
    missing ``running_mean``/``running_var`` with the identity when the checkpoint's version is
    below 2 (detectron2's Caffe2-converted checkpoints carry only weight and bias).

    The buffers are folded once into ``scale = weight * (1 / sqrt(running_var + eps))`` and
    ``shift = bias - running_mean * scale`` (float64 for float64 inputs, float32 otherwise); the
    fold is redone when a buffer, eps, the device or the compute dtype changes. No gradient reaches
    the buffers.
    """

    _version = 3

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self._fold_cache = None  # (key, scale, shift, buffers): see scale_shift

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        state_dict.pop(prefix + "num_batches_tracked", None)
        version = local_metadata.get("version", None)
        if version is None or version < 2:
            # detectron2's rule: early checkpoints have no running statistics; use the identity.
            if prefix + "running_mean" not in state_dict:
                state_dict[prefix + "running_mean"] = torch.zeros_like(self.running_mean)
            if prefix + "running_var" not in state_dict:
                state_dict[prefix + "running_var"] = torch.ones_like(self.running_var)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _fold_key(self, dtype: torch.dtype) -> Optional[tuple]:
        # Identity and storage of each buffer plus its version counter (bumped by every in-place
        # write, including load_state_dict's copy_): a key that changes whenever the fold would.
        try:
            parts = tuple(
                (id(t), t.data_ptr(), t._version, t.dtype, t.device)
                for t in (self.weight, self.bias, self.running_mean, self.running_var)
            )
        except RuntimeError:  # inference tensors have no version counter: do not cache
            return None
        return parts + (float(self.eps), dtype)

    def _fold(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        return _fold_buffers(self.weight, self.bias, self.running_mean, self.running_var, float(self.eps), dtype)

    @torch.jit.unused
    def scale_shift(self, dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
        """The folded ``(scale, shift)`` for inputs of ``dtype`` (float64 folds in float64),
        computed once and reused until a buffer, eps, the device or the dtype changes."""
        if _tracing() or _is_proxy(dtype):  # the fold becomes part of the graph, same op, same bits
            return self._fold(dtype)
        param_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        key = self._fold_key(param_dtype)
        cache = self._fold_cache
        if key is not None and cache is not None and cache[0] == key:
            return cache[1], cache[2]
        scale, shift = self._fold(dtype)
        # The cache holds the buffers it keyed on, so their ids cannot be reused while it lives.
        self._fold_cache = None if key is None else (key, scale, shift, (self.weight, self.bias,
                                                                         self.running_mean, self.running_var))
        return scale, shift

    def _scale_shift(self, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        # TorchScript cannot compile the cache (Python object identity and version counters): a
        # scripted module folds on every call, with the same op and so the same bits.
        if torch.jit.is_scripting():
            return self._fold(dtype)
        return self.scale_shift(dtype)

    def forward(self, x: Tensor) -> Tensor:
        # Indexed, not unpacked: under FX the pair is one proxy (torch 1.13 cannot unpack it).
        scale_shift = self._scale_shift(x.dtype)
        if not torch.jit.is_scripting():
            if eager():  # the op library's errors as detops' types
                return run(torch.ops.detops.frozen_batch_norm, x, scale_shift[0], scale_shift[1], "none", None)
        return torch.ops.detops.frozen_batch_norm(x, scale_shift[0], scale_shift[1], "none", None)

    def forward_relu(self, x: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        """The fused tails of a ResNet block: ``relu(bn(x))``, or ``relu(bn(x) + residual)``."""
        scale_shift = self._scale_shift(x.dtype)
        epilogue = "relu" if residual is None else "add_relu"
        if not torch.jit.is_scripting():
            if eager():  # the op library's errors as detops' types
                return run(torch.ops.detops.frozen_batch_norm, x, scale_shift[0], scale_shift[1], epilogue, residual)
        return torch.ops.detops.frozen_batch_norm(x, scale_shift[0], scale_shift[1], epilogue, residual)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_fold_cache"] = None  # derived data; keyed on ids that do not survive a copy
        return state

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.num_features}, eps={self.eps})"


def _frozen_from_batchnorm(cls, module: nn.Module) -> nn.Module:
    if module.running_mean is None or module.running_var is None:
        raise DetopsError(
            f"convert_frozen_batchnorm: {type(module).__name__}({module.num_features}) has "
            "track_running_stats=False; expected running statistics to freeze"
        )
    res = cls(module.num_features, module.eps)
    if module.affine:
        res.weight.data = module.weight.data.clone().detach()
        res.bias.data = module.bias.data.clone().detach()
    else:
        # weight 1, bias 0 in the statistics' dtype and device
        res.weight.data = torch.ones_like(module.running_mean.data)
        res.bias.data = torch.zeros_like(module.running_mean.data)
    res.running_mean.data = module.running_mean.data
    res.running_var.data = module.running_var.data
    return res


def convert_frozen_batchnorm(module: nn.Module, cls=None) -> nn.Module:
    """Replaces every ``BatchNorm2d`` and ``SyncBatchNorm`` in ``module`` by a
    :class:`FrozenBatchNorm2d` (weight and bias copied, running statistics and eps taken over), as
    detectron2's ``FrozenBatchNorm2d.convert_frozen_batchnorm``. Returns the new module if
    ``module`` itself is one; otherwise converts in place and returns ``module``."""
    cls = FrozenBatchNorm2d if cls is None else cls
    if isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)):
        return _frozen_from_batchnorm(cls, module)
    for name, child in module.named_children():
        new_child = convert_frozen_batchnorm(child, cls)
        if new_child is not child:
            module.add_module(name, new_child)
    return module


def _renamed_kwargs(mapping: Dict[str, str], cls_name: str):
    """Accepts mmcv's deprecated argument names (out_size, sample_num) with a warning, as mmcv's
    ``deprecated_api_warning`` does; the signature stays the new one."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for old, new in mapping.items():
                if old in kwargs:
                    warnings.warn(f'"{old}" is deprecated in `{cls_name}`, please use "{new}" instead',
                                  DeprecationWarning, stacklevel=2)
                    if new in kwargs:
                        raise TypeError(f"{cls_name}: both {old!r} (deprecated) and {new!r} were given")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper

    return decorate


@torch.fx.wrap
def _checked_rois(owner: str, rois: Tensor, columns: int) -> Tensor:
    # The anchors assert this shape in Python: a DetopsAssertionError naming the columns. A leaf
    # under FX that returns rois, so that a traced graph keeps the check (dead-code elimination
    # drops unused leaves).
    if not isinstance(rois, torch.Tensor):
        raise DetopsAssertionError(f"{owner}: rois is a {type(rois).__name__}; expected a [K, {columns}] tensor")
    if rois.dim() != 2 or rois.size(1) != columns:
        what = "(batch_index, cx, cy, w, h, angle)" if columns == 6 else "(batch_index, x1, y1, x2, y2)"
        raise DetopsAssertionError(f"{owner}: rois has sizes {list(rois.shape)}; expected [K, {columns}] rows " + what)
    return rois


class ROIAlignRotated(nn.Module):
    """detectron2's ``ROIAlignRotated`` (``detectron2.layers``), computed by detops.

    rois ``[K, 6]``: ``(batch_index, x_ctr, y_ctr, width, height, angle_degrees)``, the angle
    counter-clockwise; the half-pixel offset is always applied (detectron2 has no ``aligned``
    option) and a negative width or height is an error. Unlike detectron2, float16 (and bfloat16)
    inputs are not cast to float32 and back: they run natively (computed in float32, rounded once)
    with rois in float32, float64 or the input's dtype. No parameters or buffers (an empty state
    dict, as detectron2's).
    """

    def __init__(self, output_size, spatial_scale, sampling_ratio, *, backward_mode: str = "exact",
                 truncation: str = "float16"):
        super().__init__()
        check_roi_options(type(self).__name__, backward_mode, truncation)
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.backward_mode = backward_mode
        self.truncation = truncation

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        """input: NCHW (or channels_last) features; rois: ``[K, 6]`` (batch index, cx, cy, w, h, angle)."""
        rois = _checked_rois("ROIAlignRotated", rois, 6)
        return _roi_align_rotated(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, True, False,
                                  "degrees", self.backward_mode, self.truncation)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio})"
        )


class RoIAlignRotated(nn.Module):
    """mmcv's ``RoIAlignRotated`` (``mmcv.ops``; mmrotate's RoI layer), computed by detops.

    rois ``[K, 6]``: ``(batch_index, cx, cy, w, h, angle)`` with the angle in radians,
    counter-clockwise unless ``clockwise``. ``aligned=False`` is mmcv's legacy mode (no half-pixel
    offset, boxes at least 1x1). ``sampling_ratio=0`` is adaptive. mmcv's deprecated argument names
    ``out_size`` and ``sample_num`` are accepted with a DeprecationWarning, as mmcv does. No
    parameters or buffers (an empty state dict, as mmcv's).
    """

    @_renamed_kwargs({"out_size": "output_size", "sample_num": "sampling_ratio"}, "RoIAlignRotated")
    def __init__(self, output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False, *,
                 backward_mode: str = "exact", truncation: str = "float16"):
        super().__init__()
        check_roi_options(type(self).__name__, backward_mode, truncation)
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        self.aligned = aligned
        self.clockwise = clockwise
        self.backward_mode = backward_mode
        self.truncation = truncation

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        """input: NCHW (or channels_last) features; rois: ``[K, 6]`` (batch index, cx, cy, w, h, angle)."""
        rois = _checked_rois("RoIAlignRotated", rois, 6)
        return _roi_align_rotated(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                                  self.aligned, self.clockwise, "radians", self.backward_mode, self.truncation)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}, clockwise={self.clockwise})"
        )


@torch.fx.wrap
def _sampling_locations(owner: str, reference_points: Tensor, offsets: Tensor, spatial_shapes: Tensor,
                        num_points: int) -> Tensor:
    # The anchors' sampling locations from reference points (2 coordinates) or boxes (4); a leaf
    # under FX, where the branch on the reference points' size would read a proxy.
    if reference_points.shape[-1] == 2:
        # Offsets are in pixels of each level: normalise by (W, H).
        normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
        return reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
    if reference_points.shape[-1] == 4:
        # Reference boxes (cx, cy, w, h): offsets are fractions of half the box per point.
        return (reference_points[:, :, None, :, None, :2]
                + offsets / num_points * reference_points[:, :, None, :, None, 2:] * 0.5)
    raise DetopsError(f"{owner}: reference_points has {reference_points.shape[-1]} coordinates in its last "
                     "dimension; expected 2 (x, y) or 4 (cx, cy, w, h)")


class _DeformableAttention(nn.Module):
    """The projections and the sampling step shared by mmcv's and Deformable-DETR's modules: the
    same four ``nn.Linear`` (so the same state-dict keys and shapes), the same initialisation and
    the same arithmetic, in the anchors' order, around :func:`detops_torch.functional.ms_deform_attn`."""

    def __init__(self, owner: str, embed_dims: int, num_heads: int, num_levels: int, num_points: int,
                 value_dims: int, backward_mode: str, mode: Optional[str] = None):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise DetopsError(f"{owner}: embed_dims {embed_dims} is not divisible by num_heads {num_heads}")
        backward_mode = resolve_backward_mode(owner, backward_mode, mode)
        head_dims = embed_dims // num_heads
        if head_dims & (head_dims - 1) != 0:
            # The anchors' CUDA kernels prefer it; detops does not care, but the warning keeps
            # configurations portable back to them.
            warnings.warn(f"{owner}: {head_dims} channels per head is not a power of 2, which the mmcv and "
                          "Deformable-DETR CUDA kernels run slower with", stacklevel=3)
        self.num_heads = num_heads
        self.num_levels = num_levels
        self.num_points = num_points
        self.backward_mode = backward_mode
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(embed_dims, value_dims)
        self.output_proj = nn.Linear(value_dims, embed_dims)

    def _init_parameters(self) -> None:
        # Both anchors: offsets start as a fan of num_heads directions (one per head, scaled to the
        # unit square's border), point i of each head at i + 1 times its direction; uniform
        # attention (zero logits); Xavier-uniform projections with zero biases.
        nn.init.constant_(self.sampling_offsets.weight, 0.0)
        bias = self.sampling_offsets.bias
        step = 2.0 * math.pi / self.num_heads
        thetas = torch.arange(self.num_heads, dtype=torch.float32, device=bias.device) * step
        directions = torch.stack([thetas.cos(), thetas.sin()], -1)
        directions = directions / directions.abs().max(-1, keepdim=True)[0]
        grid = directions.view(self.num_heads, 1, 1, 2).repeat(1, self.num_levels, self.num_points, 1)
        for i in range(self.num_points):
            grid[:, :, i, :] *= i + 1
        with torch.no_grad():
            bias.copy_(grid.view(-1))
        nn.init.constant_(self.attention_weights.weight, 0.0)
        nn.init.constant_(self.attention_weights.bias, 0.0)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.constant_(proj.bias, 0.0)

    def _attend(self, owner: str, query: Tensor, value: Tensor, reference_points: Tensor, spatial_shapes: Tensor,
                level_start_index: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """query ``[B, Q, C]``, value ``[B, S, C]`` (batch first) -> ``[B, Q, C]``, output_proj applied."""
        bs, num_query = query.shape[0], query.shape[1]  # indexed: FX on torch 1.13 cannot unpack sizes
        num_value = value.shape[1]
        # spatial_shapes against the value's rows is the op's check ("spatial_shapes gives N rows in
        # all"): reading the table here would make the module data-dependent under torch.compile.
        value = self.value_proj(value)
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)
        value = value.view(bs, num_value, self.num_heads, -1)
        offsets = self.sampling_offsets(query).view(bs, num_query, self.num_heads, self.num_levels,
                                                    self.num_points, 2)
        weights = self.attention_weights(query).view(bs, num_query, self.num_heads,
                                                     self.num_levels * self.num_points)
        weights = weights.softmax(-1).view(bs, num_query, self.num_heads, self.num_levels, self.num_points)
        locations = _sampling_locations(owner, reference_points, offsets, spatial_shapes, self.num_points)
        # Under autocast the softmax stays float32 while the projected value is 16-bit; mmcv casts
        # the weights to the value's dtype, as here (detops takes float32 locations as they are).
        output = ms_deform_attn(value, spatial_shapes, level_start_index, locations, weights.to(value.dtype),
                                self.backward_mode)
        return self.output_proj(output)


class MultiScaleDeformableAttention(_DeformableAttention):
    """mmcv's ``MultiScaleDeformableAttention`` (``mmcv.ops``), computed by detops.

    Same constructor, parameters (``sampling_offsets``, ``attention_weights``, ``value_proj``,
    ``output_proj``), initialisation (:meth:`init_weights`) and forward: the result is
    ``identity + dropout(attention)``, with ``identity`` defaulting to the query (before
    ``query_pos`` is added). ``norm_cfg`` and ``init_cfg`` are stored, as mmcv's ``BaseModule``
    does, and otherwise unused; ``im2col_step`` is kept for configs (detops has no such step).
    Its forward takes ``**kwargs`` (as mmcv's), so it does not script; :class:`MSDeformAttn` does.
    """

    def __init__(self, embed_dims: int = 256, num_heads: int = 8, num_levels: int = 4, num_points: int = 4,
                 im2col_step: int = 64, dropout: float = 0.1, batch_first: bool = False,
                 norm_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None, value_proj_ratio: float = 1.0,
                 *, backward_mode: str = "exact", mode: Optional[str] = None):
        super().__init__(type(self).__name__, embed_dims, num_heads, num_levels, num_points,
                         int(embed_dims * value_proj_ratio), backward_mode, mode)
        self.embed_dims = embed_dims
        self.im2col_step = im2col_step
        self.dropout = nn.Dropout(dropout)
        self.batch_first = batch_first
        self.norm_cfg = norm_cfg
        self.init_cfg = copy.deepcopy(init_cfg)
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's default initialisation (Deformable-DETR's is the same): a fan of initial sampling
        offsets, uniform attention, Xavier-uniform projections with zero biases."""
        self._init_parameters()

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                identity: Optional[Tensor] = None, query_pos: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None, reference_points: Optional[Tensor] = None,
                spatial_shapes: Optional[Tensor] = None, level_start_index: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        """query ``[Q, B, C]`` (``[B, Q, C]`` with batch_first), value ``[S, B, C]`` (default: the
        query), reference_points ``[B, Q, L, 2 or 4]``, spatial_shapes ``[L, 2]``,
        level_start_index ``[L]``; ``key`` and other keywords are ignored, as mmcv does."""
        if not _is_proxy(kwargs) and "residual" in kwargs:  # mmcv's deprecated name for identity (FX: none)
            warnings.warn('"residual" is deprecated in `MultiScaleDeformableAttention`, please use "identity" '
                          "instead", DeprecationWarning, stacklevel=2)
            identity = kwargs.pop("residual")
        if reference_points is None or spatial_shapes is None or level_start_index is None:
            raise DetopsError("MultiScaleDeformableAttention: reference_points, spatial_shapes and level_start_index "
                             "are required")
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if not self.batch_first:
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
        output = self._attend("MultiScaleDeformableAttention", query, value, reference_points, spatial_shapes,
                              level_start_index, key_padding_mask)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity


class MSDeformAttn(_DeformableAttention):
    """Deformable-DETR's ``MSDeformAttn`` (``models/ops/modules``), computed by detops: the same
    constructor, parameters, initialisation (:meth:`_reset_parameters`) and forward (batch first,
    no residual, no dropout). Scriptable with ``torch.jit.script``."""

    def __init__(self, d_model: int = 256, n_levels: int = 4, n_heads: int = 8, n_points: int = 4, *,
                 backward_mode: str = "exact", mode: Optional[str] = None):
        super().__init__(type(self).__name__, d_model, n_heads, n_levels, n_points, d_model, backward_mode, mode)
        self.im2col_step = 64
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        self.n_points = n_points
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        self._init_parameters()

    def forward(self, query: Tensor, reference_points: Tensor, input_flatten: Tensor, input_spatial_shapes: Tensor,
                input_level_start_index: Tensor, input_padding_mask: Optional[Tensor] = None) -> Tensor:
        """query ``[B, Q, C]``, reference_points ``[B, Q, L, 2 or 4]``, input_flatten ``[B, S, C]``,
        input_spatial_shapes ``[L, 2]``, input_level_start_index ``[L]``, input_padding_mask
        ``[B, S]`` (True: padding) -> ``[B, Q, C]``."""
        return self._attend("MSDeformAttn", query, input_flatten, reference_points, input_spatial_shapes,
                            input_level_start_index, input_padding_mask)


class DeformConv2d(nn.Module):
    """torchvision's ``DeformConv2d`` (``torchvision.ops``), computed by detops.

    Same constructor, parameters (``weight`` ``[out_channels, in_channels / groups, kh, kw]``,
    ``bias`` or None), initialisation (:meth:`reset_parameters`: the same random draws, so the same
    seed gives the same tensors), state dict and repr; ``forward(input, offset, mask=None)`` as
    :func:`detops_torch.deform_conv2d` (DCNv2 when a mask is given). The keyword-only
    ``backward_mode`` (``"exact"`` or ``"atomic"``; ``mode``: its deprecated name) is the backward mode. Scriptable with ``torch.jit.script``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 dilation: int = 1, groups: int = 1, bias: bool = True, *, backward_mode: str = "exact", mode: Optional[str] = None):
        super().__init__()
        owner = type(self).__name__
        # torchvision's ValueErrors, with its words
        if in_channels % groups != 0:
            raise DetopsError(f"{owner}: in_channels must be divisible by groups (in_channels {in_channels}, "
                              f"groups {groups})")
        if out_channels % groups != 0:
            raise DetopsError(f"{owner}: out_channels must be divisible by groups (out_channels {out_channels}, "
                              f"groups {groups})")
        backward_mode = resolve_backward_mode(owner, backward_mode, mode)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.backward_mode = backward_mode
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, self.kernel_size[0],
                                               self.kernel_size[1]))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchvision's (and nn.Conv2d's) initialisation: Kaiming-uniform weight with a = sqrt(5),
        bias uniform in +-1 / sqrt(fan_in)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """input ``[N, Cin, H, W]``, offset ``[N, 2 * offset_groups * kh * kw, Ho, Wo]``, mask
        ``[N, offset_groups * kh * kw, Ho, Wo]`` or None -> ``[N, Cout, Ho, Wo]``."""
        if torch.jit.is_scripting():
            return _deform_conv2d(input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation,
                                  mask, self.backward_mode)
        return _deform_conv2d_autocast(input, offset, self.weight, self.bias, self.stride, self.padding,
                                       self.dilation, mask, self.backward_mode)

    def __repr__(self) -> str:
        # torchvision's: the non-default options only.
        s = (f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        s += f", padding={self.padding}" if self.padding != (0, 0) else ""
        s += f", dilation={self.dilation}" if self.dilation != (1, 1) else ""
        s += f", groups={self.groups}" if self.groups != 1 else ""
        s += ", bias=False" if self.bias is None else ""
        return s + ")"


@torch.fx.wrap
def _checked_im2col_step(owner: str, x: Tensor, im2col_step: int) -> Tensor:
    # mmcv's DCNv1 asserts that its im2col step, capped at the batch size, divides the batch
    # (detops has no such step: the check keeps configurations portable back to mmcv). A leaf
    # under FX that returns x, so that a traced graph keeps it.
    if x.dim() > 0 and x.size(0) > 0:
        step = min(im2col_step, x.size(0))
        if step <= 0 or x.size(0) % step != 0:
            raise DetopsAssertionError(owner + ": batch size must be divisible by im2col_step (batch size "
                                       + str(x.size(0)) + ", im2col_step " + str(im2col_step) + ")")
    return x


@torch.fx.wrap
def _divisible_by_deform_groups(x: Tensor, deform_groups: int, owner: str) -> Tensor:
    # mmcv builds a layer whose in_channels deform_groups does not divide and refuses it in the
    # forward (its DCNv1 with this message; its DCNv2 kernels read past the offsets instead). A
    # leaf under FX (it branches on the input's size); returns x.
    if x.dim() >= 2 and x.size(1) % deform_groups != 0:
        raise DetopsError(owner + ": input channels must divide deformable group size: input has "
                          + str(x.size(1)) + " channels, deform_groups is " + str(deform_groups))
    return x


class _MmcvDeformConv(nn.Module):
    """What mmcv's four deformable convolutions share (``DeformConv2d`` and
    ``ModulatedDeformConv2d``, here in :mod:`detops_torch.compat`, and their Packs): the
    constructor's checks and attributes, the offset conv of the Packs, and mmcv's dtype rule."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Tuple[int, int]], stride,
                 padding, dilation, groups: int, deform_groups: int, backward_mode: str,
                 mode: Optional[str] = None):
        super().__init__()
        owner = type(self).__name__
        # mmcv asserts these (or a bad value fails in its kernel); here they fail where written.
        # in_channels % deform_groups is mmcv's forward's to refuse (a layer built with it loads
        # and converts; see _deform).
        for name, channels, what, parts in (("in_channels", in_channels, "groups", groups),
                                            ("out_channels", out_channels, "groups", groups)):
            if parts <= 0 or channels % parts != 0:  # mmcv's assert, with its words
                raise DetopsAssertionError(f"{owner}: {name} {channels} cannot be divisible by {what} {parts} "
                                           f"(expected {name} divisible by {what})")
        if deform_groups <= 0:
            raise DetopsError(f"{owner}: deform_groups is {deform_groups}; expected a positive count")
        backward_mode = resolve_backward_mode(owner, backward_mode, mode)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.deform_groups = deform_groups
        self._owner = owner  # for the forward's messages (TorchScript has no type(self))
        # mmcv keeps these for code that treats the layer as an nn.Conv2d.
        self.transposed = False
        self.output_padding = (0,)
        self.backward_mode = backward_mode
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))

    def _offset_conv(self, channels_per_tap: int) -> nn.Conv2d:
        """A Pack's ``conv_offset``: ``deform_groups * channels_per_tap * kh * kw`` outputs, the
        layer's stride, padding and dilation, with bias (nn.Conv2d's own initial draws)."""
        return nn.Conv2d(self.in_channels,
                         self.deform_groups * channels_per_tap * self.kernel_size[0] * self.kernel_size[1],
                         kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                         dilation=self.dilation, bias=True)

    def _deform(self, x: Tensor, offset: Tensor, bias: Optional[Tensor], mask: Optional[Tensor]) -> Tensor:
        x = _divisible_by_deform_groups(x, self.deform_groups, self._owner)
        # mmcv casts the input, weight, bias and mask to the offset's dtype (16-bit under autocast,
        # where the offset conv's output is).
        x = x.type_as(offset)
        weight = self.weight.type_as(x)
        if bias is not None:
            bias = bias.type_as(x)
        if mask is not None:
            mask = mask.type_as(x)
        # mmcv's kernels zero the offset gradient of a sample at exactly -1 (torchvision's take
        # the one-sided derivative): every border tap of a fresh layer with padding sits there.
        return _deform_conv2d(x, offset, weight, bias, self.stride, self.padding, self.dilation, mask, self.backward_mode,
                              "mmcv")


class _MmcvDeformConv2d(_MmcvDeformConv):
    """mmcv's ``DeformConv2d`` (DCNv1) without its forward: constructor, initialisation, repr."""

    @_renamed_kwargs({"deformable_groups": "deform_groups"}, "DeformConv2d")
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Tuple[int, int]],
                 stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool = False, im2col_step: int = 32, *, backward_mode: str = "exact", mode: Optional[str] = None):
        if bias:
            raise DetopsAssertionError(f"{type(self).__name__}: bias={bias!r} is not supported in DeformConv2d "
                                       "(mmcv's DCNv1 has no bias; the modulated one has)")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deform_groups,
                         backward_mode, mode)
        self.im2col_step = im2col_step
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """mmcv's: the weight Kaiming-uniform for ReLU (bound sqrt(6 / fan_in))."""
        nn.init.kaiming_uniform_(self.weight, nonlinearity="relu")

    def __repr__(self) -> str:
        # mmcv's DeformConv2d repr, one option a line.
        return (f"{self.__class__.__name__}(in_channels={self.in_channels},\nout_channels={self.out_channels},\n"
                f"kernel_size={self.kernel_size},\nstride={self.stride},\npadding={self.padding},\n"
                f"dilation={self.dilation},\ngroups={self.groups},\ndeform_groups={self.deform_groups},\n"
                "bias=False)")


class _MmcvModulatedDeformConv2d(_MmcvDeformConv):
    """mmcv's ``ModulatedDeformConv2d`` (DCNv2) without its forward: constructor, initialisation."""

    @_renamed_kwargs({"deformable_groups": "deform_groups"}, "ModulatedDeformConv2d")
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Tuple[int, int]],
                 stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1, deform_groups: int = 1,
                 bias: Union[bool, str] = True, *, backward_mode: str = "exact", mode: Optional[str] = None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deform_groups,
                         backward_mode, mode)
        if bias:  # mmcv: any truthy value, its documented "auto" included
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's: the weight uniform in +-1 / sqrt(in_channels * kh * kw) (all input channels,
        whatever groups is), zero bias."""
        stdv = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        with torch.no_grad():
            self.weight.uniform_(-stdv, stdv)
            if self.bias is not None:
                self.bias.zero_()


class _OffsetConvCheckpoints:
    """The Packs' checkpoint versions: version-1 checkpoints (mmdetection's first DCN models)
    name the offset conv "<this module's name>_offset" next to the module, e.g.
    "layer1.0.conv2_offset.weight" for the module "layer1.0.conv2"; mmcv renames them on load,
    and so does this."""

    _version = 2

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        version = local_metadata.get("version", None)
        if version is None or version < 2:
            for param in ("weight", "bias"):
                new_key = f"{prefix}conv_offset.{param}"
                old_key = f"{prefix[:-1]}_offset.{param}"
                if new_key not in state_dict and old_key in state_dict:
                    state_dict[new_key] = state_dict.pop(old_key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,  # type: ignore
                                      unexpected_keys, error_msgs)


class DeformConv2dPack(_OffsetConvCheckpoints, _MmcvDeformConv2d):
    """mmcv's ``DeformConv2dPack`` (``mmcv.ops``; the ``DCN`` of mmdetection configs), computed by
    detops: a DCNv1 layer that predicts its own offsets.

    Same constructor (``bias`` must be False, as mmcv asserts; ``im2col_step`` is accepted and
    kept, it only batches mmcv's kernel; mmcv's deprecated ``deformable_groups`` is accepted with
    a warning), attributes, parameters (``weight``, ``conv_offset.weight``, ``conv_offset.bias``),
    initialisation (the weight Kaiming-uniform for ReLU, then ``conv_offset`` built and zeroed:
    mmcv's sequence of random draws), repr and state-dict version (2; version-1 checkpoints are
    renamed on load, as mmcv does). ``forward(x)``: ``offset = conv_offset(x)``
    (``deform_groups * 2 * kh * kw`` channels, (y, x) per tap as torchvision's) goes to
    :func:`detops_torch.deform_conv2d` without a mask. Like mmcv, the input and weight are cast
    to the offset's dtype. The keyword-only ``backward_mode`` is the backward mode (``mode``: its deprecated name).
    """

    @_renamed_kwargs({"deformable_groups": "deform_groups"}, "DeformConv2d")
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Tuple[int, int]],
                 stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool = False, im2col_step: int = 32, *, backward_mode: str = "exact", mode: Optional[str] = None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deform_groups,
                         bias, im2col_step, backward_mode=backward_mode, mode=mode)
        self.conv_offset = self._offset_conv(2)
        self.init_offset()

    def init_offset(self) -> None:
        """mmcv's: a zero ``conv_offset`` (the layer starts as a plain convolution)."""
        with torch.no_grad():
            self.conv_offset.weight.zero_()
            self.conv_offset.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        """x ``[N, in_channels, H, W]`` -> ``[N, out_channels, Ho, Wo]``."""
        x = _checked_im2col_step("DeformConv2dPack", x, self.im2col_step)
        return self._deform(x, self.conv_offset(x), None, None)


class ModulatedDeformConv2dPack(_OffsetConvCheckpoints, _MmcvModulatedDeformConv2d):
    """mmcv's ``ModulatedDeformConv2dPack`` (``mmcv.ops``; the ``DCNv2`` of mmdetection configs),
    computed by detops: a DCNv2 layer that predicts its own offsets and mask.

    Same constructor (mmcv's deprecated ``deformable_groups`` is accepted with a warning),
    attributes, parameters (``weight``, ``bias``, ``conv_offset.weight``, ``conv_offset.bias``),
    initialisation (:meth:`init_weights`, with mmcv's sequence of random draws) and state-dict
    version (2; version-1 checkpoints that name the offset conv ``<name>_offset`` are renamed on
    load, as mmcv does). ``forward(x)``: ``conv_offset(x)`` (``deform_groups * 3 * kh * kw``
    channels) is split into thirds ``o1, o2, m``; ``offset = cat(o1, o2)``, ``mask = sigmoid(m)``.

    Offset channels: mmcv's kernels read offset channel ``2 * t`` as the y and ``2 * t + 1`` as the
    x offset of kernel tap ``t`` (per deformable group), exactly as torchvision's and detops' do, so
    the concatenated ``offset`` goes to detops unchanged and an mmcv checkpoint gives mmcv's output
    (the y offsets are thus the even channels of the two first thirds, not the first third).
    Like mmcv, the input, weight, bias and mask are cast to the offset's dtype (under autocast the
    offset conv's output is 16-bit). The keyword-only ``backward_mode`` is the backward mode (``mode``: its deprecated name).
    """

    @_renamed_kwargs({"deformable_groups": "deform_groups"}, "ModulatedDeformConv2d")
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Tuple[int, int]],
                 stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1, deform_groups: int = 1,
                 bias: Union[bool, str] = True, *, backward_mode: str = "exact", mode: Optional[str] = None):
        # mmcv draws the weight (ModulatedDeformConv2d's constructor), builds conv_offset
        # (nn.Conv2d's own initial draws) and draws the weight again: the same sequence here, so
        # one seed gives mmcv's tensors.
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deform_groups,
                         bias, backward_mode=backward_mode, mode=mode)
        self.conv_offset = self._offset_conv(3)
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's initialisation: the weight uniform in +-1 / sqrt(in_channels * kh * kw), zero
        bias, and a zero conv_offset (offsets 0 and mask sigmoid(0) = 0.5 at first)."""
        super().init_weights()
        if hasattr(self, "conv_offset"):  # not yet built when the base constructor calls this
            with torch.no_grad():
                self.conv_offset.weight.zero_()
                self.conv_offset.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        """x ``[N, in_channels, H, W]`` -> ``[N, out_channels, Ho, Wo]``."""
        out = self.conv_offset(x)
        thirds = torch.chunk(out, 3, dim=1)  # indexed, not unpacked: FX on torch 1.13 cannot unpack
        offset = torch.cat((thirds[0], thirds[1]), dim=1)
        return self._deform(x, offset, self.bias, torch.sigmoid(thirds[2]))
