// The CUDA side of the gather-backward engine (include/detops/detail/gather_backward.h): its
// device workspace, phase 2 (CUB's stable radix sort over the key bits in use, the permutation,
// CUB's run-length encode and an exclusive scan for the run offsets) and phase 3 (one thread per
// (run, channel), the shared gather_run_element body). Everything is enqueued on the caller's
// stream; the run count stays on the device (phase 3 reads it there), so nothing waits.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda_check.cuh"
#include "detops/detail/gather_backward.h"
#include "internal/common.h"

namespace detops {
namespace internal {
namespace gather_cuda {

template <class A>
__global__ void init_records_kernel(detail::GatherRecords<A> rec, std::int64_t n, std::uint64_t sentinel) {
  DETOPS_GRID_STRIDE(j, n) detail::gather_init_record(j, rec, sentinel);
}

template <class A>
__global__ void permute_records_kernel(const std::int64_t* sorted_ids, const A* weights, const std::int64_t* sources,
                                       A* sorted_weights, std::int64_t* sorted_sources, std::int64_t n) {
  DETOPS_GRID_STRIDE(r, n) detail::gather_permute_record(r, sorted_ids, weights, sources, sorted_weights, sorted_sources);
}

template <class T, class A, class U, class Target, class Active>
__global__ void run_sums_kernel(detail::GatherSumArgs<T, A, U> a, const std::int64_t* num_runs, bool channels_fastest,
                                Target target, Active active) {
  // *num_runs: written on the device by CUB's run-length encode (the host never learns it)
  DETOPS_GRID_STRIDE(t, *num_runs * a.C) detail::gather_run_element(t, a, *num_runs, channels_fastest, target, active);
}

}  // namespace gather_cuda

/// The device arrays of one chunk of up to `cap` records.
template <class A>
struct GatherCudaBuffers {
  detail::GatherRecords<A> records{};  // phase 1 writes these
  std::uint64_t* sorted_keys = nullptr;
  std::int64_t* sorted_ids = nullptr;
  A* sorted_weights = nullptr;
  std::int64_t* sorted_sources = nullptr;
  std::uint64_t* run_keys = nullptr;
  std::int64_t* run_offsets = nullptr;
  std::int64_t* run_lengths = nullptr;
  std::int64_t* num_runs = nullptr;
  void* temp = nullptr;
  std::size_t temp_bytes = 0;
};

/// CUB counts run-length-encoded items in int: one chunk holds at most 2^31 - 1 records.
inline void gather_check_records(std::int64_t cap, const char* op) {
  if (cap > std::numeric_limits<int>::max())
    fail(ErrorCode::kOutOfMemory, "{}: the exact mode needs {} records in one chunk here; at most 2^31 - 1 are supported",
         op, cap);
}

/// CUB's temporary bytes for phase 2 over `cap` records with keys in [0, sentinel].
inline std::size_t gather_cuda_temp_bytes(std::int64_t cap, std::uint64_t sentinel, const char* op) {
  gather_check_records(cap, op);
  std::size_t sort = 0, rle = 0, scan = 0;
  DETOPS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const std::uint64_t*>(nullptr),
                                                    static_cast<std::uint64_t*>(nullptr),
                                                    static_cast<const std::int64_t*>(nullptr),
                                                    static_cast<std::int64_t*>(nullptr), cap, 0,
                                                    detail::gather_key_bits(sentinel)),
                    op);
  DETOPS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle, static_cast<const std::uint64_t*>(nullptr),
                                                       static_cast<std::uint64_t*>(nullptr),
                                                       static_cast<std::int64_t*>(nullptr),
                                                       static_cast<std::int64_t*>(nullptr), static_cast<int>(cap)),
                    op);
  DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const std::int64_t*>(nullptr),
                                                  static_cast<std::int64_t*>(nullptr), cap),
                    op);
  return std::max({sort, rle, scan, std::size_t{1}});
}

