// CUDA backend of SyncBatchNorm. Every result is the same bits as the CPU backend's: the math is
// the shared header's (detops/detail/sync_batch_norm_math.h), compiled with contraction off.
//
// Default mode, local statistics (forward moments, backward sums):
//   * chunk pass: one unit of work per (channel c, chunk k), chunk k = the channel's elements
//     [k * kSbnChunk, (k + 1) * kSbnChunk) in (n, h, w) order (a chunk may span images). When the channel is not the innermost dimension (NCHW and most other
//     strides) a warp takes a chunk: lane t loads the elements t, t + 32, ... (coalesced for a
//     contiguous plane), adds them in that order from 0.0, and the xor-shuffle butterfly
//     (offsets 16, 8, 4, 2, 1) combines the lanes. Lane t then holds v[t] + v[t ^ off] after each
//     level, which is sbn_lane_tree's v[t] + v[t + off] (IEEE addition is commutative), so every
//     lane ends with sbn_lane_tree's total. When the channel is innermost (NHWC) a thread takes a
//     (c, k) unit and calls sbn_chunk_moments / sbn_chunk_sums itself; adjacent threads read
//     adjacent channels (coalesced). Results go to a workspace [C][K].
//   * tree pass: a block per channel merges its K results level by level exactly as
//     sbn_tree_reduce does (pairs (2i, 2i + 1), an odd last carried up), ping-ponging between two
//     [C][K] buffers with a barrier per level, and writes the record.
// Exact mode: the same chunk units accumulate 128-bit integer sums of the quantized values
// (associative: any order gives the same sums); a block per channel adds the units' partials.
// Exponents (local scales): max |v| per unit (inf/NaN mapped to +inf, so a max never drops a
// NaN), its sbn_exponent, and an integer atomicMax into the channel's word (max is
// order-independent); the words start at kSbnZeroExponent.
// Finalize: a thread per channel runs sbn_finalize_channel / sbn_finalize_backward_channel (or
// sbn_eval_channel in evaluation mode); the forward then bumps num_batches_tracked in a second
// one-thread kernel on the same stream, after every channel has read it.
// Apply and backward apply: elementwise over any strides in float64, with a flat fast path when
// the tensors share a dense NCHW or NHWC layout. The backward's per-channel coefficients are
// computed once into a [C] workspace.
// Counts and offsets are 64-bit; empty problems write their (zero) records without launching
// empty grids.
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "cuda_check.cuh"
#include "detops/detail/sync_batch_norm_math.h"
#include "internal/sync_batch_norm_backend.h"

