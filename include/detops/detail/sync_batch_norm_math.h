// The one copy of SyncBatchNorm's math, shared by the CPU backend, the CUDA kernels and the tests.
//
// Default mode, local statistics of one channel (the same bits on the CPU and CUDA, for NCHW,
// NHWC and any strides, for any thread count):
//   * the channel's N*H*W elements are taken in (n, h, w) order and cut into chunks of
//     kSbnChunk consecutive elements (a chunk may span images; the last one may be shorter);
//   * a chunk's moments are exact two-pass ones in float64: lane t (of kSbnLanes) sums the
//     elements t, t + 32, t + 64, ... in order, the 32 lane sums are combined by the butterfly
//     sbn_lane_tree (what a warp's xor-shuffle reduction computes); mean = sum / len; then the
//     same for the squared deviations from that mean: M2 = sum (x - mean)^2;
//   * the chunks' (count, mean, M2) are merged with Chan's formula in the fixed pairwise tree
//     sbn_tree_reduce over the chunk sequence;
//   * ranks' records are merged in rank order with the same tree.
// Never E[x^2] - E[x]^2: a chunk subtracts its own mean before squaring.
//
// Exact mode (the same bits for any number of ranks and any split of the batch among them):
//   * every rank finds, per channel, the exponent E of its max |x| (max |x| < 2^E), the ranks
//     agree on the largest (one all-gather of C words);
//   * each element is rounded to the fixed-point grid 2^(E - kSbnFixedBits):
//     q = rint(x * 2^(kSbnFixedBits - E)), |q| <= 2^44, and S1 = sum q, S2 = sum q^2 are summed
//     in 128-bit integers, which are associative: any order, any split, the same sums;
//   * mean = S1 / n and var = (n S2 - S1^2) / n^2 (computed exactly in 256-bit, then rounded),
//     scaled back by powers of two.
//   The backward does the same with dy and dy * (x - mean) (2C exponents).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "detops/detail/host_device.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

inline constexpr int kSbnLanes = 32;
inline constexpr std::int64_t kSbnChunk = 256;   // elements per chunk (8 per lane)
inline constexpr int kSbnFixedBits = 44;         // exact mode: |q| <= 2^44
inline constexpr std::int64_t kSbnExactMaxCount = (std::int64_t{1} << 39) - 1;  // S2 <= (2^39 - 1) 2^88 < 2^127
inline constexpr std::int64_t kSbnZeroExponent = -(std::int64_t{1} << 20);     // every element is 0
inline constexpr std::int64_t kSbnNonFiniteExponent = std::int64_t{1} << 20;   // some element is inf/NaN
// The exponents sbn_exponent gives for finite non-zero values: 2^-1074 -> -1073, DBL_MAX -> 1024.
inline constexpr std::int64_t kSbnMinExponent = -1073;
inline constexpr std::int64_t kSbnMaxExponent = 1024;

/// Count, mean and sum of squared deviations of a set of values.
struct SbnMoments {
  std::int64_t n;
  double mean;
  double m2;
};

/// Chan et al.'s pairwise merge. An empty side is the identity, so empty ranks and empty
/// chunks change nothing (and never divide by zero).
DETOPS_HOST_DEVICE inline SbnMoments sbn_merge(const SbnMoments& a, const SbnMoments& b) {
  if (a.n == 0) return b;
  if (b.n == 0) return a;
  const std::int64_t n = a.n + b.n;
  const double wb = static_cast<double>(b.n) / static_cast<double>(n);
  const double delta = b.mean - a.mean;
  SbnMoments r;
  r.n = n;
  r.mean = a.mean + delta * wb;
  r.m2 = (a.m2 + b.m2) + (delta * delta) * (static_cast<double>(a.n) * wb);
  return r;
}

/// Sum of two partial sums (the tree operation of the backward's default mode).
struct SbnSums {
  double dy;
  double dyxmu;
};
DETOPS_HOST_DEVICE inline SbnSums sbn_merge(const SbnSums& a, const SbnSums& b) { return {a.dy + b.dy, a.dyxmu + b.dyxmu}; }

