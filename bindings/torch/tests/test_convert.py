# Tests of detops_torch.convert(): torchvision Mask R-CNN models (targets replaced, RoI pooler outputs bitwise, model outputs within 1e-10), detectron2/mmcv/Deformable-DETR classes by name (RoI, rotated, deformable), options.
import copy
import unittest
import warnings

import torch
import torch.fx
from torch import nn

import detops_torch
from detops_torch import compat
from _util import assert_bitwise_equal, max_rel_error, random_rois

try:
    import torchvision
    from torchvision.models.detection import MaskRCNN, maskrcnn_resnet50_fpn
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    from torchvision.ops import FrozenBatchNorm2d as TvFrozenBatchNorm2d
except ImportError:  # pragma: no cover
    torchvision = None

# Small and quick (float64 convolutions take torch's slow path on the CPU; the mask head costs about
# 1 GFLOP per detection), but with detections: every box scores above 0, 3 per image are kept.
MODEL_KW = dict(min_size=128, max_size=128, rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=24,
                box_score_thresh=0.0, box_detections_per_img=3, rpn_pre_nms_top_n_train=100,
                rpn_post_nms_top_n_train=32, box_batch_size_per_image=16)
TV_CLASSES = {("torchvision.ops.roi_align", "RoIAlign"), ("torchvision.ops.poolers", "MultiScaleRoIAlign"),
              ("torchvision.ops.misc", "FrozenBatchNorm2d")}


def _kind(m):
    return (type(m).__module__, type(m).__qualname__)


def _count(model, cls):
    return sum(1 for m in model.modules() if type(m) is cls)


