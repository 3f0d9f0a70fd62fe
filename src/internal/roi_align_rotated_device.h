// RoIAlignRotated's CUDA steps, written once over the device interface (internal/device_steps.h):
// the roi check, the forward, and the backward (the roi ops' shared dispatch, internal/roi_device.h:
// the atomic and truncated scatters; the exact mode and the float64 truncated mode run the gather
// engine one chunk of whole images at a time), as launches of the per-thread bodies of
// include/detops/detail/roi_align_rotated_kernels.h. cuda/roi_align_rotated_cuda.cu runs them on
// CudaDevice; tests/roi_emulated_test.cpp runs the very same code on the emulated device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "detops/detail/roi_align_rotated_kernels.h"
#include "internal/device_steps.h"
#include "internal/roi_align_rotated_backend.h"
#include "internal/roi_device.h"

namespace detops {
namespace internal {
namespace rotated_device {

using Shape = detail::RoiAlignRotatedShape;

// ---------------------------------------------------------------------------------------------
// Bodies

template <class T>
struct ForwardBody {
  detail::RotatedForwardArgs<T> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::roi_align_rotated_forward_element(i, a); }
};

/// One grad_output element's contributions, added into `add`'s target (grad_input, or the
/// truncated mode's double buffer) in V.
template <class T, class V, class Add>
struct ScatterBody {
  detail::RotatedBackwardArgs<T> a;
  detail::GradRounding rounding;
  Add add;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const {
    detail::roi_align_rotated_backward_scatter_element<T, V>(i, a, rounding, add);
  }
};

template <class A, class MinU64, class AddI64>
struct CheckBody {
  detail::RoiSource rois;
  Shape s;
  std::int64_t* counts;
  MinU64 report_bad;     // the smallest bad row: an integer min, order-independent
  AddI64 add_image;      // per-image sample sums: integer adds, order-independent
  DETOPS_HOST_DEVICE void operator()(std::int64_t k) const {
    detail::roi_align_rotated_check_element<A>(k, rois, s, counts, report_bad, add_image);
  }
};

template <class A>
struct CountBody {
  detail::RoiSource rois;
  Shape s;
  detail::ImageRange images;
  std::int64_t* counts;
  DETOPS_HOST_DEVICE void operator()(std::int64_t k) const {
    detail::roi_align_rotated_count_element<A>(k, rois, s, images, counts);
  }
};

template <class A>
struct EnumerateBody {
  detail::RotatedEnumerateArgs<A> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const { detail::roi_align_rotated_enumerate_bin(t, a); }
};

struct PermuteDivisorBody {
  const detail::GatherIndex* sorted_ids;
  const double* divisors;
  double* sorted_divisors;
  DETOPS_HOST_DEVICE void operator()(std::int64_t r) const {
    detail::roi_align_rotated_permute_divisor(r, sorted_ids, divisors, sorted_divisors);
  }
};

/// The float64 truncated mode's phase 3 over up to max_runs * C threads; *num_runs (on the
/// device) decides which do work.
struct TruncatedGatherBody {
  detail::RotatedTruncatedArgs a;
  const detail::GatherIndex* num_runs;
  bool channels_last;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    const std::int64_t runs = *num_runs;
    if (t < runs * a.sum.C) detail::roi_align_rotated_truncated_gather_element(t, a, channels_last, runs);
  }
};

// ---------------------------------------------------------------------------------------------
// Exact mode

/// The exact mode's arrays for one chunk (rotated_exact_chunks): the engine's, the per-roi counts
/// and offsets, and (float64 truncated) the divisors unsorted and sorted, in one fixed order for
/// sizing and carving.
template <class A>
WorkspaceLayout exact_layout(const Shape& s, const RotatedExactChunks& ch, std::size_t temp_bytes,
                             bool with_divisors) {
  WorkspaceLayout l;
  add_gather<A>(l, ch.records, temp_bytes);
  l.add<std::int64_t>(s.K + 1);
  l.add<std::int64_t>(s.K + 1);
  l.add<double>(with_divisors ? ch.records : 0);
  l.add<double>(with_divisors ? ch.records : 0);
  return l;
}

template <class Dev>
std::size_t exact_temp_bytes(const Dev& dev, const Shape& s, const RotatedExactChunks& ch) {
  return roi_exact_temp_bytes_on(dev, s.K, ch.records, ch.positions);
}

/// The exact mode; with `rounding` (float64 only) the truncated mode, which runs the same phases
/// with divisors and sums the scatter's contributions in the CPU's order. One chunk of whole
/// images at a time: each sorts the chunk's capacity of records (those its rois leave keep the
/// sentinel and sort last), so nothing waits for the device.
template <class T, class Dev>
void exact_backward(const Dev& dev, const RoiAlignRotatedCall& call, const RoiCheck& check, Workspace ws,
                    detail::GradRounding rounding) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const Shape& s = call.shape;
  const RotatedExactChunks ch = rotated_exact_chunks(s, check);
  const std::int64_t cap = ch.records;
  zero_fill<T>(dev, call.features);
  if (cap == 0 || s.K == 0) return;
  const std::size_t temp_bytes = exact_temp_bytes(dev, s, ch);
  WorkspaceLayout layout = exact_layout<A>(s, ch, temp_bytes, truncated);
  check_exact_workspace(call.op, truncated ? "truncated" : "exact", layout.bytes(), ws);
  layout.bind(ws.data);
  const GatherDeviceBuffers<A> g = take_gather<A>(layout, temp_bytes);
  std::int64_t* counts = layout.take<std::int64_t>();
  std::int64_t* roi_offsets = layout.take<std::int64_t>();
  double* divisors = layout.take<double>();
  double* sorted_divisors = layout.take<double>();
  const detail::RoiSource rois = roi_source(call.rois);
  const auto sentinel = static_cast<detail::GatherKey>(ch.positions);
  const bool channels_last = channels_innermost(call.features);
  const std::int64_t max_runs = std::min(cap, ch.positions + 1);
  const detail::Strides4 gi = strides4(call.features);
  T* grad_input = static_cast<T*>(call.features.data);

