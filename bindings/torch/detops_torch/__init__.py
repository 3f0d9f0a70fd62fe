# detops_torch: detops' deterministic detection ops (RoIAlign, RoIAlignRotated, grid_sample, multi-scale deformable attention, deformable convolution, FrozenBatchNorm2d, SyncBatchNorm) as PyTorch ops and modules.
"""detops for PyTorch.

``import detops_torch`` registers ``torch.ops.detops.*`` (CPU and CUDA kernels, fake kernels, autograd) and
provides torchvision-, detectron2- and mmcv-compatible modules over them::

    import detops_torch
    pooled = detops_torch.roi_align(features, [boxes], output_size=7, spatial_scale=0.25,
                                    sampling_ratio=2, aligned=True)      # backward_mode="exact"
    model = detops_torch.convert(torchvision_model)   # swap RoIAlign / MultiScaleRoIAlign / FrozenBN
    rotated = detops_torch.ROIAlignRotated(7, 0.25, 2)  # detectron2's (RoIAlignRotated: mmcv's)
    sampled = detops_torch.grid_sample(x, grid, align_corners=False)   # torch's signature
    attn = detops_torch.MultiScaleDeformableAttention(256, 8, 4, 4)    # mmcv's module (MSDeformAttn:
                                                                       # Deformable-DETR's)
    y = detops_torch.deform_conv2d(x, offset, weight, mask=mask)       # torchvision's signature
    dcn = detops_torch.ModulatedDeformConv2dPack(256, 256, 3, padding=1)  # mmcv's DCNv2 (DeformConv2dPack:
                                                                          # its DCNv1; DeformConv2d:
                                                                          # torchvision's)

The compiled op library ``_C.so`` comes in two layers: the wheel's, on torch's stable ABI, serves every
torch from its floor (2.11) up; a source build's classic layer serves the one torch it was built for
(importing it into another can abort the interpreter). What ``_build_info.py`` recorded is checked
before ``_C.so`` is loaded.
"""
import glob as _glob
import os as _os

import torch

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_REBUILD = (
    "rebuild detops_torch against the torch you import: `pip install --no-build-isolation .` in the "
    "detops source tree, or `cmake --build <build-dir> --target detops_torch detops_torch_python` "
    "in a CMake build configured with -DDETOPS_TORCH=ON"
)


def _version_tuple(version: str) -> tuple:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _check_build(build_info) -> None:
    """Raises ImportError if the op library cannot serve the installed torch (before it is loaded).

    The stable-ABI library (the wheel) serves every torch from its floor up; a classic-layer
    library (a source build) serves exactly the torch it was built against."""
    abi = getattr(build_info, "ABI", "classic")
    built = getattr(build_info, "TORCH_VERSION", None)
    if abi == "stable":
        floor = getattr(build_info, "TORCH_FLOOR", "2.11")
        if _version_tuple(torch.__version__) < _version_tuple(floor):
            raise ImportError(
                f"detops_torch needs torch >= {floor} (it is built on torch's stable ABI, here against torch "
                f"{built}) but torch {torch.__version__} is installed; upgrade torch (pip install 'torch>={floor}'), "
                f"or build detops_torch from source for this torch: {_REBUILD}"
            )
    elif built != torch.__version__:
        raise ImportError(
            f"detops_torch was built for torch {built} but torch {torch.__version__} is installed; {_REBUILD}"
        )
    if getattr(build_info, "CUDA", False):
        if torch.version.cuda is None:
            raise ImportError(
                f"detops_torch was built with CUDA but the installed torch {torch.__version__} has no CUDA; {_REBUILD}"
            )
        cuda_major = str(getattr(build_info, "CUDA_VERSION", "")).split(".")[0]
        if cuda_major and torch.version.cuda.split(".")[0] != cuda_major:
            raise ImportError(
                f"detops_torch was built with CUDA {build_info.CUDA_VERSION} but torch {torch.__version__} uses CUDA "
                f"{torch.version.cuda}; install the detops_torch wheel for CUDA {torch.version.cuda.split('.')[0]}, or "
                f"{_REBUILD}"
            )


def _library_path() -> str:
    path = _os.path.join(_HERE, "_C.so")
    if _os.path.exists(path):
        return path
    found = sorted(_glob.glob(_os.path.join(_HERE, "_C*.so")))
    if not found:
        raise ImportError(f"detops_torch: the op library _C.so is missing from {_HERE}; {_REBUILD}")
    return found[0]


try:
    from . import _build_info
except ImportError as _exc:
    raise ImportError(
        f"detops_torch: _build_info.py (written by the build next to _C.so) is missing from {_HERE}; {_REBUILD}"
    ) from _exc

_check_build(_build_info)
torch.ops.load_library(_library_path())
from . import _ops  # noqa: E402  (each op's registration, functions, modules and converter entries)
from ._errors import DetopsAssertionError, DetopsError, DetopsOutOfMemoryError  # noqa: E402

__version__ = getattr(_build_info, "DETOPS_VERSION", "unknown")

from . import functional  # noqa: E402
from . import nn  # noqa: E402
from . import distributed  # noqa: E402
from . import compat  # noqa: E402
from .convert import convert  # noqa: E402

# Each op package's __all__ (detops_torch/_ops/<op>/__init__.py), then the package's own names.
__all__ = _ops.export([package for _, package in _ops.packages()], globals()) + [
    "convert",
    "compat",
    "functional",
    "nn",
    "distributed",
    "DetopsError",
    "DetopsAssertionError",
    "DetopsOutOfMemoryError",
    "__version__",
]
