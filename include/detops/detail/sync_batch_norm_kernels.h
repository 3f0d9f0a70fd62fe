// Bodies of every SyncBatchNorm CUDA kernel, as __host__ __device__ functions, so that the tests
// run them on the CPU (tests/sync_batch_norm_emulated_test.cpp) and cuda/sync_batch_norm_cuda.cu's
// __global__ functions are one-line calls into them.
//
// Two kinds of body:
//   * per-thread bodies f(index, args) of the grid-stride kernels (as detail/roi_align_kernels.h);
//   * warp- and block-level bodies (the default mode's chunk moments and sums over a warp, the
//     per-channel tree over a block, the exact mode's per-channel sum over a block), written
//     against a thread group G, the small shuffle/barrier interface below. The CUDA backend's
//     group is the calling thread (G::kRun == 1; butterfly = __shfl_xor_sync, sync =
//     __syncthreads). SbnLockstep is the CPU's: it runs all 32 lanes of a warp, or all threads of
//     a block, at once.
//
// The group interface (every member const):
//   G::kRun              threads this object runs: 1 on the device, 32 or a whole block on the CPU
//   int thread(int r)    block-local thread index of run slot r (0 <= r < kRun)
//   int lane(int r)      thread(r) % 32
//   int64 block()        blockIdx.x;   int64 blocks(): gridDim.x;   int threads(): blockDim.x
//   butterfly(V* v, op)  each warp's xor butterfly on one value per run slot: for off = 16, 8, 4,
//                        2, 1, thread t's value becomes op(own value, value of thread t ^ off)
//                        (device: one __shfl_xor_sync per level; CPU: all lanes in lockstep,
//                        reading the values of the level before)
//   sync()               a block barrier (device: __syncthreads(); CPU: nothing to do, or the
//                        block's SbnBlockHooks when its warps run as separate groups)
//   shared<V, N>()       the block's shared array of N values of V (device: a __shared__ array;
//                        CPU: poisoned bytes, the group's own or the block's SbnBlockHooks')
// A body is written in phases: a loop over the run slots between two group operations, every
// per-thread variable an array of kRun values (on the device, one value: the loops vanish). On
// the CPU a phase runs for every thread of the block before the next starts, which is what the
// barrier between them guarantees on the device; SbnLockstep can run the threads of each phase last to first, so that a value a phase
// reads from another thread of the same phase changes the result. A block can also run as
// separate warps, one at a time, that hand on the turn at each sync() (SbnBlockHooks, in the
// test): a barrier missing between a write and another warp's read then changes the result.
// Control flow around group operations must be uniform over the group (a warp for butterfly, the
// block for sync), as on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "detops/detail/host_device.h"
#include "detops/detail/sync_batch_norm_math.h"
#include "detops/dtype.h"

// Full unrolling of the per-lane loops on the device (GCC would warn about an unknown pragma).
#if defined(__CUDACC__)
#define DETOPS_SBN_UNROLL _Pragma("unroll")
#else
#define DETOPS_SBN_UNROLL
#endif