namespace detops {
namespace internal {

namespace {

using detail::kSbnChunk;
using detail::kSbnLanes;
using detail::sbn_i128;
using detail::sbn_u128;
using detail::SbnMoments;
using detail::SbnSums;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kPerLane = static_cast<int>(kSbnChunk / kSbnLanes);  // 8
constexpr int kWarpsPerBlock = kBlock / kSbnLanes;
static_assert(kSbnLanes == 32, "a chunk's lanes are a warp's");
static_assert(kBlock % kSbnLanes == 0, "warp kernels shuffle with the full mask: blocks must be whole warps");
static_assert(kSbnChunk % kSbnLanes == 0, "");


// ---------------------------------------------------------------------------------------------
// Geometry

/// Problem shape: [N, C, H, W]; a channel's count = N * H * W elements in (n, h, w) order make
/// K = sbn_chunks(count) chunks.
struct Shape {
  std::int64_t N, C, H, W, HW, count, K;
};

Shape shape_of(const TensorView& t) {
  Shape s;
  s.N = t.sizes[0];
  s.C = t.sizes[1];
  s.H = t.sizes[2];
  s.W = t.sizes[3];
  s.HW = s.H * s.W;
  s.count = s.N * s.HW;
  s.K = detail::sbn_chunks(s.count);
  return s;
}

/// Strides of one 4-d tensor; `ps` is the stride of the row-major position p = h * W + w when
/// it is uniform (then offset = p * ps), which holds for dense NCHW and NHWC alike.
struct Src {
  std::int64_t sN, sC, sH, sW;
  std::int64_t ps;
  bool uniform;
};

Src src_of(const TensorView& t) {
  Src s{t.strides[0], t.strides[1], t.strides[2], t.strides[3], 0, false};
  const std::int64_t H = t.sizes[2], W = t.sizes[3];
  if (H == 1) {
    s.ps = s.sW, s.uniform = true;
  } else if (W == 1) {
    s.ps = s.sH, s.uniform = true;
  } else if (s.sH == W * s.sW) {
    s.ps = s.sW, s.uniform = true;
  }
  return s;
}

template <bool kUniform>
__device__ __forceinline__ std::int64_t pos_offset(const Src& s, std::int64_t W, std::int64_t p) {
  if constexpr (kUniform) {
    return p * s.ps;
  } else {
    const std::int64_t h = p / W;
    return h * s.sH + (p - h * W) * s.sW;
  }
}

template <class T>
__device__ __forceinline__ double load_double(const T* p, std::int64_t off) {
  return static_cast<double>(to_acc(p[off]));
}

/// First element (in the channel's (n, h, w) order) and length of chunk k.
struct Chunk {
  std::int64_t r0, len;
};
__device__ __forceinline__ Chunk chunk_of(const Shape& g, std::int64_t k) {
  Chunk ch;
  ch.r0 = k * kSbnChunk;
  const std::int64_t rest = g.count - ch.r0;
  ch.len = rest < kSbnChunk ? rest : kSbnChunk;
  return ch;
}

/// Offset of element r (n = r / HW, p = r % HW) of a channel, from the channel's base.
template <bool kUniform>
__device__ __forceinline__ std::int64_t elem_offset(const Src& s, const Shape& g, std::int64_t r) {
  const std::int64_t n = r / g.HW;
  return n * s.sN + pos_offset<kUniform>(s, g.W, r - n * g.HW);
}

/// The butterfly of sbn_lane_tree on a warp: every lane returns the same bits as v[0] there.
__device__ __forceinline__ double warp_lane_tree(double v) {
#pragma unroll
  for (int off = kSbnLanes / 2; off >= 1; off /= 2) v = v + __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ sbn_i128 shfl_xor_i128(sbn_i128 v, int off) {
  const sbn_u128 u = static_cast<sbn_u128>(v);
  unsigned long long lo = static_cast<unsigned long long>(u);
  unsigned long long hi = static_cast<unsigned long long>(u >> 64);
  lo = __shfl_xor_sync(kFullMask, lo, off);
  hi = __shfl_xor_sync(kFullMask, hi, off);
  return static_cast<sbn_i128>((static_cast<sbn_u128>(hi) << 64) | static_cast<sbn_u128>(lo));
}

__device__ __forceinline__ sbn_i128 warp_sum_i128(sbn_i128 v) {
#pragma unroll
  for (int off = kSbnLanes / 2; off >= 1; off /= 2) v += shfl_xor_i128(v, off);
  return v;
}

__device__ __forceinline__ double warp_max(double v) {
#pragma unroll
  for (int off = kSbnLanes / 2; off >= 1; off /= 2) v = fmax(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

/// |v|, with inf and NaN both +inf: a max over these never loses a NaN, and sbn_exponent(+inf)
/// is kSbnNonFiniteExponent as sbn_exponent(NaN) is.
__device__ __forceinline__ double abs_or_inf(double v) {
  const double a = fabs(v);
  return a <= DBL_MAX ? a : __longlong_as_double(0x7ff0000000000000ll);
}

/// Warp-unit and thread-unit enumeration: unit u = c * K + k (warps; consecutive warps read
/// consecutive chunks of a plane) or u = k * C + c (threads; consecutive threads read consecutive
/// channels).
__device__ __forceinline__ std::int64_t warp_id() {
  return static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / kSbnLanes) + threadIdx.x / kSbnLanes;
}
__device__ __forceinline__ std::int64_t warp_count() {
  return static_cast<std::int64_t>(gridDim.x) * (blockDim.x / kSbnLanes);
}

unsigned warp_grid(std::int64_t units) {
  const std::int64_t blocks = (units + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::min<std::int64_t>(std::max<std::int64_t>(blocks, 1), 1 << 20));
}
unsigned channel_grid(std::int64_t C) { return static_cast<unsigned>(std::min<std::int64_t>(std::max<std::int64_t>(C, 1), 1 << 20)); }

// ---------------------------------------------------------------------------------------------
// Default mode: chunk moments and sums

template <class T, bool kUniform>
__global__ void moments_warp_kernel(const T* __restrict__ x, Src sx, Shape g, SbnMoments* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x % kSbnLanes);
  const std::int64_t units = g.C * g.K;
  for (std::int64_t u = warp_id(); u < units; u += warp_count()) {
    const std::int64_t c = u / g.K, k = u - c * g.K;
    const Chunk ch = chunk_of(g, k);
    const T* base = x + c * sx.sC;
    double v[kPerLane];
    double s = 0.0;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
      const std::int64_t i = lane + kSbnLanes * m;
      v[m] = 0.0;
      if (i < ch.len) {
        v[m] = load_double(base, elem_offset<kUniform>(sx, g, ch.r0 + i));
        s = s + v[m];
      }
    }
    const double mean = warp_lane_tree(s) / static_cast<double>(ch.len);
    double q = 0.0;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
      const std::int64_t i = lane + kSbnLanes * m;
      if (i < ch.len) {
        const double d = v[m] - mean;
        q = q + d * d;
      }
    }
    const double m2 = warp_lane_tree(q);
    if (lane == 0) out[u] = SbnMoments{ch.len, mean, m2};
  }
}

template <class T, bool kUniform>
__global__ void moments_thread_kernel(const T* __restrict__ x, Src sx, Shape g, SbnMoments* __restrict__ out) {
  DETOPS_GRID_STRIDE(u, g.C * g.K) {
    const std::int64_t k = u / g.C, c = u - k * g.C;
    const Chunk ch = chunk_of(g, k);
    const T* base = x + c * sx.sC;
    const std::int64_t r0 = ch.r0;
    auto load = [&](std::int64_t i) -> double { return load_double(base, elem_offset<kUniform>(sx, g, r0 + i)); };
    out[c * g.K + k] = detail::sbn_chunk_moments(load, ch.len);
  }
}

template <class T, bool kUniform>
__global__ void sums_warp_kernel(const T* __restrict__ dy, Src sg, const T* __restrict__ x, Src sx,
                                 const double* __restrict__ mean, Shape g, SbnSums* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x % kSbnLanes);
  const std::int64_t units = g.C * g.K;
  for (std::int64_t u = warp_id(); u < units; u += warp_count()) {
    const std::int64_t c = u / g.K, k = u - c * g.K;
    const Chunk ch = chunk_of(g, k);
    const T* gbase = dy + c * sg.sC;
    const T* xbase = x + c * sx.sC;
    const double mu = mean[c];
    double a = 0.0, b = 0.0;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
      const std::int64_t i = lane + kSbnLanes * m;
      if (i < ch.len) {
        const double gv = load_double(gbase, elem_offset<kUniform>(sg, g, ch.r0 + i));
        const double xv = load_double(xbase, elem_offset<kUniform>(sx, g, ch.r0 + i));
        a = a + gv;
        b = b + gv * (xv - mu);
      }
    }
    a = warp_lane_tree(a);
    b = warp_lane_tree(b);
    if (lane == 0) out[u] = SbnSums{a, b};
  }
}

