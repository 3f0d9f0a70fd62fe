// deform_conv2d against torchvision.ops.deform_conv2d (torchvision 0.14.1 over torch 1.13.1,
// float64, CPU): the golden vectors of tests/golden/deform_conv2d_torchvision.txt
// (scripts/gen_golden_deform_conv2d.py), whose offsets put many samples on the cases where the
// rules are subtle: coordinates exactly -1, 0, H - 1 and H, integers and half pixels. Two sides
// are checked against them: the float64 reference (tests/reference/deform_conv2d_reference.h,
// written from the documented math) and detops' own CPU backend in both backward modes, under
// both border rules (the file's grad_offset_mmcv: mmcv's and detectron2's rule, derived by the
// generator from their kernels' early return).
// torchvision forms its products with a BLAS GEMM, which sums in its own order (and blocks), so
// neither side can agree to the bit; both must agree to a few units of rounding of each array's
// peak (kTolerance: 1e-12 of the peak, ~4500 ulps of it, far below any rule difference, which
// moves a value by a whole input-sized amount).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "detops/deform_conv2d.h"
#include "golden_util.h"
#include "reference/deform_conv2d_reference.h"
#include "test_util.h"

namespace detops {
namespace {

constexpr double kTolerance = 1e-12;

struct GoldenCase {
  std::string name;
  test::DeformConv2dProblem p{};
  test::DeformConv2dResult want;  // torchvision's output and gradients
  std::vector<double> grad_offset_mmcv;  // grad_offset under mmcv's border rule

  /// The expected results under `rule` (only grad_offset depends on it).
  test::DeformConv2dResult expected(DeformBorderRule rule) const {
    test::DeformConv2dResult r = want;
    if (rule == DeformBorderRule::kMmcv) r.grad_offset = grad_offset_mmcv;
    return r;
  }
};

constexpr DeformBorderRule kRules[] = {DeformBorderRule::kTorchvision, DeformBorderRule::kMmcv};

const char* rule_name(DeformBorderRule r) { return r == DeformBorderRule::kMmcv ? "mmcv rule" : "torchvision rule"; }

std::string convert(const test::GoldenRecord& r, GoldenCase* c) {
  test::DeformConv2dProblem& p = c->p;
  std::int64_t Ho = -1, Wo = -1;
  for (const auto& [k, v] : r.fields) {
    std::int64_t* dst = k == "N" ? &p.N : k == "Cin" ? &p.Cin : k == "H" ? &p.H : k == "W" ? &p.W
                      : k == "Cout" ? &p.Cout : k == "kh" ? &p.kh : k == "kw" ? &p.kw
                      : k == "groups" ? &p.groups : k == "offset_groups" ? &p.offset_groups
                      : k == "stride_h" ? &p.opt.stride_h : k == "stride_w" ? &p.opt.stride_w
                      : k == "pad_h" ? &p.opt.pad_h : k == "pad_w" ? &p.opt.pad_w
                      : k == "dilation_h" ? &p.opt.dilation_h : k == "dilation_w" ? &p.opt.dilation_w
                      : k == "Ho" ? &Ho : k == "Wo" ? &Wo : nullptr;
    if (dst != nullptr) *dst = test::golden_int(v);
    else if (k == "mask") p.has_mask = v == "1";
    else if (k == "bias") p.has_bias = v == "1";
    else return r.name + ": unknown field " + k;
  }
  // The file states Ho and Wo as torchvision computed them: a check of the formula in Ho(), Wo().
  if (Ho != p.Ho() || Wo != p.Wo())
    return r.name + ": Ho, Wo " + std::to_string(Ho) + ", " + std::to_string(Wo) + " differ from the formula's " +
           std::to_string(p.Ho()) + ", " + std::to_string(p.Wo());
  const std::int64_t taps = p.offset_groups * p.kh * p.kw, image = p.N * p.Cin * p.H * p.W,
                     weight = p.Cout * (p.Cin / p.groups) * p.kh * p.kw, out = p.N * p.Cout * Ho * Wo,
                     offset = p.N * 2 * taps * Ho * Wo, mask = p.N * taps * Ho * Wo;
  std::vector<std::pair<std::string, std::int64_t>> arrays = {
      {"input", image},   {"weight", weight},          {"offset", offset},         {"grad_output", out},
      {"output", out},    {"grad_input", image},       {"grad_weight", weight},    {"grad_offset", offset},
      {"grad_offset_mmcv", offset}};
  if (p.has_mask) arrays.insert(arrays.end(), {{"mask", mask}, {"grad_mask", mask}});
  if (p.has_bias) arrays.insert(arrays.end(), {{"bias", p.Cout}, {"grad_bias", p.Cout}});
  for (const auto& [label, count] : arrays)
    if (!r.has(label, count)) return r.name + ": missing or short " + label;
  for (const char* label : {"mask", "grad_mask", "bias", "grad_bias"})
    if (r.arrays.count(label) != 0 && std::none_of(arrays.begin(), arrays.end(), [&](const auto& a) {
          return a.first == label;
        }))
      return r.name + ": " + label + " given but its flag is 0";
  auto get = [&](const char* label) { return r.arrays.count(label) != 0 ? r.arrays.at(label) : std::vector<double>{}; };
  p.input = get("input");
  p.weight = get("weight");
  p.offset = get("offset");
  p.mask = get("mask");
  p.bias = get("bias");
  p.grad_output = get("grad_output");
  c->want.output = get("output");
  c->want.grad_input = get("grad_input");
  c->want.grad_weight = get("grad_weight");
  c->want.grad_offset = get("grad_offset");
  c->grad_offset_mmcv = get("grad_offset_mmcv");
  c->want.grad_mask = get("grad_mask");
  c->want.grad_bias = get("grad_bias");
  return "";
}

const test::GoldenFile<GoldenCase>& golden() {
  static const test::GoldenFile<GoldenCase> file = test::load_golden<GoldenCase>(
      std::string(DETOPS_GOLDEN_DIR) + "/deform_conv2d_torchvision.txt", "scripts/gen_golden_deform_conv2d.py",
      convert);
  return file;
}

/// max |got - want| / max |want|: 0 when both are all zeros, infinity when a value is NaN, the
/// sizes differ, or want is all zeros and got is not.
double error_to_peak(const std::vector<double>& got, const std::vector<double>& want) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (got.size() != want.size()) return kInf;
  double e = 0, peak = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    if (std::isnan(d)) return kInf;
    e = std::max(e, d);
    peak = std::max(peak, std::abs(want[i]));
  }
  if (peak == 0) return e == 0 ? 0.0 : kInf;
  return e / peak;
}

