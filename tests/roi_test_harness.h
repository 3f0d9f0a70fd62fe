// The roi pooling ops as two geometries of one test harness (issue 28): RoIAlign pools
// axis-aligned boxes, RoIAlignRotated rotated ones; options, checks, backward modes, plan and
// backend table are one. A contract both ops keep is written once over a geometry G (a struct
// below) and runs for both, as typed tests (TYPED_TEST_SUITE(..., RoiGeometries, RoiNames)) or
// as value-parameterised ones over RoiParam (roi_cases<G>(grid), one instantiation per op):
//   tests/roi_test.cpp            CPU: float64 references, determinism, workspaces, bad input
//   tests/roi_emulated_test.cpp   the CUDA steps on the emulated device against the CPU backend
//   tests/roi_gradcheck_test.cpp  the backward against finite differences
//   tests/roi_cuda_test.cpp       CUDA against the CPU (label gpu)
// A geometry says how to call its op (public API; the validated call, the CPU backend and the
// CUDA steps on a device; the kernel bodies; the float64 reference) and makes its rois. The
// op-specific tests stay in tests/roi_align{,_rotated}_test.cpp, _golden_ and _exact_bits_.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "detops/detail/roi_align_kernels.h"
#include "detops/detail/roi_align_rotated_kernels.h"
#include "detops/roi_align.h"
#include "detops/roi_align_rotated.h"
#include "internal/roi_align_backend.h"
#include "internal/roi_align_device.h"
#include "internal/roi_align_rotated_backend.h"
#include "internal/roi_align_rotated_device.h"
#include "internal/roi_front_end.h"
#include "reference/roi_align_reference.h"
#include "reference/roi_align_rotated_reference.h"
#include "test_util.h"

namespace detops {
namespace test {

/// The op of a value-parameterised case (with_geometry turns it into its geometry).
enum class RoiOp { kRoiAlign, kRoiAlignRotated };

/// Tolerances against the float64 reference that the geometries share; float32's are their own.
inline double roi_forward_tolerance(DType dt, double float32) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return float32;
    case DType::kFloat16: return 2e-3;
    default: return 1.6e-2;
  }
}
inline double roi_backward_tolerance(DType dt, BackwardMode mode, double float32) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return float32;
    case DType::kFloat16: return mode == BackwardMode::kAtomic ? 1.5e-2 : 2e-3;
    default: return mode == BackwardMode::kAtomic ? 8e-2 : 1.6e-2;
  }
}

/// RoIAlign: rows (batch_index, x1, y1, x2, y2); average or max pooling (argmax).
struct AxisAlignedRois {
  static constexpr RoiOp kOp = RoiOp::kRoiAlign;
  static constexpr const char* kName = "RoiAlign";
  static constexpr const char* kForward = "roi_align_forward";
  static constexpr const char* kBackward = "roi_align_backward";
  static constexpr int kColumns = 5;
  static constexpr bool kMaxPooling = true;
  static constexpr const internal::RoiGeometry& kGeometry = internal::kAxisAlignedRois;
  /// Three valid rows for two 8 x 8 images (the bad-input matrix).
  static constexpr double kSmallRois[15] = {0, 1, 1, 5, 5, 1, 0, 0, 7, 7, 0, 2, 2, 3, 6};
  static constexpr double kFloat32Forward = 2e-6, kFloat32Backward = 5e-6;  // against the reference
  using Options = RoiAlignOptions;
  using Shape = detail::RoiAlignShape;
  using Call = internal::RoiAlignCall;

  static Options options(std::int64_t PH, std::int64_t PW, double scale, std::int64_t sr, bool aligned,
                         PoolMode pool) {
    Options o;
    o.pooled_height = PH, o.pooled_width = PW, o.spatial_scale = scale, o.sampling_ratio = sr, o.aligned = aligned;
    o.pool_mode = pool;
    return o;
  }
  static bool max_pool(const Options& o) { return o.pool_mode == PoolMode::kMax; }

