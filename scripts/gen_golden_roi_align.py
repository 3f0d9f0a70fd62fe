#!/usr/bin/python3
"""Generate the RoIAlign golden vectors in tests/golden/ from torchvision, used as a black box.

Run with Debian's python3 and its python3-torchvision package (torch 1.13.1, torchvision 0.14.1,
CPU; they report themselves as 1.13.0a0 / 0.14.1a0), from anywhere:

    /usr/bin/python3 scripts/gen_golden_roi_align.py            # writes tests/golden/roi_align_torchvision.txt
    /usr/bin/python3 scripts/gen_golden_roi_align.py --check    # regenerate in memory, compare bytes

Everything is float64 and seeded (Python's own `random.Random`, not numpy or torch), and the
torchvision CPU kernels are sequential, so the output is byte-for-byte reproducible.

What is covered (torchvision has avg pooling only, so every case is avg):
  * a sweep over aligned {0,1} x sampling_ratio {0,-1,1,2,3} x spatial_scale {1,0.5,0.25,0.125},
    with the output size rotating through (1,1), (2,3), (7,7), (14,14) so that every
    (aligned, sampling_ratio, output size) triple appears once; feature maps N=2, C=2 (or 3),
    H 7..11, W 5..9;
  * boxes designed in feature-map coordinates (then divided by spatial_scale, exactly: the scales
    are powers of two) : inside, partly outside, wholly outside, beyond the one-pixel apron,
    inside the apron only, zero-size, zero-width, negative-size (x2 < x1), tiny (< 1 px), huge
    (100 px on a ~10 px map, adaptive grid 100x100 at output 1x1), the whole map, a non-dyadic
    box, and boxes whose first or last sample lies exactly on the apron edge (y = -1, x = -1,
    y = H, x = W) or 1/64 beyond it;
  * large output sizes keep fewer boxes (7x7: three per case, walking the list; 14x14: one per
    case, the huge and apron-edge boxes first) to keep the file small.
Input values are k/1000 for random integers k in [-5000, 5000] and grad_output values k/100 for
k in [-100, 100] (short to print; mostly not float16-exact, so a "truncated" backward visibly
rounds them). Coordinates are dyadic except for the one non-dyadic box, so they are exact in
float32 too, and the apron-edge samples land exactly on -1 and H in any precision.

File format (text, ASCII, '#' starts a comment line, tokens separated by whitespace):

    case <name> N=<n> C=<c> H=<h> W=<w> K=<k> PH=<ph> PW=<pw> spatial_scale=<s> sampling_ratio=<r> aligned=<0|1>
    input <count>          then count values, NCHW order   (count = N*C*H*W)
    rois <count>           then count values, K rows of (batch_index, x1, y1, x2, y2)  (count = K*5)
    output <count>         then count values, torchvision.ops.roi_align output, [K, C, PH, PW]
    grad_output <count>    then count values, the upstream gradient fed to backward, [K, C, PH, PW]
    grad_input <count>     then count values, input.grad after output.backward(grad_output), NCHW
    end

Values are wrapped one row of the last dimension per line (a reader may simply read `count`
whitespace-separated numbers). Names are C identifiers (usable as GoogleTest parameter names).
Values are printed with Python's repr(), the shortest decimal string that reads back (e.g. with
strtod) to the identical double.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import emit_array, fmt, write_or_check  # noqa: E402

import torch
import torchvision
from torchvision.ops import roi_align

SEED = 20240611
OUT_NAME = "roi_align_torchvision.txt"

ALIGNED = (False, True)
SAMPLING_RATIOS = (0, -1, 1, 2, 3)
SCALES = (1.0, 0.5, 0.25, 0.125)
OUTPUT_SIZES = ((1, 1), (2, 3), (7, 7), (14, 14))
# Large outputs keep a few boxes per case (indices into make_rois' list): 7x7 cases take three
# consecutive boxes each, walking the whole list; 14x14 cases take one box each, in this order.
BOXES_7X7 = 3
BOXES_14X14 = (11, 12, 13, 1, 0, 16, 2, 9, 14, 18)



def feature_boxes(H, W, PH, PW, sr):
    """Boxes as (label, start_x, start_y, end_x, end_y) in *feature-map* coordinates after the
    aligned offset, i.e. exactly the values the kernel computes as roi_start/roi_end."""
    g = sr if sr > 0 else 1  # grid per bin of the apron-edge boxes: one sample per pixel
    eh, ew = PH * g, PW * g  # their height and width (adaptive: ceil(eh / PH) = 1 = g)
    eps = 1.0 / 64
    return [
        ("inside", 1.25, 0.75, W - 1.5, H - 2.25),
        ("partly_out_tl", -2.5, -1.75, 2.5, 3.0),
        ("partly_out_br", W - 3.0, H - 2.0, W + 2.25, H + 3.5),
        ("outside_br", W + 1.5, H + 1.0, W + 4.0, H + 5.0),
        ("beyond_apron_tl", -6.0, -5.0, -2.0, -1.5),
        ("apron_strip_left", -1.0, 2.0, 0.0, 5.0),
        ("apron_strip_right", W - 0.75, 1.0, W * 1.0, H - 1.0),
        ("point", 2.25, 3.5, 2.25, 3.5),
        ("zero_width", 3.0, 1.0, 3.0, 5.0),
        ("negative", 4.0, 5.0, 1.5, 2.0),
        ("tiny", 2.125, 1.25, 2.5, 1.5),
        ("huge", -45.0, -40.0, 55.0, 60.0),
        ("edge_first_sample_tl", -1.5, -1.5, -1.5 + ew, -1.5 + eh),
        ("edge_last_sample_br", W + 0.5 - ew, H + 0.5 - eh, W + 0.5, H + 0.5),
        ("edge_first_sample_y", 1.0, -1.5, W - 1.0, -1.5 + eh),
        ("edge_last_sample_x", W + 0.5 - ew, 1.0, W + 0.5, H - 1.0),
        ("beyond_edge_tl", -1.5 - eps, -1.5 - eps, -1.5 - eps + ew, -1.5 - eps + eh),
        ("beyond_edge_br", W + 0.5 + eps - ew, H + 0.5 + eps - eh, W + 0.5 + eps, H + 0.5 + eps),
    ]


def make_rois(H, W, PH, PW, sr, scale, aligned, N, keep):
    off = 0.5 if aligned else 0.0
    boxes = feature_boxes(H, W, PH, PW, sr)
    rows = []
    for i, (_, sx, sy, ex, ey) in enumerate(boxes):
        # image coordinates: (feature + offset) / scale, exact for power-of-two scales
        rows.append([float(i % N), (sx + off) / scale, (sy + off) / scale, (ex + off) / scale, (ey + off) / scale])
    # the whole map, given directly in image coordinates
    rows.append([1.0 % N, 0.0, 0.0, W / scale, H / scale])
    # a non-dyadic box (not exact in binary; float32 callers see it rounded)
    rows.append([0.0, round(0.3 / scale, 6), round(1.7 / scale, 6), round(4.1 / scale, 6), round(5.9 / scale, 6)])
    if keep is not None:
        rows = [rows[j % len(rows)] for j in keep]
    return rows


def values(rng, count, lo, hi, denom=1000.0):
    return [rng.randint(lo, hi) / denom for _ in range(count)]


def build_cases():
    rng = random.Random(SEED)
    cases = []
    idx = 0
    n7 = n14 = 0
    for ia, aligned in enumerate(ALIGNED):
        for isr, sr in enumerate(SAMPLING_RATIOS):
            for isc, scale in enumerate(SCALES):
                size = OUTPUT_SIZES[(isc + isr + ia) % len(OUTPUT_SIZES)]
                PH, PW = size
                N = 2
                C = 3 if idx % 7 == 3 else 2
                H = 7 + (idx * 3) % 5  # 7..11
                W = 5 + (idx * 2 + idx // 5) % 5  # 5..9
                keep = None
                if size == (7, 7):
                    keep = [BOXES_7X7 * n7 + t for t in range(BOXES_7X7)]
                    n7 += 1
                elif size == (14, 14):
                    keep = [BOXES_14X14[n14 % len(BOXES_14X14)]]
                    n14 += 1
                rois = make_rois(H, W, PH, PW, sr, scale, aligned, N, keep)
                name = "a%d_sr%s_s%s_%dx%d" % (
                    int(aligned), ("m1" if sr < 0 else str(sr)), ("%g" % scale).replace(".", "p"), PH, PW)
                cases.append(dict(name=name, N=N, C=C, H=H, W=W, PH=PH, PW=PW, scale=scale, sr=sr,
                                  aligned=aligned, rois=rois))
                idx += 1
    # Random inputs and upstream gradients, drawn in case order from the one seeded generator.
    for c in cases:
        c["input"] = values(rng, c["N"] * c["C"] * c["H"] * c["W"], -5000, 5000)
        c["grad_output"] = values(rng, len(c["rois"]) * c["C"] * c["PH"] * c["PW"], -100, 100, 100.0)
    return cases


def run_case(c):
    N, C, H, W, PH, PW = c["N"], c["C"], c["H"], c["W"], c["PH"], c["PW"]
    x = torch.tensor(c["input"], dtype=torch.float64).reshape(N, C, H, W).requires_grad_(True)
    rois = torch.tensor(c["rois"], dtype=torch.float64).reshape(-1, 5)
    out = roi_align(x, rois, output_size=(PH, PW), spatial_scale=c["scale"], sampling_ratio=c["sr"],
                    aligned=c["aligned"])
    g = torch.tensor(c["grad_output"], dtype=torch.float64).reshape(out.shape)
    out.backward(g)
    return out.detach().reshape(-1).tolist(), x.grad.detach().reshape(-1).tolist()



def render():
    torch.set_num_threads(1)
    cases = build_cases()
    lines = [
        "# detops RoIAlign golden vectors: torchvision.ops.roi_align (avg pooling), float64, CPU.",
        "# Generated by scripts/gen_golden_roi_align.py (format documented there); do not edit.",
        "# torch %s, torchvision %s, seed %d, %d cases." % (torch.__version__, torchvision.__version__, SEED,
                                                          len(cases)),
    ]
    for c in cases:
        out, grad_in = run_case(c)
        K = len(c["rois"])
        lines.append("case %s N=%d C=%d H=%d W=%d K=%d PH=%d PW=%d spatial_scale=%s sampling_ratio=%d aligned=%d" % (
            c["name"], c["N"], c["C"], c["H"], c["W"], K, c["PH"], c["PW"], fmt(c["scale"]), c["sr"],
            int(c["aligned"])))
        emit_array(lines, "input", c["input"], c["W"])
        emit_array(lines, "rois", [v for r in c["rois"] for v in r], 5)
        emit_array(lines, "output", out, c["PW"])
        emit_array(lines, "grad_output", c["grad_output"], c["PW"])
        emit_array(lines, "grad_input", grad_in, c["W"])
        lines.append("end")
    return ("\n".join(lines) + "\n").encode("ascii")


def main():
    return write_or_check(__doc__.split("\n")[0], OUT_NAME, render)


if __name__ == "__main__":
    sys.exit(main())
