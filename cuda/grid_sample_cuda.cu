// CUDA backend of grid_sample: the entry points only. The steps are written once over the device
// interface (src/internal/grid_sample_device.h) and run here on CudaDevice (cuda/cuda_device.cuh):
// launches of the shared per-thread bodies and, in exact mode, the gather engine's CUB sort, all
// on the caller's stream; nothing waits. tests/grid_sample_emulated_test.cpp runs the same steps
// on the emulated device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "cuda_check.cuh"
#include "cuda_device.cuh"
#include "internal/grid_sample_backend.h"
#include "internal/grid_sample_device.h"

namespace detops {
namespace internal {

namespace {

void forward(const GridSampleCall& call, const Context& ctx) {
  DeviceGuard guard(call.input.device.index, call.op);
  const CudaDevice dev{ctx, call.op};
  dispatch_floating(call.input.dtype, [&](auto tag) { grid_sample_forward_on<decltype(tag)>(dev, call); });
}

std::size_t backward_workspace(const GridSampleCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  DeviceGuard guard(call.input.device.index, call.op);  // CUB's temporary sizes depend on the device
  const Context ctx{};                                   // a size query enqueues nothing
  return grid_sample_backward_workspace_on(CudaDevice{ctx, call.op}, call, mode);
}

void backward(const GridSampleCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.input.device.index, call.op);
  const CudaDevice dev{ctx, call.op};
  dispatch_floating(call.input.dtype, [&](auto tag) { grid_sample_backward_on<decltype(tag)>(dev, call, mode, ws); });
}

}  // namespace

extern const GridSampleBackend kGridSampleCuda = {&forward, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
