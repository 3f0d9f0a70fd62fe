// FrozenBatchNorm2d on the CPU (label cpu):
//   (a) golden vectors from torchvision.ops.FrozenBatchNorm2d (float64 fold, forward with the three
//       epilogues, autograd backward; scripts/gen_golden_frozen_bn.py -> DETOPS_GOLDEN_DIR);
//   (b) every dtype x layout (NCHW, NHWC, both starting one element into a buffer, two strided
//       views) x epilogue, forward and backward, against the float64 reference (tests/reference/)
//       fed with the same rounded inputs;
//   (c) in place (y == x, grad_x == grad_y) gives the same bits as out of place;
//   (d) edge shapes: C = 1, H*W = 1, N = 0 and H*W = 0 (no-ops), odd sizes;
//   (e) the fold, eps = 0, from_state()/state() checkpoint round trip, detectron2's identity;
//   (f) bad input: detops::Error naming the op and the argument, outputs left untouched;
//   (g) the same bytes for 1, 2 and 5 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "detops/context.h"
#include "detops/dtype.h"
#include "detops/error.h"
#include "detops/frozen_batch_norm.h"
#include "detops/tensor.h"
#include "frozen_batch_norm_test_util.h"
#include "golden_util.h"
#include "internal/half_convert.h"
#include "reference/frozen_batch_norm_reference.h"
#include "test_util.h"

#ifndef DETOPS_GOLDEN_DIR
#error "DETOPS_GOLDEN_DIR must name the folder of the golden vectors (a string literal)"
#endif

namespace detops {

namespace {

using namespace test::frozen_bn;
using ref::FbnEpilogueRef;

constexpr const char* kGoldenFile = DETOPS_GOLDEN_DIR "/frozen_bn_torchvision.txt";
constexpr Epi kEpilogues[] = {Epi::kNone, Epi::kRelu, Epi::kAddRelu};

FbnEpilogueRef to_ref(Epi e) {
  switch (e) {
    case Epi::kRelu: return FbnEpilogueRef::kRelu;
    case Epi::kAddRelu: return FbnEpilogueRef::kAddRelu;
    default: return FbnEpilogueRef::kNone;
  }
}

// ------------------------------------------------------------------------------------------------
// Views and buffers

/// Every element of a view (any strides), NCHW order, as the offset (in elements) from data.
template <class F>
void for_each_offset(const TensorView& v, F&& f) {
  std::int64_t sizes[kMaxRank] = {1, 1, 1, 1, 1, 1}, strides[kMaxRank] = {0, 0, 0, 0, 0, 0};
  const int off = kMaxRank - v.rank;
  for (int d = 0; d < v.rank; ++d) {
    sizes[off + d] = v.sizes[d];
    strides[off + d] = v.strides[d];
  }
  const std::int64_t n = v.numel();
  for (std::int64_t lin = 0; lin < n; ++lin) {
    std::int64_t rem = lin, o = 0;
    for (int d = kMaxRank - 1; d >= 0; --d) {
      o += (rem % sizes[d]) * strides[d];
      rem /= sizes[d];
    }
    f(lin, o);
  }
}

/// Writes NCHW-ordered values into a CPU view (any strides), rounding to its dtype (RNE).
void fill_view(const TensorView& v, const std::vector<double>& values) {
  for_each_offset(v, [&](std::int64_t lin, std::int64_t o) {
    const double x = values[static_cast<std::size_t>(lin)];
    switch (v.dtype) {
      case DType::kFloat32: static_cast<float*>(v.data)[o] = static_cast<float>(x); break;
      case DType::kFloat64: static_cast<double*>(v.data)[o] = x; break;
      case DType::kFloat16: static_cast<Half*>(v.data)[o] = from_double<Half>(x); break;
      case DType::kBFloat16: static_cast<BFloat16*>(v.data)[o] = from_double<BFloat16>(x); break;
      default: break;
    }
  });
}

/// Element bytes of two CPU views of the same dtype and sizes are identical (any strides).
::testing::AssertionResult same_elements(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype || a.numel() != b.numel()) return ::testing::AssertionFailure() << "different dtype or size";
  const std::size_t es = dtype_size(a.dtype);
  std::vector<std::int64_t> offs_b(static_cast<std::size_t>(b.numel()));
  for_each_offset(b, [&](std::int64_t lin, std::int64_t o) { offs_b[static_cast<std::size_t>(lin)] = o; });
  std::int64_t bad = 0, first = -1;
  for_each_offset(a, [&](std::int64_t lin, std::int64_t o) {
    const auto* pa = static_cast<const unsigned char*>(a.data) + o * static_cast<std::int64_t>(es);
    const auto* pb = static_cast<const unsigned char*>(b.data) + offs_b[static_cast<std::size_t>(lin)] *
                                                                    static_cast<std::int64_t>(es);
    if (std::memcmp(pa, pb, es) != 0) {
      if (first < 0) first = lin;
      ++bad;
    }
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  const std::vector<double> va = test::to_vector(a), vb = test::to_vector(b);
  return ::testing::AssertionFailure() << bad << " of " << a.numel() << " elements differ in their bytes; first at "
                                       << first << ": " << va[static_cast<std::size_t>(first)] << " vs "
                                       << vb[static_cast<std::size_t>(first)];
}


/// A 4-d view and the storage it lives in:
///   kNchw, kNhwc   dense tensors from Tensor::empty;
///   k*Offset1      the same dense strides, starting one element into a buffer (not vector aligned);
///   kSlice         a [N, C, H, W] slice of an NCHW [N, C, H, W + 3] buffer, starting one element in
///                  (a row stride with a gap, and a base that is not vector aligned);
///   kChannelSlice  every other channel of an NHWC [N, 2C, H, W] buffer (channel stride 2).
/// The storage is poisoned with 0xCD; the gaps between elements must stay so.
struct Buf {
  Tensor storage;
  TensorView view;

  static Buf make(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, DType dt, Lay lay,
                  Device dev = Device::cpu()) {
    Buf b;
    switch (lay) {
      case Lay::kNchw:
      case Lay::kNhwc:
        b.storage = Tensor::empty({N, C, H, W}, dt, dev, lay == Lay::kNhwc ? Layout::kNHWC : Layout::kNCHW);
        b.storage.fill_bytes(0xCD);
        b.view = b.storage.view();
        return b;
      case Lay::kNchwOffset1:
      case Lay::kNhwcOffset1: {
        b.storage = Tensor::empty({N * C * H * W + 2}, dt, dev);
        b.storage.fill_bytes(0xCD);
        char* base = static_cast<char*>(b.storage.view().data) + dtype_size(dt);
        if (lay == Lay::kNchwOffset1) b.view = TensorView(base, dt, dev, {N, C, H, W});
        else b.view = TensorView(base, dt, dev, {N, C, H, W}, {H * W * C, 1, W * C, C});
        return b;
      }
      case Lay::kSlice: {
        const std::int64_t W2 = W + 3;
        b.storage = Tensor::empty({N * C * H * W2 + 1}, dt, dev);
        b.storage.fill_bytes(0xCD);
        char* base = static_cast<char*>(b.storage.view().data) + dtype_size(dt);
        b.view = TensorView(base, dt, dev, {N, C, H, W}, {C * H * W2, H * W2, W2, 1});
        return b;
      }
      case Lay::kChannelSlice: {
        b.storage = Tensor::empty({N * 2 * C * H * W + 1}, dt, dev);
        b.storage.fill_bytes(0xCD);
        b.view = TensorView(b.storage.view().data, dt, dev, {N, C, H, W}, {H * W * 2 * C, 2, W * 2 * C, 2 * C});
        return b;
      }
    }
    return b;
  }
  std::vector<unsigned char> bytes() const {
    const auto* p = static_cast<const unsigned char*>(storage.view().data);
    return std::vector<unsigned char>(p, p + storage.nbytes());
  }
};

/// The bytes of `b`'s storage that no element of its view covers are still 0xCD.
::testing::AssertionResult gaps_untouched(const Buf& b) {
  const std::size_t es = dtype_size(b.view.dtype);
  std::vector<char> covered(b.storage.nbytes(), 0);
  const std::int64_t base = static_cast<const char*>(b.view.data) - static_cast<const char*>(b.storage.view().data);
  for_each_offset(b.view, [&](std::int64_t, std::int64_t o) {
    for (std::size_t k = 0; k < es; ++k) covered[static_cast<std::size_t>(base + o * static_cast<std::int64_t>(es)) + k] = 1;
  });
  const auto* p = static_cast<const unsigned char*>(b.storage.view().data);
  for (std::size_t i = 0; i < covered.size(); ++i)
    if (!covered[i] && p[i] != 0xCD)
      return ::testing::AssertionFailure() << "byte " << i << " outside the view was written (0x" << std::hex
                                           << int(p[i]) << ")";
  return ::testing::AssertionSuccess();
}

/// A [C] parameter tensor (float32 or float64) holding `v`.
Tensor param(const std::vector<double>& v, DType dt) {
  return test::make_tensor({static_cast<std::int64_t>(v.size())}, dt, v);
}

/// Values as the library sees them after storing in dtype.
std::vector<double> rounded(const std::vector<double>& v, DType dt) {
  return test::to_vector(param(v, dt));
}

DType param_dtype(DType dt) { return dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

/// Smallest positive normal number of a dtype: below it, results are absolutely, not relatively,
/// accurate.
double normal_min(DType dt) {
  switch (dt) {
    case DType::kFloat64: return std::numeric_limits<double>::min();
    case DType::kFloat16: return 6.103515625e-05;
    default: return static_cast<double>(std::numeric_limits<float>::min());
  }
}

/// |got_i - want_i| <= rel * max(|want_i|, mag_i, floor) for every i, where mag_i is the size of the
/// terms that produced want_i (so that cancellation is judged against them, not against a tiny
/// result). An empty mag means |want_i|. Values are compared, so -0 == +0.
::testing::AssertionResult close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                                 const std::vector<double>& mag = {}, double floor = 0.0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << ", expected " << want.size();
  std::ostringstream msg;
  std::int64_t bad = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double m = std::max({std::abs(want[i]), mag.empty() ? 0.0 : mag[i], floor});
    const double err = std::abs(got[i] - want[i]);
    const bool ok = got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])) || err <= rel * m;
    if (!ok) {
      if (bad < 8)
        msg << "\n  [" << i << "] got " << got[i] << ", expected " << want[i] << " (diff " << (got[i] - want[i])
            << ", allowed " << rel * m << ")";
      ++bad;
      worst = std::max(worst, m > 0 ? err / m : err);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements differ by more than " << rel
                                       << " relative (worst " << worst << ")" << msg.str();
}

/// Values equal (-0 == +0, NaN == NaN).
::testing::AssertionResult equal_values(const std::vector<double>& got, const std::vector<double>& want) {
  return close(got, want, 0.0);
}

/// mag_i = |x_i * scale_c| + |shift_c| (+ |residual_i|) for [N, C, HW] tensors.
std::vector<double> forward_magnitude(const std::vector<double>& x, const std::vector<double>& scale,
                                      const std::vector<double>& shift, const std::vector<double>* residual,
                                      std::int64_t C, std::int64_t HW) {
  std::vector<double> m(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / HW) % C);
    m[i] = std::abs(x[i] * scale[c]) + std::abs(shift[c]) + (residual ? std::abs((*residual)[i]) : 0.0);
  }
  return m;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a detops::Error: ") + e.what();
  }
  return "no error";
}

// ================================================================================================
// (a) Golden vectors from torchvision

