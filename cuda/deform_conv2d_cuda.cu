// CUDA backend of deform_conv2d: one-line __global__ wrappers of the per-thread bodies of
// include/detops/detail/deform_conv2d_kernels.h, and the launch sequences (the CPU backend's, step
// for step); the exact mode runs the gather engine (cuda/gather_backward.cuh) per chunk of images.
// The GEMMs are the fixed-order body (4 rows of one column per thread, k in order): the CPU's bits,
// not cuBLAS's speed. All work is enqueued on the caller's stream; nothing waits on it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "atomic_add.cuh"
#include "cuda_check.cuh"
#include "gather_backward.cuh"
#include "zero_fill.cuh"
#include "internal/deform_conv2d_backend.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

namespace {

using detail::DeformConv2dShape;
using detail::Strides4;

/// The scatter's add: an atomicAdd into grad_input.
template <class T>
struct AtomicAddTo {
  T* base;
  __device__ void operator()(std::int64_t offset, acc_t<T> v) const { atomic_add(base + offset, v); }
};

// ---------------------------------------------------------------------------------------------
// Kernels (each a one-line wrapper of a shared body)

template <class T>
__global__ void column_kernel(detail::DeformConv2dArgs<T> a, std::int64_t n0, std::int64_t Q, bool transposed,
                              acc_t<T>* col, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_column_element(t, a, n0, Q, transposed, col);
}

template <class A>
__global__ void gemm_kernel(detail::DeformGemmArgs<A> g, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_gemm_element(t, g);
}

template <class T>
__global__ void weight_kernel(const T* weight, Strides4 ws, DeformConv2dShape s, acc_t<T>* w, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_weight_element(t, weight, ws, s, w);
}

template <class T>
__global__ void store_weight_kernel(const acc_t<T>* acc, DeformConv2dShape s, T* gw, Strides4 ws, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_store_weight_element(t, acc, s, gw, ws);
}

template <class T>
__global__ void output_kernel(const acc_t<T>* acc, std::int64_t Q, const T* bias, std::int64_t bias_s,
                              DeformConv2dShape s, std::int64_t n0, T* out, Strides4 os, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_output_element(t, acc, Q, bias, bias_s, s, n0, out, os);
}

template <class T>
__global__ void grad_output_kernel(const T* grad_output, Strides4 gs, DeformConv2dShape s, std::int64_t n0,
                                   std::int64_t Q, acc_t<T>* go, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_grad_output_element(t, grad_output, gs, s, n0, Q, go);
}

template <class T>
__global__ void bias_kernel(const acc_t<T>* go, std::int64_t Q, acc_t<T>* acc, bool last, T* grad_bias,
                            std::int64_t gbs, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_bias_element(t, go, Q, acc, last, grad_bias, gbs);
}

template <class T>
__global__ void offset_kernel(detail::DeformConv2dBackwardArgs<T> a, T* grad_offset, Strides4 gos, T* grad_mask,
                              Strides4 gms, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_offset_element(t, a, grad_offset, gos, grad_mask, gms);
}

template <class T>
__global__ void scatter_kernel(detail::DeformConv2dBackwardArgs<T> a, Strides4 gi, AtomicAddTo<T> add,
                               std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_scatter_element(t, a, gi, add);
}

template <class T>
__global__ void enumerate_kernel(detail::DeformConv2dBackwardArgs<T> a, std::uint64_t sentinel,
                                 detail::GatherRecords<acc_t<T>> rec, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::deform_conv2d_enumerate_element(t, a, sentinel, rec);
}

// ---------------------------------------------------------------------------------------------
// Host helpers

template <class A>
void run_gemm(const detail::DeformGemmArgs<A>& g, const Context& ctx, const char* op) {
  const std::int64_t n = g.G * ((g.M + detail::kDeformGemmRows - 1) / detail::kDeformGemmRows) * g.N;
  if (n == 0) return;
  gemm_kernel<A><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(g, n);
  check_launch("gemm_kernel", op, ctx);
}

template <class T>
void build_columns(const detail::DeformConv2dArgs<T>& a, std::int64_t n0, std::int64_t Q, bool transposed,
                   acc_t<T>* col, const Context& ctx, const char* op) {
  const std::int64_t n = a.s.rows() * Q;
  if (n == 0) return;
  column_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(a, n0, Q, transposed, col, n);
  check_launch("column_kernel", op, ctx);
}

template <class T>
void widen_weight(const DeformConv2dCall& call, acc_t<T>* w, const Context& ctx) {
  const DeformConv2dShape& s = call.shape;
  const std::int64_t n = s.Cout * s.group_in() * s.taps();
  if (n == 0) return;
  weight_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(static_cast<const T*>(call.weight.data),
                                                               dc_strides(call.weight), s, w, n);
  check_launch("weight_kernel", call.op, ctx);
}

template <class A>
WorkspaceLayout backward_layout(const DeformConv2dCall& call, BackwardMode mode, std::size_t temp_bytes) {
  WorkspaceLayout l;
  const DeformWants w = deform_wants(call);
  add_deform_backward<A>(l, call.shape, w);
  if (mode == BackwardMode::kExact && w.input) add_gather_cuda<A>(l, deform_exact_records(call.shape), temp_bytes);
  return l;
}

std::size_t exact_temp_bytes(const DeformConv2dCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact || !deform_wants(call).input) return 0;
  return gather_cuda_temp_bytes(deform_exact_records(call.shape),
                                static_cast<std::uint64_t>(deform_exact_positions(call.shape)), call.op);
}

