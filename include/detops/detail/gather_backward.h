// The engine behind every exact-mode backward of a bilinear gather (RoIAlign, grid_sample,
// multi-scale deformable attention): the transpose of a gather is a scatter whose (destination,
// weight) pairs depend on the coordinates only, never on the channel. So an op enumerates them
// once per chunk of planes as records, in a canonical order of its own; the engine sorts the
// records stably by destination (a counting sort on the CPU, CUB's radix sort on CUDA), cuts them
// into runs of one destination, and sums each run for every channel in sorted order, one write
// per element. A run's sum is fixed by the canonical order alone, so every backend, thread count
// and launch shape gives the same bits.
//
// Phase 1 (the op's): records[j] = (key, weight, source) for j in [0, n): destination `key` in
// [0, positions) receives weight * upstream[source + c * upstream_c] for every channel c; the
// key `positions` (the sentinel) contributes nothing and sorts last.
// Phase 2 (the engine's, per backend): stable sort by key, permute weights and sources into
// sorted order, runs = (key, first sorted record, length), sentinel runs dropped or skipped.
// Phase 3 (the engine's bodies here): one (run, channel) per thread, gather_run_sum.
//
// Long runs: with split > 0 a run is summed in partials of `split` records, each from zero, and
// the partials are added in order; a run no longer than `split` is one partial, so its sum is
// the same as with split = 0 (RoIAlign's exact mode uses split = 0, its bits predate the engine).
#pragma once

#include <cstdint>

#include "detops/detail/host_device.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

/// A record's destination within its chunk (the sort's key): a chunk has fewer than 2^32
/// destinations (the sentinel included), so keys take 32 bits (internal::gather_check_chunk).
using GatherKey = std::uint32_t;
/// An index into a chunk's records or runs: a chunk has at most 2^31 - 1 records (CUB counts
/// runs in int), so the sort's payload, the run offsets and lengths take 32 bits.
using GatherIndex = std::int32_t;

/// One chunk's records in enumeration order (phase 1 writes them). `ids` is the sort's payload
/// on CUDA (j itself); the CPU sort writes a permutation instead and leaves it unused.
template <class A>
struct GatherRecords {
  GatherKey* keys;
  GatherIndex* ids;
  A* weights;
  std::int64_t* sources;
};

/// Sets record j to "no contribution" (keys = sentinel): records that phase 1 does not fill
/// (a skipped sample, an invalid row) are then fully defined and sort last.
template <class A>
DETOPS_HOST_DEVICE inline void gather_init_record(std::int64_t j, const GatherRecords<A>& rec,
                                                  GatherKey sentinel) {
  rec.keys[j] = sentinel;
  if (rec.ids) rec.ids[j] = static_cast<GatherIndex>(j);
  rec.weights[j] = A(0);
  rec.sources[j] = 0;
}

/// Stores record j.
template <class A>
DETOPS_HOST_DEVICE inline void gather_set_record(const GatherRecords<A>& rec, std::int64_t j, GatherKey key, A weight,
                                                 std::int64_t source) {
  rec.keys[j] = key;
  if (rec.ids) rec.ids[j] = static_cast<GatherIndex>(j);
  rec.weights[j] = weight;
  rec.sources[j] = source;
}

/// The records in sorted order, cut into runs of one destination.
template <class A>
struct GatherSorted {
  const GatherKey* run_keys;
  const GatherIndex* run_offsets;   // first sorted record of each run
  const GatherIndex* run_lengths;
  const A* weights;                 // sorted order
  const std::int64_t* sources;      // sorted order
};

/// Phase 2's permutation, one sorted record per thread: the r-th sorted record is record
/// sorted_ids[r].
template <class A>
DETOPS_HOST_DEVICE inline void gather_permute_record(std::int64_t r, const GatherIndex* sorted_ids, const A* weights,
                                                     const std::int64_t* sources, A* sorted_weights,
                                                     std::int64_t* sorted_sources) {
  const GatherIndex j = sorted_ids[r];
  sorted_weights[r] = weights[j];
  sorted_sources[r] = sources[j];
}

/// The partial length of the ops built on the engine (RoIAlign's exact mode keeps 0). At most
/// this many records are summed in a row before a partial is closed, which bounds the rounding
/// error's growth along a hot destination and lets a GPU split long runs without changing bits.
constexpr std::int64_t kGatherPartial = 256;

