#!/usr/bin/python3
"""Generate the FrozenBatchNorm2d golden vectors in tests/golden/ from torchvision, used as a black box.

Run with Debian's python3 and its python3-torchvision package (torch 1.13.1, torchvision 0.14.1,
CPU; they report themselves as 1.13.0a0 / 0.14.1a0), from anywhere:

    /usr/bin/python3 scripts/gen_golden_frozen_bn.py            # writes tests/golden/frozen_bn_torchvision.txt
    /usr/bin/python3 scripts/gen_golden_frozen_bn.py --check    # regenerate in memory, compare bytes

Everything is float64 and seeded (Python's own `random.Random`, not numpy or torch); the ops are
elementwise, so the output is byte-for-byte reproducible.

What is computed, per case (all tensors float64, NCHW, x and residual require grad):

    fbn   = torchvision.ops.FrozenBatchNorm2d(C, eps) with the case's four buffers
    y_none      = fbn(x)                          (x * scale + bias, torchvision's own forward)
    y_relu      = torch.relu(fbn(x))
    y_add_relu  = torch.relu(fbn(x) + residual)
    grad_x_*    = x.grad after y_*.backward(grad_y), one fresh graph per epilogue
    grad_residual_add_relu = residual.grad after y_add_relu.backward(grad_y)
    scale = weight * (running_var + eps).rsqrt(),  shift = bias - running_mean * scale
                  (torchvision's fold, evaluated here with torch float64 ops)

What is covered:
  * eps 1e-5 (torchvision / detectron2 default), 0.0 (maskrcnn-benchmark, legacy detection
    weights; running_var strictly positive there) and 1e-3;
  * edge shapes: C = 1, H*W = 1, odd sizes [3, 5, 7, 9];
  * a channel with running_var = 0 and eps > 0 (scale = weight / sqrt(eps)), a channel with
    weight 0, negative weights (negative scales), small variances (large scales);
  * pre-activations that are exactly 0, exactly negative and exactly positive (designed with
    dyadic values in `exact_signs_eps0`), and in every case a residual that is the exact negation
    of fbn(x) at every fifth element (i % 5 == 2, NCHW order), so that fbn(x) + residual is
    exactly +0 there and the ReLU masks its gradient;
  * detectron2's identity (weight 1, bias 0, running_mean 0, running_var = 1 - eps) in float64.
Input values are k/1000 for random integers k (short to print, mostly not exact in binary);
grad_y values are k/100 for k in [-100, 100].

File format (text, ASCII, '#' starts a comment line, tokens separated by whitespace):

    case <name> N=<n> C=<c> H=<h> W=<w> eps=<eps>
    weight <C>             then C values   (the four buffers, float64)
    bias <C>
    running_mean <C>
    running_var <C>
    scale <C>              the fold computed by torch in float64 (see above)
    shift <C>
    x <count>              then count values, NCHW order (count = N*C*H*W)
    residual <count>
    grad_y <count>
    y_none <count>
    y_relu <count>
    y_add_relu <count>
    grad_x_none <count>
    grad_x_relu <count>
    grad_x_add_relu <count>
    grad_residual_add_relu <count>
    end

Arrays are wrapped one row of the last dimension per line (per-channel arrays on one line); a
reader may simply read `count` whitespace-separated numbers after the label. Names are C
identifiers (usable as GoogleTest parameter names). Values are printed with Python's repr(), the
shortest decimal string that reads back (e.g. with strtod) to the identical double; "-0.0" may
occur (torch.relu keeps the sign of a negative zero; compare values, not bits, at zeros).
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import emit_array, fmt, write_or_check  # noqa: E402

import torch
import torchvision
from torchvision.ops import FrozenBatchNorm2d

SEED = 20240717
OUT_NAME = "frozen_bn_torchvision.txt"



def ints(rng, count, lo, hi, denom):
    return [rng.randint(lo, hi) / denom for _ in range(count)]


def random_case(rng, name, N, C, H, W, eps, zero_var=(), zero_weight=(), var_lo=1, var_hi=4000, var_denom=1000.0):
    c = dict(name=name, N=N, C=C, H=H, W=W, eps=eps)
    c["weight"] = ints(rng, C, -2000, 2000, 1000.0)
    c["bias"] = ints(rng, C, -1000, 1000, 1000.0)
    c["running_mean"] = ints(rng, C, -1000, 1000, 1000.0)
    c["running_var"] = ints(rng, C, var_lo, var_hi, var_denom)
    for ch in zero_var:
        c["running_var"][ch] = 0.0
    for ch in zero_weight:
        c["weight"][ch] = 0.0
    n = N * C * H * W
    c["x"] = ints(rng, n, -3000, 3000, 1000.0)
    c["residual"] = ints(rng, n, -2000, 2000, 1000.0)
    c["grad_y"] = ints(rng, n, -100, 100, 100.0)
    return c


def exact_signs_case(rng):
    """eps = 0, dyadic buffers and inputs: every pre-activation is exact, with exact zeros."""
    N, C, H, W = 1, 3, 3, 4
    c = dict(name="exact_signs_eps0", N=N, C=C, H=H, W=W, eps=0.0)
    # ch0: scale 2, shift -1;  ch1: scale -0.5, shift 0.25;  ch2: scale 1, shift 0 (identity)
    c["weight"] = [2.0, -1.0, 1.0]
    c["bias"] = [0.0, 0.25, 0.0]
    c["running_mean"] = [0.5, 0.0, 0.0]
    c["running_var"] = [1.0, 4.0, 1.0]
    t = 2.0 ** -20
    x0 = [0.5, 0.25, 0.75, 0.0, 1.0, -1.0, 0.5 + t, 0.5 - t, 0.5, 3.0, -3.0, 0.4375]
    x1 = [0.5, 1.0, 0.0, -0.5, 0.5 + t, 0.5 - t, 0.5, 4.0, -4.0, 0.125, 0.5, 2.0]
    x2 = [0.0, 1.0, -1.0, t, -t, 0.0, 2.5, -2.5, 0.0, 1e-3, -1e-3, 0.0]
    c["x"] = x0 + x1 + x2
    # residuals: a third cancel the pre-activation exactly (+0), a third make it positive, a
    # third negative (pre-activations: ch0 [0, -.5, .5, -1, 1, -3, 2t, -2t, 0, 5, -7, -.125],
    # ch1 [0, -.25, .25, .5, -t/2, t/2, 0, -1.75, 2.25, .1875, 0, -.75], ch2 = x2)
    r0 = [0.0, 0.5, 0.25, -0.5, -1.0, 1.0, t, 2 * t, 0.25, -5.0, 8.0, 0.0625]
    r1 = [0.125, 0.25, -0.5, -0.5, t, -(t / 2), -0.125, 2.0, -2.25, -0.25, 0.0, 1.0]
    r2 = [0.5, -1.0, 0.5, -t, 2 * t, -0.25, -2.5, 3.0, 0.0, -1e-3, 2e-3, -0.5]
    c["residual"] = r0 + r1 + r2
    c["grad_y"] = ints(rng, N * C * H * W, -100, 100, 100.0)
    return c


def identity_case(rng):
    """detectron2's default FrozenBatchNorm2d: running_var = 1 - eps makes it the identity."""
    N, C, H, W = 2, 2, 2, 3
    eps = 1e-5
    c = dict(name="identity_detectron2_eps1em5", N=N, C=C, H=H, W=W, eps=eps)
    c["weight"] = [1.0] * C
    c["bias"] = [0.0] * C
    c["running_mean"] = [0.0] * C
    c["running_var"] = [1.0 - eps] * C
    n = N * C * H * W
    c["x"] = ints(rng, n, -3000, 3000, 1000.0)
    c["residual"] = ints(rng, n, -2000, 2000, 1000.0)
    c["grad_y"] = ints(rng, n, -100, 100, 100.0)
    return c


