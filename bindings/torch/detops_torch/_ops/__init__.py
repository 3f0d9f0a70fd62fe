# The binding's ops, one package each (registration, functional, modules, converter entries); OPS is the one central list.
"""One package per op of ``DETOPS_OPS`` (CMakeLists.txt), each the whole binding of that op next
to its C++ half ``bindings/torch/csrc/<op>.cpp``:

* ``_registration``: its fake kernels (both layers) and, for the stable layer, its autograd
  (see :mod:`detops_torch._registry`);
* ``functional``, ``nn``, ``compat``, ``distributed`` (those it has): its functions and modules;
  each part's ``__all__`` is what :mod:`detops_torch.functional` (``.nn``, ``.compat``,
  ``.distributed``) re-exports;
* ``CONVERTERS`` and ``MMCV_LAYERS`` in a part: its entries of :func:`detops_torch.convert` and
  :func:`detops_torch.compat.register_mmcv`;
* the package's ``__all__``: what ``import detops_torch`` exports from it.

A new op adds its package and one line to ``OPS`` (and its name to ``DETOPS_OPS``); the
namespaces, the converter table and the mmcv registrations are derived from these.
"""
import importlib
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Tuple

OPS = (
    "roi_align",
    "roi_align_rotated",
    "grid_sample",
    "ms_deform_attn",
    "deform_conv2d",
    "frozen_batch_norm",
    "sync_batch_norm",
)

PARTS = ("functional", "nn", "compat", "distributed")

_PACKAGES = {op: importlib.import_module(f"{__name__}.{op}") for op in OPS}


def packages() -> Iterator[Tuple[str, ModuleType]]:
    """``(op, package)`` in ``OPS`` order."""
    return iter(_PACKAGES.items())


def parts(kind: str) -> List[ModuleType]:
    """Every op's ``kind`` part (``"functional"``, ``"nn"``, ...), in ``OPS`` order."""
    if kind not in PARTS:
        raise ValueError(f"detops_torch._ops.parts: kind is {kind!r}; expected one of {PARTS}")
    return [getattr(pkg, kind) for _, pkg in packages() if hasattr(pkg, kind)]


def export(modules: List[ModuleType], namespace: Dict[str, Any]) -> List[str]:
    """Copies each module's ``__all__`` into ``namespace``; returns the names in order. Two ops
    exporting one name into one namespace is a programming error, raised at import."""
    names: List[str] = []
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if name in namespace and namespace[name] is not value:
                raise ImportError(f"detops_torch: {module.__name__} exports {name!r}, which another op exports too")
            namespace[name] = value
            if name not in names:
                names.append(name)
    return names


def converters() -> Dict[Tuple[str, str], Callable]:
    """Every op's converter entries: (module, qualified class name) of a peer's class -> builder."""
    table: Dict[Tuple[str, str], Callable] = {}
    for kind in PARTS:
        for module in parts(kind):
            for key, build in getattr(module, "CONVERTERS", {}).items():
                if key in table:
                    raise ImportError(f"detops_torch: {module.__name__} converts {key}, which another op converts")
                table[key] = build
    return table


def mmcv_layers() -> Dict[str, Tuple[type, str]]:
    """Every op's mmcv registrations: name -> (class, kind)."""
    layers: Dict[str, Tuple[type, str]] = {}
    for kind in PARTS:
        for module in parts(kind):
            layers.update(getattr(module, "MMCV_LAYERS", {}))
    return layers
