#!/usr/bin/env python3
# Mask R-CNN training demo: synthetic data, detops_torch or torchvision RoIAlign, two runs compared by hash.
"""Reproducible Mask R-CNN training with detops_torch.

Builds ``torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)``
at a small image size, trains it for a few SGD steps on synthetic images and targets drawn from a
fixed seed (nothing is downloaded), and prints per step the losses and a hash of the losses and of
every parameter. Each variant runs twice from the same seed; the runs agree when the training is
reproducible.

Variants (``--ops``):
  detops                      detops_torch.convert(model): RoIAlign with backward_mode="exact"
  torchvision                 torchvision's C++/CUDA kernel, called directly
                              (torch.ops.torchvision.roi_align; atomicAdd backward on CUDA)
  torchvision-deterministic   torchvision.ops.roi_align as shipped: on CUDA with deterministic
                              algorithms on, torchvision >= 0.16 reroutes to its pure-Python
                              fallback (vision#7587), which is slow and memory hungry (vision#8168)

On the CPU every variant is run-to-run identical at a fixed thread count (torch's own
convolutions give other bits at another thread count, so no variant is thread-count independent
as a whole model). On CUDA, torch.use_deterministic_algorithms(True, warn_only=True) is set and
CUBLAS_WORKSPACE_CONFIG=:4096:8 before CUDA starts; the summary lists the nondeterministic ops
torch warned about, the step time and the peak memory of each variant.

    python3 examples/torch/train_maskrcnn.py --smoke            # CI: 2 steps at 128 px, CPU
    python3 examples/torch/train_maskrcnn.py --threads 2        # CPU: detops and torchvision
    python3 examples/torch/train_maskrcnn.py --device cuda --steps 5 --json out.json   # all variants
"""
import os

# cuBLAS reads this when CUDA starts; it must be set before anything initializes CUDA
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision.models.detection import maskrcnn_resnet50_fpn  # noqa: E402

VARIANTS = ("detops", "torchvision", "torchvision-deterministic")


def synthetic_batch(images, size, num_classes, seed, device):
    """Images in [0, 1] and 1-3 boxes per image with labels and box-shaped masks, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    imgs, targets = [], []
    for _ in range(images):
        imgs.append(torch.rand(3, size, size, generator=g).to(device))
        k = int(torch.randint(1, 4, (1,), generator=g))
        lo = torch.rand(k, 2, generator=g) * (size * 0.6)
        wh = size * 0.1 + torch.rand(k, 2, generator=g) * (size * 0.3)
        boxes = torch.cat([lo, (lo + wh).clamp(max=size - 1)], dim=1).round()
        masks = torch.zeros(k, size, size, dtype=torch.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
            masks[i, y1:y2, x1:x2] = 1
        labels = torch.randint(1, num_classes, (k,), generator=g)
        targets.append({"boxes": boxes.to(device), "labels": labels.to(device), "masks": masks.to(device)})
    return imgs, targets


def _direct_torchvision_roi_align(input, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False):
    """torchvision.ops.roi_align without its deterministic-mode reroute: the registered kernel."""
    from torch.nn.modules.utils import _pair
    from torchvision.ops._utils import convert_boxes_to_roi_format
    rois = boxes if isinstance(boxes, torch.Tensor) else convert_boxes_to_roi_format(boxes)
    ph, pw = _pair(output_size)
    return torch.ops.torchvision.roi_align(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned)


class _Variant:
    """Builds the model of one variant, and routes torchvision's pooler while it runs."""

    def __init__(self, name, args):
        self.name, self.args = name, args
        self._saved = None
        self.swapped = []

    def __enter__(self):
        if self.name == "torchvision":
            import torchvision.ops.poolers as poolers
            self._saved = poolers.roi_align
            poolers.roi_align = _direct_torchvision_roi_align
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            import torchvision.ops.poolers as poolers
            poolers.roi_align = self._saved
            self._saved = None

    def model(self):
        torch.manual_seed(self.args.seed)
        model = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=self.args.classes,
                                      min_size=self.args.size, max_size=self.args.size,
                                      box_batch_size_per_image=self.args.rois)
        if self.name == "detops":
            import detops_torch
            options = {"backward_mode": "exact"}
            if self.args.batchnorm != "none":
                options["batchnorm"] = self.args.batchnorm
            model = detops_torch.convert(model, **options)
            swapped = sorted({type(m).__name__ for m in model.modules()
                              if type(m).__module__.startswith("detops_torch")})
            if not swapped:
                raise RuntimeError("detops_torch.convert replaced no module of the Mask R-CNN")
            self.swapped = swapped
        return model.to(self.args.device)