struct GoldenCase {
  std::string name;
  std::int64_t N = 0, C = 0, H = 0, W = 0;
  double eps = 0.0;
  std::map<std::string, std::vector<double>> a;  // arrays by label

  const std::vector<double>& operator[](const std::string& k) const { return a.at(k); }
  std::int64_t numel() const { return N * C * H * W; }
  std::string describe() const {
    std::ostringstream s;
    s << name << " (N=" << N << " C=" << C << " H=" << H << " W=" << W << " eps=" << eps << ")";
    return s.str();
  }
};

using GoldenFile = test::GoldenFile<GoldenCase>;

const char* const kPerChannel[] = {"weight", "bias", "running_mean", "running_var", "scale", "shift"};
const char* const kPerElement[] = {"x", "residual", "grad_y", "y_none", "y_relu", "y_add_relu", "grad_x_none",
                                   "grad_x_relu", "grad_x_add_relu", "grad_residual_add_relu"};

/// A record of the golden file (format: scripts/gen_golden_frozen_bn.py) as a case; "" or why not.
std::string to_case(const test::GoldenRecord& r, GoldenCase* c) {
  for (const auto& [k, v] : r.fields) {
    if (test::golden_nchw_field(k, v, &c->N, &c->C, &c->H, &c->W)) continue;
    if (k == "eps") c->eps = test::golden_double(v);
    else return "unknown field '" + k + "=" + v + "'";
  }
  std::string why = r.need(kPerChannel, c->C);
  if (why.empty()) why = r.need(kPerElement, c->numel());
  if (why.empty()) c->a = r.arrays;
  return why;
}

const GoldenFile& golden() {
  static const GoldenFile f = test::load_golden<GoldenCase>(kGoldenFile, "scripts/gen_golden_frozen_bn.py", to_case);
  return f;
}

TEST(FrozenBnGoldenFile, Parses) {
  const GoldenFile& f = golden();
  ASSERT_TRUE(f.error.empty()) << f.error;
  EXPECT_GE(f.cases.size(), 10u);
  bool zero_var_eps = false, eps0 = false, c1 = false, hw1 = false, negative_scale = false;
  std::int64_t exact_zero_preact = 0;
  for (const GoldenCase& c : f.cases) {
    for (std::int64_t ch = 0; ch < c.C; ++ch) {
      zero_var_eps |= c["running_var"][ch] == 0.0 && c.eps > 0;
      negative_scale |= c["scale"][ch] < 0;
    }
    eps0 |= c.eps == 0.0;
    c1 |= c.C == 1;
    hw1 |= c.H * c.W == 1;
    for (std::int64_t i = 0; i < c.numel(); ++i) exact_zero_preact += c["y_add_relu"][i] == 0.0 && c["grad_y"][i] != 0;
  }
  EXPECT_TRUE(zero_var_eps && eps0 && c1 && hw1 && negative_scale);
  EXPECT_GT(exact_zero_preact, 0);
}

class FrozenBnGolden : public ::testing::TestWithParam<std::size_t> {
 protected:
  const GoldenCase& gc() const { return golden().cases.at(GetParam()); }
};

constexpr double kTolGolden = 1e-14;

BatchNormState state_of(const GoldenCase& c, DType dt, std::vector<Tensor>* keep) {
  keep->clear();
  for (const char* k : {"weight", "bias", "running_mean", "running_var"}) keep->push_back(param(c[k], dt));
  BatchNormState s;
  s.weight = (*keep)[0];
  s.bias = (*keep)[1];
  s.running_mean = (*keep)[2];
  s.running_var = (*keep)[3];
  s.eps = c.eps;
  return s;
}

// The reference against torchvision, value for value: validates the reference the other tests
// trust (it evaluates torchvision's operations in torchvision's order).
TEST_P(FrozenBnGolden, ReferenceMatchesTorchvisionExactly) {
  const GoldenCase& c = gc();
  SCOPED_TRACE(c.describe());
  std::vector<double> scale, shift;
  ref::frozen_bn_fold_ref(c["weight"], c["bias"], c["running_mean"], c["running_var"], c.eps, &scale, &shift);
  EXPECT_TRUE(equal_values(scale, c["scale"])) << "scale";
  EXPECT_TRUE(equal_values(shift, c["shift"])) << "shift";
  const std::int64_t HW = c.H * c.W;
  for (Epi e : kEpilogues) {
    const std::string en = epi_name(e);
    const std::vector<double> y = ref::frozen_bn_forward_ref(c["x"], scale, shift, c["residual"], c.N, c.C, HW, to_ref(e));
    EXPECT_TRUE(equal_values(y, c["y_" + en])) << "y_" << en;
    std::vector<double> gr;
    const std::vector<double> gx =
        ref::frozen_bn_backward_ref(c["grad_y"], scale, c["y_" + en], c.N, c.C, HW, to_ref(e), &gr);
    EXPECT_TRUE(equal_values(gx, c["grad_x_" + en])) << "grad_x_" << en;
    if (e == Epi::kAddRelu) {
      EXPECT_TRUE(equal_values(gr, c["grad_residual_add_relu"])) << "grad_residual";
    }
  }
}

struct GoldenRun {
  std::vector<double> scale, shift;
  std::map<std::string, std::vector<double>> y, gx;
  std::vector<double> gr;
};

/// The library in float64 on a golden case, tensors in `layout`: fold, then the forward and the
/// backward of each epilogue (the backward's y is the library's own forward output).
GoldenRun run_golden(const GoldenCase& c, Layout layout, bool through_module) {
  GoldenRun r;
  std::vector<Tensor> keep;
  const BatchNormState st = state_of(c, DType::kFloat64, &keep);
  Tensor scale = Tensor::empty({c.C}, DType::kFloat64), shift = Tensor::empty({c.C}, DType::kFloat64);
  FrozenBatchNorm2d m;
  if (through_module) {
    m = FrozenBatchNorm2d::from_state(st);
    r.scale = test::to_vector(m.scale());
    r.shift = test::to_vector(m.shift());
  } else {
    frozen_batch_norm_fold(st, scale, shift);
    r.scale = test::to_vector(scale);
    r.shift = test::to_vector(shift);
  }
  const DType f64 = DType::kFloat64;
  const Tensor x = test::make_tensor({c.N, c.C, c.H, c.W}, f64, c["x"], layout);
  const Tensor res = test::make_tensor({c.N, c.C, c.H, c.W}, f64, c["residual"], layout);
  const Tensor gy = test::make_tensor({c.N, c.C, c.H, c.W}, f64, c["grad_y"], layout);
  for (Epi e : kEpilogues) {
    const std::string en = epi_name(e);
    Tensor y = Tensor::empty({c.N, c.C, c.H, c.W}, f64, Device::cpu(), layout);
    Tensor gx = Tensor::empty({c.N, c.C, c.H, c.W}, f64, Device::cpu(), layout);
    Tensor gr = Tensor::empty({c.N, c.C, c.H, c.W}, f64, Device::cpu(), layout);
    y.fill_bytes(0xCD);
    gx.fill_bytes(0xCD);
    gr.fill_bytes(0xCD);
    const TensorView rv = e == Epi::kAddRelu ? res.view() : TensorView{};
    const TensorView yv = has_relu(e) ? y.view() : TensorView{};
    const TensorView grv = e == Epi::kAddRelu ? gr.view() : TensorView{};
    if (through_module) {
      m.forward(x, y, e, rv);
      m.backward(gy, gx, e, yv, grv);
    } else {
      frozen_batch_norm_forward(x, scale, shift, y, e, rv);
      frozen_batch_norm_backward(gy, scale, gx, e, yv, grv);
    }
    r.y[en] = test::to_vector(y);
    r.gx[en] = test::to_vector(gx);
    if (e == Epi::kAddRelu) r.gr = test::to_vector(gr);
  }
  return r;
}

std::vector<double> fold_magnitude(const GoldenCase& c, const std::vector<double>& scale) {
  std::vector<double> m(static_cast<std::size_t>(c.C));
  for (std::size_t ch = 0; ch < m.size(); ++ch)
    m[ch] = std::abs(c["bias"][ch]) + std::abs(c["running_mean"][ch] * scale[ch]);
  return m;
}

void check_golden(const GoldenCase& c, const GoldenRun& r, double tol, const char* what) {
  const std::int64_t HW = c.H * c.W;
  EXPECT_TRUE(close(r.scale, c["scale"], tol)) << what << ": scale";
  EXPECT_TRUE(close(r.shift, c["shift"], tol, fold_magnitude(c, c["scale"]))) << what << ": shift";
  for (Epi e : kEpilogues) {
    const std::string en = epi_name(e);
    const std::vector<double> mag = forward_magnitude(c["x"], c["scale"], c["shift"],
                                                      e == Epi::kAddRelu ? &c["residual"] : nullptr, c.C, HW);
    EXPECT_TRUE(close(r.y.at(en), c["y_" + en], tol, mag)) << what << ": y_" << en;
    EXPECT_TRUE(close(r.gx.at(en), c["grad_x_" + en], tol)) << what << ": grad_x_" << en;
  }
  EXPECT_TRUE(close(r.gr, c["grad_residual_add_relu"], tol)) << what << ": grad_residual_add_relu";
}

TEST_P(FrozenBnGolden, Float64WithinTolerance) {
  const GoldenCase& c = gc();
  SCOPED_TRACE(c.describe());
  for (Layout l : {Layout::kNCHW, Layout::kNHWC}) {
    const char* ln = l == Layout::kNHWC ? "NHWC" : "NCHW";
    check_golden(c, run_golden(c, l, false), kTolGolden, ln);
    check_golden(c, run_golden(c, l, true), kTolGolden, (std::string(ln) + ", FrozenBatchNorm2d").c_str());
  }
}

// torchvision's operations in torchvision's order, with FMA contraction off, give torchvision's
// doubles: the library is expected to match value for value (as RoIAlign does).
TEST_P(FrozenBnGolden, Float64MatchesTorchvisionBitForBit) {
  const GoldenCase& c = gc();
  SCOPED_TRACE(c.describe());
  for (Layout l : {Layout::kNCHW, Layout::kNHWC}) {
    const GoldenRun r = run_golden(c, l, false);
    check_golden(c, r, 0.0, l == Layout::kNHWC ? "NHWC, bitwise" : "NCHW, bitwise");
  }
}

std::vector<std::size_t> case_indices() {
  std::vector<std::size_t> v(golden().cases.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Torchvision, FrozenBnGolden, ::testing::ValuesIn(case_indices()),
                         [](const ::testing::TestParamInfo<std::size_t>& p) {
                           return golden().cases.at(p.param).name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FrozenBnGolden);

// ================================================================================================
// (b), (c) every dtype x layout x epilogue against the float64 reference; in place

double tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat64: return 1e-14;
    case DType::kFloat32: return 1e-6;
    case DType::kFloat16: return 1e-3;
    default: return 1e-2;
  }
}

// C and H*W odd or not multiples of any vector width, C = 1, H*W = 1, and a wider C.
constexpr Shape kShapes[] = {{2, 19, 5, 7}, {1, 64, 4, 9}, {3, 3, 1, 1}, {1, 1, 6, 11}, {2, 40, 3, 5}};

struct Problem {
  Shape s;
  std::vector<double> weight, bias, mean, var, x, residual, grad_y;
};