template <class T, bool kUniform>
__global__ void sums_thread_kernel(const T* __restrict__ dy, Src sg, const T* __restrict__ x, Src sx,
                                   const double* __restrict__ mean, Shape g, SbnSums* __restrict__ out) {
  DETOPS_GRID_STRIDE(u, g.C * g.K) {
    const std::int64_t k = u / g.C, c = u - k * g.C;
    const Chunk ch = chunk_of(g, k);
    const T* gbase = dy + c * sg.sC;
    const T* xbase = x + c * sx.sC;
    const std::int64_t r0 = ch.r0;
    auto load_dy = [&](std::int64_t i) -> double { return load_double(gbase, elem_offset<kUniform>(sg, g, r0 + i)); };
    auto load_x = [&](std::int64_t i) -> double { return load_double(xbase, elem_offset<kUniform>(sx, g, r0 + i)); };
    out[c * g.K + k] = detail::sbn_chunk_sums(load_dy, load_x, mean[c], ch.len);
  }
}

__device__ __forceinline__ void put_record(const SbnMoments& m, std::int64_t* rec, std::int64_t c) {
  rec[1 + 2 * c] = detail::sbn_double_word(m.mean);
  rec[2 + 2 * c] = detail::sbn_double_word(m.m2);
}
__device__ __forceinline__ void put_record(const SbnSums& s, std::int64_t* rec, std::int64_t c) {
  rec[1 + 2 * c] = detail::sbn_double_word(s.dy);
  rec[2 + 2 * c] = detail::sbn_double_word(s.dyxmu);
}

/// sbn_tree_reduce over each channel's K >= 1 chunk results, a block per channel: level by
/// level, pairs (2i, 2i + 1) of `src` into `dst`[i], an odd last element carried to dst[half];
/// a barrier between levels, then the buffers swap. Writes the record (word 0 by channel 0).
template <class R>
__global__ void tree_kernel(R* a, R* b, Shape g, std::int64_t count, std::int64_t* __restrict__ rec) {
  for (std::int64_t c = blockIdx.x; c < g.C; c += gridDim.x) {
    R* src = a + c * g.K;
    R* dst = b + c * g.K;
    std::int64_t k = g.K;
    while (k > 1) {
      const std::int64_t half = k / 2;
      for (std::int64_t i = threadIdx.x; i < half; i += blockDim.x) dst[i] = detail::sbn_merge(src[2 * i], src[2 * i + 1]);
      if ((k & 1) && threadIdx.x == 0) dst[half] = src[k - 1];
      __syncthreads();
      R* t = src;
      src = dst;
      dst = t;
      k = half + (k & 1);
    }
    if (threadIdx.x == 0) {
      put_record(src[0], rec, c);
      if (c == 0) rec[0] = count;
    }
    __syncthreads();  // thread 0 has read src[0] before the block moves on
  }
}

/// A record with word 0 = count and every other word 0 (no element, or no channel).
__global__ void fill_record_kernel(std::int64_t* rec, std::int64_t words, std::int64_t count) {
  DETOPS_GRID_STRIDE(i, words) rec[i] = i == 0 ? count : 0;
}

// ---------------------------------------------------------------------------------------------
// Order-free passes: exact-mode integer sums and the exponents

enum class Pass { kExactForward, kExactBackward, kScalesForward, kScalesBackward };

struct alignas(16) Pair128 {
  sbn_i128 s1, s2;
};

template <class T>
struct PassArgs {
  const T* x;
  const T* dy;  // backward passes
  Src sx, sg;
  Shape g;
  const double* mean;             // backward passes
  const std::int64_t* exponents;  // exact passes: [C] or [2C]
  Pair128* partial;               // exact passes: [C][K] (unit order)
  std::int64_t* scales;           // scale passes: [C] or [2C], preset to kSbnZeroExponent
};

