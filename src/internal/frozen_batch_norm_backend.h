// What the FrozenBatchNorm2d entry points hand to a backend after validation.
#pragma once

#include "detops/context.h"
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

void frozen_bn_cpu(const FrozenBnCall& call, const Context& ctx);
void frozen_bn_cuda(const FrozenBnCall& call, const Context& ctx);

}  // namespace internal
}  // namespace detops
