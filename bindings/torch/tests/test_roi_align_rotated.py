# Tests of detops_torch.roi_align_rotated and the rotated RoI modules: float64 reference, gradcheck, reproducibility, zero angle vs roi_align, modules, meta, TorchScript, bad input, CUDA.
import itertools
import math
import unittest
import warnings

import torch

import detops_torch
from detops_torch import functional as F
from _util import (HAS_CUDA, TORCH_2_1, assert_bitwise_equal, assert_raises_untouched, max_rel_error, num_threads,
                   tensor_bytes, tensor_hash)

# (output size, spatial_scale, sampling_ratio): fixed and adaptive grids, a scale that is not a
# power of two.
CONFIGS = list(itertools.product([(2, 3), (4, 4)], [1.0, 0.625], [-1, 0, 2]))
# (aligned, clockwise, angle_unit): detectron2's convention first, then mmcv's variants.
CONVENTIONS = [(True, False, "degrees"), (True, False, "radians"), (True, True, "radians"),
               (False, False, "radians"), (False, True, "degrees")]


def _rotated_rois(gen, batch, count, height, width, radians=False, dtype=torch.float64):
    """[count, 6] rois (batch_index, cx, cy, w, h, angle): centres reaching 20% beyond the map (the
    apron and clamping are exercised), sides from 0.5 to 0.8 of the map, any angle, every fourth
    one a multiple of 90 degrees."""
    idx = (torch.arange(count, dtype=torch.float64) % batch)[torch.randperm(count, generator=gen)]
    u = lambda: torch.rand(count, generator=gen, dtype=torch.float64)  # noqa: E731
    cx = (u() * 1.4 - 0.2) * width
    cy = (u() * 1.4 - 0.2) * height
    w = 0.5 + u() * width * 0.8
    h = 0.5 + u() * height * 0.8
    angle = u() * 360.0 - 180.0
    angle[::4] = torch.tensor([0.0, 90.0, -180.0, 270.0], dtype=torch.float64).repeat(count)[: len(angle[::4])]
    if radians:
        angle = angle * (math.pi / 180.0)
    return torch.stack([idx, cx, cy, w, h, angle], dim=1).to(dtype)


def _inputs(seed, dtype=torch.float64, n=2, c=3, h=11, w=13, k=14, radians=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64).to(dtype)
    rois = _rotated_rois(gen, n, k, h / 0.625, w / 0.625, radians=radians)
    return x, rois, gen


def reference(x, rois, output_size, spatial_scale, sampling_ratio, aligned=True, clockwise=False,
              angle_unit="degrees"):
    """RoIAlignRotated in float64 from the semantics documented in detops/roi_align_rotated.h
    (detectron2's formulas, mmcv's options), with Python's sin and cos. Built from torch ops on
    ``x`` so that autograd gives the reference gradient."""
    N, C, H, W = x.shape
    PH, PW = output_size
    outs = []
    for r in rois.detach().double().tolist():
        b = int(r[0])
        offset = 0.5 if aligned else 0.0
        cx = r[1] * spatial_scale - offset
        cy = r[2] * spatial_scale - offset
        roi_w = r[3] * spatial_scale
        roi_h = r[4] * spatial_scale
        if not aligned:
            roi_w = max(roi_w, 1.0)
            roi_h = max(roi_h, 1.0)
        t = r[5] if angle_unit == "radians" else r[5] * (math.pi / 180.0)
        if clockwise:
            t = -t
        cos_t, sin_t = math.cos(t), math.sin(t)
        bin_h, bin_w = roi_h / PH, roi_w / PW
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / PH)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / PW)
        if gh <= 0 or gw <= 0:
            outs.append(x.new_zeros(C, PH, PW))
            continue
        ph = torch.arange(PH, dtype=torch.float64).view(PH, 1, 1, 1)
        pw = torch.arange(PW, dtype=torch.float64).view(1, PW, 1, 1)
        iy = torch.arange(gh, dtype=torch.float64).view(1, 1, gh, 1)
        ix = torch.arange(gw, dtype=torch.float64).view(1, 1, 1, gw)
        yy = -roi_h / 2 + ph * bin_h + (iy + 0.5) * bin_h / gh
        xx = -roi_w / 2 + pw * bin_w + (ix + 0.5) * bin_w / gw
        y = (yy * cos_t - xx * sin_t + cy).expand(PH, PW, gh, gw).reshape(-1)
        xs = (yy * sin_t + xx * cos_t + cx).expand(PH, PW, gh, gw).reshape(-1)
        # RoIAlign's bilinear rule: 0 beyond the one-pixel apron, clamped into the map inside it.
        inside = (y >= -1.0) & (y <= H) & (xs >= -1.0) & (xs <= W)
        y = torch.where(inside, y.clamp(min=0.0), torch.zeros_like(y))
        xs = torch.where(inside, xs.clamp(min=0.0), torch.zeros_like(xs))
        y0, x0 = y.floor().long(), xs.floor().long()
        y_edge, x_edge = y0 >= H - 1, x0 >= W - 1
        y0 = torch.where(y_edge, torch.full_like(y0, H - 1), y0)
        x0 = torch.where(x_edge, torch.full_like(x0, W - 1), x0)
        y1 = torch.where(y_edge, y0, y0 + 1)
        x1 = torch.where(x_edge, x0, x0 + 1)
        ly = torch.where(y_edge, torch.zeros_like(y), y - y0.double())
        lx = torch.where(x_edge, torch.zeros_like(xs), xs - x0.double())
        hy, hx = 1.0 - ly, 1.0 - lx
        plane = x[b].double()
        val = (hy * hx) * plane[:, y0, x0] + (hy * lx) * plane[:, y0, x1] + (ly * hx) * plane[:, y1, x0] \
            + (ly * lx) * plane[:, y1, x1]
        val = val * inside.double()
        outs.append(val.view(C, PH, PW, gh * gw).sum(-1) / max(gh * gw, 1))
    if not outs:
        return x.new_zeros(0, C, PH, PW).double()
    return torch.stack(outs)


