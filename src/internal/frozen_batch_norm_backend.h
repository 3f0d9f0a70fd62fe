// What the FrozenBatchNorm2d entry points hand to a backend after validation.
#pragma once

#include "detops/context.h"
#include "detops/detail/frozen_batch_norm_math.h"
#include "detops/frozen_batch_norm.h"
#include "detops/tensor.h"

namespace detops {
namespace internal {

/// One validated elementwise call. Forward: a = x, b = residual (absent unless kAddRelu), out = y.
/// Backward: a = grad_y, b = y (absent unless a ReLU epilogue), out = grad_x, out2 = grad_residual
/// (optional).
struct FrozenBnCall {
  const char* op;
  TensorView a, b, out, out2;
  TensorView scale, shift;  // shift absent for the backward
  FrozenBnEpilogue epilogue;
  bool backward;
};

/// kNCHW or kNHWC when every defined view of the call has exactly the dense strides of that
/// layout (then the data can be walked as flat arrays of planes or channel rows), else kNone.
enum class DenseLayout { kNone, kNCHW, kNHWC };
DenseLayout frozen_bn_dense_layout(const FrozenBnCall& call);

/// The generic element bodies' arguments for a call.
template <class T>
detail::FrozenBnArgs<T> make_frozen_bn_args(const FrozenBnCall& call, bool add, bool relu) {
  detail::FrozenBnArgs<T> p{};
  p.a = static_cast<const T*>(call.a.data);
  p.b = static_cast<const T*>(call.b.data);
  p.out = static_cast<T*>(call.out.data);
  p.out2 = static_cast<T*>(call.out2.data);
  for (int d = 0; d < 4; ++d) {
    p.sa[d] = call.a.strides[d];
    p.sb[d] = call.b.defined() ? call.b.strides[d] : 0;
    p.so[d] = call.out.strides[d];
    p.so2[d] = call.out2.defined() ? call.out2.strides[d] : 0;
  }
  p.scale = static_cast<const acc_t<T>*>(call.scale.data);
  p.shift = static_cast<const acc_t<T>*>(call.shift.data);
  p.N = call.a.sizes[0], p.C = call.a.sizes[1], p.H = call.a.sizes[2], p.W = call.a.sizes[3];
  p.add = add, p.relu = relu;
  return p;
}

void frozen_bn_cpu(const FrozenBnCall& call, const Context& ctx);
void frozen_bn_cuda(const FrozenBnCall& call, const Context& ctx);

}  // namespace internal
}  // namespace detops
