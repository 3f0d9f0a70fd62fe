// CUDA backend of SyncBatchNorm: the entry points only. The launch sequences (chunk passes, the
// per-channel tree and exact reductions, exponents, finalize, apply and backward apply) are
// written once over the device interface (src/internal/sync_batch_norm_device.h, which states
// them) and run here on CudaDevice (cuda/cuda_device.cuh: the warp and block bodies' thread group
// is the calling thread, butterfly = __shfl_xor_sync, sync = __syncthreads), on the caller's
// stream. tests/sync_batch_norm_emulated_test.cpp runs the same steps on an emulated device.
#include <cstddef>

#include "cuda_check.cuh"
#include "cuda_device.cuh"
#include "detops/detail/sync_batch_norm_kernels.h"
#include "internal/sync_batch_norm_backend.h"
#include "internal/sync_batch_norm_device.h"

namespace detops {
namespace internal {

namespace {

static_assert(kBlock == detail::kSbnBlock, "the bodies' block size is the launches'");
static_assert(kWarpLanes == detail::kSbnLanes, "the bodies' lanes are a warp's");

std::size_t scratch_bytes(SbnPass pass, const TensorView& x, bool exact) {
  return sbn_pass_layout(pass, x, exact).bytes();
}

void local_scales(const SbnLocalCall& call, const Context& ctx) {
  const char* op = "sync_batch_norm_local_scales";
  DeviceGuard guard(call.x.device.index, op);
  sbn_local_scales_on(CudaDevice{ctx, op}, call);
}

void merge_scales(const SbnMergeCall& a, const Context& ctx) {
  const char* op = "sync_batch_norm_merge_scales";
  DeviceGuard guard(a.device.index, op);
  sbn_merge_scales_on(CudaDevice{ctx, op}, a);
}

void local_stats(const SbnLocalCall& a, const Context& ctx, Workspace ws) {
  const char* op = "sync_batch_norm_local_stats";
  DeviceGuard guard(a.x.device.index, op);
  sbn_local_stats_on(CudaDevice{ctx, op}, a, ws);
}

void local_backward(const SbnLocalCall& a, const Context& ctx, Workspace ws) {
  const char* op = "sync_batch_norm_local_backward";
  DeviceGuard guard(a.x.device.index, op);
  sbn_local_backward_on(CudaDevice{ctx, op}, a, ws);
}

void finalize(const detail::SbnFinalizeArgs& args, Device device, const Context& ctx) {
  const char* op = "sync_batch_norm_finalize_stats";
  DeviceGuard guard(device.index, op);
  sbn_finalize_on(CudaDevice{ctx, op}, args);
}

void finalize_backward(const detail::SbnBackwardFinalizeArgs& args, Device device, const Context& ctx) {
  const char* op = "sync_batch_norm_finalize_backward";
  DeviceGuard guard(device.index, op);
  sbn_finalize_backward_on(CudaDevice{ctx, op}, args);
}

void eval_stats(const SbnEvalCall& a, const Context& ctx) {
  const char* op = "sync_batch_norm_forward";
  DeviceGuard guard(a.device.index, op);
  sbn_eval_stats_on(CudaDevice{ctx, op}, a);
}

void apply(const SbnApplyCall& a, const Context& ctx) {
  const char* op = "sync_batch_norm_apply";
  DeviceGuard guard(a.x.device.index, op);
  sbn_apply_on(CudaDevice{ctx, op}, a);
}

void backward_apply(const SbnBackwardApplyCall& a, const Context& ctx, Workspace ws) {
  const char* op = "sync_batch_norm_backward_apply";
  DeviceGuard guard(a.x.device.index, op);
  sbn_backward_apply_on(CudaDevice{ctx, op}, a, ws);
}

}  // namespace

extern const SyncBnBackend kSyncBnCuda = {&scratch_bytes, &local_scales, &merge_scales, &local_stats,
                                          &local_backward, &finalize, &finalize_backward, &eval_stats,
                                          &apply, &backward_apply};

}  // namespace internal
}  // namespace detops
