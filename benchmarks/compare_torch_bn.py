#!/usr/bin/env python3
"""detops SyncBatchNorm (one rank) vs torch.nn.BatchNorm2d, training forward+backward, side by side.

Times torch.nn.BatchNorm2d(C) in training mode (the PyTorch this Python imports) and detops_bench's
BM_SyncBnTrainStep on the same shapes, alternating: for each round, and for each group of
configurations (device, shape, layout, threads), torch is timed once (the median of --calls calls),
then detops_bench is run once per detops mode of the group with an exact --benchmark_filter (one
process each, DETOPS_BENCH_FULL=1 so every configuration is registered). The table reports the
medians over the rounds and the ratio torch / detops (above 1: detops is faster), both of the
medians and "paired" (the median of the per-round ratios, steadier when the load drifts).

Workload (benchmarks/sync_batch_norm_bench.cpp): Mask R-CNN R50-FPN activations, float32,
  res2 [2, 256, 200, 272], res5 [2, 2048, 25, 34], box [512, 256, 7, 7] (box head RoI features);
NCHW, or NHWC = torch.channels_last (x and grad_y). Values do not change the timing; torch's are
random (fixed seed) in the bench's ranges: x in [-3, 3), grad_y in [-1, 1), weight in [0.2, 2),
bias in [-1, 1); eps 1e-5, momentum 0.1, running statistics tracked.

What is timed, per configuration:
  torch     y = bn(x); torch.autograd.grad(y, (x, bn.weight, bn.bias), grad_y): the training
            forward (batch statistics, running-statistics update) and the backward with grad_x,
            grad_weight and grad_bias, outputs allocated by torch per call (what the user gets).
  detops    BM_SyncBnTrainStep/<device>/<shape>/f32/<layout>/<mode>[/t<threads>]: Google
            Benchmark's per-iteration time of sync_batch_norm_forward + sync_batch_norm_backward
            (communicator nullptr), outputs preallocated; wall clock on the CPU, CUDA events on
            the GPU.
CPU threads: torch.set_num_threads(t) for the bench's /t<t> runs (Context::num_threads = t).
CUDA (--device cuda): torch on CUDA tensors, timed with CUDA events (cuDNN's batch norm where
torch picks it), against BM_SyncBnTrainStep/cuda/... of a detops_bench built with CUDA.

Output: the table on stdout (and in --table, default: the JSON's path with .txt), and the JSON
(--out, default benchmarks/results/compare-bn-<host>-<date>.json) with every sample, the medians,
ratios, the target ("SyncBatchNorm on one rank no slower than torch.nn.BatchNorm2d training
forward+backward"), versions, thread counts, machine information and load averages.

Usage (Debian's torch is the one of /usr/bin/python3; the pyenv `python3` first on PATH has no torch,
and a python3 without torch re-runs the script under $PYTHON or /usr/bin/python3 when those have
it; with no torch at all only detops is timed):
  /usr/bin/python3 benchmarks/compare_torch_bn.py --bench build/benchmarks/detops_bench \\
      --shapes res5 --threads 1 [--layouts nchw,nhwc] [--modes default,exact] [--out FILE.json]
On a GPU machine (scripts/gpu-check.sh): --device cuda --rounds 3 --max-seconds 150
"""

import argparse
import platform
import statistics
import sys
import time

from bench_common import (CUDA_CHAIN, TIMING, Bench, add_timing_args, alternating_rounds, cell, csv_list, doc_head, doc_run,
                          ensure_torch, file_time, find_bench, fmt_ratio, git_describe, loadavg, machine_info,
                          output_paths, paired_ratio, print_round, ratio_of_medians, summarize, timing_settings,
                          write_outputs)

PROG = "compare_torch_bn"

# The shapes of benchmarks/sync_batch_norm_bench.cpp (keep in sync)
SHAPES = {"res2": (2, 256, 200, 272), "res5": (2, 2048, 25, 34), "box": (512, 256, 7, 7)}
EPS, MOMENTUM = 1e-5, 0.1
TARGET = "SyncBatchNorm on one rank no slower than torch.nn.BatchNorm2d training forward+backward"


def bench_name(device, shape, layout, mode, threads):
    """mode: default | exact, or default:baseline / default:avx2 for the CPU loops' narrower
    instruction sets (the bench's /isa_<name> suffix; plain modes use the widest the CPU has)."""
    mode, _, isa = mode.partition(":")
    n = f"BM_SyncBnTrainStep/{device}/{shape}/f32/{layout}/{mode}"
    if device == "cpu":
        n += f"/t{threads}" + (f"/isa_{isa}" if isa else "")
    return n


