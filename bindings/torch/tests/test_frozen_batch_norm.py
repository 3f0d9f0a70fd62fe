# Tests of detops_torch's FrozenBatchNorm2d: the ops (fold, epilogues, gradients, errors) and the module (torchvision/detectron2 checkpoints, fold cache, convert_frozen_batchnorm).
import collections
import copy
import unittest

import torch
from torch import nn

import detops_torch
from detops_torch import compat
from _util import (TORCH_2_1, assert_bitwise_equal, max_rel_error, num_threads, tensor_bytes, tensor_hash)

try:
    import torchvision
    from torchvision.ops import FrozenBatchNorm2d as TvFrozenBatchNorm2d
except ImportError:  # pragma: no cover
    torchvision = None

needs_torchvision = unittest.skipUnless(torchvision is not None, "torchvision is not installed")
KEYS = ["weight", "bias", "running_mean", "running_var"]


def _randomize(module, seed, dtype=None):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, (lo, hi) in zip(KEYS, ((0.5, 1.5), (-0.5, 0.5), (-0.3, 0.3), (0.2, 2.0))):
            buf = getattr(module, name)
            buf.copy_(torch.rand(buf.shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo)
    return module if dtype is None else module.to(dtype)


def _x(seed, dtype=torch.float64, shape=(2, 6, 5, 7)):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _fold(m, dtype=torch.float64):
    return torch.ops.detops.frozen_batch_norm_fold(*(getattr(m, k).to(dtype) for k in KEYS), float(m.eps))


class FrozenBatchNormOpTest(unittest.TestCase):
    def test_fold_is_the_documented_formula(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 1, torch.float64)
        scale, shift = _fold(m)
        self.assertEqual((scale.dtype, shift.dtype), (torch.float64, torch.float64))
        # weight * (1 / sqrt(running_var + eps)): IEEE operations, so torch's evaluation has the same bits
        assert_bitwise_equal(self, scale, m.weight * (1 / torch.sqrt(m.running_var + m.eps)), "scale")
        assert_bitwise_equal(self, shift, m.bias - m.running_mean * scale, "shift = bias - mean * scale")
        s32, _ = _fold(m, torch.float32)
        self.assertEqual(s32.dtype, torch.float32)  # float32 (and 16-bit) data fold in float32
        self.assertFalse(scale.requires_grad or shift.requires_grad)

    def test_epilogues_match_the_elementwise_definition(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 2, torch.float64)
        scale, shift = _fold(m)
        x, r = _x(3), _x(4)
        affine = x * scale[:, None, None] + shift[:, None, None]
        cases = {"none": (None, affine), "relu": (None, torch.relu(affine)), "add_relu": (r, torch.relu(affine + r))}
        for epilogue, (residual, ref) in cases.items():
            for fmt in (torch.contiguous_format, torch.channels_last):
                xi = x.contiguous(memory_format=fmt)
                ri = None if residual is None else residual.contiguous(memory_format=fmt)
                y = detops_torch.functional.frozen_batch_norm(xi, scale, shift, epilogue, ri)
                self.assertTrue(y.is_contiguous(memory_format=fmt), f"{epilogue} keeps the memory format")
                assert_bitwise_equal(self, y, ref, f"{epilogue} {fmt}")

    def test_gradcheck_every_epilogue(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(3), 5, torch.float64)
        scale, shift = _fold(m)
        x = _x(6, shape=(2, 3, 3, 4)).requires_grad_(True)
        r = _x(7, shape=(2, 3, 3, 4)).requires_grad_(True)
        for epilogue in ("none", "relu"):
            fn = lambda t: detops_torch.functional.frozen_batch_norm(t, scale, shift, epilogue)  # noqa: E731
            self.assertTrue(torch.autograd.gradcheck(fn, (x,)), epilogue)
        fn = lambda t, u: detops_torch.functional.frozen_batch_norm(t, scale, shift, "add_relu", u)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(fn, (x, r)), "add_relu")

    def test_scale_and_shift_are_frozen(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 8, torch.float64)
        scale, shift = _fold(m)
        x = _x(9)
        for s, t in ((scale.clone().requires_grad_(True), shift), (scale, shift.clone().requires_grad_(True))):
            with self.assertRaisesRegex(ValueError, "frozen"):
                detops_torch.functional.frozen_batch_norm(x, s, t)

    def test_bad_input_raises_value_error_and_writes_nothing(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 10, torch.float64)
        scale, shift = _fold(m)
        x, r = _x(11), _x(12)
        bad_var = m.running_var.clone()
        bad_var[2] = -1.0
        cases = [
            ("epilogue", lambda: detops_torch.functional.frozen_batch_norm(x, scale, shift, "gelu")),
            ("residual", lambda: detops_torch.functional.frozen_batch_norm(x, scale, shift, "add_relu")),
            ("residual", lambda: detops_torch.functional.frozen_batch_norm(x, scale, shift, "relu", r)),
            ("scale", lambda: detops_torch.functional.frozen_batch_norm(x, scale[:5], shift)),
            ("dtype", lambda: detops_torch.functional.frozen_batch_norm(x.long(), scale, shift)),
            ("residual", lambda: detops_torch.functional.frozen_batch_norm(x, scale, shift, "add_relu", r[:1])),
            ("running_var", lambda: torch.ops.detops.frozen_batch_norm_fold(m.weight, m.bias, m.running_mean,
                                                                            bad_var, 1e-5)),
            ("eps", lambda: torch.ops.detops.frozen_batch_norm_fold(m.weight, m.bias, m.running_mean,
                                                                    m.running_var, -1.0)),
        ]
        tensors = (x, r, scale, shift, bad_var)
        before = [tensor_bytes(t) for t in tensors]
        for pattern, fn in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(ValueError, pattern):
                    fn()
        self.assertEqual([tensor_bytes(t) for t in tensors], before)

    def test_meta_tensors(self):
        x = torch.empty(2, 6, 5, 7, device="meta", dtype=torch.float16)
        s = torch.empty(6, device="meta")
        y = detops_torch.functional.frozen_batch_norm(x, s, s, "add_relu", x)
        self.assertEqual((y.device.type, tuple(y.shape), y.dtype), ("meta", (2, 6, 5, 7), torch.float16))
        gx, gr = torch.ops.detops._frozen_batch_norm_backward(x, s, "add_relu", x)
        self.assertEqual((tuple(gx.shape), tuple(gr.shape)), ((2, 6, 5, 7), (2, 6, 5, 7)))

    def test_torchscript(self):
        def f(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
            return torch.ops.detops.frozen_batch_norm(x, scale, shift, "relu", None)

        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 13, torch.float64)
        scale, shift = _fold(m)
        x = _x(14)
        assert_bitwise_equal(self, torch.jit.script(f)(x, scale, shift), f(x, scale, shift), "scripted")

    @unittest.skipUnless(TORCH_2_1 and hasattr(torch.library, "opcheck"), "torch.library.opcheck needs torch >= 2.1")
    def test_opcheck(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 15, torch.float64)
        scale, shift = _fold(m)
        x, r = _x(16).requires_grad_(True), _x(17).requires_grad_(True)
        torch.library.opcheck(torch.ops.detops.frozen_batch_norm.default, (x, scale, shift, "add_relu", r))
        torch.library.opcheck(torch.ops.detops.frozen_batch_norm_fold.default,
                              tuple(getattr(m, k) for k in KEYS) + (1e-5,))


