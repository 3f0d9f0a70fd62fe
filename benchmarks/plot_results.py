#!/usr/bin/env python3
"""Charts of the RoIAlign benchmarks, as PNG (matplotlib, Agg backend).

  plot_results.py [COMPARE_JSON] [--bench-json GB_JSON] [--out-dir DIR]

COMPARE_JSON is benchmarks/compare_torchvision.py's output (default: the newest
benchmarks/results/compare-*.json); GB_JSON, optional, is a Google Benchmark JSON from
`detops_bench --benchmark_out=... --benchmark_out_format=json` (medians are used when it has
repetitions). Two charts:

  roi_align_modes.png           backward time per mode (atomic, truncated, exact) for each device,
                                layout and thread count; from GB_JSON when given (every backward
                                configuration in it), else from COMPARE_JSON; torchvision's backward
                                is drawn beside them where COMPARE_JSON has the same configuration.
  roi_align_vs_torchvision.png  detops vs torchvision, forward and backward, per device, layout and
                                thread count, with the ratio torchvision / detops over each detops bar.

Written to docs/ by default (--out-dir, or --modes-png / --vs-png for the exact paths).
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import textwrap

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
except ImportError as e:  # e.g. a GPU machine without it: make the charts where the JSON is copied to
    if __name__ == "__main__" and not os.environ.get("DETOPS_PLOT_REEXEC"):
        for cand in (os.environ.get("PYTHON"), "/usr/bin/python3"):  # Debian's python3-matplotlib
            if cand and os.path.exists(cand) and os.path.realpath(cand) != os.path.realpath(sys.executable) and \
                    subprocess.run([cand, "-c", "import matplotlib"], capture_output=True).returncode == 0:
                os.execve(cand, [cand, os.path.abspath(__file__)] + sys.argv[1:],
                          dict(os.environ, DETOPS_PLOT_REEXEC="1"))
    if __name__ == "__main__":
        print(f"plot: matplotlib is not available ({e}); no charts (the JSON has the figures)", file=sys.stderr)
        sys.exit(0 if "--if-available" in sys.argv else 3)
    raise

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODES = ("atomic", "truncated", "exact")
MODE_COLORS = {"atomic": "#e4572e", "truncated": "#f3a712", "exact": "#2e86ab", None: "#3a9a5b"}  # None: forward
TV_COLOR, TV_DET_COLOR, TV_DET_COMPILED_COLOR = "#9e9e9e", "#555555", "#8e6cb8"
DEVICE_TITLES = {"cpu": "CPU", "cuda": "CUDA"}


def fmt_ms(v):
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_ratio(r):
    return f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def newest_compare_json():
    files = sorted(glob.glob(os.path.join(HERE, "results", "compare-*.json")), key=os.path.getmtime)
    return files[-1] if files else None


def med(s):
    return s.get("median") if s else None


def config_label(layout, threads, extra=None):
    parts = ([extra] if extra else []) + [layout.upper()]
    if threads:
        parts.append(f"{threads} thread{'s' if threads != 1 else ''}")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# Google Benchmark JSON


def read_bench_json(path, name_filter=None):
    """Backward runs (names matching name_filter, a regex, when given):
    {(device, dtype, layout, head, sampling, pool, threads): {mode: ms}}; None (with a warning) when
    the file is missing or not complete JSON (a benchmark run that was stopped)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        print(f"plot: {path}: {e}; no modes chart from it", file=sys.stderr)
        return None
    rows = data.get("benchmarks", [])
    have_median = any(b.get("aggregate_name") == "median" for b in rows)
    out = {}
    for b in rows:
        if b.get("error_occurred"):
            continue
        if have_median and b.get("aggregate_name") != "median":
            continue
        if not have_median and b.get("run_type", "iteration") != "iteration":
            continue
        name = b.get("run_name", b["name"])
        if name_filter and not re.search(name_filter, name):
            continue
        m = re.match(r"^BM_RoiAlignBackward/(cpu|cuda)/(\w+)/(nchw|nhwc)/(box|mask)/(\w+)/(avg|max)/(atomic|truncated|exact)"
                     r"(?:/t(\d+))?", name)
        if not m:
            continue
        device, dtype, layout, head, sampling, pool, mode, threads = m.groups()
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        key = (device, dtype, layout, head, sampling, pool, int(threads) if threads else None)
        out.setdefault(key, {})[mode] = b["real_time"] * scale
    return out, data.get("context", {})


# ------------------------------------------------------------------------------------------------
# Drawing helpers


