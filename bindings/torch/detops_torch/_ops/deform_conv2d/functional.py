# deform_conv2d (torchvision's signature: DCNv1, and DCNv2 with a mask) and its all-positional forms for the modules.
"""Deformable convolution's functional form: ``deform_conv2d`` has ``torchvision.ops.deform_conv2d``'s
signature (DCNv1, and DCNv2 with a mask) plus trailing ``backward_mode`` (``"exact"`` or
``"atomic"``) and ``border_rule`` (torchvision's or mmcv's offset gradient at -1)."""
from typing import List, Optional, Tuple

import torch
import torch.fx
from torch import Tensor
from torch.nn.modules.utils import _pair

from ..._common import _sizes, resolve_backward_mode
from ..._errors import DetopsError, eager, run

__all__ = ["DEFORM_BORDER_RULES", "deform_conv2d"]


# deform_conv2d's offset-gradient border rule: torchvision's, or mmcv's (also detectron2's)
DEFORM_BORDER_RULES = ("torchvision", "mmcv")


def _deform_groups(input: Tensor, offset: Tensor, weight: Tensor) -> Tuple[int, int]:
    """(groups, offset_groups) inferred from the shapes as torchvision infers them. Shapes that
    give none (wrong ranks, an empty kernel) give 1 and 1: the op then names what is wrong."""
    if input.dim() != 4 or weight.dim() != 4 or offset.dim() != 4:
        return 1, 1
    taps = weight.size(2) * weight.size(3)
    if taps <= 0:
        return 1, 1
    if offset.size(1) <= 0 or offset.size(1) % (2 * taps) != 0:
        raise DetopsError(
            "deform_conv2d: the shape of the offset tensor at dimension 1 is not valid: offset has sizes "
            + _sizes(offset) + "; expected [N, 2 * offset_groups * kh * kw, Ho, Wo] with offset_groups >= 1:"
            + " channels a positive multiple of 2 * kh * kw = " + str(2 * taps)
        )
    groups = 1
    if weight.size(1) > 0:
        groups = input.size(1) // weight.size(1)
    return groups, offset.size(1) // (2 * taps)


@torch.fx.wrap
def _deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: Tuple[int, int],
    padding: Tuple[int, int],
    dilation: Tuple[int, int],
    mask: Optional[Tensor],
    backward_mode: str,
    border_rule: str = "torchvision",
) -> Tensor:
    # All-positional form of deform_conv2d, for the modules (TorchScript 1.13 rejects keyword-only
    # arguments with defaults). The op validates the rest, backward_mode and border_rule included.
    stride_h, stride_w = _pair(stride)
    pad_h, pad_w = _pair(padding)
    dil_h, dil_w = _pair(dilation)
    groups, offset_groups = _deform_groups(input, offset, weight)
    return torch.ops.detops.deform_conv2d(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h,
                                          dil_w, groups, offset_groups, mask is not None, backward_mode, border_rule)


def _autocast_args(tensors: List[Optional[Tensor]]) -> List[Optional[Tensor]]:
    """Under torch.autocast, every tensor argument in the autocast dtype, as autocast treats
    torch's conv2d (deform_conv2d is a convolution): detops then computes natively in that dtype
    (float32 accumulation). torchvision instead casts to float32 and returns float32. Outside
    autocast the tensors are returned as they are (mixed dtypes are then a ValueError)."""
    dtype: Optional[torch.dtype] = None
    device_type = tensors[0].device.type  # the input's (never None)
    if device_type not in ("cpu", "cuda"):
        return tensors
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4 (the per-device functions warn there)
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
    elif device_type == "cuda" and torch.is_autocast_enabled():
        dtype = torch.get_autocast_gpu_dtype()
    elif device_type == "cpu" and torch.is_autocast_cpu_enabled():
        dtype = torch.get_autocast_cpu_dtype()
    if dtype is None:
        return tensors
    return [t if t is None or not t.is_floating_point() else t.to(dtype) for t in tensors]


