// SyncBatchNorm's CUDA steps, written once over the device interface (internal/device_steps.h)
// and its thread-group launches: the bodies of include/detops/detail/sync_batch_norm_kernels.h
// (which states how each works and why its results are the CPU backend's bits) as
//   dev.launch(name, n, body)            grid-stride bodies, one index per thread;
//   dev.launch_occupied(name, n, body)   the same, compiled for two blocks per SM (the NHWC
//                                        chunk reductions hold 32 lane sums per thread);
//   dev.launch_warps(name, blocks, body) body(group) per warp: its 32 lanes in lockstep;
//   dev.launch_blocks(name, blocks, body) body(group) per block, with barriers and shared memory;
//   Dev::MaxI64                          the exponents' order-free integer maximum.
// cuda/sync_batch_norm_cuda.cu runs them on CudaDevice (the group: the calling thread, shuffles and
// __syncthreads); tests/sync_batch_norm_emulated_test.cpp runs the very same code on an emulated
// device whose groups run lockstep (or warps taking turns at the barriers).
//
// Sequences:
//   * default mode, local statistics: the chunk pass (a warp per (channel, chunk) unit, or a thread
//     per unit when the channel is innermost: NHWC), then a block per channel merges its [K]
//     results in the fixed tree and writes the record;
//   * exact mode: the same units accumulate 128-bit integer sums, then a block per channel adds them;
//   * exponents (local scales): the words are preset to kSbnZeroExponent, then every unit's
//     exponent goes in with an integer atomic maximum;
//   * finalize: a thread per channel, compiled for a rank-tree depth chosen from the rank count
//     (sbn_rank_depth: small stack frames); the forward then bumps num_batches_tracked in a second
//     one-thread launch on the same stream, after every channel has read it;
//   * apply and backward apply: elementwise, with flat fast paths for dense NCHW/NHWC; the
//     backward's per-channel coefficients are computed once into a [C] workspace.
// Counts and offsets are 64-bit; empty problems write their (zero) records without launching
// empty grids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "detops/detail/sync_batch_norm_kernels.h"
#include "internal/device_steps.h"
#include "internal/sync_batch_norm_backend.h"

