// CPU backend of grid_sample. Every value comes from the shared bodies of
// include/detops/detail/grid_sample_kernels.h; this file only chooses the loops:
//  - forward: a point's corners are computed once and read for many channels (NHWC: threads take
//    points; NCHW: the image's points, computed once and sorted by row, for each channel of a
//    group in turn);
//  - atomic backward: a plain scatter, threads own groups of planes (points in grid order, each
//    computed once per image and group, as the forward's), so every grad_input element
//    receives its contributions in grid order, rounded per add as CUDA's atomics round them
//    (deterministic here, unlike on the GPU);
//  - exact backward: float32 bilinear on NCHW planes, or few channels, the atomic mode's walk
//    with the engine's partials where a destination needs them (PlaneScatter: no records, no
//    sort); otherwise the gather engine (src/internal/gather_backward_cpu.h) per chunk of images;
//    both give the engine's bits (exact_path);
//  - grad_grid: threads take grid points, each sums over the channels in order (NCHW: channels
//    outermost over a piece of points, each point with its own sums, float32 bilinear in vector
//    lanes; each channel's step is detail::grid_grad_grid_add, as grid_sample_grad_grid_point's).
// No result depends on the thread count or the layout.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu/grid_sample_cpu.h"  // also the interface of grid_sample_cpu_kernels.inc
#include "internal/common.h"
#include "internal/gather_backward_cpu.h"
#include "internal/grid_sample_backend.h"

