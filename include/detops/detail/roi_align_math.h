// The one copy of RoIAlign's math, shared verbatim by the CPU backend, the CUDA kernels and the
// emulated-grid tests: roi validation, bin geometry, the adaptive grid, and bilinear weights.
// Everything is written so that host and device evaluate the same IEEE operations in the same
// order (the library is built with -ffp-contract=off on the host and --fmad=false on the device),
// which is what makes the exact backward mode bitwise identical across backends.
#pragma once

#include <cmath>
#include <cstdint>

#include "detops/detail/host_device.h"

namespace detops {
namespace detail {

/// Why a roi row was rejected (kOk if it was not), for both roi ops (RoIAlignRotated is RoIAlign
/// with a rotated geometry: its rows have one more value and can have a negative size).
enum class RoiStatus : std::int32_t {
  kOk = 0,
  kBatchIndexNotFinite,
  kBatchIndexNotInteger,
  kBatchIndexOutOfRange,
  kValueNotFinite,      // a coordinate: x1, y1, x2, y2 (or cx, cy, w, h, angle)
  kNegativeSize,        // rotated: w < 0 or h < 0 with `aligned` (detectron2 asserts)
  kGeometryNotFinite,   // finite values whose scaled box overflows the accumulation type
  kTooManySamples,      // adaptive grid larger than max_samples_per_roi
};

/// Scalar parameters of one RoIAlign call, as the kernels see them.
struct RoiAlignShape {
  std::int64_t N, C, H, W;   // input
  std::int64_t K, PH, PW;    // rois and pooled size
  double spatial_scale;
  std::int64_t sampling_ratio;  // <= 0: adaptive
  bool aligned;
  std::int64_t max_samples_per_roi;
};

/// Geometry of one roi in accumulation type A. batch < 0 marks an invalid row (it pools to 0).
template <class A>
struct RoiBox {
  std::int64_t batch;
  A start_h, start_w, bin_h, bin_w;
  std::int64_t grid_h, grid_w;  // >= 0; both 0 when either is
  A count;                      // avg divisor of the forward: max(grid_h * grid_w, 1)
  RoiStatus status;
};

DETOPS_HOST_DEVICE inline float ceil_(float v) { return ::ceilf(v); }
DETOPS_HOST_DEVICE inline double ceil_(double v) { return ::ceil(v); }

DETOPS_HOST_DEVICE inline bool is_finite_d(double v) { return v - v == 0.0; }

/// Checks the batch index and coordinates of a roi row (values as double, exact for every
/// supported rois dtype). `coords` are x1, y1, x2, y2.
DETOPS_HOST_DEVICE inline RoiStatus check_roi_values(double b, const double* coords, std::int64_t N) {
  if (!is_finite_d(b)) return RoiStatus::kBatchIndexNotFinite;
  const double bi = static_cast<double>(static_cast<std::int64_t>(b < -9e18 ? -9e18 : (b > 9e18 ? 9e18 : b)));
  if (bi != b) return RoiStatus::kBatchIndexNotInteger;
  if (b < 0 || b >= static_cast<double>(N)) return RoiStatus::kBatchIndexOutOfRange;
  for (int i = 0; i < 4; ++i)
    if (!is_finite_d(coords[i])) return RoiStatus::kValueNotFinite;
  return RoiStatus::kOk;
}

/// Adaptive or fixed grid along one axis. `extent` is the roi size in feature pixels; the
/// result is clamped to [0, limit + 1] before the integer conversion, so NaN or a huge box never
/// reaches an undefined conversion (the caller rejects anything above `limit`).
template <class A>
DETOPS_HOST_DEVICE inline std::int64_t grid_size(A extent, std::int64_t pooled, std::int64_t sampling_ratio,
                                                 std::int64_t limit) {
  if (sampling_ratio > 0) return sampling_ratio;
  const A g = ceil_(extent / static_cast<A>(pooled));
  if (!(g > A(0))) return 0;  // negative, zero or NaN: no samples (torchvision's loops don't run)
  if (g > static_cast<A>(limit)) return limit + 1;
  return static_cast<std::int64_t>(g);
}

/// Geometry of roi row (b, x1, y1, x2, y2); the row must have passed check_roi_values unless
/// the caller accepts an invalid box (batch = -1).
template <class A>
DETOPS_HOST_DEVICE inline RoiBox<A> make_roi_box(double b, const double* c, const RoiAlignShape& s) {
  RoiBox<A> r{};
  r.status = check_roi_values(b, c, s.N);
  r.batch = -1;
  if (r.status != RoiStatus::kOk) return r;
  const A scale = static_cast<A>(s.spatial_scale);
  const A offset = s.aligned ? A(0.5) : A(0);
  // torchvision order of operations: roi * scale - offset, in the accumulation type.
  r.start_w = static_cast<A>(c[0]) * scale - offset;
  r.start_h = static_cast<A>(c[1]) * scale - offset;
  const A end_w = static_cast<A>(c[2]) * scale - offset;
  const A end_h = static_cast<A>(c[3]) * scale - offset;
  A roi_w = end_w - r.start_w;
  A roi_h = end_h - r.start_h;
  if (!s.aligned) {  // legacy: force malformed rois to 1x1
    roi_w = roi_w > A(1) ? roi_w : A(1);
    roi_h = roi_h > A(1) ? roi_h : A(1);
  }
  r.bin_h = roi_h / static_cast<A>(s.PH);
  r.bin_w = roi_w / static_cast<A>(s.PW);
  if (!is_finite_d(static_cast<double>(r.start_w)) || !is_finite_d(static_cast<double>(r.start_h)) ||
      !is_finite_d(static_cast<double>(r.bin_w)) || !is_finite_d(static_cast<double>(r.bin_h))) {
    r.status = RoiStatus::kGeometryNotFinite;
    return r;
  }
  const std::int64_t limit = s.max_samples_per_roi;
  r.grid_h = grid_size<A>(roi_h, s.PH, s.sampling_ratio, limit);
  r.grid_w = grid_size<A>(roi_w, s.PW, s.sampling_ratio, limit);
  // A bin with no samples along one axis has none at all: zero both, so that no loop runs over
  // the other axis for nothing (an empty roi with adaptive sampling could otherwise iterate
  // up to max_samples_per_roi times per bin to produce 0). Avg then gives 0 (count is 1), max
  // gives 0 with argmax -1, and the backward scatters nothing.
  if (r.grid_h == 0 || r.grid_w == 0) r.grid_h = r.grid_w = 0;
  // In double: each grid is at most limit + 1, so the product is exact enough to compare.
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

/// Sample coordinate along one axis: start + p * bin + (i + 0.5) * bin / grid (torchvision's
/// operation order, so that float64 results match it to the last bit).
template <class A>
DETOPS_HOST_DEVICE inline A sample_coord(A start, A bin, std::int64_t p, std::int64_t i, std::int64_t grid) {
  return start + static_cast<A>(p) * bin + static_cast<A>(static_cast<double>(i) + 0.5) * bin / static_cast<A>(grid);
}

/// Bilinear sample of an H x W plane at (y, x): the four neighbours (y_low | y_high) x
/// (x_low | x_high) and their weights w1 (low, low), w2 (low, high), w3 (high, low), w4 (high,
/// high). valid == false for samples beyond the one-pixel apron (y < -1, y > H, ..., or NaN),
/// which contribute nothing; samples inside it are clamped into the map.
template <class A>
struct Bilinear {
  std::int64_t y_low, y_high, x_low, x_high;
  A w1, w2, w3, w4;
  bool valid;
};

template <class A>
DETOPS_HOST_DEVICE inline Bilinear<A> bilinear(A y, A x, std::int64_t H, std::int64_t W) {
  Bilinear<A> b{};
  // Written so NaN takes the invalid branch and never reaches the integer conversion.
  if (!(y >= A(-1) && y <= static_cast<A>(H) && x >= A(-1) && x <= static_cast<A>(W))) {
    b.valid = false;
    return b;
  }
  b.valid = true;
  if (y <= A(0)) y = A(0);
  if (x <= A(0)) x = A(0);
  b.y_low = static_cast<std::int64_t>(y);
  b.x_low = static_cast<std::int64_t>(x);
  if (b.y_low >= H - 1) {
    b.y_high = b.y_low = H - 1;
    y = static_cast<A>(b.y_low);
  } else {
    b.y_high = b.y_low + 1;
  }
  if (b.x_low >= W - 1) {
    b.x_high = b.x_low = W - 1;
    x = static_cast<A>(b.x_low);
  } else {
    b.x_high = b.x_low + 1;
  }
  const A ly = y - static_cast<A>(b.y_low);
  const A lx = x - static_cast<A>(b.x_low);
  const A hy = A(1) - ly;
  const A hx = A(1) - lx;
  b.w1 = hy * hx;
  b.w2 = hy * lx;
  b.w3 = ly * hx;
  b.w4 = ly * lx;
  return b;
}

}  // namespace detail
}  // namespace detops
