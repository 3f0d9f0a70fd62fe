// What the SyncBatchNorm entry points hand to a backend after validation, and the backend table
// (internal/backend.h). Tensors are 4-d views [N, C, H, W] of one floating dtype (any strides);
// per-channel float64 arrays and int64 records are plain pointers on the tensors' device. Every
// function is stream-ordered on ctx.cuda_stream for CUDA and must give the same bits as the CPU
// backend (the math is in detops/detail/sync_batch_norm_math.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/context.h"
#include "detops/detail/sync_batch_norm_math.h"
#include "detops/tensor.h"

namespace detops {
namespace internal {

/// A local pass over x (and dy in the backward): the exponents (local_scales) or the record
/// (local_stats, local_backward; layout in sync_batch_norm_math.h).
struct SbnLocalCall {
  TensorView x;
  TensorView dy;                        ///< absent: the forward's pass
  const double* mean = nullptr;         ///< backward: save_mean
  bool exact = false;
  const std::int64_t* scales = nullptr;  ///< exact mode: the merged exponents
  std::int64_t* out = nullptr;           ///< the exponents or the record
};

/// scales[i] = max over r of gathered[r * words + i], i < words.
struct SbnMergeCall {
  const std::int64_t* gathered;
  std::int64_t ranks, words;
  std::int64_t* scales;
  Device device;
};

/// Evaluation mode: sbn_eval_channel for every channel.
struct SbnEvalCall {
  detail::SbnParam running_mean, running_var;
  double eps;
  std::int64_t channels;
  double* save_mean;
  double* save_invstd;
  Device device;
};

/// y = sbn_apply(x, mean[c], weight[c] * invstd[c], bias[c]) (weight 1 and bias 0 when absent).
struct SbnApplyCall {
  TensorView x;
  detail::SbnParam weight, bias;
  const double* mean;
  const double* invstd;
  TensorView y;
};

/// dx = sbn_grad(dy, x, sbn_grad_coef(weight[c], mean[c], invstd[c], sums[c], sums[C + c], sums[2C]));
/// sums == nullptr: evaluation mode (dx = dy * weight * invstd).
struct SbnBackwardApplyCall {
  TensorView dy, x;
  detail::SbnParam weight;
  const double* mean;
  const double* invstd;
  const double* sums;
  TensorView dx;
};

/// The passes that use backend scratch (SyncBnBackend::scratch_bytes).
enum class SbnPass { kLocalStats, kLocalBackward, kBackwardApply };

/// A SyncBatchNorm backend: one table per device, defined at the bottom of
/// src/cpu/sync_batch_norm_cpu.cpp and cuda/sync_batch_norm_cuda.cu.
struct SyncBnBackend {
  /// Bytes of the WorkspaceLayout `pass` carves from its `ws` (without the alignment slack) for x
  /// (exact: the exact mode's pass); 0 when the backend needs none.
  std::size_t (*scratch_bytes)(SbnPass pass, const TensorView& x, bool exact);
  /// Exponents: forward (dy absent): scales[c] = sbn_exponent(max |x|) over channel c; backward:
  /// scales[c] = sbn_exponent(max |dy|), scales[C + c] = sbn_exponent(max |dy * (x - mean[c])|),
  /// the product in float64.
  void (*local_scales)(const SbnLocalCall& call, const Context& ctx);
  void (*merge_scales)(const SbnMergeCall& call, const Context& ctx);
  /// This rank's forward / backward record; ws: scratch_bytes(kLocalStats / kLocalBackward)
  /// bytes, kWorkspaceAlign-aligned.
  void (*local_stats)(const SbnLocalCall& call, const Context& ctx, Workspace ws);
  void (*local_backward)(const SbnLocalCall& call, const Context& ctx, Workspace ws);
  /// sbn_finalize_channel / sbn_finalize_backward_channel for every channel on `device`;
  /// num_batches_tracked is incremented once (after every channel read it) when the global count
  /// is at least 2 and running statistics are tracked.
  void (*finalize)(const detail::SbnFinalizeArgs& args, Device device, const Context& ctx);
  void (*finalize_backward)(const detail::SbnBackwardFinalizeArgs& args, Device device, const Context& ctx);
  void (*eval_stats)(const SbnEvalCall& call, const Context& ctx);
  void (*apply)(const SbnApplyCall& call, const Context& ctx);
  /// ws: scratch_bytes(kBackwardApply) bytes, kWorkspaceAlign-aligned.
  void (*backward_apply)(const SbnBackwardApplyCall& call, const Context& ctx, Workspace ws);
};
extern const SyncBnBackend kSyncBnCpu;
extern const SyncBnBackend kSyncBnCuda;

}  // namespace internal
}  // namespace detops