namespace detops {
namespace internal {

#define DETOPS_CPU_KERNELS_FILE "grid_sample_cpu_kernels.inc"
#include "cpu/cpu_variants.inc"

namespace {

using detail::GridPoint;
using detail::GridSampleShape;
using detail::GridSampleStrides;

/// Grid points a thread takes at a time (each is C channels of work).
std::int64_t point_grain(std::int64_t C) { return std::max<std::int64_t>(1, 2048 / std::max<std::int64_t>(C, 1)); }

/// The NCHW walks take (image, group of up to kGroup channels) items: an item computes the corners
/// of all the image's grid points once, then walks them for one channel plane after the other, so
/// each plane is read (or, in the backward, written) in one pass while it stays in cache (pieces
/// of points would bring every plane back once per piece). With one channel per item there is
/// nothing to share: the walk computes each point where it uses it.
constexpr std::int64_t kGroup = 16;

// Inlines every call of the function it marks. The shared point helpers (grid_sample_point,
// grid_point) are too big for GCC to inline on its own; called out of line, they build the point
// on the stack and copy it to the caller, whose wide loads of the narrower stores stall: that copy
// took about a third of the points workload's time. Inlining changes no operation, so no bit.
#if defined(__GNUC__) || defined(__clang__)
#define DETOPS_GRID_FLATTEN __attribute__((flatten))
#else
#define DETOPS_GRID_FLATTEN
#endif

/// Calls visit(ho, wo, point) for the grid points of image n, in order (wo fastest).
template <class T, class Visit>
DETOPS_GRID_FLATTEN void for_each_point(const detail::GridSampleArgs<T>& a, std::int64_t n, Visit&& visit) {
  for (std::int64_t ho = 0; ho < a.shape.Ho; ++ho)
    for (std::int64_t wo = 0; wo < a.shape.Wo; ++wo) visit(ho, wo, detail::grid_sample_point(a, n, ho, wo));
}

/// Points walked ahead of the one read: how far prefetch_corners looks.
constexpr std::int64_t kAhead = 8;

/// Asks the cache for the rows of point p's corners in `plane` (changes no value). The NCHW walks
/// read (or write) a plane at the points' random corners; the first pass over a plane would
/// otherwise wait on memory at every point.
template <class T, class A>
inline void prefetch_corners(const GridPoint<A>& p, const T* plane, const GridSampleStrides& st) {
#if defined(__GNUC__) || defined(__clang__)
  for (int k = 0; k < p.count; k += 2) {  // nw (or nearest's pixel) and sw: each the first valid of its row
    const int first = p.valid[k] ? k : k + 1;
    if (first < p.count && p.valid[first]) __builtin_prefetch(plane + p.iy[first] * st.s2 + p.ix[first] * st.s3);
  }
#else
  (void)p, (void)plane, (void)st;
#endif
}

/// A grid point of an NCHW walk with its place in the grid.
template <class A>
struct PlacedPoint {
  GridPoint<A> p;
  std::int64_t ho, wo;
};

/// A walk's buffers (one per thread, reused across its items).
template <class A>
struct WalkBuffers {
  std::vector<PlacedPoint<A>> points, scratch;
  std::vector<std::int64_t> rows;  // counting sort's buckets
};

/// Orders points by the row of their first corner (stable; points sampling nothing first), so a
/// walk reads a plane row after row instead of at random.
template <class A>
void sort_by_row(WalkBuffers<A>& b, std::int64_t H) {
  auto bucket = [H](const GridPoint<A>& p) {
    return p.count == 0 ? std::int64_t{0} : std::min(std::max(p.iy[0], std::int64_t{-1}), H) + 2;
  };
  b.rows.assign(static_cast<std::size_t>(H + 4), 0);
  for (const PlacedPoint<A>& q : b.points) ++b.rows[static_cast<std::size_t>(bucket(q.p) + 1)];
  for (std::size_t r = 1; r < b.rows.size(); ++r) b.rows[r] += b.rows[r - 1];
  b.scratch.resize(b.points.size());
  for (const PlacedPoint<A>& q : b.points) {
    std::int64_t& slot = b.rows[static_cast<std::size_t>(bucket(q.p))];
    b.scratch[static_cast<std::size_t>(slot++)] = q;
  }
  b.points.swap(b.scratch);
}

/// Calls visit(c, ho, wo, point) for the channels [c0, c1) of image n, channel by channel; within
/// a channel the grid points in order, or, with `any_order` (for visits that do not depend on one
/// another), sorted by row. `image` (strides st) is the tensor whose planes visit reads or writes
/// at the corners: prefetched.
/// `on_points(points)`, when given, sees the buffered points before the channels (several
/// channels only).
struct NoPoints {
  template <class P>
  void operator()(const std::vector<P>&) const {}
};
template <class T, class A, class U, class Visit, class OnPoints = NoPoints>
void for_each_channel_point(const detail::GridSampleArgs<T>& a, std::int64_t n, std::int64_t c0, std::int64_t c1,
                            WalkBuffers<A>& b, bool any_order, const U* image, const GridSampleStrides& st,
                            Visit&& visit, OnPoints&& on_points = OnPoints{}) {
  if (c1 - c0 == 1) {
    for_each_point(a, n, [&](std::int64_t ho, std::int64_t wo, const GridPoint<A>& p) { visit(c0, ho, wo, p); });
    return;
  }
  const std::int64_t count = a.shape.Ho * a.shape.Wo;
  b.points.resize(static_cast<std::size_t>(count));
  PlacedPoint<A>* next = b.points.data();
  for_each_point(a, n, [&](std::int64_t ho, std::int64_t wo, const GridPoint<A>& p) { *next++ = {p, ho, wo}; });
  if (any_order) sort_by_row(b, a.shape.H);
  on_points(b.points);
  for (std::int64_t c = c0; c < c1; ++c) {
    const U* plane = image + c * st.s1;
    const PlacedPoint<A>* q = b.points.data();
    for (std::int64_t i = 0; i < count; ++i) {
      if (i + kAhead < count) prefetch_corners(q[i + kAhead].p, plane, st);
      visit(c, q[i].ho, q[i].wo, q[i].p);
    }
  }
}

/// Forward. Channels innermost in the input (NHWC): threads take grid points and read a point's
/// corners across the contiguous channels. Otherwise (NCHW): threads take (image, group of
/// channels) items. Either way every output element is the same arithmetic.
template <class T>
void forward_typed(const GridSampleCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const detail::GridSampleArgs<T> a = grid_sample_args<T>(call);
  const GridSampleShape& s = call.shape;
  const GridSampleStrides out = gs_strides(call.output);
  T* output = static_cast<T*>(call.output.data);
  const int threads = ctx.resolved_threads();
  if (channels_innermost(call.input)) {
    parallel_for(s.N * s.Ho * s.Wo, point_grain(s.C), threads, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t) {
        const std::int64_t wo = t % s.Wo, ho = (t / s.Wo) % s.Ho, n = t / (s.Wo * s.Ho);
        const GridPoint<A> p = detail::grid_sample_point(a, n, ho, wo);
        T* o = output + n * out.s0 + ho * out.s2 + wo * out.s3;
        const T* image = a.input + n * a.in.s0;
        for (std::int64_t c = 0; c < s.C; ++c)
          o[c * out.s1] = from_acc<T>(detail::grid_sample_interpolate(p, image + c * a.in.s1, a.in));
      }
    });
    return;
  }
  const std::int64_t groups = (s.C + kGroup - 1) / kGroup;
  if constexpr (std::is_same_v<T, float>) {
    if (lanes_apply(call)) {  // float32 bilinear: the points in vector lanes (grid_sample_cpu_kernels.inc)
      const auto forward_lanes = cpu_kernels(ctx).forward_lanes;
      parallel_for(s.N * groups, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
        GridLanes lanes;
        for (std::int64_t item = lo; item < hi; ++item) {
          const std::int64_t g = item % groups, n = item / groups;
          forward_lanes(a, n, g * kGroup, std::min(s.C, (g + 1) * kGroup), output, out, lanes);
        }
      });
      return;
    }
  }
  parallel_for(s.N * groups, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
    WalkBuffers<A> buffers;
    for (std::int64_t item = lo; item < hi; ++item) {
      const std::int64_t g = item % groups, n = item / groups;
      for_each_channel_point(a, n, g * kGroup, std::min(s.C, (g + 1) * kGroup), buffers, true,
                             a.input + n * a.in.s0, a.in,
                             [&](std::int64_t c, std::int64_t ho, std::int64_t wo, const GridPoint<A>& p) {
                               output[n * out.s0 + c * out.s1 + ho * out.s2 + wo * out.s3] = from_acc<T>(
                                   detail::grid_sample_interpolate(p, a.input + n * a.in.s0 + c * a.in.s1, a.in));
                             });
    }
  });
}

