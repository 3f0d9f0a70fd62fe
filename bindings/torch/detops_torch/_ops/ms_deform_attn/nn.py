# mmcv's MultiScaleDeformableAttention and Deformable-DETR's MSDeformAttn over detops' ms_deform_attn.
"""Multi-scale deformable attention's modules with the anchors' signatures:

* ``MultiScaleDeformableAttention(embed_dims=256, num_heads=8, num_levels=4, num_points=4,
  im2col_step=64, dropout=0.1, batch_first=False, norm_cfg=None, init_cfg=None,
  value_proj_ratio=1.0)``: mmcv's (its parameters, initialisation and residual forward)
* ``MSDeformAttn(d_model=256, n_levels=4, n_heads=8, n_points=4)``: Deformable-DETR's (no
  residual); the two share their state-dict keys, so a checkpoint of either loads into the other.

Both also take the keyword-only ``backward_mode`` (``"exact"``, the default, or ``"atomic"``).
"""
import copy
import math
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.fx
from torch import Tensor, nn

from ..._common import _built_quietly, _gather_mode, _is_proxy, _take, resolve_backward_mode
from ..._errors import DetopsError
from .functional import ms_deform_attn

# torch.fx.wrap patches the globals of the module that registers a function: a leaf of a traced
# graph here (it reads the autocast state).
torch.fx.wrap("ms_deform_attn")

__all__ = ["MultiScaleDeformableAttention", "MSDeformAttn"]


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


def _mmcv_ms_deform_attn(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: MultiScaleDeformableAttention(
        m.embed_dims, m.num_heads, m.num_levels, m.num_points, m.im2col_step, m.dropout.p, m.batch_first,
        getattr(m, "norm_cfg", None), getattr(m, "init_cfg", None), backward_mode=_gather_mode(opts)))
    # value_proj and output_proj come with their shapes (value_proj_ratio is in them)
    return _take(new, m, ("sampling_offsets", "attention_weights", "value_proj", "output_proj", "dropout"))


def _detr_ms_deform_attn(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: MSDeformAttn(m.d_model, m.n_levels, m.n_heads, m.n_points,
                                                   backward_mode=_gather_mode(opts)))
    new.im2col_step = m.im2col_step
    return _take(new, m, ("sampling_offsets", "attention_weights", "value_proj", "output_proj"))


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("mmcv.ops.multi_scale_deform_attn", "MultiScaleDeformableAttention"): _mmcv_ms_deform_attn,
    # Deformable-DETR (and the DETR family that vendors its ops) imports it from models/ops,
    ("models.ops.modules.ms_deform_attn", "MSDeformAttn"): _detr_ms_deform_attn,
}

# The names detops_torch.compat.register_mmcv() gives these layers in mmcv's registries: name ->
# (class, kind); kinds: "ops" (also an attribute of mmcv.ops), "norm", "conv", "attention".
MMCV_LAYERS = {
    "DetopsMultiScaleDeformableAttention": (MultiScaleDeformableAttention, "attention"),
}