/// The butterfly of a warp's xor-shuffle reduction, on 32 lane values (v is overwritten):
/// level off = 16, 8, 4, 2, 1 adds lane t + off into lane t. Returns the total.
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE double sbn_lane_tree(double* v) {
  for (int off = kSbnLanes / 2; off >= 1; off /= 2)
    for (int t = 0; t < off; ++t) v[t] = v[t] + v[t + off];
  return v[0];
}

/// The fixed pairwise tree over r[0..k): each level merges (r[2i], r[2i+1]) into r[i], an odd
/// last element moves up unchanged. In place; returns r[0], or `empty` when k == 0. Any
/// implementation that merges the same pairs level by level gives the same bits.
template <class T>
DETOPS_HOST_DEVICE inline T sbn_tree_reduce(T* r, std::int64_t k, const T& empty) {
  if (k <= 0) return empty;
  while (k > 1) {
    const std::int64_t half = k / 2;
    for (std::int64_t i = 0; i < half; ++i) r[i] = sbn_merge(r[2 * i], r[2 * i + 1]);
    if (k & 1) r[half] = r[k - 1];
    k = half + (k & 1);
  }
  return r[0];
}

/// sbn_lane_tree of the lanes of one chunk of `len` values, load(i) giving value i as float64:
/// lane t adds load(t), load(t + 32), ... in order from 0.0 (written blocked, so that the CPU
/// vectorizes it; the order of each lane is the same).
template <class Load>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE double sbn_chunk_lane_total(const Load& load, std::int64_t len) {
  double lanes[kSbnLanes];
  for (int t = 0; t < kSbnLanes; ++t) lanes[t] = 0.0;
  std::int64_t k = 0;
  for (; k + kSbnLanes <= len; k += kSbnLanes)
    for (int t = 0; t < kSbnLanes; ++t) lanes[t] = lanes[t] + load(k + t);
  for (int t = 0; k + t < len; ++t) lanes[t] = lanes[t] + load(k + t);
  return sbn_lane_tree(lanes);
}

/// Moments of one chunk of `len` (1..kSbnChunk) values, load(i) giving value i as float64: the
/// lanes' sum, then the lanes' sum of squared deviations from that mean.
template <class Load>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE SbnMoments sbn_chunk_moments(const Load& load, std::int64_t len) {
  const double mean = sbn_chunk_lane_total(load, len) / static_cast<double>(len);
  auto sq = [&](std::int64_t i) -> double {
    const double d = load(i) - mean;
    return d * d;
  };
  return {len, mean, sbn_chunk_lane_total(sq, len)};
}

/// Backward default mode: sums of dy and dy * (x - mean) over one chunk, same lane structure
/// (one lane set after the other: each lane adds the same terms in the same order either way,
/// and one set of 32 lanes at a time needs fewer registers on the device than both).
template <class LoadDy, class LoadX>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE SbnSums sbn_chunk_sums(const LoadDy& dy, const LoadX& x, double mean, std::int64_t len) {
  auto prod = [&](std::int64_t i) -> double { return dy(i) * (x(i) - mean); };
  return {sbn_chunk_lane_total(dy, len), sbn_chunk_lane_total(prod, len)};
}

/// Chunks of a channel with `count` = N*H*W elements.
DETOPS_HOST_DEVICE inline std::int64_t sbn_chunks(std::int64_t count) { return (count + kSbnChunk - 1) / kSbnChunk; }

// ---------------------------------------------------------------------------------------------
// Exact mode: fixed point.

/// E with |v| < 2^E for the largest |v| of a set (kSbnZeroExponent when it is 0, and
/// kSbnNonFiniteExponent when it is inf or NaN).
DETOPS_HOST_DEVICE inline std::int64_t sbn_exponent(double absmax) {
  if (!(absmax <= 1.7976931348623157e308)) return kSbnNonFiniteExponent;  // inf or NaN
  if (absmax == 0.0) return kSbnZeroExponent;
  int e = 0;
  (void)::frexp(absmax, &e);  // absmax = f * 2^e, f in [0.5, 1): absmax < 2^e
  return e;
}

/// Whether an exponent word is a finite one sbn_exponent can return. The phases take exponent and
/// record words from their caller: any other word (not one of the two sentinels either) is
/// garbage, and is treated as kSbnNonFiniteExponent (values quantize to 0, statistics are NaN).
DETOPS_HOST_DEVICE inline bool sbn_finite_exponent(std::int64_t e) {
  return e >= kSbnMinExponent && e <= kSbnMaxExponent;
}