/// Every element of a strided [N, C, H, W] tensor set to 0 (gaps keep their bytes).
template <class T>
void zero_fill(const TensorView& v, const Context& ctx) {
  const GridSampleStrides st = gs_strides(v);
  const std::int64_t C = v.sizes[1], H = v.sizes[2], W = v.sizes[3];
  T* p = static_cast<T*>(v.data);
  parallel_for(v.sizes[0] * C, std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(H * W, 1)),
               ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t nc = lo; nc < hi; ++nc) {
                   T* plane = p + (nc / C) * st.s0 + (nc % C) * st.s1;
                   for (std::int64_t y = 0; y < H; ++y)
                     for (std::int64_t x = 0; x < W; ++x) plane[y * st.s2 + x * st.s3] = from_acc<T>(acc_t<T>(0));
                 }
               });
}

/// The backward's walks over lanes (backward_lanes_apply): image n's grid points block by block
/// in grid order; for each block, channels [c0, c1) in turn (each plane still sees its points in
/// grid order), visit(c, ho, wo, o, w) with corner k's destination index (-1 off the map) at
/// o[k * kLaneBlock] and its weight at w[k * kLaneBlock]: the values grid_sample_point gives.
template <class Visit>
void for_each_lane_point(const GridSampleCpuKernels& kernels, const detail::GridSampleArgs<float>& a, std::int64_t n,
                         std::int64_t c0, std::int64_t c1, GridLanes& lanes, Visit&& visit) {
  const GridSampleShape& s = a.shape;
  const std::int64_t count = s.Ho * s.Wo;
  for (std::int64_t t0 = 0; t0 < count; t0 += kLaneBlock) {
    const std::int64_t m = std::min(kLaneBlock, count - t0);
    kernels.fill_block(a, n, t0, m, s.W, 1, lanes);
    const std::int32_t* o = lanes.offset.data();
    const float* w = lanes.weight.data();
    for (std::int64_t c = c0; c < c1; ++c) {
      std::int64_t ho = t0 / s.Wo, wo = t0 % s.Wo;
      for (std::int64_t i = 0; i < m; ++i) {
        visit(c, ho, wo, o + i, w + i);
        if (++wo == s.Wo) wo = 0, ++ho;
      }
    }
  }
}

/// The atomic mode's walk of an item over lanes: image n's planes [c0, c1) of grad_input `gi`
/// (dense), each record added where it lands, every plane seeing its points in grid order; with
/// `count` (H * W zeros), each point with a corner on the map is counted once, at its last such
/// corner (see records_bounded).
void add_item_lanes(const GridSampleCpuKernels& kernels, const detail::GridSampleBackwardArgs<float>& a,
                    std::int64_t n, std::int64_t c0, std::int64_t c1, float* gi, GridLanes& lanes,
                    std::int32_t* count) {
  for_each_lane_point(kernels, a.g, n, c0, c1, lanes,
                      [&](std::int64_t c, std::int64_t ho, std::int64_t wo, const std::int32_t* o, const float* w) {
                        float* plane = gi + n * a.gi.s0 + c * a.gi.s1;
                        const float gv = a.grad_output[n * a.go.s0 + c * a.go.s1 + ho * a.go.s2 + wo * a.go.s3];
                        for (int k = 0; k < 4; ++k) {
                          const std::int32_t d = o[k * kLaneBlock];
                          if (d >= 0) plane[d] = plane[d] + gv * w[k * kLaneBlock];
                        }
                        if (count != nullptr && c == c0) {
                          const std::int32_t last = std::max(std::max(o[0], o[kLaneBlock]),
                                                             std::max(o[2 * kLaneBlock], o[3 * kLaneBlock]));
                          if (last >= 0) ++count[last];
                        }
                      });
}

/// Whether no destination of a plane can receive more than kGatherPartial records, from `count`
/// (add_item_lanes'). A point is counted at m, its on-map corner of largest offset (rows of W: the
/// corner furthest down, then right). For a destination d that receives a record from it: d as
/// nw gives m = d, d + 1, d + W or d + W + 1; as ne, d or d + W (se, when the row below is on the
/// map); as sw, d or d + 1; as se, d. So d has at most four counts' worth of records.
bool records_bounded(const std::vector<std::int32_t>& count) {
  return 4 * static_cast<std::int64_t>(*std::max_element(count.begin(), count.end())) <= detail::kGatherPartial;
}

