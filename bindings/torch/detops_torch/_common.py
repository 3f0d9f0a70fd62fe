# What the ops' Python layers share: the option strings and their checks, the RoI modules' repr and rois check, mmcv's renamed keywords, convert()'s building helpers.
"""Helpers shared by the per-op packages of :mod:`detops_torch._ops` (no op of its own)."""
import functools
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.fx
from torch import Tensor, nn

from ._errors import DetopsAssertionError, DetopsError

# The accepted option strings. The ops validate them again in their forward (with detops' own
# message); the modules check them at construction so a typo fails where it was written.
BACKWARD_MODES = ("exact", "truncated", "atomic")
TRUNCATIONS = ("float16", "bfloat16")
# grid_sample, ms_deform_attn and deform_conv2d have no truncated mode.
GATHER_BACKWARD_MODES = ("exact", "atomic")


def _sizes(t: Tensor) -> str:
    parts: List[str] = []
    for s in t.shape:
        parts.append(str(s))
    return "[" + ", ".join(parts) + "]"


def resolve_backward_mode(owner: str, backward_mode: str, mode: Optional[str]) -> str:
    """``backward_mode``, or the value of the deprecated ``mode`` keyword it replaced (0.1.x)."""
    if mode is not None:
        warnings.warn(f"{owner}: the keyword `mode` is now `backward_mode` (its name in every detops op); "
                      "`mode` will be removed", DeprecationWarning, stacklevel=3)
        backward_mode = mode
    check_choice(owner, "backward_mode", backward_mode, GATHER_BACKWARD_MODES)
    return backward_mode


def check_choice(owner: str, name: str, value: str, allowed: Tuple[str, ...]) -> None:
    """Raises DetopsError unless ``value`` is one of ``allowed`` (used by the modules' constructors)."""
    if not isinstance(value, str) or value not in allowed:
        raise DetopsError(
            f"{owner}: {name} is {value!r}; expected one of " + ", ".join(repr(a) for a in allowed)
        )


def check_roi_options(owner: str, backward_mode: str, truncation: str) -> None:
    """Raises DetopsError unless backward_mode and truncation are ones detops knows."""
    check_choice(owner, "backward_mode", backward_mode, BACKWARD_MODES)
    check_choice(owner, "truncation", truncation, TRUNCATIONS)


def _is_proxy(value) -> bool:
    """Whether ``value`` is an FX proxy (symbolic tracing: the module must not keep it as state)."""
    return isinstance(value, torch.fx.Proxy)


def _roi_options_repr(module: nn.Module) -> str:
    """", backward_mode=..., truncation=..." for the options that are not the defaults (so a default
    module's repr is its peer's)."""
    parts = ""
    if module.backward_mode != "exact":
        parts += f", backward_mode={module.backward_mode!r}"
    if module.truncation != "float16":
        parts += f", truncation={module.truncation!r}"
    return parts


def _renamed_kwargs(mapping: Dict[str, str], cls_name: str):
    """Accepts mmcv's deprecated argument names (out_size, sample_num) with a warning, as mmcv's
    ``deprecated_api_warning`` does; the signature stays the new one."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for old, new in mapping.items():
                if old in kwargs:
                    warnings.warn(f'"{old}" is deprecated in `{cls_name}`, please use "{new}" instead',
                                  DeprecationWarning, stacklevel=2)
                    if new in kwargs:
                        raise TypeError(f"{cls_name}: both {old!r} (deprecated) and {new!r} were given")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper

    return decorate


@torch.fx.wrap
def _checked_rois(owner: str, rois: Tensor, columns: int) -> Tensor:
    # The anchors assert this shape in Python: a DetopsAssertionError naming the columns. A leaf
    # under FX that returns rois, so that a traced graph keeps the check (dead-code elimination
    # drops unused leaves).
    if not isinstance(rois, torch.Tensor):
        raise DetopsAssertionError(f"{owner}: rois is a {type(rois).__name__}; expected a [K, {columns}] tensor")
    if rois.dim() != 2 or rois.size(1) != columns:
        what = "(batch_index, cx, cy, w, h, angle)" if columns == 6 else "(batch_index, x1, y1, x2, y2)"
        raise DetopsAssertionError(f"{owner}: rois has sizes {list(rois.shape)}; expected [K, {columns}] rows " + what)
    return rois


# ---- convert()'s builders (each op's CONVERTERS use them) -----------------------------------

def _roi_kwargs(opts: Dict[str, object]) -> Dict[str, object]:
    return {"backward_mode": opts["backward_mode"], "truncation": opts["truncation"]}


def _gather_mode(opts: Dict[str, object]) -> str:
    # The deformable ops have two modes: "atomic", or "exact" (also under "truncated", which only
    # the RoI ops have).
    return "atomic" if opts["backward_mode"] == "atomic" else "exact"


def _built_quietly(build: Callable[[], nn.Module]) -> nn.Module:
    # The replacement's constructor draws initial parameters that are then replaced by the
    # original's: the draws must not move the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        return build()


def _take(new: nn.Module, old: nn.Module, names) -> nn.Module:
    for name in names:
        setattr(new, name, getattr(old, name))  # the same Parameter / submodule objects
    return new
