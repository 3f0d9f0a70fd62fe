# Tests of torch.compile / torch.export over torch.ops.detops (torch >= 2.4): opcheck on every op, inductor with dynamic shapes giving eager's bits, a model of the modules without graph breaks, an exported detection head.
import os
import shutil
import tempfile
import unittest

import torch

import detops_torch
from _util import TORCH_VERSION, assert_bitwise_equal

TORCH_2_4 = TORCH_VERSION >= (2, 4)
ops = torch.ops.detops


_saved_cache_dir = None
_cache_dir = None


def setUpModule():
    # A cache of torch.compile's own for this module: torch keys its AOTAutograd/FX graph caches on
    # the traced graph, not on a custom op's schema or autograd formula, so a graph cached by an
    # older build of detops would be replayed against today's ops (README: upgrading detops).
    global _saved_cache_dir, _cache_dir
    _saved_cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    _cache_dir = tempfile.mkdtemp(prefix="detops-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache_dir


def tearDownModule():
    if _saved_cache_dir is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _saved_cache_dir
    shutil.rmtree(_cache_dir, ignore_errors=True)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rois(gen, k, n, h, w, cols=5):
    """[K, 5] boxes (batch, x1, y1, x2, y2) inside an h x w map, or [K, 6] rotated ones."""
    b = torch.randint(0, n, (k, 1), generator=gen).double()
    xy = torch.rand(k, 2, generator=gen, dtype=torch.float64) * torch.tensor([w * 0.6, h * 0.6])
    wh = torch.rand(k, 2, generator=gen, dtype=torch.float64) * torch.tensor([w * 0.4, h * 0.4]) + 1
    if cols == 5:
        return torch.cat([b, xy, xy + wh], 1)
    angle = torch.rand(k, 1, generator=gen, dtype=torch.float64) * 180 - 90
    return torch.cat([b, xy + wh / 2, wh, angle], 1)


def _levels(shapes):
    spatial = torch.tensor(shapes, dtype=torch.int64)
    areas = spatial[:, 0] * spatial[:, 1]
    start = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    return spatial, start, int(areas.sum())


def _cases(seed=7):
    """(name, op, args, differentiable tensor indices) for every forward op; float64 values."""
    g = _gen(seed)
    x = torch.randn(2, 3, 11, 13, generator=g, dtype=torch.float64)
    rois = _rois(g, 6, 2, 11, 13)
    rrois = _rois(g, 6, 2, 11, 13, cols=6)
    grid = torch.rand(2, 4, 5, 2, generator=g, dtype=torch.float64) * 2.2 - 1.1
    spatial, start, s = _levels([[6, 7], [3, 4]])
    value = torch.randn(2, s, 2, 4, generator=g, dtype=torch.float64)
    loc = torch.rand(2, 5, 2, 2, 3, 2, generator=g, dtype=torch.float64)
    attn = torch.rand(2, 5, 2, 2, 3, generator=g, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64)
    off = torch.randn(2, 18, 11, 13, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 9, 11, 13, generator=g, dtype=torch.float64)
    bias = torch.randn(4, generator=g, dtype=torch.float64)
    scale = torch.rand(3, generator=g, dtype=torch.float64) + 0.5
    shift = torch.randn(3, generator=g, dtype=torch.float64)
    return [
        ("roi_align", ops.roi_align, (x, rois, 0.5, 3, 2, 2, True, "exact", "float16"), (0,)),
        ("roi_align_max", ops.roi_align_max, (x, rois, 0.5, 3, 2, 2, True, "exact", "float16"), (0,)),
        ("roi_align_rotated", ops.roi_align_rotated,
         (x, rrois, 0.5, 3, 2, 2, True, False, "degrees", "exact", "float16"), (0,)),
        ("grid_sample", ops.grid_sample, (x, grid, "bilinear", "zeros", False, "exact"), (0, 1)),
        # point_sample's form: unit coordinates
        ("grid_sample", ops.grid_sample, (x, grid * 0.5 + 0.5, "bilinear", "border", True, "exact", "unit"), (0, 1)),
        ("ms_deform_attn", ops.ms_deform_attn, (value, spatial, start, loc, attn, "exact"), (0, 3, 4)),
        ("deform_conv2d", ops.deform_conv2d,
         (x, w, off, mask, bias, 1, 1, 1, 1, 1, 1, 1, 1, True, "exact"), (0, 1, 2, 3, 4)),
        ("frozen_batch_norm", ops.frozen_batch_norm, (x, scale, shift, "add_relu", x.flip(3)), (0, 4)),
    ]


def _with_grad(args, indices):
    return tuple(a.detach().clone().requires_grad_(True) if i in indices else a for i, a in enumerate(args))


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@unittest.skipUnless(TORCH_2_4, "torch.library.opcheck, register_fake and compiled custom ops: torch >= 2.4")
class OpcheckTest(unittest.TestCase):
    """torch.library.opcheck on every op: schema, autograd registration, fake tensors, AOT dispatch
    with dynamic shapes (the forward ops with gradients, the backward ops and phases without)."""

    def test_forward_ops(self):
        for name, op, args, diff in _cases():
            with self.subTest(op=name):
                torch.library.opcheck(op.default, _with_grad(args, diff))

    def test_backward_ops(self):
        g = _gen(3)
        x = torch.randn(2, 3, 11, 13, generator=g, dtype=torch.float64)
        rois = _rois(g, 6, 2, 11, 13)
        rrois = _rois(g, 6, 2, 11, 13, cols=6)
        grad = torch.randn(6, 3, 3, 2, generator=g, dtype=torch.float64)
        _, argmax = ops.roi_align_max(x, rois, 0.5, 3, 2, 2, True)
        cases = {
            "_roi_align_backward": (grad, rois, 0.5, 3, 2, 2, 3, 11, 13, 2, True, "exact", "float16", False),
            "_roi_align_max_backward": (grad, rois, argmax, 0.5, 3, 2, 2, 3, 11, 13, 2, True, "atomic", "float16",
                                        True),
            "_roi_align_rotated_backward": (grad, rrois, 0.5, 3, 2, 2, 3, 11, 13, 2, True, False, "degrees",
                                            "exact", "float16", False),
            "_frozen_batch_norm_backward": (x, x[0, :, 0, 0] + 1, "relu", x.relu()),
            "frozen_batch_norm_fold": (x[0, :, 0, 0], x[0, :, 1, 0], x[0, :, 2, 0], x[0, :, 3, 0].abs() + 0.5, 1e-5),
        }
        for name, op, args, diff in _cases():
            ones = torch.ones_like(_first(op(*args)))
            if name == "grid_sample":
                coordinates = args[6] if len(args) > 6 else "normalized"  # the last case's: "unit"
                cases["_grid_sample_backward"] = (ones, *args[:5], "exact", coordinates, True, True)
            elif name == "ms_deform_attn":
                cases["_ms_deform_attn_backward"] = (ones, *args[:5], "exact", True, True, True)
            elif name == "deform_conv2d":
                cases["_deform_conv2d_backward"] = (ones, *args[:4], *args[5:13], "exact", "mmcv", True, True, True, True,
                                                    True)
        for name, args in cases.items():
            with self.subTest(op=name):
                torch.library.opcheck(getattr(ops, name).default, args)

    def test_sync_batch_norm_phases(self):
        g = _gen(5)
        x = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
        for mode in ("default", "exact"):
            with self.subTest(mode=mode):
                scales = ops.sync_batch_norm_local_scales(x, None, None) if mode == "exact" else None
                record = ops.sync_batch_norm_local_stats(x, mode, scales)
                gathered = torch.stack([record, record])
                rm, rv, n = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), \
                    torch.zeros((), dtype=torch.int64)
                args = (gathered, None, rm, rv, n, 1e-5, 0.1, mode, scales)
                torch.library.opcheck(ops.sync_batch_norm_finalize_stats.default, args)
                mean, invstd = ops.sync_batch_norm_finalize_stats(*args)
                torch.library.opcheck(ops.sync_batch_norm_apply.default, (x, None, None, mean, invstd))
                torch.library.opcheck(ops.sync_batch_norm_local_stats.default, (x, mode, scales))
                if mode == "exact":
                    torch.library.opcheck(ops.sync_batch_norm_local_scales.default, (x, None, None))
                    torch.library.opcheck(ops.sync_batch_norm_merge_scales.default, (torch.stack([scales, scales]),))
                grad_y = torch.randn(x.shape, generator=g, dtype=torch.float64)
                bscales = ops.sync_batch_norm_local_scales(x, grad_y, mean) if mode == "exact" else None
                torch.library.opcheck(ops.sync_batch_norm_local_backward.default, (grad_y, x, mean, mode, bscales))
                brecord = ops.sync_batch_norm_local_backward(grad_y, x, mean, mode, bscales)
                bargs = (torch.stack([brecord, brecord]), 0, mode, invstd, bscales, True)
                torch.library.opcheck(ops.sync_batch_norm_finalize_backward.default, bargs)
                sums = ops.sync_batch_norm_finalize_backward(*bargs)[0]
                torch.library.opcheck(ops.sync_batch_norm_backward_apply.default,
                                      (grad_y, x, None, mean, invstd, sums))
                header = (x, False, False, True, False, mode, True, 1e-5, 0.1, False)
                torch.library.opcheck(ops.sync_batch_norm_header.default, header)
                words = ops.sync_batch_norm_header(*header)
                torch.library.opcheck(ops.sync_batch_norm_check_headers.default,
                                      (torch.stack([words, words]), "forward"))

    def test_every_op_with_a_fake_is_checked(self):
        # A new op (or phase) cannot be left out of the checks above: the ops they name are every op
        # with a fake kernel (detops_torch._registry.FAKES, which test_package compares with csrc).
        import inspect
        import re

        from detops_torch import _registry

        source = inspect.getsource(OpcheckTest)
        named = {name for name, _, _, _ in _cases()}
        for name in _registry.FAKES:
            if name not in named:
                found = re.search(rf"\bops\.{name}\.default\b|\"{name}\"", source)
                self.assertTrue(found, f"detops::{name} has no opcheck case in OpcheckTest")