/// Atomic mode: threads own (image, group of channels) items, so each grad_input plane has one
/// writer; an item walks the grid points in order for each of its planes (the order of CUDA's
/// thread indices within a plane, so the two backends add the same values; only CUDA's
/// scheduling reorders them).
template <class T>
void scatter_backward(const GridSampleCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const GridSampleShape& s = call.shape;
  T* gi = static_cast<T*>(call.grad_input.data);
  const std::int64_t groups = (s.C + kGroup - 1) / kGroup;
  if constexpr (std::is_same_v<T, float>) {
    if (backward_lanes_apply(call)) {  // the points from lanes; each plane still in grid order
      const GridSampleCpuKernels& kernels = cpu_kernels(ctx);
      parallel_for(s.N * groups, 1, ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
        GridLanes lanes;
        for (std::int64_t item = lo; item < hi; ++item) {
          const std::int64_t g = item % groups, n = item / groups;
          add_item_lanes(kernels, a, n, g * kGroup, std::min(s.C, (g + 1) * kGroup), gi, lanes, nullptr);
        }
      });
      return;
    }
  }
  parallel_for(s.N * groups, 1, ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
    WalkBuffers<A> buffers;
    for (std::int64_t item = lo; item < hi; ++item) {
      const std::int64_t g = item % groups, n = item / groups;
      for_each_channel_point(
          a.g, n, g * kGroup, std::min(s.C, (g + 1) * kGroup), buffers, false, gi + n * a.gi.s0, a.gi,
          [&](std::int64_t c, std::int64_t ho, std::int64_t wo, const GridPoint<A>& p) {
            T* plane = gi + n * a.gi.s0 + c * a.gi.s1;
            const A gv = to_acc(a.grad_output[n * a.go.s0 + c * a.go.s1 + ho * a.go.s2 + wo * a.go.s3]);
            for (int k = 0; k < p.count; ++k) {
              if (!p.valid[k]) continue;
              T& dst = plane[p.iy[k] * a.gi.s2 + p.ix[k] * a.gi.s3];
              dst = from_acc<T>(to_acc(dst) + gv * p.weight[k]);
            }
          });
    }
  });
}

/// The exact mode's chunk: images per chunk, its records and its positions (the sentinel).
struct ExactChunk {
  std::int64_t images, records, positions;
};
ExactChunk exact_chunk(const GridSampleShape& s) {
  const std::int64_t images = grid_sample_chunk_images(s);
  return {images, images * grid_sample_image_records(s), images * s.H * s.W};
}

template <class A>
WorkspaceLayout exact_layout(const GridSampleShape& s, const char* op) {
  const ExactChunk ch = exact_chunk(s);
  WorkspaceLayout l;
  add_gather_cpu<A>(l, ch.records, ch.positions, op);
  return l;
}

/// Exact mode: per chunk of images, phase 1 (the enumerate body per grid point), the engine's
/// sort and its fixed-order sums into grad_input (zeroed first: pixels no point reaches).
template <class T>
void exact_backward(const GridSampleCall& call, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const GridSampleShape& s = call.shape;
  const int threads = ctx.resolved_threads();
  const ExactChunk ch = exact_chunk(s);
  WorkspaceLayout layout = exact_layout<A>(s, call.op);
  layout.bind(ws.data);
  const GatherCpuBuffers<A> b = take_gather_cpu<A>(layout);
  const std::int64_t per_image_points = s.Ho * s.Wo;
  const auto sentinel = static_cast<detail::GatherKey>(ch.positions);
  for (std::int64_t n0 = 0; n0 < s.N; n0 += ch.images) {
    const std::int64_t images = std::min(ch.images, s.N - n0);
    const std::int64_t points = images * per_image_points;
    parallel_for(points, 1024, threads, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t t = lo; t < hi; ++t) detail::grid_sample_enumerate_element(t, a, n0, sentinel, b.records);
    });
    detail::GatherSorted<A> sorted{};
    const std::int64_t n = points * detail::grid_sample_records_per_point(s);
    const std::int64_t runs = gather_sort_cpu(b, n, sentinel, threads, sorted);
    detail::GatherSumArgs<T, A> sa{sorted,
                                   a.grad_output,
                                   a.go.s1,
                                   static_cast<T*>(call.grad_input.data),
                                   a.gi.s1,
                                   s.C,
                                   sentinel,
                                   detail::kGatherPartial};
    gather_sum_cpu(sa, runs, detail::GridSampleTarget{n0, s.H, s.W, a.gi}, threads);
  }
}

/// A thread's state in the scatter path, all allocated before grad_input is written.
template <class A>
struct ScatterThread {
  WalkBuffers<A> buffers;
  PlaneScatter<A> scatter;
  std::vector<A> sums;                // 16-bit types: the plane's sums
  std::vector<std::int32_t> counts;   // records per destination of an item's image
  GridLanes lanes;                    // float32 bilinear: the points' lanes (backward_lanes_apply)
};