/// 2^k for -1022 <= k <= 1023, built from its bits.
DETOPS_HOST_DEVICE inline double sbn_pow2(int k) {
  const std::int64_t bits = static_cast<std::int64_t>(k + 1023) << 52;
#if DETOPS_ON_DEVICE
  return __longlong_as_double(bits);
#else
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
#endif
}

/// The factors that scale a value of channel exponent E onto the integer grid: v * f1 * f2 is
/// v * 2^(kSbnFixedBits - E), exactly (two factors when 2^(44 - E) is not a double). For the two
/// special exponents the factors are 0 (every value quantizes to 0).
struct SbnQuantScale {
  double f1, f2;
};
DETOPS_HOST_DEVICE inline SbnQuantScale sbn_quant_scale(std::int64_t e) {
  if (!sbn_finite_exponent(e)) return {0.0, 0.0};     // the sentinels, or a garbage word
  const int k = kSbnFixedBits - static_cast<int>(e);  // -980 <= k <= 1117
  if (k > 1000) return {sbn_pow2(1000), sbn_pow2(k - 1000)};
  return {sbn_pow2(k), 1.0};
}

/// Rounds v to the grid 2^(E - kSbnFixedBits), nearest with ties to even, as an integer: the
/// scaling is exact (or, scaling down, the one correctly rounded product ldexp would give) and
/// the rounding is t + 1.5 * 2^52, exact RNE for |t| <= 2^51, whose bit pattern minus that of
/// 1.5 * 2^52 is the integer (the doubles in [2^52, 2^53] are the integers, consecutive patterns).
/// |v| < 2^E, so |q| <= 2^kSbnFixedBits. Written without branches (selects, an integer
/// subtraction), so that the CPU loops vectorize it. Needs IEEE evaluation (no fast-math), as the
/// whole library does.
DETOPS_HOST_DEVICE inline std::int64_t sbn_quantize(double v, const SbnQuantScale& s) {
  double t = (v * s.f1) * s.f2;
  // |t| <= 2^44 when the exponent covers v; clamp (defined garbage, never UB) when a caller of
  // the phases passes exponents of other data
  t = t >= -2251799813685248.0 ? t : -2251799813685248.0;  // also NaN
  t = t > 2251799813685248.0 ? 2251799813685248.0 : t;
  constexpr double kMagic = 6755399441055744.0;            // 1.5 * 2^52
  constexpr std::int64_t kMagicBits = 0x4338000000000000;  // its bit pattern
  const double r = t + kMagic;
#if DETOPS_ON_DEVICE
  const std::int64_t q = __double_as_longlong(r) - kMagicBits;
#else
  std::int64_t bits;
  std::memcpy(&bits, &r, 8);
  const std::int64_t q = bits - kMagicBits;
#endif
  return s.f1 == 0.0 ? 0 : q;  // a special exponent: every value counts as 0
}
DETOPS_HOST_DEVICE inline std::int64_t sbn_quantize(double v, std::int64_t e) {
  return sbn_quantize(v, sbn_quant_scale(e));
}

using sbn_i128 = __int128;
using sbn_u128 = unsigned __int128;

DETOPS_HOST_DEVICE inline void sbn_store_i128(sbn_i128 v, std::int64_t* words) {
  const sbn_u128 u = static_cast<sbn_u128>(v);
  words[0] = static_cast<std::int64_t>(static_cast<std::uint64_t>(u));
  words[1] = static_cast<std::int64_t>(static_cast<std::uint64_t>(u >> 64));
}
DETOPS_HOST_DEVICE inline sbn_i128 sbn_load_i128(const std::int64_t* words) {
  const sbn_u128 u = (static_cast<sbn_u128>(static_cast<std::uint64_t>(words[1])) << 64) |
                     static_cast<sbn_u128>(static_cast<std::uint64_t>(words[0]));
  return static_cast<sbn_i128>(u);
}

/// Correctly rounded (nearest even) conversion of a 64-bit value with a sticky bit: the top 64
/// bits of a wider integer, shifted right by `shift`, whose dropped bits are or-ed into bit 0.
DETOPS_HOST_DEVICE inline double sbn_u64_to_double(std::uint64_t m) {
#if DETOPS_ON_DEVICE
  return __ull2double_rn(m);
#else
  return static_cast<double>(m);
#endif
}

