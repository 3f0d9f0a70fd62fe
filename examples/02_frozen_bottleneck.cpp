// 02_frozen_bottleneck: FrozenBatchNorm2d folded from a checkpoint's BatchNorm2d buffers, then a
// ResNet bottleneck's tail, relu(bn(x) + identity), forward and backward in one pass each.
// Checks its own result against the formulas, written out below, and exits nonzero on a failure.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <detops/detops.h>

int main() {
  using namespace detops;
  constexpr std::int64_t N = 2, C = 4, H = 5, W = 6, kPlane = H * W;
  std::vector<float> weight = {1.0f, 0.5f, 2.0f, -1.0f}, bias = {0.0f, 0.25f, -0.5f, 1.0f};
  std::vector<float> mean = {0.1f, -0.2f, 0.0f, 3.0f}, var = {1.0f, 0.25f, 4.0f, 0.5f};
  Tensor x = Tensor::empty({N, C, H, W}, DType::kFloat32), identity = Tensor::empty({N, C, H, W}, DType::kFloat32);
  Tensor grad_y = Tensor::empty({N, C, H, W}, DType::kFloat32);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data<float>()[i] = std::sin(0.7f * float(i));
    identity.data<float>()[i] = 0.5f * std::cos(0.3f * float(i));
    grad_y.data<float>()[i] = 1.0f + 0.01f * float(i % 7);
  }

  // [readme:frozen_bn]
  // Given x, identity and grad_y ([N, C, H, W] Tensors) and a checkpoint's BatchNorm2d buffers
  // weight, bias, mean and var (std::vector<float> of C each):
  auto view = [](std::vector<float>& v) {
    return TensorView(v.data(), DType::kFloat32, Device::cpu(), {std::int64_t(v.size())});
  };
  BatchNormState state{view(weight), view(bias), view(mean), view(var), /*eps=*/1e-5};
  FrozenBatchNorm2d bn = FrozenBatchNorm2d::from_state(state);  // scale and shift, folded once

  // The bottleneck's tail: y = relu(bn(x) + identity), one pass over memory.
  Tensor y = Tensor::empty({N, C, H, W}, DType::kFloat32);
  bn.forward(x, y, FrozenBnEpilogue::kAddRelu, identity);

  // Backward: grad_x = grad_y * scale where y > 0; the identity branch gets the masked grad_y.
  Tensor grad_x = Tensor::empty({N, C, H, W}, DType::kFloat32);
  Tensor grad_identity = Tensor::empty({N, C, H, W}, DType::kFloat32);
  bn.backward(grad_y, grad_x, FrozenBnEpilogue::kAddRelu, y, grad_identity);
  // [/readme:frozen_bn]

  int failures = 0;
  auto check = [&](const char* what, std::int64_t i, float got, float want) {
    if (std::fabs(got - want) <= 1e-6f * std::max(1.0f, std::fabs(want))) return;
    if (++failures <= 5) std::printf("%s[%lld] = %.9g, expected %.9g\n", what, (long long)i, got, want);
  };
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const std::int64_t c = (i / kPlane) % C;
    const float scale = weight[c] / std::sqrt(var[c] + 1e-5f), shift = bias[c] - mean[c] * scale;
    const float want_y = std::max(x.data<float>()[i] * scale + shift + identity.data<float>()[i], 0.0f);
    const float masked = y.data<float>()[i] > 0 ? grad_y.data<float>()[i] : 0.0f;
    check("scale", c, bn.scale().data<float>()[c], scale);
    check("y", i, y.data<float>()[i], want_y);
    check("grad_x", i, grad_x.data<float>()[i], masked * scale);
    check("grad_identity", i, grad_identity.data<float>()[i], masked);
  }
  // The checkpoint's buffers come back unchanged (the fold itself is not invertible).
  if (bn.state().running_var.dtype != DType::kFloat32 ||
      static_cast<const float*>(bn.state().running_var.data)[3] != var[3])
    ++failures;

  std::printf("02_frozen_bottleneck: y[0] = %g, grad_x[0] = %g; %s\n", y.data<float>()[0], grad_x.data<float>()[0],
              failures ? "FAILED" : "ok");
  return failures == 0 ? 0 : 1;
}
