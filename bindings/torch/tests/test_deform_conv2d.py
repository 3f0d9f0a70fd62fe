# Tests of detops_torch.deform_conv2d, DeformConv2d, the mmcv layers (DeformConv2dPack, ModulatedDeformConv2dPack, compat's DeformConv2d and ModulatedDeformConv2d): torchvision parity, gradcheck, reproducibility, 16-bit, module drop-in behaviour (torchvision's, mmcv's), meta, TorchScript, bad input.
import collections
import itertools
import math
import unittest
import warnings

import torch
import torch.fx
import torch.nn.functional as TF

import detops_torch
from detops_torch import compat
from detops_torch import functional as F
from detops_torch._ops.deform_conv2d import functional as deform_conv2d_functional
from _util import (HAS_CUDA, TORCH_2_1, assert_bitwise_equal, assert_raises_untouched, max_rel_error, num_threads,
                   tensor_hash)

try:
    import torchvision
    from torchvision.ops import deform_conv2d as tv_deform_conv2d
except ImportError:  # pragma: no cover
    torchvision = None

NAMES = ("output", "grad_input", "grad_offset", "grad_weight", "grad_mask", "grad_bias")


def _case(seed, dtype=torch.float64, n=2, cin=4, cout=6, h=7, w=8, k=(3, 3), stride=(1, 1), padding=(1, 1),
          dilation=(1, 1), groups=1, offset_groups=1, mask=True, bias=True, spread=2.5):
    """(input, offset, weight, bias, mask, grad_output) for these options; offsets up to
    ``spread`` pixels, so that samples leave the map and several taps share pixels."""
    gen = torch.Generator().manual_seed(seed)
    kh, kw = k
    ho = (h + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    wo = (w + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = rand(n, cin, h, w)
    offset = (torch.rand(n, 2 * offset_groups * kh * kw, ho, wo, generator=gen, dtype=torch.float64) * 2 - 1) * spread
    weight = rand(cout, cin // groups, kh, kw)
    b = rand(cout) if bias else None
    m = torch.rand(n, offset_groups * kh * kw, ho, wo, generator=gen, dtype=torch.float64) if mask else None
    grad = rand(n, cout, ho, wo)
    cast = [t if t is None else t.to(dtype) for t in (x, offset, weight, b, m, grad)]
    return tuple(cast)


def _run(fn, x, offset, weight, bias, mask, grad):
    """(output, grad_input, grad_offset, grad_weight, grad_mask, grad_bias) of
    fn(x, offset, weight, bias, mask) with ``grad`` flowing back (None for absent arguments)."""
    leaves = [t if t is None else t.detach().clone().requires_grad_(True) for t in (x, offset, weight, bias, mask)]
    out = fn(*leaves)
    out.backward(grad)
    xl, ol, wl, bl, ml = leaves
    return (out.detach(), xl.grad, ol.grad, wl.grad, None if ml is None else ml.grad, None if bl is None else bl.grad)


def _detops(stride=(1, 1), padding=(1, 1), dilation=(1, 1), mode="exact"):
    return lambda x, o, w, b, m: detops_torch.deform_conv2d(x, o, w, b, stride, padding, dilation, m, backward_mode=mode)


def _torchvision(stride=(1, 1), padding=(1, 1), dilation=(1, 1)):
    return lambda x, o, w, b, m: tv_deform_conv2d(x, o, w, b, stride, padding, dilation, m)


# (name, options of _case): every option torchvision's deform_conv2d has.
CONFIGS = [
    ("plain", {}),
    ("no mask", {"mask": False}),
    ("no bias", {"bias": False}),
    ("v1 no bias", {"mask": False, "bias": False}),
    ("groups 2", {"groups": 2}),
    ("offset groups 2", {"offset_groups": 2}),
    ("groups 2, offset groups 4", {"groups": 2, "offset_groups": 4, "cout": 4}),
    ("stride 2x1, pad 0x2", {"stride": (2, 1), "padding": (0, 2), "h": 9}),
    ("dilation 2x1, kernel 3x2", {"dilation": (2, 1), "k": (3, 2), "padding": (2, 1)}),
    ("kernel 1x1, no padding", {"k": (1, 1), "padding": (0, 0)}),
    ("everything", {"stride": (2, 2), "padding": (2, 1), "dilation": (1, 2), "groups": 2, "offset_groups": 2,
                    "k": (2, 3), "h": 9, "w": 10}),
]


def _geometry(opts):
    return {k: opts.get(k, d) for k, d in (("stride", (1, 1)), ("padding", (1, 1)), ("dilation", (1, 1)))}


@unittest.skipUnless(torchvision is not None, "torchvision is not installed")
class TorchvisionParityTest(unittest.TestCase):
    def test_float64_forward_and_gradients_match_torchvision(self):
        # The same formulas in double, possibly summed in another order: within 1e-14 of the
        # largest value (measured on torchvision 0.14's CPU kernels: every result bitwise equal but
        # grad_bias, 7.9e-16 from its sum over (n, ho, wo)).
        for i, (name, opts) in enumerate(CONFIGS):
            case = _case(i, **opts)
            geometry = _geometry(opts)
            ref = _run(_torchvision(**geometry), *case)
            for mode in F.GATHER_BACKWARD_MODES:
                ours = _run(_detops(mode=mode, **geometry), *case)
                for what, a, b in zip(NAMES, ours, ref):
                    if b is None:
                        self.assertIsNone(a, f"{what} {name} {mode}")
                        continue
                    self.assertLessEqual(max_rel_error(a, b), 1e-14, f"{what} {name} {mode}")

    def test_positional_and_int_options_like_torchvision(self):
        x, offset, weight, bias, mask, _ = _case(1, stride=(2, 2), padding=(1, 1), h=9)
        ours = detops_torch.deform_conv2d(x, offset, weight, bias, 2, 1, 1, mask)
        ref = tv_deform_conv2d(x, offset, weight, bias, 2, 1, 1, mask)
        self.assertLessEqual(max_rel_error(ours, ref), 1e-14)
        # torch.ops.detops.deform_conv2d takes torchvision's op arguments in torchvision's order.
        args = (x, weight, offset, mask, bias, 2, 2, 1, 1, 1, 1, 1, 1, True)
        assert_bitwise_equal(self, torch.ops.detops.deform_conv2d(*args), ours, "op, positional")
        self.assertLessEqual(max_rel_error(torch.ops.torchvision.deform_conv2d(*args), ours), 1e-14)

    def test_16bit_run_natively_and_close_to_float64(self):
        opts = {"groups": 2, "offset_groups": 2, "cin": 8, "cout": 8}
        # Measured (largest of the six results): float32 3.5e-7, float16 3.2e-4, bfloat16 3.0e-3.
        for dtype, tol in ((torch.float32, 2e-6), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
            case = _case(20, dtype=dtype, **opts)
            ours = _run(_detops(), *case)
            # The reference from the same rounded inputs, in float64.
            ref = _run(_torchvision(), *[t.double() for t in case])
            for what, a, b in zip(NAMES, ours, ref):
                self.assertEqual(a.dtype, dtype, f"{what} {dtype}: computed natively, no upcast")
                self.assertLessEqual(max_rel_error(a, b), tol, f"{what} {dtype}")


class BackwardModeNameTest(unittest.TestCase):
    """The option is `backward_mode` in every layer; the 0.1 spelling `mode` still works, warned."""

    def test_deprecated_mode_keyword_still_selects_the_backward_mode(self):
        x, offset, weight, bias, mask = _case(0, torch.float64)[:5]
        with self.assertWarnsRegex(DeprecationWarning, "backward_mode"):
            old = detops_torch.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask, mode="atomic")
        new = detops_torch.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask, backward_mode="atomic")
        assert_bitwise_equal(self, old, new, "mode= and backward_mode= are the same option")
        for cls in (detops_torch.DeformConv2d, detops_torch.ModulatedDeformConv2dPack, detops_torch.DeformConv2dPack):
            with self.subTest(cls=cls.__name__), self.assertWarnsRegex(DeprecationWarning, "backward_mode"):
                self.assertEqual(cls(4, 6, 3, mode="atomic").backward_mode, "atomic")
        with self.assertWarnsRegex(DeprecationWarning, "backward_mode"):
            self.assertEqual(detops_torch.MSDeformAttn(8, 2, 2, 2, mode="atomic").backward_mode, "atomic")
        with self.assertRaisesRegex(ValueError, "backward_mode is 'fast'"):
            detops_torch.DeformConv2d(4, 6, 3, backward_mode="fast")


class GradientTest(unittest.TestCase):
    def test_gradcheck_both_modes(self):
        for mode, (name, opts) in itertools.product(F.GATHER_BACKWARD_MODES, [
                ("v2", {}), ("v1 groups", {"mask": False, "groups": 2}),
                ("offset groups, stride, dilation", {"offset_groups": 2, "stride": (2, 1), "dilation": (1, 2),
                                                     "padding": (1, 2)})]):
            x, offset, weight, bias, mask, _ = _case(30, n=1, cin=2, cout=2, h=5, w=5, **opts)
            inputs = tuple(t.requires_grad_(True) for t in (x, offset, weight, bias, mask) if t is not None)
            geometry = _geometry(opts)

            def fn(*tensors):
                x_, o_, w_, b_ = tensors[:4]
                m_ = tensors[4] if len(tensors) > 4 else None
                return detops_torch.deform_conv2d(x_, o_, w_, b_, mask=m_, backward_mode=mode, **geometry)

            self.assertTrue(torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6), f"{name} {mode}")

    def test_only_needed_gradients_are_computed(self):
        x, offset, weight, bias, mask, grad = _case(40)
        full = _run(_detops(), x, offset, weight, bias, mask, grad)
        op = torch.ops.detops._deform_conv2d_backward
        # Order of the flags and of the results: input, weight, offset, mask, bias.
        results = (full[1], full[3], full[2], full[4], full[5])
        for which in range(5):
            flags = [i == which for i in range(5)]
            got = op(grad, x, weight, offset, mask, 1, 1, 1, 1, 1, 1, 1, 1, "exact", "torchvision", *flags)
            for i, g in enumerate(got):
                if i == which:
                    assert_bitwise_equal(self, g, results[i], f"gradient {i} alone")
                else:
                    self.assertIsNone(g, f"gradient {i} not asked for")
        # Through autograd: only the leaves that require grad get one, with the same bits.
        w = weight.clone().requires_grad_(True)
        detops_torch.deform_conv2d(x, offset, w, bias, padding=1, mask=mask).backward(grad)
        assert_bitwise_equal(self, w.grad, full[3], "weight only")
        o = offset.clone().requires_grad_(True)
        detops_torch.deform_conv2d(x, o, weight, bias, padding=1, mask=mask).backward(grad)
        assert_bitwise_equal(self, o.grad, full[2], "offset only")

    def test_empty_problems(self):
        # N = 0 and Cout = 0 succeed; gradients are zero-filled where they have elements.
        for n, cout in ((0, 6), (2, 0)):
            case = _case(41, n=n, cout=cout)
            out, *grads = _run(_detops(), *case)
            self.assertEqual(tuple(out.shape), (n, cout, 7, 8))
            for g, t in zip(grads, (case[0], case[1], case[2], case[4], case[3])):
                self.assertEqual(tuple(g.shape), tuple(t.shape))
                self.assertEqual(int((g != 0).sum()), 0)

    def test_double_backward_raises(self):
        x, offset, weight, bias, mask, grad = _case(42)
        x.requires_grad_(True)
        out = detops_torch.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask)
        (gx,) = torch.autograd.grad(out, x, grad.requires_grad_(True), create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "double backward is not supported"):
            gx.sum().backward()


