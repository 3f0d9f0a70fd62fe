// Per-thread bodies of every RoIAlignRotated kernel, as __host__ __device__ functions of a flat
// thread index: the CUDA launchers wrap them in one-line __global__ functions, and the emulated-
// grid tests run them on the CPU. Everything that is not rotation-specific is RoIAlign's
// (roi_align_kernels.h): roi rows, the thread-to-bin split, one bilinear sample's arithmetic, the
// scatter modes' gradient rounding and contributions, the exact mode's destination map, and the
// whole-tensor passes.
#pragma once

#include <cstdint>

#include "detops/detail/gather_backward.h"
#include "detops/detail/host_device.h"
#include "detops/detail/roi_align_kernels.h"
#include "detops/detail/roi_align_rotated_math.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

/// Columns of a rotated roi row: (batch_index, cx, cy, w, h, angle).
constexpr int kRotatedRoiColumns = 6;

template <class A>
DETOPS_HOST_DEVICE inline RotatedBox<A> load_rotated_box(const RoiSource& rois, std::int64_t k,
                                                         const RoiAlignRotatedShape& s) {
  double row[kRotatedRoiColumns];
  load_roi_row(rois.data, rois.dtype, rois.s0, rois.s1, k, row, kRotatedRoiColumns);
  RotatedBox<A> box = make_rotated_box<A>(row[0], row + 1, s);
  if (box.status != RoiStatus::kOk) box.batch = -1;
  return box;
}

// ---------------------------------------------------------------------------------------------
// Forward: one output element per thread (avg pooling, the only mode detectron2 has).

template <class T>
struct RotatedForwardArgs {
  const T* input;
  Strides4 in;  // n, c, h, w
  RoiSource rois;
  T* output;
  Strides4 out;  // k, c, ph, pw
  RoiAlignRotatedShape shape;
  bool channels_last;  // thread order
};

template <class T>
DETOPS_HOST_DEVICE inline void roi_align_rotated_forward_element(std::int64_t i, const RotatedForwardArgs<T>& a) {
  using A = acc_t<T>;
  const RoiAlignRotatedShape& s = a.shape;
  const BinIndex bi = split_bin_index(i, s.C, s.PH, s.PW, a.channels_last);
  const RotatedBox<A> box = load_rotated_box<A>(a.rois, bi.k, s);
  T* out = a.output + bi.k * a.out.s0 + bi.c * a.out.s1 + bi.ph * a.out.s2 + bi.pw * a.out.s3;
  if (box.batch < 0) {  // invalid row (only reachable with check_rois = false)
    *out = from_acc<T>(A(0));
    return;
  }
  const T* plane = a.input + box.batch * a.in.s0 + bi.c * a.in.s1;
  A acc = A(0);
  for (std::int64_t iy = 0; iy < box.grid_h; ++iy)
    for (std::int64_t ix = 0; ix < box.grid_w; ++ix) {
      const MapPoint<A> p = rotated_sample(box, bi.ph, bi.pw, iy, ix);
      const Bilinear<A> b = bilinear(p.y, p.x, s.H, s.W);
      if (b.valid) acc += interpolate(plane, a.in.s2, a.in.s3, b);
    }
  *out = from_acc<T>(acc / box.count);
}

// ---------------------------------------------------------------------------------------------
// Backward, scatter form (atomic and truncated modes): one grad_output element per thread,
// contributions (g * w) / count handed to `add(offset_in_grad_input, value)` in the order
// (sample, corner).

template <class T>
struct RotatedBackwardArgs {
  const T* grad_output;
  Strides4 go;  // k, c, ph, pw
  RoiSource rois;
  Strides4 gi;  // the accumulator's strides: n, c, h, w
  RoiAlignRotatedShape shape;
  bool channels_last;
};

/// V is the type contributions are computed in: acc_t<T> for kAtomic, double for kTruncated.
template <class T, class V, class Add>
DETOPS_HOST_DEVICE inline void roi_align_rotated_backward_scatter_element(std::int64_t i, const RotatedBackwardArgs<T>& a,
                                                                          GradRounding rounding, Add&& add) {
  using A = acc_t<T>;
  const RoiAlignRotatedShape& s = a.shape;
  const BinIndex bi = split_bin_index(i, s.C, s.PH, s.PW, a.channels_last);
  const RotatedBox<A> box = load_rotated_box<A>(a.rois, bi.k, s);
  if (box.batch < 0) return;
  const A g_acc = to_acc(a.grad_output[bi.k * a.go.s0 + bi.c * a.go.s1 + bi.ph * a.go.s2 + bi.pw * a.go.s3]);
  const V g = scatter_gradient<V>(g_acc, rounding);
  const V count = static_cast<V>(box.grid_h * box.grid_w);
  const std::int64_t base = box.batch * a.gi.s0 + bi.c * a.gi.s1;
  for (std::int64_t iy = 0; iy < box.grid_h; ++iy)
    for (std::int64_t ix = 0; ix < box.grid_w; ++ix) {
      const MapPoint<A> p = rotated_sample(box, bi.ph, bi.pw, iy, ix);
      const Bilinear<A> b = bilinear(p.y, p.x, s.H, s.W);
      if (!b.valid) continue;
      add(base + b.y_low * a.gi.s2 + b.x_low * a.gi.s3, scatter_contribution(g, b.w1, count));
      add(base + b.y_low * a.gi.s2 + b.x_high * a.gi.s3, scatter_contribution(g, b.w2, count));
      add(base + b.y_high * a.gi.s2 + b.x_low * a.gi.s3, scatter_contribution(g, b.w3, count));
      add(base + b.y_high * a.gi.s2 + b.x_high * a.gi.s3, scatter_contribution(g, b.w4, count));
    }
}