def bar_labels(ax, bars, texts, fontsize=7.5, bold=None):
    """Value labels over bars; `bold`, when given, is a second (bold) line over each value."""
    for i, (b, t) in enumerate(zip(bars, texts)):
        x, h = b.get_x() + b.get_width() / 2, b.get_height()
        ax.annotate(t, (x, h), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                    fontsize=fontsize)
        if bold and bold[i]:
            ax.annotate(bold[i], (x, h), xytext=(0, 3 + fontsize * 1.15), textcoords="offset points", ha="center",
                        va="bottom", fontsize=fontsize, fontweight="bold")


def use_log(values):
    """Log scale only where a linear one would flatten bars to nothing (e.g. a 100x slower fallback)."""
    vals = [v for v in values if v]
    return bool(vals) and max(vals) / min(vals) > 60


def wrap(text, fig_w_in, fontsize=7.5):
    chars = max(60, int(fig_w_in * 72 / (fontsize * 0.55)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def frame(fig, fig_h_in, top_in=1.0, bottom_text=None, fontsize=7.5):
    """Leaves top_in inches for the title and legend, and room for the footnote at the bottom."""
    lines = bottom_text.count("\n") + 1 if bottom_text else 0
    bottom_in = 0.2 + lines * fontsize * 1.35 / 72
    if bottom_text:
        fig.text(0.5, 0.08 / fig_h_in, bottom_text, ha="center", va="bottom", fontsize=fontsize, color="#444444")
    fig.tight_layout(rect=(0, bottom_in / fig_h_in, 1, 1 - top_in / fig_h_in))


def finish_axes(ax, values, log, headroom=1.22):
    if log:
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 2, max(values) * headroom ** 4 * 2)
        ax.set_ylabel("time per call, ms (log scale)")
    else:
        ax.set_ylim(0, max(values) * headroom)
        ax.set_ylabel("time per call, ms")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def subtitle(doc):
    if not doc:
        return ""
    m, v, w = doc.get("machine", {}), doc.get("versions", {}), doc.get("workload", {})
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    load = doc.get("load_average", {})
    s = doc.get("settings", {})
    return (f"{w.get('description', '')}\n"
            f"{m.get('cpu_model') or m.get('machine', '')} ({m.get('logical_cpus')} cpus){gpu}; torch "
            f"{v.get('torch')}, torchvision {v.get('torchvision')}, detops {v.get('detops')}; medians of "
            f"{s.get('rounds')} alternating rounds; load avg {load.get('start')} -> {load.get('end')}; "
            f"{doc.get('created', '')[:10]}")


# ------------------------------------------------------------------------------------------------
# (a) time per backward mode


def modes_chart(doc, bench, out_path, caption=None):
    # groups per device: (label, {mode: ms}, torchvision ms or None)
    per_device = {}
    tv_ref = {}
    if doc:
        for r in doc["results"]:
            if r["pass"] == "backward":
                tv_ref[(r["device"], r["layout"], r["threads"])] = med(r["baselines"].get("torchvision"))
    if bench and bench[0]:
        rows, _ = bench
        # f32 box sr2 avg first (the comparison's configuration), then the rest in a stable order
        def order(k):
            device, dtype, layout, head, sampling, pool, threads = k
            return (device, (dtype, head, sampling, pool) != ("f32", "box", "sr2", "avg"), dtype, head, sampling,
                    pool, layout, threads or 0)
        for key in sorted(rows, key=order):
            device, dtype, layout, head, sampling, pool, threads = key
            extra = " ".join(p for p in (dtype, head, sampling, pool) if p)
            tv = tv_ref.get((device, layout, threads)) if (dtype, head, sampling, pool) == ("f32", "box", "sr2",
                                                                                          "avg") else None
            per_device.setdefault(device, []).append((config_label(layout, threads, extra), rows[key], tv))
        source = "Google Benchmark JSON (detops_bench)"
    else:
        groups = {}
        for r in doc["results"]:
            if r["pass"] != "backward" or not r["detops_ms"]:
                continue
            k = (r["device"], r["layout"], r["threads"])
            groups.setdefault(k, {})[r["mode"]] = r["detops_ms"]["median"]
        for (device, layout, threads), modes in groups.items():
            per_device.setdefault(device, []).append((config_label(layout, threads), modes,
                                                      tv_ref.get((device, layout, threads))))
        source = "compare_torchvision.py"
    if not per_device:
        print("plot: no backward results for the modes chart", file=sys.stderr)
        return False

    devices = [d for d in ("cpu", "cuda") if d in per_device]
    n_max = max(len(per_device[d]) for d in devices)
    fig_w = max(10.0, 1.45 * n_max + 2.5)
    fig_h = 4.2 * len(devices) + 1.9
    fig, axes = plt.subplots(len(devices), 1, figsize=(fig_w, fig_h), squeeze=False)
    any_tv = False
    for ax, device in zip(axes[:, 0], devices):
        groups = per_device[device]
        show_tv = any(tv for _, _, tv in groups)
        any_tv |= show_tv
        series = list(MODES) + (["torchvision"] if show_tv else [])
        width = 0.8 / len(series)
        all_vals = [v for _, modes, tv in groups for v in list(modes.values()) + ([tv] if show_tv else []) if v]
        log = use_log(all_vals)
        for si, s in enumerate(series):
            xs, hs = [], []
            for gi, (_, modes, tv) in enumerate(groups):
                v = tv if s == "torchvision" else modes.get(s)
                if v:
                    xs.append(gi + (si - (len(series) - 1) / 2) * width)
                    hs.append(v)
            if not hs:
                continue
            tv_bar = s == "torchvision"
            bars = ax.bar(xs, hs, width * 0.92, color=TV_COLOR if tv_bar else MODE_COLORS[s],
                          hatch="//" if tv_bar else None, edgecolor="#6d6d6d" if tv_bar else "white", linewidth=0.6)
            bar_labels(ax, bars, [fmt_ms(h) for h in hs], fontsize=7 if len(groups) > 6 else 8)
        finish_axes(ax, all_vals, log, headroom=1.15)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([g[0] for g in groups], fontsize=8.5)
        ax.set_title(f"{DEVICE_TITLES.get(device, device)} backward, per mode (lower is better)", fontsize=11,
                     loc="left", fontweight="bold")
    handles = [Patch(color=MODE_COLORS[m], label=lbl) for m, lbl in
               (("atomic", "atomic (GPU: atomicAdd, not reproducible; CPU: race-free scatter)"),
                ("truncated", "truncated (fp16-rounded inputs, double sums)"),
                ("exact", "exact (bitwise reproducible)"))]
    if any_tv:
        handles.append(Patch(facecolor=TV_COLOR, hatch="//", edgecolor="#6d6d6d", label="torchvision backward"))
    fig.suptitle("detops RoIAlign backward: time per mode", fontsize=13, fontweight="bold",
                 y=1 - 0.12 / fig_h, va="top")
    fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=8.5, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.45 / fig_h))
    sub = subtitle(doc)
    foot = wrap((sub + "\n" if sub else "") + f"source: {source}; ms per call (median); lower is better"
                + (f"\n{caption}" if caption else ""), fig_w)
    frame(fig, fig_h, top_in=0.75, bottom_text=foot)
    fig.savefig(out_path, dpi=130)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------
