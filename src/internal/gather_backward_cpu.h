// The CPU side of the gather-backward engine (include/detops/detail/gather_backward.h): its
// workspace, phase 2 (a stable counting sort, or a stable comparison sort when destinations far
// outnumber records: the same order) and phase 3 (the fixed-order sums, parallel over runs,
// vectorized over channels when they are contiguous on both sides). Ops call these from their
// CPU backends, one chunk of planes at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "internal/common.h"

namespace detops {
namespace internal {

/// Whether phase 2 counts (positions + 2 buckets) rather than compares.
inline bool gather_counting_sort(std::int64_t positions, std::int64_t records) {
  return positions + 1 <= 2 * records + (1 << 20);
}

/// Runs a chunk can have: at most one per record and one per destination.
inline std::int64_t gather_run_capacity(std::int64_t records, std::int64_t positions) {
  return std::min(records, positions);
}

/// Phase 2 on key arrays alone: `sorted_ids` (n entries) lists the records stably sorted by key,
/// and the runs of equal non-sentinel keys go to run_keys / run_offsets / run_lengths (at least
/// gather_run_capacity entries each). `buckets` has positions + 2 entries when
/// gather_counting_sort(positions, n), and may be null otherwise. Returns the number of runs.
/// Sequential: its cost is a few passes over n integers.
inline std::int64_t gather_sort_keys_cpu(const std::uint64_t* keys, std::int64_t n, std::uint64_t positions,
                                         std::int64_t* sorted_ids, std::int64_t* buckets, std::uint64_t* run_keys,
                                         std::int64_t* run_offsets, std::int64_t* run_lengths) {
  const std::int64_t p = static_cast<std::int64_t>(positions);
  if (gather_counting_sort(p, n)) {
    std::fill(buckets, buckets + p + 2, std::int64_t{0});
    for (std::int64_t j = 0; j < n; ++j) ++buckets[keys[j] + 1];
    for (std::int64_t q = 0; q <= p; ++q) buckets[q + 1] += buckets[q];
    for (std::int64_t j = 0; j < n; ++j) sorted_ids[buckets[keys[j]]++] = j;
  } else {
    std::iota(sorted_ids, sorted_ids + n, std::int64_t{0});
    std::stable_sort(sorted_ids, sorted_ids + n, [&](std::int64_t x, std::int64_t y) { return keys[x] < keys[y]; });
  }
  std::int64_t runs = 0;
  for (std::int64_t r = 0; r < n;) {
    const std::uint64_t key = keys[sorted_ids[r]];
    if (key >= positions) break;  // sentinels sort last
    std::int64_t e = r + 1;
    while (e < n && keys[sorted_ids[e]] == key) ++e;
    run_keys[runs] = key;
    run_offsets[runs] = r;
    run_lengths[runs] = e - r;
    ++runs;
    r = e;
  }
  return runs;
}

/// The CPU engine's arrays for chunks of up to `cap` records over `positions` destinations.
template <class A>
struct GatherCpuBuffers {
  detail::GatherRecords<A> records{};  // phase 1 writes these (ids stays null on the CPU)
  std::int64_t* sorted_ids = nullptr;
  std::int64_t* buckets = nullptr;
  A* sorted_weights = nullptr;
  std::int64_t* sorted_sources = nullptr;
  std::uint64_t* run_keys = nullptr;
  std::int64_t* run_offsets = nullptr;
  std::int64_t* run_lengths = nullptr;
};

/// Sizes the arrays in `l` (one fixed order; take them back with take_gather_cpu after bind).
template <class A>
void add_gather_cpu(WorkspaceLayout& l, std::int64_t cap, std::int64_t positions) {
  const std::int64_t runs = gather_run_capacity(cap, positions);
  l.add<std::uint64_t>(cap);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(gather_counting_sort(positions, cap) ? positions + 2 : 0);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::uint64_t>(runs);
  l.add<std::int64_t>(runs);
  l.add<std::int64_t>(runs);
}
template <class A>
GatherCpuBuffers<A> take_gather_cpu(WorkspaceLayout& l) {
  GatherCpuBuffers<A> b;
  b.records.keys = l.take<std::uint64_t>();
  b.records.ids = nullptr;
  b.records.weights = l.take<A>();
  b.records.sources = l.take<std::int64_t>();
  b.sorted_ids = l.take<std::int64_t>();
  b.buckets = l.take<std::int64_t>();
  b.sorted_weights = l.take<A>();
  b.sorted_sources = l.take<std::int64_t>();
  b.run_keys = l.take<std::uint64_t>();
  b.run_offsets = l.take<std::int64_t>();
  b.run_lengths = l.take<std::int64_t>();
  return b;
}

/// Phase 2 for records [0, n) of `b` (n <= cap, keys in [0, positions]): sorts, permutes, and
/// returns the number of runs; `sorted` receives the view phase 3 reads.
template <class A>
std::int64_t gather_sort_cpu(const GatherCpuBuffers<A>& b, std::int64_t n, std::uint64_t positions, int threads,
                             detail::GatherSorted<A>& sorted) {
  const std::int64_t runs = gather_sort_keys_cpu(b.records.keys, n, positions, b.sorted_ids, b.buckets, b.run_keys,
                                                 b.run_offsets, b.run_lengths);
  const std::int64_t used = runs == 0 ? 0 : b.run_offsets[runs - 1] + b.run_lengths[runs - 1];  // sentinels last
  parallel_for(used, 1 << 14, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r)
      detail::gather_permute_record(r, b.sorted_ids, b.records.weights, b.records.sources, b.sorted_weights,
                                    b.sorted_sources);
  });
  sorted = {b.run_keys, b.run_offsets, b.run_lengths, b.sorted_weights, b.sorted_sources};
  return runs;
}

