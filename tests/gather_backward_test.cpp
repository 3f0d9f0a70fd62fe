// The gather-backward engine on its own (include/detops/detail/gather_backward.h, its CPU side
// src/internal/gather_backward_cpu.h, and the bodies of its CUDA steps (src/internal/device_steps.h) over an
// emulated grid): the sort is stable whichever way it runs, the runs are right, partials are
// summed as documented, and the CUDA pipeline's bodies give the CPU phase 3's bytes for every
// dtype, thread order, layout, partial length and thread count. The ops' own tests (RoIAlign,
// grid_sample, ms_deform_attn) then cover the engine inside each op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "detops/error.h"
#include "internal/gather_backward_cpu.h"

namespace detops {
namespace {

using detail::GatherRecords;
using detail::GatherSorted;
using detail::GatherSumArgs;

/// A random chunk: `n` records over `positions` destinations (some sentinels), hot spots included,
/// so runs range from 1 to a few hundred records.
struct Chunk {
  std::int64_t n, positions, sources;  // sources: upstream rows
  std::vector<detail::GatherKey> keys;
  std::vector<double> weights;
  std::vector<std::int64_t> rows;  // upstream row of each record
};

Chunk make_chunk(std::int64_t n, std::int64_t positions, std::int64_t sources, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Chunk c{n, positions, sources, {}, {}, {}};
  std::uniform_int_distribution<std::int64_t> pos(0, positions - 1), hot(0, std::min<std::int64_t>(3, positions - 1)),
      src(0, sources - 1);
  std::uniform_real_distribution<double> w(-1.0, 1.0);
  std::uniform_int_distribution<int> kind(0, 9);
  for (std::int64_t j = 0; j < n; ++j) {
    const int k = kind(rng);
    c.keys.push_back(static_cast<detail::GatherKey>(k == 0 ? positions : k < 4 ? hot(rng) : pos(rng)));
    c.weights.push_back(w(rng));
    c.rows.push_back(src(rng));
  }
  return c;
}

TEST(GatherSort, StableAndTheSameWhetherItCountsOrCompares) {
  for (std::int64_t positions : {std::int64_t{5}, std::int64_t{1000}, std::int64_t{5000000}}) {
    const Chunk c = make_chunk(3000, positions, 7, 11 + positions);
    ASSERT_EQ(internal::gather_counting_sort(positions, c.n), positions < 5000000) << "both sorts must be exercised";
    std::vector<detail::GatherIndex> ids(c.n), buckets(static_cast<std::size_t>(positions + 2));
    const std::int64_t cap = internal::gather_run_capacity(c.n, positions);
    std::vector<detail::GatherKey> run_keys(cap);
    std::vector<detail::GatherIndex> run_offsets(cap), run_lengths(cap);
    const std::int64_t runs = internal::gather_sort_keys_cpu(c.keys.data(), c.n, positions, ids.data(), buckets.data(),
                                                             run_keys.data(), run_offsets.data(), run_lengths.data());
    // the order std::stable_sort gives (what CUB's radix sort gives on the device)
    std::vector<detail::GatherIndex> expect(c.n);
    for (std::int64_t j = 0; j < c.n; ++j) expect[j] = static_cast<detail::GatherIndex>(j);
    std::stable_sort(expect.begin(), expect.end(), [&](std::int64_t a, std::int64_t b) { return c.keys[a] < c.keys[b]; });
    EXPECT_EQ(ids, expect);
    // runs: every non-sentinel key once, in order, lengths that add up
    std::int64_t covered = 0;
    for (std::int64_t r = 0; r < runs; ++r) {
      EXPECT_LT(run_keys[r], positions);
      if (r > 0) {
        EXPECT_LT(run_keys[r - 1], run_keys[r]);
      }
      EXPECT_EQ(run_offsets[r], covered);
      for (std::int64_t i = 0; i < run_lengths[r]; ++i) EXPECT_EQ(c.keys[ids[covered + i]], run_keys[r]);
      covered += run_lengths[r];
    }
    const auto sentinels = std::count(c.keys.begin(), c.keys.end(), static_cast<detail::GatherKey>(positions));
    EXPECT_EQ(covered + sentinels, c.n);
  }
}

TEST(GatherSort, NothingButSentinelsGivesNoRun) {
  const std::vector<detail::GatherKey> keys(10, 4);
  std::vector<detail::GatherIndex> ids(10), buckets(6), offsets(4), lengths(4);
  std::vector<detail::GatherKey> run_keys(4);
  EXPECT_EQ(internal::gather_sort_keys_cpu(keys.data(), 10, 4, ids.data(), buckets.data(), run_keys.data(),
                                           offsets.data(), lengths.data()),
            0);
}

/// A run of 600 records whose sum depends on the association (2^24 then 599 ones): partials of
/// 256 must give
/// ((p0 + p1) + p2) with each p summed from zero, and split 0 the plain left-to-right sum.
TEST(GatherRunSum, PartialsAreSummedFromZeroAndAddedInOrder) {
  const std::int64_t n = 600;
  std::vector<float> up(n);
  std::vector<float> w(n, 1.0f);
  std::vector<std::int64_t> src(n);
  for (std::int64_t i = 0; i < n; ++i) {
    up[i] = i == 0 ? 16777216.0f : 1.0f;  // 2^24 + 1 rounds back to 2^24: the ones vanish unless grouped
    src[i] = i;
  }
  const detail::GatherKey key = 0;
  const detail::GatherIndex off = 0, len = n;
  const GatherSorted<float> g{&key, &off, &len, w.data(), src.data()};
  auto plain = [&](std::int64_t b, std::int64_t e) {
    float acc = 0.0f;
    for (std::int64_t i = b; i < e; ++i) acc = acc + up[i] * w[i];
    return acc;
  };
  const float whole = plain(0, n);
  const float parts = ((0.0f + plain(0, 256)) + plain(256, 512)) + plain(512, 600);
  ASSERT_NE(whole, parts) << "the case must tell the two orders apart";
  EXPECT_EQ(detail::gather_run_sum(g, 0, up.data(), 1, 0, 0), whole);
  EXPECT_EQ(detail::gather_run_sum(g, 0, up.data(), 1, 0, 600), whole);
  EXPECT_EQ(detail::gather_run_sum(g, 0, up.data(), 1, 0, 256), parts);
}

/// Runs the engine's CUDA pipeline as the kernels do, one body call per emulated thread:
/// init_records_kernel over garbage, the op's records, CUB's stable sort (std::stable_sort),
/// permute_records_kernel, run-length encode (the sentinel's run included, as CUB emits it) and
/// run_sums_kernel in the given thread order.
template <class T, class A, class Target, class Active>
void emulate_cuda(const Chunk& c, const std::vector<T>& up, std::int64_t up_c, std::vector<T>& out, std::int64_t out_c,
                  std::int64_t C, std::int64_t split, bool channels_fastest, const Target& target,
                  const Active& active) {
  const std::int64_t n = c.n;
  std::vector<detail::GatherKey> keys(n, 0xA5A5A5A5u);
  std::vector<detail::GatherIndex> ids(n, -1);
  std::vector<std::int64_t> sources(n, -1), sorted_sources(n);
  std::vector<A> weights(n, A(-7)), sorted_weights(n);
  const GatherRecords<A> rec{keys.data(), ids.data(), weights.data(), sources.data()};
  const auto sentinel = static_cast<detail::GatherKey>(c.positions);
  for (std::int64_t j = 0; j < n; ++j) detail::gather_init_record(j, rec, sentinel);
  for (std::int64_t j = 0; j < n; ++j)
    if (c.keys[j] != sentinel)  // a skipped contribution keeps init's sentinel
      detail::gather_set_record(rec, j, c.keys[j], static_cast<A>(c.weights[j]), c.rows[j] * (up_c == 1 ? C : 1));
  std::vector<detail::GatherIndex> sorted(ids);
  std::stable_sort(sorted.begin(), sorted.end(), [&](std::int64_t a, std::int64_t b) { return keys[a] < keys[b]; });
  for (std::int64_t r = 0; r < n; ++r)
    detail::gather_permute_record(r, sorted.data(), weights.data(), sources.data(), sorted_weights.data(),
                                  sorted_sources.data());
  std::vector<detail::GatherKey> run_keys;
  std::vector<detail::GatherIndex> run_offsets, run_lengths;
  for (std::int64_t r = 0; r < n; ++r) {
    if (r == 0 || keys[sorted[r]] != keys[sorted[r - 1]]) {
      run_keys.push_back(keys[sorted[r]]);
      run_offsets.push_back(static_cast<detail::GatherIndex>(r));
      run_lengths.push_back(0);
    }
    ++run_lengths.back();
  }
  const GatherSumArgs<T, A> a{{run_keys.data(), run_offsets.data(), run_lengths.data(), sorted_weights.data(),
                               sorted_sources.data()},
                              up.data(), up_c, out.data(), out_c, C, sentinel, split};
  const auto runs = static_cast<std::int64_t>(run_keys.size());
  for (std::int64_t t = 0; t < runs * C; ++t) detail::gather_run_element(t, a, runs, channels_fastest, target, active);
}

/// The CPU engine (phase 2 and 3 of gather_backward_cpu.h) on the same chunk.
template <class T, class A, class Target, class Active>
void run_cpu(const Chunk& c, const std::vector<T>& up, std::int64_t up_c, std::vector<T>& out, std::int64_t out_c,
             std::int64_t C, std::int64_t split, int threads, const Target& target, const Active& active) {
  internal::WorkspaceLayout l;
  internal::add_gather_cpu<A>(l, c.n, c.positions, "test");
  std::vector<unsigned char> ws(l.bytes() + internal::WorkspaceLayout::kAlign);
  l.bind(ws.data() + (internal::WorkspaceLayout::kAlign - reinterpret_cast<std::uintptr_t>(ws.data()) %
                                                             internal::WorkspaceLayout::kAlign));
  const internal::GatherCpuBuffers<A> b = internal::take_gather_cpu<A>(l);
  const auto sentinel = static_cast<detail::GatherKey>(c.positions);
  for (std::int64_t j = 0; j < c.n; ++j) detail::gather_init_record(j, b.records, sentinel);
  for (std::int64_t j = 0; j < c.n; ++j)
    if (c.keys[j] != sentinel)
      detail::gather_set_record(b.records, j, c.keys[j], static_cast<A>(c.weights[j]), c.rows[j] * (up_c == 1 ? C : 1));
  GatherSorted<A> sorted{};
  const std::int64_t runs = internal::gather_sort_cpu(b, c.n, sentinel, threads, sorted);
  internal::gather_sum_cpu(GatherSumArgs<T, A>{sorted, up.data(), up_c, out.data(), out_c, C, sentinel, split}, runs,
                           target, threads, active);
}

/// Destination d's channel 0: rows of C (channels contiguous) or planes of `positions` (channel
/// stride = positions).
struct RowTarget {
  std::int64_t stride;
  DETOPS_HOST_DEVICE std::int64_t operator()(detail::GatherKey key) const { return static_cast<std::int64_t>(key) * stride; }
};

/// Drops every record whose sorted index and channel have an odd sum (a predicate that depends on
/// both, as RoIAlign's max pooling does).
struct Checkerboard {
  DETOPS_HOST_DEVICE bool operator()(std::int64_t r, std::int64_t c) const { return (r + c) % 2 == 0; }
};

template <class T>
class GatherEngine : public ::testing::Test {};
using Dtypes = ::testing::Types<float, double, Half, BFloat16>;
TYPED_TEST_SUITE(GatherEngine, Dtypes);

TYPED_TEST(GatherEngine, CudaBodiesGiveTheCpuBytes) {
  using T = TypeParam;
  using A = acc_t<T>;
  for (const bool channels_contiguous : {true, false}) {
    for (const std::int64_t split : {std::int64_t{0}, std::int64_t{3}, detail::kGatherPartial}) {
      for (const bool checker : {false, true}) {
        const std::int64_t C = 5, positions = 40, sources = 30;
        const Chunk c = make_chunk(2000, positions, sources, 7 + split);
        // channels contiguous: upstream [sources, C] and out [positions, C]; otherwise planes
        const std::int64_t up_c = channels_contiguous ? 1 : sources, out_c = channels_contiguous ? 1 : positions;
        std::vector<T> up(static_cast<std::size_t>(sources * C));
        std::mt19937_64 rng(3);
        std::uniform_real_distribution<double> u(-2.0, 2.0);
        for (auto& v : up) v = from_double<T>(u(rng));
        const RowTarget target{channels_contiguous ? C : 1};
        const T poison = from_double<T>(1234.5);
        std::vector<T> cpu(static_cast<std::size_t>(positions * C), poison);
        std::vector<std::vector<T>> cpus;
        for (const int threads : {1, 2, 3, 8}) {
          std::vector<T> o(cpu.size(), poison);
          if (checker) run_cpu<T, A>(c, up, up_c, o, out_c, C, split, threads, target, Checkerboard{});
          else run_cpu<T, A>(c, up, up_c, o, out_c, C, split, threads, target, detail::GatherAllActive{});
          cpus.push_back(o);
        }
        for (const auto& o : cpus) EXPECT_EQ(std::memcmp(o.data(), cpus[0].data(), o.size() * sizeof(T)), 0);
        for (const bool fastest : {false, true}) {
          std::vector<T> dev(cpu.size(), poison);
          if (checker) emulate_cuda<T, A>(c, up, up_c, dev, out_c, C, split, fastest, target, Checkerboard{});
          else emulate_cuda<T, A>(c, up, up_c, dev, out_c, C, split, fastest, target, detail::GatherAllActive{});
          EXPECT_EQ(std::memcmp(dev.data(), cpus[0].data(), dev.size() * sizeof(T)), 0)
              << "contiguous " << channels_contiguous << " split " << split << " checker " << checker << " fastest "
              << fastest;
        }
        // and against the definition: each destination's run in record order, partials of split
        for (std::int64_t d = 0; d < positions; ++d) {
          bool any = false;
          for (std::int64_t ch = 0; ch < C; ++ch) {
            A total = A(0), part = A(0);
            std::int64_t in_part = 0, rank = 0;
            // the sorted index of each record of d: the count of records before it with a smaller
            // key plus its rank among d's records (the checkerboard reads it)
            const std::int64_t first =
                std::count_if(c.keys.begin(), c.keys.end(), [&](detail::GatherKey k) { return k < d; });
            const std::int64_t len = std::count(c.keys.begin(), c.keys.end(), static_cast<detail::GatherKey>(d));
            const bool partials = split > 0 && len > split;
            for (std::int64_t j = 0; j < c.n; ++j) {
              if (c.keys[j] != static_cast<detail::GatherKey>(d)) continue;
              any = true;
              const std::int64_t r = first + rank++;
              if (!checker || (r + ch) % 2 == 0)
                part = part + to_acc(up[c.rows[j] * (up_c == 1 ? C : 1) + ch * up_c]) * static_cast<A>(c.weights[j]);
              if (partials && ++in_part == split) {
                total = total + part;
                part = A(0);
                in_part = 0;
              }
            }
            const A expect = !partials ? part : (in_part > 0 ? total + part : total);
            if (!any) continue;
            const T got = cpus[0][d * target.stride + ch * out_c];
            const T want = from_acc<T>(expect);
            EXPECT_EQ(std::memcmp(&got, &want, sizeof(T)), 0) << "destination " << d << " channel " << ch;
          }
          if (!any)  // no record: the engine does not write it
            for (std::int64_t ch = 0; ch < C; ++ch) {
              const T got = cpus[0][d * target.stride + ch * out_c];
              EXPECT_EQ(std::memcmp(&got, &poison, sizeof(T)), 0);
            }
        }
      }
    }
  }
}

TEST(GatherKeyBits, CoversTheSentinel) {
  EXPECT_EQ(detail::gather_key_bits(0), 1);
  EXPECT_EQ(detail::gather_key_bits(1), 1);
  EXPECT_EQ(detail::gather_key_bits(2), 2);
  EXPECT_EQ(detail::gather_key_bits(255), 8);
  EXPECT_EQ(detail::gather_key_bits(256), 9);
  EXPECT_EQ(detail::gather_key_bits(~detail::GatherKey{0}), 32);
}

TEST(GatherLimits, ChunksPastThe32BitTypesAreRefused) {
  // keys are 32-bit (the sentinel included) and record indices 31-bit: a chunk past either is
  // refused with a message before anything is sized
  EXPECT_NO_THROW(internal::gather_check_chunk("op", (std::int64_t{1} << 31) - 1, (std::int64_t{1} << 32) - 1));
  try {
    internal::gather_check_chunk("grid_sample_backward", 10, std::int64_t{1} << 32);
    ADD_FAILURE() << "2^32 destinations must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("grid_sample_backward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2^32 - 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(internal::gather_check_chunk("op", std::int64_t{1} << 31, 10), Error);
}

}  // namespace
}  // namespace detops
