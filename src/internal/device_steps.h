// The device interface the CUDA backend's step sequences are written over, and the steps every op
// shares (the zero fill, the gather engine's phases 2 and 3). A step sequence is written once as
// templates over a device `dev`; cuda/cuda_device.cuh binds it to CUDA and CUB on the caller's
// stream, tests/emulated_device.h to an emulated grid and CPU stand-ins with CUB's contracts. So
// launch arguments, grid sizes, sort keys and bit ranges, buffer carving and zero fills are the
// very code the GPU runs, and a CPU test runs them (issue 28).
//
// A device offers (every call enqueued in order; nothing waits):
//   dev.op                                     the op's name, for messages
//   dev.launch(name, n, body)                  body(t) for every t in [0, n); nothing for n <= 0.
//                                              body: a copyable functor with a DETOPS_HOST_DEVICE
//                                              operator()(std::int64_t) const
//   dev.zero(p, bytes)                         bytes of p set to 0
//   dev.sort_pairs_bytes(n, end_bit)           temporary bytes of sort_pairs over n items
//   dev.sort_pairs(temp, bytes, keys_in, keys_out, ids_in, ids_out, n, end_bit)
//                                              stable radix sort of (key, id) by key bits
//                                              [0, end_bit) (cub::DeviceRadixSort::SortPairs)
//   dev.run_length_encode_bytes(n), dev.run_length_encode(temp, bytes, in, unique, counts,
//                                              num_runs, n): runs of equal keys; the count lands
//                                              in *num_runs on the device
//                                              (cub::DeviceRunLengthEncode::Encode)
//   dev.exclusive_sum_bytes(n), dev.exclusive_sum(temp, bytes, in, out, n)
//                                              (cub::DeviceScan::ExclusiveSum)
//   dev.reduce_sum_bytes(n), dev.reduce_sum(temp, bytes, in, out, n), and reduce_max likewise:
//                                              int64 reductions into *out on the device
//                                              (cub::DeviceReduce::Sum / Max)
//   dev.copy_to_device(dst, src, bytes), dev.copy_to_host(dst, src, bytes), dev.wait()
//                                              stream-ordered copies; wait() blocks the host until
//                                              the work enqueued so far is done
//   dev.ctx                                    the call's Context (scratch memory comes from it)
//   Dev::Add<T>{T* base}                       the atomic mode's add: add(offset, acc_t<T> v)
//                                              adds v into base[offset] (atomicAdd on CUDA)
//   Dev::MinU64{unsigned long long* p}         min(v): *p = min(*p, v), order-independent
//   Dev::AddI64{std::int64_t* base}            add(i, v): base[i] += v, order-independent
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "detops/detail/gather_backward.h"
#include "detops/detail/host_device.h"
#include "detops/detail/strided.h"
#include "detops/tensor.h"
#include "internal/common.h"
#include "internal/gather_limits.h"

namespace detops {
namespace internal {

// ---------------------------------------------------------------------------------------------
// The zero fill every backward starts with

/// One element of a strided 4-d view set to 0 (gaps keep their bytes).
template <class T>
struct FillZeroBody {
  T* p;
  detail::Strides4 st;
  std::int64_t C, H, W;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::fill_zero_element(i, p, st, C, H, W); }
};

/// A dense view (contiguous NCHW or NHWC with no gaps) can be zeroed with one memset.
inline bool is_dense(const TensorView& v) {
  return v.span_bytes() == v.numel() * static_cast<std::int64_t>(dtype_size(v.dtype));
}

/// Every element of a strided 4-d view of T set to 0: one memset when it is dense, otherwise one
/// thread per element.
template <class T, class Dev>
void zero_fill(const Dev& dev, const TensorView& v) {
  const std::int64_t n = v.numel();
  if (n == 0) return;
  if (is_dense(v)) {
    dev.zero(v.data, static_cast<std::size_t>(n) * sizeof(T));
    return;
  }
  dev.launch("fill_zero", n,
             FillZeroBody<T>{static_cast<T*>(v.data), {v.strides[0], v.strides[1], v.strides[2], v.strides[3]},
                             v.sizes[1], v.sizes[2], v.sizes[3]});
}

// ---------------------------------------------------------------------------------------------
// The gather engine's device half (include/detops/detail/gather_backward.h): phase 2 (the
// sort over the key bits in use, the permutation, the run-length encode and the scan for the run
// offsets) and phase 3 (one thread per (run, channel)). The run count stays on the device.

template <class A>
struct GatherInitBody {
  detail::GatherRecords<A> rec;
  detail::GatherKey sentinel;
  DETOPS_HOST_DEVICE void operator()(std::int64_t j) const { detail::gather_init_record(j, rec, sentinel); }
};

template <class A>
struct GatherPermuteBody {
  const detail::GatherIndex* sorted_ids;
  const A* weights;
  const std::int64_t* sources;
  A* sorted_weights;
  std::int64_t* sorted_sources;
  DETOPS_HOST_DEVICE void operator()(std::int64_t r) const {
    detail::gather_permute_record(r, sorted_ids, weights, sources, sorted_weights, sorted_sources);
  }
};

/// Phase 3 over up to max_runs * C threads; *num_runs (written by the run-length encode on the
/// device) decides which do work.
template <class T, class A, class U, class Target, class Active>
struct GatherRunSumsBody {
  detail::GatherSumArgs<T, A, U> a;
  const detail::GatherIndex* num_runs;
  bool channels_fastest;
  Target target;
  Active active;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    const std::int64_t runs = *num_runs;
    if (t < runs * a.C) detail::gather_run_element(t, a, runs, channels_fastest, target, active);
  }
};

