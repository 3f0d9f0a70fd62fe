// CUDA backend of SyncBatchNorm: __global__ functions that are one-line calls into the bodies of
// detops/detail/sync_batch_norm_kernels.h (which states how each kernel works and why its results
// are the CPU backend's bits), and the launch sequences. The warp- and block-level bodies are
// written against a thread group; this file's DeviceThread maps it onto the calling thread:
// butterfly = __shfl_xor_sync, sync = __syncthreads. tests/sync_batch_norm_emulated_test.cpp runs
// the same bodies over an emulated grid on the CPU.
//
// Launch sequences:
//   * default mode, local statistics: the chunk pass (a warp per (channel, chunk) unit, or a thread
//     per unit when the channel is innermost: NHWC), then a block per channel merges its [K]
//     results in the fixed tree and writes the record;
//   * exact mode: the same units accumulate 128-bit integer sums, then a block per channel adds them;
//   * exponents (local scales): the words are preset to kSbnZeroExponent, then every unit's
//     exponent goes in with an integer atomicMax;
//   * finalize: a thread per channel, compiled for a rank-tree depth chosen from the rank count
//     (sbn_rank_depth: small stack frames); the forward then bumps num_batches_tracked in a second
//     one-thread kernel on the same stream, after every channel has read it;
//   * apply and backward apply: elementwise, with flat fast paths for dense NCHW/NHWC; the
//     backward's per-channel coefficients are computed once into a [C] workspace.
// Counts and offsets are 64-bit; empty problems write their (zero) records without launching
// empty grids.
#include <cstdint>
#include <type_traits>

#include "cuda_check.cuh"
#include "detops/detail/sync_batch_norm_kernels.h"
#include "internal/sync_batch_norm_backend.h"