# ------------------------------------------------------------------------------------------------
# torch


class TorchBN:
    """torch.nn.BatchNorm2d(C) in training mode on one configuration's inputs."""

    def __init__(self, torch, device, shape, layout):
        self.torch, self.device = torch, device
        n, c, h, w = SHAPES[shape]
        g = torch.Generator().manual_seed(20240602)
        x = torch.rand(n, c, h, w, generator=g) * 6 - 3
        gy = torch.rand(n, c, h, w, generator=g) * 2 - 1
        if layout == "nhwc":
            x = x.contiguous(memory_format=torch.channels_last)
            gy = gy.contiguous(memory_format=torch.channels_last)
        self.x = x.to(device).requires_grad_(True)  # .to keeps the memory format
        self.gy = gy.to(device)
        self.bn = torch.nn.BatchNorm2d(c, eps=EPS, momentum=MOMENTUM).to(device).train()
        with torch.no_grad():
            self.bn.weight.copy_(torch.rand(c, generator=g) * 1.8 + 0.2)
            self.bn.bias.copy_(torch.rand(c, generator=g) * 2 - 1)
        self.params = (self.x, self.bn.weight, self.bn.bias)

    def step(self):
        y = self.bn(self.x)
        return self.torch.autograd.grad(y, self.params, self.gy)

    def time(self, calls):
        """Median ms of `calls` training steps (wall clock on the CPU; on a GPU CUDA events around
        CUDA_CHAIN back-to-back steps, per step: the timing of detops_bench)."""
        torch = self.torch
        ms = []
        for _ in range(calls):
            if self.device == "cpu":
                t0 = time.perf_counter()
                r = self.step()
                ms.append((time.perf_counter() - t0) * 1e3)
            else:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for j in range(CUDA_CHAIN):
                    r = self.step()
                    if j + 1 < CUDA_CHAIN:
                        del r
                stop.record()
                stop.synchronize()
                ms.append(start.elapsed_time(stop) / CUDA_CHAIN)
            del r
        return statistics.median(ms)


# ------------------------------------------------------------------------------------------------
# Summaries and the table


def check_target(results):
    """Per default-mode row: met when torch / detops of the medians >= 1 (detops no slower). The
    exact mode (opt-in, for replaying multi-rank runs bit for bit) is reported, not judged."""
    rows = []
    for r in results:
        judged = r["mode"] == "default"
        met = None if r["ratio"] is None or not judged else r["ratio"] >= 1.0
        rows.append({"benchmark": r["benchmark"], "ratio": r["ratio"], "ratio_paired": r["ratio_paired"],
                     "judged": judged, "met": met})
    verdicts = [x["met"] for x in rows if x["met"] is not None]
    return {"target": TARGET + " (default mode)", "rows": rows, "met": (all(verdicts) if verdicts else None)}