/// Correctly rounded conversion of an unsigned integer of `limbs` 64-bit limbs (little endian).
DETOPS_HOST_DEVICE inline double sbn_limbs_to_double(const std::uint64_t* limb, int limbs) {
  int top = limbs - 1;
  while (top > 0 && limb[top] == 0) --top;
  if (top == 0) return sbn_u64_to_double(limb[0]);
  // leading bit position within limb[top]
  int lz = 0;
  for (std::uint64_t v = limb[top]; !(v & (std::uint64_t{1} << 63)); v <<= 1) ++lz;
  // take 64 bits starting at the leading one; the rest is sticky
  const int shift = 64 * top - lz;  // value = m * 2^shift + rest
  std::uint64_t m = lz == 0 ? limb[top] : (limb[top] << lz) | (limb[top - 1] >> (64 - lz));
  bool sticky = lz == 0 ? limb[top - 1] != 0 : (limb[top - 1] << lz) != 0;
  for (int i = top - 2; i >= 0 && !sticky; --i) sticky = limb[i] != 0;
  // m has 64 significant bits; the 11 below double's 53 decide the rounding, so a sticky bit in
  // bit 0 makes the single rounding of the conversion exact.
  if (sticky) m |= 1u;
  return ::ldexp(sbn_u64_to_double(m), shift);
}

DETOPS_HOST_DEVICE inline double sbn_i128_to_double(sbn_i128 v) {
  const bool neg = v < 0;
  const sbn_u128 u = neg ? static_cast<sbn_u128>(0) - static_cast<sbn_u128>(v) : static_cast<sbn_u128>(v);
  const std::uint64_t limb[2] = {static_cast<std::uint64_t>(u), static_cast<std::uint64_t>(u >> 64)};
  const double d = sbn_limbs_to_double(limb, 2);
  return neg ? -d : d;
}

/// n * S2 - S1^2 for n <= 2^39, 0 <= S2 < 2^127, |S1| < 2^84, exactly (>= 0 by Cauchy-Schwarz),
/// as a correctly rounded double.
DETOPS_HOST_DEVICE inline double sbn_exact_var_numerator(std::int64_t n, sbn_i128 s1, sbn_i128 s2) {
  const sbn_u128 us2 = static_cast<sbn_u128>(s2);
  const sbn_u128 us1 = s1 < 0 ? static_cast<sbn_u128>(0) - static_cast<sbn_u128>(s1) : static_cast<sbn_u128>(s1);
  const std::uint64_t un = static_cast<std::uint64_t>(n);
  // a = n * S2 (192 bits)
  std::uint64_t a[4] = {0, 0, 0, 0};
  {
    const sbn_u128 lo = static_cast<sbn_u128>(static_cast<std::uint64_t>(us2)) * un;
    const sbn_u128 hi = static_cast<sbn_u128>(static_cast<std::uint64_t>(us2 >> 64)) * un + (lo >> 64);
    a[0] = static_cast<std::uint64_t>(lo);
    a[1] = static_cast<std::uint64_t>(hi);
    a[2] = static_cast<std::uint64_t>(hi >> 64);
  }
  // b = S1^2 (256 bits)
  std::uint64_t b[4] = {0, 0, 0, 0};
  {
    const std::uint64_t x0 = static_cast<std::uint64_t>(us1), x1 = static_cast<std::uint64_t>(us1 >> 64);
    const sbn_u128 p00 = static_cast<sbn_u128>(x0) * x0;
    const sbn_u128 p01 = static_cast<sbn_u128>(x0) * x1;  // twice, at 2^64
    const sbn_u128 p11 = static_cast<sbn_u128>(x1) * x1;
    b[0] = static_cast<std::uint64_t>(p00);
    sbn_u128 t = (p00 >> 64) + static_cast<std::uint64_t>(p01) + static_cast<std::uint64_t>(p01);
    b[1] = static_cast<std::uint64_t>(t);
    t = (t >> 64) + (p01 >> 64) + (p01 >> 64) + static_cast<std::uint64_t>(p11);
    b[2] = static_cast<std::uint64_t>(t);
    t = (t >> 64) + (p11 >> 64);
    b[3] = static_cast<std::uint64_t>(t);
  }
  // a - b, clamped at 0 (cannot be negative for exact sums; the clamp guards misuse)
  std::uint64_t d[4];
  std::uint64_t borrow = 0;
  for (int i = 0; i < 4; ++i) {
    const std::uint64_t ai = a[i], bi = b[i];
    d[i] = ai - bi - borrow;
    borrow = (ai < bi || (ai == bi && borrow)) ? 1u : 0u;
  }
  if (borrow) return 0.0;
  return sbn_limbs_to_double(d, 4);
}

