#!/usr/bin/python3
"""Generate the grid_sample golden vectors in tests/golden/ from torch.nn.functional.grid_sample.

Run with Debian's python3 and its python3-torch package (torch 1.13.1, CPU; it reports itself as
1.13.0a0), from anywhere:

    /usr/bin/python3 scripts/gen_golden_grid_sample.py            # writes tests/golden/grid_sample_torch.txt
    /usr/bin/python3 scripts/gen_golden_grid_sample.py --check    # regenerate in memory, compare bytes

Everything is float64 and seeded (Python's own `random.Random`), one thread, so the output is
byte-for-byte reproducible.

What is covered: every mode {bilinear, nearest} x padding {zeros, border, reflection} x
align_corners {0, 1}, on two map sizes (N=2, C=2, 4x5 and N=1, C=3, 1x6: a one-pixel axis, where
reflection with align_corners is degenerate). Each grid holds, for both axes:
  * the special points: exactly -1 and 1, the last pixel's centre (1 with align_corners,
    1 - 1/size without), the first pixel's centre, 0, one pixel and three pixels outside on both
    sides (reflection folds them back), a point on a pixel edge (a .5 coordinate: nearest rounds
    half to even), and points just inside and outside the border (1 -/+ 2^-10);
  * random dyadic values k/256 in [-1.5, 1.5] (exact in every precision).
Input values are k/1000 for integers k in [-5000, 5000], grad_output values k/100 in [-1, 1].

File format (text, ASCII, '#' starts a comment line):

    case <name> N=<n> C=<c> H=<h> W=<w> Ho=<ho> Wo=<wo> mode=<bilinear|nearest> padding=<zeros|border|reflection> align_corners=<0|1>
    input <count>          NCHW order (count = N*C*H*W)
    grid <count>           [N, Ho, Wo, 2] order, (x, y) pairs
    output <count>         F.grid_sample(input, grid, ...), [N, C, Ho, Wo]
    grad_output <count>    the upstream gradient fed to backward, [N, C, Ho, Wo]
    grad_input <count>     input.grad, NCHW
    grad_grid <count>      grid.grad, [N, Ho, Wo, 2]
    end

Values are printed with Python's repr() (the shortest decimal string that reads back to the
identical double).
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import emit_array, write_or_check  # noqa: E402

import torch
import torch.nn.functional as F

SEED = 20261202
OUT_NAME = "grid_sample_torch.txt"
MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border", "reflection")
SHAPES = ((2, 2, 4, 5), (1, 3, 1, 6))  # N, C, H, W
RANDOM_POINTS = 12


def specials(size, align_corners):
    """Normalized coordinates of the special points along an axis of `size` pixels."""
    px = 2.0 / (size - 1) if (align_corners and size > 1) else 2.0 / size  # one pixel, normalized
    last = 1.0 if align_corners else 1.0 - 1.0 / size
    first = -last
    edge = first + 0.5 * px  # halfway between the first two pixel centres: a .5 coordinate
    eps = 2.0 ** -10
    return [-1.0, 1.0, last, first, 0.0, 1.0 + px, -1.0 - px, 1.0 + 3 * px, -1.0 - 3 * px, edge, 1.0 - eps, 1.0 + eps,
            -1.0 + eps, -1.0 - eps]


def build_grid(rng, N, H, W, align_corners):
    """Ho = 1 row per batch of points: all x specials with each y special (and random points)."""
    xs, ys = specials(W, align_corners), specials(H, align_corners)
    pts = []
    for i, x in enumerate(xs):
        pts.append((x, ys[(i * 5) % len(ys)]))
    for i, y in enumerate(ys):
        pts.append((xs[(i * 3 + 1) % len(xs)], y))
    for _ in range(RANDOM_POINTS):
        pts.append((rng.randint(-384, 384) / 256.0, rng.randint(-384, 384) / 256.0))
    Wo = 8
    Ho = (len(pts) + Wo - 1) // Wo
    while len(pts) < Ho * Wo:
        pts.append((rng.randint(-256, 256) / 256.0, rng.randint(-256, 256) / 256.0))
    grid = []
    for n in range(N):
        rot = (n * 5) % len(pts)  # the second image sees the points in another order
        for p in pts[rot:] + pts[:rot]:
            grid.extend(p)
    return Ho, Wo, grid


def build_cases():
    rng = random.Random(SEED)
    cases = []
    for (N, C, H, W) in SHAPES:
        for mode in MODES:
            for padding in PADDINGS:
                for ac in (False, True):
                    Ho, Wo, grid = build_grid(rng, N, H, W, ac)
                    cases.append(dict(
                        name="%s_%s_ac%d_%dx%d" % (mode, padding, int(ac), H, W), N=N, C=C, H=H, W=W, Ho=Ho, Wo=Wo,
                        mode=mode, padding=padding, ac=ac, grid=grid,
                        input=[rng.randint(-5000, 5000) / 1000.0 for _ in range(N * C * H * W)],
                        grad_output=[rng.randint(-100, 100) / 100.0 for _ in range(N * C * Ho * Wo)]))
    return cases


def run_case(c):
    N, C, H, W, Ho, Wo = c["N"], c["C"], c["H"], c["W"], c["Ho"], c["Wo"]
    x = torch.tensor(c["input"], dtype=torch.float64).reshape(N, C, H, W).requires_grad_(True)
    g = torch.tensor(c["grid"], dtype=torch.float64).reshape(N, Ho, Wo, 2).requires_grad_(True)
    out = F.grid_sample(x, g, mode=c["mode"], padding_mode=c["padding"], align_corners=c["ac"])
    go = torch.tensor(c["grad_output"], dtype=torch.float64).reshape(out.shape)
    out.backward(go)
    return (out.detach().reshape(-1).tolist(), x.grad.detach().reshape(-1).tolist(),
            g.grad.detach().reshape(-1).tolist())


def render():
    torch.set_num_threads(1)
    cases = build_cases()
    lines = [
        "# detops grid_sample golden vectors: torch.nn.functional.grid_sample, float64, CPU.",
        "# Generated by scripts/gen_golden_grid_sample.py (format documented there); do not edit.",
        "# torch %s, seed %d, %d cases." % (torch.__version__, SEED, len(cases)),
    ]
    for c in cases:
        out, grad_in, grad_grid = run_case(c)
        lines.append("case %s N=%d C=%d H=%d W=%d Ho=%d Wo=%d mode=%s padding=%s align_corners=%d" % (
            c["name"], c["N"], c["C"], c["H"], c["W"], c["Ho"], c["Wo"], c["mode"], c["padding"], int(c["ac"])))
        emit_array(lines, "input", c["input"], c["W"])
        emit_array(lines, "grid", c["grid"], 2 * c["Wo"])
        emit_array(lines, "output", out, c["Wo"])
        emit_array(lines, "grad_output", c["grad_output"], c["Wo"])
        emit_array(lines, "grad_input", grad_in, c["W"])
        emit_array(lines, "grad_grid", grad_grid, 2 * c["Wo"])
        lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


def main():
    return write_or_check(__doc__.split("\n")[0], OUT_NAME, render)


if __name__ == "__main__":
    sys.exit(main())
