// CPU backend of RoIAlign. Geometry and weights come from include/detops/detail (the same helpers
// the CUDA kernels call); this file only decides loop order, threading and memory layout:
//  - forward: per roi, a table of bilinear samples per bin is built once and reused for every
//    channel (channels innermost and vectorizable for NHWC, planes outermost for NCHW);
//  - atomic/truncated backward: threads own disjoint channel ranges and scatter without races;
//  - exact backward: the shared enumerate body, a stable counting sort, then the shared
//    fixed-order run sum, so results equal the CUDA backend's bit for bit.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "internal/common.h"
#include "internal/roi_align_backend.h"

namespace detops {
namespace internal {

using detail::Bilinear;
using detail::RoiBox;
using detail::RoiStatus;

namespace {

/// One bilinear sample with its four plane offsets (input strides applied).
template <class A>
struct Sample {
  std::int64_t o1, o2, o3, o4;
  A w1, w2, w3, w4;
  std::int32_t index;  // iy * grid_w + ix
  bool valid;
};

/// Every sample of one roi, grouped by bin: bin b owns samples [b * per_bin, (b + 1) * per_bin).
template <class A>
struct RoiTable {
  RoiBox<A> box;
  std::int64_t per_bin = 0;
  std::vector<Sample<A>> samples;
};

template <class A>
void build_roi_table(const detail::RoiSource& rois, std::int64_t k, const detail::RoiAlignShape& s, std::int64_t sh,
                     std::int64_t sw, RoiTable<A>& t) {
  t.box = detail::load_roi_box<A>(rois, k, s);
  t.samples.clear();
  if (t.box.batch < 0) return;
  t.per_bin = t.box.grid_h * t.box.grid_w;
  t.samples.resize(static_cast<std::size_t>(t.per_bin * s.PH * s.PW));
  std::size_t i = 0;
  for (std::int64_t ph = 0; ph < s.PH; ++ph)
    for (std::int64_t pw = 0; pw < s.PW; ++pw)
      for (std::int64_t iy = 0; iy < t.box.grid_h; ++iy) {
        const A y = detail::sample_coord(t.box.start_h, t.box.bin_h, ph, iy, t.box.grid_h);
        for (std::int64_t ix = 0; ix < t.box.grid_w; ++ix, ++i) {
          const A x = detail::sample_coord(t.box.start_w, t.box.bin_w, pw, ix, t.box.grid_w);
          const Bilinear<A> b = detail::bilinear(y, x, s.H, s.W);
          Sample<A>& q = t.samples[i];
          q.valid = b.valid;
          q.index = static_cast<std::int32_t>(iy * t.box.grid_w + ix);
          if (!b.valid) continue;
          q.o1 = b.y_low * sh + b.x_low * sw;
          q.o2 = b.y_low * sh + b.x_high * sw;
          q.o3 = b.y_high * sh + b.x_low * sw;
          q.o4 = b.y_high * sh + b.x_high * sw;
          q.w1 = b.w1;
          q.w2 = b.w2;
          q.w3 = b.w3;
          q.w4 = b.w4;
        }
      }
}

// ---------------------------------------------------------------------------------------------
// Forward

template <class T>
void forward_typed(const RoiAlignCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const detail::RoiAlignShape& s = call.shape;
  const auto in = strides4(call.features);
  const auto out = strides4(call.pooled);
  const auto am = call.max_pool ? strides4(call.argmax) : detail::Strides4{0, 0, 0, 0};
  const T* input = static_cast<const T*>(call.features.data);
  T* output = static_cast<T*>(call.pooled.data);
  auto* argmax = static_cast<std::int32_t*>(call.argmax.data);
  const detail::RoiSource rois = roi_source(call.rois);
  const bool vector_channels = in.s1 == 1 && out.s1 == 1 && s.C > 1;

  parallel_for(s.K, 1, ctx.resolved_threads(), [&](std::int64_t kb, std::int64_t ke) {
    RoiTable<A> t;
    std::vector<A> acc(static_cast<std::size_t>(vector_channels ? s.C : 0));
    std::vector<std::int32_t> best_index(acc.size());
    for (std::int64_t k = kb; k < ke; ++k) {
      build_roi_table(rois, k, s, in.s2, in.s3, t);
      T* out_k = output + k * out.s0;
      std::int32_t* am_k = call.max_pool ? argmax + k * am.s0 : nullptr;
      if (t.box.batch < 0) {  // invalid row (only reachable with check_rois = false)
        for (std::int64_t c = 0; c < s.C; ++c)
          for (std::int64_t ph = 0; ph < s.PH; ++ph)
            for (std::int64_t pw = 0; pw < s.PW; ++pw) {
              out_k[c * out.s1 + ph * out.s2 + pw * out.s3] = from_acc<T>(A(0));
              if (am_k) am_k[c * am.s1 + ph * am.s2 + pw * am.s3] = -1;
            }
        continue;
      }
      const T* base = input + t.box.batch * in.s0;
      if (vector_channels) {
        // NHWC: bins outermost, channels innermost and contiguous (vectorizes).
        for (std::int64_t ph = 0; ph < s.PH; ++ph)
          for (std::int64_t pw = 0; pw < s.PW; ++pw) {
            const Sample<A>* q = t.samples.data() + (ph * s.PW + pw) * t.per_bin;
            std::fill(acc.begin(), acc.end(), A(0));
            std::fill(best_index.begin(), best_index.end(), -1);
            for (std::int64_t i = 0; i < t.per_bin; ++i) {
              const Sample<A>& p = q[i];
              if (!call.max_pool) {
                if (!p.valid) continue;
                const T *p1 = base + p.o1, *p2 = base + p.o2, *p3 = base + p.o3, *p4 = base + p.o4;
                for (std::int64_t c = 0; c < s.C; ++c)
                  acc[c] += p.w1 * to_acc(p1[c]) + p.w2 * to_acc(p2[c]) + p.w3 * to_acc(p3[c]) + p.w4 * to_acc(p4[c]);
              } else {
                for (std::int64_t c = 0; c < s.C; ++c) {
                  const A v = p.valid ? p.w1 * to_acc(base[p.o1 + c]) + p.w2 * to_acc(base[p.o2 + c]) +
                                            p.w3 * to_acc(base[p.o3 + c]) + p.w4 * to_acc(base[p.o4 + c])
                                      : A(0);
                  if (detail::max_pool_takes(v, acc[c], best_index[c])) {
                    acc[c] = v;
                    best_index[c] = p.index;
                  }
                }
              }
            }
            T* o = out_k + ph * out.s2 + pw * out.s3;
            for (std::int64_t c = 0; c < s.C; ++c) o[c] = from_acc<T>(call.max_pool ? acc[c] : acc[c] / t.box.count);
            if (am_k)
              for (std::int64_t c = 0; c < s.C; ++c) am_k[c * am.s1 + ph * am.s2 + pw * am.s3] = best_index[c];
          }
        continue;
      }
      // NCHW (or any other strides): planes outermost, so each plane's rows are read in order and
      // few pages are live; avg pooling takes kGroup planes at a time so every table entry is
      // loaded once per group (each channel's additions keep their order: same bits).
      std::int64_t c_begin = 0;
      if (!call.max_pool) {
        constexpr std::int64_t kGroup = 16;
        for (; c_begin + kGroup <= s.C; c_begin += kGroup) {
          const T* plane = base + c_begin * in.s1;
          for (std::int64_t ph = 0; ph < s.PH; ++ph)
            for (std::int64_t pw = 0; pw < s.PW; ++pw) {
              const Sample<A>* q = t.samples.data() + (ph * s.PW + pw) * t.per_bin;
              A sum[kGroup] = {};
              for (std::int64_t i = 0; i < t.per_bin; ++i) {
                const Sample<A>& p = q[i];
                if (!p.valid) continue;
                for (std::int64_t g = 0; g < kGroup; ++g) {
                  const T* pl = plane + g * in.s1;
                  sum[g] += p.w1 * to_acc(pl[p.o1]) + p.w2 * to_acc(pl[p.o2]) + p.w3 * to_acc(pl[p.o3]) +
                            p.w4 * to_acc(pl[p.o4]);
                }
              }
              T* o = out_k + c_begin * out.s1 + ph * out.s2 + pw * out.s3;
              for (std::int64_t g = 0; g < kGroup; ++g) o[g * out.s1] = from_acc<T>(sum[g] / t.box.count);
            }
        }
      }
      for (std::int64_t c = c_begin; c < s.C; ++c) {
        const T* plane = base + c * in.s1;
        for (std::int64_t ph = 0; ph < s.PH; ++ph)
          for (std::int64_t pw = 0; pw < s.PW; ++pw) {
            const Sample<A>* q = t.samples.data() + (ph * s.PW + pw) * t.per_bin;
            T* o = out_k + c * out.s1 + ph * out.s2 + pw * out.s3;
            if (!call.max_pool) {
              A sum = A(0);
              for (std::int64_t i = 0; i < t.per_bin; ++i) {
                const Sample<A>& p = q[i];
                if (!p.valid) continue;
                sum += p.w1 * to_acc(plane[p.o1]) + p.w2 * to_acc(plane[p.o2]) + p.w3 * to_acc(plane[p.o3]) +
                       p.w4 * to_acc(plane[p.o4]);
              }
              *o = from_acc<T>(sum / t.box.count);
            } else {
              A best = A(0);
              std::int32_t bi = -1;
              for (std::int64_t i = 0; i < t.per_bin; ++i) {
                const Sample<A>& p = q[i];
                const A v = p.valid ? p.w1 * to_acc(plane[p.o1]) + p.w2 * to_acc(plane[p.o2]) +
                                          p.w3 * to_acc(plane[p.o3]) + p.w4 * to_acc(plane[p.o4])
                                    : A(0);
                if (detail::max_pool_takes(v, best, bi)) {
                  best = v;
                  bi = p.index;
                }
              }
              *o = from_acc<T>(best);
              am_k[c * am.s1 + ph * am.s2 + pw * am.s3] = bi;
            }
          }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Backward helpers

/// Writes value into every element of a strided 4-d view, in parallel over the first two dims.
template <class T, class F>
void for_each_element(const TensorView& v, const Context& ctx, F&& f) {
  const std::int64_t outer = v.sizes[0] * v.sizes[1];
  parallel_for(outer, 1, ctx.resolved_threads(), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const std::int64_t n = i / v.sizes[1], c = i % v.sizes[1];
      for (std::int64_t y = 0; y < v.sizes[2]; ++y)
        for (std::int64_t x = 0; x < v.sizes[3]; ++x)
          f(n * v.strides[0] + c * v.strides[1] + y * v.strides[2] + x * v.strides[3],
            ((n * v.sizes[1] + c) * v.sizes[2] + y) * v.sizes[3] + x);
    }
  });
}

template <class T>
void zero_fill(const TensorView& v, const Context& ctx) {
  T* p = static_cast<T*>(v.data);
  if (v.is_contiguous() || (v.layout() == Layout::kNHWC && v.span_bytes() == v.numel() * static_cast<std::int64_t>(sizeof(T)))) {
    std::memset(static_cast<void*>(p), 0, static_cast<std::size_t>(v.numel()) * sizeof(T));
    return;
  }
  for_each_element<T>(v, ctx, [&](std::int64_t off, std::int64_t) { p[off] = from_acc<T>(acc_t<T>(0)); });
}

/// Scatter backward (atomic and truncated modes): threads own disjoint channel ranges, so plain
/// adds are race-free; V is the contribution type, Target the accumulator array's element type.
template <class T, class V, class Target>
void scatter_backward(const RoiAlignCall& call, const Context& ctx, Target* target, const detail::Strides4& ts,
                      int narrow) {
  using A = acc_t<T>;
  const detail::RoiAlignShape& s = call.shape;
  const auto go = strides4(call.pooled);
  const auto am = call.max_pool ? strides4(call.argmax) : detail::Strides4{0, 0, 0, 0};
  const T* grad_output = static_cast<const T*>(call.pooled.data);
  const auto* argmax = static_cast<const std::int32_t*>(call.argmax.data);
  const detail::RoiSource rois = roi_source(call.rois);
  parallel_for(s.C, 1, ctx.resolved_threads(), [&](std::int64_t cb, std::int64_t ce) {
    RoiTable<A> t;
    for (std::int64_t k = 0; k < s.K; ++k) {
      build_roi_table(rois, k, s, ts.s2, ts.s3, t);
      if (t.box.batch < 0) continue;
      const V count = static_cast<V>(t.per_bin);
      for (std::int64_t c = cb; c < ce; ++c) {
        Target* plane = target + t.box.batch * ts.s0 + c * ts.s1;
        auto add = [plane](std::int64_t off, V v) {
          plane[off] = static_cast<Target>(from_double<Target>(static_cast<double>(static_cast<V>(to_acc(plane[off])) + v)));
        };
        for (std::int64_t bin = 0; bin < s.PH * s.PW; ++bin) {
          const std::int64_t ph = bin / s.PW, pw = bin % s.PW;
          const A ga = to_acc(grad_output[k * go.s0 + c * go.s1 + ph * go.s2 + pw * go.s3]);
          const V g = narrow ? static_cast<V>(detail::truncate_gradient(static_cast<double>(ga), narrow)) : static_cast<V>(ga);
          const Sample<A>* q = t.samples.data() + bin * t.per_bin;
          auto scatter = [&](const Sample<A>& p, V den) {
            add(p.o1, g * static_cast<V>(p.w1) / den);
            add(p.o2, g * static_cast<V>(p.w2) / den);
            add(p.o3, g * static_cast<V>(p.w3) / den);
            add(p.o4, g * static_cast<V>(p.w4) / den);
          };
          if (!call.max_pool) {
            for (std::int64_t i = 0; i < t.per_bin; ++i)
              if (q[i].valid) scatter(q[i], count);
          } else {
            const std::int32_t idx = argmax[k * am.s0 + c * am.s1 + ph * am.s2 + pw * am.s3];
            if (idx >= 0 && idx < t.per_bin && q[idx].valid) scatter(q[idx], V(1));
          }
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Exact backward

/// The workspace arrays of the exact mode, in one fixed order (used for sizing and for carving).
template <class A>
struct ExactBuffers {
  detail::ExactRecords<A> slots{};
  detail::ExactRecords<A> sorted{};
  std::int64_t* roi_offsets = nullptr;
  std::int64_t* sorted_ids = nullptr;
  std::int64_t* buckets = nullptr;
  std::uint64_t* run_keys = nullptr;
  std::int64_t* run_offsets = nullptr;
  std::int64_t* run_lengths = nullptr;
};

bool use_counting_sort(std::int64_t positions, std::int64_t cap) { return positions + 1 <= 2 * cap + (1 << 20); }

template <class A>
WorkspaceLayout exact_layout(const detail::RoiAlignShape& s, std::int64_t cap) {
  WorkspaceLayout l;
  const std::int64_t positions = s.N * s.H * s.W;
  add_records<A>(l, cap, true);   // slots
  add_records<A>(l, cap, false);  // sorted copies (keys and ids are read through sorted_ids)
  l.add<std::int64_t>(s.K + 1);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(use_counting_sort(positions, cap) ? positions + 2 : 0);
  l.add<std::uint64_t>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(cap);
  return l;
}

template <class A>
ExactBuffers<A> carve_exact(WorkspaceLayout& l, void* base) {
  l.bind(base);
  ExactBuffers<A> b;
  b.slots = take_records<A>(l);
  b.sorted = take_records<A>(l);
  b.roi_offsets = l.take<std::int64_t>();
  b.sorted_ids = l.take<std::int64_t>();
  b.buckets = l.take<std::int64_t>();
  b.run_keys = l.take<std::uint64_t>();
  b.run_offsets = l.take<std::int64_t>();
  b.run_lengths = l.take<std::int64_t>();
  return b;
}

template <class T>
void exact_backward(const RoiAlignCall& call, const RoiCheck& check, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const detail::RoiAlignShape& s = call.shape;
  const int threads = ctx.resolved_threads();
  const std::int64_t cap = exact_slot_capacity(s, check);
  WorkspaceLayout layout = exact_layout<A>(s, cap);
  ExactBuffers<A> b = carve_exact<A>(layout, ws.data);
  const detail::RoiSource rois = roi_source(call.rois);
  const std::uint64_t sentinel = static_cast<std::uint64_t>(s.N * s.H * s.W);

  // Phase 1: per-roi slot offsets, then every (roi, bin) enumerates its slots.
  b.roi_offsets[0] = 0;
  for (std::int64_t k = 0; k < s.K; ++k)
    b.roi_offsets[k + 1] = b.roi_offsets[k] + detail::roi_sample_count<A>(rois, k, s);
  parallel_for(cap, 1 << 16, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t j = lo; j < hi; ++j) {
      b.slots.keys[j] = sentinel;
      b.slots.ids[j] = j;
    }
  });
  detail::EnumerateArgs<A> ea{rois, b.roi_offsets, s, call.max_pool, strides4(call.pooled),
                              call.max_pool ? strides4(call.argmax) : detail::Strides4{0, 0, 0, 0}, b.slots};
  parallel_for(s.K * s.PH * s.PW, 64, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t t = lo; t < hi; ++t) detail::roi_align_exact_enumerate_bin(t, ea);
  });

  // Phase 2: stable sort of slot ids by position (counting sort, or a stable comparison sort
  // when positions far outnumber slots: both give the same order).
  const std::int64_t positions = s.N * s.H * s.W;
  if (use_counting_sort(positions, cap)) {
    std::fill(b.buckets, b.buckets + positions + 2, 0);
    for (std::int64_t j = 0; j < cap; ++j) ++b.buckets[b.slots.keys[j] + 1];
    for (std::int64_t p = 0; p <= positions; ++p) b.buckets[p + 1] += b.buckets[p];
    for (std::int64_t j = 0; j < cap; ++j) b.sorted_ids[b.buckets[b.slots.keys[j]]++] = j;
  } else {
    std::iota(b.sorted_ids, b.sorted_ids + cap, std::int64_t{0});
    std::stable_sort(b.sorted_ids, b.sorted_ids + cap,
                     [&](std::int64_t x, std::int64_t y) { return b.slots.keys[x] < b.slots.keys[y]; });
  }
  parallel_for(cap, 1 << 14, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) detail::roi_align_exact_permute(r, b.sorted_ids, b.slots, b.sorted);
  });
  std::int64_t runs = 0;
  for (std::int64_t r = 0; r < cap;) {
    const std::uint64_t key = b.slots.keys[b.sorted_ids[r]];
    std::int64_t e = r + 1;
    while (e < cap && b.slots.keys[b.sorted_ids[e]] == key) ++e;
    if (key == sentinel) break;  // sentinels sort last
    b.run_keys[runs] = key;
    b.run_offsets[runs] = r;
    b.run_lengths[runs] = e - r;
    ++runs;
    r = e;
  }

  // Phase 3: zero grad_input, then each (run, channel) is written once with its fixed-order sum.
  zero_fill<T>(call.features, ctx);
  const detail::GatherArgs<T> ga = make_gather_args<T>(call, b.sorted, b.run_keys, b.run_offsets, b.run_lengths);
  const bool vector_channels = ga.gi.s1 == 1 && ga.go_c == 1 && s.C > 1;
  if (vector_channels) {
    parallel_for(runs, 256, threads, [&](std::int64_t lo, std::int64_t hi) {
      std::vector<A> acc(static_cast<std::size_t>(s.C));
      for (std::int64_t run = lo; run < hi; ++run) {
        std::fill(acc.begin(), acc.end(), A(0));
        const std::int64_t begin = ga.run_offsets[run], end = begin + ga.run_lengths[run];
        for (std::int64_t r = begin; r < end; ++r) {
          const T* g = ga.grad_output + ga.go_offsets[r];
          const A w = ga.weights[r];
          if (!ga.max_pool) {
            for (std::int64_t c = 0; c < s.C; ++c) acc[c] = acc[c] + to_acc(g[c]) * w;
          } else {
            for (std::int64_t c = 0; c < s.C; ++c)
              if (detail::exact_slot_active(ga, r, c)) acc[c] = acc[c] + to_acc(g[c]) * w;
          }
        }
        T* out = ga.grad_input + detail::exact_run_target(ga, ga.run_keys[run]);
        for (std::int64_t c = 0; c < s.C; ++c) out[c] = from_acc<T>(acc[c]);
      }
    });
  } else {
    // Channel blocks: each slot is loaded once per block instead of once per channel; the order
    // of additions within every channel is still the slot order, so the bits do not change.
    constexpr std::int64_t kBlock = 16;
    const std::int64_t blocks = (s.C + kBlock - 1) / kBlock;
    parallel_for(blocks, 1, threads, [&](std::int64_t bb, std::int64_t be) {
      A acc[kBlock];
      for (std::int64_t blk = bb; blk < be; ++blk) {
        const std::int64_t c0 = blk * kBlock, nc = std::min(kBlock, s.C - c0);
        for (std::int64_t run = 0; run < runs; ++run) {
          for (std::int64_t j = 0; j < nc; ++j) acc[j] = A(0);
          const std::int64_t begin = ga.run_offsets[run], end = begin + ga.run_lengths[run];
          for (std::int64_t r = begin; r < end; ++r) {
            const T* g = ga.grad_output + ga.go_offsets[r] + c0 * ga.go_c;
            const A w = ga.weights[r];
            for (std::int64_t j = 0; j < nc; ++j)
              if (detail::exact_slot_active(ga, r, c0 + j)) acc[j] = acc[j] + to_acc(g[j * ga.go_c]) * w;
          }
          T* out = ga.grad_input + detail::exact_run_target(ga, ga.run_keys[run]) + c0 * ga.gi.s1;
          for (std::int64_t j = 0; j < nc; ++j) out[j * ga.gi.s1] = from_acc<T>(acc[j]);
        }
      }
    });
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

RoiCheck roi_align_check_rois_cpu(const RoiAlignCall& call, bool need_total) {
  (void)need_total;  // cheap on the CPU: always computed
  RoiCheck check;
  check.total_samples = 0;
  const detail::RoiSource rois = roi_source(call.rois);
  return dispatch_floating(call.features.dtype, [&](auto tag) {
    using A = acc_t<decltype(tag)>;
    for (std::int64_t k = 0; k < call.shape.K; ++k) {
      double row[5];
      detail::load_roi_row(rois.data, rois.dtype, rois.s0, rois.s1, k, row);
      const RoiBox<A> box = detail::make_roi_box<A>(row[0], row + 1, call.shape);
      if (box.status != RoiStatus::kOk) {
        if (check.bad_row < 0) {
          check.bad_row = k;
          check.status = box.status;
          std::copy(row, row + 5, check.row);
          check.grid_h = box.grid_h;
          check.grid_w = box.grid_w;
        }
        continue;
      }
      // saturating: each term is at most 2^40 (max_samples_per_roi), the sum must not wrap
      check.total_samples = std::min<std::int64_t>(check.total_samples + box.grid_h * box.grid_w * call.shape.PH * call.shape.PW,
                                                   std::int64_t{1} << 50);
    }
    return check;
  });
}

void roi_align_forward_cpu(const RoiAlignCall& call, const Context& ctx) {
  dispatch_floating(call.features.dtype, [&](auto tag) { forward_typed<decltype(tag)>(call, ctx); });
}

std::size_t roi_align_backward_workspace_cpu(const RoiAlignCall& call, const RoiCheck& check, BackwardMode mode) {
  const detail::RoiAlignShape& s = call.shape;
  switch (mode) {
    case BackwardMode::kAtomic: return 0;
    case BackwardMode::kTruncated: {
      WorkspaceLayout l;
      l.add<double>(s.N * s.C * s.H * s.W);
      return l.bytes();
    }
    case BackwardMode::kExact:
      return dispatch_floating(call.features.dtype, [&](auto tag) {
        return exact_layout<acc_t<decltype(tag)>>(s, exact_slot_capacity(s, check)).bytes();
      });
  }
  return 0;
}

void roi_align_backward_cpu(const RoiAlignCall& call, const RoiCheck& check, const RoiAlignBackwardOptions& opt,
                            const Context& ctx, Workspace ws) {
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::RoiAlignShape& s = call.shape;
    switch (opt.mode) {
      case BackwardMode::kAtomic:
        zero_fill<T>(call.features, ctx);
        if (s.K > 0) scatter_backward<T, acc_t<T>, T>(call, ctx, static_cast<T*>(call.features.data), strides4(call.features), 0);
        break;
      case BackwardMode::kTruncated: {
        // Accumulate in a contiguous NCHW double buffer, then round each sum once.
        auto* buf = static_cast<double*>(ws.data);
        const detail::Strides4 bs{s.C * s.H * s.W, s.H * s.W, s.W, 1};
        if (s.K > 0) std::fill(buf, buf + s.N * s.C * s.H * s.W, 0.0);
        if (s.K > 0) scatter_backward<T, double, double>(call, ctx, buf, bs, narrow_code(opt));
        T* gi = static_cast<T*>(call.features.data);
        if (s.K == 0) zero_fill<T>(call.features, ctx);
        else for_each_element<T>(call.features, ctx, [&](std::int64_t off, std::int64_t lin) { gi[off] = from_double<T>(buf[lin]); });
        break;
      }
      case BackwardMode::kExact:
        if (s.K == 0) zero_fill<T>(call.features, ctx);
        else exact_backward<T>(call, check, ctx, ws);
        break;
    }
  });
}

}  // namespace internal
}  // namespace detops
