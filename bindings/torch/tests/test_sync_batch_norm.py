# Tests of detops_torch.SyncBatchNorm over gloo: multi-process runs against one-process BatchNorm2d.
"""SyncBatchNorm over torch.distributed (gloo, CPU).

Worker processes (2 and 3 ranks, one spawn per world size) run every case on their slice of a
global batch saved by the parent, and save what they computed; the parent compares it with one
process on the whole batch: torch's BatchNorm2d (default mode, within float64 rounding) and
detops_torch's SyncBatchNorm without a process group (exact mode, bit for bit, for every split).
"""
import datetime
import faulthandler
import os
import sys
import tempfile
import time
import traceback
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import detops_torch
from detops_torch.distributed import SyncBatchNorm, convert_sync_batchnorm

C, H, W = 3, 5, 4
N_GLOBAL = 5
TIMEOUT = datetime.timedelta(seconds=30)
WORKER_WATCHDOG_S = 60

# name, world, mode, x dtype, parameter dtype, per-rank batch sizes, momentum, forward steps,
# ranks whose input is channels_last
CASES = [
    ("default_f64_uneven", 2, "default", torch.float64, torch.float64, [4, 1], 0.1, 1, ()),
    ("default_f64_empty", 2, "default", torch.float64, torch.float64, [0, 5], 0.1, 1, ()),
    ("exact_f64_uneven", 2, "exact", torch.float64, torch.float64, [4, 1], 0.1, 1, (1,)),
    ("exact_f64_empty", 2, "exact", torch.float64, torch.float64, [5, 0], 0.1, 1, ()),
    ("exact_f32_cumulative", 2, "exact", torch.float32, torch.float32, [2, 3], None, 2, (0,)),
    ("default_f32_cumulative", 2, "default", torch.float32, torch.float32, [2, 3], None, 2, ()),
    ("exact_bf16", 2, "exact", torch.bfloat16, torch.float32, [3, 2], 0.1, 1, ()),
    ("exact_f16_params16", 2, "exact", torch.float16, torch.float16, [1, 4], 0.1, 1, ()),
    ("default_f64_w3", 3, "default", torch.float64, torch.float64, [2, 1, 2], 0.1, 1, ()),
    ("default_f64_w3_empty", 3, "default", torch.float64, torch.float64, [3, 0, 2], 0.1, 1, ()),
    ("exact_f64_w3", 3, "exact", torch.float64, torch.float64, [1, 3, 1], 0.1, 1, (2,)),
    ("exact_f64_w3_empty", 3, "exact", torch.float64, torch.float64, [2, 3, 0], None, 2, ()),
    ("exact_f32_w3", 3, "exact", torch.float32, torch.float32, [1, 1, 3], 0.1, 1, ()),
]
PARAM_ONLY_SPLIT = [3, 2]
# the cases the CUDA test runs (2 ranks, CUDA tensors over gloo)
CUDA_CASES = ("default_f64_uneven", "exact_f64_empty", "exact_f32_cumulative", "exact_bf16")


def _data():
    """The global batch, the loss weights g (loss = sum(y * g)) and the affine parameters."""
    gen = torch.Generator().manual_seed(1234)
    # a mean far from 0 and channels of different scales exercise the exact mode's grid
    x = torch.randn(N_GLOBAL, C, H, W, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 3.0, 0.25]).view(
        1, C, 1, 1) + torch.tensor([0.5, -2.0, 10.0]).view(1, C, 1, 1)
    g = torch.randn(N_GLOBAL, C, H, W, generator=gen, dtype=torch.float64)
    weight = 1.0 + 0.5 * torch.randn(C, generator=gen, dtype=torch.float64)
    bias = torch.randn(C, generator=gen, dtype=torch.float64)
    return x, g, weight, bias