namespace detops {
namespace internal {
namespace sbn_device {

using detail::SbnFlat;
using detail::SbnMoments;
using detail::SbnOrderFreePass;
using detail::SbnPair128;
using detail::SbnShape;
using detail::SbnSrc;
using detail::SbnSums;

// ---------------------------------------------------------------------------------------------
// Bodies

template <class T, bool kUniform>
struct MomentsUnitBody {
  detail::SbnMomentsArgs<T> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t u) const { detail::sbn_moments_unit<T, kUniform>(u, a); }
};
template <class T, bool kUniform>
struct MomentsWarpBody {
  detail::SbnMomentsArgs<T> a;
  template <class G>
  DETOPS_HOST_DEVICE void operator()(const G& grp) const { detail::sbn_moments_warp<T, kUniform>(a, grp); }
};
template <class T, bool kUniform>
struct SumsUnitBody {
  detail::SbnSumsArgs<T> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t u) const { detail::sbn_sums_unit<T, kUniform>(u, a); }
};
template <class T, bool kUniform>
struct SumsWarpBody {
  detail::SbnSumsArgs<T> a;
  template <class G>
  DETOPS_HOST_DEVICE void operator()(const G& grp) const { detail::sbn_sums_warp<T, kUniform>(a, grp); }
};
template <class R>
struct TreeBody {
  detail::SbnTreeArgs<R> a;
  template <class G>
  DETOPS_HOST_DEVICE void operator()(const G& grp) const { detail::sbn_tree_block(a, grp); }
};
struct FillRecordBody {
  std::int64_t* rec;
  std::int64_t count;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::sbn_fill_record_word(i, rec, count); }
};
template <class T, bool kUniform, SbnOrderFreePass P, class Max>
struct OrderFreeUnitBody {
  detail::SbnPassArgs<T> a;
  Max max;
  DETOPS_HOST_DEVICE void operator()(std::int64_t u) const { detail::sbn_order_free_unit<T, kUniform, P>(u, a, max); }
};
template <class T, bool kUniform, SbnOrderFreePass P, class Max>
struct OrderFreeWarpBody {
  detail::SbnPassArgs<T> a;
  Max max;
  template <class G>
  DETOPS_HOST_DEVICE void operator()(const G& grp) const { detail::sbn_order_free_warp<T, kUniform, P>(a, grp, max); }
};
struct ExactReduceBody {
  detail::SbnExactReduceArgs a;
  template <class G>
  DETOPS_HOST_DEVICE void operator()(const G& grp) const { detail::sbn_exact_reduce_block(a, grp); }
};
struct FillWordsBody {
  std::int64_t* p;
  std::int64_t value;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::sbn_fill_word(i, p, value); }
};
struct MergeScalesBody {
  const std::int64_t* gathered;
  std::int64_t ranks, words;
  std::int64_t* scales;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const {
    detail::sbn_merge_scales_word(i, gathered, ranks, words, scales);
  }
};
template <int kDepth>
struct FinalizeBody {
  detail::SbnFinalizeArgs a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t c) const { detail::sbn_finalize_channel<kDepth>(a, c); }
};
struct BumpBatchesBody {
  detail::SbnFinalizeArgs a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t) const { detail::sbn_bump_batches(a); }
};
struct EvalStatsBody {
  detail::SbnParam running_mean, running_var;
  double eps;
  double* save_mean;
  double* save_invstd;
  DETOPS_HOST_DEVICE void operator()(std::int64_t c) const {
    detail::sbn_eval_channel(running_mean, running_var, eps, save_mean, save_invstd, c);
  }
};
template <int kDepth>
struct FinalizeBackwardBody {
  detail::SbnBackwardFinalizeArgs a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::sbn_finalize_backward_index<kDepth>(i, a); }
};
template <class T, SbnFlat L>
struct ApplyBody {
  detail::SbnApplyArgs<T> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::sbn_apply_element<T, L>(i, a); }
};
struct GradCoefBody {
  detail::SbnGradCoefArgs a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t c) const { detail::sbn_grad_coef_channel(c, a); }
};
template <class T, SbnFlat L>
struct BackwardApplyBody {
  detail::SbnBackwardApplyArgs<T> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::sbn_backward_apply_element<T, L>(i, a); }
};

// ---------------------------------------------------------------------------------------------
// Host helpers

inline SbnShape shape_of(const TensorView& t) { return detail::sbn_shape(t.sizes); }
inline SbnSrc src_of(const TensorView& t) { return detail::sbn_src(t.sizes, t.strides); }
inline SbnFlat flat_layout(const TensorView& t) { return detail::sbn_flat_layout(t.sizes, t.strides); }
inline bool same_strides(const TensorView& a, const TensorView& b) {
  return detail::sbn_same_strides(a.strides, b.strides);
}

/// f(std::integral_constant<bool, v>).
template <class F>
void with_bool(bool v, F&& f) {
  if (v) f(std::true_type{});
  else f(std::false_type{});
}

/// f(std::integral_constant<SbnFlat, flat>).
template <class F>
void with_flat(SbnFlat flat, F&& f) {
  switch (flat) {
    case SbnFlat::kNchw: return f(std::integral_constant<SbnFlat, SbnFlat::kNchw>{});
    case SbnFlat::kNhwc: return f(std::integral_constant<SbnFlat, SbnFlat::kNhwc>{});
    case SbnFlat::kGeneric: return f(std::integral_constant<SbnFlat, SbnFlat::kGeneric>{});
  }
}

/// f(std::integral_constant<int, depth>) for the rank-tree depth of `ranks`.
template <class F>
void with_depth(std::int64_t ranks, F&& f) {
  switch (detail::sbn_rank_depth(ranks)) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: return f(std::integral_constant<int, 64>{});
  }
}

/// `pass`'s layout bound to ws (which the front end sized with sbn_pass_layout(...).bytes()).
inline WorkspaceLayout bind_pass(SbnPass pass, const TensorView& x, bool exact, Workspace ws, const char* op);

template <class Dev>
void fill_record(const Dev& dev, std::int64_t* rec, std::int64_t words, std::int64_t count) {
  dev.launch("sbn_fill_record", words, FillRecordBody{rec, count});
}

