# torchvision's RoIAlign and MultiScaleRoIAlign (the FPN pooler) over detops' roi_align.
"""RoIAlign's modules with torchvision's signatures:

* ``RoIAlign(output_size, spatial_scale, sampling_ratio, aligned=False)``
* ``MultiScaleRoIAlign(featmap_names, output_size, sampling_ratio, *, canonical_scale=224,
  canonical_level=4)``: torchvision's FPN pooler (its level mapping, its outputs)

Both also take the keyword-only ``backward_mode`` (default ``"exact"``) and ``truncation``.
"""
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.fx
from torch import Tensor, nn

from ..._common import _is_proxy, _roi_kwargs, _roi_options_repr, check_roi_options
from ..._errors import DetopsError
from .functional import _roi_align, boxes_to_rois

# torch.fx.wrap patches a function in the globals of the module that registers it: the leaves
# called from here are registered here (they branch on shapes or box lists).
torch.fx.wrap("_roi_align")

__all__ = ["RoIAlign", "MultiScaleRoIAlign"]


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


def _tv_roi_align(m: nn.Module, opts) -> nn.Module:
    return RoIAlign(m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned, **_roi_kwargs(opts))


def _tv_multiscale(m: nn.Module, opts) -> nn.Module:
    new = MultiScaleRoIAlign(
        m.featmap_names, m.output_size, m.sampling_ratio,
        canonical_scale=getattr(m, "canonical_scale", 224), canonical_level=getattr(m, "canonical_level", 4),
        **_roi_kwargs(opts),
    )
    # The scales and level mapper are inferred on the first forward; keep them if already there.
    new.scales = m.scales
    new.map_levels = m.map_levels
    return new


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("torchvision.ops.roi_align", "RoIAlign"): _tv_roi_align,
    ("torchvision.ops.poolers", "MultiScaleRoIAlign"): _tv_multiscale,
}