@torch.fx.wrap
@torch.jit.unused
def _deform_conv2d_autocast(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: Tuple[int, int],
    padding: Tuple[int, int],
    dilation: Tuple[int, int],
    mask: Optional[Tensor],
    backward_mode: str,
    border_rule: str = "torchvision",
) -> Tensor:
    # _deform_conv2d after _autocast_args: the eager path of the function and the modules (a
    # scripted module calls _deform_conv2d directly).
    input, offset, weight, bias, mask = _autocast_args([input, offset, weight, bias, mask])
    if eager():  # the op library's errors as detops' types
        return run(_deform_conv2d, input, offset, weight, bias, stride, padding, dilation, mask, backward_mode,
                   border_rule)
    return _deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask, backward_mode, border_rule)


@torch.fx.wrap
def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: Tuple[int, int] = (1, 1),
    padding: Tuple[int, int] = (0, 0),
    dilation: Tuple[int, int] = (1, 1),
    mask: Optional[Tensor] = None,
    backward_mode: str = "exact",
    mode: Optional[str] = None,
    border_rule: str = "torchvision",
) -> Tensor:
    """Deformable convolution, ``torchvision.ops.deform_conv2d``'s signature and semantics,
    computed by detops: DCNv1 without ``mask``, DCNv2 (modulated) with it.

    Args:
        input: ``[N, Cin, H, W]`` float32, float64, float16 or bfloat16 (NCHW or channels_last; the
            output and grad_input keep the input's memory format).
        offset: ``[N, 2 * offset_groups * kh * kw, Ho, Wo]``: channel ``2 * (g * kh * kw + i * kw + j)``
            is the y offset of kernel tap ``(i, j)`` in offset group ``g``, the next one its x offset.
        weight: ``[Cout, Cin / groups, kh, kw]``; ``groups = Cin / weight.shape[1]``.
        bias: ``[Cout]`` or None.
        stride, padding, dilation: ``int`` or ``(h, w)``, as torchvision.
        mask: ``[N, offset_groups * kh * kw, Ho, Wo]`` modulation (DCNv2) or None (DCNv1).
        backward_mode: ``"exact"`` (bitwise reproducible gradients, the default) or ``"atomic"``
            (the anchors' scatter of grad_input; not reproducible on GPUs, where it raises torch's
            nondeterminism alert). The forward and the other gradients are the same in both.
            (``mode``: its deprecated name.)
        border_rule: the offset gradient of a sampling point at exactly -1 (row or column): the
            one-sided derivative (``"torchvision"``, the default) or 0 (``"mmcv"``: mmcv's and
            detectron2's kernels, which zero it unless ``-1 < y < H`` and ``-1 < x < W``). A fresh
            mmcv DCN layer (zero offsets) with padding puts every border tap there, so its first
            step differs; mmcv's stand-ins use ``"mmcv"``. Nothing else depends on it.

    All tensors share the input's dtype and device (under ``torch.autocast`` they are cast to the
    autocast dtype first, as for a convolution). 16-bit inputs run natively (float32 accumulation,
    rounded once), not upcast.

    Returns:
        ``[N, Cout, Ho, Wo]``. Gradients flow to input, offset, weight, mask and bias, each computed
        only when needed.

    Scriptable with ``torch.jit.script``, as torchvision's (``backward_mode`` and ``mode`` follow
    torchvision's arguments, positional or keyword; scripted, ``mode`` gives no warning and autocast
    does not cast, as in the scripted modules).
    """
    if torch.jit.is_scripting():
        if mode is not None:
            backward_mode = mode
        return _deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask, backward_mode, border_rule)
    else:
        backward_mode = resolve_backward_mode("deform_conv2d", backward_mode, mode)
        return _deform_conv2d_autocast(input, offset, weight, bias, stride, padding, dilation, mask, backward_mode,
                                       border_rule)
