# The Python half of torch.ops.detops' registration: fake (meta) kernels for both layers, and, for the stable layer, autograd, error types and the nondeterminism alert.
"""What the op library's C++ does not register, by layer (``_build_info.ABI``).

* Both layers: the fake kernels (shapes, dtypes, memory formats), one Python function per op in
  ``detops_torch/_ops/<op>.py``, registered with ``torch.library.register_fake`` (the Meta key
  and torch.compile's fake tensors, symbolic sizes included), or as a Meta kernel on torch < 2.4.
* The stable layer (the wheel: one ``_C.so`` for every torch from the floor up) cannot carry
  autograd, torch's error types or torch's nondeterminism alert across the stable ABI, so this
  module registers one Python kernel per op on the ``Autograd`` key. It runs the op below
  autograd (as ``torch.library.register_autograd`` does), applies the op's backward formula,
  raises ``DetopsError`` / ``DetopsOutOfMemoryError`` (:mod:`detops_torch._errors`) for the C++
  errors tagged ``[detops:ValueError]`` / ``[detops:OutOfMemoryError]`` (backend_stable.h), raises
  torch's alert for the atomic backward on CUDA, and refuses double backward through the backward
  ops (a ``DetopsError``). The classic layer does all of this in C++ and registers nothing here
  but the fakes.
"""
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from . import _build_info
from ._errors import DetopsError, run, translated  # noqa: F401  (translated: for callers)
from ._common import check_choice  # noqa: F401  (the fakes refuse what the modules refuse)

STABLE = getattr(_build_info, "ABI", "classic") == "stable"

_LIBS: List[Any] = []  # torch.library.Library objects must outlive their registrations


def _library() -> Any:
    if not _LIBS:
        _LIBS.append(torch.library.Library("detops", "IMPL"))
    return _LIBS[0]


def _op(name: str) -> Any:
    return getattr(torch.ops.detops, name).default


# ---- errors (the types and their translation: _errors.py) ---------------------------------------