/// One (channel, chunk) unit over elements first, first + step, ... < len. kWarp: the lanes of a
/// warp share the unit and combine at the end; otherwise a thread owns it.
template <class T, bool kUniform, Pass P, bool kWarp>
__device__ __forceinline__ void order_free_unit(const PassArgs<T>& a, std::int64_t c, std::int64_t k, int first,
                                                int step) {
  constexpr bool kBackward = P == Pass::kExactBackward || P == Pass::kScalesBackward;
  constexpr bool kExact = P == Pass::kExactForward || P == Pass::kExactBackward;
  const Shape& g = a.g;
  const Chunk ch = chunk_of(g, k);
  const T* xbase = a.x + c * a.sx.sC;
  const T* gbase = kBackward ? a.dy + c * a.sg.sC : nullptr;
  const double mu = kBackward ? a.mean[c] : 0.0;
  std::int64_t e1 = 0, e2 = 0;
  if constexpr (kExact) {
    e1 = a.exponents[c];
    if constexpr (kBackward) e2 = a.exponents[g.C + c];
  }
  sbn_i128 s1 = 0, s2 = 0;
  double m1 = 0.0, m2 = 0.0;
  for (std::int64_t i = first; i < ch.len; i += step) {
    const double xv = load_double(xbase, elem_offset<kUniform>(a.sx, g, ch.r0 + i));
    if constexpr (P == Pass::kExactForward) {
      const std::int64_t q = detail::sbn_quantize(xv, e1);
      s1 += q;
      s2 += static_cast<sbn_i128>(q) * q;
    } else if constexpr (P == Pass::kScalesForward) {
      m1 = fmax(m1, abs_or_inf(xv));
    } else {
      const double gv = load_double(gbase, elem_offset<kUniform>(a.sg, g, ch.r0 + i));
      const double prod = gv * (xv - mu);
      if constexpr (P == Pass::kExactBackward) {
        s1 += detail::sbn_quantize(gv, e1);
        s2 += detail::sbn_quantize(prod, e2);
      } else {
        m1 = fmax(m1, abs_or_inf(gv));
        m2 = fmax(m2, abs_or_inf(prod));
      }
    }
  }
  if constexpr (kExact) {
    if constexpr (kWarp) {
      s1 = warp_sum_i128(s1);
      s2 = warp_sum_i128(s2);
      if (first != 0) return;
    }
    a.partial[c * g.K + k] = Pair128{s1, s2};
  } else {
    if constexpr (kWarp) {
      m1 = warp_max(m1);
      if constexpr (kBackward) m2 = warp_max(m2);
      if (first != 0) return;
    }
    atomicMax(reinterpret_cast<long long*>(a.scales + c), static_cast<long long>(detail::sbn_exponent(m1)));
    if constexpr (kBackward)
      atomicMax(reinterpret_cast<long long*>(a.scales + g.C + c), static_cast<long long>(detail::sbn_exponent(m2)));
  }
}

template <class T, bool kUniform, Pass P>
__global__ void order_free_warp_kernel(PassArgs<T> a) {
  const int lane = static_cast<int>(threadIdx.x % kSbnLanes);
  const std::int64_t units = a.g.C * a.g.K;
  for (std::int64_t u = warp_id(); u < units; u += warp_count()) {
    const std::int64_t c = u / a.g.K, k = u - c * a.g.K;
    order_free_unit<T, kUniform, P, true>(a, c, k, lane, kSbnLanes);
  }
}

template <class T, bool kUniform, Pass P>
__global__ void order_free_thread_kernel(PassArgs<T> a) {
  DETOPS_GRID_STRIDE(u, a.g.C * a.g.K) {
    const std::int64_t k = u / a.g.C, c = u - k * a.g.C;
    order_free_unit<T, kUniform, P, false>(a, c, k, 0, 1);
  }
}

/// Exact mode: a block per channel adds its K partials (integers: any order) and writes the
/// record's S1 and S2 (word 0 by channel 0).
__global__ void exact_reduce_kernel(const Pair128* __restrict__ partial, Shape g, std::int64_t count,
                                    std::int64_t* __restrict__ rec) {
  __shared__ Pair128 warp_sums[kWarpsPerBlock];
  const int lane = static_cast<int>(threadIdx.x % kSbnLanes), warp = static_cast<int>(threadIdx.x / kSbnLanes);
  for (std::int64_t c = blockIdx.x; c < g.C; c += gridDim.x) {
    sbn_i128 s1 = 0, s2 = 0;
    for (std::int64_t i = threadIdx.x; i < g.K; i += blockDim.x) {
      const Pair128 p = partial[c * g.K + i];
      s1 += p.s1;
      s2 += p.s2;
    }
    s1 = warp_sum_i128(s1);
    s2 = warp_sum_i128(s2);
    if (lane == 0) warp_sums[warp] = Pair128{s1, s2};
    __syncthreads();
    if (threadIdx.x == 0) {
      sbn_i128 t1 = 0, t2 = 0;
      for (int w = 0; w < static_cast<int>(blockDim.x / kSbnLanes); ++w) {
        t1 += warp_sums[w].s1;
        t2 += warp_sums[w].s2;
      }
      detail::sbn_store_i128(t1, rec + 1 + 4 * c);
      detail::sbn_store_i128(t2, rec + 3 + 4 * c);
      if (c == 0) rec[0] = count;
    }
    __syncthreads();  // warp_sums is reused by the next channel
  }
}

__global__ void fill_words_kernel(std::int64_t* p, std::int64_t n, std::int64_t value) {
  DETOPS_GRID_STRIDE(i, n) p[i] = value;
}

// ---------------------------------------------------------------------------------------------
// Finalize and merge

__global__ void merge_scales_kernel(const std::int64_t* __restrict__ gathered, std::int64_t ranks, std::int64_t words,
                                    std::int64_t* __restrict__ scales) {
  DETOPS_GRID_STRIDE(i, words) {
    std::int64_t m = detail::kSbnZeroExponent;
    for (std::int64_t r = 0; r < ranks; ++r) {
      const std::int64_t v = gathered[r * words + i];
      m = v > m ? v : m;
    }
    scales[i] = m;
  }
}

