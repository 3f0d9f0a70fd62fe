// CPU backend of RoIAlign. Geometry and weights come from include/detops/detail (the same helpers
// the CUDA kernels call); this file only decides loop order, threading and memory layout:
//  - forward: per roi, a table of bilinear samples per bin is built once and reused for every
//    channel. NHWC: channels innermost and vectorized (roi_align_cpu_kernels.inc, compiled per
//    instruction set). NCHW: plane groups outermost over blocks of sparse rois (the group's
//    planes stay cached while every roi of the image reads them), dense rois one by one;
//  - atomic/truncated backward: threads own disjoint channels (plane groups or ranges) and
//    scatter without races, every plane's adds in roi order;
//  - exact backward: the shared enumerate body, then the gather-backward engine's stable
//    counting sort and fixed-order run sums (internal/gather_backward_cpu.h; NHWC: this op's
//    own vectorized loop, the same sums), so results equal the CUDA backend's bit for bit.
// docs/design.md ("CPU backend") has the why and the measurements.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/roi_align_cpu.h"  // also the interface of roi_align_cpu_kernels.inc
#include "cpu/scatter_cpu.h"
#include "internal/gather_backward_cpu.h"

namespace detops {
namespace internal {

#define DETOPS_CPU_KERNELS_FILE "roi_align_cpu_kernels.inc"
#include "cpu/cpu_variants.inc"

namespace {

/// Planes per group of the plane-group walks: as many as keep a group's planes of one image
/// within kGroupBytes (a per-core L2 share), so every roi of the image on that group reads (or
/// adds to) cached lines; at most `cap`, a power of two.
constexpr std::int64_t kGroupBytes = std::int64_t{1} << 20;
/// Samples per roi block: the tables of a block are built once and walked once per plane group.
constexpr std::int64_t kBlockSamples = std::int64_t{1} << 18;

inline int planes_per_group(const detail::RoiAlignShape& s, std::size_t element_bytes, std::int64_t cap = 16) {
  const std::int64_t plane_bytes = std::max<std::int64_t>(s.H * s.W * static_cast<std::int64_t>(element_bytes), 1);
  int g = 16;
  while (g > 1 && (g * plane_bytes > kGroupBytes || g > cap)) g /= 2;
  return g;
}

/// Bytes per channel that the two NCHW walks read for one roi. Plane-group walk: the roi's sample
/// table once per group of G planes (sequential). Roi walk: the roi's footprint of the plane (the
/// cache lines of its sampled rows), fetched from memory again for every roi because rois
/// overlap. Sparse samples over a large roi (fixed sampling ratio) favour the first, dense ones
/// (adaptive grids: a table entry per pixel or more) the second.
struct WalkCost {
  double group, roi;
};
template <class A>
WalkCost walk_cost(const RoiBox<A>& box, const detail::RoiAlignShape& s, std::size_t element_bytes, int G) {
  // (bins are negative for an inverted roi with `aligned`: count its extent as empty)
  const double extent_h = std::max(0.0, static_cast<double>(box.bin_h) * static_cast<double>(s.PH)) + 2;
  const double extent_w = std::max(0.0, static_cast<double>(box.bin_w) * static_cast<double>(s.PW)) + 2;
  const double rows = std::min({2.0 * static_cast<double>(s.PH * box.grid_h), extent_h, static_cast<double>(s.H)});
  const double lines = std::min(2.0 * static_cast<double>(s.PW * box.grid_w),
                                std::min(extent_w, static_cast<double>(s.W)) * static_cast<double>(element_bytes) / 64 + 1);
  return {static_cast<double>(table_size(box, s)) * sizeof(Sample<A>) / G, rows * lines * 64};
}

/// An uninitialized array of n samples (nullptr for 0): tables are written before they are read,
/// and zero-filling megabytes first would be a serial pass over memory.
template <class A>
std::unique_ptr<Sample<A>[]> make_samples(std::int64_t n) {
  return n > 0 ? std::unique_ptr<Sample<A>[]>(new Sample<A>[static_cast<std::size_t>(n)]) : nullptr;
}

/// The rois of a plane-group walk: boxes of every roi; `order` holds the valid rois, those of the
/// plane-group walk (`grouped`) first, by image and in k order within an image, then the others in
/// k order; the grouped ones split into blocks of whole tables (`block_begin`, `offset` of each
/// table in its block) with room for the largest block in `table`. Allocates everything up front.
template <class A>
struct RoiPlan {
  std::vector<RoiBox<A>> boxes;
  std::vector<unsigned char> grouped;
  std::vector<std::int64_t> order, offset, block_begin;
  std::int64_t ngrouped = 0;
  std::unique_ptr<Sample<A>[]> table;  // room for the largest block (left uninitialized)

