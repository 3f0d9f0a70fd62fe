// A RoIAlignRotated problem decoded from fuzz bytes (shared by the forward and backward targets):
// options, shapes, dtypes, strides (dense, NHWC, padded, permuted, transposed), roi rows with
// moderate values and injected specials (non-finite values, fractional or out-of-range batch
// indices, negative sizes, huge boxes), and what the call must do: succeed when every row and
// option is valid, raise when a checked row is invalid, either when a row is borderline (a huge
// box whose grid may exceed the sample guard).
#pragma once

#include "fuzz_common.h"
#include "reference/roi_align_rotated_reference.h"

namespace detops {
namespace fuzz {

/// What a returned call must have done with one roi row.
struct RotatedRow {
  bool valid = false;       // the library pools it (an invalid row pools to zero, unchecked)
  bool comparable = false;  // valid, moderate, an exact grid, no sample near a discontinuity
  double delta = 0;         // bound on the library's sample position error (accumulation type)
  double v[6] = {};         // the stored values, as the library reads them
};

struct RotatedCase {
  RoiAlignRotatedOptions opt;
  RoiAlignBackwardOptions bwd;
  std::int64_t N = 1, C = 1, H = 1, W = 1, K = 0;
  DType dt = DType::kFloat32, roi_dt = DType::kFloat32;
  Tensor4 features, rois, pooled;  // features: input | grad_input; pooled: output | grad_output
  Expect expect = Expect::kSuccess;
  bool pooled_finite = true, features_finite = true;
  double pooled_maxabs = 0, features_maxabs = 0;
  std::vector<RotatedRow> rows;
};

/// The float64 reference's parameters for the case's options.
inline ref::RotatedParamsRef rotated_params(const RotatedCase& c) {
  ref::RotatedParamsRef p;
  p.PH = c.opt.pooled_height;
  p.PW = c.opt.pooled_width;
  p.spatial_scale = c.opt.spatial_scale;
  p.sampling_ratio = c.opt.sampling_ratio;
  p.aligned = c.opt.aligned;
  p.radians = c.opt.angle_unit == AngleUnit::kRadians;
  p.clockwise = c.opt.clockwise;
  return p;
}

/// Whether the float64 reference applies to a valid row, and the position error it allows.
/// The library computes the box in the accumulation type A (float below float64): every sample
/// position is within delta = 64 u (2 + m) of the exact one, m the box's largest scaled value
/// (centre, size; the angle's sine and cosine are within one rounding of A). The sampling is
/// continuous except where a sample crosses the apron's edge (y = -1 or H, x = -1 or W) and where
/// the adaptive grid ceil(size / pooled) changes; a row with a sample within delta of an edge, or
/// a size / pooled within delta of an integer, is not compared. Neither is a row whose grid the
/// sample guard may refuse, nor a large or huge one (cost, overflow).
inline void classify_rotated_row(const RotatedCase& c, RotatedRow* row) {
  const RoiAlignRotatedOptions& o = c.opt;
  const double* v = row->v;
  double m = 0;
  for (int i = 1; i < 5; ++i) m = std::max(m, std::fabs(v[i] * o.spatial_scale));
  if (m > 4096 || std::fabs(v[5]) > 1e4) return;
  const double u = c.dt == DType::kFloat64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  row->delta = 64 * u * (2 + m);
  const ref::RotatedParamsRef p = rotated_params(c);
  if (o.sampling_ratio <= 0) {
    double roi_h = v[4] * o.spatial_scale, roi_w = v[3] * o.spatial_scale;
    if (!o.aligned) roi_h = std::max(roi_h, 1.0), roi_w = std::max(roi_w, 1.0);
    const double qh = roi_h / static_cast<double>(p.PH), qw = roi_w / static_cast<double>(p.PW);
    if (std::fabs(qh - std::round(qh)) <= row->delta || std::fabs(qw - std::round(qw)) <= row->delta) return;
  }
  const std::vector<ref::RotatedSampleRef> samples = ref::rotated_samples_ref(v, p);
  if (static_cast<double>(samples.size()) > std::min(20000.0, static_cast<double>(o.max_samples_per_roi))) return;
  const double H = static_cast<double>(c.H), W = static_cast<double>(c.W);
  for (const ref::RotatedSampleRef& s : samples)
    if (std::fabs(s.y + 1) <= row->delta || std::fabs(s.y - H) <= row->delta || std::fabs(s.x + 1) <= row->delta ||
        std::fabs(s.x - W) <= row->delta)
      return;
  row->comparable = true;
}

/// Whether a stored row (values as the library reads them) is valid for the options: an integer
/// batch index in [0, N), finite values, and non-negative sizes when aligned. `huge`: a size
/// whose adaptive grid may exceed the sample guard (the outcome then depends on the grid).
inline bool rotated_row_valid(const double* v, const RotatedCase& c, bool* huge) {
  const double b = v[0];
  if (!std::isfinite(b) || b != std::trunc(b) || b < 0 || b >= static_cast<double>(c.N)) return false;
  for (int i = 1; i < 6; ++i)
    if (!std::isfinite(v[i])) return false;
  // the sign test is the library's: on the scaled size in the accumulation type (a float
  // underflows a tiny negative width to -0, which is not negative)
  const auto negative = [&](double s) {
    if (c.dt == DType::kFloat64) return s * c.opt.spatial_scale < 0;
    return static_cast<float>(s) * static_cast<float>(c.opt.spatial_scale) < 0.0f;
  };
  if (c.opt.aligned && (negative(v[3]) || negative(v[4]))) return false;
  const double m = std::max({std::fabs(v[1]), std::fabs(v[2]), std::fabs(v[3]), std::fabs(v[4])}) * c.opt.spatial_scale;
  *huge = m > 64;
  return true;
}

/// A row value: mostly moderate, sometimes special.
inline double row_value(Reader& r, double scale) { return r.one_in(12) ? special(r) : moderate(r) * scale; }

inline RotatedCase decode_rotated(Reader& r, Arena& arena, bool backward) {
  RotatedCase c;
  const DType dts[4] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  c.dt = dts[r.u8() % 4];
  c.roi_dt = r.one_in(3) ? c.dt : (r.one_in(2) ? DType::kFloat64 : DType::kFloat32);
  c.N = r.range(1, 2), c.C = r.range(0, 5), c.H = r.range(1, 9), c.W = r.range(1, 9), c.K = r.range(0, 6);
  RoiAlignRotatedOptions& o = c.opt;
  o.pooled_height = r.range(1, 3);
  o.pooled_width = r.range(1, 3);
  const double scales[4] = {1.0, 0.5, 0.25, 2.0};
  o.spatial_scale = scales[r.u8() % 4];
  o.sampling_ratio = r.range(-1, 3);
  o.angle_unit = r.one_in(3) ? AngleUnit::kRadians : AngleUnit::kDegrees;
  o.aligned = !r.one_in(4);
  o.clockwise = r.one_in(3);
  o.check_rois = !r.one_in(6);
  if (r.one_in(12)) o.max_samples_per_roi = r.range(1, 64);
  const BackwardMode modes[3] = {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact};
  c.bwd.mode = modes[r.u8() % 3];
  c.bwd.truncation = r.one_in(2) ? TruncationFormat::kFloat16 : TruncationFormat::kBFloat16;
  describe("{} {}: dtype {} rois {} N {} C {} H {} W {} K {} pooled {}x{} scale {} sampling {} {} aligned {} "
           "clockwise {} check {} max_samples {} mode {}", backward ? "backward" : "forward", "roi_align_rotated",
           dtype_name(c.dt), dtype_name(c.roi_dt), c.N, c.C, c.H, c.W, c.K, o.pooled_height, o.pooled_width,
           o.spatial_scale, o.sampling_ratio, to_string(o.angle_unit), o.aligned, o.clockwise, o.check_rois,
           o.max_samples_per_roi, to_string(c.bwd.mode));

  const std::int64_t fsizes[4] = {c.N, c.C, c.H, c.W}, psizes[4] = {c.K, c.C, o.pooled_height, o.pooled_width};
  const std::int64_t rsizes[2] = {c.K, 6};
  c.features = place(arena, make_spec(r, backward ? "grad_input" : "input", c.dt, 4, fsizes, backward, false));
  c.pooled = place(arena, make_spec(r, backward ? "grad_output" : "output", c.dt, 4, psizes, !backward, false));
  c.rois = place(arena, make_spec(r, "rois", c.roi_dt, 2, rsizes, false, false));

  // rows: batch index, centre, size, angle
  std::vector<double> rows(static_cast<std::size_t>(c.K * 6));
  for (std::int64_t k = 0; k < c.K; ++k) {
    double* v = &rows[static_cast<std::size_t>(k * 6)];
    v[0] = r.one_in(16) ? row_value(r, 1) : static_cast<double>(r.range(0, c.N - 1));
    v[1] = row_value(r, 4), v[2] = row_value(r, 4);
    v[3] = row_value(r, 2), v[4] = row_value(r, 2);
    v[5] = row_value(r, o.angle_unit == AngleUnit::kRadians ? 1 : 45);
  }
  write_values(c.rois.view, rows);
  const std::vector<double> stored = read_values(c.rois.view);
  bool any_invalid = false, any_huge = false;
  c.rows.resize(static_cast<std::size_t>(c.K));
  for (std::int64_t k = 0; k < c.K; ++k) {
    RotatedRow& row = c.rows[static_cast<std::size_t>(k)];
    std::copy(&stored[static_cast<std::size_t>(k * 6)], &stored[static_cast<std::size_t>(k * 6)] + 6, row.v);
    bool huge = false;
    row.valid = rotated_row_valid(row.v, c, &huge);
    any_invalid |= !row.valid;
    any_huge |= row.valid && huge;
    if (row.valid && !huge) classify_rotated_row(c, &row);
    describe("rois[{}] = ({}, {}, {}, {}, {}, {}){}", k, row.v[0], row.v[1], row.v[2], row.v[3], row.v[4], row.v[5],
             !row.valid ? " invalid" : row.comparable ? fmt::format(" comparable delta {:.3g}", row.delta) : "");
  }
  if (any_invalid && o.check_rois) c.expect = Expect::kError;
  // a huge box may exceed the sample guard (or the workspace limit); the guard may also be tiny
  if (c.expect != Expect::kError && (any_huge || o.max_samples_per_roi < (std::int64_t{1} << 22) ||
                                     (any_invalid && o.sampling_ratio <= 0)))
    c.expect = Expect::kEither;
  if (o.sampling_ratio > 0 &&
      o.sampling_ratio * o.sampling_ratio * o.pooled_height * o.pooled_width > o.max_samples_per_roi)
    c.expect = Expect::kError;

  // inputs: moderate values, sometimes a special
  const TensorView& in = backward ? c.pooled.view : c.features.view;
  std::vector<double> values(static_cast<std::size_t>(count(in)));
  for (double& x : values) x = r.one_in(32) ? special(r) : moderate(r);
  write_values(in, values);
  double maxabs = 0;
  bool finite = true;
  for (double x : read_values(in)) {
    finite &= std::isfinite(x);
    maxabs = std::max(maxabs, std::fabs(x));
  }
  (backward ? c.pooled_finite : c.features_finite) = finite;
  (backward ? c.pooled_maxabs : c.features_maxabs) = maxabs;
  poison(backward ? c.features.view : c.pooled.view);
  describe("expect {}", expect_name(c.expect));
  return c;
}

inline void check_rotated_error(ErrorCode code, const std::string& msg) {
  FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kOutOfMemory, "unexpected error code {} ({})",
             static_cast<int>(code), msg);
  // argument errors name the op; an allocation refused by the fuzz allocator is its own message
  FUZZ_CHECK(code == ErrorCode::kOutOfMemory || msg.rfind("roi_align_rotated_", 0) == 0,
             "message does not name the op: {}", msg);
  FUZZ_CHECK(!msg.empty(), "empty error message");
}

}  // namespace fuzz
}  // namespace detops
