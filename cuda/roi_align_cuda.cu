// CUDA backend of RoIAlign: the entry points only. The steps (the roi check with its one wait, the
// forward, the scatter modes and the exact and float64 truncated modes' gather engine with
// RoIAlign's own slot fields) are written once over the device interface
// (src/internal/roi_align_device.h, with the roi ops' shared sequences of
// src/internal/roi_device.h) and run here on CudaDevice (cuda/cuda_device.cuh), on the caller's
// stream. tests/roi_emulated_test.cpp runs the same steps on the emulated device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "cuda_check.cuh"
#include "cuda_device.cuh"
#include "internal/roi_align_backend.h"
#include "internal/roi_align_device.h"
#include "internal/roi_device.h"

namespace detops {
namespace internal {

namespace {

RoiCheck check_rois(const RoiAlignCall& call, bool need_total, const Context& ctx) {
  DeviceGuard guard(call.features.device.index, call.op);
  return roi_align_check_rois_on(CudaDevice{ctx, call.op}, call, need_total);
}

void forward(const RoiAlignCall& call, const Context& ctx) {
  DeviceGuard guard(call.features.device.index, call.op);
  const CudaDevice dev{ctx, call.op};
  dispatch_floating(call.features.dtype, [&](auto tag) { roi_align_forward_on<decltype(tag)>(dev, call); });
}

bool enumerates(const RoiAlignCall& call, BackwardMode mode) {
  return roi_backward_enumerates(call.features.dtype, mode);
}

std::size_t backward_workspace(const RoiAlignCall& call, const RoiBackwardPlan& plan) {
  DeviceGuard guard(call.features.device.index, call.op);  // CUB's temp sizes depend on the device
  const Context ctx{};                                      // a size query enqueues nothing
  return roi_align_backward_workspace_on(CudaDevice{ctx, call.op}, call, plan);
}

void backward(const RoiAlignCall& call, const RoiBackwardPlan& plan, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.features.device.index, call.op);
  roi_align_backward_on(CudaDevice{ctx, call.op}, call, plan, ws);
}

}  // namespace

extern const RoiAlignBackend kRoiAlignCuda = {&check_rois, &forward, &enumerates, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
