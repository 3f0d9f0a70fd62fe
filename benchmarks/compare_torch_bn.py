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
import datetime
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The shapes of benchmarks/sync_batch_norm_bench.cpp (keep in sync)
SHAPES = {"res2": (2, 256, 200, 272), "res5": (2, 2048, 25, 34), "box": (512, 256, 7, 7)}
EPS, MOMENTUM = 1e-5, 0.1
TARGET = "SyncBatchNorm on one rank no slower than torch.nn.BatchNorm2d training forward+backward"


def ensure_torch():
    """Imports torch; where this interpreter has none, re-runs the script under one that has."""
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        pass
    if os.environ.get("DETOPS_COMPARE_REEXEC"):
        return False
    for cand in (os.environ.get("PYTHON"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if not cand or not os.path.exists(cand) or os.path.realpath(cand) == os.path.realpath(sys.executable):
            continue
        if subprocess.run([cand, "-c", "import torch"], capture_output=True).returncode == 0:
            print(f"compare_torch_bn: no torch in {sys.executable}; re-running under {cand}", file=sys.stderr,
                  flush=True)
            env = dict(os.environ, DETOPS_COMPARE_REEXEC="1")
            os.execve(cand, [cand, os.path.abspath(__file__)] + sys.argv[1:], env)
    return False


def read_first(path, pattern):
    try:
        with open(path) as f:
            for line in f:
                m = re.match(pattern, line)
                if m:
                    return m.group(1).strip()
    except OSError:
        pass
    return None


def machine_info():
    info = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": read_first("/proc/cpuinfo", r"model name\s*:\s*(.*)"),
        "logical_cpus": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mem_total": read_first("/proc/meminfo", r"MemTotal:\s*(.*)"),
        "python_executable": sys.executable,
    }
    if shutil.which("nvidia-smi"):
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True)
        info["nvidia_smi"] = p.stdout.strip() or p.stderr.strip()
    return info


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ------------------------------------------------------------------------------------------------
# detops_bench


