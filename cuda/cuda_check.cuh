// Checked CUDA calls and launch helpers for the CUDA backend: every runtime call's status is
// turned into a detops::Error naming the call and the op; device code never throws.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "detops/context.h"
#include "internal/common.h"

namespace detops {
namespace internal {

inline void cuda_check(cudaError_t status, const char* what, const char* op) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  const ErrorCode code = status == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kCudaError;
  fail(code, "{}: {} failed: {} ({})", op, what, cudaGetErrorString(status), cudaGetErrorName(status));
}

#define DETOPS_CUDA_CHECK(call, op) ::detops::internal::cuda_check((call), #call, (op))

/// Makes device `index` current for a scope and restores the caller's device afterwards.
class DeviceGuard {
 public:
  DeviceGuard(int index, const char* op) {
    DETOPS_CUDA_CHECK(cudaGetDevice(&previous_), op);
    if (previous_ != index) DETOPS_CUDA_CHECK(cudaSetDevice(index), op);
  }
  ~DeviceGuard() {
    int now = 0;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

/// The caller's stream (nullptr: the legacy default stream).
inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.cuda_stream); }

constexpr int kBlock = 256;

/// Blocks for a grid-stride loop over n items (n > 0).
inline unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::min<std::int64_t>(std::max<std::int64_t>(blocks, 1), 1 << 20));
}

/// Checks a launch; with ctx.debug_sync, also waits for it so a fault points at its kernel.
inline void check_launch(const char* kernel, const char* op, const Context& ctx) {
  cuda_check(cudaGetLastError(), kernel, op);
  if (ctx.debug_sync) cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.cuda_stream)), kernel, op);
}

#define DETOPS_GRID_STRIDE(i, n)                                                                  \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

}  // namespace internal
}  // namespace detops
