// The seam between host code and the CUDA runtime: implemented by cuda/runtime.cu when the CUDA
// backend is built, and by src/cuda_stub.cpp (throwing ErrorCode::kNotCompiled) otherwise.
#pragma once

#include <cstddef>
#include <string>

#include "detops/tensor.h"

namespace detops {
namespace internal {

bool cuda_backend_compiled();
/// Visible devices; 0 when none or when the runtime fails, and then `why` (when given) says which.
int cuda_devices(std::string* why = nullptr);
/// Synchronous allocation and free (for Tensor); a failure is kOutOfMemory naming `op`.
void* cuda_malloc(std::size_t bytes, Device d, const char* op);
void cuda_free(void* p, Device d) noexcept;
/// Stream-ordered allocation and free (for workspace).
void* cuda_malloc_async(std::size_t bytes, Device d, void* stream);
void cuda_free_async(void* p, Device d, void* stream) noexcept;
/// Synchronous copy between any two devices (host <-> device or device <-> device).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes);
/// Copy ordered on `stream` (device memory on either side; host memory should be pinned for
/// the copy to be asynchronous, pageable memory works too).
void copy_bytes_async(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes, void* stream);
void cuda_memset(void* p, int value, std::size_t bytes, Device d);
/// Waits for the work queued on `stream` (one-time conversions that read device data on the host).
void cuda_stream_synchronize(Device d, void* stream);

}  // namespace internal
}  // namespace detops
