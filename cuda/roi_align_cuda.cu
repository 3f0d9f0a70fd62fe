// CUDA backend of RoIAlign: thin __global__ wrappers around the per-thread bodies of
// include/detops/detail/roi_align_kernels.h, plus the launch sequences: the roi check, the scatter
// modes and the backward's dispatch are RoIAlignRotated's too (cuda/roi_launch.cuh); the exact
// mode's phases (the engine's CUB radix sort, run-length encode and scans, and RoIAlign's own slot
// fields) are here. All work is enqueued on the caller's stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "atomic_add.cuh"
#include "cuda_check.cuh"
#include "detops/detail/roi_align_kernels.h"
#include "gather_backward.cuh"
#include "internal/roi_align_backend.h"
#include "internal/scratch.h"
#include "roi_launch.cuh"

namespace detops {
namespace internal {

namespace {

using detail::Strides4;

// ---------------------------------------------------------------------------------------------
// Kernels (each a one-line wrapper of a shared body)

template <class T>
__global__ void forward_kernel(detail::ForwardArgs<T> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::roi_align_forward_element(i, a);
}

template <class T, class V, class Target>
__global__ void scatter_kernel(detail::BackwardArgs<T> a, std::int64_t n, Target* target, detail::GradRounding rounding) {
  DETOPS_GRID_STRIDE(i, n) {
    detail::roi_align_backward_scatter_element<T, V>(i, a, rounding,
                                                     [target](std::int64_t off, V v) { atomic_add(target + off, v); });
  }
}

template <class A>
__global__ void check_kernel(detail::RoiSource rois, detail::RoiAlignShape s, unsigned long long* first_bad,
                             std::int64_t* counts) {
  DETOPS_GRID_STRIDE(k, s.K) {
    detail::roi_align_check_element<A>(k, rois, s, counts, [first_bad](std::int64_t bad) {
      atomicMin(first_bad, static_cast<unsigned long long>(bad));  // integer min: order-independent
    });
  }
}

template <class A>
__global__ void count_kernel(detail::RoiSource rois, detail::RoiAlignShape s, std::int64_t* counts) {
  DETOPS_GRID_STRIDE(k, s.K + 1) detail::roi_align_count_element<A>(k, rois, s, counts);
}

template <class A>
__global__ void init_slots_kernel(detail::ExactRecords<A> rec, std::int64_t n, std::uint64_t sentinel) {
  DETOPS_GRID_STRIDE(j, n) detail::roi_align_exact_init_slot(j, rec, sentinel);
}

template <class A>
__global__ void enumerate_kernel(detail::EnumerateArgs<A> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::roi_align_exact_enumerate_bin(t, a);
}

/// RoIAlign's own slot fields into sorted order (the engine permutes weights and sources).
template <class A>
__global__ void permute_extras_kernel(const std::int64_t* sorted_ids, detail::ExactRecords<A> from,
                                      detail::ExactRecords<A> to, std::int64_t n) {
  DETOPS_GRID_STRIDE(r, n) detail::roi_align_permute_extras(r, sorted_ids, from, to);
}

/// Phase 3 of the float64 truncated mode: the scatter's contributions in the CPU's order.
template <class T>
__global__ void truncated_gather_kernel(detail::GatherArgs<T> a, const std::int64_t* num_runs, bool channels_last) {
  DETOPS_GRID_STRIDE(t, *num_runs * a.shape.C) detail::roi_align_truncated_gather_element(t, a, channels_last, *num_runs);
}

// ---------------------------------------------------------------------------------------------
// Host helpers

/// The exact mode's device workspace, in one fixed order (used for sizing and for carving): the
/// engine's arrays, RoIAlign's own slot fields (unsorted and sorted), and the per-roi counts and
/// offsets. The float64 truncated mode uses it too, with divisors (`with_divisors`).
template <class A>
struct ExactDeviceBuffers {
  GatherCudaBuffers<A> engine{};
  detail::ExactRecords<A> slots{};   // views: the engine's records plus the extras below
  detail::ExactRecords<A> sorted{};
  std::int64_t* counts = nullptr;
  std::int64_t* roi_offsets = nullptr;
};

std::uint64_t sentinel_of(const detail::RoiAlignShape& s) { return static_cast<std::uint64_t>(s.N * s.H * s.W); }

/// CUB's temporary bytes: the engine's phase 2 over all rois' slots, and the scan of the counts.
std::size_t cub_temp_bytes(const detail::RoiAlignShape& s, std::int64_t cap, const char* op) {
  return roi_exact_temp_bytes(s.K, cap, sentinel_of(s), op);
}

template <class A>
void add_extras(WorkspaceLayout& l, std::int64_t cap, bool with_divisors) {
  l.add<std::int64_t>(cap);
  l.add<std::int32_t>(cap);
  if (with_divisors) l.add<double>(cap);
}
template <class A>
void take_extras(WorkspaceLayout& l, detail::ExactRecords<A>& r, bool with_divisors) {
  r.am_offsets = l.take<std::int64_t>();
  r.samples = l.take<std::int32_t>();
  r.divisors = with_divisors ? l.take<double>() : nullptr;
}

template <class A>
WorkspaceLayout exact_device_layout(const detail::RoiAlignShape& s, std::int64_t cap, std::size_t temp_bytes,
                                    bool with_divisors) {
  WorkspaceLayout l;
  add_gather_cuda<A>(l, cap, temp_bytes);
  add_extras<A>(l, cap, with_divisors);  // slots
  add_extras<A>(l, cap, with_divisors);  // sorted
  l.add<std::int64_t>(s.K + 1);
  l.add<std::int64_t>(s.K + 1);
  return l;
}

template <class A>
ExactDeviceBuffers<A> carve(WorkspaceLayout& l, void* base, std::size_t temp_bytes, bool with_divisors) {
  l.bind(base);
  ExactDeviceBuffers<A> b;
  b.engine = take_gather_cuda<A>(l, temp_bytes);
  const GatherCudaBuffers<A>& g = b.engine;
  b.slots.keys = g.records.keys;
  b.slots.ids = g.records.ids;
  b.slots.weights = g.records.weights;
  b.slots.go_offsets = g.records.sources;
  take_extras<A>(l, b.slots, with_divisors);
  b.sorted.keys = g.sorted_keys;
  b.sorted.ids = g.sorted_ids;
  b.sorted.weights = g.sorted_weights;
  b.sorted.go_offsets = g.sorted_sources;
  take_extras<A>(l, b.sorted, with_divisors);
  b.counts = l.take<std::int64_t>();
  b.roi_offsets = l.take<std::int64_t>();
  return b;
}

/// The exact mode; with `rounding` (kFloat16 or kBFloat16) the float64 truncated mode, which runs
/// the same phases with divisors and sums truncated contributions in phase 3.
template <class T>
void exact_backward(const RoiAlignCall& call, const RoiCheck& check, const Context& ctx, Workspace ws,
                    detail::GradRounding rounding = detail::GradRounding::kNone) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const detail::RoiAlignShape& s = call.shape;
  const char* op = call.op;
  cudaStream_t stream = stream_of(ctx);
  const std::int64_t cap = exact_slot_capacity(s, check);
  if (cap == 0 || s.K == 0) {
    zero_fill_cuda<T>(call.features, ctx, op);
    return;
  }
  const std::size_t temp_bytes = cub_temp_bytes(s, cap, op);
  WorkspaceLayout layout = exact_device_layout<A>(s, cap, temp_bytes, truncated);
  check_exact_workspace(op, truncated ? "truncated" : "exact", layout.bytes(), ws);
  ExactDeviceBuffers<A> b = carve<A>(layout, ws.data, temp_bytes, truncated);
  const detail::RoiSource rois = roi_source(call.rois);
  const std::uint64_t sentinel = sentinel_of(s);

