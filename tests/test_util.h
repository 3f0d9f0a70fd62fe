// Test helpers: tensors from and to std::vector<double> in any dtype and layout, byte hashes for
// bitwise comparisons, and seeded random problems shaped like detection workloads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "detops/detops.h"

namespace detops {
namespace test {

/// Writes NCHW-ordered values into t (any strides), converting to t's dtype (RNE).
inline void fill_from(const TensorView& w, const std::vector<double>& v) {
  std::int64_t sizes[kMaxRank] = {1, 1, 1, 1, 1, 1}, strides[kMaxRank] = {0, 0, 0, 0, 0, 0};
  const int off = kMaxRank - w.rank;
  for (int d = 0; d < w.rank; ++d) {
    sizes[off + d] = w.sizes[d];
    strides[off + d] = w.strides[d];
  }
  std::int64_t lin = 0;
  std::int64_t idx[kMaxRank] = {};
  const std::int64_t n = w.numel();
  for (lin = 0; lin < n; ++lin) {
    std::int64_t rem = lin, o = 0;
    for (int d = kMaxRank - 1; d >= 0; --d) {
      idx[d] = rem % sizes[d];
      rem /= sizes[d];
      o += idx[d] * strides[d];
    }
    const double x = v[static_cast<std::size_t>(lin)];
    switch (w.dtype) {
      case DType::kFloat32: static_cast<float*>(w.data)[o] = static_cast<float>(x); break;
      case DType::kFloat64: static_cast<double*>(w.data)[o] = x; break;
      case DType::kFloat16: static_cast<Half*>(w.data)[o] = from_double<Half>(x); break;
      case DType::kBFloat16: static_cast<BFloat16*>(w.data)[o] = from_double<BFloat16>(x); break;
      case DType::kInt32: static_cast<std::int32_t*>(w.data)[o] = static_cast<std::int32_t>(x); break;
      case DType::kInt64: static_cast<std::int64_t*>(w.data)[o] = static_cast<std::int64_t>(x); break;
    }
  }
}

/// Reads t (any strides, CPU) back as NCHW-ordered doubles.
inline std::vector<double> to_vector(const TensorView& w) {
  std::int64_t sizes[kMaxRank] = {1, 1, 1, 1, 1, 1}, strides[kMaxRank] = {0, 0, 0, 0, 0, 0};
  const int off = kMaxRank - w.rank;
  for (int d = 0; d < w.rank; ++d) {
    sizes[off + d] = w.sizes[d];
    strides[off + d] = w.strides[d];
  }
  const std::int64_t n = w.numel();
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t lin = 0; lin < n; ++lin) {
    std::int64_t rem = lin, o = 0;
    for (int d = kMaxRank - 1; d >= 0; --d) {
      o += (rem % sizes[d]) * strides[d];
      rem /= sizes[d];
    }
    double x = 0;
    switch (w.dtype) {
      case DType::kFloat32: x = static_cast<const float*>(w.data)[o]; break;
      case DType::kFloat64: x = static_cast<const double*>(w.data)[o]; break;
      case DType::kFloat16: x = static_cast<float>(static_cast<const Half*>(w.data)[o]); break;
      case DType::kBFloat16: x = static_cast<float>(static_cast<const BFloat16*>(w.data)[o]); break;
      case DType::kInt32: x = static_cast<const std::int32_t*>(w.data)[o]; break;
      case DType::kInt64: x = static_cast<double>(static_cast<const std::int64_t*>(w.data)[o]); break;
    }
    v[static_cast<std::size_t>(lin)] = x;
  }
  return v;
}

inline Tensor make_tensor(std::initializer_list<std::int64_t> sizes, DType dt, const std::vector<double>& v,
                          Layout layout = Layout::kNCHW) {
  Tensor t = Tensor::empty(sizes, dt, Device::cpu(), layout);
  fill_from(t, v);
  return t;
}

/// FNV-1a over a tensor's bytes (dense tensors from Tensor::empty).
inline std::uint64_t hash_bytes(const Tensor& t) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(t.view().data);
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.view().data, b.view().data, a.nbytes()) == 0;
}

inline std::vector<double> random_values(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

/// K random rois over an image of (H/scale) x (W/scale), some overlapping, some partly outside.
inline std::vector<double> random_rois(std::int64_t K, std::int64_t N, double img_h, double img_w, std::uint64_t seed,
                                       double min_size = 2.0, double max_size = 0.0) {
  std::mt19937_64 rng(seed);
  if (max_size <= 0) max_size = 0.6 * std::min(img_h, img_w);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> r(static_cast<std::size_t>(K * 5));
  for (std::int64_t k = 0; k < K; ++k) {
    const double w = min_size + u(rng) * (max_size - min_size), h = min_size + u(rng) * (max_size - min_size);
    const double x1 = -0.1 * img_w + u(rng) * (1.1 * img_w - w * 0.5), y1 = -0.1 * img_h + u(rng) * (1.1 * img_h - h * 0.5);
    r[k * 5 + 0] = static_cast<double>(static_cast<std::int64_t>(u(rng) * N) % N);
    r[k * 5 + 1] = x1;
    r[k * 5 + 2] = y1;
    r[k * 5 + 3] = x1 + w;
    r[k * 5 + 4] = y1 + h;
  }
  return r;
}

/// Relative max error |a - b| / max(1, max |b|).
inline double max_rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 1.0, e = 0.0;
  for (double x : b) m = std::max(m, std::abs(x));
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e / m;
}

