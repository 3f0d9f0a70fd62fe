"""The README's "Use it from PyTorch" example, run by ctest (detops_torch_example_quickstart).

Checks what the README claims: the exact backward gives the same gradient bits twice, and
convert() swaps torchvision's poolers in place.
"""
import sys

# [readme:quickstart]
import torch, torchvision, detops_torch

feats = torch.rand(2, 256, 50, 68, requires_grad=True)
boxes = [torch.tensor([[10.0, 12.0, 90.0, 80.0]]), torch.tensor([[0.0, 0.0, 40.0, 40.0]])]
pooled = detops_torch.roi_align(feats, boxes, output_size=7, spatial_scale=0.25,
                                sampling_ratio=2, aligned=True)  # torchvision's signature
pooled.sum().backward()  # exact backward: the same bits on every run, thread count and device

model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)
detops_torch.convert(model)  # RoIAlign, MultiScaleRoIAlign, FrozenBatchNorm2d swapped in place
model = detops_torch.convert_sync_batchnorm(model, mode="exact")  # BatchNorm2d -> SyncBatchNorm
# [/readme:quickstart]


def main() -> int:
    first = feats.grad.clone()
    feats.grad = None
    detops_torch.roi_align(feats, boxes, output_size=7, spatial_scale=0.25, sampling_ratio=2,
                           aligned=True).sum().backward()
    same = torch.equal(first.view(torch.int32), feats.grad.view(torch.int32))
    poolers = [m for m in model.modules() if isinstance(m, detops_torch.MultiScaleRoIAlign)]
    syncs = [m for m in model.modules() if isinstance(m, detops_torch.SyncBatchNorm)]
    print(f"quickstart: pooled {tuple(pooled.shape)}, gradient bits equal over two runs: {same}, "
          f"{len(poolers)} detops poolers, {len(syncs)} detops SyncBatchNorm layers")
    return 0 if same and len(poolers) == 2 and syncs else 1


if __name__ == "__main__":
    sys.exit(main())