  static void forward(const TensorView& input, const TensorView& rois, const TensorView& output, const Options& o,
                      const Context& ctx = {}, const TensorView& argmax = {}) {
    roi_align_forward(input, rois, output, o, ctx, argmax);
  }
  static void backward(const TensorView& go, const TensorView& rois, const TensorView& gi, const Options& o,
                       const RoiAlignBackwardOptions& b, const Context& ctx = {}, const TensorView& argmax = {},
                       Workspace ws = {}) {
    roi_align_backward(go, rois, gi, o, b, ctx, argmax, ws);
  }
  static std::size_t workspace_size(const TensorView& go, const TensorView& rois, const TensorView& gi,
                                    const Options& o, const RoiAlignBackwardOptions& b, const Context& ctx = {}) {
    return roi_align_backward_workspace_size(go, rois, gi, o, b, ctx);
  }

  /// K random boxes over an image of img_h x img_w, some overlapping, some partly outside.
  static std::vector<double> random_rois(std::int64_t K, std::int64_t N, double img_h, double img_w,
                                         std::uint64_t seed, double min_size, double max_size) {
    return test::random_rois(K, N, img_h, img_w, seed, min_size, max_size);
  }
  /// Rows 0-2 of r: a box beyond the apron, a zero-size box, a box covering the whole map.
  static void edge_rows(std::vector<double>& r, std::int64_t /*N*/, double img_h, double img_w) {
    const double edge[3][4] = {{-20, -20, -6, -4}, {7, 9, 7, 9}, {-3, -3, img_w + 6, img_h + 4}};
    for (int i = 0; i < 3; ++i) std::copy(edge[i], edge[i] + 4, &r[static_cast<std::size_t>(i * 5 + 1)]);
  }
  /// Makes `row` a box that an aligned roi check rejects for its size: none (any finite box is one).
  static bool invalid_size(double* /*row*/) { return false; }
  /// Makes `row` a box of about `size` x `size` pixels (so that adaptive sampling needs a huge grid).
  static void huge(double* row, double size) { row[1] = -500, row[2] = -500, row[3] = size - 500, row[4] = size - 500; }

  // The validated call of the front end, the CPU backend, and the CUDA steps on a device.
  static Shape shape(const TensorView& features, std::int64_t K, const Options& o) {
    return internal::pooling_shape(features, K, o);
  }
  static Call call(const TensorView& features, const TensorView& rois, const TensorView& pooled,
                   const TensorView& argmax, const Options& o) {
    const bool max = max_pool(o);
    return {"emulated", features, rois, pooled, max ? argmax : TensorView{}, shape(features, rois.sizes[0], o), max};
  }
  static const internal::RoiAlignBackend& cpu_backend() { return internal::kRoiAlignCpu; }
  template <class Dev>
  static internal::RoiCheck check_rois_on(const Dev& dev, const Call& c, bool need_total) {
    return internal::roi_align_check_rois_on(dev, c, need_total);
  }
  template <class T, class Dev>
  static void forward_on(const Dev& dev, const Call& c) {
    internal::roi_align_forward_on<T>(dev, c);
  }
  /// plan_roi_align_backward over the steps on `dev`, as the front end plans over its backend's.
  template <class Dev>
  static internal::RoiBackwardPlan plan_on(const Dev& dev, const Call& c, const RoiAlignBackwardOptions& b) {
    return internal::plan_roi_align_backward(
        c, b, internal::roi_backward_enumerates(c.features.dtype, b.mode),
        [&](bool need_total) { return check_rois_on(dev, c, need_total); },
        [&](const internal::RoiBackwardPlan& p) { return internal::roi_align_backward_workspace_on(dev, c, p); });
  }
  template <class Dev>
  static void backward_on(const Dev& dev, const Call& c, const internal::RoiBackwardPlan& plan, Workspace ws) {
    internal::roi_align_backward_on(dev, c, plan, ws);
  }
  /// The check kernel's body (no per-image sums: RoIAlign has no chunks of images) and the count's.
  template <class A, class Bad, class AddImage>
  static void check_element(std::int64_t k, const detail::RoiSource& r, const Shape& s, std::int64_t* counts,
                            Bad&& bad, AddImage&& /*add_image*/) {
    detail::roi_align_check_element<A>(k, r, s, counts, bad);
  }
  template <class A>
  static void count_element(std::int64_t k, const detail::RoiSource& r, const Shape& s, std::int64_t* counts) {
    detail::roi_align_count_element<A>(k, r, s, counts);
  }