class ReproducibilityTest(unittest.TestCase):
    def _grads(self, mode, threads, mask=True, layout=torch.contiguous_format):
        # Offsets of up to 4 pixels over a small map: every input pixel gathers many samples.
        case = _case(50, dtype=torch.float32, n=2, cin=16, cout=16, h=12, w=12, offset_groups=2, mask=mask,
                     spread=4.0)
        x = case[0].contiguous(memory_format=layout)
        with num_threads(threads):
            return _run(_detops(mode=mode), x, *case[1:])

    def test_exact_gradients_identical_across_runs_and_threads(self):
        hashes = {tensor_hash(*self._grads("exact", t)) for t in (1, 2, 1, 2)}
        self.assertEqual(len(hashes), 1, hashes)

    def test_cpu_atomic_repeats_at_a_fixed_thread_count(self):
        self.assertEqual(len({tensor_hash(*self._grads("atomic", 2)) for _ in range(3)}), 1)

    def test_modes_differ_only_in_grad_input(self):
        # The forward and the weight, offset, mask and bias gradients do not depend on the mode.
        exact, atomic = self._grads("exact", 2), self._grads("atomic", 2)
        for what, a, b in zip(NAMES, exact, atomic):
            if what == "grad_input":
                self.assertLessEqual(max_rel_error(a, b), 1e-5)
            else:
                assert_bitwise_equal(self, a, b, what)

    def test_channels_last_is_bitwise_nchw(self):
        nchw = self._grads("exact", 2)
        nhwc = self._grads("exact", 2, layout=torch.channels_last)
        self.assertTrue(nhwc[0].is_contiguous(memory_format=torch.channels_last))
        self.assertTrue(nhwc[1].is_contiguous(memory_format=torch.channels_last))
        for what, a, b in zip(NAMES, nhwc, nchw):
            assert_bitwise_equal(self, a, b, what)

    def test_hash_is_sensitive(self):
        self.assertNotEqual(tensor_hash(*self._grads("exact", 1)), tensor_hash(*self._grads("exact", 1, mask=False)))


@unittest.skipUnless(torchvision is not None, "torchvision is not installed")
class DeformConv2dModuleTest(unittest.TestCase):
    CONFIGS = [((4, 6, 3), {}), ((4, 6, 3), {"stride": 2, "padding": 1}),
               ((4, 8, (3, 2)), {"dilation": 2, "groups": 2}), ((4, 6, 1), {"bias": False}),
               ((6, 6, 3), {"padding": (1, 0), "groups": 3, "bias": False})]

    def test_same_initialisation_state_dict_and_repr(self):
        for args, kwargs in self.CONFIGS:
            torch.manual_seed(7)
            theirs = torchvision.ops.DeformConv2d(*args, **kwargs)
            torch.manual_seed(7)
            ours = detops_torch.DeformConv2d(*args, **kwargs)
            self.assertEqual(repr(ours), repr(theirs))
            self.assertEqual(list(ours.state_dict()), list(theirs.state_dict()))
            for key, value in theirs.state_dict().items():
                assert_bitwise_equal(self, ours.state_dict()[key], value, f"{key} {args} {kwargs}")
            for attr in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"):
                self.assertEqual(getattr(ours, attr), getattr(theirs, attr), attr)

    def test_torchvision_checkpoint_gives_the_same_output(self):
        gen = torch.Generator().manual_seed(8)
        for (cin, cout, k), kwargs in self.CONFIGS:
            theirs = torchvision.ops.DeformConv2d(cin, cout, k, **kwargs).double()
            ours = detops_torch.DeformConv2d(cin, cout, k, **kwargs).double()  # other random parameters
            ours.load_state_dict(theirs.state_dict())
            x = torch.randn(2, cin, 9, 10, generator=gen, dtype=torch.float64)
            kh, kw = ours.kernel_size
            with torch.no_grad():
                ho, wo = TF.conv2d(x, ours.weight, None, ours.stride, ours.padding, ours.dilation,
                                   ours.groups).shape[-2:]
            offset = torch.randn(2, 2 * 2 * kh * kw, ho, wo, generator=gen, dtype=torch.float64)
            mask = torch.rand(2, 2 * kh * kw, ho, wo, generator=gen, dtype=torch.float64)
            for m in (None, mask):
                ref = theirs(x, offset, m)
                self.assertLessEqual(max_rel_error(ours(x, offset, m), ref), 1e-14, f"{cin, cout, k} {kwargs}")

    def test_torchscript_and_mode(self):
        m = detops_torch.DeformConv2d(4, 6, 3, padding=1, backward_mode="atomic")
        x, offset, _, _, mask, _ = _case(60, dtype=torch.float32)
        scripted = torch.jit.script(m)
        assert_bitwise_equal(self, scripted(x, offset, mask), m(x, offset, mask), "scripted")
        assert_bitwise_equal(self, scripted(x, offset), m(x, offset), "scripted, no mask")
        self.assertEqual(m.backward_mode, "atomic")
        with self.assertRaisesRegex(ValueError, "mode.*'truncated'"):
            detops_torch.DeformConv2d(4, 6, 3, backward_mode="truncated")
        # torchvision's ValueError and words; detops' type (also a RuntimeError)
        with self.assertRaisesRegex(detops_torch.DetopsError, "in_channels must be divisible by groups"):
            detops_torch.DeformConv2d(4, 6, 3, groups=3)
        with self.assertRaisesRegex(ValueError, "out_channels must be divisible by groups"):
            detops_torch.DeformConv2d(4, 5, 3, groups=2)

    def test_autocast_runs_in_the_autocast_dtype(self):
        m = detops_torch.DeformConv2d(4, 6, 3, padding=1)
        x, offset, _, _, mask, _ = _case(61, dtype=torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x, offset.bfloat16(), mask)  # mixed dtypes, as convolutions produce them under autocast
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertLessEqual(max_rel_error(out, m(x, offset, mask)), 4e-2)
        with self.assertRaisesRegex(ValueError, "dtype"):
            m(x, offset.bfloat16(), mask)  # outside autocast: no silent cast


