// Multi-scale deformable attention backward against central finite differences of the forward,
// in float64 on the CPU: loss = sum(output * G) for a fixed G, d loss / d x ~ (loss(x + h) -
// loss(x - h)) / 2h for every element of value, sampling_locations and attention_weights.
// The output is linear in value and in the attention weights, so those quotients are exact up to
// rounding for any sample. In a location it is piecewise linear (kinks where a position crosses
// a pixel centre, and the skip bounds): the problem keeps every position at least 1e-3 from a
// kink (redrawn until it does), far beyond the step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ms_deform_attn_test_util.h"

namespace detops {
namespace {

constexpr double kStep = 1e-6;
constexpr double kTol = 1e-6;

/// Distance of a position from the nearest kink: an integer (a corner changes) or a skip bound.
double kink_distance(double loc, std::int64_t size) {
  const double x = loc * static_cast<double>(size) - 0.5;
  return std::min({std::abs(x - std::round(x)), std::abs(x + 1.0), std::abs(x - static_cast<double>(size))});
}

ref::MsdaProblemRef problem() {
  ref::MsdaProblemRef pr = test::msda_random_problem(2, 2, 3, 4, 2, {3, 5, 2, 2, 1, 3}, 81);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-0.15, 1.15);
  for (std::size_t i = 0; i < pr.loc.size(); ++i) {
    const std::int64_t l = static_cast<std::int64_t>(i / 2 / static_cast<std::size_t>(pr.P)) % pr.L;
    const std::int64_t size = pr.shapes[static_cast<std::size_t>(2 * l + (i % 2 == 0 ? 1 : 0))];
    while (kink_distance(pr.loc[i], size) < 1e-3) pr.loc[i] = u(rng);
  }
  return pr;
}

double loss(const ref::MsdaProblemRef& pr, const std::vector<double>& G) {
  const test::MsdaTensors t(pr, DType::kFloat64, DType::kFloat64, false);
  const std::vector<double> out = test::to_vector(test::msda_run_forward(t, false).view);
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += out[i] * G[i];
  return s;
}

/// Compares each analytic gradient element with the difference quotient of `field`.
void check_field(const ref::MsdaProblemRef& pr, const std::vector<double>& G, std::vector<double> ref::MsdaProblemRef::*field,
                 const std::vector<double>& analytic, const char* name) {
  std::int64_t checked = 0;
  for (std::size_t i = 0; i < (pr.*field).size(); ++i) {
    ref::MsdaProblemRef plus = pr, minus = pr;
    (plus.*field)[i] += kStep;
    (minus.*field)[i] -= kStep;
    const double fd = (loss(plus, G) - loss(minus, G)) / (2 * kStep);
    EXPECT_NEAR(analytic[i], fd, kTol * std::max(1.0, std::abs(fd))) << name << "[" << i << "]";
    ++checked;
  }
  EXPECT_GT(checked, 0) << name;
}

TEST(MsDeformAttnGradcheck, Float64GradientsMatchFiniteDifferences) {
  const ref::MsdaProblemRef pr = problem();
  const std::vector<double> G = test::random_values(static_cast<std::size_t>(pr.B * pr.Q * pr.M * pr.D), 17);
  const test::MsdaTensors t(pr, DType::kFloat64, DType::kFloat64, false);
  const test::MsdaBuf go = test::msda_filled({pr.B, pr.Q, pr.M * pr.D}, DType::kFloat64, G, false);
  for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
    SCOPED_TRACE(to_string(mode));
    const test::MsdaGrads g = test::msda_run_backward(t, go, mode, false);
    check_field(pr, G, &ref::MsdaProblemRef::value, test::to_vector(g.value.view), "grad_value");
    check_field(pr, G, &ref::MsdaProblemRef::loc, test::to_vector(g.loc.view), "grad_sampling_locations");
    check_field(pr, G, &ref::MsdaProblemRef::attn, test::to_vector(g.attn.view), "grad_attention_weights");
  }
}

}  // namespace
}  // namespace detops
