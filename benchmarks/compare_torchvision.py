#!/usr/bin/env python3
"""detops vs torchvision RoIAlign, side by side, in one run.

Times torchvision's RoIAlign (the PyTorch/torchvision this Python imports) and detops_bench on the
same workload, alternating: for each round, and for each group of configurations (device, pass,
layout, threads), torchvision is timed once (the median of --calls calls), then detops_bench is run
once per detops configuration of the group with an exact --benchmark_filter. The table reports
the medians over the rounds and the ratio torchvision / detops (above 1: detops is faster), both of
the medians and "paired" (the median of the per-round ratios, steadier when the load drifts).

Workload (benchmarks/roi_align_bench.cpp): the box head of Mask R-CNN R50-FPN on P2, features
float32 [2, 256, 200, 272], 1024 rois (512 per image, boxes of 16..400 px from test::random_rois
with seed 20240602), 7x7, sampling_ratio 2, aligned, spatial_scale 0.25. The rois are the bench's
own: dumped by `detops_bench --detops_dump_rois=PATH` when the binary has that flag, otherwise
regenerated here with the same algorithm (std::mt19937_64, and libstdc++'s
uniform_real_distribution<double>: one 64-bit draw / 2^64, which is what GCC's
generate_canonical does for a 64-bit engine; the standard leaves it to the implementation, so a
detops_bench built with libc++ or MSVC could differ; --rois-file overrides both). Feature and
gradient values do not change the timing of the average pooling measured here, so torchvision's
are random (torch.rand, fixed seed) rather than the bench's.

What is timed, per configuration ("what the user gets"):
  forward   torchvision.ops.roi_align(x, rois, 7, 0.25, 2, True); for NHWC x is channels_last,
            which torchvision copies to NCHW inside the call (its output is NCHW).
  backward  torch.ops.torchvision._roi_align_backward (what autograd calls) with grad_output in
            the input's layout; for NHWC the NCHW result is copied to channels_last, since that is
            what x.grad of a channels_last leaf holds (AccumulateGrad follows the leaf's layout).
            The time without that copy is kept in the JSON as torchvision_op_only.
  detops    Google Benchmark's per-iteration wall time (/real_time on the CPU, CUDA events on
            the GPU), inputs and outputs preallocated; backward writes all of grad_input.
CPU threads: torch.set_num_threads(t) for the bench's /t<t> runs (Context::num_threads = t).
On a GPU also: torchvision with torch.use_deterministic_algorithms(True) through autograd (its
deterministic fallback where torchvision has one; torchvision versions without it raise in the
backward, which is recorded), optionally under torch.compile (--tv-compile).

Output: the table on stdout (and in --table, default: the JSON's path with .txt), and the JSON
(--json, default benchmarks/results/compare-<host>-<date>.json) with every sample, the medians,
ratios, the issue-5 targets, versions, thread counts, machine information and load averages.

  /usr/bin/python3 benchmarks/compare_torchvision.py [--quick] [--bench build/benchmarks/detops_bench]
  (a python3 without torch re-runs the script under $PYTHON or /usr/bin/python3 when those have it;
  with no torch at all only detops is timed). On a GPU machine, e.g. for scripts/gpu-check.sh:
  --devices cuda --rounds 3 --tv-compile off --max-seconds 225
"""

import argparse
import hashlib
import importlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import (CUDA_CHAIN, TIMING, Bench, add_timing_args, alternating_rounds, cell, csv_list, doc_head, doc_run,
                          ensure_torch, file_time, find_bench, fmt_ms, fmt_ratio, git_describe, loadavg, machine_info,
                          output_paths, paired_ratio, print_round, ratio_of_medians, summarize, timing_settings,
                          write_outputs)

PROG = "compare"

# ------------------------------------------------------------------------------------------------
# The workload of benchmarks/roi_align_bench.cpp (keep in sync)

N, C, H, W = 2, 256, 200, 272
ROIS_PER_IMAGE = 512
K = N * ROIS_PER_IMAGE
SPATIAL_SCALE = 0.25
IMAGE_H, IMAGE_W = 800.0, 1088.0
MIN_BOX, MAX_BOX = 16.0, 400.0
ROI_SEED = 20240602
POOLED = 7  # box head
SAMPLING_RATIO = 2
ALIGNED = True
MODES = ("atomic", "truncated", "exact")


