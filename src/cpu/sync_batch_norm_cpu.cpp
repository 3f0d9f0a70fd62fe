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

/// Per-channel constants of apply(): y = sbn_apply(x, mean[c], scale[c], shift[c]).
struct SbnApplyCoefs {
  const double* mean;
  const double* scale;
  const double* shift;
};
/// Per-channel constants of backward_apply() (SbnGradCoef as separate arrays, so that the
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

#define DETOPS_CPU_KERNELS_FILE "sync_batch_norm_cpu_kernels.inc"
#include "cpu/cpu_variants.inc"

namespace {

std::size_t scratch_bytes(SbnPass, const TensorView&, bool) { return 0; }  // host vectors of its own

void local_scales(const SbnLocalCall& a, const Context& ctx) {
  cpu_kernels(ctx).local_scales(a.x, a.dy, a.mean, a.out, ctx);
}

void merge_scales(const SbnMergeCall& a, const Context&) {
  for (std::int64_t i = 0; i < a.words; ++i) {
    std::int64_t m = detail::kSbnZeroExponent;
    for (std::int64_t r = 0; r < a.ranks; ++r) m = std::max(m, a.gathered[r * a.words + i]);
    a.scales[i] = m;
  }
}

void local_stats(const SbnLocalCall& a, const Context& ctx, Workspace) {
  cpu_kernels(ctx).local_stats(a.x, a.exact, a.scales, a.out, ctx);
}

void local_backward(const SbnLocalCall& a, const Context& ctx, Workspace) {
  cpu_kernels(ctx).local_backward(a.dy, a.x, a.mean, a.exact, a.scales, a.out, ctx);
}

void finalize(const detail::SbnFinalizeArgs& args, Device, const Context&) {
  for (std::int64_t c = 0; c < args.channels; ++c) detail::sbn_finalize_channel(args, c);
  if (args.num_batches_tracked && args.running_mean.data &&
      detail::sbn_forward_count(args.gathered, args.ranks, args.words, args.exact) >= 2)
    args.num_batches_tracked[0] = detail::sbn_next_count(args.num_batches_tracked[0]);
}

void finalize_backward(const detail::SbnBackwardFinalizeArgs& args, Device, const Context&) {
  detail::sbn_finalize_backward_count(args);
  for (std::int64_t c = 0; c < args.channels; ++c) detail::sbn_finalize_backward_channel(args, c);
}

void eval_stats(const SbnEvalCall& a, const Context&) {
  for (std::int64_t c = 0; c < a.channels; ++c)
    detail::sbn_eval_channel(a.running_mean, a.running_var, a.eps, a.save_mean, a.save_invstd, c);
}

void apply(const SbnApplyCall& a, const Context& ctx) {
  const std::int64_t C = a.x.sizes[1];
  std::vector<double> scale(static_cast<std::size_t>(C)), shift(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) {
    scale[static_cast<std::size_t>(c)] = detail::sbn_load(a.weight, c, 1.0) * a.invstd[c];
    shift[static_cast<std::size_t>(c)] = detail::sbn_load(a.bias, c, 0.0);
  }
  cpu_kernels(ctx).apply(a.x, SbnApplyCoefs{a.mean, scale.data(), shift.data()}, a.y, ctx);
}

void backward_apply(const SbnBackwardApplyCall& a, const Context& ctx, Workspace) {
  const std::int64_t C = a.x.sizes[1];
  const double* sums = a.sums;
  std::vector<double> k(static_cast<std::size_t>(C)), mdy(k.size()), kx(k.size()), mu(k.size());
  for (std::int64_t c = 0; c < C; ++c) {
    const double w = detail::sbn_load(a.weight, c, 1.0);
    const detail::SbnGradCoef g = sums ? detail::sbn_grad_coef(w, a.mean[c], a.invstd[c], sums[c], sums[C + c], sums[2 * C])
                                       : detail::sbn_grad_coef(w, a.mean[c], a.invstd[c], 0.0, 0.0, 0.0);
    const auto i = static_cast<std::size_t>(c);
    k[i] = g.k, mdy[i] = g.mdy, kx[i] = g.kx, mu[i] = g.mean;
  }
  cpu_kernels(ctx).backward_apply(a.dy, a.x, SbnGradCoefs{k.data(), mdy.data(), kx.data(), mu.data()}, a.dx, ctx);
}

}  // namespace

extern const SyncBnBackend kSyncBnCpu = {&scratch_bytes, &local_scales, &merge_scales, &local_stats,
                                         &local_backward, &finalize, &finalize_backward, &eval_stats,
                                         &apply, &backward_apply};

}  // namespace internal
}  // namespace detops
