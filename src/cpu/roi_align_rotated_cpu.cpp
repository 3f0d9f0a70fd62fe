// CPU backend of RoIAlignRotated. Geometry and weights come from include/detops/detail (the same
// helpers the CUDA kernels call); the sample tables (Sample, corners) are RoIAlign's, and so are
// the scatter step, the zero fill and the truncated mode's rounding (cpu/scatter_cpu.h) and the
// exact mode's engine (internal/gather_backward_cpu.h). This file decides the walk:
//  - rois are ordered by image (k order within an image) and their sample tables built in blocks
//    of at most kBlockSamples samples; for each block, threads take units of channels and walk
//    every roi of the block on them. NCHW: a unit is a group of planes that fits a core's cache
//    share, so the group's planes stay cached while every roi of the image reads (or adds to)
//    them, as RoIAlign's plane-group walk. Channels innermost: a unit is a contiguous range of
//    channels, walked a row at a time (vectorized).
//  - forward: each output adds its samples in table order (the CUDA body's order); channels
//    innermost, the loop is RoIAlign's add_bin_rows, compiled per instruction set
//    (roi_align_rotated_cpu_kernels.inc);
//  - atomic/truncated backward: units own disjoint channels, so plain adds are race-free, and
//    each element receives its adds in the order (roi, bin, sample, corner), the order of the
//    CUDA scatter body run in thread order and the exact mode's canonical order;
//  - exact backward: per chunk of whole images, the shared enumerate body, the engine's sort and
//    fixed-order run sums.
// So neither the walk, the layout nor the thread count changes any bit.
#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/roi_align_cpu.h"  // Sample, corners, make_sample
#include "cpu/scatter_cpu.h"
#include "internal/gather_backward_cpu.h"
#include "internal/roi_align_rotated_backend.h"

namespace detops {
namespace internal {

namespace {

/// Channels [cb, ce) of one roi for the channels-innermost forward (roi_align_rotated_cpu_kernels.inc).
struct RotatedRows {
  const void* image;    // the roi's image (channel 0)
  const void* samples;  // its table: Sample<accumulation type>, `bins` bins of per_bin samples
  std::int64_t per_bin, bins, PW;
  std::int64_t sh, sw;  // input row and column strides (the table's offsets use them)
  std::int64_t cb, ce;
  void* out;            // the roi's output (channel 0)
  std::int64_t os2, os3;
  double count;         // the average's divisor (exact: an integer)
  const HalfConvert* cv;
};

/// A variant's entry points (roi_align_rotated_cpu_kernels.inc).
struct RotatedCpuKernels {
  void (*forward_rows)(DType dtype, const RotatedRows& r);
};

}  // namespace

#define DETOPS_CPU_KERNELS_FILE "roi_align_rotated_cpu_kernels.inc"
#include "cpu/cpu_variants.inc"

namespace {

using detail::RotatedBox;
using detail::RoiStatus;
using Shape = detail::RoiAlignRotatedShape;

/// Samples per block of roi tables (the tables of a block are built once and walked once per unit).
constexpr std::int64_t kRotatedBlockSamples = std::int64_t{1} << 18;
/// Bytes of planes a unit keeps in a core's cache (a per-core L2 share).
constexpr std::int64_t kUnitBytes = std::int64_t{1} << 20;
/// The most planes in a unit (unit_width's cap when channels are not innermost).
constexpr std::int64_t kMaxUnitPlanes = 16;

template <class A>
std::int64_t rotated_table_size(const RotatedBox<A>& box, const Shape& s) {
  return box.batch < 0 ? 0 : box.grid_h * box.grid_w * s.PH * s.PW;
}

/// Writes the samples of one roi, bin by bin, to `out`.
template <class A>
void fill_rotated_samples(const RotatedBox<A>& box, const Shape& s, std::int64_t sh, std::int64_t sw, Sample<A>* out) {
  std::int64_t i = 0;
  for (std::int64_t ph = 0; ph < s.PH; ++ph)
    for (std::int64_t pw = 0; pw < s.PW; ++pw)
      for (std::int64_t iy = 0; iy < box.grid_h; ++iy)
        for (std::int64_t ix = 0; ix < box.grid_w; ++ix, ++i) {
          const detail::MapPoint<A> p = detail::rotated_sample(box, ph, pw, iy, ix);
          out[i] = make_sample(detail::bilinear(p.y, p.x, s.H, s.W), iy * box.grid_w + ix, sh, sw);
        }
}

/// The rois of a call: every box, the valid ones ordered by image (k order within an image), cut
/// into blocks of whole tables (`block_begin`, `offset` of each table in its block), with room
/// for the largest block in `table`. Everything is allocated here, before any output is written.
template <class A>
struct RotatedPlan {
  std::vector<RotatedBox<A>> boxes;
  std::vector<std::int64_t> order, offset, block_begin;
  std::unique_ptr<Sample<A>[]> table;  // left uninitialized: written before it is read

