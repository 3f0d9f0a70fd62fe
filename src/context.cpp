// Context defaults and the built-in workspace allocator.
#include "detops/context.h"

#include <new>
#include <thread>

#include "internal/common.h"
#include "internal/runtime.h"

namespace detops {

int Context::resolved_threads() const {
  if (num_threads > 0) return num_threads;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

namespace {
class DefaultAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device, void* stream) override {
    if (bytes == 0) return nullptr;
    if (device.is_cpu()) {
      void* p = ::operator new(bytes, std::align_val_t{256}, std::nothrow);
      if (!p) internal::fail(ErrorCode::kOutOfMemory, "workspace: cannot allocate {} bytes on the CPU", bytes);
      return p;
    }
    return internal::cuda_malloc_async(bytes, device, stream);
  }
  void deallocate(void* ptr, std::size_t, Device device, void* stream) override {
    if (!ptr) return;
    if (device.is_cpu()) ::operator delete(ptr, std::align_val_t{256});
    else internal::cuda_free_async(ptr, device, stream);
  }
};
}  // namespace

Allocator& default_allocator() {
  static DefaultAllocator instance;  // stateless
  return instance;
}

bool cuda_compiled() { return internal::cuda_backend_compiled(); }
int cuda_device_count() { return internal::cuda_devices(); }

}  // namespace detops