  zero_fill_cuda<T>(call.features, ctx, op);
  // Phase 1: slot offsets per roi, then enumerate.
  count_kernel<A><<<grid_for(s.K + 1), kBlock, 0, stream>>>(rois, s, b.counts);
  check_launch("count_kernel", op, ctx);
  scan_roi_offsets(b.engine, b.counts, b.roi_offsets, s.K, ctx, op);
  init_slots_kernel<A><<<grid_for(cap), kBlock, 0, stream>>>(b.slots, cap, sentinel);
  check_launch("init_slots_kernel", op, ctx);
  detail::EnumerateArgs<A> ea{rois, b.roi_offsets, s, call.max_pool, strides4(call.pooled),
                              call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0}, b.slots};
  enumerate_kernel<A><<<grid_for(s.K * s.PH * s.PW), kBlock, 0, stream>>>(ea, s.K * s.PH * s.PW);
  check_launch("enumerate_kernel", op, ctx);
  // Phase 2: the engine's stable radix sort by position, permutation and runs; then RoIAlign's
  // own slot fields in sorted order.
  const detail::GatherSorted<A> sorted = gather_sort_cuda(b.engine, cap, sentinel, ctx, op);
  permute_extras_kernel<A><<<grid_for(cap), kBlock, 0, stream>>>(b.sorted.ids, b.slots, b.sorted, cap);
  check_launch("permute_extras_kernel", op, ctx);
  // Phase 3: one fixed-order sum per (run, channel).
  detail::GatherArgs<T> ga = make_gather_args<T>(call, b.sorted, sorted.run_keys, sorted.run_offsets,
                                                 sorted.run_lengths);
  ga.rounding = rounding;
  const bool channels_last = channels_innermost(call.features);
  const std::int64_t max_runs = std::min(cap, s.N * s.H * s.W + 1);
  if (truncated) {
    truncated_gather_kernel<T><<<grid_for(max_runs * s.C), kBlock, 0, stream>>>(ga, b.engine.num_runs, channels_last);
    check_launch("truncated_gather_kernel", op, ctx);
  } else {
    gather_sum_cuda(detail::roi_gather_sum_args(ga), b.engine.num_runs, max_runs, channels_last,
                    detail::roi_gather_target(ga), ctx, op, ga.active);
  }
}

/// The scatter modes' kernel over every grad_output element, adding into `target` (strides `ts`):
/// grad_input (kAtomic) or the truncated mode's double buffer.
template <class T, class Target>
void launch_scatter(const RoiAlignCall& call, Target* target, const Strides4& ts, detail::GradRounding rounding,
                    const Context& ctx) {
  detail::BackwardArgs<T> a{};
  a.grad_output = static_cast<const T*>(call.pooled.data);
  a.go = strides4(call.pooled);
  a.rois = roi_source(call.rois);
  a.gi = ts;
  a.argmax = static_cast<const std::int32_t*>(call.argmax.data);
  a.am = call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0};
  a.shape = call.shape;
  a.max_pool = call.max_pool;
  a.channels_last = channels_innermost(call.pooled);
  const std::int64_t n = call.pooled.numel();
  scatter_kernel<T, scatter_value_t<T, Target>, Target><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(a, n, target,
                                                                                                    rounding);
  check_launch("scatter_kernel", call.op, ctx);
}

