// Per-thread bodies of the multi-scale deformable attention kernels, as __host__ __device__
// functions of a flat thread index. The CUDA backend wraps each in a one-line __global__; the
// tests run them over an emulated grid on the CPU, byte for byte against the CPU backend.
//
// Index orders (fastest last): forward and atomic scatter (b, q, m, d), one output channel per
// thread as the anchors; location / attention-weight gradients (b, q, m, l, p), one writer per
// sample summing its D channels in order; exact-mode records (plane, q, l, p), a plane being one
// (b, m), each sample writing its four corner records into slots 4 t .. 4 t + 3.
#pragma once

#include <cstdint>

#include "detops/detail/gather_backward.h"
#include "detops/detail/host_device.h"
#include "detops/detail/ms_deform_attn_math.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

/// The inputs every kernel reads: value [B, S, M, D], the level table, sampling_locations
/// [B, Q, M, L, P, 2] (element type Loc) and attention_weights [B, Q, M, L, P]; strides in elements.
template <class T, class Loc>
struct MsdaInputs {
  const T* value;
  std::int64_t vs[4];
  const MsdaLevel* levels;  // L entries (device memory on CUDA)
  const Loc* loc;
  std::int64_t ls[6];
  const T* attn;
  std::int64_t as[5];
  MsdaShape shape;
};

/// The location of sample (b, q, m, l, p) in the accumulation type.
template <class A, class T, class Loc>
DETOPS_HOST_DEVICE inline void msda_load_location(const MsdaInputs<T, Loc>& in, std::int64_t b, std::int64_t q,
                                                  std::int64_t m, std::int64_t l, std::int64_t p, A& x, A& y) {
  const Loc* at = in.loc + b * in.ls[0] + q * in.ls[1] + m * in.ls[2] + l * in.ls[3] + p * in.ls[4];
  x = static_cast<A>(at[0]);
  y = static_cast<A>(at[in.ls[5]]);
}

template <class A, class T, class Loc>
DETOPS_HOST_DEVICE inline A msda_load_attention(const MsdaInputs<T, Loc>& in, std::int64_t b, std::int64_t q,
                                                std::int64_t m, std::int64_t l, std::int64_t p) {
  return to_acc(in.attn[b * in.as[0] + q * in.as[1] + m * in.as[2] + l * in.as[3] + p * in.as[4]]);
}

/// Corner c's value of channel d of head m in image b (0 for a corner outside the level).
template <class A, class T, class Loc>
DETOPS_HOST_DEVICE inline A msda_corner_value(const MsdaInputs<T, Loc>& in, const MsdaSample<A>& s, int c,
                                              std::int64_t b, std::int64_t m, std::int64_t d) {
  if (!s.inside[c]) return A(0);
  return to_acc(in.value[b * in.vs[0] + s.row[c] * in.vs[1] + m * in.vs[2] + d * in.vs[3]]);
}

// ---------------------------------------------------------------------------------------------
// Forward

template <class T, class Loc>
struct MsdaForwardArgs {
  MsdaInputs<T, Loc> in;
  T* out;  // [B, Q, M * D]
  std::int64_t os[3];
};

/// output[b, q, m * D + d], i over (b, q, m, d): the (l, p) samples added from zero in order.
template <class T, class Loc>
DETOPS_HOST_DEVICE inline void msda_forward_element(std::int64_t i, const MsdaForwardArgs<T, Loc>& a) {
  using A = acc_t<T>;
  const MsdaShape& sh = a.in.shape;
  const std::int64_t d = i % sh.D;
  i /= sh.D;
  const std::int64_t m = i % sh.M;
  i /= sh.M;
  const std::int64_t q = i % sh.Q;
  const std::int64_t b = i / sh.Q;
  A acc = A(0);
  for (std::int64_t l = 0; l < sh.L; ++l) {
    const MsdaLevel lv = a.in.levels[l];
    for (std::int64_t p = 0; p < sh.P; ++p) {
      A x, y;
      msda_load_location(a.in, b, q, m, l, p, x, y);
      const MsdaSample<A> s = msda_sample(x, y, lv);
      if (!s.valid) continue;
      const A attn = msda_load_attention<A>(a.in, b, q, m, l, p);
      const A v = msda_bilinear(s, msda_corner_value(a.in, s, 0, b, m, d), msda_corner_value(a.in, s, 1, b, m, d),
                                msda_corner_value(a.in, s, 2, b, m, d), msda_corner_value(a.in, s, 3, b, m, d));
      acc = acc + v * attn;
    }
  }
  a.out[b * a.os[0] + q * a.os[1] + (m * sh.D + d) * a.os[2]] = from_acc<T>(acc);
}