// ---------------------------------------------------------------------------------------------
// Per-channel parameters (weight, bias, running stats) in float32 or float64.

struct SbnParam {
  void* data;  // null when absent
  bool f64;
  std::int64_t stride;
};
DETOPS_HOST_DEVICE inline double sbn_load(const SbnParam& p, std::int64_t c, double absent) {
  if (!p.data) return absent;
  return p.f64 ? static_cast<const double*>(p.data)[c * p.stride]
               : static_cast<double>(static_cast<const float*>(p.data)[c * p.stride]);
}
DETOPS_HOST_DEVICE inline void sbn_store(const SbnParam& p, std::int64_t c, double v) {
  if (!p.data) return;
  if (p.f64) static_cast<double*>(p.data)[c * p.stride] = v;
  else static_cast<float*>(p.data)[c * p.stride] = static_cast<float>(v);
}

// Record layout (int64 words): word 0 = this rank's element count per channel; then per channel
//   default forward:  mean, M2 (float64 bit patterns)        -> 1 + 2C words
//   default backward: sum dy, sum dy*(x - mean)               -> 1 + 2C words
//   exact forward:    S1 (2 words), S2 (2 words)              -> 1 + 4C words
//   exact backward:   S_dy (2 words), S_dyxmu (2 words)       -> 1 + 4C words
DETOPS_HOST_DEVICE inline std::int64_t sbn_record_words(std::int64_t channels, bool exact) {
  return 1 + (exact ? 4 : 2) * channels;
}
DETOPS_HOST_DEVICE inline std::int64_t sbn_double_word(double v) {
  std::int64_t w;
  static_assert(sizeof(w) == sizeof(v), "");
#if DETOPS_ON_DEVICE
  w = __double_as_longlong(v);
#else
  std::memcpy(&w, &v, 8);
#endif
  return w;
}
DETOPS_HOST_DEVICE inline double sbn_word_double(std::int64_t w) {
#if DETOPS_ON_DEVICE
  return __longlong_as_double(w);
#else
  double v;
  std::memcpy(&v, &w, 8);
  return v;
#endif
}

/// Finalize arguments: the gathered records [ranks, words], the agreed exponents (exact mode),
/// the outputs and the running statistics to update.
struct SbnFinalizeArgs {
  const std::int64_t* gathered;
  std::int64_t ranks, words, channels;
  bool exact;
  const std::int64_t* exponents;  // exact mode: [C] (forward) or [2C] (backward)
  double eps;
  bool has_momentum;
  double momentum;
  SbnParam running_mean, running_var;
  std::int64_t* num_batches_tracked;  // [1] or null; read by every channel, written by channel 0
  double* save_mean;
  double* save_invstd;
};

/// Global count (the sum of the ranks' word 0), or -1 when the records are garbage: a count is
/// negative or the sum does not fit in int64 (no local_stats writes such records; a caller of the
/// phases may gather anything). Finalizing garbage gives NaN statistics and updates nothing.
DETOPS_HOST_DEVICE inline std::int64_t sbn_global_count(const std::int64_t* gathered, std::int64_t ranks,
                                                        std::int64_t words) {
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < ranks; ++r) {
    const std::int64_t k = gathered[r * words];
    if (k < 0 || k > 9223372036854775807LL - n) return -1;
    n += k;
  }
  return n;
}

/// The forward's global count: sbn_global_count, and -1 (like garbage) in exact mode when it
/// reaches 2^39 (the ranks together hold more elements per channel than the 128-bit sum of
/// squares can take; each rank checks its own count, and the one-call API checks the total in the
/// rank-agreement header before anything runs: this is the defined result when the header check is
/// skipped or the phases are driven by hand). NaN statistics, nothing updated.
DETOPS_HOST_DEVICE inline std::int64_t sbn_forward_count(const std::int64_t* gathered, std::int64_t ranks,
                                                         std::int64_t words, bool exact) {
  const std::int64_t n = sbn_global_count(gathered, ranks, words);
  return exact && n > kSbnExactMaxCount ? -1 : n;
}

