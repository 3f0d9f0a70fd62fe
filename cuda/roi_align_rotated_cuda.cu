// CUDA backend of RoIAlignRotated: one-line __global__ wrappers around the per-thread bodies of
// include/detops/detail/roi_align_rotated_kernels.h, and the launch sequences: atomic adds as
// RoIAlign's, the truncated mode's double accumulator, and the gather-backward engine
// (cuda/gather_backward.cuh) for the exact mode and the float64 truncated mode. All work is
// enqueued on the caller's stream.
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "atomic_add.cuh"
#include "cuda_check.cuh"
#include "detops/detail/roi_align_rotated_kernels.h"
#include "gather_backward.cuh"
#include "internal/roi_align_rotated_backend.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

namespace {

using detail::Strides4;
using Shape = detail::RoiAlignRotatedShape;

// ---------------------------------------------------------------------------------------------
// Kernels (each a one-line wrapper of a shared body)

template <class T>
__global__ void rotated_forward_kernel(detail::RotatedForwardArgs<T> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::roi_align_rotated_forward_element(i, a);
}

template <class T, class V, class Target>
__global__ void rotated_scatter_kernel(detail::RotatedBackwardArgs<T> a, std::int64_t n, Target* target,
                                       detail::GradRounding rounding) {
  DETOPS_GRID_STRIDE(i, n) {
    detail::roi_align_rotated_backward_scatter_element<T, V>(
        i, a, rounding, [target](std::int64_t off, V v) { atomic_add(target + off, v); });
  }
}

template <class A>
__global__ void rotated_check_kernel(detail::RoiSource rois, Shape s, unsigned long long* first_bad,
                                     std::int64_t* counts) {
  DETOPS_GRID_STRIDE(k, s.K) {
    detail::roi_align_rotated_check_element<A>(k, rois, s, counts, [first_bad](std::int64_t bad) {
      atomicMin(first_bad, static_cast<unsigned long long>(bad));  // integer min: order-independent
    });
  }
}

template <class A>
__global__ void rotated_count_kernel(detail::RoiSource rois, Shape s, std::int64_t* counts) {
  DETOPS_GRID_STRIDE(k, s.K + 1) detail::roi_align_rotated_count_element<A>(k, rois, s, counts);
}

template <class A>
__global__ void rotated_enumerate_kernel(detail::RotatedEnumerateArgs<A> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::roi_align_rotated_enumerate_bin(t, a);
}

__global__ void rotated_permute_divisor_kernel(const std::int64_t* sorted_ids, const double* divisors,
                                               double* sorted_divisors, std::int64_t n) {
  DETOPS_GRID_STRIDE(r, n) detail::roi_align_rotated_permute_divisor(r, sorted_ids, divisors, sorted_divisors);
}

__global__ void rotated_truncated_gather_kernel(detail::RotatedTruncatedArgs a, const std::int64_t* num_runs,
                                                bool channels_last) {
  DETOPS_GRID_STRIDE(t, *num_runs * a.sum.C) detail::roi_align_rotated_truncated_gather_element(t, a, channels_last, *num_runs);
}

template <class T>
__global__ void rotated_fill_zero_kernel(T* p, Strides4 st, std::int64_t C, std::int64_t H, std::int64_t W,
                                         std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::fill_zero_element(i, p, st, C, H, W);
}

template <class T>
__global__ void rotated_cast_kernel(const double* buf, T* p, Strides4 st, std::int64_t C, std::int64_t H,
                                    std::int64_t W, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::roi_align_truncated_store_element(i, buf, p, st, C, H, W);
}

// ---------------------------------------------------------------------------------------------
// Host helpers

bool is_dense(const TensorView& v) {
  return v.span_bytes() == v.numel() * static_cast<std::int64_t>(dtype_size(v.dtype));
}

template <class T>
void zero_fill(const TensorView& v, const Context& ctx, const char* op) {
  const std::int64_t n = v.numel();
  if (n == 0) return;
  if (is_dense(v)) {
    DETOPS_CUDA_CHECK(cudaMemsetAsync(v.data, 0, static_cast<std::size_t>(n) * sizeof(T), stream_of(ctx)), op);
    return;
  }
  rotated_fill_zero_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(static_cast<T*>(v.data), strides4(v),
                                                                           v.sizes[1], v.sizes[2], v.sizes[3], n);
  check_launch("rotated_fill_zero_kernel", op, ctx);
}

std::uint64_t sentinel_of(const Shape& s) { return static_cast<std::uint64_t>(s.N * s.H * s.W); }

/// CUB's temporary bytes: the engine's phase 2, and the scan of the per-roi counts.
std::size_t cub_temp_bytes(const Shape& s, std::int64_t cap, const char* op) {
  std::size_t scan_rois = 0;
  DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_rois, static_cast<const std::int64_t*>(nullptr),
                                                  static_cast<std::int64_t*>(nullptr), s.K + 1),
                    op);
  return std::max(gather_cuda_temp_bytes(cap, sentinel_of(s), op), scan_rois);
}

