// grid_sample against torch.nn.functional.grid_sample (torch 1.13.1, float64, CPU): the golden
// vectors of tests/golden/grid_sample_torch.txt (scripts/gen_golden_grid_sample.py). detops
// evaluates PyTorch's CPU operations in PyTorch's order (with its fused multiply-adds), so in
// float64 the forward and grad_grid agree to the bit. grad_input sums the same contributions in
// another order where one pixel receives several: detops adds them in (point, corner) order,
// PyTorch's vectorized kernel corner by corner within each vector of 4 points (AVX2 doubles), so
// there a few ulps may differ. (Lower precisions are checked against the reference in
// grid_sample_test.cpp: the golden file's border points, such as 1 - 1/W, are not exact in them
// and move across pixel edges, where nearest and grad_grid jump.)
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "golden_util.h"
#include "grid_sample_test_util.h"

namespace detops {
namespace {

struct GoldenCase {
  std::string name;
  test::GridSampleProblem p{};
  std::vector<double> output, grad_input, grad_grid;
};

std::string convert(const test::GoldenRecord& r, GoldenCase* c) {
  test::GridSampleProblem& p = c->p;
  for (const auto& [k, v] : r.fields) {
    if (test::golden_nchw_field(k, v, &p.N, &p.C, &p.H, &p.W)) continue;
    if (k == "Ho") p.Ho = test::golden_int(v);
    else if (k == "Wo") p.Wo = test::golden_int(v);
    else if (k == "mode") p.opt.interpolation = v == "nearest" ? GridSampleInterpolation::kNearest
                                                               : GridSampleInterpolation::kBilinear;
    else if (k == "padding") p.opt.padding = v == "border"       ? GridSamplePadding::kBorder
                                             : v == "reflection" ? GridSamplePadding::kReflection
                                                                 : GridSamplePadding::kZeros;
    else if (k == "align_corners") p.opt.align_corners = v == "1";
    else return r.name + ": unknown field " + k;
  }
  const std::int64_t in = p.N * p.C * p.H * p.W, out = p.N * p.C * p.Ho * p.Wo, grid = p.N * p.Ho * p.Wo * 2;
  for (const auto& [label, count] : {std::pair<const char*, std::int64_t>{"input", in}, {"grid", grid},
                                     {"output", out}, {"grad_output", out}, {"grad_input", in}, {"grad_grid", grid}})
    if (!r.has(label, count)) return r.name + ": missing or short " + label;
  p.input = r.arrays.at("input");
  p.grid = r.arrays.at("grid");
  p.grad_output = r.arrays.at("grad_output");
  c->output = r.arrays.at("output");
  c->grad_input = r.arrays.at("grad_input");
  c->grad_grid = r.arrays.at("grad_grid");
  return "";
}

const test::GoldenFile<GoldenCase>& golden() {
  static const test::GoldenFile<GoldenCase> file = test::load_golden<GoldenCase>(
      std::string(DETOPS_GOLDEN_DIR) + "/grid_sample_torch.txt", "scripts/gen_golden_grid_sample.py", convert);
  return file;
}

TEST(GridSampleGolden, FileCoversEveryModePaddingAndAlignment) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  EXPECT_EQ(golden().cases.size(), 24u);
}

TEST(GridSampleGolden, Float64ForwardAndGradGridToTheBitGradInputWithinUlps) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  for (const GoldenCase& c : golden().cases) {
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const test::GridSampleRun r =
            test::run_grid_sample(c.p, DType::kFloat64, DType::kFloat64, layout, mode, 2);
        const std::string what = c.name + " " + to_string(mode) + (layout == Layout::kNHWC ? " nhwc" : "");
        const test::UlpDiff fo = test::ulp_diff(test::to_vector(r.output), c.output, DType::kFloat64);
        const test::UlpDiff gi = test::ulp_diff(test::to_vector(r.grad_input), c.grad_input, DType::kFloat64);
        const test::UlpDiff gg = test::ulp_diff(test::to_vector(r.grad_grid), c.grad_grid, DType::kFloat64);
        EXPECT_EQ(fo.differing, 0) << what << ": output, " << fo.max_ulps << " ulps at most";
        EXPECT_LE(gi.max_ulps, 8) << what << ": grad_input, " << gi.differing << " elements differ";
        EXPECT_EQ(gg.differing, 0) << what << ": grad_grid, " << gg.max_ulps << " ulps at most";
      }
    }
  }
}

}  // namespace
}  // namespace detops
