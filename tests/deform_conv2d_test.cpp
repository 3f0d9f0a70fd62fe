// deform_conv2d on the CPU: every configuration x dtype x mode against the float64 reference
// (forward and all five gradients), central finite differences in float64, bitwise
// reproducibility (runs, 1/2/3/8 threads, NCHW vs NHWC, instruction sets, chunked images), atomic
// against exact, the caller's workspace, empty problems, and the bad-input matrix with poisoned
// outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "deform_conv2d_test_util.h"

namespace detops {
namespace {

using test::DeformConv2dConfig;
using test::DeformConv2dProblem;
using test::DeformConv2dRun;
using test::to_vector;

/// Error bound relative to the largest reference value of a quantity: sums of up to ~100 terms
/// rounded in float (16-bit inputs are exact in float, their outputs are rounded once).
double tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 2e-6;
    case DType::kFloat16: return 2e-3;
    default: return 1.6e-2;
  }
}

std::string name(std::size_t config, DType dt, BackwardMode mode) {
  return "config " + std::to_string(config) + " " + std::string(dtype_name(dt)) + " " + to_string(mode);
}

void expect_close(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  EXPECT_LE(test::max_error_to_peak(to_vector(got), want), tol) << what;
}

TEST(DeformConv2d, MatchesReferenceEveryConfigDtypeAndMode) {
  const std::vector<DeformConv2dConfig> configs = test::deform_configs();
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const DeformConv2dProblem p = test::make_deform_problem(configs[i], 10 + i);
    for (DType dt : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const test::DeformConv2dResult ref = test::ref::deform_conv2d(test::rounded_problem(p, dt));
      for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
        const DeformConv2dRun r = test::run_deform_conv2d(p, dt, Layout::kNCHW, mode, 2);
        const double tol = tolerance(dt);
        const std::string what = name(i, dt, mode);
        expect_close(r.output, ref.output, tol, what + " output");
        expect_close(r.grad_input, ref.grad_input, tol, what + " grad_input");
        expect_close(r.grad_weight, ref.grad_weight, tol, what + " grad_weight");
        expect_close(r.grad_offset, ref.grad_offset, tol, what + " grad_offset");
        if (p.has_mask) expect_close(r.grad_mask, ref.grad_mask, tol, what + " grad_mask");
        if (p.has_bias) expect_close(r.grad_bias, ref.grad_bias, tol, what + " grad_bias");
      }
    }
  }
}

/// d(sum(output * grad_output)) / d(x) by central differences in float64, for every element of
/// input, weight, offset (away from the kinks: samples on a pixel row or column), mask and bias.
TEST(DeformConv2d, GradientsMatchFiniteDifferences) {
  DeformConv2dConfig c = test::deform_configs()[1];
  c.N = 1;
  DeformConv2dProblem p = test::make_deform_problem(c, 77);
  // keep every sample off the pixel grid, where the derivative has a kink
  for (double& o : p.offset) o = std::round(o * 4) / 4 + 0.3;
  const DeformConv2dRun r = test::run_deform_conv2d(p, DType::kFloat64, Layout::kNCHW, BackwardMode::kExact, 2);
  const auto loss = [&](const DeformConv2dProblem& q) {
    const test::DeformConv2dResult f = test::ref::deform_conv2d(q);
    double s = 0;
    for (std::size_t i = 0; i < f.output.size(); ++i) s += f.output[i] * q.grad_output[i];
    return s;
  };
  const double h = 1e-6;
  const auto check = [&](std::vector<double> DeformConv2dProblem::*field, const Tensor& grad, const char* what) {
    const std::vector<double> g = to_vector(grad);
    ASSERT_EQ(g.size(), (p.*field).size()) << what;
    for (std::size_t i = 0; i < g.size(); ++i) {
      DeformConv2dProblem a = p, b = p;
      (a.*field)[i] += h;
      (b.*field)[i] -= h;
      const double fd = (loss(a) - loss(b)) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-6 * (1 + std::fabs(fd))) << what << "[" << i << "]";
    }
  };
  check(&DeformConv2dProblem::input, r.grad_input, "grad_input");
  check(&DeformConv2dProblem::weight, r.grad_weight, "grad_weight");
  check(&DeformConv2dProblem::offset, r.grad_offset, "grad_offset");
  check(&DeformConv2dProblem::mask, r.grad_mask, "grad_mask");
  check(&DeformConv2dProblem::bias, r.grad_bias, "grad_bias");
}

