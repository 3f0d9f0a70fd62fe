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

/// The same, compiled for two resident blocks per SM (bodies that keep many values in registers:
/// SyncBatchNorm's NHWC chunk reductions).
template <class Body>
__global__ void __launch_bounds__(kBlock, 2) run_body_occupied_kernel(Body body, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) body(t);
}

/// The thread group of the device (the interface of detail/sync_batch_norm_kernels.h's warp and
/// block bodies): the calling thread; butterfly = __shfl_xor_sync over a warp, sync =
/// __syncthreads, shared<V, N>() one __shared__ array per (V, N) per block.
constexpr int kWarpLanes = 32;
__device__ __forceinline__ double shfl_xor(double v, int off) { return __shfl_xor_sync(0xffffffffu, v, off); }
__device__ __forceinline__ __int128 shfl_xor(__int128 v, int off) {
  const auto u = static_cast<unsigned __int128>(v);
  unsigned long long lo = static_cast<unsigned long long>(u);
  unsigned long long hi = static_cast<unsigned long long>(u >> 64);
  lo = __shfl_xor_sync(0xffffffffu, lo, off);
  hi = __shfl_xor_sync(0xffffffffu, hi, off);
  return static_cast<__int128>((static_cast<unsigned __int128>(hi) << 64) | static_cast<unsigned __int128>(lo));
}
struct DeviceThread {
  static constexpr int kRun = 1;
  __device__ int thread(int) const { return static_cast<int>(threadIdx.x); }
  __device__ int lane(int) const { return static_cast<int>(threadIdx.x % kWarpLanes); }
  __device__ std::int64_t block() const { return blockIdx.x; }
  __device__ std::int64_t blocks() const { return gridDim.x; }
  __device__ int threads() const { return static_cast<int>(blockDim.x); }
  template <class V, class Op>
  __device__ void butterfly(V* v, Op op) const {
#pragma unroll
    for (int off = kWarpLanes / 2; off >= 1; off /= 2) v[0] = op(v[0], shfl_xor(v[0], off));
  }
  __device__ void sync() const { __syncthreads(); }
  template <class V, int N>
  __device__ V* shared() const {
    __shared__ V s[N];
    return s;
  }
};

/// A group body over a grid of blocks of kBlock threads: body(the calling thread's group).
template <class Body>
__global__ void run_group_kernel(Body body) {
  body(DeviceThread{});
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

/// SyncBatchNorm's exponents: an integer maximum, order-independent.
struct CudaAtomicMaxI64 {
  __device__ void operator()(std::int64_t* p, std::int64_t v) const {
    atomicMax(reinterpret_cast<long long*>(p), static_cast<long long>(v));
  }
};

struct CudaDevice {
  const Context& ctx;
  const char* op;

  template <class T>
  using Add = CudaAtomicAdd<T>;
  using MinU64 = CudaAtomicMinU64;
  using AddI64 = CudaAtomicAddI64;
  using MaxI64 = CudaAtomicMaxI64;

  template <class Body>
  void launch(const char* name, std::int64_t n, const Body& body) const {
    if (n <= 0) return;
    run_body_kernel<Body><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(body, n);
    check_launch(name, op, ctx);
  }
  template <class Body>
  void launch_occupied(const char* name, std::int64_t n, const Body& body) const {
    if (n <= 0) return;
    run_body_occupied_kernel<Body><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(body, n);
    check_launch(name, op, ctx);
  }
  /// body(group) on every thread of `blocks` blocks of kBlock threads (warp bodies and block
  /// bodies alike: the group is the calling thread).
  template <class Body>
  void launch_warps(const char* name, unsigned blocks, const Body& body) const {
    launch_groups(name, blocks, body);
  }
  template <class Body>
  void launch_blocks(const char* name, unsigned blocks, const Body& body) const {
    launch_groups(name, blocks, body);
  }
  template <class Body>
  void launch_groups(const char* name, unsigned blocks, const Body& body) const {
    if (blocks == 0) return;
    run_group_kernel<Body><<<blocks, kBlock, 0, stream_of(ctx)>>>(body);
    check_launch(name, op, ctx);
  }
  void zero(void* p, std::size_t bytes) const {
    if (bytes > 0) DETOPS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_of(ctx)), op);
  }

  std::size_t sort_pairs_bytes(std::int64_t n, int end_bit) const {
    std::size_t bytes = 0;
    DETOPS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const detail::GatherKey*>(nullptr),
                                                      static_cast<detail::GatherKey*>(nullptr),
                                                      static_cast<const detail::GatherIndex*>(nullptr),
                                                      static_cast<detail::GatherIndex*>(nullptr), n, 0, end_bit),
                      op);
    return bytes;
  }
  void sort_pairs(void* temp, std::size_t bytes, const detail::GatherKey* keys_in, detail::GatherKey* keys_out,
                  const detail::GatherIndex* ids_in, detail::GatherIndex* ids_out, std::int64_t n, int end_bit) const {
    DETOPS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, ids_in, ids_out, n, 0, end_bit,
                                                      stream_of(ctx)),
                      op);
  }

  std::size_t run_length_encode_bytes(std::int64_t n) const {
    std::size_t bytes = 0;
    DETOPS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, bytes, static_cast<const detail::GatherKey*>(nullptr),
                                                         static_cast<detail::GatherKey*>(nullptr),
                                                         static_cast<detail::GatherIndex*>(nullptr),
                                                         static_cast<detail::GatherIndex*>(nullptr), static_cast<int>(n)),
                      op);
    return bytes;
  }
  void run_length_encode(void* temp, std::size_t bytes, const detail::GatherKey* in, detail::GatherKey* unique,
                         detail::GatherIndex* counts, detail::GatherIndex* num_runs, std::int64_t n) const {
    DETOPS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, bytes, in, unique, counts, num_runs, static_cast<int>(n),
                                                         stream_of(ctx)),
                      op);
  }

  /// Enough for an exclusive_sum of n items of either type (int64 counts, the engine's int32 run
  /// lengths).
  std::size_t exclusive_sum_bytes(std::int64_t n) const {
    std::size_t wide = 0, narrow = 0;
    DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, wide, static_cast<const std::int64_t*>(nullptr),
                                                    static_cast<std::int64_t*>(nullptr), n),
                      op);
    DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, narrow, static_cast<const detail::GatherIndex*>(nullptr),
                                                    static_cast<detail::GatherIndex*>(nullptr), n),
                      op);
    return std::max(wide, narrow);
  }
  template <class I>
  void exclusive_sum(void* temp, std::size_t bytes, const I* in, I* out, std::int64_t n) const {
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