# ------------------------------------------------------------------------------------------------
# The bench's rois: std::mt19937_64 and libstdc++'s uniform_real_distribution<double>(0, 1)

_MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64 (fully specified by the C++ standard)."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & _MASK64
        for i in range(1, 312):
            p = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (p ^ (p >> 62)) + i) & _MASK64
        self.i = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            y = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            v = mt[(i + 156) % 312] ^ (y >> 1)
            if y & 1:
                v ^= 0xB5026F5AA96619E9
            mt[i] = v
        self.i = 0

    def __call__(self):
        if self.i >= 312:
            self._twist()
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & _MASK64


def _canonical(rng):
    # libstdc++ generate_canonical<double, 53> with a 2^64-range engine: one draw, double(x) / 2^64
    # (int -> double rounds to nearest even in Python and in the C++ conversion), then clamped
    # below 1.
    u = float(rng()) / 18446744073709551616.0
    return u if u < 1.0 else 0.9999999999999999


def bench_rois():
    """tests/test_util.h random_rois(K, N, 800, 1088, seed, 16, 400), batch column k / 512."""
    rng = MT19937_64(ROI_SEED)
    rows = []
    for k in range(K):
        w = MIN_BOX + _canonical(rng) * (MAX_BOX - MIN_BOX)
        h = MIN_BOX + _canonical(rng) * (MAX_BOX - MIN_BOX)
        x1 = -0.1 * IMAGE_W + _canonical(rng) * (1.1 * IMAGE_W - w * 0.5)
        y1 = -0.1 * IMAGE_H + _canonical(rng) * (1.1 * IMAGE_H - h * 0.5)
        _canonical(rng)  # the batch index draw, overwritten by the bench
        rows.append([float(k // ROIS_PER_IMAGE), x1, y1, x1 + w, y1 + h])
    return rows


def read_rois_file(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            vals = [float(v) for v in line.replace(",", " ").split()]
            if len(vals) != 5:
                raise ValueError(f"{path}: expected 5 numbers per line, got {line!r}")
            rows.append(vals)
    if len(rows) != K:
        raise ValueError(f"{path}: expected {K} rois, got {len(rows)}")
    return rows


def rois_digest(rows):
    h = hashlib.sha256()
    for r in rows:
        h.update((" ".join(repr(v) for v in r) + "\n").encode())
    return h.hexdigest()[:16]


def get_rois(args, bench):
    """The rois and a record of where they came from."""
    generated = bench_rois()
    info = {"generator": "python mt19937_64 + libstdc++ generate_canonical (this script)"}
    if args.rois_file:
        rows = read_rois_file(args.rois_file)
        info.update(source=f"--rois-file {args.rois_file}", matches_python_generator=rows == generated)
    else:
        rows = None
        if bench:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "rois.txt")
                p = subprocess.run([bench, f"--detops_dump_rois={path}"], capture_output=True, text=True, timeout=120)
                if p.returncode == 0 and os.path.exists(path):
                    rows = read_rois_file(path)
                    info.update(source="detops_bench --detops_dump_rois", matches_python_generator=rows == generated)
        if rows is None:
            rows = generated
            info.update(source="python generator (detops_bench has no --detops_dump_rois); bitwise equal to "
                             "tests/test_util.h random_rois built with g++/libstdc++")
    info["sha256_16"] = rois_digest(rows)
    info["count"] = len(rows)
    return rows, info


# ------------------------------------------------------------------------------------------------
# detops_bench


def bench_name(device, pass_, layout, mode=None, threads=None):
    n = f"BM_RoiAlign{'Backward' if pass_ == 'backward' else 'Forward'}/{device}/f32/{layout}/box/sr2/avg"
    if pass_ == "backward":
        n += f"/{mode}"
    if device == "cpu":
        n += f"/t{threads}"
    return n


# ------------------------------------------------------------------------------------------------
# torchvision timing


class TorchSide:
    def __init__(self, torch, torchvision, rois_rows):
        self.torch = torch
        self.tv = torchvision
        self.rois_rows = rois_rows
        self.cache = {}
        self.det_status = {}  # variant -> "ok" or why not
        # the module, not the function torchvision.ops re-exports under the same name
        m = importlib.import_module("torchvision.ops.roi_align")
        self.has_python_fallback = hasattr(m, "_roi_align")

    # inputs, one set per (device, layout)
    def inputs(self, device, layout):
        key = (device, layout)
        if key not in self.cache:
            torch = self.torch
            g = torch.Generator().manual_seed(20240601)
            x = torch.rand(N, C, H, W, generator=g) * 2 - 1
            grad = torch.rand(K, C, POOLED, POOLED, generator=g) * 2 - 1
            rois = torch.tensor(self.rois_rows, dtype=torch.float64).to(torch.float32)  # RNE, as the bench
            if layout == "nhwc":
                x = x.contiguous(memory_format=torch.channels_last)
                grad = grad.contiguous(memory_format=torch.channels_last)
            dev = torch.device(device)
            self.cache[key] = (x.to(dev), rois.to(dev), grad.to(dev))
        return self.cache[key]

    def _time_chain(self, device, calls, stages, chain=1):
        """Times `calls` samples of stages[0], stages[1](result), ...: per sample the cumulative ms at
        the end of each stage (wall clock on the CPU, CUDA events on the GPU); on CUDA a sample runs
        the stages `chain` times back to back (CUDA_CHAIN for the native ops: the timing of
        detops_bench) and reports the average per run. Returns the per-stage (median, samples)."""
        torch = self.torch
        per_stage = [[] for _ in stages]
        for _ in range(calls):
            if device == "cpu":
                marks = [time.perf_counter()]
                r = None
                for i, f in enumerate(stages):
                    r = f() if i == 0 else f(r)
                    marks.append(time.perf_counter())
                ms = [(m - marks[0]) * 1e3 for m in marks[1:]]
            else:
                # an event after every stage of every run; stage i's time is the sum over runs of
                # (its event - the event before it)
                events = [[torch.cuda.Event(enable_timing=True) for _ in stages] for _ in range(chain)]
                start = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for j in range(chain):
                    r = None
                    for i, f in enumerate(stages):
                        r = f() if i == 0 else f(r)
                        events[j][i].record()
                    if j + 1 < chain:
                        del r
                events[-1][-1].synchronize()
                stage_ms = [0.0] * len(stages)
                prev = start
                for j in range(chain):
                    for i in range(len(stages)):
                        stage_ms[i] += prev.elapsed_time(events[j][i])
                        prev = events[j][i]
                ms, acc = [], 0.0
                for v in stage_ms:
                    acc += v
                    ms.append(acc / chain)
            del r
            for i, v in enumerate(ms):
                per_stage[i].append(v)
        return [(statistics.median(v), v) for v in per_stage]

    def _median_of(self, device, calls, f, chain=1):
        return self._time_chain(device, calls, [f], chain)[0]

    def forward_fn(self, device, layout):
        x, rois, _ = self.inputs(device, layout)
        roi_align = self.tv.ops.roi_align
        return lambda: roi_align(x, rois, POOLED, SPATIAL_SCALE, SAMPLING_RATIO, ALIGNED)

    def backward_stages(self, device, layout):
        """The native backward as stages: the op, then (NHWC) the copy to channels_last that x.grad gets."""
        torch = self.torch
        x, rois, grad = self.inputs(device, layout)
        op = torch.ops.torchvision._roi_align_backward

        def op_only():
            return op(grad, rois, SPATIAL_SCALE, POOLED, POOLED, N, C, H, W, SAMPLING_RATIO, ALIGNED)

        if layout == "nhwc":
            return [op_only, lambda g: g.contiguous(memory_format=torch.channels_last)]
        return [op_only]

    def time_native(self, device, layout, pass_, calls):
        """{'torchvision': ms, 'torchvision_op_only': ms (NHWC backward)} as (median, samples)."""
        out = {}
        chain = CUDA_CHAIN if device == "cuda" else 1
        if pass_ == "forward":
            out["torchvision"] = self._median_of(device, calls, self.forward_fn(device, layout), chain)
        else:
            stages = self._time_chain(device, calls, self.backward_stages(device, layout), chain)
            out["torchvision"] = stages[-1]
            if layout == "nhwc":
                out["torchvision_op_only"] = stages[0]
        return out

    # torch.use_deterministic_algorithms(True): torchvision's deterministic path, through autograd
    def _det_graph(self, device, layout, compiled):
        torch = self.torch
        key = ("det", device, layout, compiled)
        if key in self.cache:
            return self.cache[key]
        x0, rois, grad = self.inputs(device, layout)
        roi_align = self.tv.ops.roi_align

        def fwd(x, r):
            return roi_align(x, r, POOLED, SPATIAL_SCALE, SAMPLING_RATIO, ALIGNED)

        f = torch.compile(fwd) if compiled else fwd
        x = x0.detach().clone().requires_grad_(True)
        self.cache[key] = (f, x, rois, grad)
        return self.cache[key]

    def time_deterministic(self, device, layout, pass_, calls, compiled):
        torch = self.torch
        variant = "torchvision_deterministic" + ("_compiled" if compiled else "")
        st = self.det_status.get((variant, device, layout, pass_))
        if st is not None and st != "ok":
            return {}
        prev = torch.are_deterministic_algorithms_enabled()
        try:
            torch.use_deterministic_algorithms(True)
            f, x, rois, grad = self._det_graph(device, layout, compiled)
            if pass_ == "forward":
                def call():
                    with torch.no_grad():
                        return f(x, rois)
                if st is None:
                    call()  # warm-up (compilation)
            else:
                y = f(x, rois)

                def call():
                    (g,) = torch.autograd.grad(y, x, grad, retain_graph=True)
                    return g.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else g
                if st is None:
                    call()  # warm-up (compilation of the backward); raises where there is no deterministic path
            first = self._median_of(device, 1, call)
            if first[0] > 250:  # a slow fallback: a few calls are enough for its median
                calls = min(calls, 3)
            res = self._median_of(device, calls - 1, call) if calls > 1 else first
            if calls > 1:
                res = (statistics.median(res[1] + first[1]), res[1] + first[1])
            self.det_status[(variant, device, layout, pass_)] = "ok"
            return {variant: res}
        except Exception as e:  # noqa: BLE001 - anything torchvision/torch raise is the finding
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
            self.det_status[(variant, device, layout, pass_)] = msg
            return {}
        finally:
            torch.use_deterministic_algorithms(prev)


# ------------------------------------------------------------------------------------------------
# Plan, rounds, summary


def build_plan(args, cuda_ok):
    """Groups of configurations: each group is one torchvision timing and its detops benchmarks."""
    groups = []
    for device in csv_list(args.devices):
        if device == "cuda" and not cuda_ok:
            continue
        for pass_ in csv_list(args.passes):
            for layout in csv_list(args.layouts):
                for t in ([int(t) for t in args.threads.split(",")] if device == "cpu" else [None]):
                    modes = csv_list(args.modes) if pass_ == "backward" else [None]
                    rows = []
                    for mode in modes:
                        rows.append({"device": device, "pass": pass_, "layout": layout, "threads": t,
                                     "mode": mode, "benchmark": bench_name(device, pass_, layout, mode, t)})
                    groups.append({"device": device, "pass": pass_, "layout": layout, "threads": t, "rows": rows})
    return groups


TARGETS = [
    # (id, description, device); the measured value and goal are worked out in check_targets
    ("cpu-fwd-nchw-t1", "CPU forward NCHW, 1 thread: >= 3x torchvision", "cpu"),
    ("cpu-fwd-nhwc-t1", "CPU forward NHWC, 1 thread: >= 10x torchvision (channels_last input)", "cpu"),
    ("cpu-fwd-nchw-scaling", "CPU forward NCHW: 2 threads >= 1.8x faster than 1", "cpu"),
    ("cpu-fwd-nhwc-scaling", "CPU forward NHWC: 2 threads >= 1.8x faster than 1", "cpu"),
    ("cpu-bwd-exact-nchw-t1", "CPU backward exact NCHW, 1 thread: >= 2x torchvision", "cpu"),
    ("cpu-bwd-exact-nhwc-t1", "CPU backward exact NHWC, 1 thread: >= 5x torchvision", "cpu"),
    ("cuda-fwd", "CUDA forward (NCHW): no slower than torchvision", "cuda"),
    ("cuda-bwd-atomic", "CUDA backward atomic (NCHW): no slower than torchvision", "cuda"),
    ("cuda-bwd-exact-vs-tv-atomic", "CUDA backward exact (NCHW): within 1.5x of torchvision's (atomic) backward",
     "cuda"),
    ("cuda-bwd-exact-vs-tv-det", "CUDA backward exact (NCHW): >= 20x faster than torchvision deterministic",
     "cuda"),
    ("cuda-bwd-truncated-vs-atomic", "CUDA backward truncated (NCHW): within 1.3x of detops atomic", "cuda"),
]


def check_targets(results):
    def find(device, pass_, layout, threads=None, mode=None):
        for r in results:
            if (r["device"], r["pass"], r["layout"], r["threads"], r["mode"]) == (device, pass_, layout, threads, mode):
                return r
        return None

    def med(r, key):
        if not r:
            return None
        return (r["detops_ms"] or {}).get("median") if key == "detops" else (r["baselines"].get(key) or {}).get("median")

    def ratio(num, den):
        return num / den if num and den else None

    out = []
    for tid, desc, device in TARGETS:
        value, goal = None, None
        if tid.startswith("cpu-fwd-") and tid.endswith("-t1"):
            r = find("cpu", "forward", tid.split("-")[2], 1)
            value, goal = ratio(med(r, "torchvision"), med(r, "detops")), 3.0 if "nchw" in tid else 10.0
        elif tid.endswith("-scaling"):
            layout = tid.split("-")[2]
            value, goal = ratio(med(find("cpu", "forward", layout, 1), "detops"),
                                med(find("cpu", "forward", layout, 2), "detops")), 1.8
        elif tid.startswith("cpu-bwd-exact"):
            layout = tid.split("-")[3]
            r = find("cpu", "backward", layout, 1, "exact")
            value, goal = ratio(med(r, "torchvision"), med(r, "detops")), 2.0 if layout == "nchw" else 5.0
        elif tid == "cuda-fwd":
            r = find("cuda", "forward", "nchw")
            value, goal = ratio(med(r, "torchvision"), med(r, "detops")), 1.0
        elif tid == "cuda-bwd-atomic":
            r = find("cuda", "backward", "nchw", None, "atomic")
            value, goal = ratio(med(r, "torchvision"), med(r, "detops")), 1.0
        elif tid == "cuda-bwd-exact-vs-tv-atomic":
            r = find("cuda", "backward", "nchw", None, "exact")
            value, goal = ratio(med(r, "torchvision"), med(r, "detops")), 1 / 1.5
        elif tid == "cuda-bwd-exact-vs-tv-det":
            r = find("cuda", "backward", "nchw", None, "exact")
            dets = [med(r, k) for k in ("torchvision_deterministic", "torchvision_deterministic_compiled")]
            dets = [d for d in dets if d]
            value, goal = ratio(min(dets) if dets else None, med(r, "detops")), 20.0
        elif tid == "cuda-bwd-truncated-vs-atomic":
            value, goal = ratio(med(find("cuda", "backward", "nchw", None, "atomic"), "detops"),
                                med(find("cuda", "backward", "nchw", None, "truncated"), "detops")), 1 / 1.3
        if value is None:
            if any(r["device"] == device for r in results):
                out.append({"id": tid, "target": desc, "value": None, "goal": goal, "met": None})
            continue
        out.append({"id": tid, "target": desc, "value": round(value, 3), "goal": round(goal, 3),
                    "met": bool(value >= goal)})
    return out


def render_table(doc):
    res = doc["results"]
    lines = []
    w = doc["workload"]
    lines.append(f"detops vs torchvision RoIAlign | {w['description']}")
    lines.append(f"medians of {doc['settings']['rounds']} alternating rounds (torchvision: median of "
                 f"{doc['settings']['calls_per_round']} calls per round; detops_bench: --benchmark_min_time="
                 f"{doc['settings']['min_time_s']})")
    lines.append("ratio = torchvision / detops of the medians (> 1: detops faster); paired = median over rounds of "
                 "each round's ratio; +-: half the min-max range over rounds, relative to the median")
    v = doc["versions"]
    lines.append(f"torch {v.get('torch')} | torchvision {v.get('torchvision')} | detops {v.get('detops')} | "
                 f"host {doc['machine']['host']} ({doc['machine'].get('cpu_model')}, {doc['machine']['logical_cpus']}"
                 f" cpus) | load avg start {doc['load_average']['start']} end {doc['load_average']['end']}")
    det_cols = [(k, title) for k, title in (("torchvision_deterministic", "tv determ. ms"),
                                            ("torchvision_deterministic_compiled", "tv det+compile"))
                if any(r["baselines"].get(k) for r in res)]
    hdr = (f"{'device':<6} {'pass':<8} {'layout':<6} {'thr':>3} {'mode':<9} {'torchvision ms':>16} {'detops ms':>15} "
           f"{'ratio':>7} {'paired':>7}")
    for _, title in det_cols:
        hdr += f" {title:>14} {'ratio':>7}"
    lines.append("")
    lines.append(hdr)
    lines.append("-" * len(hdr))

    for r in res:
        tv = r["baselines"].get("torchvision")
        line = (f"{r['device']:<6} {r['pass']:<8} {r['layout']:<6} {r['threads'] if r['threads'] else '-':>3} "
                f"{r['mode'] or '-':<9} {cell(tv):>16} ")
        if r.get("detops_error") and not r["detops_ms"]:
            line += f"{'skipped':>15} {'-':>7} {'-':>7}"
        else:
            line += (f"{cell(r['detops_ms']):>15} {fmt_ratio(r['ratios'].get('torchvision')):>7} "
                     f"{fmt_ratio(r.get('ratios_paired', {}).get('torchvision')):>7}")
        for k, _ in det_cols:
            line += f" {cell(r['baselines'].get(k)):>14} {fmt_ratio(r['ratios'].get(k)):>7}"
        lines.append(line)
    notes = []
    for r in res:
        op = r["baselines"].get("torchvision_op_only")
        if op and r["mode"] in (None, "exact"):
            notes.append(f"  {r['device']} {r['pass']} {r['layout']} t{r['threads']}: torchvision op alone (NCHW "
                         f"grad_input, no channels_last copy) {fmt_ms(op['median'])} ms")
        if r.get("detops_error"):
            notes.append(f"  {r['benchmark']}: {r['detops_error']}")
        if r.get("torchvision_error") and r["mode"] in (None, "atomic"):
            notes.append(f"  torchvision {r['device']} {r['pass']} {r['layout']}: {r['torchvision_error']}")
    if notes:
        lines.append("")
        lines.extend(notes)
    det = doc.get("torchvision_deterministic", {})
    if det.get("status") and det.get("python_fallback") is False:
        lines.append("  torchvision deterministic: this torchvision has no deterministic RoIAlign fallback (added in "
                     "0.16): its forward is the native kernel, its CUDA backward raises")
    for k, v in det.get("status", {}).items():
        if v != "ok":
            lines.append(f"  torchvision deterministic ({k}): {v}")
    if doc.get("notes"):
        lines.append("")
        lines.extend("note: " + n for n in doc["notes"])
    if doc.get("targets"):
        lines.append("")
        lines.append("targets (issue 5)")
        for t in doc["targets"]:
            mark = "n/a " if t["met"] is None else ("MET " if t["met"] else "MISS")
            val = "-" if t["value"] is None else f"{t['value']:.2f}x (goal {t['goal']:.2f}x)"
            lines.append(f"  [{mark}] {t['target']}: {val}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", help="detops_bench (default: $DETOPS_BENCH, build-gpu/, build/, build-cpu/)")
    ap.add_argument("--json", help="output JSON (default benchmarks/results/compare-<host>-<date>.json)")
    ap.add_argument("--table", help="also write the table here (default: the JSON path with .txt)")
    ap.add_argument("--devices", default=None, help="cpu,cuda (default: cpu, plus cuda when available)")
    ap.add_argument("--passes", default="forward,backward")
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--threads", default="1,2", help="CPU thread counts (torch.set_num_threads = detops /t<n>)")
    ap.add_argument("--modes", default="atomic,truncated,exact", help="detops backward modes")
    ap.add_argument("--rois-file", help="rois to use (K lines of: batch x1 y1 x2 y2)")
    ap.add_argument("--tv-compile", choices=("auto", "on", "off"), default="auto",
                    help="CUDA: also time the deterministic torchvision path under torch.compile "
                         "(auto: on unless --quick)")
    ap.add_argument("--no-deterministic", action="store_true", help="CUDA: skip torchvision deterministic")
    add_timing_args(ap, "torchvision")
    args = ap.parse_args()

    have_torch = ensure_torch(PROG, __file__, "import torch, torchvision")
    rounds, calls, cuda_calls, min_time = timing_settings(args)

    bench_path = find_bench(args.bench)
    if not bench_path:
        print(f"{PROG}: detops_bench not found (build it, or pass --bench / DETOPS_BENCH)", file=sys.stderr)
        return 2
    bench = Bench(bench_path, min_time, args.bench_timeout, args=["--detops_full"])

    torch = torchvision = None
    versions = {}
    if have_torch:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # for deterministic mode, harmless otherwise
        import torch
        import torchvision
        versions.update(torch=torch.__version__, torchvision=torchvision.__version__,
                        torch_cuda=torch.version.cuda, torch_parallel=torch.__config__.parallel_info().splitlines()[-1])
    else:
        print("compare: no torch/torchvision importable: timing detops only", file=sys.stderr)
    cuda_ok = bool(torch and torch.cuda.is_available())  # torchvision can be timed on CUDA
    bench_cuda = "benchmarks on cuda" in bench.banner  # detops_bench has CUDA benchmarks and a device
    if args.devices is None:
        args.devices = "cpu,cuda" if cuda_ok or bench_cuda else "cpu"

    rois_rows, rois_info = get_rois(args, bench_path)
    tside = TorchSide(torch, torchvision, rois_rows) if torch else None
    tv_compile = args.tv_compile == "on" or (args.tv_compile == "auto" and not args.quick)
    tv_compile = tv_compile and torch is not None and hasattr(torch, "compile")

    groups = build_plan(args, cuda_ok or bench_cuda)
    if not groups:
        print(f"compare: nothing to run (devices {args.devices}; CUDA: torch {'yes' if cuda_ok else 'no'}, "
              f"detops_bench {'yes' if bench_cuda else 'no'})", file=sys.stderr)
        return 2
    machine = machine_info(detailed=True)
    if cuda_ok:
        machine["gpu"] = torch.cuda.get_device_name(0)
    default_threads = torch.get_num_threads() if torch else None

    print(f"compare: {bench.banner or bench_path}", flush=True)
    print(f"compare: {len(groups)} groups x {rounds} rounds; rois: {rois_info['source']}"
          + (f" (python generator {'matches' if rois_info.get('matches_python_generator') else 'DIFFERS'})"
             if "matches_python_generator" in rois_info else ""), flush=True)

    samples = {}  # (group index, key) -> list of ms; key: "tv:<variant>" or "detops:<mode>"
    errors = {}
    tv_errors = {}  # group index -> why torchvision could not be timed
    for gi, g in enumerate(groups):
        if not torch:
            tv_errors[gi] = "torch/torchvision not importable"
        elif g["device"] == "cuda" and not cuda_ok:
            tv_errors[gi] = f"torch {torch.__version__} sees no CUDA device"
    load_samples = [{"t": 0.0, "load": loadavg()}]
    t_start = time.time()

    # warm-up: one untimed torchvision call per group (first-touch of the inputs, lazy init)
    if tside:
        for gi, g in enumerate(groups):
            if gi in tv_errors:
                continue
            if g["device"] == "cpu":
                torch.set_num_threads(g["threads"])
            try:
                if g["pass"] == "forward":
                    tside.forward_fn(g["device"], g["layout"])()
                else:
                    tside._time_chain(g["device"], 1, tside.backward_stages(g["device"], g["layout"]))
            except Exception as e:  # noqa: BLE001
                tv_errors[gi] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                print(f"compare: torchvision failed ({tv_errors[gi]}); not timed", flush=True)
        if cuda_ok:
            torch.cuda.synchronize()

    def write(rounds_done, quiet):
        """The JSON and the table of the rounds done so far."""
        results = []
        for gi, g in enumerate(groups):
            baselines = {}
            for (gj, key), vals in samples.items():
                if gj == gi and key.startswith("tv:"):
                    baselines[key[3:]] = summarize(vals)
            for row in g["rows"]:
                d = summarize(samples.get((gi, "detops:" + str(row["mode"])), []))
                ratios = {k: ratio_of_medians(b, d) for k, b in baselines.items()}
                paired = {k: p for k, b in baselines.items() if (p := paired_ratio(b, d)) is not None}
                results.append({**{k: row[k] for k in ("device", "pass", "layout", "threads", "mode", "benchmark")},
                                "detops_ms": d, "detops_error": errors.get(row["benchmark"]),
                                "torchvision_error": tv_errors.get(gi),
                                "baselines": baselines, "ratios": ratios, "ratios_paired": paired})

        det_status = {}
        if tside:
            for (variant, device, layout, pass_), st in tside.det_status.items():
                det_status[f"{variant} {device} {pass_} {layout}"] = st
        ctx = bench.context
        versions.update(git=git_describe(), bench_built=file_time(bench_path))
        versions.update(detops=ctx.get("detops_version"), detops_cuda=ctx.get("detops_cuda"),
                        google_benchmark_build_type=ctx.get("library_build_type"), python=platform.python_version())
        json_path, table_path = output_paths(args.json, args.table, "compare")

        doc = {
            **doc_head("detops-compare-torchvision/1", __file__, t_start),
            "workload": {
                "description": (f"float32 [{N}, {C}, {H}, {W}], {K} rois (16..400 px, seed {ROI_SEED}), "
                                f"{POOLED}x{POOLED}, sampling_ratio {SAMPLING_RATIO}, aligned, spatial_scale "
                                f"{SPATIAL_SCALE}, avg pooling"),
                "input": [N, C, H, W], "dtype": "float32", "rois": K, "pooled": [POOLED, POOLED],
                "sampling_ratio": SAMPLING_RATIO, "aligned": ALIGNED, "spatial_scale": SPATIAL_SCALE,
                "rois_info": rois_info,
            },
            "settings": {"rounds": rounds_done, "rounds_requested": rounds, "calls_per_round": calls, "cuda_calls_per_round": cuda_calls,
                         "min_time_s": min_time, "quick": args.quick,
                         "threads": [int(t) for t in args.threads.split(",")], "devices": args.devices.split(","),
                         "tv_compile": tv_compile, "torch_default_threads": default_threads,
                         "timing": TIMING,
                         "what_is_timed": {
                             "torchvision forward": "torchvision.ops.roi_align (NHWC: channels_last input, copied "
                                                    "to NCHW inside; NCHW output)",
                             "torchvision backward": "torch.ops.torchvision._roi_align_backward, grad_output in the "
                                                     "input's layout; NHWC: + .contiguous(channels_last), as x.grad",
                             "torchvision_deterministic": "torch.use_deterministic_algorithms(True), "
                                                          "roi_align through autograd (torch.autograd.grad)",
                             "detops": "detops_bench per-iteration time, preallocated outputs and workspace"}},
            **doc_run(machine, load_samples, versions, bench, bench_path),
            "torchvision_deterministic": {"python_fallback": tside.has_python_fallback if tside else None,
                                          "status": det_status},
            "results": results,
            "notes": args.note,
        }
        doc["targets"] = check_targets(results)
        write_outputs(PROG, doc, render_table(doc), json_path, table_path, quiet)

    rounds_done = 0
    for rnd in alternating_rounds(PROG, rounds, args.max_seconds, t_start):
        rounds_done += 1
        for gi, g in enumerate(groups):
            if tside:
                if g["device"] == "cpu":
                    torch.set_num_threads(g["threads"])
                else:
                    torch.set_num_threads(default_threads)
                n_calls = calls if g["device"] == "cpu" else cuda_calls
                if gi not in tv_errors:
                    try:
                        for key, (med, _) in tside.time_native(g["device"], g["layout"], g["pass"], n_calls).items():
                            samples.setdefault((gi, "tv:" + key), []).append(med)
                    except Exception as e:  # noqa: BLE001 - e.g. a torchvision built without CUDA ops
                        tv_errors[gi] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                        print(f"compare: torchvision failed ({tv_errors[gi]}); not timed again", flush=True)
                if g["device"] == "cuda" and cuda_ok and not args.no_deterministic:
                    for compiled in ([False, True] if tv_compile else [False]):
                        for key, (med, _) in tside.time_deterministic(g["device"], g["layout"], g["pass"],
                                                                      n_calls, compiled).items():
                            samples.setdefault((gi, "tv:" + key), []).append(med)
            bench.run_rows(gi, g["rows"], samples, errors)
            label = f"{g['device']} {g['pass']} {g['layout']}" + (f" t{g['threads']}" if g["threads"] else "")
            print_round(rnd, rounds, t_start, label, 22, "torchvision", samples.get((gi, "tv:torchvision"), [None])[-1],
                        gi, g["rows"], samples)
        load_samples.append({"t": round(time.time() - t_start, 1), "load": loadavg()})
        write(rounds_done, quiet=True)
    if torch:
        torch.set_num_threads(default_threads)
    write(rounds_done, quiet=False)
    return 0




if __name__ == "__main__":
    sys.exit(main())
