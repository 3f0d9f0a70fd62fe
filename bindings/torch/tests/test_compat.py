# Tests of detops_torch.compat and the torchvision-like modules' interfaces: anchor signatures, state dicts and reprs (fixtures from detectron2/mmcv source), behaviour, register_mmcv.
import inspect
import json
import math
import os
import sys
import types
import unittest
import warnings
from unittest import mock

import torch

import detops_torch
from detops_torch import compat
from _util import assert_bitwise_equal, random_rois

try:
    import torchvision
except ImportError:  # pragma: no cover
    torchvision = None

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "anchors.json")
REQUIRED = inspect.Parameter.empty


def _load_fixtures():
    with open(FIXTURES) as f:
        data = json.load(f)
    return {k: v for k, v in data.items() if not k.startswith("_")}


def _resolve(dotted):
    obj = detops_torch
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _init_params(cls):
    return [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]


class SignatureMixin:
    def assert_anchor_signature(self, cls, expected):
        """``expected``: [(name, default or REQUIRED)], the anchor's parameters in order. detops may
        add keyword-only parameters with defaults after them, nothing else."""
        params = _init_params(cls)
        head = params[:len(expected)]
        self.assertEqual([p.name for p in head], [n for n, _ in expected], cls)
        for p, (name, default) in zip(head, expected):
            self.assertIn(p.kind, (p.POSITIONAL_OR_KEYWORD,), f"{cls.__name__}.{name} must stay positional")
            self.assertEqual(p.default, default, f"{cls.__name__}.{name} default")
            if default is not REQUIRED:
                self.assertIs(type(p.default), type(default), f"{cls.__name__}.{name} default type")
        for p in params[len(expected):]:
            self.assertEqual(p.kind, p.KEYWORD_ONLY, f"{cls.__name__}: extra parameter {p.name} must be keyword-only")
            self.assertIsNot(p.default, REQUIRED, f"{cls.__name__}: extra parameter {p.name} needs a default")


