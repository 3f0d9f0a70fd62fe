# mmcv's DeformConv2d and ModulatedDeformConv2d, detectron2's DeformConv and ModulatedDeformConv, over detops' deform_conv2d under mmcv's border rule.
"""Deformable convolution's modules with the signatures of mmcv and detectron2:

* mmcv ``mmcv.ops.DeformConv2d`` (DCNv1, ``forward(x, offset)``; RepPoints', VFNet's and Guided
  Anchoring's heads) and ``mmcv.ops.ModulatedDeformConv2d`` (DCNv2, ``forward(x, offset, mask)``;
  DyHead's): the layers without an offset conv of their own (their Packs, which have one, are
  :class:`detops_torch.DeformConv2dPack` and :class:`detops_torch.ModulatedDeformConv2dPack`);
* detectron2 ``detectron2.layers.DeformConv`` and ``ModulatedDeformConv`` (DCNv1 and DCNv2, with
  ``norm`` and ``activation``), under detectron2's offset-gradient border rule, which is mmcv's.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.fx
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from ..._common import GATHER_BACKWARD_MODES, _built_quietly, _gather_mode, _take, check_choice
from ..._errors import DetopsAssertionError, DetopsError
from .functional import _deform_conv2d
from .nn import _checked_im2col_step, _mmcv_deform_conv, _MmcvDeformConv2d, _MmcvModulatedDeformConv2d

# torch.fx.wrap patches the globals of the module that registers a function: the leaves called
# from here are registered here too.
torch.fx.wrap("_checked_im2col_step")
torch.fx.wrap("_deform_conv2d")

__all__ = ["DeformConv2d", "ModulatedDeformConv2d", "DeformConv", "ModulatedDeformConv"]


class DeformConv2d(_MmcvDeformConv2d):
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


class ModulatedDeformConv2d(_MmcvModulatedDeformConv2d):
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


def _d2_deform_conv(cls, taken: Tuple[str, ...]) -> Callable[[nn.Module, Dict[str, object]], nn.Module]:
    """The builder for detectron2's DeformConv / ModulatedDeformConv: their constructor arguments
    as the old module holds them; the Parameters, norm and activation in ``taken`` are the old
    module's."""

    def build(m: nn.Module, opts) -> nn.Module:
        bias = {} if cls is DeformConv else {"bias": m.bias is not None}
        new = _built_quietly(lambda: cls(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding,
                                         m.dilation, m.groups, m.deformable_groups, norm=m.norm,
                                         activation=m.activation, backward_mode=_gather_mode(opts), **bias))
        return _take(new, m, taken)

    return build


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("mmcv.ops.deform_conv", "DeformConv2d"): _mmcv_deform_conv(DeformConv2d, ("weight",)),
    ("mmcv.ops.modulated_deform_conv", "ModulatedDeformConv2d"): _mmcv_deform_conv(ModulatedDeformConv2d,
                                                                                   ("weight", "bias")),
    ("detectron2.layers.deform_conv", "DeformConv"): _d2_deform_conv(DeformConv, ("weight",)),
    ("detectron2.layers.deform_conv", "ModulatedDeformConv"): _d2_deform_conv(ModulatedDeformConv,
                                                                             ("weight", "bias")),
}
