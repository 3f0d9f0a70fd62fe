// CUDA backend of deform_conv2d: one-line __global__ wrappers of the per-thread bodies of
// include/detops/detail/deform_conv2d_kernels.h, launched as the steps of the sequences both
// backends share (deform_forward_steps / deform_backward_steps, internal/deform_conv2d_backend.h);
// the exact mode runs the gather engine (cuda/gather_backward.cuh) per chunk of images.
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
// Host side

/// Launches `kernel` over n threads (its last parameter) on the context's stream and checks the
/// launch; nothing for n = 0.
template <class... P, class... Args>
void launch(void (*kernel)(P...), std::int64_t n, const char* name, const DeformConv2dCall& call, const Context& ctx,
            const Args&... args) {
  if (n == 0) return;
  kernel<<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(args..., n);
  check_launch(name, call.op, ctx);
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

/// The steps of deform_forward_steps / deform_backward_steps (internal/deform_conv2d_backend.h)
/// as launches of the kernels above, in order on the caller's stream.
template <class T>
struct CudaSteps {
  using A = acc_t<T>;
  const DeformConv2dCall& call;
  const Context& ctx;
  BackwardMode mode = BackwardMode::kExact;
  GatherCudaBuffers<A> gather{};  // exact grad_input

  const DeformConv2dShape& s() const { return call.shape; }
  void widen_weight(A* w) const {
    launch(weight_kernel<T>, s().Cout * s().group_in() * s().taps(), "weight_kernel", call, ctx,
           static_cast<const T*>(call.weight.data), dc_strides(call.weight), s(), w);
  }
  void columns(const detail::DeformConv2dArgs<T>& f, std::int64_t n0, std::int64_t images, bool transposed,
               A* col) const {
    const std::int64_t Q = images * s().positions();
    launch(column_kernel<T>, s().rows() * Q, "column_kernel", call, ctx, f, n0, Q, transposed, col);
  }
  void gemm(const detail::DeformGemmArgs<A>& g) const {
    launch(gemm_kernel<A>, g.G * ((g.M + detail::kDeformGemmRows - 1) / detail::kDeformGemmRows) * g.N, "gemm_kernel",
           call, ctx, g);
  }
  void output(std::int64_t n0, std::int64_t Q, const A* acc) const {
    const T* bias = s().has_bias ? static_cast<const T*>(call.bias.data) : nullptr;
    launch(output_kernel<T>, s().Cout * Q, "output_kernel", call, ctx, acc, Q, bias,
           s().has_bias ? call.bias.strides[0] : std::int64_t{0}, s(), n0, static_cast<T*>(call.output.data),
           dc_strides(call.output));
  }
  void zero_grad_input() const { zero_fill_cuda<T>(call.grads.grad_input, ctx, call.op); }
  void zero(A* p, std::int64_t n) const {
    if (n > 0) DETOPS_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(A) * static_cast<std::size_t>(n), stream_of(ctx)), call.op);
  }
  void grad_output(std::int64_t n0, std::int64_t Q, A* go) const {
    launch(grad_output_kernel<T>, s().Cout * Q, "grad_output_kernel", call, ctx,
           static_cast<const T*>(call.grad_output.data), dc_strides(call.grad_output), s(), n0, Q, go);
  }
  void bias(const A* go, std::int64_t Q, A* sums, bool last) const {
    launch(bias_kernel<T>, s().Cout, "bias_kernel", call, ctx, go, Q, sums, last,
           static_cast<T*>(call.grads.grad_bias.data), call.grads.grad_bias.strides[0]);
  }
  void offsets(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    const DeformWants w = deform_wants(call);
    launch(offset_kernel<T>, images * s().offset_groups * s().taps() * s().positions(), "offset_kernel", call, ctx, a,
           w.offset ? static_cast<T*>(call.grads.grad_offset.data) : nullptr, dc_strides(call.grads.grad_offset),
           w.mask ? static_cast<T*>(call.grads.grad_mask.data) : nullptr, dc_strides(call.grads.grad_mask));
  }
  void input(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    const Strides4 gi = dc_strides(call.grads.grad_input);
    T* grad_input = static_cast<T*>(call.grads.grad_input.data);
    if (mode != BackwardMode::kExact) {
      launch(scatter_kernel<T>, s().rows() * a.Q, "scatter_kernel", call, ctx, a, gi, AtomicAddTo<T>{grad_input});
      return;
    }
    // the engine: records per (image, offset group, tap, position) in canonical order, CUB's
    // stable sort, then each destination's run summed in order (the run count stays on the device)
    const auto sentinel = static_cast<std::uint64_t>(deform_exact_positions(s()));
    const std::int64_t points = images * s().offset_groups * s().taps() * s().positions(), records = points * 4;
    launch(enumerate_kernel<T>, points, "enumerate_kernel", call, ctx, a, sentinel, gather.records);
    const detail::GatherSorted<A> sorted = gather_sort_cuda(gather, records, sentinel, ctx, call.op);
    const detail::GatherSumArgs<T, A, A> sa{sorted,   a.grad_col, s().taps() * a.Q, grad_input, gi.s1,
                                         s().offset_group_channels(), sentinel, detail::kGatherPartial};
    const std::int64_t max_runs = std::min<std::int64_t>(records, static_cast<std::int64_t>(sentinel) + 1);
    gather_sum_cuda(sa, gather.num_runs, max_runs, channels_innermost(call.grads.grad_input),
                    detail::DeformConv2dTarget{a.n0, s().offset_groups, s().offset_group_channels(), s().H, s().W, gi},
                    ctx, call.op);
  }
  void store_weight(const A* sums) const {
    launch(store_weight_kernel<T>, s().Cout * s().group_in() * s().taps(), "store_weight_kernel", call, ctx, sums, s(),
           static_cast<T*>(call.grads.grad_weight.data), dc_strides(call.grads.grad_weight));
  }
};

template <class T>
void forward_typed(const DeformConv2dCall& call, const Context& ctx, Workspace ws) {
  CudaSteps<T> x{call, ctx};
  deform_forward_steps<T>(call, ws, x);
}

template <class T>
void backward_typed(const DeformConv2dCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const std::size_t temp_bytes = exact_temp_bytes(call, mode);
  WorkspaceLayout layout = backward_layout<A>(call, mode, temp_bytes);
  layout.bind(ws.data);
  const DeformBackwardBuffers<A> buf = take_deform_backward<A>(layout);
  CudaSteps<T> x{call, ctx, mode};
  if (mode == BackwardMode::kExact && deform_wants(call).input) x.gather = take_gather_cuda<A>(layout, temp_bytes);
  deform_backward_steps<T>(call, buf, x);
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
