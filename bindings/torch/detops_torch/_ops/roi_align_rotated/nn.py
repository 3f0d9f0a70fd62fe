# detectron2's ROIAlignRotated and mmcv's RoIAlignRotated over detops' roi_align_rotated.
"""RoIAlignRotated's modules with the anchors' signatures:

* ``ROIAlignRotated(output_size, spatial_scale, sampling_ratio)``: detectron2's
  (``detectron2.layers``): rois ``[K, 6]`` ``(batch_index, cx, cy, w, h, angle)``, angles in
  degrees counter-clockwise, always aligned
* ``RoIAlignRotated(output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False)``:
  mmcv's (``mmcv.ops``, used by mmrotate): the same rois with angles in radians; mmcv's deprecated
  ``out_size`` and ``sample_num`` are accepted with a warning

Both also take the keyword-only ``backward_mode`` (default ``"exact"``) and ``truncation``.
"""
from typing import Callable, Dict, Tuple

import torch
import torch.fx
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from ..._common import _checked_rois, _renamed_kwargs, _roi_kwargs, check_roi_options
from .functional import _roi_align_rotated

# torch.fx.wrap patches the globals of the module that registers a function: the leaves called
# from here are registered here.
torch.fx.wrap("_roi_align_rotated")
torch.fx.wrap("_checked_rois")

__all__ = ["ROIAlignRotated", "RoIAlignRotated"]


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


def _d2_roi_align_rotated(m: nn.Module, opts) -> nn.Module:
    return ROIAlignRotated(m.output_size, m.spatial_scale, m.sampling_ratio, **_roi_kwargs(opts))


def _mmcv_roi_align_rotated(m: nn.Module, opts) -> nn.Module:
    return RoIAlignRotated(m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned, m.clockwise,
                                **_roi_kwargs(opts))


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("detectron2.layers.roi_align_rotated", "ROIAlignRotated"): _d2_roi_align_rotated,
    ("mmcv.ops.roi_align_rotated", "RoIAlignRotated"): _mmcv_roi_align_rotated,
}

# The names detops_torch.compat.register_mmcv() gives these layers in mmcv's registries: name ->
# (class, kind); kinds: "ops" (also an attribute of mmcv.ops), "norm", "conv", "attention".
MMCV_LAYERS = {
    "DetopsRoIAlignRotated": (RoIAlignRotated, "ops"),
}
