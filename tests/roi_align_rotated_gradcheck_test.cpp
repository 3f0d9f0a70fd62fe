// RoIAlignRotated backward against central finite differences of the forward, in float64 on the
// CPU: loss = sum(output * G) for a fixed G, d loss / d input[i] ~ (loss(x + h e_i) - loss(x - h e_i)) / 2h.
// The op is linear in the input values (sample positions depend on the rois only), so the
// difference quotient is exact up to rounding for any box: rotated ones, boxes over the map's
// edges and the apron, zero-size ones, mmcv's options. Every backward mode is checked (G is
// representable in float16, so the truncated mode's rounding of G is exact), and so is the float64
// reference, which the other tests trust.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "detops/roi_align_rotated.h"
#include "detops/tensor.h"
#include "reference/roi_align_rotated_reference.h"
#include "test_util.h"

namespace detops {
namespace {

constexpr double kStep = 1e-6;
constexpr double kTol = 1e-6;

struct Problem {
  const char* name;
  std::int64_t N, C, H, W, PH, PW;
  double spatial_scale;
  std::int64_t sampling_ratio;
  AngleUnit unit;
  bool aligned, clockwise;
  std::vector<double> rois;  // K rows of (batch, cx, cy, w, h, angle)
  std::int64_t K() const { return static_cast<std::int64_t>(rois.size() / 6); }
  RoiAlignRotatedOptions options() const {
    RoiAlignRotatedOptions o;
    o.pooled_height = PH;
    o.pooled_width = PW;
    o.spatial_scale = spatial_scale;
    o.sampling_ratio = sampling_ratio;
    o.angle_unit = unit;
    o.aligned = aligned;
    o.clockwise = clockwise;
    return o;
  }
};

std::vector<Problem> problems() {
  return {
      {"detectron2_sr2_edges", 2, 2, 7, 6, 2, 3, 0.5, 2, AngleUnit::kDegrees, true, false,
       {0, 6.0, 7.0, 6.0, 4.0, 30.0,     // inside, turned
        1, 1.0, 2.0, 9.0, 7.0, -60.0,    // over the top-left edge and the apron
        0, 11.0, 13.0, 5.0, 8.0, 135.0,  // over the bottom-right edge
        1, 5.0, 5.0, 0.0, 0.0, 10.0,     // zero size: no samples
        0, 6.0, 6.0, 30.0, 2.0, 90.0}},  // a long strip across the map
      {"detectron2_adaptive", 2, 2, 7, 6, 3, 2, 1.0, 0, AngleUnit::kDegrees, true, false,
       {0, 3.0, 3.5, 4.5, 5.0, 17.0,
        1, 2.0, 3.0, 12.0, 10.0, -100.0,  // adaptive grid 5x5 per bin
        0, 5.5, 0.5, 1.0, 0.5, 45.0}},
      {"mmcv_legacy_clockwise_radians", 1, 3, 6, 8, 2, 2, 1.0, 2, AngleUnit::kRadians, false, true,
       {0, 4.0, 3.0, 5.0, 3.0, 0.7,
        0, 1.0, 1.0, -2.0, 0.5, -2.1,  // negative width: clamped to 1 in the legacy mode
        0, 7.5, 5.0, 6.0, 6.0, 3.0}},
  };
}

std::vector<double> forward(const Problem& p, const std::vector<double>& x) {
  Tensor input = test::make_tensor({p.N, p.C, p.H, p.W}, DType::kFloat64, x);
  Tensor rois = test::make_tensor({p.K(), 6}, DType::kFloat64, p.rois);
  Tensor out = Tensor::empty({p.K(), p.C, p.PH, p.PW}, DType::kFloat64);
  roi_align_rotated_forward(input, rois, out, p.options());
  return test::to_vector(out);
}

double loss(const std::vector<double>& out, const std::vector<double>& g) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += out[i] * g[i];
  return s;
}

/// G with values k/8 in [-2, 2]: exact in float16, so the truncated mode's rounding keeps them.
std::vector<double> upstream(std::size_t n) {
  std::vector<double> g = test::random_values(n, 77, -2.0, 2.0);
  for (double& v : g) v = std::round(v * 8) / 8;
  return g;
}

class RoiAlignRotatedGradcheck : public ::testing::TestWithParam<Problem> {};

TEST_P(RoiAlignRotatedGradcheck, BackwardMatchesFiniteDifferences) {
  const Problem& p = GetParam();
  const std::vector<double> x = test::random_values(static_cast<std::size_t>(p.N * p.C * p.H * p.W), 5, -1.0, 1.0);
  const std::vector<double> g = upstream(static_cast<std::size_t>(p.K() * p.C * p.PH * p.PW));
  std::vector<double> numeric(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += kStep;
    xm[i] -= kStep;
    numeric[i] = (loss(forward(p, xp), g) - loss(forward(p, xm), g)) / (2 * kStep);
  }
  ASSERT_GT(test::max_abs(numeric), 0.1);  // the problem exercises the gradient

  Tensor rois = test::make_tensor({p.K(), 6}, DType::kFloat64, p.rois);
  Tensor go = test::make_tensor({p.K(), p.C, p.PH, p.PW}, DType::kFloat64, g);
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    SCOPED_TRACE(to_string(mode));
    Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, DType::kFloat64);
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_rotated_backward(go, rois, gi, p.options(), b);
    const std::vector<double> analytic = test::to_vector(gi);
    for (std::size_t i = 0; i < x.size(); ++i)
      EXPECT_NEAR(analytic[i], numeric[i], kTol * (1 + std::fabs(numeric[i]))) << "element " << i;
  }
  // the reference's backward is the same derivative
  ref::RotatedParamsRef rp;
  rp.PH = p.PH, rp.PW = p.PW, rp.spatial_scale = p.spatial_scale, rp.sampling_ratio = p.sampling_ratio;
  rp.aligned = p.aligned, rp.radians = p.unit == AngleUnit::kRadians, rp.clockwise = p.clockwise;
  const std::vector<double> ref_grad = ref::roi_align_rotated_backward_ref(g, p.N, p.C, p.H, p.W, p.rois, p.K(), rp);
  for (std::size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(ref_grad[i], numeric[i], kTol * (1 + std::fabs(numeric[i]))) << "reference element " << i;
}

INSTANTIATE_TEST_SUITE_P(Problems, RoiAlignRotatedGradcheck, ::testing::ValuesIn(problems()),
                         [](const ::testing::TestParamInfo<Problem>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace detops