/// Phase 3 on the CPU: every (run, channel) of a.out written once with gather_run_sum's value.
/// Parallel over runs (each writes its own destination); with channels contiguous on both sides
/// the sums of a run advance together over the channels (the same additions per channel, in the
/// same order, so the same bits as one channel at a time).
/// `channels_outer`: threads take channels, each walks every run for its channel (for an upstream
/// whose channel planes are large: one stays in cache for all the runs); the same sums.
template <class T, class A, class U, class Target, class Active = detail::GatherAllActive>
void gather_sum_cpu(const detail::GatherSumArgs<T, A, U>& a, std::int64_t runs, const Target& target, int threads,
                    const Active& active = Active{}, bool channels_outer = false) {
  if (runs <= 0 || a.C <= 0) return;
  if (channels_outer) {
    parallel_for(a.C, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t c = lo; c < hi; ++c)
        for (std::int64_t run = 0; run < runs; ++run) {
          const std::uint64_t key = a.sorted.run_keys[run];
          if (key >= a.sentinel) continue;
          a.out[target(key) + c * a.out_c] =
              from_acc<T>(detail::gather_run_sum(a.sorted, run, a.upstream, a.upstream_c, c, a.split, active));
        }
    });
    return;
  }
  const bool rows = a.upstream_c == 1 && a.out_c == 1 && a.C > 1;
  const std::int64_t grain = std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(a.C, 1));
  parallel_for(runs, grain, threads, [&](std::int64_t lo, std::int64_t hi) {
    if (rows) {
      std::vector<A> total(static_cast<std::size_t>(a.C)), part(total.size());
      for (std::int64_t run = lo; run < hi; ++run) {
        const std::uint64_t key = a.sorted.run_keys[run];
        if (key >= a.sentinel) continue;
        const std::int64_t begin = a.sorted.run_offsets[run], end = begin + a.sorted.run_lengths[run];
        const std::int64_t split = a.split <= 0 || end - begin <= a.split ? end - begin : a.split;
        std::fill(total.begin(), total.end(), A(0));
        for (std::int64_t p = begin; p < end; p += split) {
          const std::int64_t q = end - p < split ? end : p + split;
          std::fill(part.begin(), part.end(), A(0));
          for (std::int64_t r = p; r < q; ++r) {
            const U* g = a.upstream + a.sorted.sources[r];
            const A w = a.sorted.weights[r];
            for (std::int64_t c = 0; c < a.C; ++c) {
              const A sum = part[c] + to_acc(g[c]) * w;
              part[c] = active(r, c) ? sum : part[c];
            }
          }
          if (split == end - begin) {
            total.swap(part);  // one partial: the run's sum is the partial itself
          } else {
            for (std::int64_t c = 0; c < a.C; ++c) total[c] = total[c] + part[c];
          }
        }
        T* out = a.out + target(key);
        for (std::int64_t c = 0; c < a.C; ++c) out[c] = from_acc<T>(total[c]);
      }
    } else {
      for (std::int64_t run = lo; run < hi; ++run) {
        const std::uint64_t key = a.sorted.run_keys[run];
        if (key >= a.sentinel) continue;
        T* out = a.out + target(key);
        for (std::int64_t c = 0; c < a.C; ++c)
          out[c * a.out_c] = from_acc<T>(detail::gather_run_sum(a.sorted, run, a.upstream, a.upstream_c, c, a.split,
                                                                active));
      }
    }
  });
}

}  // namespace internal
}  // namespace detops