__global__ void finalize_kernel(detail::SbnFinalizeArgs a) { DETOPS_GRID_STRIDE(c, a.channels) detail::sbn_finalize_channel(a, c); }

/// num_batches_tracked + 1 (saturating) once, after finalize_kernel (same stream) has read it in every channel.
__global__ void bump_batches_kernel(const std::int64_t* __restrict__ gathered, std::int64_t ranks, std::int64_t words,
                                    bool exact, std::int64_t* num_batches_tracked) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && detail::sbn_forward_count(gathered, ranks, words, exact) >= 2)
    num_batches_tracked[0] = detail::sbn_next_count(num_batches_tracked[0]);
}

__global__ void eval_stats_kernel(detail::SbnParam running_mean, detail::SbnParam running_var, double eps,
                                  std::int64_t channels, double* save_mean, double* save_invstd) {
  DETOPS_GRID_STRIDE(c, channels) detail::sbn_eval_channel(running_mean, running_var, eps, save_mean, save_invstd, c);
}

__global__ void finalize_backward_kernel(detail::SbnBackwardFinalizeArgs a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) detail::sbn_finalize_backward_count(a);  // also when C == 0
  DETOPS_GRID_STRIDE(c, a.channels) detail::sbn_finalize_backward_channel(a, c);
}

// ---------------------------------------------------------------------------------------------
// Elementwise passes

enum class Flat { kGeneric, kNchw, kNhwc };

/// Whether the view is exactly dense NCHW or NHWC (other views take the generic path).
Flat flat_layout(const TensorView& t) {
  const std::int64_t C = t.sizes[1], H = t.sizes[2], W = t.sizes[3];
  const std::int64_t* s = t.strides;
  if (s[3] == 1 && s[2] == W && s[1] == H * W && s[0] == C * H * W) return Flat::kNchw;
  if (s[1] == 1 && s[3] == C && s[2] == W * C && s[0] == H * W * C) return Flat::kNhwc;
  return Flat::kGeneric;
}
bool same_strides(const TensorView& a, const TensorView& b) {
  for (int d = 0; d < 4; ++d)
    if (a.strides[d] != b.strides[d]) return false;
  return true;
}

/// Channel of logical (NCHW-order) element i, and its offsets in up to three tensors.
template <Flat L>
__device__ __forceinline__ std::int64_t element_at(std::int64_t i, const Shape& g, const Src& s0, const Src& s1,
                                                   const Src& s2, std::int64_t& o0, std::int64_t& o1,
                                                   std::int64_t& o2) {
  if constexpr (L == Flat::kNchw) {
    o0 = o1 = o2 = i;
    return (i / g.HW) % g.C;
  } else if constexpr (L == Flat::kNhwc) {
    o0 = o1 = o2 = i;
    return i % g.C;
  } else {
    std::int64_t t = i / g.W;
    const std::int64_t w = i - t * g.W;
    const std::int64_t h = t % g.H;
    t /= g.H;
    const std::int64_t c = t % g.C;
    const std::int64_t n = t / g.C;
    o0 = n * s0.sN + c * s0.sC + h * s0.sH + w * s0.sW;
    o1 = n * s1.sN + c * s1.sC + h * s1.sH + w * s1.sW;
    o2 = n * s2.sN + c * s2.sC + h * s2.sH + w * s2.sW;
    return c;
  }
}

template <class T, Flat L>
__global__ void apply_kernel(const T* x, Src sx, T* y, Src sy, Shape g, detail::SbnParam weight, detail::SbnParam bias,
                             const double* __restrict__ mean, const double* __restrict__ invstd, std::int64_t total) {
  DETOPS_GRID_STRIDE(i, total) {
    std::int64_t ox, oy, unused;
    const std::int64_t c = element_at<L>(i, g, sx, sy, sy, ox, oy, unused);
    const double scale = detail::sbn_load(weight, c, 1.0) * invstd[c];
    const double v = detail::sbn_apply(static_cast<double>(to_acc(x[ox])), mean[c], scale, detail::sbn_load(bias, c, 0.0));
    y[oy] = from_double<T>(v);
  }
}

__global__ void grad_coef_kernel(detail::SbnParam weight, const double* __restrict__ mean,
                                 const double* __restrict__ invstd, const double* __restrict__ sums, std::int64_t C,
                                 detail::SbnGradCoef* __restrict__ coef) {
  DETOPS_GRID_STRIDE(c, C) {
    const double w = detail::sbn_load(weight, c, 1.0);
    coef[c] = sums ? detail::sbn_grad_coef(w, mean[c], invstd[c], sums[c], sums[C + c], sums[2 * C])
                   : detail::sbn_grad_coef(w, mean[c], invstd[c], 0.0, 0.0, 0.0);
  }
}

template <class T, Flat L>
__global__ void backward_apply_kernel(const T* dy, Src sg, const T* x, Src sx, T* dx, Src sd, Shape g,
                                      const detail::SbnGradCoef* __restrict__ coef, std::int64_t total) {
  DETOPS_GRID_STRIDE(i, total) {
    std::int64_t og, ox, od;
    const std::int64_t c = element_at<L>(i, g, sg, sx, sd, og, ox, od);
    const double v = detail::sbn_grad(static_cast<double>(to_acc(dy[og])), static_cast<double>(to_acc(x[ox])), coef[c]);
    dx[od] = from_double<T>(v);
  }
}

