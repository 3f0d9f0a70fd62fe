# Tests of detops_torch.roi_align and the RoI modules: torchvision parity, gradcheck, reproducibility, meta, TorchScript, bad input.
import itertools
import unittest
from typing import List

import torch

import detops_torch
from detops_torch import functional as F
from _util import (HAS_CUDA, TORCH_2_1, assert_bitwise_equal, assert_raises_untouched, fpn_features, max_rel_error,
                   num_threads, random_boxes, random_rois, split_rois, tensor_hash)

try:
    import torchvision
    from torchvision.ops import MultiScaleRoIAlign as TvMultiScaleRoIAlign
    from torchvision.ops import roi_align as tv_roi_align
except ImportError:  # pragma: no cover
    torchvision = None

needs_torchvision = unittest.skipUnless(torchvision is not None, "torchvision is not installed")

# (output size, spatial_scale, sampling_ratio, aligned): fixed and adaptive grids, both alignments,
# a scale that is not a power of two.
CONFIGS = list(itertools.product([(2, 3), (5, 4)], [1.0, 0.625], [-1, 0, 2], [False, True]))


def _inputs(seed, dtype=torch.float64, n=2, c=3, h=11, w=13, k=14):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64).to(dtype)
    rois = random_rois(gen, n, k, h / 0.625, w / 0.625, dtype=torch.float64)
    return x, rois, gen


def _tv(x, rois, cfg):
    size, scale, sampling, aligned = cfg
    return tv_roi_align(x, rois, size, scale, sampling, aligned)


def _dt(x, rois, cfg, **kw):
    size, scale, sampling, aligned = cfg
    return detops_torch.roi_align(x, rois, size, scale, sampling, aligned, **kw)


def _grad(fn, x, grad_out):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    out.backward(grad_out)
    return out.detach(), x.grad


