#!/usr/bin/python3
"""Generate the multi-scale deformable attention golden vectors in tests/golden/ from PyTorch's
F.grid_sample, composed the way Deformable-DETR's pure-PyTorch fallback (ms_deform_attn_core_pytorch)
composes it: per level, value rows as (B*M, D, H, W) maps, grid = 2 * location - 1, bilinear,
padding zeros, align_corners=False; the samples weighted by the attention weights and summed over
(level, point). Autograd gives the three gradients.

Run with Debian's python3 and its python3-torch package (torch 1.13.1, CPU), from anywhere:

    /usr/bin/python3 scripts/gen_golden_ms_deform_attn.py          # writes tests/golden/ms_deform_attn_grid_sample.txt
    /usr/bin/python3 scripts/gen_golden_ms_deform_attn.py --check  # regenerate in memory, compare bytes

Everything is float64 and seeded (Python's `random.Random`), and grid_sample's CPU kernels are
sequential, so the output is byte-for-byte reproducible.

grid_sample and the kernels agree everywhere except on the kernels' bounds: a sample exactly at
x = -1 or x = W (or y) is skipped by the kernels, while grid_sample still differentiates its
zero-weighted corner. Random locations never land there; tests/ms_deform_attn_test.cpp checks the
boundary against the float64 reference instead. Locations are drawn from [-0.2, 1.2], so some
samples fall outside their level (both give zeros there).

Cases vary B, M, D, Q, P and the levels (odd sizes, a 1xW level, a 1x1 level).

File format (text, '#' comment lines, whitespace-separated tokens):

    case <name> B=<b> S=<s> M=<m> D=<d> Q=<q> L=<l> P=<p>
    spatial_shapes <2L>             (H, W) per level
    value <B*S*M*D>                 [B, S, M, D]
    sampling_locations <...>        [B, Q, M, L, P, 2], (x, y)
    attention_weights <...>         [B, Q, M, L, P]
    output <B*Q*M*D>                [B, Q, M*D]
    grad_output <B*Q*M*D>           the upstream gradient fed to backward
    grad_value, grad_sampling_locations, grad_attention_weights   the three gradients
    end

Values are printed with Python's repr() (the shortest decimal that reads back to the same double).
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import emit_array, write_or_check  # noqa: E402

import torch
import torch.nn.functional as F

SEED = 20261202
OUT_NAME = "ms_deform_attn_grid_sample.txt"

# name, B, M, D, Q, P, levels (H, W)
CASES = [
    ("small_two_levels", 1, 2, 3, 5, 2, [(3, 5), (2, 2)]),
    ("three_levels_one_row", 2, 1, 4, 3, 3, [(4, 4), (1, 3), (2, 1)]),
    ("four_levels_one_pixel", 1, 3, 2, 6, 4, [(6, 7), (3, 4), (2, 2), (1, 1)]),
    ("wide_heads", 2, 4, 8, 4, 2, [(5, 3), (3, 2)]),
]


def msda_grid_sample(value, shapes, loc, attn):
    """value [B, S, M, D], loc [B, Q, M, L, P, 2], attn [B, Q, M, L, P] -> [B, Q, M*D]."""
    B, S, M, D = value.shape
    _, Q, _, L, P, _ = loc.shape
    grids = 2 * loc - 1
    sampled = []
    start = 0
    for lvl, (H, W) in enumerate(shapes):
        rows = value[:, start:start + H * W]  # [B, HW, M, D]
        start += H * W
        maps = rows.flatten(2).transpose(1, 2).reshape(B * M, D, H, W)
        grid = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)  # [B*M, Q, P, 2]
        sampled.append(F.grid_sample(maps, grid, mode="bilinear", padding_mode="zeros", align_corners=False))
    stacked = torch.stack(sampled, dim=-2).flatten(-2)  # [B*M, D, Q, L*P]
    weights = attn.transpose(1, 2).reshape(B * M, 1, Q, L * P)
    out = (stacked * weights).sum(-1).view(B, M * D, Q)
    return out.transpose(1, 2).contiguous()


def values(rng, count, lo, hi):
    return [rng.uniform(lo, hi) for _ in range(count)]


def render():
    rng = random.Random(SEED)
    lines = ["# multi-scale deformable attention golden vectors (float64): F.grid_sample composition,",
             "# torch %s; written by scripts/gen_golden_ms_deform_attn.py" % torch.__version__]
    for name, B, M, D, Q, P, shapes in CASES:
        L = len(shapes)
        S = sum(h * w for h, w in shapes)
        value = torch.tensor(values(rng, B * S * M * D, -1, 1), dtype=torch.float64).view(B, S, M, D)
        loc = torch.tensor(values(rng, B * Q * M * L * P * 2, -0.2, 1.2), dtype=torch.float64).view(B, Q, M, L, P, 2)
        attn = torch.tensor(values(rng, B * Q * M * L * P, -1, 1), dtype=torch.float64).view(B, Q, M, L, P)
        grad_out = torch.tensor(values(rng, B * Q * M * D, -1, 1), dtype=torch.float64).view(B, Q, M * D)
        value.requires_grad_(True)
        loc.requires_grad_(True)
        attn.requires_grad_(True)
        out = msda_grid_sample(value, shapes, loc, attn)
        out.backward(grad_out)
        lines.append("case %s B=%d S=%d M=%d D=%d Q=%d L=%d P=%d" % (name, B, S, M, D, Q, L, P))
        emit_array(lines, "spatial_shapes", [v for hw in shapes for v in hw], 2, as_int=True)
        flat = lambda t: t.detach().reshape(-1).tolist()  # noqa: E731
        emit_array(lines, "value", flat(value), D)
        emit_array(lines, "sampling_locations", flat(loc), 2)
        emit_array(lines, "attention_weights", flat(attn), P)
        emit_array(lines, "output", flat(out), M * D)
        emit_array(lines, "grad_output", flat(grad_out), M * D)
        emit_array(lines, "grad_value", flat(value.grad), D)
        emit_array(lines, "grad_sampling_locations", flat(loc.grad), 2)
        emit_array(lines, "grad_attention_weights", flat(attn.grad), P)
        lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


if __name__ == "__main__":
    sys.exit(write_or_check(__doc__.splitlines()[0], OUT_NAME, render))