// ---------------------------------------------------------------------------------------------
// Roi checks and counts.

/// The images [begin, end) of one chunk of the exact mode (its rois enumerate, the others wait for
/// their own chunk).
struct ImageRange {
  std::int64_t begin, end;
  DETOPS_HOST_DEVICE bool holds(std::int64_t n) const { return n >= begin && n < end; }
};

/// Samples of roi k (grid_h * grid_w * PH * PW) when it is a valid row of an image in `images`,
/// else 0.
template <class A>
DETOPS_HOST_DEVICE inline std::int64_t rotated_sample_count(const RoiSource& rois, std::int64_t k,
                                                            const RoiAlignRotatedShape& s, const ImageRange& images) {
  const RotatedBox<A> box = load_rotated_box<A>(rois, k, s);
  return box.batch < 0 || !images.holds(box.batch) ? 0 : box.grid_h * box.grid_w * s.PH * s.PW;
}

/// The roi check, one roi per thread: k in [0, K). Hands an invalid row's index to
/// `report_bad(k)` and, when `counts` is given, stores the roi's samples (0 when invalid) and
/// hands those of a valid row to `add_image(batch, samples)` (the per-image totals that size the
/// exact mode's chunks; the CUDA kernel adds them with integer atomics, which do not depend on the
/// order).
template <class A, class ReportBad, class AddImage>
DETOPS_HOST_DEVICE inline void roi_align_rotated_check_element(std::int64_t k, const RoiSource& rois,
                                                               const RoiAlignRotatedShape& s, std::int64_t* counts,
                                                               ReportBad&& report_bad, AddImage&& add_image) {
  const RotatedBox<A> box = load_rotated_box<A>(rois, k, s);
  if (box.status != RoiStatus::kOk) report_bad(k);
  if (!counts) return;
  counts[k] = box.batch < 0 ? 0 : box.grid_h * box.grid_w * s.PH * s.PW;
  if (box.batch >= 0) add_image(box.batch, counts[k]);
}

/// Per-roi sample counts of one chunk's rois for its record offsets, k in [0, K + 1); rois of
/// other images and entry K are 0, so an exclusive scan over K + 1 entries ends with the chunk's
/// total.
template <class A>
DETOPS_HOST_DEVICE inline void roi_align_rotated_count_element(std::int64_t k, const RoiSource& rois,
                                                               const RoiAlignRotatedShape& s, const ImageRange& images,
                                                               std::int64_t* counts) {
  counts[k] = k < s.K ? rotated_sample_count<A>(rois, k, s, images) : 0;
}

// ---------------------------------------------------------------------------------------------
// Backward, exact mode: an instance of the gather-backward engine (detail/gather_backward.h), one
// chunk of whole images [begin, end) at a time. Phase 1 writes 4 records per sample of the
// chunk's rois at the fixed index
//   4 * (roi_offsets[k] + bin * grid_h * grid_w + iy * grid_w + ix) + corner,
// the canonical order (roi, bin, sample, corner): key = position (n - begin)*H*W + y*W + x (the
// sentinel, the chunk's positions, for a sample beyond the apron), weight = w / count, source =
// the offset of grad_output[k, 0, ph, pw]. Phase 3 sums runs in partials of kGatherPartial records.
//
// CUDA's float64 truncated mode runs the same phases with `divisors` set: the records then hold
// the bare weight w and divisors[j] = count, so that phase 3 forms each contribution as the
// scatter does, (g * w) / count, and adds them in double in the CPU scatter's order (which is the
// canonical order): the CPU's bits, where double atomics would leave the scheduling order in them.

template <class A>
struct RotatedEnumerateArgs {
  RoiSource rois;
  const std::int64_t* roi_offsets;  // K + 1: exclusive prefix of rotated_sample_count over the chunk, in samples
  RoiAlignRotatedShape shape;
  Strides4 go;  // grad_output strides
  GatherRecords<A> rec;
  ImageRange images;           // the chunk
  double* divisors = nullptr;  // CUDA's float64 truncated mode only
};