/// Many samples on a small map: runs of one pixel longer than the engine's partial (256).
DeformConv2dProblem crowded_problem() {
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  return test::make_deform_problem({2, 6, 4, 5, 5, 3, 3, 1, 2, o, true, true}, 300, 1.5);
}

void expect_same_run(const DeformConv2dRun& a, const DeformConv2dRun& b, const std::string& what,
                     bool grad_input = true) {
  // NCHW-ordered values compared as bytes: the layout must not change a bit
  const auto same = [&](const Tensor& x, const Tensor& y, const char* name) {
    if (!x.view().defined()) return;
    const std::vector<double> u = to_vector(x), v = to_vector(y);
    EXPECT_EQ(u.size(), v.size()) << what << " " << name;
    EXPECT_EQ(std::memcmp(u.data(), v.data(), u.size() * sizeof(double)), 0) << what << " " << name;
  };
  same(a.output, b.output, "output");
  if (grad_input) same(a.grad_input, b.grad_input, "grad_input");
  same(a.grad_weight, b.grad_weight, "grad_weight");
  same(a.grad_offset, b.grad_offset, "grad_offset");
  same(a.grad_mask, b.grad_mask, "grad_mask");
  same(a.grad_bias, b.grad_bias, "grad_bias");
}

TEST(DeformConv2d, ExactIsBitwiseAcrossRunsThreadsAndLayouts) {
  const DeformConv2dProblem p = crowded_problem();
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    const DeformConv2dRun base = test::run_deform_conv2d(p, dt, Layout::kNCHW, BackwardMode::kExact, 1);
    for (int threads : {1, 2, 3, 8})
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
        expect_same_run(test::run_deform_conv2d(p, dt, layout, BackwardMode::kExact, threads), base,
                        std::string(dtype_name(dt)) + " threads " + std::to_string(threads) +
                            (layout == Layout::kNHWC ? " nhwc" : ""));
  }
}

TEST(DeformConv2d, InstructionSetVariantsGiveTheSameBits) {
  // The crowded problem (blocks only partly filled), and one whose GEMMs fill whole blocks of every
  // variant (8 rows by up to 32 columns) with some left over, over more than one slice of k (256):
  // 2 groups of 32 input channels x 9 taps (k = 288 in the forward), 10 output channels each, 11 x 9
  // positions.
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  const DeformConv2dProblem wide = test::make_deform_problem({2, 64, 11, 9, 20, 3, 3, 2, 1, o, true, true}, 310, 1.5);
  for (const DeformConv2dProblem& p : {crowded_problem(), wide}) {
    for (DType dt : {DType::kFloat32, DType::kFloat64}) {
      const DeformConv2dRun base =
          test::run_deform_conv2d(p, dt, Layout::kNCHW, BackwardMode::kExact, 2, Device::cpu(), CpuIsa::kBaseline);
      for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
        if (static_cast<int>(isa) > static_cast<int>(cpu_isa_supported())) continue;
        const std::string what = std::to_string(p.Cin) + " channels " + std::string(dtype_name(dt)) + " " +
                                 cpu_isa_name(isa);
        expect_same_run(test::run_deform_conv2d(p, dt, Layout::kNCHW, BackwardMode::kExact, 2, Device::cpu(), isa),
                        base, what);
      }
    }
  }
}

TEST(DeformConv2d, AtomicDiffersFromExactOnlyInGradInputRounding) {
  const DeformConv2dProblem p = crowded_problem();
  for (DType dt : {DType::kFloat32, DType::kFloat16}) {
    const DeformConv2dRun e = test::run_deform_conv2d(p, dt, Layout::kNCHW, BackwardMode::kExact, 2);
    const DeformConv2dRun a = test::run_deform_conv2d(p, dt, Layout::kNHWC, BackwardMode::kAtomic, 2);
    expect_same_run(a, e, std::string(dtype_name(dt)) + " atomic", false);
    // the atomic mode rounds after every add (in the 16-bit dtype for float16)
    EXPECT_LE(test::max_error_to_peak(to_vector(a.grad_input), to_vector(e.grad_input)),
              dt == DType::kFloat16 ? 2e-2 : 1e-5);
  }
}

/// Slices [i, i + 1) of the batch dimension of a result, NCHW-ordered.
std::vector<double> image(const Tensor& t, std::int64_t i) {
  const std::vector<double> v = to_vector(t);
  const std::size_t per = v.size() / static_cast<std::size_t>(t.view().sizes[0]);
  return {v.begin() + static_cast<std::ptrdiff_t>(per * i), v.begin() + static_cast<std::ptrdiff_t>(per * (i + 1))};
}