Problem make_problem(const Shape& s, std::uint64_t seed) {
  Problem p;
  p.s = s;
  const std::size_t C = static_cast<std::size_t>(s.C), n = static_cast<std::size_t>(s.N * s.C * s.H * s.W);
  p.weight = test::random_values(C, seed, -2.0, 2.0);
  p.bias = test::random_values(C, seed + 1, -1.0, 1.0);
  p.mean = test::random_values(C, seed + 2, -1.0, 1.0);
  p.var = test::random_values(C, seed + 3, 0.0, 3.0);
  p.var[0] = 0.0;  // a dead channel: scale = weight / sqrt(eps)
  if (C > 2) p.weight[2] = 0.0;
  p.x = test::random_values(n, seed + 4, -3.0, 3.0);
  p.residual = test::random_values(n, seed + 5, -2.0, 2.0);
  p.grad_y = test::random_values(n, seed + 6, -1.0, 1.0);
  return p;
}

using CpuParam = std::tuple<DType, Lay, Epi>;
class FrozenBnCpu : public ::testing::TestWithParam<CpuParam> {};

TEST_P(FrozenBnCpu, MatchesFloat64ReferenceAndInPlace) {
  const auto [dt, lay, epi] = GetParam();
  const DType pdt = param_dtype(dt);
  const double tol = tolerance(dt);
  std::uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    seed += 10;
    SCOPED_TRACE(::testing::Message() << "shape [" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "]");
    const Problem p = make_problem(s, seed);
    const std::int64_t HW = s.H * s.W;

    // Fold, then use the folded values (as stored) in the reference: the forward is checked on its
    // own, the fold in the fold tests below.
    const Tensor w = param(p.weight, pdt), b = param(p.bias, pdt), m = param(p.mean, pdt), v = param(p.var, pdt);
    Tensor scale = Tensor::empty({s.C}, pdt), shift = Tensor::empty({s.C}, pdt);
    BatchNormState st{w, b, m, v, 1e-5};
    frozen_batch_norm_fold(st, scale, shift);
    const std::vector<double> sc = test::to_vector(scale), sh = test::to_vector(shift);

    Buf x = Buf::make(s.N, s.C, s.H, s.W, dt, lay), r = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
    fill_view(x.view, p.x);
    fill_view(r.view, p.residual);
    const std::vector<double> xr = test::to_vector(x.view), rr = test::to_vector(r.view);
    const std::vector<unsigned char> x_before = x.bytes(), r_before = r.bytes();

    // Forward
    Buf y = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
    const TensorView rv = epi == Epi::kAddRelu ? r.view : TensorView{};
    frozen_batch_norm_forward(x.view, scale, shift, y.view, epi, rv);
    const std::vector<double> want_y = ref::frozen_bn_forward_ref(xr, sc, sh, rr, s.N, s.C, HW, to_ref(epi));
    const std::vector<double> got_y = test::to_vector(y.view);
    EXPECT_TRUE(close(got_y, want_y, tol, forward_magnitude(xr, sc, sh, epi == Epi::kAddRelu ? &rr : nullptr, s.C, HW),
                      normal_min(dt)))
        << "forward";
    EXPECT_TRUE(gaps_untouched(y)) << "forward wrote outside y";
    EXPECT_TRUE(x.bytes() == x_before && r.bytes() == r_before) << "forward modified an input";
    if (has_relu(epi)) {
      for (double val : got_y) ASSERT_TRUE(val >= 0.0) << "ReLU output " << val;
    }

    // Forward in place (y == x): same bits.
    Buf xi = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
    fill_view(xi.view, p.x);
    frozen_batch_norm_forward(xi.view, scale, shift, xi.view, epi, rv);
    EXPECT_TRUE(same_elements(xi.view, y.view)) << "in-place forward";
    EXPECT_TRUE(gaps_untouched(xi)) << "in-place forward wrote outside x";

    // Backward, with the library's own y for the ReLU masks.
    Buf gy = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
    fill_view(gy.view, p.grad_y);
    const std::vector<double> gyr = test::to_vector(gy.view);
    const std::vector<unsigned char> gy_before = gy.bytes(), y_before = y.bytes();
    Buf gx = Buf::make(s.N, s.C, s.H, s.W, dt, lay), gr = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
    const TensorView yv = has_relu(epi) ? y.view : TensorView{};
    const TensorView grv = epi == Epi::kAddRelu ? gr.view : TensorView{};
    frozen_batch_norm_backward(gy.view, scale, gx.view, epi, yv, grv);
    std::vector<double> want_gr;
    const std::vector<double> want_gx =
        ref::frozen_bn_backward_ref(gyr, sc, got_y, s.N, s.C, HW, to_ref(epi), &want_gr);
    EXPECT_TRUE(close(test::to_vector(gx.view), want_gx, tol, {}, normal_min(dt))) << "backward grad_x";
    EXPECT_TRUE(gaps_untouched(gx)) << "backward wrote outside grad_x";
    EXPECT_TRUE(gy.bytes() == gy_before && y.bytes() == y_before) << "backward modified an input";
    if (epi == Epi::kAddRelu) {
      EXPECT_TRUE(equal_values(test::to_vector(gr.view), want_gr)) << "grad_residual is the masked grad_y, exactly";
      EXPECT_TRUE(gaps_untouched(gr)) << "backward wrote outside grad_residual";
      // grad_residual is optional: grad_x does not change without it.
      Buf gx2 = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
      frozen_batch_norm_backward(gy.view, scale, gx2.view, epi, yv, TensorView{});
      EXPECT_TRUE(same_elements(gx2.view, gx.view)) << "grad_x without grad_residual";
    } else {
      // nothing of gr may have been written when no grad_residual was passed
      EXPECT_TRUE(gr.bytes() == std::vector<unsigned char>(gr.storage.nbytes(), 0xCD));
    }

    // Backward in place (grad_x == grad_y): same bits.
    Buf gi = Buf::make(s.N, s.C, s.H, s.W, dt, lay), gri = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
    fill_view(gi.view, p.grad_y);
    frozen_batch_norm_backward(gi.view, scale, gi.view, epi, yv, epi == Epi::kAddRelu ? gri.view : TensorView{});
    EXPECT_TRUE(same_elements(gi.view, gx.view)) << "in-place backward grad_x";
    if (epi == Epi::kAddRelu) {
      EXPECT_TRUE(same_elements(gri.view, gr.view)) << "in-place backward grad_residual";
    }
  }
}

std::string cpu_param_name(const ::testing::TestParamInfo<CpuParam>& i) {
  const auto [dt, lay, epi] = i.param;
  return std::string(dtype_name(dt)) + "_" + lay_name(lay) + "_" + epi_name(epi);
}

INSTANTIATE_TEST_SUITE_P(AllCombinations, FrozenBnCpu,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::ValuesIn(kLays), ::testing::ValuesIn(kEpilogues)),
                         cpu_param_name);

// Mixed layouts in one call: NHWC x and grad_y, NCHW y and grad_x, sliced residual.
TEST(FrozenBnCpuLayouts, MixedLayoutsAgreeWithDense) {
  const Shape s{2, 21, 6, 5};
  const Problem p = make_problem(s, 7);
  const Tensor scale = param(test::random_values(21, 8, -2, 2), DType::kFloat32);
  const Tensor shift = param(test::random_values(21, 9, -1, 1), DType::kFloat32);
  for (Epi epi : kEpilogues) {
    SCOPED_TRACE(epi_name(epi));
    auto run = [&](Lay lx, Lay ly, Lay lr, std::vector<double>* gx_out) {
      Buf x = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, lx), y = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, ly);
      Buf r = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, lr);
      fill_view(x.view, p.x);
      fill_view(r.view, p.residual);
      frozen_batch_norm_forward(x.view, scale, shift, y.view, epi, epi == Epi::kAddRelu ? r.view : TensorView{});
      Buf gy = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, lx), gx = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, ly);
      fill_view(gy.view, p.grad_y);
      frozen_batch_norm_backward(gy.view, scale, gx.view, epi, has_relu(epi) ? y.view : TensorView{});
      *gx_out = test::to_vector(gx.view);
      return test::to_vector(y.view);
    };
    std::vector<double> g1, g2;
    const std::vector<double> y1 = run(Lay::kNchw, Lay::kNchw, Lay::kNchw, &g1);
    const std::vector<double> y2 = run(Lay::kNhwc, Lay::kNchw, Lay::kSlice, &g2);
    EXPECT_TRUE(equal_values(y2, y1)) << "forward";
    EXPECT_TRUE(equal_values(g2, g1)) << "backward";
  }
}

// ================================================================================================
// (d) edge shapes and semantics

TEST(FrozenBnCpuEdges, EmptyProblemsDoNothing) {
  const Tensor scale = param({1.5, -2.0, 0.5}, DType::kFloat32), shift = param({0.1, 0.2, 0.3}, DType::kFloat32);
  Tensor buf = Tensor::empty({256}, DType::kFloat32);
  buf.fill_bytes(0xCD);
  const std::vector<unsigned char> before(static_cast<unsigned char*>(buf.view().data),
                                          static_cast<unsigned char*>(buf.view().data) + buf.nbytes());
  auto untouched = [&] { return std::memcmp(before.data(), buf.view().data, buf.nbytes()) == 0; };
  float* base = buf.data<float>();
  for (const auto& sizes : std::vector<std::vector<std::int64_t>>{{0, 3, 4, 5}, {2, 3, 0, 5}, {2, 3, 4, 0}}) {
    SCOPED_TRACE(::testing::Message() << "[" << sizes[0] << ", 3, " << sizes[2] << ", " << sizes[3] << "]");
    const TensorView x(base, DType::kFloat32, Device::cpu(), {sizes[0], 3, sizes[2], sizes[3]});
    const TensorView y(base + 64, DType::kFloat32, Device::cpu(), {sizes[0], 3, sizes[2], sizes[3]});
    const TensorView r(base + 128, DType::kFloat32, Device::cpu(), {sizes[0], 3, sizes[2], sizes[3]});
    const TensorView g(base + 192, DType::kFloat32, Device::cpu(), {sizes[0], 3, sizes[2], sizes[3]});
    for (Epi e : kEpilogues) {
      const std::string m1 = what_of([&] {
        frozen_batch_norm_forward(x, scale, shift, y, e, e == Epi::kAddRelu ? r : TensorView{});
      });
      EXPECT_EQ(m1, "no error") << epi_name(e);
      const std::string m2 = what_of([&] {
        frozen_batch_norm_backward(g, scale, y, e, has_relu(e) ? x : TensorView{}, e == Epi::kAddRelu ? r : TensorView{});
      });
      EXPECT_EQ(m2, "no error") << epi_name(e);
      EXPECT_TRUE(untouched()) << epi_name(e);
    }
  }
}