/// Wrapping 128-bit sum (defined for any words; exact for the sums local_stats writes, which
/// cannot overflow).
DETOPS_HOST_DEVICE inline sbn_i128 sbn_add_i128(sbn_i128 a, sbn_i128 b) {
  return static_cast<sbn_i128>(static_cast<sbn_u128>(a) + static_cast<sbn_u128>(b));
}

/// The stack depth the finalize kernels are compiled for, given the rank count: the rank tree
/// below holds at most bit_length(ranks) partial results, so kDepth entries serve ranks < 2^kDepth.
/// 8 and 16 keep a thread's stack frame small (a few hundred bytes, within the 1 KB the driver
/// reserves per thread without growing); 64 (the CPU's) serves every int64 count.
inline int sbn_rank_depth(std::int64_t ranks) {
  return ranks < (std::int64_t{1} << 8) ? 8 : ranks < (std::int64_t{1} << 16) ? 16 : 64;
}

/// Whether sbn_rank_tree<kDepth> can take `ranks` values (ranks < 2^kDepth; always at 63 and up).
template <int kDepth>
DETOPS_HOST_DEVICE inline bool sbn_rank_tree_fits(std::int64_t ranks) {
  if constexpr (kDepth < 63) return (ranks >> kDepth) == 0;
  return true;
}

/// The fixed pairwise tree over the ranks' values load(0..ranks) (sbn_tree_reduce's order),
/// evaluated without an array of ranks: a stack of perfect subtrees, the binary counter of the
/// ranks added so far (rank r merges once per trailing one bit of r), combined right to left at
/// the end. Needs ranks < 2^kDepth (callers check sbn_rank_tree_fits first).
template <int kDepth, class R, class Load>
DETOPS_HOST_DEVICE inline R sbn_rank_tree(std::int64_t ranks, const Load& load, const R& empty) {
  R stack[kDepth];
  int top = 0;
  for (std::int64_t r = 0; r < ranks; ++r) {
    R m = load(r);
    for (std::int64_t t = r; t & 1; t >>= 1) m = sbn_merge(stack[--top], m);
    stack[top++] = m;
  }
  if (top == 0) return empty;
  R m = stack[top - 1];
  for (int i = top - 2; i >= 0; --i) m = sbn_merge(stack[i], m);
  return m;
}

/// Global mean and biased variance of channel c. Default mode: the ranks' moments merged in
/// rank order (sbn_rank_tree with a stack of kDepth partial results). More ranks than kDepth
/// serves (a launcher's mistake; never with the CPU's 64): NaN statistics, as garbage counts.
template <int kDepth = 64>
DETOPS_HOST_DEVICE inline SbnMoments sbn_global_moments(const SbnFinalizeArgs& a, std::int64_t c) {
  // garbage counts (negative, or overflowing; exact mode: 2^39 or more): NaN statistics;
  // otherwise no partial count of the merges below can overflow
  const std::int64_t n = sbn_forward_count(a.gathered, a.ranks, a.words, a.exact);
  if (n < 0 || !sbn_rank_tree_fits<kDepth>(a.ranks)) {
    const double nan = ::nan("");
    return {-1, nan, nan};
  }
  if (a.exact) {
    sbn_i128 s1 = 0, s2 = 0;
    for (std::int64_t r = 0; r < a.ranks; ++r) {
      const std::int64_t* rec = a.gathered + r * a.words;
      s1 = sbn_add_i128(s1, sbn_load_i128(rec + 1 + 4 * c));
      s2 = sbn_add_i128(s2, sbn_load_i128(rec + 1 + 4 * c + 2));
    }
    SbnMoments m{n, 0.0, 0.0};
    const std::int64_t e = a.exponents[c];
    if (n == 0) return m;
    if (e == kSbnZeroExponent) return m;
    if (!sbn_finite_exponent(e)) {  // kSbnNonFiniteExponent, or a garbage word
      const double nan = ::nan("");
      return {n, nan, nan};
    }
    const int scale = static_cast<int>(e) - kSbnFixedBits;
    const double dn = static_cast<double>(n);
    m.mean = ::ldexp(sbn_i128_to_double(s1) / dn, scale);
    const double var = ::ldexp(sbn_exact_var_numerator(n, s1, s2) / dn / dn, 2 * scale);
    m.m2 = var * dn;
    return m;
  }
  auto load = [&](std::int64_t r) {
    const std::int64_t* rec = a.gathered + r * a.words;
    return SbnMoments{rec[0], sbn_word_double(rec[1 + 2 * c]), sbn_word_double(rec[2 + 2 * c])};
  };
  return sbn_rank_tree<kDepth>(a.ranks, load, SbnMoments{0, 0.0, 0.0});
}

