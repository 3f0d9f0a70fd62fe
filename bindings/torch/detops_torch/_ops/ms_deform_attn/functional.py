# ms_deform_attn: the arguments of Deformable-DETR's MSDeformAttnFunction and mmcv's MultiScaleDeformableAttnFunction.
"""Multi-scale deformable attention's functional form: ``ms_deform_attn`` takes the arguments of
Deformable-DETR's ``MSDeformAttnFunction`` and mmcv's ``MultiScaleDeformableAttnFunction``
(without ``im2col_step``) plus ``backward_mode`` (``"exact"`` or ``"atomic"``)."""
import torch
import torch.fx
from torch import Tensor

from ..._common import GATHER_BACKWARD_MODES  # noqa: F401  (exported)
from ..._errors import eager, run

__all__ = ["GATHER_BACKWARD_MODES", "ms_deform_attn"]


@torch.fx.wrap
def ms_deform_attn(
    value: Tensor,
    value_spatial_shapes: Tensor,
    value_level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    backward_mode: str = "exact",
) -> Tensor:
    """Multi-scale deformable attention (Deformable DETR), computed by detops.

    Args:
        value: ``[B, S, M, D]`` float32, float64, float16 or bfloat16; ``S`` is the sum of the
            levels' ``H * W``.
        value_spatial_shapes: ``[L, 2]`` int64, ``(H, W)`` per level.
        value_level_start_index: ``[L]`` int64, the first row of each level in ``S``.
        sampling_locations: ``[B, Q, M, L, P, 2]`` (x, y) in [0, 1]; float32/float64 or the value's
            dtype.
        attention_weights: ``[B, Q, M, L, P]``; a floating-point one is cast to the value's dtype first,
            as mmcv's Function does (so float32 weights go with a 16-bit value; their gradient comes
            back in their own dtype). The locations are not cast: they keep their precision.
        backward_mode: ``"exact"`` (bitwise reproducible, the default) or ``"atomic"`` (the
            anchors' scatter of the value gradient; not reproducible on GPUs).

    Returns:
        ``[B, Q, M * D]`` in the value's dtype. Gradients flow to ``value``,
        ``sampling_locations`` and ``attention_weights``, each computed only when needed.
    """
    if attention_weights.dtype != value.dtype and attention_weights.is_floating_point() and value.is_floating_point():
        attention_weights = attention_weights.to(value.dtype)
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.ms_deform_attn, value, value_spatial_shapes, value_level_start_index,
                       sampling_locations, attention_weights, backward_mode)
    return torch.ops.detops.ms_deform_attn(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                                           attention_weights, backward_mode)