/// The engine's arrays, the per-roi counts and offsets, and (float64 truncated) the divisors
/// unsorted and sorted, in one fixed order for sizing and carving.
template <class A>
WorkspaceLayout exact_device_layout(const Shape& s, std::int64_t cap, std::size_t temp_bytes, bool with_divisors) {
  WorkspaceLayout l;
  add_gather_cuda<A>(l, cap, temp_bytes);
  l.add<std::int64_t>(s.K + 1);
  l.add<std::int64_t>(s.K + 1);
  l.add<double>(with_divisors ? cap : 0);
  l.add<double>(with_divisors ? cap : 0);
  return l;
}

/// The exact mode; with `rounding` (float64 only) the truncated mode, which runs the same phases
/// with divisors and sums the scatter's contributions in the CPU's order.
template <class T>
void exact_backward(const RoiAlignRotatedCall& call, const RotatedRoiCheck& check, const Context& ctx, Workspace ws,
                    detail::GradRounding rounding = detail::GradRounding::kNone) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const Shape& s = call.shape;
  const char* op = call.op;
  cudaStream_t stream = stream_of(ctx);
  const std::int64_t cap = rotated_record_capacity(s, check);
  zero_fill<T>(call.features, ctx, op);
  if (cap == 0 || s.K == 0) return;
  const std::size_t temp_bytes = cub_temp_bytes(s, cap, op);
  WorkspaceLayout layout = exact_device_layout<A>(s, cap, temp_bytes, truncated);
  if (layout.bytes() > ws.bytes)
    fail(ErrorCode::kInvalidArgument, "{}: workspace has {} bytes; the {} mode needs {} here", op, ws.bytes,
         truncated ? "truncated" : "exact", layout.bytes());
  layout.bind(ws.data);
  const GatherCudaBuffers<A> g = take_gather_cuda<A>(layout, temp_bytes);
  std::int64_t* counts = layout.take<std::int64_t>();
  std::int64_t* roi_offsets = layout.take<std::int64_t>();
  double* divisors = layout.take<double>();
  double* sorted_divisors = layout.take<double>();
  const detail::RoiSource rois = roi_source(call.rois);
  const std::uint64_t sentinel = sentinel_of(s);

  // Phase 1: record offsets per roi, every record set to the sentinel, then enumerate.
  rotated_count_kernel<A><<<grid_for(s.K + 1), kBlock, 0, stream>>>(rois, s, counts);
  check_launch("rotated_count_kernel", op, ctx);
  std::size_t tb = temp_bytes;
  DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(g.temp, tb, counts, roi_offsets, s.K + 1, stream), op);
  gather_init_cuda(g, cap, sentinel, ctx, op);
  if (truncated)  // records left at the sentinel keep a defined divisor (never read)
    DETOPS_CUDA_CHECK(cudaMemsetAsync(divisors, 0, static_cast<std::size_t>(cap) * sizeof(double), stream), op);
  const detail::RotatedEnumerateArgs<A> ea{rois, roi_offsets, s, strides4(call.pooled), g.records,
                                           truncated ? divisors : nullptr};
  rotated_enumerate_kernel<A><<<grid_for(s.K * s.PH * s.PW), kBlock, 0, stream>>>(ea, s.K * s.PH * s.PW);
  check_launch("rotated_enumerate_kernel", op, ctx);

  // Phase 2: the engine's stable radix sort by position, permutation and runs.
  const detail::GatherSorted<A> sorted = gather_sort_cuda(g, cap, sentinel, ctx, op);

  // Phase 3: one fixed-order sum per (run, channel).
  const bool channels_last = channels_innermost(call.features);
  const std::int64_t max_runs = std::min(cap, s.N * s.H * s.W + 1);
  const auto args = detail::rotated_gather_sum_args<T>(sorted, static_cast<const T*>(call.pooled.data),
                                                       call.pooled.strides[1], static_cast<T*>(call.features.data),
                                                       call.features.strides[1], s);
  const detail::RoiGatherTarget target{strides4(call.features), s.H, s.W};
  if constexpr (std::is_same_v<T, double>) {
    if (truncated) {
      rotated_permute_divisor_kernel<<<grid_for(cap), kBlock, 0, stream>>>(g.sorted_ids, divisors, sorted_divisors,
                                                                           cap);
      check_launch("rotated_permute_divisor_kernel", op, ctx);
      const detail::RotatedTruncatedArgs ta{args, sorted_divisors, target, rounding};
      rotated_truncated_gather_kernel<<<grid_for(max_runs * s.C), kBlock, 0, stream>>>(ta, g.num_runs, channels_last);
      check_launch("rotated_truncated_gather_kernel", op, ctx);
      return;
    }
  }
  gather_sum_cuda(args, g.num_runs, max_runs, channels_last, target, ctx, op);
}

