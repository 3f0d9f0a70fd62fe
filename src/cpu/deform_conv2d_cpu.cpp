// CPU backend of deform_conv2d. Every value comes from the shared bodies of
// include/detops/detail/deform_conv2d_kernels.h and the sequence of steps from
// internal/deform_conv2d_backend.h (deform_forward_steps / deform_backward_steps, run with this
// file's executor CpuSteps); this file only chooses the loops:
//  - columns: a sampling point's corners are computed once per (image, offset group, tap, piece
//    of positions) and read for every channel of the group;
//  - the GEMMs: the fixed-order kernel of deform_conv2d_cpu_kernels.inc, per instruction set;
//  - grad_offset / grad_mask: one (image, group, tap, position) per iteration, as the body;
//  - atomic grad_input: threads own planes (a plane has one writer), contributions in the body's
//    order, rounded per add as CUDA's atomics round them (deterministic here, unlike on the GPU);
//  - exact grad_input: the gather engine (src/internal/gather_backward_cpu.h) per chunk.
// No result depends on the thread count, the layout or the instruction set.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "internal/common.h"
#include "internal/cpu_isa.h"
#include "internal/deform_conv2d_backend.h"
#include "internal/gather_backward_cpu.h"

#if DETOPS_X86_ISA_VARIANTS
#include <immintrin.h>  // the gathers of lane_columns' AVX2 and AVX-512 variants
#endif

namespace detops {
namespace internal {

/// How a sampling point samples in lane_columns: the bilinear sum, 0 (outside), or NaN.
constexpr std::int32_t kDeformInside = 0, kDeformOutside = 1, kDeformNaN = 2;

/// The per-instruction-set entry points (deform_conv2d_cpu_kernels.inc).
struct DeformCpuKernels {
  void (*gemm_f32)(const detail::DeformGemmArgs<float>& g, int threads);
  void (*gemm_f64)(const detail::DeformGemmArgs<double>& g, int threads);
  /// One channel's float32 column values of m points (see lane_columns).
  void (*columns_f32)(const float* plane, std::int64_t m, const std::int32_t* o0, const std::int32_t* o1,
                      const std::int32_t* o2, const std::int32_t* o3, const float* w0, const float* w1,
                      const float* w2, const float* w3, const float* mk, const std::int32_t* state, float* out);
};

#define DETOPS_CPU_KERNELS_FILE "deform_conv2d_cpu_kernels.inc"
#include "cpu/cpu_variants.inc"

namespace {

using detail::DeformConv2dShape;
using detail::DeformCorners;
using detail::DeformCoord;
using detail::Strides4;

void run_gemm(const detail::DeformGemmArgs<float>& g, const Context& ctx) {
  cpu_kernels(ctx).gemm_f32(g, ctx.resolved_threads());
}
void run_gemm(const detail::DeformGemmArgs<double>& g, const Context& ctx) {
  cpu_kernels(ctx).gemm_f64(g, ctx.resolved_threads());
}

/// Runs body(t) for t in [0, n) on the context's threads.
template <class Body>
void for_each(std::int64_t n, std::int64_t grain, const Context& ctx, const Body& body) {
  parallel_for(n, grain, ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t t = lo; t < hi; ++t) body(t);
  });
}

/// Positions whose corners one item of the column walk computes at once.
constexpr std::int64_t kPiece = 256;

/// An item of the column walks: image b of the chunk, offset group g, tap, and the piece of
/// positions [p0, p0 + len) (items run pieces fastest, then taps, groups, images).
struct ColumnItem {
  std::int64_t b, g, tap, p0, len;
  ColumnItem(std::int64_t item, std::int64_t pieces, std::int64_t taps, std::int64_t og, std::int64_t P)
      : b(item / (pieces * taps * og)),
        g((item / (pieces * taps)) % og),
        tap((item / pieces) % taps),
        p0((item % pieces) * kPiece),
        len(std::min(kPiece, P - p0)) {}
};

/// build_columns' [R, Q] layout for float32 with every pixel offset of a plane within 32 bits: per
/// item, each point's corner offsets (-1 off the map or when it samples nothing), weights, mask
/// and state once, then every channel of the offset group through lane_columns (vector lanes over
/// the points, which a channel's row holds in order; deform_sample's value, bit for bit). (The
/// transposed layout keeps the scalar walk: written a channel at a time, its stride costs more
/// than the lanes save.)
void columns_in_lanes(const detail::DeformConv2dArgs<float>& a, std::int64_t n0, std::int64_t images, float* col,
                      const Context& ctx) {
  const DeformConv2dShape& s = a.s;
  const std::int64_t P = s.positions(), taps = s.taps(), Q = images * P;
  const std::int64_t og = s.offset_groups, cg = s.offset_group_channels();
  const std::int64_t pieces = (P + kPiece - 1) / kPiece;
  const DeformCpuKernels& kernels = cpu_kernels(ctx);
  parallel_for(images * og * taps * pieces, 1, ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
    constexpr std::int64_t B = kPiece;
    std::vector<std::int32_t> ints(5 * B);  // corner offsets k at [k * B, (k + 1) * B), then states
    std::vector<float> floats(5 * B);       // weights k at [k * B, (k + 1) * B), then masks
    std::int32_t *const o = ints.data(), *const state = o + 4 * B;
    float *const w = floats.data(), *const mk = w + 4 * B;
    for (std::int64_t item = lo; item < hi; ++item) {
      const ColumnItem it(item, pieces, taps, og, P);
      const std::int64_t tap = it.tap, g = it.g, b = it.b, n = n0 + b, p0 = it.p0, len = it.len;
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t p = p0 + i;
        const DeformCoord<float> pt = detail::deform_coord(a, n, g, tap, p / s.Wo, p % s.Wo);
        const DeformCorners<float> k = detail::deform_corners(pt.y, pt.x, s.H, s.W);
        state[i] = k.nan ? kDeformNaN : k.inside ? kDeformInside : kDeformOutside;
        float wk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (state[i] == kDeformInside) detail::deform_bilinear_weights(k, wk);
        for (int c = 0; c < 4; ++c) {
          const std::int64_t yy = k.y0 + (c >> 1), xx = k.x0 + (c & 1);
          const bool read = state[i] == kDeformInside && k.valid[c];
          o[c * B + i] = read ? static_cast<std::int32_t>(yy * a.in.s2 + xx * a.in.s3) : -1;
          w[c * B + i] = wk[c];
        }
        mk[i] = pt.m;
      }
      const std::int64_t q0 = b * P + p0;
      for (std::int64_t c = g * cg; c < (g + 1) * cg; ++c) {
        const float* plane = a.input + n * a.in.s0 + c * a.in.s1;
        kernels.columns_f32(plane, len, o, o + B, o + 2 * B, o + 3 * B, w, w + B, w + 2 * B, w + 3 * B, mk, state,
                            col + (c * taps + tap) * Q + q0);
      }
    }
  });
}

