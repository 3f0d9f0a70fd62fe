# Tests of detops_torch.ms_deform_attn and the attention modules: parity with the pure-PyTorch composition, gradcheck, reproducibility, needed gradients only, meta, TorchScript, bad input, the anchors' signatures and state dicts.
import inspect
import itertools
import unittest
from unittest import mock

import torch
import torch.nn.functional as TF

import detops_torch
from detops_torch._ops.ms_deform_attn import nn as dnn  # the module whose ms_deform_attn the modules call
from _util import (HAS_CUDA, TORCH_2_1, assert_bitwise_equal, assert_raises_untouched, max_rel_error, num_threads,
                   tensor_bytes, tensor_hash)

SHAPES = [(6, 7), (3, 4), (2, 2)]  # (H, W) per level; small and not square


def _levels(shapes):
    spatial = torch.tensor(shapes, dtype=torch.int64)
    sizes = spatial[:, 0] * spatial[:, 1]
    start = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
    return spatial, start, int(sizes.sum())


def _inputs(seed, dtype=torch.float64, b=2, q=5, m=2, d=3, p=2, shapes=SHAPES, spread=0.15):
    """value, spatial_shapes, level_start_index, sampling_locations (reaching ``spread`` outside
    [0, 1], so that skipped samples and zero padding are exercised), attention_weights."""
    gen = torch.Generator().manual_seed(seed)
    spatial, start, s = _levels(shapes)
    nl = len(shapes)
    value = torch.randn(b, s, m, d, generator=gen, dtype=torch.float64).to(dtype)
    loc = (torch.rand(b, q, m, nl, p, 2, generator=gen, dtype=torch.float64) * (1 + 2 * spread) - spread).to(dtype)
    attn = torch.rand(b, q, m, nl, p, generator=gen, dtype=torch.float64).to(dtype)
    return value, spatial, start, loc, attn, gen


def composition(value, spatial_shapes, sampling_locations, attention_weights):
    """Multi-scale deformable attention as torch operations (what mmcv's and Deformable-DETR's
    pure-PyTorch paths compute): per level, a bilinear grid_sample with zeros padding and
    align_corners=False of each head's channels at 2 * location - 1, weighted and summed."""
    b, _, m, d = value.shape
    _, q, _, nl, p, _ = sampling_locations.shape
    sizes = [int(h) * int(w) for h, w in spatial_shapes.tolist()]
    sampled = []
    for level, (piece, (h, w)) in enumerate(zip(value.split(sizes, dim=1), spatial_shapes.tolist())):
        maps = piece.permute(0, 2, 3, 1).reshape(b * m, d, h, w)
        grid = (2 * sampling_locations[:, :, :, level] - 1).transpose(1, 2).reshape(b * m, q, p, 2)
        sampled.append(TF.grid_sample(maps, grid, mode="bilinear", padding_mode="zeros", align_corners=False))
    stacked = torch.stack(sampled, dim=-2).flatten(-2)  # [b*m, d, q, nl*p]
    weights = attention_weights.transpose(1, 2).reshape(b * m, 1, q, nl * p)
    return (stacked * weights).sum(-1).view(b, m * d, q).transpose(1, 2).contiguous()


