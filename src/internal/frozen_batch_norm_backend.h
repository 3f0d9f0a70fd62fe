// What the FrozenBatchNorm2d entry points hand to a backend after validation.
#pragma once

#include <optional>
#include <type_traits>

#include "detops/context.h"
#include "detops/detail/frozen_batch_norm_math.h"
#include "detops/frozen_batch_norm.h"
#include "detops/tensor.h"

namespace detops {
namespace internal {

/// One validated elementwise call, forward or backward: made by for_forward() or for_backward() below,
/// which name every tensor.
struct FrozenBnCall {
  const char* op;
  bool backward;
  FrozenBnEpilogue epilogue;
  TensorView input;          ///< forward: x; backward: grad_y
  TensorView aux;            ///< forward: the residual (kAddRelu); backward: the forward's y (ReLU mask)
  TensorView output;         ///< forward: y; backward: grad_x
  TensorView grad_residual;  ///< backward with kAddRelu: grad_residual (optional)
  TensorView scale, shift;   ///< [C]; shift is absent for the backward

  static FrozenBnCall for_forward(const char* op, const TensorView& x, const TensorView& scale, const TensorView& shift,
                              const TensorView& y, FrozenBnEpilogue epilogue, const TensorView& residual) {
    return {op, false, epilogue, x, residual, y, {}, scale, shift};
  }
  static FrozenBnCall for_backward(const char* op, const TensorView& grad_y, const TensorView& scale,
                               const TensorView& grad_x, FrozenBnEpilogue epilogue, const TensorView& y,
                               const TensorView& grad_residual) {
    return {op, true, epilogue, grad_y, y, grad_x, grad_residual, scale, {}};
  }
};

/// A FrozenBatchNorm2d backend (internal/backend.h): src/cpu/frozen_batch_norm_cpu.cpp and
/// cuda/frozen_batch_norm_cuda.cu.
struct FrozenBnBackend {
  void (*run)(const FrozenBnCall& call, const Context& ctx);
};
extern const FrozenBnBackend kFrozenBnCpu;
extern const FrozenBnBackend kFrozenBnCuda;

/// The layout when every defined view of the call has exactly its dense strides (then the data
/// can be walked as flat arrays of planes or channel rows), else nullopt.
std::optional<Layout> frozen_bn_dense_layout(const FrozenBnCall& call);

/// Calls f(std::bool_constant<add>, std::bool_constant<relu>) for the call's epilogue (the
/// backward of kAddRelu needs only the ReLU mask: its residual's gradient is a masked copy).
template <class F>
void dispatch_epilogue(const FrozenBnCall& call, F&& f) {
  switch (call.epilogue) {
    case FrozenBnEpilogue::kNone: f(std::false_type{}, std::false_type{}); break;
    case FrozenBnEpilogue::kRelu: f(std::false_type{}, std::true_type{}); break;
    case FrozenBnEpilogue::kAddRelu:
      if (call.backward) f(std::false_type{}, std::true_type{});
      else f(std::true_type{}, std::true_type{});
      break;
  }
}

/// The generic element bodies' arguments for a call.
template <class T>
detail::FrozenBnArgs<T> make_frozen_bn_args(const FrozenBnCall& call, bool add, bool relu) {
  detail::FrozenBnArgs<T> p{};
  p.a = static_cast<const T*>(call.input.data);
  p.b = static_cast<const T*>(call.aux.data);
  p.out = static_cast<T*>(call.output.data);
  p.out2 = static_cast<T*>(call.grad_residual.data);
  for (int d = 0; d < 4; ++d) {
    p.sa[d] = call.input.strides[d];
    p.sb[d] = call.aux.defined() ? call.aux.strides[d] : 0;
    p.so[d] = call.output.strides[d];
    p.so2[d] = call.grad_residual.defined() ? call.grad_residual.strides[d] : 0;
  }
  p.scale = static_cast<const acc_t<T>*>(call.scale.data);
  p.shift = static_cast<const acc_t<T>*>(call.shift.data);
  p.N = call.input.sizes[0], p.C = call.input.sizes[1], p.H = call.input.sizes[2], p.W = call.input.sizes[3];
  p.add = add, p.relu = relu;
  return p;
}

}  // namespace internal
}  // namespace detops