template <class T, class Dev>
void local_stats_default(const Dev& dev, const TensorView& x, std::int64_t* record, Workspace ws) {
  const SbnShape g = shape_of(x);
  const SbnSrc sx = src_of(x);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  if (units == 0) return fill_record(dev, record, detail::sbn_record_words(g.C, false), count);
  WorkspaceLayout l = bind_pass(SbnPass::kLocalStats, x, false, ws, dev.op);
  SbnMoments* a = l.take<SbnMoments>();
  SbnMoments* b = l.take<SbnMoments>();
  const detail::SbnMomentsArgs<T> args{static_cast<const T*>(x.data), sx, g, a};
  with_bool(sx.uniform, [&](auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if (channels_innermost(x)) dev.launch_occupied("sbn_moments_units", units, MomentsUnitBody<T, kU>{args});
    else dev.launch_warps("sbn_moments_warps", detail::sbn_warp_grid(units), MomentsWarpBody<T, kU>{args});
  });
  dev.launch_blocks("sbn_tree", detail::sbn_channel_grid(g.C),
                    TreeBody<SbnMoments>{detail::SbnTreeArgs<SbnMoments>{a, b, g, count, record}});
}

template <class T, class Dev>
void local_backward_default(const Dev& dev, const TensorView& dy, const TensorView& x, const double* mean,
                            std::int64_t* record, Workspace ws) {
  const SbnShape g = shape_of(x);
  const SbnSrc sx = src_of(x), sg = src_of(dy);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  if (units == 0) return fill_record(dev, record, detail::sbn_record_words(g.C, false), count);
  WorkspaceLayout l = bind_pass(SbnPass::kLocalBackward, x, false, ws, dev.op);
  SbnSums* a = l.take<SbnSums>();
  SbnSums* b = l.take<SbnSums>();
  const detail::SbnSumsArgs<T> args{static_cast<const T*>(dy.data), sg, static_cast<const T*>(x.data), sx, mean, g, a};
  with_bool(sx.uniform && sg.uniform, [&](auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if (channels_innermost(x)) dev.launch_occupied("sbn_sums_units", units, SumsUnitBody<T, kU>{args});
    else dev.launch_warps("sbn_sums_warps", detail::sbn_warp_grid(units), SumsWarpBody<T, kU>{args});
  });
  dev.launch_blocks("sbn_tree", detail::sbn_channel_grid(g.C),
                    TreeBody<SbnSums>{detail::SbnTreeArgs<SbnSums>{a, b, g, count, record}});
}

template <class T, SbnOrderFreePass P, class Dev>
void order_free(const Dev& dev, const detail::SbnPassArgs<T>& a, bool threads, bool uniform) {
  const std::int64_t units = a.g.C * a.g.K;
  using Max = typename Dev::MaxI64;
  with_bool(uniform, [&](auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if (threads) dev.launch("sbn_order_free_units", units, OrderFreeUnitBody<T, kU, P, Max>{a, Max{}});
    else dev.launch_warps("sbn_order_free_warps", detail::sbn_warp_grid(units), OrderFreeWarpBody<T, kU, P, Max>{a, Max{}});
  });
}

/// Exact mode, forward (dy absent) or backward: partial integer sums per unit, then per channel.
template <class T, class Dev>
void local_exact(const Dev& dev, bool backward, const TensorView& dy, const TensorView& x, const double* mean,
                 const std::int64_t* exponents, std::int64_t* record, Workspace ws) {
  const SbnShape g = shape_of(x);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  if (units == 0) return fill_record(dev, record, detail::sbn_record_words(g.C, true), count);
  WorkspaceLayout l = bind_pass(backward ? SbnPass::kLocalBackward : SbnPass::kLocalStats, x, true, ws, dev.op);
  detail::SbnPassArgs<T> a{};
  a.x = static_cast<const T*>(x.data);
  a.dy = backward ? static_cast<const T*>(dy.data) : nullptr;
  a.sx = src_of(x);
  a.sg = backward ? src_of(dy) : a.sx;
  a.g = g;
  a.mean = mean;
  a.exponents = exponents;
  a.partial = l.take<SbnPair128>();
  a.scales = nullptr;
  const bool threads = channels_innermost(x), uniform = a.sx.uniform && a.sg.uniform;
  if (backward) order_free<T, SbnOrderFreePass::kExactBackward>(dev, a, threads, uniform);
  else order_free<T, SbnOrderFreePass::kExactForward>(dev, a, threads, uniform);
  dev.launch_blocks("sbn_exact_reduce", detail::sbn_channel_grid(g.C),
                    ExactReduceBody{detail::SbnExactReduceArgs{a.partial, g, count, record}});
}

}  // namespace sbn_device