  for (std::int64_t n0 = 0; n0 < s.N; n0 += ch.images) {
    const detail::ImageRange images{n0, std::min(s.N, n0 + ch.images)};
    // Phase 1: record offsets per roi of the chunk, every record set to the sentinel, then
    // enumerate (the chunk's rois only).
    dev.launch("rotated_count", s.K + 1, CountBody<A>{rois, s, images, counts});
    scan_roi_offsets_on(dev, g, counts, roi_offsets, s.K);
    gather_init(dev, g, cap, sentinel);
    if (truncated)  // records left at the sentinel keep a defined divisor (never read)
      dev.zero(divisors, static_cast<std::size_t>(cap) * sizeof(double));
    const detail::RotatedEnumerateArgs<A> ea{rois,   roi_offsets, s, strides4(call.pooled), g.records,
                                             images, truncated ? divisors : nullptr};
    dev.launch("rotated_enumerate", s.K * s.PH * s.PW, EnumerateBody<A>{ea});

    // Phase 2: the engine's stable radix sort by position, permutation and runs.
    const detail::GatherSorted<A> sorted = gather_sort(dev, g, cap, sentinel);

    // Phase 3: one fixed-order sum per (run, channel) of the chunk's images.
    const auto args = detail::rotated_gather_sum_args<T>(sorted, static_cast<const T*>(call.pooled.data),
                                                         call.pooled.strides[1], grad_input + n0 * gi.s0, gi.s1, s.C,
                                                         sentinel);
    const detail::RoiGatherTarget target{gi, s.H, s.W};
    if constexpr (std::is_same_v<T, double>) {
      if (truncated) {
        dev.launch("rotated_permute_divisors", cap, PermuteDivisorBody{g.sorted_ids, divisors, sorted_divisors});
        dev.launch("rotated_truncated_gather", max_runs * s.C,
                   TruncatedGatherBody{detail::RotatedTruncatedArgs{args, sorted_divisors, target, rounding},
                                       g.num_runs, channels_last});
        continue;
      }
    }
    gather_sum(dev, args, g.num_runs, max_runs, channels_last, target);
  }
}

