// The one copy of FrozenBatchNorm2d's math, shared by the CPU backend, the CUDA kernels and the
// tests: folding the four buffers, the per-element forward and backward with their epilogues, and
// the CUDA kernels' per-thread bodies (each __global__ function is one call into one of them, so
// tests/frozen_batch_norm_emulated_test.cpp runs every kernel line on the CPU).
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

// ---------------------------------------------------------------------------------------------
// The dense vector bodies: the CUDA fast path for tensors that share one dense layout, 16 bytes
// (V elements) per load and store. The launcher takes it only when no vector straddles a
// channel boundary (NCHW: H*W a multiple of V, so a vector lies in one plane; NHWC: C a multiple
// of V, so a vector lies in one row of channels) and every pointer is 16-byte aligned.

#if defined(__CUDA_ARCH__)
#define DETOPS_FROZEN_BN_UNROLL _Pragma("unroll")
#else
#define DETOPS_FROZEN_BN_UNROLL  // host compilers would warn about an unknown pragma
#endif

/// V elements of T, loaded and stored as one 16-byte access.
template <class T, int V>
struct alignas(16) FrozenBnPack {
  T v[V];
};

/// Flat arrays of a dense call (the roles of a, b, out, out2 as in FrozenBnArgs) and the
/// number of vectors, nvec = N*C*H*W / V.
template <class T>
struct FrozenBnVecArgs {
  const T* a;
  const T* b;
  T* out;
  T* out2;
  const acc_t<T>* scale;
  const acc_t<T>* shift;
  std::int64_t nvec, C, HW;
};

/// Channel of lane j of the vector starting at flat element i0 (NHWC: the row's channels run
/// along the vector; NCHW: the whole vector lies in one plane).
template <bool kNhwc>
DETOPS_HOST_DEVICE inline std::int64_t frozen_bn_lane_channel(std::int64_t i0, int j, std::int64_t C,
                                                              std::int64_t HW) {
  return kNhwc ? (i0 % C) + j : (i0 / HW) % C;
}

/// Forward of vector v: y = epilogue(x * scale + shift [+ residual]) lane by lane.
template <class T, int V, bool kAdd, bool kRelu, bool kNhwc>
DETOPS_HOST_DEVICE inline void frozen_bn_forward_vec(std::int64_t v, const FrozenBnVecArgs<T>& p) {
  using A = acc_t<T>;
  using Pack = FrozenBnPack<T, V>;
  const Pack xp = reinterpret_cast<const Pack*>(p.a)[v];
  Pack rp;
  if constexpr (kAdd) rp = reinterpret_cast<const Pack*>(p.b)[v];
  Pack yp;
  DETOPS_FROZEN_BN_UNROLL
  for (int j = 0; j < V; ++j) {
    const std::int64_t c = frozen_bn_lane_channel<kNhwc>(v * V, j, p.C, p.HW);
    A r = A(0);
    if constexpr (kAdd) r = to_acc(rp.v[j]);
    yp.v[j] = from_acc<T>(frozen_bn_apply(to_acc(xp.v[j]), p.scale[c], p.shift[c], r, kAdd, kRelu));
  }
  reinterpret_cast<Pack*>(p.out)[v] = yp;
}

/// Backward of vector v: grad_x = grad_y * scale where the ReLU passed, grad_residual (when
/// out2 is given) = grad_y there; zero elsewhere.
template <class T, int V, bool kRelu, bool kNhwc>
DETOPS_HOST_DEVICE inline void frozen_bn_backward_vec(std::int64_t v, const FrozenBnVecArgs<T>& p) {
  using A = acc_t<T>;
  using Pack = FrozenBnPack<T, V>;
  const Pack gp = reinterpret_cast<const Pack*>(p.a)[v];
  Pack yp;
  if constexpr (kRelu) yp = reinterpret_cast<const Pack*>(p.b)[v];
  Pack xp, rp;
  DETOPS_FROZEN_BN_UNROLL
  for (int j = 0; j < V; ++j) {
    const std::int64_t c = frozen_bn_lane_channel<kNhwc>(v * V, j, p.C, p.HW);
    bool passed = true;
    if constexpr (kRelu) passed = to_acc(yp.v[j]) > A(0);
    xp.v[j] = from_acc<T>(frozen_bn_grad(to_acc(gp.v[j]), p.scale[c], passed));
    rp.v[j] = passed ? gp.v[j] : from_acc<T>(A(0));
  }
  reinterpret_cast<Pack*>(p.out)[v] = xp;
  if (p.out2) reinterpret_cast<Pack*>(p.out2)[v] = rp;
}

#undef DETOPS_FROZEN_BN_UNROLL

}  // namespace detail
}  // namespace detops