/// The six results by name, for messages and per-quantity summaries.
std::vector<std::pair<const char*, const std::vector<double>*>> quantities(const test::DeformConv2dResult& r) {
  return {{"output", &r.output},           {"grad_input", &r.grad_input}, {"grad_weight", &r.grad_weight},
          {"grad_offset", &r.grad_offset}, {"grad_mask", &r.grad_mask},   {"grad_bias", &r.grad_bias}};
}

TEST(DeformConv2dGolden, FileCoversTheOptions) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  const auto& cs = golden().cases;
  EXPECT_EQ(cs.size(), 14u);
  auto any = [&](auto pred) {
    return std::any_of(cs.begin(), cs.end(), [&](const GoldenCase& c) { return pred(c.p); });
  };
  using P = test::DeformConv2dProblem;
  EXPECT_TRUE(any([](const P& p) { return p.has_mask; }));
  EXPECT_TRUE(any([](const P& p) { return !p.has_mask; }));
  EXPECT_TRUE(any([](const P& p) { return p.has_bias; }));
  EXPECT_TRUE(any([](const P& p) { return !p.has_bias; }));
  EXPECT_TRUE(any([](const P& p) { return p.groups == 2 && p.offset_groups == 2; }));
  EXPECT_TRUE(any([](const P& p) { return p.opt.stride_h == 2 && p.opt.stride_w == 2; }));
  EXPECT_TRUE(any([](const P& p) { return p.opt.dilation_h == 2 && p.opt.dilation_w == 2; }));
  EXPECT_TRUE(any([](const P& p) { return p.opt.pad_h == 2; }));
  EXPECT_TRUE(any([](const P& p) { return p.kh != p.kw; }));
  EXPECT_TRUE(any([](const P& p) { return p.H == 1; }));
  EXPECT_TRUE(any([](const P& p) { return p.W == 1; }));
}