/// The columns of the chunk at n0 (Q columns): [R, Q], or [Q, R] when `transposed`. Items are
/// (image, offset group, tap, piece of positions): the piece's points once, then each channel
/// of the group reads its four corners (deform_sample's arithmetic, the column body's value).
template <class T>
void build_columns(const detail::DeformConv2dArgs<T>& a, std::int64_t n0, std::int64_t images, bool transposed,
                   acc_t<T>* col, const Context& ctx) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = a.s;
  const std::int64_t P = s.positions(), taps = s.taps(), R = s.rows(), Q = images * P;
  const std::int64_t og = s.offset_groups, cg = s.offset_group_channels();
  const std::int64_t pieces = (P + kPiece - 1) / kPiece;
  if constexpr (std::is_same_v<T, float>) {
    constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
    const bool fits = (s.H - 1) * a.in.s2 + (s.W - 1) * a.in.s3 < kMax;
    if (!transposed && fits) return columns_in_lanes(a, n0, images, col, ctx);
  }
  parallel_for(images * og * taps * pieces, 1, ctx.resolved_threads(), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<DeformCoord<A>> coords(static_cast<std::size_t>(kPiece));
    std::vector<DeformCorners<A>> corners(static_cast<std::size_t>(kPiece));
    for (std::int64_t item = lo; item < hi; ++item) {
      const ColumnItem it(item, pieces, taps, og, P);
      const std::int64_t tap = it.tap, g = it.g, b = it.b, n = n0 + b, p0 = it.p0, len = it.len;
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t p = p0 + i;
        coords[i] = detail::deform_coord(a, n, g, tap, p / s.Wo, p % s.Wo);
        corners[i] = detail::deform_corners(coords[i].y, coords[i].x, s.H, s.W);
      }
      const std::int64_t q0 = b * P + p0;
      if (transposed) {  // [Q, R]: a point's channels are neighbours (stride taps)
        for (std::int64_t i = 0; i < len; ++i)
          for (std::int64_t c = g * cg; c < (g + 1) * cg; ++c)
            col[(q0 + i) * R + c * taps + tap] = detail::deform_sample(a, coords[i], corners[i], n, c);
      } else {  // [R, Q]: a channel's points are neighbours
        for (std::int64_t c = g * cg; c < (g + 1) * cg; ++c)
          for (std::int64_t i = 0; i < len; ++i)
            col[(c * taps + tap) * Q + q0 + i] = detail::deform_sample(a, coords[i], corners[i], n, c);
      }
    }
  });
}