def _dt(x, rois, cfg, conv=CONVENTIONS[0], **kw):
    size, scale, sampling = cfg
    aligned, clockwise, unit = conv
    return detops_torch.roi_align_rotated(x, rois, size, scale, sampling, aligned, clockwise, unit, **kw)


def _ref(x, rois, cfg, conv=CONVENTIONS[0]):
    size, scale, sampling = cfg
    aligned, clockwise, unit = conv
    return reference(x, rois, size, scale, sampling, aligned, clockwise, unit)


def _grad(fn, x, grad_out):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    out.backward(grad_out)
    return out.detach(), x.grad


class ReferenceTest(unittest.TestCase):
    def test_the_reference_can_fail(self):
        # The angle, its unit and its direction all change the result: the comparisons below
        # cannot pass by accident.
        x, rois, _ = _inputs(1)
        cfg = ((2, 3), 1.0, 2)
        base = _ref(x, rois, cfg)
        self.assertGreater(max_rel_error(base, _ref(x, rois, cfg, (True, True, "degrees"))), 1e-3)
        self.assertGreater(max_rel_error(base, _ref(x, rois, cfg, (True, False, "radians"))), 1e-3)
        self.assertGreater(max_rel_error(base, _ref(x, rois, cfg, (False, False, "degrees"))), 1e-3)

    def test_float64_forward_matches_reference(self):
        for i, (cfg, conv) in enumerate(itertools.product(CONFIGS, CONVENTIONS)):
            x, rois, _ = _inputs(i, radians=conv[2] == "radians")
            out = _dt(x, rois, cfg, conv)
            self.assertEqual(out.dtype, torch.float64)
            # sin and cos are detops' own (within an ulp of the C library's): not bitwise.
            self.assertLessEqual(max_rel_error(out, _ref(x, rois, cfg, conv)), 1e-12, f"{cfg} {conv}")

    def test_float64_backward_matches_reference_in_every_mode(self):
        for i, (cfg, conv) in enumerate(itertools.product(CONFIGS[::2], CONVENTIONS)):
            x, rois, gen = _inputs(100 + i, radians=conv[2] == "radians")
            # Multiples of 1/8 below 2^10: representable in float16 and bfloat16, so the truncated
            # mode's rounding of incoming gradients is exact and only the summation order differs.
            g = torch.randint(-64, 64, (rois.shape[0], x.shape[1], *cfg[0]), generator=gen).double() / 8
            _, ref = _grad(lambda t: _ref(t, rois, cfg, conv), x, g)
            for mode, trunc in (("exact", "float16"), ("atomic", "float16"), ("truncated", "float16"),
                                ("truncated", "bfloat16")):
                _, ours = _grad(lambda t: _dt(t, rois, cfg, conv, backward_mode=mode, truncation=trunc), x, g)
                self.assertLessEqual(max_rel_error(ours, ref), 1e-12, f"{mode}/{trunc} {cfg} {conv}")

    def test_float32_close(self):
        for i, cfg in enumerate(CONFIGS[::2]):
            x, rois, gen = _inputs(200 + i, dtype=torch.float32)
            g = torch.randn(rois.shape[0], x.shape[1], *cfg[0], generator=gen)
            for r in (rois.float(), rois):  # float32 or float64 rois with a float32 input
                out, grad = _grad(lambda t: _dt(t, r, cfg), x, g)
                ref_out, ref_grad = _grad(lambda t: _ref(t, r, cfg), x.double(), g.double())
                self.assertEqual((out.dtype, grad.dtype), (torch.float32, torch.float32))
                torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-5, atol=1e-5)

    def test_16bit_runs_natively_and_close(self):
        cfg = ((4, 4), 0.625, 2)
        for dtype, tol in ((torch.float16, 4e-3), (torch.bfloat16, 3e-2)):
            x, rois, gen = _inputs(300, dtype=dtype)
            for r in (rois.float(), rois.double(), rois.to(dtype)):
                out = _dt(x, r, cfg)
                self.assertEqual(out.dtype, dtype)  # no silent float32 upcast of the result
                torch.testing.assert_close(out.double(), _ref(x.double(), r.double(), cfg), rtol=tol, atol=tol)
            g = torch.randn(rois.shape[0], x.shape[1], 4, 4, generator=gen).to(dtype)
            for mode in F.BACKWARD_MODES:
                _, grad = _grad(lambda t: _dt(t, rois.float(), cfg, backward_mode=mode), x, g)
                _, ref_grad = _grad(lambda t: _ref(t, rois.float(), cfg), x.double(), g.double())
                self.assertEqual(grad.dtype, dtype)
                torch.testing.assert_close(grad.double(), ref_grad, rtol=4 * tol, atol=4 * tol)

    def test_clockwise_is_the_negated_angle(self):
        # `clockwise` negates the angle before anything else: the same bits.
        x, rois, _ = _inputs(400)
        flipped = rois.clone()
        flipped[:, 5] = -flipped[:, 5]
        cfg = ((3, 2), 0.625, 0)
        for unit in F.ANGLE_UNITS:
            for aligned in (True, False):
                assert_bitwise_equal(self, _dt(x, rois, cfg, (aligned, True, unit)),
                                     _dt(x, flipped, cfg, (aligned, False, unit)), f"{unit} aligned={aligned}")

    def test_degenerate_and_empty(self):
        x, rois, _ = _inputs(500)
        rois[:3, 3] = 0.0  # zero width: with an adaptive grid the bins have no samples and pool to 0
        out = _dt(x, rois, ((2, 2), 1.0, -1))
        self.assertEqual(tensor_bytes(out[:3]), tensor_bytes(torch.zeros_like(out[:3])))
        self.assertLessEqual(max_rel_error(out, _ref(x, rois, ((2, 2), 1.0, -1))), 1e-12)
        # No rois: an empty result, and a zero gradient.
        xg = x.clone().requires_grad_(True)
        out = _dt(xg, rois[:0], ((2, 2), 1.0, 2))
        self.assertEqual(tuple(out.shape), (0, 3, 2, 2))
        out.sum().backward()
        self.assertEqual(tensor_bytes(xg.grad), tensor_bytes(torch.zeros_like(x)))

    def test_channels_last(self):
        for dtype in (torch.float64, torch.float32):
            for i, cfg in enumerate(CONFIGS[::3]):
                x, rois, gen = _inputs(600 + i, dtype=dtype, c=5)
                xcl = x.contiguous(memory_format=torch.channels_last)
                g = torch.randn(rois.shape[0], x.shape[1], *cfg[0], generator=gen, dtype=torch.float64).to(dtype)
                out, grad = _grad(lambda t: _dt(t, rois, cfg), x, g)
                out_cl, grad_cl = _grad(lambda t: _dt(t, rois, cfg), xcl, g)
                self.assertTrue(grad_cl.is_contiguous(memory_format=torch.channels_last))
                assert_bitwise_equal(self, out_cl, out, f"forward {dtype} {cfg}")
                assert_bitwise_equal(self, grad_cl, grad, f"exact backward {dtype} {cfg}")