# (b) detops vs torchvision


def vs_chart(doc, out_path, caption=None):
    res = doc["results"]
    devices = [d for d in ("cpu", "cuda") if any(r["device"] == d for r in res)]
    passes = [p for p in ("forward", "backward") if any(r["pass"] == p for r in res)]
    if not devices or not passes:
        print("plot: no results for the comparison chart", file=sys.stderr)
        return False
    det_keys = ("torchvision_deterministic", "torchvision_deterministic_compiled")
    ncfg = max(len({(r["layout"], r["threads"]) for r in res if r["device"] == d and r["pass"] == p})
               for d in devices for p in passes)
    both = passes == ["forward", "backward"]
    fig_w = max(10.0, (2.0 * ncfg + 1.2) * (1.7 if both else 1.0))
    fig_h = 4.4 * len(devices) + 2.0
    fig, axes = plt.subplots(len(devices), len(passes), figsize=(fig_w, fig_h), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1.9]} if both else None)
    legend = {}
    for di, device in enumerate(devices):
        for pi, pass_ in enumerate(passes):
            ax = axes[di, pi]
            rows = [r for r in res if r["device"] == device and r["pass"] == pass_]
            cfgs = []
            for r in rows:
                if (r["layout"], r["threads"]) not in cfgs:
                    cfgs.append((r["layout"], r["threads"]))
            modes = [m for m in ((None,) if pass_ == "forward" else MODES) if any(r["mode"] == m for r in rows)]
            dets = [k for k in det_keys if any(med(r["baselines"].get(k)) for r in rows)]
            series = [("tv", "torchvision")] + [("tv", k) for k in dets] + [("detops", m) for m in modes]
            width = 0.84 / len(series)
            drawn = []  # (kind, bars, values, ratios)
            for si, (kind, key) in enumerate(series):
                xs, hs, ratios = [], [], []
                for ci, (layout, threads) in enumerate(cfgs):
                    if kind == "detops":
                        r = next((r for r in rows if (r["layout"], r["threads"], r["mode"]) == (layout, threads, key)),
                                 None)
                        v = med(r["detops_ms"]) if r else None
                        ratio = r["ratios"].get("torchvision") if r and v else None
                    else:
                        r = next((r for r in rows if (r["layout"], r["threads"]) == (layout, threads)), None)
                        v, ratio = (med(r["baselines"].get(key)) if r else None), None
                    if v:
                        xs.append(ci + (si - (len(series) - 1) / 2) * width)
                        hs.append(v)
                        ratios.append(ratio)
                if not hs:
                    continue
                if kind == "detops":
                    color, hatch = MODE_COLORS[key], None
                    label = "detops forward" if key is None else f"detops backward, {key}"
                elif key == "torchvision":
                    color, hatch, label = TV_COLOR, "//", "torchvision"
                else:
                    color = TV_DET_COMPILED_COLOR if "compiled" in key else TV_DET_COLOR
                    hatch = "xx" if "compiled" in key else ".."
                    label = "torchvision, use_deterministic_algorithms(True)" + (
                        " + torch.compile" if "compiled" in key else "")
                bars = ax.bar(xs, hs, width * 0.92, color=color, hatch=hatch,
                              edgecolor="#5a5a5a" if hatch else "white", linewidth=0.6)
                legend[label] = Patch(facecolor=color, hatch=hatch, edgecolor="#5a5a5a" if hatch else color,
                                      label=label)
                drawn.append((kind, bars, hs, ratios))
            all_vals = [h for _, _, hs, _ in drawn for h in hs]
            if not all_vals:
                ax.set_axis_off()
                continue
            fs = 6.8 if len(series) > 3 else 8
            for kind, bars, hs, ratios in drawn:
                bar_labels(ax, bars, [fmt_ms(h) for h in hs], fontsize=fs,
                           bold=[fmt_ratio(rt) if rt else None for rt in ratios] if kind == "detops" else None)
            finish_axes(ax, all_vals, use_log(all_vals), headroom=1.22)
            ax.set_xticks(range(len(cfgs)))
            ax.set_xticklabels([config_label(l, t) for l, t in cfgs], fontsize=9)
            ax.set_title(f"{DEVICE_TITLES.get(device, device)} {pass_}", fontsize=11, loc="left", fontweight="bold")
    order = ["torchvision", "torchvision, use_deterministic_algorithms(True)",
             "torchvision, use_deterministic_algorithms(True) + torch.compile", "detops forward",
             "detops backward, atomic", "detops backward, truncated", "detops backward, exact"]
    handles = [legend[k] for k in order if k in legend]
    fig.suptitle("RoIAlign box head: detops vs torchvision", fontsize=13, fontweight="bold",
                 y=1 - 0.12 / fig_h, va="top")
    fig.legend(handles=handles, loc="upper center", ncol=len(handles) if len(handles) <= 5 else 4, fontsize=8.5,
               frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.45 / fig_h))
    notes = ("Bars: ms per call (median), lower is better. Bold over a detops bar: torchvision / detops "
             "(above 1x: detops is faster). NHWC: torchvision gets a channels_last input, which it copies to NCHW "
             "inside the forward; its backward time includes the copy of grad_input to channels_last (what x.grad "
             "holds).")
    frame(fig, fig_h, top_in=0.75 if len(handles) > 4 else 0.6, bottom_text=wrap(subtitle(doc) + "\n" + notes + (f"\n{caption}" if caption else ""), fig_w))
    fig.savefig(out_path, dpi=130)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("compare_json", nargs="?", help="compare_torchvision.py JSON (default: newest in results/)")
    ap.add_argument("--bench-json", help="Google Benchmark JSON from detops_bench (for the modes chart)")
    ap.add_argument("--bench-filter", help="regex: only these benchmarks of --bench-json (e.g. '/f32/')")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs"), help="where the PNGs go (default docs/)")
    ap.add_argument("--modes-png", help="path of the modes chart (default OUT_DIR/roi_align_modes.png)")
    ap.add_argument("--vs-png", help="path of the comparison chart (default OUT_DIR/roi_align_vs_torchvision.png)")
    ap.add_argument("--caption", help="a line added under each chart (e.g. how loaded the machine was)")
    ap.add_argument("--if-available", action="store_true", help="exit 0, not 3, when matplotlib is missing")
    args = ap.parse_args()

    path = args.compare_json or newest_compare_json()
    doc = None
    if path:
        with open(path) as f:
            doc = json.load(f)
    bench = read_bench_json(args.bench_json, args.bench_filter) if args.bench_json else None
    if not doc and not bench:
        print("plot: no comparison JSON (run compare_torchvision.py) and no --bench-json", file=sys.stderr)
        return 2
    os.makedirs(args.out_dir, exist_ok=True)
    modes_png = args.modes_png or os.path.join(args.out_dir, "roi_align_modes.png")
    vs_png = args.vs_png or os.path.join(args.out_dir, "roi_align_vs_torchvision.png")
    ok = True
    if modes_chart(doc, bench, modes_png, args.caption):
        print(f"plot: wrote {os.path.relpath(modes_png)}")
    else:
        ok = False
    if doc:
        if vs_chart(doc, vs_png, args.caption):
            print(f"plot: wrote {os.path.relpath(vs_png)}")
        else:
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