@needs_torchvision
class TorchvisionParityTest(unittest.TestCase):
    def test_float64_forward_is_bitwise_torchvision(self):
        for i, cfg in enumerate(CONFIGS):
            x, rois, _ = _inputs(i)
            assert_bitwise_equal(self, _dt(x, rois, cfg), _tv(x, rois, cfg), f"config {cfg}")

    def test_float64_atomic_backward_is_bitwise_torchvision(self):
        for i, cfg in enumerate(CONFIGS):
            x, rois, gen = _inputs(100 + i)
            g = torch.randn(rois.shape[0], x.shape[1], *cfg[0], generator=gen, dtype=torch.float64)
            _, ours = _grad(lambda t: _dt(t, rois, cfg, backward_mode="atomic"), x, g)
            _, ref = _grad(lambda t: _tv(t, rois, cfg), x, g)
            assert_bitwise_equal(self, ours, ref, f"config {cfg}")

    def test_float64_exact_and_truncated_backward_within_rounding(self):
        for i, cfg in enumerate(CONFIGS):
            x, rois, gen = _inputs(200 + i)
            # Multiples of 1/8 below 2^10: representable in float16 and bfloat16, so the truncated
            # mode's rounding of incoming gradients is exact and only the summation order differs.
            g = torch.randint(-64, 64, (rois.shape[0], x.shape[1], *cfg[0]), generator=gen).double() / 8
            _, ref = _grad(lambda t: _tv(t, rois, cfg), x, g)
            for mode, trunc in (("exact", "float16"), ("truncated", "float16"), ("truncated", "bfloat16")):
                _, ours = _grad(lambda t: _dt(t, rois, cfg, backward_mode=mode, truncation=trunc), x, g)
                self.assertLessEqual(max_rel_error(ours, ref), 1e-13, f"{mode}/{trunc} config {cfg}")

    def test_float32_close(self):
        for i, cfg in enumerate(CONFIGS[::3]):
            x, rois, gen = _inputs(300 + i, dtype=torch.float32)
            rois = rois.float()
            g = torch.randn(rois.shape[0], x.shape[1], *cfg[0], generator=gen)
            out, grad = _grad(lambda t: _dt(t, rois, cfg), x, g)
            ref_out, ref_grad = _grad(lambda t: _tv(t, rois, cfg), x, g)
            torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-5)

    def test_16bit_runs_natively_and_close(self):
        cfg = ((4, 4), 0.625, 2, True)
        for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
            x, rois, gen = _inputs(400, dtype=dtype)
            ref_out = _tv(x.float(), rois.float(), cfg)
            for r in (rois.float(), rois.double(), rois.to(dtype)):
                out = _dt(x, r, cfg)
                self.assertEqual(out.dtype, dtype)  # no silent float32 upcast of the result
                ref = _tv(x.float(), r.float(), cfg)
                torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
            g = torch.randn(ref_out.shape, generator=gen)
            _, grad = _grad(lambda t: _dt(t, rois.float(), cfg), x, g.to(dtype))
            _, ref_grad = _grad(lambda t: _tv(t, rois.float(), cfg), x.float(), g.to(dtype).float())
            self.assertEqual(grad.dtype, dtype)
            torch.testing.assert_close(grad.float(), ref_grad, rtol=4 * tol, atol=4 * tol)

    def test_channels_last(self):
        for dtype in (torch.float64, torch.float32):
            for i, cfg in enumerate(CONFIGS[::2]):
                x, rois, gen = _inputs(500 + i, dtype=dtype, c=5)
                rois = rois.to(dtype)
                xcl = x.contiguous(memory_format=torch.channels_last)
                g = torch.randn(rois.shape[0], x.shape[1], *cfg[0], generator=gen, dtype=dtype)
                out, grad = _grad(lambda t: _dt(t, rois, cfg), x, g)
                out_cl, grad_cl = _grad(lambda t: _dt(t, rois, cfg), xcl, g)
                self.assertTrue(grad_cl.is_contiguous(memory_format=torch.channels_last))
                assert_bitwise_equal(self, out_cl, out, f"forward {dtype} {cfg}")
                assert_bitwise_equal(self, grad_cl, grad, f"exact backward {dtype} {cfg}")
                if dtype == torch.float64:
                    assert_bitwise_equal(self, out_cl, _tv(xcl, rois, cfg), f"vs torchvision {cfg}")

    def test_list_of_boxes(self):
        x, rois, _ = _inputs(600, n=3, k=17)
        rois = rois[torch.sort(rois[:, 0], stable=True).indices]
        boxes = split_rois(rois, 3)
        self.assertTrue(all(b.shape[0] > 0 for b in boxes))
        ordered = torch.cat([torch.cat([torch.full_like(b[:, :1], i), b], 1) for i, b in enumerate(boxes)])
        cfg = ((3, 3), 0.625, 2, True)
        from_list = _dt(x, boxes, cfg)
        assert_bitwise_equal(self, from_list, _dt(x, ordered, cfg), "list vs [K, 5]")
        assert_bitwise_equal(self, from_list, _tv(x, boxes, cfg), "list vs torchvision's list form")
        # A single-image list, and an image without boxes among others.
        assert_bitwise_equal(self, _dt(x[:1], boxes[:1], cfg), _tv(x[:1], boxes[:1], cfg), "one image")
        with_empty = [boxes[0], boxes[1][:0], boxes[2]]
        assert_bitwise_equal(self, _dt(x, with_empty, cfg), _tv(x, with_empty, cfg), "an empty image")

    def test_module_matches_functional_and_torchvision_module(self):
        x, rois, _ = _inputs(700)
        for cfg in CONFIGS[:4]:
            size, scale, sampling, aligned = cfg
            ours = detops_torch.RoIAlign(size, scale, sampling, aligned)
            ref = torchvision.ops.RoIAlign(size, scale, sampling, aligned)
            assert_bitwise_equal(self, ours(x, rois), ref(x, rois), f"module {cfg}")
        self.assertFalse(detops_torch.RoIAlign(7, 1.0, 2).aligned)  # torchvision's default

    def _fpn_case(self, seed, batch=2, image=128):
        gen = torch.Generator().manual_seed(seed)
        feats = fpn_features(gen, batch, 4, image)
        # Box sides from 8 to 600 px (level 2 below 112, level 5 from 448) so that every FPN
        # level receives rois; boxes larger than the image are clamped by the pooling.
        boxes = []
        for _ in range(batch):
            b = random_boxes(gen, 24, image, image, min_size=4.0, margin=0.1)
            side = torch.exp(torch.rand(24, generator=gen, dtype=torch.float64) * 4.3) * 8
            b[:, 2:] = b[:, :2] + side[:, None]
            boxes.append(b)
        shapes = [(image, image), (image - 8, image - 24)][:batch]
        return feats, boxes, shapes

    def test_multiscale_roi_align_equals_torchvision(self):
        names = ["0", "1", "2", "3"]
        for sampling in (2, 0):
            feats, boxes, shapes = self._fpn_case(800 + sampling)
            ref_mod = TvMultiScaleRoIAlign(names, 7, sampling)
            ref = ref_mod(feats, boxes, shapes)
            levels = ref_mod.map_levels(boxes)
            self.assertEqual(len(torch.unique(levels)), 4, "the case must spread rois over all levels")
            for mode in ("atomic", "exact"):
                ours_mod = detops_torch.MultiScaleRoIAlign(names, 7, sampling, backward_mode=mode)
                leaves = {k: v.detach().clone().requires_grad_(True) for k, v in feats.items()}
                out = ours_mod(leaves, boxes, shapes)
                assert_bitwise_equal(self, out, ref, f"forward sampling {sampling}")
                self.assertEqual(ours_mod.scales, ref_mod.scales)
                g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
                out.backward(g)
                ref_leaves = {k: v.detach().clone().requires_grad_(True) for k, v in feats.items()}
                TvMultiScaleRoIAlign(names, 7, sampling)(ref_leaves, boxes, shapes).backward(g)
                for k in names:
                    if mode == "atomic":
                        assert_bitwise_equal(self, leaves[k].grad, ref_leaves[k].grad, f"grad level {k}")
                    else:
                        self.assertLessEqual(max_rel_error(leaves[k].grad, ref_leaves[k].grad), 1e-13, k)
                self.assertIsNone(leaves["pool"].grad)  # not a pooled level

    def test_multiscale_single_level_and_signature(self):
        feats, boxes, shapes = self._fpn_case(900, batch=1)
        ref = TvMultiScaleRoIAlign(["1"], (3, 5), 2, canonical_scale=112, canonical_level=3)
        ours = detops_torch.MultiScaleRoIAlign(["1"], (3, 5), 2, canonical_scale=112, canonical_level=3)
        assert_bitwise_equal(self, ours(feats, boxes, shapes), ref(feats, boxes, shapes), "one level")
        for names in (["0", "2"], ["3", "1"]):
            ref = TvMultiScaleRoIAlign(names, 4, 1, canonical_scale=112, canonical_level=3)
            ours = detops_torch.MultiScaleRoIAlign(names, 4, 1, canonical_scale=112, canonical_level=3)
            assert_bitwise_equal(self, ours(feats, boxes, shapes), ref(feats, boxes, shapes), str(names))

    def test_repr_is_torchvisions(self):
        # A default module prints as torchvision's (issue 27: MultiScaleRoIAlign added its mode);
        # the detops options show only when they are not the defaults.
        self.assertEqual(repr(detops_torch.MultiScaleRoIAlign(["0", "p3"], (3, 5), 2)),
                         repr(TvMultiScaleRoIAlign(["0", "p3"], (3, 5), 2)))
        self.assertEqual(repr(detops_torch.RoIAlign((3, 5), 0.25, 2, True)),
                         repr(torchvision.ops.RoIAlign((3, 5), 0.25, 2, True)))
        self.assertEqual(repr(detops_torch.MultiScaleRoIAlign(["0"], 7, 2, backward_mode="truncated",
                                                              truncation="bfloat16")),
                         "MultiScaleRoIAlign(featmap_names=['0'], output_size=(7, 7), sampling_ratio=2, "
                         "backward_mode='truncated', truncation='bfloat16')")
        self.assertTrue(repr(detops_torch.RoIAlign(7, 1.0, 2, backward_mode="atomic")).endswith(
            "aligned=False, backward_mode='atomic')"))