template <class T>
void forward_typed(const DeformConv2dCall& call, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = call.shape;
  WorkspaceLayout layout;
  add_deform_forward<A>(layout, s);
  layout.bind(ws.data);
  const DeformForwardBuffers<A> buf = take_deform_forward<A>(layout);
  const detail::DeformConv2dArgs<T> a = deform_conv2d_args<T>(call);
  widen_weight<T>(call, buf.weight, ctx);
  const T* bias = s.has_bias ? static_cast<const T*>(call.bias.data) : nullptr;
  const std::int64_t bias_s = s.has_bias ? call.bias.strides[0] : 0;
  const std::int64_t chunk = deform_chunk_images(s);
  for (std::int64_t n0 = 0; n0 < s.N; n0 += chunk) {
    const std::int64_t Q = std::min(chunk, s.N - n0) * s.positions();
    build_columns(a, n0, Q, false, buf.col, ctx, call.op);
    run_gemm(deform_forward_gemm(s, buf.weight, buf.col, buf.acc, Q), ctx, call.op);
    const std::int64_t n = s.Cout * Q;
    output_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(buf.acc, Q, bias, bias_s, s, n0,
                                                                 static_cast<T*>(call.output.data),
                                                                 dc_strides(call.output), n);
    check_launch("output_kernel", call.op, ctx);
  }
}