/// Bytes of one thread's ScatterThread (the walk's points aside): per pixel a stamped count and a
/// total, a plain count (the image's records), and a 16-bit type's float plane.
template <class T>
std::size_t scatter_thread_bytes(const GridSampleShape& s) {
  using A = acc_t<T>;
  const std::size_t per_pixel =
      sizeof(std::uint64_t) + sizeof(A) + sizeof(std::int32_t) + (std::is_same_v<T, A> ? 0 : sizeof(A));
  return static_cast<std::size_t>(s.H * s.W) * per_pixel;
}

/// Exact mode without the engine: threads own (image, group of channels) items, as in the atomic
/// mode, and each plane's grid points are walked in grid order, corner by corner. That is the
/// engine's canonical order for every destination (grid_sample_enumerate_element numbers records
/// point by point, corner by corner, and the engine sorts them stably by destination), so with
/// the engine's partials (PlaneScatter) every grad_input element gets the engine's bits. 16-bit
/// types add in float in a plane of their own, rounded once into grad_input at the plane's end.
template <class T>
void exact_scatter_backward(const GridSampleCall& call, const Context& ctx) {
  using A = acc_t<T>;
  constexpr bool kSameType = std::is_same_v<T, A>;
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const GridSampleShape& s = call.shape;
  T* gi = static_cast<T*>(call.grad_input.data);
  const std::int64_t groups = (s.C + kGroup - 1) / kGroup, positions = s.H * s.W;
  bool use_lanes = false;
  if constexpr (std::is_same_v<T, float>) use_lanes = backward_lanes_apply(call);
  const auto make = [&] {
    ScatterThread<A> t{WalkBuffers<A>{}, PlaneScatter<A>(positions, detail::kGatherPartial), {}, {}, {}};
    if (s.C > 1 && !use_lanes) t.buffers.points.reserve(static_cast<std::size_t>(s.Ho * s.Wo));
    if (s.C > 1 || use_lanes) t.counts.resize(static_cast<std::size_t>(positions));
    if (!kSameType) t.sums.resize(static_cast<std::size_t>(positions));
    if (use_lanes) t.lanes.size_for_block();
    return t;
  };
  if constexpr (std::is_same_v<T, float>) {
    if (use_lanes) {  // the points from lanes, each plane's in grid order; grad_input's planes dense
      const GridSampleCpuKernels& kernels = cpu_kernels(ctx);
      const auto walk = [&](ScatterThread<A>& state, std::int64_t lo, std::int64_t hi) {
        PlaneScatter<A>& scatter = state.scatter;
        std::vector<std::int32_t>& counts = state.counts;
        const auto add_plane = [&](std::int64_t n, std::int64_t c) {  // with PlaneScatter's partials
          float* plane = gi + n * a.gi.s0 + c * a.gi.s1;
          const float* go = a.grad_output + n * a.go.s0 + c * a.go.s1;
          scatter.next_plane();
          for_each_lane_point(kernels, a.g, n, c, c + 1, state.lanes,
                              [&](std::int64_t, std::int64_t ho, std::int64_t wo, const std::int32_t* o,
                                  const float* w) {
                                const float gv = go[ho * a.go.s2 + wo * a.go.s3];
                                for (int k = 0; k < 4; ++k) {
                                  const std::int32_t d = o[k * kLaneBlock];
                                  if (d >= 0) scatter.add(d, plane[d], gv * w[k * kLaneBlock]);
                                }
                              });
          scatter.finish([plane](std::int64_t d) { return plane + d; });
        };
        for (std::int64_t item = lo; item < hi; ++item) {
          const std::int64_t g = item % groups, n = item / groups;
          const std::int64_t c0 = g * kGroup, c1 = std::min(s.C, (g + 1) * kGroup);
          // The item's planes optimistically, block by block as the atomic mode walks them (each
          // plane still sees its points in grid order): each record added where it lands, which is
          // PlaneScatter's sum while no destination has reached a second partial, and the points
          // counted (the planes share their records). If no destination can have received more
          // than kGatherPartial, every plane has the engine's sums; otherwise the item's planes are
          // cleared and each runs PlaneScatter's partials.
          std::fill(counts.begin(), counts.end(), 0);
          add_item_lanes(kernels, a, n, c0, c1, gi, state.lanes, counts.data());
          if (records_bounded(counts)) continue;
          for (std::int64_t c = c0; c < c1; ++c) {
            float* plane = gi + n * a.gi.s0 + c * a.gi.s1;
            std::fill(plane, plane + positions, 0.0f);
            add_plane(n, c);
          }
        }
      };
      run_owned(call.op, s.N * groups, ctx.resolved_threads(), scatter_thread_bytes<T>(s), make,
                [&] { zero_fill<T>(call.grad_input, ctx); }, walk);
      return;
    }
  }
  const auto walk = [&](ScatterThread<A>& state, std::int64_t lo, std::int64_t hi) {
    WalkBuffers<A>& buffers = state.buffers;
    PlaneScatter<A>& scatter = state.scatter;
    std::vector<A>& sums = state.sums;
    std::vector<std::int32_t>& counts = state.counts;
    for (std::int64_t item = lo; item < hi; ++item) {
      const std::int64_t g = item % groups, n = item / groups;
      std::int64_t current = -1;
      bool counted = false;  // no destination of the image gets more than kGatherPartial records
      const auto count_points = [&](const std::vector<PlacedPoint<A>>& points) {
        // Several channels share the image's records: count them once, and if no destination
        // reaches a second partial, the planes add without counting.
        std::fill(counts.begin(), counts.end(), 0);
        std::int32_t most = 0;
        for (const PlacedPoint<A>& q : points)
          for (int k = 0; k < q.p.count; ++k)
            if (q.p.valid[k]) most = std::max(most, ++counts[static_cast<std::size_t>(q.p.iy[k] * s.W + q.p.ix[k])]);
        counted = most <= detail::kGatherPartial;
      };
      T* plane = nullptr;
      const auto at = [&](std::int64_t d) -> A* {
        if constexpr (kSameType) return plane + (d / s.W) * a.gi.s2 + (d % s.W) * a.gi.s3;
        else return sums.data() + d;
      };
      const auto finish_plane = [&] {
        if (current < 0) return;
        scatter.finish(at);
        if constexpr (!kSameType) {
          const A* sum = sums.data();
          for (std::int64_t y = 0; y < s.H; ++y)
            for (std::int64_t x = 0; x < s.W; ++x) plane[y * a.gi.s2 + x * a.gi.s3] = from_acc<T>(*sum++);
        }
      };
      for_each_channel_point(
          a.g, n, g * kGroup, std::min(s.C, (g + 1) * kGroup), buffers, false, gi + n * a.gi.s0, a.gi,
          [&](std::int64_t c, std::int64_t ho, std::int64_t wo, const GridPoint<A>& p) {
            if (c != current) {
              finish_plane();
              current = c;
              plane = gi + n * a.gi.s0 + c * a.gi.s1;
              scatter.next_plane(counted);
              if constexpr (!kSameType) std::fill(sums.begin(), sums.end(), A(0));
            }
            const A gv = to_acc(a.grad_output[n * a.go.s0 + c * a.go.s1 + ho * a.go.s2 + wo * a.go.s3]);
            for (int k = 0; k < p.count; ++k) {
              if (!p.valid[k]) continue;
              const std::int64_t d = p.iy[k] * s.W + p.ix[k];
              A& acc = kSameType ? reinterpret_cast<A&>(plane[p.iy[k] * a.gi.s2 + p.ix[k] * a.gi.s3])
                                 : sums[static_cast<std::size_t>(d)];
              scatter.add(d, acc, gv * p.weight[k]);
            }
          },
          count_points);
      finish_plane();
    }
  };
  run_owned(call.op, s.N * groups, ctx.resolved_threads(), scatter_thread_bytes<T>(s), make,
            [&] { zero_fill<T>(call.grad_input, ctx); }, walk);
}

