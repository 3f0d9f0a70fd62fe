// Execution context of a detops call: CPU thread count, CUDA stream, workspace allocator, and
// the process-wide defaults a caller may change. Nothing here is hidden global state: every op
// takes a Context, and the defaults are only read when a field is left at its "default" value.
#pragma once

#include <cstddef>
#include <string>

#include "detops/tensor.h"

namespace detops {

/// Allocates workspace for the modes that need it. CUDA allocations must be stream-ordered
/// (cudaMallocAsync semantics): the memory may be used by work enqueued on `stream` after the
/// call, and is released with free() on the same stream.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes, Device device, void* stream) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, Device device, void* stream) = 0;
};

/// The built-in allocator: operator new on the CPU, cudaMallocAsync/cudaFreeAsync on CUDA.
Allocator& default_allocator();

/// Caller-provided scratch memory (see each op's *_workspace_size()).
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

/// Vector instruction sets the CPU kernels are compiled for (x86-64; other CPUs have only
/// kBaseline). The kernels that have variants (SyncBatchNorm's loops, RoIAlign's channels-last
/// loops, grid_sample's float32 bilinear forward) are compiled once per set and chosen at run
/// time, and FrozenBatchNorm2d converts float16 with F16C from kAvx2 on; every variant gives the
/// same bits (IEEE operations in the same order, fused into an FMA only where the math calls
/// fma(), the same roundings; the tests compare them bit for bit), so the choice only changes
/// speed.
enum class CpuIsa : int {
  kAuto = 0,      ///< the widest set this CPU and OS support
  kBaseline = 1,  ///< the build's baseline (x86-64: SSE2)
  kAvx2 = 2,      ///< AVX2 and FMA
  kAvx512 = 3,    ///< AVX-512 F/VL/DQ/BW, and FMA
};

/// "auto", "baseline", "avx2", "avx512".
const char* cpu_isa_name(CpuIsa isa);
/// The widest set this CPU supports (and the build has variants for): never kAuto.
CpuIsa cpu_isa_supported();

struct Context {
  /// CPU worker threads; 0 = std::thread::hardware_concurrency(). A negative value is an error
  /// (see resolved_threads()); a larger value than max(64, 4 x hardware_concurrency()) is capped
  /// there (results never depend on the thread count), and each parallel loop uses no more
  /// threads than it has work items.
  int num_threads = 0;
  /// cudaStream_t to enqueue CUDA work on; nullptr = the legacy default stream. detops never
  /// synchronizes the device; see each op for the calls that wait on this stream.
  void* cuda_stream = nullptr;
  /// Workspace allocator used when the caller passes no Workspace; nullptr = default_allocator().
  Allocator* allocator = nullptr;
  /// Synchronize after each kernel launch and check for errors, so an asynchronous fault is
  /// reported by the op that caused it (debugging aid; slow).
  bool debug_sync = false;
  /// Widest vector instruction set the CPU kernels may use: a request wider than the CPU
  /// supports is lowered to what it supports (never an illegal instruction). For benchmarks and
  /// tests; the results do not depend on it.
  CpuIsa cpu_isa = CpuIsa::kAuto;

  /// Thread count this context resolves to (>= 1): num_threads, or the core count for 0, at most
  /// max(64, 4 x hardware_concurrency()). Throws Error (kInvalidArgument) when
  /// num_threads is negative. CPU ops call it when they resolve their thread
  /// count (CUDA ops never read num_threads).
  int resolved_threads() const;
  /// The instruction set the CPU kernels will use: min(cpu_isa, cpu_isa_supported()).
  CpuIsa resolved_cpu_isa() const;
};

/// Whether this build contains the CUDA backend, and how many devices are visible (0 if none).
bool cuda_compiled();
int cuda_device_count();
/// Why cuda_device_count() is 0: no CUDA backend in this build, the CUDA runtime's error (a
/// driver older than the toolkit, no driver at all), or no device; empty when a device is visible.
std::string cuda_unavailable_reason();

}  // namespace detops