class GradcheckTest(unittest.TestCase):
    def test_gradcheck_every_mode(self):
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(2, 2, 5, 6, generator=gen, dtype=torch.float64)
        rois = random_rois(gen, 2, 4, 5, 6)
        for pool, mode, trunc, aligned, sampling in itertools.product(
                ("avg", "max"), F.BACKWARD_MODES, F.TRUNCATIONS, (False, True), (2, -1)):
            xi = x.clone().requires_grad_(True)

            def fn(t):
                return detops_torch.roi_align(t, rois, (2, 3), 0.9, sampling, aligned, backward_mode=mode,
                                              truncation=trunc, pool_mode=pool)

            self.assertTrue(torch.autograd.gradcheck(fn, (xi,), eps=1e-6, atol=1e-7),
                            f"{pool} {mode} {trunc} aligned={aligned} sampling={sampling}")

    def test_rois_get_no_gradient_and_double_backward_raises(self):
        gen = torch.Generator().manual_seed(8)
        x = torch.randn(1, 2, 6, 6, generator=gen, dtype=torch.float64, requires_grad=True)
        rois = random_rois(gen, 1, 3, 6, 6).requires_grad_(True)
        for pool in ("avg", "max"):
            out = detops_torch.roi_align(x, rois, 2, 1.0, 2, True, pool_mode=pool)
            g = torch.randn(out.shape, generator=gen, dtype=out.dtype, requires_grad=True)
            (gx,) = torch.autograd.grad(out, x, g, create_graph=True)
            self.assertTrue(gx.requires_grad)
            with self.assertRaisesRegex(RuntimeError, "double backward is not supported"):
                gx.sum().backward()
        out = detops_torch.roi_align(x, rois, 2, 1.0, 2, True)
        out.sum().backward()
        self.assertIsNone(rois.grad)