/// Which exact path the CPU backend runs (either gives the same bits). The scatter where its walk
/// is the atomic mode's: float32 bilinear on dense NCHW planes (the points from lanes, every
/// record added where it lands unless records_bounded finds a destination that may need a
/// partial: Mask2Former's point loss and RT-DETR's decoder, 256 channels, within 1.1x of the
/// atomic mode, the decoder 2x faster than the engine), and elsewhere where few channels share
/// the records (fewer than a walk's group: the engine's sequential sort and its records cost more
/// than the sums). The engine with many channels otherwise (its sort paid once for all of them,
/// its sums in parallel over destinations: bfloat16's decoder 1.3x faster than the scatter),
/// where channels-last rows vectorize its sums, and where a thread's scatter state would pass
/// kScatterThreadBytes (a large map).
CpuExactPath exact_path(const GridSampleCall& call) {
  const bool rows = channels_innermost(call.grad_input) && channels_innermost(call.grad_output) && call.shape.C > 1;
  const std::size_t bytes =
      dispatch_floating(call.input.dtype, [&](auto tag) { return scatter_thread_bytes<decltype(tag)>(call.shape); });
  const bool walk = backward_lanes_apply(call) || call.shape.C < kGroup;
  return !rows && walk && bytes <= kScatterThreadBytes ? CpuExactPath::kScatter : CpuExactPath::kEngine;
}

/// Grid points an NCHW grad_grid piece holds (their corners and two sums each).
constexpr std::int64_t kGradGridPiece = 4096;

