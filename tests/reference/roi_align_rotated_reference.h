// Slow, deliberately simple float64 RoIAlignRotated reference (forward and backward) for tests.
// It shares nothing with the library: plain std::vector<double> in NCHW order, one loop nest per
// formula, written from the semantics in include/detops/roi_align_rotated.h (detectron2's
// ROIAlignRotated, and mmcv's options), with the C library's sin and cos.
//
// Semantics, per output element (k, c, ph, pw) with roi row r = rois[k*6 .. k*6+5]:
//   b = (int64)r[0]                             the caller guarantees an integer in [0, N)
//   offset = aligned ? 0.5 : 0
//   cx = r[1]*scale - offset, cy = r[2]*scale - offset
//   roi_w = r[3]*scale, roi_h = r[4]*scale      (when !aligned: at least 1)
//   t = r[5] in degrees (radians: as given), negated when clockwise
//   bin_w = roi_w / PW, grid_w = sampling_ratio > 0 ? sampling_ratio : ceil(roi_w / PW) (h alike)
//   sample (iy, ix): yy = -roi_h/2 + ph*bin_h + (iy + 0.5)*bin_h/grid_h (xx alike), then
//                    y = yy*cos t - xx*sin t + cy,  x = yy*sin t + xx*cos t + cx
//   bilinear(y, x): RoIAlign's (0 beyond the one-pixel apron; clamped inside it).
//   output: sum of samples / max(grid_h*grid_w, 1). Backward: each sample inside the apron
//   scatters grad * w_i / (grid_h*grid_w) to its 4 neighbours.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace detops {
namespace ref {

struct RotatedParamsRef {
  std::int64_t PH = 7, PW = 7;
  double spatial_scale = 1.0;
  std::int64_t sampling_ratio = -1;
  bool aligned = true;
  bool radians = false;
  bool clockwise = false;
};

/// Every sample of every bin of one roi: (bin, y, x, count) in (ph, pw, iy, ix) order.
struct RotatedSampleRef {
  std::int64_t bin;
  double y, x;
  double count;
};

inline std::vector<RotatedSampleRef> rotated_samples_ref(const double* r, const RotatedParamsRef& p) {
  const double offset = p.aligned ? 0.5 : 0.0;
  const double cx = r[1] * p.spatial_scale - offset, cy = r[2] * p.spatial_scale - offset;
  double roi_w = r[3] * p.spatial_scale, roi_h = r[4] * p.spatial_scale;
  if (!p.aligned) {
    roi_w = std::max(roi_w, 1.0);
    roi_h = std::max(roi_h, 1.0);
  }
  double t = p.radians ? r[5] : r[5] * (M_PI / 180.0);
  if (p.clockwise) t = -t;
  const double ct = std::cos(t), st = std::sin(t);
  const double bin_h = roi_h / static_cast<double>(p.PH), bin_w = roi_w / static_cast<double>(p.PW);
  const std::int64_t gh = p.sampling_ratio > 0 ? p.sampling_ratio : static_cast<std::int64_t>(std::ceil(roi_h / p.PH));
  const std::int64_t gw = p.sampling_ratio > 0 ? p.sampling_ratio : static_cast<std::int64_t>(std::ceil(roi_w / p.PW));
  std::vector<RotatedSampleRef> out;
  if (gh <= 0 || gw <= 0) return out;
  for (std::int64_t ph = 0; ph < p.PH; ++ph)
    for (std::int64_t pw = 0; pw < p.PW; ++pw)
      for (std::int64_t iy = 0; iy < gh; ++iy)
        for (std::int64_t ix = 0; ix < gw; ++ix) {
          const double yy = -roi_h / 2 + ph * bin_h + (iy + 0.5) * bin_h / gh;
          const double xx = -roi_w / 2 + pw * bin_w + (ix + 0.5) * bin_w / gw;
          out.push_back({ph * p.PW + pw, yy * ct - xx * st + cy, yy * st + xx * ct + cx, static_cast<double>(gh * gw)});
        }
  return out;
}

/// RoIAlign's bilinear rule: the four (index, weight) pairs of (y, x) in an H x W plane, or none.
inline int bilinear_ref(double y, double x, std::int64_t H, std::int64_t W, std::int64_t idx[4], double w[4]) {
  if (y < -1.0 || y > H || x < -1.0 || x > W) return 0;
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  std::int64_t y0 = static_cast<std::int64_t>(y), x0 = static_cast<std::int64_t>(x), y1, x1;
  if (y0 >= H - 1) {
    y0 = y1 = H - 1;
    y = static_cast<double>(y0);
  } else {
    y1 = y0 + 1;
  }
  if (x0 >= W - 1) {
    x0 = x1 = W - 1;
    x = static_cast<double>(x0);
  } else {
    x1 = x0 + 1;
  }
  const double ly = y - y0, lx = x - x0, hy = 1 - ly, hx = 1 - lx;
  idx[0] = y0 * W + x0, idx[1] = y0 * W + x1, idx[2] = y1 * W + x0, idx[3] = y1 * W + x1;
  w[0] = hy * hx, w[1] = hy * lx, w[2] = ly * hx, w[3] = ly * lx;
  return 4;
}

inline std::vector<double> roi_align_rotated_forward_ref(const std::vector<double>& input, std::int64_t N,
                                                         std::int64_t C, std::int64_t H, std::int64_t W,
                                                         const std::vector<double>& rois, std::int64_t K,
                                                         const RotatedParamsRef& p) {
  (void)N;
  std::vector<double> out(static_cast<std::size_t>(K * C * p.PH * p.PW), 0.0);
  for (std::int64_t k = 0; k < K; ++k) {
    const double* r = &rois[static_cast<std::size_t>(k * 6)];
    const std::int64_t b = static_cast<std::int64_t>(r[0]);
    const std::vector<RotatedSampleRef> samples = rotated_samples_ref(r, p);
    for (std::int64_t c = 0; c < C; ++c) {
      const double* plane = &input[static_cast<std::size_t>((b * C + c) * H * W)];
      double* o = &out[static_cast<std::size_t>((k * C + c) * p.PH * p.PW)];
      for (const RotatedSampleRef& s : samples) {
        std::int64_t idx[4];
        double w[4];
        const int n = bilinear_ref(s.y, s.x, H, W, idx, w);
        for (int q = 0; q < n; ++q) o[s.bin] += w[q] * plane[idx[q]];
      }
      if (!samples.empty())
        for (std::int64_t bin = 0; bin < p.PH * p.PW; ++bin) o[bin] /= std::max(samples[0].count, 1.0);
    }
  }
  return out;
}

inline std::vector<double> roi_align_rotated_backward_ref(const std::vector<double>& grad, std::int64_t N,
                                                          std::int64_t C, std::int64_t H, std::int64_t W,
                                                          const std::vector<double>& rois, std::int64_t K,
                                                          const RotatedParamsRef& p) {
  std::vector<double> gi(static_cast<std::size_t>(N * C * H * W), 0.0);
  for (std::int64_t k = 0; k < K; ++k) {
    const double* r = &rois[static_cast<std::size_t>(k * 6)];
    const std::int64_t b = static_cast<std::int64_t>(r[0]);
    const std::vector<RotatedSampleRef> samples = rotated_samples_ref(r, p);
    for (std::int64_t c = 0; c < C; ++c) {
      double* plane = &gi[static_cast<std::size_t>((b * C + c) * H * W)];
      const double* g = &grad[static_cast<std::size_t>((k * C + c) * p.PH * p.PW)];
      for (const RotatedSampleRef& s : samples) {
        std::int64_t idx[4];
        double w[4];
        const int n = bilinear_ref(s.y, s.x, H, W, idx, w);
        for (int q = 0; q < n; ++q) plane[idx[q]] += g[s.bin] * w[q] / s.count;
      }
    }
  }
  return gi;
}

}  // namespace ref
}  // namespace detops