// C = 1 and H*W = 1 and a 1x1x1x1 tensor, float32, against the reference (the parameterized test
// covers them too; this pins the smallest shapes in every layout a caller can make).
TEST(FrozenBnCpuEdges, TinyShapes) {
  for (const Shape& s : {Shape{1, 1, 1, 1}, Shape{5, 1, 1, 1}, Shape{1, 1, 1, 17}, Shape{1, 33, 1, 1}}) {
    for (Lay lay : kLays) {
      SCOPED_TRACE(::testing::Message() << "[" << s.N << ", " << s.C << ", " << s.H << ", " << s.W << "] "
                                        << lay_name(lay));
      const Problem p = make_problem(s, 3);
      std::vector<double> sc, sh;
      ref::frozen_bn_fold_ref(rounded(p.weight, DType::kFloat32), rounded(p.bias, DType::kFloat32),
                              rounded(p.mean, DType::kFloat32), rounded(p.var, DType::kFloat32), 1e-5, &sc, &sh);
      const Tensor scale = param(sc, DType::kFloat32), shift = param(sh, DType::kFloat32);
      sc = test::to_vector(scale);
      sh = test::to_vector(shift);
      Buf x = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, lay), y = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, lay);
      Buf r = Buf::make(s.N, s.C, s.H, s.W, DType::kFloat32, lay);
      fill_view(x.view, p.x);
      fill_view(r.view, p.residual);
      frozen_batch_norm_forward(x.view, scale, shift, y.view, Epi::kAddRelu, r.view);
      const std::vector<double> xr = test::to_vector(x.view), rr = test::to_vector(r.view);
      EXPECT_TRUE(close(test::to_vector(y.view),
                        ref::frozen_bn_forward_ref(xr, sc, sh, rr, s.N, s.C, s.H * s.W, FbnEpilogueRef::kAddRelu), 1e-6,
                        forward_magnitude(xr, sc, sh, &rr, s.C, s.H * s.W)));
      EXPECT_TRUE(gaps_untouched(y));
    }
  }
}

// The ReLU: NaN propagates (as torch.relu), -0 becomes +0, exact zeros do not pass gradient.
TEST(FrozenBnCpuSemantics, ReluOfNanNegativeZeroAndExactZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor scale = param({1.0}, DType::kFloat32);
  const Tensor shift = test::make_tensor({1}, DType::kFloat32, {-0.0});
  // x: -0 (-> -0 * 1 + -0 = -0), NaN, 0.5, -0.5, 0 (-> +0), inf, -inf
  const std::vector<double> xs = {-0.0, nan, 0.5, -0.5, 0.0, INFINITY, -INFINITY};
  const std::int64_t n = static_cast<std::int64_t>(xs.size());
  const Tensor x = test::make_tensor({1, 1, 1, n}, DType::kFloat32, xs);
  Tensor y = Tensor::empty({1, 1, 1, n}, DType::kFloat32);
  frozen_batch_norm_forward(x, scale, shift, y, Epi::kNone);
  const float* yp = y.data<float>();
  EXPECT_TRUE(std::signbit(yp[0]) && yp[0] == 0.0f) << "kNone keeps -0 * 1 + -0 = -0, got " << yp[0];
  EXPECT_TRUE(std::isnan(yp[1]));
  frozen_batch_norm_forward(x, scale, shift, y, Epi::kRelu);
  EXPECT_TRUE(!std::signbit(yp[0]) && yp[0] == 0.0f) << "ReLU(-0) = +0, got " << (std::signbit(yp[0]) ? "-" : "+") << yp[0];
  EXPECT_TRUE(std::isnan(yp[1])) << "ReLU(NaN) = NaN (torch.relu), got " << yp[1];
  EXPECT_EQ(yp[2], 0.5f);
  EXPECT_TRUE(yp[3] == 0.0f && !std::signbit(yp[3]));
  EXPECT_TRUE(yp[4] == 0.0f && !std::signbit(yp[4]));
  EXPECT_EQ(yp[5], INFINITY);
  EXPECT_TRUE(yp[6] == 0.0f && !std::signbit(yp[6]));
  // Backward: the mask is y > 0 (NaN and zeros block the gradient).
  const Tensor gy = test::make_tensor({1, 1, 1, n}, DType::kFloat32, std::vector<double>(xs.size(), 2.0));
  Tensor gx = Tensor::empty({1, 1, 1, n}, DType::kFloat32), gr = Tensor::empty({1, 1, 1, n}, DType::kFloat32);
  frozen_batch_norm_backward(gy, scale, gx, Epi::kAddRelu, y, gr);
  const std::vector<double> want = {0, 0, 2, 0, 0, 2, 0};
  EXPECT_TRUE(equal_values(test::to_vector(gx), want));
  EXPECT_TRUE(equal_values(test::to_vector(gr), want));
  // Residual: pre-activation + residual exactly 0 -> 0 and no gradient.
  const Tensor xs2 = test::make_tensor({1, 1, 1, 3}, DType::kFloat32, {0.75, 0.75, 0.75});
  const Tensor rs2 = test::make_tensor({1, 1, 1, 3}, DType::kFloat32, {-0.75, -0.5, -1.0});
  Tensor y2 = Tensor::empty({1, 1, 1, 3}, DType::kFloat32);
  frozen_batch_norm_forward(xs2, scale, param({0.0}, DType::kFloat32), y2, Epi::kAddRelu, rs2);
  EXPECT_TRUE(equal_values(test::to_vector(y2), {0.0, 0.25, 0.0}));
}

// float16 through F16C (where the CPU has it) against the portable conversions (Context::cpu_isa
// = kBaseline), bit for bit (NaN payloads aside, see same_halves): every epilogue, forward and backward, out of place and in place (y
// over x or the residual, grad_x over grad_y, grad_residual over y), NCHW planes (529) and NHWC
// rows (530) longer than a staging block (512) with tails, random half bit patterns (NaNs quiet
// and signalling with payloads, infinities, subnormals, signed zeros) and scales that overflow.
// Two float16 tensors of the same layout hold the same bits, except that a NaN may carry another
// payload: where two NaN operands meet (x * scale + shift + residual), which payload the addition
// keeps follows the compiler's operand order, which differs between code paths and optimization
// levels (the documented guarantee: NaN results are NaN, payload bits unspecified).
::testing::AssertionResult same_halves(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const std::uint16_t*>(a.view().data);
  const auto* pb = static_cast<const std::uint16_t*>(b.view().data);
  auto nan = [](std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; };
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    if (pa[i] != pb[i] && !(nan(pa[i]) && nan(pb[i]))) {
      if (first < 0) first = i;
      ++bad;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements differ; first at " << first
                                       << ::testing::Message() << ": " << std::hex << "0x" << unsigned{pa[first]}
                                       << " vs 0x" << unsigned{pb[first]};
}

TEST(FrozenBnCpuF16c, SameBitsAsThePortableConversions) {
  if (!internal::half_convert_f16c(Context{})) GTEST_SKIP() << "no F16C (or no AVX2) here: the F16C path is not taken";
  constexpr std::int64_t N = 2, C = 530, H = 23, W = 23;
  const std::int64_t n = N * C * H * W;
  auto halves = [&](std::uint64_t seed) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    std::uint64_t z = seed;
    for (auto& b : bits) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<std::uint16_t>(z >> 48);  // any pattern: NaNs, infinities, subnormals, zeros
      if ((z >> 20) % 4 != 0) b = static_cast<std::uint16_t>((b & 0x83ffu) | (((z >> 30) % 6 + 12) << 10));  // mostly O(1)
    }
    return bits;
  };
  auto tensor = [&](const std::vector<std::uint16_t>& bits, Layout layout) {
    Tensor t = Tensor::empty({N, C, H, W}, DType::kFloat16, Device::cpu(), layout);
    std::memcpy(t.view().data, bits.data(), bits.size() * 2);  // memory order: the values' meaning does not matter
    return t;
  };
  auto empty = [&](Layout layout) { return Tensor::empty({N, C, H, W}, DType::kFloat16, Device::cpu(), layout); };
  const Tensor scale = test::make_tensor({C}, DType::kFloat32, test::random_values(C, 5, -300.0, 300.0));
  const Tensor shift = test::make_tensor({C}, DType::kFloat32, test::random_values(C, 6, -2.0, 2.0));
  Context portable, fast;
  portable.cpu_isa = CpuIsa::kBaseline;
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
    const Tensor x = tensor(halves(1), layout), r = tensor(halves(2), layout), gy = tensor(halves(3), layout);
    for (Epi epi : {Epi::kNone, Epi::kRelu, Epi::kAddRelu}) {
      const std::string what = std::string(layout == Layout::kNHWC ? "nhwc " : "nchw ") + std::to_string(static_cast<int>(epi));
      const bool add = epi == Epi::kAddRelu;
      const TensorView res = add ? r.view() : TensorView{};
      Tensor y0 = empty(layout), y1 = empty(layout);
      frozen_batch_norm_forward(x, scale, shift, y0, epi, res, portable);
      frozen_batch_norm_forward(x, scale, shift, y1, epi, res, fast);
      EXPECT_TRUE(same_halves(y0, y1)) << "forward " << what;
      // in place: y over x, and (add) y over the residual
      Tensor xi = x.contiguous(layout);
      frozen_batch_norm_forward(xi, scale, shift, xi, epi, res, fast);
      EXPECT_TRUE(same_halves(y0, xi)) << "forward in place over x " << what;
      if (add) {
        Tensor ri = r.contiguous(layout);
        frozen_batch_norm_forward(x, scale, shift, ri, epi, ri, fast);
        EXPECT_TRUE(same_halves(y0, ri)) << "forward in place over the residual " << what;
      }
      Tensor gx0 = empty(layout), gx1 = empty(layout), gr0, gr1;
      if (add) gr0 = empty(layout), gr1 = empty(layout);
      const TensorView yv = epi == Epi::kNone ? TensorView{} : y0.view();
      frozen_batch_norm_backward(gy, scale, gx0, epi, yv, gr0, portable);
      frozen_batch_norm_backward(gy, scale, gx1, epi, yv, gr1, fast);
      EXPECT_TRUE(same_halves(gx0, gx1)) << "backward " << what;
      if (add) {
        EXPECT_TRUE(same_halves(gr0, gr1)) << "grad_residual " << what;
      }
      // in place: grad_x over grad_y; (add) grad_residual over y
      Tensor gi = gy.contiguous(layout), yi = y0.contiguous(layout), gri;
      if (add) gri = empty(layout);
      frozen_batch_norm_backward(gi, scale, gi, epi, epi == Epi::kNone ? TensorView{} : yi.view(), gri, fast);
      EXPECT_TRUE(same_halves(gx0, gi)) << "backward in place over grad_y " << what;
      if (add) {
        Tensor gx2 = empty(layout);
        frozen_batch_norm_backward(gy, scale, gx2, epi, yi, yi, fast);
        EXPECT_TRUE(same_halves(gx0, gx2)) << "backward, grad_residual over y " << what;
        EXPECT_TRUE(same_halves(gr0, yi)) << "grad_residual in place over y " << what;
      }
    }
  }
}

// ================================================================================================
// (e) the fold, eps, from_state / state, identity

