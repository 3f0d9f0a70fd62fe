// grid_sample's CUDA steps, written once over the device interface (internal/device_steps.h):
// the forward, the backward's zero fill, its atomic scatter or exact mode (the gather engine per
// chunk of images) and grad_grid, as launches of the per-thread bodies of
// include/detops/detail/grid_sample_kernels.h. cuda/grid_sample_cuda.cu runs them on CudaDevice;
// tests/grid_sample_emulated_test.cpp runs the very same code on the emulated device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "detops/detail/gather_backward.h"
#include "detops/detail/grid_sample_kernels.h"
#include "internal/device_steps.h"
#include "internal/grid_sample_backend.h"

namespace detops {
namespace internal {
namespace grid_sample_device {

template <class T>
struct ForwardBody {
  detail::GridSampleForwardArgs<T> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const { detail::grid_sample_forward_element(t, a); }
};

template <class T, class Add>
struct ScatterBody {
  detail::GridSampleBackwardArgs<T> a;
  Add add;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const { detail::grid_sample_scatter_element(t, a, add); }
};

template <class T>
struct GradGridBody {
  detail::GridSampleBackwardArgs<T> a;
  void* grad_grid;
  DType dtype;
  detail::GridSampleStrides gg;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::grid_sample_grad_grid_element(t, a, grad_grid, dtype, gg);
  }
};

template <class T>
struct EnumerateBody {
  detail::GridSampleBackwardArgs<T> a;
  std::int64_t n0;
  detail::GatherKey sentinel;
  detail::GatherRecords<acc_t<T>> rec;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::grid_sample_enumerate_element(t, a, n0, sentinel, rec);
  }
};

/// The exact mode's chunk: images per chunk, its records and its positions (the sentinel).
struct ExactChunk {
  std::int64_t images, records, positions;
};
inline ExactChunk exact_chunk(const detail::GridSampleShape& s) {
  const std::int64_t images = grid_sample_chunk_images(s);
  return {images, images * grid_sample_image_records(s), images * s.H * s.W};
}

template <class Dev>
std::size_t exact_temp_bytes(const Dev& dev, const GridSampleCall& call) {
  const ExactChunk ch = exact_chunk(call.shape);
  return gather_temp_bytes(dev, ch.records, ch.positions);
}

template <class A>
WorkspaceLayout exact_layout(const GridSampleCall& call, std::size_t temp_bytes) {
  WorkspaceLayout l;
  add_gather<A>(l, exact_chunk(call.shape).records, temp_bytes);
  return l;
}

/// Exact mode: per chunk of images, phase 1 (every record slot written), the engine's sort and
/// its fixed-order sums into grad_input (zeroed before).
template <class T, class Dev>
void exact_backward(const Dev& dev, const GridSampleCall& call, Workspace ws) {
  using A = acc_t<T>;
  const detail::GridSampleShape& s = call.shape;
  const detail::GridSampleBackwardArgs<T> a = grid_sample_backward_args<T>(call, false);
  const ExactChunk ch = exact_chunk(s);
  const std::size_t temp_bytes = exact_temp_bytes(dev, call);
  WorkspaceLayout layout = exact_layout<A>(call, temp_bytes);
  layout.bind(ws.data);
  const GatherDeviceBuffers<A> b = take_gather<A>(layout, temp_bytes);
  const auto sentinel = static_cast<detail::GatherKey>(ch.positions);
  const bool channels_fastest = channels_innermost(call.grad_input);
  for (std::int64_t n0 = 0; n0 < s.N; n0 += ch.images) {
    const std::int64_t points = std::min(ch.images, s.N - n0) * s.Ho * s.Wo;
    const std::int64_t records = points * detail::grid_sample_records_per_point(s);
    dev.launch("grid_sample_enumerate", points, EnumerateBody<T>{a, n0, sentinel, b.records});
    const detail::GatherSorted<A> sorted = gather_sort(dev, b, records, sentinel);
    const detail::GatherSumArgs<T, A> sa{sorted, a.grad_output, a.go.s1, static_cast<T*>(call.grad_input.data),
                                         a.gi.s1, s.C, sentinel, detail::kGatherPartial};
    // at most one run per record and per destination, plus the sentinel's
    const std::int64_t max_runs = std::min(records, ch.positions + 1);
    gather_sum(dev, sa, b.num_runs, max_runs, channels_fastest, detail::GridSampleTarget{n0, s.H, s.W, a.gi});
  }
}

}  // namespace grid_sample_device

/// The forward on `dev` into call.output (thread order follows the output's memory order).
template <class T, class Dev>
void grid_sample_forward_on(const Dev& dev, const GridSampleCall& call) {
  detail::GridSampleForwardArgs<T> a{};
  a.g = grid_sample_args<T>(call);
  a.output = static_cast<T*>(call.output.data);
  a.out = gs_strides(call.output);
  a.channels_last = channels_innermost(call.output);
  dev.launch("grid_sample_forward", call.output.numel(), grid_sample_device::ForwardBody<T>{a});
}

/// Bytes of the backward's workspace on `dev` for `mode` (the exact mode's engine; 0 otherwise).
template <class Dev>
std::size_t grid_sample_backward_workspace_on(const Dev& dev, const GridSampleCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  const std::size_t temp_bytes = grid_sample_device::exact_temp_bytes(dev, call);
  return dispatch_floating(call.input.dtype, [&](auto tag) {
    return grid_sample_device::exact_layout<acc_t<decltype(tag)>>(call, temp_bytes).bytes();
  });
}

/// The backward on `dev` into call.grad_input and call.grad_grid (either may be absent).
template <class T, class Dev>
void grid_sample_backward_on(const Dev& dev, const GridSampleCall& call, BackwardMode mode, Workspace ws) {
  const detail::GridSampleShape& s = call.shape;
  if (call.grad_input.defined() && call.grad_input.numel() > 0) {
    zero_fill<T>(dev, call.grad_input);
    const std::int64_t n = call.grad_output.numel();
    if (n > 0 && mode == BackwardMode::kExact) {
      grid_sample_device::exact_backward<T>(dev, call, ws);
    } else if (n > 0) {
      using Add = typename Dev::template Add<T>;
      dev.launch("grid_sample_scatter", n,
                 grid_sample_device::ScatterBody<T, Add>{
                     grid_sample_backward_args<T>(call, channels_innermost(call.grad_output)),
                     Add{static_cast<T*>(call.grad_input.data)}});
    }
  }
  if (call.grad_grid.defined() && call.grad_grid.numel() > 0) {
    dev.launch("grid_sample_grad_grid", s.N * s.Ho * s.Wo,
               grid_sample_device::GradGridBody<T>{grid_sample_backward_args<T>(call, false), call.grad_grid.data,
                                                   call.grad_grid.dtype, gs_strides(call.grad_grid)});
  }
}

}  // namespace internal
}  // namespace detops
