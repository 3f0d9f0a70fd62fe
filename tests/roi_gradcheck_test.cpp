// RoIAlign's and RoIAlignRotated's backward against central finite differences of the forward, in
// float64 on the CPU: loss = sum(output * G) for a fixed G, d loss / d input[i] ~
// (loss(x + h e_i) - loss(x - h e_i)) / 2h. Average pooling is linear in the input values (sample
// positions depend on the rois only), so the difference quotient is exact up to rounding for any
// box: rotated ones, boxes over the map's edges and the apron, zero-size ones, legacy alignment,
// mmcv's options. Max pooling is piecewise linear: valid while the perturbation leaves every
// argmax unchanged, so its problems use random inputs and boxes well inside the map, and elements
// whose perturbation moves an argmax are skipped (and counted). Every backward mode in both
// layouts (G is exact in float16, so the truncated mode's rounding keeps it), and the float64
// references, which the other tests trust, the same way. One harness for both ops
// (tests/roi_test_harness.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "roi_test_harness.h"

namespace detops {
namespace {

using namespace test;  // NOLINT: the harness and the helpers it builds on

constexpr double kStep = 1e-6;
constexpr double kAbsTol = 1e-6;
constexpr double kRelTol = 1e-6;

template <class G>
struct GradProblem {
  const char* name;
  std::int64_t N, C, H, W;
  typename G::Options opt;
  std::vector<double> rois;  // K rows of G's columns, image coordinates
  std::int64_t K() const { return static_cast<std::int64_t>(rois.size()) / G::kColumns; }
};

std::vector<GradProblem<AxisAlignedRois>> problems(AxisAlignedRois) {
  auto o = [](std::int64_t PH, std::int64_t PW, double scale, std::int64_t sr, bool aligned, PoolMode pool) {
    return AxisAlignedRois::options(PH, PW, scale, sr, aligned, pool);
  };
  constexpr PoolMode kAvg = PoolMode::kAvg, kMax = PoolMode::kMax;
  return {
      // avg: linear in the inputs, so edge boxes are fair game.
      {"avg_legacy_sr2_edges", 2, 2, 7, 6, o(2, 3, 0.5, 2, false, kAvg),
       {0, 1.5, 2.25, 9.0, 11.5,      // inside
        1, -5.0, -3.0, 4.0, 6.5,      // crosses the top-left edge and the apron
        0, 8.0, 10.0, 14.5, 15.0,     // crosses the bottom-right edge
        1, -2.0, 4.0, -1.0, 8.0,      // a strip in the left apron
        0, 4.5, 4.5, 4.5, 4.5,        // zero size (legacy: becomes 1x1)
        1, 6.0, 8.0, 3.0, 2.0}},      // negative size
      {"avg_aligned_adaptive_edges", 2, 2, 7, 6, o(3, 3, 1.0, 0, true, kAvg),
       {0, 0.5, 0.5, 5.25, 6.0,       // inside
        1, -8.0, -6.0, 14.0, 18.0,    // huge: adaptive grid 8x8 per bin
        0, -1.0, -1.0, 0.5, 0.5,      // apron edge: samples at -1
        1, 4.0, 5.0, 7.5, 8.5,        // crosses the bottom-right edge
        0, 2.0, 2.0, 2.0, 2.0,        // zero size: adaptive grid 0, no samples
        1, 2.3, 1.7, 2.6, 1.9}},      // tiny
      {"avg_legacy_adaptive_7x7", 1, 3, 9, 8, o(7, 7, 0.25, -1, false, kAvg),
       {0, 4.0, 2.0, 28.0, 30.0, 0, -6.0, -4.0, 10.0, 12.0}},
      {"avg_aligned_sr1_scale2", 2, 2, 6, 7, o(2, 2, 2.0, 1, true, kAvg),
       {1, 0.25, 0.5, 2.75, 2.5, 0, 1.1, 0.4, 3.3, 3.4}},
      // max: boxes well inside the map, random inputs, no clamping (no exact ties).
      {"max_aligned_sr2", 2, 2, 8, 7, o(2, 2, 1.0, 2, true, kMax),
       {0, 1.5, 1.75, 5.5, 6.25, 1, 2.25, 1.5, 6.0, 7.0, 1, 1.3, 2.1, 3.9, 4.4}},
      {"max_legacy_adaptive", 2, 2, 9, 8, o(3, 2, 0.5, 0, false, kMax),
       {1, 3.0, 2.5, 12.0, 14.0, 0, 2.2, 3.4, 10.6, 13.8}},
      {"max_aligned_sr3", 1, 3, 7, 7, o(2, 3, 1.0, 3, true, kMax), {0, 1.25, 1.5, 5.5, 5.75}},
  };
}

std::vector<GradProblem<RotatedRois>> problems(RotatedRois) {
  auto o = [](std::int64_t PH, std::int64_t PW, double scale, std::int64_t sr, AngleUnit unit, bool aligned,
              bool clockwise) {
    RoiAlignRotatedOptions r = RotatedRois::options(PH, PW, scale, sr, aligned, PoolMode::kAvg);
    r.angle_unit = unit;
    r.clockwise = clockwise;
    return r;
  };
  return {
      {"detectron2_sr2_edges", 2, 2, 7, 6, o(2, 3, 0.5, 2, AngleUnit::kDegrees, true, false),
       {0, 6.0, 7.0, 6.0, 4.0, 30.0,     // inside, turned
        1, 1.0, 2.0, 9.0, 7.0, -60.0,    // over the top-left edge and the apron
        0, 11.0, 13.0, 5.0, 8.0, 135.0,  // over the bottom-right edge
        1, 5.0, 5.0, 0.0, 0.0, 10.0,     // zero size: no samples
        0, 6.0, 6.0, 30.0, 2.0, 90.0}},  // a long strip across the map
      {"detectron2_adaptive", 2, 2, 7, 6, o(3, 2, 1.0, 0, AngleUnit::kDegrees, true, false),
       {0, 3.0, 3.5, 4.5, 5.0, 17.0,
        1, 2.0, 3.0, 12.0, 10.0, -100.0,  // adaptive grid 5x5 per bin
        0, 5.5, 0.5, 1.0, 0.5, 45.0}},
      {"mmcv_legacy_clockwise_radians", 1, 3, 6, 8, o(2, 2, 1.0, 2, AngleUnit::kRadians, false, true),
       {0, 4.0, 3.0, 5.0, 3.0, 0.7,
        0, 1.0, 1.0, -2.0, 0.5, -2.1,  // negative width: clamped to 1 in the legacy mode
        0, 7.5, 5.0, 6.0, 6.0, 3.0}},
  };
}

Tensor make4(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, DType dt, Layout layout) {
  Tensor t = Tensor::empty({a, b, c, d}, dt, Device::cpu(), layout);
  t.fill_bytes(0xFF);
  return t;
}

// A problem run through the library in one layout.
template <class G>
class LibraryRunner {
 public:
  LibraryRunner(const GradProblem<G>& p, Layout layout)
      : p_(p),
        layout_(layout),
        input_(make4(p.N, p.C, p.H, p.W, DType::kFloat64, layout)),
        rois_(make_tensor({p.K(), G::kColumns}, DType::kFloat64, p.rois)),
        output_(make4(p.K(), p.C, p.opt.pooled_height, p.opt.pooled_width, DType::kFloat64, layout)),
        argmax_(make4(p.K(), p.C, p.opt.pooled_height, p.opt.pooled_width, DType::kInt32, layout)) {}