  /// Loads the boxes; arrange() does the rest.
  RoiPlan(const detail::RoiSource& rois, const detail::RoiAlignShape& s, int threads)
      : boxes(static_cast<std::size_t>(s.K)), grouped(static_cast<std::size_t>(s.K)) {
    parallel_for(s.K, 256, threads, [&](std::int64_t kb, std::int64_t ke) {
      for (std::int64_t k = kb; k < ke; ++k) boxes[static_cast<std::size_t>(k)] = detail::load_roi_box<A>(rois, k, s);
    });
  }
  /// Orders the valid rois (pick(box): plane-group walk), builds the blocks, allocates the table.
  template <class Grouped>
  void arrange(const detail::RoiAlignShape& s, Grouped&& pick) {
    for (std::int64_t k = 0; k < s.K; ++k) {
      const RoiBox<A>& b = box(k);
      grouped[static_cast<std::size_t>(k)] = b.batch >= 0 && pick(b);
    }
    // images, then the others; a sort, not buckets per image (N may be huge with a broadcast input)
    order.clear();
    order.reserve(static_cast<std::size_t>(s.K));
    for (std::int64_t k = 0; k < s.K; ++k)
      if (box(k).batch >= 0) order.push_back(k);
    auto key = [&](std::int64_t k) { return is_grouped(k) ? box(k).batch : s.N; };
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return key(a) < key(b); });
    ngrouped = 0;
    while (ngrouped < static_cast<std::int64_t>(order.size()) && is_grouped(roi(ngrouped))) ++ngrouped;
    offset.assign(static_cast<std::size_t>(ngrouped) + 1, 0);
    block_begin.assign(1, 0);
    std::int64_t largest = 0;
    for (std::int64_t j = 0; j < ngrouped; ++j) {
      const std::int64_t n = table_size(box(roi(j)), s);
      std::int64_t& o = offset[static_cast<std::size_t>(j)];
      if (o > 0 && o + n > kBlockSamples) {  // start a new block at j
        block_begin.push_back(j);
        o = 0;
      }
      offset[static_cast<std::size_t>(j) + 1] = o + n;
      largest = std::max(largest, o + n);
    }
    block_begin.push_back(ngrouped);
    table = make_samples<A>(largest);
  }
  const RoiBox<A>& box(std::int64_t k) const { return boxes[static_cast<std::size_t>(k)]; }
  bool is_grouped(std::int64_t k) const { return grouped[static_cast<std::size_t>(k)] != 0; }
  std::int64_t roi(std::int64_t j) const { return order[static_cast<std::size_t>(j)]; }
  std::int64_t blocks() const { return static_cast<std::int64_t>(block_begin.size()) - 1; }
  const Sample<A>* samples(std::int64_t j) const { return table.get() + offset[static_cast<std::size_t>(j)]; }
  /// Builds the tables of block b (in parallel over its rois).
  void fill_block(std::int64_t b, const detail::RoiAlignShape& s, const detail::Strides4& st, int threads) {
    const std::int64_t jb = block_begin[static_cast<std::size_t>(b)], je = block_begin[static_cast<std::size_t>(b) + 1];
    parallel_for(je - jb, 16, threads, [&](std::int64_t lb, std::int64_t le) {
      for (std::int64_t j = jb + lb; j < jb + le; ++j)
        fill_roi_samples(box(roi(j)), s, st.s2, st.s3, table.get() + offset[static_cast<std::size_t>(j)]);
    });
  }
};

/// NCHW (or any strides without contiguous channels). Two kinds of rois (walk_cost):
///  - sparse ones, ordered by image, in blocks whose sample tables are built once; threads take
///    (plane group, roi range) items, plane groups outermost, so a group's planes stay in the
///    core's cache while every roi of the block on that image reads them (rois overlap: walking
///    rois outermost re-reads each roi's footprint of every plane from memory);
///  - dense ones one by one: the table is built and used at once (it stays in cache) for all
///    channels, 16 planes at a time; threads take ranges of equal sample counts.
template <class T>
void forward_planes(const RoiAlignCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const ForwardViews<T> v(call);
  const detail::RoiAlignShape& s = v.s;
  const detail::Strides4 &in = v.in, &os = v.os, &as = v.as;
  const int threads = ctx.resolved_threads();
  const int G = planes_per_group(s, sizeof(T));
  RoiPlan<A> plan(v.rois, s, threads);
  const bool disjoint_planes = in.s1 >= s.H * s.W;  // not e.g. a channels-last input pooled to NCHW
  plan.arrange(s, [&](const RoiBox<A>& b) {
    const WalkCost w = walk_cost(b, s, sizeof(T), G);
    return disjoint_planes && w.group < w.roi;
  });
  // dense rois: part p takes [dense_begin[p], dense_begin[p + 1]) of the order (about equal
  // samples each) with its own table, sized to the largest roi of its range
  const auto nvalid = static_cast<std::int64_t>(plan.order.size());
  const auto dense_parts = static_cast<int>(std::min<std::int64_t>(threads, nvalid - plan.ngrouped));
  std::vector<std::int64_t> dense_begin(static_cast<std::size_t>(dense_parts) + 1, nvalid);
  std::vector<std::unique_ptr<Sample<A>[]>> scratch(static_cast<std::size_t>(dense_parts));
  if (dense_parts > 0) {
    double total = 0.0, seen = 0.0;
    for (std::int64_t j = plan.ngrouped; j < nvalid; ++j) total += static_cast<double>(table_size(plan.box(plan.roi(j)), s));
    int p = 0;
    for (std::int64_t j = plan.ngrouped; j < nvalid; ++j) {
      while (p < dense_parts && seen * dense_parts >= total * p) dense_begin[static_cast<std::size_t>(p++)] = j;
      seen += static_cast<double>(table_size(plan.box(plan.roi(j)), s));
    }
    dense_begin[0] = plan.ngrouped;
    for (int q = 0; q < dense_parts; ++q) {
      std::int64_t largest = 0;
      for (std::int64_t j = dense_begin[static_cast<std::size_t>(q)]; j < dense_begin[static_cast<std::size_t>(q) + 1]; ++j)
        largest = std::max(largest, table_size(plan.box(plan.roi(j)), s));
      scratch[static_cast<std::size_t>(q)] = make_samples<A>(largest);
    }
  }

  parallel_for(s.K, 64, threads, [&](std::int64_t kb, std::int64_t ke) {
    for (std::int64_t k = kb; k < ke; ++k)
      if (plan.box(k).batch < 0) pool_invalid_roi(s, os, as, v.pooled(k));
  });

  const std::int64_t groups = s.C / G, units = groups + s.C % G;  // tail channels one by one
  const std::int64_t parts = std::max<std::int64_t>(1, (4 * static_cast<std::int64_t>(threads) + units - 1) / std::max<std::int64_t>(units, 1));
  for (std::int64_t b = 0; b < plan.blocks() && units > 0; ++b) {
    const std::int64_t jb = plan.block_begin[static_cast<std::size_t>(b)];
    const std::int64_t je = plan.block_begin[static_cast<std::size_t>(b) + 1];
    plan.fill_block(b, s, in, threads);
    parallel_for(units * parts, 1, threads, [&](std::int64_t ib, std::int64_t ie) {
      for (std::int64_t item = ib; item < ie; ++item) {
        const std::int64_t u = item / parts, part = item % parts;
        const std::int64_t c = u < groups ? u * G : groups * G + (u - groups);
        const std::int64_t rb = jb + (je - jb) * part / parts, re = jb + (je - jb) * (part + 1) / parts;
        for (std::int64_t j = rb; j < re; ++j) {
          const std::int64_t k = plan.roi(j);
          const RoiBox<A>& box = plan.box(k);
          pool_roi_channels(v.input + box.batch * in.s0, in, plan.samples(j), box.grid_h * box.grid_w, box.count, s, os,
                            as, v.pooled(k), c, u < groups ? G : 1, G);
        }
      }
    });
  }
  if (dense_parts > 0)
    parallel_for(dense_parts, 1, dense_parts, [&](std::int64_t pb, std::int64_t pe) {
      for (std::int64_t p = pb; p < pe; ++p) {
        Sample<A>* q = scratch[static_cast<std::size_t>(p)].get();
        for (std::int64_t j = dense_begin[static_cast<std::size_t>(p)]; j < dense_begin[static_cast<std::size_t>(p) + 1]; ++j) {
          const std::int64_t k = plan.roi(j);
          const RoiBox<A>& box = plan.box(k);
          fill_roi_samples(box, s, in.s2, in.s3, q);
          pool_roi_channels(v.input + box.batch * in.s0, in, q, box.grid_h * box.grid_w, box.count, s, os, as,
                            v.pooled(k), 0, s.C, 16);
        }
      }
    });
}


// ---------------------------------------------------------------------------------------------
// Backward helpers

/// Scatter backward (atomic and truncated modes): threads own disjoint channel ranges, so plain
/// adds are race-free; V is the contribution type, Target the accumulator array's element type.
/// Two walks, picked over all rois by walk_cost: plane groups outermost (tables built in blocks;
/// the group's planes of the accumulator stay in the core's cache while every roi of the image
/// adds to them; threads own groups), or rois outermost with each thread's channel range (a roi's
/// table built once per thread and kept in cache). Both keep every plane's order of adds.
/// prepare() (zeroing the accumulator) runs once everything is allocated: an allocation failure
/// leaves grad_input as it was.
template <class T, class V, class Target, class Prepare>
void scatter_backward(const RoiAlignCall& call, const Context& ctx, Target* target, const detail::Strides4& ts,
                      detail::GradRounding rounding, Prepare&& prepare) {
  using A = acc_t<T>;
  const detail::RoiAlignShape& s = call.shape;
  const auto go = strides4(call.pooled);
  const auto am = call.max_pool ? strides4(call.argmax) : detail::Strides4{0, 0, 0, 0};
  const T* grad_output = static_cast<const T*>(call.pooled.data);
  const auto* argmax = static_cast<const std::int32_t*>(call.argmax.data);
  const int threads = ctx.resolved_threads();
  // groups small enough that every thread owns some
  const int G = planes_per_group(s, sizeof(Target), std::max<std::int64_t>(1, s.C / (2 * static_cast<std::int64_t>(threads))));
  auto scatter_channels = [&](std::int64_t k, const RoiBox<A>& box, const Sample<A>* q, std::int64_t c, std::int64_t n,
                              int width) {
    scatter_roi_channels<V>(target + box.batch * ts.s0, ts, q, box.grid_h * box.grid_w, s, grad_output + k * go.s0, go,
                            call.max_pool ? argmax + k * am.s0 : nullptr, am, rounding, c, n, width);
  };

  RoiPlan<A> plan(roi_source(call.rois), s, threads);
  WalkCost total{0.0, 0.0};
  for (const RoiBox<A>& b : plan.boxes) {
    if (b.batch < 0) continue;
    const WalkCost w = walk_cost(b, s, sizeof(Target), G);
    total.group += w.group;
    total.roi += w.roi;
  }
  // planes must be disjoint blocks (NCHW-like): in a channels-last accumulator a group's planes
  // interleave with all the others, so a group would touch every line of the image
  if (ts.s1 >= s.H * s.W && total.group < total.roi) {
    plan.arrange(s, [](const RoiBox<A>&) { return true; });
    prepare();
    const std::int64_t groups = s.C / G, units = groups + s.C % G;  // tail channels one by one
    for (std::int64_t b = 0; b < plan.blocks(); ++b) {
      const std::int64_t jb = plan.block_begin[static_cast<std::size_t>(b)];
      const std::int64_t je = plan.block_begin[static_cast<std::size_t>(b) + 1];
      plan.fill_block(b, s, ts, threads);
      parallel_for(units, 1, threads, [&](std::int64_t ub, std::int64_t ue) {
        for (std::int64_t u = ub; u < ue; ++u) {
          const std::int64_t c = u < groups ? u * G : groups * G + (u - groups);
          for (std::int64_t j = jb; j < je; ++j)
            scatter_channels(plan.roi(j), plan.box(plan.roi(j)), plan.samples(j), c, u < groups ? G : 1, G);
        }
      });
    }
    return;
  }
  // rois outermost: part p owns channels [C p / parts, C (p + 1) / parts) and builds every roi's
  // table in its own buffer (sized to the largest roi)
  const auto parts = static_cast<int>(std::min<std::int64_t>(threads, s.C));
  std::int64_t largest = 0;
  for (const RoiBox<A>& b : plan.boxes) largest = std::max(largest, table_size(b, s));
  std::vector<std::unique_ptr<Sample<A>[]>> tables(static_cast<std::size_t>(parts));
  for (auto& t : tables) t = make_samples<A>(largest);
  prepare();
  parallel_for(parts, 1, parts, [&](std::int64_t pb, std::int64_t pe) {
    for (std::int64_t p = pb; p < pe; ++p) {
      const std::int64_t cb = s.C * p / parts, ce = s.C * (p + 1) / parts;
      Sample<A>* q = tables[static_cast<std::size_t>(p)].get();
      for (std::int64_t k = 0; k < s.K; ++k) {
        const RoiBox<A>& box = plan.box(k);
        if (box.batch < 0) continue;
        fill_roi_samples(box, s, ts.s2, ts.s3, q);
        scatter_channels(k, box, q, cb, ce - cb, 16);
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
  detail::GatherIndex* sorted_ids = nullptr;
  detail::GatherIndex* buckets = nullptr;
  detail::GatherKey* run_keys = nullptr;
  detail::GatherIndex* run_offsets = nullptr;
  detail::GatherIndex* run_lengths = nullptr;
};

/// One chunk: the whole batch (RoIAlign's exact bits predate the engine's chunks), checked
/// against the engine's limits.
template <class A>
WorkspaceLayout exact_layout(const detail::RoiAlignShape& s, std::int64_t cap, bool max_pool, const char* op) {
  WorkspaceLayout l;
  const std::int64_t positions = s.N * s.H * s.W;
  gather_check_chunk(op, cap, positions);
  add_records<A>(l, cap, true, max_pool);   // slots
  add_records<A>(l, cap, false, max_pool);  // sorted copies (keys are read through sorted_ids)
  const std::int64_t runs = gather_run_capacity(cap, positions);
  l.add<std::int64_t>(s.K + 1);
  l.add<detail::GatherIndex>(cap);
  l.add<detail::GatherIndex>(gather_counting_sort(positions, cap) ? positions + 2 : 0);
  l.add<detail::GatherKey>(runs);
  l.add<detail::GatherIndex>(runs);
  l.add<detail::GatherIndex>(runs);
  return l;
}

template <class A>
ExactBuffers<A> carve_exact(WorkspaceLayout& l, void* base, bool max_pool) {
  l.bind(base);
  ExactBuffers<A> b;
  b.slots = take_records<A>(l, true, max_pool);
  b.sorted = take_records<A>(l, false, max_pool);
  b.roi_offsets = l.take<std::int64_t>();
  b.sorted_ids = l.take<detail::GatherIndex>();
  b.buckets = l.take<detail::GatherIndex>();
  b.run_keys = l.take<detail::GatherKey>();
  b.run_offsets = l.take<detail::GatherIndex>();
  b.run_lengths = l.take<detail::GatherIndex>();
  return b;
}

template <class T>
void exact_backward(const RoiAlignCall& call, const RoiCheck& check, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const detail::RoiAlignShape& s = call.shape;
  const int threads = ctx.resolved_threads();
  const std::int64_t cap = exact_slot_capacity(s, check);
  WorkspaceLayout layout = exact_layout<A>(s, cap, call.max_pool, call.op);
  ExactBuffers<A> b = carve_exact<A>(layout, ws.data, call.max_pool);
  const detail::RoiSource rois = roi_source(call.rois);
  const auto sentinel = static_cast<detail::GatherKey>(s.N * s.H * s.W);

  // Phase 1: per-roi slot offsets, then every (roi, bin) enumerates its slots.
  b.roi_offsets[0] = 0;
  for (std::int64_t k = 0; k < s.K; ++k)
    b.roi_offsets[k + 1] = b.roi_offsets[k] + detail::roi_sample_count<A>(rois, k, s);
  parallel_for(cap, 1 << 16, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t j = lo; j < hi; ++j) b.slots.keys[j] = sentinel;
  });
  detail::EnumerateArgs<A> ea{rois, b.roi_offsets, s, call.max_pool, strides4(call.pooled),
                              call.max_pool ? strides4(call.argmax) : detail::Strides4{0, 0, 0, 0}, b.slots};
  parallel_for(s.K * s.PH * s.PW, 64, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t t = lo; t < hi; ++t) detail::roi_align_exact_enumerate_bin(t, ea);
  });

  // Phase 2: the engine's stable sort of slot ids by position, and the runs; then every slot
  // field in sorted order.
  const std::int64_t runs = gather_sort_keys_cpu(b.slots.keys, cap, sentinel, b.sorted_ids, b.buckets, b.run_keys,
                                                 b.run_offsets, b.run_lengths);
  parallel_for(cap, 1 << 14, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) detail::roi_align_exact_permute(r, b.sorted_ids, b.slots, b.sorted);
  });

  // Phase 3: zero grad_input, then each (run, channel) is written once with its fixed-order sum.
  zero_fill<T>(call.features, ctx);
  const detail::GatherArgs<T> ga = make_gather_args<T>(call, b.sorted, b.run_keys, b.run_offsets, b.run_lengths);
  const bool vector_channels = ga.gi.s1 == 1 && ga.go_c == 1 && s.C > 1;
  if (vector_channels)  // RoIAlign's own vectorized loop (per instruction set), the same sums
    cpu_kernels(ctx).exact_runs_channels_last(call.features.dtype, &ga, s.C, runs, threads);
  else
    gather_sum_cpu(detail::roi_gather_sum_args(ga), runs, detail::roi_gather_target(ga), threads, ga.active);
}