/// The records of one chunk an op aims for: it takes as many whole planes as fit in
/// max(one plane's records, kGatherChunkRecords), so the CPU workspace stays near 16 MB (at most
/// 32 bytes per record with float weights, plus the runs) however large the batch, and a larger
/// batch only means more chunks. A
/// chunk never splits a plane and a destination belongs to one plane, so chunking changes no sum.
constexpr std::int64_t kGatherChunkRecords = std::int64_t{1} << 19;

/// Every record contributes to every channel (the default); RoIAlign's max pooling passes a
/// predicate that keeps only a bin's winning sample.
struct GatherAllActive {
  DETOPS_HOST_DEVICE bool operator()(std::int64_t /*sorted record*/, std::int64_t /*channel*/) const { return true; }
};

/// Sorted records [begin, end) for channel c, in order: acc = acc + g * w, from zero. Every
/// backend produces exactly this sequence of roundings.
template <class T, class A, class Active = GatherAllActive>
DETOPS_HOST_DEVICE inline A gather_partial_sum(const GatherSorted<A>& g, std::int64_t begin, std::int64_t end,
                                               const T* upstream, std::int64_t upstream_c, std::int64_t c,
                                               const Active& active = Active{}) {
  A acc = A(0);
  for (std::int64_t r = begin; r < end; ++r) {
    if (!active(r, c)) continue;
    acc = acc + to_acc(upstream[g.sources[r] + c * upstream_c]) * g.weights[r];
  }
  return acc;
}

/// The fixed-order sum of one run for channel c: partials of `split` records (split <= 0: one),
/// each from zero, added in order.
template <class T, class A, class Active = GatherAllActive>
DETOPS_HOST_DEVICE inline A gather_run_sum(const GatherSorted<A>& g, std::int64_t run, const T* upstream,
                                           std::int64_t upstream_c, std::int64_t c, std::int64_t split,
                                           const Active& active = Active{}) {
  const std::int64_t begin = g.run_offsets[run], end = begin + std::int64_t{g.run_lengths[run]};
  if (split <= 0 || end - begin <= split) return gather_partial_sum(g, begin, end, upstream, upstream_c, c, active);
  A total = A(0);
  for (std::int64_t p = begin; p < end; p += split) {
    const std::int64_t q = end - p < split ? end : p + split;
    total = total + gather_partial_sum(g, p, q, upstream, upstream_c, c, active);
  }
  return total;
}

/// Phase 3's arguments apart from the op's destination map. U is the upstream gradient's type:
/// the op's T (grad_output), or A where an op first transforms it (deform_conv2d's columns).
template <class T, class A, class U = T>
struct GatherSumArgs {
  GatherSorted<A> sorted;
  const U* upstream;        // the gradient that flows back (grad_output)
  std::int64_t upstream_c;  // its channel stride
  T* out;                   // the gradient written (grad_input)
  std::int64_t out_c;       // its channel stride
  std::int64_t C;           // channels
  GatherKey sentinel;       // = positions
  std::int64_t split;       // partial length, <= 0 for none
};

/// Phase 3, one (run, channel) per thread: t in [0, runs * C), channel-fastest when
/// `channels_fastest` (neighbouring threads then write neighbouring channels of a channels-last
/// output), run-fastest otherwise. `target(key)` is the offset of the destination's channel 0 in
/// out; runs holding the sentinel write nothing.
template <class T, class A, class U, class Target, class Active = GatherAllActive>
DETOPS_HOST_DEVICE inline void gather_run_element(std::int64_t t, const GatherSumArgs<T, A, U>& a, std::int64_t runs,
                                                  bool channels_fastest, const Target& target,
                                                  const Active& active = Active{}) {
  const std::int64_t run = channels_fastest ? t / a.C : t % runs;
  const std::int64_t c = channels_fastest ? t % a.C : t / runs;
  const GatherKey key = a.sorted.run_keys[run];
  if (key >= a.sentinel) return;
  a.out[target(key) + c * a.out_c] = from_acc<T>(gather_run_sum(a.sorted, run, a.upstream, a.upstream_c, c, a.split,
                                                                active));
}

/// Bits of a radix sort over keys in [0, sentinel].
DETOPS_HOST_DEVICE inline int gather_key_bits(GatherKey sentinel) {
  int bits = 1;
  while (bits < 32 && (sentinel >> bits) != 0) ++bits;
  return bits;
}

}  // namespace detail
}  // namespace detops