def find_bench(explicit):
    cands = [explicit or os.environ.get("DETOPS_BENCH")]
    cands += [os.path.join(ROOT, d, "benchmarks", "detops_bench") for d in ("build-gpu", "build", "build-cpu")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


def bench_name(device, shape, layout, mode, threads):
    n = f"BM_SyncBnTrainStep/{device}/{shape}/f32/{layout}/{mode}"
    return n + (f"/t{threads}" if device == "cpu" else "")


class Bench:
    """detops_bench, one process per measurement, with every configuration registered."""

    def __init__(self, path, min_time, timeout):
        self.path, self.min_time, self.timeout = path, min_time, timeout
        self.env = dict(os.environ, DETOPS_BENCH_FULL="1")
        self.min_time_suffix = ""  # Google Benchmark >= 1.8 prefers "0.5s"
        p = subprocess.run([path, "--benchmark_list_tests=true"], capture_output=True, text=True, timeout=120,
                           env=self.env)
        lines = p.stdout.splitlines()
        self.banner = lines[0] if lines and lines[0].startswith("detops ") else ""
        self.names = set()
        for line in lines:
            m = re.match(r"^(BM_\S+?)(/real_time|/manual_time)?$", line.strip())
            if m:
                self.names.add(m.group(1))
        self.context = {}

    def has(self, name):
        return name in self.names

    def run(self, name):
        """{'ms': per-iteration time, 'iterations': n} or {'error': why}."""
        regex = "^" + re.escape(name).replace("\\/", "/") + "(/real_time|/manual_time)?$"
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            for attempt in range(2):
                cmd = [self.path, f"--benchmark_filter={regex}", f"--benchmark_out={out}",
                       "--benchmark_out_format=json", f"--benchmark_min_time={self.min_time}{self.min_time_suffix}"]
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout, env=self.env)
                except subprocess.TimeoutExpired:
                    return {"error": f"timed out after {self.timeout} s"}
                if p.returncode != 0 and attempt == 0 and "min_time" in (p.stderr + p.stdout) and not self.min_time_suffix:
                    self.min_time_suffix = "s"
                    continue
                break
            if p.returncode != 0 or not os.path.exists(out):
                return {"error": f"detops_bench exited {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"}
            with open(out) as f:
                data = json.load(f)
        if not self.context:
            self.context = data.get("context", {})
        runs = [b for b in data.get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"]
        if not runs:
            return {"error": "no benchmark matched " + regex}
        b = runs[0]
        if b.get("error_occurred"):
            return {"error": b.get("error_message", "skipped")}
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        return {"ms": b["real_time"] * scale, "iterations": b.get("iterations")}


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
        """Median ms of `calls` training steps (wall clock on the CPU, CUDA events on a GPU)."""
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
                r = self.step()
                stop.record()
                stop.synchronize()
                ms.append(start.elapsed_time(stop))
            del r
        return statistics.median(ms)


# ------------------------------------------------------------------------------------------------
# Summaries and the table


def summarize(samples):
    vals = [v for v in samples if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    spread = 50.0 * (max(vals) - min(vals)) / m if len(vals) > 1 and m else None
    return {"median": m, "min": min(vals), "max": max(vals), "n": len(vals), "spread_pct": spread,
            "samples": [round(v, 4) for v in vals]}


def fmt_ms(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def fmt_ratio(v):
    return "-" if v is None else (f"{v:.2f}x" if v < 10 else f"{v:.1f}x")


def cell(s):
    if not s:
        return "-"
    sp = s.get("spread_pct")
    return fmt_ms(s["median"]) + (f" +-{sp:.0f}%" if sp is not None else "")


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
    lines.append(f"torch {v.get('torch')} ({v.get('torch_parallel')}) | detops {v.get('detops')} | host {m['host']} "
                 f"({m.get('cpu_model')}, {m['logical_cpus']} cpus) | load avg start {doc['load_average']['start']} "
                 f"end {doc['load_average']['end']}")
    hdr = (f"{'device':<6} {'shape':<5} {'layout':<6} {'thr':>3} {'mode':<8} {'torch ms':>14} {'detops ms':>14} "
           f"{'ratio':>7} {'paired':>7}")
    lines += ["", hdr, "-" * len(hdr)]
    for r in doc["results"]:
        thr = str(r["threads"]) if r["threads"] else "-"
        det = cell(r["detops_ms"]) if r["detops_ms"] else f"({(r['detops_error'] or 'no samples')[:40]})"
        tor = cell(r["torch_ms"]) if r["torch_ms"] else "(n/a)"
        lines.append(f"{r['device']:<6} {r['shape']:<5} {r['layout']:<6} {thr:>3} {r['mode']:<8} {tor:>14} {det:>14} "
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
    ap.add_argument("--modes", default="default", help="detops modes: default,exact (default: default)")
    ap.add_argument("--rounds", type=int, help="alternating rounds (default 5; --quick 1)")
    ap.add_argument("--calls", type=int, help="torch calls per round on the CPU, median taken (default 3)")
    ap.add_argument("--cuda-calls", type=int, help="the same on CUDA (default 20)")
    ap.add_argument("--min-time", type=float, help="detops_bench --benchmark_min_time, s (default 0.5; --quick 0.01)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 call, short min_time")
    ap.add_argument("--bench-timeout", type=int, default=300, help="seconds per detops_bench run")
    ap.add_argument("--max-seconds", type=float, help="start no round that would end past this many seconds "
                                                     "(at least one round runs)")
    ap.add_argument("--note", action="append", default=[], help="a note for the JSON (repeatable)")
    args = ap.parse_args()

    have_torch = ensure_torch()
    rounds = args.rounds or (1 if args.quick else 5)
    calls = args.calls or (1 if args.quick else 3)
    cuda_calls = args.cuda_calls or (5 if args.quick else 20)
    min_time = args.min_time if args.min_time is not None else (0.01 if args.quick else 0.5)

    bench_path = find_bench(args.bench)
    if not bench_path:
        print("compare_torch_bn: detops_bench not found (build it, or pass --bench / DETOPS_BENCH)", file=sys.stderr)
        return 2
    bench = Bench(bench_path, min_time, args.bench_timeout)

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

    devices = [d for d in args.device.split(",") if d]
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"unknown shape {s!r}; expected some of {','.join(SHAPES)}")
    layouts = [x for x in args.layouts.split(",") if x]
    modes = [x for x in args.modes.split(",") if x]
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

    rounds_done = 0
    for rnd in range(rounds):
        if rnd and args.max_seconds:
            per_round = (time.time() - t_start) / rnd
            if time.time() - t_start + per_round > args.max_seconds:
                print(f"compare_torch_bn: stopping after {rnd} rounds (--max-seconds {args.max_seconds:g})", flush=True)
                break
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
            for row in g["rows"]:
                if not bench.has(row["benchmark"]):
                    errors[row["benchmark"]] = "not registered by this detops_bench"
                    continue
                r = bench.run(row["benchmark"])
                if "error" in r:
                    errors[row["benchmark"]] = r["error"]
                else:
                    samples.setdefault((gi, "detops:" + row["mode"]), []).append(r["ms"])
            label = f"{g['device']} {g['shape']} {g['layout']}" + (f" t{g['threads']}" if g["threads"] else "")
            tm = samples.get((gi, "torch"), [None])[-1]
            dm = " ".join(f"{row['mode']}={fmt_ms(samples.get((gi, 'detops:' + row['mode']), [None])[-1])}"
                          for row in g["rows"])
            print(f"  round {rnd + 1}/{rounds} [{time.time() - t_start:6.0f} s, load {loadavg()}] {label:<20} "
                  f"torch={fmt_ms(tm)} {dm}", flush=True)
        load_samples.append({"t": round(time.time() - t_start, 1), "load": loadavg()})
    if torch:
        torch.set_num_threads(default_threads)

    results = []
    for gi, g in enumerate(groups):
        tsum = summarize(samples.get((gi, "torch"), []))
        for row in g["rows"]:
            d = summarize(samples.get((gi, "detops:" + row["mode"]), []))
            ratio = tsum["median"] / d["median"] if tsum and d else None
            paired = None
            if tsum and d and len(tsum["samples"]) == len(d["samples"]):
                paired = statistics.median(a / b for a, b in zip(tsum["samples"], d["samples"]))
            results.append({"device": g["device"], "shape": g["shape"], "input": list(SHAPES[g["shape"]]),
                            "layout": g["layout"], "threads": g["threads"], "mode": row["mode"],
                            "benchmark": row["benchmark"], "torch_ms": tsum, "detops_ms": d, "ratio": ratio,
                            "ratio_paired": paired, "detops_error": errors.get(row["benchmark"]),
                            "torch_error": torch_errors.get(gi)})

    try:
        head = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True,
                              timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        head = None
    ctx = bench.context
    versions.update(git=head, detops=ctx.get("detops_version"), detops_cuda=ctx.get("detops_cuda"),
                    google_benchmark_build_type=ctx.get("library_build_type"), python=platform.python_version(),
                    bench_built=datetime.datetime.fromtimestamp(os.path.getmtime(bench_path)).isoformat(
                        timespec="seconds"))
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    json_path = args.out or os.path.join(HERE, "results", f"compare-bn-{host}-{datetime.date.today().isoformat()}.json")
    table_path = args.table or os.path.splitext(json_path)[0] + ".txt"
    doc = {
        "schema": "detops-compare-torch-bn/1",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:]),
        "duration_s": round(time.time() - t_start, 1),
        "workload": {"shapes": {s: list(SHAPES[s]) for s in shapes}, "dtype": "float32", "eps": EPS,
                     "momentum": MOMENTUM, "affine": True, "track_running_stats": True},
        "settings": {"rounds": rounds_done, "rounds_requested": rounds, "calls_per_round": calls,
                     "cuda_calls_per_round": cuda_calls, "min_time_s": min_time, "quick": args.quick,
                     "devices": devices, "layouts": layouts, "modes": modes,
                     "threads": [int(x) for x in args.threads.split(",")], "torch_default_threads": default_threads,
                     "timing": {"cpu": "wall clock (time.perf_counter; Google Benchmark real_time)",
                                "cuda": "CUDA events (torch.cuda.Event; Google Benchmark manual_time)"},
                     "what_is_timed": {
                         "torch": "y = BatchNorm2d(C).train()(x); torch.autograd.grad(y, (x, weight, bias), "
                                  "grad_y); NHWC: x and grad_y channels_last",
                         "detops": "BM_SyncBnTrainStep: sync_batch_norm_forward + sync_batch_norm_backward, "
                                   "communicator nullptr, preallocated outputs"}},
        "machine": machine,
        "load_average": {"start": load_samples[0]["load"], "end": loadavg(), "per_round": load_samples},
        "versions": versions,
        "bench": {"path": bench_path, "banner": bench.banner, "context": ctx},
        "results": results,
        "notes": args.note,
    }
    doc["target"] = check_target(results)
    table = render_table(doc)
    print()
    print(table)
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    with open(table_path, "w") as f:
        f.write(table + "\n")
    print(f"\ncompare_torch_bn: wrote {os.path.relpath(json_path)} and {os.path.relpath(table_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
