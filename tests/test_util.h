// Test helpers: tensors from and to std::vector<double> in any dtype and layout, byte hashes for
// bitwise comparisons, and seeded random problems shaped like detection workloads.
#pragma once

#include <cstdint>
#include <cstring>
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

}  // namespace test
}  // namespace detops