/// Sizes the arrays in `l` (take them back with take_gather_cuda after bind, same arguments).
template <class A>
void add_gather_cuda(WorkspaceLayout& l, std::int64_t cap, std::size_t temp_bytes) {
  l.add<std::uint64_t>(cap);
  l.add<std::int64_t>(cap);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::uint64_t>(cap);
  l.add<std::int64_t>(cap);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::uint64_t>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(1);
  l.add_bytes(temp_bytes);
}
template <class A>
GatherCudaBuffers<A> take_gather_cuda(WorkspaceLayout& l, std::size_t temp_bytes) {
  GatherCudaBuffers<A> b;
  b.records.keys = l.take<std::uint64_t>();
  b.records.ids = l.take<std::int64_t>();
  b.records.weights = l.take<A>();
  b.records.sources = l.take<std::int64_t>();
  b.sorted_keys = l.take<std::uint64_t>();
  b.sorted_ids = l.take<std::int64_t>();
  b.sorted_weights = l.take<A>();
  b.sorted_sources = l.take<std::int64_t>();
  b.run_keys = l.take<std::uint64_t>();
  b.run_offsets = l.take<std::int64_t>();
  b.run_lengths = l.take<std::int64_t>();
  b.num_runs = l.take<std::int64_t>();
  b.temp = l.take<unsigned char>();
  b.temp_bytes = temp_bytes;
  return b;
}

/// Before phase 1: every record of [0, n) set to the sentinel.
template <class A>
void gather_init_cuda(const GatherCudaBuffers<A>& b, std::int64_t n, std::uint64_t sentinel, const Context& ctx,
                      const char* op) {
  if (n <= 0) return;
  gather_cuda::init_records_kernel<A><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(b.records, n, sentinel);
  check_launch("init_records_kernel", op, ctx);
}

/// Phase 2 over records [0, n) with keys in [0, sentinel]; the run count lands in *b.num_runs on
/// the device. Returns the sorted view phase 3 reads.
template <class A>
detail::GatherSorted<A> gather_sort_cuda(const GatherCudaBuffers<A>& b, std::int64_t n, std::uint64_t sentinel,
                                         const Context& ctx, const char* op) {
  cudaStream_t stream = stream_of(ctx);
  gather_check_records(n, op);
  std::size_t tb = b.temp_bytes;
  DETOPS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(b.temp, tb, b.records.keys, b.sorted_keys, b.records.ids,
                                                    b.sorted_ids, n, 0, detail::gather_key_bits(sentinel), stream),
                    op);
  gather_cuda::permute_records_kernel<A><<<grid_for(n), kBlock, 0, stream>>>(
      b.sorted_ids, b.records.weights, b.records.sources, b.sorted_weights, b.sorted_sources, n);
  check_launch("permute_records_kernel", op, ctx);
  DETOPS_CUDA_CHECK(cudaMemsetAsync(b.run_lengths, 0, static_cast<std::size_t>(n) * sizeof(std::int64_t), stream), op);
  tb = b.temp_bytes;
  DETOPS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(b.temp, tb, b.sorted_keys, b.run_keys, b.run_lengths, b.num_runs,
                                                       static_cast<int>(n), stream),
                    op);
  tb = b.temp_bytes;
  DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(b.temp, tb, b.run_lengths, b.run_offsets, n, stream), op);
  return {b.run_keys, b.run_offsets, b.run_lengths, b.sorted_weights, b.sorted_sources};
}

/// Phase 3: launches one thread per (run, channel) for up to `max_runs` runs (the device count
/// decides how many do work). The sentinel's run, when present, writes nothing.
template <class T, class A, class U, class Target, class Active = detail::GatherAllActive>
void gather_sum_cuda(const detail::GatherSumArgs<T, A, U>& a, const std::int64_t* num_runs, std::int64_t max_runs,
                     bool channels_fastest, const Target& target, const Context& ctx, const char* op,
                     const Active& active = Active{}) {
  if (max_runs <= 0 || a.C <= 0) return;
  gather_cuda::run_sums_kernel<T, A, U, Target, Active>
      <<<grid_for(max_runs * a.C), kBlock, 0, stream_of(ctx)>>>(a, num_runs, channels_fastest, target, active);
  check_launch("run_sums_kernel", op, ctx);
}

}  // namespace internal
}  // namespace detops
