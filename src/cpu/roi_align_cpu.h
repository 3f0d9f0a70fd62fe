// What RoIAlign's CPU loops share: sample tables, pooled-roi views, and the table of the
// entry points that roi_align_cpu_kernels.inc defines per instruction-set variant. This is that
// kernel file's whole interface (it has no #includes of its own: it is compiled inside the
// variants' namespaces). Included by roi_align_cpu.cpp and roi_align_rotated_cpu.cpp (whose
// tables are these); everything is internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "internal/common.h"
#include "internal/cpu_isa.h"
#include "internal/half_convert.h"
#include "cpu/scatter_cpu.h"
#include "internal/roi_align_backend.h"

namespace detops {
namespace internal {

using detail::Bilinear;
using detail::RoiBox;
using detail::RoiStatus;

namespace {

/// One bilinear sample: the offset of its (y_low, x_low) corner (plane strides applied), whether
/// the other corners are one column / one row further (else the same: the clamped last column or
/// row), and the four weights. 32 bytes for float (the tables are streamed once per plane group).
template <class A>
struct Sample {
  std::int64_t o1;
  A w1, w2, w3, w4;
  std::int32_t index;  // iy * grid_w + ix
  bool valid, step_x, step_y;
};

/// The four corner offsets of a sample in a plane with row stride sh and column stride sw.
struct Corners {
  std::int64_t o1, o2, o3, o4;
};
template <class A>
inline Corners corners(const Sample<A>& p, std::int64_t sh, std::int64_t sw) {
  const std::int64_t dx = p.step_x ? sw : 0, dy = p.step_y ? sh : 0;
  return {p.o1, p.o1 + dx, p.o1 + dy, p.o1 + dy + dx};
}

/// Avg pooling with channels innermost: adds the weighted corner rows of samples q[0, n) of the
/// image at `base` (channel 0 of each row) to acc[0, C), in sample order, each as
/// acc[c] += w1 v1 + w2 v2 + w3 v3 + w4 v4 (the CUDA bodies' expression). float16 with F16C
/// (cv): a sample's four corner rows are first converted to float in `rows` (4 * C floats), then
/// the float loop runs; half -> float is exact, so the bits are the same. Always inlined: called
/// from a kernel file's variant it is vectorized for the variant's instruction set
/// (internal/cpu_isa.h). RoIAlign's and RoIAlignRotated's channels-last forwards share it.
template <class T, class A>
DETOPS_FORCEINLINE void add_bin_rows(const T* base, const Sample<A>* q, std::int64_t n, std::int64_t sh,
                                     std::int64_t sw, std::int64_t C, const HalfConvert* cv, float* rows, A* acc) {
  for (std::int64_t i = 0; i < n; ++i) {
    const Sample<A>& p = q[i];
    if (!p.valid) continue;
    const std::int64_t dx = p.step_x ? sw : 0, dy = p.step_y ? sh : 0;
    const T *p1 = base + p.o1, *p2 = p1 + dx, *p3 = p1 + dy, *p4 = p3 + dx;
    if constexpr (std::is_same_v<T, Half>) {
      if (cv) {
        float *f1 = rows, *f2 = f1 + C, *f3 = f2 + C, *f4 = f3 + C;
        cv->to_float(p1, f1, C);
        cv->to_float(p2, f2, C);
        cv->to_float(p3, f3, C);
        cv->to_float(p4, f4, C);
        for (std::int64_t c = 0; c < C; ++c) acc[c] += p.w1 * f1[c] + p.w2 * f2[c] + p.w3 * f3[c] + p.w4 * f4[c];
        continue;
      }
    }
    for (std::int64_t c = 0; c < C; ++c)
      acc[c] += p.w1 * to_acc(p1[c]) + p.w2 * to_acc(p2[c]) + p.w3 * to_acc(p3[c]) + p.w4 * to_acc(p4[c]);
  }
}

/// The table entry of bilinear sample b (grid index `index`) in a plane with row stride sh and
/// column stride sw; every field written (tables are not zero-initialized).
template <class A>
inline Sample<A> make_sample(const Bilinear<A>& b, std::int64_t index, std::int64_t sh, std::int64_t sw) {
  Sample<A> q;
  q.valid = b.valid;
  q.index = static_cast<std::int32_t>(index);
  q.o1 = b.valid ? b.y_low * sh + b.x_low * sw : 0;
  q.step_x = b.valid && b.x_high != b.x_low;
  q.step_y = b.valid && b.y_high != b.y_low;
  q.w1 = b.valid ? b.w1 : A(0);
  q.w2 = b.valid ? b.w2 : A(0);
  q.w3 = b.valid ? b.w3 : A(0);
  q.w4 = b.valid ? b.w4 : A(0);
  return q;
}

/// Every sample of one roi, grouped by bin: bin b owns samples [b * per_bin, (b + 1) * per_bin).
template <class A>
struct RoiTable {
  RoiBox<A> box;
  std::int64_t per_bin = 0;
  std::vector<Sample<A>> samples;
};

/// Number of samples in a roi's table (0 for an invalid row).
template <class A>
std::int64_t table_size(const RoiBox<A>& box, const detail::RoiAlignShape& s) {
  return box.batch < 0 ? 0 : box.grid_h * box.grid_w * s.PH * s.PW;
}

/// Writes the table_size(box, s) samples of one roi, bin by bin, to `out`.
template <class A>
void fill_roi_samples(const RoiBox<A>& box, const detail::RoiAlignShape& s, std::int64_t sh, std::int64_t sw,
                      Sample<A>* out) {
  if (box.batch < 0) return;
  std::size_t i = 0;
  for (std::int64_t ph = 0; ph < s.PH; ++ph)
    for (std::int64_t pw = 0; pw < s.PW; ++pw)
      for (std::int64_t iy = 0; iy < box.grid_h; ++iy) {
        const A y = detail::sample_coord(box.start_h, box.bin_h, ph, iy, box.grid_h);
        for (std::int64_t ix = 0; ix < box.grid_w; ++ix, ++i) {
          const A x = detail::sample_coord(box.start_w, box.bin_w, pw, ix, box.grid_w);
          out[i] = make_sample(detail::bilinear(y, x, s.H, s.W), iy * box.grid_w + ix, sh, sw);
        }
      }
}

template <class A>
void build_roi_table(const detail::RoiSource& rois, std::int64_t k, const detail::RoiAlignShape& s, std::int64_t sh,
                     std::int64_t sw, RoiTable<A>& t) {
  t.box = detail::load_roi_box<A>(rois, k, s);
  // an invalid box may keep the grid it was refused for (up to 2^40 + 1 per axis): no product
  t.per_bin = t.box.batch < 0 ? 0 : t.box.grid_h * t.box.grid_w;
  t.samples.resize(static_cast<std::size_t>(table_size(t.box, s)));
  fill_roi_samples(t.box, s, sh, sw, t.samples.data());
}

// ---------------------------------------------------------------------------------------------
// Forward

/// Output location of one roi: where its pooled values (and argmax) go.
template <class T>
struct PooledRoi {
  T* out;
  std::int32_t* argmax;  // nullptr for avg pooling
};

/// The views of one forward call, as the loops use them.
template <class T>
struct ForwardViews {
  const detail::RoiAlignShape& s;
  detail::Strides4 in, os, as;  // input, output, argmax strides
  const T* input;
  detail::RoiSource rois;
  T* output;
  std::int32_t* argmax;  // nullptr for avg pooling

