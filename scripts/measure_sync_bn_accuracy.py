#!/usr/bin/python3
"""torch.nn.BatchNorm2d's training-mode accuracy over a sweep of mean/spread ratios (issue 14).

The torch side of tests/sync_batch_norm_accuracy_test.cpp (which measures detops' kExact and
kDefault modes): the same data distributions, the same reference and the same error measures, so
the two tables compare row by row (the random numbers differ). Run with Debian's python3 and its
python3-torch (torch 1.13.1, CPU) and numpy:

    /usr/bin/python3 scripts/measure_sync_bn_accuracy.py [--seeds K] [--threads T]

Data, shape [8, 16, 14, 14]: channel c has spread s_c = 2^(c/16) and mean r * s_c,
x = r * s_c + s_c * U(-1, 1); grad_y = U(-1, 1); weight = 1 + 0.5 U(-1, 1); bias = 0.5 U(-1, 1);
eps = 1e-5. float32 rows round every input to float32 first, and the reference uses the values as
stored. torch: BatchNorm2d(16).train() in the dtype, y = bn(x), y.backward(grad_y); save_mean and
save_invstd from torch.ops.aten.native_batch_norm on the same inputs (float32 for float32 input).

Reference: numpy long double (80-bit on x86) with a pivot x0 = the channel's first value:
d = x - x0 (exact), mean = x0 + sum(d) / n never rounded to float64.

Errors (each the largest over channels or elements; K seeds: the largest over seeds):
    mean    |save_mean - mean| * invstd     (in standard deviations)
    invstd  |save_invstd / invstd - 1|
    y, gx   max |got - ref| / max |ref|     (normwise over the tensor)
    gw      |got - ref| / (invstd * sum |dy (x - mean)|)
    gb      |got - ref| / sum |dy|
"""
import argparse

import numpy as np
import torch

N, C, H, W = 8, 16, 14, 14
EPS = 1e-5
RATIOS = [0, 1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9]
NAMES = ["mean", "invstd", "y", "grad_x", "grad_w", "grad_b"]
LD = np.longdouble


def make_data(ratio, np_dtype, rng):
    s = np.exp2(np.arange(C) / C).reshape(1, C, 1, 1)
    x = ratio * s + s * rng.uniform(-1.0, 1.0, size=(N, C, H, W))
    dy = rng.uniform(-1.0, 1.0, size=(N, C, H, W))
    w = 1.0 + 0.5 * rng.uniform(-1.0, 1.0, size=C)
    b = 0.5 * rng.uniform(-1.0, 1.0, size=C)
    return [a.astype(np_dtype) for a in (x, dy, w, b)]


def reference(x, dy, w, b):
    x = x.astype(np.float64).astype(LD)
    dy = dy.astype(np.float64).astype(LD)
    w = w.astype(np.float64).astype(LD).reshape(1, C, 1, 1)
    b = b.astype(np.float64).astype(LD).reshape(1, C, 1, 1)
    n = LD(N * H * W)
    x0 = x[0, :, 0, 0].reshape(1, C, 1, 1)
    d = x - x0
    md = d.sum(axis=(0, 2, 3), keepdims=True) / n
    dev = d - md
    var = (dev * dev).sum(axis=(0, 2, 3), keepdims=True) / n
    invstd = LD(1) / np.sqrt(var + LD(EPS))
    y = dev * invstd * w + b
    sdy = dy.sum(axis=(0, 2, 3), keepdims=True)
    sdyx = (dy * dev).sum(axis=(0, 2, 3), keepdims=True)
    dx = (dy - sdy / n - dev * invstd * invstd * sdyx / n) * w * invstd
    return dict(
        x0=x0.ravel(), md=md.ravel(), invstd=invstd.ravel(), y=y, dx=dx,
        dw=(sdyx * invstd).ravel(), db=sdy.ravel(),
        dw_abs=(np.abs(dy * dev).sum(axis=(0, 2, 3)) * invstd.ravel()), db_abs=np.abs(dy).sum(axis=(0, 2, 3)))


def run_torch(x, dy, w, b, torch_dtype):
    xt = torch.from_numpy(x).to(torch_dtype).requires_grad_(True)
    bn = torch.nn.BatchNorm2d(C, eps=EPS, momentum=0.1).to(torch_dtype).train()
    with torch.no_grad():
        bn.weight.copy_(torch.from_numpy(w))
        bn.bias.copy_(torch.from_numpy(b))
    y = bn(xt)
    y.backward(torch.from_numpy(dy).to(torch_dtype))
    rm = torch.zeros(C, dtype=torch_dtype)
    rv = torch.ones(C, dtype=torch_dtype)
    with torch.no_grad():
        _, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
            xt.detach(), bn.weight.detach(), bn.bias.detach(), rm, rv, True, 0.1, EPS)
    f = lambda t: t.detach().to(torch.float64).numpy()
    return dict(y=f(y), dx=f(xt.grad), mean=f(save_mean), invstd=f(save_invstd), dw=f(bn.weight.grad),
                db=f(bn.bias.grad))


def errors(ref, got):
    e = {}
    e["mean"] = np.max(np.abs((got["mean"].astype(LD) - ref["x0"]) - ref["md"]) * ref["invstd"])
    e["invstd"] = np.max(np.abs(got["invstd"].astype(LD) / ref["invstd"] - 1))
    e["y"] = np.max(np.abs(got["y"].astype(LD) - ref["y"])) / np.max(np.abs(ref["y"]))
    e["grad_x"] = np.max(np.abs(got["dx"].astype(LD) - ref["dx"])) / np.max(np.abs(ref["dx"]))
    # a channel whose stored values are all equal has sum |dy (x - mean)| = 0 (float32 at large m/s)
    e["grad_w"] = np.max(np.abs(got["dw"].astype(LD) - ref["dw"]) / np.maximum(ref["dw_abs"], LD(1e-300)))
    e["grad_b"] = np.max(np.abs(got["db"].astype(LD) - ref["db"]) / np.maximum(ref["db_abs"], LD(1e-300)))
    return {k: float(v) for k, v in e.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=1, help="draws per row; the table shows the largest errors")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert np.finfo(LD).nmant >= 63, "the reference needs an 80-bit (or wider) long double"
    print(f"torch {torch.__version__}, BatchNorm2d training mode, [{N}, {C}, {H}, {W}], eps {EPS}, "
          f"seeds {args.seeds}")
    print(f"{'dtype':<8} {'impl':<8} {'m/s':>8}" + "".join(f" {n:>9}" for n in NAMES))
    for name, np_dtype, torch_dtype in (("float64", np.float64, torch.float64), ("float32", np.float32, torch.float32)):
        for ratio in RATIOS:
            worst = dict.fromkeys(NAMES, 0.0)
            for seed in range(args.seeds):
                rng = np.random.default_rng(1400 + 17 * seed + int(np.log10(ratio + 1) * 8))
                x, dy, w, b = make_data(ratio, np_dtype, rng)
                e = errors(reference(x, dy, w, b), run_torch(x, dy, w, b, torch_dtype))
                worst = {k: max(worst[k], e[k]) for k in NAMES}
            print(f"{name:<8} {'torch':<8} {ratio:8.0e}" + "".join(f" {worst[k]:9.2e}" for k in NAMES))


if __name__ == "__main__":
    main()
