# torchvision's DeformConv2d and mmcv's DCN layers with their own offset conv (DeformConv2dPack, ModulatedDeformConv2dPack) over detops' deform_conv2d.
"""Deformable convolution's modules with the anchors' signatures:

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

All take the keyword-only ``backward_mode`` (``"exact"``, the default, or ``"atomic"``). mmcv's
layers without an offset conv, and detectron2's, are in :mod:`detops_torch.compat`.
"""
import math
from typing import Callable, Dict, Optional, Tuple, Union

import torch
import torch.fx
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from ..._common import _built_quietly, _gather_mode, _renamed_kwargs, _take, resolve_backward_mode
from ..._errors import DetopsAssertionError, DetopsError
from .functional import _deform_conv2d, _deform_conv2d_autocast

# torch.fx.wrap patches the globals of the module that registers a function: the leaves called
# from here are registered here (they branch on shapes or the autocast state).
torch.fx.wrap("_deform_conv2d")
torch.fx.wrap("_deform_conv2d_autocast")

__all__ = ["DeformConv2d", "DeformConv2dPack", "ModulatedDeformConv2dPack"]


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


def _tv_deform_conv2d(m: nn.Module, opts) -> nn.Module:
    new = _built_quietly(lambda: DeformConv2d(
        m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups,
        bias=m.bias is not None, backward_mode=_gather_mode(opts)))
    return _take(new, m, ("weight", "bias"))


def _mmcv_deform_conv(cls, taken: Tuple[str, ...]) -> Callable[[nn.Module, Dict[str, object]], nn.Module]:
    """The builder for one of mmcv's four deformable convolutions: their common constructor
    arguments, then DCNv2's bias flag (its ``taken`` names the bias) or DCNv1's im2col_step; the
    Parameters and submodules in ``taken`` are the old module's."""

    def build(m: nn.Module, opts) -> nn.Module:
        extra = {"bias": m.bias is not None} if "bias" in taken else {"im2col_step": m.im2col_step}
        new = _built_quietly(lambda: cls(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding,
                                         m.dilation, m.groups, m.deform_groups, backward_mode=_gather_mode(opts), **extra))
        return _take(new, m, taken)

    return build


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("torchvision.ops.deform_conv", "DeformConv2d"): _tv_deform_conv2d,
    ("mmcv.ops.deform_conv", "DeformConv2dPack"): _mmcv_deform_conv(DeformConv2dPack, ("weight", "conv_offset")),
    ("mmcv.ops.modulated_deform_conv", "ModulatedDeformConv2dPack"): _mmcv_deform_conv(
        ModulatedDeformConv2dPack, ("weight", "bias", "conv_offset")),
}

# The names detops_torch.compat.register_mmcv() gives these layers in mmcv's registries: name ->
# (class, kind); kinds: "ops" (also an attribute of mmcv.ops), "norm", "conv", "attention".
MMCV_LAYERS = {
    "DetopsDCN": (DeformConv2dPack, "conv"),
    "DetopsDCNv2": (ModulatedDeformConv2dPack, "conv"),
}
