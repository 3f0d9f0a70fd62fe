// The CUDA runtime seam (internal/runtime.h) in a CPU-only build: every call that needs a device
// reports that CUDA is not compiled. Ops need no stubs: backend_for() (internal/backend.h) refuses
// a CUDA tensor when the build has no CUDA backend table.
#include <cstring>

#include "internal/common.h"
#include "internal/runtime.h"

namespace detops {
namespace internal {

namespace {
[[noreturn]] void not_compiled(const char* what) {
  fail(ErrorCode::kNotCompiled, "{}: this build of detops has no CUDA backend (configure with DETOPS_CUDA=ON)", what);
}
}  // namespace

bool cuda_backend_compiled() { return false; }
int cuda_devices(std::string* why) {
  if (why) *why = "this build of detops has no CUDA backend (configure with DETOPS_CUDA=ON)";
  return 0;
}
void* cuda_malloc(std::size_t, Device, const char* op) { not_compiled(op); }
void cuda_free(void*, Device) noexcept {}
void* cuda_malloc_async(std::size_t, Device, void*) { not_compiled("cuda_malloc_async"); }
void cuda_free_async(void*, Device, void*) noexcept {}
void copy_bytes(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  if (!dd.is_cpu() || !sd.is_cpu()) not_compiled("copy_bytes");
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_bytes_async(void* dst, Device dd, const void* src, Device sd, std::size_t bytes, void*) {
  copy_bytes(dst, dd, src, sd, bytes);
}
void cuda_memset(void*, int, std::size_t, Device) { not_compiled("cuda_memset"); }
void cuda_stream_synchronize(Device, void*) { not_compiled("cuda_stream_synchronize"); }

}  // namespace internal
}  // namespace detops