class ZeroAngleTest(unittest.TestCase):
    """With angle 0 a rotated box samples exactly the points RoIAlign samples in the same
    axis-aligned box. On dyadic boxes (every coordinate, size and sample offset exact in binary)
    the two compute the same numbers with no rounding, so the results are the same bits."""

    def _case(self, seed, scale):
        gen = torch.Generator().manual_seed(seed)
        n, c, h, w, k = 2, 3, 10, 12, 20
        x = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64)
        # Output (2, 4): sizes up to 2 * output size (scaled) keep adaptive grids at 1 or 2 samples.
        x1 = torch.randint(-8, 4 * w, (k,), generator=gen).double() / 4 / scale
        y1 = torch.randint(-8, 4 * h, (k,), generator=gen).double() / 4 / scale
        bw = torch.randint(1, 4 * 8 + 1, (k,), generator=gen).double() / 4 / scale
        bh = torch.randint(1, 4 * 4 + 1, (k,), generator=gen).double() / 4 / scale
        idx = (torch.arange(k) % n).double()
        boxes = torch.stack([idx, x1, y1, x1 + bw, y1 + bh], 1)
        rotated = torch.stack([idx, x1 + bw / 2, y1 + bh / 2, bw, bh, torch.zeros(k, dtype=torch.float64)], 1)
        return x, boxes, rotated, gen

    def test_zero_angle_is_roi_align_aligned(self):
        for scale, sampling, dtype in itertools.product((1.0, 0.5), (-1, 1, 2, 4), (torch.float64, torch.float32)):
            x, boxes, rotated, gen = self._case(int(scale * 10) + sampling, scale)
            x = x.to(dtype)
            g = torch.randn(boxes.shape[0], x.shape[1], 2, 4, generator=gen, dtype=torch.float64).to(dtype)
            rot = lambda t: detops_torch.roi_align_rotated(t, rotated, (2, 4), scale, sampling)  # noqa: E731
            ali = lambda t: detops_torch.roi_align(t, boxes, (2, 4), scale, sampling, True)  # noqa: E731
            out_r, grad_r = _grad(rot, x, g)
            out_a, grad_a = _grad(ali, x, g)
            what = f"scale {scale} sampling {sampling} {dtype}"
            assert_bitwise_equal(self, out_r, out_a, "forward, " + what)
            assert_bitwise_equal(self, grad_r, grad_a, "exact backward, " + what)


