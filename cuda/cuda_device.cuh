// The CUDA binding of the device interface (src/internal/device_steps.h): launches of one generic
// kernel over a step's body, CUB's sort, run-length encode and scan with their temporary-storage
// queries, memsets; everything on the caller's stream, every status checked, nothing waits.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <cstddef>
#include <cstdint>

#include "atomic_add.cuh"
#include "cuda_check.cuh"
#include "detops/context.h"
#include "internal/device_steps.h"

namespace detops {
namespace internal {

/// The one kernel of the step sequences: body(t) over a grid-stride loop. Its bodies are the
/// functors of the shared step headers, which the emulated device runs on the CPU.
template <class Body>
__global__ void run_body_kernel(Body body, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) body(t);
}

/// The atomic modes' add: an atomicAdd into base[offset], rounded as the anchors round.
template <class T>
struct CudaAtomicAdd {
  T* base;
  __device__ void operator()(std::int64_t offset, acc_t<T> v) const { atomic_add(base + offset, v); }
};

/// The roi checks' integer atomics: the smallest bad row, and per-image sample counts.
struct CudaAtomicMinU64 {
  unsigned long long* p;
  __device__ void operator()(std::int64_t v) const { atomicMin(p, static_cast<unsigned long long>(v)); }
};
struct CudaAtomicAddI64 {
  std::int64_t* base;
  __device__ void operator()(std::int64_t i, std::int64_t v) const {
    atomicAdd(reinterpret_cast<unsigned long long*>(base + i), static_cast<unsigned long long>(v));
  }
};

struct CudaDevice {
  const Context& ctx;
  const char* op;

  template <class T>
  using Add = CudaAtomicAdd<T>;
  using MinU64 = CudaAtomicMinU64;
  using AddI64 = CudaAtomicAddI64;

  template <class Body>
  void launch(const char* name, std::int64_t n, const Body& body) const {
    if (n <= 0) return;
    run_body_kernel<Body><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(body, n);
    check_launch(name, op, ctx);
  }
  void zero(void* p, std::size_t bytes) const {
    if (bytes > 0) DETOPS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_of(ctx)), op);
  }

  std::size_t sort_pairs_bytes(std::int64_t n, int end_bit) const {
    std::size_t bytes = 0;
    DETOPS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
                                                      static_cast<std::uint64_t*>(nullptr),
                                                      static_cast<const std::int64_t*>(nullptr),
                                                      static_cast<std::int64_t*>(nullptr), n, 0, end_bit),
                      op);
    return bytes;
  }
  void sort_pairs(void* temp, std::size_t bytes, const std::uint64_t* keys_in, std::uint64_t* keys_out,
                  const std::int64_t* ids_in, std::int64_t* ids_out, std::int64_t n, int end_bit) const {
    DETOPS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, ids_in, ids_out, n, 0, end_bit,
                                                      stream_of(ctx)),
                      op);
  }

  std::size_t run_length_encode_bytes(std::int64_t n) const {
    std::size_t bytes = 0;
    DETOPS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
                                                         static_cast<std::uint64_t*>(nullptr),
                                                         static_cast<std::int64_t*>(nullptr),
                                                         static_cast<std::int64_t*>(nullptr), static_cast<int>(n)),
                      op);
    return bytes;
  }
  void run_length_encode(void* temp, std::size_t bytes, const std::uint64_t* in, std::uint64_t* unique,
                         std::int64_t* counts, std::int64_t* num_runs, std::int64_t n) const {
    DETOPS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, bytes, in, unique, counts, num_runs, static_cast<int>(n),
                                                         stream_of(ctx)),
                      op);
  }

  std::size_t exclusive_sum_bytes(std::int64_t n) const {
    std::size_t bytes = 0;
    DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const std::int64_t*>(nullptr),
                                                    static_cast<std::int64_t*>(nullptr), n),
                      op);
    return bytes;
  }
  void exclusive_sum(void* temp, std::size_t bytes, const std::int64_t* in, std::int64_t* out, std::int64_t n) const {
    DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, n, stream_of(ctx)), op);
  }

  std::size_t reduce_sum_bytes(std::int64_t n) const {
    std::size_t bytes = 0;
    DETOPS_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, bytes, static_cast<const std::int64_t*>(nullptr),
                                             static_cast<std::int64_t*>(nullptr), n),
                      op);
    return bytes;
  }
  void reduce_sum(void* temp, std::size_t bytes, const std::int64_t* in, std::int64_t* out, std::int64_t n) const {
    DETOPS_CUDA_CHECK(cub::DeviceReduce::Sum(temp, bytes, in, out, n, stream_of(ctx)), op);
  }
  std::size_t reduce_max_bytes(std::int64_t n) const {
    std::size_t bytes = 0;
    DETOPS_CUDA_CHECK(cub::DeviceReduce::Max(nullptr, bytes, static_cast<const std::int64_t*>(nullptr),
                                             static_cast<std::int64_t*>(nullptr), n),
                      op);
    return bytes;
  }
  void reduce_max(void* temp, std::size_t bytes, const std::int64_t* in, std::int64_t* out, std::int64_t n) const {
    DETOPS_CUDA_CHECK(cub::DeviceReduce::Max(temp, bytes, in, out, n, stream_of(ctx)), op);
  }

  void copy_to_device(void* dst, const void* src, std::size_t bytes) const {
    if (bytes > 0) DETOPS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(ctx)), op);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) const {
    if (bytes > 0) DETOPS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(ctx)), op);
  }
  void wait() const { DETOPS_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)), op); }
};

}  // namespace internal
}  // namespace detops
