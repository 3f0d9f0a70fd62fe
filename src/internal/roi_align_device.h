// RoIAlign's CUDA steps, written once over the device interface (internal/device_steps.h): the roi
// check, the forward (average or max pooling), and the backward (the roi ops' shared dispatch,
// internal/roi_device.h: the atomic and truncated scatters; the exact mode and the float64
// truncated mode run the gather engine over every roi's slots, with RoIAlign's own slot fields),
// as launches of the per-thread bodies of include/detops/detail/roi_align_kernels.h.
// cuda/roi_align_cuda.cu runs them on CudaDevice; tests/roi_emulated_test.cpp runs the very same
// code on the emulated device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "detops/detail/roi_align_kernels.h"
#include "internal/device_steps.h"
#include "internal/roi_align_backend.h"
#include "internal/roi_device.h"

namespace detops {
namespace internal {
namespace roi_align_device {

using detail::Strides4;

// ---------------------------------------------------------------------------------------------
// Bodies

template <class T>
struct ForwardBody {
  detail::ForwardArgs<T> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::roi_align_forward_element(i, a); }
};

template <class T, class V, class Add>
struct ScatterBody {
  detail::BackwardArgs<T> a;
  detail::GradRounding rounding;
  Add add;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const {
    detail::roi_align_backward_scatter_element<T, V>(i, a, rounding, add);
  }
};

template <class A, class MinU64>
struct CheckBody {
  detail::RoiSource rois;
  detail::RoiAlignShape s;
  std::int64_t* counts;
  MinU64 report_bad;  // the smallest bad row: an integer min, order-independent
  DETOPS_HOST_DEVICE void operator()(std::int64_t k) const {
    detail::roi_align_check_element<A>(k, rois, s, counts, report_bad);
  }
};

template <class A>
struct CountBody {
  detail::RoiSource rois;
  detail::RoiAlignShape s;
  std::int64_t* counts;
  DETOPS_HOST_DEVICE void operator()(std::int64_t k) const { detail::roi_align_count_element<A>(k, rois, s, counts); }
};

template <class A>
struct InitSlotsBody {
  detail::ExactRecords<A> rec;
  detail::GatherKey sentinel;
  DETOPS_HOST_DEVICE void operator()(std::int64_t j) const { detail::roi_align_exact_init_slot(j, rec, sentinel); }
};

template <class A>
struct EnumerateBody {
  detail::EnumerateArgs<A> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const { detail::roi_align_exact_enumerate_bin(t, a); }
};

/// RoIAlign's own slot fields into sorted order (the engine permutes weights and sources).
template <class A>
struct PermuteExtrasBody {
  const detail::GatherIndex* sorted_ids;
  detail::ExactRecords<A> from, to;
  DETOPS_HOST_DEVICE void operator()(std::int64_t r) const { detail::roi_align_permute_extras(r, sorted_ids, from, to); }
};

/// Phase 3 of the float64 truncated mode over up to max_runs * C threads: the scatter's
/// contributions in the CPU's order; *num_runs (on the device) decides which threads work.
template <class T>
struct TruncatedGatherBody {
  detail::GatherArgs<T> a;
  const detail::GatherIndex* num_runs;
  bool channels_last;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    const std::int64_t runs = *num_runs;
    if (t < runs * a.shape.C) detail::roi_align_truncated_gather_element(t, a, channels_last, runs);
  }
};

// ---------------------------------------------------------------------------------------------
// Exact mode

/// The exact mode's device workspace, in one fixed order (used for sizing and for carving): the
/// engine's arrays, RoIAlign's own slot fields (unsorted and sorted), and the per-roi counts and
/// offsets. The float64 truncated mode uses it too, with divisors (`with_divisors`).
template <class A>
struct ExactBuffers {
  GatherDeviceBuffers<A> engine{};
  detail::ExactRecords<A> slots{};  // views: the engine's records plus the extras below
  detail::ExactRecords<A> sorted{};
  std::int64_t* counts = nullptr;
  std::int64_t* roi_offsets = nullptr;
};

inline std::int64_t sentinel_of(const detail::RoiAlignShape& s) {
  return s.N * s.H * s.W;
}

template <class Dev>
std::size_t exact_temp_bytes(const Dev& dev, const detail::RoiAlignShape& s, std::int64_t cap) {
  return roi_exact_temp_bytes_on(dev, s.K, cap, sentinel_of(s));
}

/// RoIAlign's slot fields beyond the engine's: argmax offsets and samples (max pooling only) and
/// divisors (the float64 truncated mode only).
inline void add_extras(WorkspaceLayout& l, std::int64_t cap, bool max_pool, bool with_divisors) {
  if (max_pool) {
    l.add<std::int64_t>(cap);
    l.add<std::int32_t>(cap);
  }
  if (with_divisors) l.add<double>(cap);
}
template <class A>
void take_extras(WorkspaceLayout& l, detail::ExactRecords<A>& r, bool max_pool, bool with_divisors) {
  r.am_offsets = max_pool ? l.take<std::int64_t>() : nullptr;
  r.samples = max_pool ? l.take<std::int32_t>() : nullptr;
  r.divisors = with_divisors ? l.take<double>() : nullptr;
}

template <class A>
WorkspaceLayout exact_layout(const detail::RoiAlignShape& s, std::int64_t cap, std::size_t temp_bytes,
                             bool max_pool, bool with_divisors) {
  WorkspaceLayout l;
  add_gather<A>(l, cap, temp_bytes);
  add_extras(l, cap, max_pool, with_divisors);  // slots
  add_extras(l, cap, max_pool, with_divisors);  // sorted
  l.add<std::int64_t>(s.K + 1);
  l.add<std::int64_t>(s.K + 1);
  return l;
}

template <class A>
ExactBuffers<A> carve(WorkspaceLayout& l, void* base, std::size_t temp_bytes, bool max_pool, bool with_divisors) {
  l.bind(base);
  ExactBuffers<A> b;
  b.engine = take_gather<A>(l, temp_bytes);
  const GatherDeviceBuffers<A>& g = b.engine;
  b.slots.keys = g.records.keys;
  b.slots.ids = g.records.ids;
  b.slots.weights = g.records.weights;
  b.slots.go_offsets = g.records.sources;
  take_extras<A>(l, b.slots, max_pool, with_divisors);
  b.sorted.keys = g.sorted_keys;
  b.sorted.ids = g.sorted_ids;
  b.sorted.weights = g.sorted_weights;
  b.sorted.go_offsets = g.sorted_sources;
  take_extras<A>(l, b.sorted, max_pool, with_divisors);
  b.counts = l.take<std::int64_t>();
  b.roi_offsets = l.take<std::int64_t>();
  return b;
}

/// The exact mode; with `rounding` (kFloat16 or kBFloat16) the float64 truncated mode, which runs
/// the same phases with divisors and sums truncated contributions in phase 3.
template <class T, class Dev>
void exact_backward(const Dev& dev, const RoiAlignCall& call, const RoiCheck& check, Workspace ws,
                    detail::GradRounding rounding) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const detail::RoiAlignShape& s = call.shape;
  const std::int64_t cap = exact_slot_capacity(s, check);
  if (cap == 0 || s.K == 0) {
    zero_fill<T>(dev, call.features);
    return;
  }
  const std::size_t temp_bytes = exact_temp_bytes(dev, s, cap);
  WorkspaceLayout layout = exact_layout<A>(s, cap, temp_bytes, call.max_pool, truncated);
  check_exact_workspace(call.op, truncated ? "truncated" : "exact", layout.bytes(), ws);
  ExactBuffers<A> b = carve<A>(layout, ws.data, temp_bytes, call.max_pool, truncated);
  const detail::RoiSource rois = roi_source(call.rois);
  const auto sentinel = static_cast<detail::GatherKey>(sentinel_of(s));  // checked by the workspace query