  /// The float64 reference on NCHW-ordered values (argmax: max pooling's, out or in).
  static std::vector<double> reference_forward(const std::vector<double>& input, std::int64_t N, std::int64_t C,
                                               std::int64_t H, std::int64_t W, const std::vector<double>& rois,
                                               const Options& o, std::vector<std::int32_t>* argmax = nullptr) {
    std::vector<double> out;
    std::vector<std::int32_t> am;
    ref::roi_align_forward_ref(input, N, C, H, W, rois, static_cast<std::int64_t>(rois.size() / kColumns),
                               o.pooled_height, o.pooled_width, o.spatial_scale, o.sampling_ratio, o.aligned,
                               max_pool(o), &out, argmax ? argmax : &am);
    return out;
  }
  static std::vector<double> reference_backward(const std::vector<double>& grad, std::int64_t N, std::int64_t C,
                                                std::int64_t H, std::int64_t W, const std::vector<double>& rois,
                                                const Options& o, const std::vector<std::int32_t>* argmax = nullptr) {
    return ref::roi_align_backward_ref(grad, N, C, H, W, rois, static_cast<std::int64_t>(rois.size() / kColumns),
                                       o.pooled_height, o.pooled_width, o.spatial_scale, o.sampling_ratio, o.aligned,
                                       max_pool(o), argmax);
  }
};

/// RoIAlignRotated: rows (batch_index, cx, cy, w, h, angle); average pooling only.
struct RotatedRois {
  static constexpr RoiOp kOp = RoiOp::kRoiAlignRotated;
  static constexpr const char* kName = "RoiAlignRotated";
  static constexpr const char* kForward = "roi_align_rotated_forward";
  static constexpr const char* kBackward = "roi_align_rotated_backward";
  static constexpr int kColumns = 6;
  static constexpr bool kMaxPooling = false;
  static constexpr const internal::RoiGeometry& kGeometry = internal::kRotatedRois;
  static constexpr double kSmallRois[18] = {0, 3, 3, 4, 4, 10, 1, 4, 4, 7, 7, -30, 0, 2, 5, 3, 6, 45};
  static constexpr double kFloat32Forward = 4e-6, kFloat32Backward = 8e-6;
  using Options = RoiAlignRotatedOptions;
  using Shape = detail::RoiAlignRotatedShape;
  using Call = internal::RoiAlignRotatedCall;

  static Options options(std::int64_t PH, std::int64_t PW, double scale, std::int64_t sr, bool aligned,
                         PoolMode /*avg*/) {
    Options o;
    o.pooled_height = PH, o.pooled_width = PW, o.spatial_scale = scale, o.sampling_ratio = sr, o.aligned = aligned;
    return o;
  }
  static bool max_pool(const Options&) { return false; }

  static void forward(const TensorView& input, const TensorView& rois, const TensorView& output, const Options& o,
                      const Context& ctx = {}, const TensorView& /*argmax: none*/ = {}) {
    roi_align_rotated_forward(input, rois, output, o, ctx);
  }
  static void backward(const TensorView& go, const TensorView& rois, const TensorView& gi, const Options& o,
                       const RoiAlignBackwardOptions& b, const Context& ctx = {}, const TensorView& /*argmax*/ = {},
                       Workspace ws = {}) {
    roi_align_rotated_backward(go, rois, gi, o, b, ctx, ws);
  }
  static std::size_t workspace_size(const TensorView& go, const TensorView& rois, const TensorView& gi,
                                    const Options& o, const RoiAlignBackwardOptions& b, const Context& ctx = {}) {
    return roi_align_rotated_backward_workspace_size(go, rois, gi, o, b, ctx);
  }

