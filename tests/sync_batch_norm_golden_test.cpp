// SyncBatchNorm on the CPU (label cpu) against golden vectors from torch.nn.BatchNorm2d in training
// mode (float64 forward, buffers, torch's saved mean / invstd, autograd backward;
// scripts/gen_golden_sync_bn.py -> DETOPS_GOLDEN_DIR/batch_norm_torch.txt). One process with
// communicator nullptr is SyncBatchNorm with one rank, i.e. BatchNorm2d.
// Each case runs in float64 (within float64 rounding of torch) and in float32 (inputs rounded to
// float32, against the same float64 golden, within what that rounding allows), NCHW and NHWC,
// SyncBnMode::kDefault and kExact; NCHW and NHWC give the same bits. num_batches_tracked exactly.
// The largest errors seen are printed per case and, at the end, per quantity and dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "detops/dtype.h"
#include "detops/sync_batch_norm.h"
#include "detops/tensor.h"
#include "golden_util.h"
#include "test_util.h"

#ifndef DETOPS_GOLDEN_DIR
#error "DETOPS_GOLDEN_DIR must name the folder of the golden vectors (a string literal)"
#endif

namespace detops {
namespace {

constexpr const char* kGoldenFile = DETOPS_GOLDEN_DIR "/batch_norm_torch.txt";

// ================================================================================================
// Golden file (format: scripts/gen_golden_sync_bn.py; parsed by golden_util.h).

struct GoldenCase {
  std::string name;
  std::int64_t N = 0, C = 0, H = 0, W = 0;
  double eps = 0.0;
  std::optional<double> momentum;
  bool affine = false, track = false;
  std::int64_t nbt = 0;  // initial num_batches_tracked
  std::map<std::string, std::vector<double>> a;  // arrays by label