class GradcheckTest(unittest.TestCase):
    def test_gradcheck_every_mode(self):
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(2, 2, 5, 6, generator=gen, dtype=torch.float64)
        for (mode, trunc), (aligned, clockwise, unit), sampling in itertools.product(
                [("exact", "float16"), ("atomic", "float16"), ("truncated", "float16"), ("truncated", "bfloat16")],
                CONVENTIONS, (2, -1)):
            rois = _rotated_rois(gen, 2, 4, 5, 6, radians=unit == "radians")
            xi = x.clone().requires_grad_(True)

            def fn(t):
                return detops_torch.roi_align_rotated(t, rois, (2, 3), 0.9, sampling, aligned, clockwise, unit,
                                                      backward_mode=mode, truncation=trunc)

            self.assertTrue(torch.autograd.gradcheck(fn, (xi,), eps=1e-6, atol=1e-7),
                            f"{mode} {trunc} aligned={aligned} clockwise={clockwise} {unit} sampling={sampling}")

    def test_rois_get_no_gradient_and_double_backward_raises(self):
        gen = torch.Generator().manual_seed(8)
        x = torch.randn(1, 2, 6, 6, generator=gen, dtype=torch.float64, requires_grad=True)
        rois = _rotated_rois(gen, 1, 3, 6, 6).requires_grad_(True)
        out = detops_torch.roi_align_rotated(x, rois, 2, 1.0, 2)
        g = torch.randn(out.shape, generator=gen, dtype=out.dtype, requires_grad=True)
        (gx,) = torch.autograd.grad(out, x, g, create_graph=True)
        self.assertTrue(gx.requires_grad)
        with self.assertRaisesRegex(RuntimeError, "double backward is not supported"):
            gx.sum().backward()
        detops_torch.roi_align_rotated(x, rois, 2, 1.0, 2).sum().backward()
        self.assertIsNone(rois.grad)


