#!/usr/bin/env python3
# CPU timings of detops' grid_sample, multi-scale deformable attention and deformable convolution against PyTorch's own (grid_sample, the pure composition) and torchvision's deform_conv2d, forward and forward+backward, on one thread and more.
"""detops_torch vs PyTorch on the CPU, one thread (or each count of --threads, every side given
the same), median of --repeats timed calls per variant (variants interleaved within each repeat,
after one warm-up call each).

Cases (float32):
  msda_dino4   multi-scale deformable attention at DINO-4scale's encoder shape for one image:
               levels 100x167, 50x84, 25x42, 13x21 (S = 22223), 8 heads of 32 channels, 4 points,
               Q = S; detops_torch.ms_deform_attn against the pure-PyTorch composition (one
               F.grid_sample per level, weighted sum: mmcv's and Deformable-DETR's CPU path);
               gradients for value, locations and weights.
  gs_rtdetr    grid_sample, RT-DETR-like: input [1, 256, 100, 167], grid [1, 300, 16, 2], bilinear,
               zeros, align_corners False; gradients for input and grid.
  gs_m2f_point Mask2Former's point loss: point_sample of mask logits [100, 1, 112, 112] at
               [100, 12544, 2] points in [0, 1]; gradient for the logits only. Baseline:
               detectron2's point_sample (F.grid_sample at 2 * coords - 1); detops:
               detops_torch.point_sample (one op reading each c as 2c - 1: the same bits).
  dcn_c3, dcn_c4, dcn_c5
               deform_conv2d with a mask (DCNv2) at the 3x3 convolutions of ResNet-50-DCN's stages
               c3, c4, c5 for one 800x1333 image: 128 channels at 100x167, 256 at 50x84, 512 at
               25x42; stride 1, padding 1, one offset group, no bias (mmdetection's DCN ResNets
               put a norm after it); offsets N(0, 2^2) pixels, mask in [0, 1]; gradients for the
               input, offset, mask and weight. Baseline: torchvision.ops.deform_conv2d.
Variants: the baseline (torch's or torchvision's), detops exact, detops atomic. Phases: forward
("fwd", no autograd) and forward + backward ("fwd+bwd", a fixed random output gradient).

    PYTHONPATH=build-torch/python /usr/bin/python3 benchmarks/torch/bench_deform.py OUT.json
        [--repeats 5] [--quick] [--cases dcn_c4,dcn_c5] [--threads 1,2]
Writes OUT.json and the table as OUT.txt (OUT minus .json plus .txt), after every case. With
several thread counts each case runs at each (results "CASE" for the first count, "CASE/Nt" for
the others) and the table adds every variant's scaling from the first count.
"""
import argparse
import json
import os
import platform
import re
import statistics
import time

import torch
import torch.nn.functional as TF
import torchvision

import detops_torch

DINO_LEVELS = [(100, 167), (50, 84), (25, 42), (13, 21)]


def msda_composition(value, spatial_shapes, sampling_locations, attention_weights):
    """The pure-PyTorch multi-scale deformable attention (per level grid_sample, weighted sum)."""
    b, _, m, d = value.shape
    _, q, _, nl, p, _ = sampling_locations.shape
    shapes = spatial_shapes.tolist()
    sampled = []
    for level, (piece, (h, w)) in enumerate(zip(value.split([h * w for h, w in shapes], dim=1), shapes)):
        maps = piece.permute(0, 2, 3, 1).reshape(b * m, d, h, w)
        grid = (2 * sampling_locations[:, :, :, level] - 1).transpose(1, 2).reshape(b * m, q, p, 2)
        sampled.append(TF.grid_sample(maps, grid, mode="bilinear", padding_mode="zeros", align_corners=False))
    weights = attention_weights.transpose(1, 2).reshape(b * m, 1, q, nl * p)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
    return out.view(b, m * d, q).transpose(1, 2).contiguous()


def msda_case(levels, heads=8, dims=32, points=4):
    gen = torch.Generator().manual_seed(0)
    spatial = torch.tensor(levels, dtype=torch.int64)
    sizes = spatial[:, 0] * spatial[:, 1]
    start = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
    s = int(sizes.sum())
    value = torch.randn(1, s, heads, dims, generator=gen)
    loc = torch.rand(1, s, heads, len(levels), points, 2, generator=gen)
    attn = torch.rand(1, s, heads, len(levels), points, generator=gen).softmax(-1)
    grad = torch.randn(1, s, heads * dims, generator=gen)
    variants = {
        "torch": lambda v, l, a: msda_composition(v, spatial, l, a),
        "detops exact": lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a, "exact"),
        "detops atomic": lambda v, l, a: detops_torch.ms_deform_attn(v, spatial, start, l, a, "atomic"),
    }
    shape = f"value [1, {s}, {heads}, {dims}], Q {s}, levels {levels}, {points} points"
    return shape, (value, loc, attn), (True, True, True), grad, variants