/// Phase 1, one (roi, bin) per thread: t in [0, K*PH*PW). Rois without samples in the chunk
/// (other images', invalid rows, empty grids) write nothing and return before reading the roi;
/// records of samples beyond the apron keep gather_init_record's sentinel (set before this pass).
template <class A>
DETOPS_HOST_DEVICE inline void roi_align_rotated_enumerate_bin(std::int64_t t, const RotatedEnumerateArgs<A>& a) {
  const RoiAlignRotatedShape& s = a.shape;
  const std::int64_t bins = s.PH * s.PW;
  const std::int64_t k = t / bins, bin = t % bins;
  if (a.roi_offsets[k + 1] == a.roi_offsets[k]) return;  // every chunk launches every roi's threads
  const std::int64_t ph = bin / s.PW, pw = bin % s.PW;
  const RotatedBox<A> box = load_rotated_box<A>(a.rois, k, s);
  if (box.batch < 0 || !a.images.holds(box.batch)) return;  // contributes no records here (its count is 0)
  const std::int64_t per_bin = box.grid_h * box.grid_w;
  const std::int64_t first = 4 * (a.roi_offsets[k] + bin * per_bin);
  const GatherKey plane = static_cast<GatherKey>((box.batch - a.images.begin) * s.H * s.W);
  const A count = static_cast<A>(per_bin);
  const std::int64_t go_offset = k * a.go.s0 + ph * a.go.s2 + pw * a.go.s3;
  for (std::int64_t iy = 0; iy < box.grid_h; ++iy)
    for (std::int64_t ix = 0; ix < box.grid_w; ++ix) {
      const MapPoint<A> p = rotated_sample(box, ph, pw, iy, ix);
      const Bilinear<A> b = bilinear(p.y, p.x, s.H, s.W);
      if (!b.valid) continue;
      const std::int64_t j = first + 4 * (iy * box.grid_w + ix);
      const std::int64_t ys[4] = {b.y_low, b.y_low, b.y_high, b.y_high};
      const std::int64_t xs[4] = {b.x_low, b.x_high, b.x_low, b.x_high};
      const A ws[4] = {b.w1, b.w2, b.w3, b.w4};
      for (int q = 0; q < 4; ++q) {
        const GatherKey key = plane + static_cast<GatherKey>(ys[q] * s.W + xs[q]);
        gather_set_record(a.rec, j + q, key, a.divisors ? ws[q] : ws[q] / count, go_offset);
        if (a.divisors) a.divisors[j + q] = static_cast<double>(per_bin);
      }
    }
}

/// The engine's phase-3 arguments for one chunk: grad_output flows into grad_input (the chunk's
/// first image: keys count from it), `positions` is the chunk's sentinel, partials of
/// kGatherPartial.
template <class T>
DETOPS_HOST_DEVICE inline GatherSumArgs<T, acc_t<T>> rotated_gather_sum_args(const GatherSorted<acc_t<T>>& sorted,
                                                                             const T* grad_output, std::int64_t go_c,
                                                                             T* grad_input, std::int64_t gi_c,
                                                                             std::int64_t C, GatherKey positions) {
  return {sorted, grad_output, go_c, grad_input, gi_c, C, positions, kGatherPartial};
}

/// The float64 truncated mode's divisors into sorted order (the engine permutes weights and
/// sources): the r-th sorted record came from record sorted_ids[r].
DETOPS_HOST_DEVICE inline void roi_align_rotated_permute_divisor(std::int64_t r, const GatherIndex* sorted_ids,
                                                                 const double* divisors, double* sorted_divisors) {
  sorted_divisors[r] = divisors[sorted_ids[r]];
}

/// Phase 3 of the float64 truncated mode.
struct RotatedTruncatedArgs {
  GatherSumArgs<double, double> sum;  // sorted records (bare weights), grad_output, grad_input
  const double* divisors;             // sorted order
  RoiGatherTarget target;
  GradRounding rounding;
};

/// One (run, channel) per thread, mapped as the engine's gather_run_element maps them: the
/// scatter's contributions (g rounded, times w, over count) added in double in sorted order.
DETOPS_HOST_DEVICE inline void roi_align_rotated_truncated_gather_element(std::int64_t t, const RotatedTruncatedArgs& a,
                                                                          bool channels_last, std::int64_t runs) {
  const GatherSumArgs<double, double>& g = a.sum;
  const std::int64_t run = channels_last ? t / g.C : t % runs, c = channels_last ? t % g.C : t / runs;
  const GatherKey key = g.sorted.run_keys[run];
  if (key >= g.sentinel) return;
  const std::int64_t begin = g.sorted.run_offsets[run], end = begin + g.sorted.run_lengths[run];
  double acc = 0.0;
  for (std::int64_t r = begin; r < end; ++r) {
    const double grad = scatter_gradient<double>(g.upstream[g.sorted.sources[r] + c * g.upstream_c], a.rounding);
    acc += scatter_contribution(grad, g.sorted.weights[r], a.divisors[r]);
  }
  g.out[a.target(key) + c * g.out_c] = acc;
}

}  // namespace detail
}  // namespace detops