class ReproducibilityTest(unittest.TestCase):
    def _grad_hash(self, mode, pool, dtype, threads):
        gen = torch.Generator().manual_seed(11)
        x = torch.randn(2, 16, 24, 24, generator=gen, dtype=torch.float64).to(dtype)
        # Many overlapping rois: each input position receives contributions from many bins.
        rois = random_rois(gen, 2, 96, 24, 24, min_size=4.0, margin=0.05).float()
        w = torch.randn(96, 16, 7, 7, generator=gen, dtype=torch.float64).to(dtype)
        with num_threads(threads):
            leaf = x.clone().requires_grad_(True)
            feat = leaf * 1.5  # a differentiable producer: the gradient passes through autograd
            out = detops_torch.roi_align(feat, rois, 7, 1.0, 2, True, backward_mode=mode, pool_mode=pool)
            (out * w).sum().backward()
            return tensor_hash(out, leaf.grad)

    def test_exact_gradients_identical_across_runs_and_threads(self):
        for dtype, pool in ((torch.float32, "avg"), (torch.float16, "avg"), (torch.float32, "max")):
            hashes = {self._grad_hash("exact", pool, dtype, t) for t in (1, 2, 1, 2, 2)}
            self.assertEqual(len(hashes), 1, f"{dtype} {pool}: {hashes}")

    def test_cpu_atomic_and_truncated_repeat(self):
        # On the CPU every mode is run-to-run reproducible at a fixed thread count (documented).
        for mode in ("atomic", "truncated"):
            self.assertEqual(len({self._grad_hash(mode, "avg", torch.float32, 2) for _ in range(3)}), 1, mode)

    def test_hash_is_sensitive(self):
        # The hash above must be able to tell gradients apart: different modes round differently.
        self.assertNotEqual(self._grad_hash("exact", "avg", torch.float32, 1),
                            self._grad_hash("exact", "max", torch.float32, 1))


