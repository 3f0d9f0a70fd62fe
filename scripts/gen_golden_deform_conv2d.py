#!/usr/bin/python3
"""Generate the deform_conv2d golden vectors in tests/golden/ from torchvision.ops.deform_conv2d.

Run with Debian's python3 and its python3-torchvision package (torchvision 0.14.1 over torch 1.13.1,
CPU; they report themselves as 0.14.1a0 and 1.13.0a0), from anywhere:

    /usr/bin/python3 scripts/gen_golden_deform_conv2d.py            # writes tests/golden/deform_conv2d_torchvision.txt
    /usr/bin/python3 scripts/gen_golden_deform_conv2d.py --check    # regenerate in memory, compare bytes

Everything is float64 and seeded (Python's own `random.Random`), one thread, so the output is
byte-for-byte reproducible. The gradients are torch.autograd's (torchvision's CPU backward).

What is covered (CASES below): with and without mask and bias; groups 1 and 2; offset groups 1, 2
and 3; stride 2; padding 1 and 2; dilation 2; different h and w settings; non-square kernels (3x2,
1x3, 3x1); tiny maps (1xW, Hx1, 1x1); a batch of 4 (torchvision runs it as two blocks of 2 images);
random real values.

Most offsets are chosen to put the sample on a target coordinate (offset = target - the tap's
base position, so the coordinate is exact): for each axis of size S, the borders -1, 0, S - 1 and
S, just inside and outside them (+-2^-10), beyond the map (-1.5, S + 0.5, -3), integer coordinates
inside the map, half pixels, and random k/64 values in [-2, S + 1]; the rest are small random
offsets k/32 in [-1.5, 1.5]. Every value is dyadic, so every input is exact: input k/256 in
[-4, 4], weight k/128 in [-1, 1], mask k/256 in [-0.25, 1.25] (with exact 0s and 1s), bias k/64
in [-2, 2], grad_output k/128 in [-1, 1]. (With so few bits, torchvision's products and sums are
exact too, whatever order its GEMM sums in.) One case (REAL_VALUED) draws random reals from the
same ranges instead, offsets included: there the sums round, and their order shows.

File format (text, ASCII, '#' starts a comment line):

    case <name> N=<n> Cin=<c> H=<h> W=<w> Cout=<o> kh=<kh> kw=<kw> groups=<g> offset_groups=<og>
         stride_h=<> stride_w=<> pad_h=<> pad_w=<> dilation_h=<> dilation_w=<> Ho=<ho> Wo=<wo>
         mask=<0|1> bias=<0|1>                      (all on one line)
    input <count>          [N, Cin, H, W]
    weight <count>         [Cout, Cin / groups, kh, kw]
    offset <count>         [N, 2 * og * kh * kw, Ho, Wo] (channel 2 t: y of tap t, 2 t + 1: x)
    mask <count>           [N, og * kh * kw, Ho, Wo]          (only when mask=1)
    bias <count>           [Cout]                             (only when bias=1)
    grad_output <count>    the upstream gradient fed to backward, [N, Cout, Ho, Wo]
    output <count>         torchvision.ops.deform_conv2d(input, offset, weight, bias, ..., mask=mask)
    grad_input <count>     input.grad
    grad_weight <count>    weight.grad
    grad_offset <count>    offset.grad
    grad_offset_mmcv <count>  the same under mmcv's (and detectron2's) border rule: their
                           get_coordinate_weight returns 0 unless -1 < y < H and -1 < x < W, so
                           both entries of a sample outside that open box are 0 and the rest are
                           torchvision's (the kernels share every other expression)
    grad_mask <count>      mask.grad                          (only when mask=1)
    grad_bias <count>      bias.grad                          (only when bias=1)
    end

Arrays are in row-major order of the shapes above, one row of the last dimension per line.
Values are printed with Python's repr() (the shortest decimal string that reads back to the
identical double).
"""

import os
import random
import sys

# One thread everywhere (OpenMP and the BLAS torch links): the GEMMs' sums keep one order.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import emit_array, write_or_check  # noqa: E402

import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision.ops import deform_conv2d  # noqa: E402

SEED = 20261215
OUT_NAME = "deform_conv2d_torchvision.txt"
TARGET_FRACTION = 0.75  # of the offsets: put the sample on a target coordinate

