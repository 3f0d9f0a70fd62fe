// The roi ops' shared CUDA sequences (src/internal/roi_device.h) bound to CudaDevice, under their
// earlier names, for RoIAlign's backend, which still launches its own kernels. Everything is
// enqueued on the caller's stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_check.cuh"
#include "cuda_device.cuh"
#include "gather_backward.cuh"
#include "zero_fill.cuh"
#include "internal/roi_device.h"

namespace detops {
namespace internal {

/// roi_check_on on CUDA; launch(A{}, first_bad, counts, image_samples) launches the op's own
/// check kernel `kernel` (checked here).
template <class Launch>
DeviceRoiCheck roi_check_cuda(const char* op, const char* kernel, const TensorView& features, const TensorView& rois,
                              std::int64_t K, int columns, bool need_total, bool per_image, const Context& ctx,
                              Launch&& launch) {
  return roi_check_on(CudaDevice{ctx, op}, features, rois, K, columns, need_total, per_image,
                      [&](auto a_tag, unsigned long long* first_bad, std::int64_t* counts, std::int64_t* image_samples) {
                        launch(a_tag, first_bad, counts, image_samples);
                        check_launch(kernel, op, ctx);
                      });
}

template <class ExactBytes>
std::size_t roi_backward_workspace_cuda(DType dtype, BackwardMode mode, const detail::RoiAlignShape& s,
                                        ExactBytes&& exact_bytes) {
  return roi_backward_workspace_bytes(dtype, mode, s, exact_bytes);
}

template <class Scatter, class Exact>
void roi_backward_cuda(const TensorView& grad_input, const detail::RoiAlignShape& s, std::int64_t n,
                       const RoiAlignBackwardOptions& opt, Workspace ws, const Context& ctx, const char* op,
                       Scatter&& scatter, Exact&& exact) {
  roi_backward_on(CudaDevice{ctx, op}, grad_input, s, n, opt, ws, scatter, exact);
}

inline std::size_t roi_exact_temp_bytes(std::int64_t K, std::int64_t records, std::uint64_t sentinel, const char* op) {
  const Context ctx{};  // the queries enqueue nothing
  return roi_exact_temp_bytes_on(CudaDevice{ctx, op}, K, records, sentinel);
}

template <class A>
void scan_roi_offsets(const GatherCudaBuffers<A>& g, const std::int64_t* counts, std::int64_t* offsets,
                      std::int64_t K, const Context& ctx, const char* op) {
  scan_roi_offsets_on(CudaDevice{ctx, op}, g, counts, offsets, K);
}

}  // namespace internal
}  // namespace detops
