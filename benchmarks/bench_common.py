"""What benchmarks/compare_torch_bn.py and benchmarks/compare_torchvision.py share: finding torch
(re-running the script under a Python that has it), finding and running detops_bench one benchmark
per process, the timing options, the alternating rounds, medians and ratios, table cells, machine
information and the JSON and table output files. Not a script of its own."""

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

# CUDA: both sides time CUDA_CHAIN back-to-back calls between one pair of events and report the
# average per call (bench_util.h kCudaChain, the same number): the host enqueues the next call
# while the device runs the last, as in a training loop, so a fast kernel is not timed as its
# launch latency (Python's for torch, C++'s for detops). Where dispatching a call takes longer
# than running it, the time is the dispatch, on both sides alike.
CUDA_CHAIN = 10
TIMING = {"cpu": "wall clock (time.perf_counter; Google Benchmark real_time), one call per sample",
          "cuda": f"CUDA events around {CUDA_CHAIN} back-to-back calls, per call (torch.cuda.Event; "
                  f"Google Benchmark manual_time, bench_util.h kCudaChain); torchvision's deterministic "
                  f"fallback one call per sample (its calls take milliseconds or more)"}


# ------------------------------------------------------------------------------------------------
# torch


def ensure_torch(prog, script, probe="import torch"):
    """Imports torch; where this interpreter has none, re-runs `script` (the caller's __file__) under
    one where `probe` succeeds. False when there is none."""
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
        if subprocess.run([cand, "-c", probe], capture_output=True).returncode == 0:
            print(f"{prog}: no torch in {sys.executable}; re-running under {cand}", file=sys.stderr, flush=True)
            env = dict(os.environ, DETOPS_COMPARE_REEXEC="1")
            os.execve(cand, [cand, os.path.abspath(script)] + sys.argv[1:], env)
    return False


# ------------------------------------------------------------------------------------------------
# Machine and versions


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


def machine_info(detailed=False):
    """Host, CPU, memory, GPUs (nvidia-smi); `detailed` adds platform.machine() and the Python version."""
    info = {"host": socket.gethostname(), "platform": platform.platform()}
    if detailed:
        info["machine"] = platform.machine()
    info.update(cpu_model=read_first("/proc/cpuinfo", r"model name\s*:\s*(.*)"), logical_cpus=os.cpu_count(),
                cpus_available=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                mem_total=read_first("/proc/meminfo", r"MemTotal:\s*(.*)"))
    if detailed:
        info["python"] = sys.version.split()[0]
    info["python_executable"] = sys.executable
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


def git_describe():
    try:
        return subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True,
                              timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def file_time(path):
    """The file's modification time, ISO 8601 to the second (when detops_bench was built)."""
    return datetime.datetime.fromtimestamp(os.path.getmtime(path)).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------------
# detops_bench


