// Slow, deliberately simple float64 RoIAlign reference (forward and backward, avg and max
// pooling) for tests. It shares nothing with the library: plain std::vector<double> in NCHW order,
// one loop nest per formula, written from the semantics in include/detops/roi_align.h. Use it to
// check the library on any input; tests/roi_align_golden_test.cpp checks it against torchvision.
//
// Semantics, per output element (k, c, ph, pw) with roi row r = rois[k*5 .. k*5+4]:
//   b = (int64)r[0]                           the caller guarantees an integer in [0, N)
//   offset = aligned ? 0.5 : 0
//   start_x = r[1]*scale - offset, start_y = r[2]*scale - offset
//   roi_w = r[3]*scale - offset - start_x     (same for h); when !aligned, roi_w = max(roi_w, 1)
//   bin_w = roi_w / PW, bin_h = roi_h / PH
//   grid_w = sampling_ratio > 0 ? sampling_ratio : ceil(roi_w / PW)    (negative grids -> 0)
//   sample (iy, ix) of the bin: y = start_y + ph*bin_h + (iy + 0.5)*bin_h/grid_h (same for x)
//   bilinear(y, x): 0, and no gradient, when y < -1 || y > H || x < -1 || x > W; otherwise y and
//   x are clamped into [0, H-1] x [0, W-1] and the four neighbours are blended.
//   avg: sum of samples / max(grid_h*grid_w, 1). Backward: each sample inside the apron scatters
//        grad * w_i / (grid_h*grid_w) to its 4 neighbours.
//   max: the largest sample, an out-of-apron sample counting as 0; argmax = iy*grid_w + ix of the
//        first maximal sample in row-major (iy, ix) order; a bin without samples gives 0 and
//        argmax -1. Backward: grad * w_i to the 4 neighbours of the argmax sample (no count), and
//        nothing when argmax is -1 or that sample lies outside the apron.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace detops {
namespace ref {

/// Geometry of one roi after scaling: start, bin size and sampling grid on each axis.
struct RoiGeometryRef {
  std::int64_t batch = 0;
  double start_y = 0, start_x = 0;
  double bin_h = 0, bin_w = 0;
  std::int64_t grid_h = 0, grid_w = 0;
};

inline RoiGeometryRef roi_geometry_ref(const double* roi, std::int64_t PH, std::int64_t PW, double spatial_scale,
                                       std::int64_t sampling_ratio, bool aligned) {
  RoiGeometryRef g;
  g.batch = static_cast<std::int64_t>(roi[0]);
  const double offset = aligned ? 0.5 : 0.0;
  g.start_x = roi[1] * spatial_scale - offset;
  g.start_y = roi[2] * spatial_scale - offset;
  const double end_x = roi[3] * spatial_scale - offset;
  const double end_y = roi[4] * spatial_scale - offset;
  double roi_w = end_x - g.start_x;
  double roi_h = end_y - g.start_y;
  if (!aligned) {
    roi_w = std::max(roi_w, 1.0);
    roi_h = std::max(roi_h, 1.0);
  }
  g.bin_h = roi_h / static_cast<double>(PH);
  g.bin_w = roi_w / static_cast<double>(PW);
  if (sampling_ratio > 0) {
    g.grid_h = sampling_ratio;
    g.grid_w = sampling_ratio;
  } else {
    g.grid_h = static_cast<std::int64_t>(std::ceil(roi_h / static_cast<double>(PH)));
    g.grid_w = static_cast<std::int64_t>(std::ceil(roi_w / static_cast<double>(PW)));
  }
  if (g.grid_h < 0) g.grid_h = 0;
  if (g.grid_w < 0) g.grid_w = 0;
  return g;
}

/// Position of sample (iy, ix) of bin (ph, pw).
inline double sample_y_ref(const RoiGeometryRef& g, std::int64_t ph, std::int64_t iy) {
  return g.start_y + static_cast<double>(ph) * g.bin_h +
         (static_cast<double>(iy) + 0.5) * g.bin_h / static_cast<double>(g.grid_h);
}
inline double sample_x_ref(const RoiGeometryRef& g, std::int64_t pw, std::int64_t ix) {
  return g.start_x + static_cast<double>(pw) * g.bin_w +
         (static_cast<double>(ix) + 0.5) * g.bin_w / static_cast<double>(g.grid_w);
}

/// The four neighbours (offsets into an H x W plane) and weights of a bilinear sample.
/// Returns false (and zero weights) when the sample lies outside the one-pixel apron.
struct BilinearRef {
  std::int64_t pos[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

inline bool bilinear_ref(std::int64_t H, std::int64_t W, double y, double x, BilinearRef* out) {
  *out = BilinearRef{};
  if (y < -1.0 || y > static_cast<double>(H) || x < -1.0 || x > static_cast<double>(W)) return false;
  if (y <= 0) y = 0;
  if (x <= 0) x = 0;
  std::int64_t y_low = static_cast<std::int64_t>(y);
  std::int64_t x_low = static_cast<std::int64_t>(x);
  std::int64_t y_high, x_high;
  if (y_low >= H - 1) {
    y_low = y_high = H - 1;
    y = static_cast<double>(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= W - 1) {
    x_low = x_high = W - 1;
    x = static_cast<double>(x_low);
  } else {
    x_high = x_low + 1;
  }
  const double ly = y - static_cast<double>(y_low);
  const double lx = x - static_cast<double>(x_low);
  const double hy = 1.0 - ly;
  const double hx = 1.0 - lx;
  out->pos[0] = y_low * W + x_low;
  out->pos[1] = y_low * W + x_high;
  out->pos[2] = y_high * W + x_low;
  out->pos[3] = y_high * W + x_high;
  out->w[0] = hy * hx;
  out->w[1] = hy * lx;
  out->w[2] = ly * hx;
  out->w[3] = ly * lx;
  return true;
}

inline double bilinear_value_ref(const double* plane, std::int64_t H, std::int64_t W, double y, double x) {
  BilinearRef b;
  if (!bilinear_ref(H, W, y, x, &b)) return 0.0;
  return b.w[0] * plane[b.pos[0]] + b.w[1] * plane[b.pos[1]] + b.w[2] * plane[b.pos[2]] +
         b.w[3] * plane[b.pos[3]];
}

/// Forward. input: N*C*H*W (NCHW); rois: K*5; out: resized to K*C*PH*PW; argmax (optional,
/// meaningful for max_pool only; -1 everywhere for avg): resized to K*C*PH*PW.
inline void roi_align_forward_ref(const std::vector<double>& input, std::int64_t N, std::int64_t C, std::int64_t H,
                                  std::int64_t W, const std::vector<double>& rois, std::int64_t K, std::int64_t PH,
                                  std::int64_t PW, double spatial_scale, std::int64_t sampling_ratio, bool aligned,
                                  bool max_pool, std::vector<double>* out, std::vector<std::int32_t>* argmax = nullptr) {
  if (static_cast<std::int64_t>(input.size()) != N * C * H * W || static_cast<std::int64_t>(rois.size()) != K * 5) {
    throw std::invalid_argument("roi_align_forward_ref: input or rois has the wrong size");
  }
  out->assign(static_cast<std::size_t>(K * C * PH * PW), 0.0);
  if (argmax != nullptr) argmax->assign(static_cast<std::size_t>(K * C * PH * PW), -1);
  for (std::int64_t k = 0; k < K; ++k) {
    const RoiGeometryRef g = roi_geometry_ref(&rois[static_cast<std::size_t>(k * 5)], PH, PW, spatial_scale,
                                              sampling_ratio, aligned);
    if (g.batch < 0 || g.batch >= N) throw std::invalid_argument("roi_align_forward_ref: batch index out of range");
    for (std::int64_t c = 0; c < C; ++c) {
      const double* plane = &input[static_cast<std::size_t>((g.batch * C + c) * H * W)];
      for (std::int64_t ph = 0; ph < PH; ++ph) {
        for (std::int64_t pw = 0; pw < PW; ++pw) {
          const std::size_t o = static_cast<std::size_t>(((k * C + c) * PH + ph) * PW + pw);
          if (!max_pool) {
            double sum = 0.0;
            for (std::int64_t iy = 0; iy < g.grid_h; ++iy) {
              for (std::int64_t ix = 0; ix < g.grid_w; ++ix) {
                sum += bilinear_value_ref(plane, H, W, sample_y_ref(g, ph, iy), sample_x_ref(g, pw, ix));
              }
            }
            const double count = static_cast<double>(std::max<std::int64_t>(g.grid_h * g.grid_w, 1));
            (*out)[o] = sum / count;
          } else {
            double best = 0.0;
            std::int32_t best_index = -1;
            for (std::int64_t iy = 0; iy < g.grid_h; ++iy) {
              for (std::int64_t ix = 0; ix < g.grid_w; ++ix) {
                const double v = bilinear_value_ref(plane, H, W, sample_y_ref(g, ph, iy), sample_x_ref(g, pw, ix));
                if (best_index < 0 || v > best) {
                  best = v;
                  best_index = static_cast<std::int32_t>(iy * g.grid_w + ix);
                }
              }
            }
            (*out)[o] = best;  // 0 when the bin had no samples
            if (argmax != nullptr) (*argmax)[o] = best_index;
          }
        }
      }
    }
  }
}

/// Backward: returns grad_input (N*C*H*W, NCHW) for grad_output (K*C*PH*PW). For max_pool,
/// `argmax` must be the forward's argmax.
inline std::vector<double> roi_align_backward_ref(const std::vector<double>& grad_output, std::int64_t N,
                                                  std::int64_t C, std::int64_t H, std::int64_t W,
                                                  const std::vector<double>& rois, std::int64_t K, std::int64_t PH,
                                                  std::int64_t PW, double spatial_scale, std::int64_t sampling_ratio,
                                                  bool aligned, bool max_pool,
                                                  const std::vector<std::int32_t>* argmax = nullptr) {
  if (static_cast<std::int64_t>(grad_output.size()) != K * C * PH * PW ||
      static_cast<std::int64_t>(rois.size()) != K * 5) {
    throw std::invalid_argument("roi_align_backward_ref: grad_output or rois has the wrong size");
  }
  if (max_pool && (argmax == nullptr || static_cast<std::int64_t>(argmax->size()) != K * C * PH * PW)) {
    throw std::invalid_argument("roi_align_backward_ref: max pooling needs the forward's argmax");
  }
  std::vector<double> grad_input(static_cast<std::size_t>(N * C * H * W), 0.0);
  for (std::int64_t k = 0; k < K; ++k) {
    const RoiGeometryRef g = roi_geometry_ref(&rois[static_cast<std::size_t>(k * 5)], PH, PW, spatial_scale,
                                              sampling_ratio, aligned);
    if (g.batch < 0 || g.batch >= N) throw std::invalid_argument("roi_align_backward_ref: batch index out of range");
    for (std::int64_t c = 0; c < C; ++c) {
      double* plane = &grad_input[static_cast<std::size_t>((g.batch * C + c) * H * W)];
      for (std::int64_t ph = 0; ph < PH; ++ph) {
        for (std::int64_t pw = 0; pw < PW; ++pw) {
          const std::size_t o = static_cast<std::size_t>(((k * C + c) * PH + ph) * PW + pw);
          const double grad = grad_output[o];
          BilinearRef b;
          if (!max_pool) {
            const double count = static_cast<double>(g.grid_h * g.grid_w);
            for (std::int64_t iy = 0; iy < g.grid_h; ++iy) {
              for (std::int64_t ix = 0; ix < g.grid_w; ++ix) {
                if (!bilinear_ref(H, W, sample_y_ref(g, ph, iy), sample_x_ref(g, pw, ix), &b)) continue;
                for (int i = 0; i < 4; ++i) plane[b.pos[i]] += grad * b.w[i] / count;
              }
            }
          } else {
            const std::int32_t a = (*argmax)[o];
            if (a < 0 || g.grid_w <= 0) continue;
            const std::int64_t iy = a / g.grid_w;
            const std::int64_t ix = a % g.grid_w;
            if (!bilinear_ref(H, W, sample_y_ref(g, ph, iy), sample_x_ref(g, pw, ix), &b)) continue;
            for (int i = 0; i < 4; ++i) plane[b.pos[i]] += grad * b.w[i];
          }
        }
      }
    }
  }
  return grad_input;
}

}  // namespace ref
}  // namespace detops
