// What the RoIAlign entry points hand to a backend after validation: the views, the scalar
// shape, and what the roi check learned; and the backend table. Shared by
// src/cpu/roi_align_cpu.cpp and cuda/roi_align_cuda.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/context.h"
#include "detops/detail/roi_align_kernels.h"
#include "detops/roi_align.h"
#include "internal/common.h"

namespace detops {
namespace internal {

/// One validated call. For the forward, `features` is the input and `pooled` the output; for
/// the backward, `features` is grad_input and `pooled` grad_output.
struct RoiAlignCall {
  const char* op;
  TensorView features;
  TensorView rois;
  TensorView pooled;
  TensorView argmax;  // absent unless max pooling
  detail::RoiAlignShape shape;
  bool max_pool;
};

/// What checking the rois found: the first invalid row (-1 if none) with its status, and the
/// total number of samples over all rois (-1 if not computed).
struct RoiCheck {
  std::int64_t bad_row = -1;
  detail::RoiStatus status = detail::RoiStatus::kOk;
  double row[5] = {};  // the bad row's values, for the message
  std::int64_t grid_h = 0, grid_w = 0;
  std::int64_t total_samples = -1;
};

inline detail::Strides4 strides4(const TensorView& v) {
  return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
}
inline detail::RoiSource roi_source(const TensorView& r) { return {r.data, r.dtype, r.strides[0], r.strides[1]}; }
inline detail::GradRounding grad_rounding(const RoiAlignBackwardOptions& b) {
  if (b.mode != BackwardMode::kTruncated) return detail::GradRounding::kNone;
  return b.truncation == TruncationFormat::kFloat16 ? detail::GradRounding::kFloat16 : detail::GradRounding::kBFloat16;
}

/// Bytes of the truncated mode's dense double accumulator (every element of grad_input), which
/// the CPU backends and CUDA's 16- and 32-bit truncated modes of both roi ops use.
inline std::size_t truncated_buffer_bytes(const detail::RoiAlignShape& s) {
  WorkspaceLayout l;
  l.add<double>(s.N * s.C * s.H * s.W);
  return l.bytes();
}

/// Slots the exact mode enumerates: 4 per sample. Known without reading rois for a fixed
/// sampling ratio; otherwise from the check.
inline std::int64_t exact_slot_capacity(const detail::RoiAlignShape& s, const RoiCheck& check) {
  if (s.sampling_ratio > 0) return 4 * s.K * s.PH * s.PW * s.sampling_ratio * s.sampling_ratio;
  return 4 * (check.total_samples < 0 ? 0 : check.total_samples);
}

/// The exact mode's slot arrays in a workspace: add_records() sizes one set (keys and ids only
/// when `with_keys`; divisors only with `with_divisors`, CUDA's float64 truncated mode),
/// take_records() takes it back in the same order after bind(), with the same `with_divisors`.
template <class A>
void add_records(WorkspaceLayout& l, std::int64_t cap, bool with_keys, bool with_divisors = false) {
  l.add<std::uint64_t>(with_keys ? cap : 0);
  l.add<std::int64_t>(with_keys ? cap : 0);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int32_t>(cap);
  if (with_divisors) l.add<double>(cap);
}
template <class A>
detail::ExactRecords<A> take_records(WorkspaceLayout& l, bool with_divisors = false) {
  detail::ExactRecords<A> r;
  r.keys = l.take<std::uint64_t>();
  r.ids = l.take<std::int64_t>();
  r.weights = l.take<A>();
  r.go_offsets = l.take<std::int64_t>();
  r.am_offsets = l.take<std::int64_t>();
  r.samples = l.take<std::int32_t>();
  r.divisors = with_divisors ? l.take<double>() : nullptr;
  return r;
}

/// Phase 3's arguments: the sorted slots, their runs, and the call's tensors.
template <class T>
detail::GatherArgs<T> make_gather_args(const RoiAlignCall& call, const detail::ExactRecords<acc_t<T>>& sorted,
                                       const std::uint64_t* run_keys, const std::int64_t* run_offsets,
                                       const std::int64_t* run_lengths) {
  detail::GatherArgs<T> ga{};
  ga.sorted = {run_keys, run_offsets, run_lengths, sorted.weights, sorted.go_offsets};
  ga.grad_output = static_cast<const T*>(call.pooled.data);
  ga.go_c = call.pooled.strides[1];
  ga.active = {static_cast<const std::int32_t*>(call.argmax.data), sorted.am_offsets, sorted.samples,
               call.max_pool ? call.argmax.strides[1] : 0, call.max_pool};
  ga.grad_input = static_cast<T*>(call.features.data);
  ga.gi = strides4(call.features);
  ga.shape = call.shape;
  ga.divisors = sorted.divisors;  // null unless CUDA's float64 truncated mode (set ga.rounding too)
  return ga;
}

/// A RoIAlign backend: one table per device (internal/backend.h), defined at the bottom of
/// src/cpu/roi_align_cpu.cpp and cuda/roi_align_cuda.cu.
struct RoiAlignBackend {
  /// Checks every roi row (the first invalid one with its status) and, with need_total, totals
  /// the samples (exact mode with adaptive sampling). CUDA: one wait on ctx.cuda_stream.
  RoiCheck (*check_rois)(const RoiAlignCall& call, bool need_total, const Context& ctx);
  void (*forward)(const RoiAlignCall& call, const Context& ctx);
  /// Bytes of the backward's WorkspaceLayout (without the alignment slack) for `mode`.
  std::size_t (*backward_workspace)(const RoiAlignCall& call, const RoiCheck& check, BackwardMode mode);
  /// The backward into call.features (grad_input); ws is the layout's memory, kWorkspaceAlign-aligned.
  void (*backward)(const RoiAlignCall& call, const RoiCheck& check, const RoiAlignBackwardOptions& opt,
                   const Context& ctx, Workspace ws);
  /// Whether the backward in `mode` enumerates (position, weight, bin) slots, 4 per sample, so its
  /// workspace follows the sample count: the exact mode everywhere; on CUDA also the float64
  /// truncated mode, which runs the exact mode's phases so that its double sums come out in the
  /// CPU's order (double atomics would leave the scheduling order in them).
  bool (*uses_slots)(const RoiAlignCall& call, BackwardMode mode);
};
extern const RoiAlignBackend kRoiAlignCpu;
extern const RoiAlignBackend kRoiAlignCuda;

}  // namespace internal
}  // namespace detops