def find_bench(explicit):
    """detops_bench: `explicit` (--bench), $DETOPS_BENCH, then build-gpu/, build/, build-cpu/."""
    cands = [explicit, os.environ.get("DETOPS_BENCH")]
    cands += [os.path.join(ROOT, d, "benchmarks", "detops_bench") for d in ("build-gpu", "build", "build-cpu")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


class Bench:
    """detops_bench, one process per measurement. `args` go on every command line, `env` (extra
    variables) into every process's environment: what registers the configurations compared."""

    def __init__(self, path, min_time, timeout, args=(), env=None):
        self.path, self.min_time, self.timeout = path, min_time, timeout
        self.args = list(args)
        self.env = dict(os.environ, **env) if env else None
        self.min_time_suffix = ""  # Google Benchmark >= 1.8 prefers "0.5s"
        p = subprocess.run([path] + self.args + ["--benchmark_list_tests=true"], capture_output=True, text=True,
                           timeout=120, env=self.env)
        lines = p.stdout.splitlines()
        self.banner = lines[0] if lines and lines[0].startswith("detops ") else ""
        # names as listed carry /real_time or /manual_time; keep a map from the plain name
        self.names = {}
        for line in lines:
            m = re.match(r"^(BM_\S+?)(/real_time|/manual_time)?$", line.strip())
            if m:
                self.names[m.group(1)] = line.strip()
        self.context = {}

    def has(self, name):
        return name in self.names

    def run(self, name):
        """One detops_bench process for one benchmark: {'ms': per-iteration time, 'iterations': n} or
        {'error': why}."""
        regex = "^" + re.escape(name).replace("\\/", "/") + "(/real_time|/manual_time)?$"
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            for attempt in range(2):
                cmd = [self.path] + self.args + [
                    f"--benchmark_filter={regex}", f"--benchmark_out={out}", "--benchmark_out_format=json",
                    f"--benchmark_min_time={self.min_time}{self.min_time_suffix}"]
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

    def run_rows(self, gi, rows, samples, errors):
        """Runs each row's benchmark once: the time goes to samples[(gi, "detops:<mode>")], a failure
        to errors[benchmark]."""
        for row in rows:
            if not self.has(row["benchmark"]):
                errors[row["benchmark"]] = "not registered by this detops_bench"
                continue
            r = self.run(row["benchmark"])
            if "error" in r:
                errors[row["benchmark"]] = r["error"]
            else:
                samples.setdefault((gi, "detops:" + str(row["mode"])), []).append(r["ms"])


# ------------------------------------------------------------------------------------------------
# Options and rounds


def add_timing_args(ap, baseline):
    """The options both comparisons take for rounds, calls and detops_bench runs; `baseline` names
    what detops is compared with (in the help)."""
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 call, short min_time")
    ap.add_argument("--rounds", type=int, help="alternating rounds (default 5; --quick 1)")
    ap.add_argument("--calls", type=int, help=f"{baseline} calls per round on the CPU, median taken (default 3; "
                                              "--quick 1)")
    ap.add_argument("--cuda-calls", type=int, help="the same on CUDA (default 20; --quick 5)")
    ap.add_argument("--min-time", type=float, help="detops_bench --benchmark_min_time, s (default 0.5; --quick 0.01)")
    ap.add_argument("--bench-timeout", type=int, default=300, help="seconds per detops_bench run")
    ap.add_argument("--max-seconds", type=float, help="start no round that would end past this many seconds "
                                                     "(at least one round runs); the JSON says how many ran")
    ap.add_argument("--note", action="append", default=[], help="a note for the JSON (repeatable)")


def timing_settings(args):
    """(rounds, calls, cuda_calls, min_time) from the options, with their defaults (--quick's when given)."""
    rounds = args.rounds or (1 if args.quick else 5)
    calls = args.calls or (1 if args.quick else 3)
    cuda_calls = args.cuda_calls or (5 if args.quick else 20)
    min_time = args.min_time if args.min_time is not None else (0.01 if args.quick else 0.5)
    return rounds, calls, cuda_calls, min_time


def csv_list(s):
    return [x for x in s.split(",") if x]


def alternating_rounds(prog, rounds, max_seconds, t_start):
    """Yields the round indices 0 .. rounds-1; stops before a round that would end more than
    max_seconds after t_start, judged by the rounds so far (at least one round runs)."""
    for rnd in range(rounds):
        if rnd and max_seconds:
            per_round = (time.time() - t_start) / rnd
            if time.time() - t_start + per_round > max_seconds:
                print(f"{prog}: stopping after {rnd} rounds (--max-seconds {max_seconds:g})", flush=True)
                return
        yield rnd


def print_round(rnd, rounds, t_start, label, width, baseline, baseline_ms, gi, rows, samples):
    """The progress line of one group in one round: the baseline's time and each detops mode's."""
    dm = " ".join(f"{row['mode'] or 'detops'}={fmt_ms(samples.get((gi, 'detops:' + str(row['mode'])), [None])[-1])}"
                  for row in rows)
    print(f"  round {rnd + 1}/{rounds} [{time.time() - t_start:6.0f} s, load {loadavg()}] {label:<{width}} "
          f"{baseline}={fmt_ms(baseline_ms)} {dm}", flush=True)


# ------------------------------------------------------------------------------------------------
# Summaries and the table


def spread(samples):
    """Half the min-max range relative to the median, in percent."""
    if not samples or len(samples) < 2:
        return None
    m = statistics.median(samples)
    return 50.0 * (max(samples) - min(samples)) / m if m else None


def summarize(samples):
    vals = [v for v in samples if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals),
            "spread_pct": spread(vals), "samples": [round(v, 4) for v in vals]}


def ratio_of_medians(base, det):
    """baseline / detops of the summaries' medians (> 1: detops faster)."""
    return base["median"] / det["median"] if base and det else None


def paired_ratio(base, det):
    """The median of the per-round ratios baseline / detops (each round ran them back to back: less
    sensitive to load that drifts over the run than the ratio of the medians)."""
    if base and det and len(base["samples"]) == len(det["samples"]):
        return statistics.median(a / b for a, b in zip(base["samples"], det["samples"]))
    return None


def fmt_ms(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def fmt_ratio(v):
    return "-" if v is None else (f"{v:.2f}x" if v < 10 else f"{v:.1f}x")


def cell(s):
    """A summary as 'median +-spread%'."""
    if not s:
        return "-"
    sp = s.get("spread_pct")
    return fmt_ms(s["median"]) + (f" +-{sp:.0f}%" if sp is not None else "")


# ------------------------------------------------------------------------------------------------
# Output


def doc_head(schema, script, t_start):
    """The JSON's first keys: schema, creation time, the command line (`script` is the caller's
    __file__) and the duration so far."""
    return {"schema": schema,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.relpath(script, ROOT)] + sys.argv[1:]),
            "duration_s": round(time.time() - t_start, 1)}


def doc_run(machine, load_samples, versions, bench, bench_path):
    """The JSON's keys on where it ran: machine, load averages, versions, detops_bench."""
    return {"machine": machine,
            "load_average": {"start": load_samples[0]["load"], "end": loadavg(), "per_round": load_samples},
            "versions": versions,
            "bench": {"path": bench_path, "banner": bench.banner, "context": bench.context}}


def output_paths(json_arg, table_arg, prefix):
    """The JSON path (default benchmarks/results/<prefix>-<host>-<date>.json) and the table's (default:
    the JSON's with .txt)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    json_path = json_arg or os.path.join(HERE, "results", f"{prefix}-{host}-{datetime.date.today().isoformat()}.json")
    return json_path, table_arg or os.path.splitext(json_path)[0] + ".txt"


def write_outputs(prog, doc, table, json_path, table_path, quiet=False):
    """Writes the JSON and the table (each replaced whole: a reader never sees half a file), and
    prints the table unless `quiet` (the comparisons write after every round, so that a run
    stopped from outside keeps the rounds it finished)."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    for path, text in ((json_path, json.dumps(doc, indent=1) + "\n"), (table_path, table + "\n")):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    if not quiet:
        print()
        print(table)
        print(f"\n{prog}: wrote {os.path.relpath(json_path)} and {os.path.relpath(table_path)}")