# name, N, Cin, H, W, Cout, (kh, kw), groups, offset_groups, (stride), (pad), (dilation), mask, bias
CASES = (
    ("basic_3x3_mask_bias", 2, 2, 5, 5, 3, (3, 3), 1, 1, (1, 1), (1, 1), (1, 1), True, True),
    ("v1_no_mask_no_bias", 1, 3, 4, 5, 2, (3, 3), 1, 1, (1, 1), (0, 0), (1, 1), False, False),
    ("groups2_mask", 2, 4, 4, 5, 4, (3, 3), 2, 1, (1, 1), (1, 1), (1, 1), True, False),
    ("offset_groups2_bias", 1, 4, 6, 5, 3, (3, 3), 1, 2, (1, 1), (1, 1), (1, 1), False, True),
    ("groups2_offset_groups2", 2, 4, 4, 4, 6, (3, 3), 2, 2, (1, 1), (1, 1), (1, 1), True, True),
    ("stride2", 1, 2, 7, 8, 2, (3, 3), 1, 1, (2, 2), (1, 1), (1, 1), True, False),
    ("pad2_dilation2", 1, 2, 6, 6, 3, (3, 3), 1, 1, (1, 1), (2, 2), (2, 2), True, True),
    ("kernel3x2_mixed_hw", 2, 2, 5, 4, 2, (3, 2), 1, 2, (2, 1), (1, 1), (1, 2), True, True),
    ("kernel1x3_offset_groups3", 1, 3, 4, 6, 2, (1, 3), 1, 3, (1, 1), (0, 1), (1, 1), True, False),
    ("map_1xW", 1, 2, 1, 7, 2, (1, 3), 1, 1, (1, 1), (0, 1), (1, 1), True, True),
    ("map_Hx1", 2, 1, 6, 1, 2, (3, 1), 1, 1, (1, 1), (1, 0), (1, 1), False, True),
    ("map_1x1_pad1", 1, 2, 1, 1, 2, (3, 3), 1, 1, (1, 1), (1, 1), (1, 1), True, True),
    ("batch4_two_blocks", 4, 2, 3, 4, 2, (2, 2), 1, 1, (1, 1), (0, 1), (1, 1), True, True),
    ("real_values", 1, 2, 4, 4, 2, (3, 3), 1, 1, (1, 1), (1, 1), (1, 1), True, True),
)
REAL_VALUED = ("real_values",)  # cases with random reals instead of dyadics: products and sums round


def dyadic(rng, lo, hi, den):
    return rng.randint(int(lo * den), int(hi * den)) / float(den)


def draw(rng, lo, hi, den, reals):
    """k/den in [lo, hi], or (reals) a uniform random real in [lo, hi]."""
    return rng.uniform(lo, hi) if reals else dyadic(rng, lo, hi, den)


def target(rng, size):
    """A sample coordinate along an axis of `size` pixels: a border, near one, outside, an
    integer or half pixel inside, or random."""
    eps = 2.0 ** -10
    s = float(size)
    kind = rng.randrange(10)
    if kind == 0:
        return rng.choice((-1.0, 0.0, s - 1, s))
    if kind == 1:
        return rng.choice((-1.0 + eps, -1.0 - eps, s - 1 + eps, s - 1 - eps, s - eps, s + eps, eps, -eps))
    if kind == 2:
        return rng.choice((-1.5, -3.0, s + 0.5, -0.5, s - 0.5))
    if kind in (3, 4):
        return float(rng.randint(0, size - 1))
    if kind == 5:
        return rng.randint(0, size - 1) + 0.5
    return dyadic(rng, -2.0, s + 1, 64)