def _run(fn, value, loc, attn, grad_out):
    """(output, grad_value, grad_locations, grad_weights)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (value, loc, attn)]
    out = fn(*leaves)
    out.backward(grad_out)
    return (out.detach(),) + tuple(t.grad for t in leaves)


NAMES = ("output", "grad_value", "grad_sampling_locations", "grad_attention_weights")


class CompositionParityTest(unittest.TestCase):
    def test_float64_matches_the_composition(self):
        for i, mode in enumerate(("exact", "atomic")):
            for d, p in ((3, 2), (8, 4)):
                value, spatial, start, loc, attn, gen = _inputs(i, d=d, p=p)
                g = torch.randn(2, 5, 2 * d, generator=gen, dtype=torch.float64)
                ours = _run(lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a, mode),
                            value, loc, attn, g)
                ref = _run(lambda v, l, a: composition(v, spatial, l, a), value, loc, attn, g)
                for name, a, b in zip(NAMES, ours, ref):
                    # The same products, summed in another order: within 4e-15 of the largest
                    # value, about 18 ulps (measured: below 5e-16).
                    self.assertLessEqual(max_rel_error(a, b), 4e-15, f"{name} {mode} D={d} P={p}")

    def test_16bit_and_float32_close(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)):
            value, spatial, start, loc, attn, gen = _inputs(10, dtype=dtype)
            g = torch.randn(2, 5, 6, generator=gen).to(dtype)
            ours = _run(lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a), value, loc, attn, g)
            self.assertTrue(all(t.dtype == dtype for t in ours), dtype)  # natively, no upcast
            ref = _run(lambda v, l, a: composition(v, spatial, l, a), value.double(), loc.double(), attn.double(),
                       g.double())
            for name, a, b in zip(NAMES, ours, ref):
                torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol, msg=f"{name} {dtype}")

    def test_float32_locations_with_a_16bit_value(self):
        value, spatial, start, loc, attn, _ = _inputs(11, dtype=torch.float16)
        out = detops_torch.ms_deform_attn(value, spatial, start, loc.float(), attn)
        ref = composition(value.double(), spatial, loc.float().double(), attn.double())
        torch.testing.assert_close(out.double(), ref, rtol=4e-3, atol=4e-3)

    def test_weights_cast_to_the_value_dtype_as_mmcv(self):
        # mmcv's Function casts the attention weights to the value's dtype: a 16-bit value with
        # float32 weights (autocast's softmax) works (issue 27: it raised); the locations keep
        # their precision, and the weights' gradient comes back in their dtype.
        for dtype in (torch.float16, torch.bfloat16):
            value, spatial, start, loc, attn, _ = _inputs(12, dtype=dtype)
            loc32 = loc.float().requires_grad_(True)
            attn32 = attn.float().requires_grad_(True)
            out = detops_torch.ms_deform_attn(value, spatial, start, loc32, attn32)
            expected = torch.ops.detops.ms_deform_attn(value, spatial, start, loc.float(), attn.float().to(dtype))
            assert_bitwise_equal(self, out, expected, f"{dtype} value, float32 weights")
            out.float().sum().backward()
            self.assertEqual((attn32.grad.dtype, loc32.grad.dtype), (torch.float32, torch.float32))
        value, spatial, start, loc, attn, _ = _inputs(13, dtype=torch.float32)
        assert_bitwise_equal(self, detops_torch.ms_deform_attn(value, spatial, start, loc.double(), attn.double()),
                             torch.ops.detops.ms_deform_attn(value, spatial, start, loc.double(), attn),
                             "float64 weights with a float32 value, float64 locations kept")


class GradientTest(unittest.TestCase):
    def test_gradcheck(self):
        for i, mode in enumerate(("exact", "atomic")):
            value, spatial, start, loc, attn, _ = _inputs(20 + i, b=1, q=2, m=2, d=2, p=2,
                                                          shapes=[(3, 4), (2, 3)])
            args = tuple(t.requires_grad_(True) for t in (value, loc, attn))
            fn = lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a, mode)  # noqa: E731
            self.assertTrue(torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-7), mode)

    def test_only_needed_gradients_are_computed(self):
        value, spatial, start, loc, attn, gen = _inputs(30)
        g = torch.randn(2, 5, 6, generator=gen, dtype=torch.float64)
        full = _run(lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a), value, loc, attn, g)[1:]
        for mask in itertools.product((False, True), repeat=3):
            grads = torch.ops.detops._ms_deform_attn_backward(g, value, spatial, start, loc, attn, "exact", *mask)
            for name, wanted, got, ref in zip(NAMES[1:], mask, grads, full):
                if wanted:
                    assert_bitwise_equal(self, got, ref, f"{name} with mask {mask}")
                else:
                    self.assertIsNone(got, f"{name} with mask {mask}")
        # Through autograd: only the tensors that require grad get one.
        v = value.clone().requires_grad_(True)
        detops_torch.ms_deform_attn(v, spatial, start, loc, attn).backward(g)
        assert_bitwise_equal(self, v.grad, full[0], "value only")
        l = loc.clone().requires_grad_(True)  # noqa: E741
        detops_torch.ms_deform_attn(value, spatial, start, l, attn).backward(g)
        assert_bitwise_equal(self, l.grad, full[1], "locations only")

    def test_empty_batch_and_queries(self):
        for b, q in ((0, 5), (2, 0)):
            value, spatial, start, loc, attn, _ = _inputs(32, b=b, q=q)
            out, gv, gl, ga = _run(lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a), value, loc,
                                   attn, torch.ones(b, q, 6, dtype=value.dtype))
            self.assertEqual(tuple(out.shape), (b, q, 6))
            self.assertEqual([tuple(t.shape) for t in (gv, gl, ga)], [tuple(t.shape) for t in (value, loc, attn)])
            self.assertEqual(int((gv != 0).sum()), 0)

    def test_double_backward_raises(self):
        value, spatial, start, loc, attn, gen = _inputs(31)
        value.requires_grad_(True)
        out = detops_torch.ms_deform_attn(value, spatial, start, loc, attn)
        g = torch.randn(out.shape, generator=gen, dtype=out.dtype, requires_grad=True)
        (gv,) = torch.autograd.grad(out, value, g, create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "double backward is not supported"):
            gv.sum().backward()


class ReproducibilityTest(unittest.TestCase):
    def _hash(self, mode, threads, seed=40):
        # Many queries over small levels: each value row receives many contributions.
        value, spatial, start, loc, attn, gen = _inputs(seed, dtype=torch.float32, b=2, q=300, m=4, d=8, p=4,
                                                        shapes=[(8, 9), (4, 5), (2, 3)])
        w = torch.randn(2, 300, 32, generator=gen)
        with num_threads(threads):
            leaves = [t.clone().requires_grad_(True) for t in (value, loc, attn)]
            out = detops_torch.ms_deform_attn(leaves[0] * 1.5, spatial, start, leaves[1], leaves[2], mode)
            (out * w).sum().backward()
            return tensor_hash(out, *(t.grad for t in leaves))

    def test_exact_gradients_identical_across_runs_and_threads(self):
        hashes = {self._hash("exact", t) for t in (1, 2, 1, 2)}
        self.assertEqual(len(hashes), 1, hashes)

    def test_cpu_atomic_repeats_at_a_fixed_thread_count(self):
        self.assertEqual(len({self._hash("atomic", 2) for _ in range(3)}), 1)

    def test_hash_is_sensitive(self):
        self.assertNotEqual(self._hash("exact", 1, seed=40), self._hash("exact", 1, seed=41))


class MetaAndScriptTest(unittest.TestCase):
    def test_meta_tensors(self):
        spatial, start, s = _levels(SHAPES)
        value = torch.empty(2, s, 4, 8, device="meta", dtype=torch.bfloat16)
        loc = torch.empty(2, 9, 4, 3, 2, 2, device="meta")
        attn = torch.empty(2, 9, 4, 3, 2, device="meta", dtype=torch.bfloat16)
        # The level tables may stay host tensors (as in a CUDA call).
        for tables in ((spatial, start), (spatial.to("meta"), start.to("meta"))):
            out = torch.ops.detops.ms_deform_attn(value, *tables, loc, attn, "atomic")
            self.assertEqual((out.device.type, tuple(out.shape), out.dtype), ("meta", (2, 9, 32), torch.bfloat16))
        grads = torch.ops.detops._ms_deform_attn_backward(torch.empty(2, 9, 32, device="meta"), value, spatial,
                                                          start, loc, attn, "exact", True, True, False)
        self.assertEqual([tuple(t.shape) for t in grads[:2]], [tuple(value.shape), tuple(loc.shape)])
        self.assertEqual((grads[0].dtype, grads[1].dtype), (torch.bfloat16, torch.float32))
        self.assertIsNone(grads[2])
        with self.assertRaisesRegex(ValueError, "mode"):
            torch.ops.detops.ms_deform_attn(value, spatial, start, loc, attn, "truncated")
        with self.assertRaisesRegex(ValueError, "device|meta"):
            torch.ops.detops.ms_deform_attn(value, spatial, start, torch.zeros(2, 9, 4, 3, 2, 2), attn, "exact")

    def test_torchscript(self):
        def op_call(v: torch.Tensor, shapes: torch.Tensor, start: torch.Tensor, loc: torch.Tensor,
                    attn: torch.Tensor) -> torch.Tensor:
            return torch.ops.detops.ms_deform_attn(v, shapes, start, loc, attn, "exact")

        scripted = torch.jit.script(op_call)
        value, spatial, start, loc, attn, _ = _inputs(50)
        assert_bitwise_equal(self, scripted(value, spatial, start, loc, attn),
                             op_call(value, spatial, start, loc, attn), "scripted op call")
        self.assertIn("detops::ms_deform_attn", str(scripted.graph))
        scripted_fn = torch.jit.script(detops_torch.ms_deform_attn)
        assert_bitwise_equal(self, scripted_fn(value, spatial, start, loc, attn, "atomic"),
                             op_call(value, spatial, start, loc, attn), "scripted functional")


    @unittest.skipUnless(TORCH_2_1 and hasattr(torch.library, "opcheck"), "torch.library.opcheck needs torch >= 2.1")
    def test_opcheck(self):
        value, spatial, start, loc, attn, _ = _inputs(51)
        for dev in ["cpu"] + (["cuda"] if HAS_CUDA else []):
            for mode in ("exact", "atomic"):
                args = (value.to(dev).requires_grad_(True), spatial.to(dev), start.to(dev),
                        loc.to(dev).requires_grad_(True), attn.to(dev).requires_grad_(True), mode)
                torch.library.opcheck(torch.ops.detops.ms_deform_attn.default, args)

    @unittest.skipUnless(TORCH_2_1, "torch.compile over custom ops needs torch >= 2.1")
    def test_torch_compile_fullgraph(self):
        value, spatial, start, loc, attn, _ = _inputs(52)

        def fn(v, l, a):
            return detops_torch.ms_deform_attn(v * 2.0, spatial, start, l, a).square().sum()

        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        one = torch.tensor(1.0, dtype=value.dtype)
        for name, a, b in zip(NAMES, _run(compiled, value, loc, attn, one), _run(fn, value, loc, attn, one)):
            assert_bitwise_equal(self, a, b, f"compiled {name}")


class BadInputTest(unittest.TestCase):
    def _raises(self, pattern, fn, *tensors):
        assert_raises_untouched(self, pattern, fn, *tensors)

    def test_shapes_dtypes_tables_and_mode(self):
        value, spatial, start, loc, attn, _ = _inputs(60, dtype=torch.float32)
        msda = detops_torch.ms_deform_attn
        wrong_start = start.clone()
        wrong_start[1] += 1
        cases = [
            (r"value.*\[B, S, M, D\]", lambda: msda(value[0], spatial, start, loc, attn)),
            (r"sampling_locations.*\[B, Q, M, L, P, 2\]", lambda: msda(value, spatial, start, loc[0], attn)),
            (r"attention_weights.*\[B, Q, M, L, P\]", lambda: msda(value, spatial, start, loc, attn[0])),
            ("level_start_index", lambda: msda(value, spatial, wrong_start, loc, attn)),
            ("spatial_shapes|S", lambda: msda(value[:, 1:], spatial, start, loc, attn)),  # S != sum of H*W
            ("spatial_shapes", lambda: msda(value, spatial.int(), start, loc, attn)),
            ("attention_weights", lambda: torch.ops.detops.ms_deform_attn(value, spatial, start, loc, attn.double())),
            ("dtype", lambda: msda(value.long(), spatial, start, loc, attn)),
            ("mode.*'truncated'", lambda: msda(value, spatial, start, loc, attn, "truncated")),
        ]
        for pattern, fn in cases:
            with self.subTest(pattern=pattern):
                self._raises(pattern, fn, value, spatial, start, loc, attn)


# ---- The modules ------------------------------------------------------------------------------

# The anchors' constructor parameters (name, default), in order, from their source:
# open-mmlab/mmcv mmcv/ops/multi_scale_deform_attn.py and fundamentalvision/Deformable-DETR
# models/ops/modules/ms_deform_attn.py.
MMCV_PARAMS = [("embed_dims", 256), ("num_heads", 8), ("num_levels", 4), ("num_points", 4), ("im2col_step", 64),
               ("dropout", 0.1), ("batch_first", False), ("norm_cfg", None), ("init_cfg", None),
               ("value_proj_ratio", 1.0)]
MMCV_FORWARD = ["query", "key", "value", "identity", "query_pos", "key_padding_mask", "reference_points",
                "spatial_shapes", "level_start_index", "kwargs"]
DETR_PARAMS = [("d_model", 256), ("n_levels", 4), ("n_heads", 8), ("n_points", 4)]
DETR_FORWARD = ["query", "reference_points", "input_flatten", "input_spatial_shapes", "input_level_start_index",
                "input_padding_mask"]


def anchor_state_shapes(embed_dims, num_heads, num_levels, num_points, value_proj_ratio=1.0):
    """The state dict (key -> shape) the anchors' constructors create: four nn.Linear layers,
    sampling_offsets (C -> M*L*P*2), attention_weights (C -> M*L*P), value_proj (C -> C*ratio),
    output_proj (C*ratio -> C)."""
    value_dims = int(embed_dims * value_proj_ratio)
    layers = {"sampling_offsets": (embed_dims, num_heads * num_levels * num_points * 2),
              "attention_weights": (embed_dims, num_heads * num_levels * num_points),
              "value_proj": (embed_dims, value_dims), "output_proj": (value_dims, embed_dims)}
    shapes = {}
    for name, (fan_in, fan_out) in layers.items():
        shapes[f"{name}.weight"] = (fan_out, fan_in)
        shapes[f"{name}.bias"] = (fan_out,)
    return shapes


def _state_shapes(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _encoder_case(seed, batch=2, queries=11, channels=32, levels=((6, 7), (3, 4)), dtype=torch.float64, box=False):
    gen = torch.Generator().manual_seed(seed)
    spatial, start, s = _levels(list(levels))
    query = torch.randn(batch, queries, channels, generator=gen, dtype=torch.float64).to(dtype)
    value = torch.randn(batch, s, channels, generator=gen, dtype=torch.float64).to(dtype)
    ref = torch.rand(batch, queries, len(levels), 4 if box else 2, generator=gen, dtype=torch.float64).to(dtype)
    mask = torch.rand(batch, s, generator=gen) < 0.1
    return query, value, ref, spatial, start, mask


class ModuleInterfaceTest(unittest.TestCase):
    def _assert_signature(self, fn, expected, skip_self=True):
        params = [p for p in inspect.signature(fn).parameters.values() if not (skip_self and p.name == "self")]
        head = params[:len(expected)]
        self.assertEqual([p.name for p in head], [n for n, _ in expected])
        for p, (name, default) in zip(head, expected):
            self.assertEqual(p.default, default, name)
            self.assertIs(type(p.default), type(default), name)
        # detops' own options: keyword-only, after the anchor's (`mode`: backward_mode's old name)
        extra = [(p.name, p.kind, p.default) for p in params[len(expected):]]
        self.assertIn(extra, ([], [("backward_mode", inspect.Parameter.KEYWORD_ONLY, "exact"),
                                   ("mode", inspect.Parameter.KEYWORD_ONLY, None)]))

    def test_constructor_and_forward_signatures_are_the_anchors(self):
        self._assert_signature(detops_torch.MultiScaleDeformableAttention.__init__, MMCV_PARAMS)
        self._assert_signature(detops_torch.MSDeformAttn.__init__, DETR_PARAMS)
        forward = inspect.signature(detops_torch.MultiScaleDeformableAttention.forward).parameters
        self.assertEqual([n for n in forward if n != "self"], MMCV_FORWARD)
        forward = inspect.signature(detops_torch.MSDeformAttn.forward).parameters
        self.assertEqual([n for n in forward if n != "self"], DETR_FORWARD)

    def test_state_dict_keys_and_shapes_are_the_anchors(self):
        for kwargs in ({}, {"embed_dims": 64, "num_heads": 4, "num_levels": 3, "num_points": 2},
                       {"embed_dims": 64, "value_proj_ratio": 0.5}):
            mod = detops_torch.MultiScaleDeformableAttention(**kwargs)
            args = {k: kwargs.get(k, d) for k, d in MMCV_PARAMS}
            expected = anchor_state_shapes(args["embed_dims"], args["num_heads"], args["num_levels"],
                                           args["num_points"], args["value_proj_ratio"])
            self.assertEqual(_state_shapes(mod), expected, kwargs)
        for args in ((), (64, 3, 4, 2)):
            mod = detops_torch.MSDeformAttn(*args)
            d_model, n_levels, n_heads, n_points = args or (256, 4, 8, 4)
            self.assertEqual(_state_shapes(mod), anchor_state_shapes(d_model, n_heads, n_levels, n_points), args)

    def test_an_anchor_shaped_checkpoint_loads_strictly(self):
        gen = torch.Generator().manual_seed(65)
        checkpoint = {k: torch.randn(shape, generator=gen) for k, shape in anchor_state_shapes(64, 4, 3, 2).items()}
        for mod in (detops_torch.MultiScaleDeformableAttention(64, 4, 3, 2), detops_torch.MSDeformAttn(64, 3, 4, 2)):
            mod.load_state_dict(checkpoint)  # strict: no missing or unexpected key, no shape mismatch
            for k, v in mod.state_dict().items():
                assert_bitwise_equal(self, v, checkpoint[k], k)

    def test_initialisation_is_the_anchors(self):
        for mod in (detops_torch.MultiScaleDeformableAttention(64, 4, 3, 2), detops_torch.MSDeformAttn(64, 3, 4, 2)):
            bias = mod.sampling_offsets.bias.view(4, 3, 2, 2)
            # Head h points along angle 2*pi*h/4, scaled so that the larger coordinate is 1;
            # point i is i + 1 times that; every level alike.
            directions = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
            for i in range(2):
                torch.testing.assert_close(bias[:, :, i], (directions * (i + 1))[:, None].expand(4, 3, 2),
                                           atol=1e-6, rtol=0)
            for t in (mod.sampling_offsets.weight, mod.attention_weights.weight, mod.attention_weights.bias,
                      mod.value_proj.bias, mod.output_proj.bias):
                self.assertEqual(int((t != 0).sum()), 0)
            bound = (6.0 / (64 + 64)) ** 0.5  # Xavier-uniform
            self.assertLessEqual(mod.value_proj.weight.abs().max().item(), bound)
            self.assertGreater(mod.value_proj.weight.abs().max().item(), 0.5 * bound)

    def test_bad_configuration(self):
        with self.assertRaisesRegex(ValueError, "divisible"):
            detops_torch.MultiScaleDeformableAttention(embed_dims=30, num_heads=8)
        with self.assertRaisesRegex(ValueError, "mode"):
            detops_torch.MSDeformAttn(backward_mode="truncated")


class ModuleBehaviourTest(unittest.TestCase):
    def _pair(self, seed, **kwargs):
        """An MSDeformAttn and an mmcv-style module with the same parameters (loaded from it)."""
        torch.manual_seed(seed)
        detr = detops_torch.MSDeformAttn(32, 2, 4, 2, **kwargs).double()
        # Break the initial symmetry (zero weights) so that the test sees every parameter.
        with torch.no_grad():
            for p in detr.parameters():
                p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.1)
        mmcv = detops_torch.MultiScaleDeformableAttention(32, 4, 2, 2, batch_first=True, **kwargs).double()
        mmcv.load_state_dict(detr.state_dict())  # strict: same keys, same shapes
        return detr.eval(), mmcv.eval()

    def test_checkpoints_load_both_ways_and_residual_is_the_difference(self):
        detr, mmcv = self._pair(70)
        detr2 = detops_torch.MSDeformAttn(32, 2, 4, 2).double()
        detr2.load_state_dict(mmcv.state_dict())
        for box in (False, True):
            query, value, ref, spatial, start, mask = _encoder_case(71, box=box)
            out = detr(query, ref, value, spatial, start, mask)
            assert_bitwise_equal(self, detr2(query, ref, value, spatial, start, mask), out, "reloaded")
            with_residual = mmcv(query, value=value, reference_points=ref, spatial_shapes=spatial,
                                 level_start_index=start, key_padding_mask=mask)
            # mmcv adds the identity (the query) after the (eval-mode: identity) dropout.
            assert_bitwise_equal(self, with_residual, out + query, f"residual, box={box}")
            identity = torch.randn_like(query)
            assert_bitwise_equal(self, mmcv(query, None, value, identity, reference_points=ref,
                                            spatial_shapes=spatial, level_start_index=start, key_padding_mask=mask),
                                 out + identity, "explicit identity")

    def test_module_matches_the_composition(self):
        detr, _ = self._pair(72)

        def reference(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, mode):
            return composition(value, spatial_shapes, sampling_locations, attention_weights)

        for box in (False, True):
            query, value, ref, spatial, start, mask = _encoder_case(73, box=box)
            leaves = [t.clone().requires_grad_(True) for t in (query, value, ref)]
            out = detr(leaves[0], leaves[2], leaves[1], spatial, start, mask)
            out.square().sum().backward()
            with mock.patch.object(dnn, "ms_deform_attn", reference):
                ref_leaves = [t.clone().requires_grad_(True) for t in (query, value, ref)]
                ref_out = detr(ref_leaves[0], ref_leaves[2], ref_leaves[1], spatial, start, mask)
                ref_out.square().sum().backward()
            # The projections are shared: only the sampling differs, by a few ulps (measured: below 1e-15).
            self.assertLessEqual(max_rel_error(out, ref_out), 4e-15, f"output box={box}")
            for name, a, b in zip(("query", "value", "reference_points"), leaves, ref_leaves):
                self.assertLessEqual(max_rel_error(a.grad, b.grad), 4e-15, f"grad {name} box={box}")

    def test_mmcv_sequence_first_and_query_pos(self):
        _, mmcv = self._pair(74)
        seq_first = detops_torch.MultiScaleDeformableAttention(32, 4, 2, 2).double().eval()
        seq_first.load_state_dict(mmcv.state_dict())
        query, value, ref, spatial, start, _ = _encoder_case(75)
        pos = torch.randn_like(query)
        expected = mmcv(query, value=value, query_pos=pos, reference_points=ref, spatial_shapes=spatial,
                        level_start_index=start)
        got = seq_first(query.transpose(0, 1), value=value.transpose(0, 1), query_pos=pos.transpose(0, 1),
                        reference_points=ref, spatial_shapes=spatial, level_start_index=start)
        assert_bitwise_equal(self, got.transpose(0, 1), expected, "batch_first=False")
        # value defaults to the query (self-attention over a flattened map of Q positions).
        spatial1, start1, _ = _levels([(11, 1)])
        ref1 = ref[:, :, :1]
        mmcv1 = detops_torch.MultiScaleDeformableAttention(32, 4, 1, 2, batch_first=True).double().eval()
        assert_bitwise_equal(self, mmcv1(query, reference_points=ref1, spatial_shapes=spatial1,
                                         level_start_index=start1),
                             mmcv1(query, value=query, reference_points=ref1, spatial_shapes=spatial1,
                                   level_start_index=start1), "value defaults to query")

    def test_dropout_in_training(self):
        _, mmcv = self._pair(76)
        mmcv.train()
        query, value, ref, spatial, start, _ = _encoder_case(77)
        kw = dict(value=value, reference_points=ref, spatial_shapes=spatial, level_start_index=start)
        torch.manual_seed(0)
        a = mmcv(query, **kw)
        torch.manual_seed(1)
        b = mmcv(query, **kw)
        self.assertNotEqual(tensor_bytes(a), tensor_bytes(b))  # dropout is active in training

    def test_deformable_detr_module_scripts(self):
        # mmcv's forward takes **kwargs, which TorchScript cannot compile; Deformable-DETR's scripts.
        detr, _ = self._pair(82)
        scripted = torch.jit.script(detr)
        for box in (False, True):
            query, value, ref, spatial, start, mask = _encoder_case(83, box=box)
            assert_bitwise_equal(self, scripted(query, ref, value, spatial, start, mask),
                                 detr(query, ref, value, spatial, start, mask), f"scripted, box={box}")

    def test_module_errors(self):
        detr, mmcv = self._pair(78)
        query, value, ref, spatial, start, _ = _encoder_case(79)
        with self.assertRaisesRegex(ValueError, "reference_points.*3"):
            detr(query, ref[..., :1].expand(*ref.shape[:-1], 3), value, spatial, start)
        with self.assertRaisesRegex(ValueError, "spatial_shapes"):
            detr(query, ref, value[:, 1:], spatial, start)
        with self.assertRaisesRegex(ValueError, "reference_points"):
            mmcv(query, value=value, spatial_shapes=spatial, level_start_index=start)

    def test_reproducible_training_step(self):
        def step(threads):
            torch.manual_seed(80)
            mod = detops_torch.MultiScaleDeformableAttention(32, 4, 2, 2, batch_first=True)
            query, value, ref, spatial, start, mask = _encoder_case(81, dtype=torch.float32, queries=64)
            with num_threads(threads):
                out = mod(query, value=value, reference_points=ref, spatial_shapes=spatial, level_start_index=start,
                          key_padding_mask=mask)
                out.square().mean().backward()
            return tensor_hash(out, *(p.grad for p in mod.parameters()))

        # Repeated at a fixed thread count: torch's own matrix products (the projections) are not
        # promised to give the same bits at another thread count; the op's independence of it is
        # tested above (ReproducibilityTest).
        self.assertEqual(len({step(2), step(2), step(2)}), 1)


@unittest.skipUnless(HAS_CUDA, "CUDA is not available")
class CudaTest(unittest.TestCase):
    def test_cuda_matches_cpu_bitwise_in_exact_mode(self):
        for dtype in (torch.float32, torch.float64, torch.float16):
            value, spatial, start, loc, attn, gen = _inputs(90, dtype=dtype, q=40, m=4, d=8, p=4)
            g = torch.randn(2, 40, 32, generator=gen).to(dtype)
            cpu = _run(lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a), value, loc, attn, g)
            for tables in ((spatial, start), (spatial.cuda(), start.cuda())):  # host or device level tables
                cuda = _run(lambda v, l, a: detops_torch.ms_deform_attn(v, *tables, l, a), value.cuda(), loc.cuda(),
                            attn.cuda(), g.cuda())
                for name, a, b in zip(NAMES, cuda, cpu):
                    assert_bitwise_equal(self, a.cpu(), b, f"{name} {dtype}")

    def test_atomic_mode_raises_the_nondeterminism_alert(self):
        value, spatial, start, loc, attn, _ = _inputs(91, dtype=torch.float32)
        v = value.cuda().requires_grad_(True)
        out = detops_torch.ms_deform_attn(v, spatial, start, loc.cuda(), attn.cuda(), "atomic")
        old = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            with self.assertRaisesRegex(RuntimeError, "atomic"):
                out.sum().backward()
        finally:
            torch.use_deterministic_algorithms(old)


if __name__ == "__main__":
    unittest.main()