namespace detops {
namespace detail {

inline constexpr int kSbnBlock = 256;  // threads per block of every SyncBatchNorm kernel
inline constexpr int kSbnWarpsPerBlock = kSbnBlock / kSbnLanes;
inline constexpr int kSbnPerLane = static_cast<int>(kSbnChunk / kSbnLanes);  // elements per lane of a chunk
static_assert(kSbnLanes == 32, "a chunk's lanes are a warp's");
static_assert(kSbnBlock % kSbnLanes == 0, "warp bodies shuffle with the full mask: blocks must be whole warps");
static_assert(kSbnChunk % kSbnLanes == 0, "");

// ---------------------------------------------------------------------------------------------
// Geometry

/// Problem shape: [N, C, H, W]; a channel's count = N * H * W elements in (n, h, w) order make
/// K = sbn_chunks(count) chunks.
struct SbnShape {
  std::int64_t N, C, H, W, HW, count, K;
};
DETOPS_HOST_DEVICE inline SbnShape sbn_shape(const std::int64_t* sizes) {
  SbnShape s;
  s.N = sizes[0];
  s.C = sizes[1];
  s.H = sizes[2];
  s.W = sizes[3];
  s.HW = s.H * s.W;
  s.count = s.N * s.HW;
  s.K = sbn_chunks(s.count);
  return s;
}

/// Strides of one 4-d tensor; `ps` is the stride of the row-major position p = h * W + w when
/// it is uniform (then offset = p * ps), which holds for dense NCHW and NHWC alike.
struct SbnSrc {
  std::int64_t sN, sC, sH, sW;
  std::int64_t ps;
  bool uniform;
};
DETOPS_HOST_DEVICE inline SbnSrc sbn_src(const std::int64_t* sizes, const std::int64_t* strides) {
  SbnSrc s{strides[0], strides[1], strides[2], strides[3], 0, false};
  const std::int64_t H = sizes[2], W = sizes[3];
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
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE std::int64_t sbn_pos_offset(const SbnSrc& s, std::int64_t W, std::int64_t p) {
  if constexpr (kUniform) {
    return p * s.ps;
  } else {
    const std::int64_t h = p / W;
    return h * s.sH + (p - h * W) * s.sW;
  }
}

/// Offset of element r (n = r / HW, p = r % HW) of a channel, from the channel's base.
template <bool kUniform>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE std::int64_t sbn_elem_offset(const SbnSrc& s, const SbnShape& g, std::int64_t r) {
  const std::int64_t n = r / g.HW;
  return n * s.sN + sbn_pos_offset<kUniform>(s, g.W, r - n * g.HW);
}

template <class T>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE double sbn_load_double(const T* p, std::int64_t off) {
  return static_cast<double>(to_acc(p[off]));
}

/// First element (in the channel's (n, h, w) order) and length of chunk k.
struct SbnChunkRange {
  std::int64_t r0, len;
};
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE SbnChunkRange sbn_chunk_of(const SbnShape& g, std::int64_t k) {
  SbnChunkRange ch;
  ch.r0 = k * kSbnChunk;
  const std::int64_t rest = g.count - ch.r0;
  ch.len = rest < kSbnChunk ? rest : kSbnChunk;
  return ch;
}

/// Blocks of the warp kernels (kSbnWarpsPerBlock units per block) and of the per-channel block
/// kernels, capped at 2^20 (the bodies stride over what a capped grid does not cover).
inline unsigned sbn_warp_grid(std::int64_t units) {
  std::int64_t blocks = (units + kSbnWarpsPerBlock - 1) / kSbnWarpsPerBlock;
  blocks = blocks < 1 ? 1 : blocks;
  return static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20));
}
inline unsigned sbn_channel_grid(std::int64_t C) {
  const std::int64_t blocks = C < 1 ? 1 : C;
  return static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20));
}

// ---------------------------------------------------------------------------------------------
// The CPU's thread group.

/// A block whose warps run as separate groups (host threads taking turns): the block barrier and
/// the block's shared memory.
struct SbnBlockHooks {
  virtual void sync() = 0;
  virtual void* shared(std::size_t bytes) = 0;  // the same bytes for every warp of the block

 protected:
  ~SbnBlockHooks() = default;
};

/// kRun threads of one block in lockstep: a warp (kRun == 32, `first` its first thread) or a
/// whole block (kRun == threads). `reverse` runs each phase's threads last to first.
template <int kRunT>
struct SbnLockstep {
  static constexpr int kRun = kRunT;
  static_assert(kRun % kSbnLanes == 0, "whole warps");
  int first = 0;
  std::int64_t block_index = 0, grid_blocks = 1;
  int block_threads = kSbnBlock;
  bool reverse = false;
  SbnBlockHooks* hooks = nullptr;  // set when the block's warps run as separate groups

  int thread(int r) const { return first + (reverse ? kRun - 1 - r : r); }
  int lane(int r) const { return thread(r) % kSbnLanes; }
  std::int64_t block() const { return block_index; }
  std::int64_t blocks() const { return grid_blocks; }
  int threads() const { return block_threads; }
  void sync() const {
    if (hooks) hooks->sync();
  }
  template <class V, int N>
  V* shared() const {
    if (hooks) return static_cast<V*>(hooks->shared(sizeof(V) * N));
    static_assert(sizeof(V) * N <= sizeof(shared_bytes), "");
    std::memset(shared_bytes, 0xCD, sizeof(shared_bytes));  // not initialized on the device either
    return reinterpret_cast<V*>(shared_bytes);
  }
  template <class V, class Op>
  void butterfly(V* v, Op op) const {
    V old[kRun];
    for (int off = kSbnLanes / 2; off >= 1; off /= 2) {
      for (int r = 0; r < kRun; ++r) old[r] = v[r];
      for (int r = 0; r < kRun; ++r) v[r] = op(old[r], old[slot(thread(r) ^ off)]);
    }
  }

