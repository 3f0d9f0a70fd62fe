// SyncBatchNorm's CPU backend: the math of detops/detail/sync_batch_norm_math.h over strided
// views. The loops live in sync_batch_norm_cpu_kernels.inc, compiled here once per instruction-set
// variant (internal/cpu_isa.h) and chosen per call by Context::cpu_isa; every variant gives the
// same bits. The per-channel constants and the O(C) phases stay here (not worth vectorizing).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "internal/common.h"
#include "internal/cpu_isa.h"
#include "internal/sync_batch_norm_backend.h"

namespace detops {
namespace internal {
namespace {

/// Per-channel constants of sbn_apply_cpu: y = sbn_apply(x, mean[c], scale[c], shift[c]).
struct SbnApplyCoefs {
  const double* mean;
  const double* scale;
  const double* shift;
};
/// Per-channel constants of sbn_backward_apply_cpu (SbnGradCoef as separate arrays, so that the
/// channels-inner walk vectorizes over them).
struct SbnGradCoefs {
  const double* k;
  const double* mdy;
  const double* kx;
  const double* mean;
};

/// A variant's entry points.
struct SbnCpuKernels {
  void (*local_scales)(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* scales,
                       const Context& ctx);
  void (*local_stats)(const TensorView& x, bool exact, const std::int64_t* scales, std::int64_t* record,
                      const Context& ctx);
  void (*local_backward)(const TensorView& dy, const TensorView& x, const double* mean, bool exact,
                         const std::int64_t* scales, std::int64_t* record, const Context& ctx);
  void (*apply)(const TensorView& x, const SbnApplyCoefs& k, const TensorView& y, const Context& ctx);
  void (*backward_apply)(const TensorView& dy, const TensorView& x, const SbnGradCoefs& k, const TensorView& dx,
                         const Context& ctx);
};

}  // namespace

namespace sbn_baseline {
#include "sync_batch_norm_cpu_kernels.inc"
}  // namespace sbn_baseline

#if DETOPS_X86_ISA_VARIANTS
DETOPS_ISA_BEGIN(DETOPS_ISA_AVX2_TARGETS)
namespace sbn_avx2 {
#include "sync_batch_norm_cpu_kernels.inc"
}  // namespace sbn_avx2
DETOPS_ISA_END

DETOPS_ISA_BEGIN(DETOPS_ISA_AVX512_TARGETS)
namespace sbn_avx512 {
#include "sync_batch_norm_cpu_kernels.inc"
}  // namespace sbn_avx512
DETOPS_ISA_END
#else
namespace sbn_avx2 {
using sbn_baseline::kKernels;
}
namespace sbn_avx512 {
using sbn_baseline::kKernels;
}
#endif

namespace {
const SbnCpuKernels& kernels(const Context& ctx) {
  return kernels_for(ctx, sbn_baseline::kKernels, sbn_avx2::kKernels, sbn_avx512::kKernels);
}
}  // namespace

void sbn_local_scales_cpu(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* scales,
                          const Context& ctx) {
  kernels(ctx).local_scales(x, dy, mean, scales, ctx);
}

void sbn_merge_scales_cpu(const std::int64_t* gathered, std::int64_t ranks, std::int64_t words, std::int64_t* scales) {
  for (std::int64_t i = 0; i < words; ++i) {
    std::int64_t m = detail::kSbnZeroExponent;
    for (std::int64_t r = 0; r < ranks; ++r) m = std::max(m, gathered[r * words + i]);
    scales[i] = m;
  }
}

void sbn_local_stats_cpu(const TensorView& x, bool exact, const std::int64_t* scales, std::int64_t* record,
                         const Context& ctx) {
  kernels(ctx).local_stats(x, exact, scales, record, ctx);
}

void sbn_local_backward_cpu(const TensorView& dy, const TensorView& x, const double* mean, bool exact,
                            const std::int64_t* scales, std::int64_t* record, const Context& ctx) {
  kernels(ctx).local_backward(dy, x, mean, exact, scales, record, ctx);
}

void sbn_finalize_cpu(const detail::SbnFinalizeArgs& args) {
  for (std::int64_t c = 0; c < args.channels; ++c) detail::sbn_finalize_channel(args, c);
  if (args.num_batches_tracked && args.running_mean.data &&
      detail::sbn_forward_count(args.gathered, args.ranks, args.words, args.exact) >= 2)
    args.num_batches_tracked[0] = detail::sbn_next_count(args.num_batches_tracked[0]);
}

void sbn_finalize_backward_cpu(const detail::SbnBackwardFinalizeArgs& args) {
  detail::sbn_finalize_backward_count(args);
  for (std::int64_t c = 0; c < args.channels; ++c) detail::sbn_finalize_backward_channel(args, c);
}

void sbn_eval_stats_cpu(const detail::SbnParam& running_mean, const detail::SbnParam& running_var, double eps,
                        std::int64_t channels, double* save_mean, double* save_invstd) {
  for (std::int64_t c = 0; c < channels; ++c)
    detail::sbn_eval_channel(running_mean, running_var, eps, save_mean, save_invstd, c);
}

void sbn_apply_cpu(const TensorView& x, const detail::SbnParam& weight, const detail::SbnParam& bias,
                   const double* mean, const double* invstd, const TensorView& y, const Context& ctx) {
  const std::int64_t C = x.sizes[1];
  std::vector<double> scale(static_cast<std::size_t>(C)), shift(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) {
    scale[static_cast<std::size_t>(c)] = detail::sbn_load(weight, c, 1.0) * invstd[c];
    shift[static_cast<std::size_t>(c)] = detail::sbn_load(bias, c, 0.0);
  }
  kernels(ctx).apply(x, SbnApplyCoefs{mean, scale.data(), shift.data()}, y, ctx);
}

void sbn_backward_apply_cpu(const TensorView& dy, const TensorView& x, const detail::SbnParam& weight,
                            const double* mean, const double* invstd, const double* sums, const TensorView& dx,
                            const Context& ctx) {
  const std::int64_t C = x.sizes[1];
  std::vector<double> k(static_cast<std::size_t>(C)), mdy(k.size()), kx(k.size()), mu(k.size());
  for (std::int64_t c = 0; c < C; ++c) {
    const double w = detail::sbn_load(weight, c, 1.0);
    const detail::SbnGradCoef g = sums ? detail::sbn_grad_coef(w, mean[c], invstd[c], sums[c], sums[C + c], sums[2 * C])
                                       : detail::sbn_grad_coef(w, mean[c], invstd[c], 0.0, 0.0, 0.0);
    const auto i = static_cast<std::size_t>(c);
    k[i] = g.k, mdy[i] = g.mdy, kx[i] = g.kx, mu[i] = g.mean;
  }
  kernels(ctx).backward_apply(dy, x, SbnGradCoefs{k.data(), mdy.data(), kx.data(), mu.data()}, dx, ctx);
}

}  // namespace internal
}  // namespace detops