TEST(FrozenBnFold, Float32MatchesReferenceAndTheDocumentedOrder) {
  const std::size_t C = 300;
  std::vector<double> w = test::random_values(C, 1, -3, 3), b = test::random_values(C, 2, -2, 2),
                      m = test::random_values(C, 3, -2, 2), v = test::random_values(C, 4, 0, 5);
  v[0] = 0.0;
  v[1] = 1e-30;
  v[2] = 1e30;
  w[3] = 0.0;
  for (double eps : {1e-5, 1e-3, 0.0}) {
    SCOPED_TRACE(::testing::Message() << "eps " << eps);
    if (eps == 0.0) v[0] = 0.25;  // eps = 0 needs running_var > 0
    const Tensor tw = param(w, DType::kFloat32), tb = param(b, DType::kFloat32), tm = param(m, DType::kFloat32),
                 tv = param(v, DType::kFloat32);
    Tensor scale = Tensor::empty({static_cast<std::int64_t>(C)}, DType::kFloat32);
    Tensor shift = Tensor::empty({static_cast<std::int64_t>(C)}, DType::kFloat32);
    frozen_batch_norm_fold(BatchNormState{tw, tb, tm, tv, eps}, scale, shift);
    std::vector<double> rs, rh;
    const std::vector<double> wr = test::to_vector(tw), br = test::to_vector(tb), mr = test::to_vector(tm),
                              vr = test::to_vector(tv);
    ref::frozen_bn_fold_ref(wr, br, mr, vr, static_cast<float>(eps), &rs, &rh);
    std::vector<double> mag(C);
    for (std::size_t c = 0; c < C; ++c) mag[c] = std::abs(br[c]) + std::abs(mr[c] * rs[c]);
    const std::vector<double> gs = test::to_vector(scale), gh = test::to_vector(shift);
    EXPECT_TRUE(close(gs, rs, 1e-6)) << "scale";
    EXPECT_TRUE(close(gh, rh, 1e-6, mag)) << "shift";
    // The header's float32 fold: scale = w * (1 / sqrt(rv + eps)), shift = b - rm * scale, each
    // operation rounded to float32 (this file is built with -ffp-contract=off).
    for (std::size_t c = 0; c < C; ++c) {
      const float inv = 1.0f / std::sqrt(tv.data<float>()[c] + static_cast<float>(eps));
      const float s = tw.data<float>()[c] * inv;
      const float prod = tm.data<float>()[c] * s;
      const float h = tb.data<float>()[c] - prod;
      ASSERT_EQ(std::memcmp(&s, &scale.data<float>()[c], 4), 0) << "scale[" << c << "] " << scale.data<float>()[c] << " vs " << s;
      ASSERT_EQ(std::memcmp(&h, &shift.data<float>()[c], 4), 0) << "shift[" << c << "] " << shift.data<float>()[c] << " vs " << h;
    }
  }
}

TEST(FrozenBnFold, Float64MatchesReferenceExactly) {
  const std::size_t C = 200;
  std::vector<double> w = test::random_values(C, 11, -3, 3), b = test::random_values(C, 12, -2, 2),
                      m = test::random_values(C, 13, -2, 2), v = test::random_values(C, 14, 1e-3, 5);
  for (double eps : {1e-5, 0.0, 1e-3}) {
    const Tensor tw = param(w, DType::kFloat64), tb = param(b, DType::kFloat64), tm = param(m, DType::kFloat64),
                 tv = param(v, DType::kFloat64);
    Tensor scale = Tensor::empty({static_cast<std::int64_t>(C)}, DType::kFloat64);
    Tensor shift = Tensor::empty({static_cast<std::int64_t>(C)}, DType::kFloat64);
    frozen_batch_norm_fold(BatchNormState{tw, tb, tm, tv, eps}, scale, shift);
    std::vector<double> rs, rh;
    ref::frozen_bn_fold_ref(w, b, m, v, eps, &rs, &rh);
    EXPECT_TRUE(equal_values(test::to_vector(scale), rs)) << "eps " << eps;
    EXPECT_TRUE(equal_values(test::to_vector(shift), rh)) << "eps " << eps;
  }
}

TEST(FrozenBnFold, EpsZeroWithPositiveVariance) {
  const Tensor w = param({1.0, 2.0, -0.5}, DType::kFloat32), b = param({0.0, 1.0, 0.25}, DType::kFloat32);
  const Tensor m = param({0.0, 0.5, -1.0}, DType::kFloat32), v = param({1.0, 4.0, 0.25}, DType::kFloat32);
  Tensor scale = Tensor::empty({3}, DType::kFloat32), shift = Tensor::empty({3}, DType::kFloat32);
  frozen_batch_norm_fold(BatchNormState{w, b, m, v, 0.0}, scale, shift);
  EXPECT_TRUE(equal_values(test::to_vector(scale), {1.0, 1.0, -1.0}));
  EXPECT_TRUE(equal_values(test::to_vector(shift), {0.0, 0.5, -0.75}));
  // ... and the module, with a forward
  const FrozenBatchNorm2d fbn = FrozenBatchNorm2d::from_state(BatchNormState{w, b, m, v, 0.0});
  const Tensor x = test::make_tensor({1, 3, 1, 2}, DType::kFloat32, {1, -1, 1, -1, 1, -1});
  Tensor y = Tensor::empty({1, 3, 1, 2}, DType::kFloat32);
  fbn.forward(x, y);
  EXPECT_TRUE(equal_values(test::to_vector(y), {1, -1, 1.5, -0.5, -1.75, 0.25}));
}

// torchvision accepts running_var = +inf (a channel that saw unbounded activations): its scale is
// w * rsqrt(inf) = 0 and its shift the bias, so the channel outputs the bias (NaN where x is
// inf or NaN, as in torchvision). So does detops, in float32 and float64.
TEST(FrozenBnFold, InfiniteRunningVarGivesTheBiasAsTorchvisionDoes) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    const Tensor w = param({2.0, -3.0}, dt), b = param({0.5, -1.25}, dt);
    const Tensor m = param({4.0, 0.0}, dt), v = param({inf, inf}, dt);
    Tensor scale = Tensor::empty({2}, dt), shift = Tensor::empty({2}, dt);
    frozen_batch_norm_fold(BatchNormState{w, b, m, v, 1e-5}, scale, shift);
    const std::vector<double> s = test::to_vector(scale), t = test::to_vector(shift);
    EXPECT_EQ(s[0], 0.0) << dtype_name(dt);
    EXPECT_EQ(s[1], 0.0) << dtype_name(dt);  // -3 * 0 = -0, equal to 0
    EXPECT_TRUE(equal_values(t, {0.5, -1.25})) << dtype_name(dt);
    const FrozenBatchNorm2d fbn = FrozenBatchNorm2d::from_state(BatchNormState{w, b, m, v, 1e-5});
    const Tensor x = test::make_tensor({1, 2, 1, 3}, dt, {1e30, -7, inf, 0, 3, -2});
    Tensor y = Tensor::empty({1, 2, 1, 3}, dt);
    fbn.forward(x, y);
    const std::vector<double> got = test::to_vector(y);
    EXPECT_EQ(got[0], 0.5);
    EXPECT_EQ(got[1], 0.5);
    EXPECT_TRUE(std::isnan(got[2])) << "inf * 0 is NaN, as in torchvision";
    EXPECT_EQ(got[3], -1.25);
    EXPECT_EQ(got[4], -1.25);
    EXPECT_EQ(got[5], -1.25);
  }
}

std::vector<unsigned char> view_bytes(const TensorView& v) {
  const auto* p = static_cast<const unsigned char*>(v.data);
  return std::vector<unsigned char>(p, p + v.span_bytes());
}

::testing::AssertionResult same_buffer(const TensorView& got, const Tensor& want, const char* name) {
  if (got.dtype != want.view().dtype)
    return ::testing::AssertionFailure() << name << ": dtype " << dtype_name(got.dtype) << ", expected "
                                         << dtype_name(want.view().dtype);
  if (got.rank != 1 || got.sizes[0] != want.size(0))
    return ::testing::AssertionFailure() << name << ": " << got.describe() << ", expected " << want.view().describe();
  if (!got.device.is_cpu()) return ::testing::AssertionFailure() << name << " not on the CPU";
  if (!same_elements(got, want.view())) return ::testing::AssertionFailure() << name << ": bytes differ";
  return ::testing::AssertionSuccess();
}

TEST(FrozenBnModule, FromStateRoundTripsTheCheckpointBitwise) {
  for (DType pdt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(pdt));
    const std::int64_t C = 37;
    std::vector<double> vv = test::random_values(C, 24, 0, 3);
    vv[5] = 0.0;
    Tensor w = param(test::random_values(C, 21, -2, 2), pdt), b = param(test::random_values(C, 22, -1, 1), pdt);
    Tensor m = param(test::random_values(C, 23, -1, 1), pdt), v = param(vv, pdt);
    const double eps = 1e-3;
    FrozenBatchNorm2d fbn;
    const std::string err = what_of([&] { fbn = FrozenBatchNorm2d::from_state(BatchNormState{w, b, m, v, eps}); });
    ASSERT_EQ(err, "no error");
    EXPECT_EQ(fbn.channels(), C);
    const BatchNormState st = fbn.state();
    EXPECT_EQ(st.eps, eps);
    EXPECT_TRUE(same_buffer(st.weight, w, "weight"));
    EXPECT_TRUE(same_buffer(st.bias, b, "bias"));
    EXPECT_TRUE(same_buffer(st.running_mean, m, "running_mean"));
    EXPECT_TRUE(same_buffer(st.running_var, v, "running_var")) << "running_var must be copied unchanged (no eps added)";
    // The fold: float64 stays float64, everything else folds in float32.
    const DType fold_dt = param_dtype(pdt);
    EXPECT_EQ(fbn.scale().view().dtype, fold_dt);
    EXPECT_EQ(fbn.shift().view().dtype, fold_dt);
    std::vector<double> rs, rh;
    ref::frozen_bn_fold_ref(test::to_vector(w), test::to_vector(b), test::to_vector(m), test::to_vector(v),
                            fold_dt == DType::kFloat64 ? eps : static_cast<float>(eps), &rs, &rh);
    const double tol = fold_dt == DType::kFloat64 ? 0.0 : 1e-6;
    std::vector<double> mag(static_cast<std::size_t>(C));
    for (std::size_t c = 0; c < mag.size(); ++c) mag[c] = std::abs(test::to_vector(b)[c]) + std::abs(test::to_vector(m)[c] * rs[c]);
    EXPECT_TRUE(close(test::to_vector(fbn.scale()), rs, tol)) << "scale";
    EXPECT_TRUE(close(test::to_vector(fbn.shift()), rh, tol, mag)) << "shift";
    // The module copied its buffers: changing the caller's afterwards changes nothing.
    const std::vector<unsigned char> w_before = view_bytes(fbn.state().weight);
    w.fill_bytes(0x11);
    v.fill_bytes(0x22);
    EXPECT_TRUE(view_bytes(fbn.state().weight) == w_before) << "from_state must copy, not alias";
    // A module rebuilt from the saved state folds to the same bits.
    const FrozenBatchNorm2d again = FrozenBatchNorm2d::from_state(fbn.state());
    EXPECT_TRUE(same_elements(again.scale().view(), fbn.scale().view()));
    EXPECT_TRUE(same_elements(again.shift().view(), fbn.shift().view()));
  }
}

TEST(FrozenBnModule, ForwardAndBackwardEqualTheFreeFunctions) {
  const Shape s{2, 11, 3, 4};
  const Problem p = make_problem(s, 31);
  const Tensor w = param(p.weight, DType::kFloat32), b = param(p.bias, DType::kFloat32),
               m = param(p.mean, DType::kFloat32), v = param(p.var, DType::kFloat32);
  const BatchNormState st{w, b, m, v, 1e-5};
  const FrozenBatchNorm2d fbn = FrozenBatchNorm2d::from_state(st);
  Tensor scale = Tensor::empty({s.C}, DType::kFloat32), shift = Tensor::empty({s.C}, DType::kFloat32);
  frozen_batch_norm_fold(st, scale, shift);
  EXPECT_TRUE(same_elements(fbn.scale().view(), scale.view()));
  EXPECT_TRUE(same_elements(fbn.shift().view(), shift.view()));
  const Tensor x = test::make_tensor({s.N, s.C, s.H, s.W}, DType::kBFloat16, p.x, Layout::kNHWC);
  const Tensor r = test::make_tensor({s.N, s.C, s.H, s.W}, DType::kBFloat16, p.residual, Layout::kNHWC);
  const Tensor gy = test::make_tensor({s.N, s.C, s.H, s.W}, DType::kBFloat16, p.grad_y, Layout::kNHWC);
  for (Epi e : kEpilogues) {
    Tensor y1 = Tensor::zeros({s.N, s.C, s.H, s.W}, DType::kBFloat16, Device::cpu(), Layout::kNHWC);
    Tensor y2 = Tensor::zeros({s.N, s.C, s.H, s.W}, DType::kBFloat16, Device::cpu(), Layout::kNHWC);
    fbn.forward(x, y1, e, e == Epi::kAddRelu ? r.view() : TensorView{});
    frozen_batch_norm_forward(x, scale, shift, y2, e, e == Epi::kAddRelu ? r.view() : TensorView{});
    EXPECT_TRUE(test::same_bytes(y1, y2)) << epi_name(e);
    Tensor g1 = Tensor::zeros({s.N, s.C, s.H, s.W}, DType::kBFloat16, Device::cpu(), Layout::kNHWC);
    Tensor g2 = Tensor::zeros({s.N, s.C, s.H, s.W}, DType::kBFloat16, Device::cpu(), Layout::kNHWC);
    fbn.backward(gy, g1, e, has_relu(e) ? y1.view() : TensorView{});
    frozen_batch_norm_backward(gy, scale, g2, e, has_relu(e) ? y1.view() : TensorView{});
    EXPECT_TRUE(test::same_bytes(g1, g2)) << epi_name(e);
  }
}