/// The device arrays of one chunk of up to `cap` records.
template <class A>
struct GatherDeviceBuffers {
  detail::GatherRecords<A> records{};  // phase 1 writes these
  detail::GatherKey* sorted_keys = nullptr;
  detail::GatherIndex* sorted_ids = nullptr;
  A* sorted_weights = nullptr;
  std::int64_t* sorted_sources = nullptr;
  detail::GatherKey* run_keys = nullptr;
  detail::GatherIndex* run_offsets = nullptr;
  detail::GatherIndex* run_lengths = nullptr;
  detail::GatherIndex* num_runs = nullptr;
  void* temp = nullptr;
  std::size_t temp_bytes = 0;
};

/// Temporary bytes of phase 2 over `cap` records with keys in [0, sentinel] (checked against the
/// engine's limits here: every op sizes its workspace through this before writing anything).
template <class Dev>
std::size_t gather_temp_bytes(const Dev& dev, std::int64_t cap, std::int64_t sentinel) {
  gather_check_chunk(dev.op, cap, sentinel);
  return std::max({dev.sort_pairs_bytes(cap, detail::gather_key_bits(sentinel)), dev.run_length_encode_bytes(cap),
                   dev.exclusive_sum_bytes(cap), std::size_t{1}});
}

/// Sizes the arrays in `l` (take them back with take_gather after bind, same arguments).
template <class A>
void add_gather(WorkspaceLayout& l, std::int64_t cap, std::size_t temp_bytes) {
  l.add<detail::GatherKey>(cap);
  l.add<detail::GatherIndex>(cap);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<detail::GatherKey>(cap);
  l.add<detail::GatherIndex>(cap);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<detail::GatherKey>(cap);
  l.add<detail::GatherIndex>(cap);
  l.add<detail::GatherIndex>(cap);
  l.add<detail::GatherIndex>(1);
  l.add_bytes(temp_bytes);
}
template <class A>
GatherDeviceBuffers<A> take_gather(WorkspaceLayout& l, std::size_t temp_bytes) {
  GatherDeviceBuffers<A> b;
  b.records.keys = l.take<detail::GatherKey>();
  b.records.ids = l.take<detail::GatherIndex>();
  b.records.weights = l.take<A>();
  b.records.sources = l.take<std::int64_t>();
  b.sorted_keys = l.take<detail::GatherKey>();
  b.sorted_ids = l.take<detail::GatherIndex>();
  b.sorted_weights = l.take<A>();
  b.sorted_sources = l.take<std::int64_t>();
  b.run_keys = l.take<detail::GatherKey>();
  b.run_offsets = l.take<detail::GatherIndex>();
  b.run_lengths = l.take<detail::GatherIndex>();
  b.num_runs = l.take<detail::GatherIndex>();
  b.temp = l.take<unsigned char>();
  b.temp_bytes = temp_bytes;
  return b;
}

/// Before phase 1: every record of [0, n) set to the sentinel.
template <class A, class Dev>
void gather_init(const Dev& dev, const GatherDeviceBuffers<A>& b, std::int64_t n, detail::GatherKey sentinel) {
  dev.launch("gather_init_records", n, GatherInitBody<A>{b.records, sentinel});
}

/// Phase 2 over records [0, n) with keys in [0, sentinel]; the run count lands in *b.num_runs on
/// the device. Returns the sorted view phase 3 reads.
template <class A, class Dev>
detail::GatherSorted<A> gather_sort(const Dev& dev, const GatherDeviceBuffers<A>& b, std::int64_t n,
                                    detail::GatherKey sentinel) {
  gather_check_chunk(dev.op, n, sentinel);
  dev.sort_pairs(b.temp, b.temp_bytes, b.records.keys, b.sorted_keys, b.records.ids, b.sorted_ids, n,
                 detail::gather_key_bits(sentinel));
  dev.launch("gather_permute_records", n,
             GatherPermuteBody<A>{b.sorted_ids, b.records.weights, b.records.sources, b.sorted_weights,
                                  b.sorted_sources});
  dev.zero(b.run_lengths, static_cast<std::size_t>(n) * sizeof(detail::GatherIndex));
  dev.run_length_encode(b.temp, b.temp_bytes, b.sorted_keys, b.run_keys, b.run_lengths, b.num_runs, n);
  dev.exclusive_sum(b.temp, b.temp_bytes, b.run_lengths, b.run_offsets, n);
  return {b.run_keys, b.run_offsets, b.run_lengths, b.sorted_weights, b.sorted_sources};
}

/// Phase 3: one thread per (run, channel) for up to `max_runs` runs (the device count decides how
/// many do work). The sentinel's run, when present, writes nothing.
template <class T, class A, class U, class Target, class Active = detail::GatherAllActive, class Dev>
void gather_sum(const Dev& dev, const detail::GatherSumArgs<T, A, U>& a, const detail::GatherIndex* num_runs,
                std::int64_t max_runs, bool channels_fastest, const Target& target, const Active& active = Active{}) {
  if (max_runs <= 0 || a.C <= 0) return;
  dev.launch("gather_run_sums", max_runs * a.C,
             GatherRunSumsBody<T, A, U, Target, Active>{a, num_runs, channels_fastest, target, active});
}

}  // namespace internal
}  // namespace detops
