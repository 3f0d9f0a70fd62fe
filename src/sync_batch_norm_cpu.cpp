// SyncBatchNorm's CPU backend: the math of detops/detail/sync_batch_norm_math.h over strided
// views. Two walks over a tensor:
//   * per channel (any strides): one thread owns a channel, takes its images' planes in order
//     and their chunks (the plane is read as a flat array when it is row-major contiguous);
//   * channels innermost (stride(1) == 1, NHWC): one thread owns a range of chunks and handles
//     every channel of a position together (vectorized over channels); per-chunk results are
//     kept and merged per channel afterwards in the same tree.
// Both compute the same function of the data, so the layout never changes the bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "internal/common.h"
#include "internal/sync_batch_norm_backend.h"

namespace detops {
namespace internal {
namespace {

using detail::kSbnChunk;
using detail::kSbnLanes;
using detail::SbnMoments;
using detail::SbnSums;

template <class T>
inline double ld(const T& v) {
  return static_cast<double>(to_acc(v));
}

struct Dims {
  std::int64_t N, C, H, W, HW, count, K;  // count = N * H * W elements per channel, K chunks
  explicit Dims(const TensorView& x)
      : N(x.sizes[0]), C(x.sizes[1]), H(x.sizes[2]), W(x.sizes[3]), HW(H * W), count(N * H * W),
        K(detail::sbn_chunks(N * H * W)) {}
};

/// Elements [r0, r0 + len) of channel c (in (n, h, w) order) as float64, into out: a chunk, which
/// may span images. Row-major contiguous planes are copied as runs.
template <class T>
void gather_chunk(const TensorView& v, std::int64_t HW, std::int64_t c, std::int64_t r0, std::int64_t len,
                  double* out) {
  const std::int64_t sh = v.strides[2], sw = v.strides[3], W = v.sizes[3];
  const bool flat = sw == 1 && (sh == W || v.sizes[2] <= 1);
  std::int64_t n = r0 / HW, p = r0 % HW;
  for (std::int64_t i = 0; i < len; ++n, p = 0) {
    const T* base = static_cast<const T*>(v.data) + n * v.strides[0] + c * v.strides[1];
    const std::int64_t take = std::min(len - i, HW - p);
    if (flat) {
      for (std::int64_t j = 0; j < take; ++j) out[i + j] = static_cast<double>(to_acc(base[p + j]));
    } else {
      for (std::int64_t j = 0; j < take; ++j) {
        const std::int64_t q = p + j;
        out[i + j] = static_cast<double>(to_acc(base[(q / W) * sh + (q % W) * sw]));
      }
    }
    i += take;
  }
}

/// Calls f(load) with load(p) = element p (row-major position in the plane) of channel c of
/// image n as float64; a contiguous plane gets a flat loader.
template <class T, class F>
inline void with_plane(const TensorView& v, std::int64_t n, std::int64_t c, F&& f) {
  const T* base = static_cast<const T*>(v.data) + n * v.strides[0] + c * v.strides[1];
  const std::int64_t sh = v.strides[2], sw = v.strides[3], W = v.sizes[3];
  if (sw == 1 && (sh == W || v.sizes[2] <= 1)) {
    f([base](std::int64_t p) { return ld(base[p]); });
  } else {
    f([base, sh, sw, W](std::int64_t p) { return ld(base[(p / W) * sh + (p % W) * sw]); });
  }
}

/// A view whose channel stride is 1 and whose positions can be walked as rows of C channels.
inline bool channels_inner(const TensorView& v) { return v.sizes[1] > 1 && v.strides[1] == 1; }

/// Element offset of position p (row-major in the plane) of image n, channel 0.
inline std::int64_t pos_offset(const TensorView& v, std::int64_t n, std::int64_t p) {
  return n * v.strides[0] + (p / v.sizes[3]) * v.strides[2] + (p % v.sizes[3]) * v.strides[3];
}
/// Element offset of element r = n * HW + p of channel 0.
inline std::int64_t row_offset(const TensorView& v, std::int64_t HW, std::int64_t r) {
  return pos_offset(v, r / HW, r % HW);
}

inline int threads_of(const Context& ctx) { return ctx.resolved_threads(); }

/// Channels handled together by the channels-inner walks: the lanes (32 x 512 doubles, 128 KB)
/// and the chunk's 256 x 512 elements stay in L2 for the second pass; rows of 512 channels are
/// long enough for the prefetchers (measured on res5 NHWC: 64 channels 2.4x slower, 1024 10%
/// faster).
constexpr std::int64_t kChannelBlock = 512;

/// sbn_lane_tree for `cn` channels at once: lanes is [kSbnLanes][kChannelBlock], channel c's lane
/// t at lanes[t * kChannelBlock + c]; the same additions per channel, vectorized across channels.
/// Row 0 receives the totals.
inline void lane_tree_rows(double* lanes, std::int64_t cn) {
  for (int off = kSbnLanes / 2; off >= 1; off /= 2)
    for (int t = 0; t < off; ++t) {
      double* dst = lanes + t * kChannelBlock;
      const double* src = lanes + (t + off) * kChannelBlock;
      for (std::int64_t c = 0; c < cn; ++c) dst[c] = dst[c] + src[c];
    }
}

// ---------------------------------------------------------------------------------------------
// Default mode: moments (forward) and sums (backward) per chunk, merged in the tree.

/// Calls f(k, c, r0, len) for every (chunk k, channel c). Planes of at least kPlaneWalk
/// positions: a thread owns a channel and walks its planes in order (sequential reads). Smaller
/// planes (a detection head's 7x7 or 14x14): in parallel over (chunk, block of kGatherBlock
/// channels), the channels of a block in order (consecutive channels' planes are adjacent in
/// NCHW, so the walk streams; measured: the box head [512, 256, 7, 7] 2x faster than per channel,
/// res5 [2, 2048, 25, 34] 1.6x slower).
constexpr std::int64_t kGatherBlock = 64;
constexpr std::int64_t kPlaneWalk = 512;
template <class F>
void for_chunk_blocks(const Dims& d, const Context& ctx, F&& f) {
  if (d.HW >= kPlaneWalk) {
    parallel_for(d.C, 1, threads_of(ctx), [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t c = c0; c < c1; ++c)
        for (std::int64_t k = 0; k < d.K; ++k) f(k, c, k * kSbnChunk, std::min(kSbnChunk, d.count - k * kSbnChunk));
    });
    return;
  }
  const std::int64_t blocks = (d.C + kGatherBlock - 1) / kGatherBlock;
  parallel_for(d.K * blocks, 1, threads_of(ctx), [&](std::int64_t w0, std::int64_t w1) {
    for (std::int64_t w = w0; w < w1; ++w) {
      const std::int64_t k = w / blocks, c0 = (w % blocks) * kGatherBlock;
      const std::int64_t r0 = k * kSbnChunk, len = std::min(kSbnChunk, d.count - r0);
      for (std::int64_t c = c0; c < std::min(d.C, c0 + kGatherBlock); ++c) f(k, c, r0, len);
    }
  });
}

/// The per-channel tree over chunk results stored [K][C], handed to store(c, result).
template <class R, class Store>
void merge_chunks(const std::vector<R>& chunks, const Dims& d, const R& empty, const Context& ctx, Store&& store) {
  parallel_for(d.C, 1, threads_of(ctx), [&](std::int64_t c0, std::int64_t c1) {
    std::vector<R> r(static_cast<std::size_t>(d.K));
    for (std::int64_t c = c0; c < c1; ++c) {
      for (std::int64_t k = 0; k < d.K; ++k) r[static_cast<std::size_t>(k)] = chunks[static_cast<std::size_t>(k * d.C + c)];
      store(c, detail::sbn_tree_reduce(r.data(), d.K, empty));
    }
  });
}

template <class T>
void default_stats(const TensorView& x, std::int64_t* record, const Context& ctx) {
  const Dims d(x);
  const SbnMoments empty{0, 0.0, 0.0};
  auto store = [&](std::int64_t c, const SbnMoments& m) {
    record[1 + 2 * c] = detail::sbn_double_word(m.mean);
    record[2 + 2 * c] = detail::sbn_double_word(m.m2);
  };
  if (channels_inner(x) && d.K > 0) {
    // chunk-major: the channels of a chunk together, kChannelBlock at a time (the lanes and the
    // chunk's slice stay in cache)
    std::vector<SbnMoments> chunks(static_cast<std::size_t>(d.K * d.C));
    parallel_for(d.K, 1, threads_of(ctx), [&](std::int64_t k0, std::int64_t k1) {
      std::vector<double> lanes(static_cast<std::size_t>(kSbnLanes * kChannelBlock)), mean(kChannelBlock);
      for (std::int64_t k = k0; k < k1; ++k) {
        const std::int64_t r0 = k * kSbnChunk, len = std::min(kSbnChunk, d.count - r0);
        for (std::int64_t cb = 0; cb < d.C; cb += kChannelBlock) {
          const std::int64_t cn = std::min<std::int64_t>(kChannelBlock, d.C - cb);
          for (int pass = 0; pass < 2; ++pass) {
            std::fill(lanes.begin(), lanes.end(), 0.0);
            for (std::int64_t i = 0; i < len; ++i) {
              const T* row = static_cast<const T*>(x.data) + row_offset(x, d.HW, r0 + i) + cb;
              double* lane = lanes.data() + (i % kSbnLanes) * kChannelBlock;
              if (pass == 0) {
                for (std::int64_t c = 0; c < cn; ++c) lane[c] = lane[c] + ld(row[c]);
              } else {
                for (std::int64_t c = 0; c < cn; ++c) {
                  const double dv = ld(row[c]) - mean[static_cast<std::size_t>(c)];
                  lane[c] = lane[c] + dv * dv;
                }
              }
            }
            lane_tree_rows(lanes.data(), cn);
            for (std::int64_t c = 0; c < cn; ++c) {
              const double total = lanes[static_cast<std::size_t>(c)];
              if (pass == 0) {
                mean[static_cast<std::size_t>(c)] = total / static_cast<double>(len);
              } else {
                chunks[static_cast<std::size_t>(k * d.C + cb + c)] = {len, mean[static_cast<std::size_t>(c)], total};
              }
            }
          }
        }
      }
    });
    merge_chunks(chunks, d, empty, ctx, store);
  } else if (d.K > 0) {
    // chunk-major over blocks of channels: a channel's chunk is gathered (runs of its planes;
    // consecutive channels of an image are adjacent in NCHW, so the walk streams) and reduced
    // while in L1
    std::vector<SbnMoments> chunks(static_cast<std::size_t>(d.K * d.C));
    for_chunk_blocks(d, ctx, [&](std::int64_t k, std::int64_t c, std::int64_t r0, std::int64_t len) {
      double buf[kSbnChunk];
      gather_chunk<T>(x, d.HW, c, r0, len, buf);
      chunks[static_cast<std::size_t>(k * d.C + c)] =
          detail::sbn_chunk_moments([&](std::int64_t i) { return buf[i]; }, len);
    });
    merge_chunks(chunks, d, empty, ctx, store);
  } else {
    for (std::int64_t c = 0; c < d.C; ++c) store(c, empty);
  }
  record[0] = d.N * d.HW;
}

template <class T>
void default_backward(const TensorView& dy, const TensorView& x, const double* mean, std::int64_t* record,
                      const Context& ctx) {
  const Dims d(x);
  const SbnSums zero{0.0, 0.0};
  auto store = [&](std::int64_t c, const SbnSums& s) {
    record[1 + 2 * c] = detail::sbn_double_word(s.dy);
    record[2 + 2 * c] = detail::sbn_double_word(s.dyxmu);
  };
  if (channels_inner(x) && channels_inner(dy) && d.K > 0) {
    std::vector<SbnSums> chunks(static_cast<std::size_t>(d.K * d.C));
    parallel_for(d.K, 1, threads_of(ctx), [&](std::int64_t k0, std::int64_t k1) {
      std::vector<double> a(static_cast<std::size_t>(kSbnLanes * kChannelBlock)), b(a.size());
      for (std::int64_t k = k0; k < k1; ++k) {
        const std::int64_t r0 = k * kSbnChunk, len = std::min(kSbnChunk, d.count - r0);
        for (std::int64_t cb = 0; cb < d.C; cb += kChannelBlock) {
          const std::int64_t cn = std::min<std::int64_t>(kChannelBlock, d.C - cb);
          std::fill(a.begin(), a.end(), 0.0);
          std::fill(b.begin(), b.end(), 0.0);
          for (std::int64_t i = 0; i < len; ++i) {
            const T* xr = static_cast<const T*>(x.data) + row_offset(x, d.HW, r0 + i) + cb;
            const T* gr = static_cast<const T*>(dy.data) + row_offset(dy, d.HW, r0 + i) + cb;
            double* la = a.data() + (i % kSbnLanes) * kChannelBlock;
            double* lb = b.data() + (i % kSbnLanes) * kChannelBlock;
            for (std::int64_t c = 0; c < cn; ++c) {
              const double g = ld(gr[c]);
              la[c] = la[c] + g;
              lb[c] = lb[c] + g * (ld(xr[c]) - mean[cb + c]);
            }
          }
          lane_tree_rows(a.data(), cn);
          lane_tree_rows(b.data(), cn);
          for (std::int64_t c = 0; c < cn; ++c)
            chunks[static_cast<std::size_t>(k * d.C + cb + c)] = {a[static_cast<std::size_t>(c)], b[static_cast<std::size_t>(c)]};
        }
      }
    });
    merge_chunks(chunks, d, zero, ctx, store);
  } else if (d.K > 0) {
    std::vector<SbnSums> chunks(static_cast<std::size_t>(d.K * d.C));
    for_chunk_blocks(d, ctx, [&](std::int64_t k, std::int64_t c, std::int64_t r0, std::int64_t len) {
      double gbuf[kSbnChunk], xbuf[kSbnChunk];
      gather_chunk<T>(dy, d.HW, c, r0, len, gbuf);
      gather_chunk<T>(x, d.HW, c, r0, len, xbuf);
      chunks[static_cast<std::size_t>(k * d.C + c)] = detail::sbn_chunk_sums(
          [&](std::int64_t i) { return gbuf[i]; }, [&](std::int64_t i) { return xbuf[i]; }, mean[c], len);
    });
    merge_chunks(chunks, d, zero, ctx, store);
  } else {
    for (std::int64_t c = 0; c < d.C; ++c) store(c, zero);
  }
  record[0] = d.N * d.HW;
}

// ---------------------------------------------------------------------------------------------
// Exact mode and the exponents: reductions whose order does not matter (integer sums, maxima),
// so each walk simply visits every element once.

/// Calls f(c, value_x, value_dy) for every element, per channel (channel-owned threads) and
/// hands each thread's [begin, end) channel range to `per_thread` (false: the walk is over
/// positions, every thread sees every channel, results must be combined by the caller).
template <class T, class Visit>
void visit_channels(const TensorView& x, const TensorView& dy, const Context& ctx, Visit&& visit) {
  const Dims d(x);
  parallel_for(d.C, 1, threads_of(ctx), [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c)
      for (std::int64_t n = 0; n < d.N; ++n)
        with_plane<T>(x, n, c, [&](const auto& load_x) {
          if (dy.defined()) {
            with_plane<T>(dy, n, c, [&](const auto& load_dy) {
              for (std::int64_t p = 0; p < d.HW; ++p) visit(c, load_x(p), load_dy(p));
            });
          } else {
            for (std::int64_t p = 0; p < d.HW; ++p) visit(c, load_x(p), 0.0);
          }
        });
  });
}

/// For channels-inner tensors: every thread walks a range of positions over all channels with
/// its own accumulator state (created by make()), merged afterwards by combine(state).
template <class T, class State, class Make, class Visit, class Combine>
void visit_positions(const TensorView& x, const TensorView& dy, const Context& ctx, Make&& make, Visit&& visit,
                     Combine&& combine) {
  const Dims d(x);
  const std::int64_t rows = d.N * d.HW;
  const int threads = threads_of(ctx);
  const std::int64_t parts = std::max<std::int64_t>(1, std::min<std::int64_t>(threads, rows));
  std::vector<State> states;
  states.reserve(static_cast<std::size_t>(parts));
  for (std::int64_t i = 0; i < parts; ++i) states.push_back(make());
  parallel_for(parts, 1, threads, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      State& st = states[static_cast<std::size_t>(i)];
      for (std::int64_t r = rows * i / parts; r < rows * (i + 1) / parts; ++r) {
        const std::int64_t n = r / d.HW, p = r % d.HW;
        const T* xr = static_cast<const T*>(x.data) + pos_offset(x, n, p);
        const T* gr = dy.defined() ? static_cast<const T*>(dy.data) + pos_offset(dy, n, p) : nullptr;
        for (std::int64_t c = 0; c < d.C; ++c) visit(st, c, ld(xr[c]), gr ? ld(gr[c]) : 0.0);
      }
    }
  });
  for (auto& st : states) combine(st);
}