/// The scatter modes' launch over every grad_output element, adding into `target` (strides `ts`):
/// grad_input (kAtomic) or the truncated mode's double buffer.
template <class T, class Target, class Dev>
void scatter(const Dev& dev, const RoiAlignRotatedCall& call, Target* target, const detail::Strides4& ts,
             detail::GradRounding rounding) {
  detail::RotatedBackwardArgs<T> a{};
  a.grad_output = static_cast<const T*>(call.pooled.data);
  a.go = strides4(call.pooled);
  a.rois = roi_source(call.rois);
  a.gi = ts;
  a.shape = call.shape;
  a.channels_last = channels_innermost(call.pooled);
  using Add = typename Dev::template Add<Target>;
  dev.launch("rotated_scatter", call.pooled.numel(),
             ScatterBody<T, scatter_value_t<T, Target>, Add>{a, rounding, Add{target}});
}

}  // namespace rotated_device

/// The roi check on `dev` (with need_total, the sample totals that size the exact mode).
template <class Dev>
RoiCheck rotated_check_rois_on(const Dev& dev, const RoiAlignRotatedCall& call, bool need_total) {
  const rotated_device::Shape& s = call.shape;
  const detail::RoiSource rois = roi_source(call.rois);
  using MinU64 = typename Dev::MinU64;
  using AddI64 = typename Dev::AddI64;
  const DeviceRoiCheck found = roi_check_on(
      dev, call.features, call.rois, s.K, detail::kRotatedRoiColumns, need_total, true,
      [&](auto a_tag, unsigned long long* first_bad, std::int64_t* counts, std::int64_t* image_samples) {
        dev.launch("rotated_check", s.K,
                   rotated_device::CheckBody<decltype(a_tag), MinU64, AddI64>{rois, s, counts, MinU64{first_bad},
                                                                              AddI64{image_samples}});
      });
  RoiCheck check = roi_check_from_device<RoiCheck>(
      found, detail::kRotatedRoiColumns, call.features.dtype,
      [&](auto a_tag, const double* row) { return detail::make_rotated_box<decltype(a_tag)>(row[0], row + 1, s); });
  if (need_total) check.max_image_samples = found.max_image_samples;
  return check;
}

/// The forward on `dev` into call.pooled (thread order follows the output's memory order).
template <class T, class Dev>
void rotated_forward_on(const Dev& dev, const RoiAlignRotatedCall& call) {
  detail::RotatedForwardArgs<T> a{};
  a.input = static_cast<const T*>(call.features.data);
  a.in = strides4(call.features);
  a.rois = roi_source(call.rois);
  a.output = static_cast<T*>(call.pooled.data);
  a.out = strides4(call.pooled);
  a.shape = call.shape;
  a.channels_last = channels_innermost(call.pooled);
  dev.launch("rotated_forward", call.pooled.numel(), rotated_device::ForwardBody<T>{a});
}

/// Bytes of the backward's workspace on `dev` for the plan (its mode and roi check).
template <class Dev>
std::size_t rotated_backward_workspace_on(const Dev& dev, const RoiAlignRotatedCall& call,
                                          const RoiBackwardPlan& plan) {
  const rotated_device::Shape& s = call.shape;
  const RotatedExactChunks ch = rotated_exact_chunks(s, plan.check);
  return roi_backward_workspace_bytes(call.features.dtype, plan.mode, s, [&](auto a_tag, bool with_divisors) {
    using A = decltype(a_tag);
    return rotated_device::exact_layout<A>(s, ch, rotated_device::exact_temp_bytes(dev, s, ch), with_divisors).bytes();
  });
}

/// The backward on `dev` into call.features (grad_input) as the plan says.
template <class Dev>
void rotated_backward_on(const Dev& dev, const RoiAlignRotatedCall& call, const RoiBackwardPlan& plan,
                         Workspace ws) {
  roi_backward_on(
      dev, call.features, call.shape, call.pooled.numel(), plan, ws,
      [&](auto t_tag, auto* target, const detail::Strides4& ts, detail::GradRounding rounding) {
        rotated_device::scatter<decltype(t_tag)>(dev, call, target, ts, rounding);
      },
      [&](auto t_tag, detail::GradRounding rounding) {
        rotated_device::exact_backward<decltype(t_tag)>(dev, call, plan.check, ws, rounding);
      });
}

}  // namespace internal
}  // namespace detops
