#!/usr/bin/env python3
"""Chart of SyncBatchNorm (one rank) against torch.nn.BatchNorm2d, as PNG (matplotlib, Agg).

  plot_sync_bn.py [COMPARE_BN_JSON] [--out PNG]

COMPARE_BN_JSON is benchmarks/compare_torch_bn.py's output (default: the newest
benchmarks/results/compare-bn-*.json). One bar group per (device, shape, layout, threads):
torch's training forward+backward, detops' default mode and (when measured) its baseline-ISA run
(default:baseline) and exact mode, median
ms on a log scale, with the ratio torch / detops over each detops bar (> 1: detops faster).
Written to docs/sync_bn_vs_torch.png by default.
"""

import argparse
import glob
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # Debian's python3-matplotlib lives under /usr/bin/python3
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != "/usr/bin/python3" \
            and not os.environ.get("DETOPS_PLOT_REEXEC"):
        os.environ["DETOPS_PLOT_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def newest(pattern):
    files = sorted(glob.glob(pattern), key=os.path.getmtime)
    return files[-1] if files else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="?", help="compare_torch_bn.py output")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "sync_bn_vs_torch.png"))
    a = ap.parse_args()
    path = a.json or newest(os.path.join(HERE, "results", "compare-bn-*.json"))
    if not path:
        sys.exit("plot_sync_bn: no compare-bn-*.json found; run benchmarks/compare_torch_bn.py first")
    with open(path) as f:
        data = json.load(f)

    groups = {}  # (device, shape, layout, threads) -> {"torch": ms, "default": (ms, ratio), "exact": ...}
    for r in data["results"]:
        if r.get("detops_error") or r.get("torch_error") or not r.get("detops_ms"):
            continue
        key = (r["device"], r["shape"], r["layout"], r["threads"])
        g = groups.setdefault(key, {})
        if r.get("torch_ms"):
            g["torch"] = r["torch_ms"]["median"]
        g[r["mode"]] = (r["detops_ms"]["median"], r.get("ratio"))
    if not groups:
        sys.exit(f"plot_sync_bn: {path} has no complete rows")

    keys = sorted(groups, key=lambda k: (k[0], ["box", "res5", "res2"].index(k[1]) if k[1] in ("box", "res5", "res2")
                                         else 9, k[2], k[3]))
    series = [("torch", "torch BatchNorm2d", "#999999"), ("default", "detops default", "#1f77b4"),
              ("default:baseline", "detops default, baseline ISA (SSE2)", "#2ca02c"),
              ("exact", "detops exact", "#ff7f0e")]
    series = [sr for sr in series if any(sr[0] in g for g in groups.values())]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(keys)), 4.8))
    for si, (name, label, color) in enumerate(series):
        xs, ys, ratios = [], [], []
        for i, k in enumerate(keys):
            v = groups[k].get(name)
            if v is None:
                continue
            ms, ratio = (v, None) if name == "torch" else v
            xs.append(i + (si - (len(series) - 1) / 2) * width)
            ys.append(ms)
            ratios.append(ratio)
        bars = ax.bar(xs, ys, width, label=label, color=color)
        for b, ratio in zip(bars, ratios):
            if ratio:
                ax.annotate(f"{ratio:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                            va="bottom", fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_ylabel("training forward + backward, ms (median)")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{d}\n{s} {l}\nt{t}" for d, s, l, t in keys], fontsize=8)
    machine = data.get("machine", {})
    host = f"{machine.get('cpu_model', '')}, {machine.get('logical_cpus', '?')} CPUs ({machine.get('host', '')})"
    ax.set_title(f"SyncBatchNorm (one rank) vs torch.nn.BatchNorm2d, float32 — ratio = torch / detops\n{host}",
                 fontsize=9)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 4)  # room for the legend above the bars' labels
    ax.legend(fontsize=8, ncol=len(series), loc="upper center")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"plot_sync_bn: wrote {a.out} from {path}")


if __name__ == "__main__":
    main()
