// The one copy of RoIAlignRotated's math, shared verbatim by the CPU backend, the CUDA kernels and
// the emulated-grid tests: roi validation, the rotated box geometry, the angle's sine and cosine,
// and the rotation of a sample point. Bin geometry along each box axis (sample_coord, grid_size)
// and the bilinear weights (bilinear) are RoIAlign's (roi_align_math.h): a rotated box samples its
// own frame exactly as RoIAlign samples an axis-aligned box, then rotates each point into the map.
#pragma once

#include <cmath>
#include <cstdint>

#include "detops/detail/host_device.h"
#include "detops/detail/roi_align_math.h"

namespace detops {
namespace detail {

/// Scalar parameters of one RoIAlignRotated call: RoIAlign's, plus the angle's convention.
struct RoiAlignRotatedShape : RoiAlignShape {
  bool angle_radians;  // false: degrees (detectron2); true: radians (mmcv)
  bool clockwise;      // mmcv's option: the angle is negated
};

/// Geometry of one rotated roi in accumulation type A, in the box's own frame: a sample at
/// (yy, xx) (yy from start_h, xx from start_w, both relative to the centre) lands on the map at
///   y = yy * cos - xx * sin + center_h,   x = yy * sin + xx * cos + center_w.
/// batch < 0 marks an invalid row (it pools to 0).
template <class A>
struct RotatedBox {
  std::int64_t batch;
  A center_h, center_w;  // cy * scale - offset, cx * scale - offset
  A start_h, start_w;    // -roi_h / 2, -roi_w / 2
  A bin_h, bin_w;
  A cos_t, sin_t;
  std::int64_t grid_h, grid_w;  // >= 0; both 0 when either is
  A count;                      // avg divisor: max(grid_h * grid_w, 1)
  RoiStatus status;
};

/// The sine and cosine of an angle, in double.
struct SinCos {
  double sin, cos;
};

/// sin and cos of x for |x| <= pi/4 (and a little beyond): Taylor polynomials to x^19 and x^18
/// in Horner form (truncation error below 1e-19), written as plain multiplies and adds so that
/// host and device round each step identically.
DETOPS_HOST_DEVICE inline SinCos sincos_reduced(double x) {
  const double x2 = x * x;
  double s = -1.0 / 121645100408832000.0;  // -1/19!
  s = s * x2 + 1.0 / 355687428096000.0;    // 1/17!
  s = s * x2 - 1.0 / 1307674368000.0;      // 1/15!
  s = s * x2 + 1.0 / 6227020800.0;         // 1/13!
  s = s * x2 - 1.0 / 39916800.0;           // 1/11!
  s = s * x2 + 1.0 / 362880.0;             // 1/9!
  s = s * x2 - 1.0 / 5040.0;               // 1/7!
  s = s * x2 + 1.0 / 120.0;                // 1/5!
  s = s * x2 - 1.0 / 6.0;                  // 1/3!
  double c = -1.0 / 6402373705728000.0;    // -1/18!
  c = c * x2 + 1.0 / 20922789888000.0;     // 1/16!
  c = c * x2 - 1.0 / 87178291200.0;        // 1/14!
  c = c * x2 + 1.0 / 479001600.0;          // 1/12!
  c = c * x2 - 1.0 / 3628800.0;            // 1/10!
  c = c * x2 + 1.0 / 40320.0;              // 1/8!
  c = c * x2 - 1.0 / 720.0;                // 1/6!
  c = c * x2 + 1.0 / 24.0;                 // 1/4!
  c = c * x2 - 0.5;
  return {x + x * (x2 * s), 1.0 + x2 * c};
}

/// sin and cos of the roi angle, the same bits on every backend (the C library's and CUDA's sin
/// and cos differ in the last place). Degrees are reduced exactly: the angle modulo 360 (fmod is
/// exact) minus the nearest multiple of 90 (exact too), so multiples of 90 degrees give exactly
/// 0 and +-1. Radians are reduced by the nearest multiple of pi/2 in two parts (Cody-Waite: the
/// first part has 33 significant bits, so q * part is exact for |q| < 2^20). `clockwise`
/// negates the angle (mmcv). The angle must be finite.
DETOPS_HOST_DEVICE inline SinCos rotation_sincos(double angle, bool radians, bool clockwise) {
  if (clockwise) angle = -angle;
  double q, x;
  if (!radians) {
    const double a = ::fmod(angle, 360.0);
    q = ::floor(a / 90.0 + 0.5);
    x = (a - 90.0 * q) * (3.14159265358979323846 / 180.0);
  } else {
    constexpr double kPio2Hi = 1.57079632673412561417e+00;  // pi/2, first 33 bits
    constexpr double kPio2Lo = 6.07710050650619224932e-11;  // pi/2 - kPio2Hi
    q = ::floor(angle * (2.0 / 3.14159265358979323846) + 0.5);
    x = (angle - q * kPio2Hi) - q * kPio2Lo;
  }
  const SinCos r = sincos_reduced(x);
  double quadrant = ::fmod(q, 4.0);  // exact; in (-4, 4)
  if (quadrant < 0) quadrant += 4.0;
  switch (static_cast<int>(quadrant)) {
    case 1: return {r.cos, -r.sin};
    case 2: return {-r.sin, -r.cos};
    case 3: return {-r.cos, r.sin};
    default: return r;
  }
}

/// Checks the batch index and the five values (cx, cy, w, h, angle) of a row read as doubles.
DETOPS_HOST_DEVICE inline RoiStatus check_rotated_roi_values(double b, const double* v, std::int64_t N) {
  // RoIAlign's check covers the batch index and four values; then the angle
  const RoiStatus s = check_roi_values(b, v, N);
  if (s != RoiStatus::kOk) return s;
  return is_finite_d(v[4]) ? RoiStatus::kOk : RoiStatus::kValueNotFinite;
}

/// Geometry of roi row (b, cx, cy, w, h, angle), in detectron2's order of operations:
///   center = c * scale - offset (offset 0.5 when aligned, else 0); size = s * scale (when not
///   aligned: at least 1; when aligned a negative size is an error); bin = size / pooled;
///   start = -size / 2; grid as RoIAlign's (adaptive: ceil(size / pooled)).
template <class A>
DETOPS_HOST_DEVICE inline RotatedBox<A> make_rotated_box(double b, const double* v, const RoiAlignRotatedShape& s) {
  RotatedBox<A> r{};
  r.batch = -1;
  r.status = check_rotated_roi_values(b, v, s.N);
  if (r.status != RoiStatus::kOk) return r;
  const A scale = static_cast<A>(s.spatial_scale);
  const A offset = s.aligned ? A(0.5) : A(0);
  r.center_w = static_cast<A>(v[0]) * scale - offset;
  r.center_h = static_cast<A>(v[1]) * scale - offset;
  A roi_w = static_cast<A>(v[2]) * scale;
  A roi_h = static_cast<A>(v[3]) * scale;
  if (s.aligned) {
    if (roi_w < A(0) || roi_h < A(0)) {
      r.status = RoiStatus::kNegativeSize;
      return r;
    }
  } else {  // mmcv's legacy mode: boxes at least 1x1
    roi_w = roi_w > A(1) ? roi_w : A(1);
    roi_h = roi_h > A(1) ? roi_h : A(1);
  }
  r.bin_h = roi_h / static_cast<A>(s.PH);
  r.bin_w = roi_w / static_cast<A>(s.PW);
  r.start_h = -roi_h / A(2);
  r.start_w = -roi_w / A(2);
  const SinCos t = rotation_sincos(v[4], s.angle_radians, s.clockwise);
  r.cos_t = static_cast<A>(t.cos);
  r.sin_t = static_cast<A>(t.sin);
  if (!is_finite_d(static_cast<double>(r.center_w)) || !is_finite_d(static_cast<double>(r.center_h)) ||
      !is_finite_d(static_cast<double>(r.bin_w)) || !is_finite_d(static_cast<double>(r.bin_h))) {
    r.status = RoiStatus::kGeometryNotFinite;
    return r;
  }
  const std::int64_t limit = s.max_samples_per_roi;
  r.grid_h = grid_size<A>(roi_h, s.PH, s.sampling_ratio, limit);
  r.grid_w = grid_size<A>(roi_w, s.PW, s.sampling_ratio, limit);
  if (r.grid_h == 0 || r.grid_w == 0) r.grid_h = r.grid_w = 0;  // as RoIAlign: no loop for nothing
  if (static_cast<double>(r.grid_h) * static_cast<double>(r.grid_w) * static_cast<double>(s.PH) *
          static_cast<double>(s.PW) > static_cast<double>(limit)) {
    r.status = RoiStatus::kTooManySamples;
    return r;
  }
  const std::int64_t g = r.grid_h * r.grid_w;
  r.count = static_cast<A>(g > 1 ? g : 1);
  r.batch = static_cast<std::int64_t>(b);
  return r;
}

/// A sample's position on the map.
template <class A>
struct MapPoint {
  A y, x;
};

/// Sample (iy, ix) of bin (ph, pw): RoIAlign's sample_coord in the box frame, then rotated about
/// the centre and translated, as detectron2: ((yy * cos) - (xx * sin)) + center_h and
/// ((yy * sin) + (xx * cos)) + center_w.
template <class A>
DETOPS_HOST_DEVICE inline MapPoint<A> rotated_sample(const RotatedBox<A>& box, std::int64_t ph, std::int64_t pw,
                                                     std::int64_t iy, std::int64_t ix) {
  const A yy = sample_coord(box.start_h, box.bin_h, ph, iy, box.grid_h);
  const A xx = sample_coord(box.start_w, box.bin_w, pw, ix, box.grid_w);
  return {yy * box.cos_t - xx * box.sin_t + box.center_h, yy * box.sin_t + xx * box.cos_t + box.center_w};
}

}  // namespace detail
}  // namespace detops