/// weight widened to A, [Cout, Rg] (a contiguous weight of A is that layout already: a copy).
template <class T>
void widen_weight(const DeformConv2dCall& call, acc_t<T>* w, const Context& ctx) {
  const DeformConv2dShape& s = call.shape;
  const T* weight = static_cast<const T*>(call.weight.data);
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    if (call.weight.is_contiguous()) {
      std::copy(weight, weight + s.Cout * s.group_in() * s.taps(), w);
      return;
    }
  }
  const Strides4 ws = dc_strides(call.weight);
  for_each(s.Cout * s.group_in() * s.taps(), 4096, ctx,
           [&](std::int64_t t) { detail::deform_conv2d_weight_element(t, weight, ws, s, w); });
}

/// Every element of a strided 4-d tensor set to 0 (CUDA's zero-fill body, plane by plane).
template <class T>
void zero_fill(const TensorView& v, const Context& ctx) {
  if (!v.defined() || v.numel() == 0) return;
  const Strides4 st = dc_strides(v);
  const std::int64_t C = v.sizes[1], H = v.sizes[2], W = v.sizes[3];
  T* p = static_cast<T*>(v.data);
  for_each(v.sizes[0] * C, 16, ctx, [&](std::int64_t nc) {
    for (std::int64_t i = nc * H * W; i < (nc + 1) * H * W; ++i) detail::fill_zero_element(i, p, st, C, H, W);
  });
}

/// Atomic grad_input for the chunk: every sample's corners once (deform_scatter_point, into
/// `points`), then threads own planes (n, c); a plane takes its taps and positions in the scatter
/// body's thread order, each add rounded to T.
template <class T>
void scatter_input(const DeformConv2dCall& call, const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images,
                   detail::DeformScatterPoint<acc_t<T>>* points, const Context& ctx) {
  const DeformConv2dShape& s = call.shape;
  const std::int64_t P = s.positions(), taps = s.taps(), og = s.offset_groups, cg = s.offset_group_channels();
  T* gi = static_cast<T*>(call.grads.grad_input.data);
  const Strides4 gs = dc_strides(call.grads.grad_input);
  for_each(images * og * taps * P, 1024, ctx, [&](std::int64_t t) {
    const std::int64_t p = t % P, tap = (t / P) % taps, g = (t / (P * taps)) % og, b = t / (P * taps * og);
    points[t] = detail::deform_scatter_point(a.f, a.n0 + b, g, tap, p, gs);
  });
  for_each(images * s.Cin, 1, ctx, [&](std::int64_t item) {
    const std::int64_t c = item % s.Cin, b = item / s.Cin, n = a.n0 + b;
    T* plane = gi + n * gs.s0 + c * gs.s1;
    const detail::DeformScatterPoint<acc_t<T>>* pts = points + (b * og + c / cg) * taps * P;
    const acc_t<T>* gc = a.grad_col + c * taps * a.Q + b * P;
    for (std::int64_t tap = 0; tap < taps; ++tap)
      for (std::int64_t p = 0; p < P; ++p) {
        const detail::DeformScatterPoint<acc_t<T>>& sp = pts[tap * P + p];
        const acc_t<T> g = gc[tap * a.Q + p];
        for (int corner = 0; corner < 4; ++corner) {
          if (!sp.valid[corner]) continue;
          T& dst = plane[sp.offset[corner]];
          dst = from_acc<T>(to_acc(dst) + sp.weight[corner] * g);
        }
      }
  });
}