def call(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` with tagged C++ errors raised as detops' types."""
    return run(fn, *args)


def alert_not_deterministic(what: str) -> None:
    """torch's nondeterminism alert (``torch.use_deterministic_algorithms``), raised from Python:
    an error, or a warning under ``warn_only=True``; nothing when the mode is off."""
    if not torch.are_deterministic_algorithms_enabled():
        return
    message = (f"{what} does not have a deterministic implementation, but you set "
               "'torch.use_deterministic_algorithms(True)'. Use detops' exact mode (backward_mode='exact'), "
               "which is bitwise reproducible, or turn the check off.")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        raise RuntimeError(message)


# ---- fake kernels (both layers) ------------------------------------------------------------------

# The ops that have a fake kernel, in registration order (every op of the library must: the package
# test compares this with the schemas in bindings/torch/csrc).
FAKES: List[str] = []


def fake(name: str) -> Callable:
    """Registers the decorated function as ``detops::<name>``'s fake (meta) kernel."""
    def register(fn: Callable) -> Callable:
        qualname = f"detops::{name}"
        FAKES.append(name)
        if hasattr(torch.library, "register_fake"):        # torch >= 2.4
            torch.library.register_fake(qualname, fn, lib=_library())
        elif hasattr(torch.library, "impl_abstract"):      # torch 2.2, 2.3
            torch.library.impl_abstract(qualname, fn, lib=_library())
        else:                                              # torch 1.13 - 2.1: a Meta kernel
            _library().impl(name, fn, "Meta")
        return fn
    return register


def require_meta_or_fake(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """A mix of meta and real tensors reaches the Meta kernel (the dispatcher picks Meta when any
    argument is meta): refuse it, as shaping an output on the real device would hide the mistake.
    Fake tensors (torch.compile) are all on their real devices and pass."""
    present = {k: t for k, t in tensors.items() if t is not None}
    if not any(t.is_meta for t in present.values()):
        return
    for arg, t in present.items():
        if not t.is_meta:
            raise DetopsError(f"{op}: {arg} is on device {t.device}; expected meta like the other arguments")


def require_dim(op: str, arg: str, t: torch.Tensor, dim: int, shape: str) -> None:
    """The C++ glue's rank check (common.h), for the outputs a fake kernel shapes."""
    if t.dim() != dim:
        raise DetopsError(f"{op}: {arg} has {t.dim()} dimensions (sizes {list(t.shape)}); expected {shape}")


def channels_last(t: torch.Tensor) -> bool:
    """The layout the C++ glue gives an output made like ``t``: torch's suggest_memory_format for
    4-d tensors (c10's is_channels_last_strides_2d, as backend_stable.h spells it)."""
    if t.dim() != 4:
        return False
    sizes, strides = t.shape, t.stride()
    if strides[1] == 0:
        return False
    smallest = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < smallest:
            return False
        if d == 0 and smallest == strides[1]:
            return False  # N111 and N11W slices: torch calls them contiguous
        smallest = strides[d] * sizes[d] if sizes[d] > 1 else strides[d]
    return True


def new_empty(like: torch.Tensor, sizes: Sequence[Any], dtype: Optional[torch.dtype] = None,
              channels_last: bool = False) -> torch.Tensor:
    """The C++ glue's new_empty: on like's device, like's dtype unless given, channels-last if asked."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(tuple(sizes), dtype=dtype or like.dtype, device=like.device, memory_format=fmt)


def empty_like_format(t: torch.Tensor) -> torch.Tensor:
    """The C++ glue's empty_like_format: t's sizes and dtype, channels-last when t is."""
    return new_empty(t, t.shape, channels_last=channels_last(t))


# ---- autograd (stable layer) ---------------------------------------------------------------------

def _with_defaults(op: Any, args: Tuple[Any, ...]) -> List[Any]:
    """The dispatcher drops trailing arguments equal to their defaults; put them back."""
    args = list(args)
    for argument in op._schema.arguments[len(args):]:
        args.append(argument.default_value)
    return args


def _below_autograd(op: Any, keyset: Any, args: Sequence[Any]) -> Any:
    with torch._C._AutoDispatchBelowAutograd():
        return call(op.redispatch, keyset & torch._C._after_autograd_keyset, *args)


def autograd(name: str, setup_context: Optional[Callable] = None, backward: Optional[Callable] = None,
             double_backward_error: Optional[str] = None, check: Optional[Callable] = None) -> None:
    """The stable layer's Autograd kernel of ``detops::<name>`` (nothing in the classic layer).

    ``setup_context(ctx, inputs, output)`` and ``backward(ctx, needs_input_grad, *grads)`` as
    ``torch.library.register_autograd``'s (inputs with their defaults filled in; needs_input_grad
    one flag per schema argument), returning one gradient per schema argument. Without a formula
    the op is not differentiable: a backward through it raises ``double_backward_error`` (the
    backward ops) or the op runs below autograd only (phases driven by Python, folds).
    ``check(inputs)``, if given, runs first on every call (what the classic layer's autograd
    kernel refuses before running the op).
    """
    if not STABLE:
        return
    op = _op(name)
    differentiable = backward is not None or double_backward_error is not None

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, keyset: Any, *args: Any) -> Any:
            output = _below_autograd(op, keyset, args)
            if setup_context is not None:
                setup_context(ctx, _with_defaults(op, args), output)
            if isinstance(output, tuple):
                ctx.mark_non_differentiable(*[t for t in output if t is not None and not t.is_floating_point()])
            return output

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            if backward is None:
                raise DetopsError(double_backward_error or f"detops::{name}: no gradient")
            needs = ctx.needs_input_grad[1:]
            result = call(backward, ctx, needs, *grads)
            # One gradient per argument the dispatcher passed (it drops trailing defaults).
            return (None, *tuple(result)[:len(needs)])

    Function.__name__ = f"DetopsBackward_{name}"

    def kernel(keyset: Any, *args: Any) -> Any:
        if check is not None:
            check(_with_defaults(op, args))
        if differentiable and torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return Function.apply(keyset, *args)
        return _below_autograd(op, keyset, args)

    _library().impl(name, kernel, "Autograd", with_keyset=True)


def saved(ctx: Any, **values: Any) -> None:
    """Non-tensor attributes on ctx (tensors go through ctx.save_for_backward)."""
    for key, value in values.items():
        setattr(ctx, key, value)