class FixtureAnchorTest(SignatureMixin, unittest.TestCase):
    """detectron2 and mmcv do not install here: their interfaces are fixtures written from source."""

    def test_fixture_is_read(self):
        self.assertEqual(sorted(_load_fixtures()),
                         ["detectron2.DeformConv", "detectron2.FrozenBatchNorm2d",
                          "detectron2.ModulatedDeformConv", "detectron2.ROIAlign", "detectron2.ROIAlignRotated",
                          "mmcv.DeformConv2d", "mmcv.DeformConv2dPack", "mmcv.ModulatedDeformConv2d",
                          "mmcv.ModulatedDeformConv2dPack", "mmcv.RoIAlign", "mmcv.RoIAlignRotated"])

    def test_constructor_signatures(self):
        for name, spec in _load_fixtures().items():
            with self.subTest(anchor=name):
                expected = [(p, REQUIRED if d == "required" else d) for p, d in spec["params"]]
                self.assert_anchor_signature(_resolve(spec["detops"]), expected)

    def test_forward_signatures(self):
        for name, spec in _load_fixtures().items():
            with self.subTest(anchor=name):
                params = list(inspect.signature(_resolve(spec["detops"]).forward).parameters)
                self.assertEqual(params[1:], spec["forward"])

    def test_state_dicts_attributes_and_reprs(self):
        for name, spec in _load_fixtures().items():
            with self.subTest(anchor=name):
                cls = _resolve(spec["detops"])
                ex = spec["repr_example"]
                m = cls(*ex["args"], **ex["kwargs"])
                self.assertEqual(list(m.state_dict().keys()), spec["state_dict_keys"])
                shapes = {k: list(p.shape) for k, p in m.named_parameters()}
                self.assertEqual(shapes, spec.get("parameter_shapes", {}))
                for attr in spec["attributes"]:
                    self.assertTrue(hasattr(m, attr), f"{name}.{attr}")
                self.assertEqual(repr(m), ex["repr"])
                if "version" in spec:
                    self.assertEqual(cls._version, spec["version"])
                    self.assertEqual(m.state_dict()._metadata[""]["version"], spec["version"])
                for method in spec.get("classmethods", []):
                    self.assertTrue(inspect.ismethod(getattr(cls, method)), method)
                for kwargs in spec.get("keyword_calls", []):
                    cls(**kwargs)  # the anchors' callers (ROIPooler, mmdet configs) use keywords

    def test_detectron2_frozen_batchnorm_initial_state(self):
        m = compat.FrozenBatchNorm2d(5, eps=1e-3)
        assert_bitwise_equal(self, m.weight, torch.ones(5), "weight")
        assert_bitwise_equal(self, m.bias, torch.zeros(5), "bias")
        assert_bitwise_equal(self, m.running_mean, torch.zeros(5), "running_mean")
        assert_bitwise_equal(self, m.running_var, torch.ones(5) - 1e-3, "running_var")

    def test_mmcv_deprecated_keyword_names(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = compat.RoIAlign(out_size=5, sample_num=3)
        self.assertEqual((m.output_size, m.sampling_ratio), ((5, 5), 3))
        self.assertEqual(len([w for w in caught if issubclass(w.category, DeprecationWarning)]), 2)
        with self.assertRaises(TypeError), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            compat.RoIAlign(7, out_size=5)  # given twice
        self.assertEqual(inspect.signature(compat.RoIAlign.__init__).parameters["output_size"].default, REQUIRED)


@unittest.skipUnless(torchvision is not None, "torchvision is not installed")
class TorchvisionAnchorTest(SignatureMixin, unittest.TestCase):
    """torchvision is installed: compare with its classes directly."""

    def test_signatures(self):
        from torchvision.ops import DeformConv2d, FrozenBatchNorm2d, MultiScaleRoIAlign, RoIAlign

        for ours, theirs in ((detops_torch.RoIAlign, RoIAlign), (detops_torch.MultiScaleRoIAlign, MultiScaleRoIAlign),
                             (detops_torch.FrozenBatchNorm2d, FrozenBatchNorm2d),
                             (detops_torch.DeformConv2d, DeformConv2d)):
            with self.subTest(cls=theirs.__name__):
                anchor = [p for p in _init_params(theirs)]
                positional = [(p.name, p.default) for p in anchor if p.kind == p.POSITIONAL_OR_KEYWORD]
                self.assert_anchor_signature(ours, positional)
                ours_kw = {p.name: p.default for p in _init_params(ours) if p.kind == p.KEYWORD_ONLY}
                for p in anchor:
                    if p.kind == p.KEYWORD_ONLY:
                        self.assertEqual(ours_kw.get(p.name, "<missing>"), p.default, p.name)

    def test_state_dicts(self):
        from torchvision.ops import FrozenBatchNorm2d, MultiScaleRoIAlign, RoIAlign

        pairs = ((detops_torch.RoIAlign(7, 0.25, 2), RoIAlign(7, 0.25, 2)),
                 (detops_torch.MultiScaleRoIAlign(["0"], 7, 2), MultiScaleRoIAlign(["0"], 7, 2)),
                 (detops_torch.FrozenBatchNorm2d(8), FrozenBatchNorm2d(8)))
        for ours, theirs in pairs:
            self.assertEqual(list(ours.state_dict().keys()), list(theirs.state_dict().keys()))
            for k, v in theirs.state_dict().items():
                assert_bitwise_equal(self, ours.state_dict()[k], v, k)


def _mmcv_max_reference(x, rois, out_h, out_w, scale, sampling, aligned):
    """mmcv's max pooling RoIAlign, written out from its definition in float64 (slow; tiny inputs)."""
    n, c, h, w = x.shape
    out = torch.zeros(rois.shape[0], c, out_h, out_w, dtype=torch.float64)

    def bilinear(plane, y, xx):
        if y < -1.0 or y > h or xx < -1.0 or xx > w:
            return 0.0
        y, xx = max(y, 0.0), max(xx, 0.0)
        y0, x0 = int(y), int(xx)
        if y0 >= h - 1:
            y0 = y1 = h - 1
            y = float(y0)
        else:
            y1 = y0 + 1
        if x0 >= w - 1:
            x0 = x1 = w - 1
            xx = float(x0)
        else:
            x1 = x0 + 1
        ly, lx = y - y0, xx - x0
        hy, hx = 1.0 - ly, 1.0 - lx
        return (hy * hx * plane[y0, x0] + hy * lx * plane[y0, x1] + ly * hx * plane[y1, x0]
                + ly * lx * plane[y1, x1]).item()

    off = 0.5 if aligned else 0.0
    for k, r in enumerate(rois.double().tolist()):
        b = int(r[0])
        x1, y1, x2, y2 = (v * scale - off for v in r[1:])
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / out_h, rw / out_w
        gh = sampling if sampling > 0 else math.ceil(rh / out_h)
        gw = sampling if sampling > 0 else math.ceil(rw / out_w)
        for ch in range(c):
            plane = x[b, ch].double()
            for ph in range(out_h):
                for pw in range(out_w):
                    vals = [bilinear(plane, y1 + ph * bh + (iy + 0.5) * bh / gh, x1 + pw * bw + (ix + 0.5) * bw / gw)
                            for iy in range(gh) for ix in range(gw)]
                    out[k, ch, ph, pw] = max(vals) if vals else 0.0
    return out


class CompatBehaviourTest(unittest.TestCase):
    def _case(self, seed, dtype=torch.float64):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 3, 9, 11, generator=gen, dtype=torch.float64).to(dtype)
        rois = random_rois(gen, 2, 8, 9 / 0.5, 11 / 0.5)
        return x, rois

    @unittest.skipUnless(torchvision is not None, "torchvision is not installed")
    def test_detectron2_roialign_casts_rois_and_defaults_to_aligned(self):
        x, rois = self._case(1)
        m = compat.ROIAlign((3, 4), 0.5, 0)
        self.assertTrue(m.aligned)
        ref = torchvision.ops.roi_align(x, rois, (3, 4), 0.5, 0, True)
        assert_bitwise_equal(self, m(x, rois), ref, "float64 rois")
        ref32 = torchvision.ops.roi_align(x, rois.float().double(), (3, 4), 0.5, 0, True)
        assert_bitwise_equal(self, m(x, rois.float()), ref32, "float32 rois cast to the input's dtype")
        with self.assertRaisesRegex(ValueError, r"\[K, 5\]"):
            m(x, rois[:, 1:])

    @unittest.skipUnless(torchvision is not None, "torchvision is not installed")
    def test_mmcv_avg_is_torchvision_aligned(self):
        x, rois = self._case(2)
        for use_tv in (False, True):
            m = compat.RoIAlign(3, 0.5, use_torchvision=use_tv)
            ref = torchvision.ops.roi_align(x, rois, 3, 0.5, 0, True)
            assert_bitwise_equal(self, m(x, rois), ref, f"use_torchvision={use_tv}")

    def test_mmcv_max_pooling(self):
        x, rois = self._case(3)
        for sampling, aligned in ((2, True), (0, False), (1, True)):
            m = compat.RoIAlign((2, 3), 0.5, sampling, "max", aligned)
            out = m(x, rois)
            ref = _mmcv_max_reference(x, rois, 2, 3, 0.5, sampling, aligned)
            torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13)
            avg = compat.RoIAlign((2, 3), 0.5, sampling, "avg", aligned)(x, rois)
            self.assertTrue(bool((out >= avg - 1e-12).all()), "max >= mean over the same samples")
        xg = x.clone().requires_grad_(True)
        compat.RoIAlign(2, 0.5, 2, "max")(xg, rois).sum().backward()
        self.assertEqual(xg.grad.shape, x.shape)
        with self.assertRaisesRegex(ValueError, "pool_mode"):
            compat.RoIAlign(7, pool_mode="sum")

    def test_modules_script(self):
        x, rois = self._case(4)
        for m in (compat.ROIAlign(3, 0.5, 2), compat.RoIAlign(3, 0.5, 2, "max"),
                  detops_torch.MultiScaleRoIAlign(["0", "1"], 3, 2)):
            scripted = torch.jit.script(m)
            if isinstance(m, detops_torch.MultiScaleRoIAlign):
                feats = {"0": x, "1": x[:, :, ::2, ::2].contiguous()}
                boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
                assert_bitwise_equal(self, scripted(feats, boxes, [(18, 22), (18, 20)]),
                                     m(feats, boxes, [(18, 22), (18, 20)]), "scripted MultiScaleRoIAlign")
            else:
                assert_bitwise_equal(self, scripted(x, rois), m(x, rois), type(m).__name__)