/// The scratch of each pass, in one fixed order (used for sizing and for carving): the default
/// mode's two [C][K] ping-pong buffers of moments (forward) or sums (backward), the exact mode's
/// [C][K] integer partials, or backward_apply's [C] coefficients.
inline WorkspaceLayout sbn_pass_layout(SbnPass pass, const TensorView& x, bool exact) {
  const detail::SbnShape g = sbn_device::shape_of(x);
  const std::int64_t units = g.C * g.K;
  WorkspaceLayout l;
  if (pass == SbnPass::kBackwardApply) {
    if (g.N * g.C * g.HW > 0) l.add<detail::SbnGradCoef>(g.C);
  } else if (units > 0) {
    if (exact) {
      l.add<detail::SbnPair128>(units);
    } else if (pass == SbnPass::kLocalStats) {
      l.add<detail::SbnMoments>(units);
      l.add<detail::SbnMoments>(units);
    } else {
      l.add<detail::SbnSums>(units);
      l.add<detail::SbnSums>(units);
    }
  }
  return l;
}

inline WorkspaceLayout sbn_device::bind_pass(SbnPass pass, const TensorView& x, bool exact, Workspace ws,
                                             const char* op) {
  WorkspaceLayout l = sbn_pass_layout(pass, x, exact);
  if (ws.bytes < l.bytes())
    fail(ErrorCode::kInvalidArgument, "{}: internal: backend scratch has {} bytes; the pass needs {}", op, ws.bytes,
         l.bytes());
  l.bind(ws.data);
  return l;
}

/// Exponents (see SyncBnBackend::local_scales) on `dev`.
template <class Dev>
void sbn_local_scales_on(const Dev& dev, const SbnLocalCall& call) {
  const TensorView& x = call.x;
  const TensorView& dy = call.dy;
  const bool backward = dy.defined();  // as the CPU backend: an empty dy may have no data
  const detail::SbnShape g = sbn_device::shape_of(x);
  const std::int64_t words = backward ? 2 * g.C : g.C;
  if (words == 0) return;
  dev.launch("sbn_fill_words", words, sbn_device::FillWordsBody{call.out, detail::kSbnZeroExponent});
  if (g.C * g.K == 0) return;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::SbnPassArgs<T> a{};
    a.x = static_cast<const T*>(x.data);
    a.dy = backward ? static_cast<const T*>(dy.data) : nullptr;
    a.sx = sbn_device::src_of(x);
    a.sg = backward ? sbn_device::src_of(dy) : a.sx;
    a.g = g;
    a.mean = call.mean;
    a.exponents = nullptr;
    a.partial = nullptr;
    a.scales = call.out;
    const bool threads = channels_innermost(x), uniform = a.sx.uniform && a.sg.uniform;
    if (backward) sbn_device::order_free<T, detail::SbnOrderFreePass::kScalesBackward>(dev, a, threads, uniform);
    else sbn_device::order_free<T, detail::SbnOrderFreePass::kScalesForward>(dev, a, threads, uniform);
  });
}

template <class Dev>
void sbn_merge_scales_on(const Dev& dev, const SbnMergeCall& a) {
  if (a.words <= 0) return;
  dev.launch("sbn_merge_scales", a.words, sbn_device::MergeScalesBody{a.gathered, a.ranks, a.words, a.scales});
}

/// This rank's forward record (call.dy absent) on `dev`; ws: sbn_pass_layout(kLocalStats) bytes.
template <class Dev>
void sbn_local_stats_on(const Dev& dev, const SbnLocalCall& a, Workspace ws) {
  dispatch_floating(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (a.exact) sbn_device::local_exact<T>(dev, false, TensorView{}, a.x, nullptr, a.scales, a.out, ws);
    else sbn_device::local_stats_default<T>(dev, a.x, a.out, ws);
  });
}