template <class T>
detail::RotatedBackwardArgs<T> backward_args(const RoiAlignRotatedCall& call, const Strides4& target) {
  detail::RotatedBackwardArgs<T> a{};
  a.grad_output = static_cast<const T*>(call.pooled.data);
  a.go = strides4(call.pooled);
  a.rois = roi_source(call.rois);
  a.gi = target;
  a.shape = call.shape;
  a.channels_last = channels_innermost(call.pooled);
  return a;
}

// ---------------------------------------------------------------------------------------------
// Entry points

RotatedRoiCheck check_rois(const RoiAlignRotatedCall& call, bool need_total, const Context& ctx) {
  const char* op = call.op;
  DeviceGuard guard(call.features.device.index, op);
  cudaStream_t stream = stream_of(ctx);
  const Shape& s = call.shape;
  const detail::RoiSource rois = roi_source(call.rois);
  std::size_t reduce_bytes = 0;
  if (need_total)
    DETOPS_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, reduce_bytes, static_cast<const std::int64_t*>(nullptr),
                                             static_cast<std::int64_t*>(nullptr), s.K),
                      op);
  WorkspaceLayout l;
  l.add<unsigned long long>(1);
  l.add<std::int64_t>(1);
  l.add<std::int64_t>(need_total ? s.K : 0);
  l.add_bytes(reduce_bytes);
  const Scratch scratch(op, l.bytes(), call.features.device, ctx);
  scratch.bind(l);
  auto* first_bad = l.take<unsigned long long>();
  auto* total = l.take<std::int64_t>();
  std::int64_t* counts = l.take<std::int64_t>();
  if (!need_total) counts = nullptr;  // the check kernel then only validates
  void* temp = l.take<unsigned char>();

  const unsigned long long none = static_cast<unsigned long long>(s.K);
  DETOPS_CUDA_CHECK(cudaMemcpyAsync(first_bad, &none, sizeof(none), cudaMemcpyHostToDevice, stream), op);
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using A = acc_t<decltype(tag)>;
    rotated_check_kernel<A><<<grid_for(s.K), kBlock, 0, stream>>>(rois, s, first_bad, counts);
  });
  check_launch("rotated_check_kernel", op, ctx);
  if (need_total) DETOPS_CUDA_CHECK(cub::DeviceReduce::Sum(temp, reduce_bytes, counts, total, s.K, stream), op);
  unsigned long long bad = none;
  std::int64_t sum = 0;
  DETOPS_CUDA_CHECK(cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream), op);
  if (need_total) DETOPS_CUDA_CHECK(cudaMemcpyAsync(&sum, total, sizeof(sum), cudaMemcpyDeviceToHost, stream), op);
  DETOPS_CUDA_CHECK(cudaStreamSynchronize(stream), op);  // the one documented wait

  RotatedRoiCheck check;
  check.total_samples = sum;
  if (bad < none) {
    // Bring the offending row to the host and re-run the shared check there for the message.
    check.bad_row = static_cast<std::int64_t>(bad);
    const std::size_t es = dtype_size(call.rois.dtype);
    alignas(8) unsigned char host_row[detail::kRotatedRoiColumns * 8];
    for (int i = 0; i < detail::kRotatedRoiColumns; ++i) {
      const auto* src = static_cast<const unsigned char*>(call.rois.data) +
                        (check.bad_row * call.rois.strides[0] + i * call.rois.strides[1]) * es;
      DETOPS_CUDA_CHECK(cudaMemcpyAsync(host_row + i * es, src, es, cudaMemcpyDeviceToHost, stream), op);
    }
    DETOPS_CUDA_CHECK(cudaStreamSynchronize(stream), op);  // an error path: a second wait is fine
    detail::load_roi_row(host_row, call.rois.dtype, 1, 1, 0, check.row, detail::kRotatedRoiColumns);
    dispatch_floating(call.features.dtype, [&](auto tag) {
      using A = acc_t<decltype(tag)>;
      const detail::RotatedBox<A> box = detail::make_rotated_box<A>(check.row[0], check.row + 1, s);
      check.status = box.status;
      check.grid_h = box.grid_h;
      check.grid_w = box.grid_w;
    });
  }
  return check;
}

