// What RoIAlign's CPU loops share: sample tables, pooled-roi views, and the table of the
// entry points that roi_align_cpu_kernels.inc defines per instruction-set variant. This is that
// kernel file's whole interface (it has no #includes of its own: it is compiled inside the
// variants' namespaces). Included only by roi_align_cpu.cpp; everything is internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "internal/common.h"
#include "internal/cpu_isa.h"
#include "internal/half_convert.h"
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
  t.per_bin = t.box.grid_h * t.box.grid_w;
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