def _mmcv_reference(x, offset, mask, weight, bias, stride, padding, dilation, groups, deform_groups):
    """mmcv's modulated deformable convolution in float64, written from the indexing of its
    kernels (modulated_deform_conv_cuda_kernel.cuh, modulated_deformable_im2col): for deformable
    group g and kernel tap (i, j), the offset channel g * 2 * kh * kw + 2 * (i * kw + j) is the y
    (h) offset and the next one the x (w) offset; the mask channel is g * kh * kw + i * kw + j; a
    sample at (y, x) reads 0 unless -1 < y < H and -1 < x < W, corners outside the map read 0."""
    n, cin, h, w = x.shape
    cout, _, kh, kw = weight.shape
    ho, wo = offset.shape[-2:]
    cpg = cin // deform_groups
    cols = torch.zeros(n, cin, kh, kw, ho, wo, dtype=torch.float64)
    base_y = (torch.arange(ho, dtype=torch.float64) * stride[0] - padding[0]).view(ho, 1)
    base_x = (torch.arange(wo, dtype=torch.float64) * stride[1] - padding[1]).view(1, wo)
    for b in range(n):
        for c in range(cin):
            g = c // cpg
            plane = x[b, c].double()
            for i in range(kh):
                for j in range(kw):
                    t = i * kw + j
                    y = base_y + i * dilation[0] + offset[b, g * 2 * kh * kw + 2 * t].double()
                    xx = base_x + j * dilation[1] + offset[b, g * 2 * kh * kw + 2 * t + 1].double()
                    y0, x0 = torch.floor(y), torch.floor(xx)
                    val = torch.zeros(ho, wo, dtype=torch.float64)
                    inside = (y > -1) & (y < h) & (xx > -1) & (xx < w)
                    for cy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
                        for cx, wx in ((x0, 1 - (xx - x0)), (x0 + 1, xx - x0)):
                            ok = inside & (cy >= 0) & (cy <= h - 1) & (cx >= 0) & (cx <= w - 1)
                            v = plane[cy.clamp(0, h - 1).long(), cx.clamp(0, w - 1).long()]
                            val = val + torch.where(ok, wy * wx * v, torch.zeros_like(v))
                    cols[b, c, i, j] = val * mask[b, g * kh * kw + t].double()
    out = torch.zeros(n, cout, ho, wo, dtype=torch.float64)
    opg, ipg = cout // groups, cin // groups
    for gr in range(groups):
        wg = weight[gr * opg:(gr + 1) * opg].double().reshape(opg, -1)
        cg = cols[:, gr * ipg:(gr + 1) * ipg].reshape(n, ipg * kh * kw, ho * wo)
        out[:, gr * opg:(gr + 1) * opg] = (wg @ cg).view(n, opg, ho, wo)
    if bias is not None:
        out = out + bias.double().view(1, -1, 1, 1)
    return out


def _mmcv_pack_reference(pack, x):
    """mmcv's ModulatedDeformConv2dPack.forward over _mmcv_reference."""
    out = TF.conv2d(x, pack.conv_offset.weight, pack.conv_offset.bias, pack.stride, pack.padding, pack.dilation)
    o1, o2, m = torch.chunk(out, 3, dim=1)
    return _mmcv_reference(x, torch.cat((o1, o2), dim=1), torch.sigmoid(m), pack.weight, pack.bias, pack.stride,
                           pack.padding, pack.dilation, pack.groups, pack.deform_groups)


def _randomised_pack(cls, *args, seed=70, **kwargs):
    """A Pack with every parameter random (offsets of a few pixels), in float64."""
    torch.manual_seed(seed)
    pack = cls(*args, **kwargs).double()
    with torch.no_grad():
        for p in pack.parameters():
            p.normal_()
        pack.conv_offset.weight.mul_(0.3)
    return pack


