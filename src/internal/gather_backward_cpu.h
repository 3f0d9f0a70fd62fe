// The CPU side of the gather-backward engine (include/detops/detail/gather_backward.h): its
// workspace, phase 2 (a stable counting sort, or a stable comparison sort when destinations far
// outnumber records: the same order) and phase 3 (the fixed-order sums, parallel over runs,
// vectorized over channels when they are contiguous on both sides). Ops call these from their
// CPU backends, one chunk of planes at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "internal/common.h"
#include "internal/gather_limits.h"

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
inline std::int64_t gather_sort_keys_cpu(const detail::GatherKey* keys, std::int64_t n, detail::GatherKey positions,
                                         detail::GatherIndex* sorted_ids, detail::GatherIndex* buckets,
                                         detail::GatherKey* run_keys, detail::GatherIndex* run_offsets,
                                         detail::GatherIndex* run_lengths) {
  using detail::GatherIndex;
  const std::int64_t p = positions;
  if (gather_counting_sort(p, n)) {
    std::fill(buckets, buckets + p + 2, GatherIndex{0});
    for (std::int64_t j = 0; j < n; ++j) ++buckets[std::int64_t{keys[j]} + 1];
    for (std::int64_t q = 0; q <= p; ++q) buckets[q + 1] += buckets[q];
    for (std::int64_t j = 0; j < n; ++j) sorted_ids[buckets[keys[j]]++] = static_cast<GatherIndex>(j);
  } else {
    std::iota(sorted_ids, sorted_ids + n, GatherIndex{0});
    std::stable_sort(sorted_ids, sorted_ids + n, [&](GatherIndex x, GatherIndex y) { return keys[x] < keys[y]; });
  }
  std::int64_t runs = 0;
  for (std::int64_t r = 0; r < n;) {
    const detail::GatherKey key = keys[sorted_ids[r]];
    if (key >= positions) break;  // sentinels sort last
    std::int64_t e = r + 1;
    while (e < n && keys[sorted_ids[e]] == key) ++e;
    run_keys[runs] = key;
    run_offsets[runs] = static_cast<GatherIndex>(r);
    run_lengths[runs] = static_cast<GatherIndex>(e - r);
    ++runs;
    r = e;
  }
  return runs;
}

/// The CPU engine's arrays for chunks of up to `cap` records over `positions` destinations.
template <class A>
struct GatherCpuBuffers {
  detail::GatherRecords<A> records{};  // phase 1 writes these (ids stays null on the CPU)
  detail::GatherIndex* sorted_ids = nullptr;
  detail::GatherIndex* buckets = nullptr;
  A* sorted_weights = nullptr;
  std::int64_t* sorted_sources = nullptr;
  detail::GatherKey* run_keys = nullptr;
  detail::GatherIndex* run_offsets = nullptr;
  detail::GatherIndex* run_lengths = nullptr;
};

/// Sizes the arrays in `l` (one fixed order; take them back with take_gather_cpu after bind),
/// after checking the chunk against the engine's limits (`op` names it in the message).
template <class A>
void add_gather_cpu(WorkspaceLayout& l, std::int64_t cap, std::int64_t positions, const char* op) {
  gather_check_chunk(op, cap, positions);
  const std::int64_t runs = gather_run_capacity(cap, positions);
  l.add<detail::GatherKey>(cap);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<detail::GatherIndex>(cap);
  l.add<detail::GatherIndex>(gather_counting_sort(positions, cap) ? positions + 2 : 0);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<detail::GatherKey>(runs);
  l.add<detail::GatherIndex>(runs);
  l.add<detail::GatherIndex>(runs);
}
template <class A>
GatherCpuBuffers<A> take_gather_cpu(WorkspaceLayout& l) {
  GatherCpuBuffers<A> b;
  b.records.keys = l.take<detail::GatherKey>();
  b.records.ids = nullptr;
  b.records.weights = l.take<A>();
  b.records.sources = l.take<std::int64_t>();
  b.sorted_ids = l.take<detail::GatherIndex>();
  b.buckets = l.take<detail::GatherIndex>();
  b.sorted_weights = l.take<A>();
  b.sorted_sources = l.take<std::int64_t>();
  b.run_keys = l.take<detail::GatherKey>();
  b.run_offsets = l.take<detail::GatherIndex>();
  b.run_lengths = l.take<detail::GatherIndex>();
  return b;
}

