# torchvision's (and detectron2's) FrozenBatchNorm2d over detops' frozen_batch_norm, and convert_frozen_batchnorm.
"""FrozenBatchNorm2d's module:

* ``FrozenBatchNorm2d(num_features, eps=1e-5)``: the buffers and state dict of torchvision's and
  detectron2's FrozenBatchNorm2d (either checkpoint loads unchanged)
* ``convert_frozen_batchnorm(module)``: BatchNorm2d / SyncBatchNorm -> FrozenBatchNorm2d, as
  detectron2's classmethod of that name.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.fx
from torch import Tensor, nn

from ..._common import _is_proxy
from ..._errors import DetopsError, eager, run

__all__ = ["FrozenBatchNorm2d", "convert_frozen_batchnorm"]


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


def _take_buffers(new: nn.Module, old: nn.Module) -> nn.Module:
    for name in ("weight", "bias", "running_mean", "running_var"):
        setattr(new, name, getattr(old, name))  # same tensors: the checkpoint and device stay
    return new


def _tv_frozen_bn(m: nn.Module, opts) -> nn.Module:
    return _take_buffers(FrozenBatchNorm2d(m.weight.shape[0], m.eps), m)


# (module, qualified class name) of a peer's class -> builder of its detops replacement
# (detops_torch.convert collects every op's table).
CONVERTERS: Dict[Tuple[str, str], Callable[[nn.Module, Dict[str, object]], nn.Module]] = {
    ("torchvision.ops.misc", "FrozenBatchNorm2d"): _tv_frozen_bn,
}