TEST(DeformConv2d, ChunkedImagesGiveEachImagesOwnBits) {
  // 32 channels x 9 taps x 48 x 48 positions = 663552 column elements per image: the 2^22 budget
  // holds 6 images, so 7 images run as a chunk of 6 and a chunk of 1; each image must come out as
  // when it runs alone, and grad_weight / grad_bias (sums over the batch) as the reference says.
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  const DeformConv2dConfig c{7, 32, 48, 48, 2, 3, 3, 1, 1, o, true, true};
  static_assert(6 * 32 * 9 * 48 * 48 <= (1 << 22) && 7 * 32 * 9 * 48 * 48 > (1 << 22), "two chunks");
  const DeformConv2dProblem p = test::make_deform_problem(c, 900);
  const DeformConv2dRun all = test::run_deform_conv2d(p, DType::kFloat32, Layout::kNCHW, BackwardMode::kExact, 2);
  for (std::int64_t i : {0, 5, 6}) {
    DeformConv2dProblem q = p;
    q.N = 1;
    const auto slice = [&](const std::vector<double>& v) {
      const std::size_t per = v.size() / static_cast<std::size_t>(p.N);
      return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(per * i),
                                 v.begin() + static_cast<std::ptrdiff_t>(per * (i + 1)));
    };
    q.input = slice(p.input), q.offset = slice(p.offset), q.mask = slice(p.mask), q.grad_output = slice(p.grad_output);
    const DeformConv2dRun one = test::run_deform_conv2d(q, DType::kFloat32, Layout::kNCHW, BackwardMode::kExact, 2);
    const std::string what = "image " + std::to_string(i);
    EXPECT_EQ(image(all.output, i), to_vector(one.output)) << what;
    EXPECT_EQ(image(all.grad_input, i), to_vector(one.grad_input)) << what;
    EXPECT_EQ(image(all.grad_offset, i), to_vector(one.grad_offset)) << what;
    EXPECT_EQ(image(all.grad_mask, i), to_vector(one.grad_mask)) << what;
  }
  const test::DeformConv2dResult ref = test::ref::deform_conv2d(test::rounded_problem(p, DType::kFloat32));
  expect_close(all.grad_weight, ref.grad_weight, 1e-5, "grad_weight");
  expect_close(all.grad_bias, ref.grad_bias, 1e-5, "grad_bias");
}

TEST(DeformConv2d, CallerWorkspaceGivesTheSameBits) {
  const DeformConv2dProblem p = crowded_problem();
  const DeformConv2dRun base = test::run_deform_conv2d(p, DType::kFloat32, Layout::kNCHW, BackwardMode::kExact, 2);
  const test::DeformConv2dTensors t = test::deform_tensors(p, DType::kFloat32, Layout::kNCHW);
  DeformConv2dRun r;
  r.output = Tensor::empty({p.N, p.Cout, p.Ho(), p.Wo()}, DType::kFloat32);
  r.grad_input = Tensor::empty({p.N, p.Cin, p.H, p.W}, DType::kFloat32);
  r.grad_weight = Tensor::empty({p.Cout, p.Cin / p.groups, p.kh, p.kw}, DType::kFloat32);
  r.grad_offset = Tensor::empty({p.N, 2 * p.offset_groups * p.kh * p.kw, p.Ho(), p.Wo()}, DType::kFloat32);
  r.grad_mask = Tensor::empty({p.N, p.offset_groups * p.kh * p.kw, p.Ho(), p.Wo()}, DType::kFloat32);
  r.grad_bias = Tensor::empty({p.Cout}, DType::kFloat32);
  const std::size_t fb = deform_conv2d_forward_workspace_size(t.input, t.weight, t.offset, t.mask, t.bias, r.output,
                                                              p.opt);
  std::vector<unsigned char> fw(fb + 3);
  deform_conv2d_forward(t.input, t.weight, t.offset, t.mask, t.bias, r.output, p.opt, {}, {fw.data() + 3, fb});
  const DeformConv2dGrads g{r.grad_input, r.grad_weight, r.grad_offset, r.grad_mask, r.grad_bias};
  const std::size_t bb = deform_conv2d_backward_workspace_size(t.grad_output, t.input, t.weight, t.offset, t.mask, g,
                                                               p.opt, {});
  EXPECT_GT(bb, 0u);
  std::vector<unsigned char> bw(bb + 1);
  deform_conv2d_backward(t.grad_output, t.input, t.weight, t.offset, t.mask, g, p.opt, {}, {}, {bw.data() + 1, bb});
  expect_same_run(r, base, "caller workspace");
  // one byte short is refused before anything is written
  EXPECT_THROW(deform_conv2d_backward(t.grad_output, t.input, t.weight, t.offset, t.mask, g, p.opt, {}, {},
                                      {bw.data(), bb - 1}),
               Error);
}