def _randomize_norms(model, seed):
    """Non-trivial statistics for every BatchNorm2d / FrozenBatchNorm2d, so the folds matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d) or _kind(m) == ("torchvision.ops.misc", "FrozenBatchNorm2d"):
                c = m.running_var.numel()
                m.running_mean.copy_(torch.rand(c, generator=gen, dtype=torch.float64) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen, dtype=torch.float64) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=gen, dtype=torch.float64) * 0.5 + 0.75)
                m.bias.copy_(torch.rand(c, generator=gen, dtype=torch.float64) * 0.2 - 0.1)


def _images(seed, count=2):
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(3, 128, 128, generator=gen, dtype=torch.float64),
            torch.rand(3, 112, 128, generator=gen, dtype=torch.float64)][:count]


def _capture_poolers(model):
    """Records (inputs, output) of the Mask R-CNN RoI poolers on each forward."""
    calls = {"box": [], "mask": []}
    handles = []
    for key, m in (("box", model.roi_heads.box_roi_pool), ("mask", model.roi_heads.mask_roi_pool)):
        handles.append(m.register_forward_hook(lambda mod, inp, out, key=key: calls[key].append((inp, out))))
    return calls, handles


@unittest.skipUnless(torchvision is not None, "torchvision is not installed")
class ConvertTorchvisionModelsTest(unittest.TestCase):
    def _compare_outputs(self, got, ref, tol=1e-10):
        self.assertEqual(len(got), len(ref))
        for g, r in zip(got, ref):
            self.assertEqual(sorted(g), sorted(r))
            self.assertGreater(r["boxes"].shape[0], 0, "the comparison needs detections")
            assert_bitwise_equal(self, g["labels"], r["labels"], "labels")
            for k in ("boxes", "scores", "masks"):
                self.assertEqual(g[k].shape, r[k].shape, k)
                self.assertLessEqual(max_rel_error(g[k], r[k]), tol, k)

    def _check_poolers(self, converted, ref_calls):
        """The converted poolers give the original poolers' outputs bit for bit on the original
        inputs (inside the model their inputs differ by the folds' rounding)."""
        for key, pooler in (("box", converted.roi_heads.box_roi_pool), ("mask", converted.roi_heads.mask_roi_pool)):
            self.assertIs(type(pooler), detops_torch.MultiScaleRoIAlign)
            self.assertEqual(len(ref_calls[key]), 1)
            for inp, ref_out in ref_calls[key]:
                self.assertGreater(ref_out.shape[0], 0)
                assert_bitwise_equal(self, pooler(*inp), ref_out, f"{key} pooler on the original inputs")

    def test_maskrcnn_resnet50_fpn(self):
        torch.manual_seed(0)
        model = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, **MODEL_KW).double().eval()
        _randomize_norms(model, 1)
        n_bn = _count(model, nn.BatchNorm2d)
        self.assertGreater(n_bn, 50)  # no backbone weights: torchvision builds it with BatchNorm2d
        plain = copy.deepcopy(model)
        calls, handles = _capture_poolers(model)
        with torch.no_grad():
            ref = model(_images(1, count=1))
        for h in handles:
            h.remove()

        # batchnorm=None: only the two MultiScaleRoIAlign poolers are targets (the model's
        # features are then unchanged, so the poolers' bitwise equality is the model's too).
        self.assertIs(detops_torch.convert(plain), plain)
        self.assertFalse([m for m in plain.modules() if _kind(m) in TV_CLASSES])
        self.assertEqual(_count(plain, detops_torch.MultiScaleRoIAlign), 2)
        self.assertEqual(_count(plain, nn.BatchNorm2d), n_bn)
        self._check_poolers(plain, calls)
        self.assertEqual(plain.roi_heads.box_roi_pool.scales, model.roi_heads.box_roi_pool.scales)

        # batchnorm="frozen": every BatchNorm2d becomes a detops FrozenBatchNorm2d as well.
        frozen = detops_torch.convert(plain, batchnorm="frozen")
        self.assertEqual(_count(frozen, nn.BatchNorm2d), 0)
        self.assertEqual(_count(frozen, detops_torch.FrozenBatchNorm2d), n_bn)
        with torch.no_grad():
            out = frozen(_images(1, count=1))
        self._compare_outputs(out, ref)

    def test_maskrcnn_over_frozen_batchnorm_backbone(self):
        torch.manual_seed(1)
        backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, norm_layer=TvFrozenBatchNorm2d,
                                       trainable_layers=3)
        model = MaskRCNN(backbone, num_classes=5, **MODEL_KW).double().eval()
        _randomize_norms(model, 2)
        n_frozen = _count(model, TvFrozenBatchNorm2d)
        self.assertGreater(n_frozen, 15)
        converted = copy.deepcopy(model)
        calls, handles = _capture_poolers(model)
        with torch.no_grad():
            ref = model(_images(1))
        for h in handles:
            h.remove()

        detops_torch.convert(converted)
        self.assertFalse([m for m in converted.modules() if _kind(m) in TV_CLASSES])
        self.assertEqual(_count(converted, detops_torch.FrozenBatchNorm2d), n_frozen)
        self.assertEqual(_count(converted, detops_torch.MultiScaleRoIAlign), 2)
        # The converted FrozenBatchNorm2d hold the very same buffers: the checkpoint is unchanged.
        self.assertEqual(converted.state_dict().keys(), model.state_dict().keys())
        for k, v in model.state_dict().items():
            assert_bitwise_equal(self, converted.state_dict()[k], v, k)
        self._check_poolers(converted, calls)
        with torch.no_grad():
            out = converted(_images(1))
        # detops folds w * (1 / sqrt(v + eps)), torchvision w * rsqrt(v + eps): the issue allows the
        # roundings to differ, so the outputs are held to 1e-10 relative, not to their bits.
        self._compare_outputs(out, ref)

        # The converted model still scripts (torchvision's detection models do), with the same results.
        converted.float()
        images = [i.float() for i in _images(1, count=1)]
        scripted = torch.jit.script(converted)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "RCNN always returns a (Losses, Detections) tuple"
            eager_out = converted(images)
            _, script_out = scripted(images)
        for k in ("boxes", "scores", "masks"):
            assert_bitwise_equal(self, script_out[0][k], eager_out[0][k], f"scripted {k}")

        # A training step (float32: quick) runs through the detops ops and reaches the trainable
        # backbone layers.
        converted.train()
        images = [i.float() for i in _images(2, count=1)]
        mask = torch.zeros(2, 128, 128, dtype=torch.uint8)
        mask[:, 20:80, 15:90] = 1
        targets = [{"boxes": torch.tensor([[15.0, 20.0, 90.0, 80.0], [40.0, 30.0, 120.0, 100.0]]),
                    "labels": torch.tensor([1, 3]), "masks": mask}]
        losses = converted(images, targets)
        self.assertIn("loss_mask", losses)
        sum(losses.values()).backward()
        grad = converted.backbone.body.layer4[0].conv1.weight.grad
        self.assertIsNotNone(grad)
        self.assertGreater(grad.abs().sum().item(), 0.0)


def _fake_class(module, name, base=nn.Module, body=None):
    """A class with another library's module path and name (detectron2 and mmcv are not installed)."""
    return type(name, (base,), dict(body or {}, __module__=module, __qualname__=name))


def _d2_roialign_init(self, output_size, spatial_scale, sampling_ratio, aligned=True):
    nn.Module.__init__(self)
    self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned = (output_size, spatial_scale,
                                                                               sampling_ratio, aligned)


def _d2_roialign_forward(self, input, rois):  # detectron2: torchvision's op on rois cast to the input's dtype
    return torchvision.ops.roi_align(input, rois.to(dtype=input.dtype), self.output_size, self.spatial_scale,
                                     self.sampling_ratio, self.aligned)