def _run_case(case, x_all, g_all, weight, bias, rank, device="cpu"):
    """One case on `rank`'s slice (the whole batch when rank is None), on `device`: what the parent
    compares (on the CPU)."""
    name, world, mode, dtype, pdtype, split, momentum, steps, cl_ranks = case
    if rank is None:
        lo, hi = 0, N_GLOBAL
    else:
        lo = sum(split[:rank])
        hi = lo + split[rank]
    m = SyncBatchNorm(C, momentum=momentum, mode=mode, dtype=pdtype, device=device)
    with torch.no_grad():
        m.weight.copy_(weight)
        m.bias.copy_(bias)
    x = x_all[lo:hi].to(device, dtype).clone()  # a leaf of its own
    if rank is not None and rank in cl_ranks:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    for _ in range(steps):
        y = m(x)
    (y.double() * g_all[lo:hi].to(device)).sum().backward()
    out = {"y": y.detach(), "grad_x": x.grad, "grad_w": m.weight.grad, "grad_b": m.bias.grad,
           "running_mean": m.running_mean, "running_var": m.running_var, "nbt": m.num_batches_tracked}
    return {k: v.detach().to("cpu", copy=True) for k, v in out.items()}


def _disagreement(kind, rank):
    """Each rank's part of a case whose ranks disagree: returns (exception class name, message, seconds)."""
    x = torch.randn(2, 4 if (kind == "channels" and rank == 1) else C, H, W, dtype=torch.float64)
    channels = x.shape[1]
    mode = "exact" if (kind == "mode" and rank == 1) else "default"
    m = SyncBatchNorm(channels, mode=mode).double()
    if kind == "local_failure" and rank == 1:
        x = x[:, :2]  # 2 channels into a 3-channel layer: this rank's own checks fail
    if kind == "backward_mode":
        # the forwards agree; rank 1 switches to the exact mode before the backward
        y = m(x.requires_grad_(True))
        if rank == 1:
            y.grad_fn.mode = "exact"  # test-only: edits the autograd node's saved mode
        start = time.monotonic()
        try:
            y.sum().backward()
        except Exception as e:  # noqa: BLE001
            return type(e).__name__, str(e), time.monotonic() - start
        return None, "", time.monotonic() - start
    start = time.monotonic()
    try:
        m(x)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e), time.monotonic() - start
    return None, "", time.monotonic() - start


def _parameter_grads_only(rank, x_all, g_all, split):
    """The input needs no gradient: the backward makes only this rank's parameter gradients (no
    record gathered, as torch.nn.SyncBatchNorm skips its all_reduce then)."""
    lo = sum(split[:rank])
    m = SyncBatchNorm(C, mode="exact").double()
    y = m(x_all[lo:lo + split[rank]])
    (y * g_all[lo:lo + split[rank]]).sum().backward()
    return m.weight.grad, m.bias.grad


def _mmcv_parameter_grads(rank, x_all, g_all, split):
    """_parameter_grads_only through mmcv's stand-in (compat.SyncBatchNorm): its parameter
    gradients are the group's mean, the same on every rank."""
    lo = sum(split[:rank])
    m = detops_torch.compat.SyncBatchNorm(C, mode="exact").double()
    y = m(x_all[lo:lo + split[rank]])
    (y * g_all[lo:lo + split[rank]]).sum().backward()
    return m.weight.grad, m.bias.grad, m.group_size


def _ddp_model(mode):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Conv2d(C, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1)).double()
    return convert_sync_batchnorm(model, mode=mode)


def _ddp_step(model, x, g, n):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(x)
    (out * g).sum().div(n).backward()
    opt.step()
    state = getattr(model, "module", model).state_dict()  # DDP keeps the model as .module
    return {k: v.detach().clone() for k, v in state.items()}