  /// K random boxes (angles in degrees) centred over an image of img_h x img_w, some partly outside.
  static std::vector<double> random_rois(std::int64_t K, std::int64_t N, double img_h, double img_w,
                                         std::uint64_t seed, double min_size, double max_size) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<double> r(static_cast<std::size_t>(K * 6));
    for (std::int64_t k = 0; k < K; ++k) {
      double* row = &r[static_cast<std::size_t>(k * 6)];
      row[0] = static_cast<double>(static_cast<std::int64_t>(u(rng) * N) % N);
      row[1] = -0.1 * img_w + 1.2 * img_w * u(rng);
      row[2] = -0.1 * img_h + 1.2 * img_h * u(rng);
      row[3] = min_size + (max_size - min_size) * u(rng);
      row[4] = min_size + (max_size - min_size) * u(rng);
      row[5] = -180.0 + 360.0 * u(rng);
    }
    return r;
  }
  static void edge_rows(std::vector<double>& r, std::int64_t N, double img_h, double img_w) {
    const double edge[3][6] = {{0, -30, -30, 6, 4, 10},                                         // beyond the apron
                               {0, 7, 9, 0, 0, 33},                                             // zero size
                               {N - 1.0, img_w / 2, img_h / 2, 2 * img_w, 2 * img_h, 90}};  // covers the map
    for (int i = 0; i < 3; ++i) std::copy(edge[i], edge[i] + 6, &r[static_cast<std::size_t>(i * 6)]);
  }
  /// A negative width: aligned boxes are not clamped, the check rejects it.
  static bool invalid_size(double* row) {
    row[3] = -1;
    return true;
  }
  static void huge(double* row, double size) { row[3] = row[4] = size; }

  static Shape shape(const TensorView& features, std::int64_t K, const Options& o) {
    Shape s{};
    static_cast<detail::RoiAlignShape&>(s) = internal::pooling_shape(features, K, o);
    s.angle_radians = o.angle_unit == AngleUnit::kRadians;
    s.clockwise = o.clockwise;
    return s;
  }
  static Call call(const TensorView& features, const TensorView& rois, const TensorView& pooled,
                   const TensorView& /*argmax*/, const Options& o) {
    return {"emulated", features, rois, pooled, shape(features, rois.sizes[0], o)};
  }
  static const internal::RoiAlignRotatedBackend& cpu_backend() { return internal::kRoiAlignRotatedCpu; }
  template <class Dev>
  static internal::RoiCheck check_rois_on(const Dev& dev, const Call& c, bool need_total) {
    return internal::rotated_check_rois_on(dev, c, need_total);
  }
  template <class T, class Dev>
  static void forward_on(const Dev& dev, const Call& c) {
    internal::rotated_forward_on<T>(dev, c);
  }
  template <class Dev>
  static internal::RoiBackwardPlan plan_on(const Dev& dev, const Call& c, const RoiAlignBackwardOptions& b) {
    return internal::plan_rotated_backward(
        c, b, internal::roi_backward_enumerates(c.features.dtype, b.mode),
        [&](bool need_total) { return check_rois_on(dev, c, need_total); },
        [&](const internal::RoiBackwardPlan& p) { return internal::rotated_backward_workspace_on(dev, c, p); });
  }
  template <class Dev>
  static void backward_on(const Dev& dev, const Call& c, const internal::RoiBackwardPlan& plan, Workspace ws) {
    internal::rotated_backward_on(dev, c, plan, ws);
  }
  /// The check kernel's body, with the per-image sums that size the exact mode's chunks.
  template <class A, class Bad, class AddImage>
  static void check_element(std::int64_t k, const detail::RoiSource& r, const Shape& s, std::int64_t* counts,
                            Bad&& bad, AddImage&& add_image) {
    detail::roi_align_rotated_check_element<A>(k, r, s, counts, bad, add_image);
  }
  template <class A>
  static void count_element(std::int64_t k, const detail::RoiSource& r, const Shape& s, std::int64_t* counts) {
    detail::roi_align_rotated_count_element<A>(k, r, s, detail::ImageRange{0, s.N}, counts);
  }

  static ref::RotatedParamsRef params(const Options& o) {
    ref::RotatedParamsRef r;
    r.PH = o.pooled_height, r.PW = o.pooled_width, r.spatial_scale = o.spatial_scale;
    r.sampling_ratio = o.sampling_ratio, r.aligned = o.aligned;
    r.radians = o.angle_unit == AngleUnit::kRadians, r.clockwise = o.clockwise;
    return r;
  }
  static std::vector<double> reference_forward(const std::vector<double>& input, std::int64_t N, std::int64_t C,
                                               std::int64_t H, std::int64_t W, const std::vector<double>& rois,
                                               const Options& o, std::vector<std::int32_t>* /*argmax*/ = nullptr) {
    return ref::roi_align_rotated_forward_ref(input, N, C, H, W, rois, static_cast<std::int64_t>(rois.size() / 6),
                                              params(o));
  }
  static std::vector<double> reference_backward(const std::vector<double>& grad, std::int64_t N, std::int64_t C,
                                                std::int64_t H, std::int64_t W, const std::vector<double>& rois,
                                                const Options& o, const std::vector<std::int32_t>* = nullptr) {
    return ref::roi_align_rotated_backward_ref(grad, N, C, H, W, rois, static_cast<std::int64_t>(rois.size() / 6),
                                               params(o));
  }
};

