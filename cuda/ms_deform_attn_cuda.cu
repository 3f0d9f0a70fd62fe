// CUDA backend of multi-scale deformable attention: one-line __global__ wrappers around the
// per-thread bodies of include/detops/detail/ms_deform_attn_kernels.h, and for the exact mode the
// gather-backward engine's phases (cuda/gather_backward.cuh) over chunks of (b, m) planes. All
// work is enqueued on the caller's stream; the level table goes to the device in a small buffer
// of the call's own.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "atomic_add.cuh"
#include "cuda_check.cuh"
#include "gather_backward.cuh"
#include "internal/ms_deform_attn_backend.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

namespace {

// ---------------------------------------------------------------------------------------------
// Kernels (each a one-line wrapper of a shared body)

template <class T, class Loc>
__global__ void forward_kernel(detail::MsdaForwardArgs<T, Loc> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::msda_forward_element(i, a);
}

template <class T>
__global__ void zero_value_kernel(T* p, detail::MsdaShape sh, std::int64_t s0, std::int64_t s1, std::int64_t s2,
                                  std::int64_t s3, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::msda_zero_value_element(i, p, s0, s1, s2, s3, sh);
}

template <class T, class Loc>
__global__ void scatter_kernel(detail::MsdaBackwardArgs<T, Loc> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) {
    detail::msda_value_scatter_element(i, a, [&a](std::int64_t off, acc_t<T> v) { atomic_add(a.grad_value + off, v); });
  }
}

template <class T, class Loc>
__global__ void location_grad_kernel(detail::MsdaBackwardArgs<T, Loc> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::msda_location_grad_element(i, a);
}

template <class T, class Loc>
__global__ void records_kernel(detail::MsdaBackwardArgs<T, Loc> a, std::int64_t plane0, std::uint64_t sentinel,
                               detail::GatherRecords<acc_t<T>> rec, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::msda_exact_records_element(t, a, plane0, sentinel, rec);
}

// ---------------------------------------------------------------------------------------------
// Host helpers

/// The level table on the device, from the checked host copy (pageable memory: the copy is
/// staged before cudaMemcpyAsync returns, so the host vector may go).
class DeviceLevels {
 public:
  DeviceLevels(const MsdaCall& call, const Context& ctx)
      : scratch_(call.op, bytes(call), call.value.device, ctx) {
    if (call.levels.empty()) return;
    DETOPS_CUDA_CHECK(cudaMemcpyAsync(scratch_.data(), call.levels.data(), call.levels.size() * sizeof(detail::MsdaLevel),
                                      cudaMemcpyHostToDevice, stream_of(ctx)),
                      call.op);
  }
  const detail::MsdaLevel* data() const { return static_cast<const detail::MsdaLevel*>(scratch_.data()); }

 private:
  static std::size_t bytes(const MsdaCall& call) { return call.levels.size() * sizeof(detail::MsdaLevel); }
  Scratch scratch_;
};

/// Copies the bytes of a small int64 tensor (on the device or the host) into `span`, indexed by
/// its strides; a device copy is enqueued on the stream (the caller waits once for all).
void enqueue_read(const TensorView& v, std::vector<std::int64_t>& span, const Context& ctx, const char* op) {
  const std::int64_t bytes = v.numel() == 0 ? 0 : v.span_bytes();
  span.resize(static_cast<std::size_t>(bytes / 8));
  if (bytes == 0) return;
  if (v.device.is_cpu()) {
    std::memcpy(span.data(), v.data, static_cast<std::size_t>(bytes));
    return;
  }
  DETOPS_CUDA_CHECK(cudaMemcpyAsync(span.data(), v.data, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost,
                                    stream_of(ctx)),
                    op);
}

void read_levels(const MsdaCall& call, std::int64_t* shapes, std::int64_t* starts, const Context& ctx) {
  DeviceGuard guard(call.value.device.index, call.op);
  const std::int64_t L = call.shape.L;
  std::vector<std::int64_t> ss, ls;
  enqueue_read(call.spatial_shapes, ss, ctx, call.op);
  enqueue_read(call.level_start_index, ls, ctx, call.op);
  DETOPS_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)), call.op);  // the one documented wait
  for (std::int64_t l = 0; l < L; ++l) {
    shapes[2 * l] = ss[static_cast<std::size_t>(l * call.spatial_shapes.strides[0])];
    shapes[2 * l + 1] = ss[static_cast<std::size_t>(l * call.spatial_shapes.strides[0] + call.spatial_shapes.strides[1])];
    starts[l] = ls[static_cast<std::size_t>(l * call.level_start_index.strides[0])];
  }
}

void forward(const MsdaCall& call, const Context& ctx) {
  DeviceGuard guard(call.value.device.index, call.op);
  const DeviceLevels levels(call, ctx);
  dispatch_msda(call.value.dtype, call.sampling_locations.dtype, [&](auto t, auto loc) {
    using T = decltype(t);
    using Loc = decltype(loc);
    detail::MsdaForwardArgs<T, Loc> a{};
    a.in = msda_inputs<T, Loc>(call, levels.data());
    a.out = static_cast<T*>(call.output.data);
    copy_strides(call.output, a.os);
    const std::int64_t n = call.output.numel();
    forward_kernel<T, Loc><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(a, n);
    check_launch("forward_kernel", call.op, ctx);
  });
}