def grid_case(input_shape, grid_shape, grads, point_sample):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(*input_shape, generator=gen)
    if point_sample:  # coordinates in [0, 1], as Mask2Former samples them
        coords = torch.rand(grid_shape[0], grid_shape[1], 2, generator=gen)
        tensors = (x, coords)

        variants = {  # detectron2's point_sample, and detops' (which Mask2Former's loss would call)
            "torch": lambda t, c: TF.grid_sample(t, 2.0 * c.unsqueeze(2) - 1.0, "bilinear", "zeros",
                                                 False).squeeze(3),
            "detops exact": lambda t, c: detops_torch.point_sample(t, c, align_corners=False),
            "detops atomic": lambda t, c: detops_torch.point_sample(t, c, align_corners=False,
                                                                    backward_mode="atomic"),
        }
    else:
        tensors = (x, torch.rand(*grid_shape, generator=gen) * 2 - 1)
        variants = {
            "torch": lambda t, g: TF.grid_sample(t, g, "bilinear", "zeros", False),
            "detops exact": lambda t, g: detops_torch.grid_sample(t, g, "bilinear", "zeros", False),
            "detops atomic": lambda t, g: detops_torch.grid_sample(t, g, "bilinear", "zeros", False,
                                                                   backward_mode="atomic"),
        }
    with torch.no_grad():
        out_shape = variants["torch"](*tensors).shape
    grad = torch.randn(out_shape, generator=gen)
    shape = f"input {list(input_shape)}, " + (f"points [{grid_shape[0]}, {grid_shape[1]}, 2]" if point_sample
                                              else f"grid {list(grid_shape)}")
    return shape, tensors, grads, grad, variants


# ResNet-50-DCN's 3x3 convolutions (bottleneck conv2) for one 800x1333 image: (channels, H, W).
DCN_STAGES = {"dcn_c3": (128, 100, 167), "dcn_c4": (256, 50, 84), "dcn_c5": (512, 25, 42)}