 private:
  int slot(int t) const { return reverse ? kRun - 1 - (t - first) : t - first; }
  alignas(64) mutable unsigned char shared_bytes[1024];
};

// ---------------------------------------------------------------------------------------------
// Default mode: chunk moments (forward) and sums (backward), then the per-channel tree.
//
// Unit u is a (channel c, chunk k) pair. When the channel is not the innermost dimension (NCHW
// and most other strides) a warp takes a unit (u = c * K + k: consecutive warps read consecutive
// chunks of a plane): lane t loads the elements t, t + 32, ... (coalesced for a contiguous plane),
// adds them in that order from 0.0, and the butterfly (offsets 16, 8, 4, 2, 1) combines the lanes.
// Lane t then holds v[t] + v[t ^ off] after each level, which is sbn_lane_tree's v[t] + v[t + off]
// (IEEE addition is commutative), so every lane ends with sbn_lane_tree's total. When the channel
// is innermost (NHWC) a thread takes a unit (u = k * C + c: adjacent threads read adjacent
// channels) and calls sbn_chunk_moments / sbn_chunk_sums itself. Results go to [C][K].

template <class T>
struct SbnMomentsArgs {
  const T* x;
  SbnSrc sx;
  SbnShape g;
  SbnMoments* out;  // [C][K]
};

template <class T>
struct SbnSumsArgs {
  const T* dy;
  SbnSrc sg;
  const T* x;
  SbnSrc sx;
  const double* mean;  // [C]
  SbnShape g;
  SbnSums* out;  // [C][K]
};

/// Thread unit u (u < C * K) of the forward's chunk moments.
template <class T, bool kUniform>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_moments_unit(std::int64_t u, const SbnMomentsArgs<T>& a) {
  const SbnShape& g = a.g;
  const std::int64_t k = u / g.C, c = u - k * g.C;
  const SbnChunkRange ch = sbn_chunk_of(g, k);
  const T* base = a.x + c * a.sx.sC;
  const std::int64_t r0 = ch.r0;
  const SbnSrc& sx = a.sx;
  auto load = [&](std::int64_t i) -> double { return sbn_load_double(base, sbn_elem_offset<kUniform>(sx, g, r0 + i)); };
  a.out[c * g.K + k] = sbn_chunk_moments(load, ch.len);
}

/// Thread unit u (u < C * K) of the backward's chunk sums.
template <class T, bool kUniform>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_sums_unit(std::int64_t u, const SbnSumsArgs<T>& a) {
  const SbnShape& g = a.g;
  const std::int64_t k = u / g.C, c = u - k * g.C;
  const SbnChunkRange ch = sbn_chunk_of(g, k);
  const T* gbase = a.dy + c * a.sg.sC;
  const T* xbase = a.x + c * a.sx.sC;
  const std::int64_t r0 = ch.r0;
  const SbnSrc &sg = a.sg, &sx = a.sx;
  const double mean = a.mean[c];
  auto load_dy = [&](std::int64_t i) -> double { return sbn_load_double(gbase, sbn_elem_offset<kUniform>(sg, g, r0 + i)); };
  auto load_x = [&](std::int64_t i) -> double { return sbn_load_double(xbase, sbn_elem_offset<kUniform>(sx, g, r0 + i)); };
  a.out[c * g.K + k] = sbn_chunk_sums(load_dy, load_x, mean, ch.len);
}

/// The warp of group `grp` (kRun: that warp's lanes, or one of them) and the warps of the grid:
/// its index and their number.
template <class G>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE std::int64_t sbn_warp_index(const G& grp) {
  return grp.block() * (grp.threads() / kSbnLanes) + grp.thread(0) / kSbnLanes;
}
template <class G>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE std::int64_t sbn_warp_total(const G& grp) {
  return grp.blocks() * (grp.threads() / kSbnLanes);
}

struct SbnAdd {
  template <class V>
  DETOPS_HOST_DEVICE V operator()(const V& a, const V& b) const {
    return a + b;
  }
};
/// The larger of two values that are never NaN (sbn_abs_or_inf's), as fmax.
struct SbnMax {
  DETOPS_HOST_DEVICE double operator()(double a, double b) const { return ::fmax(a, b); }
};

