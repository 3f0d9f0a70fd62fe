#!/usr/bin/env python3
"""The summary of a GPU check (scripts/gpu-check.sh): what each step did and what it measured.

Reads the check's folder (<build>/gpu-check: steps.txt, one "<name>\t<seconds>\t<result>" line per
step; logs/<step>.log, the output of each step; what the check's tests wrote: gpu-<op>.json from
each op's CUDA benchmarks, sanitizer-<tool>-<suite>.log, compare-gpu.txt, compare-bn-gpu.txt,
maskrcnn-gpu.json) and prints, in this order: the steps, the test counts of each ctest step (the
Python tests' own counts inside the torch step), compute-sanitizer per suite, the benchmark medians
with issue 5's FrozenBatchNorm2d target, the comparisons' tables and the Mask R-CNN demo's figures.
Only the standard library: the GPU machine may have nothing else.

    python3 benchmarks/gpu_summary.py build-gpu/gpu-check [--budget 480] [--status 0]
"""
import argparse
import glob
import json
import os
import re

CTEST_STEPS = {"tests": "tests (CUDA_LAUNCH_BLOCKING=1)", "tests-async": "tests (async launches)",
               "bench": "benchmarks", "compare": "comparisons", "sanitizer": "compute-sanitizer",
               "torch": "torch tests (ctest -L torch, the demo)"}


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def ctest_counts(log):
    """'N passed, F failed, S skipped (of T)' from a ctest log, and the failed tests' lines."""
    m = None
    for m in re.finditer(r"tests passed, (\d+) tests? failed out of (\d+)", log):
        pass
    if m is None:
        passed = len(re.findall(r"Test +#\d+: .* Passed", log))
        return f"ctest printed no summary (stopped?); {passed} passed before that", []
    failed, total = int(m.group(1)), int(m.group(2))
    skipped = len(re.findall(r"Test +#\d+: .*\*\*\*Skipped", log))
    bad = re.findall(r"(?m)^\s+\d+ - .* \((?:Failed|Not Run|Timeout|SEGFAULT|Subprocess aborted|Exception)\)", log)
    # the skipped ones by name (a CUDA test skips without a device, the NCCL ones where the machine
    # refuses NCCL's bootstrap): a few, then how many more
    names = re.findall(r"Test +#\d+: (\S+) \.*\s*\*\*\*Skipped", log)
    bad += [f"  skipped: {n}" for n in names[:8]] + ([f"  skipped: {len(names) - 8} more"] if len(names) > 8 else [])
    return f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped (of {total})", bad[:30]


def python_counts(log):
    """The Python tests inside ctest -V output: unittest's 'Ran N tests ... OK (skipped=K)' and
    pytest's 'N passed, K skipped in T s' lines."""
    text = re.sub(r"(?m)^\d+: ", "", log)  # ctest -V prefixes each test's lines with its number
    n = {"passed": 0, "failed": 0, "skipped": 0}
    reports = 0
    for m in re.finditer(r"^Ran (\d+) tests? in [\d.]+s\s*\n\s*(OK|FAILED)(?: \(([^)]*)\))?", text, re.M):
        reports += 1
        extra = {k.strip(): int(v) for k, v in (kv.split("=") for kv in (m.group(3) or "").split(",") if "=" in kv)}
        failed = extra.get("failures", 0) + extra.get("errors", 0) + extra.get("unexpected successes", 0)
        skipped = extra.get("skipped", 0) + extra.get("expected failures", 0)
        n["failed"] += failed
        n["skipped"] += skipped
        n["passed"] += int(m.group(1)) - failed - skipped
    for m in re.finditer(r"^=*\s*(\d+ [a-z ]+(?:, \d+ [a-z ]+)*) in [\d.]+s", text, re.M):
        counts = {w: int(c) for c, w in re.findall(r"(\d+) ([a-z ]+)", m.group(1))}
        if not counts.keys() & {"passed", "failed", "skipped", "error", "errors"}:
            continue
        reports += 1
        n["passed"] += counts.get("passed", 0) + counts.get("xfailed", 0)
        n["failed"] += counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        n["skipped"] += counts.get("skipped", 0)
    if reports:
        return f"  Python tests inside ({reports} files): {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped"
    return ""


def sanitizer_lines(folder):
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "sanitizer-*.log"))):
        text = read(path)
        name = os.path.basename(path)[len("sanitizer-"):-len(".log")]
        summary = re.findall(r"ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: \d+ hazards? displayed", text)
        ran = re.findall(r"\d+ tests? from \d+ test suites? ran", text)
        if "Device not supported" in text:
            out.append(f"  {name:<44} unsupported on this machine")
        else:
            out.append(f"  {name:<44} {ran[-1] if ran else 'no tests ran'}; {summary[-1] if summary else 'no summary'}")
    return out


