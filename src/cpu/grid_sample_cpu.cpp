// CPU backend of grid_sample. Every value comes from the shared bodies of
// include/detops/detail/grid_sample_kernels.h; this file only chooses the loops:
//  - forward: a point's corners are computed once and read for many channels (NHWC: threads take
//    points; NCHW: pieces of points for groups of channels);
//  - atomic backward: a plain scatter, threads own groups of planes, so every grad_input element
//    receives its contributions in grid order, rounded per add as CUDA's atomics round them
//    (deterministic here, unlike on the GPU);
//  - exact backward: the gather engine (src/internal/gather_backward_cpu.h) per chunk of images;
//  - grad_grid: threads take grid points, each sums over the channels in order.
// No result depends on the thread count or the layout.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "internal/common.h"
#include "internal/gather_backward_cpu.h"
#include "internal/grid_sample_backend.h"

namespace detops {
namespace internal {
namespace {

using detail::GridPoint;
using detail::GridSampleShape;
using detail::GridSampleStrides;

/// Grid points a thread takes at a time (each is C channels of work).
std::int64_t point_grain(std::int64_t C) { return std::max<std::int64_t>(1, 2048 / std::max<std::int64_t>(C, 1)); }

/// The NCHW walks take pieces of kPiece grid points whose corners are computed once and read for
/// kGroup channels (one plane at a time, which stays in cache).
constexpr std::int64_t kPiece = 512, kGroup = 16;

/// Forward. Channels innermost in the input (NHWC): threads take grid points and read a point's
/// corners across the contiguous channels. Otherwise (NCHW): threads take (image, piece of points,
/// group of channels) items. Either way every output element is the same arithmetic.
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
  const std::int64_t plane_points = s.Ho * s.Wo;
  const std::int64_t pieces = (plane_points + kPiece - 1) / kPiece, groups = (s.C + kGroup - 1) / kGroup;
  parallel_for(s.N * pieces * groups, 1, threads, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<GridPoint<A>> points(static_cast<std::size_t>(std::min(plane_points, kPiece)));
    for (std::int64_t item = lo; item < hi; ++item) {
      const std::int64_t g = item % groups, piece = (item / groups) % pieces, n = item / (groups * pieces);
      const std::int64_t q0 = piece * kPiece, q1 = std::min(plane_points, q0 + kPiece);
      for (std::int64_t q = q0; q < q1; ++q)
        points[static_cast<std::size_t>(q - q0)] = detail::grid_sample_point(a, n, q / s.Wo, q % s.Wo);
      for (std::int64_t c = g * kGroup; c < std::min(s.C, (g + 1) * kGroup); ++c) {
        const T* plane = a.input + n * a.in.s0 + c * a.in.s1;
        T* o = output + n * out.s0 + c * out.s1;
        for (std::int64_t q = q0; q < q1; ++q)
          o[(q / s.Wo) * out.s2 + (q % s.Wo) * out.s3] =
              from_acc<T>(detail::grid_sample_interpolate(points[static_cast<std::size_t>(q - q0)], plane, a.in));
      }
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

/// Atomic mode: threads own (image, group of channels) items, so each grad_input plane has one
/// writer; an item walks the grid points in order, a piece at a time (corners computed once per
/// piece), and adds into each of its planes (the order of CUDA's thread indices within a plane,
/// so the two backends add the same values; only CUDA's scheduling reorders them).
template <class T>
void scatter_backward(const GridSampleCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const GridSampleShape& s = call.shape;
  T* gi = static_cast<T*>(call.grad_input.data);
  const std::int64_t plane_points = s.Ho * s.Wo, groups = (s.C + kGroup - 1) / kGroup;
  parallel_for(s.N * groups, 1, ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<GridPoint<A>> points(static_cast<std::size_t>(std::min(plane_points, kPiece)));
    for (std::int64_t item = lo; item < hi; ++item) {
      const std::int64_t g = item % groups, n = item / groups;
      for (std::int64_t q0 = 0; q0 < plane_points; q0 += kPiece) {
        const std::int64_t q1 = std::min(plane_points, q0 + kPiece);
        for (std::int64_t q = q0; q < q1; ++q)
          points[static_cast<std::size_t>(q - q0)] = detail::grid_sample_point(a.g, n, q / s.Wo, q % s.Wo);
        for (std::int64_t c = g * kGroup; c < std::min(s.C, (g + 1) * kGroup); ++c) {
          T* plane = gi + n * a.gi.s0 + c * a.gi.s1;
          const T* go = a.grad_output + n * a.go.s0 + c * a.go.s1;
          for (std::int64_t q = q0; q < q1; ++q) {
            const GridPoint<A>& p = points[static_cast<std::size_t>(q - q0)];
            const A gv = to_acc(go[(q / s.Wo) * a.go.s2 + (q % s.Wo) * a.go.s3]);
            for (int k = 0; k < p.count; ++k) {
              if (!p.valid[k]) continue;
              T& dst = plane[p.iy[k] * a.gi.s2 + p.ix[k] * a.gi.s3];
              dst = from_acc<T>(to_acc(dst) + gv * p.weight[k]);
            }
          }
        }
      }
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
WorkspaceLayout exact_layout(const GridSampleShape& s) {
  const ExactChunk ch = exact_chunk(s);
  WorkspaceLayout l;
  add_gather_cpu<A>(l, ch.records, ch.positions);
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
  WorkspaceLayout layout = exact_layout<A>(s);
  layout.bind(ws.data);
  const GatherCpuBuffers<A> b = take_gather_cpu<A>(layout);
  const std::int64_t per_image_points = s.Ho * s.Wo;
  const auto sentinel = static_cast<std::uint64_t>(ch.positions);
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

template <class T>
void grad_grid_backward(const GridSampleCall& call, const Context& ctx) {
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const GridSampleShape& s = call.shape;
  const GridSampleStrides gg = gs_strides(call.grad_grid);
  parallel_for(s.N * s.Ho * s.Wo, point_grain(s.C), ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t t = lo; t < hi; ++t)
      detail::grid_sample_grad_grid_element(t, a, call.grad_grid.data, call.grad_grid.dtype, gg);
  });
}

// ---------------------------------------------------------------------------------------------
// Entry points (the table kGridSampleCpu at the bottom)

void forward(const GridSampleCall& call, const Context& ctx) {
  dispatch_floating(call.input.dtype, [&](auto tag) { forward_typed<decltype(tag)>(call, ctx); });
}

std::size_t backward_workspace(const GridSampleCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  return dispatch_floating(call.input.dtype,
                           [&](auto tag) { return exact_layout<acc_t<decltype(tag)>>(call.shape).bytes(); });
}

void backward(const GridSampleCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  dispatch_floating(call.input.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (call.grad_input.defined() && call.grad_input.numel() > 0) {
      zero_fill<T>(call.grad_input, ctx);
      if (call.shape.Ho * call.shape.Wo > 0) {
        if (mode == BackwardMode::kExact) exact_backward<T>(call, ctx, ws);
        else scatter_backward<T>(call, ctx);
      }
    }
    if (call.grad_grid.defined() && call.grad_grid.numel() > 0) grad_grid_backward<T>(call, ctx);
  });
}

}  // namespace

extern const GridSampleBackend kGridSampleCpu = {&forward, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