class ReproducibilityTest(unittest.TestCase):
    def _grad_hash(self, mode, dtype, threads, seed=11):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 16, 24, 24, generator=gen, dtype=torch.float64).to(dtype)
        # Many overlapping rotated rois: each input position receives contributions from many bins.
        rois = _rotated_rois(gen, 2, 96, 24, 24).float()
        w = torch.randn(96, 16, 7, 7, generator=gen, dtype=torch.float64).to(dtype)
        with num_threads(threads):
            leaf = x.clone().requires_grad_(True)
            feat = leaf * 1.5  # a differentiable producer: the gradient passes through autograd
            out = detops_torch.roi_align_rotated(feat, rois, 7, 1.0, 2, backward_mode=mode)
            (out * w).sum().backward()
            return tensor_hash(out, leaf.grad)

    def test_exact_gradients_identical_across_runs_and_threads(self):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            hashes = {self._grad_hash("exact", dtype, t) for t in (1, 2, 1, 2, 2)}
            self.assertEqual(len(hashes), 1, f"{dtype}: {hashes}")

    def test_cpu_atomic_and_truncated_repeat(self):
        # On the CPU every mode is run-to-run reproducible at a fixed thread count (documented).
        for mode in ("atomic", "truncated"):
            self.assertEqual(len({self._grad_hash(mode, torch.float32, 2) for _ in range(3)}), 1, mode)

    def test_hash_is_sensitive(self):
        # The hash above must be able to tell gradients apart.
        self.assertNotEqual(self._grad_hash("exact", torch.float32, 1),
                            self._grad_hash("exact", torch.float32, 1, seed=12))