def bench_table(folder):
    files = sorted(glob.glob(os.path.join(folder, "gpu-*.json")))
    if not files:
        return ["(no benchmark results)"]
    lines = [f"{'benchmark (median)':<72} {'time':>12} {'items/s':>9} {'GB/s':>7}"]
    medians = {}
    for path in files:
        try:
            benchmarks = json.load(open(path)).get("benchmarks", [])
        except ValueError:
            lines.append(f"{path}: {'empty' if not read(path) else 'not complete JSON (the run was stopped)'}")
            continue
        errors = {b.get("error_message", "")[:60] for b in benchmarks if b.get("error_occurred")}
        if benchmarks and len(errors) == 1 and all(b.get("error_occurred") for b in benchmarks):
            lines.append(f"{path}: every benchmark skipped: {errors.pop()}")
            continue
        key = lambda b: b.get("run_name", b["name"])  # noqa: E731
        rows = [b for b in benchmarks if b.get("aggregate_name") == "median"]
        if not rows:  # one repetition: no aggregates
            rows = [b for b in benchmarks if b.get("run_type", "iteration") == "iteration"]
        shown = {key(b) for b in rows}
        for b in benchmarks:  # runs that skipped or failed have no aggregates: one line each
            if b.get("error_occurred") and key(b) not in shown:
                rows.append(b)
                shown.add(key(b))
        for b in rows:
            name = key(b)[:72]
            if b.get("error_occurred"):
                lines.append(f"{name:<72} skipped: {b.get('error_message', '')[:40]}")
                continue
            items = f"{b['items_per_second'] / 1e9:.2f}G" if "items_per_second" in b else "-"
            gbs = f"{b['bytes_per_second'] / 1e9:.1f}" if "bytes_per_second" in b else "-"
            lines.append(f"{name:<72} {b['real_time']:>9.3f} {b['time_unit']:<2} {items:>9} {gbs:>7}")
            medians[key(b).split("/manual_time")[0].split("/real_time")[0]] = b["real_time"]
    # Issue 5's FrozenBatchNorm2d target: the forward within 1.2x of a device-to-device copy of the
    # same bytes (BM_FrozenBnCopy reads and writes the tensor once, as the forward does).
    targets = []
    for name, t in sorted(medians.items()):
        parts = name.split("/")  # BM_FrozenBnForward/cuda/res2/f32/nchw/none
        if parts[0] != "BM_FrozenBnForward" or parts[-1] != "none":
            continue
        copy = medians.get("/".join(["BM_FrozenBnCopy"] + parts[1:4]))
        if copy:
            r = t / copy
            targets.append(f"  [{'MET ' if r <= 1.2 else 'MISS'}] FrozenBatchNorm2d forward {'/'.join(parts[1:5])}: "
                           f"{r:.2f}x a device-to-device copy (goal <= 1.20x)")
    if targets:
        lines += ["", "targets (issue 5)"] + targets
    return lines


def maskrcnn_table(path):
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        return []
    lines = [f"Mask R-CNN demo ({d.get('gpu') or d.get('device')}, torch {d.get('torch')}, torchvision "
             f"{d.get('torchvision')}, {d.get('steps')} steps, {d.get('size')} px x {d.get('images')} images, "
             f"{d.get('rois')} RoIs)",
             f"{'variant':<28} {'runs':>10} {'median step':>12} {'peak memory':>12}  last step hash"]
    for name, v in d.get("variants", {}).items():
        peak = f"{v['peak_memory_bytes'] / 2**20:.0f} MiB" if v.get("peak_memory_bytes") else "-"
        last = (v.get("hashes") or [[]])[0]
        last = str(last[-1])[:16] if last else "-"
        lines.append(f"{name:<28} {'identical' if v.get('runs_identical') else 'DIFFER':>10} "
                     f"{v.get('median_step_s', 0) * 1e3:>9.0f} ms {peak:>12}  {last}")
        lines += [f"  torch warned: {w[:120]}" for w in v.get("nondeterminism_warnings", [])]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="the check's folder (<build>/gpu-check)")
    ap.add_argument("--budget", type=int, default=0, help="the check's budget in seconds (for the first line)")
    ap.add_argument("--elapsed", type=int, default=0, help="seconds used so far")
    ap.add_argument("--final", action="store_true", help="the check is over: PASSED or FAILED, not 'so far'")
    args = ap.parse_args()
    folder, logs = args.folder, os.path.join(args.folder, "logs")
    steps = [line.split("\t") for line in read(os.path.join(folder, "steps.txt")).splitlines() if line.strip()]
    failed = any(r.startswith("FAILED") for _, _, r in steps)
    out = [f"== gpu-check summary ({args.elapsed}s of {args.budget}s) =="]
    out += read(os.path.join(logs, "machine.log")).splitlines()[:1]
    out += [f"{name:<16} {secs:>4}s  {result}" for name, secs, result in steps]
    for name, _, result in steps:
        if name in CTEST_STEPS and not result.startswith("skipped"):
            log = read(os.path.join(logs, f"{name}.log"))
            counts, bad = ctest_counts(log)
            out.append(f"{CTEST_STEPS[name]}: {counts}")
            # a device the tests cannot use fails each of them (DETOPS_REQUIRE_GPU): say why once
            why = re.search(r"no CUDA device: [^\n]*DETOPS_REQUIRE_GPU=1\)", log)
            out += [f"  the tests see no device: {why.group(0)}"] if why else []
            out += bad
            if name == "torch":
                out += [line for line in [python_counts(log)] if line]
    sanitizer = sanitizer_lines(folder)
    if sanitizer:
        out += ["compute-sanitizer:"] + sanitizer
    out += [""] + bench_table(folder) + [""]
    for name, what in (("compare-gpu.txt", "torchvision comparison"), ("compare-bn-gpu.txt", "torch BatchNorm2d comparison")):
        text = read(os.path.join(folder, name)).rstrip()
        out += [text if text else f"(no {what})", ""]
    demo = maskrcnn_table(os.path.join(folder, "maskrcnn-gpu.json"))
    if demo:
        out += demo + [""]
    verdict = "FAILED" if failed else ("PASSED" if args.final else "PASSED so far")
    out.append(f"gpu-check: {verdict}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
