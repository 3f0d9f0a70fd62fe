// RoIAlign backward against central finite differences of the forward, in float64 on the CPU:
// loss = sum(output * G) for a fixed G, d loss / d input[i] ~ (loss(x + h e_i) - loss(x - h e_i)) / 2h.
// Avg pooling is linear in the input values (sample positions do not depend on them), so the
// difference quotient is exact up to rounding for any box, edge boxes included. Max pooling is
// piecewise linear: valid while the perturbation leaves every argmax unchanged, so its problems
// use random inputs and boxes well inside the map, and elements whose perturbation moves an
// argmax are skipped (and counted). The same check is run on the float64 reference itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "detops/context.h"
#include "detops/dtype.h"
#include "detops/roi_align.h"
#include "detops/tensor.h"
#include "reference/roi_align_reference.h"

namespace {

using detops::BackwardMode;
using detops::DType;
using detops::Layout;
using detops::PoolMode;
using detops::Tensor;

constexpr double kStep = 1e-6;
constexpr double kAbsTol = 1e-6;
constexpr double kRelTol = 1e-6;

struct Problem {
  const char* name;
  std::int64_t N, C, H, W, PH, PW;
  double spatial_scale;
  std::int64_t sampling_ratio;
  bool aligned;
  PoolMode pool;
  std::vector<double> rois;  // K rows of (batch, x1, y1, x2, y2), image coordinates
  std::int64_t K() const { return static_cast<std::int64_t>(rois.size() / 5); }
};

std::vector<Problem> problems() {
  return {
      // avg: linear in the inputs, so edge boxes are fair game.
      {"avg_legacy_sr2_edges", 2, 2, 7, 6, 2, 3, 0.5, 2, false, PoolMode::kAvg,
       {0, 1.5, 2.25, 9.0, 11.5,      // inside
        1, -5.0, -3.0, 4.0, 6.5,      // crosses the top-left edge and the apron
        0, 8.0, 10.0, 14.5, 15.0,     // crosses the bottom-right edge
        1, -2.0, 4.0, -1.0, 8.0,      // a strip in the left apron
        0, 4.5, 4.5, 4.5, 4.5,        // zero size (legacy: becomes 1x1)
        1, 6.0, 8.0, 3.0, 2.0}},      // negative size
      {"avg_aligned_adaptive_edges", 2, 2, 7, 6, 3, 3, 1.0, 0, true, PoolMode::kAvg,
       {0, 0.5, 0.5, 5.25, 6.0,       // inside
        1, -8.0, -6.0, 14.0, 18.0,    // huge: adaptive grid 8x8 per bin
        0, -1.0, -1.0, 0.5, 0.5,      // apron edge: samples at -1
        1, 4.0, 5.0, 7.5, 8.5,        // crosses the bottom-right edge
        0, 2.0, 2.0, 2.0, 2.0,        // zero size: adaptive grid 0, no samples
        1, 2.3, 1.7, 2.6, 1.9}},      // tiny
      {"avg_legacy_adaptive_7x7", 1, 3, 9, 8, 7, 7, 0.25, -1, false, PoolMode::kAvg,
       {0, 4.0, 2.0, 28.0, 30.0, 0, -6.0, -4.0, 10.0, 12.0}},
      {"avg_aligned_sr1_scale2", 2, 2, 6, 7, 2, 2, 2.0, 1, true, PoolMode::kAvg,
       {1, 0.25, 0.5, 2.75, 2.5, 0, 1.1, 0.4, 3.3, 3.4}},
      // max: boxes well inside the map, random inputs, no clamping (no exact ties).
      {"max_aligned_sr2", 2, 2, 8, 7, 2, 2, 1.0, 2, true, PoolMode::kMax,
       {0, 1.5, 1.75, 5.5, 6.25, 1, 2.25, 1.5, 6.0, 7.0, 1, 1.3, 2.1, 3.9, 4.4}},
      {"max_legacy_adaptive", 2, 2, 9, 8, 3, 2, 0.5, 0, false, PoolMode::kMax,
       {1, 3.0, 2.5, 12.0, 14.0, 0, 2.2, 3.4, 10.6, 13.8}},
      {"max_aligned_sr3", 1, 3, 7, 7, 2, 3, 1.0, 3, true, PoolMode::kMax, {0, 1.25, 1.5, 5.5, 5.75}},
  };
}

// ------------------------------------------------------------------------------------------------
// Tensors through their strides (float64 and int32 only here).

void for_each_offset(const detops::TensorView& v, const std::function<void(std::int64_t)>& f) {
  std::int64_t idx[detops::kMaxRank] = {};
  const std::int64_t n = v.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t off = 0;
    for (int d = 0; d < v.rank; ++d) off += idx[d] * v.strides[d];
    f(off);
    for (int d = v.rank - 1; d >= 0; --d) {
      if (++idx[d] < v.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

void fill(const Tensor& t, const std::vector<double>& values) {
  std::size_t i = 0;
  for_each_offset(t.view(), [&](std::int64_t off) {
    if (t.view().dtype == DType::kInt32) static_cast<std::int32_t*>(t.view().data)[off] = static_cast<std::int32_t>(values[i++]);
    else static_cast<double*>(t.view().data)[off] = values[i++];
  });
}

std::vector<double> read(const Tensor& t) {
  std::vector<double> out;
  for_each_offset(t.view(), [&](std::int64_t off) {
    out.push_back(t.view().dtype == DType::kInt32 ? static_cast<const std::int32_t*>(t.view().data)[off]
                                                  : static_cast<const double*>(t.view().data)[off]);
  });
  return out;
}

Tensor make4(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, DType dt, Layout layout) {
  Tensor t = Tensor::empty({a, b, c, d}, dt, detops::Device::cpu(), layout);
  t.fill_bytes(0xFF);
  return t;
}

// ------------------------------------------------------------------------------------------------

detops::RoiAlignOptions options_of(const Problem& p) {
  detops::RoiAlignOptions o;
  o.pooled_height = p.PH;
  o.pooled_width = p.PW;
  o.spatial_scale = p.spatial_scale;
  o.sampling_ratio = p.sampling_ratio;
  o.aligned = p.aligned;
  o.pool_mode = p.pool;
  return o;
}

// A problem run through the library in one layout.
class LibraryRunner {
 public:
  LibraryRunner(const Problem& p, Layout layout)
      : p_(p),
        layout_(layout),
        input_(make4(p.N, p.C, p.H, p.W, DType::kFloat64, layout)),
        rois_(Tensor::empty({p.K(), 5}, DType::kFloat64, detops::Device::cpu())),
        output_(make4(p.K(), p.C, p.PH, p.PW, DType::kFloat64, layout)),
        argmax_(make4(p.K(), p.C, p.PH, p.PW, DType::kInt32, layout)) {
    fill(rois_, p.rois);
  }

  // Output (NCHW order) and argmax (max pooling) for the given input (NCHW order).
  std::vector<double> forward(const std::vector<double>& x, std::vector<double>* argmax = nullptr) {
    fill(input_, x);
    const bool is_max = p_.pool == PoolMode::kMax;
    detops::roi_align_forward(input_, rois_, output_, options_of(p_), detops::Context{},
                              is_max ? argmax_.view() : detops::TensorView{});
    if (argmax != nullptr && is_max) *argmax = read(argmax_);
    return read(output_);
  }

  std::vector<double> backward(const std::vector<double>& g, const std::vector<double>& argmax, BackwardMode mode) {
    Tensor go = make4(p_.K(), p_.C, p_.PH, p_.PW, DType::kFloat64, layout_);
    fill(go, g);
    Tensor gi = make4(p_.N, p_.C, p_.H, p_.W, DType::kFloat64, layout_);
    Tensor am;
    const bool is_max = p_.pool == PoolMode::kMax;
    if (is_max) {
      am = make4(p_.K(), p_.C, p_.PH, p_.PW, DType::kInt32, layout_);
      fill(am, argmax);
    }
    detops::RoiAlignBackwardOptions b;
    b.mode = mode;
    detops::roi_align_backward(go, rois_, gi, options_of(p_), b, detops::Context{},
                               is_max ? am.view() : detops::TensorView{});
    return read(gi);
  }

 private:
  const Problem& p_;
  Layout layout_;
  Tensor input_, rois_, output_, argmax_;
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> random_input(const Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<double> x(static_cast<std::size_t>(p.N * p.C * p.H * p.W));
  for (double& v : x) v = u(rng);
  return x;
}

// Multiples of 1/64 in [-2, 2], never 0: exact in float16, so the truncated mode rounds nothing.
std::vector<double> random_grad(const Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> u(1, 128);
  std::vector<double> g(static_cast<std::size_t>(p.K() * p.C * p.PH * p.PW));
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

::testing::AssertionResult grads_agree(const std::vector<double>& analytic, const NumericGrad& numeric,
                                       const Problem& p) {
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

class RoiAlignGradcheckCpu : public ::testing::TestWithParam<std::size_t> {
 protected:
  Problem problem() const { return problems().at(GetParam()); }
};

TEST_P(RoiAlignGradcheckCpu, LibraryBackwardMatchesFiniteDifferences) {
  const Problem p = problem();
  const std::vector<double> x = random_input(p, 1000 + GetParam());
  const std::vector<double> G = random_grad(p, 2000 + GetParam());
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
    const char* lname = layout == Layout::kNCHW ? "NCHW" : "NHWC";
    SCOPED_TRACE(std::string(p.name) + ", " + lname);
    LibraryRunner run(p, layout);
    std::vector<double> argmax;
    run.forward(x, &argmax);
    const NumericGrad num =
        numeric_grad(x, G, [&](const std::vector<double>& xi, std::vector<double>* am) { return run.forward(xi, am); });
    EXPECT_LE(num.n_skipped * 100, static_cast<std::int64_t>(x.size()))
        << "too many elements whose perturbation moves an argmax: the problem is badly chosen";
    // Something must flow back, or the check proves nothing.
    double norm = 0;
    for (double v : num.grad) norm += std::fabs(v);
    EXPECT_GT(norm, 0.0);
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic, BackwardMode::kTruncated}) {
      const std::vector<double> gi = run.backward(G, argmax, mode);
      EXPECT_TRUE(grads_agree(gi, num, p)) << p.name << ", " << lname << ", mode " << detops::to_string(mode);
    }
  }
}

TEST_P(RoiAlignGradcheckCpu, ReferenceBackwardMatchesFiniteDifferences) {
  const Problem p = problem();
  SCOPED_TRACE(p.name);
  const bool is_max = p.pool == PoolMode::kMax;
  const std::vector<double> x = random_input(p, 1000 + GetParam());
  const std::vector<double> G = random_grad(p, 2000 + GetParam());
  auto forward = [&](const std::vector<double>& xi, std::vector<double>* am) {
    std::vector<double> out;
    std::vector<std::int32_t> a;
    detops::ref::roi_align_forward_ref(xi, p.N, p.C, p.H, p.W, p.rois, p.K(), p.PH, p.PW, p.spatial_scale,
                                       p.sampling_ratio, p.aligned, is_max, &out, &a);
    if (am != nullptr) am->assign(a.begin(), a.end());
    return out;
  };
  std::vector<double> am_d;
  forward(x, &am_d);
  const std::vector<std::int32_t> am(am_d.begin(), am_d.end());
  const NumericGrad num = numeric_grad(x, G, forward);
  EXPECT_LE(num.n_skipped * 100, static_cast<std::int64_t>(x.size()));
  const std::vector<double> gi = detops::ref::roi_align_backward_ref(
      G, p.N, p.C, p.H, p.W, p.rois, p.K(), p.PH, p.PW, p.spatial_scale, p.sampling_ratio, p.aligned, is_max, &am);
  EXPECT_TRUE(grads_agree(gi, num, p)) << "reference, " << p.name;
}

INSTANTIATE_TEST_SUITE_P(Problems, RoiAlignGradcheckCpu, ::testing::Range<std::size_t>(0, problems().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& p) {
                           return std::string(problems().at(p.param).name);
                         });

}  // namespace
