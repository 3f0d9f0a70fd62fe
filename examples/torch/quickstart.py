"""The README's "Use it from PyTorch" example, run by ctest (detops_torch_example_quickstart).

Checks what the README claims: the exact backward gives the same gradient bits twice (RoIAlign,
grid_sample, point_sample, deformable attention), and convert() swaps torchvision's poolers in place.
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

# [readme:deform]
x = torch.randn(2, 64, 50, 68, requires_grad=True)
grid = torch.rand(2, 300, 16, 2) * 2 - 1
y = detops_torch.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                             align_corners=False)  # torch.nn.functional.grid_sample's signature
masks = torch.randn(10, 1, 112, 112, requires_grad=True)
coords = torch.rand(10, 1000, 2)  # in [0, 1]
points = detops_torch.point_sample(masks, coords, align_corners=False)  # detectron2's / Mask2Former's

# mmcv's MultiScaleDeformableAttention (its state dict; MSDeformAttn is Deformable-DETR's)
attn = detops_torch.MultiScaleDeformableAttention(embed_dims=64, num_heads=4, num_levels=2,
                                                  num_points=4, batch_first=True)
shapes = torch.tensor([[32, 32], [16, 16]])  # (H, W) per level
start = torch.tensor([0, 32 * 32])           # first row of each level
query, value = torch.randn(2, 100, 64), torch.randn(2, 32 * 32 + 16 * 16, 64, requires_grad=True)
ref = torch.rand(2, 100, 2, 2)  # reference points per level
torch.manual_seed(0)  # the module's dropout: same seed, same mask
out = attn(query, value=value, reference_points=ref, spatial_shapes=shapes, level_start_index=start)
(y.sum() + points.sum() + out.sum()).backward()  # exact backward: the same bits on every run
# [/readme:deform]


def main() -> int:
    first = feats.grad.clone()
    feats.grad = None
    detops_torch.roi_align(feats, boxes, output_size=7, spatial_scale=0.25, sampling_ratio=2,
                           aligned=True).sum().backward()
    same = torch.equal(first.view(torch.int32), feats.grad.view(torch.int32))
    # the deformable ops' gradients, a second time: the same bits
    grads = [x.grad.clone(), masks.grad.clone(), value.grad.clone()]
    x.grad = masks.grad = value.grad = None
    y2 = detops_torch.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    points2 = detops_torch.point_sample(masks, coords, align_corners=False)
    torch.manual_seed(0)
    out2 = attn(query, value=value, reference_points=ref, spatial_shapes=shapes, level_start_index=start)
    again = y2.sum() + points2.sum() + out2.sum()
    again.backward()
    same_deform = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                      for a, b in zip(grads, [x.grad, masks.grad, value.grad]))
    poolers = [m for m in model.modules() if isinstance(m, detops_torch.MultiScaleRoIAlign)]
    syncs = [m for m in model.modules() if isinstance(m, detops_torch.SyncBatchNorm)]
    print(f"quickstart: pooled {tuple(pooled.shape)}, gradient bits equal over two runs: {same}, "
          f"{len(poolers)} detops poolers, {len(syncs)} detops SyncBatchNorm layers; grid_sample, "
          f"point_sample and deformable attention gradient bits equal over two runs: {same_deform}")
    return 0 if same and same_deform and len(poolers) == 2 and syncs else 1


if __name__ == "__main__":
    sys.exit(main())
