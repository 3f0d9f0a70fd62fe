# Tests of detops_torch.grid_sample and point_sample: torch parity, gradcheck, reproducibility, needed gradients only, meta, TorchScript, bad input.
import itertools
import unittest
import warnings

import torch
import torch.nn.functional as TF

import detops_torch
from detops_torch import functional as F
from detops_torch._ops.grid_sample import functional as grid_sample_functional
from _util import (HAS_CUDA, TORCH_2_1, assert_bitwise_equal, assert_raises_untouched, max_rel_error, num_threads,
                   tensor_bytes, tensor_hash)

# Every option torch's 4-d grid_sample shares with detops.
CONFIGS = list(itertools.product(F.GRID_SAMPLE_MODES, F.GRID_SAMPLE_PADDING_MODES, (False, True)))


def _inputs(seed, dtype=torch.float64, n=2, c=3, h=7, w=9, ho=5, wo=6, spread=1.3):
    """input [n, c, h, w] and a grid reaching ``spread`` (> 1: outside the map, so that every
    padding mode matters)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64).to(dtype)
    grid = ((torch.rand(n, ho, wo, 2, generator=gen, dtype=torch.float64) * 2 - 1) * spread).to(dtype)
    return x, grid, gen


def _run(fn, x, grid, grad_out):
    """(output, grad_input, grad_grid) of fn(x, grid) with grad_out flowing back."""
    x = x.detach().clone().requires_grad_(True)
    grid = grid.detach().clone().requires_grad_(True)
    out = fn(x, grid)
    out.backward(grad_out)
    return out.detach(), x.grad, grid.grad


def _torch(cfg):
    mode, padding, align = cfg
    return lambda x, g: TF.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align)


def _detops(cfg, backward_mode="exact"):
    mode, padding, align = cfg
    return lambda x, g: detops_torch.grid_sample(x, g, mode, padding, align, backward_mode=backward_mode)


class TorchParityTest(unittest.TestCase):
    def test_float64_forward_and_gradients_match_torch(self):
        # The same formulas in double, arranged differently (torch's forward is not ours bit for
        # bit) and summed in another order (grad_input, grad_grid's sum over channels): within
        # 4e-15 of the largest value, about 18 ulps (measured: below 7e-16).
        for i, cfg in enumerate(CONFIGS):
            x, grid, gen = _inputs(i)
            g = torch.randn(2, 3, 5, 6, generator=gen, dtype=torch.float64)
            ref = _run(_torch(cfg), x, grid, g)
            for mode in F.GATHER_BACKWARD_MODES:
                ours = _run(_detops(cfg, mode), x, grid, g)
                for name, a, b in zip(("output", "grad_input", "grad_grid"), ours, ref):
                    self.assertLessEqual(max_rel_error(a, b), 4e-15, f"{name} {cfg} {mode}")

    def test_nearest_grid_gradient_is_zero_like_torch(self):
        x, grid, gen = _inputs(20)
        _, _, grad_grid = _run(_detops(("nearest", "zeros", False)), x, grid, torch.ones(2, 3, 5, 6, dtype=x.dtype))
        self.assertEqual(tensor_bytes(grad_grid), tensor_bytes(torch.zeros_like(grad_grid)))

    def test_non_finite_coordinates_as_torch(self):
        # NaN and infinite grid values as torch's CPU kernel treats them: border and reflection
        # sample an edge pixel, zeros padding gives 0 (nearest) or NaN (bilinear). torch's own
        # backward crashes on such grids under bilinear border/reflection, so there only the
        # forward is compared (and detops' gradients are checked finite).
        nan, inf = float("nan"), float("inf")
        grid = torch.tensor([[[[nan, 0.25], [0.5, nan], [inf, 0.0], [-0.75, -inf], [-inf, 0.3]]]],
                            dtype=torch.float64)
        x = torch.randn(1, 3, 4, 5, dtype=torch.float64)
        g = torch.randn(1, 3, 1, 5, dtype=torch.float64)
        for cfg in CONFIGS:
            mode, padding, _ = cfg
            with self.subTest(cfg=cfg):
                ours = _run(_detops(cfg), x, grid, g)
                torch_backward = mode == "nearest" or padding == "zeros"
                if torch_backward:
                    ref = _run(_torch(cfg), x, grid, g)
                else:
                    ref = (_torch(cfg)(x, grid),)
                    for name, t in zip(("grad_input", "grad_grid"), ours[1:]):
                        self.assertTrue(bool(torch.isfinite(t).all()), name)
                for name, a, b in zip(("output", "grad_input", "grad_grid"), ours, ref):
                    self.assertTrue(torch.equal(a.isnan(), b.isnan()), f"{name}: NaN at {a.isnan()} vs {b.isnan()}")
                    self.assertLessEqual(max_rel_error(a.nan_to_num(), b.nan_to_num()), 4e-15, name)
                self.assertEqual(bool(ours[0].isnan().any()), cfg[:2] == ("bilinear", "zeros"))

    def test_float32_and_16bit_close(self):
        cfg = ("bilinear", "border", False)
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)):
            x, grid, gen = _inputs(30, dtype=dtype)
            g = torch.randn(2, 3, 5, 6, generator=gen).to(dtype)
            out, gx, gg = _run(_detops(cfg), x, grid, g)
            self.assertEqual((out.dtype, gx.dtype, gg.dtype), (dtype, dtype, dtype))  # natively, no upcast
            ref = _run(_torch(cfg), x.double(), grid.double(), g.double())
            for name, a, b in zip(("output", "grad_input", "grad_grid"), (out, gx, gg), ref):
                torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol, msg=f"{name} {dtype}")
        # A float32 grid with a 16-bit input is accepted, and its gradient stays float32.
        x, grid, gen = _inputs(31, dtype=torch.float16)
        _, _, gg = _run(_detops(cfg), x, grid.float(), torch.ones(2, 3, 5, 6, dtype=torch.float16))
        self.assertEqual(gg.dtype, torch.float32)

    def test_channels_last_is_bitwise_nchw(self):
        for i, cfg in enumerate(CONFIGS[::2]):
            x, grid, gen = _inputs(40 + i, dtype=torch.float32, c=5)
            g = torch.randn(2, 5, 5, 6, generator=gen)
            ref = _run(_detops(cfg), x, grid, g)
            ours = _run(_detops(cfg), x.contiguous(memory_format=torch.channels_last), grid, g)
            self.assertTrue(ours[0].is_contiguous(memory_format=torch.channels_last))
            self.assertTrue(ours[1].is_contiguous(memory_format=torch.channels_last))
            for name, a, b in zip(("output", "grad_input", "grad_grid"), ours, ref):
                assert_bitwise_equal(self, a, b, f"{name} {cfg}")

    def test_align_corners_none_warns_and_means_false(self):
        x, grid, _ = _inputs(50)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = detops_torch.grid_sample(x, grid)
        self.assertTrue(any("align_corners" in str(w.message) for w in caught))
        assert_bitwise_equal(self, out, detops_torch.grid_sample(x, grid, align_corners=False), "None -> False")


class PointSampleTest(unittest.TestCase):
    def _detectron2(self, x, coords, **kwargs):
        # detectron2's point_sample over torch's grid_sample, written from its documented behaviour.
        flat = coords.dim() == 3
        grid = 2.0 * (coords.unsqueeze(2) if flat else coords) - 1.0
        out = TF.grid_sample(x, grid, **kwargs)
        return out.squeeze(3) if flat else out

    def test_matches_detectron2_point_sample(self):
        gen = torch.Generator().manual_seed(60)
        x = torch.randn(4, 1, 14, 14, generator=gen, dtype=torch.float64)
        for shape in ((4, 50, 2), (4, 5, 7, 2)):
            coords = torch.rand(*shape, generator=gen, dtype=torch.float64)
            for align in (False, True):
                ours = detops_torch.point_sample(x, coords, align_corners=align)
                ref = self._detectron2(x, coords, align_corners=align)
                self.assertEqual(ours.shape, ref.shape)
                self.assertLessEqual(max_rel_error(ours, ref), 4e-15, f"{shape} align_corners={align}")
        # Mask2Former's point loss: gradients reach the logits, mode keywords pass through.
        logits = x.clone().requires_grad_(True)
        coords = torch.rand(4, 50, 2, generator=gen, dtype=torch.float64)
        detops_torch.point_sample(logits, coords, align_corners=False, backward_mode="atomic").sum().backward()
        ref = x.clone().requires_grad_(True)
        self._detectron2(ref, coords, align_corners=False).sum().backward()
        self.assertLessEqual(max_rel_error(logits.grad, ref.grad), 4e-15)

    def test_one_pass_has_the_bits_of_the_two_step_form(self):
        # point_sample reads c as 2c - 1 inside the op: the output, grad_input and grad of the
        # coordinates must be those of grid_sample at torch's own `2.0 * c - 1.0` (and torch's
        # backward of it), for every option, mode and dtype, with coordinates whose 2c - 1 rounds
        # and some outside [0, 1].
        gen = torch.Generator().manual_seed(61)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            x = torch.randn(2, 3, 9, 11, generator=gen, dtype=torch.float64).to(dtype)
            coords = (torch.rand(2, 40, 2, generator=gen, dtype=torch.float64) * 1.4 - 0.2)
            coords[0, :8, 0] = torch.rand(8, generator=gen, dtype=torch.float64) * 1e-3  # 2c - 1 rounds
            coords = coords.to(dtype)
            g = torch.randn(2, 3, 40, generator=gen, dtype=torch.float64).to(dtype)
            for (mode, padding, align), backward_mode in itertools.product(CONFIGS, F.GATHER_BACKWARD_MODES):
                what = f"{dtype} {mode} {padding} align_corners={align} {backward_mode}"
                results = []
                for two_step in (False, True):
                    xi = x.clone().requires_grad_(True)
                    ci = coords.clone().requires_grad_(True)
                    if two_step:
                        grid = 2.0 * ci.unsqueeze(2) - 1.0
                        out = detops_torch.grid_sample(xi, grid, mode, padding, align, backward_mode).squeeze(3)
                    else:
                        out = detops_torch.point_sample(xi, ci, mode=mode, padding_mode=padding, align_corners=align,
                                                        backward_mode=backward_mode)
                    out.backward(g)
                    results.append((out.detach(), xi.grad, ci.grad))
                for name, a, b in zip(("output", "grad_input", "grad_coords"), *results):
                    assert_bitwise_equal(self, a, b, f"{name} {what}")


class GradientTest(unittest.TestCase):
    def test_gradcheck_every_option(self):
        for i, (cfg, mode) in enumerate(itertools.product(CONFIGS, F.GATHER_BACKWARD_MODES)):
            x, grid, _ = _inputs(70 + i, n=1, c=2, h=4, w=5, ho=3, wo=2)
            xi, gi = x.requires_grad_(True), grid.requires_grad_(True)
            self.assertTrue(torch.autograd.gradcheck(_detops(cfg, mode), (xi, gi), eps=1e-6, atol=1e-7),
                            f"{cfg} {mode}")

    def test_only_needed_gradients_are_computed(self):
        x, grid, gen = _inputs(90)
        g = torch.randn(2, 3, 5, 6, generator=gen, dtype=torch.float64)
        _, full_gx, full_gg = _run(_detops(CONFIGS[0]), x, grid, g)
        # The backward op returns None for what is not asked for.
        gx, gg = torch.ops.detops._grid_sample_backward(g, x, grid, "bilinear", "zeros", False, "exact", "normalized",
                                                        True, False)
        self.assertIsNone(gg)
        assert_bitwise_equal(self, gx, full_gx, "grad_input alone")
        gx, gg = torch.ops.detops._grid_sample_backward(g, x, grid, "bilinear", "zeros", False, "exact", "normalized",
                                                        False, True)
        self.assertIsNone(gx)
        assert_bitwise_equal(self, gg, full_gg, "grad_grid alone")
        # Through autograd: a grid that does not require grad gets none, and the reverse.
        xi = x.clone().requires_grad_(True)
        detops_torch.grid_sample(xi, grid, align_corners=False).backward(g)
        assert_bitwise_equal(self, xi.grad, full_gx, "input only")
        gi = grid.clone().requires_grad_(True)
        detops_torch.grid_sample(x, gi, align_corners=False).backward(g)
        assert_bitwise_equal(self, gi.grad, full_gg, "grid only")

    def test_empty_inputs(self):
        # N = 0, C = 0 and an empty grid succeed; the gradients are zero-filled.
        for n, c, ho in ((0, 3, 5), (2, 0, 5), (2, 3, 0)):
            x, grid, _ = _inputs(92, n=n, c=c, ho=ho)
            out, gx, gg = _run(_detops(CONFIGS[0]), x, grid, torch.ones(n, c, ho, 6, dtype=x.dtype))
            self.assertEqual(tuple(out.shape), (n, c, ho, 6))
            self.assertEqual((tuple(gx.shape), tuple(gg.shape)), (tuple(x.shape), tuple(grid.shape)))
            self.assertEqual(int((gx != 0).sum()) + int((gg != 0).sum()), 0)

    def test_double_backward_raises(self):
        x, grid, gen = _inputs(91)
        x.requires_grad_(True)
        out = detops_torch.grid_sample(x, grid, align_corners=True)
        g = torch.randn(out.shape, generator=gen, dtype=out.dtype, requires_grad=True)
        (gx,) = torch.autograd.grad(out, x, g, create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "double backward is not supported"):
            gx.sum().backward()


class ReproducibilityTest(unittest.TestCase):
    def _hash(self, mode, threads, interpolation="bilinear"):
        gen = torch.Generator().manual_seed(100)
        # Many more grid points than pixels: every pixel of grad_input sums many contributions.
        x = torch.randn(2, 8, 12, 12, generator=gen)
        grid = torch.rand(2, 48, 48, 2, generator=gen) * 2.2 - 1.1
        w = torch.randn(2, 8, 48, 48, generator=gen)
        with num_threads(threads):
            leaf = x.clone().requires_grad_(True)
            gleaf = grid.clone().requires_grad_(True)
            out = detops_torch.grid_sample(leaf * 1.5, gleaf, interpolation, "reflection", False,
                                           backward_mode=mode)
            (out * w).sum().backward()
            return tensor_hash(out, leaf.grad, gleaf.grad)

    def test_exact_gradients_identical_across_runs_and_threads(self):
        for interpolation in F.GRID_SAMPLE_MODES:
            hashes = {self._hash("exact", t, interpolation) for t in (1, 2, 1, 2)}
            self.assertEqual(len(hashes), 1, f"{interpolation}: {hashes}")

    def test_cpu_atomic_repeats_at_a_fixed_thread_count(self):
        self.assertEqual(len({self._hash("atomic", 2) for _ in range(3)}), 1)

    def test_hash_is_sensitive(self):
        self.assertNotEqual(self._hash("exact", 1, "bilinear"), self._hash("exact", 1, "nearest"))


class MetaAndScriptTest(unittest.TestCase):
    def test_meta_tensors(self):
        x = torch.empty(2, 3, 10, 12, device="meta", dtype=torch.float16)
        grid = torch.empty(2, 4, 5, 2, device="meta")
        out = torch.ops.detops.grid_sample(x, grid, "nearest", "border", True, "atomic")
        self.assertEqual((out.device.type, tuple(out.shape), out.dtype), ("meta", (2, 3, 4, 5), torch.float16))
        out = detops_torch.grid_sample(x.contiguous(memory_format=torch.channels_last), grid, align_corners=False)
        self.assertTrue(out.is_contiguous(memory_format=torch.channels_last))
        gx, gg = torch.ops.detops._grid_sample_backward(torch.empty(2, 3, 4, 5, device="meta"), x, grid, "bilinear",
                                                        "zeros", False, "exact", "unit", True, True)
        self.assertEqual((tuple(gx.shape), gx.dtype, tuple(gg.shape), gg.dtype),
                         ((2, 3, 10, 12), torch.float16, (2, 4, 5, 2), torch.float32))
        with self.assertRaisesRegex(ValueError, "mode"):
            torch.ops.detops.grid_sample(x, grid, "bilinear", "zeros", False, "truncated")
        with self.assertRaisesRegex(ValueError, "device|meta"):
            torch.ops.detops.grid_sample(torch.zeros(2, 3, 10, 12), grid, "bilinear", "zeros", False, "exact")

    def test_torchscript(self):
        def op_call(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            return torch.ops.detops.grid_sample(x, grid, "bilinear", "reflection", True, "exact")

        scripted = torch.jit.script(op_call)
        x, grid, _ = _inputs(110)
        assert_bitwise_equal(self, scripted(x, grid), op_call(x, grid), "scripted op call")
        self.assertIn("detops::grid_sample", str(scripted.graph))
        scripted_fn = torch.jit.script(grid_sample_functional._grid_sample)
        assert_bitwise_equal(self, scripted_fn(x, grid, "nearest", "zeros", False, "atomic"),
                             detops_torch.grid_sample(x, grid, "nearest", "zeros", False, backward_mode="atomic"),
                             "scripted positional form")

    def test_functional_scripts_as_torchs(self):
        # torch.jit.script(torch.nn.functional.grid_sample) works; so must detops' (issue 27).
        scripted = torch.jit.script(detops_torch.grid_sample)
        x, grid, _ = _inputs(111)
        assert_bitwise_equal(self, scripted(x, grid, "nearest", "border", True, "atomic"),
                             detops_torch.grid_sample(x, grid, "nearest", "border", True, backward_mode="atomic"),
                             "scripted function")

        def user(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            return detops_torch.grid_sample(x, grid, padding_mode="reflection", align_corners=False)

        assert_bitwise_equal(self, torch.jit.script(user)(x, grid), user(x, grid), "scripted caller")


    @unittest.skipUnless(TORCH_2_1 and hasattr(torch.library, "opcheck"), "torch.library.opcheck needs torch >= 2.1")
    def test_opcheck(self):
        x, grid, _ = _inputs(112)
        for dev in ["cpu"] + (["cuda"] if HAS_CUDA else []):
            for mode in F.GATHER_BACKWARD_MODES:
                args = (x.to(dev).requires_grad_(True), grid.to(dev).requires_grad_(True), "bilinear", "border",
                        False, mode)
                torch.library.opcheck(torch.ops.detops.grid_sample.default, args)

    @unittest.skipUnless(TORCH_2_1, "torch.compile over custom ops needs torch >= 2.1")
    def test_torch_compile_fullgraph(self):
        x, grid, _ = _inputs(113)

        def fn(t, g):
            return detops_torch.grid_sample(t * 2.0, g, "bilinear", "zeros", False).square().sum()

        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        eager = _run(fn, x, grid, torch.tensor(1.0, dtype=x.dtype))
        ours = _run(compiled, x, grid, torch.tensor(1.0, dtype=x.dtype))
        for name, a, b in zip(("loss", "grad_input", "grad_grid"), ours, eager):
            assert_bitwise_equal(self, a, b, f"compiled {name}")


class BadInputTest(unittest.TestCase):
    def _raises(self, pattern, fn, *tensors):
        assert_raises_untouched(self, pattern, fn, *tensors)

    def test_shapes_dtypes_and_options(self):
        x, grid, _ = _inputs(120, dtype=torch.float32)
        gs = detops_torch.grid_sample
        cases = [
            (r"input.*\[N, C, H, W\]", lambda: gs(x[None], grid, align_corners=False)),  # 5-d: not offered
            (r"grid.*\[N, Ho, Wo, 2\]", lambda: gs(x, grid[0], align_corners=False)),
            ("grid", lambda: gs(x, torch.cat([grid, grid[..., :1]], -1), align_corners=False)),
            ("grid", lambda: gs(x, grid[:1], align_corners=False)),  # batch sizes differ
            ("dtype", lambda: gs(x.long(), grid, align_corners=False)),
            ("grid.*dtype", lambda: gs(x, grid.half(), align_corners=False)),
            ("mode.*'bicubic'", lambda: gs(x, grid, "bicubic", align_corners=False)),
            ("padding_mode.*'circular'", lambda: gs(x, grid, padding_mode="circular", align_corners=False)),
            ("backward_mode.*'truncated'", lambda: gs(x, grid, align_corners=False, backward_mode="truncated")),
            ("interpolation.*'area'",
             lambda: torch.ops.detops.grid_sample(x, grid, "area", "zeros", False, "exact")),
            ("mode.*'Exact'", lambda: torch.ops.detops.grid_sample(x, grid, "bilinear", "zeros", False, "Exact")),
            ("coordinates.*'pixels'",
             lambda: torch.ops.detops.grid_sample(x, grid, "bilinear", "zeros", False, "exact", "pixels")),
            ("point_sample|mode.*'bicubic'", lambda: detops_torch.point_sample(x, grid, "bicubic", align_corners=False)),
        ]
        for pattern, fn in cases:
            with self.subTest(pattern=pattern):
                self._raises(pattern, fn, x, grid)

    def test_bad_mode_fails_in_the_forward(self):
        x, grid, _ = _inputs(121)
        x.requires_grad_(True)
        with self.assertRaisesRegex(ValueError, "mode"):
            torch.ops.detops.grid_sample(x, grid, "bilinear", "zeros", False, "fast")
        self.assertIsNone(x.grad)


@unittest.skipUnless(HAS_CUDA, "CUDA is not available")
class CudaTest(unittest.TestCase):
    def test_cuda_matches_cpu_bitwise_in_exact_mode(self):
        for dtype in (torch.float32, torch.float64, torch.float16):
            for cfg in CONFIGS:
                x, grid, gen = _inputs(130, dtype=dtype, c=8, h=9, w=11, ho=13, wo=14)
                g = torch.randn(2, 8, 13, 14, generator=gen).to(dtype)
                cpu = _run(_detops(cfg), x, grid, g)
                cuda = _run(_detops(cfg), x.cuda(), grid.cuda(), g.cuda())
                for name, a, b in zip(("output", "grad_input", "grad_grid"), cuda, cpu):
                    assert_bitwise_equal(self, a.cpu(), b, f"{name} {dtype} {cfg}")

    def test_atomic_mode_raises_the_nondeterminism_alert(self):
        x, grid, _ = _inputs(131, dtype=torch.float32)
        x = x.cuda().requires_grad_(True)
        out = detops_torch.grid_sample(x, grid.cuda(), align_corners=False, backward_mode="atomic")
        old = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            with self.assertRaisesRegex(RuntimeError, "atomic"):
                out.sum().backward()
            x.grad = None
            detops_torch.grid_sample(x, grid.cuda(), align_corners=False).sum().backward()  # exact: no alert
        finally:
            torch.use_deterministic_algorithms(old)


if __name__ == "__main__":
    unittest.main()
