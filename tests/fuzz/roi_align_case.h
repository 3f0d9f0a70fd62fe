// A RoIAlign problem decoded from fuzz bytes (shared by the forward and backward targets):
// options, shapes, dtypes, strides, memory placement, roi rows and values, with what the call
// must do (succeed, raise, or either) and, per roi row, whether the float64 reference applies.
#pragma once

#include "fuzz_common.h"
#include "reference/roi_align_reference.h"

namespace detops {
namespace fuzz {

/// Former gaps of the library, now closed (see README.md in this directory); false would make the
/// fuzzer tolerate them again. RoIAlign rejects an output that shares memory with an input (or
/// output with argmax): such a call must raise kInvalidArgument before writing anything.
constexpr bool kRoiAlignRejectsCrossOverlap = true;
/// roi_align_backward rounds a caller Workspace's base up to 256 bytes (the queried size includes
/// the slack): pointers 4 bytes off are tried too, and the call must then work as any other.
constexpr bool kWorkspaceAlignmentHandled = true;

enum class RowStatus { kValid, kInvalid, kMaybe };

struct RoiRow {
  double v[5] = {};
  RowStatus status = RowStatus::kValid;
  ErrorCode code = ErrorCode::kInvalidArgument;  // when kInvalid
  bool comparable = false;                       // valid, moderate, away from discontinuities
  double delta = 0;                              // bound on the library's sample position error
  std::int64_t grid_h = 0, grid_w = 0;           // when comparable
  double samples_upper = 0;                      // upper bound of the samples the library takes
  double samples_lower = 0;                      // lower bound (rows the library accepts)
};

struct RoiAlignCase {
  bool backward = false;
  RoiAlignOptions opt;
  RoiAlignBackwardOptions bwd;
  std::int64_t N = 1, C = 1, H = 1, W = 1, K = 0;
  DType dt = DType::kFloat32, roi_dt = DType::kFloat32;
  Tensor4 features, rois, pooled, argmax;  // features: input | grad_input; pooled: output | grad_output
  bool has_argmax = false;
  Expect expect = Expect::kSuccess;
  bool cross_overlap = false;  // an output shares bytes with another tensor (a known gap)
  bool features_finite = true, pooled_finite = true;
  double features_maxabs = 0, pooled_maxabs = 0;
  std::vector<RoiRow> rows;
  double work = 0;  // samples x channels the call would compute
};

inline const char* pool_name(PoolMode p) { return p == PoolMode::kMax ? "max" : "avg"; }

/// Classifies a stored roi row (values as the library reads them).
inline RoiRow classify_row(const double* v, const RoiAlignCase& c) {
  RoiRow row;
  std::copy(v, v + 5, row.v);
  const RoiAlignOptions& o = c.opt;
  const double b = v[0];
  if (!std::isfinite(b) || b != std::trunc(b) || b < 0 || b >= static_cast<double>(c.N)) {
    row.status = RowStatus::kInvalid;
    return row;
  }
  for (int i = 1; i < 5; ++i)
    if (!std::isfinite(v[i])) {
      row.status = RowStatus::kInvalid;
      return row;
    }
  const bool f64 = c.dt == DType::kFloat64;
  const double offset = o.aligned ? 0.5 : 0.0;
  double m = 0, raw = 0;
  for (int i = 1; i < 5; ++i) m = std::max(m, std::fabs(v[i] * o.spatial_scale)), raw = std::max(raw, std::fabs(v[i]));
  // the scaled box may overflow the accumulation type; so may a value itself, which the library
  // converts to that type before scaling it (a float64 row of 3.5e38 is inf in float)
  if (m > (f64 ? 1e300 : 1e30) || !std::isfinite(m) || (!f64 && raw > 3e38)) {
    row.status = RowStatus::kMaybe;
    row.samples_upper = static_cast<double>(o.max_samples_per_roi);
    return row;
  }
  double roi_w = (v[3] * o.spatial_scale - offset) - (v[1] * o.spatial_scale - offset);
  double roi_h = (v[4] * o.spatial_scale - offset) - (v[2] * o.spatial_scale - offset);
  if (!o.aligned) roi_w = std::max(roi_w, 1.0), roi_h = std::max(roi_h, 1.0);
  const double PH = static_cast<double>(o.pooled_height), PW = static_cast<double>(o.pooled_width);
  // The library computes the adaptive grid in the accumulation type: within one of ours unless
  // exact (float64), and `near` says whether roi/pooled is close to an integer.
  const double slack = f64 ? 0.0 : 1.0;
  double gh, gw, lo_h, lo_w, hi_h, hi_w;
  bool near_grid = false;
  if (o.sampling_ratio > 0) {
    gh = gw = lo_h = lo_w = hi_h = hi_w = static_cast<double>(o.sampling_ratio);
  } else {
    const double qh = roi_h / PH, qw = roi_w / PW;
    gh = qh > 0 ? std::ceil(qh) : 0;
    gw = qw > 0 ? std::ceil(qw) : 0;
    lo_h = std::max(gh - slack, 0.0), hi_h = gh + slack;
    lo_w = std::max(gw - slack, 0.0), hi_w = gw + slack;
    const double tol = 64 * std::ldexp(1.0, -24) * (2 + m);
    near_grid = !f64 && (std::fabs(qh - std::round(qh)) <= tol || std::fabs(qw - std::round(qw)) <= tol);
  }
  const double limit = static_cast<double>(o.max_samples_per_roi);
  const double lower = lo_h * lo_w * PH * PW, upper = hi_h * hi_w * PH * PW;
  row.samples_upper = std::min(upper, limit);
  row.samples_lower = lower;
  if (lower > limit) {
    row.status = RowStatus::kInvalid;
    row.code = ErrorCode::kOutOfMemory;
    return row;
  }
  if (upper > limit) {
    row.status = RowStatus::kMaybe;
    return row;
  }
  // Comparable: moderate, a small exact grid, no sample near the apron's edge (the only
  // discontinuity of the sampling) by more than the position error of the accumulation type.
  if (m > 4096 || near_grid || gh * gw * PH * PW > 20000) return row;
  row.delta = f64 ? 0.0 : 64 * std::ldexp(1.0, -24) * (2 + m);
  const ref::RoiGeometryRef g = ref::roi_geometry_ref(v, o.pooled_height, o.pooled_width, o.spatial_scale,
                                                      o.sampling_ratio, o.aligned);
  if (!f64) {
    for (std::int64_t ph = 0; ph < o.pooled_height; ++ph)
      for (std::int64_t iy = 0; iy < g.grid_h; ++iy) {
        const double y = ref::sample_y_ref(g, ph, iy);
        if (std::fabs(y + 1) <= row.delta || std::fabs(y - static_cast<double>(c.H)) <= row.delta) return row;
      }
    for (std::int64_t pw = 0; pw < o.pooled_width; ++pw)
      for (std::int64_t ix = 0; ix < g.grid_w; ++ix) {
        const double x = ref::sample_x_ref(g, pw, ix);
        if (std::fabs(x + 1) <= row.delta || std::fabs(x - static_cast<double>(c.W)) <= row.delta) return row;
      }
  }
  row.comparable = true;
  row.grid_h = g.grid_h;
  row.grid_w = g.grid_w;
  return row;
}

/// Decodes options, shapes, dtypes, strides, placement and values; writes inputs, poisons
/// outputs. `arena` receives every buffer.
inline RoiAlignCase decode_roi_align(Reader& r, Arena& arena, bool backward) {
  RoiAlignCase c;
  c.backward = backward;
  Expect& e = c.expect;
  RoiAlignOptions& o = c.opt;

  // Options.
  o.pooled_height = 1 + r.range(0, 3);
  o.pooled_width = 1 + r.range(0, 3);
  if (r.one_in(24)) o.pooled_height = o.pooled_width = 7;
  if (r.one_in(48)) {
    static const std::int64_t bad[] = {0, -1, -(std::int64_t{1} << 40)};
    (r.one_in(2) ? o.pooled_height : o.pooled_width) = bad[r.u8() % 3];
    expect_error(&e);
  }
  static const double scales[] = {1.0, 0.5, 0.25, 2.0, 0.125, 1.0 / 3.0, 0.0625, 1.0};
  o.spatial_scale = scales[r.u8() % 8];
  if (r.one_in(16)) o.spatial_scale = (1 + r.u8()) / 64.0;
  if (r.one_in(48)) {
    static const double huge_or_tiny[] = {1e30, 1e-320, 3e38, 1e-30};
    o.spatial_scale = huge_or_tiny[r.u8() % 4];  // valid: boxes may overflow or collapse
  }
  if (r.one_in(48)) {
    static const double bad[] = {0.0, -0.5, std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                 -0.0};
    o.spatial_scale = bad[r.u8() % 6];
    expect_error(&e);
  }
  static const std::int64_t ratios[] = {-1, 0, 1, 2, 3, 2, -7, 4};
  o.sampling_ratio = ratios[r.u8() % 8];
  if (r.one_in(48)) o.sampling_ratio = std::int64_t{1} << r.range(5, 40);
  const bool guard_off = r.one_in(24);  // the sample guard at its maximum: sizes must not overflow
  if (guard_off && r.one_in(3)) o.sampling_ratio = (std::int64_t{1} << r.range(18, 33)) + r.range(-1, 1);
  o.aligned = r.u8() & 1;
  o.pool_mode = r.one_in(3) ? PoolMode::kMax : PoolMode::kAvg;
  if (r.one_in(64)) o.pool_mode = static_cast<PoolMode>(2 + r.u8() % 200);  // unknown: treated as?
  static const std::int64_t limits[] = {std::int64_t{1} << 22, std::int64_t{1} << 22, 4096, 256, 16, 1, 65536,
                                        std::int64_t{1} << 22};
  o.max_samples_per_roi = limits[r.u8() % 8];
  if (guard_off) {
    // The largest guard the library takes is 2^40 (products of it stay below 2^63); above it is
    // an error.
    static const std::int64_t raised[] = {std::int64_t{1} << 40, std::int64_t{1} << 40, (std::int64_t{1} << 40) + 1,
                                          std::numeric_limits<std::int64_t>::max()};
    o.max_samples_per_roi = raised[r.u8() % 4];
    if (o.max_samples_per_roi > (std::int64_t{1} << 40)) expect_error(&e);
  }
  if (r.one_in(48)) {
    o.max_samples_per_roi = r.one_in(2) ? 0 : -1;
    expect_error(&e);
  }
  if (o.sampling_ratio > 0) {
    const double per_roi = static_cast<double>(o.sampling_ratio) * static_cast<double>(o.sampling_ratio) *
                           static_cast<double>(o.pooled_height) * static_cast<double>(o.pooled_width);
    if (o.pooled_height > 0 && o.pooled_width > 0 && per_roi > static_cast<double>(o.max_samples_per_roi))
      expect_error(&e);
  }
  o.check_rois = !r.one_in(6);
  if (backward) {
    static const BackwardMode modes[] = {BackwardMode::kExact, BackwardMode::kAtomic, BackwardMode::kTruncated};
    c.bwd.mode = modes[r.u8() % 3];
    c.bwd.truncation = r.one_in(3) ? TruncationFormat::kBFloat16 : TruncationFormat::kFloat16;
    if (r.one_in(64)) {
      c.bwd.mode = static_cast<BackwardMode>(3 + r.u8() % 200);
      expect_error(&e);
    }
    if (r.one_in(64)) {
      c.bwd.truncation = static_cast<TruncationFormat>(2 + r.u8() % 200);
      expect_error(&e);
    }
  }
  const bool max_pool = o.pool_mode == PoolMode::kMax;
  const bool unknown_pool = o.pool_mode != PoolMode::kMax && o.pool_mode != PoolMode::kAvg;
  if (unknown_pool) expect_maybe(&e);  // undocumented; anything but a crash

  // Shapes and dtypes.
  c.N = 1 + r.range(0, 2);
  if (r.one_in(12)) c.N = 0;
  c.C = 1 + r.range(0, 3);
  if (r.one_in(12)) c.C = 0;
  if (r.one_in(16)) c.C = 15 + r.range(0, 3);  // NCHW channel groups of 16 plus a remainder
  c.H = 1 + r.range(0, 7);
  c.W = 1 + r.range(0, 7);
  if (r.one_in(16)) c.H = 9 + r.range(0, 24);
  if (r.one_in(16)) c.W = 9 + r.range(0, 24);
  if (r.one_in(24)) (r.one_in(2) ? c.H : c.W) = 0;
  c.K = r.range(0, 4);
  if (r.one_in(10)) c.K = 5 + r.range(0, 4);
  static const DType floats[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  c.dt = floats[r.u8() % 4];
  bool bad_dtype = false;
  if (r.one_in(64)) {
    c.dt = DType::kInt32;
    bad_dtype = true;
    expect_error(&e);
  } else if (r.one_in(128)) {
    c.dt = static_cast<DType>(5 + r.u8() % 200);  // not a DType at all
    bad_dtype = true;
    expect_unknown_dtype(&e);
  }
  switch (r.u8() % 4) {
    case 0:
    case 1: c.roi_dt = c.dt; break;
    case 2: c.roi_dt = DType::kFloat32; break;
    default: c.roi_dt = DType::kFloat64; break;
  }
  if (r.one_in(32)) {
    c.roi_dt = (c.dt == DType::kFloat16) ? DType::kBFloat16 : r.one_in(2) ? DType::kInt32 : DType::kFloat16;
    if (c.roi_dt != c.dt) expect_error(&e);
  }
  if (!is_float_dtype(c.roi_dt) && !bad_dtype) expect_error(&e);
  if (c.K > 0 && c.C > 0 && (c.H == 0 || c.W == 0)) expect_error(&e);

  // Tensors.
  const std::int64_t fsizes[4] = {c.N, c.C, c.H, c.W};
  const std::int64_t psizes[4] = {c.K, c.C, o.pooled_height, o.pooled_width};
  Spec fs = make_spec(r, backward ? "grad_input" : "input", c.dt, 4, fsizes, backward);
  if (r.one_in(64)) {  // rank 3 or 5
    fs.rank = r.one_in(2) ? 3 : 5;
    fs.sizes[4] = 1, fs.strides[4] = 1;
    expect_error(&e);
  }
  std::int64_t rsizes[2] = {c.K, 5};
  Spec rs;
  {
    rs.name = "rois";
    rs.dtype = c.roi_dt;
    rs.rank = 2;
    rs.sizes[0] = c.K, rs.sizes[1] = 5;
    switch (r.u8() % 8) {
      case 0: rs.form = Form::kTransposed, rs.strides[0] = 1, rs.strides[1] = std::max<std::int64_t>(c.K, 1); break;
      case 1: rs.form = Form::kPadded, rs.strides[0] = 5 + r.range(1, 4), rs.strides[1] = 1; break;
      case 2: rs.form = Form::kPadded, rs.strides[0] = 10, rs.strides[1] = 2; break;
      case 3:
        if (r.one_in(4)) {
          rs.form = Form::kBroadcast, rs.strides[0] = 0, rs.strides[1] = 1;  // every row the same
          break;
        }
        [[fallthrough]];
      default: rs.form = Form::kDense, rs.strides[0] = 5, rs.strides[1] = 1; break;
    }
    if (r.one_in(64)) {
      rs.form = Form::kNegative;
      rs.strides[r.u8() % 2] *= -1;
      if (rs.strides[0] < 0 || rs.strides[1] < 0) expect_error(&e);
    }
    if (r.one_in(64)) {
      rs.sizes[1] = r.one_in(2) ? 4 : 6;
      expect_error(&e);
    } else if (r.one_in(64)) {
      rs.rank = r.one_in(2) ? 1 : 3;
      rs.sizes[rs.rank - 1] = 5, rs.strides[rs.rank - 1] = 1;
      if (rs.rank == 3) rs.sizes[0] = c.K, rs.sizes[1] = 1, rs.strides[0] = 5, rs.strides[1] = 5;
      expect_error(&e);
    }
  }
  (void)rsizes;
  Spec ps = make_spec(r, backward ? "grad_output" : "output", c.dt, 4, psizes, !backward);
  if (r.one_in(64)) {
    ps.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    ps.dtype = c.dt == DType::kFloat32 ? DType::kFloat64 : DType::kFloat32;
    expect_error(&e);
  }
  c.has_argmax = max_pool || unknown_pool;
  if (r.one_in(48)) {
    c.has_argmax = !c.has_argmax;
    if (!unknown_pool) expect_error(&e);
  }
  Spec as = make_spec(r, "argmax", DType::kInt32, 4, psizes, !backward);
  if (c.has_argmax && r.one_in(64)) {
    as.dtype = DType::kFloat32;
    if (!unknown_pool) expect_error(&e);
  }
  if (c.has_argmax && r.one_in(64)) {
    as.sizes[r.u8() % 4] += 1;
    if (!unknown_pool) expect_error(&e);
  }

  // Placement: own buffers, sometimes misaligned by an element; rarely an output inside another
  // tensor's buffer (overlapping it, or not).
  const std::int64_t mis = r.one_in(8) ? 1 : 0;
  c.features = place(arena, fs, mis);
  c.rois = place(arena, rs, r.one_in(8) ? 1 : 0);
  c.pooled = place(arena, ps, mis);
  if (c.has_argmax) c.argmax = place(arena, as, 0);
  if (r.one_in(12)) {
    // Put one output inside the buffer of another tensor at a decoded offset (replacing its own).
    Tensor4* outs[2] = {backward ? &c.features : &c.pooled, (!backward && c.has_argmax) ? &c.argmax : nullptr};
    Tensor4* out = outs[r.u8() % 2];
    if (!out) out = outs[0];
    std::vector<Tensor4*> hosts = {&c.features, &c.rois, &c.pooled};
    if (c.has_argmax) hosts.push_back(&c.argmax);
    Tensor4* host = hosts[r.u8() % hosts.size()];
    const Spec& spec = out == &c.features ? fs : out == &c.pooled ? ps : as;
    Tensor4 moved;
    if (host != out && place_inside(arena, *host, spec, r.range(0, 64) * 2, &moved)) {
      *out = moved;
      if (spans_intersect(out->view, host->view)) c.cross_overlap = true;
    }
  }
  // Outputs may not have overlapping elements (the library's conservative test).
  for (const Tensor4* t : {&c.features, &c.pooled, &c.argmax}) {
    if (!t->output || !t->view.defined()) continue;
    if (self_overlapping_conservative(t->view)) expect_error(&e);
  }
  for (const Tensor4* t : {&c.features, &c.rois, &c.pooled, &c.argmax}) {
    if (!t->view.defined()) continue;
    for (int d = 0; d < t->view.rank; ++d)
      if (t->view.strides[d] < 0) expect_error(&e);
  }

  // Devices and null pointers.
  if (r.one_in(64)) {
    Tensor4* ts[4] = {&c.features, &c.rois, &c.pooled, &c.argmax};
    Tensor4* t = ts[r.u8() % 4];
    if (t->view.defined()) {
      if (r.one_in(2)) {
        t->view.device = Device::cuda(r.one_in(2) ? 0 : -1);
      } else if (count(t->view) > 0) {
        t->view.data = nullptr;
      } else {
        t->view.device = Device::cuda(0);
      }
      expect_error(&e);
    }
  }

  // Values.
  auto gen_values = [&](Tensor4& t, bool* finite, double* maxabs) {
    if (!t.view.defined() || t.view.data == nullptr || !t.view.device.is_cpu()) return;
    const bool specials = r.one_in(8);
    std::vector<double> v(static_cast<std::size_t>(std::max<std::int64_t>(count(t.view), 0)));
    for (double& x : v) x = specials && r.one_in(3) ? special(r) : moderate(r);
    write_values(t.view, v);
    (void)finite;
    (void)maxabs;
  };
  if (backward) {
    gen_values(c.pooled, nullptr, nullptr);
    if (c.has_argmax && c.argmax.view.data && c.argmax.view.device.is_cpu() && count(c.argmax.view) > 0) {
      // argmax: -1, in range, just out of range, or garbage; the grid is only known later, so
      // values are small non-negative numbers or specials.
      std::vector<double> v(static_cast<std::size_t>(count(c.argmax.view)));
      for (double& x : v) {
        const int m = r.u8() % 16;
        x = m == 0 ? -1 : m == 1 ? (r.one_in(2) ? -2147483648.0 : 2147483647.0) : static_cast<double>(r.range(0, 40));
      }
      write_values(c.argmax.view, v);
    }
  } else {
    gen_values(c.features, nullptr, nullptr);
  }
  // Roi rows: a valid batch index or a bad one; moderate boxes, huge boxes, or specials.
  std::vector<double> roi_values(static_cast<std::size_t>(std::max<std::int64_t>(count(c.rois.view), 0)));
  const std::int64_t cols = c.rois.view.rank == 2 ? c.rois.view.sizes[1] : 5;
  for (std::size_t i = 0; i < roi_values.size(); i += static_cast<std::size_t>(std::max<std::int64_t>(cols, 1))) {
    double row[5];
    if (r.one_in(10)) {
      const double n = static_cast<double>(c.N);
      const double bad[] = {0.5, -1, n, n + 0.5, std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                            1e19, -1e19, 9007199254740992.0, -0.0, 2147483648.0, 1e-300, n - 0.25};
      row[0] = bad[r.u8() % (sizeof(bad) / sizeof(bad[0]))];
    } else {
      row[0] = static_cast<double>(c.N > 0 ? r.range(0, c.N - 1) : 0);
    }
    const int mode = r.u8() % 16;
    const double s = o.spatial_scale > 0 && std::isfinite(o.spatial_scale) ? o.spatial_scale : 1.0;
    for (int a = 0; a < 2; ++a) {  // a = 0: x, 1: y
      const std::int64_t extent = a == 0 ? c.W : c.H;
      double lo, hi;
      if (mode == 0) {
        lo = r.one_in(2) ? special(r) : moderate(r);
        hi = r.one_in(2) ? special(r) : moderate(r);
      } else if (mode == 1) {
        lo = static_cast<double>(r.range(-2000, 2000)) / s;
        hi = lo + static_cast<double>(r.range(-100, 1 << 20)) / s;
      } else {
        const double f = static_cast<double>(r.range(-24, 8 * extent + 24)) / 8.0;
        const double w = static_cast<double>(r.range(-8, 8 * extent + 16)) / 8.0;
        lo = f / s;
        hi = (f + w) / s;
      }
      row[1 + a] = lo;
      row[3 + a] = hi;
    }
    for (std::int64_t j = 0; j < cols && i + static_cast<std::size_t>(j) < roi_values.size(); ++j)
      roi_values[i + static_cast<std::size_t>(j)] = j < 5 ? row[j] : 0.0;
  }
  if (c.rois.view.data && c.rois.view.device.is_cpu()) write_values(c.rois.view, roi_values);

  // Outputs poisoned last (an output inside another tensor's buffer overwrites it: the values
  // are read back from memory below, so the reference sees what the library sees).
  for (Tensor4* t : {&c.features, &c.pooled, &c.argmax})
    if (t->output && t->view.data && t->view.device.is_cpu()) poison(t->view);

  // Read back what the library will see and classify the rows.
  const bool rois_readable = c.rois.view.data && c.rois.view.device.is_cpu() && c.rois.view.rank == 2 &&
                             c.rois.view.sizes[1] == 5 && is_float_dtype(c.rois.view.dtype);
  if (rois_readable && c.N >= 0 && e != Expect::kError) {
    const std::vector<double> rv = read_values(c.rois.view);
    for (std::int64_t k = 0; k < c.K; ++k) {
      RoiRow row = classify_row(&rv[static_cast<std::size_t>(k * 5)], c);
      if (row.status == RowStatus::kInvalid && o.check_rois) {
        expect_error(&e);
      } else if (row.status == RowStatus::kMaybe && o.check_rois) {
        expect_maybe(&e);
      }
      if (row.status != RowStatus::kInvalid) c.work += row.samples_upper * static_cast<double>(std::max<std::int64_t>(c.C, 1));
      c.rows.push_back(row);
    }
  }
  auto scan = [](const Tensor4& t, bool* finite, double* maxabs) {
    if (!t.view.data || !t.view.device.is_cpu() || !is_float_dtype(t.view.dtype)) return;
    for (double x : read_values(t.view)) {
      if (!std::isfinite(x)) *finite = false;
      else *maxabs = std::max(*maxabs, std::fabs(x));
    }
  };
  if (!backward) scan(c.features, &c.features_finite, &c.features_maxabs);
  else scan(c.pooled, &c.pooled_finite, &c.pooled_maxabs);
  if (c.cross_overlap) {
    if (kRoiAlignRejectsCrossOverlap) expect_error(&e);
    else expect_maybe(&e);
  }
  // With the sample guard raised, a call needing more than 2^40 samples may be refused (its sizes
  // would overflow 64 bits soon after); it must never overflow silently.
  if (guard_off) {
    double total = 0;
    for (const RoiRow& row : c.rows)
      if (row.status != RowStatus::kInvalid) total += row.samples_upper;
    if (total > std::ldexp(1.0, 40)) expect_maybe(&e);
  }

  describe("op roi_align_{} N={} C={} H={} W={} K={} dtype={} rois dtype={}", backward ? "backward" : "forward",
           c.N, c.C, c.H, c.W, c.K, is_float_dtype(c.dt) || c.dt == DType::kInt32 ? dtype_name(c.dt) : "unknown",
           is_float_dtype(c.roi_dt) || c.roi_dt == DType::kInt32 ? dtype_name(c.roi_dt) : "unknown");
  describe("options pooled {}x{} scale {} sampling {} aligned {} pool {} max_samples {} check_rois {}", o.pooled_height,
           o.pooled_width, o.spatial_scale, o.sampling_ratio, o.aligned, static_cast<int>(o.pool_mode),
           o.max_samples_per_roi, o.check_rois);
  if (backward)
    describe("backward mode {} truncation {}", static_cast<int>(c.bwd.mode), static_cast<int>(c.bwd.truncation));
  for (const Tensor4* t : {&c.features, &c.rois, &c.pooled, &c.argmax})
    if (t->view.defined()) describe("  {} (buffer {}): {}", t->name, t->buffer, describe_view(t->view));
  for (std::size_t k = 0; k < c.rows.size(); ++k) {
    const RoiRow& row = c.rows[k];
    describe("  rois[{}] = ({}, {}, {}, {}, {}) {}{}", k, row.v[0], row.v[1], row.v[2], row.v[3], row.v[4],
             row.status == RowStatus::kValid ? "valid" : row.status == RowStatus::kInvalid ? "invalid" : "maybe",
             row.comparable ? fmt::format(" comparable grid {}x{} delta {:.3g}", row.grid_h, row.grid_w, row.delta) : "");
  }
  describe("expect {}{}", expect_name(e), c.cross_overlap ? " (an output overlaps another tensor)" : "");
  note_expect(e, false, c.cross_overlap);
  return c;
}

/// The error code a failed call may carry.
inline void check_error_code(ErrorCode code, const std::string& msg, const FuzzAllocator& alloc) {
  FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kOutOfMemory || code == ErrorCode::kNotCompiled,
             "unexpected error code {} ({})", static_cast<int>(code), msg);
  FUZZ_CHECK(!msg.empty(), "empty error message");
  (void)alloc;
}

}  // namespace fuzz
}  // namespace detops
