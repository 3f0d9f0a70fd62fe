// The zero fill of a strided 4-d grad_input that every CUDA backward starts with, for the ops
// whose CUDA steps are not yet written over the device interface: zero_fill of
// src/internal/device_steps.h bound to CudaDevice. Enqueued on the caller's stream.
#pragma once

#include "cuda_device.cuh"
#include "internal/device_steps.h"

namespace detops {
namespace internal {

/// Zeroes every element of a strided 4-d view of T (a memset when it is dense).
template <class T>
void zero_fill_cuda(const TensorView& v, const Context& ctx, const char* op) {
  zero_fill<T>(CudaDevice{ctx, op}, v);
}

}  // namespace internal
}  // namespace detops