TEST(DeformConv2d, EmptyProblemsSucceed) {
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  for (const DeformConv2dConfig& c : {DeformConv2dConfig{0, 4, 5, 5, 3, 3, 3, 1, 1, o, true, true},
                                      DeformConv2dConfig{2, 4, 5, 5, 0, 3, 3, 1, 1, o, true, false},
                                      DeformConv2dConfig{2, 0, 5, 5, 3, 3, 3, 1, 1, o, true, true},
                                      // nothing needs workspace, yet grad_offset and grad_mask have elements
                                      DeformConv2dConfig{2, 0, 5, 5, 0, 3, 3, 1, 1, o, true, false}}) {
    const DeformConv2dProblem p = test::rounded_problem(test::make_deform_problem(c, 5), DType::kFloat32);
    const DeformConv2dRun r = test::run_deform_conv2d(p, DType::kFloat32, Layout::kNCHW, BackwardMode::kExact, 2);
    const test::DeformConv2dResult ref = test::ref::deform_conv2d(p);
    // the reference has no gradients without a grad_output (N = 0): they are all 0
    const auto expect = [](const Tensor& got, const std::vector<double>& want, const char* what) {
      const std::vector<double> g = to_vector(got);
      EXPECT_EQ(g, want.empty() ? std::vector<double>(g.size(), 0.0) : want) << what;
    };
    SCOPED_TRACE("N " + std::to_string(c.N) + " Cin " + std::to_string(c.Cin) + " Cout " + std::to_string(c.Cout));
    expect(r.output, ref.output, "output");
    expect(r.grad_input, ref.grad_input, "grad_input");
    expect(r.grad_weight, ref.grad_weight, "grad_weight");
    expect(r.grad_offset, ref.grad_offset, "grad_offset");
    expect(r.grad_mask, ref.grad_mask, "grad_mask");
    // grad_bias sums 50 values in float, the reference in double
    if (c.bias && c.N > 0) expect_close(r.grad_bias, ref.grad_bias, 1e-6, "grad_bias");
    if (c.bias && c.N == 0) expect(r.grad_bias, ref.grad_bias, "grad_bias");
  }
}

// A NaN offset shows, as in torchvision: its sample is NaN, so the output at that position (every
// output channel of its groups), grad_mask, grad_weight and both of its grad_offset entries are
// NaN; grad_input gets nothing from it. An infinite offset samples nothing (0), as torchvision's.
TEST(DeformConv2d, NanOffsetsPropagateAndInfinitiesSampleNothing) {
  DeformConv2dProblem p = test::make_deform_problem(test::deform_configs()[0], 41);
  ASSERT_EQ(p.offset_groups, 1);
  ASSERT_FALSE(p.has_mask);
  const std::int64_t Ho = p.Ho(), Wo = p.Wo(), plane = Ho * Wo;
  p.offset[0] = std::nan("");  // image 0, tap 0's y, position (0, 0)
  p.offset[3] = INFINITY;      // image 0, tap 0's y, position (0, 3)
  p.offset[static_cast<std::size_t>(plane + 8)] = -INFINITY;  // tap 0's x, position (1, 1)
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
      const std::string what = std::string(dtype_name(dt)) + " " + to_string(mode);
      const DeformConv2dRun r = test::run_deform_conv2d(p, dt, Layout::kNCHW, mode, 2);
      const std::vector<double> out = to_vector(r.output), go = to_vector(r.grad_offset);
      for (std::size_t i = 0; i < out.size(); ++i) {
        const bool at_nan = i % static_cast<std::size_t>(plane) == 0 && i < static_cast<std::size_t>(p.Cout * plane);
        EXPECT_EQ(std::isnan(out[i]), at_nan) << what << " output " << i;
        if (!at_nan) {
          EXPECT_TRUE(std::isfinite(out[i])) << what << " output " << i;
        }
      }
      for (std::size_t i = 0; i < go.size(); ++i) {
        const bool at_nan = i == 0 || i == static_cast<std::size_t>(plane);  // tap 0's y and x at (0, 0)
        EXPECT_EQ(std::isnan(go[i]), at_nan) << what << " grad_offset " << i;
      }
      for (double v : to_vector(r.grad_input)) EXPECT_TRUE(std::isfinite(v)) << what;
      const std::vector<double> gw = to_vector(r.grad_weight);  // tap (0, 0) of every weight sums the sample
      for (std::size_t i = 0; i < gw.size(); ++i)
        EXPECT_EQ(std::isnan(gw[i]), i % static_cast<std::size_t>(p.kh * p.kw) == 0) << what << " grad_weight " << i;
      for (double v : to_vector(r.grad_bias)) EXPECT_TRUE(std::isfinite(v)) << what;
    }
  }
}

