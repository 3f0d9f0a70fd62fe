// The CUDA side of the runtime seam (src/internal/runtime.h): allocation, copies, device count.
#include <cstring>

#include "cuda_check.cuh"
#include "internal/runtime.h"

namespace detops {
namespace internal {

bool cuda_backend_compiled() { return true; }

int cuda_devices(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    // e.g. cudaErrorInsufficientDriver: a driver older than the toolkit reads as "no device"
    if (why) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount found no device";
  return n;
}

namespace {
/// An allocation failure as kOutOfMemory naming the bytes and the device; other statuses as
/// cuda_check reports them.
void check_allocation(cudaError_t status, const char* call, const char* op, std::size_t bytes, Device d) {
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    fail(ErrorCode::kOutOfMemory, "{}: cannot allocate {} bytes on {}: {} failed: {} ({})", op, bytes, to_string(d),
         call, cudaGetErrorString(status), cudaGetErrorName(status));
  }
  cuda_check(status, call, op);
}
}  // namespace

void* cuda_malloc(std::size_t bytes, Device d, const char* op) {
  DeviceGuard guard(d.index, op);
  void* p = nullptr;
  check_allocation(cudaMalloc(&p, bytes), "cudaMalloc", op, bytes, d);
  return p;
}

void cuda_free(void* p, Device d) noexcept {
  if (!p) return;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  (void)cudaSetDevice(d.index);
  (void)cudaFree(p);
  (void)cudaSetDevice(prev);
}

void* cuda_malloc_async(std::size_t bytes, Device d, void* stream) {
  DeviceGuard guard(d.index, "workspace");
  void* p = nullptr;
  check_allocation(cudaMallocAsync(&p, bytes, static_cast<cudaStream_t>(stream)), "cudaMallocAsync", "workspace", bytes,
                   d);
  return p;
}

void cuda_free_async(void* p, Device d, void* stream) noexcept {
  if (!p) return;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  (void)cudaSetDevice(d.index);
  (void)cudaFreeAsync(p, static_cast<cudaStream_t>(stream));
  (void)cudaSetDevice(prev);
}

void copy_bytes(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  if (!bytes) return;
  if (dd.is_cpu() && sd.is_cpu()) {  // no CUDA runtime involved (works without a driver)
    std::memcpy(dst, src, bytes);
    return;
  }
  const int index = dd.is_cuda() ? dd.index : sd.index;
  DeviceGuard guard(index, "copy");
  DETOPS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "copy");
  // A pageable host-to-device cudaMemcpy may return before the DMA lands; wait, so work on any
  // stream (including non-blocking ones) sees the data.
  if (dd.is_cuda()) DETOPS_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy), "copy");
}

void copy_bytes_async(void* dst, Device dd, const void* src, Device sd, std::size_t bytes, void* stream) {
  if (!bytes) return;
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  DeviceGuard guard(dd.is_cuda() ? dd.index : sd.index, "copy");
  DETOPS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)), "copy");
}

void cuda_stream_synchronize(Device d, void* stream) {
  DeviceGuard guard(d.index, "synchronize");
  DETOPS_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "synchronize");
}

void cuda_memset(void* p, int value, std::size_t bytes, Device d) {
  DeviceGuard guard(d.index, "memset");
  DETOPS_CUDA_CHECK(cudaMemset(p, value, bytes), "memset");
  // cudaMemset is queued on the legacy default stream, which a non-blocking stream does not wait
  // for: wait here (as copy_bytes does), so Tensor::zeros / fill_bytes are complete on return and
  // work on any stream sees the bytes.
  DETOPS_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy), "memset");
}

}  // namespace internal
}  // namespace detops