// ---------------------------------------------------------------------------------------------
// Entry points

RoiCheck check_rois(const RoiAlignCall& call, bool need_total, const Context& ctx) {
  DeviceGuard guard(call.features.device.index, call.op);
  const detail::RoiAlignShape& s = call.shape;
  const detail::RoiSource rois = roi_source(call.rois);
  const DeviceRoiCheck found = roi_check_cuda(
      call.op, "check_kernel", call.features, call.rois, s.K, 5, need_total, false, ctx,
      [&](auto a_tag, unsigned long long* first_bad, std::int64_t* counts, std::int64_t* /*per image: unused*/) {
        check_kernel<decltype(a_tag)><<<grid_for(s.K), kBlock, 0, stream_of(ctx)>>>(rois, s, first_bad, counts);
      });
  return roi_check_from_device<RoiCheck>(found, 5, call.features.dtype, [&](auto a_tag, const double* row) {
    return detail::make_roi_box<decltype(a_tag)>(row[0], row + 1, s);
  });
}

void forward(const RoiAlignCall& call, const Context& ctx) {
  DeviceGuard guard(call.features.device.index, call.op);
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::ForwardArgs<T> a{};
    a.input = static_cast<const T*>(call.features.data);
    a.in = strides4(call.features);
    a.rois = roi_source(call.rois);
    a.output = static_cast<T*>(call.pooled.data);
    a.out = strides4(call.pooled);
    a.argmax = static_cast<std::int32_t*>(call.argmax.data);
    a.am = call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0};
    a.shape = call.shape;
    a.max_pool = call.max_pool;
    a.channels_last = channels_innermost(call.pooled);
    const std::int64_t n = call.pooled.numel();
    forward_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(a, n);
    check_launch("forward_kernel", call.op, ctx);
  });
}

std::size_t backward_workspace(const RoiAlignCall& call, const RoiCheck& check, BackwardMode mode) {
  DeviceGuard guard(call.features.device.index, call.op);  // CUB's temp sizes depend on the device
  const detail::RoiAlignShape& s = call.shape;
  const std::int64_t cap = exact_slot_capacity(s, check);
  return roi_backward_workspace_cuda(call.features.dtype, mode, s, [&](auto a_tag, bool with_divisors) {
    using A = decltype(a_tag);
    return exact_device_layout<A>(s, cap, cub_temp_bytes(s, cap, call.op), with_divisors).bytes();
  });
}

void backward(const RoiAlignCall& call, const RoiCheck& check, const RoiAlignBackwardOptions& opt, const Context& ctx,
              Workspace ws) {
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

bool uses_slots(const RoiAlignCall& call, BackwardMode mode) {
  return roi_backward_enumerates(call.features.dtype, mode);
}

}  // namespace

extern const RoiAlignBackend kRoiAlignCuda = {&check_rois, &forward, &backward_workspace, &backward, &uses_slots};

}  // namespace internal
}  // namespace detops