class Detectron2DeformConvTest(unittest.TestCase):
    """detectron2's DeformConv / ModulatedDeformConv stand-ins: its border rule (mmcv's), empty
    inputs, norm and activation, its asserts, FX."""

    def _inputs(self, n=2, c=4, h=7, w=8, groups=1, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64, requires_grad=True)
        offset = torch.zeros(n, 2 * groups * 9, h, w, dtype=torch.float64, requires_grad=True)  # a fresh layer's
        mask = torch.rand(n, groups * 9, h, w, generator=g, dtype=torch.float64, requires_grad=True)
        return x, offset, mask

    def test_fresh_layer_takes_detectron2s_border_rule(self):
        torch.manual_seed(0)
        m = compat.ModulatedDeformConv(4, 6, 3, padding=1).double()
        x, offset, mask = self._inputs()
        out = m(x, offset, mask)
        out.square().sum().backward()
        for rule in ("mmcv", "torchvision"):
            xr, offr, maskr = (t.detach().clone().requires_grad_(True) for t in (x, offset, mask))
            ref = detops_torch.deform_conv2d(xr, offr, m.weight, m.bias, padding=(1, 1), mask=maskr, border_rule=rule)
            ref.square().sum().backward()
            if rule == "mmcv":
                assert_bitwise_equal(self, out, ref, "output")
                assert_bitwise_equal(self, offset.grad, offr.grad, "grad_offset under detectron2's rule")
            else:  # every border tap of a fresh padded layer sits at exactly -1: the rules differ
                self.assertFalse(torch.equal(offset.grad, offr.grad))

    def test_norm_and_activation_follow_the_convolution(self):
        torch.manual_seed(1)
        norm = torch.nn.GroupNorm(2, 6).double()
        m = compat.ModulatedDeformConv(4, 6, 3, padding=1, norm=norm, activation=torch.relu).double()
        x, offset, mask = self._inputs(seed=1)
        plain = detops_torch.deform_conv2d(x, offset, m.weight, m.bias, padding=(1, 1), mask=mask, border_rule="mmcv")
        assert_bitwise_equal(self, m(x, offset, mask), torch.relu(norm(plain)), "norm then activation")
        self.assertIn("norm", dict(m.named_children()))

    def test_empty_input_gives_an_empty_output_of_the_right_shape(self):
        m = compat.DeformConv(4, 6, 3, stride=2, padding=1).double()
        x = torch.zeros(0, 4, 9, 10, dtype=torch.float64, requires_grad=True)
        out = m(x, torch.zeros(0, 18, 5, 5, dtype=torch.float64))
        self.assertEqual(list(out.shape), [0, 6, 5, 5])
        out.sum().backward()  # gradients flow (as zeros) like detectron2's _NewEmptyTensorOp
        self.assertEqual(list(x.grad.shape), [0, 4, 9, 10])

    def test_detectron2s_asserts_and_the_forwards_deformable_groups_check(self):
        with self.assertRaises(AssertionError):
            compat.DeformConv(4, 6, 3, bias=True)
        with self.assertRaisesRegex(AssertionError, "in_channels 5 cannot be divisible by groups 2"):
            compat.ModulatedDeformConv(5, 6, 3, groups=2)
        m = compat.DeformConv(6, 6, 3, padding=1, deformable_groups=4)  # builds, as detectron2's does
        with self.assertRaisesRegex(ValueError, "input channels must divide deformable group size"):
            m(torch.randn(1, 6, 5, 5), torch.zeros(1, 72, 5, 5))
        with self.assertRaisesRegex(ValueError, "Expected 4D tensor as input, got 3D"):
            m(torch.randn(6, 5, 5), torch.zeros(72, 5, 5))

    def test_fx_traces_both(self):
        for m, args in ((compat.DeformConv(4, 6, 3, padding=1).double(), self._inputs()[:2]),
                        (compat.ModulatedDeformConv(4, 6, 3, padding=1).double(), self._inputs())):
            with self.subTest(module=type(m).__name__):
                traced = torch.fx.symbolic_trace(m)
                assert_bitwise_equal(self, traced(*args), m(*args), "traced")