def render_table(doc):
    s = doc["settings"]
    lines = [f"detops SyncBatchNorm (one rank) vs torch.nn.BatchNorm2d, training forward+backward, float32",
             f"medians of {s['rounds']} alternating rounds (torch: median of {s['calls_per_round']} calls per round "
             f"on the CPU, {s['cuda_calls_per_round']} on CUDA; detops_bench: --benchmark_min_time={s['min_time_s']})",
             "ratio = torch / detops of the medians (> 1: detops faster); paired = median over rounds of each "
             "round's ratio; +-: half the min-max range over rounds, relative to the median"]
    v, m = doc["versions"], doc["machine"]
    isa = f" (CPU {v['detops_cpu_isa']})" if v.get("detops_cpu_isa") else ""
    lines.append(f"torch {v.get('torch')} ({v.get('torch_parallel')}) | detops {v.get('detops')}{isa} | host {m['host']} "
                 f"({m.get('cpu_model')}, {m['logical_cpus']} cpus) | load avg start {doc['load_average']['start']} "
                 f"end {doc['load_average']['end']}")
    hdr = (f"{'device':<6} {'shape':<5} {'layout':<6} {'thr':>3} {'mode':<16} {'torch ms':>14} {'detops ms':>14} "
           f"{'ratio':>7} {'paired':>7}")
    lines += ["", hdr, "-" * len(hdr)]
    for r in doc["results"]:
        thr = str(r["threads"]) if r["threads"] else "-"
        det = cell(r["detops_ms"]) if r["detops_ms"] else f"({(r['detops_error'] or 'no samples')[:40]})"
        tor = cell(r["torch_ms"]) if r["torch_ms"] else "(n/a)"
        lines.append(f"{r['device']:<6} {r['shape']:<5} {r['layout']:<6} {thr:>3} {r['mode']:<16} {tor:>14} {det:>14} "
                     f"{fmt_ratio(r['ratio']):>7} {fmt_ratio(r['ratio_paired']):>7}")
    errs = sorted({r["torch_error"] for r in doc["results"] if r.get("torch_error")})
    for e in errs:
        lines.append(f"torch: {e}")
    t = doc["target"]
    lines.append("")
    mark = "n/a " if t["met"] is None else ("MET " if t["met"] else "MISS")
    lines.append(f"target [{mark}] {t['target']}")
    for row in t["rows"]:
        mk = ("info" if not row["judged"] else "n/a ") if row["met"] is None else ("MET " if row["met"] else "MISS")
        lines.append(f"  [{mk}] {row['benchmark']}: {fmt_ratio(row['ratio'])}")
    for n in doc.get("notes", []):
        lines.append("note: " + n)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bench", help="detops_bench (default: $DETOPS_BENCH, build-gpu/, build/, build-cpu/)")
    ap.add_argument("--out", help="output JSON (default benchmarks/results/compare-bn-<host>-<date>.json)")
    ap.add_argument("--table", help="also write the table here (default: the JSON path with .txt)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cpu,cuda (default cpu)")
    ap.add_argument("--shapes", default="res5,res2", help="of res2,res5,box (default res5,res2)")
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--threads", default="1,2", help="CPU thread counts (torch.set_num_threads = detops /t<n>)")
    ap.add_argument("--modes", default="default",
                    help="detops modes: default,exact; default:baseline and default:avx2 time the CPU loops "
                         "at a narrower instruction set (default: default)")
    add_timing_args(ap, "torch")
    args = ap.parse_args()

    have_torch = ensure_torch(PROG, __file__)
    rounds, calls, cuda_calls, min_time = timing_settings(args)

    bench_path = find_bench(args.bench)
    if not bench_path:
        print(f"{PROG}: detops_bench not found (build it, or pass --bench / DETOPS_BENCH)", file=sys.stderr)
        return 2
    bench = Bench(bench_path, min_time, args.bench_timeout, env={"DETOPS_BENCH_FULL": "1"})

    torch = None
    versions = {}
    if have_torch:
        import torch
        versions.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                        torch_parallel=torch.__config__.parallel_info().splitlines()[-1].strip(),
                        cudnn=torch.backends.cudnn.version() if torch.cuda.is_available() else None)
    else:
        print("compare_torch_bn: no torch importable: timing detops only", file=sys.stderr)
    cuda_ok = bool(torch and torch.cuda.is_available())

    devices = csv_list(args.device)
    shapes = csv_list(args.shapes)
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"unknown shape {s!r}; expected some of {','.join(SHAPES)}")
    layouts = csv_list(args.layouts)
    modes = csv_list(args.modes)
    groups = []
    for dev in devices:
        for shape in shapes:
            for layout in layouts:
                for t in ([int(x) for x in args.threads.split(",")] if dev == "cpu" else [None]):
                    rows = [{"mode": m, "benchmark": bench_name(dev, shape, layout, m, t)} for m in modes]
                    groups.append({"device": dev, "shape": shape, "layout": layout, "threads": t, "rows": rows})

    machine = machine_info()
    if cuda_ok:
        machine["gpu"] = torch.cuda.get_device_name(0)
    default_threads = torch.get_num_threads() if torch else None
    print(f"compare_torch_bn: {bench.banner or bench_path}", flush=True)
    print(f"compare_torch_bn: {len(groups)} groups x {rounds} rounds; torch "
          f"{versions.get('torch', 'absent')} ({sys.executable})", flush=True)

    samples = {}  # (group index, "torch" | "detops:<mode>") -> [ms per round]
    errors, torch_errors, tside = {}, {}, {}
    for gi, g in enumerate(groups):
        if not torch:
            torch_errors[gi] = "torch not importable"
        elif g["device"] == "cuda" and not cuda_ok:
            torch_errors[gi] = f"torch {torch.__version__} sees no CUDA device"
    load_samples = [{"t": 0.0, "load": loadavg()}]
    t_start = time.time()

    def set_threads(g):
        if torch:
            torch.set_num_threads(g["threads"] if g["device"] == "cpu" else default_threads)

    # inputs and one untimed step per group (first touch, lazy initialization, cuDNN's choice)
    for gi, g in enumerate(groups):
        if gi in torch_errors:
            continue
        set_threads(g)
        try:
            tside[gi] = TorchBN(torch, g["device"], g["shape"], g["layout"])
            tside[gi].step()
        except Exception as e:  # noqa: BLE001 - e.g. out of memory
            torch_errors[gi] = f"{type(e).__name__}: {str(e).strip()[:300]}"
            tside.pop(gi, None)
    if cuda_ok:
        torch.cuda.synchronize()

    def write(rounds_done, quiet):
        """The JSON and the table of the rounds done so far."""
        results = []
        for gi, g in enumerate(groups):
            tsum = summarize(samples.get((gi, "torch"), []))
            for row in g["rows"]:
                d = summarize(samples.get((gi, "detops:" + row["mode"]), []))
                ratio, paired = ratio_of_medians(tsum, d), paired_ratio(tsum, d)
                results.append({"device": g["device"], "shape": g["shape"], "input": list(SHAPES[g["shape"]]),
                                "layout": g["layout"], "threads": g["threads"], "mode": row["mode"],
                                "benchmark": row["benchmark"], "torch_ms": tsum, "detops_ms": d, "ratio": ratio,
                                "ratio_paired": paired, "detops_error": errors.get(row["benchmark"]),
                                "torch_error": torch_errors.get(gi)})

        ctx = bench.context
        versions.update(git=git_describe(), detops=ctx.get("detops_version"), detops_cuda=ctx.get("detops_cuda"),
                        detops_cpu_isa=ctx.get("detops_cpu_isa"),
                        google_benchmark_build_type=ctx.get("library_build_type"), python=platform.python_version(),
                        bench_built=file_time(bench_path))
        json_path, table_path = output_paths(args.out, args.table, "compare-bn")
        doc = {
            **doc_head("detops-compare-torch-bn/1", __file__, t_start),
            "workload": {"shapes": {s: list(SHAPES[s]) for s in shapes}, "dtype": "float32", "eps": EPS,
                         "momentum": MOMENTUM, "affine": True, "track_running_stats": True},
            "settings": {"rounds": rounds_done, "rounds_requested": rounds, "calls_per_round": calls,
                         "cuda_calls_per_round": cuda_calls, "min_time_s": min_time, "quick": args.quick,
                         "devices": devices, "layouts": layouts, "modes": modes,
                         "threads": [int(x) for x in args.threads.split(",")], "torch_default_threads": default_threads,
                         "timing": TIMING,
                         "what_is_timed": {
                             "torch": "y = BatchNorm2d(C).train()(x); torch.autograd.grad(y, (x, weight, bias), "
                                      "grad_y); NHWC: x and grad_y channels_last",
                             "detops": "BM_SyncBnTrainStep: sync_batch_norm_forward + sync_batch_norm_backward, "
                                       "communicator nullptr, preallocated outputs"}},
            **doc_run(machine, load_samples, versions, bench, bench_path),
            "results": results,
            "notes": args.note,
        }
        doc["target"] = check_target(results)
        write_outputs(PROG, doc, render_table(doc), json_path, table_path, quiet)

    rounds_done = 0
    for rnd in alternating_rounds(PROG, rounds, args.max_seconds, t_start):
        rounds_done += 1
        for gi, g in enumerate(groups):
            if gi in tside:
                set_threads(g)
                try:
                    samples.setdefault((gi, "torch"), []).append(
                        tside[gi].time(calls if g["device"] == "cpu" else cuda_calls))
                except Exception as e:  # noqa: BLE001
                    torch_errors[gi] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                    del tside[gi]
            bench.run_rows(gi, g["rows"], samples, errors)
            label = f"{g['device']} {g['shape']} {g['layout']}" + (f" t{g['threads']}" if g["threads"] else "")
            print_round(rnd, rounds, t_start, label, 20, "torch", samples.get((gi, "torch"), [None])[-1], gi,
                        g["rows"], samples)
        load_samples.append({"t": round(time.time() - t_start, 1), "load": loadavg()})
        write(rounds_done, quiet=True)
    if torch:
        torch.set_num_threads(default_threads)
    write(rounds_done, quiet=False)
    return 0




if __name__ == "__main__":
    sys.exit(main())