using RoiGeometries = ::testing::Types<AxisAlignedRois, RotatedRois>;

/// Typed tests named by their op: Suite/RoiAlign.Test, Suite/RoiAlignRotated.Test.
struct RoiNames {
  template <class G>
  static std::string GetName(int) {
    return G::kName;
  }
};

/// f(G{}) for the op's geometry.
template <class F>
decltype(auto) with_geometry(RoiOp op, F&& f) {
  if (op == RoiOp::kRoiAlign) return f(AxisAlignedRois{});
  return f(RotatedRois{});
}

/// The pool modes of G (max pooling only where G has it).
template <class G>
std::vector<PoolMode> pool_modes() {
  if (G::kMaxPooling) return {PoolMode::kAvg, PoolMode::kMax};
  return {PoolMode::kAvg};
}

/// The random rois of G with its edge rows first (when K >= 3).
template <class G>
std::vector<double> rois_with_edges(std::int64_t K, std::int64_t N, double img_h, double img_w, std::uint64_t seed,
                                    double min_size, double max_size) {
  std::vector<double> r = G::random_rois(K, N, img_h, img_w, seed, min_size, max_size);
  if (K >= 3) G::edge_rows(r, N, img_h, img_w);
  return r;
}

/// The first `rows` rows of G::kSmallRois (valid rows for two 8 x 8 images) as float32 rois.
template <class G>
Tensor small_rois(std::int64_t rows) {
  const std::vector<double> r(G::kSmallRois, G::kSmallRois + rows * G::kColumns);
  return make_tensor({rows, G::kColumns}, DType::kFloat32, r);
}

/// Sets rois[row, col] of a float32 rois tensor of G.
template <class G>
void set_roi(Tensor& rois, int row, int col, double v) {
  rois.data<float>()[row * G::kColumns + col] = static_cast<float>(v);
}

// ---------------------------------------------------------------------------------------------
// Value-parameterised grids: one case per op and combination.