template <class A>
WorkspaceLayout backward_layout(const DeformConv2dCall& call, BackwardMode mode) {
  WorkspaceLayout l;
  const DeformWants w = deform_wants(call);
  add_deform_backward<A>(l, call.shape, w);
  if (mode == BackwardMode::kExact && w.input)
    add_gather_cpu<A>(l, deform_exact_records(call.shape), deform_exact_positions(call.shape), call.op);
  if (mode == BackwardMode::kAtomic && w.input)  // the scatter's sample table
    l.add<detail::DeformScatterPoint<A>>(deform_chunk_images(call.shape) * call.shape.offset_groups *
                                         call.shape.taps() * call.shape.positions());
  return l;
}

/// Exact grad_input for the chunk: phase 1 per (image, group, tap, position), the engine's sort
/// and its fixed-order sums, one write per element.
template <class T>
void exact_input(const DeformConv2dCall& call, const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images,
                 const GatherCpuBuffers<acc_t<T>>& g, const Context& ctx) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = call.shape;
  const int threads = ctx.resolved_threads();
  const std::int64_t points = images * s.offset_groups * s.taps() * s.positions();
  const auto sentinel = static_cast<detail::GatherKey>(deform_exact_positions(s));
  for_each(points, 1024, ctx, [&](std::int64_t t) { detail::deform_conv2d_enumerate_element(t, a, sentinel, g.records); });
  detail::GatherSorted<A> sorted{};
  const std::int64_t runs = gather_sort_cpu(g, points * 4, sentinel, threads, sorted);
  const Strides4 gs = dc_strides(call.grads.grad_input);
  const detail::GatherSumArgs<T, A, A> sa{sorted, a.grad_col, s.taps() * a.Q, static_cast<T*>(call.grads.grad_input.data),
                                       gs.s1, s.offset_group_channels(), sentinel, detail::kGatherPartial};
  // channels outermost: a channel's grad_columns rows (taps * Q values) stay in cache while every
  // run reads them; run-outer order would fetch them again for each run
  gather_sum_cpu(sa, runs,
                 detail::DeformConv2dTarget{a.n0, s.offset_groups, s.offset_group_channels(), s.H, s.W, gs}, threads,
                 detail::GatherAllActive{}, /*channels_outer=*/true);
}

/// The steps of deform_forward_steps / deform_backward_steps (internal/deform_conv2d_backend.h)
/// on the CPU: the shared bodies in loops on the context's threads, and this file's own walks for
/// the columns, the GEMMs and grad_input.
template <class T>
struct CpuSteps {
  using A = acc_t<T>;
  const DeformConv2dCall& call;
  const Context& ctx;
  BackwardMode mode = BackwardMode::kExact;
  GatherCpuBuffers<A> gather{};                           // exact grad_input
  detail::DeformScatterPoint<A>* scatter_points = nullptr;  // atomic grad_input

