# grid_sample (torch's signature, 4-d) and point_sample (detectron2's and Mask2Former's helper over it).
"""grid_sample's functional forms: ``grid_sample`` has ``torch.nn.functional.grid_sample``'s
signature (4-d input; bilinear and nearest) plus a trailing ``backward_mode`` (``"exact"`` or
``"atomic"``); ``point_sample`` is detectron2's (and Mask2Former's) helper over it."""
import warnings
from typing import Optional

import torch
import torch.fx
from torch import Tensor

from ..._common import GATHER_BACKWARD_MODES, check_choice
from ..._errors import eager, run

__all__ = ["GRID_SAMPLE_COORDINATES", "GRID_SAMPLE_MODES", "GRID_SAMPLE_PADDING_MODES", "grid_sample",
           "point_sample"]


GRID_SAMPLE_MODES = ("bilinear", "nearest")
GRID_SAMPLE_PADDING_MODES = ("zeros", "border", "reflection")
# What the grid's values are: torch's [-1, 1], or point_sample's [0, 1] (read as 2c - 1).
GRID_SAMPLE_COORDINATES = ("normalized", "unit")


@torch.fx.wrap
def _grid_sample(input: Tensor, grid: Tensor, mode: str, padding_mode: str, align_corners: bool,
                 backward_mode: str, coordinates: str = "normalized") -> Tensor:
    # All-positional form of grid_sample (TorchScript 1.13 rejects keyword-only arguments with
    # defaults). The op checks the strings again, under its own argument names.
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.grid_sample, input, grid, mode, padding_mode, align_corners, backward_mode,
                       coordinates)
    return torch.ops.detops.grid_sample(input, grid, mode, padding_mode, align_corners, backward_mode, coordinates)


def _checked_align_corners(mode: str, padding_mode: str, align_corners: Optional[bool], backward_mode: str) -> bool:
    """grid_sample's option checks (eager and traced; scripted, the op checks them under its
    argument names) and its align_corners: None means False, with the warning torch gives."""
    if not torch.jit.is_scripting():
        check_choice("grid_sample", "mode", mode, GRID_SAMPLE_MODES)
        check_choice("grid_sample", "padding_mode", padding_mode, GRID_SAMPLE_PADDING_MODES)
        check_choice("grid_sample", "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    if align_corners is None:
        warnings.warn(
            "grid_sample: align_corners is None, which means False (torch's default since 1.3.0); "
            "pass align_corners explicitly to silence this warning",
            stacklevel=3,
        )
        return False
    return align_corners


@torch.fx.wrap
def grid_sample(
    input: Tensor,
    grid: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: Optional[bool] = None,
    backward_mode: str = "exact",
) -> Tensor:
    """``torch.nn.functional.grid_sample`` for 4-d inputs, computed by detops.

    Args:
        input: ``[N, C, H, W]`` float32, float64, float16 or bfloat16 (NCHW or channels_last; the
            output and its gradient keep the input's memory format).
        grid: ``[N, Ho, Wo, 2]`` (x, y) in [-1, 1]; the input's dtype, or float32/float64.
        mode: ``"bilinear"`` or ``"nearest"`` (torch's ``"bicubic"`` and 5-d inputs are not offered).
        padding_mode: ``"zeros"``, ``"border"`` or ``"reflection"``.
        align_corners: as torch; None means False, with a warning as torch gives.
        backward_mode: ``"exact"`` (bitwise reproducible, the default) or ``"atomic"`` (a scatter;
            not reproducible on GPUs, where it raises torch's nondeterminism alert).

    Returns:
        ``[N, C, Ho, Wo]`` in the input's dtype. Gradients flow to ``input`` and ``grid`` (zero for
        the grid with ``"nearest"``, as torch's); a NaN coordinate samples 0 and gets 0 gradients.

    Scriptable with ``torch.jit.script``, as torch's.
    """
    align_corners = _checked_align_corners(mode, padding_mode, align_corners, backward_mode)
    return _grid_sample(input, grid, mode, padding_mode, align_corners, backward_mode)


@torch.fx.wrap
def point_sample(
    input: Tensor,
    point_coords: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: Optional[bool] = None,
    backward_mode: str = "exact",
) -> Tensor:
    """detectron2's (and Mask2Former's) ``point_sample``: samples ``input`` ``[N, C, H, W]`` at
    ``point_coords`` in [0, 1] x [0, 1], given as ``[N, P, 2]`` (result ``[N, C, P]``) or
    ``[N, Ho, Wo, 2]`` (result ``[N, C, Ho, Wo]``); the options are :func:`grid_sample`'s
    (detectron2 passes them through ``**kwargs``: name them).

    One pass: the op reads each coordinate c as ``2 * c - 1`` computed in the coordinates' dtype,
    so the output and both gradients have the bits of detectron2's
    ``grid_sample(input, 2.0 * point_coords - 1.0)`` (its backward included) without building
    that grid.
    """
    align_corners = _checked_align_corners(mode, padding_mode, align_corners, backward_mode)
    add_dim = point_coords.dim() == 3
    if add_dim:
        point_coords = point_coords.unsqueeze(2)
    output = _grid_sample(input, point_coords, mode, padding_mode, align_corners, backward_mode, "unit")
    if add_dim:
        output = output.squeeze(3)
    return output
