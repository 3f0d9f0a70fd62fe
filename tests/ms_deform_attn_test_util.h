// Test helpers for multi-scale deformable attention: random problems (with samples outside the
// levels), tensors in any dtype and in a contiguous or a strided, permuted layout (gaps poisoned
// with 0xCD so stray writes show), and one call of each entry point returning float64 vectors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "detops/detops.h"
#include "reference/ms_deform_attn_reference.h"
#include "test_util.h"

namespace detops {
namespace test {

/// A tensor view into a poisoned storage. Strided: every dimension padded by one element and the
/// last dimension not innermost (memory order, innermost first: rank-2, rank-1, rank-3, ..., 0).
struct MsdaBuf {
  Tensor storage;
  TensorView view;
};

inline MsdaBuf msda_buf(const std::vector<std::int64_t>& sizes, DType dt, bool strided, Device dev = Device::cpu()) {
  const int rank = static_cast<int>(sizes.size());
  std::vector<std::int64_t> strides(sizes.size());
  std::int64_t extent = 1;
  if (!strided) {
    for (int d = rank - 1; d >= 0; --d) {
      strides[d] = extent;
      extent *= std::max<std::int64_t>(sizes[d], 1);
    }
  } else {
    std::vector<int> order;
    if (rank >= 2) order = {rank - 2, rank - 1};
    else order = {0};
    for (int d = rank - 3; d >= 0; --d) order.push_back(d);
    for (int d : order) {
      strides[d] = extent;
      extent *= std::max<std::int64_t>(sizes[d], 1) + 1;
    }
  }
  MsdaBuf b;
  b.storage = Tensor::empty({extent + 1}, dt, Device::cpu());
  b.storage.fill_bytes(0xCD);
  b.view = TensorView(b.storage.view().data, dt, Device::cpu(), sizes, strides);
  if (!dev.is_cpu()) {
    b.storage = b.storage.to(dev);
    b.view.data = b.storage.view().data;
    b.view.device = dev;
  }
  return b;
}

inline MsdaBuf msda_filled(const std::vector<std::int64_t>& sizes, DType dt, const std::vector<double>& v, bool strided) {
  MsdaBuf b = msda_buf(sizes, dt, strided);
  fill_from(b.view, v);
  return b;
}

/// A random problem: levels as given, locations in [-0.15, 1.15] (some samples outside), values
/// and weights in [-1, 1].
inline ::detops::ref::MsdaProblemRef msda_random_problem(std::int64_t B, std::int64_t M, std::int64_t D, std::int64_t Q,
                                               std::int64_t P, const std::vector<std::int64_t>& shapes,
                                               std::uint64_t seed) {
  ::detops::ref::MsdaProblemRef pr;
  pr.B = B;
  pr.M = M;
  pr.D = D;
  pr.Q = Q;
  pr.P = P;
  pr.L = static_cast<std::int64_t>(shapes.size() / 2);
  pr.shapes = shapes;
  pr.S = pr.start(pr.L);
  pr.value = random_values(static_cast<std::size_t>(B * pr.S * M * D), seed);
  pr.loc = random_values(static_cast<std::size_t>(B * Q * M * pr.L * P * 2), seed + 1, -0.15, 1.15);
  pr.attn = random_values(static_cast<std::size_t>(B * Q * M * pr.L * P), seed + 2);
  return pr;
}

/// The detops tensors of a problem.
struct MsdaTensors {
  MsdaBuf value, shapes, starts, loc, attn;
  std::int64_t B, S, M, D, Q, L, P;

  MsdaTensors(const ::detops::ref::MsdaProblemRef& pr, DType dt, DType loc_dt, bool strided)
      : B(pr.B), S(pr.S), M(pr.M), D(pr.D), Q(pr.Q), L(pr.L), P(pr.P) {
    value = msda_filled({B, S, M, D}, dt, pr.value, strided);
    std::vector<double> sh(pr.shapes.begin(), pr.shapes.end()), st;
    for (std::int64_t l = 0; l < L; ++l) st.push_back(static_cast<double>(pr.start(l)));
    shapes = msda_filled({L, 2}, DType::kInt64, sh, strided);
    starts = msda_filled({L}, DType::kInt64, st, strided);
    loc = msda_filled({B, Q, M, L, P, 2}, loc_dt, pr.loc, strided);
    attn = msda_filled({B, Q, M, L, P}, dt, pr.attn, strided);
  }
  /// The problem as the tensors hold it (inputs rounded to their dtypes).
  ::detops::ref::MsdaProblemRef rounded(const ::detops::ref::MsdaProblemRef& pr) const {
    ::detops::ref::MsdaProblemRef r = pr;
    r.value = to_vector(value.view);
    r.loc = to_vector(loc.view);
    r.attn = to_vector(attn.view);
    return r;
  }
};

/// Forward into a fresh output (contiguous or strided); returns the output buffer.
inline MsdaBuf msda_run_forward(const MsdaTensors& t, bool strided, const Context& ctx = {}) {
  MsdaBuf out = msda_buf({t.B, t.Q, t.M * t.D}, t.value.view.dtype, strided);
  ms_deform_attn_forward(t.value.view, t.shapes.view, t.starts.view, t.loc.view, t.attn.view, out.view, ctx);
  return out;
}

struct MsdaGrads {
  MsdaBuf value, loc, attn;
};

inline MsdaGrads msda_run_backward(const MsdaTensors& t, const MsdaBuf& grad_out, BackwardMode mode, bool strided,
                                   const Context& ctx = {}) {
  MsdaGrads g;
  g.value = msda_buf({t.B, t.S, t.M, t.D}, t.value.view.dtype, strided);
  g.loc = msda_buf({t.B, t.Q, t.M, t.L, t.P, 2}, t.loc.view.dtype, strided);
  g.attn = msda_buf({t.B, t.Q, t.M, t.L, t.P}, t.value.view.dtype, strided);
  MsDeformAttnBackwardOptions opt;
  opt.mode = mode;
  ms_deform_attn_backward(t.value.view, t.shapes.view, t.starts.view, t.loc.view, t.attn.view, grad_out.view,
                          g.value.view, g.loc.view, g.attn.view, opt, ctx);
  return g;
}

/// Every byte of the storage outside the view's elements still holds the 0xCD poison.
inline bool msda_gaps_untouched(const MsdaBuf& b) {
  const TensorView& v = b.view;
  const std::size_t es = dtype_size(v.dtype), n = b.storage.nbytes();
  std::vector<char> element(n, 0);
  const std::int64_t count = v.numel();
  for (std::int64_t lin = 0; lin < count; ++lin) {
    std::int64_t rem = lin, off = 0;
    for (int d = v.rank - 1; d >= 0; --d) {
      off += (rem % v.sizes[d]) * v.strides[d];
      rem /= v.sizes[d];
    }
    for (std::size_t k = 0; k < es; ++k) element[static_cast<std::size_t>(off) * es + k] = 1;
  }
  const auto* bytes = static_cast<const unsigned char*>(b.storage.view().data);
  for (std::size_t i = 0; i < n; ++i)
    if (!element[i] && bytes[i] != 0xCD) return false;
  return true;
}

inline bool msda_same(const MsdaBuf& a, const MsdaBuf& b) { return same_bytes(a.storage, b.storage); }
/// The same element values bit for bit (whatever the layouts).
inline bool msda_same_values(const MsdaBuf& a, const MsdaBuf& b) {
  const std::vector<double> x = to_vector(a.view), y = to_vector(b.view);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

}  // namespace test
}  // namespace detops
