// The zero fill of a strided 4-d grad_input that every CUDA backward starts with: one memset when
// the view is dense, otherwise one thread per element through detail::fill_zero_element (gaps
// keep their bytes). Enqueued on the caller's stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_check.cuh"
#include "detops/context.h"
#include "detops/detail/strided.h"
#include "detops/tensor.h"

namespace detops {
namespace internal {
namespace zero_fill_cuda_detail {

template <class T>
__global__ void fill_zero_kernel(T* p, detail::Strides4 st, std::int64_t C, std::int64_t H, std::int64_t W,
                                 std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::fill_zero_element(i, p, st, C, H, W);
}

}  // namespace zero_fill_cuda_detail

/// A dense view (contiguous NCHW or NHWC with no gaps) can be zeroed with one memset.
inline bool is_dense(const TensorView& v) {
  return v.span_bytes() == v.numel() * static_cast<std::int64_t>(dtype_size(v.dtype));
}

/// Zeroes every element of a strided 4-d view of T (a memset when it is dense).
template <class T>
void zero_fill_cuda(const TensorView& v, const Context& ctx, const char* op) {
  const std::int64_t n = v.numel();
  if (n == 0) return;
  if (is_dense(v)) {
    DETOPS_CUDA_CHECK(cudaMemsetAsync(v.data, 0, static_cast<std::size_t>(n) * sizeof(T), stream_of(ctx)), op);
    return;
  }
  const detail::Strides4 st{v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
  zero_fill_cuda_detail::fill_zero_kernel<T>
      <<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(static_cast<T*>(v.data), st, v.sizes[1], v.sizes[2], v.sizes[3], n);
  check_launch("fill_zero_kernel", op, ctx);
}

}  // namespace internal
}  // namespace detops
