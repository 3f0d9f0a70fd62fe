// Context defaults and the built-in workspace allocator.
#include "detops/context.h"

#include <algorithm>
#include <new>
#include <thread>

#include "internal/common.h"
#include "internal/cpu_isa.h"
#include "internal/runtime.h"

namespace detops {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

namespace {
CpuIsa detect_cpu_isa() {
#if DETOPS_X86_ISA_VARIANTS
  // libgcc / compiler-rt check the OS state too (XCR0: ymm and zmm registers saved)
  __builtin_cpu_init();
  // (the variants' sets, internal/cpu_isa.h: FMA with both)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return CpuIsa::kBaseline;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
    return CpuIsa::kAvx512;
  return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}
}  // namespace

CpuIsa cpu_isa_supported() {
  static const CpuIsa isa = detect_cpu_isa();  // a property of the machine, read once
  return isa;
}

CpuIsa Context::resolved_cpu_isa() const {
  const CpuIsa best = cpu_isa_supported();
  const int want = static_cast<int>(cpu_isa);
  if (cpu_isa == CpuIsa::kAuto || want > static_cast<int>(best)) return best;
  if (want < static_cast<int>(CpuIsa::kBaseline)) return CpuIsa::kBaseline;  // not an enumerator
  return cpu_isa;
}

namespace {
constexpr unsigned kMaxCores = 1u << 16;  // keeps kThreadsPerCore * cores within int
constexpr int kThreadsPerCore = 4;
constexpr int kMinThreadCap = 64;  // a floor, so that thread-count tests mean the same on small machines
}  // namespace

int Context::resolved_threads() const {
  if (num_threads < 0)
    internal::fail(ErrorCode::kInvalidArgument, "Context: num_threads is {}; expected 0 (all cores) or a positive count",
                   num_threads);
  const unsigned hc = std::thread::hardware_concurrency();
  const int cores = hc > 0 ? static_cast<int>(std::min(hc, kMaxCores)) : 1;
  if (num_threads == 0) return cores;
  // The one cap for every CPU op: threads beyond a few per core only cost (each is started per
  // parallel loop), and INT_MAX would have a loop try to start billions. Results do not depend
  // on the count (see context.h), so capping never changes a bit; parallel_for caps again at
  // the work items of each loop.
  return std::min(num_threads, std::max(kMinThreadCap, kThreadsPerCore * cores));
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
std::string cuda_unavailable_reason() {
  std::string why;
  return internal::cuda_devices(&why) > 0 ? std::string() : why;
}

}  // namespace detops
