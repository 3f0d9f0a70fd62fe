#!/usr/bin/python3
"""Generate the SyncBatchNorm golden vectors in tests/golden/ from torch.nn.BatchNorm2d (training mode), used as a black box.

Run with Debian's python3 and its python3-torch package (torch 1.13.1, CPU; it reports itself as
1.13.0a0), from anywhere:

    /usr/bin/python3 scripts/gen_golden_sync_bn.py            # writes tests/golden/batch_norm_torch.txt
    /usr/bin/python3 scripts/gen_golden_sync_bn.py --check    # regenerate in memory, compare bytes

Everything is float64 and seeded (Python's own `random.Random`, not numpy or torch); torch runs on
one thread, so the output is byte-for-byte reproducible on a given torch build.

What is computed, per case (all tensors float64, NCHW, x requires grad):

    bn    = torch.nn.BatchNorm2d(C, eps, momentum, affine, track_running_stats), .train(), with the
            case's weight/bias (affine), running_mean/running_var and num_batches_tracked (tracking)
    y                        = bn(x)   (global = local batch statistics; one process is
                                        SyncBatchNorm with one rank)
    running_mean_out, running_var_out, num_batches_tracked_out = the buffers after that call
    grad_x, grad_weight, grad_bias = x.grad, bn.weight.grad, bn.bias.grad after y.backward(grad_y)
    save_mean, save_invstd   = torch.ops.aten.native_batch_norm(x, w, b, rm, rv, True, m, eps)[1:],
                               on fresh copies of the buffers, m = momentum or, when momentum is
                               None, 1 / (num_batches_tracked + 1) as BatchNorm2d uses; the script
                               asserts that this call's output and buffers equal the module's bit
                               for bit (the module goes through the same kernel).
    save_invstd = 1 / sqrt(biased batch var + eps); running_var is updated with the unbiased var.

What is covered: a typical shape [2, 4, 5, 6]; C = 1; H*W = 1 with N = 2 (count 2, the smallest
count with running statistics); N = 1, H = 1, W = 3; a channel with mean 1e4 and std ~1 (values
10000 + k/1000: a one-pass E[x^2] - E[x]^2 would lose ~8 digits); a channel whose values are all
equal (var 0: save_invstd = 1/sqrt(eps), y = bias); odd sizes [3, 5, 7, 9]; momentum 0.1, 1.0 and
None (cumulative average, num_batches_tracked starting at 3 or 0); affine on and off;
track_running_stats on and off; eps 1e-5 and 1e-3; zero and negative weights. Every case has
N*H*W >= 2 (detops updates running statistics only when the count is at least 2; torch always).
Input values are k/1000 for random integers k (short to print, mostly not exact in binary);
grad_y values are k/100 for k in [-100, 100].

File format (text, ASCII, '#' starts a comment line, tokens separated by whitespace):

    case <name> N=<n> C=<c> H=<h> W=<w> eps=<eps> momentum=<m or None> affine=<0|1> track=<0|1> nbt=<n0>
    weight <C>                   then C values     (affine only)
    bias <C>                     (affine only)
    running_mean <C>             initial buffers   (track only)
    running_var <C>              (track only)
    x <count>                    then count values, NCHW order (count = N*C*H*W)
    grad_y <count>
    y <count>
    save_mean <C>                torch's saved batch mean
    save_invstd <C>              torch's saved 1 / sqrt(biased var + eps)
    running_mean_out <C>         buffers after the forward (track only)
    running_var_out <C>          (track only)
    num_batches_tracked_out 1    an integer (track only; nbt is its initial value, 0 when not tracking)
    grad_x <count>
    grad_weight <C>              (affine only)
    grad_bias <C>                (affine only)
    end

Arrays are wrapped one row of the last dimension per line (per-channel arrays on one line); a
reader may simply read `count` whitespace-separated numbers after the label. Names are C
identifiers (usable as GoogleTest parameter names). Values are printed with Python's repr(), the
shortest decimal string that reads back (e.g. with strtod) to the identical double.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import emit_array, fmt, write_or_check  # noqa: E402

import torch

SEED = 20240921
OUT_NAME = "batch_norm_torch.txt"



def ints(rng, count, lo, hi, denom):
    return [rng.randint(lo, hi) / denom for _ in range(count)]


def make_case(rng, name, N, C, H, W, eps=1e-5, momentum=0.1, affine=True, track=True, nbt=0, large_mean=(),
              constant=(), zero_weight=()):
    c = dict(name=name, N=N, C=C, H=H, W=W, eps=eps, momentum=momentum, affine=affine, track=track,
             nbt=nbt if track else 0)
    if affine:
        c["weight"] = ints(rng, C, -2000, 2000, 1000.0)
        c["bias"] = ints(rng, C, -1000, 1000, 1000.0)
        for ch in zero_weight:
            c["weight"][ch] = 0.0
    if track:
        c["running_mean"] = ints(rng, C, -1000, 1000, 1000.0)
        c["running_var"] = ints(rng, C, 1, 4000, 1000.0)
    HW = H * W
    x = ints(rng, N * C * HW, -3000, 3000, 1000.0)
    for n in range(N):
        for ch in range(C):
            base = (n * C + ch) * HW
            for i in range(HW):
                if ch in large_mean:  # 10000 + k/1000, k uniform in [-1732, 1732] (std ~1)
                    x[base + i] = (10000000 + rng.randint(-1732, 1732)) / 1000.0
                elif ch in constant:
                    x[base + i] = 0.375 if ch % 2 == 0 else 1.7  # dyadic and not
    c["x"] = x
    c["grad_y"] = ints(rng, N * C * HW, -100, 100, 100.0)
    return c


def build_cases():
    rng = random.Random(SEED)
    return [
        make_case(rng, "typical_2x4x5x6", 2, 4, 5, 6),
        make_case(rng, "c1_momentum_none", 3, 1, 4, 5, momentum=None, nbt=3),
        make_case(rng, "hw1_n2_momentum1", 2, 3, 1, 1, momentum=1.0),
        make_case(rng, "n1_h1_w3_no_affine", 1, 2, 1, 3, affine=False),
        make_case(rng, "large_mean_channel", 2, 3, 3, 4, large_mean=(1,)),
        make_case(rng, "constant_channel_eps1em3", 2, 4, 3, 3, eps=1e-3, constant=(0, 3), zero_weight=(2,)),
        make_case(rng, "odd_3x5x7x9_momentum_none", 3, 5, 7, 9, momentum=None, nbt=0),
        make_case(rng, "no_track_2x3x4x5", 2, 3, 4, 5, track=False),
        make_case(rng, "no_track_no_affine", 2, 2, 3, 2, affine=False, track=False),
    ]


def run_case(c):
    f64 = torch.float64
    N, C, H, W = c["N"], c["C"], c["H"], c["W"]
    shape = (N, C, H, W)
    assert N * H * W >= 2, c["name"]

    def module():
        m = torch.nn.BatchNorm2d(C, eps=c["eps"], momentum=c["momentum"], affine=c["affine"],
                                 track_running_stats=c["track"]).to(f64)
        m.train()
        with torch.no_grad():
            if c["affine"]:
                m.weight.copy_(torch.tensor(c["weight"], dtype=f64))
                m.bias.copy_(torch.tensor(c["bias"], dtype=f64))
            if c["track"]:
                m.running_mean.copy_(torch.tensor(c["running_mean"], dtype=f64))
                m.running_var.copy_(torch.tensor(c["running_var"], dtype=f64))
                m.num_batches_tracked.fill_(c["nbt"])
        return m

    res = {}
    m = module()
    x = torch.tensor(c["x"], dtype=f64).reshape(shape).requires_grad_(True)
    g = torch.tensor(c["grad_y"], dtype=f64).reshape(shape)
    y = m(x)
    y.backward(g)
    res["y"] = y.detach().reshape(-1).tolist()
    res["grad_x"] = x.grad.detach().reshape(-1).tolist()
    if c["affine"]:
        res["grad_weight"] = m.weight.grad.tolist()
        res["grad_bias"] = m.bias.grad.tolist()
    if c["track"]:
        res["running_mean_out"] = m.running_mean.tolist()
        res["running_var_out"] = m.running_var.tolist()
        res["num_batches_tracked_out"] = [int(m.num_batches_tracked.item())]
        assert res["num_batches_tracked_out"][0] == c["nbt"] + 1

    # The saved statistics, from the kernel itself, on fresh buffers; cross-checked with the module.
    m2 = module()
    with torch.no_grad():
        xx = torch.tensor(c["x"], dtype=f64).reshape(shape)
        if c["momentum"] is None:
            factor = 1.0 / (c["nbt"] + 1) if c["track"] else 0.0
        else:
            factor = c["momentum"]
        rm = m2.running_mean if c["track"] else None
        rv = m2.running_var if c["track"] else None
        w = m2.weight if c["affine"] else None
        b = m2.bias if c["affine"] else None
        out, save_mean, save_invstd = torch.ops.aten.native_batch_norm(xx, w, b, rm, rv, True, factor, c["eps"])
        assert out.reshape(-1).tolist() == res["y"], c["name"] + ": native_batch_norm output != module output"
        if c["track"]:
            assert rm.tolist() == res["running_mean_out"], c["name"] + ": running_mean differs"
            assert rv.tolist() == res["running_var_out"], c["name"] + ": running_var differs"
        res["save_mean"] = save_mean.tolist()
        res["save_invstd"] = save_invstd.tolist()
        # Sanity: the saved statistics are the two-pass batch mean and 1/sqrt(biased var + eps).
        mean = xx.mean(dim=(0, 2, 3))
        var = ((xx - mean.reshape(1, C, 1, 1)) ** 2).mean(dim=(0, 2, 3))
        ref_invstd = (var + c["eps"]).rsqrt()
        assert torch.allclose(save_mean, mean, rtol=1e-14, atol=0), c["name"]
        assert torch.allclose(save_invstd, ref_invstd, rtol=1e-12, atol=0), c["name"]
    return res



def render():
    torch.set_num_threads(1)
    cases = build_cases()
    lines = [
        "# detops SyncBatchNorm golden vectors: torch.nn.BatchNorm2d in training mode (one process = one rank),",
        "# float64, CPU, forward, buffers and autograd backward, with torch's saved mean / invstd. Generated by",
        "# scripts/gen_golden_sync_bn.py (format documented there); do not edit.",
        "# torch %s, seed %d, %d cases." % (torch.__version__, SEED, len(cases)),
    ]
    for c in cases:
        res = run_case(c)
        C, W = c["C"], c["W"]
        mom = "None" if c["momentum"] is None else fmt(c["momentum"])
        lines.append("case %s N=%d C=%d H=%d W=%d eps=%s momentum=%s affine=%d track=%d nbt=%d" %
                     (c["name"], c["N"], C, c["H"], W, fmt(c["eps"]), mom, int(c["affine"]), int(c["track"]),
                      c["nbt"]))
        for key in ("weight", "bias", "running_mean", "running_var"):
            if key in c:
                emit_array(lines, key, c[key], C)
        for key in ("x", "grad_y"):
            emit_array(lines, key, c[key], W)
        emit_array(lines, "y", res["y"], W)
        emit_array(lines, "save_mean", res["save_mean"], C)
        emit_array(lines, "save_invstd", res["save_invstd"], C)
        if c["track"]:
            emit_array(lines, "running_mean_out", res["running_mean_out"], C)
            emit_array(lines, "running_var_out", res["running_var_out"], C)
            emit_array(lines, "num_batches_tracked_out", res["num_batches_tracked_out"], 1, as_int=True)
        emit_array(lines, "grad_x", res["grad_x"], W)
        if c["affine"]:
            emit_array(lines, "grad_weight", res["grad_weight"], C)
            emit_array(lines, "grad_bias", res["grad_bias"], C)
        lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


def main():
    return write_or_check(__doc__.split("\n")[0], OUT_NAME, render)


if __name__ == "__main__":
    sys.exit(main())