namespace detops {
namespace internal {

namespace {

using detail::SbnFlat;
using detail::SbnMoments;
using detail::SbnPair128;
using detail::SbnOrderFreePass;
using detail::SbnShape;
using detail::SbnSrc;
using detail::SbnSums;
using detail::sbn_i128;
using detail::sbn_u128;

constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kBlock == detail::kSbnBlock, "the bodies' block size is the launches'");

// ---------------------------------------------------------------------------------------------
// The thread group of the device: the calling thread (detail/sync_batch_norm_kernels.h); its
// shared<V, N>() is one __shared__ array per (V, N) per block.

__device__ __forceinline__ double shfl_xor(double v, int off) { return __shfl_xor_sync(kFullMask, v, off); }
__device__ __forceinline__ sbn_i128 shfl_xor(sbn_i128 v, int off) {
  const sbn_u128 u = static_cast<sbn_u128>(v);
  unsigned long long lo = static_cast<unsigned long long>(u);
  unsigned long long hi = static_cast<unsigned long long>(u >> 64);
  lo = __shfl_xor_sync(kFullMask, lo, off);
  hi = __shfl_xor_sync(kFullMask, hi, off);
  return static_cast<sbn_i128>((static_cast<sbn_u128>(hi) << 64) | static_cast<sbn_u128>(lo));
}

struct DeviceThread {
  static constexpr int kRun = 1;
  __device__ int thread(int) const { return static_cast<int>(threadIdx.x); }
  __device__ int lane(int) const { return static_cast<int>(threadIdx.x % detail::kSbnLanes); }
  __device__ std::int64_t block() const { return blockIdx.x; }
  __device__ std::int64_t blocks() const { return gridDim.x; }
  __device__ int threads() const { return static_cast<int>(blockDim.x); }
  template <class V, class Op>
  __device__ void butterfly(V* v, Op op) const {
#pragma unroll
    for (int off = detail::kSbnLanes / 2; off >= 1; off /= 2) v[0] = op(v[0], shfl_xor(v[0], off));
  }
  __device__ void sync() const { __syncthreads(); }
  template <class V, int N>
  __device__ V* shared() const {
    __shared__ V s[N];
    return s;
  }
};

/// The exponents' integer maximum (order-free).
struct AtomicMax {
  __device__ void operator()(std::int64_t* p, std::int64_t v) const {
    atomicMax(reinterpret_cast<long long*>(p), static_cast<long long>(v));
  }
};

// ---------------------------------------------------------------------------------------------
// Kernels

// The channels-innermost thread kernels hold a chunk's 32 lane sums (two sets in the backward):
// ptxas gave them 102-172 registers unbounded, one block of 256 per SM for the backward's.
// Two blocks per SM caps them at 128 registers.
template <class T, bool kUniform>
__global__ void __launch_bounds__(kBlock, 2) moments_thread_kernel(detail::SbnMomentsArgs<T> a, std::int64_t units) {
  DETOPS_GRID_STRIDE(u, units) detail::sbn_moments_unit<T, kUniform>(u, a);
}

template <class T, bool kUniform>
__global__ void moments_warp_kernel(detail::SbnMomentsArgs<T> a) {
  detail::sbn_moments_warp<T, kUniform>(a, DeviceThread{});
}

template <class T, bool kUniform>
__global__ void __launch_bounds__(kBlock, 2) sums_thread_kernel(detail::SbnSumsArgs<T> a, std::int64_t units) {
  DETOPS_GRID_STRIDE(u, units) detail::sbn_sums_unit<T, kUniform>(u, a);
}

template <class T, bool kUniform>
__global__ void sums_warp_kernel(detail::SbnSumsArgs<T> a) {
  detail::sbn_sums_warp<T, kUniform>(a, DeviceThread{});
}

template <class R>
__global__ void tree_kernel(detail::SbnTreeArgs<R> a) {
  detail::sbn_tree_block(a, DeviceThread{});
}

__global__ void fill_record_kernel(std::int64_t* rec, std::int64_t words, std::int64_t count) {
  DETOPS_GRID_STRIDE(i, words) detail::sbn_fill_record_word(i, rec, count);
}

template <class T, bool kUniform, SbnOrderFreePass P>
__global__ void order_free_thread_kernel(detail::SbnPassArgs<T> a, std::int64_t units) {
  DETOPS_GRID_STRIDE(u, units) detail::sbn_order_free_unit<T, kUniform, P>(u, a, AtomicMax{});
}

template <class T, bool kUniform, SbnOrderFreePass P>
__global__ void order_free_warp_kernel(detail::SbnPassArgs<T> a) {
  detail::sbn_order_free_warp<T, kUniform, P>(a, DeviceThread{}, AtomicMax{});
}

__global__ void exact_reduce_kernel(detail::SbnExactReduceArgs a) { detail::sbn_exact_reduce_block(a, DeviceThread{}); }

__global__ void fill_words_kernel(std::int64_t* p, std::int64_t n, std::int64_t value) {
  DETOPS_GRID_STRIDE(i, n) detail::sbn_fill_word(i, p, value);
}

__global__ void merge_scales_kernel(const std::int64_t* __restrict__ gathered, std::int64_t ranks, std::int64_t words,
                                    std::int64_t* __restrict__ scales) {
  DETOPS_GRID_STRIDE(i, words) detail::sbn_merge_scales_word(i, gathered, ranks, words, scales);
}

template <int kDepth>
__global__ void finalize_kernel(detail::SbnFinalizeArgs a) {
  DETOPS_GRID_STRIDE(c, a.channels) detail::sbn_finalize_channel<kDepth>(a, c);
}

/// Launched <<<1, 1>>> after finalize_kernel (same stream), when running statistics are tracked.
__global__ void bump_batches_kernel(detail::SbnFinalizeArgs a) {
  DETOPS_GRID_STRIDE(i, 1) detail::sbn_bump_batches(a);
}

__global__ void eval_stats_kernel(detail::SbnParam running_mean, detail::SbnParam running_var, double eps,
                                  std::int64_t channels, double* save_mean, double* save_invstd) {
  DETOPS_GRID_STRIDE(c, channels) detail::sbn_eval_channel(running_mean, running_var, eps, save_mean, save_invstd, c);
}

/// Launched over max(C, 1) threads: thread 0 also writes the count.
template <int kDepth>
__global__ void finalize_backward_kernel(detail::SbnBackwardFinalizeArgs a, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::sbn_finalize_backward_index<kDepth>(i, a);
}

template <class T, SbnFlat L>
__global__ void apply_kernel(detail::SbnApplyArgs<T> a, std::int64_t total) {
  DETOPS_GRID_STRIDE(i, total) detail::sbn_apply_element<T, L>(i, a);
}

__global__ void grad_coef_kernel(detail::SbnGradCoefArgs a) {
  DETOPS_GRID_STRIDE(c, a.C) detail::sbn_grad_coef_channel(c, a);
}

template <class T, SbnFlat L>
__global__ void backward_apply_kernel(detail::SbnBackwardApplyArgs<T> a, std::int64_t total) {
  DETOPS_GRID_STRIDE(i, total) detail::sbn_backward_apply_element<T, L>(i, a);
}

// ---------------------------------------------------------------------------------------------
// Host helpers

SbnShape shape_of(const TensorView& t) { return detail::sbn_shape(t.sizes); }
SbnSrc src_of(const TensorView& t) { return detail::sbn_src(t.sizes, t.strides); }
SbnFlat flat_layout(const TensorView& t) { return detail::sbn_flat_layout(t.sizes, t.strides); }
bool same_strides(const TensorView& a, const TensorView& b) { return detail::sbn_same_strides(a.strides, b.strides); }


/// The scratch of each pass, in one fixed order (used for sizing and for carving): the default
/// mode's two [C][K] ping-pong buffers of moments (forward) or sums (backward), the exact mode's
/// [C][K] integer partials, or backward_apply's [C] coefficients.
WorkspaceLayout pass_layout(SbnPass pass, const TensorView& x, bool exact) {
  const SbnShape g = shape_of(x);
  const std::int64_t units = g.C * g.K;
  WorkspaceLayout l;
  if (pass == SbnPass::kBackwardApply) {
    if (g.N * g.C * g.HW > 0) l.add<detail::SbnGradCoef>(g.C);
  } else if (units > 0) {
    if (exact) {
      l.add<SbnPair128>(units);
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
  const SbnShape g = shape_of(x);
  const SbnSrc sx = src_of(x);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  cudaStream_t stream = stream_of(ctx);
  if (units == 0) return fill_record(record, detail::sbn_record_words(g.C, false), count, op, ctx);
  WorkspaceLayout l = bind_pass(SbnPass::kLocalStats, x, false, ws, op);
  SbnMoments* a = l.take<SbnMoments>();
  SbnMoments* b = l.take<SbnMoments>();
  const detail::SbnMomentsArgs<T> args{static_cast<const T*>(x.data), sx, g, a};
  launch_chunks(channels_innermost(x), sx.uniform, [&](auto thr, auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if constexpr (decltype(thr)::value) {
      moments_thread_kernel<T, kU><<<grid_for(units), kBlock, 0, stream>>>(args, units);
    } else {
      moments_warp_kernel<T, kU><<<detail::sbn_warp_grid(units), kBlock, 0, stream>>>(args);
    }
  });
  check_launch("moments_kernel", op, ctx);
  tree_kernel<SbnMoments><<<detail::sbn_channel_grid(g.C), kBlock, 0, stream>>>(
      detail::SbnTreeArgs<SbnMoments>{a, b, g, count, record});
  check_launch("tree_kernel", op, ctx);
}

template <class T>
void local_backward_default(const TensorView& dy, const TensorView& x, const double* mean, std::int64_t* record,
                            Workspace ws, const char* op, const Context& ctx) {
  const SbnShape g = shape_of(x);
  const SbnSrc sx = src_of(x), sg = src_of(dy);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  cudaStream_t stream = stream_of(ctx);
  if (units == 0) return fill_record(record, detail::sbn_record_words(g.C, false), count, op, ctx);
  WorkspaceLayout l = bind_pass(SbnPass::kLocalBackward, x, false, ws, op);
  SbnSums* a = l.take<SbnSums>();
  SbnSums* b = l.take<SbnSums>();
  const detail::SbnSumsArgs<T> args{static_cast<const T*>(dy.data), sg, static_cast<const T*>(x.data), sx, mean, g, a};
  launch_chunks(channels_innermost(x), sx.uniform && sg.uniform, [&](auto thr, auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if constexpr (decltype(thr)::value) {
      sums_thread_kernel<T, kU><<<grid_for(units), kBlock, 0, stream>>>(args, units);
    } else {
      sums_warp_kernel<T, kU><<<detail::sbn_warp_grid(units), kBlock, 0, stream>>>(args);
    }
  });
  check_launch("sums_kernel", op, ctx);
  tree_kernel<SbnSums><<<detail::sbn_channel_grid(g.C), kBlock, 0, stream>>>(
      detail::SbnTreeArgs<SbnSums>{a, b, g, count, record});
  check_launch("tree_kernel", op, ctx);
}

template <class T, SbnOrderFreePass P>
void launch_order_free(const detail::SbnPassArgs<T>& a, bool threads, bool uniform, const char* op, const Context& ctx) {
  const std::int64_t units = a.g.C * a.g.K;
  cudaStream_t stream = stream_of(ctx);
  launch_chunks(threads, uniform, [&](auto thr, auto uni) {
    constexpr bool kU = decltype(uni)::value;
    if constexpr (decltype(thr)::value) {
      order_free_thread_kernel<T, kU, P><<<grid_for(units), kBlock, 0, stream>>>(a, units);
    } else {
      order_free_warp_kernel<T, kU, P><<<detail::sbn_warp_grid(units), kBlock, 0, stream>>>(a);
    }
  });
  check_launch("order_free_kernel", op, ctx);
}

/// Exact mode, forward (dy absent) or backward: partial integer sums per unit, then per channel.
template <class T>
void local_exact(bool backward, const TensorView& dy, const TensorView& x, const double* mean,
                 const std::int64_t* exponents, std::int64_t* record, Workspace ws, const char* op,
                 const Context& ctx) {
  const SbnShape g = shape_of(x);
  const std::int64_t count = g.N * g.HW, units = g.C * g.K;
  if (units == 0) return fill_record(record, detail::sbn_record_words(g.C, true), count, op, ctx);
  WorkspaceLayout l = bind_pass(backward ? SbnPass::kLocalBackward : SbnPass::kLocalStats, x, true, ws, op);
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
  if (backward) launch_order_free<T, SbnOrderFreePass::kExactBackward>(a, threads, uniform, op, ctx);
  else launch_order_free<T, SbnOrderFreePass::kExactForward>(a, threads, uniform, op, ctx);
  exact_reduce_kernel<<<detail::sbn_channel_grid(g.C), kBlock, 0, stream_of(ctx)>>>(
      detail::SbnExactReduceArgs{a.partial, g, count, record});
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
  const SbnShape g = shape_of(x);
  const std::int64_t words = backward ? 2 * g.C : g.C;
  if (words == 0) return;
  fill_words_kernel<<<grid_for(words), kBlock, 0, stream_of(ctx)>>>(scales, words, detail::kSbnZeroExponent);
  check_launch("fill_words_kernel", op, ctx);
  if (g.C * g.K == 0) return;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::SbnPassArgs<T> a{};
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
    if (backward) launch_order_free<T, SbnOrderFreePass::kScalesBackward>(a, threads, uniform, op, ctx);
    else launch_order_free<T, SbnOrderFreePass::kScalesForward>(a, threads, uniform, op, ctx);
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
    switch (detail::sbn_rank_depth(args.ranks)) {
      case 8: finalize_kernel<8><<<grid_for(args.channels), kBlock, 0, stream>>>(args); break;
      case 16: finalize_kernel<16><<<grid_for(args.channels), kBlock, 0, stream>>>(args); break;
      default: finalize_kernel<64><<<grid_for(args.channels), kBlock, 0, stream>>>(args); break;
    }
    check_launch("finalize_kernel", op, ctx);
  }
  if (args.num_batches_tracked && args.running_mean.data) {
    bump_batches_kernel<<<1, 1, 0, stream>>>(args);
    check_launch("bump_batches_kernel", op, ctx);
  }
}

void finalize_backward(const detail::SbnBackwardFinalizeArgs& args, Device device, const Context& ctx) {
  const char* op = "sync_batch_norm_finalize_backward";
  DeviceGuard guard(device.index, op);
  // launched also for C == 0: sums[0] receives the count
  const std::int64_t n = args.channels > 0 ? args.channels : 1;
  cudaStream_t stream = stream_of(ctx);
  switch (detail::sbn_rank_depth(args.ranks)) {
    case 8: finalize_backward_kernel<8><<<grid_for(n), kBlock, 0, stream>>>(args, n); break;
    case 16: finalize_backward_kernel<16><<<grid_for(n), kBlock, 0, stream>>>(args, n); break;
    default: finalize_backward_kernel<64><<<grid_for(n), kBlock, 0, stream>>>(args, n); break;
  }
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
  const SbnShape g = shape_of(x);
  const std::int64_t total = g.N * g.C * g.HW;
  if (total == 0) return;
  const SbnFlat flat = same_strides(x, y) ? flat_layout(x) : SbnFlat::kGeneric;
  cudaStream_t stream = stream_of(ctx);
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::SbnApplyArgs<T> args{static_cast<const T*>(x.data), src_of(x), static_cast<T*>(y.data), src_of(y),
                                       g, a.weight, a.bias, a.mean, a.invstd};
    switch (flat) {
      case SbnFlat::kNchw: apply_kernel<T, SbnFlat::kNchw><<<grid_for(total), kBlock, 0, stream>>>(args, total); break;
      case SbnFlat::kNhwc: apply_kernel<T, SbnFlat::kNhwc><<<grid_for(total), kBlock, 0, stream>>>(args, total); break;
      case SbnFlat::kGeneric:
        apply_kernel<T, SbnFlat::kGeneric><<<grid_for(total), kBlock, 0, stream>>>(args, total);
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
  const SbnShape g = shape_of(x);
  const std::int64_t total = g.N * g.C * g.HW;
  if (total == 0) return;
  cudaStream_t stream = stream_of(ctx);
  WorkspaceLayout l = bind_pass(SbnPass::kBackwardApply, x, false, ws, op);
  detail::SbnGradCoef* coef = l.take<detail::SbnGradCoef>();
  grad_coef_kernel<<<grid_for(g.C), kBlock, 0, stream>>>(
      detail::SbnGradCoefArgs{a.weight, a.mean, a.invstd, a.sums, g.C, coef});
  check_launch("grad_coef_kernel", op, ctx);
  const SbnFlat flat = same_strides(dy, x) && same_strides(dy, dx) ? flat_layout(x) : SbnFlat::kGeneric;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::SbnBackwardApplyArgs<T> args{static_cast<const T*>(dy.data), src_of(dy), static_cast<const T*>(x.data),
                                               src_of(x), static_cast<T*>(dx.data), src_of(dx), g, coef};
    switch (flat) {
      case SbnFlat::kNchw:
        backward_apply_kernel<T, SbnFlat::kNchw><<<grid_for(total), kBlock, 0, stream>>>(args, total);
        break;
      case SbnFlat::kNhwc:
        backward_apply_kernel<T, SbnFlat::kNhwc><<<grid_for(total), kBlock, 0, stream>>>(args, total);
        break;
      case SbnFlat::kGeneric:
        backward_apply_kernel<T, SbnFlat::kGeneric><<<grid_for(total), kBlock, 0, stream>>>(args, total);
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