  zero_fill<T>(dev, call.features);
  // Phase 1: slot offsets per roi, then enumerate.
  dev.launch("roi_align_count", s.K + 1, CountBody<A>{rois, s, b.counts});
  scan_roi_offsets_on(dev, b.engine, b.counts, b.roi_offsets, s.K);
  dev.launch("roi_align_init_slots", cap, InitSlotsBody<A>{b.slots, sentinel});
  const detail::EnumerateArgs<A> ea{rois, b.roi_offsets, s, call.max_pool, strides4(call.pooled),
                                    call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0}, b.slots};
  dev.launch("roi_align_enumerate", s.K * s.PH * s.PW, EnumerateBody<A>{ea});
  // Phase 2: the engine's stable radix sort by position, permutation and runs; then RoIAlign's
  // own slot fields in sorted order.
  const detail::GatherSorted<A> sorted = gather_sort(dev, b.engine, cap, sentinel);
  dev.launch("roi_align_permute_extras", cap, PermuteExtrasBody<A>{b.sorted.ids, b.slots, b.sorted});
  // Phase 3: one fixed-order sum per (run, channel).
  detail::GatherArgs<T> ga = make_gather_args<T>(call, b.sorted, sorted.run_keys, sorted.run_offsets,
                                                 sorted.run_lengths);
  ga.rounding = rounding;
  const bool channels_last = channels_innermost(call.features);
  const std::int64_t max_runs = std::min(cap, s.N * s.H * s.W + 1);
  if (truncated) {
    dev.launch("roi_align_truncated_gather", max_runs * s.C,
               TruncatedGatherBody<T>{ga, b.engine.num_runs, channels_last});
  } else {
    gather_sum(dev, detail::roi_gather_sum_args(ga), b.engine.num_runs, max_runs, channels_last,
               detail::roi_gather_target(ga), ga.active);
  }
}