def _grads(fn, args, diff, seed):
    """fn's outputs and the gradients of sum(out * w) (w fixed by seed) for the tensors at `diff`."""
    args = _with_grad(args, diff)
    out = _first(fn(*args))
    weight = torch.randn(out.shape, generator=_gen(seed), dtype=out.dtype)
    grads = torch.autograd.grad(out, [args[i] for i in diff], weight)
    return (out.detach(),) + tuple(grads)


@unittest.skipUnless(TORCH_2_4, "compiled custom ops with fake kernels: torch >= 2.4")
class InductorTest(unittest.TestCase):
    """torch.compile(fullgraph=True, dynamic=True) with the default inductor backend: forward and
    backward of every op give eager's bits (the op is the graph: inductor calls detops' kernel)."""

    def test_every_op_bitwise_with_dynamic_shapes(self):
        torch._dynamo.reset()
        for name, op, args, diff in _cases():
            with self.subTest(op=name):
                compiled = torch.compile(lambda *a, _op=op: _op(*a), fullgraph=True, dynamic=True)
                eager = _grads(op, args, diff, 11)
                ours = _grads(compiled, args, diff, 11)
                for i, (a, b) in enumerate(zip(ours, eager)):
                    assert_bitwise_equal(self, a, b, f"{name}: output {i}")

    def test_modules_compile_without_graph_breaks(self):
        torch._dynamo.reset()
        torch.manual_seed(0)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bn = detops_torch.FrozenBatchNorm2d(8)
                self.dcn = detops_torch.ModulatedDeformConv2dPack(8, 8, 3, padding=1)
                self.pool = detops_torch.RoIAlign((4, 4), 0.5, 2, True)
                self.attn = detops_torch.MSDeformAttn(8, 2, 2, 2)

            def forward(self, x, rois, query, reference, value, spatial, start):
                y = self.dcn(self.bn(x))
                pooled = self.pool(y, rois)
                sampled = detops_torch.point_sample(y, reference[:, :, 0], align_corners=False)
                attended = self.attn(query, reference, value, spatial, start)
                return pooled.square().sum() + sampled.sum() + attended.square().sum()

        model = Model().double()
        with torch.no_grad():
            model.dcn.conv_offset.weight.normal_(0, 0.05)
            model.bn.running_var.uniform_(0.5, 2.0)
        g = _gen(2)
        spatial, start, s = _levels([[6, 7], [3, 4]])
        inputs = (torch.randn(2, 8, 12, 14, generator=g, dtype=torch.float64), _rois(g, 5, 2, 12, 14),
                  torch.randn(2, 9, 8, generator=g, dtype=torch.float64),
                  torch.rand(2, 9, 2, 2, generator=g, dtype=torch.float64),
                  torch.randn(2, s, 8, generator=g, dtype=torch.float64), spatial, start)

        def run(fn):
            model.zero_grad()
            loss = fn(*inputs)
            loss.backward()
            return [loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

        eager = run(model)
        compiled = torch.compile(model, fullgraph=True, dynamic=True)  # a graph break raises
        ours = run(compiled)
        self.assertEqual(len(ours), len(eager))
        for i, (a, b) in enumerate(zip(ours, eager)):
            self.assertTrue(torch.allclose(a, b, rtol=1e-12, atol=1e-12), f"loss/gradient {i}")


@unittest.skipUnless(TORCH_VERSION >= (2, 6), "torch.export of custom ops with fake kernels: torch >= 2.6")
class ExportTest(unittest.TestCase):
    def test_export_converted_detection_head(self):
        torchvision = __import__("torchvision")
        torch.manual_seed(1)

        class BoxHead(torch.nn.Module):
            """A Faster R-CNN box head over one feature map: FrozenBN, RoIAlign, TwoMLPHead."""

            def __init__(self):
                super().__init__()
                self.bn = torchvision.ops.FrozenBatchNorm2d(16)
                self.pool = torchvision.ops.RoIAlign((7, 7), 0.25, 2, aligned=True)
                self.head = torchvision.models.detection.faster_rcnn.TwoMLPHead(16 * 7 * 7, 32)

            def forward(self, features, rois):
                return self.head(self.pool(self.bn(features), rois))

        model = detops_torch.convert(BoxHead().eval())
        self.assertIsInstance(model.bn, detops_torch.FrozenBatchNorm2d)
        self.assertIsInstance(model.pool, detops_torch.RoIAlign)
        g = _gen(4)
        features = torch.randn(2, 16, 20, 24, generator=g)
        rois = _rois(g, 7, 2, 80, 96).float()
        exported = torch.export.export(model, (features, rois))
        self.assertIn("detops.roi_align", str(exported.graph))
        self.assertIn("detops.frozen_batch_norm", str(exported.graph))
        assert_bitwise_equal(self, exported.module()(features, rois), model(features, rois), "exported head")


if __name__ == "__main__":
    unittest.main()