/// One case of a grid; the dimensions a grid does not list keep these defaults.
struct RoiParam {
  RoiOp op = RoiOp::kRoiAlign;
  DType dt = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  BackwardMode mode = BackwardMode::kExact;
  PoolMode pool = PoolMode::kAvg;
  std::int64_t sr = 2;
  bool aligned = true;
  std::string name;  // the listed dimensions' values: the test's name suffix
};
inline void PrintTo(const RoiParam& p, std::ostream* os) { *os << p.name; }
inline std::string roi_param_name(const ::testing::TestParamInfo<RoiParam>& i) { return i.param.name; }

/// The dimensions of a grid (an empty list: not a dimension).
struct RoiGrid {
  std::vector<DType> dtypes;
  std::vector<Layout> layouts;
  std::vector<BackwardMode> modes;
  std::vector<PoolMode> pools;  // max pooling only where G pools by max
  std::vector<bool> aligned;
  std::vector<std::int64_t> srs;
};

/// The values grids list most.
inline const std::vector<DType> kRoiDtypes{DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
inline const std::vector<Layout> kRoiLayouts{Layout::kNCHW, Layout::kNHWC};
inline const std::vector<BackwardMode> kRoiModes{BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact};
inline const std::vector<PoolMode> kRoiPools{PoolMode::kAvg, PoolMode::kMax};

/// Every combination of the grid's values for geometry G.
template <class G>
std::vector<RoiParam> roi_cases(const RoiGrid& g) {
  std::vector<RoiParam> cases(1);
  cases[0].op = G::kOp;
  // every case so far times each value of a dimension; set() names the case, or drops it (false)
  auto expand = [&](const auto& values, auto set) {
    if (values.empty()) return;
    std::vector<RoiParam> next;
    for (const RoiParam& c : cases)
      for (const auto& v : values) {
        RoiParam p = c;
        if (set(p, v)) next.push_back(p);
      }
    cases = std::move(next);
  };
  auto add = [](RoiParam& p, const std::string& part) { p.name += (p.name.empty() ? "" : "_") + part; };
  expand(g.dtypes, [&](RoiParam& p, DType v) {
    p.dt = v;
    add(p, std::string(dtype_name(v)));
    return true;
  });
  expand(g.layouts, [&](RoiParam& p, Layout v) {
    p.layout = v;
    add(p, v == Layout::kNHWC ? "nhwc" : "nchw");
    return true;
  });
  expand(g.modes, [&](RoiParam& p, BackwardMode v) {
    p.mode = v;
    add(p, to_string(v));
    return true;
  });
  expand(g.pools, [&](RoiParam& p, PoolMode v) {
    if (!G::kMaxPooling) return v == PoolMode::kAvg;  // one case, not named
    p.pool = v;
    add(p, to_string(v));
    return true;
  });
  expand(g.aligned, [&](RoiParam& p, bool v) {
    p.aligned = v;
    add(p, v ? "aligned" : "legacy");
    return true;
  });
  expand(g.srs, [&](RoiParam& p, std::int64_t v) {
    p.sr = v;
    add(p, v > 0 ? "sr" + std::to_string(v) : "adaptive");
    return true;
  });
  return cases;
}

/// Instantiates the value-parameterised `suite` over `grid` (a RoiGrid) for both ops: test names
/// RoiAlign/<suite>.<test>/<values> and RoiAlignRotated/<suite>.<test>/<values>.
#define DETOPS_ROI_INSTANTIATE(suite, grid)                                                                          \
  INSTANTIATE_TEST_SUITE_P(RoiAlign, suite,                                                                          \
                           ::testing::ValuesIn(::detops::test::roi_cases<::detops::test::AxisAlignedRois>(grid)), \
                           ::detops::test::roi_param_name);                                                          \
  INSTANTIATE_TEST_SUITE_P(RoiAlignRotated, suite,                                                                   \
                           ::testing::ValuesIn(::detops::test::roi_cases<::detops::test::RotatedRois>(grid)),     \
                           ::detops::test::roi_param_name)

// ---------------------------------------------------------------------------------------------
// Problems

/// A problem as NCHW-ordered doubles: the float64 reference's and the finite differences' input.
template <class G>
struct Problem {
  std::int64_t N = 2, C = 5, H = 13, W = 17, K = 12;
  typename G::Options opt;
  std::vector<double> input, rois, grad;
};

/// 12 rois (G's edge rows first) pooled 3 x 4 at scale 1/2 from two 13 x 17 maps.
template <class G>
Problem<G> make_problem(std::int64_t sr, bool aligned, PoolMode pool, std::uint64_t seed) {
  Problem<G> p;
  p.opt = G::options(3, 4, 0.5, sr, aligned, pool);
  p.input = random_values(static_cast<std::size_t>(p.N * p.C * p.H * p.W), seed, -2.0, 2.0);
  p.rois = rois_with_edges<G>(p.K, p.N, p.H / 0.5, p.W / 0.5, seed + 1, 1.0, 20.0);
  p.grad = random_values(static_cast<std::size_t>(p.K * p.C * 12), seed + 2, -1.0, 1.0);
  return p;
}

/// Values as the library sees them after storing in dtype (so the reference sees the same input).
inline std::vector<double> rounded(const std::vector<double>& v, DType dt) {
  return to_vector(make_tensor({static_cast<std::int64_t>(v.size())}, dt, v));
}

/// Runs forward and backward on p (2 threads; a poisoned output and grad_input) and checks both
/// against G's float64 reference; the reference's backward takes the forward's argmax and, in the
/// truncated mode, the gradients rounded to float16 as the library rounds them.
template <class G>
void check_against_reference(const Problem<G>& p, DType dt, Layout layout, BackwardMode mode) {
  const std::int64_t PH = p.opt.pooled_height, PW = p.opt.pooled_width;
  const bool max = G::max_pool(p.opt);
  Tensor input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input, layout);
  Tensor rois = make_tensor({p.K, G::kColumns}, dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32, p.rois);
  Tensor output = Tensor::empty({p.K, p.C, PH, PW}, dt, Device::cpu(), layout);
  Tensor argmax;
  if (max) argmax = Tensor::empty({p.K, p.C, PH, PW}, DType::kInt32, Device::cpu(), layout);
  output.fill_bytes(0xCD);
  Context ctx;
  ctx.num_threads = 2;
  G::forward(input, rois, output, p.opt, ctx, argmax);
  const std::vector<double> rois_used = to_vector(rois);
  const std::vector<double> ref_out = G::reference_forward(rounded(p.input, dt), p.N, p.C, p.H, p.W, rois_used, p.opt);
  EXPECT_LE(max_rel_error(to_vector(output), ref_out), roi_forward_tolerance(dt, G::kFloat32Forward));

  Tensor grad_output = make_tensor({p.K, p.C, PH, PW}, dt, p.grad, layout);
  std::vector<double> g = to_vector(grad_output);
  if (mode == BackwardMode::kTruncated)
    for (double& x : g) x = static_cast<float>(from_double<Half>(x));
  std::vector<std::int32_t> am;
  if (max) {
    const std::vector<double> a = to_vector(argmax);
    am.assign(a.begin(), a.end());
  }
  const std::vector<double> ref_grad =
      G::reference_backward(g, p.N, p.C, p.H, p.W, rois_used, p.opt, max ? &am : nullptr);
  Tensor grad_input = Tensor::empty({p.N, p.C, p.H, p.W}, dt, Device::cpu(), layout);
  grad_input.fill_bytes(0xCD);  // fully overwritten, including untouched positions
  RoiAlignBackwardOptions b;
  b.mode = mode;
  G::backward(grad_output, rois, grad_input, p.opt, b, ctx, argmax);
  EXPECT_LE(max_rel_error(to_vector(grad_input), ref_grad), roi_backward_tolerance(dt, mode, G::kFloat32Backward));
}