class RegisterMmcvTest(unittest.TestCase):
    def test_without_mmcv_raises_a_clear_import_error(self):
        with mock.patch.dict(sys.modules, {"mmcv": None, "mmcv.ops": None}):
            with self.assertRaisesRegex(ImportError, r"register_mmcv\(\) needs mmcv"):
                compat.register_mmcv()

    def test_with_mmcv_2_and_mmengine(self):
        registered = {}

        class Registry:
            def register_module(self, name=None, module=None, force=False):
                registered[name] = (module, force)

        mmcv = types.ModuleType("mmcv")
        ops = types.ModuleType("mmcv.ops")
        mmcv.ops = ops
        mmengine = types.ModuleType("mmengine")
        registry_mod = types.ModuleType("mmengine.registry")
        registry_mod.MODELS = Registry()
        mmengine.registry = registry_mod
        fake = {"mmcv": mmcv, "mmcv.ops": ops, "mmengine": mmengine, "mmengine.registry": registry_mod}
        with mock.patch.dict(sys.modules, fake):
            result = compat.register_mmcv()
        self.assertIs(ops.DetopsRoIAlign, compat.RoIAlign)
        self.assertIs(ops.DetopsRoIAlignRotated, detops_torch.nn.RoIAlignRotated)
        expected = {"DetopsSyncBN": detops_torch.SyncBatchNorm, "DetopsMMSyncBN": compat.SyncBatchNorm,
                    "DetopsRoIAlign": compat.RoIAlign,
                    "DetopsRoIAlignRotated": detops_torch.nn.RoIAlignRotated,
                    "DetopsDCN": detops_torch.DeformConv2dPack, "DetopsDCNv2": detops_torch.ModulatedDeformConv2dPack,
                    "DetopsMultiScaleDeformableAttention": detops_torch.MultiScaleDeformableAttention}
        self.assertEqual(registered, {k: (v, True) for k, v in expected.items()})
        self.assertEqual(result, dict({"mmcv.ops.DetopsRoIAlign": compat.RoIAlign,
                                       "mmcv.ops.DetopsRoIAlignRotated": detops_torch.nn.RoIAlignRotated},
                                      **{"mmengine.MODELS." + k: v for k, v in expected.items()}))
        # mmdetection's roi extractor: layer_cls = getattr(mmcv.ops, cfg.pop('type'))
        layer = getattr(ops, "DetopsRoIAlign")(output_size=7, spatial_scale=0.25, sampling_ratio=0)
        self.assertEqual(layer.output_size, (7, 7))
        # mmrotate's: the same lookup, with the rotated layer's arguments
        layer = getattr(ops, "DetopsRoIAlignRotated")(output_size=7, spatial_scale=0.25, sampling_ratio=2,
                                                      clockwise=True)
        self.assertEqual((layer.output_size, layer.clockwise), ((7, 7), True))

    def test_with_mmcv_1(self):
        """mmcv 1.x has no mmengine: each kind of layer has its own registry (and a missing one,
        here ATTENTION, is skipped)."""
        registered = {}

        class Registry:
            def __init__(self, name):
                self.name = name

            def register_module(self, name=None, module=None, force=False):
                registered[(self.name, name)] = (module, force)

        mmcv = types.ModuleType("mmcv")
        ops = types.ModuleType("mmcv.ops")
        cnn = types.ModuleType("mmcv.cnn")
        cnn.NORM_LAYERS, cnn.CONV_LAYERS = Registry("norm"), Registry("conv")
        mmcv.ops, mmcv.cnn = ops, cnn
        fake = {"mmcv": mmcv, "mmcv.ops": ops, "mmcv.cnn": cnn, "mmengine": None, "mmengine.registry": None,
                "mmcv.cnn.bricks": None, "mmcv.cnn.bricks.registry": None}
        with mock.patch.dict(sys.modules, fake):
            result = compat.register_mmcv(force=False)
        self.assertEqual(registered, {("norm", "DetopsSyncBN"): (detops_torch.SyncBatchNorm, False),
                                      ("norm", "DetopsMMSyncBN"): (compat.SyncBatchNorm, False),
                                      ("conv", "DetopsDCN"): (detops_torch.DeformConv2dPack, False),
                                      ("conv", "DetopsDCNv2"): (detops_torch.ModulatedDeformConv2dPack, False)})
        self.assertEqual(sorted(result), ["mmcv.CONV_LAYERS.DetopsDCN", "mmcv.CONV_LAYERS.DetopsDCNv2",
                                          "mmcv.NORM_LAYERS.DetopsMMSyncBN", "mmcv.NORM_LAYERS.DetopsSyncBN",
                                          "mmcv.ops.DetopsRoIAlign", "mmcv.ops.DetopsRoIAlignRotated"])


if __name__ == "__main__":
    unittest.main()