def _d2_frozen_init(self, num_features, eps=1e-5):
    nn.Module.__init__(self)
    self.num_features, self.eps = num_features, eps
    self.register_buffer("weight", torch.ones(num_features))
    self.register_buffer("bias", torch.zeros(num_features))
    self.register_buffer("running_mean", torch.zeros(num_features))
    self.register_buffer("running_var", torch.ones(num_features) - eps)


def _d2_frozen_forward(self, x):
    return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.1,
                                    self.eps)


def _mmcv_init(self, output_size, spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True,
               use_torchvision=False):
    nn.Module.__init__(self)
    self.output_size = nn.modules.utils._pair(output_size)
    self.spatial_scale, self.sampling_ratio = float(spatial_scale), int(sampling_ratio)
    self.pool_mode, self.aligned, self.use_torchvision = pool_mode, aligned, use_torchvision


D2ROIAlign = _fake_class("detectron2.layers.roi_align", "ROIAlign",
                         body={"__init__": _d2_roialign_init, "forward": _d2_roialign_forward})
D2FrozenBatchNorm2d = _fake_class("detectron2.layers.batch_norm", "FrozenBatchNorm2d",
                                  body={"__init__": _d2_frozen_init, "forward": _d2_frozen_forward})
MmcvRoIAlign = _fake_class("mmcv.ops.roi_align", "RoIAlign", body={"__init__": _mmcv_init})
# mmcv's SyncBatchNorm's attributes (num_features, eps, momentum, affine, track_running_stats,
# group, stats_mode) and parameters: the stand-in's own.
MmcvSyncBatchNorm = _fake_class("mmcv.ops.sync_bn", "SyncBatchNorm", base=compat.SyncBatchNorm)


class ConvertByClassNameTest(unittest.TestCase):
    def _pooler(self):
        # detectron2's ROIPooler keeps its per-level ROIAlign modules in a ModuleList.
        pooler = nn.Module()
        pooler.level_poolers = nn.ModuleList([D2ROIAlign((7, 7), 1 / s, 0, aligned=False) for s in (4, 8)])
        return pooler

    @unittest.skipUnless(torchvision is not None, "torchvision is not installed")
    def test_detectron2_and_mmcv_modules(self):
        gen = torch.Generator().manual_seed(3)
        model = nn.Module()
        model.stem = nn.Sequential(nn.Conv2d(3, 4, 1), D2FrozenBatchNorm2d(4, eps=1e-4), nn.ReLU())
        model.pooler = self._pooler()
        model.mmdet_layers = nn.ModuleList([MmcvRoIAlign(7, 0.25, 2, "max", False, True), MmcvRoIAlign(14, 0.125)])
        subclass = type("MyROIAlign", (D2ROIAlign,), {"__module__": __name__})
        model.custom = subclass(3, 1.0, 2)
        model.eval()
        with torch.no_grad():
            for k in ("weight", "bias", "running_mean", "running_var"):
                getattr(model.stem[1], k).uniform_(0.5, 1.5, generator=gen)
        old_bn = model.stem[1]
        x = torch.rand(2, 3, 16, 16, generator=gen, dtype=torch.float64)
        rois = random_rois(gen, 2, 6, 64, 64)
        model.double()
        feat = model.stem(x)
        ref = [p(feat, rois.float()) for p in model.pooler.level_poolers]

        detops_torch.convert(model, backward_mode="atomic")
        self.assertIs(type(model.stem[1]), compat.FrozenBatchNorm2d)
        self.assertIs(model.stem[1].running_var, old_bn.running_var)  # the same buffers
        self.assertEqual(model.stem[1].eps, 1e-4)
        self.assertFalse(model.stem[1].training)
        self.assertEqual([type(p) for p in model.pooler.level_poolers], [compat.ROIAlign] * 2)
        self.assertEqual([type(p) for p in model.mmdet_layers], [compat.RoIAlign] * 2)
        self.assertIs(type(model.custom), subclass)  # a subclass may behave differently: left alone
        p0 = model.pooler.level_poolers[0]
        self.assertEqual((p0.output_size, p0.spatial_scale, p0.sampling_ratio, p0.aligned, p0.backward_mode),
                         ((7, 7), 0.25, 0, False, "atomic"))
        m0 = model.mmdet_layers[0]
        self.assertEqual((m0.output_size, m0.spatial_scale, m0.sampling_ratio, m0.pool_mode, m0.aligned,
                          m0.use_torchvision), ((7, 7), 0.25, 2, "max", False, True))
        feat2 = model.stem(x)
        self.assertLessEqual(max_rel_error(feat2, feat), 1e-14)
        for p, r in zip(model.pooler.level_poolers, ref):
            assert_bitwise_equal(self, p(feat, rois.float()), r, "detectron2 ROIAlign")

    def test_mmcv_sync_batchnorm(self):
        # detops stands in for mmcv's SyncBatchNorm (MMSyncBN) with mmcv's semantics (its group
        # averaging of the parameter gradients: test_sync_batch_norm), not torch's.
        model = nn.Sequential(nn.Conv2d(3, 4, 1), MmcvSyncBatchNorm(4, eps=1e-3, momentum=0.2, stats_mode="N"))
        old = model[1]
        detops_torch.convert(model)
        new = model[1]
        self.assertIs(type(new), compat.SyncBatchNorm)
        self.assertIs(new.weight, old.weight)
        self.assertIs(new.running_var, old.running_var)
        self.assertEqual((new.eps, new.momentum, new.stats_mode, new.group), (1e-3, 0.2, "N", None))

    def test_options_and_errors(self):
        rp = torchvision.ops.RoIAlign(7, 0.5, 2) if torchvision is not None else D2ROIAlign(7, 0.5, 2)
        new = detops_torch.convert(rp, truncation="bfloat16", backward_mode="truncated")
        self.assertIsNot(new, rp)  # the model itself is a target: its replacement is returned
        self.assertEqual((new.backward_mode, new.truncation), ("truncated", "bfloat16"))
        with self.assertRaisesRegex(ValueError, "batchnorm"):
            detops_torch.convert(nn.Identity(), batchnorm="Frozen")
        with self.assertRaisesRegex(ValueError, "backward_mode"):
            detops_torch.convert(nn.Identity(), backward_mode="fast")
        with self.assertRaisesRegex(TypeError, "sampling_ratio"):
            detops_torch.convert(nn.Identity(), sampling_ratio=2)
        with self.assertRaisesRegex(ValueError, "batchnorm='sync'"):
            detops_torch.convert(nn.Identity(), mode="exact")
        with self.assertRaisesRegex(ValueError, "TorchScript"):
            detops_torch.convert(torch.jit.script(nn.Linear(2, 2)))
        bn = nn.BatchNorm2d(3)
        model = nn.Sequential(bn)
        self.assertIs(detops_torch.convert(model)[0], bn)  # BatchNorm2d only when asked

    def test_batchnorm_sync(self):
        model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
        weight = model[1].weight
        detops_torch.convert(model, batchnorm="sync", mode="exact")
        for m in (model[1], model[2][0]):
            self.assertIsInstance(m, detops_torch.SyncBatchNorm)
            self.assertIsInstance(m, nn.SyncBatchNorm)
            self.assertEqual(m.mode, "exact")
        self.assertIs(model[1].weight, weight)  # as torch's convert_sync_batchnorm: same Parameters


