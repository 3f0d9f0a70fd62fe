// FrozenBatchNorm2d on CPU and CUDA: BatchNorm with fixed, pretrained statistics, as detection
// backbones use it (torchvision.ops.FrozenBatchNorm2d, detectron2 FrozenBatchNorm2d,
// maskrcnn-benchmark). The four buffers are folded once into a per-channel affine map
//   scale = weight / sqrt(running_var + eps),   shift = bias - running_mean * scale
// (float32, or float64 for float64 parameters), and the forward is y = x * scale + shift, with
// the epilogues backbones need fused into the same pass over memory:
//   kNone:          y = x * scale + shift
//   kRelu:          y = max(x * scale + shift, 0)
//   kAddRelu:       y = max(x * scale + shift + residual, 0)   (a bottleneck block's tail)
// Frozen means frozen: there are no parameter gradients. The backward is
//   grad_x = grad_y * scale             (masked by y > 0 for the ReLU epilogues)
//   grad_residual = grad_y (masked)     (kAddRelu only)
//
// Shapes: x, y, residual, grad_* are [N, C, H, W] of one dtype (float32, float64, float16,
// bfloat16), NCHW or NHWC (read from strides; any strides are accepted, the two dense layouts
// take the vectorized paths); scale and shift are [C] float32 (float64 when x is float64).
// In place is allowed where it is safe elementwise: y may be x or the residual; grad_x may be
// grad_y or y; grad_residual may be grad_y or y. Any other overlap (a partial one, or grad_x with
// grad_residual) is an error.
// Compute is in float32 (float64 for float64 tensors), stored in the tensor's dtype. N = 0 or
// H*W = 0 succeed and do nothing. Errors are detops::Error, raised before anything is written.
#pragma once

#include "detops/context.h"
#include "detops/tensor.h"

namespace detops {

enum class FrozenBnEpilogue : std::uint8_t { kNone, kRelu, kAddRelu };

/// The four BatchNorm buffers (each [C], on one device, one floating dtype) and eps. eps = 1e-5
/// matches torchvision and detectron2; eps = 0 reproduces maskrcnn-benchmark with its
/// Caffe2-folded weights.
struct BatchNormState {
  TensorView weight, bias, running_mean, running_var;
  double eps = 1e-5;
};

/// Folds `state` into `scale` and `shift` ([C], float32 or float64, any device). The four buffers
/// share one floating dtype and device. Errors: sizes that differ, a negative or NaN running_var,
/// running_var + eps == 0 (a division by zero), eps negative or not finite, dtypes or devices
/// that do not match. running_var = +inf is accepted, as torchvision does: the channel's scale is
/// 0 and its shift the bias, so it outputs the bias (NaN where x is inf or NaN). A one-time conversion: buffers on a GPU are read after waiting for
/// ctx.cuda_stream, folded on the host, and written back synchronously.
void frozen_batch_norm_fold(const BatchNormState& state, const TensorView& scale, const TensorView& shift,
                            const Context& ctx = {});

/// y = epilogue(x * scale + shift [+ residual]). A residual is required with kAddRelu and an
/// error with the other epilogues.
void frozen_batch_norm_forward(const TensorView& x, const TensorView& scale, const TensorView& shift,
                               const TensorView& y, FrozenBnEpilogue epilogue = FrozenBnEpilogue::kNone,
                               const TensorView& residual = {}, const Context& ctx = {});

/// grad_x = grad_y * scale, masked by y > 0 for the ReLU epilogues (y is the forward's output,
/// needed only for them, an error to omit); grad_residual = masked grad_y for kAddRelu (optional:
/// pass an absent view to skip it; an error with the other epilogues).
void frozen_batch_norm_backward(const TensorView& grad_y, const TensorView& scale, const TensorView& grad_x,
                                FrozenBnEpilogue epilogue = FrozenBnEpilogue::kNone, const TensorView& y = {},
                                const TensorView& grad_residual = {}, const Context& ctx = {});

/// A folded FrozenBatchNorm2d that keeps what it was folded from, so a checkpoint can be written
/// back unchanged (the fold itself is not invertible). Like detectron2's
/// convert_frozen_batchnorm, building one from a BatchNorm2d's state copies running_var
/// unchanged (eps is applied once, by the fold).
class FrozenBatchNorm2d {
 public:
  /// Copies the buffers (to `device`) and folds them. Parameter dtype: float64 buffers stay
  /// float64, everything else folds in float32.
  static FrozenBatchNorm2d from_state(const BatchNormState& state, Device device = Device::cpu(),
                                      const Context& ctx = {});
  /// The identity on C channels (weight 1, bias 0, running_mean 0, running_var 1 - eps), as
  /// detectron2 initializes it; param_dtype is float32 or float64.
  static FrozenBatchNorm2d identity(std::int64_t channels, double eps = 1e-5, Device device = Device::cpu(),
                                    DType param_dtype = DType::kFloat32);

  std::int64_t channels() const { return scale_.size(0); }
  const Tensor& scale() const { return scale_; }
  const Tensor& shift() const { return shift_; }
  /// The buffers it was built from, for checkpoints.
  BatchNormState state() const;

  void forward(const TensorView& x, const TensorView& y, FrozenBnEpilogue epilogue = FrozenBnEpilogue::kNone,
               const TensorView& residual = {}, const Context& ctx = {}) const;
  void backward(const TensorView& grad_y, const TensorView& grad_x, FrozenBnEpilogue epilogue = FrozenBnEpilogue::kNone,
                const TensorView& y = {}, const TensorView& grad_residual = {}, const Context& ctx = {}) const;

 private:
  Tensor weight_, bias_, running_mean_, running_var_, scale_, shift_;
  double eps_ = 1e-5;
};

}  // namespace detops