// The offsets must really put samples on the subtle coordinates (a change of the generator that
// lost them would leave the rules there unchecked).
TEST(DeformConv2dGolden, SamplesLandOnBordersIntegersAndHalfPixels) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  enum { kMinusOne, kZero, kLast, kSize, kInteriorInteger, kHalf, kOutside, kCount };
  std::int64_t seen[2][kCount] = {};  // [axis][kind]
  for (const GoldenCase& c : golden().cases) {
    const test::DeformConv2dProblem& p = c.p;
    const std::int64_t Ho = p.Ho(), Wo = p.Wo(), K = p.kh * p.kw;
    for (std::int64_t n = 0; n < p.N; ++n)
      for (std::int64_t t = 0; t < p.offset_groups * K; ++t)
        for (std::int64_t ho = 0; ho < Ho; ++ho)
          for (std::int64_t wo = 0; wo < Wo; ++wo) {
            const std::int64_t i = (t % K) / p.kw, j = t % p.kw;
            const auto at = static_cast<std::size_t>(((n * 2 * p.offset_groups * K + 2 * t) * Ho + ho) * Wo + wo);
            const double coord[2] = {
                static_cast<double>(ho * p.opt.stride_h - p.opt.pad_h + i * p.opt.dilation_h) + p.offset[at],
                static_cast<double>(wo * p.opt.stride_w - p.opt.pad_w + j * p.opt.dilation_w) +
                    p.offset[at + static_cast<std::size_t>(Ho * Wo)]};
            const double size[2] = {static_cast<double>(p.H), static_cast<double>(p.W)};
            for (int a = 0; a < 2; ++a) {
              const double v = coord[a], s = size[a];
              if (v == -1) ++seen[a][kMinusOne];
              if (v == 0) ++seen[a][kZero];
              if (v == s - 1) ++seen[a][kLast];
              if (v == s) ++seen[a][kSize];
              if (v > 0 && v < s - 1 && v == std::floor(v)) ++seen[a][kInteriorInteger];
              if (v - std::floor(v) == 0.5) ++seen[a][kHalf];
              if (v < -1 || v > s) ++seen[a][kOutside];
            }
          }
  }
  const char* names[kCount] = {"-1", "0", "size - 1", "size", "an interior integer", "a half pixel", "outside"};
  for (int a = 0; a < 2; ++a)
    for (int k = 0; k < kCount; ++k) EXPECT_GT(seen[a][k], 0) << (a == 0 ? "y" : "x") << " never " << names[k];
}

TEST(DeformConv2dGolden, Float64ReferenceMatchesTorchvisionAndMmcvRules) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  for (const DeformBorderRule rule : kRules) {
    std::vector<double> worst(6, 0.0);
    for (const GoldenCase& c : golden().cases) {
      SCOPED_TRACE(c.name + " " + rule_name(rule));
      test::DeformConv2dProblem p = c.p;
      p.border_rule = rule;
      const test::DeformConv2dResult got = test::ref::deform_conv2d(p), want = c.expected(rule);
      const auto g = quantities(got), w = quantities(want);
      for (std::size_t q = 0; q < g.size(); ++q) {
        const double e = error_to_peak(*g[q].second, *w[q].second);
        worst[q] = std::max(worst[q], e);
        EXPECT_LE(e, kTolerance) << g[q].first << ": " << g[q].second->size() << " values, the golden file's "
                                 << w[q].second->size();
      }
    }
    // The figures themselves, for the record.
    std::printf("[ reference vs golden (%s), max over cases, error / peak ]", rule_name(rule));
    const auto names = quantities(test::DeformConv2dResult{});
    for (std::size_t q = 0; q < worst.size(); ++q) std::printf(" %s %.3g", names[q].first, worst[q]);
    std::printf("\n");
  }
}

// The two rules must really differ on the file (samples at exactly -1 with a nonzero one-sided
// derivative), and only in grad_offset's entries of samples outside -1 < y < H, -1 < x < W.
TEST(DeformConv2dGolden, BorderRulesDifferOnlyAtMinusOne) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  std::int64_t differ = 0;
  for (const GoldenCase& c : golden().cases) {
    ASSERT_EQ(c.grad_offset_mmcv.size(), c.want.grad_offset.size()) << c.name;
    for (std::size_t i = 0; i < c.grad_offset_mmcv.size(); ++i) {
      if (c.grad_offset_mmcv[i] == c.want.grad_offset[i]) continue;
      ++differ;
      EXPECT_EQ(c.grad_offset_mmcv[i], 0.0) << c.name << " entry " << i;
    }
  }
  EXPECT_GT(differ, 20);
}

