// CUDA backend of RoIAlignRotated: one-line __global__ wrappers around the per-thread bodies of
// include/detops/detail/roi_align_rotated_kernels.h, and the launch sequences: the roi check, the
// scatter modes (atomic adds; the truncated mode's double accumulator) and the backward's dispatch
// are RoIAlign's (cuda/roi_launch.cuh); the exact mode and the float64 truncated mode run the
// gather-backward engine (cuda/gather_backward.cuh) one chunk of whole images at a time. All work
// is enqueued on the caller's stream.
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
#include "roi_launch.cuh"

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
                                     std::int64_t* counts, std::int64_t* image_samples) {
  DETOPS_GRID_STRIDE(k, s.K) {
    detail::roi_align_rotated_check_element<A>(
        k, rois, s, counts,
        [first_bad](std::int64_t bad) {
          atomicMin(first_bad, static_cast<unsigned long long>(bad));  // integer min: order-independent
        },
        [image_samples](std::int64_t n, std::int64_t samples) {  // integer sums: order-independent
          atomicAdd(reinterpret_cast<unsigned long long*>(image_samples + n), static_cast<unsigned long long>(samples));
        });
  }
}

template <class A>
__global__ void rotated_count_kernel(detail::RoiSource rois, Shape s, detail::ImageRange images, std::int64_t* counts) {
  DETOPS_GRID_STRIDE(k, s.K + 1) detail::roi_align_rotated_count_element<A>(k, rois, s, images, counts);
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

// ---------------------------------------------------------------------------------------------
// Host helpers

/// The exact mode's arrays for one chunk (rotated_exact_chunks): the engine's, the per-roi counts
/// and offsets, and (float64 truncated) the divisors unsorted and sorted, in one fixed order for
/// sizing and carving.
template <class A>
WorkspaceLayout exact_device_layout(const Shape& s, const RotatedExactChunks& ch, std::size_t temp_bytes,
                                    bool with_divisors) {
  WorkspaceLayout l;
  add_gather_cuda<A>(l, ch.records, temp_bytes);
  l.add<std::int64_t>(s.K + 1);
  l.add<std::int64_t>(s.K + 1);
  l.add<double>(with_divisors ? ch.records : 0);
  l.add<double>(with_divisors ? ch.records : 0);
  return l;
}

std::size_t exact_temp_bytes(const Shape& s, const RotatedExactChunks& ch, const char* op) {
  return roi_exact_temp_bytes(s.K, ch.records, static_cast<std::uint64_t>(ch.positions), op);
}

/// The exact mode; with `rounding` (float64 only) the truncated mode, which runs the same phases
/// with divisors and sums the scatter's contributions in the CPU's order. One chunk of whole
/// images at a time: each sorts the chunk's capacity of records (those its rois leave keep the
/// sentinel and sort last), so nothing waits for the device.
template <class T>
void exact_backward(const RoiAlignRotatedCall& call, const RotatedRoiCheck& check, const Context& ctx, Workspace ws,
                    detail::GradRounding rounding = detail::GradRounding::kNone) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const Shape& s = call.shape;
  const char* op = call.op;
  cudaStream_t stream = stream_of(ctx);
  const RotatedExactChunks ch = rotated_exact_chunks(s, check);
  const std::int64_t cap = ch.records;
  zero_fill_cuda<T>(call.features, ctx, op);
  if (cap == 0 || s.K == 0) return;
  const std::size_t temp_bytes = exact_temp_bytes(s, ch, op);
  WorkspaceLayout layout = exact_device_layout<A>(s, ch, temp_bytes, truncated);
  check_exact_workspace(op, truncated ? "truncated" : "exact", layout.bytes(), ws);
  layout.bind(ws.data);
  const GatherCudaBuffers<A> g = take_gather_cuda<A>(layout, temp_bytes);
  std::int64_t* counts = layout.take<std::int64_t>();
  std::int64_t* roi_offsets = layout.take<std::int64_t>();
  double* divisors = layout.take<double>();
  double* sorted_divisors = layout.take<double>();
  const detail::RoiSource rois = roi_source(call.rois);
  const std::uint64_t sentinel = static_cast<std::uint64_t>(ch.positions);
  const bool channels_last = channels_innermost(call.features);
  const std::int64_t max_runs = std::min(cap, ch.positions + 1);
  const detail::Strides4 gi = strides4(call.features);
  T* grad_input = static_cast<T*>(call.features.data);

  for (std::int64_t n0 = 0; n0 < s.N; n0 += ch.images) {
    const detail::ImageRange images{n0, std::min(s.N, n0 + ch.images)};
    // Phase 1: record offsets per roi of the chunk, every record set to the sentinel, then
    // enumerate (the chunk's rois only).
    rotated_count_kernel<A><<<grid_for(s.K + 1), kBlock, 0, stream>>>(rois, s, images, counts);
    check_launch("rotated_count_kernel", op, ctx);
    scan_roi_offsets(g, counts, roi_offsets, s.K, ctx, op);
    gather_init_cuda(g, cap, sentinel, ctx, op);
    if (truncated)  // records left at the sentinel keep a defined divisor (never read)
      DETOPS_CUDA_CHECK(cudaMemsetAsync(divisors, 0, static_cast<std::size_t>(cap) * sizeof(double), stream), op);
    const detail::RotatedEnumerateArgs<A> ea{rois,      roi_offsets, s, strides4(call.pooled), g.records,
                                             images, truncated ? divisors : nullptr};
    rotated_enumerate_kernel<A><<<grid_for(s.K * s.PH * s.PW), kBlock, 0, stream>>>(ea, s.K * s.PH * s.PW);
    check_launch("rotated_enumerate_kernel", op, ctx);

    // Phase 2: the engine's stable radix sort by position, permutation and runs.
    const detail::GatherSorted<A> sorted = gather_sort_cuda(g, cap, sentinel, ctx, op);

    // Phase 3: one fixed-order sum per (run, channel) of the chunk's images.
    const auto args = detail::rotated_gather_sum_args<T>(sorted, static_cast<const T*>(call.pooled.data),
                                                         call.pooled.strides[1], grad_input + n0 * gi.s0, gi.s1, s.C,
                                                         sentinel);
    const detail::RoiGatherTarget target{gi, s.H, s.W};
    if constexpr (std::is_same_v<T, double>) {
      if (truncated) {
        rotated_permute_divisor_kernel<<<grid_for(cap), kBlock, 0, stream>>>(g.sorted_ids, divisors, sorted_divisors,
                                                                             cap);
        check_launch("rotated_permute_divisor_kernel", op, ctx);
        const detail::RotatedTruncatedArgs ta{args, sorted_divisors, target, rounding};
        rotated_truncated_gather_kernel<<<grid_for(max_runs * s.C), kBlock, 0, stream>>>(ta, g.num_runs, channels_last);
        check_launch("rotated_truncated_gather_kernel", op, ctx);
        continue;
      }
    }
    gather_sum_cuda(args, g.num_runs, max_runs, channels_last, target, ctx, op);
  }
}