def _check_deprecated_keyword_and_script(test, cls):
    """mmcv's deprecated ``deformable_groups`` is accepted with one DeprecationWarning; the Pack
    scripts and the scripted one gives the same bits."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pack = cls(4, 6, 3, padding=1, deformable_groups=2)
    test.assertEqual(pack.deform_groups, 2)
    test.assertEqual(len([w for w in caught if issubclass(w.category, DeprecationWarning)]), 1)
    pack = _randomised_pack(cls, 4, 6, 3, padding=1, backward_mode="atomic").float()
    x = torch.randn(2, 4, 8, 9)
    assert_bitwise_equal(test, torch.jit.script(pack)(x), pack(x), "scripted")


def _check_checkpoints(test, cls):
    """A random Pack's state dict (version 2) loads into a new one and gives the same output. A
    version-1 checkpoint (mmdetection's first DCN models) names the offset conv "<module>_offset"
    next to the module; it is renamed on load when the loader hands every module the whole state
    dict, as mmengine's load_checkpoint does (torch >= 1.13's own load_state_dict gives a child
    only the keys under its prefix: mmcv's renaming cannot see these keys there either)."""
    def make():
        return cls(4, 6, 3, padding=1, deform_groups=2).double()

    source = _randomised_pack(cls, 4, 6, 3, padding=1, deform_groups=2)
    state = source.state_dict()
    test.assertEqual(state._metadata[""]["version"], 2)
    target = make()
    target.load_state_dict(state)
    x = torch.randn(2, source.in_channels, 8, 9, dtype=torch.float64)
    assert_bitwise_equal(test, target(x), source(x), "loaded")
    for version in (1, None):
        parent = torch.nn.Module()
        parent.conv2 = make()
        old = collections.OrderedDict()
        for key, value in state.items():
            name = "conv2_offset." + key[12:] if key.startswith("conv_offset.") else "conv2." + key
            old[name] = value
        metadata = {"conv2": {"version": version}} if version else {}
        missing, unexpected, errors = [], [], []
        for prefix, module in parent.named_modules(prefix=""):
            prefix = prefix + "." if prefix else ""
            module._load_from_state_dict(old, prefix, metadata.get(prefix[:-1], {}), True, missing, unexpected,
                                         errors)
        test.assertEqual((missing, errors), ([], []), f"version {version}")
        test.assertNotIn("conv2_offset.weight", old)
        assert_bitwise_equal(test, parent.conv2(x), source(x), f"version-{version} checkpoint")


class ModulatedDeformConv2dPackTest(unittest.TestCase):
    def _randomised(self, *args, **kwargs):
        return _randomised_pack(detops_torch.ModulatedDeformConv2dPack, *args, **kwargs)

    def test_structure_and_zero_initialised_offsets(self):
        pack = detops_torch.ModulatedDeformConv2dPack(4, 8, 3, stride=2, padding=1, deform_groups=2)
        self.assertEqual([k for k, _ in pack.named_parameters()],
                         ["weight", "bias", "conv_offset.weight", "conv_offset.bias"])
        self.assertEqual(tuple(pack.conv_offset.weight.shape), (2 * 3 * 9, 4, 3, 3))
        self.assertEqual((pack.conv_offset.stride, pack.conv_offset.padding), ((2, 2), (1, 1)))
        for p in (pack.conv_offset.weight, pack.conv_offset.bias, pack.bias):
            self.assertEqual(int((p != 0).sum()), 0)
        self.assertEqual((pack.transposed, pack.output_padding, pack._version), (False, (0,), 2))
        stdv = 1 / math.sqrt(4 * 9)
        self.assertLessEqual(float(pack.weight.abs().max()), stdv)
        x = torch.randn(2, 4, 11, 12)
        self.assertEqual(tuple(pack(x).shape), (2, 8, 6, 6))

    def test_initialisation_follows_mmcv_draws(self):
        # mmcv: weight drawn, conv_offset built (nn.Conv2d's own draws), weight drawn again.
        torch.manual_seed(3)
        pack = detops_torch.ModulatedDeformConv2dPack(4, 8, 3, padding=1)
        torch.manual_seed(3)
        stdv = 1 / math.sqrt(4 * 9)
        torch.empty(8, 4, 3, 3).uniform_(-stdv, stdv)
        torch.nn.Conv2d(4, 27, 3, padding=1)
        expected = torch.empty(8, 4, 3, 3).uniform_(-stdv, stdv)
        assert_bitwise_equal(self, pack.weight.detach(), expected, "weight")

    @unittest.skipUnless(torchvision is not None, "torchvision is not installed")
    def test_initial_output_is_a_half_masked_plain_convolution(self):
        # Zero offsets and mask sigmoid(0) = 0.5: torchvision's deform_conv2d with that split, and
        # half a plain convolution plus the bias.
        pack = self._randomised(4, 6, 3, padding=1, groups=2, deform_groups=2)
        with torch.no_grad():
            pack.conv_offset.weight.zero_()
            pack.conv_offset.bias.zero_()
        x = torch.randn(2, 4, 9, 10, dtype=torch.float64)
        out = pack(x)
        zeros = torch.zeros(2, 2 * 2 * 9, 9, 10, dtype=torch.float64)
        half = torch.full((2, 2 * 9, 9, 10), 0.5, dtype=torch.float64)
        ref = tv_deform_conv2d(x, zeros, pack.weight, pack.bias, 1, 1, 1, half)
        self.assertLessEqual(max_rel_error(out, ref), 1e-14)
        conv = 0.5 * TF.conv2d(x, pack.weight, None, 1, 1, 1, 2) + pack.bias.view(1, -1, 1, 1)
        self.assertLessEqual(max_rel_error(out, conv), 1e-14)

    def test_matches_mmcv_reference_and_torchvision_split(self):
        for args, kwargs in (((4, 6, 3), {"padding": 1}), ((4, 4, 3), {"stride": 2, "padding": 2, "dilation": 2,
                                                                         "groups": 2, "deform_groups": 2}),
                             ((4, 6, (3, 2)), {"padding": (1, 0), "deform_groups": 4, "bias": False})):
            pack = self._randomised(*args, **kwargs)
            x = torch.randn(2, args[0], 8, 9, dtype=torch.float64)
            out = pack(x)
            self.assertLessEqual(max_rel_error(out, _mmcv_pack_reference(pack, x)), 1e-13, f"{args} {kwargs}")
            if torchvision is not None:
                o1, o2, m = torch.chunk(pack.conv_offset(x), 3, dim=1)
                ref = tv_deform_conv2d(x, torch.cat((o1, o2), dim=1), pack.weight, pack.bias, pack.stride,
                                       pack.padding, pack.dilation, torch.sigmoid(m))
                self.assertLessEqual(max_rel_error(out, ref), 1e-14, f"{args} {kwargs}")

    def test_reference_detects_a_swapped_offset_convention(self):
        # Control for the test above: reading the first third as y offsets (not the even channels)
        # gives a different result, so the reference does tell the conventions apart.
        pack = self._randomised(4, 6, 3, padding=1)
        x = torch.randn(1, 4, 8, 9, dtype=torch.float64)
        o1, o2, m = torch.chunk(pack.conv_offset(x), 3, dim=1)
        planar = torch.stack((o1, o2), dim=2).flatten(1, 2)  # (y, x) pairs from the two thirds
        wrong = _mmcv_reference(x, planar, torch.sigmoid(m), pack.weight, pack.bias, pack.stride, pack.padding,
                                pack.dilation, 1, 1)
        self.assertGreater(max_rel_error(pack(x), wrong), 1e-3)

    def test_checkpoint_loads_and_gives_the_same_output(self):
        _check_checkpoints(self, detops_torch.ModulatedDeformConv2dPack)

    def test_deprecated_keyword_torchscript_and_errors(self):
        _check_deprecated_keyword_and_script(self, detops_torch.ModulatedDeformConv2dPack)
        with self.assertRaisesRegex(ValueError, "deform_groups is 0; expected a positive count"):
            detops_torch.ModulatedDeformConv2dPack(4, 6, 3, deform_groups=0)
        with self.assertRaisesRegex(ValueError, "mode"):
            detops_torch.ModulatedDeformConv2dPack(4, 6, 3, backward_mode="fast")

    def test_gradients_and_autocast(self):
        pack = self._randomised(4, 6, 3, padding=1).float()
        x = torch.randn(2, 4, 8, 9, requires_grad=True)
        pack(x).square().sum().backward()
        for name, p in pack.named_parameters():
            self.assertIsNotNone(p.grad, name)
            self.assertGreater(float(p.grad.abs().sum()), 0, name)
        self.assertGreater(float(x.grad.abs().sum()), 0)
        # mmcv casts the input, weight, bias and mask to the offset's dtype (16-bit under autocast).
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = pack(x)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertLessEqual(max_rel_error(out, pack(x)), 5e-2)


class DeformConv2dPackTest(unittest.TestCase):
    """mmcv's DCNv1 Pack (mmdetection's ``DCN``): offsets from its own conv, no mask, no bias."""

    def test_structure_and_zero_initialised_offsets(self):
        pack = detops_torch.DeformConv2dPack(4, 8, 3, stride=2, padding=1, deform_groups=2)
        self.assertEqual([k for k, _ in pack.named_parameters()], ["weight", "conv_offset.weight", "conv_offset.bias"])
        self.assertEqual(tuple(pack.conv_offset.weight.shape), (2 * 2 * 9, 4, 3, 3))
        self.assertEqual((pack.conv_offset.stride, pack.conv_offset.padding), ((2, 2), (1, 1)))
        for p in (pack.conv_offset.weight, pack.conv_offset.bias):
            self.assertEqual(int((p != 0).sum()), 0)
        self.assertEqual((pack.transposed, pack.output_padding, pack._version, pack.im2col_step), (False, (0,), 2, 32))
        self.assertEqual(tuple(pack(torch.randn(2, 4, 11, 12)).shape), (2, 8, 6, 6))

    def test_initialisation_follows_mmcv_draws(self):
        # mmcv: the weight Kaiming-uniform for ReLU, then conv_offset built (nn.Conv2d's own draws)
        # and zeroed; so the next draw after the layer is the same too.
        torch.manual_seed(3)
        pack = detops_torch.DeformConv2dPack(4, 8, 3, padding=1, groups=2)
        after = torch.rand(4)
        torch.manual_seed(3)
        expected = torch.nn.init.kaiming_uniform_(torch.empty(8, 2, 3, 3), nonlinearity="relu")
        torch.nn.Conv2d(4, 18, 3, padding=1)
        assert_bitwise_equal(self, pack.weight.detach(), expected, "weight")
        assert_bitwise_equal(self, after, torch.rand(4), "the draw after the layer")
        self.assertLessEqual(float(pack.weight.abs().max()), math.sqrt(6 / (2 * 9)))

    def test_initial_output_is_a_plain_convolution(self):
        pack = _randomised_pack(detops_torch.DeformConv2dPack, 4, 6, 3, padding=1, groups=2, deform_groups=2)
        pack.init_offset()
        x = torch.randn(2, 4, 9, 10, dtype=torch.float64)
        self.assertLessEqual(max_rel_error(pack(x), TF.conv2d(x, pack.weight, None, 1, 1, 1, 2)), 1e-14)

    def test_matches_mmcv_reference_and_torchvision(self):
        for args, kwargs in (((4, 6, 3), {"padding": 1}), ((4, 4, 3), {"stride": 2, "padding": 2, "dilation": 2,
                                                                         "groups": 2, "deform_groups": 2}),
                             ((4, 6, (3, 2)), {"padding": (1, 0), "deform_groups": 4})):
            pack = _randomised_pack(detops_torch.DeformConv2dPack, *args, **kwargs)
            x = torch.randn(2, args[0], 8, 9, dtype=torch.float64)
            out = pack(x)
            offset = pack.conv_offset(x)
            ones = torch.ones(offset.shape[0], offset.shape[1] // 2, *offset.shape[2:], dtype=torch.float64)
            ref = _mmcv_reference(x, offset, ones, pack.weight, None, pack.stride, pack.padding, pack.dilation,
                                  pack.groups, pack.deform_groups)
            self.assertLessEqual(max_rel_error(out, ref), 1e-13, f"{args} {kwargs}")
            if torchvision is not None:
                ref = tv_deform_conv2d(x, offset, pack.weight, None, pack.stride, pack.padding, pack.dilation)
                self.assertLessEqual(max_rel_error(out, ref), 1e-14, f"{args} {kwargs}")

    def test_checkpoint_loads_and_gives_the_same_output(self):
        _check_checkpoints(self, detops_torch.DeformConv2dPack)

    def test_deprecated_keyword_torchscript_and_errors(self):
        _check_deprecated_keyword_and_script(self, detops_torch.DeformConv2dPack)
        # mmcv asserts these: AssertionError (and detops' DetopsError), with mmcv's words
        with self.assertRaisesRegex(AssertionError, r"DeformConv2dPack: bias=True is not supported in DeformConv2d"):
            detops_torch.DeformConv2dPack(4, 6, 3, bias=True)
        with self.assertRaisesRegex(detops_torch.DetopsError, "deform_groups is -1; expected a positive count"):
            detops_torch.DeformConv2dPack(4, 6, 3, deform_groups=-1)
        with self.assertRaisesRegex(AssertionError, "out_channels 6 cannot be divisible by groups 4"):
            detops_torch.DeformConv2dPack(4, 6, 3, groups=4)
        with self.assertRaisesRegex(ValueError, "mode"):
            detops_torch.DeformConv2dPack(4, 6, 3, backward_mode="fast")

    def test_gradients_reproducibility_and_autocast(self):
        pack = _randomised_pack(detops_torch.DeformConv2dPack, 4, 6, 3, padding=1).float()
        x = torch.randn(2, 4, 8, 9)

        def grads():
            pack.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            pack(xi).square().sum().backward()
            return [xi.grad] + [p.grad for _, p in pack.named_parameters()]

        first = grads()
        for name, g in zip(["input"] + [k for k, _ in pack.named_parameters()], first):
            self.assertIsNotNone(g, name)
            self.assertGreater(float(g.abs().sum()), 0, name)
        for a, b in zip(first, grads()):
            assert_bitwise_equal(self, a, b, "exact mode, second run")
        # mmcv casts the input and weight to the offset's dtype (16-bit under autocast).
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = pack(x)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertLessEqual(max_rel_error(out, pack(x)), 5e-2)


@unittest.skipUnless(torchvision is not None, "torchvision is not installed")
class MmcvPlainLayersTest(unittest.TestCase):
    """compat.DeformConv2d and compat.ModulatedDeformConv2d: mmcv's layers that take the offset
    (and mask) as arguments."""

    def _inputs(self, layer, h, w, seed=11):
        gen = torch.Generator().manual_seed(seed)
        kh, kw = layer.kernel_size
        ho = (h + 2 * layer.padding[0] - layer.dilation[0] * (kh - 1) - 1) // layer.stride[0] + 1
        wo = (w + 2 * layer.padding[1] - layer.dilation[1] * (kw - 1) - 1) // layer.stride[1] + 1
        x = torch.randn(2, layer.in_channels, h, w, generator=gen, dtype=torch.float64)
        taps = layer.deform_groups * kh * kw
        offset = 1.5 * torch.randn(2, 2 * taps, ho, wo, generator=gen, dtype=torch.float64)
        mask = torch.rand(2, taps, ho, wo, generator=gen, dtype=torch.float64)
        return x, offset, mask

    def test_deform_conv2d_matches_torchvision(self):
        for kwargs in ({"padding": 1}, {"stride": 2, "padding": 2, "dilation": 2, "groups": 2, "deform_groups": 2}):
            layer = compat.DeformConv2d(4, 6, 3, **kwargs).double()
            x, offset, _ = self._inputs(layer, 8, 9)
            ref = tv_deform_conv2d(x, offset, layer.weight, None, layer.stride, layer.padding, layer.dilation)
            self.assertLessEqual(max_rel_error(layer(x, offset), ref), 1e-14, kwargs)

    def test_deform_conv2d_pads_an_input_smaller_than_the_kernel(self):
        # mmcv pads such an input (and the offset) with zeros at the bottom and right and crops the
        # output back: the same values as no padding, since samples outside the map read zeros.
        layer = compat.DeformConv2d(4, 6, (3, 5), padding=1).double()
        x, offset, _ = self._inputs(layer, 2, 4)
        self.assertEqual(tuple(offset.shape[2:]), (2, 2))
        out = layer(x, offset)
        self.assertEqual(tuple(out.shape), (2, 6, 2, 2))
        ref = tv_deform_conv2d(x, offset, layer.weight, None, layer.stride, layer.padding, layer.dilation)
        self.assertLessEqual(max_rel_error(out, ref), 1e-14)
        self.assertTrue(out.is_contiguous())

    def test_modulated_deform_conv2d_matches_torchvision(self):
        for kwargs in ({"padding": 1}, {"padding": 1, "groups": 2, "deform_groups": 2, "bias": False}):
            layer = compat.ModulatedDeformConv2d(4, 6, 3, **kwargs).double()
            with torch.no_grad():
                if layer.bias is not None:
                    layer.bias.normal_()
            x, offset, mask = self._inputs(layer, 8, 9)
            ref = tv_deform_conv2d(x, offset, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                                   mask)
            self.assertLessEqual(max_rel_error(layer(x, offset, mask), ref), 1e-14, kwargs)

    def test_initialisation_follows_mmcv_draws(self):
        torch.manual_seed(4)
        v1, v2 = compat.DeformConv2d(4, 8, 3, groups=2), compat.ModulatedDeformConv2d(4, 8, 3, groups=2)
        torch.manual_seed(4)
        expected_v1 = torch.nn.init.kaiming_uniform_(torch.empty(8, 2, 3, 3), nonlinearity="relu")
        stdv = 1 / math.sqrt(4 * 9)
        expected_v2 = torch.empty(8, 2, 3, 3).uniform_(-stdv, stdv)
        assert_bitwise_equal(self, v1.weight.detach(), expected_v1, "DeformConv2d weight")
        assert_bitwise_equal(self, v2.weight.detach(), expected_v2, "ModulatedDeformConv2d weight")
        self.assertEqual(int((v2.bias != 0).sum()), 0)

    def test_script_gradients_and_errors(self):
        layer = compat.DeformConv2d(4, 6, 3, padding=1, backward_mode="atomic")
        x, offset, mask = (t.float() for t in self._inputs(layer, 8, 9))
        assert_bitwise_equal(self, torch.jit.script(layer)(x, offset), layer(x, offset), "scripted DeformConv2d")
        mod = compat.ModulatedDeformConv2d(4, 6, 3, padding=1)
        assert_bitwise_equal(self, torch.jit.script(mod)(x, offset, mask), mod(x, offset, mask),
                             "scripted ModulatedDeformConv2d")
        offset.requires_grad_()
        mask.requires_grad_()
        mod(x, offset, mask).square().sum().backward()
        for name, g in (("offset", offset.grad), ("mask", mask.grad), ("weight", mod.weight.grad)):
            self.assertGreater(float(g.abs().sum()), 0, name)
        with self.assertRaisesRegex(ValueError, "DeformConv2d: bias=True is not supported"):
            compat.DeformConv2d(4, 6, 3, bias=True)
        compat.ModulatedDeformConv2d(4, 6, 3, deform_groups=3)  # built as mmcv builds it; refused when run


class MetaAndScriptTest(unittest.TestCase):
    def test_meta_tensors(self):
        x = torch.empty(2, 4, 9, 10, device="meta", dtype=torch.float16)
        w = torch.empty(6, 2, 3, 3, device="meta", dtype=torch.float16)
        off = torch.empty(2, 36, 5, 5, device="meta", dtype=torch.float16)
        mask = torch.empty(2, 18, 5, 5, device="meta", dtype=torch.float16)
        out = torch.ops.detops.deform_conv2d(x, w, off, mask, None, 2, 2, 1, 1, 1, 1, 2, 2, True, "atomic")
        self.assertEqual((out.device.type, tuple(out.shape), out.dtype), ("meta", (2, 6, 5, 5), torch.float16))
        out = torch.ops.detops.deform_conv2d(x.contiguous(memory_format=torch.channels_last), w, off, None, None, 2, 2,
                                             1, 1, 1, 1, 2, 2, False)
        self.assertTrue(out.is_contiguous(memory_format=torch.channels_last))
        grads = torch.ops.detops._deform_conv2d_backward(torch.empty(2, 6, 5, 5, device="meta"), x, w, off, mask, 2,
                                                         2, 1, 1, 1, 1, 2, 2, "exact", "mmcv", True, True, True, True, True)
        self.assertEqual([tuple(g.shape) for g in grads], [(2, 4, 9, 10), (6, 2, 3, 3), (2, 36, 5, 5),
                                                           (2, 18, 5, 5), (6,)])
        with self.assertRaisesRegex(ValueError, "mode"):
            torch.ops.detops.deform_conv2d(x, w, off, mask, None, 2, 2, 1, 1, 1, 1, 2, 2, True, "truncated")
        with self.assertRaisesRegex(ValueError, "device|meta"):
            torch.ops.detops.deform_conv2d(torch.zeros(2, 4, 9, 10), w, off, mask, None, 2, 2, 1, 1, 1, 1, 2, 2, True)

    def test_torchscript(self):
        def op_call(x: torch.Tensor, o: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            return torch.ops.detops.deform_conv2d(x, w, o, m, None, 1, 1, 1, 1, 1, 1, 1, 1, True, "exact")

        scripted = torch.jit.script(op_call)
        x, offset, weight, _, mask, _ = _case(80)
        assert_bitwise_equal(self, scripted(x, offset, weight, mask), op_call(x, offset, weight, mask), "scripted")
        self.assertIn("detops::deform_conv2d", str(scripted.graph))
        scripted_fn = torch.jit.script(deform_conv2d_functional._deform_conv2d)
        assert_bitwise_equal(self, scripted_fn(x, offset, weight, None, (1, 1), (1, 1), (1, 1), mask, "atomic"),
                             detops_torch.deform_conv2d(x, offset, weight, None, 1, 1, 1, mask, backward_mode="atomic"),
                             "scripted positional form")

    def test_functional_scripts_as_torchvisions(self):
        # torch.jit.script(torchvision.ops.deform_conv2d) works; so must detops' (issue 27), its
        # options (and the deprecated `mode`) given positionally or by keyword.
        x, offset, weight, _, mask, _ = _case(81)
        expected = detops_torch.deform_conv2d(x, offset, weight, None, (1, 1), (1, 1), (1, 1), mask)
        scripted = torch.jit.script(detops_torch.deform_conv2d)
        assert_bitwise_equal(self, scripted(x, offset, weight, None, (1, 1), (1, 1), (1, 1), mask, "atomic"),
                             expected, "scripted function")

        def user(x: torch.Tensor, o: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            return detops_torch.deform_conv2d(x, o, w, padding=(1, 1), mask=m, mode="atomic")

        assert_bitwise_equal(self, torch.jit.script(user)(x, offset, weight, mask), expected, "scripted caller")
        with self.assertWarns(DeprecationWarning):  # eager `mode` still works, with its warning
            assert_bitwise_equal(self, user(x, offset, weight, mask), expected, "eager caller")

    def test_fx_symbolic_trace(self):
        # The module's call is a leaf of the graph (its shape inference and autocast check would
        # otherwise branch on proxies).
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.dcn = detops_torch.DeformConv2d(4, 6, 3, padding=1)

            def forward(self, x, o, m):
                return self.dcn(x * 2.0, o, m)

        net = Net()
        traced = torch.fx.symbolic_trace(net)
        x, offset, _, _, mask, _ = _case(83, dtype=torch.float32)
        assert_bitwise_equal(self, traced(x, offset, mask), net(x, offset, mask), "traced")

    @unittest.skipUnless(TORCH_2_1 and hasattr(torch.library, "opcheck"), "torch.library.opcheck needs torch >= 2.1")
    def test_opcheck(self):
        x, offset, weight, bias, mask, _ = _case(81, n=1, cin=2, cout=2, h=5, w=5)
        for dev in ["cpu"] + (["cuda"] if HAS_CUDA else []):
            for mode in F.GATHER_BACKWARD_MODES:
                t = [v.to(dev).requires_grad_(True) for v in (x, weight, offset, mask, bias)]
                torch.library.opcheck(torch.ops.detops.deform_conv2d.default,
                                      (*t, 1, 1, 1, 1, 1, 1, 1, 1, True, mode))

    @unittest.skipUnless(TORCH_2_1, "torch.compile over custom ops needs torch >= 2.1")
    def test_torch_compile_fullgraph(self):
        x, offset, weight, bias, mask, _ = _case(82)

        def fn(x_, o_, w_, b_, m_):
            return detops_torch.deform_conv2d(x_ * 2.0, o_, w_, b_, padding=1, mask=m_).square().sum()

        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        one = torch.tensor(1.0, dtype=x.dtype)
        eager = _run(fn, x, offset, weight, bias, mask, one)
        ours = _run(compiled, x, offset, weight, bias, mask, one)
        for what, a, b in zip(("loss",) + NAMES[1:], ours, eager):
            assert_bitwise_equal(self, a, b, f"compiled {what}")


class NonFiniteOffsetTest(unittest.TestCase):
    def test_nan_offset_shows_and_infinity_samples_nothing(self):
        # A NaN offset makes its sample NaN: the output at that position (every output channel),
        # grad_weight at that tap, grad_mask and both grad_offset entries of that sample; nothing
        # reaches grad_input. (torchvision's kernels cast floor(NaN) to an integer, undefined:
        # they return NaN, or crash, depending on the other coordinate.) An infinite offset
        # samples nothing, as torchvision's.
        x, offset, weight, bias, mask, grad = _case(120, n=1, h=5, w=6)
        offset[0, 0, 1, 1] = float("nan")  # tap 0's y at position (1, 1)
        offset[0, 5, 2, 3] = float("inf")  # tap 2's x at (2, 3)
        offset[0, 6, 3, 3] = -float("inf")  # tap 3's y at (3, 3)
        for mode in F.GATHER_BACKWARD_MODES:
            with self.subTest(mode=mode):
                out, gi, goff, gw, gm, gb = _run(_detops(mode=mode), x, offset, weight, bias, mask, grad)
                nan_out = torch.zeros_like(out, dtype=torch.bool)
                nan_out[:, :, 1, 1] = True
                self.assertTrue(torch.equal(out.isnan(), nan_out))
                self.assertTrue(bool(gi.isfinite().all()) and bool(gb.isfinite().all()))
                nan_off = torch.zeros_like(goff, dtype=torch.bool)
                nan_off[0, 0:2, 1, 1] = True
                self.assertTrue(torch.equal(goff.isnan(), nan_off))
                nan_mask = torch.zeros_like(gm, dtype=torch.bool)
                nan_mask[0, 0, 1, 1] = True
                self.assertTrue(torch.equal(gm.isnan(), nan_mask))
                nan_w = torch.zeros_like(gw, dtype=torch.bool)
                nan_w[:, :, 0, 0] = True
                self.assertTrue(torch.equal(gw.isnan(), nan_w))


class BorderRuleTest(unittest.TestCase):
    """The offset gradient of a sample at exactly -1: torchvision's one-sided derivative, or 0 as
    mmcv's and detectron2's kernels give (border_rule="mmcv", what mmcv's stand-ins use). A fresh
    mmcv layer (zero offsets) with padding puts every border tap there."""

    @staticmethod
    def _fresh(seed, rule, mode="exact"):
        x, offset, weight, bias, mask, grad = _case(seed, h=5, w=6)
        offset = torch.zeros_like(offset).requires_grad_(True)
        x, weight, bias, mask = (t.requires_grad_(True) for t in (x, weight, bias, mask))
        out = detops_torch.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask, backward_mode=mode,
                                         border_rule=rule)
        out.backward(grad)
        return out, x.grad, offset.grad, weight.grad, mask.grad, bias.grad

    @staticmethod
    def _border(offset_grad, h=5, w=6):
        """Which entries of a 3x3, padding-1 layer's offset gradient belong to taps outside the map
        (row or column -1 or H / W), as a bool tensor shaped like it."""
        taps = offset_grad.shape[1] // 2
        ho = torch.arange(offset_grad.shape[2]).view(1, -1, 1)
        wo = torch.arange(offset_grad.shape[3]).view(1, 1, -1)
        t = torch.arange(taps).view(-1, 1, 1) % 9
        y, x = ho - 1 + t // 3, wo - 1 + t % 3
        out = (y <= -1) | (y >= h) | (x <= -1) | (x >= w)
        return out.repeat_interleave(2, dim=0).unsqueeze(0).expand_as(offset_grad)

    def test_mmcv_rule_zeroes_border_taps_only(self):
        for mode in F.GATHER_BACKWARD_MODES:
            with self.subTest(mode=mode):
                tv = self._fresh(110, "torchvision", mode)
                mm = self._fresh(110, "mmcv", mode)
                for name, a, b in zip(NAMES, tv, mm):
                    if name != "grad_offset":
                        assert_bitwise_equal(self, b, a, name)
                border = self._border(tv[2])
                self.assertTrue(bool((mm[2][border] == 0).all()))
                self.assertGreater(int((tv[2][border] != 0).sum()), border.sum().item() // 5)
                assert_bitwise_equal(self, mm[2][~border], tv[2][~border], "grad_offset inside")

    def test_torchvision_rule_is_the_default_and_matches_torchvision(self):
        default = self._fresh(111, "torchvision")
        x, offset, weight, bias, mask, grad = _case(111, h=5, w=6)
        x2 = x.detach().requires_grad_(True)
        plain = detops_torch.deform_conv2d(x2, torch.zeros_like(offset), weight, bias, padding=1, mask=mask)
        assert_bitwise_equal(self, plain, default[0], "output")
        if torchvision is not None:
            off = torch.zeros_like(offset).requires_grad_(True)
            tv_deform_conv2d(x, off, weight, bias, padding=1, mask=mask).backward(grad)
            self.assertLessEqual(max_rel_error(default[2], off.grad), 1e-14)

    def _pack_gradients(self, cls, reference):
        """A fresh Pack (mmcv's zero offset conv) with padding: the offset conv's gradients against
        autograd through the float64 mmcv reference (whose samples outside -1 < y < H,
        -1 < x < W are exactly 0, mmcv's rule)."""
        torch.manual_seed(112)
        pack = cls(4, 6, 3, padding=1).double()
        with torch.no_grad():
            pack.weight.normal_()
        x = torch.randn(2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
        pack(x).square().sum().backward()
        got = [p.grad.clone() for p in pack.conv_offset.parameters()] + [x.grad.clone()]
        for p in list(pack.parameters()) + [x]:
            p.grad = None
        reference(pack, x).square().sum().backward()
        want = [p.grad for p in pack.conv_offset.parameters()] + [x.grad]
        for g, w in zip(got, want):
            self.assertLessEqual(max_rel_error(g, w), 1e-12)
        self.assertGreater(pack.conv_offset.bias.grad.abs().max().item(), 0)
        return got

    def test_modulated_pack_follows_mmcv_rule(self):
        self._pack_gradients(detops_torch.ModulatedDeformConv2dPack, _mmcv_pack_reference)

    def test_dcn_v1_pack_follows_mmcv_rule(self):
        def reference(pack, x):
            offset = TF.conv2d(x, pack.conv_offset.weight, pack.conv_offset.bias, pack.stride, pack.padding,
                               pack.dilation)
            ones = torch.ones(x.shape[0], offset.shape[1] // 2, *offset.shape[2:], dtype=torch.float64)
            return _mmcv_reference(x, offset, ones, pack.weight, None, pack.stride, pack.padding, pack.dilation,
                                   pack.groups, pack.deform_groups)
        self._pack_gradients(detops_torch.DeformConv2dPack, reference)

    def test_compat_layers_follow_mmcv_rule(self):
        x, offset, weight, bias, mask, grad = _case(113, h=5, w=6)
        zero = torch.zeros_like(offset)
        for layer, args in ((compat.ModulatedDeformConv2d(4, 6, 3, padding=1), (mask,)),
                            (compat.DeformConv2d(4, 6, 3, padding=1), ())):
            with self.subTest(layer=type(layer).__name__):
                layer = layer.double()
                off = zero.clone().requires_grad_(True)
                layer(x, off, *args).backward(grad)
                border = self._border(off.grad)
                self.assertTrue(bool((off.grad[border] == 0).all()))
                ref = zero.clone().requires_grad_(True)
                layer_bias = getattr(layer, "bias", None)
                detops_torch.deform_conv2d(x, ref, layer.weight, layer_bias, padding=1, mask=args[0] if args else None,
                                           border_rule="mmcv").backward(grad)
                assert_bitwise_equal(self, off.grad, ref.grad, "grad_offset")

    def test_torchvision_module_keeps_torchvision_rule(self):
        x, offset, weight, bias, mask, grad = _case(114, h=5, w=6)
        m = detops_torch.DeformConv2d(4, 6, 3, padding=1).double()
        off = torch.zeros_like(offset).requires_grad_(True)
        m(x, off, mask).backward(grad)
        self.assertGreater(int((off.grad[self._border(off.grad)] != 0).sum()), 0)

    def test_mmcv_layers_refuse_indivisible_deform_groups_in_the_forward(self):
        # mmcv builds (and loads) such a layer and refuses it when run.
        for cls, args in ((detops_torch.DeformConv2dPack, ()), (detops_torch.ModulatedDeformConv2dPack, ()),
                          (compat.DeformConv2d, ("offset",)), (compat.ModulatedDeformConv2d, ("offset", "mask"))):
            with self.subTest(cls=cls.__name__):
                layer = cls(6, 4, 3, padding=1, deform_groups=4)
                x = torch.randn(1, 6, 5, 5)
                extra = {"offset": torch.zeros(1, 2 * 4 * 9, 5, 5), "mask": torch.ones(1, 4 * 9, 5, 5)}
                # mmcv's RuntimeError and words (DetopsError is both a ValueError and a RuntimeError)
                with self.assertRaisesRegex(RuntimeError, "input channels must divide deformable group size"):
                    layer(x, *(extra[a] for a in args))


class BadInputTest(unittest.TestCase):
    def _raises(self, pattern, fn, *tensors):
        assert_raises_untouched(self, pattern, fn, *tensors)

    def test_shapes_dtypes_and_options(self):
        x, offset, weight, bias, mask, _ = _case(90, dtype=torch.float32)
        dc = detops_torch.deform_conv2d
        op = torch.ops.detops.deform_conv2d
        cases = [
            (r"input.*\[N, Cin, H, W\]", lambda: dc(x[0], offset, weight, bias, padding=1, mask=mask)),
            (r"weight.*\[Cout, Cin / groups, kh, kw\]", lambda: dc(x, offset, weight[0], bias, padding=1)),
            (r"offset.*2 \* kh \* kw = 18", lambda: dc(x, offset[:, :17], weight, bias, padding=1)),
            ("offset.*sizes", lambda: dc(x, offset[:, :, :6], weight, bias, padding=1)),  # Ho does not match
            ("mask.*sizes", lambda: dc(x, offset, weight, bias, padding=1, mask=mask[:, :8])),
            ("bias.*sizes", lambda: dc(x, offset, weight, bias[:5], padding=1)),
            ("weight.*dtype", lambda: dc(x, offset, weight.double(), bias, padding=1)),
            ("mask.*dtype", lambda: dc(x, offset, weight, bias, padding=1, mask=mask.half())),
            ("dtype", lambda: dc(x.long(), offset.long(), weight.long(), None, padding=1)),
            ("weight.*dividing Cin", lambda: dc(x, offset, weight[:, :3], bias, padding=1)),
            ("stride.*positive", lambda: dc(x, offset, weight, bias, stride=0, padding=1)),
            ("dilation.*positive", lambda: dc(x, offset, weight, bias, dilation=(1, -1), padding=1)),
            ("padding.*>= 0", lambda: dc(x, offset, weight, bias, padding=-1)),
            ("no output position", lambda: dc(x[:, :, :1], offset, weight, bias)),
            ("mode.*'truncated'", lambda: dc(x, offset, weight, bias, padding=1, backward_mode="truncated")),
            ("mode.*'Exact'", lambda: op(x, weight, offset, mask, bias, 1, 1, 1, 1, 1, 1, 1, 1, True, "Exact")),
            ("border_rule is 'detectron2'; expected one of 'torchvision', 'mmcv'",
             lambda: dc(x, offset, weight, bias, padding=1, border_rule="detectron2")),
            ("groups is 2", lambda: op(x, weight, offset, mask, bias, 1, 1, 1, 1, 1, 1, 2, 1, True)),
            ("offset_groups is 2", lambda: op(x, weight, offset, mask, bias, 1, 1, 1, 1, 1, 1, 1, 2, True)),
            ("use_mask is True but mask is None", lambda: op(x, weight, offset, None, bias, 1, 1, 1, 1, 1, 1, 1, 1,
                                                             True)),
        ]
        for pattern, fn in cases:
            with self.subTest(pattern=pattern):
                self._raises(pattern, fn, x, offset, weight, bias, mask)

    def test_bad_mode_fails_in_the_forward(self):
        x, offset, weight, bias, mask, _ = _case(91)
        x.requires_grad_(True)
        with self.assertRaisesRegex(ValueError, "mode"):
            torch.ops.detops.deform_conv2d(x, weight, offset, mask, bias, 1, 1, 1, 1, 1, 1, 1, 1, True, "fast")
        self.assertIsNone(x.grad)

    def test_option_arithmetic_that_overflows_is_an_error(self):
        # The binding sizes the output itself before detops' checks: with pad_h = 2**62 its
        # H + 2 * pad_h once wrapped (undefined behaviour) below the kernel's extent, and the error
        # blamed a too-small input. Both the op and the backward op refuse, naming the values given.
        x, offset, weight, bias, mask, _ = _case(93)
        big = 2**63 - 1
        ops = torch.ops.detops
        cases = [
            (r"padding is \(4611686018427387904, 1\)", (1, 1, 2**62, 1, 1, 1)),
            (r"dilation is \(1, 9223372036854775807\)", (1, 1, 1, 1, 1, big)),
        ]
        for pattern, (sh, sw, ph, pw, dh, dw) in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(ValueError, pattern):
                    ops.deform_conv2d(x, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, 1, 1, True)
                grad = torch.ones(2, weight.shape[0], offset.shape[2], offset.shape[3], dtype=x.dtype)
                with self.assertRaisesRegex(ValueError, pattern):
                    ops._deform_conv2d_backward(grad, x, weight, offset, mask, sh, sw, ph, pw, dh, dw, 1, 1,
                                                "exact", "torchvision", True, True, True, True, True)

    def test_use_mask_false_ignores_the_mask(self):
        # torchvision's Python passes an empty [N, 0] mask with use_mask=False.
        x, offset, weight, bias, _, _ = _case(92, mask=False)
        empty = torch.zeros(2, 0, dtype=x.dtype)
        got = torch.ops.detops.deform_conv2d(x, weight, offset, empty, bias, 1, 1, 1, 1, 1, 1, 1, 1, False)
        ref = detops_torch.deform_conv2d(x, offset, weight, bias, padding=1)
        assert_bitwise_equal(self, got, ref, "use_mask=False")


@unittest.skipUnless(HAS_CUDA, "CUDA is not available")
class CudaTest(unittest.TestCase):
    def test_cuda_matches_cpu_bitwise(self):
        # detops' header: forward and every gradient bitwise equal on the CPU and CUDA in exact
        # mode; in atomic mode everything but grad_input.
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            for name, opts in CONFIGS:
                case = _case(100, dtype=dtype, **opts)
                geometry = _geometry(opts)
                for mode in F.GATHER_BACKWARD_MODES:
                    cpu = _run(_detops(mode=mode, **geometry), *case)
                    cuda = _run(_detops(mode=mode, **geometry), *[t if t is None else t.cuda() for t in case])
                    for what, a, b in zip(NAMES, cuda, cpu):
                        if b is None:
                            continue
                        if mode == "atomic" and what == "grad_input":
                            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
                            self.assertLessEqual(max_rel_error(a.cpu(), b), tol, f"{what} {dtype} {name}")
                        else:
                            assert_bitwise_equal(self, a.cpu(), b, f"{what} {dtype} {name} {mode}")

    def test_exact_is_reproducible_on_cuda(self):
        case = [t.cuda() for t in _case(101, dtype=torch.float32, cin=32, cout=32, h=24, w=24, spread=6.0)]
        hashes = {tensor_hash(*_run(_detops(), *case)) for _ in range(3)}
        self.assertEqual(len(hashes), 1)

    def test_atomic_mode_raises_the_nondeterminism_alert(self):
        x, offset, weight, bias, mask, _ = [t.cuda() for t in _case(102, dtype=torch.float32)]
        x.requires_grad_(True)
        out = detops_torch.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask, backward_mode="atomic")
        old = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            with self.assertRaisesRegex(RuntimeError, "atomic"):
                out.sum().backward()
            x.grad = None
            detops_torch.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask).sum().backward()  # exact
        finally:
            torch.use_deterministic_algorithms(old)

    def test_modules_on_cuda(self):
        for cls in (detops_torch.ModulatedDeformConv2dPack, detops_torch.DeformConv2dPack):
            pack = cls(8, 8, 3, padding=1).cuda()
            x = torch.randn(2, 8, 16, 16, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                out = pack(x)
            self.assertEqual(out.dtype, torch.float16, cls.__name__)
            out.float().sum().backward()
            self.assertIsNotNone(pack.conv_offset.weight.grad, cls.__name__)


if __name__ == "__main__":
    unittest.main()