void forward(const RoiAlignRotatedCall& call, const Context& ctx) {
  DeviceGuard guard(call.features.device.index, call.op);
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::RotatedForwardArgs<T> a{};
    a.input = static_cast<const T*>(call.features.data);
    a.in = strides4(call.features);
    a.rois = roi_source(call.rois);
    a.output = static_cast<T*>(call.pooled.data);
    a.out = strides4(call.pooled);
    a.shape = call.shape;
    a.channels_last = channels_innermost(call.pooled);
    const std::int64_t n = call.pooled.numel();
    rotated_forward_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(a, n);
    check_launch("rotated_forward_kernel", call.op, ctx);
  });
}

std::size_t backward_workspace(const RoiAlignRotatedCall& call, const RotatedRoiCheck& check, BackwardMode mode) {
  DeviceGuard guard(call.features.device.index, call.op);  // CUB's temp sizes depend on the device
  const Shape& s = call.shape;
  const std::int64_t cap = rotated_record_capacity(s, check);
  switch (mode) {
    case BackwardMode::kAtomic: return 0;
    case BackwardMode::kTruncated: {
      if (call.features.dtype == DType::kFloat64)  // the exact mode's phases, with divisors
        return exact_device_layout<double>(s, cap, cub_temp_bytes(s, cap, call.op), true).bytes();
      WorkspaceLayout l;
      l.add<double>(s.N * s.C * s.H * s.W);
      return l.bytes();
    }
    case BackwardMode::kExact:
      return dispatch_floating(call.features.dtype, [&](auto tag) {
        return exact_device_layout<acc_t<decltype(tag)>>(s, cap, cub_temp_bytes(s, cap, call.op), false).bytes();
      });
  }
  return 0;
}

void backward(const RoiAlignRotatedCall& call, const RotatedRoiCheck& check, const RoiAlignBackwardOptions& opt,
              const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.features.device.index, call.op);
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    const Shape& s = call.shape;
    cudaStream_t stream = stream_of(ctx);
    const std::int64_t n = call.pooled.numel();
    switch (opt.mode) {
      case BackwardMode::kAtomic: {
        zero_fill<T>(call.features, ctx, call.op);
        if (n == 0) break;
        const auto a = backward_args<T>(call, strides4(call.features));
        rotated_scatter_kernel<T, acc_t<T>, T><<<grid_for(n), kBlock, 0, stream>>>(
            a, n, static_cast<T*>(call.features.data), detail::GradRounding::kNone);
        check_launch("rotated_scatter_kernel", call.op, ctx);
        break;
      }
      case BackwardMode::kTruncated: {
        if constexpr (std::is_same_v<T, double>) {
          // Double atomics would leave the scheduling order in the result: the CPU's order instead.
          exact_backward<T>(call, check, ctx, ws, grad_rounding(opt));
          break;
        }
        const std::int64_t total = s.N * s.C * s.H * s.W;
        if (s.K == 0) {  // no workspace was sized: nothing to accumulate
          zero_fill<T>(call.features, ctx, call.op);
          break;
        }
        auto* buf = static_cast<double*>(ws.data);
        DETOPS_CUDA_CHECK(cudaMemsetAsync(buf, 0, static_cast<std::size_t>(total) * sizeof(double), stream), call.op);
        if (n > 0) {
          const auto a = backward_args<T>(call, Strides4{s.C * s.H * s.W, s.H * s.W, s.W, 1});
          rotated_scatter_kernel<T, double, double><<<grid_for(n), kBlock, 0, stream>>>(a, n, buf, grad_rounding(opt));
          check_launch("rotated_scatter_kernel", call.op, ctx);
        }
        rotated_cast_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(buf, static_cast<T*>(call.features.data),
                                                                       strides4(call.features), s.C, s.H, s.W, total);
        check_launch("rotated_cast_kernel", call.op, ctx);
        break;
      }
      case BackwardMode::kExact:
        exact_backward<T>(call, check, ctx, ws);
        break;
    }
  });
}

bool uses_records(const RoiAlignRotatedCall& call, BackwardMode mode) {
  return mode == BackwardMode::kExact || (mode == BackwardMode::kTruncated && call.features.dtype == DType::kFloat64);
}

}  // namespace

extern const RoiAlignRotatedBackend kRoiAlignRotatedCuda = {&check_rois, &forward, &backward_workspace, &backward,
                                                            &uses_records};

}  // namespace internal
}  // namespace detops