def dcn_case(channels, h, w, quick):
    if quick:  # half of each side
        h, w = max(h // 2, 3), max(w // 2, 3)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, channels, h, w, generator=gen)
    offset = torch.randn(1, 2 * 9, h, w, generator=gen) * 2.0
    mask = torch.rand(1, 9, h, w, generator=gen)
    weight = torch.randn(channels, channels, 3, 3, generator=gen) / (3 * channels ** 0.5)
    grad = torch.randn(1, channels, h, w, generator=gen)
    variants = {
        "torchvision": lambda t, o, m, wt: torchvision.ops.deform_conv2d(t, o, wt, None, 1, 1, 1, m),
        "detops exact": lambda t, o, m, wt: detops_torch.deform_conv2d(t, o, wt, None, 1, 1, 1, m),
        "detops atomic": lambda t, o, m, wt: detops_torch.deform_conv2d(t, o, wt, None, 1, 1, 1, m, backward_mode="atomic"),
    }
    shape = (f"input [1, {channels}, {h}, {w}], weight [{channels}, {channels}, 3, 3], stride 1, padding 1, "
             "mask, no bias")
    return shape, (x, offset, mask, weight), (True, True, True, True), grad, variants


def time_once(fn, tensors, needs_grad, grad, backward):
    if backward:
        leaves = [t.detach().requires_grad_(need) for t, need in zip(tensors, needs_grad)]
        start = time.perf_counter()
        fn(*leaves).backward(grad)
        return time.perf_counter() - start
    with torch.no_grad():
        start = time.perf_counter()
        fn(*tensors)
        return time.perf_counter() - start


def run_case(name, case, repeats):
    shape, tensors, needs_grad, grad, variants = case
    result = {"shape": shape, "ms": {}}
    for phase, backward in (("fwd", False), ("fwd+bwd", True)):
        samples = {v: [] for v in variants}
        for v, fn in variants.items():  # warm-up
            time_once(fn, tensors, needs_grad, grad, backward)
        for r in range(repeats):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for v in order:
                samples[v].append(time_once(variants[v], tensors, needs_grad, grad, backward) * 1e3)
        for v, ms in samples.items():
            result["ms"].setdefault(v, {})[phase] = {"median": statistics.median(ms), "samples": ms}
    return result


def table(results):
    # The baseline is each case's first variant: torch for grid_sample and ms_deform_attn,
    # torchvision for deform_conv2d. Rows of a thread count after the first ("CASE/2t") add each
    # variant's speed-up over the first count's row.
    scaled = any("/" in name for name in results)
    lines = [f"{'case':<17}{'phase':<9}{'base ms':>11}{'exact ms':>11}{'atomic ms':>11}{'base/exact':>12}"
             f"{'base/atomic':>13}" + (f"{'scaling base/exact/atomic':>29}" if scaled else "")]
    variants = ("detops exact", "detops atomic")
    for name, r in results.items():
        base = next(iter(r["ms"]))
        first = results.get(name.split("/")[0]) if "/" in name else None
        for phase in ("fwd", "fwd+bwd"):
            t, e, a = (r["ms"][v][phase]["median"] for v in (base, *variants))
            line = f"{name:<17}{phase:<9}{t:>11.2f}{e:>11.2f}{a:>11.2f}{t / e:>11.2f}x{t / a:>12.2f}x"
            if first is not None:
                gains = [first["ms"][v][phase]["median"] / r["ms"][v][phase]["median"] for v in (base, *variants)]
                line += f"{'':>8}" + " / ".join(f"{g:.2f}x" for g in gains)
            lines.append(line)
    lines.append("")
    lines += [f"{name}: base {next(iter(r['ms']))}; {r['shape']}" for name, r in results.items() if "/" not in name]
    return "\n".join(lines) + "\n"


def blas_info():
    """torch's BLAS as its build reports it (torchvision's deform_conv2d does its GEMMs with it), and
    the library libblas.so.3 resolves to (Debian's alternatives), which "generic" means here."""
    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    info = found.group(1) if found else "unknown"
    link = "/etc/alternatives/libblas.so.3-" + platform.machine() + "-linux-gnu"
    if os.path.exists(link):
        info += f" ({os.path.realpath(link)})"
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="JSON output path; the table goes next to it with a .txt suffix")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per variant and phase (median)")
    parser.add_argument("--quick", action="store_true",
                        help="the DINO case at a quarter of each level side, the DCN cases at half of each side")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts (default 1), each case at each")
    parser.add_argument("--cases", default="",
                        help="comma-separated case names to run (default: all): gs_rtdetr, gs_m2f_point, msda_dino4, "
                             + ", ".join(DCN_STAGES))
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if not threads or min(threads) < 1:
        parser.error(f"--threads: expected positive counts, got {args.threads!r}")
    levels = [(max(h // 4, 1), max(w // 4, 1)) for h, w in DINO_LEVELS] if args.quick else DINO_LEVELS
    cases = {
        "gs_rtdetr": lambda: grid_case((1, 256, 100, 167), (1, 300, 16, 2), (True, True), False),
        "gs_m2f_point": lambda: grid_case((100, 1, 112, 112), (100, 12544), (True, False), True),
        "msda_dino4": lambda: msda_case(levels),
    }
    for name, (channels, h, w) in DCN_STAGES.items():
        cases[name] = lambda c=channels, h=h, w=w: dcn_case(c, h, w, args.quick)
    if args.cases:
        chosen = args.cases.split(",")
        unknown = [c for c in chosen if c not in cases]
        if unknown:
            parser.error(f"unknown case(s) {unknown}; expected some of {list(cases)}")
        cases = {name: cases[name] for name in chosen}
    doc = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
           "torch": torch.__version__, "torchvision": torchvision.__version__, "detops": detops_torch.__version__,
           "torch_blas": blas_info(), "threads": threads, "repeats": args.repeats, "quick": args.quick,
           "dtype": "float32", "results": {}}
    text_path = (args.out[:-5] if args.out.endswith(".json") else args.out) + ".txt"
    counts = ", ".join(map(str, threads)) + (" thread" if threads == [1] else " threads")
    for name, make in cases.items():
        case = make()
        for i, t in enumerate(threads):
            torch.set_num_threads(t)  # detops_torch takes torch's count
            key = name if i == 0 else f"{name}/{t}t"
            doc["results"][key] = dict(run_case(key, case, args.repeats), threads=t)
            doc["machine"]["loadavg_end"] = os.getloadavg()
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
            with open(text_path, "w") as f:
                f.write(table(doc["results"]))
                f.write(f"torch {doc['torch']} (BLAS {doc['torch_blas']}), torchvision {doc['torchvision']}, "
                        f"{'quick, ' if args.quick else ''}{counts}, median of {args.repeats}\n")
        print(table({k: r for k, r in doc["results"].items() if k.split("/")[0] == name}), end="", flush=True)


if __name__ == "__main__":
    main()