/// Phase 2 for records [0, n) of `b` (n <= cap, keys in [0, positions]): sorts, permutes, and
/// returns the number of runs; `sorted` receives the view phase 3 reads.
template <class A>
std::int64_t gather_sort_cpu(const GatherCpuBuffers<A>& b, std::int64_t n, detail::GatherKey positions, int threads,
                             detail::GatherSorted<A>& sorted) {
  const std::int64_t runs = gather_sort_keys_cpu(b.records.keys, n, positions, b.sorted_ids, b.buckets, b.run_keys,
                                                 b.run_offsets, b.run_lengths);
  const std::int64_t used = runs == 0 ? 0 : std::int64_t{b.run_offsets[runs - 1]} + b.run_lengths[runs - 1];  // sentinels last
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
          const detail::GatherKey key = a.sorted.run_keys[run];
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
        const detail::GatherKey key = a.sorted.run_keys[run];
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
        const detail::GatherKey key = a.sorted.run_keys[run];
        if (key >= a.sentinel) continue;
        T* out = a.out + target(key);
        for (std::int64_t c = 0; c < a.C; ++c)
          out[c * a.out_c] = from_acc<T>(detail::gather_run_sum(a.sorted, run, a.upstream, a.upstream_c, c, a.split,
                                                                active));
      }
    }
  });
}

/// The two ways a CPU backend runs an exact backward, with the same bits: the engine (records,
/// a stable sort, fixed-order sums; it wins where channels-last rows vectorize its sums) or a
/// sequential scatter in canonical order (PlaneScatter: no records, no sort, little memory). The
/// backend picks by layout; tests run both and compare them bit for bit.
enum class CpuExactPath { kEngine, kScatter };

/// The engine's sums without its records and sort, for a backend that visits one destination
/// plane's records in canonical order itself: each record is added where it lands, so every
/// destination receives its records in the engine's sorted order (the sort is stable by
/// destination), from zero. The engine's partials are kept: before a destination's k-th record,
/// k a positive multiple of `split`, the partial so far is folded into its total
/// (total = total + partial, the total starting from zero; the partial restarts from zero), and
/// finish() adds each folded destination's last partial to its total, so a destination of more
/// than `split` records gets gather_run_sum's value and one of at most `split` records is its
/// one partial, as in the engine. Records with weight 0 count (the engine keeps them).
///
/// A destination is `width` channels (a row; 1 for one value), accumulated at acc[i * stride].
/// `split`: 0 (no partials) or a power of 2 (kGatherPartial). Use: next_plane(), then for every
/// record of the plane in canonical order add() (one channel) or count() / fold() and the row's
/// adds, then finish(at, stride) (at(d): destination d's accumulator). Destinations are indices
/// in [0, positions); the counts live in one array per thread, stamped with a plane generation
/// so that a new plane costs no clearing. Not thread-safe: one per thread.
template <class A>
class PlaneScatter {
 public:
  PlaneScatter(std::int64_t positions, std::int64_t split, std::int64_t width = 1)
      : split_(split > 0 ? static_cast<std::uint32_t>(split) : 0), width_(width) {
    if (split_ & (split_ - 1)) throw std::logic_error("PlaneScatter: split must be a power of 2");
    if (split_ > 0) {
      state_.assign(static_cast<std::size_t>(positions), 0);
      total_.resize(static_cast<std::size_t>(positions * width));
    }
  }

  /// Starts a plane: every destination has seen no record. `counted`: the caller knows that no
  /// destination of this plane receives more than `split` records (so nothing need be counted).
  void next_plane(bool counted = false) {
    folded_.clear();
    counting_ = split_ > 0 && !counted;
    if (!counting_) return;
    if (++generation_ == 0) {  // wrapped: forget every stamp
      std::fill(state_.begin(), state_.end(), std::uint64_t{0});
      generation_ = 1;
    }
  }

