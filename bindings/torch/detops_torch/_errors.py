# detops_torch's error types (DetopsError, DetopsAssertionError, DetopsOutOfMemoryError) and the translation of the op library's errors into them.
"""The errors detops_torch raises, and where they come from.

* :class:`DetopsError`: a bad argument. It is a ``ValueError`` (detops' type since 0.1) and a
  ``RuntimeError`` (what torchvision's and mmcv's C++ checks raise), so code and peer tests that
  catch either catch it.
* :class:`DetopsAssertionError`: a ``DetopsError`` that is also an ``AssertionError``, where a
  stand-in replaces a peer's Python ``assert`` (torchvision's box-shape checks, mmcv's
  ``im2col_step``).
* :class:`DetopsOutOfMemoryError`: an allocation (or a grid or workspace larger than allowed)
  that failed; a ``MemoryError`` and, on torch >= 2.5, torch's device-neutral
  ``torch.OutOfMemoryError`` (never ``torch.cuda.OutOfMemoryError`` for a CPU tensor).

How the op library's C++ errors reach them: the classic layer's kernels raise torch's types
(``ValueError`` through ``TORCH_CHECK_VALUE``, torch's out-of-memory error), the stable layer's
raise ``RuntimeError`` tagged ``[detops:ValueError]`` / ``[detops:OutOfMemoryError]``.
:func:`run` (every eager call of the functions and modules) and the stable layer's autograd
kernel (:mod:`detops_torch._registry`) translate both into the types above. Not translated: a
direct ``torch.ops.detops.*`` call in the classic layer (torch's types) and, in the classic
layer, errors raised inside ``backward()`` (C++ autograd: torch's types; double backward is a
``RuntimeError`` there, a ``DetopsError`` in the stable layer). Under TorchScript an op's error
is torch's ``RuntimeError`` and a Python-level check is ``torch.jit.Error``, for any scripted
code.
"""
import re
from typing import Any, Callable

import torch

__all__ = ["DetopsError", "DetopsAssertionError", "DetopsOutOfMemoryError", "translated", "run", "eager"]


class DetopsError(ValueError, RuntimeError):
    """A bad argument to a detops op, function or module (a ValueError and a RuntimeError)."""


class DetopsAssertionError(DetopsError, AssertionError):
    """A DetopsError where the peer asserts in Python (torchvision's box shapes, mmcv's im2col_step)."""


# torch >= 2.5 has a device-neutral torch.OutOfMemoryError (torch.cuda's is its alias); before,
# only torch.cuda.OutOfMemoryError, which a CPU failure must not claim.
_TORCH_OOM = getattr(torch, "OutOfMemoryError", None)
_OOM_BASES = (MemoryError,) if _TORCH_OOM is None else (MemoryError, _TORCH_OOM)


class DetopsOutOfMemoryError(*_OOM_BASES):  # type: ignore[misc]
    """An allocation detops needed failed, or a problem needs more memory than detops allows
    (a MemoryError; on torch >= 2.5 also torch.OutOfMemoryError)."""


_TAG = re.compile(r"\[detops:(ValueError|OutOfMemoryError)\] ")


def translated(error: BaseException) -> BaseException:
    """The detops type for an error of the op library (either layer), or ``error`` itself."""
    if isinstance(error, (DetopsError, DetopsOutOfMemoryError)):
        return error
    message = str(error)
    match = _TAG.search(message)
    if match is not None:  # the stable layer's tagged RuntimeError
        text = message[match.end():]
        return DetopsError(text) if match.group(1) == "ValueError" else DetopsOutOfMemoryError(text)
    oom_types = tuple(t for t in (_TORCH_OOM, getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    if oom_types and isinstance(error, oom_types):  # the classic layer's c10::OutOfMemoryError
        return DetopsOutOfMemoryError(message)
    if type(error) is ValueError:  # the classic layer's TORCH_CHECK_VALUE
        return DetopsError(message)
    return error


def run(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` with the op library's errors raised as detops' types (eager calls only:
    TorchScript compiles no try statement). On a torch without a device-neutral out-of-memory
    error (< 2.5), an out-of-memory error of a call with CUDA tensors stays torch.cuda's."""
    try:
        return fn(*args)
    except (ValueError, RuntimeError) as error:
        better = translated(error)
        if better is error:
            raise
        if (isinstance(better, DetopsOutOfMemoryError) and _TORCH_OOM is None and not _TAG.search(str(error))
                and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)):
            raise
        raise better from None


def eager() -> bool:
    """Whether a call runs in plain Python (neither scripted nor under torch.compile), where
    :func:`run` may wrap it."""
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return not (check is not None and check())
