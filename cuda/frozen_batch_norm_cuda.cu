// CUDA backend of FrozenBatchNorm2d: one pass over memory with 16-byte vector loads and stores
// when the tensors share a dense layout whose channel pattern fits the vector (NCHW: H*W a
// multiple of the vector width; NHWC: C a multiple of it) and every pointer is 16-byte aligned;
// otherwise the shared generic element bodies. The arithmetic is the shared helpers' either way.
#include <cstdint>

#include "cuda_check.cuh"
#include "detops/detail/frozen_batch_norm_math.h"
#include "internal/frozen_batch_norm_backend.h"

namespace detops {
namespace internal {

namespace {

template <class T, int V>
struct alignas(16) Pack {
  T v[V];
};

/// Channel of lane j of the vector starting at flat element i0.
template <bool kNhwc>
__device__ inline std::int64_t lane_channel(std::int64_t i0, int j, std::int64_t C, std::int64_t HW) {
  return kNhwc ? (i0 % C) + j : (i0 / HW) % C;
}

template <class T, int V, bool kAdd, bool kRelu, bool kNhwc>
__global__ void forward_vec_kernel(const T* x, const T* r, T* y, const acc_t<T>* scale, const acc_t<T>* shift,
                                   std::int64_t nvec, std::int64_t C, std::int64_t HW) {
  using A = acc_t<T>;
  DETOPS_GRID_STRIDE(v, nvec) {
    const Pack<T, V> xp = reinterpret_cast<const Pack<T, V>*>(x)[v];
    Pack<T, V> rp;
    if (kAdd) rp = reinterpret_cast<const Pack<T, V>*>(r)[v];
    Pack<T, V> yp;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const std::int64_t c = lane_channel<kNhwc>(v * V, j, C, HW);
      yp.v[j] = from_acc<T>(detail::frozen_bn_apply(to_acc(xp.v[j]), scale[c], shift[c], kAdd ? to_acc(rp.v[j]) : A(0),
                                                    kAdd, kRelu));
    }
    reinterpret_cast<Pack<T, V>*>(y)[v] = yp;
  }
}

template <class T, int V, bool kRelu, bool kNhwc>
__global__ void backward_vec_kernel(const T* gy, const T* y, T* gx, T* gr, const acc_t<T>* scale, std::int64_t nvec,
                                    std::int64_t C, std::int64_t HW) {
  using A = acc_t<T>;
  DETOPS_GRID_STRIDE(v, nvec) {
    const Pack<T, V> gp = reinterpret_cast<const Pack<T, V>*>(gy)[v];
    Pack<T, V> yp;
    if (kRelu) yp = reinterpret_cast<const Pack<T, V>*>(y)[v];
    Pack<T, V> xp, rp;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const std::int64_t c = lane_channel<kNhwc>(v * V, j, C, HW);
      const bool passed = !kRelu || to_acc(yp.v[j]) > A(0);
      xp.v[j] = from_acc<T>(detail::frozen_bn_grad(to_acc(gp.v[j]), scale[c], passed));
      rp.v[j] = passed ? gp.v[j] : from_acc<T>(A(0));
    }
    reinterpret_cast<Pack<T, V>*>(gx)[v] = xp;
    if (gr) reinterpret_cast<Pack<T, V>*>(gr)[v] = rp;
  }
}

template <class T>
__global__ void forward_generic_kernel(detail::FrozenBnArgs<T> p, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::frozen_bn_forward_element(i, p);
}

template <class T>
__global__ void backward_generic_kernel(detail::FrozenBnArgs<T> p, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::frozen_bn_backward_element(i, p);
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <class T, bool kAdd, bool kRelu>
void launch_typed(const FrozenBnCall& call, const Context& ctx) {
  using A = acc_t<T>;
  constexpr int V = static_cast<int>(16 / sizeof(T));
  cudaStream_t stream = static_cast<cudaStream_t>(ctx.cuda_stream);
  const TensorView& ref = call.input;
  const std::int64_t N = ref.sizes[0], C = ref.sizes[1], H = ref.sizes[2], W = ref.sizes[3];
  const std::int64_t n = N * C * H * W, HW = H * W;
  const T* a = static_cast<const T*>(call.input.data);
  const T* b = static_cast<const T*>(call.aux.data);
  T* out = static_cast<T*>(call.output.data);
  T* out2 = static_cast<T*>(call.grad_residual.data);
  const A* scale = static_cast<const A*>(call.scale.data);
  const A* shift = static_cast<const A*>(call.shift.data);

  const std::optional<Layout> dense = frozen_bn_dense_layout(call);
  const bool lanes_fit = (dense == Layout::kNCHW && HW % V == 0) || (dense == Layout::kNHWC && C % V == 0);
  const bool aligned = aligned16(a) && aligned16(out) && (!b || aligned16(b)) && (!out2 || aligned16(out2));
  if (lanes_fit && aligned) {
    const std::int64_t nvec = n / V;
    const bool nhwc = dense == Layout::kNHWC;
    if (!call.backward) {
      if (nhwc) forward_vec_kernel<T, V, kAdd, kRelu, true><<<grid_for(nvec), kBlock, 0, stream>>>(a, b, out, scale, shift, nvec, C, HW);
      else forward_vec_kernel<T, V, kAdd, kRelu, false><<<grid_for(nvec), kBlock, 0, stream>>>(a, b, out, scale, shift, nvec, C, HW);
    } else {
      if (nhwc) backward_vec_kernel<T, V, kRelu, true><<<grid_for(nvec), kBlock, 0, stream>>>(a, b, out, out2, scale, nvec, C, HW);
      else backward_vec_kernel<T, V, kRelu, false><<<grid_for(nvec), kBlock, 0, stream>>>(a, b, out, out2, scale, nvec, C, HW);
    }
    check_launch(call.backward ? "backward_vec_kernel" : "forward_vec_kernel", call.op, ctx);
    return;
  }
  const detail::FrozenBnArgs<T> p = make_frozen_bn_args<T>(call, kAdd, kRelu);
  if (!call.backward) forward_generic_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(p, n);
  else backward_generic_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(p, n);
  check_launch(call.backward ? "backward_generic_kernel" : "forward_generic_kernel", call.op, ctx);
}

void run(const FrozenBnCall& call, const Context& ctx) {
  DeviceGuard guard(call.input.device.index, call.op);
  dispatch_floating(call.input.dtype, [&](auto tag) {
    dispatch_epilogue(call, [&](auto add, auto relu) { launch_typed<decltype(tag), add(), relu()>(call, ctx); });
  });
}

}  // namespace

extern const FrozenBnBackend kFrozenBnCuda = {&run};

}  // namespace internal
}  // namespace detops