/// The warp-per-unit chunk moments, for the warp(s) of `grp`.
template <class T, bool kUniform, class G>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_moments_warp(const SbnMomentsArgs<T>& a, const G& grp) {
  constexpr int R = G::kRun;
  const SbnShape& g = a.g;
  const std::int64_t units = g.C * g.K;
  for (std::int64_t u = sbn_warp_index(grp); u < units; u += sbn_warp_total(grp)) {
    const std::int64_t c = u / g.K, k = u - c * g.K;
    const SbnChunkRange ch = sbn_chunk_of(g, k);
    const T* base = a.x + c * a.sx.sC;
    double v[R][kSbnPerLane];
    double s[R];
    for (int r = 0; r < R; ++r) {
      const int lane = grp.lane(r);
      s[r] = 0.0;
      DETOPS_SBN_UNROLL
      for (int m = 0; m < kSbnPerLane; ++m) {
        const std::int64_t i = lane + kSbnLanes * m;
        v[r][m] = 0.0;
        if (i < ch.len) {
          v[r][m] = sbn_load_double(base, sbn_elem_offset<kUniform>(a.sx, g, ch.r0 + i));
          s[r] = s[r] + v[r][m];
        }
      }
    }
    grp.butterfly(s, SbnAdd{});
    double mean[R], q[R];
    for (int r = 0; r < R; ++r) {
      const int lane = grp.lane(r);
      mean[r] = s[r] / static_cast<double>(ch.len);
      q[r] = 0.0;
      DETOPS_SBN_UNROLL
      for (int m = 0; m < kSbnPerLane; ++m) {
        const std::int64_t i = lane + kSbnLanes * m;
        if (i < ch.len) {
          const double d = v[r][m] - mean[r];
          q[r] = q[r] + d * d;
        }
      }
    }
    grp.butterfly(q, SbnAdd{});
    for (int r = 0; r < R; ++r)
      if (grp.lane(r) == 0) a.out[u] = SbnMoments{ch.len, mean[r], q[r]};
  }
}

/// The warp-per-unit chunk sums, for the warp(s) of `grp`.
template <class T, bool kUniform, class G>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_sums_warp(const SbnSumsArgs<T>& a, const G& grp) {
  constexpr int R = G::kRun;
  const SbnShape& g = a.g;
  const std::int64_t units = g.C * g.K;
  for (std::int64_t u = sbn_warp_index(grp); u < units; u += sbn_warp_total(grp)) {
    const std::int64_t c = u / g.K, k = u - c * g.K;
    const SbnChunkRange ch = sbn_chunk_of(g, k);
    const T* gbase = a.dy + c * a.sg.sC;
    const T* xbase = a.x + c * a.sx.sC;
    const double mu = a.mean[c];
    double sa[R], sb[R];
    for (int r = 0; r < R; ++r) {
      const int lane = grp.lane(r);
      sa[r] = 0.0;
      sb[r] = 0.0;
      DETOPS_SBN_UNROLL
      for (int m = 0; m < kSbnPerLane; ++m) {
        const std::int64_t i = lane + kSbnLanes * m;
        if (i < ch.len) {
          const double gv = sbn_load_double(gbase, sbn_elem_offset<kUniform>(a.sg, g, ch.r0 + i));
          const double xv = sbn_load_double(xbase, sbn_elem_offset<kUniform>(a.sx, g, ch.r0 + i));
          sa[r] = sa[r] + gv;
          sb[r] = sb[r] + gv * (xv - mu);
        }
      }
    }
    grp.butterfly(sa, SbnAdd{});
    grp.butterfly(sb, SbnAdd{});
    for (int r = 0; r < R; ++r)
      if (grp.lane(r) == 0) a.out[u] = SbnSums{sa[r], sb[r]};
  }
}

DETOPS_HOST_DEVICE inline void sbn_put_record(const SbnMoments& m, std::int64_t* rec, std::int64_t c) {
  rec[1 + 2 * c] = sbn_double_word(m.mean);
  rec[2 + 2 * c] = sbn_double_word(m.m2);
}
DETOPS_HOST_DEVICE inline void sbn_put_record(const SbnSums& s, std::int64_t* rec, std::int64_t c) {
  rec[1 + 2 * c] = sbn_double_word(s.dy);
  rec[2 + 2 * c] = sbn_double_word(s.dyxmu);
}

/// The per-channel tree: `a` holds the [C][K] chunk results (K >= 1), `b` as much scratch.
template <class R>
struct SbnTreeArgs {
  R* a;
  R* b;
  SbnShape g;
  std::int64_t count;  // word 0 of the record
  std::int64_t* rec;
};