inline bool positions_walk(const TensorView& x, const TensorView& dy) {
  return channels_inner(x) && (!dy.defined() || channels_inner(dy));
}

struct AbsMax {
  double v = 0.0;
  bool non_finite = false;
  void add(double a) {
    if (!(std::fabs(a) <= 1.7976931348623157e308)) non_finite = true;
    else v = std::max(v, std::fabs(a));
  }
  void add(const AbsMax& o) {
    non_finite = non_finite || o.non_finite;
    v = std::max(v, o.v);
  }
  std::int64_t exponent() const { return non_finite ? detail::kSbnNonFiniteExponent : detail::sbn_exponent(v); }
};

template <class T>
void local_scales(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* scales,
                  const Context& ctx) {
  const std::int64_t C = x.sizes[1];
  const bool backward = dy.defined();
  std::vector<AbsMax> total(static_cast<std::size_t>(backward ? 2 * C : C));
  auto visit = [&](std::vector<AbsMax>& acc, std::int64_t c, double xv, double g) {
    if (backward) {
      acc[static_cast<std::size_t>(c)].add(g);
      acc[static_cast<std::size_t>(C + c)].add(g * (xv - mean[c]));
    } else {
      acc[static_cast<std::size_t>(c)].add(xv);
    }
  };
  if (positions_walk(x, dy)) {
    visit_positions<T, std::vector<AbsMax>>(
        x, dy, ctx, [&] { return std::vector<AbsMax>(total.size()); }, visit,
        [&](const std::vector<AbsMax>& st) {
          for (std::size_t i = 0; i < total.size(); ++i) total[i].add(st[i]);
        });
  } else {
    visit_channels<T>(x, dy, ctx, [&](std::int64_t c, double xv, double g) { visit(total, c, xv, g); });
  }
  for (std::size_t i = 0; i < total.size(); ++i) scales[i] = total[i].exponent();
}