  RotatedPlan(const detail::RoiSource& rois, const Shape& s, int threads) : boxes(static_cast<std::size_t>(s.K)) {
    parallel_for(s.K, 256, threads, [&](std::int64_t kb, std::int64_t ke) {
      for (std::int64_t k = kb; k < ke; ++k) boxes[static_cast<std::size_t>(k)] = detail::load_rotated_box<A>(rois, k, s);
    });
    for (std::int64_t k = 0; k < s.K; ++k)
      if (box(k).batch >= 0) order.push_back(k);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return box(a).batch < box(b).batch; });
    offset.assign(order.size() + 1, 0);
    block_begin.assign(1, 0);
    std::int64_t largest = 0;
    for (std::size_t j = 0; j < order.size(); ++j) {
      const std::int64_t n = rotated_table_size(box(order[j]), s);
      if (offset[j] > 0 && offset[j] + n > kRotatedBlockSamples) {  // start a new block at j
        block_begin.push_back(static_cast<std::int64_t>(j));
        offset[j] = 0;
      }
      offset[j + 1] = offset[j] + n;
      largest = std::max(largest, offset[j + 1]);
    }
    block_begin.push_back(static_cast<std::int64_t>(order.size()));
    if (largest > 0) table.reset(new Sample<A>[static_cast<std::size_t>(largest)]);
  }
  const RotatedBox<A>& box(std::int64_t k) const { return boxes[static_cast<std::size_t>(k)]; }
  std::int64_t roi(std::int64_t j) const { return order[static_cast<std::size_t>(j)]; }
  const Sample<A>* samples(std::int64_t j) const { return table.get() + offset[static_cast<std::size_t>(j)]; }