/// float32 values a backbone can hold, without -0 (see IdentityTurnsNegativeZeroIntoZero).
std::vector<double> identity_test_values() {
  std::vector<double> v;
  const float fmax = std::numeric_limits<float>::max(), fmin = std::numeric_limits<float>::min();
  const float den = std::numeric_limits<float>::denorm_min();
  for (double s : {1.0, -1.0}) {
    for (double x : {0.0, static_cast<double>(fmax), static_cast<double>(fmin), static_cast<double>(den),
                     static_cast<double>(fmin) / 3, 1e-40, 3e38, 1.0, 1e-20, 12345.678, static_cast<double>(INFINITY)}) {
      if (x == 0.0 && s < 0) continue;
      v.push_back(s * x);
    }
  }
  for (int e = -149; e <= 127; ++e) v.push_back(std::ldexp(1.0, e) * (e % 2 ? 1.5 : -1.25));
  v.push_back(std::numeric_limits<double>::quiet_NaN());
  const std::vector<double> r = test::random_values(4000, 41, -100, 100);
  v.insert(v.end(), r.begin(), r.end());
  return v;
}

// detectron2 initializes running_var = 1 - eps so that (running_var + eps)^(-1/2) = 1 and the
// module is exactly the identity; in float32 (1 - eps) + eps rounds to exactly 1 for these eps.
TEST(FrozenBnModule, IdentityIsExactOnFloat32) {
  const std::vector<double> vals = identity_test_values();
  const std::int64_t C = 4, n = static_cast<std::int64_t>(vals.size()) / C;
  for (double eps : {1e-5, 1e-3, 1e-4, 0.1, 0.0}) {
    SCOPED_TRACE(::testing::Message() << "eps " << eps);
    const float ef = static_cast<float>(eps);
    ASSERT_EQ(static_cast<float>(1.0 - eps) + ef, 1.0f) << "(1 - eps) + eps is not exactly 1 in float32";
    ASSERT_EQ((1.0f - ef) + ef, 1.0f) << "(1 - eps) + eps is not exactly 1 in float32";
    const FrozenBatchNorm2d id = FrozenBatchNorm2d::identity(C, eps);
    EXPECT_EQ(id.channels(), C);
    EXPECT_EQ(id.scale().view().dtype, DType::kFloat32);
    EXPECT_TRUE(equal_values(test::to_vector(id.scale()), std::vector<double>(C, 1.0))) << "scale must be exactly 1";
    EXPECT_TRUE(equal_values(test::to_vector(id.shift()), std::vector<double>(C, 0.0))) << "shift must be exactly 0";
    const BatchNormState st = id.state();
    EXPECT_EQ(st.eps, eps);
    EXPECT_TRUE(equal_values(test::to_vector(st.weight), std::vector<double>(C, 1.0)));
    EXPECT_TRUE(equal_values(test::to_vector(st.bias), std::vector<double>(C, 0.0)));
    EXPECT_TRUE(equal_values(test::to_vector(st.running_mean), std::vector<double>(C, 0.0)));
    for (double rv : test::to_vector(st.running_var)) EXPECT_EQ(static_cast<float>(rv) + ef, 1.0f) << "running_var " << rv;
    for (Layout l : {Layout::kNCHW, Layout::kNHWC}) {
      const Tensor x = test::make_tensor({1, C, 1, n}, DType::kFloat32, std::vector<double>(vals.begin(), vals.begin() + C * n), l);
      Tensor y = Tensor::empty({1, C, 1, n}, DType::kFloat32, Device::cpu(), l);
      y.fill_bytes(0xCD);
      id.forward(x, y);
      EXPECT_TRUE(test::same_bytes(x, y)) << "identity forward is not bitwise the identity";
      Tensor gx = Tensor::empty({1, C, 1, n}, DType::kFloat32, Device::cpu(), l);
      id.backward(x, gx);
      EXPECT_TRUE(test::same_bytes(x, gx)) << "identity backward is not bitwise the identity";
    }
  }
}

// y = x * 1 + 0 turns -0 into +0 (as torchvision's and detectron2's modules do): values equal, sign not.
TEST(FrozenBnModule, IdentityTurnsNegativeZeroIntoZero) {
  const FrozenBatchNorm2d id = FrozenBatchNorm2d::identity(1);
  const Tensor x = test::make_tensor({1, 1, 1, 2}, DType::kFloat32, {-0.0, 0.0});
  Tensor y = Tensor::empty({1, 1, 1, 2}, DType::kFloat32);
  id.forward(x, y);
  EXPECT_EQ(y.data<float>()[0], 0.0f);
  EXPECT_EQ(y.data<float>()[1], 0.0f);
  EXPECT_FALSE(std::signbit(y.data<float>()[1]));
}

TEST(FrozenBnModule, IdentityIsExactOnFloat64AndHalfData) {
  const std::vector<double> vals = test::random_values(999, 42, -50, 50);
  {
    const FrozenBatchNorm2d id = FrozenBatchNorm2d::identity(3, 1e-5, Device::cpu(), DType::kFloat64);
    EXPECT_EQ(id.scale().view().dtype, DType::kFloat64);
    const Tensor x = test::make_tensor({1, 3, 9, 37}, DType::kFloat64, vals);
    Tensor y = Tensor::empty({1, 3, 9, 37}, DType::kFloat64);
    id.forward(x, y);
    EXPECT_TRUE(test::same_bytes(x, y)) << "float64";
  }
  const FrozenBatchNorm2d id = FrozenBatchNorm2d::identity(3);
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const Tensor x = test::make_tensor({1, 3, 9, 37}, dt, vals, Layout::kNHWC);
    Tensor y = Tensor::empty({1, 3, 9, 37}, dt, Device::cpu(), Layout::kNHWC);
    id.forward(x, y);
    EXPECT_TRUE(test::same_bytes(x, y)) << dtype_name(dt);
  }
}

// identity() with 16-bit parameters: 1 - eps is not representable next to 1 in float16/bfloat16
// (it rounds to 1), so the fold gives (1 + eps)^(-1/2) != 1 unless the library compensates. Either
// an error or an exact identity is acceptable; a silent near-identity is not.
TEST(FrozenBnModule, IdentityWith16BitParametersIsExactOrRejected) {
  const std::vector<double> vals = test::random_values(60, 43, -50, 50);
  for (DType pdt : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(pdt));
    FrozenBatchNorm2d id;
    const std::string err = what_of([&] { id = FrozenBatchNorm2d::identity(3, 1e-5, Device::cpu(), pdt); });
    if (err != "no error") {
      std::printf("[ note    ] identity(3, 1e-5, cpu, %s) is rejected: %s\n", std::string(dtype_name(pdt)).c_str(),
                  err.c_str());
      continue;
    }
    EXPECT_TRUE(equal_values(test::to_vector(id.scale()), std::vector<double>(3, 1.0)))
        << "scale " << test::to_vector(id.scale())[0] << " (running_var stored as "
        << test::to_vector(id.state().running_var)[0] << ")";
    const Tensor x = test::make_tensor({1, 3, 4, 5}, DType::kFloat32, vals);
    Tensor y = Tensor::empty({1, 3, 4, 5}, DType::kFloat32);
    id.forward(x, y);
    EXPECT_TRUE(test::same_bytes(x, y)) << "not the identity on float32 data";
  }
}

// ================================================================================================
// (f) bad input: detops::Error naming the op and the argument; poisoned outputs untouched

/// Valid arguments of every entry point, float32 [2, 3, 4, 5] NCHW; a case breaks one of them.
struct Args {
  Tensor x, y, residual, grad_y, grad_x, grad_residual, scale, shift, weight, bias, mean, var;
  TensorView vx, vy, vres, vgy, vgx, vgres, vscale, vshift;
  BatchNormState st;
  Epi epi = Epi::kAddRelu;
  std::vector<Tensor> extra;  // storage for replacement tensors

  Args() {
    const std::int64_t N = 2, C = 3, H = 4, W = 5;
    x = test::make_tensor({N, C, H, W}, DType::kFloat32, test::random_values(120, 51));
    residual = test::make_tensor({N, C, H, W}, DType::kFloat32, test::random_values(120, 52));
    grad_y = test::make_tensor({N, C, H, W}, DType::kFloat32, test::random_values(120, 53));
    y = Tensor::empty({N, C, H, W}, DType::kFloat32);
    grad_x = Tensor::empty({N, C, H, W}, DType::kFloat32);
    grad_residual = Tensor::empty({N, C, H, W}, DType::kFloat32);
    scale = param({1.5, -0.5, 2.0}, DType::kFloat32);
    shift = param({0.1, 0.2, -0.3}, DType::kFloat32);
    weight = param({1.0, 2.0, 0.5}, DType::kFloat32);
    bias = param({0.0, 0.1, 0.2}, DType::kFloat32);
    mean = param({0.3, -0.2, 0.1}, DType::kFloat32);
    var = param({1.0, 0.5, 2.0}, DType::kFloat32);
    vx = x, vy = y, vres = residual, vgy = grad_y, vgx = grad_x, vgres = grad_residual, vscale = scale, vshift = shift;
    st = BatchNormState{weight, bias, mean, var, 1e-5};
  }
  TensorView keep(Tensor t) {
    extra.push_back(std::move(t));
    return extra.back().view();
  }
};

enum class Op { kForward, kBackward, kFold };
const char* op_name(Op o) {
  switch (o) {
    case Op::kForward: return "frozen_batch_norm_forward";
    case Op::kBackward: return "frozen_batch_norm_backward";
    case Op::kFold: return "frozen_batch_norm_fold";
  }
  return "?";
}