def step_hash(losses, model):
    """sha256 over the loss values (float64) and every parameter's bytes, in a fixed order."""
    h = hashlib.sha256()
    for name in sorted(losses):
        h.update(name.encode())
        h.update(torch.tensor(float(losses[name]), dtype=torch.float64).numpy().tobytes())
    for name, p in model.named_parameters():
        h.update(name.encode())
        t = p.detach().to("cpu").contiguous()
        h.update((t.view(torch.int16) if t.dtype in (torch.float16, torch.bfloat16) else t).numpy().tobytes())
    return h.hexdigest()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_once(variant, args, run):
    """One run: a fresh model from the seed, `args.steps` SGD steps; per-step hashes and times."""
    device = torch.device(args.device)
    with _Variant(variant, args) as v:
        model = v.model()
        if v.swapped and run == 0:
            print(f"  {variant}: detops_torch modules in the model: {', '.join(v.swapped)}")
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
        torch.manual_seed(args.seed + 1)  # the samplers' random draws
        hashes, times, records = [], [], []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for step in range(args.steps):
            images, targets = synthetic_batch(args.images, args.size, args.classes, args.seed + 100 + step, device)
            _sync(device)
            start = time.perf_counter()
            losses = model(images, targets)
            total = sum(losses.values())
            opt.zero_grad(set_to_none=True)
            total.backward()
            opt.step()
            _sync(device)
            times.append(time.perf_counter() - start)
            values = {k: float(t) for k, t in losses.items()}
            hashes.append(step_hash(values, model))
            records.append(values)
            print(f"  {variant:<26} run {run} step {step}: loss {sum(values.values()):.6f} "
                  f"hash {hashes[-1][:16]}  {times[-1] * 1e3:.0f} ms", flush=True)
            if not all(map(lambda x: x == x and abs(x) != float("inf"), values.values())):
                print(f"  {variant}: non-finite loss at step {step}", file=sys.stderr)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"hashes": hashes, "step_times_s": times, "losses": records, "peak_memory_bytes": peak}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=None, help=f"one of {', '.join(VARIANTS)}, a comma list, or 'all' "
                   "(default: detops and torchvision on the CPU, all on CUDA)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--size", type=int, default=None,
                   help="min_size = max_size of the model's transform (default: 128 on the CPU, 800 on CUDA)")
    p.add_argument("--images", type=int, default=2, help="images per step")
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--rois", type=int, default=None,
                   help="RoIs sampled per image for the box head (torchvision's box_batch_size_per_image; "
                   "default: 32 on the CPU, torchvision's 512 on CUDA)")
    p.add_argument("--runs", type=int, default=2, help="runs per variant (compared)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--batchnorm", default="none", choices=("none", "frozen", "sync"),
                   help="detops variant: also convert BatchNorm2d (detops_torch.convert(batchnorm=...))")
    p.add_argument("--json", default=None, help="write a summary here")
    p.add_argument("--smoke", action="store_true",
                   help="CI: 2 steps of 1 image at 128 px with 32 RoIs, detops only, 2 runs compared")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.size, args.images, args.rois = 2, 128, 1, 32
        args.ops = args.ops or "detops"
    device = torch.device(args.device)
    if args.size is None:
        args.size = 800 if device.type == "cuda" else 128
    if args.rois is None:
        args.rois = 512 if device.type == "cuda" else 32
    if args.ops is None:
        args.ops = "all" if device.type == "cuda" else "detops,torchvision"
    variants = VARIANTS if args.ops == "all" else tuple(args.ops.split(","))
    for v in variants:
        if v not in VARIANTS:
            p.error(f"--ops: {v!r} is not one of {', '.join(VARIANTS)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False

    print(f"Mask R-CNN (resnet50-fpn, {args.classes} classes) {args.size}px x {args.images} images, "
          f"{args.steps} steps, {args.runs} runs per variant on {device} "
          f"(torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.get_num_threads()} threads)")
    summary = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
               "torch": torch.__version__, "torchvision": torchvision.__version__, "python": platform.python_version(),
               "threads": torch.get_num_threads(), "steps": args.steps, "size": args.size, "images": args.images,
               "rois": args.rois,
               "seed": args.seed, "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
               "variants": {}}
    ok = True
    for v in variants:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs = [train_once(v, args, r) for r in range(args.runs)]
        nondeterministic = sorted({str(w.message).split("\n")[0][:160] for w in caught
                                   if "deterministic" in str(w.message)})
        identical = all(r["hashes"] == runs[0]["hashes"] for r in runs)
        timed = [t for r in runs for t in r["step_times_s"][1:]] or [t for r in runs for t in r["step_times_s"]]
        entry = {"runs_identical": identical, "hashes": [r["hashes"] for r in runs],
                 "losses": runs[0]["losses"], "median_step_s": statistics.median(timed),
                 "peak_memory_bytes": max((r["peak_memory_bytes"] or 0) for r in runs) or None,
                 "nondeterminism_warnings": nondeterministic}
        summary["variants"][v] = entry
        peak = f", peak {entry['peak_memory_bytes'] / 2**20:.0f} MiB" if entry["peak_memory_bytes"] else ""
        print(f"{v}: runs {'IDENTICAL' if identical else 'DIFFER'}; median step "
              f"{entry['median_step_s'] * 1e3:.0f} ms{peak}")
        for msg in nondeterministic:
            print(f"  torch warned: {msg}")
        # detops' promise: identical runs; torchvision's atomic CUDA path is expected to differ
        if v == "detops" or device.type == "cpu":
            ok = ok and identical
        if args.json:  # after every variant: a run stopped by a time limit keeps what it finished
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
    if args.json:
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