def build_case(rng, spec):
    (name, N, Cin, H, W, Cout, (kh, kw), groups, og, (sh, sw), (ph, pw), (dh, dw), has_mask, has_bias) = spec
    reals = name in REAL_VALUED
    Ho = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    Wo = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    c = dict(name=name, N=N, Cin=Cin, H=H, W=W, Cout=Cout, kh=kh, kw=kw, groups=groups, og=og, sh=sh, sw=sw, ph=ph,
             pw=pw, dh=dh, dw=dw, Ho=Ho, Wo=Wo, has_mask=has_mask, has_bias=has_bias)
    c["input"] = [draw(rng, -4, 4, 256, reals) for _ in range(N * Cin * H * W)]
    c["weight"] = [draw(rng, -1, 1, 128, reals) for _ in range(Cout * (Cin // groups) * kh * kw)]
    offset = []
    for n in range(N):
        for g in range(og):
            for i in range(kh):
                for j in range(kw):
                    for axis in (0, 1):  # y then x
                        for ho in range(Ho):
                            for wo in range(Wo):
                                if axis == 0:
                                    base, size = ho * sh - ph + i * dh, H
                                else:
                                    base, size = wo * sw - pw + j * dw, W
                                if not reals and rng.random() < TARGET_FRACTION:
                                    offset.append(target(rng, size) - base)  # exact: small dyadics
                                else:
                                    offset.append(draw(rng, -1.5, 1.5, 32, reals))
    c["offset"] = offset
    if has_mask:
        c["mask"] = [rng.choice((0.0, 1.0)) if rng.random() < 0.1 else draw(rng, -0.25, 1.25, 256, reals)
                     for _ in range(N * og * kh * kw * Ho * Wo)]
    if has_bias:
        c["bias"] = [draw(rng, -2, 2, 64, reals) for _ in range(Cout)]
    c["grad_output"] = [draw(rng, -1, 1, 128, reals) for _ in range(N * Cout * Ho * Wo)]
    return c


def run_case(c):
    def t(key, shape):
        return torch.tensor(c[key], dtype=torch.float64).reshape(shape).requires_grad_(True)

    N, Cin, H, W, Cout, kh, kw, og, Ho, Wo = (c[k] for k in ("N", "Cin", "H", "W", "Cout", "kh", "kw", "og", "Ho",
                                                             "Wo"))
    x = t("input", (N, Cin, H, W))
    w = t("weight", (Cout, Cin // c["groups"], kh, kw))
    off = t("offset", (N, 2 * og * kh * kw, Ho, Wo))
    m = t("mask", (N, og * kh * kw, Ho, Wo)) if c["has_mask"] else None
    b = t("bias", (Cout,)) if c["has_bias"] else None
    out = deform_conv2d(x, off, w, bias=b, stride=(c["sh"], c["sw"]), padding=(c["ph"], c["pw"]),
                        dilation=(c["dh"], c["dw"]), mask=m)
    assert tuple(out.shape) == (N, Cout, Ho, Wo), (c["name"], tuple(out.shape))
    out.backward(torch.tensor(c["grad_output"], dtype=torch.float64).reshape(out.shape))

    def flat(v):
        return v.detach().reshape(-1).tolist()

    res = dict(output=flat(out), grad_input=flat(x.grad), grad_weight=flat(w.grad), grad_offset=flat(off.grad))
    if m is not None:
        res["grad_mask"] = flat(m.grad)
    if b is not None:
        res["grad_bias"] = flat(b.grad)
    return res


def mmcv_grad_offset(c, grad_offset):
    """grad_offset under mmcv's border rule: torchvision's, with both entries of every sample
    outside -1 < y < H, -1 < x < W set to 0. The coordinates are exact (dyadic offsets), and the
    check uses the same float64 sums torchvision's kernel forms."""
    N, H, W, kh, kw, og, Ho, Wo = (c[k] for k in ("N", "H", "W", "kh", "kw", "og", "Ho", "Wo"))
    out = list(grad_offset)
    plane = Ho * Wo
    for n in range(N):
        for t in range(og * kh * kw):
            i, j = (t % (kh * kw)) // kw, t % kw
            base = (n * 2 * og * kh * kw + 2 * t) * plane
            for ho in range(Ho):
                for wo in range(Wo):
                    at = base + ho * Wo + wo
                    y = (ho * c["sh"] - c["ph"] + i * c["dh"]) + c["offset"][at]
                    x = (wo * c["sw"] - c["pw"] + j * c["dw"]) + c["offset"][at + plane]
                    if not (-1 < y < H and -1 < x < W):
                        out[at] = 0.0
                        out[at + plane] = 0.0
    return out


def render():
    torch.set_num_threads(1)
    rng = random.Random(SEED)
    cases = [build_case(rng, spec) for spec in CASES]
    lines = [
        "# detops deform_conv2d golden vectors: torchvision.ops.deform_conv2d, float64, CPU.",
        "# Generated by scripts/gen_golden_deform_conv2d.py (format documented there); do not edit.",
        "# torchvision %s, torch %s, seed %d, %d cases." % (torchvision.__version__, torch.__version__, SEED,
                                                            len(cases)),
    ]
    for c in cases:
        res = run_case(c)
        lines.append(
            "case %s N=%d Cin=%d H=%d W=%d Cout=%d kh=%d kw=%d groups=%d offset_groups=%d stride_h=%d stride_w=%d "
            "pad_h=%d pad_w=%d dilation_h=%d dilation_w=%d Ho=%d Wo=%d mask=%d bias=%d" % (
                c["name"], c["N"], c["Cin"], c["H"], c["W"], c["Cout"], c["kh"], c["kw"], c["groups"], c["og"],
                c["sh"], c["sw"], c["ph"], c["pw"], c["dh"], c["dw"], c["Ho"], c["Wo"], int(c["has_mask"]),
                int(c["has_bias"])))
        emit_array(lines, "input", c["input"], c["W"])
        emit_array(lines, "weight", c["weight"], c["kw"])
        emit_array(lines, "offset", c["offset"], c["Wo"])
        if c["has_mask"]:
            emit_array(lines, "mask", c["mask"], c["Wo"])
        if c["has_bias"]:
            emit_array(lines, "bias", c["bias"], c["Cout"])
        emit_array(lines, "grad_output", c["grad_output"], c["Wo"])
        emit_array(lines, "output", res["output"], c["Wo"])
        emit_array(lines, "grad_input", res["grad_input"], c["W"])
        emit_array(lines, "grad_weight", res["grad_weight"], c["kw"])
        emit_array(lines, "grad_offset", res["grad_offset"], c["Wo"])
        emit_array(lines, "grad_offset_mmcv", mmcv_grad_offset(c, res["grad_offset"]), c["Wo"])
        if c["has_mask"]:
            emit_array(lines, "grad_mask", res["grad_mask"], c["Wo"])
        if c["has_bias"]:
            emit_array(lines, "grad_bias", res["grad_bias"], c["Cout"])
        lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


def main():
    return write_or_check(__doc__.split("\n")[0], OUT_NAME, render)


if __name__ == "__main__":
    sys.exit(main())