struct ExactAcc {
  detail::sbn_i128 a = 0, b = 0;
};

/// Exact forward (S1 = sum q(x), S2 = sum q(x)^2) or backward (sum q(dy), sum q(dy (x - mean))).
template <class T>
void exact_record(const TensorView& x, const TensorView& dy, const double* mean, const std::int64_t* scales,
                  std::int64_t* record, const Context& ctx) {
  const Dims d(x);
  const bool backward = dy.defined();
  std::vector<ExactAcc> total(static_cast<std::size_t>(d.C));
  std::vector<detail::SbnQuantScale> s1(static_cast<std::size_t>(d.C)), s2(s1.size());
  for (std::int64_t c = 0; c < d.C; ++c) {
    s1[static_cast<std::size_t>(c)] = detail::sbn_quant_scale(scales[c]);
    if (backward) s2[static_cast<std::size_t>(c)] = detail::sbn_quant_scale(scales[d.C + c]);
  }
  auto visit = [&](std::vector<ExactAcc>& acc, std::int64_t c, double xv, double g) {
    const auto i = static_cast<std::size_t>(c);
    ExactAcc& e = acc[i];
    if (backward) {
      e.a += detail::sbn_quantize(g, s1[i]);
      e.b += detail::sbn_quantize(g * (xv - mean[c]), s2[i]);
    } else {
      const std::int64_t q = detail::sbn_quantize(xv, s1[i]);
      e.a += q;
      e.b += static_cast<detail::sbn_i128>(q) * q;
    }
  };
  if (positions_walk(x, dy)) {
    visit_positions<T, std::vector<ExactAcc>>(
        x, dy, ctx, [&] { return std::vector<ExactAcc>(total.size()); }, visit,
        [&](const std::vector<ExactAcc>& st) {
          for (std::size_t i = 0; i < total.size(); ++i) total[i].a += st[i].a, total[i].b += st[i].b;
        });
  } else {
    visit_channels<T>(x, dy, ctx, [&](std::int64_t c, double xv, double g) { visit(total, c, xv, g); });
  }
  record[0] = d.N * d.HW;
  for (std::int64_t c = 0; c < d.C; ++c) {
    detail::sbn_store_i128(total[static_cast<std::size_t>(c)].a, record + 1 + 4 * c);
    detail::sbn_store_i128(total[static_cast<std::size_t>(c)].b, record + 3 + 4 * c);
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise passes.

/// Calls f(c, in_a, in_b, out) for every element, with in_b optional. Channel-inner views walk
/// rows of channels (vectorizable); others walk planes.
template <class T, class F>
void elementwise(const TensorView& a, const TensorView& b, const TensorView& out, const Context& ctx, F&& f) {
  const Dims d(a);
  const bool rows = channels_inner(a) && channels_inner(out) && (!b.defined() || channels_inner(b));
  if (rows) {
    parallel_for(d.N * d.HW, 256, threads_of(ctx), [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t n = r / d.HW, p = r % d.HW;
        const T* ar = static_cast<const T*>(a.data) + pos_offset(a, n, p);
        const T* br = b.defined() ? static_cast<const T*>(b.data) + pos_offset(b, n, p) : ar;
        T* orow = static_cast<T*>(out.data) + pos_offset(out, n, p);
        for (std::int64_t c = 0; c < d.C; ++c) orow[c] = f(c, ld(ar[c]), ld(br[c]));
      }
    });
    return;
  }
  parallel_for(d.N * d.C, 1, threads_of(ctx), [&](std::int64_t q0, std::int64_t q1) {
    for (std::int64_t q = q0; q < q1; ++q) {
      const std::int64_t n = q / d.C, c = q % d.C;
      const T* ap = static_cast<const T*>(a.data) + n * a.strides[0] + c * a.strides[1];
      const T* bp = b.defined() ? static_cast<const T*>(b.data) + n * b.strides[0] + c * b.strides[1] : ap;
      T* op = static_cast<T*>(out.data) + n * out.strides[0] + c * out.strides[1];
      const bool flat = a.strides[3] == 1 && a.strides[2] == d.W && out.strides[3] == 1 && out.strides[2] == d.W &&
                        (!b.defined() || (b.strides[3] == 1 && b.strides[2] == d.W));
      if (flat) {
        for (std::int64_t p = 0; p < d.HW; ++p) op[p] = f(c, ld(ap[p]), ld(bp[p]));
      } else {
        for (std::int64_t h = 0; h < d.H; ++h)
          for (std::int64_t w = 0; w < d.W; ++w) {
            const std::int64_t oa = h * a.strides[2] + w * a.strides[3];
            const std::int64_t ob = b.defined() ? h * b.strides[2] + w * b.strides[3] : oa;
            op[h * out.strides[2] + w * out.strides[3]] = f(c, ld(ap[oa]), ld(bp[ob]));
          }
      }
    }
  });
}

}  // namespace