/// num_batches_tracked + 1, saturating at INT64_MAX (the count never wraps to a negative factor).
DETOPS_HOST_DEVICE inline std::int64_t sbn_next_count(std::int64_t n) {
  return n == 9223372036854775807LL ? n : n + 1;
}

/// Channel c of the forward's finalize: save_mean, save_invstd and the running statistics.
/// Global count 0: mean 0, invstd 0; count 1: var 0. Running statistics (and
/// num_batches_tracked) change only when the global count is at least 2 (the unbiased variance
/// M2 / (n - 1) needs it). kDepth: sbn_global_moments's.
template <int kDepth = 64>
DETOPS_HOST_DEVICE inline void sbn_finalize_channel(const SbnFinalizeArgs& a, std::int64_t c) {
  const SbnMoments m = sbn_global_moments<kDepth>(a, c);
  if (m.n < 0) {  // garbage counts
    a.save_mean[c] = m.mean;
    a.save_invstd[c] = m.mean;
    return;
  }
  if (m.n == 0) {
    a.save_mean[c] = 0.0;
    a.save_invstd[c] = 0.0;
    return;
  }
  const double dn = static_cast<double>(m.n);
  const double var = m.m2 / dn;
  a.save_mean[c] = m.mean;
  a.save_invstd[c] = 1.0 / ::sqrt(var + a.eps);
  if (m.n < 2 || !a.running_mean.data) return;
  const std::int64_t tracked = a.num_batches_tracked ? sbn_next_count(a.num_batches_tracked[0]) : 1;
  const double f = a.has_momentum ? a.momentum : 1.0 / static_cast<double>(tracked);
  const double unbiased = m.m2 / (dn - 1.0);
  sbn_store(a.running_mean, c, (1.0 - f) * sbn_load(a.running_mean, c, 0.0) + f * m.mean);
  sbn_store(a.running_var, c, (1.0 - f) * sbn_load(a.running_var, c, 0.0) + f * unbiased);
}

/// Evaluation mode: the running statistics as the saved ones.
DETOPS_HOST_DEVICE inline void sbn_eval_channel(const SbnParam& running_mean, const SbnParam& running_var, double eps,
                                                double* save_mean, double* save_invstd, std::int64_t c) {
  save_mean[c] = sbn_load(running_mean, c, 0.0);
  save_invstd[c] = 1.0 / ::sqrt(sbn_load(running_var, c, 1.0) + eps);
}

/// Backward finalize arguments.
struct SbnBackwardFinalizeArgs {
  const std::int64_t* gathered;
  std::int64_t ranks, words, channels, rank;
  bool exact;
  const std::int64_t* exponents;  // exact mode: [2C]: dy's, then dy * (x - mean)'s
  const double* save_invstd;
  double* sums;                   // [2C + 1]: global sum dy, global sum dy*(x - mean), count
  SbnParam grad_weight, grad_bias;  // this rank's: invstd * local sum dy*(x - mean), local sum dy
};

DETOPS_HOST_DEVICE inline double sbn_exact_sum(sbn_i128 s, std::int64_t e) {
  if (e == kSbnZeroExponent) return 0.0;
  if (!sbn_finite_exponent(e)) return ::nan("");  // kSbnNonFiniteExponent, or a garbage word
  return ::ldexp(sbn_i128_to_double(s), static_cast<int>(e) - kSbnFixedBits);
}