  const std::vector<double>& operator[](const std::string& k) const { return a.at(k); }
  std::int64_t numel() const { return N * C * H * W; }
  std::string describe() const {
    std::ostringstream s;
    s << name << " (N=" << N << " C=" << C << " H=" << H << " W=" << W << " eps=" << eps << " momentum="
      << (momentum ? std::to_string(*momentum) : std::string("None")) << " affine=" << affine << " track=" << track
      << " nbt=" << nbt << ")";
    return s.str();
  }
};

using GoldenFile = test::GoldenFile<GoldenCase>;

/// A record of the golden file as a case; "" or why not.
std::string to_case(const test::GoldenRecord& r, GoldenCase* c) {
  for (const auto& [k, v] : r.fields) {
    if (test::golden_nchw_field(k, v, &c->N, &c->C, &c->H, &c->W)) continue;
    if (k == "eps") c->eps = test::golden_double(v);
    else if (k == "momentum") c->momentum = v == "None" ? std::nullopt : std::optional<double>(test::golden_double(v));
    else if (k == "affine") c->affine = v == "1";
    else if (k == "track") c->track = v == "1";
    else if (k == "nbt") c->nbt = test::golden_int(v);
    else return "unknown field '" + k + "=" + v + "'";
  }
  std::vector<std::string> per_channel = {"save_mean", "save_invstd"}, per_element = {"x", "grad_y", "y", "grad_x"};
  if (c->affine) per_channel.insert(per_channel.end(), {"weight", "bias", "grad_weight", "grad_bias"});
  if (c->track)
    per_channel.insert(per_channel.end(), {"running_mean", "running_var", "running_mean_out", "running_var_out"});
  std::string why = r.need(per_channel, c->C);
  if (why.empty()) why = r.need(per_element, c->numel());
  if (!why.empty()) return why;
  if (c->track && !r.has("num_batches_tracked_out", 1)) return c->name + ": missing num_batches_tracked_out";
  c->a = r.arrays;
  return "";
}

const GoldenFile& golden() {
  static const GoldenFile f = test::load_golden<GoldenCase>(kGoldenFile, "scripts/gen_golden_sync_bn.py", to_case);
  return f;
}

TEST(SyncBnGoldenFile, Parses) {
  const GoldenFile& f = golden();
  ASSERT_TRUE(f.error.empty()) << f.error;
  EXPECT_GE(f.cases.size(), 8u);
  bool none = false, m1 = false, m01 = false, no_affine = false, no_track = false, c1 = false, count2 = false,
       var0 = false, large_mean = false;
  for (const GoldenCase& c : f.cases) {
    none |= c.track && !c.momentum && c.nbt > 0;
    m1 |= c.track && c.momentum == 1.0;
    m01 |= c.track && c.momentum == 0.1;
    no_affine |= !c.affine;
    no_track |= !c.track;
    c1 |= c.C == 1;
    count2 |= c.N * c.H * c.W == 2;
    for (std::int64_t ch = 0; ch < c.C; ++ch) {
      var0 |= c["save_invstd"][ch] == 1.0 / std::sqrt(c.eps);
      large_mean |= std::abs(c["save_mean"][ch]) > 1e3;
    }
    EXPECT_GE(c.N * c.H * c.W, 2) << c.name << ": detops updates running statistics only for a count >= 2";
  }
  EXPECT_TRUE(none && m1 && m01 && no_affine && no_track && c1 && count2 && var0 && large_mean);
}

// ================================================================================================
// Errors and tolerances
//
// Each value is checked as |got_i - want_i| <= allowed_i = kTol * base_i + kK * p * cond_i:
//   base_i  the size of the terms that produce want_i (rounding in the computation, judged against
//           them, not against a small result);
//   cond_i  how far want_i moves when the inputs move by p times their channel's largest magnitude
//           (max|x_c|, max|dy_c|): p = 2^-53 for float64 (the mean of values near 1e4 is itself
//           only known to ~1e-12, by torch and detops alike: a merge of chunk means such as Chan's
//           formula sees that), 2^-44 for kExact (documented: values are rounded to 2^-44 of the
//           channel's largest |x| before the fixed-point sums), 2^-24 for float32 (the inputs are
//           rounded to float32 before the call; that is all float32 loses, the library computes
//           in float64).
// With mean_c, invstd_c torch's statistics, xhat = (x - mean) invstd, s_c = invstd_c max|x_c| (the
// input perturbation in units of xhat), D_c = max|dy_c|, n the count, w = 1 and b = 0 without
// affine:
//   quantity     base                                           cond
//   y            |w| |xhat| + |b|                               |w| s (2 + |xhat|)
//   grad_x       |w| invstd (|dy| + |mean dy|                   |w| invstd (2 + |xhat|)
//                  + |xhat| |mean dy xhat|)                       (D + s (mean|dy| + mean|dy xhat|))
//   grad_weight  sum |dy xhat|                                  sum (D |xhat| + |dy| s (2 + |xhat|))
//   grad_bias    sum |dy|                                       n D
//   save_mean    mean |x|                                       max|x|
//   save_invstd  invstd                                         invstd s
//   running_mean (1 - m) |rm| + m mean|x|                       (1 - m) |rm| + m max|x|
//   running_var  (1 - m) |rv| + m var_unbiased                  (1 - m) |rv| + 2 m var_unbiased s
// (m = momentum, or 1 / (num_batches_tracked + 1)). A one-pass E[x^2] - E[x]^2 in float64 would be
// off by ~ 2^-53 (max|x| invstd)^2 ~ 1e-8 relative on the large-mean channel and fail this.
// Measured (printed per case and summarized at the end of the run): the largest err / allowed is
// below 0.1 with these constants: float64 at most 0.06 (kDefault y on the constant channel, where
// torch's mean of 54 equal values is 2 ulps off and detops's is exact), float32 at most 0.096 (y
// rounded to float32).
constexpr double kTol64 = 1e-13;  // float64, relative to base
constexpr double kTol32 = 2e-7;   // float32 (outputs rounded to float32: 2^-24 = 6e-8)
constexpr double kK = 32.0;

double perturbation(DType dt, SyncBnMode mode) {
  if (dt == DType::kFloat32) return 0x1p-24 + (mode == SyncBnMode::kExact ? 0x1p-44 : 0.0);
  return mode == SyncBnMode::kExact ? 0x1p-44 : 0x1p-53;
}

enum Q { kY, kGradX, kGradW, kGradB, kSaveMean, kSaveInvstd, kRunMean, kRunVar, kNumQ };
constexpr const char* kQName[kNumQ] = {"y", "grad_x", "grad_weight", "grad_bias", "save_mean", "save_invstd",
                                       "running_mean", "running_var"};

struct Magnitudes {
  std::vector<double> base[kNumQ], cond[kNumQ];
};

Magnitudes magnitudes(const GoldenCase& c) {
  Magnitudes m;
  const std::int64_t C = c.C, HW = c.H * c.W, n = c.N * HW;
  const std::vector<double>& x = c["x"];
  const std::vector<double>& dy = c["grad_y"];
  const std::vector<double>& mean = c["save_mean"];
  const std::vector<double>& is = c["save_invstd"];
  auto ch_of = [&](std::int64_t i) { return static_cast<std::size_t>((i / HW) % C); };
  std::vector<double> w(C, 1.0), b(C, 0.0), mean_abs(C, 0.0), dy_mean(C, 0.0), dy_abs_mean(C, 0.0), dyxh_mean(C, 0.0),
      dyxh_abs_mean(C, 0.0), M(C, 0.0), D(C, 0.0), s(C), xh(x.size());
  if (c.affine) w = c["weight"], b = c["bias"];
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    const std::size_t ch = ch_of(i);
    xh[i] = (x[i] - mean[ch]) * is[ch];
    mean_abs[ch] += std::abs(x[i]) / n;
    dy_mean[ch] += dy[i] / n;
    dy_abs_mean[ch] += std::abs(dy[i]) / n;
    dyxh_mean[ch] += dy[i] * xh[i] / n;
    dyxh_abs_mean[ch] += std::abs(dy[i] * xh[i]) / n;
    M[ch] = std::max(M[ch], std::abs(x[i]));
    D[ch] = std::max(D[ch], std::abs(dy[i]));
  }
  for (std::int64_t ch = 0; ch < C; ++ch) s[ch] = is[ch] * M[ch];
  for (int q : {kY, kGradX}) m.base[q].resize(x.size()), m.cond[q].resize(x.size());
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    const std::size_t ch = ch_of(i);
    const double aw = std::abs(w[ch]), ax = std::abs(xh[i]);
    m.base[kY][i] = aw * ax + std::abs(b[ch]);
    m.cond[kY][i] = aw * s[ch] * (2 + ax);
    m.base[kGradX][i] = aw * is[ch] * (std::abs(dy[i]) + std::abs(dy_mean[ch]) + ax * std::abs(dyxh_mean[ch]));
    m.cond[kGradX][i] = aw * is[ch] * (2 + ax) * (D[ch] + s[ch] * (dy_abs_mean[ch] + dyxh_abs_mean[ch]));
  }
  std::vector<double> gw_cond(C, 0.0);
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    const std::size_t ch = ch_of(i);
    gw_cond[ch] += D[ch] * std::abs(xh[i]) + std::abs(dy[i]) * s[ch] * (2 + std::abs(xh[i]));
  }
  for (std::int64_t ch = 0; ch < C; ++ch) {
    m.base[kGradW].push_back(dyxh_abs_mean[ch] * n);
    m.cond[kGradW].push_back(gw_cond[ch]);
    m.base[kGradB].push_back(dy_abs_mean[ch] * n);
    m.cond[kGradB].push_back(D[ch] * n);
    m.base[kSaveMean].push_back(mean_abs[ch]);
    m.cond[kSaveMean].push_back(M[ch]);
    m.base[kSaveInvstd].push_back(is[ch]);
    m.cond[kSaveInvstd].push_back(is[ch] * s[ch]);
  }
  if (c.track) {
    const double mom = c.momentum ? *c.momentum : 1.0 / static_cast<double>(c.nbt + 1);
    for (std::int64_t ch = 0; ch < C; ++ch) {
      const double var = std::abs(1.0 / (is[ch] * is[ch]) - c.eps);
      const double uvar = var * static_cast<double>(n) / static_cast<double>(n - 1);
      const double rm = std::abs(c["running_mean"][ch]), rv = std::abs(c["running_var"][ch]);
      m.base[kRunMean].push_back((1 - mom) * rm + mom * mean_abs[ch]);
      m.cond[kRunMean].push_back((1 - mom) * rm + mom * M[ch]);
      m.base[kRunVar].push_back((1 - mom) * rv + mom * uvar);
      m.cond[kRunVar].push_back((1 - mom) * rv + 2 * mom * uvar * s[ch]);
    }
  }
  return m;
}