  /// For each block: builds its tables (sh, sw: the strides the offsets are for), then calls
  /// f(first channel, end channel, j) for every unit and roi j of the block, units in parallel.
  template <class F>
  void walk(const Shape& s, std::int64_t sh, std::int64_t sw, std::int64_t unit_width, int threads, F&& f) {
    const std::int64_t units = (s.C + unit_width - 1) / unit_width;
    for (std::size_t b = 0; b + 1 < block_begin.size(); ++b) {
      const std::int64_t jb = block_begin[b], je = block_begin[b + 1];
      parallel_for(je - jb, 16, threads, [&](std::int64_t lb, std::int64_t le) {
        for (std::int64_t j = jb + lb; j < jb + le; ++j)
          fill_rotated_samples(box(roi(j)), s, sh, sw, table.get() + offset[static_cast<std::size_t>(j)]);
      });
      parallel_for(units, 1, threads, [&](std::int64_t ub, std::int64_t ue) {
        for (std::int64_t u = ub; u < ue; ++u) {
          const std::int64_t cb = u * unit_width, ce = std::min(s.C, cb + unit_width);
          for (std::int64_t j = jb; j < je; ++j) f(cb, ce, j);
        }
      });
    }
  }
};

/// Channels per unit: with channels innermost, an equal share per thread (rows of channels);
/// otherwise as many planes as fit kUnitBytes (a power of two, at most 16), but no more than
/// leave every thread two units.
std::int64_t unit_width(const Shape& s, bool rows, std::size_t element_bytes, int threads) {
  if (rows) return std::max<std::int64_t>(1, (s.C + threads - 1) / threads);
  const std::int64_t plane_bytes = std::max<std::int64_t>(s.H * s.W * static_cast<std::int64_t>(element_bytes), 1);
  const std::int64_t cap = std::max<std::int64_t>(1, s.C / (2 * static_cast<std::int64_t>(threads)));
  std::int64_t g = kMaxUnitPlanes;
  while (g > 1 && (g * plane_bytes > kUnitBytes || g > cap)) g /= 2;
  return g;
}

// ---------------------------------------------------------------------------------------------
// Forward

template <class T>
void forward_typed(const RoiAlignRotatedCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const Shape& s = call.shape;
  const detail::Strides4 in = strides4(call.features), os = strides4(call.pooled);
  const T* input = static_cast<const T*>(call.features.data);
  T* output = static_cast<T*>(call.pooled.data);
  const int threads = ctx.resolved_threads();
  RotatedPlan<A> plan(roi_source(call.rois), s, threads);

  parallel_for(s.K, 64, threads, [&](std::int64_t kb, std::int64_t ke) {
    for (std::int64_t k = kb; k < ke; ++k) {
      if (plan.box(k).batch >= 0) continue;  // invalid row (check_rois = false): zeros
      for (std::int64_t c = 0; c < s.C; ++c)
        for (std::int64_t ph = 0; ph < s.PH; ++ph)
          for (std::int64_t pw = 0; pw < s.PW; ++pw)
            output[k * os.s0 + c * os.s1 + ph * os.s2 + pw * os.s3] = from_acc<T>(A(0));
    }
  });

  const bool rows = in.s1 == 1 && os.s1 == 1 && s.C > 1;
  const std::int64_t width = unit_width(s, rows, sizeof(T), threads);
  const RotatedCpuKernels& kernels = cpu_kernels(ctx);
  const HalfConvert* cv = nullptr;
  if constexpr (std::is_same_v<T, Half>) cv = half_convert_f16c(ctx);
  plan.walk(s, in.s2, in.s3, width, threads, [&](std::int64_t cb, std::int64_t ce, std::int64_t j) {
    const std::int64_t k = plan.roi(j);
    const RotatedBox<A>& box = plan.box(k);
    const Sample<A>* table = plan.samples(j);
    const std::int64_t per_bin = box.grid_h * box.grid_w;
    const T* image = input + box.batch * in.s0;
    T* out_k = output + k * os.s0;
    if (rows) {  // channels innermost: a row of channels per corner, per instruction set
      kernels.forward_rows(call.features.dtype, {image, table, per_bin, s.PH * s.PW, s.PW, in.s2, in.s3, cb, ce, out_k,
                                                 os.s2, os.s3, static_cast<double>(box.count), cv});
      return;
    }
    // planes: RoIAlign's plane-group pooling, each table entry read once for the unit's channels
    // (at most 16, a compile-time count), each channel adding its samples in table order
    pool_roi_channels(image, in, table, per_bin, box.count, s, os, detail::Strides4{0, 0, 0, 0},
                      PooledRoi<T>{out_k, nullptr}, cb, ce - cb, static_cast<int>(width));
  });
}

// ---------------------------------------------------------------------------------------------
// Scatter backward (atomic and truncated modes)

/// Adds every roi's gradient into `target` (strides ts; grad_input itself, or the truncated
/// mode's double buffer): V is the contribution type, Target the accumulator's element type.
/// prepare() (zeroing the accumulator) runs once everything is allocated: an allocation failure
/// leaves grad_input as it was.
template <class T, class V, class Target, class Prepare>
void scatter_backward(const RoiAlignRotatedCall& call, const Context& ctx, Target* target, const detail::Strides4& ts,
                      detail::GradRounding rounding, Prepare&& prepare) {
  using A = acc_t<T>;
  const Shape& s = call.shape;
  const detail::Strides4 go = strides4(call.pooled);
  const T* grad_output = static_cast<const T*>(call.pooled.data);
  const int threads = ctx.resolved_threads();
  RotatedPlan<A> plan(roi_source(call.rois), s, threads);
  // rows when the accumulator's channels are contiguous; otherwise its planes must be disjoint
  // blocks for a plane group to stay in cache (any layout is correct: units own their channels)
  const bool rows = ts.s1 == 1 && s.C > 1;
  const std::int64_t width = unit_width(s, rows, sizeof(Target), threads);
  prepare();
  plan.walk(s, ts.s2, ts.s3, width, threads, [&](std::int64_t cb, std::int64_t ce, std::int64_t j) {
    const std::int64_t k = plan.roi(j);
    const RotatedBox<A>& box = plan.box(k);
    const Sample<A>* table = plan.samples(j);
    const std::int64_t per_bin = box.grid_h * box.grid_w;
    const V count = static_cast<V>(per_bin);
    Target* image = target + box.batch * ts.s0;
    const T* go_k = grad_output + k * go.s0;
    if (rows) {
      V g[64];
      for (std::int64_t c0 = cb; c0 < ce; c0 += 64) {
        const std::int64_t n = std::min<std::int64_t>(64, ce - c0);
        Target* base = image + c0;
        for (std::int64_t bin = 0; bin < s.PH * s.PW; ++bin) {
          const T* gb = go_k + c0 * go.s1 + (bin / s.PW) * go.s2 + (bin % s.PW) * go.s3;
          for (std::int64_t c = 0; c < n; ++c) g[c] = detail::scatter_gradient<V>(to_acc(gb[c * go.s1]), rounding);
          for (std::int64_t i = 0; i < per_bin; ++i) {
            const Sample<A>& p = table[bin * per_bin + i];
            if (!p.valid) continue;
            const Corners o = corners(p, ts.s2, ts.s3);
            for (std::int64_t c = 0; c < n; ++c) scatter_add(base + o.o1 + c, detail::scatter_contribution(g[c], p.w1, count));
            for (std::int64_t c = 0; c < n; ++c) scatter_add(base + o.o2 + c, detail::scatter_contribution(g[c], p.w2, count));
            for (std::int64_t c = 0; c < n; ++c) scatter_add(base + o.o3 + c, detail::scatter_contribution(g[c], p.w3, count));
            for (std::int64_t c = 0; c < n; ++c) scatter_add(base + o.o4 + c, detail::scatter_contribution(g[c], p.w4, count));
          }
        }
      }
      return;
    }
    // planes: RoIAlign's plane-group scatter, each table entry read once for the unit's channels
    // (at most 16, a compile-time count); every plane still receives its adds in the order (bin,
    // sample, corner)
    scatter_roi_channels<V>(image, ts, table, per_bin, s, go_k, go, nullptr, detail::Strides4{0, 0, 0, 0}, rounding, cb,
                            ce - cb, static_cast<int>(width));
  });
}

// ---------------------------------------------------------------------------------------------
// Exact backward: the gather-backward engine, one chunk of whole images at a time
// (rotated_exact_chunks): the workspace holds one chunk's records, about max(one image's, 2^19),
// whatever the batch, and every destination's sum is the one a single chunk would give.

template <class A>
WorkspaceLayout exact_layout(const Shape& s, const RotatedExactChunks& ch, const char* op) {
  WorkspaceLayout l;
  add_gather_cpu<A>(l, ch.records, ch.positions, op);
  l.add<std::int64_t>(s.K + 1);  // record offsets per roi of the chunk, in samples
  return l;
}

template <class T>
void exact_backward(const RoiAlignRotatedCall& call, const RoiCheck& check, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const Shape& s = call.shape;
  const int threads = ctx.resolved_threads();
  const RotatedExactChunks ch = rotated_exact_chunks(s, check);
  WorkspaceLayout layout = exact_layout<A>(s, ch, call.op);
  layout.bind(ws.data);
  const GatherCpuBuffers<A> g = take_gather_cpu<A>(layout);
  std::int64_t* roi_offsets = layout.take<std::int64_t>();
  const detail::RoiSource rois = roi_source(call.rois);
  const auto sentinel = static_cast<detail::GatherKey>(ch.positions);
  const std::int64_t bins = s.PH * s.PW;
  T* grad_input = static_cast<T*>(call.features.data);
  const detail::Strides4 gi = strides4(call.features);
  // Each roi's image (-1: an invalid row) and samples, read once for every chunk; the rois of the
  // current chunk that have samples.
  std::vector<std::int64_t> roi_image(static_cast<std::size_t>(s.K)), roi_samples(roi_image.size()), chunk_rois;
  chunk_rois.reserve(roi_image.size());
  parallel_for(s.K, 256, threads, [&](std::int64_t kb, std::int64_t ke) {
    for (std::int64_t k = kb; k < ke; ++k) {
      const RotatedBox<A> box = detail::load_rotated_box<A>(rois, k, s);
      roi_image[static_cast<std::size_t>(k)] = box.batch;
      roi_samples[static_cast<std::size_t>(k)] = rotated_table_size(box, s);
    }
  });

  zero_fill<T>(call.features, ctx);  // then each (run, channel) of a chunk is written once
  for (std::int64_t n0 = 0; n0 < s.N && ch.records > 0; n0 += ch.images) {
    const detail::ImageRange images{n0, std::min(s.N, n0 + ch.images)};
    // Phase 1: record offsets per roi of the chunk (rotated_sample_count's), its records set to
    // the sentinel, then each (roi, bin) of the chunk writes its records.
    roi_offsets[0] = 0;
    chunk_rois.clear();
    for (std::int64_t k = 0; k < s.K; ++k) {
      const auto i = static_cast<std::size_t>(k);
      const bool here = images.holds(roi_image[i]) && roi_samples[i] > 0;
      roi_offsets[k + 1] = roi_offsets[k] + (here ? roi_samples[i] : 0);
      if (here) chunk_rois.push_back(k);
    }
    const std::int64_t n = 4 * roi_offsets[s.K];
    if (n == 0) continue;
    parallel_for(n, 1 << 16, threads, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t j = lo; j < hi; ++j) detail::gather_init_record(j, g.records, sentinel);
    });
    const detail::RotatedEnumerateArgs<A> ea{rois, roi_offsets, s, strides4(call.pooled), g.records, images};
    const auto chunk_bins = static_cast<std::int64_t>(chunk_rois.size()) * bins;
    parallel_for(chunk_bins, 64, threads, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i)
        detail::roi_align_rotated_enumerate_bin(chunk_rois[static_cast<std::size_t>(i / bins)] * bins + i % bins, ea);
    });

    // Phase 2: the engine's stable sort by position and its runs.
    detail::GatherSorted<A> sorted{};
    const std::int64_t runs = gather_sort_cpu(g, n, sentinel, threads, sorted);

    // Phase 3: each (run, channel) of the chunk's images is written once with its fixed-order sum.
    const auto args = detail::rotated_gather_sum_args<T>(sorted, static_cast<const T*>(call.pooled.data),
                                                         call.pooled.strides[1], grad_input + n0 * gi.s0, gi.s1, s.C,
                                                         sentinel);
    gather_sum_cpu(args, runs, detail::RoiGatherTarget{gi, s.H, s.W}, threads);
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points (the table kRoiAlignRotatedCpu at the bottom)

