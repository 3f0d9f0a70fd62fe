// CUDA backend of deform_conv2d: the entry points only. The steps are written once over the
// device interface (src/internal/deform_conv2d_device.h, the sequences of
// internal/deform_conv2d_backend.h) and run here on CudaDevice (cuda/cuda_device.cuh): launches
// of the shared per-thread bodies and CUB's sort, all on the caller's stream; nothing waits.
// tests/deform_conv2d_emulated_test.cpp runs the same steps on the emulated device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "cuda_check.cuh"
#include "cuda_device.cuh"
#include "internal/deform_conv2d_backend.h"
#include "internal/deform_conv2d_device.h"

namespace detops {
namespace internal {

namespace {

void forward(const DeformConv2dCall& call, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.input.device.index, call.op);
  const CudaDevice dev{ctx, call.op};
  dispatch_floating(call.input.dtype, [&](auto tag) { deform_forward_on<decltype(tag)>(dev, call, ws); });
}

std::size_t backward_workspace(const DeformConv2dCall& call, BackwardMode mode) {
  DeviceGuard guard(call.input.device.index, call.op);  // CUB's temporary sizes depend on the device
  const Context ctx{};                                   // a size query enqueues nothing
  return deform_backward_workspace_on(CudaDevice{ctx, call.op}, call, mode);
}

void backward(const DeformConv2dCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.input.device.index, call.op);
  const CudaDevice dev{ctx, call.op};
  dispatch_floating(call.input.dtype, [&](auto tag) { deform_backward_on<decltype(tag)>(dev, call, mode, ws); });
}

}  // namespace

extern const DeformConv2dBackend kDeformConv2dCuda = {&forward, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