// ---------------------------------------------------------------------------------------------
// Backward

template <class T, class Loc>
struct MsdaBackwardArgs {
  MsdaInputs<T, Loc> in;
  const T* grad_out;  // [B, Q, M * D]
  std::int64_t gos[3];
  T* grad_value;  // [B, S, M, D] or null
  std::int64_t gvs[4];
  Loc* grad_loc;  // [B, Q, M, L, P, 2] or null
  std::int64_t gls[6];
  T* grad_attn;  // [B, Q, M, L, P] or null
  std::int64_t gas[5];
};

/// Writes zero into element i of a strided [B, S, M, D] tensor (the bytes between elements keep
/// their values).
template <class T>
DETOPS_HOST_DEVICE inline void msda_zero_value_element(std::int64_t i, T* p, std::int64_t s0, std::int64_t s1,
                                                       std::int64_t s2, std::int64_t s3, const MsdaShape& sh) {
  const std::int64_t d = i % sh.D;
  i /= sh.D;
  const std::int64_t m = i % sh.M;
  i /= sh.M;
  const std::int64_t s = i % sh.S;
  const std::int64_t b = i / sh.S;
  p[b * s0 + s * s1 + m * s2 + d * s3] = T(0.0f);
}

/// The atomic mode's scatter, i over (b, q, m, d) as the anchors: for every valid sample and
/// corner inside its level, add(offset into grad_value, g * corner weight * attention weight).
template <class T, class Loc, class Add>
DETOPS_HOST_DEVICE inline void msda_value_scatter_element(std::int64_t i, const MsdaBackwardArgs<T, Loc>& a,
                                                          const Add& add) {
  using A = acc_t<T>;
  const MsdaShape& sh = a.in.shape;
  const std::int64_t d = i % sh.D;
  i /= sh.D;
  const std::int64_t m = i % sh.M;
  i /= sh.M;
  const std::int64_t q = i % sh.Q;
  const std::int64_t b = i / sh.Q;
  const A g = to_acc(a.grad_out[b * a.gos[0] + q * a.gos[1] + (m * sh.D + d) * a.gos[2]]);
  const std::int64_t base = b * a.gvs[0] + m * a.gvs[2] + d * a.gvs[3];
  for (std::int64_t l = 0; l < sh.L; ++l) {
    const MsdaLevel lv = a.in.levels[l];
    for (std::int64_t p = 0; p < sh.P; ++p) {
      A x, y;
      msda_load_location(a.in, b, q, m, l, p, x, y);
      const MsdaSample<A> s = msda_sample(x, y, lv);
      if (!s.valid) continue;
      const A attn = msda_load_attention<A>(a.in, b, q, m, l, p);
      for (int c = 0; c < kMsdaCorners; ++c)
        if (s.inside[c]) add(base + s.row[c] * a.gvs[1], g * msda_corner_weight(s, c, attn));
    }
  }
}