// ---------------------------------------------------------------------------------------------
// Host helpers

/// The scratch of each pass, in one fixed order (used for sizing and for carving): the default
/// mode's two [C][K] ping-pong buffers of moments (forward) or sums (backward), the exact mode's
/// [C][K] integer partials, or backward_apply's [C] coefficients.
WorkspaceLayout pass_layout(SbnPass pass, const TensorView& x, bool exact) {
  const Shape g = shape_of(x);
  const std::int64_t units = g.C * g.K;
  WorkspaceLayout l;
  if (pass == SbnPass::kBackwardApply) {
    if (g.N * g.C * g.HW > 0) l.add<detail::SbnGradCoef>(g.C);
  } else if (units > 0) {
    if (exact) {
      l.add<Pair128>(units);
    } else if (pass == SbnPass::kLocalStats) {
      l.add<SbnMoments>(units);
      l.add<SbnMoments>(units);
    } else {
      l.add<SbnSums>(units);
      l.add<SbnSums>(units);
    }
  }
  return l;
}

/// `pass`'s layout bound to ws (which the front end sized with scratch_bytes()).
WorkspaceLayout bind_pass(SbnPass pass, const TensorView& x, bool exact, Workspace ws, const char* op) {
  WorkspaceLayout l = pass_layout(pass, x, exact);
  if (ws.bytes < l.bytes())
    fail(ErrorCode::kInvalidArgument, "{}: internal: backend scratch has {} bytes; the pass needs {}", op, ws.bytes,
         l.bytes());
  l.bind(ws.data);
  return l;
}

void fill_record(std::int64_t* rec, std::int64_t words, std::int64_t count, const char* op, const Context& ctx) {
  fill_record_kernel<<<grid_for(words), kBlock, 0, stream_of(ctx)>>>(rec, words, count);
  check_launch("fill_record_kernel", op, ctx);
}

/// Launches the warp or thread variant of a chunk kernel, uniform or generic positions.
template <class Launch>
void launch_chunks(bool threads, bool uniform, Launch&& launch) {
  if (threads) {
    if (uniform) launch(std::true_type{}, std::true_type{});
    else launch(std::true_type{}, std::false_type{});
  } else {
    if (uniform) launch(std::false_type{}, std::true_type{});
    else launch(std::false_type{}, std::false_type{});
  }
}

template <class T>
void local_stats_default(const TensorView& x, std::int64_t* record, Workspace ws, const char* op, const Context& ctx) {
  const Shape g = shape_of(x);
  const Src sx = src_of(x);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  cudaStream_t stream = stream_of(ctx);
  if (units == 0) return fill_record(record, detail::sbn_record_words(g.C, false), count, op, ctx);
  WorkspaceLayout l = bind_pass(SbnPass::kLocalStats, x, false, ws, op);
  SbnMoments* a = l.take<SbnMoments>();
  SbnMoments* b = l.take<SbnMoments>();
  const T* xp = static_cast<const T*>(x.data);
  launch_chunks(channels_innermost(x), sx.uniform, [&](auto thr, auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if constexpr (decltype(thr)::value) {
      moments_thread_kernel<T, kU><<<grid_for(units), kBlock, 0, stream>>>(xp, sx, g, a);
    } else {
      moments_warp_kernel<T, kU><<<warp_grid(units), kBlock, 0, stream>>>(xp, sx, g, a);
    }
  });
  check_launch("moments_kernel", op, ctx);
  tree_kernel<SbnMoments><<<channel_grid(g.C), kBlock, 0, stream>>>(a, b, g, count, record);
  check_launch("tree_kernel", op, ctx);
}

template <class T>
void local_backward_default(const TensorView& dy, const TensorView& x, const double* mean, std::int64_t* record,
                            Workspace ws, const char* op, const Context& ctx) {
  const Shape g = shape_of(x);
  const Src sx = src_of(x), sg = src_of(dy);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  cudaStream_t stream = stream_of(ctx);
  if (units == 0) return fill_record(record, detail::sbn_record_words(g.C, false), count, op, ctx);
  WorkspaceLayout l = bind_pass(SbnPass::kLocalBackward, x, false, ws, op);
  SbnSums* a = l.take<SbnSums>();
  SbnSums* b = l.take<SbnSums>();
  const T* xp = static_cast<const T*>(x.data);
  const T* gp = static_cast<const T*>(dy.data);
  launch_chunks(channels_innermost(x), sx.uniform && sg.uniform, [&](auto thr, auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if constexpr (decltype(thr)::value) {
      sums_thread_kernel<T, kU><<<grid_for(units), kBlock, 0, stream>>>(gp, sg, xp, sx, mean, g, a);
    } else {
      sums_warp_kernel<T, kU><<<warp_grid(units), kBlock, 0, stream>>>(gp, sg, xp, sx, mean, g, a);
    }
  });
  check_launch("sums_kernel", op, ctx);
  tree_kernel<SbnSums><<<channel_grid(g.C), kBlock, 0, stream>>>(a, b, g, count, record);
  check_launch("tree_kernel", op, ctx);
}

