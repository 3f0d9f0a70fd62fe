// The CUDA seam in a CPU-only build: every CUDA entry point reports that CUDA is not compiled.
#include <cstring>

#include "internal/common.h"
#include "internal/frozen_batch_norm_backend.h"
#include "internal/roi_align_backend.h"
#include "internal/runtime.h"
#include "internal/sync_batch_norm_backend.h"

namespace detops {
namespace internal {

namespace {
[[noreturn]] void not_compiled(const char* what) {
  fail(ErrorCode::kNotCompiled, "{}: this build of detops has no CUDA backend (configure with DETOPS_CUDA=ON)", what);
}
}  // namespace

bool cuda_backend_compiled() { return false; }
int cuda_devices(std::string* why) {
  if (why) *why = "this build of detops has no CUDA backend (configure with DETOPS_CUDA=ON)";
  return 0;
}
void* cuda_malloc(std::size_t, Device) { not_compiled("cuda_malloc"); }
void cuda_free(void*, Device) noexcept {}
void* cuda_malloc_async(std::size_t, Device, void*) { not_compiled("cuda_malloc_async"); }
void cuda_free_async(void*, Device, void*) noexcept {}
void copy_bytes(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  if (!dd.is_cpu() || !sd.is_cpu()) not_compiled("copy_bytes");
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_bytes_async(void* dst, Device dd, const void* src, Device sd, std::size_t bytes, void*) {
  copy_bytes(dst, dd, src, sd, bytes);
}
void cuda_memset(void*, int, std::size_t, Device) { not_compiled("cuda_memset"); }
void cuda_stream_synchronize(Device, void*) { not_compiled("cuda_stream_synchronize"); }

RoiCheck roi_align_check_rois_cuda(const RoiAlignCall&, bool, bool, const Context&) { not_compiled("roi_align"); }
void roi_align_forward_cuda(const RoiAlignCall&, const Context&) { not_compiled("roi_align_forward"); }
std::size_t roi_align_backward_workspace_cuda(const RoiAlignCall&, const RoiCheck&, BackwardMode) {
  not_compiled("roi_align_backward");
}
void roi_align_backward_cuda(const RoiAlignCall&, const RoiCheck&, const RoiAlignBackwardOptions&, const Context&,
                             Workspace) {
  not_compiled("roi_align_backward");
}

void frozen_bn_cuda(const FrozenBnCall& call, const Context&) { not_compiled(call.op); }

void sbn_local_scales_cuda(const TensorView&, const TensorView&, const double*, std::int64_t*, const Context&) {
  not_compiled("sync_batch_norm");
}
void sbn_merge_scales_cuda(const std::int64_t*, std::int64_t, std::int64_t, std::int64_t*, Device, const Context&) {
  not_compiled("sync_batch_norm");
}
void sbn_local_stats_cuda(const TensorView&, bool, const std::int64_t*, std::int64_t*, const Context&) {
  not_compiled("sync_batch_norm");
}
void sbn_local_backward_cuda(const TensorView&, const TensorView&, const double*, bool, const std::int64_t*,
                             std::int64_t*, const Context&) {
  not_compiled("sync_batch_norm");
}
void sbn_finalize_cuda(const detail::SbnFinalizeArgs&, Device, const Context&) { not_compiled("sync_batch_norm"); }
void sbn_finalize_backward_cuda(const detail::SbnBackwardFinalizeArgs&, Device, const Context&) {
  not_compiled("sync_batch_norm");
}
void sbn_eval_stats_cuda(const detail::SbnParam&, const detail::SbnParam&, double, std::int64_t, double*, double*,
                         Device, const Context&) {
  not_compiled("sync_batch_norm");
}
void sbn_apply_cuda(const TensorView&, const detail::SbnParam&, const detail::SbnParam&, const double*, const double*,
                    const TensorView&, const Context&) {
  not_compiled("sync_batch_norm");
}
void sbn_backward_apply_cuda(const TensorView&, const TensorView&, const detail::SbnParam&, const double*,
                             const double*, const double*, const TensorView&, const Context&) {
  not_compiled("sync_batch_norm");
}

}  // namespace internal
}  // namespace detops
