// The gather-backward engine on CUDA for the ops whose CUDA steps are not yet written over the
// device interface: the engine's device half (src/internal/device_steps.h) bound to CudaDevice
// (cuda/cuda_device.cuh) under its earlier names. Everything is enqueued on the caller's stream;
// the run count stays on the device (phase 3 reads it there), so nothing waits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_device.cuh"
#include "internal/device_steps.h"

namespace detops {
namespace internal {

template <class A>
using GatherCudaBuffers = GatherDeviceBuffers<A>;

/// CUB's temporary bytes for phase 2 over `cap` records with keys in [0, sentinel].
inline std::size_t gather_cuda_temp_bytes(std::int64_t cap, std::uint64_t sentinel, const char* op) {
  const Context ctx{};  // the queries enqueue nothing
  return gather_temp_bytes(CudaDevice{ctx, op}, cap, sentinel);
}

template <class A>
void add_gather_cuda(WorkspaceLayout& l, std::int64_t cap, std::size_t temp_bytes) {
  add_gather<A>(l, cap, temp_bytes);
}
template <class A>
GatherCudaBuffers<A> take_gather_cuda(WorkspaceLayout& l, std::size_t temp_bytes) {
  return take_gather<A>(l, temp_bytes);
}

template <class A>
void gather_init_cuda(const GatherCudaBuffers<A>& b, std::int64_t n, std::uint64_t sentinel, const Context& ctx,
                      const char* op) {
  gather_init(CudaDevice{ctx, op}, b, n, sentinel);
}

template <class A>
detail::GatherSorted<A> gather_sort_cuda(const GatherCudaBuffers<A>& b, std::int64_t n, std::uint64_t sentinel,
                                         const Context& ctx, const char* op) {
  return gather_sort(CudaDevice{ctx, op}, b, n, sentinel);
}

template <class T, class A, class U, class Target, class Active = detail::GatherAllActive>
void gather_sum_cuda(const detail::GatherSumArgs<T, A, U>& a, const std::int64_t* num_runs, std::int64_t max_runs,
                     bool channels_fastest, const Target& target, const Context& ctx, const char* op,
                     const Active& active = Active{}) {
  gather_sum(CudaDevice{ctx, op}, a, num_runs, max_runs, channels_fastest, target, active);
}

}  // namespace internal
}  // namespace detops