/// A CPU float64 NCHW tensor holding `v`, or (for empty `v`) no tensor.
Tensor tensor_or_none(std::initializer_list<std::int64_t> sizes, const std::vector<double>& v) {
  return v.empty() ? Tensor{} : test::make_tensor(sizes, DType::kFloat64, v);
}

TEST(DeformConv2dGolden, Float64CpuMatchesBothRulesInBothModes) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  for (const GoldenCase& c : golden().cases) {
    const test::DeformConv2dProblem& p = c.p;
    const std::int64_t Ho = p.Ho(), Wo = p.Wo(), taps = p.offset_groups * p.kh * p.kw;
    const Tensor input = test::make_tensor({p.N, p.Cin, p.H, p.W}, DType::kFloat64, p.input);
    const Tensor weight = test::make_tensor({p.Cout, p.Cin / p.groups, p.kh, p.kw}, DType::kFloat64, p.weight);
    const Tensor offset = test::make_tensor({p.N, 2 * taps, Ho, Wo}, DType::kFloat64, p.offset);
    const Tensor mask = tensor_or_none({p.N, taps, Ho, Wo}, p.mask);
    const Tensor bias = tensor_or_none({p.Cout}, p.bias);
    const Tensor grad_output = test::make_tensor({p.N, p.Cout, Ho, Wo}, DType::kFloat64, p.grad_output);
    Context ctx;
    ctx.num_threads = 2;
    for (const auto& [mode, rule] : {std::pair{BackwardMode::kAtomic, DeformBorderRule::kTorchvision},
                                     std::pair{BackwardMode::kExact, DeformBorderRule::kTorchvision},
                                     std::pair{BackwardMode::kAtomic, DeformBorderRule::kMmcv},
                                     std::pair{BackwardMode::kExact, DeformBorderRule::kMmcv}}) {
      SCOPED_TRACE(c.name + " " + to_string(mode) + " " + rule_name(rule));
      // Outputs poisoned with 0xCD bytes (-6.3e66 as a double): every element must be written.
      Tensor output = Tensor::empty({p.N, p.Cout, Ho, Wo}, DType::kFloat64);
      Tensor grad_input = Tensor::empty({p.N, p.Cin, p.H, p.W}, DType::kFloat64);
      Tensor grad_weight = Tensor::empty({p.Cout, p.Cin / p.groups, p.kh, p.kw}, DType::kFloat64);
      Tensor grad_offset = Tensor::empty({p.N, 2 * taps, Ho, Wo}, DType::kFloat64);
      Tensor grad_mask = p.has_mask ? Tensor::empty({p.N, taps, Ho, Wo}, DType::kFloat64) : Tensor{};
      Tensor grad_bias = p.has_bias ? Tensor::empty({p.Cout}, DType::kFloat64) : Tensor{};
      for (Tensor* t : {&output, &grad_input, &grad_weight, &grad_offset, &grad_mask, &grad_bias})
        if (t->view().defined()) t->fill_bytes(0xCD);
      deform_conv2d_forward(input, weight, offset, mask, bias, output, p.opt, ctx);
      DeformConv2dGrads grads;
      grads.grad_input = grad_input;
      grads.grad_weight = grad_weight;
      grads.grad_offset = grad_offset;
      grads.grad_mask = grad_mask;  // an empty view without a mask
      grads.grad_bias = grad_bias;
      DeformConv2dBackwardOptions backward;
      backward.mode = mode;
      backward.border_rule = rule;
      deform_conv2d_backward(grad_output, input, weight, offset, mask, grads, p.opt, backward, ctx);
      test::DeformConv2dResult got;
      got.output = test::to_vector(output);
      got.grad_input = test::to_vector(grad_input);
      got.grad_weight = test::to_vector(grad_weight);
      got.grad_offset = test::to_vector(grad_offset);
      if (p.has_mask) got.grad_mask = test::to_vector(grad_mask);
      if (p.has_bias) got.grad_bias = test::to_vector(grad_bias);
      const test::DeformConv2dResult want = c.expected(rule);
      const auto g = quantities(got), w = quantities(want);
      for (std::size_t q = 0; q < g.size(); ++q)
        EXPECT_LE(error_to_peak(*g[q].second, *w[q].second), kTolerance) << g[q].first;
    }
  }
}

}  // namespace
}  // namespace detops