/// sbn_tree_reduce over each channel's K chunk results, a block per channel: level by level,
/// pairs (2i, 2i + 1) of src into dst[i] (threads stride over i), an odd last element carried
/// to dst[half] by thread 0; a barrier between levels, then the buffers swap. Thread 0 writes
/// the record (word 0 with channel 0).
template <class R, class G>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_tree_block(const SbnTreeArgs<R>& a, const G& grp) {
  const SbnShape& g = a.g;
  for (std::int64_t c = grp.block(); c < g.C; c += grp.blocks()) {
    R* src = a.a + c * g.K;
    R* dst = a.b + c * g.K;
    std::int64_t k = g.K;
    while (k > 1) {
      const std::int64_t half = k / 2;
      for (int r = 0; r < G::kRun; ++r) {
        const int t = grp.thread(r);
        for (std::int64_t i = t; i < half; i += grp.threads()) dst[i] = sbn_merge(src[2 * i], src[2 * i + 1]);
        if ((k & 1) && t == 0) dst[half] = src[k - 1];
      }
      grp.sync();
      R* swap = src;
      src = dst;
      dst = swap;
      k = half + (k & 1);
    }
    for (int r = 0; r < G::kRun; ++r)
      if (grp.thread(r) == 0) {
        sbn_put_record(src[0], a.rec, c);
        if (c == 0) a.rec[0] = a.count;
      }
    grp.sync();  // thread 0 has read src[0] before the block moves on
  }
}

/// Word i of a record with word 0 = count and every other word 0 (no element, or no channel).
DETOPS_HOST_DEVICE inline void sbn_fill_record_word(std::int64_t i, std::int64_t* rec, std::int64_t count) {
  rec[i] = i == 0 ? count : 0;
}
DETOPS_HOST_DEVICE inline void sbn_fill_word(std::int64_t i, std::int64_t* p, std::int64_t value) { p[i] = value; }

// ---------------------------------------------------------------------------------------------
// Order-free passes: the exact mode's integer sums and the exponents.
//
// The same (channel, chunk) units as the default mode, by warps or threads. Exact mode: 128-bit
// integer sums of the quantized values per unit (associative: any order gives the same sums),
// then a block per channel adds its units' partials. Exponents: max |v| per unit (inf and NaN
// mapped to +inf, so a max never drops a NaN), its sbn_exponent, and an integer maximum into the
// channel's word (order-independent; an atomic on the device); the words start at
// kSbnZeroExponent.

enum class SbnOrderFreePass { kExactForward, kExactBackward, kScalesForward, kScalesBackward };

struct alignas(16) SbnPair128 {
  sbn_i128 s1, s2;
};

template <class T>
struct SbnPassArgs {
  const T* x;
  const T* dy;  // backward passes
  SbnSrc sx, sg;
  SbnShape g;
  const double* mean;             // backward passes
  const std::int64_t* exponents;  // exact passes: [C] or [2C]
  SbnPair128* partial;            // exact passes: [C][K] (unit order c * K + k)
  std::int64_t* scales;           // scale passes: [C] or [2C], preset to kSbnZeroExponent
};

/// |v|, with inf and NaN both +inf: a max over these never loses a NaN, and sbn_exponent(+inf)
/// is kSbnNonFiniteExponent as sbn_exponent(NaN) is.
DETOPS_HOST_DEVICE inline double sbn_abs_or_inf(double v) {
  const double m = ::fabs(v);
  return m <= 1.7976931348623157e308 ? m : sbn_word_double(0x7ff0000000000000ll);
}