struct BadCase {
  const char* name;
  Op op;
  std::function<void(Args&)> mutate;
  std::vector<const char*> any_of;  // the message names at least one of these (the argument)
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

/// `msg` contains `word` as a whole identifier (so "y" does not match "grad_y"); a trailing '*'
/// makes it a prefix ("overlap*" matches "overlaps" and "overlapping").
bool names(const std::string& msg, std::string word) {
  const bool prefix = !word.empty() && word.back() == '*';
  if (prefix) word.pop_back();
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (std::size_t pos = msg.find(word); pos != std::string::npos; pos = msg.find(word, pos + 1)) {
    const bool start_ok = pos == 0 || !ident(msg[pos - 1]);
    const std::size_t end = pos + word.size();
    const bool end_ok = prefix || end == msg.size() || !ident(msg[end]);
    if (start_ok && end_ok) return true;
  }
  return false;
}

class FrozenBnBadInput : public ::testing::TestWithParam<BadCase> {};

/// Every byte an op could write, snapshot before the call.
struct Snapshot {
  std::vector<std::pair<const TensorView*, std::vector<unsigned char>>> saved;
  void add(const TensorView& v) {
    // A view the library refuses (negative strides, an extent that does not fit) has no span; the
    // tensors behind it are snapshotted through their own views.
    std::int64_t span = 0;
    try {
      span = v.span_bytes();
    } catch (const Error&) {
      return;
    }
    if (v.data == nullptr || span <= 0) return;
    saved.emplace_back(&v, view_bytes(v));
  }
  bool unchanged() const {
    for (const auto& s : saved)
      if (view_bytes(*s.first) != s.second) return false;
    return true;
  }
};

TEST_P(FrozenBnBadInput, ThrowsNamingTheArgumentAndWritesNothing) {
  const BadCase& bc = GetParam();
  Args a;
  bc.mutate(a);
  for (Tensor* t : {&a.y, &a.grad_x, &a.grad_residual}) t->fill_bytes(0xA5);
  Snapshot snap;
  for (const TensorView* v : {&a.vx, &a.vy, &a.vres, &a.vgy, &a.vgx, &a.vgres, &a.vscale, &a.vshift})
    if (v->device.is_cpu()) snap.add(*v);
  for (const Tensor* t : {&a.x, &a.y, &a.residual, &a.grad_y, &a.grad_x, &a.grad_residual, &a.scale, &a.shift,
                          &a.weight, &a.bias, &a.mean, &a.var})
    snap.add(t->view());
  for (const Tensor& t : a.extra) snap.add(t.view());
  std::string msg;
  ErrorCode code = ErrorCode::kCudaError;
  try {
    switch (bc.op) {
      case Op::kForward: frozen_batch_norm_forward(a.vx, a.vscale, a.vshift, a.vy, a.epi, a.vres); break;
      case Op::kBackward: frozen_batch_norm_backward(a.vgy, a.vscale, a.vgx, a.epi, a.vy, a.vgres); break;
      case Op::kFold: frozen_batch_norm_fold(a.st, a.vscale, a.vshift); break;
    }
    msg = "no error";
  } catch (const Error& e) {
    msg = e.what();
    code = e.code();
  } catch (const std::exception& e) {
    msg = std::string("not a detops::Error: ") + e.what();
  }
  std::printf("[ message ] %s: %s\n", bc.name, msg.c_str());
  ASSERT_NE(msg, "no error") << bc.name;
  EXPECT_EQ(code, ErrorCode::kInvalidArgument) << msg;
  EXPECT_EQ(msg.rfind(std::string(op_name(bc.op)) + ": ", 0), 0u) << "message should start with the op: " << msg;
  bool named = false;
  for (const char* s : bc.any_of) named |= names(msg, s);
  std::string wanted;
  for (const char* s : bc.any_of) wanted += std::string(wanted.empty() ? "" : " or ") + "'" + s + "'";
  EXPECT_TRUE(named) << "message should name " << wanted << ": " << msg;
  EXPECT_TRUE(snap.unchanged()) << "a failed call wrote to its arguments: " << msg;
}

Tensor f32(std::initializer_list<std::int64_t> sizes) { return Tensor::zeros(sizes, DType::kFloat32); }

TensorView on_cuda(TensorView v) {
  v.device = Device::cuda(0);
  return v;
}
TensorView shifted(TensorView v, std::int64_t elements) {
  v.data = static_cast<char*>(v.data) + elements * static_cast<std::int64_t>(dtype_size(v.dtype));
  return v;
}

const BadCase kBadCases[] = {
    // forward
    {"fwd_scale_channels", Op::kForward, [](Args& a) { a.vscale = a.keep(f32({4})); }, {"scale"}},
    {"fwd_shift_channels", Op::kForward, [](Args& a) { a.vshift = a.keep(f32({2})); }, {"shift"}},
    {"fwd_scale_rank", Op::kForward, [](Args& a) { a.vscale = a.keep(f32({3, 1})); }, {"scale"}},
    {"fwd_x_rank3", Op::kForward,
     [](Args& a) {
       a.vx = a.keep(f32({2, 3, 20}));
     },
     {"x"}},
    {"fwd_x_rank5", Op::kForward, [](Args& a) { a.vx = a.keep(f32({2, 3, 4, 5, 1})); }, {"x"}},
    {"fwd_y_rank", Op::kForward, [](Args& a) { a.vy = a.keep(f32({2, 3, 20})); }, {"y"}},
    {"fwd_y_sizes", Op::kForward, [](Args& a) { a.vy = a.keep(f32({2, 3, 4, 6})); }, {"y"}},
    {"fwd_y_dtype", Op::kForward,
     [](Args& a) {
       a.vx = a.keep(test::make_tensor({2, 3, 4, 5}, DType::kFloat16, test::random_values(120, 1)));
       a.vres = a.keep(test::make_tensor({2, 3, 4, 5}, DType::kFloat16, test::random_values(120, 2)));
     },
     {"y"}},
    {"fwd_x_f16_y_f32", Op::kForward,
     [](Args& a) {
       a.epi = Epi::kRelu;
       a.vres = {};
       a.vx = a.keep(test::make_tensor({2, 3, 4, 5}, DType::kFloat16, test::random_values(120, 1)));
     },
     {"y", "x"}},
    {"fwd_scale_f64_x_f32", Op::kForward, [](Args& a) { a.vscale = a.keep(param({1, 2, 3}, DType::kFloat64)); },
     {"scale"}},
    {"fwd_shift_f64_x_f32", Op::kForward, [](Args& a) { a.vshift = a.keep(param({1, 2, 3}, DType::kFloat64)); },
     {"shift"}},
    {"fwd_scale_f32_x_f64", Op::kForward,
     [](Args& a) {
       a.vx = a.keep(test::make_tensor({2, 3, 4, 5}, DType::kFloat64, test::random_values(120, 1)));
       a.vy = a.keep(Tensor::zeros({2, 3, 4, 5}, DType::kFloat64));
       a.vres = a.keep(Tensor::zeros({2, 3, 4, 5}, DType::kFloat64));
     },
     {"scale"}},
    {"fwd_scale_f16", Op::kForward, [](Args& a) { a.vscale = a.keep(param({1, 2, 3}, DType::kFloat16)); }, {"scale"}},
    {"fwd_y_device", Op::kForward, [](Args& a) { a.vy = on_cuda(a.vy); }, {"y"}},
    {"fwd_scale_device", Op::kForward, [](Args& a) { a.vscale = on_cuda(a.vscale); }, {"scale"}},
    {"fwd_residual_device", Op::kForward, [](Args& a) { a.vres = on_cuda(a.vres); }, {"residual"}},
    {"fwd_add_relu_without_residual", Op::kForward, [](Args& a) { a.vres = {}; }, {"residual"}},
    {"fwd_residual_sizes", Op::kForward, [](Args& a) { a.vres = a.keep(f32({2, 3, 5, 4})); }, {"residual"}},
    {"fwd_residual_dtype", Op::kForward,
     [](Args& a) { a.vres = a.keep(Tensor::zeros({2, 3, 4, 5}, DType::kBFloat16)); },
     {"residual"}},
    {"fwd_y_partially_overlaps_x", Op::kForward,
     [](Args& a) {
       // x lives one element into a buffer, y starts at the buffer: 119 of 120 elements overlap.
       Tensor buf = Tensor::zeros({121}, DType::kFloat32);
       a.vx = shifted(TensorView(buf.view().data, DType::kFloat32, Device::cpu(), {2, 3, 4, 5}), 1);
       a.vy = TensorView(buf.view().data, DType::kFloat32, Device::cpu(), {2, 3, 4, 5});
       a.keep(std::move(buf));
     },
     {"y", "overlap*"}},
    {"fwd_y_offset_into_x", Op::kForward,
     [](Args& a) {
       Tensor buf = Tensor::zeros({121}, DType::kFloat32);
       a.vx = TensorView(buf.view().data, DType::kFloat32, Device::cpu(), {2, 3, 4, 5});
       a.vy = shifted(a.vx, 1);
       a.keep(std::move(buf));
     },
     {"y", "overlap*"}},
    {"fwd_y_overlaps_residual", Op::kForward,
     [](Args& a) {
       Tensor buf = Tensor::zeros({121}, DType::kFloat32);
       a.vres = TensorView(buf.view().data, DType::kFloat32, Device::cpu(), {2, 3, 4, 5});
       a.vy = shifted(a.vres, 1);
       a.keep(std::move(buf));
     },
     {"y", "residual", "overlap*"}},
    {"fwd_y_overlaps_scale", Op::kForward,
     [](Args& a) {
       a.vx = a.keep(f32({1, 3, 1, 1}));
       a.vres = a.keep(f32({1, 3, 1, 1}));
       a.vy = TensorView(a.scale.view().data, DType::kFloat32, Device::cpu(), {1, 3, 1, 1});
     },
     {"y", "scale", "overlap*"}},
    {"fwd_y_self_overlap", Op::kForward,
     [](Args& a) { a.vy.strides[1] = 0; },  // both channels write one element
     {"y", "overlap*"}},
    {"fwd_y_null", Op::kForward, [](Args& a) { a.vy.data = nullptr; }, {"y"}},
    {"fwd_x_negative_stride", Op::kForward, [](Args& a) { a.vx.strides[3] = -1; }, {"x"}},
    // backward
    {"bwd_relu_without_y", Op::kBackward,
     [](Args& a) {
       a.epi = Epi::kRelu;
       a.vy = {};
       a.vgres = {};
     },
     {"y"}},
    {"bwd_add_relu_without_y", Op::kBackward, [](Args& a) { a.vy = {}; }, {"y"}},
    {"bwd_y_sizes", Op::kBackward, [](Args& a) { a.vy = a.keep(f32({2, 3, 4, 4})); }, {"y"}},
    {"bwd_y_dtype", Op::kBackward, [](Args& a) { a.vy = a.keep(Tensor::zeros({2, 3, 4, 5}, DType::kFloat64)); }, {"y"}},
    {"bwd_grad_x_sizes", Op::kBackward, [](Args& a) { a.vgx = a.keep(f32({2, 3, 4, 6})); }, {"grad_x"}},
    {"bwd_grad_x_dtype", Op::kBackward, [](Args& a) { a.vgx = a.keep(Tensor::zeros({2, 3, 4, 5}, DType::kFloat16)); },
     {"grad_x"}},
    {"bwd_grad_y_rank", Op::kBackward, [](Args& a) { a.vgy = a.keep(f32({120})); }, {"grad_y"}},
    {"bwd_scale_channels", Op::kBackward, [](Args& a) { a.vscale = a.keep(f32({2})); }, {"scale"}},
    {"bwd_scale_f64", Op::kBackward, [](Args& a) { a.vscale = a.keep(param({1, 2, 3}, DType::kFloat64)); }, {"scale"}},
    {"bwd_grad_residual_sizes", Op::kBackward, [](Args& a) { a.vgres = a.keep(f32({2, 3, 4, 4})); },
     {"grad_residual"}},
    {"bwd_grad_residual_dtype", Op::kBackward,
     [](Args& a) { a.vgres = a.keep(Tensor::zeros({2, 3, 4, 5}, DType::kBFloat16)); },
     {"grad_residual"}},
    {"bwd_grad_x_device", Op::kBackward, [](Args& a) { a.vgx = on_cuda(a.vgx); }, {"grad_x"}},
    {"bwd_grad_x_partially_overlaps_grad_y", Op::kBackward,
     [](Args& a) {
       Tensor buf = Tensor::zeros({121}, DType::kFloat32);
       a.vgy = TensorView(buf.view().data, DType::kFloat32, Device::cpu(), {2, 3, 4, 5});
       a.vgx = shifted(a.vgy, 1);
       a.keep(std::move(buf));
     },
     {"grad_x", "overlap*"}},
    {"bwd_grad_residual_is_grad_x", Op::kBackward, [](Args& a) { a.vgres = a.vgx; },
     {"grad_residual", "grad_x", "overlap*"}},
    // fold
    {"fold_negative_running_var", Op::kFold, [](Args& a) { a.var.data<float>()[1] = -0.5f; }, {"running_var"}},
    {"fold_nan_running_var", Op::kFold, [](Args& a) { a.var.data<float>()[2] = NAN; }, {"running_var"}},
    {"fold_zero_var_eps0", Op::kFold,
     [](Args& a) {
       a.var.data<float>()[0] = 0.0f;
       a.st.eps = 0.0;
     },
     {"running_var", "eps"}},
    {"fold_var_plus_negative_eps_zero", Op::kFold,
     [](Args& a) {
       a.var.data<float>()[0] = 0.25f;
       a.st.eps = -0.25;
     },
     {"running_var", "eps"}},
    {"fold_bias_size", Op::kFold, [](Args& a) { a.st.bias = a.keep(f32({4})); }, {"bias"}},
    {"fold_mean_size", Op::kFold, [](Args& a) { a.st.running_mean = a.keep(f32({2})); }, {"running_mean"}},
    {"fold_bias_dtype", Op::kFold, [](Args& a) { a.st.bias = a.keep(param({0, 0, 0}, DType::kFloat64)); }, {"bias"}},
    {"fold_scale_size", Op::kFold, [](Args& a) { a.vscale = a.keep(f32({4})); }, {"scale"}},
    {"fold_shift_rank", Op::kFold, [](Args& a) { a.vshift = a.keep(f32({3, 1})); }, {"shift"}},
    {"fold_mean_device", Op::kFold, [](Args& a) { a.st.running_mean = on_cuda(a.st.running_mean); },
     {"running_mean"}},
    {"fold_scale_device", Op::kFold, [](Args& a) { a.vscale = on_cuda(a.vscale); }, {"scale"}},
    {"fold_shift_overlaps_scale", Op::kFold, [](Args& a) { a.vshift = a.vscale; }, {"shift", "overlap*"}},
    // the outputs over the state: the fold would overwrite the caller's statistics
    {"fold_scale_over_running_var", Op::kFold, [](Args& a) { a.vscale = a.st.running_var; },
     {"scale", "running_var", "overlap*"}},
    {"fold_shift_partly_over_weight", Op::kFold,
     [](Args& a) {
       Tensor both = f32({4});  // weight in [0, 3), shift in [1, 4)
       a.st.weight = TensorView(both.data<float>(), DType::kFloat32, Device::cpu(), {3});
       a.vshift = TensorView(both.data<float>() + 1, DType::kFloat32, Device::cpu(), {3});
       a.keep(std::move(both));
     },
     {"shift", "weight", "overlap*"}},
};

INSTANTIATE_TEST_SUITE_P(Matrix, FrozenBnBadInput, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

TEST(FrozenBnBadInputModule, FromStateRejectsBadBuffers) {
  Args a;
  a.var.data<float>()[1] = -1.0f;
  const std::string msg = what_of([&] { FrozenBatchNorm2d::from_state(a.st); });
  EXPECT_NE(msg.find("running_var"), std::string::npos) << msg;
  Args b;
  b.st.bias = b.keep(f32({5}));
  const std::string msg2 = what_of([&] { FrozenBatchNorm2d::from_state(b.st); });
  EXPECT_NE(msg2.find("bias"), std::string::npos) << msg2;
  // A module's forward checks its channel count against x.
  const FrozenBatchNorm2d fbn = FrozenBatchNorm2d::identity(4);
  Tensor y = Tensor::empty({2, 3, 4, 5}, DType::kFloat32);
  y.fill_bytes(0xA5);
  const std::string msg3 = what_of([&] { fbn.forward(a.x, y); });
  EXPECT_NE(msg3.find("frozen_batch_norm_forward"), std::string::npos) << msg3;
  EXPECT_NE(msg3.find("scale"), std::string::npos) << msg3;
  for (std::size_t i = 0; i < y.nbytes(); ++i)
    ASSERT_EQ(static_cast<unsigned char*>(y.view().data)[i], 0xA5) << "byte " << i;
}

// Regression (issue 6): a DType value outside the float dtypes (int32, one added later, or one
// outside the enumeration) is rejected by every entry point instead of being read as zeros.
TEST(FrozenBnBadInput, UnknownDTypesAreRejected) {
  for (int raw : {static_cast<int>(DType::kInt32), static_cast<int>(DType::kInt32) + 1, 9, 200}) {
    const DType bad = static_cast<DType>(raw);
    Args a;
    a.scale.fill_bytes(0xA5);
    a.shift.fill_bytes(0xA5);
    BatchNormState st = a.st;
    st.weight.dtype = st.bias.dtype = st.running_mean.dtype = st.running_var.dtype = bad;
    std::string msg = what_of([&] { frozen_batch_norm_fold(st, a.scale, a.shift); });
    EXPECT_NE(msg.find("frozen_batch_norm_fold: weight has dtype"), std::string::npos) << raw << ": " << msg;
    EXPECT_NE(msg.find("expected a floating dtype"), std::string::npos) << raw << ": " << msg;
    for (const Tensor* t : {&a.scale, &a.shift})
      for (std::size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(static_cast<unsigned char*>(t->view().data)[i], 0xA5);
    msg = what_of([&] { FrozenBatchNorm2d::from_state(st); });
    EXPECT_NE(msg.find("expected a floating dtype"), std::string::npos) << raw << ": " << msg;
    TensorView x = a.vx, y = a.vy;
    x.dtype = y.dtype = bad;
    msg = what_of([&] { frozen_batch_norm_forward(x, a.vscale, a.vshift, y); });
    EXPECT_NE(msg.find("x has dtype"), std::string::npos) << raw << ": " << msg;
    TensorView gy = a.vgy, gx = a.vgx;
    gy.dtype = gx.dtype = bad;
    msg = what_of([&] { frozen_batch_norm_backward(gy, a.vscale, gx); });
    EXPECT_NE(msg.find("grad_y has dtype"), std::string::npos) << raw << ": " << msg;
  }
}

// ================================================================================================
// (g) threads

// Aliasings that are safe elementwise are allowed (each element reads its inputs before its
// outputs are written) and give the out-of-place results.
TEST(FrozenBnCpuSemantics, SafeAliasingsEqualOutOfPlace) {
  const std::vector<double> xv = test::random_values(120, 31), rv = test::random_values(120, 32),
                            gv = test::random_values(120, 33);
  Tensor w = test::make_tensor({3}, DType::kFloat32, {1.0, -2.0, 0.5}), b = test::make_tensor({3}, DType::kFloat32, {0.1, 0.2, -0.3}),
         m = test::make_tensor({3}, DType::kFloat32, {0.0, 0.5, -0.5}), var = test::make_tensor({3}, DType::kFloat32, {1.0, 2.0, 0.5});
  const FrozenBatchNorm2d bn = FrozenBatchNorm2d::from_state({w, b, m, var, 1e-5});
  Tensor x = test::make_tensor({2, 3, 4, 5}, DType::kFloat32, xv), r = test::make_tensor({2, 3, 4, 5}, DType::kFloat32, rv);
  Tensor y = Tensor::empty({2, 3, 4, 5}, DType::kFloat32);
  bn.forward(x, y, FrozenBnEpilogue::kAddRelu, r);
  bn.forward(x, r, FrozenBnEpilogue::kAddRelu, r);  // y is the residual
  EXPECT_TRUE(test::same_bytes(y, r));
  Tensor gy = test::make_tensor({2, 3, 4, 5}, DType::kFloat32, gv);
  Tensor gx = Tensor::empty({2, 3, 4, 5}, DType::kFloat32), gr = Tensor::empty({2, 3, 4, 5}, DType::kFloat32);
  bn.backward(gy, gx, FrozenBnEpilogue::kAddRelu, y, gr);
  Tensor y2 = test::make_tensor({2, 3, 4, 5}, DType::kFloat32, test::to_vector(y));
  bn.backward(gy, y2, FrozenBnEpilogue::kAddRelu, y2);  // grad_x is y
  EXPECT_TRUE(test::same_bytes(gx, y2));
  Tensor gy2 = test::make_tensor({2, 3, 4, 5}, DType::kFloat32, gv), gx2 = Tensor::empty({2, 3, 4, 5}, DType::kFloat32);
  bn.backward(gy2, gx2, FrozenBnEpilogue::kAddRelu, y, gy2);  // grad_residual is grad_y
  EXPECT_TRUE(test::same_bytes(gx, gx2));
  EXPECT_TRUE(test::same_bytes(gr, gy2));
}

TEST(FrozenBnCpuThreads, SameBytesForAnyThreadCount) {
  const Shape s{2, 64, 56, 57};
  const Problem p = make_problem(s, 77);
  const std::vector<double> sc = test::random_values(64, 78, -2, 2), sh = test::random_values(64, 79, -1, 1);
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    const DType pdt = param_dtype(dt);
    const Tensor scale = param(sc, pdt), shift = param(sh, pdt);
    for (Lay lay : {Lay::kNchw, Lay::kNhwc, Lay::kSlice}) {
      Buf x = Buf::make(s.N, s.C, s.H, s.W, dt, lay), r = Buf::make(s.N, s.C, s.H, s.W, dt, lay),
          gy = Buf::make(s.N, s.C, s.H, s.W, dt, lay);
      fill_view(x.view, p.x);
      fill_view(r.view, p.residual);
      fill_view(gy.view, p.grad_y);
      for (Epi e : kEpilogues) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << lay_name(lay) << " " << epi_name(e));
        std::vector<Buf> ys, gxs, grs;
        for (int threads : {1, 2, 5}) {
          Context ctx;
          ctx.num_threads = threads;
          ys.push_back(Buf::make(s.N, s.C, s.H, s.W, dt, lay));
          gxs.push_back(Buf::make(s.N, s.C, s.H, s.W, dt, lay));
          grs.push_back(Buf::make(s.N, s.C, s.H, s.W, dt, lay));
          frozen_batch_norm_forward(x.view, scale, shift, ys.back().view, e, e == Epi::kAddRelu ? r.view : TensorView{},
                                    ctx);
          frozen_batch_norm_backward(gy.view, scale, gxs.back().view, e, has_relu(e) ? ys.back().view : TensorView{},
                                     e == Epi::kAddRelu ? grs.back().view : TensorView{}, ctx);
        }
        for (std::size_t i = 1; i < ys.size(); ++i) {
          EXPECT_TRUE(ys[0].bytes() == ys[i].bytes()) << "forward, run " << i;
          EXPECT_TRUE(gxs[0].bytes() == gxs[i].bytes()) << "grad_x, run " << i;
          EXPECT_TRUE(grs[0].bytes() == grs[i].bytes()) << "grad_residual, run " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace detops