class MetaAndScriptTest(unittest.TestCase):
    def test_meta_tensors(self):
        x = torch.empty(2, 3, 10, 12, device="meta")
        rois = torch.empty(5, 5, device="meta")
        out = torch.ops.detops.roi_align(x, rois, 0.5, 3, 4, 2, True)
        self.assertEqual((out.device.type, tuple(out.shape), out.dtype), ("meta", (5, 3, 3, 4), torch.float32))
        out, argmax = torch.ops.detops.roi_align_max(x.half(), rois, 0.5, 3, 4, 2, True)
        self.assertEqual((tuple(out.shape), out.dtype, argmax.dtype), ((5, 3, 3, 4), torch.float16, torch.int32))
        g = torch.ops.detops._roi_align_backward(torch.empty(5, 3, 3, 4, device="meta"), rois, 0.5, 3, 4, 2, 3, 10,
                                                  12, 2, True)
        self.assertEqual((g.device.type, tuple(g.shape)), ("meta", (2, 3, 10, 12)))
        boxes = [torch.empty(2, 4, device="meta"), torch.empty(3, 4, device="meta")]
        out = detops_torch.roi_align(x.double(), boxes, 7)
        self.assertEqual((tuple(out.shape), out.dtype), ((5, 3, 7, 7), torch.float64))

    def test_torchscript(self):
        def op_call(x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
            return torch.ops.detops.roi_align(x, rois, 0.625, 3, 2, 2, True, "exact", "float16")

        scripted = torch.jit.script(op_call)
        x, rois, _ = _inputs(1200)
        assert_bitwise_equal(self, scripted(x, rois), op_call(x, rois), "scripted op call")
        self.assertIn("detops::roi_align", str(scripted.graph))

        # The modules script too, with both box forms.
        cfg = ((3, 2), 0.625, 2, True)
        boxes = split_rois(rois[torch.sort(rois[:, 0], stable=True).indices], 2)
        mod = torch.jit.script(detops_torch.RoIAlign((3, 2), 0.625, 2, True, backward_mode="atomic"))
        assert_bitwise_equal(self, mod(x, rois), _dt(x, rois, cfg), "scripted module")
        assert_bitwise_equal(self, mod(x, boxes), _dt(x, boxes, cfg), "scripted module, list form")
        x.requires_grad_(True)
        mod(x, rois).sum().backward()
        self.assertIsNotNone(x.grad)

    def test_functional_scripts_as_torchvisions(self):
        # torch.jit.script(torchvision.ops.roi_align) works; so must detops' (issue 27), called
        # from scripted code with torchvision's arguments and with the detops options.
        scripted = torch.jit.script(detops_torch.roi_align)
        x, rois, _ = _inputs(1250)
        cfg = ((3, 2), 0.625, 2, True)
        assert_bitwise_equal(self, scripted(x, rois, [3, 2], 0.625, 2, True), _dt(x, rois, cfg), "scripted function")
        assert_bitwise_equal(self, scripted(x, rois, [3, 2], 0.625, 2, True, "atomic"), _tv(x, rois, cfg),
                             "scripted function, atomic mode")

        def user(x: torch.Tensor, boxes: List[torch.Tensor]) -> torch.Tensor:
            return detops_torch.roi_align(x, boxes, 3, spatial_scale=0.625, sampling_ratio=2, aligned=True,
                                          backward_mode="exact", pool_mode="max")

        boxes = split_rois(rois[torch.sort(rois[:, 0], stable=True).indices], 2)
        assert_bitwise_equal(self, torch.jit.script(user)(x, boxes), user(x, boxes), "scripted caller, list form")

    @unittest.skipUnless(TORCH_2_1 and hasattr(torch.library, "opcheck"), "torch.library.opcheck needs torch >= 2.1")
    def test_opcheck(self):
        x, rois, _ = _inputs(1300)
        xs = x.requires_grad_(True)
        devices = ["cpu"] + (["cuda"] if HAS_CUDA else [])
        for dev in devices:
            args = (xs.detach().to(dev).requires_grad_(True), rois.to(dev), 0.625, 3, 2, 2, True, "exact", "float16")
            torch.library.opcheck(torch.ops.detops.roi_align.default, args)
            torch.library.opcheck(torch.ops.detops.roi_align_max.default, args)

    @unittest.skipUnless(TORCH_2_1, "torch.compile over custom ops needs torch >= 2.1")
    def test_torch_compile_fullgraph(self):
        x, rois, gen = _inputs(1400)

        def fn(t):
            return detops_torch.roi_align(t * 2.0, rois, (3, 2), 0.625, 2, True).square().sum()

        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        a = x.clone().requires_grad_(True)
        b = x.clone().requires_grad_(True)
        fn(a).backward()
        compiled(b).backward()
        assert_bitwise_equal(self, b.grad, a.grad, "compiled gradient")


class BadInputTest(unittest.TestCase):
    def _raises(self, pattern, fn, *tensors):
        assert_raises_untouched(self, pattern, fn, *tensors, check_grad=True)

    def test_dtype_shape_and_value_errors(self):
        x, rois, _ = _inputs(1500, dtype=torch.float32)
        rois32 = rois.float()
        cases = [
            ("dtype", lambda: detops_torch.roi_align(x.long(), rois32, 2)),
            ("rois.*dtype", lambda: detops_torch.roi_align(x, rois32.half(), 2)),
            (r"\[K, 5\]", lambda: detops_torch.roi_align(x, rois32[:, 1:], 2)),
            ("input", lambda: detops_torch.roi_align(x[0], rois32, 2)),
            (r"boxes\[1\].*\[L, 4\]", lambda: detops_torch.roi_align(x, [rois32[:3, 1:], rois32[:3, 2:]], 2)),
            (r"boxes\[1\].*dtype", lambda: detops_torch.roi_align(x, [rois32[:3, 1:], rois32[3:6, 1:].double()], 2)),
            ("empty list", lambda: detops_torch.roi_align(x, [], 2)),
            ("pooled", lambda: detops_torch.roi_align(x, rois32, (0, 2))),
            ("spatial_scale", lambda: detops_torch.roi_align(x, rois32, 2, -1.0)),
        ]
        nan_rois = rois32.clone()
        nan_rois[3, 2] = float("nan")
        cases.append(("rois\\[3\\].*finite", lambda: detops_torch.roi_align(x, nan_rois, 2)))
        bad_index = rois32.clone()
        bad_index[1, 0] = 2.5
        cases.append(("rois\\[1\\].*batch index", lambda: detops_torch.roi_align(x, bad_index, 2)))
        for pattern, fn in cases:
            with self.subTest(pattern=pattern):
                self._raises(pattern, fn, x, rois32, nan_rois)

    def test_bad_mode_strings_fail_in_the_forward(self):
        x, rois, _ = _inputs(1600)
        x.requires_grad_(True)
        for kw, name in (({"backward_mode": "exactly"}, "backward_mode"), ({"truncation": "fp8"}, "truncation")):
            for pool in ("avg", "max"):
                with self.assertRaisesRegex(ValueError, name):
                    detops_torch.roi_align(x, rois, 2, pool_mode=pool, **kw)
        with self.assertRaisesRegex(ValueError, "pool_mode"):
            detops_torch.roi_align(x, rois, 2, pool_mode="sum")
        with self.assertRaisesRegex(ValueError, "backward_mode"):
            torch.ops.detops.roi_align(x.detach(), rois, 1.0, 2, 2, 2, False, "Exact")
        self.assertIsNone(x.grad)
        with self.assertRaisesRegex(ValueError, "backward_mode"):
            detops_torch.RoIAlign(7, 1.0, 2, backward_mode="fast")
        with self.assertRaisesRegex(ValueError, "truncation"):
            detops_torch.MultiScaleRoIAlign(["0"], 7, 2, truncation="half")

    def test_wrong_device(self):
        x, rois, _ = _inputs(1700)
        if HAS_CUDA:
            with self.assertRaisesRegex(ValueError, "device|cuda|cpu"):
                detops_torch.roi_align(x.cuda(), rois, 2)
            with self.assertRaisesRegex(ValueError, "device|cuda|cpu"):
                detops_torch.roi_align(x, rois.cuda(), 2)
        with self.assertRaisesRegex(ValueError, "device"):
            detops_torch.roi_align(x, [rois[:2, 1:], rois[2:4, 1:].to("meta")], 2)

    # With a CPU tensor and a meta tensor in one call the dispatcher picks the Meta kernel, which
    # must refuse the mix rather than shape an uninitialised output on the CPU.
    def test_cpu_and_meta_tensors_mixed(self):
        x, rois, _ = _inputs(1750)
        with self.assertRaisesRegex(ValueError, "device|meta"):
            torch.ops.detops.roi_align(x, rois.to("meta"), 1.0, 2, 2, 2, False)


class QuantizedTest(unittest.TestCase):
    """torchvision registers a QuantizedCPU roi_align (qint8, quint8, qint32); detops' follows its
    semantics (issue 27): float pooling of the dequantized input, the output quantized with the
    input's scale and zero point."""

    def _case(self, seed, qdtype, scale, zero_point, images=1):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randint(40, 110, (images, 3, 10, 12), generator=gen).float()
        rois = random_rois(gen, images, 9, 10.0, 12.0, dtype=torch.float32)
        rois[:, 1:] = rois[:, 1:].round()  # representable in every quantization below
        qx = torch.quantize_per_tensor(x, scale, zero_point, qdtype)
        qrois = torch.quantize_per_tensor(rois, 1.0 if qdtype != torch.quint8 else 0.5, 0, qdtype)
        return qx, qrois

    def test_quantized_input_every_dtype(self):
        for qdtype, (scale, zero_point), aligned in itertools.product(
                (torch.qint8, torch.quint8, torch.qint32), ((1.0, 0), (2.0, 10), (0.1, 50)), (False, True)):
            with self.subTest(qdtype=qdtype, scale=scale, zero_point=zero_point, aligned=aligned):
                qx, qrois = self._case(1500, qdtype, scale, zero_point)
                qy = detops_torch.roi_align(qx, qrois, 5, 1.0, -1, aligned)
                self.assertTrue(qy.is_quantized)
                self.assertEqual((qy.dtype, qy.q_scale(), qy.q_zero_point(), tuple(qy.shape)),
                                 (qdtype, scale, zero_point, (9, 3, 5, 5)))
                y = detops_torch.roi_align(qx.dequantize(), qrois.dequantize(), 5, 1.0, -1, aligned)
                want = torch.quantize_per_tensor(y, scale, zero_point, qdtype)
                self.assertTrue(torch.equal(qy.int_repr(), want.int_repr()), "requantized detops float path")
                if torchvision is not None:
                    theirs = tv_roi_align(qx, qrois, 5, 1.0, -1, aligned)
                    diff = (theirs.int_repr().long() - qy.int_repr().long()).abs()
                    self.assertLessEqual(int(diff.max()), 1, "torchvision's kernel, within one quantum")
                    self.assertLess(int((diff != 0).sum()) / diff.numel(), 0.05)

    def test_quantized_module_and_one_image_per_batch(self):
        qx, qrois = self._case(1501, torch.quint8, 0.5, 3)
        layer = detops_torch.RoIAlign(4, 1.0, 2, True)
        self.assertTrue(torch.equal(layer(qx, qrois).int_repr(), detops_torch.roi_align(qx, qrois, 4, 1.0, 2,
                                                                                        True).int_repr()))
        qx, qrois = self._case(1502, torch.qint8, 1.0, 0, images=2)
        with self.assertRaisesRegex(RuntimeError, "Only one image per batch is allowed"):  # torchvision's words
            detops_torch.roi_align(qx, qrois, 5)


@unittest.skipUnless(HAS_CUDA, "CUDA is not available")
class CudaTest(unittest.TestCase):
    def test_cuda_matches_cpu_bitwise_in_exact_mode(self):
        for dtype in (torch.float32, torch.float64, torch.float16):
            x, rois, gen = _inputs(1800, dtype=dtype, c=8, k=40)
            rois = rois.float()
            g = torch.randn(40, 8, 3, 3, generator=gen).to(dtype)
            for pool in ("avg", "max"):
                fn = lambda t: detops_torch.roi_align(t, rois.to(t.device), 3, 0.625, -1, True, pool_mode=pool)  # noqa
                out, grad = _grad(fn, x, g)
                out_c, grad_c = _grad(fn, x.cuda(), g.cuda())
                assert_bitwise_equal(self, out_c.cpu(), out, f"forward {dtype} {pool}")
                assert_bitwise_equal(self, grad_c.cpu(), grad, f"backward {dtype} {pool}")

    def test_cuda_parity_with_torchvision_forward(self):
        if torchvision is None:
            self.skipTest("torchvision is not installed")
        x, rois, _ = _inputs(1900)
        cfg = ((3, 3), 0.625, 2, True)
        assert_bitwise_equal(self, _dt(x.cuda(), rois.cuda(), cfg).cpu(), _tv(x, rois, cfg), "cuda float64 forward")

    def test_non_default_stream(self):
        x, rois, _ = _inputs(2000, dtype=torch.float32)
        ref = _dt(x, rois.float(), ((3, 3), 0.625, 2, True))
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            out = _dt(x.cuda(), rois.float().cuda(), ((3, 3), 0.625, 2, True))
        s.synchronize()
        assert_bitwise_equal(self, out.cpu(), ref, "on a side stream")


if __name__ == "__main__":
    unittest.main()