/// grad_grid of float32 bilinear points on NCHW planes, channels in vector lanes' reach: per piece
/// of an image's points, each point's corner offsets, distances and multipliers once, then every
/// channel's plane in order, lane_grad_grid adding its terms to each point's sums. A point's sums
/// see its channels in order whatever the lanes, so they have the scalar path's bits.
void grad_grid_lanes(const GridSampleCall& call, const Context& ctx) {
  const detail::GridSampleBackwardArgs<float> a = grid_sample_backward_args<float>(call, false);
  const GridSampleShape& s = call.shape;
  const GridSampleStrides gg = gs_strides(call.grad_grid);
  const GridSampleCpuKernels& kernels = cpu_kernels(ctx);
  const std::int64_t plane_points = s.Ho * s.Wo;
  constexpr std::int64_t P = kGradGridPiece;
  parallel_for(s.N * plane_points, point_grain(s.C), ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<std::int32_t> o(4 * P);
    std::vector<float> f(9 * P);  // dx, dy, x and y multipliers, sums x and y, grad_output, 2 scratch
    float *const dx = f.data(), *const dy = dx + P, *const mx = dy + P, *const my = mx + P, *const sx = my + P,
                 *const sy = sx + P, *const gbuf = sy + P, *const xy = gbuf + P;
    std::vector<std::int64_t> go_at(static_cast<std::size_t>(P));
    for (std::int64_t t0 = lo; t0 < hi;) {
      const std::int64_t n = t0 / plane_points, q0 = t0 % plane_points;
      const std::int64_t len = std::min({hi - t0, plane_points - q0, P});
      // the piece's points in lanes: what grid_sample_point gives (bilinear: four corners)
      kernels.grad_grid_points(a.g, n, q0, len, a.g.in.s2, a.g.in.s3, o.data(), P, dx, dy, mx, my, xy);
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t ho = (q0 + i) / s.Wo, wo = (q0 + i) % s.Wo;
        go_at[static_cast<std::size_t>(i)] = ho * a.go.s2 + wo * a.go.s3;
        sx[i] = 0.0f, sy[i] = 0.0f;
      }
      // grad_output's values of the piece lie in a row when its points continue one another
      const bool row = a.go.s3 == 1 && (a.go.s2 == s.Wo || q0 / s.Wo == (q0 + len - 1) / s.Wo);
      for (std::int64_t c = 0; c < s.C; ++c) {
        const float* plane = a.g.input + n * a.g.in.s0 + c * a.g.in.s1;
        const float* go = a.grad_output + n * a.go.s0 + c * a.go.s1;
        if (!row)
          for (std::int64_t i = 0; i < len; ++i) gbuf[i] = go[go_at[static_cast<std::size_t>(i)]];
        kernels.grad_grid_lanes(plane, len, o.data(), o.data() + P, o.data() + 2 * P, o.data() + 3 * P, dx, dy,
                                row ? go + go_at[0] : gbuf, sx, sy);
      }
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t ho = (q0 + i) / s.Wo, wo = (q0 + i) % s.Wo, off = n * gg.s0 + ho * gg.s1 + wo * gg.s2;
        detail::store_grid_value(call.grad_grid.data, call.grad_grid.dtype, off, sx[i] * mx[i], s.unit);
        detail::store_grid_value(call.grad_grid.data, call.grad_grid.dtype, off + gg.s3, sy[i] * my[i], s.unit);
      }
      t0 += len;
    }
  });
}