// A fresh mmcv DCN layer (zero offsets, padding 1): every border tap sits exactly on row or
// column -1. Under mmcv's rule those taps' offset gradients are 0; under torchvision's they are
// the one-sided derivatives (nonzero). Nothing else may change, in either mode, in any dtype.
TEST(DeformConv2d, MmcvBorderRuleZeroesOffsetGradientsAtMinusOneOnly) {
  const DeformConv2dProblem tv = test::fresh_dcn_problem(DeformBorderRule::kTorchvision, 7);
  const DeformConv2dProblem mm = test::fresh_dcn_problem(DeformBorderRule::kMmcv, 7);
  const std::int64_t Ho = tv.Ho(), Wo = tv.Wo(), K = tv.kh * tv.kw;
  // whether offset channel ch at (ho, wo) belongs to a tap outside -1 < y < H, -1 < x < W
  auto outside = [&](std::int64_t ch, std::int64_t ho, std::int64_t wo) {
    const std::int64_t tap = (ch / 2) % K, i = tap / tv.kw, j = tap % tv.kw;
    const std::int64_t y = ho - tv.opt.pad_h + i, x = wo - tv.opt.pad_w + j;
    return y <= -1 || y >= tv.H || x <= -1 || x >= tv.W;
  };
  for (DType dt : {DType::kFloat64, DType::kFloat32, DType::kBFloat16}) {
    const test::DeformConv2dResult ref = test::ref::deform_conv2d(test::rounded_problem(mm, dt));
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
      const std::string what = std::string(dtype_name(dt)) + " " + to_string(mode);
      const DeformConv2dRun a = test::run_deform_conv2d(tv, dt, Layout::kNCHW, mode, 2);
      const DeformConv2dRun b = test::run_deform_conv2d(mm, dt, Layout::kNCHW, mode, 2);
      for (const auto& [x, y, n] : {std::tuple{&a.output, &b.output, "output"},
                                    std::tuple{&a.grad_input, &b.grad_input, "grad_input"},
                                    std::tuple{&a.grad_weight, &b.grad_weight, "grad_weight"},
                                    std::tuple{&a.grad_mask, &b.grad_mask, "grad_mask"},
                                    std::tuple{&a.grad_bias, &b.grad_bias, "grad_bias"}})
        EXPECT_TRUE(test::same_bytes(*x, *y)) << what << " " << n;
      const std::vector<double> ga = to_vector(a.grad_offset), gb = to_vector(b.grad_offset);
      std::int64_t border = 0, nonzero = 0;
      for (std::int64_t n = 0; n < tv.N; ++n)
        for (std::int64_t ch = 0; ch < 2 * tv.offset_groups * K; ++ch)
          for (std::int64_t ho = 0; ho < Ho; ++ho)
            for (std::int64_t wo = 0; wo < Wo; ++wo) {
              const auto at = static_cast<std::size_t>(((n * 2 * tv.offset_groups * K + ch) * Ho + ho) * Wo + wo);
              if (!outside(ch, ho, wo)) {
                EXPECT_EQ(ga[at], gb[at]) << what << " inside entry " << at;
                continue;
              }
              ++border;
              nonzero += ga[at] != 0;
              EXPECT_EQ(gb[at], 0.0) << what << " border entry " << at;
            }
      EXPECT_GT(border, 0) << what;
      // at y = -1 only the y entry is one-sided (the x derivative reads row -1 alone: 0), and the
      // corner taps have both coordinates at -1: a good fifth of the border entries are nonzero
      EXPECT_GT(nonzero, border / 5) << what << ": torchvision's one-sided derivatives should be nonzero";
      expect_close(b.grad_offset, ref.grad_offset, tolerance(dt), what + " grad_offset vs the mmcv-rule reference");
    }
  }
}