/// grad_sampling_locations and grad_attention_weights of sample i over (b, q, m, l, p): the D
/// channels' shares (msda_sample_grad) added from zero in channel order; zeros for a skipped
/// sample. Either output may be null.
template <class T, class Loc>
DETOPS_HOST_DEVICE inline void msda_location_grad_element(std::int64_t i, const MsdaBackwardArgs<T, Loc>& a) {
  using A = acc_t<T>;
  const MsdaShape& sh = a.in.shape;
  const std::int64_t p = i % sh.P;
  i /= sh.P;
  const std::int64_t l = i % sh.L;
  i /= sh.L;
  const std::int64_t m = i % sh.M;
  i /= sh.M;
  const std::int64_t q = i % sh.Q;
  const std::int64_t b = i / sh.Q;
  const MsdaLevel lv = a.in.levels[l];
  A x, y;
  msda_load_location(a.in, b, q, m, l, p, x, y);
  const MsdaSample<A> s = msda_sample(x, y, lv);
  A gx = A(0), gy = A(0), ga = A(0);
  if (s.valid) {
    const A attn = msda_load_attention<A>(a.in, b, q, m, l, p);
    const T* go = a.grad_out + b * a.gos[0] + q * a.gos[1] + m * sh.D * a.gos[2];
    for (std::int64_t d = 0; d < sh.D; ++d) {
      const MsdaSampleGrad<A> r =
          msda_sample_grad(s, lv, to_acc(go[d * a.gos[2]]), attn, msda_corner_value(a.in, s, 0, b, m, d),
                           msda_corner_value(a.in, s, 1, b, m, d), msda_corner_value(a.in, s, 2, b, m, d),
                           msda_corner_value(a.in, s, 3, b, m, d));
      gx = gx + r.x;
      gy = gy + r.y;
      ga = ga + r.attention;
    }
  }
  if (a.grad_loc) {
    Loc* out = a.grad_loc + b * a.gls[0] + q * a.gls[1] + m * a.gls[2] + l * a.gls[3] + p * a.gls[4];
    out[0] = static_cast<Loc>(gx);
    out[a.gls[5]] = static_cast<Loc>(gy);
  }
  if (a.grad_attn)
    a.grad_attn[b * a.gas[0] + q * a.gas[1] + m * a.gas[2] + l * a.gas[3] + p * a.gas[4]] = from_acc<T>(ga);
}

// ---------------------------------------------------------------------------------------------
// Exact mode: records of the gather-backward engine (include/detops/detail/gather_backward.h)

/// grad_value's offset of a record key: key = (plane - plane0) * S + s, plane = b * M + m.
struct MsdaValueTarget {
  std::int64_t plane0, S, M;
  std::int64_t s0, s1, s2;  // grad_value's strides over b, s, m
  DETOPS_HOST_DEVICE std::int64_t operator()(GatherKey key) const {
    const std::int64_t k = static_cast<std::int64_t>(key);
    const std::int64_t plane = plane0 + k / S;
    return (plane / M) * s0 + (k % S) * s1 + (plane % M) * s2;
  }
};

/// The four records of one sample, slots 4 t .. 4 t + 3: key (chunk-local plane) * S + row,
/// weight corner weight * attention weight, source `source`; the sentinel for a skipped sample or
/// a corner outside its level. Shared by msda_exact_records_element and the CPU backend.
template <class A>
DETOPS_HOST_DEVICE inline void msda_sample_records(const MsdaSample<A>& s, A attn, std::int64_t t, std::int64_t local,
                                                   std::int64_t S, std::int64_t source, GatherKey sentinel,
                                                   const GatherRecords<A>& rec) {
  for (int c = 0; c < kMsdaCorners; ++c) {
    const std::int64_t j = 4 * t + c;
    if (s.valid && s.inside[c]) {
      gather_set_record(rec, j, static_cast<GatherKey>(local * S + s.row[c]), msda_corner_weight(s, c, attn),
                        source);
    } else {
      gather_init_record(j, rec, sentinel);
    }
  }
}

/// Phase 1 for the chunk of planes starting at plane0: sample t over (plane - plane0, q, l, p)
/// writes records 4 t + c, c the corner (the canonical order (plane, q, l, p, corner)), source =
/// the offset of grad_output[b, q, m * D].
template <class T, class Loc>
DETOPS_HOST_DEVICE inline void msda_exact_records_element(std::int64_t t, const MsdaBackwardArgs<T, Loc>& a,
                                                          std::int64_t plane0, GatherKey sentinel,
                                                          const GatherRecords<acc_t<T>>& rec) {
  using A = acc_t<T>;
  const MsdaShape& sh = a.in.shape;
  std::int64_t i = t;
  const std::int64_t p = i % sh.P;
  i /= sh.P;
  const std::int64_t l = i % sh.L;
  i /= sh.L;
  const std::int64_t q = i % sh.Q;
  const std::int64_t local = i / sh.Q;
  const std::int64_t plane = plane0 + local;
  const std::int64_t b = plane / sh.M, m = plane % sh.M;
  A x, y;
  msda_load_location(a.in, b, q, m, l, p, x, y);
  const MsdaSample<A> s = msda_sample(x, y, a.in.levels[l]);
  const A attn = s.valid ? msda_load_attention<A>(a.in, b, q, m, l, p) : A(0);
  msda_sample_records(s, attn, t, local, sh.S, b * a.gos[0] + q * a.gos[1] + m * sh.D * a.gos[2], sentinel, rec);
}

}  // namespace detail
}  // namespace detops
