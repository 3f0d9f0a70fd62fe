// The program both consumer tests build: a user's first use of detops, through the umbrella
// header and the detops::detops target. It pools one 4x4 map over one roi on the CPU and checks
// the four legacy (aligned = false) RoIAlign values; a nonzero exit means a wrong result.
#include <cmath>
#include <cstdio>
#include <exception>

#include <detops/detops.h>

int main() {
  try {
    detops::Tensor input = detops::Tensor::empty({1, 1, 4, 4}, detops::DType::kFloat32);
    for (int i = 0; i < 16; ++i) input.data<float>()[i] = static_cast<float>(i + 1);  // 1 + 4y + x

    detops::Tensor rois = detops::Tensor::empty({1, 5}, detops::DType::kFloat32);
    const float roi[5] = {0, 0, 0, 3, 3};  // batch 0, box (0, 0)-(3, 3)
    for (int i = 0; i < 5; ++i) rois.data<float>()[i] = roi[i];

    detops::Tensor output = detops::Tensor::empty({1, 1, 2, 2}, detops::DType::kFloat32);
    detops::RoiAlignOptions options;
    options.pooled_height = 2;
    options.pooled_width = 2;
    options.sampling_ratio = 1;
    options.aligned = false;
    detops::roi_align_forward(input, rois, output, options);

    // Bins are 1.5 wide; one sample each, at x, y in {0.75, 2.25}: value 1 + 4y + x.
    const float expected[4] = {4.75f, 6.25f, 10.75f, 12.25f};
    int wrong = 0;
    for (int i = 0; i < 4; ++i) {
      const float got = output.data<float>()[i];
      if (!(std::fabs(got - expected[i]) <= 1e-5f)) {
        std::fprintf(stderr, "output[%d] = %.7g, expected %.7g\n", i, got, expected[i]);
        ++wrong;
      }
    }
    if (wrong != 0) return 1;
    std::printf("detops %s: roi_align_forward gave the expected 2x2 output (CUDA compiled: %s)\n",
                detops::version_string(), detops::cuda_compiled() ? "yes" : "no");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "detops error: %s\n", e.what());
    return 1;
  }
}