void sbn_local_scales_cpu(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* scales,
                          const Context& ctx) {
  dispatch_floating(x.dtype, [&](auto t) { local_scales<decltype(t)>(x, dy, mean, scales, ctx); });
}

void sbn_merge_scales_cpu(const std::int64_t* gathered, std::int64_t ranks, std::int64_t words, std::int64_t* scales) {
  for (std::int64_t i = 0; i < words; ++i) {
    std::int64_t m = detail::kSbnZeroExponent;
    for (std::int64_t r = 0; r < ranks; ++r) m = std::max(m, gathered[r * words + i]);
    scales[i] = m;
  }
}

void sbn_local_stats_cpu(const TensorView& x, bool exact, const std::int64_t* scales, std::int64_t* record,
                         const Context& ctx) {
  dispatch_floating(x.dtype, [&](auto t) {
    using T = decltype(t);
    if (exact) exact_record<T>(x, TensorView{}, nullptr, scales, record, ctx);
    else default_stats<T>(x, record, ctx);
  });
}

void sbn_local_backward_cpu(const TensorView& dy, const TensorView& x, const double* mean, bool exact,
                            const std::int64_t* scales, std::int64_t* record, const Context& ctx) {
  dispatch_floating(x.dtype, [&](auto t) {
    using T = decltype(t);
    if (exact) exact_record<T>(x, dy, mean, scales, record, ctx);
    else default_backward<T>(dy, x, mean, record, ctx);
  });
}