# The rotated and deformable anchors, by name. Each fake subclasses the detops module that mirrors
# the anchor (the same attributes, parameters and arithmetic), so the converted module must give
# the fake's output bit for bit: a configuration value or parameter that conversion dropped would
# change it.
D2ROIAlignRotated = _fake_class("detectron2.layers.roi_align_rotated", "ROIAlignRotated",
                                base=detops_torch.ROIAlignRotated)
MmcvRoIAlignRotated = _fake_class("mmcv.ops.roi_align_rotated", "RoIAlignRotated", base=detops_torch.RoIAlignRotated)
MmcvDCNv2 = _fake_class("mmcv.ops.modulated_deform_conv", "ModulatedDeformConv2dPack",
                        base=detops_torch.ModulatedDeformConv2dPack)
MmcvDCN = _fake_class("mmcv.ops.deform_conv", "DeformConv2dPack", base=detops_torch.DeformConv2dPack)
MmcvDeformConv2d = _fake_class("mmcv.ops.deform_conv", "DeformConv2d", base=compat.DeformConv2d)
MmcvModulatedDeformConv2d = _fake_class("mmcv.ops.modulated_deform_conv", "ModulatedDeformConv2d",
                                        base=compat.ModulatedDeformConv2d)
MmcvMSDA = _fake_class("mmcv.ops.multi_scale_deform_attn", "MultiScaleDeformableAttention",
                       base=detops_torch.MultiScaleDeformableAttention)
DetrMSDeformAttn = _fake_class("models.ops.modules.ms_deform_attn", "MSDeformAttn", base=detops_torch.MSDeformAttn)
D2DeformConv = _fake_class("detectron2.layers.deform_conv", "DeformConv", base=compat.DeformConv)
D2ModulatedDeformConv = _fake_class("detectron2.layers.deform_conv", "ModulatedDeformConv",
                                    base=compat.ModulatedDeformConv)


