# Shared helpers of the detops_torch Python tests: bitwise comparison, hashing, thread-count control, random rois, version gates.
"""Helpers for bindings/torch/tests (imported as ``_util``; pytest and ``python -m unittest discover``
both put this directory on sys.path). Keep the names stable: several test files use them."""
import contextlib
import hashlib
import re
from typing import Iterator, List, Optional, Sequence, Tuple

import torch


def _version_tuple(v: str) -> Tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


TORCH_VERSION = _version_tuple(torch.__version__)
# torch.library.opcheck and torch.compile(fullgraph=True) over custom ops: torch >= 2.1 only.
TORCH_2_1 = TORCH_VERSION >= (2, 1)
HAS_CUDA = torch.cuda.is_available()


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of ``t``'s values in logical (row-major) order, whatever its strides or dtype."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def assert_raises_untouched(test, pattern: str, fn, *tensors: torch.Tensor, check_grad: bool = False) -> None:
    """``fn()`` raises ValueError matching ``pattern`` and leaves every tensor's bytes (and, with
    ``check_grad``, its missing ``.grad``) as they were: a failed call writes nothing."""
    before = [tensor_bytes(t) for t in tensors]
    with test.assertRaisesRegex(ValueError, pattern):
        fn()
    for t, b in zip(tensors, before):
        test.assertEqual(tensor_bytes(t), b, "a failed call must leave its arguments untouched")
        if check_grad:
            test.assertIsNone(t.grad)


def tensor_hash(*tensors: Optional[torch.Tensor]) -> str:
    """sha256 over the dtype, sizes and bytes of each tensor (None hashes as a marker)."""
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"<none>")
            continue
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


def assert_bitwise_equal(test, actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    """Same dtype, same sizes, same bytes (so NaN payloads and signed zeros count)."""
    test.assertEqual(actual.dtype, expected.dtype, msg)
    test.assertEqual(tuple(actual.shape), tuple(expected.shape), msg)
    if tensor_bytes(actual) != tensor_bytes(expected):
        diff = (actual.detach().double() - expected.detach().double()).abs()
        test.fail(f"{msg}: not bitwise equal; max |diff| {diff.max().item():.3e}, "
                  f"{int((diff != 0).sum())} of {diff.numel()} elements differ")


def max_rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (0 when both are all zero)."""
    a = actual.detach().double()
    e = expected.detach().double()
    denom = e.abs().max().item() if e.numel() else 0.0
    num = (a - e).abs().max().item() if e.numel() else 0.0
    return 0.0 if num == 0.0 else num / max(denom, 1e-300)


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """torch.set_num_threads(n) for the block, restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def random_boxes(gen: torch.Generator, count: int, height: float, width: float, dtype=torch.float64,
                 min_size: float = 0.5, margin: float = 0.2) -> torch.Tensor:
    """[count, 4] boxes (x1, y1, x2, y2) with x1 < x2, y1 < y2, reaching ``margin`` (a fraction)
    beyond the map on every side so that the apron and clamping are exercised."""
    x1 = (torch.rand(count, generator=gen, dtype=torch.float64) * (1 + 2 * margin) - margin) * width
    y1 = (torch.rand(count, generator=gen, dtype=torch.float64) * (1 + 2 * margin) - margin) * height
    w = min_size + torch.rand(count, generator=gen, dtype=torch.float64) * width * 0.8
    h = min_size + torch.rand(count, generator=gen, dtype=torch.float64) * height * 0.8
    return torch.stack([x1, y1, x1 + w, y1 + h], dim=1).to(dtype)


def random_rois(gen: torch.Generator, batch: int, count: int, height: float, width: float,
                dtype=torch.float64, **kwargs) -> torch.Tensor:
    """[count, 5] rois: a batch index in [0, batch) (every image used when count >= batch) and a box."""
    idx = torch.arange(count, dtype=torch.float64) % batch
    idx = idx[torch.randperm(count, generator=gen)]
    boxes = random_boxes(gen, count, height, width, dtype=torch.float64, **kwargs)
    return torch.cat([idx[:, None], boxes], dim=1).to(dtype)


def split_rois(rois: torch.Tensor, batch: int) -> List[torch.Tensor]:
    """The per-image [L, 4] boxes of [K, 5] rois whose batch indices are sorted ascending."""
    return [rois[rois[:, 0] == i, 1:] for i in range(batch)]


def fpn_features(gen: torch.Generator, batch: int, channels: int, image_size: int,
                 strides: Sequence[int] = (4, 8, 16, 32), dtype=torch.float64) -> "dict":
    """An FPN feature dict as torchvision's backbones return it: keys '0'..'3' at the given
    strides plus 'pool' (stride 64)."""
    from collections import OrderedDict

    feats = OrderedDict()
    for i, s in enumerate(strides):
        n = image_size // s
        feats[str(i)] = torch.randn(batch, channels, n, n, generator=gen, dtype=torch.float64).to(dtype)
    n = max(image_size // (strides[-1] * 2), 1)
    feats["pool"] = torch.randn(batch, channels, n, n, generator=gen, dtype=torch.float64).to(dtype)
    return feats