TEST(DeformConv2d, BadBorderRuleThrowsAndWritesNothing) {
  const DeformConv2dProblem p = test::make_deform_problem(test::deform_configs()[0], 3);
  const test::DeformConv2dTensors t = test::deform_tensors(p, DType::kFloat32, Layout::kNCHW);
  Tensor grad_offset = Tensor::empty({p.N, 2 * p.offset_groups * p.kh * p.kw, p.Ho(), p.Wo()}, DType::kFloat32);
  grad_offset.fill_bytes(0xCD);
  const Tensor before = grad_offset.to(Device::cpu());
  DeformConv2dGrads g;
  g.grad_offset = grad_offset;
  DeformConv2dBackwardOptions b;
  b.border_rule = static_cast<DeformBorderRule>(2);
  for (bool query : {false, true}) {
    try {
      if (query)
        deform_conv2d_backward_workspace_size(t.grad_output, t.input, t.weight, t.offset, t.mask, g, p.opt, b);
      else
        deform_conv2d_backward(t.grad_output, t.input, t.weight, t.offset, t.mask, g, p.opt, b);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("border_rule 2 is unknown"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(test::same_bytes(grad_offset, before));
}

// ---------------------------------------------------------------------------------------------
// Bad input: a clear error naming the argument, nothing written.

struct BadCase {
  const char* what;
  const char* message;  // a substring of the error
  std::function<void(test::DeformConv2dTensors&, DeformConv2dRun&, DeformConv2dOptions&, BackwardMode&)> spoil;
};

TEST(DeformConv2d, BadInputThrowsAndWritesNothing) {
  const DeformConv2dProblem p = test::make_deform_problem(test::deform_configs()[1], 8);
  const auto poison = [](Tensor& t) { std::memset(t.view().data, 0x5a, t.nbytes()); };
  const std::vector<BadCase> cases = {
      {"weight dtype", "weight has dtype",
       [](auto& t, auto&, auto&, auto&) { t.weight = Tensor::empty({6, 2, 3, 3}, DType::kFloat64); }},
      {"groups", "Cin / groups dividing",
       [](auto& t, auto&, auto&, auto&) { t.weight = Tensor::empty({6, 3, 3, 3}, DType::kFloat32); }},
      {"Cout by groups", "Cout divisible by groups",
       [](auto& t, auto&, auto&, auto&) { t.weight = Tensor::empty({5, 2, 3, 3}, DType::kFloat32); }},
      {"offset channels", "offset has sizes",
       [](auto& t, auto&, auto&, auto&) { t.offset = Tensor::empty({2, 17, 5, 6}, DType::kFloat32); }},
      {"offset groups", "offset groups",
       [](auto& t, auto&, auto&, auto&) { t.offset = Tensor::empty({2, 54, 5, 6}, DType::kFloat32); }},
      {"mask size", "mask has sizes",
       [](auto& t, auto&, auto&, auto&) { t.mask = Tensor::empty({2, 9, 5, 6}, DType::kFloat32); }},
      {"bias size", "bias has sizes", [](auto& t, auto&, auto&, auto&) { t.bias = Tensor::empty({5}, DType::kFloat32); }},
      {"stride", "stride", [](auto&, auto&, auto& o, auto&) { o.stride_w = 0; }},
      {"dilation", "dilation", [](auto&, auto&, auto& o, auto&) { o.dilation_h = -1; }},
      {"padding", "padding", [](auto&, auto&, auto& o, auto&) { o.pad_h = -1; }},
      {"kernel larger than map", "no output position",
       [](auto& t, auto&, auto& o, auto&) {
         o.pad_h = 0;
         t.weight = Tensor::empty({6, 2, 9, 3}, DType::kFloat32);
       }},
      {"truncated mode", "truncated", [](auto&, auto&, auto&, auto& m) { m = BackwardMode::kTruncated; }},
      {"grad_input aliases input", "grad_input overlaps input",
       [](auto& t, auto& r, auto&, auto&) { r.grad_input = t.input; }},
  };
  for (const BadCase& bc : cases) {
    test::DeformConv2dTensors t = test::deform_tensors(p, DType::kFloat32, Layout::kNCHW);
    DeformConv2dRun r;
    r.output = Tensor::empty({p.N, p.Cout, p.Ho(), p.Wo()}, DType::kFloat32);
    r.grad_input = Tensor::empty({p.N, p.Cin, p.H, p.W}, DType::kFloat32);
    r.grad_weight = Tensor::empty({p.Cout, p.Cin / p.groups, p.kh, p.kw}, DType::kFloat32);
    r.grad_offset = Tensor::empty({p.N, 2 * p.offset_groups * 9, p.Ho(), p.Wo()}, DType::kFloat32);
    r.grad_mask = Tensor::empty({p.N, p.offset_groups * 9, p.Ho(), p.Wo()}, DType::kFloat32);
    r.grad_bias = Tensor::empty({p.Cout}, DType::kFloat32);
    for (Tensor* x : {&r.output, &r.grad_input, &r.grad_weight, &r.grad_offset, &r.grad_mask, &r.grad_bias}) poison(*x);
    DeformConv2dOptions o = p.opt;
    BackwardMode mode = BackwardMode::kExact;
    bc.spoil(t, r, o, mode);
    const DeformConv2dRun before{r.output.to(Device::cpu()),      r.grad_input.to(Device::cpu()),
                                 r.grad_weight.to(Device::cpu()), r.grad_offset.to(Device::cpu()),
                                 r.grad_mask.to(Device::cpu()),   r.grad_bias.to(Device::cpu())};
    const bool forward_case = mode == BackwardMode::kExact && std::string(bc.what) != "grad_input aliases input";
    if (forward_case) {
      try {
        deform_conv2d_forward(t.input, t.weight, t.offset, t.mask, t.bias, r.output, o);
        ADD_FAILURE() << bc.what << ": forward did not throw";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(bc.message), std::string::npos) << bc.what << ": " << e.what();
      }
    }
    if (std::string(bc.what) != "bias size") {
      DeformConv2dBackwardOptions b;
      b.mode = mode;
      const DeformConv2dGrads g{r.grad_input, r.grad_weight, r.grad_offset, r.grad_mask, r.grad_bias};
      try {
        deform_conv2d_backward(t.grad_output, t.input, t.weight, t.offset, t.mask, g, o, b);
        ADD_FAILURE() << bc.what << ": backward did not throw";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(bc.message), std::string::npos) << bc.what << ": " << e.what();
      }
    }
    EXPECT_TRUE(test::same_bytes(r.output, before.output)) << bc.what;
    EXPECT_TRUE(test::same_bytes(r.grad_input, before.grad_input)) << bc.what;
    EXPECT_TRUE(test::same_bytes(r.grad_weight, before.grad_weight)) << bc.what;
    EXPECT_TRUE(test::same_bytes(r.grad_offset, before.grad_offset)) << bc.what;
    EXPECT_TRUE(test::same_bytes(r.grad_mask, before.grad_mask)) << bc.what;
    EXPECT_TRUE(test::same_bytes(r.grad_bias, before.grad_bias)) << bc.what;
  }
}

// ---------------------------------------------------------------------------------------------
// Size arithmetic from the options: 2 * pad_h and dilation_h * (kh - 1) were int64 products
// that wrapped, so pad_h = INT64_MAX gave a small Ho and the call succeeded.

/// The Ho (or Wo) the unchecked arithmetic gave: every step modulo 2^64, as the wrap did.
std::int64_t wrapped_out_size(std::int64_t H, std::int64_t pad, std::int64_t dilation, std::int64_t k,
                              std::int64_t stride) {
  const std::uint64_t padded = static_cast<std::uint64_t>(H) + 2u * static_cast<std::uint64_t>(pad);
  const std::uint64_t eff = static_cast<std::uint64_t>(dilation) * static_cast<std::uint64_t>(k - 1) + 1u;
  return static_cast<std::int64_t>(padded - eff) / stride + 1;
}

TEST(DeformConv2d, OptionArithmeticThatOverflowsIsAnErrorShowingTheGivenValues) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  struct OverflowCase {
    const char* what;
    DeformConv2dOptions o;
    const char* message;  // a substring of the error: the argument and the value given
  };
  DeformConv2dOptions pad, dil, both;
  pad.pad_h = kMax;
  dil.dilation_h = kMax;
  both.pad_w = kMax / 2 + 1;
  both.dilation_w = kMax / 2 + 1;
  const std::vector<OverflowCase> cases = {
      {"pad_h", pad, "padding is (9223372036854775807, 0)"},
      {"dilation_h", dil, "dilation is (9223372036854775807, 1)"},
      {"pad_w", both, "padding is (0, 4611686018427387904)"},
  };
  const std::int64_t N = 1, C = 1, H = 7, W = 7, k = 3;
  for (const OverflowCase& c : cases) {
    SCOPED_TRACE(c.what);
    // tensors shaped for the wrapped output size, so that only the arithmetic can refuse the call
    const std::int64_t Ho = wrapped_out_size(H, c.o.pad_h, c.o.dilation_h, k, c.o.stride_h);
    const std::int64_t Wo = wrapped_out_size(W, c.o.pad_w, c.o.dilation_w, k, c.o.stride_w);
    ASSERT_GT(Ho, 0);
    ASSERT_GT(Wo, 0);
    Tensor input = Tensor::zeros({N, C, H, W}, DType::kFloat32);
    Tensor weight = Tensor::zeros({C, C, k, k}, DType::kFloat32);
    Tensor offset = Tensor::zeros({N, 2 * k * k, Ho, Wo}, DType::kFloat32);
    Tensor output = Tensor::zeros({N, C, Ho, Wo}, DType::kFloat32);
    Tensor grad_output = Tensor::zeros({N, C, Ho, Wo}, DType::kFloat32);
    Tensor grad_input = Tensor::zeros({N, C, H, W}, DType::kFloat32);
    Tensor grad_offset = Tensor::zeros({N, 2 * k * k, Ho, Wo}, DType::kFloat32);
    for (Tensor* t : {&output, &grad_input, &grad_offset}) std::memset(t->view().data, 0x5a, t->nbytes());
    const Tensor out0 = output.to(Device::cpu()), gi0 = grad_input.to(Device::cpu()),
                 go0 = grad_offset.to(Device::cpu());
    const DeformConv2dGrads g{grad_input, {}, grad_offset, {}, {}};
    const std::vector<std::pair<const char*, std::function<void()>>> calls = {
        {"forward", [&] { deform_conv2d_forward(input, weight, offset, {}, {}, output, c.o); }},
        {"forward workspace size",
         [&] { (void)deform_conv2d_forward_workspace_size(input, weight, offset, {}, {}, output, c.o); }},
        {"backward", [&] { deform_conv2d_backward(grad_output, input, weight, offset, {}, g, c.o, {}); }},
        {"backward workspace size",
         [&] { (void)deform_conv2d_backward_workspace_size(grad_output, input, weight, offset, {}, g, c.o, {}); }},
    };
    for (const auto& [call, run] : calls) {
      try {
        run();
        ADD_FAILURE() << call << " succeeded";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << call;
        EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << call << ": " << e.what();
      }
    }
    EXPECT_TRUE(test::same_bytes(output, out0));
    EXPECT_TRUE(test::same_bytes(grad_input, gi0));
    EXPECT_TRUE(test::same_bytes(grad_offset, go0));
  }
}