def build_cases():
    rng = random.Random(SEED)
    return [
        random_case(rng, "basic_eps1em5", 2, 3, 4, 5, 1e-5),
        random_case(rng, "c1_eps1em5", 2, 1, 3, 7, 1e-5),
        random_case(rng, "hw1_eps1em5", 4, 5, 1, 1, 1e-5),
        random_case(rng, "odd_3x5x7x9_eps1em5", 3, 5, 7, 9, 1e-5, zero_var=(2,), zero_weight=(4,)),
        random_case(rng, "zero_var_eps1em3", 2, 4, 3, 3, 1e-3, zero_var=(0, 3)),
        random_case(rng, "eps0", 2, 4, 2, 5, 0.0),
        random_case(rng, "eps1em3", 1, 6, 5, 4, 1e-3),
        random_case(rng, "small_var_eps1em5", 1, 4, 3, 2, 1e-5, var_lo=1, var_hi=1000, var_denom=1e6),
        random_case(rng, "c1_hw1_eps0", 3, 1, 1, 1, 0.0),
        exact_signs_case(rng),
        identity_case(rng),
    ]


def module_for(c):
    m = FrozenBatchNorm2d(c["C"], eps=c["eps"]).to(torch.float64)
    with torch.no_grad():
        m.weight.copy_(torch.tensor(c["weight"], dtype=torch.float64))
        m.bias.copy_(torch.tensor(c["bias"], dtype=torch.float64))
        m.running_mean.copy_(torch.tensor(c["running_mean"], dtype=torch.float64))
        m.running_var.copy_(torch.tensor(c["running_var"], dtype=torch.float64))
    return m


