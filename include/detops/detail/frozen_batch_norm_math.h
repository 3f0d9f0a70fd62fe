// The one copy of FrozenBatchNorm2d's math, shared by the CPU backend, the CUDA kernels and the
// tests: folding the four buffers, and the per-element forward and backward with their epilogues.
#pragma once

#include <cmath>
#include <cstdint>

#include "detops/detail/host_device.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

DETOPS_HOST_DEVICE inline float sqrt_(float v) { return ::sqrtf(v); }
DETOPS_HOST_DEVICE inline double sqrt_(double v) { return ::sqrt(v); }

/// scale = weight * (1 / sqrt(running_var + eps)), shift = bias - running_mean * scale, in P
/// (torchvision's order: rsqrt first, then the products).
template <class P>
DETOPS_HOST_DEVICE inline void frozen_bn_fold(P weight, P bias, P mean, P var, P eps, P* scale, P* shift) {
  const P inv_std = P(1) / sqrt_(var + eps);
  const P s = weight * inv_std;
  *scale = s;
  *shift = bias - mean * s;
}

/// y = x * scale + shift [+ residual], then ReLU when asked. NaN propagates through the ReLU
/// (as torch.relu); the ReLU of -0 is +0.
template <class A>
DETOPS_HOST_DEVICE inline A frozen_bn_apply(A x, A scale, A shift, A residual, bool add, bool relu) {
  A v = x * scale + shift;
  if (add) v = v + residual;
  if (relu) v = v > A(0) ? v : (v != v ? v : A(0));
  return v;
}

/// grad_x = grad_y * scale where the ReLU let the value through (y > 0), else 0.
template <class A>
DETOPS_HOST_DEVICE inline A frozen_bn_grad(A grad_y, A scale, bool passed) {
  return passed ? grad_y * scale : A(0);
}

}  // namespace detail
}  // namespace detops

namespace detops {
namespace detail {

/// Strided tensors of one FrozenBatchNorm2d call, as the kernels see them. For the forward, `a`
/// is x, `b` the residual (or null), `out` y; for the backward, `a` is grad_y, `b` the forward's
/// y (or null), `out` grad_x and `out2` grad_residual (or null).
template <class T>
struct FrozenBnArgs {
  const T* a;
  const T* b;
  T* out;
  T* out2;
  std::int64_t sa[4], sb[4], so[4], so2[4];
  const acc_t<T>* scale;
  const acc_t<T>* shift;
  std::int64_t N, C, H, W;
  bool add, relu;
};

/// Generic (any strides) forward for element i of [N, C, H, W] in NCHW order.
template <class T>
DETOPS_HOST_DEVICE inline void frozen_bn_forward_element(std::int64_t i, const FrozenBnArgs<T>& p) {
  using A = acc_t<T>;
  const std::int64_t w = i % p.W, h = (i / p.W) % p.H, c = (i / (p.W * p.H)) % p.C, n = i / (p.W * p.H * p.C);
  const A x = to_acc(p.a[n * p.sa[0] + c * p.sa[1] + h * p.sa[2] + w * p.sa[3]]);
  const A r = p.add ? to_acc(p.b[n * p.sb[0] + c * p.sb[1] + h * p.sb[2] + w * p.sb[3]]) : A(0);
  p.out[n * p.so[0] + c * p.so[1] + h * p.so[2] + w * p.so[3]] =
      from_acc<T>(frozen_bn_apply(x, p.scale[c], p.shift[c], r, p.add, p.relu));
}

/// Generic (any strides) backward for element i of [N, C, H, W] in NCHW order.
template <class T>
DETOPS_HOST_DEVICE inline void frozen_bn_backward_element(std::int64_t i, const FrozenBnArgs<T>& p) {
  using A = acc_t<T>;
  const std::int64_t w = i % p.W, h = (i / p.W) % p.H, c = (i / (p.W * p.H)) % p.C, n = i / (p.W * p.H * p.C);
  const T gy = p.a[n * p.sa[0] + c * p.sa[1] + h * p.sa[2] + w * p.sa[3]];
  const bool passed = !p.relu || to_acc(p.b[n * p.sb[0] + c * p.sb[1] + h * p.sb[2] + w * p.sb[3]]) > A(0);
  p.out[n * p.so[0] + c * p.so[1] + h * p.so[2] + w * p.so[3]] =
      from_acc<T>(frozen_bn_grad(to_acc(gy), p.scale[c], passed));
  if (p.out2) p.out2[n * p.so2[0] + c * p.so2[1] + h * p.so2[2] + w * p.so2[3]] = passed ? gy : from_acc<T>(A(0));
}

}  // namespace detail
}  // namespace detops