/// A problem as tensors (argmax: the forward's, with max pooling).
template <class G>
struct Workload {
  using Geometry = G;
  Tensor input, rois, grad_output, argmax;
  typename G::Options opt;
  std::int64_t N() const { return input.size(0); }
  std::int64_t C() const { return input.size(1); }
  std::int64_t H() const { return input.size(2); }
  std::int64_t W() const { return input.size(3); }
  std::int64_t K() const { return rois.size(0); }
};

/// The sizes of a workload: K rois of min_size to max_size pixels (G's edge rows first, unless
/// not `edge_rows`) on N maps of C x H x W at `scale`, pooled PH x PW; inputs, rois and gradients
/// from seed, seed + 1, seed + 2.
struct WorkloadSize {
  std::int64_t N, C, H, W, K, PH, PW;
  double scale, min_size, max_size;
  std::uint64_t seed;
  double grad_range;  // grad_output in [-grad_range, grad_range]
  bool edge_rows = true;
};

template <class G>
Workload<G> make_workload(const WorkloadSize& z, DType dt, Layout layout, PoolMode pool, std::int64_t sr,
                          bool aligned = true) {
  Workload<G> w;
  w.opt = G::options(z.PH, z.PW, z.scale, sr, aligned, pool);
  const auto n = static_cast<std::size_t>(z.N * z.C * z.H * z.W);
  w.input = make_tensor({z.N, z.C, z.H, z.W}, dt, random_values(n, z.seed), layout);
  const double img_h = static_cast<double>(z.H) / z.scale, img_w = static_cast<double>(z.W) / z.scale;
  w.rois = make_tensor({z.K, G::kColumns}, DType::kFloat32,
                       z.edge_rows ? rois_with_edges<G>(z.K, z.N, img_h, img_w, z.seed + 1, z.min_size, z.max_size)
                                   : G::random_rois(z.K, z.N, img_h, img_w, z.seed + 1, z.min_size, z.max_size));
  w.grad_output = make_tensor({z.K, z.C, z.PH, z.PW}, dt,
                              random_values(static_cast<std::size_t>(z.K * z.C * z.PH * z.PW), z.seed + 2,
                                            -z.grad_range, z.grad_range),
                              layout);
  if (G::max_pool(w.opt)) {
    w.argmax = Tensor::empty({z.K, z.C, z.PH, z.PW}, DType::kInt32, Device::cpu(), layout);
    Tensor out = Tensor::empty({z.K, z.C, z.PH, z.PW}, dt, Device::cpu(), layout);
    G::forward(w.input, w.rois, out, w.opt, {}, w.argmax);
  }
  return w;
}