RoiCheck check_rois(const RoiAlignRotatedCall& call, bool need_total, const Context&) {
  RoiCheck check;
  check.total_samples = 0;  // cheap here: always computed
  const detail::RoiSource rois = roi_source(call.rois);
  const Shape& s = call.shape;
  // the samples of each image's rois, for the exact mode's chunks (need_total: grad_input is not
  // empty, so N is no larger than its elements)
  std::vector<std::int64_t> image_samples(need_total ? static_cast<std::size_t>(s.N) : 0, 0);
  return dispatch_floating(call.features.dtype, [&](auto tag) {
    using A = acc_t<decltype(tag)>;
    for (std::int64_t k = 0; k < s.K; ++k) {
      double row[detail::kRotatedRoiColumns];
      detail::load_roi_row(rois.data, rois.dtype, rois.s0, rois.s1, k, row, detail::kRotatedRoiColumns);
      const RotatedBox<A> box = detail::make_rotated_box<A>(row[0], row + 1, s);
      if (box.status != RoiStatus::kOk) {
        if (check.bad_row < 0) {
          check.bad_row = k;
          check.status = box.status;
          std::copy(row, row + detail::kRotatedRoiColumns, check.row);
          check.grid_h = box.grid_h;
          check.grid_w = box.grid_w;
        }
        continue;
      }
      // saturating: each term is at most 2^40 (max_samples_per_roi), the sum must not wrap
      const std::int64_t samples = box.grid_h * box.grid_w * s.PH * s.PW;
      check.total_samples = std::min<std::int64_t>(check.total_samples + samples, std::int64_t{1} << 50);
      if (need_total) {
        std::int64_t& image = image_samples[static_cast<std::size_t>(box.batch)];
        image = std::min<std::int64_t>(image + samples, std::int64_t{1} << 50);
      }
    }
    if (need_total && !image_samples.empty())
      check.max_image_samples = *std::max_element(image_samples.begin(), image_samples.end());
    return check;
  });
}

