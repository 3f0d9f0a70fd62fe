// FrozenBatchNorm2d's CUDA steps, written once over the device interface (internal/device_steps.h):
// one pass over memory, with the 16-byte vector bodies when frozen_bn_vec_plan takes them (a dense
// layout whose channel pattern fits the vector, every pointer 16-byte aligned), otherwise the
// generic element bodies of include/detops/detail/frozen_batch_norm_math.h. The arithmetic is the
// shared helpers' either way. cuda/frozen_batch_norm_cuda.cu runs it on CudaDevice;
// tests/frozen_batch_norm_emulated_test.cpp runs the very same code on the emulated device.
#pragma once

#include <cstdint>

#include "detops/detail/frozen_batch_norm_math.h"
#include "internal/device_steps.h"
#include "internal/frozen_batch_norm_backend.h"

namespace detops {
namespace internal {
namespace frozen_bn_device {

template <class T, int V, bool kAdd, bool kRelu, bool kNhwc>
struct ForwardVecBody {
  detail::FrozenBnVecArgs<T> p;
  DETOPS_HOST_DEVICE void operator()(std::int64_t v) const { detail::frozen_bn_forward_vec<T, V, kAdd, kRelu, kNhwc>(v, p); }
};

template <class T, int V, bool kRelu, bool kNhwc>
struct BackwardVecBody {
  detail::FrozenBnVecArgs<T> p;
  DETOPS_HOST_DEVICE void operator()(std::int64_t v) const { detail::frozen_bn_backward_vec<T, V, kRelu, kNhwc>(v, p); }
};

template <class T>
struct ForwardBody {
  detail::FrozenBnArgs<T> p;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::frozen_bn_forward_element(i, p); }
};

template <class T>
struct BackwardBody {
  detail::FrozenBnArgs<T> p;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::frozen_bn_backward_element(i, p); }
};

template <class T, bool kAdd, bool kRelu, class Dev>
void run_typed(const Dev& dev, const FrozenBnCall& call) {
  constexpr int V = frozen_bn_vector_width<T>();
  const TensorView& ref = call.input;
  const std::int64_t n = ref.sizes[0] * ref.sizes[1] * ref.sizes[2] * ref.sizes[3];
  const FrozenBnVecPlan<T> plan = frozen_bn_vec_plan<T>(call);
  if (plan.use) {
    const std::int64_t nvec = plan.args.nvec;
    if (!call.backward) {
      if (plan.nhwc) dev.launch("frozen_bn_forward_vec", nvec, ForwardVecBody<T, V, kAdd, kRelu, true>{plan.args});
      else dev.launch("frozen_bn_forward_vec", nvec, ForwardVecBody<T, V, kAdd, kRelu, false>{plan.args});
    } else {
      if (plan.nhwc) dev.launch("frozen_bn_backward_vec", nvec, BackwardVecBody<T, V, kRelu, true>{plan.args});
      else dev.launch("frozen_bn_backward_vec", nvec, BackwardVecBody<T, V, kRelu, false>{plan.args});
    }
    return;
  }
  const detail::FrozenBnArgs<T> p = make_frozen_bn_args<T>(call, kAdd, kRelu);
  if (!call.backward) dev.launch("frozen_bn_forward", n, ForwardBody<T>{p});
  else dev.launch("frozen_bn_backward", n, BackwardBody<T>{p});
}

}  // namespace frozen_bn_device

/// The call (forward or backward, call.backward) on `dev`.
template <class Dev>
void frozen_bn_run_on(const Dev& dev, const FrozenBnCall& call) {
  dispatch_floating(call.input.dtype, [&](auto tag) {
    dispatch_epilogue(call, [&](auto add, auto relu) {
      frozen_bn_device::run_typed<decltype(tag), add(), relu()>(dev, call);
    });
  });
}

}  // namespace internal
}  // namespace detops