template <class T, Pass P>
void launch_order_free(const PassArgs<T>& a, bool threads, bool uniform, const char* op, const Context& ctx) {
  const std::int64_t units = a.g.C * a.g.K;
  cudaStream_t stream = stream_of(ctx);
  launch_chunks(threads, uniform, [&](auto thr, auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if constexpr (decltype(thr)::value) {
      order_free_thread_kernel<T, kU, P><<<grid_for(units), kBlock, 0, stream>>>(a);
    } else {
      order_free_warp_kernel<T, kU, P><<<warp_grid(units), kBlock, 0, stream>>>(a);
    }
  });
  check_launch("order_free_kernel", op, ctx);
}

/// Exact mode, forward (dy absent) or backward: partial integer sums per unit, then per channel.
template <class T>
void local_exact(bool backward, const TensorView& dy, const TensorView& x, const double* mean,
                 const std::int64_t* exponents, std::int64_t* record, Workspace ws, const char* op,
                 const Context& ctx) {
  const Shape g = shape_of(x);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  if (units == 0) return fill_record(record, detail::sbn_record_words(g.C, true), count, op, ctx);
  WorkspaceLayout l = bind_pass(backward ? SbnPass::kLocalBackward : SbnPass::kLocalStats, x, true, ws, op);
  PassArgs<T> a{};
  a.x = static_cast<const T*>(x.data);
  a.dy = backward ? static_cast<const T*>(dy.data) : nullptr;
  a.sx = src_of(x);
  a.sg = backward ? src_of(dy) : a.sx;
  a.g = g;
  a.mean = mean;
  a.exponents = exponents;
  a.partial = l.take<Pair128>();
  a.scales = nullptr;
  const bool threads = channels_innermost(x), uniform = a.sx.uniform && a.sg.uniform;
  if (backward) launch_order_free<T, Pass::kExactBackward>(a, threads, uniform, op, ctx);
  else launch_order_free<T, Pass::kExactForward>(a, threads, uniform, op, ctx);
  exact_reduce_kernel<<<channel_grid(g.C), kBlock, 0, stream_of(ctx)>>>(a.partial, g, count, record);
  check_launch("exact_reduce_kernel", op, ctx);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points (the backend table)

namespace {


std::size_t scratch_bytes(SbnPass pass, const TensorView& x, bool exact) {
  return pass_layout(pass, x, exact).bytes();
}

void local_scales(const SbnLocalCall& call, const Context& ctx) {
  const char* op = "sync_batch_norm_local_scales";
  const TensorView& x = call.x;
  const TensorView& dy = call.dy;
  std::int64_t* scales = call.out;
  DeviceGuard guard(x.device.index, op);
  const bool backward = dy.defined();  // as the CPU backend: an empty dy may have no data
  const Shape g = shape_of(x);
  const std::int64_t words = backward ? 2 * g.C : g.C;
  if (words == 0) return;
  fill_words_kernel<<<grid_for(words), kBlock, 0, stream_of(ctx)>>>(scales, words, detail::kSbnZeroExponent);
  check_launch("fill_words_kernel", op, ctx);
  if (g.C * g.K == 0) return;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    PassArgs<T> a{};
    a.x = static_cast<const T*>(x.data);
    a.dy = backward ? static_cast<const T*>(dy.data) : nullptr;
    a.sx = src_of(x);
    a.sg = backward ? src_of(dy) : a.sx;
    a.g = g;
    a.mean = call.mean;
    a.exponents = nullptr;
    a.partial = nullptr;
    a.scales = scales;
    const bool threads = channels_innermost(x), uniform = a.sx.uniform && a.sg.uniform;
    if (backward) launch_order_free<T, Pass::kScalesBackward>(a, threads, uniform, op, ctx);
    else launch_order_free<T, Pass::kScalesForward>(a, threads, uniform, op, ctx);
  });
}

void merge_scales(const SbnMergeCall& a, const Context& ctx) {
  const char* op = "sync_batch_norm_merge_scales";
  DeviceGuard guard(a.device.index, op);
  if (a.words <= 0) return;
  merge_scales_kernel<<<grid_for(a.words), kBlock, 0, stream_of(ctx)>>>(a.gathered, a.ranks, a.words, a.scales);
  check_launch("merge_scales_kernel", op, ctx);
}

void local_stats(const SbnLocalCall& a, const Context& ctx, Workspace ws) {
  const char* op = "sync_batch_norm_local_stats";
  DeviceGuard guard(a.x.device.index, op);
  dispatch_floating(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (a.exact) local_exact<T>(false, TensorView{}, a.x, nullptr, a.scales, a.out, ws, op, ctx);
    else local_stats_default<T>(a.x, a.out, ws, op, ctx);
  });
}

void local_backward(const SbnLocalCall& a, const Context& ctx, Workspace ws) {
  const char* op = "sync_batch_norm_local_backward";
  DeviceGuard guard(a.x.device.index, op);
  dispatch_floating(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (a.exact) local_exact<T>(true, a.dy, a.x, a.mean, a.scales, a.out, ws, op, ctx);
    else local_backward_default<T>(a.dy, a.x, a.mean, a.out, ws, op, ctx);
  });
}