void forward(const RoiAlignRotatedCall& call, const Context& ctx) {
  dispatch_floating(call.features.dtype, [&](auto tag) { forward_typed<decltype(tag)>(call, ctx); });
}

std::size_t backward_workspace(const RoiAlignRotatedCall& call, const RoiBackwardPlan& plan) {
  const Shape& s = call.shape;
  switch (plan.mode) {
    case BackwardMode::kAtomic: return 0;
    case BackwardMode::kTruncated: return truncated_buffer_bytes(s);
    case BackwardMode::kExact:
      return dispatch_floating(call.features.dtype, [&](auto tag) {
        return exact_layout<acc_t<decltype(tag)>>(s, rotated_exact_chunks(s, plan.check), call.op).bytes();
      });
  }
  return 0;
}

void backward(const RoiAlignRotatedCall& call, const RoiBackwardPlan& plan, const Context& ctx, Workspace ws) {
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    const Shape& s = call.shape;
    if (s.K == 0) {  // nothing scatters (and no workspace was sized)
      zero_fill<T>(call.features, ctx);
      return;
    }
    switch (plan.mode) {
      case BackwardMode::kAtomic:
        scatter_backward<T, acc_t<T>, T>(call, ctx, static_cast<T*>(call.features.data), strides4(call.features),
                                         detail::GradRounding::kNone, [&] { zero_fill<T>(call.features, ctx); });
        break;
      case BackwardMode::kTruncated: {
        // RoIAlign's double buffer, laid out like grad_input (NHWC when its channels are
        // contiguous), rounded once per element at the end; the layout never changes the bits.
        auto* buf = static_cast<double*>(ws.data);
        const detail::Strides4 bs = truncated_buffer_strides(call.features, s);
        scatter_backward<T, double, double>(call, ctx, buf, bs, plan.rounding,
                                            [&] { std::fill(buf, buf + s.N * s.C * s.H * s.W, 0.0); });
        store_rounded<T>(buf, bs, call.features, ctx);
        break;
      }
      case BackwardMode::kExact:
        exact_backward<T>(call, plan.check, ctx, ws);
        break;
    }
  });
}

bool enumerates(const RoiAlignRotatedCall&, BackwardMode mode) { return mode == BackwardMode::kExact; }

}  // namespace

extern const RoiAlignRotatedBackend kRoiAlignRotatedCpu = {&check_rois, &forward, &enumerates, &backward_workspace,
                                                           &backward};

}  // namespace internal
}  // namespace detops