TEST(DeformConv2d, ColumnsPerImageBeyondAnyMemoryAreAnError) {
  // Broadcast (stride-0) views: 2^30 input channels and an output of 2^33 + 1 rows from a padding
  // of 2^32 need 2^63+ column elements per image, a product that no longer fits in int64.
  float cells[2] = {0, 0};  // the inputs at cells[0], the output's span from cells[1] on
  float* cell = &cells[0];
  const std::int64_t Cin = std::int64_t{1} << 30, pad = std::int64_t{1} << 32, Ho = 2 * pad + 1;
  const TensorView input(cell, DType::kFloat32, Device::cpu(), {1, Cin, 1, 1}, {0, 0, 0, 0});
  const TensorView weight(cell, DType::kFloat32, Device::cpu(), {1, Cin, 1, 1}, {0, 0, 0, 0});
  const TensorView offset(cell, DType::kFloat32, Device::cpu(), {1, 2, Ho, 1}, {0, 0, 0, 0});
  // a non-overlapping output view that is never written: only the size query is called
  const TensorView out(&cells[1], DType::kFloat32, Device::cpu(), {1, 1, Ho, 1}, {0, 0, 1, 0});
  DeformConv2dOptions o;
  o.pad_h = pad;
  try {
    (void)deform_conv2d_forward_workspace_size(input, weight, offset, {}, {}, out, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Cin = 1073741824 and a 1x1 kernel at 8589934593x1 output positions"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace detops