void sbn_finalize_cpu(const detail::SbnFinalizeArgs& args) {
  for (std::int64_t c = 0; c < args.channels; ++c) detail::sbn_finalize_channel(args, c);
  if (args.num_batches_tracked && args.running_mean.data &&
      detail::sbn_global_count(args.gathered, args.ranks, args.words) >= 2)
    args.num_batches_tracked[0] = detail::sbn_next_count(args.num_batches_tracked[0]);
}

void sbn_finalize_backward_cpu(const detail::SbnBackwardFinalizeArgs& args) {
  detail::sbn_finalize_backward_count(args);
  for (std::int64_t c = 0; c < args.channels; ++c) detail::sbn_finalize_backward_channel(args, c);
}

void sbn_eval_stats_cpu(const detail::SbnParam& running_mean, const detail::SbnParam& running_var, double eps,
                        std::int64_t channels, double* save_mean, double* save_invstd) {
  for (std::int64_t c = 0; c < channels; ++c)
    detail::sbn_eval_channel(running_mean, running_var, eps, save_mean, save_invstd, c);
}

void sbn_apply_cpu(const TensorView& x, const detail::SbnParam& weight, const detail::SbnParam& bias,
                   const double* mean, const double* invstd, const TensorView& y, const Context& ctx) {
  const std::int64_t C = x.sizes[1];
  std::vector<double> scale(static_cast<std::size_t>(C)), shift(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) {
    scale[static_cast<std::size_t>(c)] = detail::sbn_load(weight, c, 1.0) * invstd[c];
    shift[static_cast<std::size_t>(c)] = detail::sbn_load(bias, c, 0.0);
  }
  dispatch_floating(x.dtype, [&](auto t) {
    using T = decltype(t);
    elementwise<T>(x, TensorView{}, y, ctx, [&](std::int64_t c, double xv, double) {
      const auto i = static_cast<std::size_t>(c);
      return from_double<T>(detail::sbn_apply(xv, mean[c], scale[i], shift[i]));
    });
  });
}

