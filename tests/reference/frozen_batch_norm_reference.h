// Slow, deliberately simple float64 FrozenBatchNorm2d reference (fold, forward with its three
// epilogues, backward) for tests. It shares nothing with the library: plain std::vector<double>
// in NCHW order, one loop per formula, written from the semantics in
// include/detops/frozen_batch_norm.h and torchvision.ops.FrozenBatchNorm2d;
// tests/frozen_batch_norm_test.cpp checks it against torchvision's golden vectors.
//
// Semantics, for element (n, c, h, w) of [N, C, H, W] (index i = ((n*C + c)*H + h)*W + w):
//   scale_c = weight_c * (1 / sqrt(running_var_c + eps))      (torchvision: w * (rv + eps).rsqrt())
//   shift_c = bias_c - running_mean_c * scale_c
//   v_i     = x_i * scale_c + shift_c   (+ residual_i for kAddRelu; two roundings, no FMA)
//   y_i     = v_i (kNone), or relu(v_i) = v_i > 0 ? v_i : (NaN stays NaN, else +0)
//   backward: passed_i = epilogue is kNone || y_i > 0  (y_i is the forward's output)
//             grad_x_i = passed_i ? grad_y_i * scale_c : 0,  grad_residual_i = passed_i ? grad_y_i : 0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace detops {
namespace ref {

enum class FbnEpilogueRef { kNone, kRelu, kAddRelu };

/// scale and shift from the four buffers (each of length C), in float64.
inline void frozen_bn_fold_ref(const std::vector<double>& weight, const std::vector<double>& bias,
                               const std::vector<double>& running_mean, const std::vector<double>& running_var,
                               double eps, std::vector<double>* scale, std::vector<double>* shift) {
  const std::size_t C = weight.size();
  scale->assign(C, 0.0);
  shift->assign(C, 0.0);
  for (std::size_t c = 0; c < C; ++c) {
    const double inv_std = 1.0 / std::sqrt(running_var[c] + eps);
    const double s = weight[c] * inv_std;
    (*scale)[c] = s;
    (*shift)[c] = bias[c] - running_mean[c] * s;
  }
}

inline double relu_ref(double v) {
  if (std::isnan(v)) return v;
  return v > 0.0 ? v : 0.0;
}

/// y = epilogue(x * scale + shift [+ residual]); x, residual are NCHW with N*C*H*W elements
/// (residual only read for kAddRelu), scale and shift have C elements; HW = H*W.
inline std::vector<double> frozen_bn_forward_ref(const std::vector<double>& x, const std::vector<double>& scale,
                                                 const std::vector<double>& shift,
                                                 const std::vector<double>& residual, std::int64_t N,
                                                 std::int64_t C, std::int64_t HW, FbnEpilogueRef epilogue) {
  std::vector<double> y(static_cast<std::size_t>(N * C * HW));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t p = 0; p < HW; ++p) {
        const std::size_t i = static_cast<std::size_t>((n * C + c) * HW + p);
        double v = x[i] * scale[static_cast<std::size_t>(c)];
        v = v + shift[static_cast<std::size_t>(c)];
        if (epilogue == FbnEpilogueRef::kAddRelu) v = v + residual[i];
        if (epilogue != FbnEpilogueRef::kNone) v = relu_ref(v);
        y[i] = v;
      }
  return y;
}

/// grad_x (returned) and, for kAddRelu, grad_residual (when the pointer is non-null), given the
/// forward's output y (read only for the ReLU epilogues).
inline std::vector<double> frozen_bn_backward_ref(const std::vector<double>& grad_y, const std::vector<double>& scale,
                                                  const std::vector<double>& y, std::int64_t N, std::int64_t C,
                                                  std::int64_t HW, FbnEpilogueRef epilogue,
                                                  std::vector<double>* grad_residual = nullptr) {
  const std::size_t total = static_cast<std::size_t>(N * C * HW);
  std::vector<double> gx(total);
  if (grad_residual != nullptr) grad_residual->assign(total, 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t p = 0; p < HW; ++p) {
        const std::size_t i = static_cast<std::size_t>((n * C + c) * HW + p);
        const bool passed = epilogue == FbnEpilogueRef::kNone || y[i] > 0.0;
        gx[i] = passed ? grad_y[i] * scale[static_cast<std::size_t>(c)] : 0.0;
        if (grad_residual != nullptr && epilogue == FbnEpilogueRef::kAddRelu) (*grad_residual)[i] = passed ? grad_y[i] : 0.0;
      }
  return gx;
}

}  // namespace ref
}  // namespace detops
