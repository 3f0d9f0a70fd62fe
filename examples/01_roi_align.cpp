// 01_roi_align: RoIAlign forward and exact backward on memory the caller owns (a framework's
// buffers, here std::vectors) wrapped as TensorViews, with the backward's workspace query.
// Checks its own result and exits nonzero when a check fails:
//   * a constant feature map pools to that constant;
//   * every sample lies inside the map, so the backward gives each channel the whole upstream
//     gradient (K * PH * PW with grad_output = 1);
//   * the exact backward gives the same bytes on a second run with another thread count.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <detops/detops.h>

int main() {
  using namespace detops;
  // [readme:roi_align]
  constexpr std::int64_t N = 1, C = 3, H = 16, W = 16, K = 2, P = 2;  // K rois, P x P bins
  std::vector<float> features(N * C * H * W, 0.5f);  // caller-owned memory, NCHW
  std::vector<float> boxes = {0, 1.0f, 1.0f, 9.0f, 7.0f,     // (batch index, x1, y1, x2, y2)
                              0, 4.5f, 2.0f, 15.0f, 14.5f};  // in input pixels (spatial_scale 1)
  std::vector<float> pooled(K * C * P * P), grad_pooled(K * C * P * P, 1.0f), grad_features(features.size());
  TensorView input(features.data(), DType::kFloat32, Device::cpu(), {N, C, H, W});
  TensorView rois(boxes.data(), DType::kFloat32, Device::cpu(), {K, 5});
  TensorView output(pooled.data(), DType::kFloat32, Device::cpu(), {K, C, P, P});
  TensorView grad_output(grad_pooled.data(), DType::kFloat32, Device::cpu(), {K, C, P, P});
  TensorView grad_input(grad_features.data(), DType::kFloat32, Device::cpu(), {N, C, H, W});

  RoiAlignOptions opt;  // as torchvision.ops.roi_align(input, rois, (P, P), 1.0, 2, aligned=True)
  opt.pooled_height = opt.pooled_width = P;
  opt.sampling_ratio = 2;
  opt.aligned = true;
  roi_align_forward(input, rois, output, opt);

  RoiAlignBackwardOptions bwd;  // BackwardMode::kExact is the default
  std::vector<unsigned char> scratch(roi_align_backward_workspace_size(grad_output, rois, grad_input, opt, bwd));
  roi_align_backward(grad_output, rois, grad_input, opt, bwd, Context{}, /*argmax=*/{},
                     Workspace{scratch.data(), scratch.size()});
  // [/readme:roi_align]

  int failures = 0;
  for (float v : pooled)
    if (std::fabs(v - 0.5f) > 1e-6f) ++failures;
  for (std::int64_t c = 0; c < C; ++c) {
    double sum = 0;
    for (std::int64_t i = 0; i < H * W; ++i) sum += grad_features[c * H * W + i];
    if (std::fabs(sum - double(K * P * P)) > 1e-5) {
      std::printf("channel %lld: gradient sum %.9g, expected %lld\n", (long long)c, sum, (long long)(K * P * P));
      ++failures;
    }
  }

  // Exact mode: the same bytes on every run and thread count (here the workspace comes from
  // the context's allocator).
  std::vector<float> again(grad_features.size(), -1.0f);
  Context one_thread;
  one_thread.num_threads = 1;
  roi_align_backward(grad_output, rois, TensorView(again.data(), DType::kFloat32, Device::cpu(), {N, C, H, W}), opt,
                     bwd, one_thread);
  const bool same = std::memcmp(again.data(), grad_features.data(), again.size() * sizeof(float)) == 0;
  if (!same) ++failures;

  std::printf("01_roi_align: output[0] = %g, workspace %zu bytes, exact backward %s; %s\n", pooled[0],
              scratch.size(), same ? "same bytes twice" : "DIFFERENT bytes", failures ? "FAILED" : "ok");
  return failures == 0 ? 0 : 1;
}