/// The exact mode's records per chunk (see msda_chunk_planes).
std::int64_t chunk_records(const MsdaCall& call) { return msda_chunk_planes(call.shape) * msda_plane_records(call.shape); }
std::uint64_t chunk_sentinel(const MsdaCall& call) {
  return static_cast<std::uint64_t>(msda_chunk_planes(call.shape) * call.shape.S);
}

template <class A>
WorkspaceLayout exact_layout(const MsdaCall& call, std::size_t temp_bytes) {
  WorkspaceLayout l;
  add_gather_cuda<A>(l, chunk_records(call), temp_bytes);
  return l;
}

template <class T, class Loc>
void exact_value(const MsdaCall& call, const detail::MsdaBackwardArgs<T, Loc>& a, const Context& ctx, Workspace ws) {
  using A = acc_t<T>;
  const detail::MsdaShape& sh = call.shape;
  const char* op = call.op;
  const std::size_t temp_bytes = gather_cuda_temp_bytes(chunk_records(call), chunk_sentinel(call), op);
  WorkspaceLayout layout = exact_layout<A>(call, temp_bytes);
  if (layout.bytes() > ws.bytes)
    fail(ErrorCode::kInvalidArgument, "{}: workspace has {} bytes; the exact mode needs {} here", op, ws.bytes,
         layout.bytes());
  layout.bind(ws.data);
  const GatherCudaBuffers<A> buf = take_gather_cuda<A>(layout, temp_bytes);
  const std::int64_t chunk = msda_chunk_planes(sh), per_plane = msda_plane_records(sh) / detail::kMsdaCorners;
  const bool channels_fastest = call.grad_value.strides[3] == 1;
  for (std::int64_t plane0 = 0; plane0 < sh.B * sh.M; plane0 += chunk) {
    const std::int64_t planes = std::min(chunk, sh.B * sh.M - plane0);
    const std::int64_t samples = planes * per_plane, n = samples * detail::kMsdaCorners;
    const std::uint64_t sentinel = static_cast<std::uint64_t>(planes * sh.S);
    records_kernel<T, Loc><<<grid_for(samples), kBlock, 0, stream_of(ctx)>>>(a, plane0, sentinel, buf.records, samples);
    check_launch("records_kernel", op, ctx);
    const detail::GatherSorted<A> sorted = gather_sort_cuda(buf, n, sentinel, ctx, op);
    const detail::GatherSumArgs<T, A> sum{sorted, a.grad_out, a.gos[2], a.grad_value, a.gvs[3], sh.D, sentinel,
                                          detail::kGatherPartial};
    gather_sum_cuda(sum, buf.num_runs, std::min<std::int64_t>(n, planes * sh.S + 1), channels_fastest,
                    msda_value_target(call, plane0), ctx, op);
  }
}

std::size_t backward_workspace(const MsdaCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  DeviceGuard guard(call.value.device.index, call.op);  // CUB's temp sizes depend on the device
  const std::size_t temp_bytes = gather_cuda_temp_bytes(chunk_records(call), chunk_sentinel(call), call.op);
  return call.value.dtype == DType::kFloat64 ? exact_layout<double>(call, temp_bytes).bytes()
                                              : exact_layout<float>(call, temp_bytes).bytes();
}

void backward(const MsdaCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.value.device.index, call.op);
  const DeviceLevels levels(call, ctx);
  cudaStream_t stream = stream_of(ctx);
  const detail::MsdaShape& sh = call.shape;
  dispatch_msda(call.value.dtype, call.sampling_locations.dtype, [&](auto t, auto loc) {
    using T = decltype(t);
    using Loc = decltype(loc);
    const detail::MsdaBackwardArgs<T, Loc> a = msda_backward_args<T, Loc>(call, levels.data());
    const std::int64_t samples = sh.B * sh.Q * sh.M * sh.L * sh.P;
    if ((a.grad_loc || a.grad_attn) && samples > 0) {
      location_grad_kernel<T, Loc><<<grid_for(samples), kBlock, 0, stream>>>(a, samples);
      check_launch("location_grad_kernel", call.op, ctx);
    }
    const std::int64_t n = call.grad_value.defined() ? call.grad_value.numel() : 0;
    if (n == 0) return;
    const std::int64_t* st = call.grad_value.strides;
    zero_value_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(a.grad_value, sh, st[0], st[1], st[2], st[3], n);
    check_launch("zero_value_kernel", call.op, ctx);
    if (!msda_has_samples(sh)) return;
    if (mode == BackwardMode::kExact) {
      exact_value(call, a, ctx, ws);
    } else {
      const std::int64_t threads = sh.B * sh.Q * sh.M * sh.D;
      scatter_kernel<T, Loc><<<grid_for(threads), kBlock, 0, stream>>>(a, threads);
      check_launch("scatter_kernel", call.op, ctx);
    }
  });
}

}  // namespace

extern const MsdaBackend kMsDeformAttnCuda = {read_levels, forward, backward_workspace, backward};

}  // namespace internal
}  // namespace detops
