// CUDA backend of FrozenBatchNorm2d: the entry point only. The steps (one pass over memory, the
// 16-byte vector bodies where frozen_bn_vec_plan takes them, otherwise the generic element bodies)
// are written once over the device interface (src/internal/frozen_batch_norm_device.h) and run
// here on CudaDevice (cuda/cuda_device.cuh), on the caller's stream;
// tests/frozen_batch_norm_emulated_test.cpp runs the same steps on the emulated device.
#include "cuda_check.cuh"
#include "cuda_device.cuh"
#include "internal/frozen_batch_norm_backend.h"
#include "internal/frozen_batch_norm_device.h"

namespace detops {
namespace internal {

namespace {

void run(const FrozenBnCall& call, const Context& ctx) {
  DeviceGuard guard(call.input.device.index, call.op);
  frozen_bn_run_on(CudaDevice{ctx, call.op}, call);
}

}  // namespace

extern const FrozenBnBackend kFrozenBnCuda = {&run};

}  // namespace internal
}  // namespace detops