struct Err {
  double frac = 0.0;  // max err / allowed
  double rel = 0.0;   // max err / base (0 where equal)
  std::size_t at = 0;  // where frac is largest
};

Err errors(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& base,
           const std::vector<double>& cond, double tol, double p) {
  Err e;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const double d = std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]);
    const double allowed = tol * base[i] + kK * p * cond[i];
    const double f = d / std::max(allowed, 1e-300);
    if (f > e.frac) e.frac = f, e.at = i;
    e.rel = std::max(e.rel, d / std::max(base[i], 1e-300));
  }
  return e;
}

/// Largest errors over the whole run, per dtype (0 = float64, 1 = float32), mode and quantity, with
/// the case where they occurred; printed by the environment's TearDown.
struct Summary {
  Err err[2][2][kNumQ];
  std::string where[2][2][kNumQ];
};
Summary& summary() {
  static Summary s;
  return s;
}

class SummaryPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    const Summary& s = summary();
    for (int d = 0; d < 2; ++d)
      for (int md = 0; md < 2; ++md) {
        std::printf("[ sync_bn golden ] %s %s: max err/allowed, max err/base (where err/allowed is largest)\n",
                    d == 0 ? "float64" : "float32", md == 0 ? "kDefault" : "kExact");
        for (int q = 0; q < kNumQ; ++q)
          std::printf("    %-12s %.2e  %.2e  (%s)\n", kQName[q], s.err[d][md][q].frac, s.err[d][md][q].rel,
                      s.where[d][md][q].c_str());
      }
  }
};
[[maybe_unused]] ::testing::Environment* const kSummaryEnv = ::testing::AddGlobalTestEnvironment(new SummaryPrinter);

