// CUDA backend of FrozenBatchNorm2d: one pass over memory with 16-byte vector loads and stores
// when the tensors share a dense layout whose channel pattern fits the vector (NCHW: H*W a
// multiple of the vector width; NHWC: C a multiple of it) and every pointer is 16-byte aligned
// (frozen_bn_vec_plan); otherwise the shared generic element bodies. The arithmetic is the shared
// helpers' either way.
#include <cstdint>

#include "cuda_check.cuh"
#include "detops/detail/frozen_batch_norm_math.h"
#include "internal/frozen_batch_norm_backend.h"

namespace detops {
namespace internal {

namespace {

// Each kernel is one call into a per-thread body of detops/detail/frozen_batch_norm_math.h, which
// tests/frozen_batch_norm_emulated_test.cpp runs over an emulated grid on the CPU.

template <class T, int V, bool kAdd, bool kRelu, bool kNhwc>
__global__ void forward_vec_kernel(detail::FrozenBnVecArgs<T> p) {
  DETOPS_GRID_STRIDE(v, p.nvec) detail::frozen_bn_forward_vec<T, V, kAdd, kRelu, kNhwc>(v, p);
}

template <class T, int V, bool kRelu, bool kNhwc>
__global__ void backward_vec_kernel(detail::FrozenBnVecArgs<T> p) {
  DETOPS_GRID_STRIDE(v, p.nvec) detail::frozen_bn_backward_vec<T, V, kRelu, kNhwc>(v, p);
}

template <class T>
__global__ void forward_generic_kernel(detail::FrozenBnArgs<T> p, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::frozen_bn_forward_element(i, p);
}

template <class T>
__global__ void backward_generic_kernel(detail::FrozenBnArgs<T> p, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::frozen_bn_backward_element(i, p);
}

template <class T, bool kAdd, bool kRelu>
void launch_typed(const FrozenBnCall& call, const Context& ctx) {
  constexpr int V = frozen_bn_vector_width<T>();
  cudaStream_t stream = static_cast<cudaStream_t>(ctx.cuda_stream);
  const TensorView& ref = call.input;
  const std::int64_t n = ref.sizes[0] * ref.sizes[1] * ref.sizes[2] * ref.sizes[3];
  const FrozenBnVecPlan<T> plan = frozen_bn_vec_plan<T>(call);
  if (plan.use) {
    const std::int64_t nvec = plan.args.nvec;
    if (!call.backward) {
      if (plan.nhwc) forward_vec_kernel<T, V, kAdd, kRelu, true><<<grid_for(nvec), kBlock, 0, stream>>>(plan.args);
      else forward_vec_kernel<T, V, kAdd, kRelu, false><<<grid_for(nvec), kBlock, 0, stream>>>(plan.args);
    } else {
      if (plan.nhwc) backward_vec_kernel<T, V, kRelu, true><<<grid_for(nvec), kBlock, 0, stream>>>(plan.args);
      else backward_vec_kernel<T, V, kRelu, false><<<grid_for(nvec), kBlock, 0, stream>>>(plan.args);
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
