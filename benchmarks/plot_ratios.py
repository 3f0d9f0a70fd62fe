#!/usr/bin/env python3
"""One chart of every op's CPU speed against its peer, as PNG (matplotlib, Agg backend).

  plot_ratios.py [--deform JSON] [--deform-update JSON ...] [--roi JSON] [--bn JSON] [--out PNG]

Ratio = peer time / detops time (above 1x: detops is faster), medians, log scale; a bar per thread
count measured, ratio at its end, detops atomic as a hollow marker. Rows, grouped by op:
  --deform  bench_deform.py output (default: the newest results/torch215-deform-cpu-*.json by
            name): grid_sample, point_sample, ms_deform_attn (vs torch), deform_conv2d (vs
            torchvision), forward and forward + backward, detops exact.
  --deform-update  a later bench_deform.py run of some cases (repeatable): its rows replace
            --deform's of the same case and phase.
  --roi     compare_torchvision.py output (default results/compare-vm-2026-11-30-pm.json):
            RoIAlign forward and backward (exact) per layout, vs torchvision in the same layout.
  --bn      compare_torch_bn.py output (default results/compare-bn-vm-2026-11-30-pm.json):
            SyncBatchNorm (one rank, default mode) training forward + backward per shape and
            layout, vs torch.nn.BatchNorm2d.
A missing or unreadable input drops its op, with a message on stderr. Writes docs/op_ratios.png
by default.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
except ImportError as e:  # Debian's python3-matplotlib lives under /usr/bin/python3
    if __name__ == "__main__" and not os.environ.get("DETOPS_PLOT_REEXEC"):
        for cand in (os.environ.get("PYTHON"), "/usr/bin/python3"):
            if cand and os.path.exists(cand) and os.path.realpath(cand) != os.path.realpath(sys.executable) and \
                    subprocess.run([cand, "-c", "import matplotlib"], capture_output=True).returncode == 0:
                os.execve(cand, [cand, os.path.abspath(__file__)] + sys.argv[1:],
                          dict(os.environ, DETOPS_PLOT_REEXEC="1"))
    sys.exit(f"plot_ratios: matplotlib is not available ({e})")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

CASE_LABELS = {"gs_rtdetr": "grid_sample RT-DETR", "gs_m2f_point": "point_sample Mask2Former",
               "msda_dino4": "ms_deform_attn DINO", "dcn_c3": "deform_conv2d c3", "dcn_c4": "deform_conv2d c4",
               "dcn_c5": "deform_conv2d c5"}
OP_COLORS = {"grid_sample": "#1f77b4", "point_sample": "#17becf", "ms_deform_attn": "#9467bd",
             "deform_conv2d": "#8c564b", "RoIAlign": "#d62728", "SyncBatchNorm": "#2ca02c"}
THREAD_COLORS = {1: "#2e86ab", 2: "#f3a712"}  # others: grey


def newest_deform_json():
    # by name without ".json", so that "DATE-lanes.json" counts as later than "DATE.json"
    files = sorted(glob.glob(os.path.join(RESULTS, "torch215-deform-cpu-*.json")), key=lambda p: p[:-5])
    return files[-1] if files else None


def med(s):
    return s.get("median") if s else None


def ratio(peer, det):
    return peer / det if peer and det else None


def fmt_ratio(r):
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x" if r >= 1 else f"{r:.2f}x"


# Each reader returns (rows, source note); a row is (op, label, {threads: (exact ratio, atomic ratio or None)}).

def deform_rows(doc):
    first = doc["threads"][0] if isinstance(doc.get("threads"), list) else doc.get("threads", 1)
    cases = {}  # case -> {threads: result}; "CASE" is the first count, "CASE/2t" the others
    for key, r in doc["results"].items():
        case, _, suffix = key.partition("/")
        cases.setdefault(case, {})[r.get("threads") or (int(suffix.rstrip("t")) if suffix else first)] = r
    rows, peers = [], []
    for case, by_t in cases.items():
        label = CASE_LABELS.get(case, case)
        for phase in ("fwd", "fwd+bwd"):
            vals = {}
            for t, r in sorted(by_t.items()):
                peer = next(iter(r["ms"]))
                p = med(r["ms"][peer].get(phase))
                e, a = (ratio(p, med(r["ms"].get(v, {}).get(phase))) for v in ("detops exact", "detops atomic"))
                if e:
                    vals[t] = (e, a)
                if peer not in peers:
                    peers.append(peer)
            if vals:
                rows.append((label.split()[0], f"{label} · {phase}", vals))
    vers = ", ".join(f"{p} {doc.get(p, '?')}" for p in peers)
    return rows, f"{vers}, {doc.get('machine', {}).get('cpus', '?')} cpus"


def roi_rows(doc):
    rows = []
    for layout in ("nchw", "nhwc"):
        for pass_, label in (("forward", "fwd"), ("backward", "bwd")):
            vals = {}
            for r in doc["results"]:
                if (r["device"], r["layout"], r["pass"]) != ("cpu", layout, pass_) or r.get("detops_error"):
                    continue
                tv = med(r["baselines"].get("torchvision"))
                e, a = vals.get(r["threads"], (None, None))
                if r["mode"] in (None, "exact"):
                    e = ratio(tv, med(r["detops_ms"]))
                elif r["mode"] == "atomic":
                    a = ratio(tv, med(r["detops_ms"]))
                vals[r["threads"]] = (e, a)
            vals = {t: v for t, v in sorted(vals.items()) if v[0]}
            if vals:
                rows.append(("RoIAlign", f"RoIAlign {layout.upper()} · {label}", vals))
    return rows, f"torchvision {doc.get('versions', {}).get('torchvision', '?')}"


def bn_rows(doc):
    groups = {}
    for r in doc["results"]:
        if r["device"] == "cpu" and r["mode"] == "default" and not r.get("detops_error") and not r.get("torch_error"):
            e = ratio(med(r.get("torch_ms")), med(r.get("detops_ms")))
            if e:
                groups.setdefault((r["shape"], r["layout"]), {})[r["threads"]] = (e, None)
    rows = [("SyncBatchNorm", f"SyncBatchNorm {s} {l.upper()} · fwd+bwd", dict(sorted(v.items())))
            for (s, l), v in groups.items()]
    return rows, f"torch {doc.get('versions', {}).get('torch', '?')}"


def load(path, reader, what):
    if not path:
        print(f"plot_ratios: no {what} JSON found; {what} left out", file=sys.stderr)
        return [], None
    try:
        with open(path) as f:
            rows, note = reader(json.load(f))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        print(f"plot_ratios: {path}: {type(e).__name__}: {e}; {what} left out", file=sys.stderr)
        return [], None
    if not rows:
        print(f"plot_ratios: {path}: no complete rows; {what} left out", file=sys.stderr)
    return rows, f"{os.path.basename(path)} ({note})"


def draw(rows, sources, out_path):
    fig, ax = plt.subplots(figsize=(10, 8))
    ends_all, height = [], 0.8 / max(len(vals) for _, _, vals in rows)
    for i, (op, label, vals) in enumerate(rows):
        for k, (t, (e, at)) in enumerate(vals.items()):  # centred on the row, whatever counts it has
            y = i + (k - (len(vals) - 1) / 2) * height
            ax.barh(y, e - 1, height * 0.9, left=1, color=THREAD_COLORS.get(t, "#888888"))  # from 1x to the ratio
            ends = [e] + ([at] if at else [])
            if at:
                ax.plot(at, y, "D", mfc="white", mec="#333333", ms=4, mew=0.9, zorder=3)
            ax.annotate(fmt_ratio(e), (max(ends) if e >= 1 else min(ends), y), xytext=(5 if e >= 1 else -5, 0),
                        textcoords="offset points", ha="left" if e >= 1 else "right", va="center", fontsize=7)
            ends_all += ends
        if i and op != rows[i - 1][0]:
            ax.axhline(i - 0.5, color="#bbbbbb", lw=0.7)
    ax.axvline(1.0, color="#333333", lw=1)
    ax.set_xscale("log")
    lo, hi = min(min(ends_all), 1) / 1.6, max(max(ends_all), 1) * 1.7
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo <= t <= hi]
    ax.set(xlim=(lo, hi), ylim=(len(rows) - 0.5, -0.5), xticks=ticks, yticks=range(len(rows)))  # first row on top
    ax.set_xticklabels([f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_yticklabels([label for _, label, _ in rows], fontsize=8.5)
    for tick, (op, _, _) in zip(ax.get_yticklabels(), rows):
        tick.set_color(OP_COLORS.get(op, "black"))
    ax.set_xlabel("peer time / detops time (log scale; right of 1x: detops faster)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    threads = sorted({t for _, _, vals in rows for t in vals})
    handles = [Patch(color=THREAD_COLORS.get(t, "#888888"), label=f"{t} thread{'s' if t != 1 else ''}")
               for t in threads]
    if any(at for _, _, vals in rows for _, at in vals.values()):
        handles.append(Line2D([], [], ls="", marker="D", mfc="white", mec="#333333", ms=5, label="detops atomic"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles), fontsize=8.5,
              frameon=False)
    fig.suptitle("detops vs peers on the CPU: speed ratio per op, medians", fontsize=12, fontweight="bold")
    foot = ("bars: detops exact (SyncBatchNorm: default mode); peers: torch (grid_sample, point_sample, "
            "ms_deform_attn's composition), torchvision (deform_conv2d, roi_align), torch.nn.BatchNorm2d\n"
            "sources: " + "; ".join(sources))
    fig.text(0.01, 0.01, foot, fontsize=7, color="#444444", va="bottom", ha="left", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--deform", metavar="JSON", default=newest_deform_json(), help="bench_deform.py output")
    ap.add_argument("--deform-update", metavar="JSON", action="append", default=[],
                    help="bench_deform.py output whose rows replace --deform's (a rerun of some cases)")
    ap.add_argument("--roi", metavar="JSON", default=os.path.join(RESULTS, "compare-vm-2026-11-30-pm.json"),
                    help="compare_torchvision.py output")
    ap.add_argument("--bn", metavar="JSON", default=os.path.join(RESULTS, "compare-bn-vm-2026-11-30-pm.json"),
                    help="compare_torch_bn.py output")
    ap.add_argument("--out", metavar="PNG", default=os.path.join(ROOT, "docs", "op_ratios.png"))
    a = ap.parse_args()
    rows, sources = [], []
    for path, reader, what in ((a.deform, deform_rows, "deform ops"), (a.roi, roi_rows, "RoIAlign"),
                               (a.bn, bn_rows, "SyncBatchNorm")):
        r, src = load(path, reader, what)
        if r:
            rows += r
            sources.append(src)
    for path in a.deform_update:  # in place where --deform had the row, else added
        r, src = load(path, deform_rows, "deform ops update")
        if r:
            update = {label: row for row in r for label in [row[1]]}
            rows = [update.pop(row[1], row) for row in rows] + list(update.values())
            sources.append(src)
    if not rows:
        sys.exit("plot_ratios: nothing to draw")
    rows.sort(key=lambda row: list(OP_COLORS).index(row[0]) if row[0] in OP_COLORS else len(OP_COLORS))  # stable
    draw(rows, sources, a.out)
    print(f"plot_ratios: wrote {os.path.relpath(a.out)} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
