// Multi-scale deformable attention against golden vectors from PyTorch 1.13.1's grid_sample
// composition (scripts/gen_golden_ms_deform_attn.py): forward and the three gradients, both
// backward modes. float64 agrees to a few units of rounding of each array's peak (the two sides
// compute the position and the bilinear sum in different orders, so not bitwise); float32 and the
// 16-bit dtypes to their own precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "golden_util.h"
#include "ms_deform_attn_test_util.h"

namespace detops {
namespace {

struct GoldenCase {
  std::string name;
  ref::MsdaProblemRef pr;
  std::vector<double> output, grad_output, grad_value, grad_loc, grad_attn;
};

std::string convert(const test::GoldenRecord& r, GoldenCase* c) {
  ref::MsdaProblemRef& pr = c->pr;
  for (const auto& [k, v] : r.fields) {
    std::int64_t* dst = k == "B" ? &pr.B : k == "S" ? &pr.S : k == "M" ? &pr.M : k == "D" ? &pr.D
                      : k == "Q" ? &pr.Q : k == "L" ? &pr.L : k == "P" ? &pr.P : nullptr;
    if (dst == nullptr) return r.name + ": unknown field " + k;
    *dst = test::golden_int(v);
  }
  const std::int64_t samples = pr.B * pr.Q * pr.M * pr.L * pr.P, rows = pr.B * pr.Q * pr.M * pr.D;
  std::string why = r.need(std::vector<std::string>{"spatial_shapes"}, 2 * pr.L);
  if (why.empty()) why = r.need(std::vector<std::string>{"value", "grad_value"}, pr.B * pr.S * pr.M * pr.D);
  if (why.empty()) why = r.need(std::vector<std::string>{"sampling_locations", "grad_sampling_locations"}, 2 * samples);
  if (why.empty()) why = r.need(std::vector<std::string>{"attention_weights", "grad_attention_weights"}, samples);
  if (why.empty()) why = r.need(std::vector<std::string>{"output", "grad_output"}, rows);
  if (!why.empty()) return why;
  for (double v : r.arrays.at("spatial_shapes")) pr.shapes.push_back(static_cast<std::int64_t>(v));
  pr.value = r.arrays.at("value");
  pr.loc = r.arrays.at("sampling_locations");
  pr.attn = r.arrays.at("attention_weights");
  c->output = r.arrays.at("output");
  c->grad_output = r.arrays.at("grad_output");
  c->grad_value = r.arrays.at("grad_value");
  c->grad_loc = r.arrays.at("grad_sampling_locations");
  c->grad_attn = r.arrays.at("grad_attention_weights");
  return "";
}

const test::GoldenFile<GoldenCase>& golden() {
  static const test::GoldenFile<GoldenCase> file = test::load_golden<GoldenCase>(
      std::string(DETOPS_GOLDEN_DIR) + "/ms_deform_attn_grid_sample.txt", "scripts/gen_golden_ms_deform_attn.py",
      convert);
  return file;
}

/// The largest difference in units of the rounding of `b`'s peak: |a - b| / (peak * 2^-52).
double peak_ulps(const std::vector<double>& a, const std::vector<double>& b) {
  return test::max_error_to_peak(a, b) / std::ldexp(1.0, -52);
}

TEST(MsDeformAttnGolden, FileLoads) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  EXPECT_EQ(golden().cases.size(), 4u);
}

TEST(MsDeformAttnGolden, Float64AgreesToAFewUlps) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  for (const GoldenCase& c : golden().cases) {
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
      SCOPED_TRACE(c.name + " " + to_string(mode));
      const test::MsdaTensors t(c.pr, DType::kFloat64, DType::kFloat64, false);
      const test::MsdaBuf out = test::msda_run_forward(t, false);
      const test::MsdaBuf go = test::msda_filled({c.pr.B, c.pr.Q, c.pr.M * c.pr.D}, DType::kFloat64, c.grad_output,
                                                 false);
      const test::MsdaGrads g = test::msda_run_backward(t, go, mode, false);
      const double e[4] = {peak_ulps(test::to_vector(out.view), c.output),
                           peak_ulps(test::to_vector(g.value.view), c.grad_value),
                           peak_ulps(test::to_vector(g.loc.view), c.grad_loc),
                           peak_ulps(test::to_vector(g.attn.view), c.grad_attn)};
      RecordProperty(c.name + "_peak_ulps", std::to_string(std::max({e[0], e[1], e[2], e[3]})));
      EXPECT_LE(e[0], 8.0) << "output";
      EXPECT_LE(e[1], 8.0) << "grad_value";
      EXPECT_LE(e[2], 8.0) << "grad_sampling_locations";
      EXPECT_LE(e[3], 8.0) << "grad_attention_weights";
    }
  }
}

TEST(MsDeformAttnGolden, NarrowDtypesAgreeToTheirPrecision) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  const std::pair<DType, double> dtypes[] = {
      {DType::kFloat32, 1e-5}, {DType::kFloat16, 5e-3}, {DType::kBFloat16, 4e-2}};
  for (const GoldenCase& c : golden().cases) {
    for (const auto& [dt, tol] : dtypes) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
      // locations in float32 for every dtype: the golden positions, not rounded to 16 bits
      const test::MsdaTensors t(c.pr, dt, DType::kFloat32, false);
      const test::MsdaBuf out = test::msda_run_forward(t, false);
      const test::MsdaBuf go = test::msda_filled({c.pr.B, c.pr.Q, c.pr.M * c.pr.D}, dt, c.grad_output, false);
      const test::MsdaGrads g = test::msda_run_backward(t, go, BackwardMode::kExact, false);
      EXPECT_LE(test::max_error_to_peak(test::to_vector(out.view), c.output), tol);
      EXPECT_LE(test::max_error_to_peak(test::to_vector(g.value.view), c.grad_value), tol);
      EXPECT_LE(test::max_error_to_peak(test::to_vector(g.loc.view), c.grad_loc), 4 * tol);
      EXPECT_LE(test::max_error_to_peak(test::to_vector(g.attn.view), c.grad_attn), tol);
    }
  }
}

}  // namespace
}  // namespace detops