void finalize(const detail::SbnFinalizeArgs& args, Device device, const Context& ctx) {
  const char* op = "sync_batch_norm_finalize_stats";
  DeviceGuard guard(device.index, op);
  cudaStream_t stream = stream_of(ctx);
  if (args.channels > 0) {
    finalize_kernel<<<grid_for(args.channels), kBlock, 0, stream>>>(args);
    check_launch("finalize_kernel", op, ctx);
  }
  if (args.num_batches_tracked && args.running_mean.data) {
    bump_batches_kernel<<<1, 1, 0, stream>>>(args.gathered, args.ranks, args.words, args.exact,
                                             args.num_batches_tracked);
    check_launch("bump_batches_kernel", op, ctx);
  }
}

void finalize_backward(const detail::SbnBackwardFinalizeArgs& args, Device device, const Context& ctx) {
  const char* op = "sync_batch_norm_finalize_backward";
  DeviceGuard guard(device.index, op);
  // launched also for C == 0: sums[0] receives the count
  finalize_backward_kernel<<<grid_for(args.channels > 0 ? args.channels : 1), kBlock, 0, stream_of(ctx)>>>(args);
  check_launch("finalize_backward_kernel", op, ctx);
}

void eval_stats(const SbnEvalCall& a, const Context& ctx) {
  const char* op = "sync_batch_norm_forward";
  DeviceGuard guard(a.device.index, op);
  if (a.channels <= 0) return;
  eval_stats_kernel<<<grid_for(a.channels), kBlock, 0, stream_of(ctx)>>>(a.running_mean, a.running_var, a.eps,
                                                                        a.channels, a.save_mean, a.save_invstd);
  check_launch("eval_stats_kernel", op, ctx);
}

void apply(const SbnApplyCall& a, const Context& ctx) {
  const char* op = "sync_batch_norm_apply";
  const TensorView& x = a.x;
  const TensorView& y = a.y;
  DeviceGuard guard(x.device.index, op);
  const Shape g = shape_of(x);
  const std::int64_t total = g.N * g.C * g.HW;
  if (total == 0) return;
  const Src sx = src_of(x), sy = src_of(y);
  const Flat flat = same_strides(x, y) ? flat_layout(x) : Flat::kGeneric;
  cudaStream_t stream = stream_of(ctx);
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data);
    T* yp = static_cast<T*>(y.data);
    switch (flat) {
      case Flat::kNchw:
        apply_kernel<T, Flat::kNchw><<<grid_for(total), kBlock, 0, stream>>>(xp, sx, yp, sy, g, a.weight, a.bias, a.mean, a.invstd, total);
        break;
      case Flat::kNhwc:
        apply_kernel<T, Flat::kNhwc><<<grid_for(total), kBlock, 0, stream>>>(xp, sx, yp, sy, g, a.weight, a.bias, a.mean, a.invstd, total);
        break;
      case Flat::kGeneric:
        apply_kernel<T, Flat::kGeneric><<<grid_for(total), kBlock, 0, stream>>>(xp, sx, yp, sy, g, a.weight, a.bias, a.mean, a.invstd, total);
        break;
    }
  });
  check_launch("apply_kernel", op, ctx);
}

void backward_apply(const SbnBackwardApplyCall& a, const Context& ctx, Workspace ws) {
  const char* op = "sync_batch_norm_backward_apply";
  const TensorView& dy = a.dy;
  const TensorView& x = a.x;
  const TensorView& dx = a.dx;
  DeviceGuard guard(x.device.index, op);
  const Shape g = shape_of(x);
  const std::int64_t total = g.N * g.C * g.HW;
  if (total == 0) return;
  cudaStream_t stream = stream_of(ctx);
  WorkspaceLayout l = bind_pass(SbnPass::kBackwardApply, x, false, ws, op);
  detail::SbnGradCoef* coef = l.take<detail::SbnGradCoef>();
  grad_coef_kernel<<<grid_for(g.C), kBlock, 0, stream>>>(a.weight, a.mean, a.invstd, a.sums, g.C, coef);
  check_launch("grad_coef_kernel", op, ctx);
  const Src sg = src_of(dy), sx = src_of(x), sd = src_of(dx);
  const Flat flat = same_strides(dy, x) && same_strides(dy, dx) ? flat_layout(x) : Flat::kGeneric;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(dy.data);
    const T* xp = static_cast<const T*>(x.data);
    T* dp = static_cast<T*>(dx.data);
    switch (flat) {
      case Flat::kNchw:
        backward_apply_kernel<T, Flat::kNchw><<<grid_for(total), kBlock, 0, stream>>>(gp, sg, xp, sx, dp, sd, g, coef, total);
        break;
      case Flat::kNhwc:
        backward_apply_kernel<T, Flat::kNhwc><<<grid_for(total), kBlock, 0, stream>>>(gp, sg, xp, sx, dp, sd, g, coef, total);
        break;
      case Flat::kGeneric:
        backward_apply_kernel<T, Flat::kGeneric><<<grid_for(total), kBlock, 0, stream>>>(gp, sg, xp, sx, dp, sd, g, coef, total);
        break;
    }
  });
  check_launch("backward_apply_kernel", op, ctx);
}

}  // namespace

extern const SyncBnBackend kSyncBnCuda = {&scratch_bytes, &local_scales, &merge_scales, &local_stats,
                                          &local_backward, &finalize, &finalize_backward, &eval_stats,
                                          &apply, &backward_apply};

}  // namespace internal
}  // namespace detops