class ModuleTest(unittest.TestCase):
    def test_detectron2_module(self):
        x, rois, _ = _inputs(700)
        mod = detops_torch.ROIAlignRotated((2, 3), 0.625, 2)
        assert_bitwise_equal(self, mod(x, rois), _dt(x, rois, ((2, 3), 0.625, 2)), "module vs functional")
        # detectron2's repr: output_size as given.
        self.assertEqual(repr(detops_torch.ROIAlignRotated(7, 0.25, 0)),
                         "ROIAlignRotated(output_size=7, spatial_scale=0.25, sampling_ratio=0)")
        self.assertEqual(repr(mod), "ROIAlignRotated(output_size=(2, 3), spatial_scale=0.625, sampling_ratio=2)")
        self.assertEqual((mod.output_size, mod.spatial_scale, mod.sampling_ratio), ((2, 3), 0.625, 2))
        self.assertEqual(mod.backward_mode, "exact")
        with self.assertRaises(TypeError):  # detectron2's has no aligned argument
            detops_torch.ROIAlignRotated(7, 0.25, 0, True)

    def test_mmcv_module(self):
        x, rois, _ = _inputs(710, radians=True)
        mod = detops_torch.RoIAlignRotated((2, 3), 0.625, 2, True, True)
        ref = _dt(x, rois, ((2, 3), 0.625, 2), (True, True, "radians"))
        assert_bitwise_equal(self, mod(x, rois), ref, "module vs functional")
        # mmcv's defaults, types and repr.
        d = detops_torch.RoIAlignRotated(7, 1)
        self.assertEqual((d.output_size, d.spatial_scale, d.sampling_ratio, d.aligned, d.clockwise),
                         ((7, 7), 1.0, 0, True, False))
        self.assertIsInstance(d.spatial_scale, float)
        self.assertEqual(repr(d), "RoIAlignRotated(output_size=(7, 7), spatial_scale=1.0, sampling_ratio=0, "
                                  "aligned=True, clockwise=False)")
        kw = detops_torch.RoIAlignRotated(output_size=(2, 3), spatial_scale=0.625, sampling_ratio=2, aligned=False,
                                          clockwise=True, backward_mode="atomic", truncation="bfloat16")
        self.assertEqual((kw.aligned, kw.clockwise, kw.backward_mode, kw.truncation),
                         (False, True, "atomic", "bfloat16"))
        assert_bitwise_equal(self, kw(x, rois), _dt(x, rois, ((2, 3), 0.625, 2), (False, True, "radians")),
                             "legacy clockwise")

    def test_mmcv_deprecated_names(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mod = detops_torch.RoIAlignRotated(out_size=7, spatial_scale=0.5, sample_num=2, clockwise=True)
        self.assertEqual((mod.output_size, mod.sampling_ratio, mod.clockwise), ((7, 7), 2, True))
        messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
        self.assertTrue(any("out_size" in m for m in messages) and any("sample_num" in m for m in messages),
                        messages)
        with self.assertRaises(TypeError), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            detops_torch.RoIAlignRotated(7, 0.5, out_size=7)  # given twice

    def test_state_dicts_are_empty(self):
        # Neither anchor has parameters or buffers: an empty state dict, which loads strictly.
        for mod in (detops_torch.ROIAlignRotated(7, 0.25, 2), detops_torch.RoIAlignRotated(7, 0.25)):
            self.assertEqual(list(mod.state_dict().keys()), [])
            self.assertEqual(list(mod.parameters()), [])
            mod.load_state_dict({}, strict=True)
            container = torch.nn.Sequential(mod)
            self.assertEqual(list(container.state_dict().keys()), [])

    def test_modules_run_16bit_natively(self):
        x, rois, _ = _inputs(720, dtype=torch.float16)
        for mod in (detops_torch.ROIAlignRotated(3, 0.625, 2), detops_torch.RoIAlignRotated(3, 0.625, 2)):
            for r in (rois.half(), rois.float()):
                out = mod(x, r)
                self.assertEqual(out.dtype, torch.float16)
                ref = mod(x.float(), r.float())  # the same boxes (float16 rois are rounded ones)
                torch.testing.assert_close(out.float(), ref, rtol=4e-3, atol=4e-3)

    def test_module_options_checked_at_construction(self):
        for cls, args in ((detops_torch.ROIAlignRotated, (7, 1.0, 2)), (detops_torch.RoIAlignRotated, (7, 1.0))):
            with self.assertRaisesRegex(ValueError, "backward_mode"):
                cls(*args, backward_mode="fast")
            with self.assertRaisesRegex(ValueError, "truncation"):
                cls(*args, truncation="half")

    def test_modules_script(self):
        x, rois, _ = _inputs(730)
        for mod in (detops_torch.ROIAlignRotated((3, 2), 0.625, 2, backward_mode="atomic"),
                    detops_torch.RoIAlignRotated((3, 2), 0.625, 2, False, True)):
            scripted = torch.jit.script(mod)
            assert_bitwise_equal(self, scripted(x, rois), mod(x, rois), type(mod).__name__)
            xg = x.clone().requires_grad_(True)
            scripted(xg, rois).sum().backward()
            self.assertIsNotNone(xg.grad)


class MetaAndScriptTest(unittest.TestCase):
    def test_meta_tensors(self):
        x = torch.empty(2, 3, 10, 12, device="meta")
        rois = torch.empty(5, 6, device="meta")
        # detectron2's positional order: (input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio)
        out = torch.ops.detops.roi_align_rotated(x, rois, 0.5, 3, 4, 2)
        self.assertEqual((out.device.type, tuple(out.shape), out.dtype), ("meta", (5, 3, 3, 4), torch.float32))
        out = torch.ops.detops.roi_align_rotated(x.half(), rois, 0.5, 3, 4, 2, False, True, "radians")
        self.assertEqual((tuple(out.shape), out.dtype), ((5, 3, 3, 4), torch.float16))
        g = torch.ops.detops._roi_align_rotated_backward(torch.empty(5, 3, 3, 4, device="meta"), rois, 0.5, 3, 4, 2,
                                                         3, 10, 12, 2)
        self.assertEqual((g.device.type, tuple(g.shape)), ("meta", (2, 3, 10, 12)))
        with self.assertRaisesRegex(ValueError, "angle_unit"):
            torch.ops.detops.roi_align_rotated(x, rois, 0.5, 3, 4, 2, True, False, "gradians")

    def test_detectron2_positional_call(self):
        # The schema starts with detectron2's roi_align_rotated_forward arguments; the rest default.
        args = torch.ops.detops.roi_align_rotated.default._schema.arguments
        self.assertEqual([a.name for a in args[:6]], ["input", "rois", "spatial_scale", "pooled_height",
                                                      "pooled_width", "sampling_ratio"])
        for a in args[6:]:
            self.assertIsNotNone(a.default_value, f"extra argument {a.name} must have a default")
        x, rois, _ = _inputs(800)
        out = torch.ops.detops.roi_align_rotated(x, rois, 0.625, 2, 3, 2)
        assert_bitwise_equal(self, out, _dt(x, rois, ((2, 3), 0.625, 2)), "positional defaults")

    def test_torchscript_op_call(self):
        def op_call(x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
            return torch.ops.detops.roi_align_rotated(x, rois, 0.625, 3, 2, 2, True, False, "degrees", "exact",
                                                      "float16")

        scripted = torch.jit.script(op_call)
        x, rois, _ = _inputs(900)
        assert_bitwise_equal(self, scripted(x, rois), op_call(x, rois), "scripted op call")
        self.assertIn("detops::roi_align_rotated", str(scripted.graph))

    def test_functional_scripts(self):
        # Every detops functional with a peer signature scripts (issue 27).
        scripted = torch.jit.script(detops_torch.roi_align_rotated)
        x, rois, _ = _inputs(950)
        assert_bitwise_equal(self, scripted(x, rois, [3, 2], 0.625, 2, True, False, "degrees", "atomic"),
                             detops_torch.roi_align_rotated(x, rois, (3, 2), 0.625, 2, backward_mode="atomic"),
                             "scripted function")

    @unittest.skipUnless(TORCH_2_1 and hasattr(torch.library, "opcheck"), "torch.library.opcheck needs torch >= 2.1")
    def test_opcheck(self):
        x, rois, _ = _inputs(1000)
        devices = ["cpu"] + (["cuda"] if HAS_CUDA else [])
        for dev in devices:
            args = (x.to(dev).requires_grad_(True), rois.to(dev), 0.625, 3, 2, 2, True, False, "degrees", "exact",
                    "float16")
            torch.library.opcheck(torch.ops.detops.roi_align_rotated.default, args)

    @unittest.skipUnless(TORCH_2_1, "torch.compile over custom ops needs torch >= 2.1")
    def test_torch_compile_fullgraph(self):
        x, rois, _ = _inputs(1100)

        def fn(t):
            return detops_torch.roi_align_rotated(t * 2.0, rois, (3, 2), 0.625, 2).square().sum()

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
        x, rois, _ = _inputs(1200, dtype=torch.float32)
        rois32 = rois.float()
        f = detops_torch.roi_align_rotated
        cases = [
            ("dtype", lambda: f(x.long(), rois32, 2)),
            ("rois.*dtype", lambda: f(x, rois32.half(), 2)),
            (r"\[K, 6\]", lambda: f(x, rois32[:, 1:], 2)),
            (r"\[K, 6\]", lambda: f(x, rois32[0], 2)),
            ("input", lambda: f(x[0], rois32, 2)),
            ("pooled", lambda: f(x, rois32, (0, 2))),
            ("spatial_scale", lambda: f(x, rois32, 2, -1.0)),
            (r"\[K, 6\]", lambda: detops_torch.ROIAlignRotated(2, 1.0, 2)(x, rois32[:, :5])),
            (r"\[K, 6\]", lambda: detops_torch.RoIAlignRotated(2, 1.0)(x, rois32[:, :5])),
        ]
        nan_rois = rois32.clone()
        nan_rois[3, 5] = float("nan")  # the angle
        cases.append((r"rois\[3\].*finite", lambda: f(x, nan_rois, 2)))
        bad_index = rois32.clone()
        bad_index[1, 0] = 2.5
        cases.append((r"rois\[1\].*batch index", lambda: f(x, bad_index, 2)))
        negative = rois32.clone()
        negative[2, 4] = -1.0
        cases.append((r"rois\[2\].*w >= 0 and h >= 0", lambda: f(x, negative, 2)))
        for pattern, fn in cases:
            with self.subTest(pattern=pattern):
                self._raises(pattern, fn, x, rois32, nan_rois, bad_index, negative)
        # mmcv's legacy mode clamps negative sizes to 1 instead of refusing them.
        self.assertEqual(f(x, negative, 2, aligned=False).shape, (rois.shape[0], 3, 2, 2))

    def test_bad_option_strings_fail_in_the_forward(self):
        x, rois, _ = _inputs(1300)
        x.requires_grad_(True)
        for kw, name in (({"backward_mode": "exactly"}, "backward_mode"), ({"truncation": "fp8"}, "truncation"),
                         ({"angle_unit": "deg"}, "angle_unit")):
            with self.assertRaisesRegex(ValueError, name):
                detops_torch.roi_align_rotated(x, rois, 2, **kw)
        with self.assertRaisesRegex(ValueError, "backward_mode"):
            torch.ops.detops.roi_align_rotated(x.detach(), rois, 1.0, 2, 2, 2, True, False, "degrees", "Exact")
        self.assertIsNone(x.grad)

    def test_wrong_device(self):
        x, rois, _ = _inputs(1400)
        if HAS_CUDA:
            with self.assertRaisesRegex(ValueError, "device|cuda|cpu"):
                detops_torch.roi_align_rotated(x.cuda(), rois, 2)
            with self.assertRaisesRegex(ValueError, "device|cuda|cpu"):
                detops_torch.roi_align_rotated(x, rois.cuda(), 2)
        # A CPU tensor with a meta one: the Meta kernel refuses the mix.
        with self.assertRaisesRegex(ValueError, "device|meta"):
            torch.ops.detops.roi_align_rotated(x, rois.to("meta"), 1.0, 2, 2, 2)


@unittest.skipUnless(HAS_CUDA, "CUDA is not available")
class CudaTest(unittest.TestCase):
    def test_cuda_matches_cpu_bitwise_in_exact_mode(self):
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            x, rois, gen = _inputs(1500, dtype=dtype, c=8, k=40)
            rois = rois.float()
            g = torch.randn(40, 8, 3, 3, generator=gen).to(dtype)
            for conv in CONVENTIONS[:3]:
                fn = lambda t: _dt(t, rois.to(t.device), (3, 0.625, -1), conv)  # noqa: E731
                out, grad = _grad(fn, x, g)
                out_c, grad_c = _grad(fn, x.cuda(), g.cuda())
                assert_bitwise_equal(self, out_c.cpu(), out, f"forward {dtype} {conv}")
                assert_bitwise_equal(self, grad_c.cpu(), grad, f"backward {dtype} {conv}")

    def test_cuda_float64_truncated_matches_cpu_bitwise(self):
        x, rois, gen = _inputs(1550, c=4, k=30)
        g = torch.randn(30, 4, 3, 3, generator=gen, dtype=torch.float64)
        fn = lambda t: _dt(t, rois.to(t.device), (3, 0.625, 2), backward_mode="truncated")  # noqa: E731
        _, grad = _grad(fn, x, g)
        _, grad_c = _grad(fn, x.cuda(), g.cuda())
        assert_bitwise_equal(self, grad_c.cpu(), grad, "float64 truncated")

    def test_atomic_mode_raises_the_nondeterminism_alert(self):
        x, rois, _ = _inputs(1600, dtype=torch.float32)
        x = x.cuda().requires_grad_(True)
        rois = rois.float().cuda()
        old = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            with self.assertRaisesRegex(RuntimeError, "roi_align_rotated.*atomic"):
                detops_torch.roi_align_rotated(x, rois, 3, backward_mode="atomic").sum().backward()
            for mode in ("exact", "truncated"):  # no alert
                detops_torch.roi_align_rotated(x, rois, 3, backward_mode=mode).sum().backward()
        finally:
            torch.use_deterministic_algorithms(old)

    def test_non_default_stream(self):
        x, rois, _ = _inputs(1700, dtype=torch.float32)
        ref = _dt(x, rois.float(), ((3, 3), 0.625, 2))
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            out = _dt(x.cuda(), rois.float().cuda(), ((3, 3), 0.625, 2))
        s.synchronize()
        assert_bitwise_equal(self, out.cpu(), ref, "on a side stream")


if __name__ == "__main__":
    unittest.main()