/// One thread's (or lane's) part of a unit: sums or maxima over elements first, first + step, ...
struct SbnOrderFreePart {
  sbn_i128 s1, s2;
  double m1, m2;
};
template <class T, bool kUniform, SbnOrderFreePass P>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE SbnOrderFreePart sbn_order_free_part(const SbnPassArgs<T>& a, std::int64_t c,
                                                                           const SbnChunkRange& ch, int first, int step) {
  constexpr bool kBackward = P == SbnOrderFreePass::kExactBackward || P == SbnOrderFreePass::kScalesBackward;
  constexpr bool kExact = P == SbnOrderFreePass::kExactForward || P == SbnOrderFreePass::kExactBackward;
  const SbnShape& g = a.g;
  const T* xbase = a.x + c * a.sx.sC;
  const T* gbase = kBackward ? a.dy + c * a.sg.sC : nullptr;
  const double mu = kBackward ? a.mean[c] : 0.0;
  std::int64_t e1 = 0, e2 = 0;
  if constexpr (kExact) {
    e1 = a.exponents[c];
    if constexpr (kBackward) e2 = a.exponents[g.C + c];
  }
  SbnOrderFreePart p{0, 0, 0.0, 0.0};
  for (std::int64_t i = first; i < ch.len; i += step) {
    const double xv = sbn_load_double(xbase, sbn_elem_offset<kUniform>(a.sx, g, ch.r0 + i));
    if constexpr (P == SbnOrderFreePass::kExactForward) {
      const std::int64_t q = sbn_quantize(xv, e1);
      p.s1 += q;
      p.s2 += static_cast<sbn_i128>(q) * q;
    } else if constexpr (P == SbnOrderFreePass::kScalesForward) {
      p.m1 = ::fmax(p.m1, sbn_abs_or_inf(xv));
    } else {
      const double gv = sbn_load_double(gbase, sbn_elem_offset<kUniform>(a.sg, g, ch.r0 + i));
      const double prod = gv * (xv - mu);
      if constexpr (P == SbnOrderFreePass::kExactBackward) {
        p.s1 += sbn_quantize(gv, e1);
        p.s2 += sbn_quantize(prod, e2);
      } else {
        p.m1 = ::fmax(p.m1, sbn_abs_or_inf(gv));
        p.m2 = ::fmax(p.m2, sbn_abs_or_inf(prod));
      }
    }
  }
  return p;
}

/// What the unit's owner (its thread, or lane 0 of its warp) writes: the partial sums, or the
/// exponents through `amax(word, value)` (an integer maximum: atomicMax on the device).
template <class T, SbnOrderFreePass P, class AtomicMax>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_order_free_store(const SbnPassArgs<T>& a, std::int64_t c, std::int64_t k,
                                                                const SbnOrderFreePart& p, const AtomicMax& amax) {
  constexpr bool kBackward = P == SbnOrderFreePass::kExactBackward || P == SbnOrderFreePass::kScalesBackward;
  constexpr bool kExact = P == SbnOrderFreePass::kExactForward || P == SbnOrderFreePass::kExactBackward;
  if constexpr (kExact) {
    a.partial[c * a.g.K + k] = SbnPair128{p.s1, p.s2};
  } else {
    amax(a.scales + c, sbn_exponent(p.m1));
    if constexpr (kBackward) amax(a.scales + a.g.C + c, sbn_exponent(p.m2));
  }
}

/// Thread unit u (u = k * C + c < C * K) of an order-free pass.
template <class T, bool kUniform, SbnOrderFreePass P, class AtomicMax>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_order_free_unit(std::int64_t u, const SbnPassArgs<T>& a,
                                                               const AtomicMax& amax) {
  const std::int64_t k = u / a.g.C, c = u - k * a.g.C;
  const SbnOrderFreePart p = sbn_order_free_part<T, kUniform, P>(a, c, sbn_chunk_of(a.g, k), 0, 1);
  sbn_order_free_store<T, P>(a, c, k, p, amax);
}

/// The warp-per-unit order-free pass (u = c * K + k), for the warp(s) of `grp`: lanes take
/// elements lane, lane + 32, ...; the butterfly adds the sums or takes the maxima; lane 0 stores.
template <class T, bool kUniform, SbnOrderFreePass P, class G, class AtomicMax>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_order_free_warp(const SbnPassArgs<T>& a, const G& grp,
                                                               const AtomicMax& amax) {
  constexpr bool kBackward = P == SbnOrderFreePass::kExactBackward || P == SbnOrderFreePass::kScalesBackward;
  constexpr bool kExact = P == SbnOrderFreePass::kExactForward || P == SbnOrderFreePass::kExactBackward;
  constexpr int R = G::kRun;
  const std::int64_t units = a.g.C * a.g.K;
  for (std::int64_t u = sbn_warp_index(grp); u < units; u += sbn_warp_total(grp)) {
    const std::int64_t c = u / a.g.K, k = u - c * a.g.K;
    const SbnChunkRange ch = sbn_chunk_of(a.g, k);
    SbnOrderFreePart p[R];
    sbn_i128 s1[R], s2[R];
    double m1[R], m2[R];
    for (int r = 0; r < R; ++r) {
      p[r] = sbn_order_free_part<T, kUniform, P>(a, c, ch, grp.lane(r), kSbnLanes);
      s1[r] = p[r].s1, s2[r] = p[r].s2, m1[r] = p[r].m1, m2[r] = p[r].m2;
    }
    if constexpr (kExact) {
      grp.butterfly(s1, SbnAdd{});
      grp.butterfly(s2, SbnAdd{});
    } else {
      grp.butterfly(m1, SbnMax{});
      if constexpr (kBackward) grp.butterfly(m2, SbnMax{});
    }
    for (int r = 0; r < R; ++r)
      if (grp.lane(r) == 0) sbn_order_free_store<T, P>(a, c, k, SbnOrderFreePart{s1[r], s2[r], m1[r], m2[r]}, amax);
  }
}

