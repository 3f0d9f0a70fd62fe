// CUDA backend of grid_sample: one-line __global__ wrappers of the per-thread bodies of
// include/detops/detail/grid_sample_kernels.h, and the launch sequences; the exact mode runs the
// gather engine (cuda/gather_backward.cuh) per chunk of images. All work is enqueued on the
// caller's stream; nothing waits on it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "atomic_add.cuh"
#include "cuda_check.cuh"
#include "gather_backward.cuh"
#include "zero_fill.cuh"
#include "internal/grid_sample_backend.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

namespace {

using detail::GridSampleStrides;


/// The scatter's add: an atomicAdd into grad_input.
template <class T>
struct AtomicAddTo {
  T* base;
  __device__ void operator()(std::int64_t offset, acc_t<T> v) const { atomic_add(base + offset, v); }
};

// ---------------------------------------------------------------------------------------------
// Kernels (each a one-line wrapper of a shared body)

template <class T>
__global__ void forward_kernel(detail::GridSampleForwardArgs<T> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::grid_sample_forward_element(t, a);
}

template <class T>
__global__ void scatter_kernel(detail::GridSampleBackwardArgs<T> a, std::int64_t n, AtomicAddTo<T> add) {
  DETOPS_GRID_STRIDE(t, n) detail::grid_sample_scatter_element(t, a, add);
}

template <class T>
__global__ void grad_grid_kernel(detail::GridSampleBackwardArgs<T> a, std::int64_t n, void* grad_grid, DType dtype,
                                 GridSampleStrides gg) {
  DETOPS_GRID_STRIDE(t, n) detail::grid_sample_grad_grid_element(t, a, grad_grid, dtype, gg);
}

template <class T>
__global__ void enumerate_kernel(detail::GridSampleBackwardArgs<T> a, std::int64_t n0, std::uint64_t sentinel,
                                 detail::GatherRecords<acc_t<T>> rec, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::grid_sample_enumerate_element(t, a, n0, sentinel, rec);
}

// ---------------------------------------------------------------------------------------------
// Host helpers

/// The exact mode's chunk: images per chunk, its records and its positions (the sentinel).
struct ExactChunk {
  std::int64_t images, records, positions;
};
ExactChunk exact_chunk(const detail::GridSampleShape& s) {
  const std::int64_t images = grid_sample_chunk_images(s);
  return {images, images * grid_sample_image_records(s), images * s.H * s.W};
}

std::size_t exact_temp_bytes(const GridSampleCall& call) {
  const ExactChunk ch = exact_chunk(call.shape);
  return gather_cuda_temp_bytes(ch.records, static_cast<std::uint64_t>(ch.positions), call.op);
}

template <class A>
WorkspaceLayout exact_layout(const GridSampleCall& call, std::size_t temp_bytes) {
  WorkspaceLayout l;
  add_gather_cuda<A>(l, exact_chunk(call.shape).records, temp_bytes);
  return l;
}

/// Exact mode: per chunk of images, phase 1 (enumerate_kernel: every record slot written), the
/// engine's sort and its fixed-order sums into grad_input (zeroed first).
template <class T>
void exact_backward(const GridSampleCall& call, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const detail::GridSampleShape& s = call.shape;
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const ExactChunk ch = exact_chunk(s);
  const std::size_t temp_bytes = exact_temp_bytes(call);
  WorkspaceLayout layout = exact_layout<A>(call, temp_bytes);
  layout.bind(ws.data);
  const GatherCudaBuffers<A> b = take_gather_cuda<A>(layout, temp_bytes);
  const auto sentinel = static_cast<std::uint64_t>(ch.positions);
  const bool channels_fastest = channels_innermost(call.grad_input);
  for (std::int64_t n0 = 0; n0 < s.N; n0 += ch.images) {
    const std::int64_t points = std::min(ch.images, s.N - n0) * s.Ho * s.Wo;
    const std::int64_t records = points * detail::grid_sample_records_per_point(s);
    enumerate_kernel<T><<<grid_for(points), kBlock, 0, stream_of(ctx)>>>(a, n0, sentinel, b.records, points);
    check_launch("enumerate_kernel", call.op, ctx);
    const detail::GatherSorted<A> sorted = gather_sort_cuda(b, records, sentinel, ctx, call.op);
    const detail::GatherSumArgs<T, A> sa{sorted,     a.grad_output, a.go.s1, static_cast<T*>(call.grad_input.data),
                                         a.gi.s1,    s.C,           sentinel, detail::kGatherPartial};
    // at most one run per record and per destination, plus the sentinel's
    const std::int64_t max_runs = std::min(records, ch.positions + 1);
    gather_sum_cuda(sa, b.num_runs, max_runs, channels_fastest,
                    detail::GridSampleTarget{n0, s.H, s.W, a.gi}, ctx, call.op);
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points (the table kGridSampleCuda at the bottom)

void forward(const GridSampleCall& call, const Context& ctx) {
  DeviceGuard guard(call.input.device.index, call.op);
  dispatch_floating(call.input.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::GridSampleForwardArgs<T> a{};
    a.g = grid_sample_args<T>(call);
    a.output = static_cast<T*>(call.output.data);
    a.out = gs_strides(call.output);
    a.channels_last = channels_innermost(call.output);
    const std::int64_t n = call.output.numel();
    forward_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(a, n);
    check_launch("forward_kernel", call.op, ctx);
  });
}

std::size_t backward_workspace(const GridSampleCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  DeviceGuard guard(call.input.device.index, call.op);  // CUB's temporary sizes depend on the device
  const std::size_t temp_bytes = exact_temp_bytes(call);
  return dispatch_floating(call.input.dtype,
                           [&](auto tag) { return exact_layout<acc_t<decltype(tag)>>(call, temp_bytes).bytes(); });
}

void backward(const GridSampleCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.input.device.index, call.op);
  dispatch_floating(call.input.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::GridSampleShape& s = call.shape;
    if (call.grad_input.defined() && call.grad_input.numel() > 0) {
      zero_fill_cuda<T>(call.grad_input, ctx, call.op);
      const std::int64_t n = call.grad_output.numel();
      if (n > 0 && mode == BackwardMode::kExact) {
        exact_backward<T>(call, ctx, ws);
      } else if (n > 0) {
        const auto a = grid_sample_backward_args<T>(call, channels_innermost(call.grad_output));
        scatter_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(
            a, n, AtomicAddTo<T>{static_cast<T*>(call.grad_input.data)});
        check_launch("scatter_kernel", call.op, ctx);
      }
    }
    if (call.grad_grid.defined() && call.grad_grid.numel() > 0) {
      const std::int64_t points = s.N * s.Ho * s.Wo;
      grad_grid_kernel<T><<<grid_for(points), kBlock, 0, stream_of(ctx)>>>(
          grid_sample_backward_args<T>(call, false), points, call.grad_grid.data, call.grad_grid.dtype,
          gs_strides(call.grad_grid));
      check_launch("grad_grid_kernel", call.op, ctx);
    }
  });
}

}  // namespace

extern const GridSampleBackend kGridSampleCuda = {&forward, &backward_workspace, &backward};

}  // namespace internal
}  // namespace detops