DETOPS_HOST_DEVICE inline SbnSums sbn_record_sums(const SbnBackwardFinalizeArgs& a, const std::int64_t* rec,
                                                  std::int64_t c) {
  if (a.exact)
    return {sbn_exact_sum(sbn_load_i128(rec + 1 + 4 * c), a.exponents[c]),
            sbn_exact_sum(sbn_load_i128(rec + 3 + 4 * c), a.exponents[a.channels + c])};
  return {sbn_word_double(rec[1 + 2 * c]), sbn_word_double(rec[2 + 2 * c])};
}

/// sums[2C]: the global count, NaN for garbage counts. Once per call, also when C == 0 (the
/// backends call it besides the channels).
DETOPS_HOST_DEVICE inline void sbn_finalize_backward_count(const SbnBackwardFinalizeArgs& a) {
  const std::int64_t n = sbn_global_count(a.gathered, a.ranks, a.words);
  a.sums[2 * a.channels] = n < 0 ? ::nan("") : static_cast<double>(n);
}

/// Channel c of the backward's finalize: the global sums (default mode: sbn_rank_tree of depth
/// kDepth; more ranks than it serves: NaN sums) and this rank's grad_weight and grad_bias.
template <int kDepth = 64>
DETOPS_HOST_DEVICE inline void sbn_finalize_backward_channel(const SbnBackwardFinalizeArgs& a, std::int64_t c) {
  SbnSums total{0.0, 0.0};
  if (a.exact) {
    sbn_i128 sdy = 0, sg = 0;
    for (std::int64_t r = 0; r < a.ranks; ++r) {
      sdy = sbn_add_i128(sdy, sbn_load_i128(a.gathered + r * a.words + 1 + 4 * c));
      sg = sbn_add_i128(sg, sbn_load_i128(a.gathered + r * a.words + 3 + 4 * c));
    }
    total = {sbn_exact_sum(sdy, a.exponents[c]), sbn_exact_sum(sg, a.exponents[a.channels + c])};
  } else if (sbn_rank_tree_fits<kDepth>(a.ranks)) {
    auto load = [&](std::int64_t r) { return sbn_record_sums(a, a.gathered + r * a.words, c); };
    total = sbn_rank_tree<kDepth>(a.ranks, load, SbnSums{0.0, 0.0});
  } else {
    total = {::nan(""), ::nan("")};
  }
  a.sums[c] = total.dy;
  a.sums[a.channels + c] = total.dyxmu;
  const SbnSums local = sbn_record_sums(a, a.gathered + a.rank * a.words, c);
  sbn_store(a.grad_weight, c, local.dyxmu * a.save_invstd[c]);
  sbn_store(a.grad_bias, c, local.dy);
}

// ---------------------------------------------------------------------------------------------
// Elementwise bodies (float64 arithmetic for every dtype, one rounding to the stored type).

/// y = (x - mean) * (weight * invstd) + bias.
DETOPS_HOST_DEVICE inline double sbn_apply(double x, double mean, double scale, double bias) {
  return (x - mean) * scale + bias;
}

/// Per-channel constants of the backward's elementwise pass:
///   dx = (dy - sum_dy / n - (x - mean) * invstd^2 * sum_dyxmu / n) * weight * invstd
struct SbnGradCoef {
  double k;      // weight * invstd
  double mdy;    // sum_dy / n
  double kx;     // invstd^2 * sum_dyxmu / n
  double mean;
};
DETOPS_HOST_DEVICE inline SbnGradCoef sbn_grad_coef(double weight, double mean, double invstd, double sum_dy,
                                                    double sum_dyxmu, double n) {
  SbnGradCoef g;
  g.k = weight * invstd;
  g.mean = mean;
  if (n > 0) {
    g.mdy = sum_dy / n;
    g.kx = (invstd * invstd) * (sum_dyxmu / n);
  } else if (n == 0) {
    g.mdy = 0.0;
    g.kx = 0.0;
  } else {  // a NaN (garbage records) or negative count from a caller of the phases: NaN gradients
    g.mdy = ::nan("");
    g.kx = g.mdy;
  }
  return g;
}
DETOPS_HOST_DEVICE inline double sbn_grad(double dy, double x, const SbnGradCoef& g) {
  return ((dy - g.mdy) - (x - g.mean) * g.kx) * g.k;
}

}  // namespace detail
}  // namespace detops