  explicit ForwardViews(const RoiAlignCall& call)
      : s(call.shape),
        in(strides4(call.features)),
        os(strides4(call.pooled)),
        as(call.max_pool ? strides4(call.argmax) : detail::Strides4{0, 0, 0, 0}),
        input(static_cast<const T*>(call.features.data)),
        rois(roi_source(call.rois)),
        output(static_cast<T*>(call.pooled.data)),
        argmax(call.max_pool ? static_cast<std::int32_t*>(call.argmax.data) : nullptr) {}
  PooledRoi<T> pooled(std::int64_t k) const { return {output + k * os.s0, argmax ? argmax + k * as.s0 : nullptr}; }
};

/// Pools G planes (channels c .. c + G - 1 of one image) over every bin of one roi. Each table
/// entry is loaded once for the G planes; each channel adds its samples in table order, as the
/// CUDA kernel does, so the bits do not depend on G.
template <int G, class T, class A>
void pool_roi_planes(const T* plane, const detail::Strides4& in, const Sample<A>* samples, std::int64_t per_bin,
                     A count, const detail::RoiAlignShape& s, const detail::Strides4& os,
                     const detail::Strides4& as, PooledRoi<T> r) {
  for (std::int64_t ph = 0; ph < s.PH; ++ph)
    for (std::int64_t pw = 0; pw < s.PW; ++pw) {
      const Sample<A>* q = samples + (ph * s.PW + pw) * per_bin;
      T* o = r.out + ph * os.s2 + pw * os.s3;
      if (!r.argmax) {
        A sum[G] = {};
        for (std::int64_t i = 0; i < per_bin; ++i) {
          const Sample<A>& p = q[i];
          if (!p.valid) continue;
          const Corners o = corners(p, in.s2, in.s3);
          for (int g = 0; g < G; ++g) {
            const T* pl = plane + g * in.s1;
            sum[g] += p.w1 * to_acc(pl[o.o1]) + p.w2 * to_acc(pl[o.o2]) + p.w3 * to_acc(pl[o.o3]) +
                      p.w4 * to_acc(pl[o.o4]);
          }
        }
        for (int g = 0; g < G; ++g) o[g * os.s1] = from_acc<T>(sum[g] / count);
        continue;
      }
      A best[G] = {};
      std::int32_t best_index[G];
      std::fill(best_index, best_index + G, -1);
      for (std::int64_t i = 0; i < per_bin; ++i) {
        const Sample<A>& p = q[i];
        // the validity decided once per sample, the winner by selects (as in the channels-last loop)
        auto take = [&](int g, A v) { detail::max_pool_update(v, p.index, best[g], best_index[g]); };
        if (!p.valid) {  // counts as value 0
          for (int g = 0; g < G; ++g) take(g, A(0));
          continue;
        }
        const Corners o = corners(p, in.s2, in.s3);
        for (int g = 0; g < G; ++g) {
          const T* pl = plane + g * in.s1;
          take(g, p.w1 * to_acc(pl[o.o1]) + p.w2 * to_acc(pl[o.o2]) + p.w3 * to_acc(pl[o.o3]) + p.w4 * to_acc(pl[o.o4]));
        }
      }
      std::int32_t* a = r.argmax + ph * as.s2 + pw * as.s3;
      for (int g = 0; g < G; ++g) {
        o[g * os.s1] = from_acc<T>(best[g]);
        a[g * as.s1] = best_index[g];
      }
    }
}

/// Calls f(std::integral_constant<int, G>) for G in {1, 2, 4, 8, 16}.
template <class F>
void with_group_width(int G, F&& f) {
  switch (G) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

/// Pools channels [c, c + n) of one roi (its image at `image`, its table q of per_bin samples per
/// bin, its average's divisor `count`), G planes at a time (G a power of two; the tail in the
/// largest powers of two that fit). RoIAlign's and RoIAlignRotated's NCHW walks share it.
template <class T, class A>
void pool_roi_channels(const T* image, const detail::Strides4& in, const Sample<A>* q, std::int64_t per_bin, A count,
                       const detail::RoiAlignShape& s, const detail::Strides4& os, const detail::Strides4& as,
                       PooledRoi<T> r, std::int64_t c, std::int64_t n, int G) {
  while (n > 0) {
    int g = G;
    while (g > n) g /= 2;
    const T* plane = image + c * in.s1;
    PooledRoi<T> rc{r.out + c * os.s1, r.argmax ? r.argmax + c * as.s1 : nullptr};
    with_group_width(g, [&](auto width) {
      pool_roi_planes<decltype(width)::value>(plane, in, q, per_bin, count, s, os, as, rc);
    });
    c += g;
    n -= g;
  }
}

/// Adds one roi's gradient to G planes (channels c .. c + G - 1 of one image; go_k and am_k point
/// at channel c of the roi's grad_output and argmax rows). Per plane, the adds come in the order of
/// the CUDA scatter body run in thread order (k, c, ph, pw): bins in order, a bin's samples in
/// order, four corners each; so the result does not depend on G, the walk or the threads.
template <int G, class V, class T, class Target, class A>
void scatter_roi_planes(Target* plane, const detail::Strides4& ts, const Sample<A>* samples, std::int64_t per_bin,
                        const detail::RoiAlignShape& s, const T* go_k, const detail::Strides4& go,
                        const std::int32_t* am_k, const detail::Strides4& am, detail::GradRounding rounding) {
  const V count = static_cast<V>(per_bin);
  auto scatter = [&ts](Target* pl, const Sample<A>& p, V g, V den) {
    auto add = [pl](std::int64_t off, V v) { scatter_add(pl + off, v); };
    const Corners o = corners(p, ts.s2, ts.s3);
    add(o.o1, detail::scatter_contribution(g, p.w1, den));
    add(o.o2, detail::scatter_contribution(g, p.w2, den));
    add(o.o3, detail::scatter_contribution(g, p.w3, den));
    add(o.o4, detail::scatter_contribution(g, p.w4, den));
  };
  for (std::int64_t ph = 0; ph < s.PH; ++ph)
    for (std::int64_t pw = 0; pw < s.PW; ++pw) {
      const Sample<A>* q = samples + (ph * s.PW + pw) * per_bin;
      V g[G];
      for (int i = 0; i < G; ++i) {
        const acc_t<T> ga = to_acc(go_k[i * go.s1 + ph * go.s2 + pw * go.s3]);
        g[i] = detail::scatter_gradient<V>(ga, rounding);
      }
      if (!am_k) {
        for (std::int64_t j = 0; j < per_bin; ++j) {
          if (!q[j].valid) continue;
          for (int i = 0; i < G; ++i) scatter(plane + i * ts.s1, q[j], g[i], count);
        }
        continue;
      }
      for (int i = 0; i < G; ++i) {
        const std::int32_t idx = am_k[i * am.s1 + ph * am.s2 + pw * am.s3];
        if (idx >= 0 && idx < per_bin && q[idx].valid) scatter(plane + i * ts.s1, q[idx], g[i], V(1));
      }
    }
}

/// Scatters channels [c, c + n) of one roi (its image of the accumulator at `image`, its
/// grad_output and argmax at channel 0, argmax nullptr for avg pooling), G planes at a time (G a
/// power of two; the tail in the largest powers of two that fit). Every plane receives its adds
/// in the order (bin, sample, corner) whatever G is. RoIAlign's and RoIAlignRotated's NCHW
/// scatter walks share it.
template <class V, class T, class Target, class A>
void scatter_roi_channels(Target* image, const detail::Strides4& ts, const Sample<A>* q, std::int64_t per_bin,
                          const detail::RoiAlignShape& s, const T* go_k, const detail::Strides4& go,
                          const std::int32_t* am_k, const detail::Strides4& am, detail::GradRounding rounding,
                          std::int64_t c, std::int64_t n, int G) {
  while (n > 0) {
    int g = G;
    while (g > n) g /= 2;
    with_group_width(g, [&](auto w) {
      scatter_roi_planes<decltype(w)::value, V>(image + c * ts.s1, ts, q, per_bin, s, go_k + c * go.s1, go,
                                                am_k ? am_k + c * am.s1 : nullptr, am, rounding);
    });
    c += g;
    n -= g;
  }
}

/// Writes 0 (argmax -1) to every output of an invalid roi row (only reachable with check_rois = false).
template <class T>
void pool_invalid_roi(const detail::RoiAlignShape& s, const detail::Strides4& os, const detail::Strides4& as,
                      PooledRoi<T> r) {
  for (std::int64_t c = 0; c < s.C; ++c)
    for (std::int64_t ph = 0; ph < s.PH; ++ph)
      for (std::int64_t pw = 0; pw < s.PW; ++pw) {
        r.out[c * os.s1 + ph * os.s2 + pw * os.s3] = from_acc<T>(acc_t<T>(0));
        if (r.argmax) r.argmax[c * as.s1 + ph * as.s2 + pw * as.s3] = -1;
      }
}

/// A variant's entry points (roi_align_cpu_kernels.inc).
struct RoiCpuKernels {
  void (*forward_channels_last)(const RoiAlignCall& call, const Context& ctx);
  /// Phase 3 of the exact backward with channels innermost: ga is the detail::GatherArgs<T> of
  /// the dtype.
  void (*exact_runs_channels_last)(DType dtype, const void* ga, std::int64_t C, std::int64_t runs, int threads);
};

}  // namespace

}  // namespace internal
}  // namespace detops