  /// Counts one record of destination d; true when its partial so far must be folded first.
  bool count(std::int64_t d) {
    if (!counting_) return false;
    std::uint64_t& v = state_[static_cast<std::size_t>(d)];
    const std::uint32_t seen = (v >> 32) == generation_ ? static_cast<std::uint32_t>(v) : 0u;
    v = (static_cast<std::uint64_t>(generation_) << 32) | (seen + 1);
    return seen != 0 && (seen & (split_ - 1)) == 0;
  }

  /// Folds destination d's partial (its width channels at acc[i * stride]) into its total.
  void fold(std::int64_t d, A* acc, std::int64_t stride) {
    A* total = total_.data() + d * width_;
    if (static_cast<std::uint32_t>(state_[static_cast<std::size_t>(d)]) == split_ + 1) {
      // the first partial closes (count() has just counted record split + 1): the total starts from zero
      for (std::int64_t i = 0; i < width_; ++i) total[i] = A(0);
      folded_.push_back(d);
    }
    for (std::int64_t i = 0; i < width_; ++i) {
      total[i] = total[i] + acc[i * stride];
      acc[i * stride] = A(0);
    }
  }

  /// One channel: adds a record's contribution (to_acc(upstream) * weight, as the engine forms
  /// it) to destination d, whose accumulator is `acc`.
  void add(std::int64_t d, A& acc, A contribution) {
    if (count(d)) fold(d, &acc, 1);
    acc = acc + contribution;
  }

  /// Ends the plane: each destination with more than `split` records becomes total + last
  /// partial, channel by channel (at(d) returns its accumulator, channels `stride` apart).
  template <class At>
  void finish(At&& at, std::int64_t stride = 1) {
    for (const std::int64_t d : folded_) {
      A* acc = at(d);
      const A* total = total_.data() + d * width_;
      for (std::int64_t i = 0; i < width_; ++i) acc[i * stride] = total[i] + acc[i * stride];
    }
    folded_.clear();
  }

 private:
  std::uint32_t split_;
  std::int64_t width_;
  bool counting_ = false;
  std::uint32_t generation_ = 0;
  std::vector<std::uint64_t> state_;  // (generation << 32) | records seen, per destination
  std::vector<A> total_;              // width_ per destination
  std::vector<std::int64_t> folded_;
};

/// The most per-thread memory a backend's scatter path may take (PlaneScatter's counts and totals,
/// a 16-bit type's float plane): above it the backend runs the engine, whose workspace is bounded
/// by its chunks, instead.
constexpr std::size_t kScatterThreadBytes = std::size_t{16} << 20;

/// Runs a scatter path's items [0, items) on up to `threads` threads, each owning a contiguous
/// range of items with its own state from make(). Every state is made first, so that an
/// allocation failure is ErrorCode::kOutOfMemory with nothing written; then prepare() (the
/// output's zero fill) and body(state, begin, end) per thread. `bytes` (per state) is for the
/// message. The items' results must not depend on which thread runs them (threads own planes).
template <class Make, class Prepare, class Body>
void run_owned(const char* op, std::int64_t items, int threads, std::size_t bytes, Make&& make, Prepare&& prepare,
               Body&& body) {
  const std::int64_t parts = std::max<std::int64_t>(1, std::min<std::int64_t>(threads, items));
  std::vector<decltype(make())> states;
  try {
    states.reserve(static_cast<std::size_t>(parts));
    for (std::int64_t p = 0; p < parts; ++p) states.push_back(make());
  } catch (const std::bad_alloc&) {
    fail(ErrorCode::kOutOfMemory, "{}: the exact mode's scratch ({} bytes per thread, {} threads) could not be "
         "allocated", op, bytes, parts);
  }
  prepare();
  parallel_for(parts, 1, static_cast<int>(parts), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p)
      body(states[static_cast<std::size_t>(p)], items * p / parts, items * (p + 1) / parts);
  });
}

}  // namespace internal
}  // namespace detops