/// Largest |x| (0 for an empty vector).
inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

/// Relative max error |a - b| / max |b|: measured against the reference's own magnitude (no floor
/// of 1, unlike max_rel_error, so gradients of 0.04 are not judged on an absolute scale). Infinity
/// when b is all zeros and a is not; 0 when both are.
inline double max_error_to_peak(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  const double m = max_abs(b);
  if (m == 0.0) return e == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return e / m;
}

/// Bit-level differences between two equally long vectors of values of dtype `dt` (each exactly
/// representable in it): how many elements differ, and the largest distance between two of them
/// in units in the last place of `dt` (adjacent representable values are 1 apart; +0 and -0 are 0).
struct UlpDiff {
  std::int64_t differing = 0;
  std::int64_t max_ulps = 0;
};
inline std::int64_t ordered_bits(double x, DType dt) {
  std::int64_t bits = 0, sign = 0;
  switch (dt) {
    case DType::kFloat64: {
      std::uint64_t u;
      std::memcpy(&u, &x, 8);
      sign = static_cast<std::int64_t>(u >> 63);
      bits = static_cast<std::int64_t>(u & 0x7fffffffffffffffull);
      break;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const std::uint16_t u = dt == DType::kFloat16 ? from_double<Half>(x).bits : from_double<BFloat16>(x).bits;
      sign = u >> 15;
      bits = u & 0x7fff;
      break;
    }
    default: {
      const float f = static_cast<float>(x);
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      sign = u >> 31;
      bits = u & 0x7fffffff;
      break;
    }
  }
  return sign ? -bits : bits;
}
inline UlpDiff ulp_diff(const std::vector<double>& a, const std::vector<double>& b, DType dt) {
  UlpDiff d;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) == 0) continue;
    ++d.differing;
    const std::int64_t u = ordered_bits(a[i], dt) - ordered_bits(b[i], dt);
    d.max_ulps = std::max(d.max_ulps, u < 0 ? -u : u);
  }
  return d;
}

/// The sizes of a 4-d NCHW-indexed problem.
struct Shape {
  std::int64_t N, C, H, W;
};

/// Where a [N, C, H, W] view sits in its storage: in a dense NCHW (or, channels_last, NHWC)
/// buffer of [N, c_step * C, H, W + w_pad], the first W columns of every c_step-th channel,
/// starting `offset` elements in. The defaults give a dense NCHW tensor.
struct Placement {
  bool channels_last = false;
  std::int64_t w_pad = 0, c_step = 1, offset = 0;
};

/// A 4-d view into a 1-d storage poisoned with 0xCD, on the CPU or a device: the bytes between
/// and around the view's elements (gaps a kernel must not write) are kept, so whole storages can
/// be compared byte for byte. The per-op test headers name the placements of their layouts.
struct StridedBuf {
  Tensor storage;
  TensorView view;

  /// The storage holds the buffer of `p`, `p.offset` elements before it and one after it.
  static StridedBuf make(const Shape& s, const Placement& p, DType dt, Device dev) {
    const std::int64_t C2 = p.c_step * s.C, W2 = s.W + p.w_pad;
    const std::int64_t elems = s.N * C2 * s.H * W2;
    std::int64_t st[4] = {C2 * s.H * W2, s.H * W2, W2, 1};  // of the buffer, NCHW
    if (p.channels_last) st[1] = 1, st[2] = W2 * C2, st[3] = C2;
    st[1] *= p.c_step;
    StridedBuf b;
    b.storage = Tensor::empty({elems + p.offset + 1}, dt, dev);
    b.storage.fill_bytes(0xCD);
    char* base = static_cast<char*>(b.storage.view().data) + p.offset * static_cast<std::int64_t>(dtype_size(dt));
    b.view = TensorView(base, dt, dev, {s.N, s.C, s.H, s.W}, {st[0], st[1], st[2], st[3]});
    return b;
  }

  /// An independent CPU copy of a CPU buffer (storage bytes and the view at the same offset).
  StridedBuf clone() const {
    StridedBuf b;
    b.storage = Tensor::empty({storage.numel()}, storage.view().dtype, Device::cpu());
    std::memcpy(b.storage.view().data, storage.view().data, storage.nbytes());
    b.view = rebased(b.storage);
    return b;
  }

  /// The same bytes and view on another device.
  StridedBuf to(Device dev) const {
    StridedBuf b;
    b.storage = storage.to(dev);
    b.view = rebased(b.storage);
    b.view.device = dev;
    return b;
  }

  /// Images [n0, n1) of the view.
  TensorView images(std::int64_t n0, std::int64_t n1) const {
    TensorView v = view;
    v.sizes[0] = n1 - n0;
    v.data = static_cast<char*>(view.data) + n0 * view.strides[0] * static_cast<std::int64_t>(dtype_size(view.dtype));
    return v;
  }

 private:
  /// This view, moved to the same offset into `other` (a copy of the storage).
  TensorView rebased(const Tensor& other) const {
    TensorView v = view;
    v.data = static_cast<char*>(other.view().data) +
             (static_cast<const char*>(view.data) - static_cast<const char*>(storage.view().data));
    return v;
  }
};

}  // namespace test
}  // namespace detops