def _rotated_rois(gen, batch, count, size):
    b = torch.randint(0, batch, (count, 1), generator=gen).double()
    ctr = torch.rand(count, 2, generator=gen, dtype=torch.float64) * size
    wh = torch.rand(count, 2, generator=gen, dtype=torch.float64) * size / 2 + 1
    angle = torch.rand(count, 1, generator=gen, dtype=torch.float64) * 180 - 90
    return torch.cat([b, ctr, wh, angle], 1)


class ConvertRotatedAndDeformableTest(unittest.TestCase):
    def _randomize(self, module, gen):
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.rand(p.shape, generator=gen, dtype=p.dtype) * 0.2 - 0.1)

    def test_rotated_roi_layers(self):
        gen = torch.Generator().manual_seed(5)
        model = nn.ModuleDict({"d2": D2ROIAlignRotated((5, 4), 0.5, 3),
                               "mmcv": MmcvRoIAlignRotated(6, 0.25, 0, aligned=False, clockwise=True)})
        x = torch.rand(2, 3, 20, 24, generator=gen, dtype=torch.float64)
        rois = _rotated_rois(gen, 2, 7, 40)
        ref = {k: m(x, rois) for k, m in model.items()}
        detops_torch.convert(model, backward_mode="truncated", truncation="bfloat16")
        self.assertIs(type(model["d2"]), detops_torch.ROIAlignRotated)
        self.assertIs(type(model["mmcv"]), detops_torch.RoIAlignRotated)
        m = model["mmcv"]
        self.assertEqual((m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned, m.clockwise, m.backward_mode,
                          m.truncation), ((6, 6), 0.25, 0, False, True, "truncated", "bfloat16"))
        for k, m in model.items():
            assert_bitwise_equal(self, m(x, rois), ref[k], k)

    def test_deformable_convolutions(self):
        gen = torch.Generator().manual_seed(6)
        model = nn.Module()
        model.dcn = MmcvDCNv2(4, 6, 3, stride=2, padding=2, dilation=2, groups=2, deform_groups=2)
        model.dcn_nobias = MmcvDCNv2(4, 4, (3, 1), padding=(1, 0), bias=False)
        model.dcn_v1 = MmcvDCN(4, 6, 3, stride=2, padding=1, dilation=2, groups=2, deform_groups=2, im2col_step=8)
        self._randomize(model, gen)
        model.double()
        x = torch.rand(2, 4, 9, 11, generator=gen, dtype=torch.float64)
        ref = [model.dcn(x), model.dcn_nobias(x), model.dcn_v1(x)]
        params = {k: v for k, v in model.named_parameters()}
        rng = torch.get_rng_state()
        detops_torch.convert(model, backward_mode="atomic")
        self.assertTrue(torch.equal(torch.get_rng_state(), rng), "conversion moved the global random stream")
        self.assertIs(type(model.dcn), detops_torch.ModulatedDeformConv2dPack)
        self.assertEqual((model.dcn.deform_groups, model.dcn.groups, model.dcn.dilation, model.dcn.backward_mode),
                         (2, 2, (2, 2), "atomic"))
        self.assertIsNone(model.dcn_nobias.bias)
        for k, v in model.named_parameters():
            self.assertIs(v, params[k], k)  # the same Parameters: optimizers and checkpoints still apply
        self.assertEqual(set(params), {k for k, _ in model.named_parameters()})
        assert_bitwise_equal(self, model.dcn(x), ref[0], "ModulatedDeformConv2dPack")
        assert_bitwise_equal(self, model.dcn_nobias(x), ref[1], "ModulatedDeformConv2dPack without bias")
        v1 = model.dcn_v1
        self.assertIs(type(v1), detops_torch.DeformConv2dPack)
        self.assertEqual((v1.deform_groups, v1.groups, v1.stride, v1.dilation, v1.im2col_step, v1.backward_mode),
                         (2, 2, (2, 2), (2, 2), 8, "atomic"))
        assert_bitwise_equal(self, v1(x), ref[2], "DeformConv2dPack")

    @staticmethod
    def _offset_inputs(gen):
        """x [2, 4, 9, 11]; a DCNv1 offset for 2 deformable groups at stride 2; a DCNv2 offset and
        mask for 1 group at stride 1."""
        x = torch.rand(2, 4, 9, 11, generator=gen, dtype=torch.float64)
        off1 = torch.randn(2, 2 * 2 * 9, 5, 6, generator=gen, dtype=torch.float64)
        off2 = torch.randn(2, 2 * 9, 9, 11, generator=gen, dtype=torch.float64)
        mask2 = torch.rand(2, 9, 9, 11, generator=gen, dtype=torch.float64)
        return x, off1, off2, mask2

    def test_mmcv_layers_that_take_offsets(self):
        gen = torch.Generator().manual_seed(8)
        model = nn.ModuleDict({"v1": MmcvDeformConv2d(4, 6, 3, stride=2, padding=1, groups=2, deform_groups=2,
                                                      im2col_step=4),
                               "v2": MmcvModulatedDeformConv2d(4, 6, 3, padding=2, dilation=2, bias=False)})
        self._randomize(model, gen)
        model.double()
        x, off1, off2, mask2 = self._offset_inputs(gen)
        ref = [model["v1"](x, off1), model["v2"](x, off2, mask2)]
        params = {k: v for k, v in model.named_parameters()}
        detops_torch.convert(model, backward_mode="atomic")
        self.assertIs(type(model["v1"]), compat.DeformConv2d)
        self.assertIs(type(model["v2"]), compat.ModulatedDeformConv2d)
        self.assertEqual((model["v1"].deform_groups, model["v1"].groups, model["v1"].im2col_step, model["v1"].backward_mode),
                         (2, 2, 4, "atomic"))
        self.assertIsNone(model["v2"].bias)
        for k, v in model.named_parameters():
            self.assertIs(v, params[k], k)
        assert_bitwise_equal(self, model["v1"](x, off1), ref[0], "DeformConv2d")
        assert_bitwise_equal(self, model["v2"](x, off2, mask2), ref[1], "ModulatedDeformConv2d")

    def test_detectron2_deformable_convolutions_and_their_norms(self):
        # detectron2's DeformConv / ModulatedDeformConv (its border rule, which is mmcv's), the very
        # Parameters kept; their norm is converted too (a detectron2 FrozenBatchNorm2d here).
        gen = torch.Generator().manual_seed(9)
        model = nn.ModuleDict({
            "v1": D2DeformConv(4, 6, 3, stride=2, padding=1, groups=2, deformable_groups=2,
                               norm=D2FrozenBatchNorm2d(6), activation=torch.relu),
            "v2": D2ModulatedDeformConv(4, 6, 3, padding=2, dilation=2, bias=False)})
        self._randomize(model, gen)
        model.double()
        x, off1, off2, mask2 = self._offset_inputs(gen)
        ref = [model["v1"](x, off1), model["v2"](x, off2, mask2)]
        params = {k: v for k, v in model.named_parameters()}
        detops_torch.convert(model, backward_mode="atomic")
        self.assertIs(type(model["v1"]), compat.DeformConv)
        self.assertIs(type(model["v2"]), compat.ModulatedDeformConv)
        self.assertIs(type(model["v1"].norm), compat.FrozenBatchNorm2d)
        self.assertIs(model["v1"].activation, torch.relu)
        self.assertEqual((model["v1"].deformable_groups, model["v1"].groups, model["v1"].stride,
                          model["v1"].backward_mode), (2, 2, (2, 2), "atomic"))
        self.assertIsNone(model["v2"].bias)
        for k, v in model.named_parameters():
            self.assertIs(v, params[k], k)
        assert_bitwise_equal(self, model["v1"](x, off1), ref[0], "DeformConv with its norm and activation")
        assert_bitwise_equal(self, model["v2"](x, off2, mask2), ref[1], "ModulatedDeformConv")

    @unittest.skipUnless(torchvision is not None, "torchvision is not installed")
    def test_torchvision_deform_conv2d(self):
        gen = torch.Generator().manual_seed(7)
        model = nn.Sequential(torchvision.ops.DeformConv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2),
                              nn.Sequential(torchvision.ops.DeformConv2d(6, 2, 1, bias=False))).double()
        x = torch.rand(1, 4, 10, 9, generator=gen, dtype=torch.float64)
        off0 = torch.randn(1, 2 * 9, 5, 5, generator=gen, dtype=torch.float64)
        mask0 = torch.rand(1, 9, 5, 5, generator=gen, dtype=torch.float64)
        off1 = torch.randn(1, 2, 5, 5, generator=gen, dtype=torch.float64)
        ref = model[1][0](model[0](x, off0, mask0), off1)
        weight = model[0].weight
        detops_torch.convert(model)
        self.assertIs(type(model[0]), detops_torch.DeformConv2d)
        self.assertIs(type(model[1][0]), detops_torch.DeformConv2d)
        self.assertIs(model[0].weight, weight)
        self.assertEqual((model[0].stride, model[0].padding, model[0].groups, model[0].backward_mode), ((2, 2), (1, 1), 2,
                                                                                              "exact"))
        self.assertIsNone(model[1][0].bias)
        got = model[1][0](model[0](x, off0, mask0), off1)
        self.assertLessEqual(max_rel_error(got, ref), 1e-12)  # float64: detops vs torchvision's kernels

    def test_deformable_attention(self):
        gen = torch.Generator().manual_seed(8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # 12 channels per head: not a power of 2
            mmcv = MmcvMSDA(embed_dims=24, num_heads=2, num_levels=2, num_points=3, dropout=0.25, batch_first=True,
                            value_proj_ratio=0.5)
        detr = DetrMSDeformAttn(d_model=16, n_levels=2, n_heads=4, n_points=2)
        model = nn.ModuleList([mmcv, detr])
        self._randomize(model, gen)
        model.double().eval()
        shapes = torch.tensor([[4, 5], [2, 3]])
        start = torch.tensor([0, 20])
        q = torch.rand(2, 3, 24, generator=gen, dtype=torch.float64)
        ref_pts = torch.rand(2, 3, 2, 2, generator=gen, dtype=torch.float64)
        v = torch.rand(2, 26, 24, generator=gen, dtype=torch.float64)
        q2, v2 = q[..., :16].contiguous(), v[..., :16].contiguous()
        ref = [mmcv(q, value=v, reference_points=ref_pts, spatial_shapes=shapes, level_start_index=start),
               detr(q2, ref_pts, v2, shapes, start)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            detops_torch.convert(model)
        self.assertIs(type(model[0]), detops_torch.MultiScaleDeformableAttention)
        self.assertIs(type(model[1]), detops_torch.MSDeformAttn)
        self.assertIs(model[0].value_proj, mmcv.value_proj)
        self.assertEqual((model[0].dropout.p, model[0].batch_first, model[0].value_proj.out_features), (0.25, True, 12))
        self.assertFalse(model[0].training)
        got = [model[0](q, value=v, reference_points=ref_pts, spatial_shapes=shapes, level_start_index=start),
               model[1](q2, ref_pts, v2, shapes, start)]
        assert_bitwise_equal(self, got[0], ref[0], "MultiScaleDeformableAttention")
        assert_bitwise_equal(self, got[1], ref[1], "MSDeformAttn")


if __name__ == "__main__":
    unittest.main()


class _BoxFeatures(nn.Module):
    """A detection model's box branch: FPN backbone, RoI pooler, box head (features per box)."""

    def __init__(self, backbone, pool, head):
        super().__init__()
        self.backbone, self.pool, self.head = backbone, pool, head

    def forward(self, images, boxes):
        features = self.backbone(images)
        return self.head(self.pool(features, boxes, [(128, 128), (128, 128)]))


def _fx_cases():
    """(module, inputs) for every detops module: torchvision's, detectron2's, mmcv's, Deformable-DETR's."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 12, 14, generator=gen, dtype=torch.float64)
    rois = random_rois(gen, 2, 6, 12.0, 14.0, dtype=torch.float64)
    rotated = torch.cat([rois[:, :1], rois[:, 1:3] + 2, (rois[:, 3:5] - rois[:, 1:3]).abs() + 1,
                         torch.rand(6, 1, generator=gen, dtype=torch.float64) * 90], 1)
    offset = torch.randn(2, 18, 12, 14, generator=gen, dtype=torch.float64)
    mask = torch.rand(2, 9, 12, 14, generator=gen, dtype=torch.float64)
    bn = detops_torch.FrozenBatchNorm2d(4).double()
    bn.running_var.uniform_(0.5, 1.5, generator=gen)
    value = torch.randn(2, 12 * 14 + 6 * 7, 16, generator=gen, dtype=torch.float64)
    query = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    refs = torch.rand(2, 5, 2, 2, generator=gen, dtype=torch.float64)
    shapes = torch.tensor([[12, 14], [6, 7]])
    start = torch.tensor([0, 12 * 14])
    boxes = [rois[:3, 1:] * 4, rois[3:, 1:] * 4]
    features = {"0": torch.randn(2, 4, 32, 32, generator=gen, dtype=torch.float64),
                "1": torch.randn(2, 4, 16, 16, generator=gen, dtype=torch.float64)}
    cases = [
        (detops_torch.RoIAlign(3, 0.5, 2, True), (x, rois)),
        (compat.ROIAlign(3, 0.5, 2), (x, rois)),
        (compat.RoIAlign(3, 0.5, 2, "max"), (x, rois)),
        (detops_torch.ROIAlignRotated(3, 0.5, 2), (x, rotated)),
        (detops_torch.RoIAlignRotated(3, 0.5, 2), (x, rotated)),
        (bn, (x,)),
        (compat.FrozenBatchNorm2d(4).double(), (x,)),
        (detops_torch.MultiScaleRoIAlign(["0", "1"], 3, 2), (features, boxes, [(128, 128), (128, 128)])),
        (detops_torch.DeformConv2d(4, 6, 3, padding=1).double(), (x, offset, mask)),
        (detops_torch.DeformConv2dPack(4, 6, 3, padding=1).double(), (x,)),
        (detops_torch.ModulatedDeformConv2dPack(4, 6, 3, padding=1).double(), (x,)),
        (compat.DeformConv2d(4, 6, 3, padding=1).double(), (x, offset)),
        (compat.DeformConv2d(4, 6, 3).double(), (x[:, :, :2, :5], offset[:, :, :0, :3])),  # padded to the kernel
        (compat.ModulatedDeformConv2d(4, 6, 3, padding=1).double(), (x, offset, mask)),
        (detops_torch.MSDeformAttn(16, 2, 2, 2).double(), (query, refs, value, shapes, start),
         {"input_padding_mask": None}),
    ]
    if tuple(int(p) for p in torch.__version__.split(".")[:1]) >= (2,):
        # Its forward takes **kwargs (as mmcv's), which FX on torch 1.13 under Python 3.11 cannot trace.
        attn = detops_torch.MultiScaleDeformableAttention(16, 2, 2, 2, batch_first=True).double().eval()
        cases.append((attn, (query, None, value, None, None, None, refs, shapes, start),
                      dict(key=None, identity=None, query_pos=None, key_padding_mask=None)))
    return [case if len(case) == 3 else case + (None,) for case in cases]


class FxTest(unittest.TestCase):
    def test_every_module_traces(self):
        # torch.fx.symbolic_trace failed for RoIAlign, the compat RoI layers, both rotated layers,
        # FrozenBatchNorm2d and more (issue 27): every module traces and its graph computes the
        # module's bits, leaving the module's state as it was.
        for module, inputs, absent in _fx_cases():  # absent: optional arguments traced as None
            with self.subTest(type(module).__module__ + "." + type(module).__name__):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    traced = torch.fx.symbolic_trace(module, concrete_args=absent)
                if isinstance(module, detops_torch.MultiScaleRoIAlign):
                    self.assertIsNone(module.scales, "tracing must not store proxies as the scales")
                with torch.no_grad():
                    assert_bitwise_equal(self, traced(*inputs), module(*inputs), "traced")

    @unittest.skipUnless(torchvision is not None, "torchvision is not installed")
    def test_create_feature_extractor_after_convert(self):
        # torchvision's feature extraction (FX underneath) on a converted detection backbone and
        # box branch: the node names list, and the extracted features are the eager module's.
        from torchvision.models.detection.faster_rcnn import TwoMLPHead
        from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names
        from torchvision.ops import MultiScaleRoIAlign as TvMultiScaleRoIAlign

        torch.manual_seed(3)
        backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, norm_layer=TvFrozenBatchNorm2d,
                                       trainable_layers=3)
        model = _BoxFeatures(backbone, TvMultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2),
                             TwoMLPHead(256 * 7 * 7, 32)).double().eval()
        _randomize_norms(model, 4)
        detops_torch.convert(model)
        self.assertEqual(_count(model, detops_torch.FrozenBatchNorm2d), 20)
        self.assertIs(type(model.pool), detops_torch.MultiScaleRoIAlign)
        train_nodes, eval_nodes = get_graph_node_names(model)
        self.assertEqual(train_nodes, eval_nodes)
        self.assertIn("backbone.body.layer2.1.relu_1", eval_nodes)
        self.assertIn("backbone.body.bn1.frozen_batch_norm", eval_nodes)
        self.assertTrue(any(n.startswith("pool.") for n in eval_nodes))
        extractor = create_feature_extractor(model, {"backbone.body.layer2": "c3", "pool": "pooled",
                                                     "head": "box_features"})
        images = torch.rand(2, 3, 128, 128, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
        boxes = [torch.tensor([[4.0, 8.0, 60.0, 90.0], [0.0, 0.0, 127.0, 127.0]], dtype=torch.float64),
                 torch.tensor([[30.0, 20.0, 50.0, 44.0]], dtype=torch.float64)]
        seen = {}
        hooks = [getattr(model.backbone.body, "layer2").register_forward_hook(lambda m, i, o: seen.update(c3=o)),
                 model.pool.register_forward_hook(lambda m, i, o: seen.update(pooled=o))]
        with torch.no_grad():
            got = extractor(images, boxes)
            seen["box_features"] = model(images, boxes)
        for h in hooks:
            h.remove()
        self.assertEqual(sorted(got), ["box_features", "c3", "pooled"])
        for key in got:
            assert_bitwise_equal(self, got[key], seen[key], key)
