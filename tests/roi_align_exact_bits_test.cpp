// RoIAlign's exact-mode bits, pinned. The exact mode promises the same bits across runs, threads,
// layouts and backends; this suite also holds them across the code's own history: the hashes
// below were produced by the exact mode as it stood before it moved onto the gather-backward
// engine (commit d2660ea), and a refactor that changes any bit fails here. The hashes do not
// depend on the machine (that is the exact mode's guarantee). To print the table for a deliberate
// change of the summation order (say so in the commit): DETOPS_PRINT_PINS=1.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "detops/roi_align.h"
#include "test_util.h"

namespace detops {
namespace {

using namespace test;

struct PinCase {
  DType dtype;
  PoolMode pool;
  std::int64_t sampling_ratio;
  bool aligned;
  Layout layout;
};

std::string name_of(const PinCase& c) {
  return std::string(dtype_name(c.dtype)) + "/" + to_string(c.pool) + "/sr" + std::to_string(c.sampling_ratio) +
         (c.aligned ? "/aligned" : "/legacy") + (c.layout == Layout::kNHWC ? "/nhwc" : "/nchw");
}

/// grad_input of the exact backward on a fixed problem: 2 images, 5 channels, 13x11 maps, 17
/// random rois (overlapping, so positions gather from several bins), 4x3 bins.
std::uint64_t exact_hash(const PinCase& c) {
  const std::int64_t N = 2, C = 5, H = 13, W = 11, K = 17;
  RoiAlignOptions opt;
  opt.pooled_height = 4;
  opt.pooled_width = 3;
  opt.spatial_scale = 0.5;
  opt.sampling_ratio = c.sampling_ratio;
  opt.aligned = c.aligned;
  opt.pool_mode = c.pool;
  const Tensor input = make_tensor({N, C, H, W}, c.dtype, random_values(N * C * H * W, 5), c.layout);
  const Tensor rois = make_tensor({K, 5}, DType::kFloat32, random_rois(K, N, 2.0 * H, 2.0 * W, 9));
  Tensor out = Tensor::empty({K, C, 4, 3}, c.dtype, Device::cpu(), c.layout);
  Tensor argmax = Tensor::empty({K, C, 4, 3}, DType::kInt32, Device::cpu(), c.layout);
  const bool max = c.pool == PoolMode::kMax;
  roi_align_forward(input.view(), rois.view(), out.view(), opt, {}, max ? argmax.view() : TensorView{});
  const Tensor grad_out = make_tensor({K, C, 4, 3}, c.dtype, random_values(K * C * 12, 21), c.layout);
  Tensor grad_in = Tensor::empty({N, C, H, W}, c.dtype, Device::cpu(), c.layout);
  RoiAlignBackwardOptions b;
  b.mode = BackwardMode::kExact;
  roi_align_backward(grad_out.view(), rois.view(), grad_in.view(), opt, b, {}, max ? argmax.view() : TensorView{});
  // FNV-1a over the values in NCHW order, as doubles (exact for every dtype): a layout's hash is
  // its values', so NCHW and NHWC must agree (and NHWC takes the vectorized phase 3).
  std::uint64_t h = 1469598103934665603ull;
  for (const double v : to_vector(grad_in.view())) {
    unsigned char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    for (unsigned char x : b) h = (h ^ x) * 1099511628211ull;
  }
  return h;
}

std::vector<PinCase> pin_cases() {
  std::vector<PinCase> v;
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16})
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
      for (std::int64_t sr : {std::int64_t{0}, std::int64_t{2}})
        for (bool aligned : {false, true})
          for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) v.push_back({dt, pool, sr, aligned, layout});
  return v;
}

// name -> exact_hash, from the pre-engine exact mode.
const struct {
  const char* name;
  std::uint64_t hash;
} kPins[] = {
#include "roi_align_exact_pins.inc"
};

TEST(RoiAlignExactBits, SameBitsAsBeforeTheEngine) {
  const std::vector<PinCase> cases = pin_cases();
  if (std::getenv("DETOPS_PRINT_PINS")) {
    for (const PinCase& c : cases)
      std::printf("    {\"%s\", 0x%016llxull},\n", name_of(c).c_str(), static_cast<unsigned long long>(exact_hash(c)));
    GTEST_SKIP() << "printed the table (tests/roi_align_exact_pins.inc)";
  }
  ASSERT_EQ(sizeof(kPins) / sizeof(kPins[0]), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(name_of(cases[i]), kPins[i].name);
    EXPECT_EQ(exact_hash(cases[i]), kPins[i].hash) << kPins[i].name;
  }
}

}  // namespace
}  // namespace detops