def _worker(rank, world, tmp, device="cpu"):
    """Runs every case of `world` on `rank` and saves the results; never returns.

    It leaves with os._exit: on torch 1.13, destroying a gloo process group (or a DDP reducer
    holding one) can deadlock against a gloo thread that frees a tensor and needs the GIL. A
    failure writes its traceback to rank<r>.err for the parent; a hang prints every stack and
    exits (the watchdog)."""
    faulthandler.dump_traceback_later(WORKER_WATCHDOG_S, exit=True)
    code = 1
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"), rank=rank,
                                world_size=world, timeout=TIMEOUT)
        x_all, g_all, weight, bias = torch.load(os.path.join(tmp, "data.pt"))
        out = {}
        for case in CASES:
            if case[1] != world or (device != "cpu" and case[0] not in CUDA_CASES):
                continue
            first = _run_case(case, x_all, g_all, weight, bias, rank, device)
            again = _run_case(case, x_all, g_all, weight, bias, rank, device)
            out[case[0]] = (first, again)
        if world == 2 and device == "cpu":
            for kind in ("channels", "mode", "local_failure", "backward_mode"):
                out["disagree_" + kind] = _disagreement(kind, rank)
            out["parameter_grads_only"] = _parameter_grads_only(rank, x_all, g_all, PARAM_ONLY_SPLIT)
            out["mmcv_parameter_grads"] = _mmcv_parameter_grads(rank, x_all, g_all, PARAM_ONLY_SPLIT)
            model = torch.nn.parallel.DistributedDataParallel(_ddp_model("exact"))
            out["ddp_isinstance"] = all(isinstance(mod, torch.nn.SyncBatchNorm) for mod in model.modules()
                                        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm))
            # an even global batch, each rank's loss the mean of its half: DDP's average of the
            # ranks' gradients is then the gradient of the global mean
            local = (N_GLOBAL - 1) // 2
            lo = rank * local
            out["ddp"] = _ddp_step(model, x_all[lo:lo + local], g_all[lo:lo + local, :2], local)
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))
        dist.barrier()  # no rank leaves while another still talks to it
        code = 0
    except BaseException:  # noqa: BLE001 -- reported through the file, then the exit code
        with open(os.path.join(tmp, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Spawned:
    """One spawn per world size, shared by the test methods that read its results."""
    results = {}

    @classmethod
    def get(cls, world, device="cpu"):
        key = (world, device)
        if key not in cls.results:
            with tempfile.TemporaryDirectory() as tmp:
                torch.save(_data(), os.path.join(tmp, "data.pt"))
                start = time.monotonic()
                try:
                    mp.spawn(_worker, args=(world, tmp, device), nprocs=world, join=True)
                except Exception as e:  # noqa: BLE001 -- the workers' own tracebacks say more
                    errors = [open(os.path.join(tmp, n)).read() for n in sorted(os.listdir(tmp)) if n.endswith(".err")]
                    raise AssertionError(f"{world} workers failed: {e}\n" + "\n".join(errors)) from None
                elapsed = time.monotonic() - start
                cls.results[key] = ([torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)], elapsed)
        return cls.results[key][0]


def _reference_default(case, x_all, g_all, weight, bias):
    """torch.nn.BatchNorm2d in float64 on the whole batch (the inputs rounded to the case's dtype)."""
    name, world, mode, dtype, pdtype, split, momentum, steps, _ = case
    bn = torch.nn.BatchNorm2d(C, momentum=momentum).double()
    with torch.no_grad():
        bn.weight.copy_(weight.to(pdtype).double())
        bn.bias.copy_(bias.to(pdtype).double())
    x = x_all.to(dtype).double().clone().requires_grad_(True)
    for _ in range(steps):
        y = bn(x)
    (y * g_all).sum().backward()
    mean = x.detach().mean((0, 2, 3), keepdim=True)
    xhat = (x.detach() - mean) / (x.detach().var((0, 2, 3), unbiased=False, keepdim=True) + bn.eps).sqrt()
    return {"y": y.detach(), "grad_x": x.grad, "grad_w": bn.weight.grad, "grad_b": bn.bias.grad,
            "running_mean": bn.running_mean, "running_var": bn.running_var, "nbt": bn.num_batches_tracked,
            "xhat": xhat}


def _tolerance(dtype):
    return {torch.float64: 1e-11, torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]


class SyncBatchNormMultiProcessTest(unittest.TestCase):
    def _check_cases(self, world, device="cpu"):
        ranks = _Spawned.get(world, device)
        x_all, g_all, weight, bias = _data()
        for case in CASES:
            name, _, mode, dtype, pdtype, split, momentum, steps, _ = case
            if case[1] != world or (device != "cpu" and name not in CUDA_CASES):
                continue
            with self.subTest(case=name, device=device):
                per_rank = [r[name][0] for r in ranks]
                # bitwise reproducible run to run
                for r in range(world):
                    for key, v in per_rank[r].items():
                        self.assertTrue(torch.equal(v, ranks[r][name][1][key]), f"rank {r} {key} differs between runs")
                # every rank holds the same running statistics, bit for bit
                for r in range(1, world):
                    for key in ("running_mean", "running_var", "nbt"):
                        self.assertTrue(torch.equal(per_rank[r][key], per_rank[0][key]), f"rank {r} {key}")
                y = torch.cat([p["y"] for p in per_rank])
                gx = torch.cat([p["grad_x"] for p in per_rank])
                gw = sum(p["grad_w"].double() for p in per_rank)
                gb = sum(p["grad_b"].double() for p in per_rank)
                self.assertEqual(y.dtype, dtype)
                self.assertEqual(per_rank[0]["grad_w"].dtype, pdtype)
                ref = _reference_default(case, x_all, g_all, weight, bias)
                tol = _tolerance(dtype)
                scale = lambda t: tol * max(1.0, t.abs().max().item())  # noqa: E731
                for key, got in (("y", y), ("grad_x", gx), ("grad_w", gw), ("grad_b", gb),
                                 ("running_mean", per_rank[0]["running_mean"]),
                                 ("running_var", per_rank[0]["running_var"])):
                    want = ref[key]
                    # 16-bit outputs are rounded once from float64: one unit in their last place
                    self.assertLess((got.double() - want).abs().max().item(), scale(want), f"{key} vs BatchNorm2d")
                self.assertEqual(per_rank[0]["nbt"].item(), ref["nbt"].item())
                # torch.nn.SyncBatchNorm's convention: grad_weight/grad_bias are this rank's own
                # contributions (neither reduced nor averaged); DDP reduces them
                lo = 0
                for r, p in enumerate(per_rank):
                    hi = lo + split[r]
                    gr = g_all[lo:hi]
                    want_b = gr.sum((0, 2, 3))
                    want_w = (gr * ref["xhat"][lo:hi]).sum((0, 2, 3))
                    self.assertLess((p["grad_b"].double() - want_b).abs().max().item(), scale(want_b) * 10)
                    self.assertLess((p["grad_w"].double() - want_w).abs().max().item(), scale(want_w) * 10)
                    lo = hi
                if mode == "exact":
                    # the same bits as one process on the whole batch, for every split
                    # (on the CPU: detops' CUDA statistics are the CPU's bits)
                    one = _run_case(case, x_all, g_all, weight, bias, None)
                    for key, got in (("y", y), ("grad_x", gx), ("running_mean", per_rank[0]["running_mean"]),
                                     ("running_var", per_rank[0]["running_var"]), ("nbt", per_rank[0]["nbt"])):
                        self.assertTrue(torch.equal(got, one[key]), f"exact {key} differs from one process")
                    # the parameter gradients are summed over ranks here: equal within rounding
                    self.assertLess((gw - one["grad_w"].double()).abs().max().item(), scale(gw))
                    self.assertLess((gb - one["grad_b"].double()).abs().max().item(), scale(gb))

    def test_two_processes(self):
        self._check_cases(2)

    def test_three_processes(self):
        self._check_cases(3)

    @unittest.skipUnless(torch.cuda.is_available(), "needs CUDA")
    def test_two_processes_cuda_tensors(self):
        # CUDA inputs over gloo (the records travel through host memory): one GPU serves both
        # ranks, which NCCL does not allow
        self._check_cases(2, "cuda")

    def test_disagreeing_ranks_raise_on_every_rank(self):
        ranks = _Spawned.get(2)
        expect = {"channels": "channel count", "mode": "mode", "local_failure": None, "backward_mode": "mode"}
        for kind, phrase in expect.items():
            with self.subTest(kind=kind):
                for r, res in enumerate(ranks):
                    cls, msg, seconds = res["disagree_" + kind]
                    self.assertEqual(cls, "DetopsError", f"rank {r}: {msg}")
                    self.assertLess(seconds, 10.0)
                    if phrase is not None:
                        self.assertIn(phrase, msg)
                # the failing rank reports its own error; the other names it
                if kind == "local_failure":
                    self.assertIn("weight", ranks[1]["disagree_" + kind][1])
                    self.assertIn("rank 1 of 2 failed its argument checks", ranks[0]["disagree_" + kind][1])

    def test_parameter_gradients_without_input_gradient(self):
        ranks = _Spawned.get(2)
        x_all, g_all, _, _ = _data()
        x = x_all.clone()
        mean = x.mean((0, 2, 3), keepdim=True)
        xhat = (x - mean) / (x.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-5).sqrt()
        lo = 0
        for r, n in enumerate(PARAM_ONLY_SPLIT):
            gw, gb = ranks[r]["parameter_grads_only"]
            want_w = (g_all[lo:lo + n] * xhat[lo:lo + n]).sum((0, 2, 3))
            want_b = g_all[lo:lo + n].sum((0, 2, 3))
            self.assertLess((gw - want_w).abs().max().item(), 1e-10, f"rank {r} grad_weight")
            self.assertLess((gb - want_b).abs().max().item(), 1e-10, f"rank {r} grad_bias")
            lo += n

    def test_mmcv_stand_in_averages_parameter_gradients(self):
        # mmcv's SyncBatchNorm averages grad_weight/grad_bias over the group (issue 27); detops'
        # own SyncBatchNorm keeps torch's per-rank gradients (the test above).
        ranks = _Spawned.get(2)
        local = [ranks[r]["parameter_grads_only"] for r in range(2)]
        want_w = torch.stack([local[0][0], local[1][0]]).sum(0) / 2
        want_b = torch.stack([local[0][1], local[1][1]]).sum(0) / 2
        for r in range(2):
            gw, gb, group_size = ranks[r]["mmcv_parameter_grads"]
            self.assertEqual(group_size, 2)
            self.assertTrue(torch.equal(gw, want_w), f"rank {r} grad_weight")
            self.assertTrue(torch.equal(gb, want_b), f"rank {r} grad_bias")
        self.assertFalse(torch.equal(local[0][0], want_w))

    def test_mmcv_stand_in_alone_and_its_interface(self):
        x_all, g_all, _, _ = _data()
        m = detops_torch.compat.SyncBatchNorm(C, mode="exact").double()
        ref = SyncBatchNorm(C, mode="exact").double()
        for layer in (m, ref):
            (layer(x_all) * g_all).sum().backward()
        self.assertTrue(torch.equal(m.weight.grad, ref.weight.grad))  # one process: nothing to average
        self.assertEqual((m.group, m.group_size, m.stats_mode), (None, 1, "default"))
        self.assertIn("stats_mode='default'", repr(m))
        with self.assertRaisesRegex(ValueError, "stats_mode"):
            detops_torch.compat.SyncBatchNorm(C, stats_mode="bogus")

    def test_ddp_step_matches_one_process(self):
        ranks = _Spawned.get(2)
        self.assertTrue(ranks[0]["ddp_isinstance"])
        x_all, g_all, _, _ = _data()
        half = N_GLOBAL - 1
        one = _ddp_step(_ddp_model("exact"), x_all[:half], g_all[:half, :2], half)
        for key, want in one.items():
            self.assertTrue(torch.equal(ranks[0]["ddp"][key], ranks[1]["ddp"][key]), f"{key} differs between ranks")
            if key.endswith("num_batches_tracked"):
                self.assertEqual(ranks[0]["ddp"][key].item(), want.item())
            elif "running" in key:  # exact mode: the batch statistics are the same bits
                self.assertTrue(torch.equal(ranks[0]["ddp"][key], want), key)
            else:  # convolution gradients are summed in another order
                self.assertLess((ranks[0]["ddp"][key] - want).abs().max().item(), 1e-12, key)


class SyncBatchNormOneProcessTest(unittest.TestCase):
    """No process group: BatchNorm2d semantics through the same ops."""

    def test_matches_batch_norm_2d(self):
        x_all, g_all, weight, bias = _data()
        for mode in ("default", "exact"):
            for momentum in (0.1, None):
                case = ("one", 1, mode, torch.float64, torch.float64, [N_GLOBAL], momentum, 2, ())
                got = _run_case(case, x_all, g_all, weight, bias, None)
                ref = _reference_default(case, x_all, g_all, weight, bias)
                for key in ("y", "grad_x", "grad_w", "grad_b", "running_mean", "running_var"):
                    self.assertLess((got[key] - ref[key]).abs().max().item(), 1e-11, f"{mode} {momentum} {key}")
                self.assertEqual(got["nbt"].item(), 2)

    def test_eval_is_torch_eval(self):
        m = SyncBatchNorm(C, mode="exact").double()
        ref = torch.nn.BatchNorm2d(C).double()
        x = _data()[0]
        m(x), ref(x)
        m.load_state_dict(ref.state_dict())  # the same buffers: evaluation is then torch's, bit for bit
        m.eval(), ref.eval()
        self.assertTrue(torch.equal(m(x), ref(x)))

    def test_module_contract(self):
        m = SyncBatchNorm(C, mode="exact")
        self.assertIsInstance(m, torch.nn.SyncBatchNorm)
        self.assertEqual(list(m.state_dict()), list(torch.nn.SyncBatchNorm(C).state_dict()))
        m.load_state_dict(torch.nn.BatchNorm2d(C).state_dict())
        self.assertIn("mode='exact'", repr(m))
        with self.assertRaisesRegex(ValueError, "mode"):
            SyncBatchNorm(C, mode="fast")
        with self.assertRaisesRegex(ValueError, "more than 1 value per channel"):
            SyncBatchNorm(C)(torch.randn(1, C, 1, 1))

    def test_convert_reuses_parameters_and_buffers(self):
        bn1, bn2 = torch.nn.BatchNorm1d(C), torch.nn.BatchNorm2d(C, momentum=None)
        bn1.qconfig = "q"
        model = torch.nn.Sequential(torch.nn.Sequential(bn1), bn2, torch.nn.ReLU())
        model.eval()
        converted = detops_torch.distributed.convert_sync_batchnorm(model, mode="exact")
        new1, new2 = converted[0][0], converted[1]
        self.assertIs(converted, model)
        for old, new in ((bn1, new1), (bn2, new2)):
            self.assertIsInstance(new, SyncBatchNorm)
            self.assertEqual(new.mode, "exact")
            self.assertIs(new.weight, old.weight)
            self.assertIs(new.bias, old.bias)
            self.assertIs(new.running_mean, old.running_mean)
            self.assertIs(new.num_batches_tracked, old.num_batches_tracked)
            self.assertFalse(new.training)
        self.assertEqual(new1.qconfig, "q")
        self.assertIsNone(new2.momentum)
        # 1-d batch norm inputs ([N, C] and [N, C, L]) run through the 4-d ops
        new1.train()
        x = torch.randn(6, C, 7)
        self.assertLess((new1(x) - torch.nn.functional.batch_norm(x, None, None, new1.weight, new1.bias, True)).abs()
                        .max().item(), 1e-5)

    def test_world_size_one_group(self):
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"), rank=0,
                                    world_size=1, timeout=TIMEOUT)
            try:
                x_all, g_all, weight, bias = _data()
                case = ("w1", 1, "exact", torch.float64, torch.float64, [N_GLOBAL], 0.1, 1, ())
                in_group = _run_case(case, x_all, g_all, weight, bias, None)
            finally:
                dist.destroy_process_group()
        alone = _run_case(case, x_all, g_all, weight, bias, None)
        for key, v in alone.items():
            self.assertTrue(torch.equal(in_group[key], v), key)


if __name__ == "__main__":
    unittest.main()