struct SbnExactReduceArgs {
  const SbnPair128* partial;  // [C][K]
  SbnShape g;
  std::int64_t count;  // word 0 of the record
  std::int64_t* rec;
};

/// Exact mode: a block per channel adds its K partials (integers: any order): threads stride
/// over them, each warp's butterfly adds its threads', lane 0 leaves the warp's in `warp_sums`
/// (the block's shared memory, one per warp), and after a barrier thread 0 adds those and writes
/// the record's S1 and S2 (word 0 with channel 0).
template <class G>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_exact_reduce_block(const SbnExactReduceArgs& a, const G& grp) {
  constexpr int R = G::kRun;
  SbnPair128* warp_sums = grp.template shared<SbnPair128, kSbnWarpsPerBlock>();
  const SbnShape& g = a.g;
  for (std::int64_t c = grp.block(); c < g.C; c += grp.blocks()) {
    sbn_i128 s1[R], s2[R];
    for (int r = 0; r < R; ++r) {
      s1[r] = 0, s2[r] = 0;
      for (std::int64_t i = grp.thread(r); i < g.K; i += grp.threads()) {
        const SbnPair128 p = a.partial[c * g.K + i];
        s1[r] += p.s1;
        s2[r] += p.s2;
      }
    }
    grp.butterfly(s1, SbnAdd{});
    grp.butterfly(s2, SbnAdd{});
    for (int r = 0; r < R; ++r)
      if (grp.lane(r) == 0) warp_sums[grp.thread(r) / kSbnLanes] = SbnPair128{s1[r], s2[r]};
    grp.sync();
    for (int r = 0; r < R; ++r)
      if (grp.thread(r) == 0) {
        sbn_i128 t1 = 0, t2 = 0;
        for (int w = 0; w < grp.threads() / kSbnLanes; ++w) {
          t1 += warp_sums[w].s1;
          t2 += warp_sums[w].s2;
        }
        sbn_store_i128(t1, a.rec + 1 + 4 * c);
        sbn_store_i128(t2, a.rec + 3 + 4 * c);
        if (c == 0) a.rec[0] = a.count;
      }
    grp.sync();  // warp_sums is reused by the next channel
  }
}

// ---------------------------------------------------------------------------------------------
// Merge and finalize

/// Word i of the merged exponents: the maximum over the ranks' rows (kSbnZeroExponent for none).
DETOPS_HOST_DEVICE inline void sbn_merge_scales_word(std::int64_t i, const std::int64_t* gathered, std::int64_t ranks,
                                                     std::int64_t words, std::int64_t* scales) {
  std::int64_t m = kSbnZeroExponent;
  for (std::int64_t r = 0; r < ranks; ++r) {
    const std::int64_t v = gathered[r * words + i];
    m = v > m ? v : m;
  }
  scales[i] = m;
}

/// num_batches_tracked + 1 (saturating) when the global count is at least 2; run once, after
/// every channel's finalize has read it, and only when running statistics are tracked.
DETOPS_HOST_DEVICE inline void sbn_bump_batches(const SbnFinalizeArgs& a) {
  if (sbn_forward_count(a.gathered, a.ranks, a.words, a.exact) >= 2)
    a.num_batches_tracked[0] = sbn_next_count(a.num_batches_tracked[0]);
}

/// Thread i of the backward's finalize (i < max(C, 1)): the count (i == 0, also when C == 0)
/// and channel i.
template <int kDepth>
DETOPS_HOST_DEVICE inline void sbn_finalize_backward_index(std::int64_t i, const SbnBackwardFinalizeArgs& a) {
  if (i == 0) sbn_finalize_backward_count(a);
  if (i < a.channels) sbn_finalize_backward_channel<kDepth>(a, i);
}