void sbn_backward_apply_cpu(const TensorView& dy, const TensorView& x, const detail::SbnParam& weight,
                            const double* mean, const double* invstd, const double* sums, const TensorView& dx,
                            const Context& ctx) {
  const std::int64_t C = x.sizes[1];
  // per-channel constants as separate arrays (the channels-inner walk vectorizes over them)
  std::vector<double> k(static_cast<std::size_t>(C)), mdy(k.size()), kx(k.size()), mu(k.size());
  for (std::int64_t c = 0; c < C; ++c) {
    const double w = detail::sbn_load(weight, c, 1.0);
    const detail::SbnGradCoef g = sums ? detail::sbn_grad_coef(w, mean[c], invstd[c], sums[c], sums[C + c], sums[2 * C])
                                       : detail::sbn_grad_coef(w, mean[c], invstd[c], 0.0, 0.0, 0.0);
    const auto i = static_cast<std::size_t>(c);
    k[i] = g.k, mdy[i] = g.mdy, kx[i] = g.kx, mu[i] = g.mean;
  }
  dispatch_floating(x.dtype, [&](auto t) {
    using T = decltype(t);
    elementwise<T>(dy, x, dx, ctx, [&](std::int64_t c, double g, double xv) {
      const auto i = static_cast<std::size_t>(c);
      return from_double<T>(detail::sbn_grad(g, xv, detail::SbnGradCoef{k[i], mdy[i], kx[i], mu[i]}));
    });
  });
}

}  // namespace internal
}  // namespace detops