template <class T>
void backward_typed(const DeformConv2dCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const DeformConv2dShape& s = call.shape;
  const DeformWants w = deform_wants(call);
  cudaStream_t stream = stream_of(ctx);
  const std::size_t temp_bytes = exact_temp_bytes(call, mode);
  WorkspaceLayout layout = backward_layout<A>(call, mode, temp_bytes);
  layout.bind(ws.data);
  const DeformBackwardBuffers<A> buf = take_deform_backward<A>(layout);
  GatherCudaBuffers<A> gather{};
  if (mode == BackwardMode::kExact && w.input) gather = take_gather_cuda<A>(layout, temp_bytes);

  if (w.input) zero_fill_cuda<T>(call.grads.grad_input, ctx, call.op);
  const detail::DeformConv2dArgs<T> f = deform_conv2d_args<T>(call);
  widen_weight<T>(call, buf.weight, ctx);
  T* grad_offset = w.offset ? static_cast<T*>(call.grads.grad_offset.data) : nullptr;
  T* grad_mask = w.mask ? static_cast<T*>(call.grads.grad_mask.data) : nullptr;
  T* grad_bias = w.bias ? static_cast<T*>(call.grads.grad_bias.data) : nullptr;
  const std::int64_t gbs = w.bias ? call.grads.grad_bias.strides[0] : 0;
  const std::int64_t wsize = s.Cout * s.group_in() * s.taps();
  if (w.bias) DETOPS_CUDA_CHECK(cudaMemsetAsync(buf.bias_acc, 0, sizeof(A) * s.Cout, stream), call.op);
  if (w.weight && s.N == 0) DETOPS_CUDA_CHECK(cudaMemsetAsync(buf.weight_acc, 0, sizeof(A) * wsize, stream), call.op);
  const std::int64_t chunk = deform_chunk_images(s), P = s.positions();
  const auto sentinel = static_cast<std::uint64_t>(deform_exact_positions(s));
  for (std::int64_t n0 = 0; n0 < s.N; n0 += chunk) {
    const std::int64_t images = std::min(chunk, s.N - n0), Q = images * P;
    const bool last = n0 + images >= s.N;
    const std::int64_t ngo = s.Cout * Q;
    if (ngo > 0) {
      grad_output_kernel<T><<<grid_for(ngo), kBlock, 0, stream>>>(static_cast<const T*>(call.grad_output.data),
                                                                  dc_strides(call.grad_output), s, n0, Q, buf.go, ngo);
      check_launch("grad_output_kernel", call.op, ctx);
    }
    if (w.bias) {
      bias_kernel<T><<<grid_for(s.Cout), kBlock, 0, stream>>>(buf.go, Q, buf.bias_acc, last, grad_bias, gbs, s.Cout);
      check_launch("bias_kernel", call.op, ctx);
    }
    if (w.weight) {
      build_columns(f, n0, Q, true, buf.col_t, ctx, call.op);
      run_gemm(deform_grad_weight_gemm(s, buf.go, buf.col_t, buf.weight_acc, Q, n0 > 0), ctx, call.op);
    }
    if (!w.columns()) continue;
    run_gemm(deform_grad_col_gemm(s, buf.weight, buf.go, buf.grad_col, Q), ctx, call.op);
    const detail::DeformConv2dBackwardArgs<T> a{f, buf.grad_col, n0, Q};
    const std::int64_t points = images * s.offset_groups * s.taps() * P;
    if (w.offset || w.mask) {
      offset_kernel<T><<<grid_for(points), kBlock, 0, stream>>>(a, grad_offset, dc_strides(call.grads.grad_offset),
                                                                grad_mask, dc_strides(call.grads.grad_mask), points);
      check_launch("offset_kernel", call.op, ctx);
    }
    if (!w.input) continue;
    const Strides4 gi = dc_strides(call.grads.grad_input);
    if (mode == BackwardMode::kExact) {
      enumerate_kernel<T><<<grid_for(points), kBlock, 0, stream>>>(a, sentinel, gather.records, points);
      check_launch("enumerate_kernel", call.op, ctx);
      const std::int64_t records = points * 4;
      const detail::GatherSorted<A> sorted = gather_sort_cuda(gather, records, sentinel, ctx, call.op);
      const detail::GatherSumArgs<T, A, A> sa{sorted, buf.grad_col, s.taps() * Q, static_cast<T*>(call.grads.grad_input.data),
                                           gi.s1,  s.offset_group_channels(), sentinel, detail::kGatherPartial};
      const std::int64_t max_runs = std::min<std::int64_t>(records, static_cast<std::int64_t>(sentinel) + 1);
      gather_sum_cuda(sa, gather.num_runs, max_runs, channels_innermost(call.grads.grad_input),
                      detail::DeformConv2dTarget{n0, s.offset_groups, s.offset_group_channels(), s.H, s.W, gi}, ctx,
                      call.op);
    } else {
      const std::int64_t n = s.rows() * Q;
      scatter_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(
          a, gi, AtomicAddTo<T>{static_cast<T*>(call.grads.grad_input.data)}, n);
      check_launch("scatter_kernel", call.op, ctx);
    }
  }
  if (w.weight) {
    store_weight_kernel<T><<<grid_for(wsize), kBlock, 0, stream>>>(
        buf.weight_acc, s, static_cast<T*>(call.grads.grad_weight.data), dc_strides(call.grads.grad_weight), wsize);
    check_launch("store_weight_kernel", call.op, ctx);
  }
  if (w.bias && s.N == 0) {  // no chunk stored it: the sums of nothing
    bias_kernel<T><<<grid_for(s.Cout), kBlock, 0, stream>>>(buf.go, 0, buf.bias_acc, true, grad_bias, gbs, s.Cout);
    check_launch("bias_kernel", call.op, ctx);
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points (the table kDeformConv2dCuda at the bottom)

void forward(const DeformConv2dCall& call, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.input.device.index, call.op);
  dispatch_floating(call.input.dtype, [&](auto tag) { forward_typed<decltype(tag)>(call, ctx, ws); });
}

std::size_t backward_workspace(const DeformConv2dCall& call, BackwardMode mode) {
  DeviceGuard guard(call.input.device.index, call.op);  // CUB's temporary sizes depend on the device
  const std::size_t temp_bytes = exact_temp_bytes(call, mode);
  return dispatch_floating(call.input.dtype, [&](auto tag) {
    return backward_layout<acc_t<decltype(tag)>>(call, mode, temp_bytes).bytes();
  });
}

void backward(const DeformConv2dCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.input.device.index, call.op);
  dispatch_floating(call.input.dtype, [&](auto tag) { backward_typed<decltype(tag)>(call, mode, ctx, ws); });
}

}  // namespace

extern const DeformConv2dBackend kDeformConv2dCuda = {&forward, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