/// The scatter modes' launch over every grad_output element, adding into `target` (strides `ts`):
/// grad_input (kAtomic) or the truncated mode's double buffer.
template <class T, class Target, class Dev>
void scatter(const Dev& dev, const RoiAlignCall& call, Target* target, const Strides4& ts,
             detail::GradRounding rounding) {
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
  using Add = typename Dev::template Add<Target>;
  dev.launch("roi_align_scatter", call.pooled.numel(),
             ScatterBody<T, scatter_value_t<T, Target>, Add>{a, rounding, Add{target}});
}

}  // namespace roi_align_device

/// The roi check on `dev` (with need_total, the sample total that sizes the exact mode).
template <class Dev>
RoiCheck roi_align_check_rois_on(const Dev& dev, const RoiAlignCall& call, bool need_total) {
  const detail::RoiAlignShape& s = call.shape;
  const detail::RoiSource rois = roi_source(call.rois);
  using MinU64 = typename Dev::MinU64;
  const DeviceRoiCheck found = roi_check_on(
      dev, call.features, call.rois, s.K, 5, need_total, false,
      [&](auto a_tag, unsigned long long* first_bad, std::int64_t* counts, std::int64_t* /*per image: unused*/) {
        dev.launch("roi_align_check", s.K,
                   roi_align_device::CheckBody<decltype(a_tag), MinU64>{rois, s, counts, MinU64{first_bad}});
      });
  return roi_check_from_device<RoiCheck>(found, 5, call.features.dtype, [&](auto a_tag, const double* row) {
    return detail::make_roi_box<decltype(a_tag)>(row[0], row + 1, s);
  });
}

/// The forward on `dev` into call.pooled (and call.argmax with max pooling).
template <class T, class Dev>
void roi_align_forward_on(const Dev& dev, const RoiAlignCall& call) {
  detail::ForwardArgs<T> a{};
  a.input = static_cast<const T*>(call.features.data);
  a.in = strides4(call.features);
  a.rois = roi_source(call.rois);
  a.output = static_cast<T*>(call.pooled.data);
  a.out = strides4(call.pooled);
  a.argmax = static_cast<std::int32_t*>(call.argmax.data);
  a.am = call.max_pool ? strides4(call.argmax) : detail::Strides4{0, 0, 0, 0};
  a.shape = call.shape;
  a.max_pool = call.max_pool;
  a.channels_last = channels_innermost(call.pooled);
  dev.launch("roi_align_forward", call.pooled.numel(), roi_align_device::ForwardBody<T>{a});
}

/// Bytes of the backward's workspace on `dev` for the plan (its mode and roi check).
template <class Dev>
std::size_t roi_align_backward_workspace_on(const Dev& dev, const RoiAlignCall& call, const RoiBackwardPlan& plan) {
  const detail::RoiAlignShape& s = call.shape;
  const std::int64_t cap = exact_slot_capacity(s, plan.check);
  return roi_backward_workspace_bytes(call.features.dtype, plan.mode, s, [&](auto a_tag, bool with_divisors) {
    using A = decltype(a_tag);
    return roi_align_device::exact_layout<A>(s, cap, roi_align_device::exact_temp_bytes(dev, s, cap), call.max_pool,
                                             with_divisors)
        .bytes();
  });
}

/// The backward on `dev` into call.features (grad_input) as the plan says.
template <class Dev>
void roi_align_backward_on(const Dev& dev, const RoiAlignCall& call, const RoiBackwardPlan& plan, Workspace ws) {
  roi_backward_on(
      dev, call.features, call.shape, call.pooled.numel(), plan, ws,
      [&](auto t_tag, auto* target, const detail::Strides4& ts, detail::GradRounding rounding) {
        roi_align_device::scatter<decltype(t_tag)>(dev, call, target, ts, rounding);
      },
      [&](auto t_tag, detail::GradRounding rounding) {
        roi_align_device::exact_backward<decltype(t_tag)>(dev, call, plan.check, ws, rounding);
      });
}

}  // namespace internal
}  // namespace detops
