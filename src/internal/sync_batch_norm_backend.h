// What the SyncBatchNorm entry points hand to a backend after validation. Tensors are 4-d views
// [N, C, H, W] of one floating dtype (any strides); per-channel float64 arrays and int64 records
// are plain pointers on the tensors' device. Every function is stream-ordered on ctx.cuda_stream
// for CUDA and must give the same bits as the CPU backend (the math is in
// detops/detail/sync_batch_norm_math.h).
#pragma once

#include <cstdint>

#include "detops/context.h"
#include "detops/detail/sync_batch_norm_math.h"
#include "detops/tensor.h"

namespace detops {
namespace internal {

/// Exponents: forward (dy absent): scales[c] = sbn_exponent(max |x|) over channel c; backward:
/// scales[c] = sbn_exponent(max |dy|), scales[C + c] = sbn_exponent(max |dy * (x - mean[c])|),
/// the product in float64.
void sbn_local_scales_cpu(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* scales,
                          const Context& ctx);
void sbn_local_scales_cuda(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* scales,
                           const Context& ctx);

/// scales[i] = max over r of gathered[r * words + i], i < words.
void sbn_merge_scales_cpu(const std::int64_t* gathered, std::int64_t ranks, std::int64_t words, std::int64_t* scales);
void sbn_merge_scales_cuda(const std::int64_t* gathered, std::int64_t ranks, std::int64_t words, std::int64_t* scales,
                           Device device, const Context& ctx);

/// This rank's forward record (layout in sync_batch_norm_math.h).
void sbn_local_stats_cpu(const TensorView& x, bool exact, const std::int64_t* scales, std::int64_t* record,
                         const Context& ctx);
void sbn_local_stats_cuda(const TensorView& x, bool exact, const std::int64_t* scales, std::int64_t* record,
                          const Context& ctx);

/// This rank's backward record.
void sbn_local_backward_cpu(const TensorView& dy, const TensorView& x, const double* mean, bool exact,
                            const std::int64_t* scales, std::int64_t* record, const Context& ctx);
void sbn_local_backward_cuda(const TensorView& dy, const TensorView& x, const double* mean, bool exact,
                             const std::int64_t* scales, std::int64_t* record, const Context& ctx);

/// sbn_finalize_channel / sbn_finalize_backward_channel for every channel. The CUDA version runs
/// on `device`; num_batches_tracked is incremented once (after every channel read it) when the
/// global count is at least 2 and running statistics are tracked.
void sbn_finalize_cpu(const detail::SbnFinalizeArgs& args);
void sbn_finalize_cuda(const detail::SbnFinalizeArgs& args, Device device, const Context& ctx);
void sbn_finalize_backward_cpu(const detail::SbnBackwardFinalizeArgs& args);
void sbn_finalize_backward_cuda(const detail::SbnBackwardFinalizeArgs& args, Device device, const Context& ctx);

/// Evaluation mode: sbn_eval_channel for every channel.
void sbn_eval_stats_cpu(const detail::SbnParam& running_mean, const detail::SbnParam& running_var, double eps,
                        std::int64_t channels, double* save_mean, double* save_invstd);
void sbn_eval_stats_cuda(const detail::SbnParam& running_mean, const detail::SbnParam& running_var, double eps,
                         std::int64_t channels, double* save_mean, double* save_invstd, Device device,
                         const Context& ctx);

/// y = sbn_apply(x, mean[c], weight[c] * invstd[c], bias[c]) (weight 1 and bias 0 when absent).
void sbn_apply_cpu(const TensorView& x, const detail::SbnParam& weight, const detail::SbnParam& bias,
                   const double* mean, const double* invstd, const TensorView& y, const Context& ctx);
void sbn_apply_cuda(const TensorView& x, const detail::SbnParam& weight, const detail::SbnParam& bias,
                    const double* mean, const double* invstd, const TensorView& y, const Context& ctx);

/// dx = sbn_grad(dy, x, sbn_grad_coef(weight[c], mean[c], invstd[c], sums[c], sums[C + c], sums[2C]));
/// sums == nullptr: evaluation mode (dx = dy * weight * invstd).
void sbn_backward_apply_cpu(const TensorView& dy, const TensorView& x, const detail::SbnParam& weight,
                            const double* mean, const double* invstd, const double* sums, const TensorView& dx,
                            const Context& ctx);
void sbn_backward_apply_cuda(const TensorView& dy, const TensorView& x, const detail::SbnParam& weight,
                             const double* mean, const double* invstd, const double* sums, const TensorView& dx,
                             const Context& ctx);

}  // namespace internal
}  // namespace detops