/// The scatter modes' kernel over every grad_output element, adding into `target` (strides `ts`):
/// grad_input (kAtomic) or the truncated mode's double buffer.
template <class T, class Target>
void launch_scatter(const RoiAlignRotatedCall& call, Target* target, const Strides4& ts, detail::GradRounding rounding,
                    const Context& ctx) {
  detail::RotatedBackwardArgs<T> a{};
  a.grad_output = static_cast<const T*>(call.pooled.data);
  a.go = strides4(call.pooled);
  a.rois = roi_source(call.rois);
  a.gi = ts;
  a.shape = call.shape;
  a.channels_last = channels_innermost(call.pooled);
  const std::int64_t n = call.pooled.numel();
  rotated_scatter_kernel<T, scatter_value_t<T, Target>, Target><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(
      a, n, target, rounding);
  check_launch("rotated_scatter_kernel", call.op, ctx);
}

// ---------------------------------------------------------------------------------------------
// Entry points

RotatedRoiCheck check_rois(const RoiAlignRotatedCall& call, bool need_total, const Context& ctx) {
  DeviceGuard guard(call.features.device.index, call.op);
  const Shape& s = call.shape;
  const detail::RoiSource rois = roi_source(call.rois);
  const DeviceRoiCheck found = roi_check_cuda(
      call.op, "rotated_check_kernel", call.features, call.rois, s.K, detail::kRotatedRoiColumns, need_total, true,
      ctx, [&](auto a_tag, unsigned long long* first_bad, std::int64_t* counts, std::int64_t* image_samples) {
        rotated_check_kernel<decltype(a_tag)><<<grid_for(s.K), kBlock, 0, stream_of(ctx)>>>(rois, s, first_bad, counts,
                                                                                            image_samples);
      });
  RotatedRoiCheck check = roi_check_from_device<RotatedRoiCheck>(
      found, detail::kRotatedRoiColumns, call.features.dtype,
      [&](auto a_tag, const double* row) { return detail::make_rotated_box<decltype(a_tag)>(row[0], row + 1, s); });
  if (need_total) check.max_image_samples = found.max_image_samples;
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
  const RotatedExactChunks ch = rotated_exact_chunks(s, check);
  return roi_backward_workspace_cuda(call.features.dtype, mode, s, [&](auto a_tag, bool with_divisors) {
    using A = decltype(a_tag);
    return exact_device_layout<A>(s, ch, exact_temp_bytes(s, ch, call.op), with_divisors).bytes();
  });
}

void backward(const RoiAlignRotatedCall& call, const RotatedRoiCheck& check, const RoiAlignBackwardOptions& opt,
              const Context& ctx, Workspace ws) {
  DeviceGuard guard(call.features.device.index, call.op);
  roi_backward_cuda(
      call.features, call.shape, call.pooled.numel(), opt, ws, ctx, call.op,
      [&](auto t_tag, auto* target, const Strides4& ts, detail::GradRounding rounding) {
        launch_scatter<decltype(t_tag)>(call, target, ts, rounding, ctx);
      },
      [&](auto t_tag, detail::GradRounding rounding) {
        exact_backward<decltype(t_tag)>(call, check, ctx, ws, rounding);
      });
}

bool uses_records(const RoiAlignRotatedCall& call, BackwardMode mode) {
  return roi_backward_enumerates(call.features.dtype, mode);
}

}  // namespace

extern const RoiAlignRotatedBackend kRoiAlignRotatedCuda = {&check_rois, &forward, &backward_workspace, &backward,
                                                            &uses_records};

}  // namespace internal
}  // namespace detops
