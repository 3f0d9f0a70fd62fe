// What the FrozenBatchNorm2d entry points hand to a backend after validation.
#pragma once

#include <cstdint>
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

/// Elements of T per 16-byte vector of the CUDA fast path.
template <class T>
constexpr int frozen_bn_vector_width() {
  return static_cast<int>(16 / sizeof(T));
}

/// The CUDA launcher's choice of the dense vector bodies (detail::frozen_bn_forward_vec /
/// frozen_bn_backward_vec): taken when every view shares one dense layout, no vector straddles a
/// channel boundary (NCHW: H*W % V == 0; NHWC: C % V == 0) and every pointer is 16-byte aligned.
/// Here rather than in the .cu file so that the emulated-grid test makes the same choice.
template <class T>
struct FrozenBnVecPlan {
  bool use = false;
  bool nhwc = false;
  detail::FrozenBnVecArgs<T> args{};
};

template <class T>
FrozenBnVecPlan<T> frozen_bn_vec_plan(const FrozenBnCall& call) {
  constexpr int V = frozen_bn_vector_width<T>();
  auto aligned16 = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; };
  const TensorView& ref = call.input;
  const std::int64_t N = ref.sizes[0], C = ref.sizes[1], HW = ref.sizes[2] * ref.sizes[3];
  FrozenBnVecPlan<T> plan;
  const std::optional<Layout> dense = frozen_bn_dense_layout(call);
  const bool lanes_fit = (dense == Layout::kNCHW && HW % V == 0) || (dense == Layout::kNHWC && C % V == 0);
  const bool aligned = aligned16(call.input.data) && aligned16(call.output.data) &&
                       (!call.aux.data || aligned16(call.aux.data)) &&
                       (!call.grad_residual.data || aligned16(call.grad_residual.data));
  if (!lanes_fit || !aligned) return plan;
  plan.use = true;
  plan.nhwc = dense == Layout::kNHWC;
  plan.args.a = static_cast<const T*>(call.input.data);
  plan.args.b = static_cast<const T*>(call.aux.data);
  plan.args.out = static_cast<T*>(call.output.data);
  plan.args.out2 = static_cast<T*>(call.grad_residual.data);
  plan.args.scale = static_cast<const acc_t<T>*>(call.scale.data);
  plan.args.shift = static_cast<const acc_t<T>*>(call.shift.data);
  plan.args.nvec = N * C * HW / V;
  plan.args.C = C;
  plan.args.HW = HW;
  return plan;
}

}  // namespace internal
}  // namespace detops