def run_case(c):
    shape = (c["N"], c["C"], c["H"], c["W"])
    m = module_for(c)
    f64 = torch.float64
    res = {}
    with torch.no_grad():
        w = m.weight
        scale = w * (m.running_var + m.eps).rsqrt()
        shift = m.bias - m.running_mean * scale
        res["scale"], res["shift"] = scale.tolist(), shift.tolist()
        # every fifth residual cancels fbn(x) exactly (pre-activation +0 for add+relu)
        if c["name"] not in ("exact_signs_eps0",):
            y0 = m(torch.tensor(c["x"], dtype=f64).reshape(shape)).reshape(-1).tolist()
            for i in range(len(c["residual"])):
                if i % 5 == 2:
                    c["residual"][i] = -y0[i]
    g = torch.tensor(c["grad_y"], dtype=f64).reshape(shape)
    for epi in ("none", "relu", "add_relu"):
        x = torch.tensor(c["x"], dtype=f64).reshape(shape).requires_grad_(True)
        r = torch.tensor(c["residual"], dtype=f64).reshape(shape).requires_grad_(True)
        y = m(x)
        if epi == "relu":
            y = torch.relu(y)
        elif epi == "add_relu":
            y = torch.relu(y + r)
        y.backward(g)
        res["y_" + epi] = y.detach().reshape(-1).tolist()
        res["grad_x_" + epi] = x.grad.detach().reshape(-1).tolist()
        if epi == "add_relu":
            res["grad_residual_add_relu"] = r.grad.detach().reshape(-1).tolist()
    return res



def render():
    torch.set_num_threads(1)
    cases = build_cases()
    lines = [
        "# detops FrozenBatchNorm2d golden vectors: torchvision.ops.FrozenBatchNorm2d (+ torch.relu, + residual),",
        "# float64, CPU, forward and autograd backward. Generated by scripts/gen_golden_frozen_bn.py (format",
        "# documented there); do not edit.",
        "# torch %s, torchvision %s, seed %d, %d cases." % (torch.__version__, torchvision.__version__, SEED,
                                                          len(cases)),
    ]
    for c in cases:
        res = run_case(c)
        C, W = c["C"], c["W"]
        lines.append("case %s N=%d C=%d H=%d W=%d eps=%s" % (c["name"], c["N"], C, c["H"], W, fmt(c["eps"])))
        for key in ("weight", "bias", "running_mean", "running_var"):
            emit_array(lines, key, c[key], C)
        emit_array(lines, "scale", res["scale"], C)
        emit_array(lines, "shift", res["shift"], C)
        for key in ("x", "residual", "grad_y"):
            emit_array(lines, key, c[key], W)
        for key in ("y_none", "y_relu", "y_add_relu", "grad_x_none", "grad_x_relu", "grad_x_add_relu",
                    "grad_residual_add_relu"):
            emit_array(lines, key, res[key], W)
        lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


def main():
    return write_or_check(__doc__.split("\n")[0], OUT_NAME, render)


if __name__ == "__main__":
    sys.exit(main())