// ================================================================================================
// The cases

struct BnRun {
  Tensor y, save_mean, save_invstd, running_mean, running_var, nbt, grad_x, grad_weight, grad_bias;
};

BnRun run_detops(const GoldenCase& c, DType dt, Layout lay, SyncBnMode mode) {
  const DType pdt = dt;  // parameters in the same dtype, as a module .to(dtype)
  const std::int64_t C = c.C;
  auto act = [&](const std::vector<double>& v) {
    return test::make_tensor({c.N, C, c.H, c.W}, dt, v).contiguous(lay);
  };
  auto vec = [&](const std::vector<double>& v) { return test::make_tensor({C}, pdt, v); };
  const Tensor x = act(c["x"]), gy = act(c["grad_y"]);
  Tensor weight, bias;
  BnRun r;
  SyncBnParams p;
  if (c.affine) {
    weight = vec(c["weight"]);
    bias = vec(c["bias"]);
    p.weight = weight;
    p.bias = bias;
    r.grad_weight = Tensor::empty({C}, pdt);
    r.grad_bias = Tensor::empty({C}, pdt);
    r.grad_weight.fill_bytes(0xCD);
    r.grad_bias.fill_bytes(0xCD);
  }
  if (c.track) {
    r.running_mean = vec(c["running_mean"]);
    r.running_var = vec(c["running_var"]);
    r.nbt = Tensor::empty({1}, DType::kInt64);
    r.nbt.data<std::int64_t>()[0] = c.nbt;
    p.running_mean = r.running_mean;
    p.running_var = r.running_var;
    p.num_batches_tracked = r.nbt;
  }
  r.y = Tensor::empty({c.N, C, c.H, c.W}, dt, Device::cpu(), lay);
  r.grad_x = Tensor::empty({c.N, C, c.H, c.W}, dt, Device::cpu(), lay);
  r.save_mean = Tensor::empty({C}, DType::kFloat64);
  r.save_invstd = Tensor::empty({C}, DType::kFloat64);
  for (Tensor* t : {&r.y, &r.grad_x, &r.save_mean, &r.save_invstd}) t->fill_bytes(0xCD);
  SyncBnOptions o;
  o.eps = c.eps;
  o.momentum = c.momentum;
  o.mode = mode;
  sync_batch_norm_forward(x, p, r.y, r.save_mean, r.save_invstd, nullptr, o);
  sync_batch_norm_backward(gy, x, weight, r.save_mean, r.save_invstd, r.grad_x, r.grad_weight, r.grad_bias, nullptr,
                           o);
  return r;
}

std::vector<double> vals(const Tensor& t) { return test::to_vector(t.view()); }

struct Param {
  std::size_t index;
  DType dtype;
};

class SyncBnGolden : public ::testing::TestWithParam<Param> {};