/// This rank's backward record on `dev`; ws: sbn_pass_layout(kLocalBackward) bytes.
template <class Dev>
void sbn_local_backward_on(const Dev& dev, const SbnLocalCall& a, Workspace ws) {
  dispatch_floating(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (a.exact) sbn_device::local_exact<T>(dev, true, a.dy, a.x, a.mean, a.scales, a.out, ws);
    else sbn_device::local_backward_default<T>(dev, a.dy, a.x, a.mean, a.out, ws);
  });
}

template <class Dev>
void sbn_finalize_on(const Dev& dev, const detail::SbnFinalizeArgs& args) {
  sbn_device::with_depth(args.ranks, [&](auto depth) {
    dev.launch("sbn_finalize", args.channels, sbn_device::FinalizeBody<decltype(depth)::value>{args});
  });
  if (args.num_batches_tracked && args.running_mean.data)  // after every channel has read it
    dev.launch("sbn_bump_batches", 1, sbn_device::BumpBatchesBody{args});
}

template <class Dev>
void sbn_finalize_backward_on(const Dev& dev, const detail::SbnBackwardFinalizeArgs& args) {
  // launched also for C == 0: sums[0] receives the count
  const std::int64_t n = args.channels > 0 ? args.channels : 1;
  sbn_device::with_depth(args.ranks, [&](auto depth) {
    dev.launch("sbn_finalize_backward", n, sbn_device::FinalizeBackwardBody<decltype(depth)::value>{args});
  });
}

template <class Dev>
void sbn_eval_stats_on(const Dev& dev, const SbnEvalCall& a) {
  dev.launch("sbn_eval_stats", a.channels,
             sbn_device::EvalStatsBody{a.running_mean, a.running_var, a.eps, a.save_mean, a.save_invstd});
}

template <class Dev>
void sbn_apply_on(const Dev& dev, const SbnApplyCall& a) {
  const TensorView& x = a.x;
  const TensorView& y = a.y;
  const detail::SbnShape g = sbn_device::shape_of(x);
  const std::int64_t total = g.N * g.C * g.HW;
  if (total == 0) return;
  const detail::SbnFlat flat = sbn_device::same_strides(x, y) ? sbn_device::flat_layout(x) : detail::SbnFlat::kGeneric;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::SbnApplyArgs<T> args{static_cast<const T*>(x.data), sbn_device::src_of(x), static_cast<T*>(y.data),
                                       sbn_device::src_of(y),         g,                     a.weight,
                                       a.bias,                        a.mean,                a.invstd};
    sbn_device::with_flat(flat, [&](auto l) {
      dev.launch("sbn_apply", total, sbn_device::ApplyBody<T, decltype(l)::value>{args});
    });
  });
}

/// ws: sbn_pass_layout(kBackwardApply) bytes.
template <class Dev>
void sbn_backward_apply_on(const Dev& dev, const SbnBackwardApplyCall& a, Workspace ws) {
  const TensorView& dy = a.dy;
  const TensorView& x = a.x;
  const TensorView& dx = a.dx;
  const detail::SbnShape g = sbn_device::shape_of(x);
  const std::int64_t total = g.N * g.C * g.HW;
  if (total == 0) return;
  WorkspaceLayout l = sbn_device::bind_pass(SbnPass::kBackwardApply, x, false, ws, dev.op);
  detail::SbnGradCoef* coef = l.take<detail::SbnGradCoef>();
  dev.launch("sbn_grad_coef", g.C,
             sbn_device::GradCoefBody{detail::SbnGradCoefArgs{a.weight, a.mean, a.invstd, a.sums, g.C, coef}});
  const detail::SbnFlat flat = sbn_device::same_strides(dy, x) && sbn_device::same_strides(dy, dx)
                                   ? sbn_device::flat_layout(x)
                                   : detail::SbnFlat::kGeneric;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::SbnBackwardApplyArgs<T> args{
        static_cast<const T*>(dy.data), sbn_device::src_of(dy), static_cast<const T*>(x.data), sbn_device::src_of(x),
        static_cast<T*>(dx.data),       sbn_device::src_of(dx), g,                             coef};
    sbn_device::with_flat(flat, [&](auto l) {
      dev.launch("sbn_backward_apply", total, sbn_device::BackwardApplyBody<T, decltype(l)::value>{args});
    });
  });
}

}  // namespace internal
}  // namespace detops