/// grad_grid: threads take ranges of grid points. float32 bilinear NCHW, or one channel in either
/// layout, where offsets fit: grad_grid_lanes (a piece of points in lanes, then each channel's
/// plane). Otherwise NHWC, one channel or nearest: point by point, each summing over its channels
/// (grid_sample_grad_grid_element); NCHW bilinear: a piece of one image's points at a time, sorted
/// by row, then the channels outermost, so each plane is read in one pass rather than once per
/// point. Every point still adds its channels in order with grid_grad_grid_add, as
/// grid_sample_grad_grid_point does (the emulated and lanes tests hold them to the byte).
template <class T>
void grad_grid_backward(const GridSampleCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const GridSampleShape& s = call.shape;
  const GridSampleStrides gg = gs_strides(call.grad_grid);
  const int threads = ctx.resolved_threads();
  if constexpr (std::is_same_v<T, float>) {  // NCHW planes, or one channel (either layout is one plane)
    if ((s.C == 1 || !channels_innermost(call.input)) && lanes_fit(call, call.input))
      return grad_grid_lanes(call, ctx);
  }
  if (channels_innermost(call.input) || s.C == 1 || s.nearest) {
    parallel_for(s.N * s.Ho * s.Wo, point_grain(s.C), threads,
                 [&](std::int64_t lo, std::int64_t hi) DETOPS_GRID_FLATTEN {
                   for (std::int64_t t = lo; t < hi; ++t)
                     detail::grid_sample_grad_grid_element(t, a, call.grad_grid.data, call.grad_grid.dtype, gg);
                 });
    return;
  }
  const std::int64_t plane_points = s.Ho * s.Wo;
  const auto grad_grid_range = [&](std::int64_t lo, std::int64_t hi) DETOPS_GRID_FLATTEN {
    WalkBuffers<A> b;
    std::vector<A> sum_x, sum_y;
    for (std::int64_t t0 = lo; t0 < hi;) {
      const std::int64_t n = t0 / plane_points, q0 = t0 % plane_points;
      const std::int64_t len = std::min({hi - t0, plane_points - q0, kGradGridPiece});
      const auto size = static_cast<std::size_t>(len);
      b.points.resize(size);
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t ho = (q0 + i) / s.Wo, wo = (q0 + i) % s.Wo;
        b.points[static_cast<std::size_t>(i)] = {detail::grid_sample_point(a.g, n, ho, wo), ho, wo};
      }
      sort_by_row(b, s.H);  // each point's sums are its own: any point order gives the same bits
      sum_x.assign(size, A(0));
      sum_y.assign(size, A(0));
      for (std::int64_t c = 0; c < s.C; ++c) {
        const T* plane = a.g.input + n * a.g.in.s0 + c * a.g.in.s1;
        const T* go = a.grad_output + n * a.go.s0 + c * a.go.s1;
        for (std::size_t i = 0; i < size; ++i) {
          if (i + kAhead < size) prefetch_corners(b.points[i + kAhead].p, plane, a.g.in);
          const PlacedPoint<A>& q = b.points[i];
          const GridPoint<A>& p = q.p;
          if (p.count != 4) continue;
          A v[4];
          for (int k = 0; k < 4; ++k)
            v[k] = p.valid[k] ? to_acc(plane[p.iy[k] * a.g.in.s2 + p.ix[k] * a.g.in.s3]) : A(0);
          detail::grid_grad_grid_add(v[0], v[1], v[2], v[3], p.dx, p.dy, to_acc(go[q.ho * a.go.s2 + q.wo * a.go.s3]),
                                     sum_x[i], sum_y[i]);
        }
      }
      for (std::size_t i = 0; i < size; ++i) {
        const PlacedPoint<A>& q = b.points[i];
        const bool bilinear = q.p.count == 4;
        const std::int64_t off = n * gg.s0 + q.ho * gg.s1 + q.wo * gg.s2;
        detail::store_grid_value(call.grad_grid.data, call.grad_grid.dtype, off,
                                 bilinear ? sum_x[i] * q.p.gx_mult : A(0), s.unit);
        detail::store_grid_value(call.grad_grid.data, call.grad_grid.dtype, off + gg.s3,
                                 bilinear ? sum_y[i] * q.p.gy_mult : A(0), s.unit);
      }
      t0 += len;
    }
  };
  parallel_for(s.N * plane_points, point_grain(s.C), threads, grad_grid_range);
}

// ---------------------------------------------------------------------------------------------
// Entry points (the table kGridSampleCpu at the bottom)

void forward(const GridSampleCall& call, const Context& ctx) {
  dispatch_floating(call.input.dtype, [&](auto tag) { forward_typed<decltype(tag)>(call, ctx); });
}

std::size_t backward_workspace(const GridSampleCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  return grid_sample_cpu_exact_workspace(call, exact_path(call));
}

void backward(const GridSampleCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  if (mode == BackwardMode::kExact) {
    grid_sample_cpu_exact_backward(call, exact_path(call), ctx, ws);
    return;
  }
  dispatch_floating(call.input.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (call.grad_input.defined() && call.grad_input.numel() > 0) {
      zero_fill<T>(call.grad_input, ctx);
      if (call.shape.Ho * call.shape.Wo > 0) scatter_backward<T>(call, ctx);
    }
    if (call.grad_grid.defined() && call.grad_grid.numel() > 0) grad_grid_backward<T>(call, ctx);
  });
}

}  // namespace

std::size_t grid_sample_cpu_exact_workspace(const GridSampleCall& call, CpuExactPath path) {
  if (path == CpuExactPath::kScatter) return 0;
  return dispatch_floating(call.input.dtype,
                           [&](auto tag) { return exact_layout<acc_t<decltype(tag)>>(call.shape, call.op).bytes(); });
}

void grid_sample_cpu_exact_backward(const GridSampleCall& call, CpuExactPath path, const Context& ctx, Workspace ws) {
  dispatch_floating(call.input.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (call.grad_input.defined() && call.grad_input.numel() > 0) {
      if (path == CpuExactPath::kScatter && call.shape.Ho * call.shape.Wo > 0) {
        exact_scatter_backward<T>(call, ctx);  // zero-fills once its scratch is allocated
      } else {
        zero_fill<T>(call.grad_input, ctx);
        if (call.shape.Ho * call.shape.Wo > 0) exact_backward<T>(call, ctx, ws);
      }
    }
    if (call.grad_grid.defined() && call.grad_grid.numel() > 0) grad_grid_backward<T>(call, ctx);
  });
}

extern const GridSampleBackend kGridSampleCpu = {&forward, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
