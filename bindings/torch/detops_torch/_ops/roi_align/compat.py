# detectron2's ROIAlign and mmcv's RoIAlign (avg and max pooling) over detops' roi_align.
"""RoIAlign's modules with the signatures of detectron2 and mmcv:

* detectron2 ``detectron2.layers.ROIAlign(output_size, spatial_scale, sampling_ratio, aligned=True)``
  (rois cast to the input's dtype, as detectron2 does);
* mmcv ``mmcv.ops.RoIAlign(output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode='avg',
  aligned=True, use_torchvision=False)`` (avg and max pooling; ``use_torchvision`` is accepted and
  ignored: detops computes either way).
"""
from typing import Callable, Dict, Tuple

import torch
import torch.fx
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from ..._common import _checked_rois, _renamed_kwargs, _roi_kwargs, check_choice, check_roi_options
from .functional import POOL_MODES, _roi_align

# torch.fx.wrap patches the globals of the module that registers a function: the leaves called
# from here are registered here too.
torch.fx.wrap("_roi_align")
torch.fx.wrap("_checked_rois")

__all__ = ["ROIAlign", "RoIAlign"]


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


def _d2_roi_align(m: nn.Module, opts) -> nn.Module:
    return ROIAlign(m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned, **_roi_kwargs(opts))


def _mmcv_roi_align(m: nn.Module, opts) -> nn.Module:
    return RoIAlign(m.output_size, m.spatial_scale, m.sampling_ratio, m.pool_mode, m.aligned,
                           m.use_torchvision, **_roi_kwargs(opts))


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("detectron2.layers.roi_align", "ROIAlign"): _d2_roi_align,
    ("mmcv.ops.roi_align", "RoIAlign"): _mmcv_roi_align,
}

# The names detops_torch.compat.register_mmcv() gives these layers in mmcv's registries: name ->
# (class, kind); kinds: "ops" (also an attribute of mmcv.ops), "norm", "conv", "attention".
MMCV_LAYERS = {
    "DetopsRoIAlign": (RoIAlign, "ops"),
}