TEST_P(SyncBnGolden, MatchesTorch) {
  ASSERT_TRUE(golden().error.empty()) << golden().error;
  const GoldenCase& c = golden().cases.at(GetParam().index);
  const DType dt = GetParam().dtype;
  const bool f32 = dt == DType::kFloat32;
  const double tol = f32 ? kTol32 : kTol64;
  SCOPED_TRACE(c.describe() + " " + std::string(dtype_name(dt)));
  const Magnitudes mag = magnitudes(c);
  double case_frac[kNumQ] = {}, case_rel[kNumQ] = {};
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    const int md = mode == SyncBnMode::kDefault ? 0 : 1;
    const char* mode_name = md == 0 ? "default" : "exact";
    const double p = perturbation(dt, mode);
    BnRun runs[2];
    const Layout lays[2] = {Layout::kNCHW, Layout::kNHWC};
    for (int l = 0; l < 2; ++l) {
      SCOPED_TRACE(::testing::Message() << mode_name << " " << (l == 0 ? "nchw" : "nhwc"));
      BnRun& r = runs[l];
      ASSERT_NO_THROW(r = run_detops(c, dt, lays[l], mode));
      std::vector<std::pair<Q, std::vector<double>>> got;
      got.emplace_back(kY, vals(r.y));
      got.emplace_back(kGradX, vals(r.grad_x));
      got.emplace_back(kSaveMean, vals(r.save_mean));
      got.emplace_back(kSaveInvstd, vals(r.save_invstd));
      const char* want_name[kNumQ] = {"y",         "grad_x",      "grad_weight",      "grad_bias",
                                      "save_mean", "save_invstd", "running_mean_out", "running_var_out"};
      if (c.affine) {
        got.emplace_back(kGradW, vals(r.grad_weight));
        got.emplace_back(kGradB, vals(r.grad_bias));
      }
      if (c.track) {
        got.emplace_back(kRunMean, vals(r.running_mean));
        got.emplace_back(kRunVar, vals(r.running_var));
        EXPECT_EQ(r.nbt.data<std::int64_t>()[0], static_cast<std::int64_t>(c["num_batches_tracked_out"][0]))
            << "num_batches_tracked";
      }
      for (const auto& [q, g] : got) {
        const std::vector<double>& want = c[want_name[q]];
        const Err e = errors(g, want, mag.base[q], mag.cond[q], tol, p);
        const std::size_t at = e.at;
        EXPECT_LE(e.frac, 1.0) << kQName[q] << "[" << at << "]: got " << g[at] << ", torch " << want[at]
                               << " (diff " << g[at] - want[at] << ", allowed "
                               << tol * mag.base[q][at] + kK * p * mag.cond[q][at] << ")";
        case_frac[q] = std::max(case_frac[q], e.frac);
        case_rel[q] = std::max(case_rel[q], e.rel);
        Summary& s = summary();
        const int d = f32 ? 1 : 0;
        s.err[d][md][q].rel = std::max(s.err[d][md][q].rel, e.rel);
        if (e.frac > s.err[d][md][q].frac) {
          s.err[d][md][q].frac = e.frac;
          s.where[d][md][q] = c.name + (l == 0 ? " nchw" : " nhwc");
        }
      }
    }
    // NCHW and NHWC: the same bits (the statistics are independent of the layout).
    EXPECT_TRUE(test::same_bytes(runs[0].y.contiguous(Layout::kNCHW), runs[1].y.contiguous(Layout::kNCHW)))
        << mode_name << ": y differs between NCHW and NHWC";
    EXPECT_TRUE(test::same_bytes(runs[0].grad_x.contiguous(Layout::kNCHW), runs[1].grad_x.contiguous(Layout::kNCHW)))
        << mode_name << ": grad_x differs between NCHW and NHWC";
    EXPECT_TRUE(test::same_bytes(runs[0].save_mean, runs[1].save_mean) &&
                test::same_bytes(runs[0].save_invstd, runs[1].save_invstd))
        << mode_name << ": statistics differ between NCHW and NHWC";
  }
  std::printf("[ err/allowed, err/base ] %s %s:", c.name.c_str(), std::string(dtype_name(dt)).c_str());
  for (int q = 0; q < kNumQ; ++q) std::printf(" %s %.1e %.1e", kQName[q], case_frac[q], case_rel[q]);
  std::printf("\n");
}

std::vector<Param> all_params() {
  std::vector<Param> v;
  for (std::size_t i = 0; i < golden().cases.size(); ++i)
    for (DType dt : {DType::kFloat64, DType::kFloat32}) v.push_back({i, dt});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Torch, SyncBnGolden, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return golden().cases.at(p.param.index).name + "_" + std::string(dtype_name(p.param.dtype));
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SyncBnGolden);

}  // namespace
}  // namespace detops