class FrozenBatchNormModuleTest(unittest.TestCase):
    @needs_torchvision
    def test_matches_torchvision(self):
        for dtype, tol in ((torch.float64, 1e-15), (torch.float32, 1e-6)):
            tv = _randomize(TvFrozenBatchNorm2d(6), 20).to(dtype)
            ours = detops_torch.FrozenBatchNorm2d(6)
            ours.load_state_dict(tv.state_dict())
            ours = ours.to(dtype)
            for fmt in (torch.contiguous_format, torch.channels_last):
                x = _x(21, dtype).contiguous(memory_format=fmt).requires_grad_(True)
                xt = x.detach().clone().requires_grad_(True)
                y, yt = ours(x), tv(xt)
                self.assertEqual(y.dtype, dtype)
                self.assertTrue(y.is_contiguous(memory_format=fmt))
                self.assertLessEqual(max_rel_error(y, yt), tol, f"{dtype} {fmt}")
                g = _x(22, dtype)
                y.backward(g)
                yt.backward(g)
                self.assertLessEqual(max_rel_error(x.grad, xt.grad), tol, f"grad {dtype} {fmt}")
        self.assertEqual(list(ours.parameters()), [])  # nothing to train

    @needs_torchvision
    def test_16bit_runs_natively(self):
        tv = _randomize(TvFrozenBatchNorm2d(6), 23)
        ours = detops_torch.FrozenBatchNorm2d(6)
        ours.load_state_dict(tv.state_dict())
        for dtype, tol in ((torch.float16, 1e-3), (torch.bfloat16, 8e-3)):
            x = _x(24, dtype)
            y = ours(x)
            self.assertEqual(y.dtype, dtype)
            torch.testing.assert_close(y.float(), tv(x.float()), rtol=tol, atol=tol)

    @needs_torchvision
    def test_torchvision_checkpoints_load_unchanged_both_ways(self):
        tv = _randomize(TvFrozenBatchNorm2d(6), 25)
        ours = detops_torch.FrozenBatchNorm2d(6)
        self.assertEqual(list(ours.state_dict().keys()), list(tv.state_dict().keys()))
        ours.load_state_dict(tv.state_dict(), strict=True)
        for k in KEYS:
            assert_bitwise_equal(self, ours.state_dict()[k], tv.state_dict()[k], k)
        back = TvFrozenBatchNorm2d(6)
        back.load_state_dict(ours.state_dict(), strict=True)
        for k in KEYS:
            assert_bitwise_equal(self, back.state_dict()[k], tv.state_dict()[k], k)
        # A BatchNorm2d checkpoint (what torchvision's ResNet weights are): num_batches_tracked dropped.
        bn = _randomize(nn.BatchNorm2d(6), 26)
        sd = bn.state_dict()
        self.assertIn("num_batches_tracked", sd)
        result = ours.load_state_dict(sd, strict=True)
        self.assertEqual((result.missing_keys, result.unexpected_keys), ([], []))
        assert_bitwise_equal(self, ours.running_var, bn.running_var, "running_var from BatchNorm2d")

    def test_detectron2_checkpoints(self):
        # detectron2 FrozenBatchNorm2d._version is 3; version < 2 checkpoints (Caffe2 conversions)
        # hold only weight and bias, and load as the identity statistics.
        d2 = compat.FrozenBatchNorm2d(6)
        assert_bitwise_equal(self, d2.running_var, torch.ones(6) - 1e-5, "detectron2 init: 1 - eps")
        self.assertEqual(type(d2)._version, 3)
        src = _randomize(compat.FrozenBatchNorm2d(6), 27)
        model = nn.Sequential(collections.OrderedDict(bn=compat.FrozenBatchNorm2d(6)))
        old = collections.OrderedDict([("bn.weight", src.weight.clone()), ("bn.bias", src.bias.clone())])
        old._metadata = collections.OrderedDict([("", {"version": 1}), ("bn", {"version": 1})])
        result = model.load_state_dict(old, strict=True)
        self.assertEqual((result.missing_keys, result.unexpected_keys), ([], []))
        assert_bitwise_equal(self, model.bn.weight, src.weight, "weight")
        assert_bitwise_equal(self, model.bn.running_mean, torch.zeros(6), "filled running_mean")
        assert_bitwise_equal(self, model.bn.running_var, torch.ones(6), "filled running_var")
        # A version-3 checkpoint with all four buffers loads as is, and its own state dict says 3.
        full = nn.Sequential(collections.OrderedDict(bn=src)).state_dict()
        self.assertEqual(full._metadata["bn"]["version"], 3)
        model.load_state_dict(full, strict=True)
        for k in KEYS:
            assert_bitwise_equal(self, getattr(model.bn, k), getattr(src, k), k)
        # Missing statistics in a version-3 checkpoint are an error, as in detectron2.
        partial = collections.OrderedDict([("bn.weight", src.weight), ("bn.bias", src.bias)])
        partial._metadata = collections.OrderedDict([("bn", {"version": 3})])
        with self.assertRaisesRegex(RuntimeError, "running_mean"):
            model.load_state_dict(partial, strict=True)
        self.assertEqual(repr(d2), "FrozenBatchNorm2d(num_features=6, eps=1e-05)")

    def test_fold_follows_buffer_changes(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 28)
        x = _x(29, torch.float32)

        def expected():
            scale, shift = _fold(m, torch.float32)
            return detops_torch.functional.frozen_batch_norm(x, scale, shift)

        y0 = m(x)
        assert_bitwise_equal(self, m(x), y0, "cached fold")
        with torch.no_grad():
            m.running_var[3] += 1.0  # in place
        assert_bitwise_equal(self, m(x), expected(), "after an in-place write")
        self.assertFalse(torch.equal(m(x), y0))
        m.load_state_dict(_randomize(detops_torch.FrozenBatchNorm2d(6), 30).state_dict())
        assert_bitwise_equal(self, m(x), expected(), "after load_state_dict")
        m.eps = 1e-3
        assert_bitwise_equal(self, m(x), expected(), "after changing eps")
        m.bias = torch.full((6,), 0.25)  # a new tensor
        assert_bitwise_equal(self, m(x), expected(), "after replacing a buffer")
        m.weight.data = torch.full((6,), 2.0)  # detectron2's converter assigns .data
        assert_bitwise_equal(self, m(x), expected(), "after assigning .data")
        m64 = copy.deepcopy(m).double()
        y64 = m64(x.double())
        self.assertEqual(y64.dtype, torch.float64)
        scale, shift = _fold(m64)
        assert_bitwise_equal(self, y64, detops_torch.functional.frozen_batch_norm(x.double(), scale, shift), "float64")
        assert_bitwise_equal(self, m(x), expected(), "the original is independent of its copy")

    def test_module_scripts(self):
        # TorchScript folds on every call (the cache is Python-only): same op, same bits.
        for cls in (detops_torch.FrozenBatchNorm2d, compat.FrozenBatchNorm2d):
            m = _randomize(cls(6), 39)
            scripted = torch.jit.script(m)
            for dtype in (torch.float32, torch.float64, torch.float16):
                x = _x(40, dtype)
                assert_bitwise_equal(self, scripted(x), m(x), f"{cls.__module__} {dtype}")

    def test_fused_relu_tails(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(6), 36)
        x, r = _x(37, torch.float32), _x(38, torch.float32)
        assert_bitwise_equal(self, m.forward_relu(x), torch.relu(m(x)), "relu(bn(x))")
        assert_bitwise_equal(self, m.forward_relu(x, r), torch.relu(m(x) + r), "relu(bn(x) + residual)")

    def test_gradients_reach_only_the_input_and_repeat_bitwise(self):
        m = _randomize(detops_torch.FrozenBatchNorm2d(16), 31)

        def run(threads):
            with num_threads(threads):
                x = _x(32, torch.float32, shape=(4, 16, 20, 20)).requires_grad_(True)
                y = m(x)
                (y * _x(33, torch.float32, shape=(4, 16, 20, 20))).sum().backward()
                return tensor_hash(y, x.grad)

        self.assertEqual(len({run(t) for t in (1, 2, 1, 2)}), 1)
        self.assertTrue(all(not getattr(m, k).requires_grad for k in KEYS))

    def test_convert_frozen_batchnorm(self):
        gen = torch.Generator().manual_seed(34)
        model = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
            nn.Sequential(nn.BatchNorm2d(6, affine=False), nn.BatchNorm2d(6, eps=1e-3)),
        ).double()
        for bn in (model[1], model[3][0], model[3][1]):
            with torch.no_grad():
                bn.running_mean.uniform_(-0.5, 0.5, generator=gen)
                bn.running_var.uniform_(0.5, 2.0, generator=gen)
                if bn.affine:
                    bn.weight.uniform_(0.5, 1.5, generator=gen)
                    bn.bias.uniform_(-0.5, 0.5, generator=gen)
        model.eval()
        x = _x(35, shape=(2, 3, 8, 8))
        ref = model(x)
        out = detops_torch.convert_frozen_batchnorm(model)
        self.assertIs(out, model)  # converted in place
        self.assertEqual([type(m) for m in (model[1], model[3][0], model[3][1])],
                         [detops_torch.FrozenBatchNorm2d] * 3)
        self.assertEqual(model[3][1].eps, 1e-3)
        self.assertLessEqual(max_rel_error(model(x), ref), 1e-14)
        # SyncBatchNorm (torch's runs on GPUs only, so compare the converted state, not outputs)
        sync = nn.SyncBatchNorm(6, eps=1e-4)
        with torch.no_grad():
            sync.running_var.uniform_(0.5, 2.0, generator=gen)
        frozen = detops_torch.convert_frozen_batchnorm(nn.Sequential(sync))[0]
        self.assertIsInstance(frozen, detops_torch.FrozenBatchNorm2d)
        self.assertEqual(frozen.eps, 1e-4)
        assert_bitwise_equal(self, frozen.running_var, sync.running_var, "SyncBatchNorm running_var")
        top = detops_torch.convert_frozen_batchnorm(nn.BatchNorm2d(4))
        self.assertIsInstance(top, detops_torch.FrozenBatchNorm2d)  # a BatchNorm itself: a new module
        self.assertIs(type(compat.FrozenBatchNorm2d.convert_frozen_batchnorm(nn.BatchNorm2d(4))),
                      compat.FrozenBatchNorm2d)
        with self.assertRaisesRegex(ValueError, "track_running_stats"):
            detops_torch.convert_frozen_batchnorm(nn.BatchNorm2d(4, track_running_stats=False))


if __name__ == "__main__":
    unittest.main()
