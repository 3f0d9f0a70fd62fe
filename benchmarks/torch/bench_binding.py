#!/usr/bin/env python3
# PyTorch binding overhead: a tiny RoIAlign call vs torchvision's op, and the box-head workload vs detops_bench.
"""detops_torch binding overhead, in interleaved rounds.

1. Per-call overhead: a tiny RoIAlign (input [1, 4, 16, 16] float32, one roi, 2x2 output,
   sampling_ratio 2, one thread) through the dispatcher, detops against torchvision:
     op        torch.ops.detops.roi_align vs torch.ops.torchvision.roi_align (no autograd)
     op+grad   the same with an input that requires grad (the Autograd kernels record a node)
     python    detops_torch.roi_align vs torchvision.ops.roi_align (list-of-boxes argument)
   Each round times --calls calls of every variant (order alternating between rounds) and keeps
   the per-call microseconds; the table shows medians over the rounds, detops / torchvision
   (goal of issue 15: at most 2x) and the median of the per-round ratios.
2. The box-head workload of benchmarks/roi_align_bench.cpp (features [2, 256, 200, 272] float32,
   its 1024 rois, 7x7, sampling_ratio 2, aligned, spatial_scale 0.25): forward and exact backward
   through torch.ops.detops (what a PyTorch user gets, outputs allocated by torch) against
   detops_bench's BM_RoiAlignForward/Backward .../box/sr2/avg[/exact]/t<threads> (the C++ library
   with preallocated outputs), alternating, per thread count. Goal: no difference beyond the
   rounds' spread. Without a detops_bench (--bench, $DETOPS_BENCH, build*/benchmarks/) only the
   torch side is reported.

    PYTHONPATH=build-torch/python /usr/bin/python3 benchmarks/torch/bench_binding.py [--quick]
        [--bench build/benchmarks/detops_bench] [--out benchmarks/results/torch-binding-<host>-<date>.json]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: the shared workload and detops_bench driver

import torch  # noqa: E402
import torchvision  # noqa: E402,F401  (registers torch.ops.torchvision)

import detops_torch  # noqa: E402
from bench_common import Bench, find_bench, loadavg, machine_info  # noqa: E402
from compare_torchvision import (ALIGNED, C, H, K, N, POOLED, SAMPLING_RATIO, SPATIAL_SCALE, W,  # noqa: E402
                                 bench_name, bench_rois)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_call_us(fn, calls, device):
    _sync(device)
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter_ns() - start) / calls / 1e3


def tiny_variants(device):
    """name -> (detops callable, torchvision callable)."""
    x = torch.rand(1, 4, 16, 16, device=device)
    xg = x.clone().requires_grad_(True)
    rois = torch.tensor([[0.0, 1.0, 1.5, 10.0, 11.0]], device=device)
    boxes = [rois[:, 1:]]
    det, tv = torch.ops.detops.roi_align, torch.ops.torchvision.roi_align
    return {
        "op": (lambda: det(x, rois, 1.0, 2, 2, 2, False), lambda: tv(x, rois, 1.0, 2, 2, 2, False)),
        "op+grad": (lambda: det(xg, rois, 1.0, 2, 2, 2, False), lambda: tv(xg, rois, 1.0, 2, 2, 2, False)),
        "python": (lambda: detops_torch.roi_align(x, boxes, 2, 1.0, 2, False),
                   lambda: torchvision.ops.roi_align(x, boxes, 2, 1.0, 2, False)),
    }


def run_tiny(args, device):
    torch.set_num_threads(1)
    variants = tiny_variants(device)
    for det, tv in variants.values():  # warm up: first-call dispatch, allocator
        for _ in range(50):
            det(), tv()
    samples = {name: {"detops": [], "torchvision": []} for name in variants}
    for rnd in range(args.rounds):
        for name, (det, tv) in variants.items():
            order = (("detops", det), ("torchvision", tv)) if rnd % 2 == 0 else (("torchvision", tv), ("detops", det))
            for who, fn in order:
                samples[name][who].append(_per_call_us(fn, args.calls, device))
    print(f"\nPer-call time of a tiny RoIAlign ({device}, 1 thread, {args.calls} calls x {args.rounds} rounds), us")
    print(f"{'variant':<10} {'detops':>10} {'torchvision':>12} {'ratio':>7} {'paired':>7}  spread detops / tv")
    out = {}
    for name, s in samples.items():
        d, t = statistics.median(s["detops"]), statistics.median(s["torchvision"])
        paired = statistics.median(a / b for a, b in zip(s["detops"], s["torchvision"]))
        out[name] = {"detops_us": d, "torchvision_us": t, "ratio": d / t, "paired_ratio": paired, "samples": s,
                     "goal_ratio_at_most": 2.0, "meets_goal": d / t <= 2.0}
        print(f"{name:<10} {d:>10.2f} {t:>12.2f} {d / t:>6.2f}x {paired:>6.2f}x  "
              f"{min(s['detops']):.2f}-{max(s['detops']):.2f} / "
              f"{min(s['torchvision']):.2f}-{max(s['torchvision']):.2f}")
    return out


def box_head_inputs(device):
    g = torch.Generator().manual_seed(20240601)
    x = (torch.rand(N, C, H, W, generator=g) * 2 - 1).to(device)
    rois = torch.tensor(bench_rois(), dtype=torch.float32).to(device)
    grad = (torch.rand(K, C, POOLED, POOLED, generator=g) * 2 - 1).to(device)
    return x, rois, grad


def run_box_head(args, device):
    x, rois, grad = box_head_inputs(device)
    n, c, h, w = x.shape
    fwd = lambda: torch.ops.detops.roi_align(x, rois, SPATIAL_SCALE, POOLED, POOLED, SAMPLING_RATIO, ALIGNED)  # noqa
    bwd = lambda: torch.ops.detops._roi_align_backward(grad, rois, SPATIAL_SCALE, POOLED, POOLED, n, c, h, w,  # noqa
                                                       SAMPLING_RATIO, ALIGNED, "exact")
    bench_path = find_bench(args.bench)
    bench = None
    if bench_path:
        try:
            bench = Bench(bench_path, args.min_time, args.timeout)
        except Exception as e:  # noqa: BLE001 -- report torch's side alone
            print(f"detops_bench at {bench_path} unusable ({e}); torch side only", file=sys.stderr)
    # what a torch call pays that detops_bench (outputs preallocated) does not: a fresh output
    # from torch's allocator, whose first touch page-faults on the CPU (glibc hands blocks this
    # large out by mmap and returns them on free); timed as (empty + fill) - (fill of a kept one)
    kept = {"forward": torch.empty(K, C, POOLED, POOLED, device=device), "backward": torch.empty_like(x)}
    alloc = {p: ((lambda t: lambda: torch.empty_like(t).fill_(1.0))(t), (lambda t: lambda: t.fill_(1.0))(t))
             for p, t in kept.items()}
    threads = [1] if device.type == "cuda" else args.threads
    dev = "cuda" if device.type == "cuda" else "cpu"
    rows = []
    for t in threads:
        for pass_, fn in (("forward", fwd), ("backward", bwd)):
            name = bench_name(dev, pass_, "nchw", "exact", t if dev == "cpu" else None)
            rows.append({"threads": t, "pass": pass_, "fn": fn, "benchmark": name, "torch": [], "bench": [],
                         "alloc": [],
                         "bench_error": None if (bench and bench.has(name)) else
                         ("no detops_bench" if not bench else "not registered by this detops_bench")})
    for row in rows:  # warm up
        torch.set_num_threads(row["threads"])
        row["fn"]()
    for rnd in range(args.box_rounds):
        for row in rows:
            torch.set_num_threads(row["threads"])
            row["torch"].append(_per_call_us(row["fn"], args.box_calls, device) / 1e3)
            fresh, reused = alloc[row["pass"]]
            fresh_us = _per_call_us(fresh, args.box_calls, device)
            row["alloc"].append((fresh_us - _per_call_us(reused, args.box_calls, device)) / 1e3)
            if row["bench_error"] is None:
                r = bench.run(row["benchmark"])
                if "error" in r:
                    row["bench_error"] = r["error"]
                else:
                    row["bench"].append(r["ms"])
        print(f"  box head round {rnd + 1}/{args.box_rounds} done", flush=True)
    print(f"\nBox-head workload ({device}; [2, 256, 200, 272] float32, 1024 rois, 7x7, sr 2, aligned), ms per call")
    print("(alloc: the fresh output's allocation and first touch, included in torch's time, not in detops_bench's)")
    print(f"{'pass':<9} {'thr':>3} {'torch':>9} {'alloc':>7} {'detops_bench':>13} {'ratio':>7}  spread torch / bench")
    out = []
    for row in rows:
        tm, am = statistics.median(row["torch"]), statistics.median(row["alloc"])
        entry = {"pass": row["pass"], "threads": row["threads"], "benchmark": row["benchmark"], "torch_ms": tm,
                 "alloc_ms": am, "torch_samples": row["torch"], "alloc_samples": row["alloc"],
                 "bench_samples": row["bench"], "bench_error": row["bench_error"]}
        if row["bench"]:
            bm = statistics.median(row["bench"])
            entry.update(bench_ms=bm, ratio=tm / bm,
                         paired_ratio=statistics.median(a / b for a, b in zip(row["torch"], row["bench"])),
                         ratio_without_alloc=(tm - am) / bm)
            print(f"{row['pass']:<9} {row['threads']:>3} {tm:>9.1f} {am:>7.1f} {bm:>13.1f} {tm / bm:>6.2f}x  "
                  f"{min(row['torch']):.1f}-{max(row['torch']):.1f} / {min(row['bench']):.1f}-{max(row['bench']):.1f}")
        else:
            print(f"{row['pass']:<9} {row['threads']:>3} {tm:>9.1f} {am:>7.1f} {'-':>13} {'-':>7}  "
                  f"{min(row['torch']):.1f}-{max(row['torch']):.1f} ({row['bench_error']})")
        out.append(entry)
    return out, bench_path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of the tiny-call comparison")
    ap.add_argument("--calls", type=int, default=2000, help="calls per variant and round (tiny call)")
    ap.add_argument("--box-rounds", type=int, default=5)
    ap.add_argument("--box-calls", type=int, default=3, help="calls per round of the box-head workload")
    ap.add_argument("--threads", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2],
                    help="CPU thread counts of the box-head workload (comma list)")
    ap.add_argument("--bench", default=None, help="detops_bench (default: $DETOPS_BENCH, build*/benchmarks/)")
    ap.add_argument("--min-time", default="0.5", help="detops_bench --benchmark_min_time")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--skip-box-head", action="store_true")
    ap.add_argument("--quick", action="store_true", help="5 tiny rounds of 500 calls, 2 box-head rounds of 1 call")
    ap.add_argument("--out", default=None, help="write the JSON here (e.g. benchmarks/results/...)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.calls, args.box_rounds, args.box_calls = 5, 500, 2, 1
    device = torch.device(args.device)
    doc = {"schema": "detops-torch-binding-bench/1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "torch": torch.__version__, "torchvision": torchvision.__version__, "detops_torch": detops_torch.__version__,
           "python": platform.python_version(), "device": str(device), "machine": machine_info(),
           "load_before": loadavg()}
    doc["tiny_call"] = run_tiny(args, device)
    if not args.skip_box_head:
        doc["box_head"], doc["detops_bench"] = run_box_head(args, device)
    doc["load_after"] = loadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