  // Output (NCHW order) and argmax (max pooling) for the given input (NCHW order).
  std::vector<double> forward(const std::vector<double>& x, std::vector<double>* argmax = nullptr) {
    fill_from(input_, x);
    G::forward(input_, rois_, output_, p_.opt, {}, max() ? argmax_.view() : TensorView{});
    if (argmax != nullptr && max()) *argmax = to_vector(argmax_);
    return to_vector(output_);
  }

  std::vector<double> backward(const std::vector<double>& g, const std::vector<double>& argmax, BackwardMode mode) {
    const std::int64_t PH = p_.opt.pooled_height, PW = p_.opt.pooled_width;
    Tensor go = make4(p_.K(), p_.C, PH, PW, DType::kFloat64, layout_);
    fill_from(go, g);
    Tensor gi = make4(p_.N, p_.C, p_.H, p_.W, DType::kFloat64, layout_);
    Tensor am;
    if (max()) {
      am = make4(p_.K(), p_.C, PH, PW, DType::kInt32, layout_);
      fill_from(am, argmax);
    }
    RoiAlignBackwardOptions b;
    b.mode = mode;
    G::backward(go, rois_, gi, p_.opt, b, {}, max() ? am.view() : TensorView{});
    return to_vector(gi);
  }

 private:
  bool max() const { return G::max_pool(p_.opt); }
  const GradProblem<G>& p_;
  Layout layout_;
  Tensor input_, rois_, output_, argmax_;
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Multiples of 1/64 in [-2, 2], never 0: exact in float16, so the truncated mode rounds nothing.
std::vector<double> random_grad(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> u(1, 128);
  std::vector<double> g(n);
  for (double& v : g) v = (rng() & 1 ? 1.0 : -1.0) * u(rng) / 64.0;
  return g;
}

struct NumericGrad {
  std::vector<double> grad;
  std::vector<bool> skipped;  // max pooling: the perturbation moved an argmax
  std::int64_t n_skipped = 0;
};

// Central differences of loss = <forward(x), G>; `forward` returns the output and (for max
// pooling) the argmax, which must not move for the difference to be a derivative.
NumericGrad numeric_grad(const std::vector<double>& x, const std::vector<double>& G,
                         const std::function<std::vector<double>(const std::vector<double>&, std::vector<double>*)>& forward) {
  NumericGrad r;
  r.grad.assign(x.size(), 0.0);
  r.skipped.assign(x.size(), false);
  std::vector<double> am0, amp, amm;
  forward(x, &am0);
  std::vector<double> xp = x;
  for (std::size_t i = 0; i < x.size(); ++i) {
    xp[i] = x[i] + kStep;
    const double lp = dot(forward(xp, &amp), G);
    xp[i] = x[i] - kStep;
    const double lm = dot(forward(xp, &amm), G);
    xp[i] = x[i];
    if (amp != am0 || amm != am0) {
      r.skipped[i] = true;
      ++r.n_skipped;
      continue;
    }
    r.grad[i] = (lp - lm) / (2 * kStep);
  }
  return r;
}

template <class G>
::testing::AssertionResult grads_agree(const std::vector<double>& analytic, const NumericGrad& numeric,
                                       const GradProblem<G>& p) {
  if (analytic.size() != numeric.grad.size()) {
    return ::testing::AssertionFailure() << "grad_input has " << analytic.size() << " elements, expected "
                                         << numeric.grad.size();
  }
  std::int64_t bad = 0;
  std::ostringstream msg;
  msg.precision(17);
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    if (numeric.skipped[i]) continue;
    const double err = std::fabs(analytic[i] - numeric.grad[i]);
    if (!(err <= kAbsTol + kRelTol * std::fabs(numeric.grad[i]))) {
      if (bad < 8) {
        const std::int64_t w = static_cast<std::int64_t>(i) % p.W, h = (static_cast<std::int64_t>(i) / p.W) % p.H;
        const std::int64_t c = (static_cast<std::int64_t>(i) / (p.W * p.H)) % p.C;
        const std::int64_t n = static_cast<std::int64_t>(i) / (p.W * p.H * p.C);
        msg << "\n  input[n=" << n << " c=" << c << " y=" << h << " x=" << w << "]: backward " << analytic[i]
            << ", finite difference " << numeric.grad[i];
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << analytic.size() << " gradient elements disagree"
                                       << msg.str();
}

/// The problem's input and G (seeded by its index), and the finite differences of `forward`,
/// which must see a gradient (or the check proves nothing) and few moved argmaxes.
template <class G>
struct Check {
  GradProblem<G> p;
  std::vector<double> x, g;
  explicit Check(std::size_t index)
      : p(problems(G{}).at(index)),
        x(random_values(static_cast<std::size_t>(p.N * p.C * p.H * p.W), 1000 + index, -2.0, 2.0)),
        g(random_grad(static_cast<std::size_t>(p.K() * p.C * p.opt.pooled_height * p.opt.pooled_width),
                      2000 + index)) {}
  template <class Forward>
  NumericGrad numeric(Forward&& forward) const {
    const NumericGrad num = numeric_grad(x, g, forward);
    EXPECT_LE(num.n_skipped * 100, static_cast<std::int64_t>(x.size()))
        << "too many elements whose perturbation moves an argmax: the problem is badly chosen";
    EXPECT_GT(max_abs(num.grad), 0.1) << "the problem exercises the gradient";
    return num;
  }
};

struct GradParam {
  RoiOp op;
  std::size_t index;
  std::string name;
};
void PrintTo(const GradParam& p, std::ostream* os) { *os << p.name; }

template <class G>
std::vector<GradParam> grad_params() {
  std::vector<GradParam> params;
  const auto list = problems(G{});
  for (std::size_t i = 0; i < list.size(); ++i) params.push_back({G::kOp, i, list[i].name});
  return params;
}

class RoiGradcheck : public ::testing::TestWithParam<GradParam> {};

TEST_P(RoiGradcheck, LibraryBackwardMatchesFiniteDifferences) {
  with_geometry(GetParam().op, [&](auto geometry) {
    using G = decltype(geometry);
    const Check<G> c(GetParam().index);
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
      const char* lname = layout == Layout::kNCHW ? "NCHW" : "NHWC";
      SCOPED_TRACE(std::string(c.p.name) + ", " + lname);
      LibraryRunner<G> run(c.p, layout);
      std::vector<double> argmax;
      run.forward(c.x, &argmax);
      const NumericGrad num =
          c.numeric([&](const std::vector<double>& xi, std::vector<double>* am) { return run.forward(xi, am); });
      for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic, BackwardMode::kTruncated}) {
        const std::vector<double> gi = run.backward(c.g, argmax, mode);
        EXPECT_TRUE(grads_agree(gi, num, c.p)) << c.p.name << ", " << lname << ", mode " << to_string(mode);
      }
    }
  });
}

TEST_P(RoiGradcheck, ReferenceBackwardMatchesFiniteDifferences) {
  with_geometry(GetParam().op, [&](auto geometry) {
    using G = decltype(geometry);
    const Check<G> c(GetParam().index);
    const GradProblem<G>& p = c.p;
    SCOPED_TRACE(p.name);
    auto forward = [&](const std::vector<double>& xi, std::vector<double>* am) {
      std::vector<std::int32_t> a;
      const std::vector<double> out = G::reference_forward(xi, p.N, p.C, p.H, p.W, p.rois, p.opt, &a);
      if (am != nullptr) am->assign(a.begin(), a.end());
      return out;
    };
    std::vector<double> am_d;
    forward(c.x, &am_d);
    const std::vector<std::int32_t> am(am_d.begin(), am_d.end());
    const NumericGrad num = c.numeric(forward);
    const std::vector<double> gi = G::reference_backward(c.g, p.N, p.C, p.H, p.W, p.rois, p.opt, &am);
    EXPECT_TRUE(grads_agree(gi, num, p)) << "reference, " << p.name;
  });
}

auto grad_name = [](const ::testing::TestParamInfo<GradParam>& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(RoiAlign, RoiGradcheck, ::testing::ValuesIn(grad_params<AxisAlignedRois>()), grad_name);
INSTANTIATE_TEST_SUITE_P(RoiAlignRotated, RoiGradcheck, ::testing::ValuesIn(grad_params<RotatedRois>()), grad_name);

}  // namespace
}  // namespace detops