// ---------------------------------------------------------------------------------------------
// Entry points (the table kRoiAlignCpu at the bottom)

RoiCheck check_rois(const RoiAlignCall& call, bool /*need_total: cheap here, always computed*/, const Context&) {
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

void forward(const RoiAlignCall& call, const Context& ctx) {
  if (channels_innermost(call.features) && channels_innermost(call.pooled))
    cpu_kernels(ctx).forward_channels_last(call, ctx);
  else
    dispatch_floating(call.features.dtype, [&](auto tag) { forward_planes<decltype(tag)>(call, ctx); });
}

std::size_t backward_workspace(const RoiAlignCall& call, const RoiBackwardPlan& plan) {
  const detail::RoiAlignShape& s = call.shape;
  switch (plan.mode) {
    case BackwardMode::kAtomic: return 0;
    case BackwardMode::kTruncated: return truncated_buffer_bytes(s);
    case BackwardMode::kExact:
      return dispatch_floating(call.features.dtype, [&](auto tag) {
        return exact_layout<acc_t<decltype(tag)>>(s, exact_slot_capacity(s, plan.check), call.max_pool, call.op)
            .bytes();
      });
  }
  return 0;
}

void backward(const RoiAlignCall& call, const RoiBackwardPlan& plan, const Context& ctx, Workspace ws) {
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::RoiAlignShape& s = call.shape;
    switch (plan.mode) {
      case BackwardMode::kAtomic:
        if (s.K == 0) zero_fill<T>(call.features, ctx);
        else
          scatter_backward<T, acc_t<T>, T>(call, ctx, static_cast<T*>(call.features.data), strides4(call.features),
                                           detail::GradRounding::kNone,
                                           [&] { zero_fill<T>(call.features, ctx); });
        break;
      case BackwardMode::kTruncated: {
        // Accumulate in a contiguous double buffer laid out like grad_input, then round each sum
        // once (truncated_buffer_strides: the layout does not change the bits).
        auto* buf = static_cast<double*>(ws.data);
        const detail::Strides4 bs = truncated_buffer_strides(call.features, s);
        if (s.K > 0)
          scatter_backward<T, double, double>(call, ctx, buf, bs, plan.rounding,
                                              [&] { std::fill(buf, buf + s.N * s.C * s.H * s.W, 0.0); });
        if (s.K == 0) zero_fill<T>(call.features, ctx);
        else store_rounded<T>(buf, bs, call.features, ctx);
        break;
      }
      case BackwardMode::kExact:
        if (s.K == 0) zero_fill<T>(call.features, ctx);
        else exact_backward<T>(call, plan.check, ctx, ws);
        break;
    }
  });
}

bool enumerates(const RoiAlignCall&, BackwardMode mode) { return mode == BackwardMode::kExact; }

}  // namespace

extern const RoiAlignBackend kRoiAlignCpu = {&check_rois, &forward, &enumerates, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
