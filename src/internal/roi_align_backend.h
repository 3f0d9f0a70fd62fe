// What the RoIAlign entry points hand to a backend after validation: the views, the scalar
// shape, and what the roi check learned; and the backend table. Shared by
// src/cpu/roi_align_cpu.cpp and cuda/roi_align_cuda.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/backward_mode.h"
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

/// What checking the rois found, for both roi ops: the first invalid row (-1 if none) with its
/// status and values; with need_total, the total number of samples over all rois and (for
/// RoIAlignRotated's chunks of images) the most samples the rois of one image hold (-1 if not
/// computed).
struct RoiCheck {
  std::int64_t bad_row = -1;
  detail::RoiStatus status = detail::RoiStatus::kOk;
  double row[6] = {};  // the bad row's values, for the message (5 columns; 6 for rotated rois)
  std::int64_t grid_h = 0, grid_w = 0;
  std::int64_t total_samples = -1;
  std::int64_t max_image_samples = -1;
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

/// The CPU exact mode's slot arrays in a workspace: add_records() sizes one set (keys only when
/// `with_keys`; argmax offsets and samples only for max pooling; no ids: the CPU sort makes its
/// own permutation), take_records() takes it back in the same order after bind(), with the same
/// flags. (CUDA's come from the engine's buffers plus roi_align_device.h's extras.)
template <class A>
void add_records(WorkspaceLayout& l, std::int64_t cap, bool with_keys, bool max_pool) {
  l.add<detail::GatherKey>(with_keys ? cap : 0);
  l.add<A>(cap);
  l.add<std::int64_t>(cap);
  l.add<std::int64_t>(max_pool ? cap : 0);
  l.add<std::int32_t>(max_pool ? cap : 0);
}
template <class A>
detail::ExactRecords<A> take_records(WorkspaceLayout& l, bool with_keys, bool max_pool) {
  detail::ExactRecords<A> r;
  detail::GatherKey* keys = l.take<detail::GatherKey>();  // (the arrays not wanted are empty)
  r.keys = with_keys ? keys : nullptr;
  r.ids = nullptr;
  r.weights = l.take<A>();
  r.go_offsets = l.take<std::int64_t>();
  std::int64_t* am_offsets = l.take<std::int64_t>();
  std::int32_t* samples = l.take<std::int32_t>();
  r.am_offsets = max_pool ? am_offsets : nullptr;
  r.samples = max_pool ? samples : nullptr;
  r.divisors = nullptr;
  return r;
}

/// Phase 3's arguments: the sorted slots, their runs, and the call's tensors.
template <class T>
detail::GatherArgs<T> make_gather_args(const RoiAlignCall& call, const detail::ExactRecords<acc_t<T>>& sorted,
                                       const detail::GatherKey* run_keys, const detail::GatherIndex* run_offsets,
                                       const detail::GatherIndex* run_lengths) {
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

/// A roi op's backward, decoded once per call (CUTLASS's can_implement -> get_workspace_size ->
/// run): the mode and rounding taken from the options, whether the backend enumerates records
/// (so that its workspace follows the rois' samples), the roi check with the totals that needs,
/// and the workspace's layout bytes. The workspace query returns its bytes; the backward reads it
/// and decodes nothing again. One type for both roi ops.
struct RoiBackwardPlan {
  BackwardMode mode = BackwardMode::kExact;
  detail::GradRounding rounding = detail::GradRounding::kNone;  // the truncated mode's format
  bool enumerates = false;   // records in the workspace: the exact mode; CUDA's float64 truncated mode
  RoiCheck check;            // the rois' check (with the sample totals when the workspace needs them)
  std::size_t workspace = 0; // the layout's bytes, without the alignment slack
};

/// The exact mode's records (4 per sample, `samples` in all) stay within 2^40: sized in double
/// first, so that a huge problem is an error, not an overflow.
inline void check_record_budget(const char* op, BackwardMode mode, const detail::RoiAlignShape& s,
                                std::int64_t total_samples) {
  const double samples = s.sampling_ratio > 0 ? static_cast<double>(s.K) * static_cast<double>(s.PH) *
                                                    static_cast<double>(s.PW) * static_cast<double>(s.sampling_ratio) *
                                                    static_cast<double>(s.sampling_ratio)
                                              : static_cast<double>(total_samples);
  if (4.0 * samples > static_cast<double>(std::int64_t{1} << 40))
    fail(ErrorCode::kOutOfMemory, "{}: the {} mode would need {} records (4 per sample); expected at most 2^40 "
         "(use fewer rois per call or a smaller sampling_ratio)", op, to_string(mode), 4.0 * samples);
}

/// Builds a roi op's plan. The front end passes its backend's steps, the emulated tests the CUDA
/// backend's on the emulated device, so both run this one sequence:
///   check_rois(need_total) -> RoiCheck: the roi check (need_total: the op's rule, from enumerates);
///   bytes(plan) -> std::size_t: the backend's layout bytes for the plan so far.
/// No rois or no channels: no workspace.
template <class CheckRois, class Bytes>
RoiBackwardPlan plan_roi_backward(const char* op, const detail::RoiAlignShape& s,
                                         const RoiAlignBackwardOptions& b, bool enumerates, bool need_total,
                                         CheckRois&& check_rois, Bytes&& bytes) {
  RoiBackwardPlan plan;
  plan.mode = b.mode;
  plan.rounding = grad_rounding(b);
  plan.enumerates = enumerates;
  plan.check = check_rois(need_total);
  if (s.K == 0 || s.C == 0) return plan;
  if (enumerates) check_record_budget(op, b.mode, s, plan.check.total_samples);
  plan.workspace = bytes(static_cast<const RoiBackwardPlan&>(plan));
  return plan;
}

/// RoIAlign's plan: with adaptive sampling, slots follow the rois, so the check totals their samples.
template <class CheckRois, class Bytes>
RoiBackwardPlan plan_roi_align_backward(const RoiAlignCall& call, const RoiAlignBackwardOptions& b, bool enumerates,
                                     CheckRois&& check_rois, Bytes&& bytes) {
  return plan_roi_backward(call.op, call.shape, b, enumerates, enumerates && call.shape.sampling_ratio <= 0,
                                     check_rois, bytes);
}

/// A roi op's backend: one table per op and device (internal/backend.h), defined at the bottom of
/// src/cpu/<op>_cpu.cpp and cuda/<op>_cuda.cu. Call: the op's validated call.
template <class Call>
struct RoiBackend {
  /// Checks every roi row (the first invalid one with its status) and, with need_total, totals
  /// the samples (for the workspace). CUDA: one wait on ctx.cuda_stream.
  RoiCheck (*check_rois)(const Call& call, bool need_total, const Context& ctx);
  void (*forward)(const Call& call, const Context& ctx);
  /// Whether the backward in `mode` enumerates records, 4 per sample, so that its workspace
  /// follows the sample count: the exact mode everywhere; on CUDA also the float64 truncated
  /// mode, which runs the exact mode's phases so that its double sums come out in the CPU's order
  /// (double atomics would leave the scheduling order in them). Asked once per call, by the plan.
  bool (*enumerates)(const Call& call, BackwardMode mode);
  /// Bytes of the backward's WorkspaceLayout (without the alignment slack) for the plan.
  std::size_t (*backward_workspace)(const Call& call, const RoiBackwardPlan& plan);
  /// The backward into call.features (grad_input); ws: plan.workspace bytes, kWorkspaceAlign-aligned.
  void (*backward)(const Call& call, const RoiBackwardPlan& plan, const Context& ctx, Workspace ws);
};
using RoiAlignBackend = RoiBackend<RoiAlignCall>;
extern const RoiAlignBackend kRoiAlignCpu;
extern const RoiAlignBackend kRoiAlignCuda;

}  // namespace internal
}  // namespace detops
