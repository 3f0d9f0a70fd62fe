// Strided 4-d tensors in the shared bodies: their strides, the offset of the i-th NCHW-ordered
// element, and the zero fill every CUDA backward runs on a grad_input a memset cannot clear (the
// body of internal/device_steps.h's zero_fill, run by the emulated tests).
#pragma once

#include <cstdint>

#include "detops/detail/host_device.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

/// Strides (in elements) of a 4-d tensor.
struct Strides4 {
  std::int64_t s0, s1, s2, s3;
};

/// Offset (in elements) of the i-th NCHW-ordered element of a strided [N, C, H, W] tensor.
DETOPS_HOST_DEVICE inline std::int64_t nchw_element_offset(std::int64_t i, const Strides4& st, std::int64_t C,
                                                           std::int64_t H, std::int64_t W) {
  const std::int64_t x = i % W, y = (i / W) % H, c = (i / (W * H)) % C, b = i / (W * H * C);
  return b * st.s0 + c * st.s1 + y * st.s2 + x * st.s3;
}

/// Zeroes element i (NCHW order) of a strided tensor: gaps between the elements keep their bytes.
template <class T>
DETOPS_HOST_DEVICE inline void fill_zero_element(std::int64_t i, T* p, const Strides4& st, std::int64_t C,
                                                 std::int64_t H, std::int64_t W) {
  p[nchw_element_offset(i, st, C, H, W)] = from_acc<T>(acc_t<T>(0));
}

}  // namespace detail
}  // namespace detops