  void widen_weight(A* w) const { internal::widen_weight<T>(call, w, ctx); }
  void columns(const detail::DeformConv2dArgs<T>& f, std::int64_t n0, std::int64_t images, bool transposed,
               A* col) const {
    build_columns(f, n0, images, transposed, col, ctx);
  }
  void gemm(const detail::DeformGemmArgs<A>& g) const { run_gemm(g, ctx); }
  void output(std::int64_t n0, std::int64_t Q, const A* acc) const {
    const DeformConv2dShape& s = call.shape;
    const T* bias = s.has_bias ? static_cast<const T*>(call.bias.data) : nullptr;
    const std::int64_t bias_s = s.has_bias ? call.bias.strides[0] : 0;
    T* out = static_cast<T*>(call.output.data);
    const Strides4 os = dc_strides(call.output);
    for_each(s.Cout * Q, 4096, ctx, [&](std::int64_t t) {
      detail::deform_conv2d_output_element(t, acc, Q, bias, bias_s, s, n0, out, os);
    });
  }
  void zero_grad_input() const { zero_fill<T>(call.grads.grad_input, ctx); }
  void zero(A* p, std::int64_t n) const { std::fill(p, p + n, A(0)); }
  void grad_output(std::int64_t n0, std::int64_t Q, A* go) const {
    const T* grad_output = static_cast<const T*>(call.grad_output.data);
    const Strides4 gos = dc_strides(call.grad_output);
    for_each(call.shape.Cout * Q, 4096, ctx, [&](std::int64_t t) {
      detail::deform_conv2d_grad_output_element(t, grad_output, gos, call.shape, n0, Q, go);
    });
  }
  void bias(const A* go, std::int64_t Q, A* sums, bool last) const {
    T* grad_bias = static_cast<T*>(call.grads.grad_bias.data);
    const std::int64_t gbs = call.grads.grad_bias.strides[0];
    for_each(call.shape.Cout, 1, ctx, [&](std::int64_t t) {
      detail::deform_conv2d_bias_element(t, go, Q, sums, last, grad_bias, gbs);
    });
  }
  void offsets(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    const DeformConv2dShape& s = call.shape;
    const DeformWants w = deform_wants(call);
    T* grad_offset = w.offset ? static_cast<T*>(call.grads.grad_offset.data) : nullptr;
    T* grad_mask = w.mask ? static_cast<T*>(call.grads.grad_mask.data) : nullptr;
    const Strides4 offs = dc_strides(call.grads.grad_offset), ms = dc_strides(call.grads.grad_mask);
    for_each(images * s.offset_groups * s.taps() * s.positions(), 256, ctx, [&](std::int64_t t) {
      detail::deform_conv2d_offset_element(t, a, grad_offset, offs, grad_mask, ms);
    });
  }
  void input(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    if (mode == BackwardMode::kExact) exact_input<T>(call, a, images, gather, ctx);
    else scatter_input<T>(call, a, images, scatter_points, ctx);
  }
  void store_weight(const A* sums) const {
    const DeformConv2dShape& s = call.shape;
    T* gw = static_cast<T*>(call.grads.grad_weight.data);
    const Strides4 gws = dc_strides(call.grads.grad_weight);
    for_each(s.Cout * s.group_in() * s.taps(), 4096, ctx, [&](std::int64_t t) {
      detail::deform_conv2d_store_weight_element(t, sums, s, gw, gws);
    });
  }
};

template <class T>
void forward_typed(const DeformConv2dCall& call, const Context& ctx, Workspace ws) {
  CpuSteps<T> x{call, ctx};
  deform_forward_steps<T>(call, ws, x);
}

template <class T>
void backward_typed(const DeformConv2dCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const DeformWants w = deform_wants(call);
  WorkspaceLayout layout = backward_layout<A>(call, mode);
  layout.bind(ws.data);
  const DeformBackwardBuffers<A> buf = take_deform_backward<A>(layout);
  CpuSteps<T> x{call, ctx, mode};
  if (mode == BackwardMode::kExact && w.input) x.gather = take_gather_cpu<A>(layout);
  if (mode == BackwardMode::kAtomic && w.input) x.scatter_points = layout.take<detail::DeformScatterPoint<A>>();
  deform_backward_steps<T>(call, buf, x);
}

// ---------------------------------------------------------------------------------------------
// Entry points (the table kDeformConv2dCpu at the bottom)

void forward(const DeformConv2dCall& call, const Context& ctx, Workspace ws) {
  dispatch_floating(call.input.dtype, [&](auto tag) { forward_typed<decltype(tag)>(call, ctx, ws); });
}

std::size_t backward_workspace(const DeformConv2dCall& call, BackwardMode mode) {
  return dispatch_floating(call.input.dtype,
                           [&](auto tag) { return backward_layout<acc_t<decltype(tag)>>(call, mode).bytes(); });
}

void backward(const DeformConv2dCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  dispatch_floating(call.input.dtype, [&](auto tag) { backward_typed<decltype(tag)>(call, mode, ctx, ws); });
}

}  // namespace

extern const DeformConv2dBackend kDeformConv2dCpu = {&forward, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