/// The determinism and workspace tests' problem: RoIAlign's at detection scale (clustered,
/// heavily overlapping boxes: many contributions per position); RoIAlignRotated's smaller (every
/// mode of it is costlier per sample), with more channels than threads, not a multiple of any
/// vector width.
template <class G>
Workload<G> detection_workload(DType dt, Layout layout, PoolMode pool, std::int64_t sr) {
  constexpr WorkloadSize kAxisAligned{2, 16, 50, 68, 160, 7, 7, 0.25, 8.0, 120.0, 7, 1e-3};
  constexpr WorkloadSize kRotated{2, 19, 13, 17, 40, 3, 4, 0.5, 1.0, 24.0, 41, 1.0};
  return make_workload<G>(G::kOp == RoiOp::kRoiAlign ? kAxisAligned : kRotated, dt, layout, pool, sr);
}

/// The backward of w into a new grad_input of `layout` with `threads` threads.
template <class G>
Tensor run_backward(const Workload<G>& w, BackwardMode mode, int threads, Layout layout, DType dt) {
  Tensor gi = Tensor::empty({w.N(), w.C(), w.H(), w.W()}, dt, Device::cpu(), layout);
  Context ctx;
  ctx.num_threads = threads;
  RoiAlignBackwardOptions b;
  b.mode = mode;
  G::backward(w.grad_output, w.rois, gi, w.opt, b, ctx, w.argmax);
  return gi;
}

}  // namespace test
}  // namespace detops