// ---------------------------------------------------------------------------------------------
// Elementwise passes: in float64 over any strides, with flat fast paths when the tensors share a
// dense NCHW or NHWC layout. Thread i takes logical (NCHW-order) element i.

enum class SbnFlat { kGeneric, kNchw, kNhwc };

/// Whether a 4-d view is exactly dense NCHW or NHWC.
DETOPS_HOST_DEVICE inline SbnFlat sbn_flat_layout(const std::int64_t* sizes, const std::int64_t* s) {
  const std::int64_t C = sizes[1], H = sizes[2], W = sizes[3];
  if (s[3] == 1 && s[2] == W && s[1] == H * W && s[0] == C * H * W) return SbnFlat::kNchw;
  if (s[1] == 1 && s[3] == C && s[2] == W * C && s[0] == H * W * C) return SbnFlat::kNhwc;
  return SbnFlat::kGeneric;
}
DETOPS_HOST_DEVICE inline bool sbn_same_strides(const std::int64_t* a, const std::int64_t* b) {
  for (int d = 0; d < 4; ++d)
    if (a[d] != b[d]) return false;
  return true;
}

/// Channel of logical element i, and its offsets in up to three tensors.
template <SbnFlat L>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE std::int64_t sbn_element_at(std::int64_t i, const SbnShape& g, const SbnSrc& s0,
                                                                  const SbnSrc& s1, const SbnSrc& s2, std::int64_t& o0,
                                                                  std::int64_t& o1, std::int64_t& o2) {
  if constexpr (L == SbnFlat::kNchw) {
    o0 = o1 = o2 = i;
    return (i / g.HW) % g.C;
  } else if constexpr (L == SbnFlat::kNhwc) {
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

template <class T>
struct SbnApplyArgs {
  const T* x;
  SbnSrc sx;
  T* y;
  SbnSrc sy;
  SbnShape g;
  SbnParam weight, bias;
  const double* mean;
  const double* invstd;
};

/// y = sbn_apply(x, mean[c], weight[c] * invstd[c], bias[c]) for logical element i.
template <class T, SbnFlat L>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_apply_element(std::int64_t i, const SbnApplyArgs<T>& a) {
  std::int64_t ox, oy, unused;
  const std::int64_t c = sbn_element_at<L>(i, a.g, a.sx, a.sy, a.sy, ox, oy, unused);
  const double scale = sbn_load(a.weight, c, 1.0) * a.invstd[c];
  const double v = sbn_apply(static_cast<double>(to_acc(a.x[ox])), a.mean[c], scale, sbn_load(a.bias, c, 0.0));
  a.y[oy] = from_double<T>(v);
}

struct SbnGradCoefArgs {
  SbnParam weight;
  const double* mean;
  const double* invstd;
  const double* sums;  // [2C + 1], or null: evaluation mode
  std::int64_t C;
  SbnGradCoef* coef;   // [C]
};
DETOPS_HOST_DEVICE inline void sbn_grad_coef_channel(std::int64_t c, const SbnGradCoefArgs& a) {
  const double w = sbn_load(a.weight, c, 1.0);
  a.coef[c] = a.sums ? sbn_grad_coef(w, a.mean[c], a.invstd[c], a.sums[c], a.sums[a.C + c], a.sums[2 * a.C])
                     : sbn_grad_coef(w, a.mean[c], a.invstd[c], 0.0, 0.0, 0.0);
}

template <class T>
struct SbnBackwardApplyArgs {
  const T* dy;
  SbnSrc sg;
  const T* x;
  SbnSrc sx;
  T* dx;
  SbnSrc sd;
  SbnShape g;
  const SbnGradCoef* coef;  // [C]
};

/// dx = sbn_grad(dy, x, coef[c]) for logical element i.
template <class T, SbnFlat L>
DETOPS_HOST_DEVICE DETOPS_FORCEINLINE void sbn_backward_apply_element(std::int64_t i, const SbnBackwardApplyArgs<T>& a) {
  std::int64_t og, ox, od;
  const std::int64_t c = sbn_element_at<L>(i, a.g, a.sg, a.sx, a.sd, og, ox, od);
  const double v = sbn_grad(static_cast<double>(to_acc(a.dy[og])), static_cast<double>(to_acc(a.x[ox])), a.coef[c]);
  a.dx[od] = from_double<T>(v);
}

}  // namespace detail
}  // namespace detops
