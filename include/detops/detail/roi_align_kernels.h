// Per-thread bodies of every RoIAlign kernel, as __host__ __device__ functions of a flat thread
// index. The CUDA launchers call them from one-line __global__ wrappers; the CPU backend calls
// the same geometry helpers; and the tests run these very bodies over an emulated grid on the
// CPU, so indexing and boundary errors show up without a GPU.
#pragma once

#include <cstdint>

#include "detops/detail/gather_backward.h"
#include "detops/detail/host_device.h"
#include "detops/detail/roi_align_math.h"
#include "detops/detail/strided.h"
#include "detops/dtype.h"

namespace detops {
namespace detail {

/// Reads the `columns` values of roi row k as doubles (exact for every supported dtype): for
/// RoIAlign out[0] = batch index, out[1..4] = x1, y1, x2, y2 (RoIAlignRotated reads 6 columns).
DETOPS_HOST_DEVICE inline void load_roi_row(const void* rois, DType dtype, std::int64_t s0, std::int64_t s1,
                                            std::int64_t k, double* out, int columns = 5) {
  for (int i = 0; i < columns; ++i) {
    const std::int64_t off = k * s0 + i * s1;
    switch (dtype) {
      case DType::kFloat64: out[i] = static_cast<const double*>(rois)[off]; break;
      case DType::kFloat16: out[i] = static_cast<float>(static_cast<const Half*>(rois)[off]); break;
      case DType::kBFloat16: out[i] = static_cast<float>(static_cast<const BFloat16*>(rois)[off]); break;
      default: out[i] = static_cast<const float*>(rois)[off]; break;
    }
  }
}

/// The rois of a call, as the kernels read them.
struct RoiSource {
  const void* data;
  DType dtype;
  std::int64_t s0, s1;
};

template <class A>
DETOPS_HOST_DEVICE inline RoiBox<A> load_roi_box(const RoiSource& rois, std::int64_t k, const RoiAlignShape& s) {
  double row[5];
  load_roi_row(rois.data, rois.dtype, rois.s0, rois.s1, k, row);
  RoiBox<A> box = make_roi_box<A>(row[0], row + 1, s);
  if (box.status != RoiStatus::kOk) box.batch = -1;
  return box;
}

/// Splits a flat index over [K, C, PH, PW] into (k, c, ph, pw): channel-slowest within a roi
/// (NCHW order) or channel-fastest (NHWC order), chosen to match the output's memory order so
/// neighbouring threads write neighbouring addresses.
struct BinIndex {
  std::int64_t k, c, ph, pw;
};
DETOPS_HOST_DEVICE inline BinIndex split_bin_index(std::int64_t i, std::int64_t C, std::int64_t PH, std::int64_t PW,
                                                   bool channels_last) {
  BinIndex b;
  if (channels_last) {
    b.c = i % C;
    i /= C;
    b.pw = i % PW;
    i /= PW;
    b.ph = i % PH;
    b.k = i / PH;
  } else {
    b.pw = i % PW;
    i /= PW;
    b.ph = i % PH;
    i /= PH;
    b.c = i % C;
    b.k = i / C;
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// Forward: one output element per thread.

template <class T>
struct ForwardArgs {
  const T* input;
  Strides4 in;  // n, c, h, w
  RoiSource rois;
  T* output;
  Strides4 out;  // k, c, ph, pw
  std::int32_t* argmax;  // max pooling only
  Strides4 am;
  RoiAlignShape shape;
  bool max_pool;
  bool channels_last;  // thread order
};

/// One bilinear sample of a plane (strided), in the accumulation type, with torchvision's
/// operation order: w1*v1 + w2*v2 + w3*v3 + w4*v4.
template <class T, class A>
DETOPS_HOST_DEVICE inline A interpolate(const T* plane, std::int64_t sh, std::int64_t sw, const Bilinear<A>& b) {
  const A v1 = to_acc(plane[b.y_low * sh + b.x_low * sw]);
  const A v2 = to_acc(plane[b.y_low * sh + b.x_high * sw]);
  const A v3 = to_acc(plane[b.y_high * sh + b.x_low * sw]);
  const A v4 = to_acc(plane[b.y_high * sh + b.x_high * sw]);
  return b.w1 * v1 + b.w2 * v2 + b.w3 * v3 + b.w4 * v4;
}

/// Max-pool update: the first maximal sample wins; a NaN sample wins once and then sticks (NaN
/// propagates, as in torch.max).
template <class A>
DETOPS_HOST_DEVICE inline bool max_pool_takes(A val, A best, std::int32_t best_index) {
  return best_index < 0 || val > best || (val != val && best == best);
}
/// The update itself, by selects (no branch: the CPU loops over channels vectorize with it).
template <class A>
DETOPS_HOST_DEVICE inline void max_pool_update(A val, std::int32_t index, A& best, std::int32_t& best_index) {
  const bool wins = max_pool_takes(val, best, best_index);
  best = wins ? val : best;
  best_index = wins ? index : best_index;
}

template <class T>
DETOPS_HOST_DEVICE inline void roi_align_forward_element(std::int64_t i, const ForwardArgs<T>& a) {
  using A = acc_t<T>;
  const RoiAlignShape& s = a.shape;
  const BinIndex bi = split_bin_index(i, s.C, s.PH, s.PW, a.channels_last);
  const RoiBox<A> box = load_roi_box<A>(a.rois, bi.k, s);
  T* out = a.output + bi.k * a.out.s0 + bi.c * a.out.s1 + bi.ph * a.out.s2 + bi.pw * a.out.s3;
  std::int32_t* am = a.max_pool ? a.argmax + bi.k * a.am.s0 + bi.c * a.am.s1 + bi.ph * a.am.s2 + bi.pw * a.am.s3
                                : nullptr;
  if (box.batch < 0) {  // invalid row (only reachable with check_rois = false)
    *out = from_acc<T>(A(0));
    if (am) *am = -1;
    return;
  }
  const T* plane = a.input + box.batch * a.in.s0 + bi.c * a.in.s1;
  if (!a.max_pool) {
    A acc = A(0);
    for (std::int64_t iy = 0; iy < box.grid_h; ++iy) {
      const A y = sample_coord(box.start_h, box.bin_h, bi.ph, iy, box.grid_h);
      for (std::int64_t ix = 0; ix < box.grid_w; ++ix) {
        const A x = sample_coord(box.start_w, box.bin_w, bi.pw, ix, box.grid_w);
        const Bilinear<A> b = bilinear(y, x, s.H, s.W);
        if (b.valid) acc += interpolate(plane, a.in.s2, a.in.s3, b);
      }
    }
    *out = from_acc<T>(acc / box.count);
  } else {
    A best = A(0);
    std::int32_t best_index = -1;
    for (std::int64_t iy = 0; iy < box.grid_h; ++iy) {
      const A y = sample_coord(box.start_h, box.bin_h, bi.ph, iy, box.grid_h);
      for (std::int64_t ix = 0; ix < box.grid_w; ++ix) {
        const A x = sample_coord(box.start_w, box.bin_w, bi.pw, ix, box.grid_w);
        const Bilinear<A> b = bilinear(y, x, s.H, s.W);
        const A val = b.valid ? interpolate(plane, a.in.s2, a.in.s3, b) : A(0);
        max_pool_update(val, static_cast<std::int32_t>(iy * box.grid_w + ix), best, best_index);
      }
    }
    *out = from_acc<T>(best);
    *am = best_index;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, scatter form (atomic and truncated modes): one grad_output element per thread,
// contributions handed to `add(offset_in_grad_input, value)`.

template <class T>
struct BackwardArgs {
  const T* grad_output;
  Strides4 go;  // k, c, ph, pw
  RoiSource rois;
  Strides4 gi;  // grad_input strides: n, c, h, w
  const std::int32_t* argmax;
  Strides4 am;
  RoiAlignShape shape;
  bool max_pool;
  bool channels_last;
};

/// How the backward rounds each incoming gradient before scattering it: not at all (kAtomic), or
/// to float16 / bfloat16 (kTruncated with its TruncationFormat).
enum class GradRounding : int { kNone = 0, kFloat16 = 1, kBFloat16 = 2 };

/// Rounds an incoming gradient as `r` prescribes.
DETOPS_HOST_DEVICE inline double truncate_gradient(double g, GradRounding r) {
  if (r == GradRounding::kFloat16) return static_cast<float>(from_double<Half>(g));
  if (r == GradRounding::kBFloat16) return static_cast<float>(from_double<BFloat16>(g));
  return g;
}

/// An incoming gradient as the scatter modes use it, in their contribution type V: rounded as
/// `r` prescribes (kTruncated), or as it is (kAtomic, r = kNone).
template <class V, class A>
DETOPS_HOST_DEVICE inline V scatter_gradient(A g, GradRounding r) {
  return r == GradRounding::kNone ? static_cast<V>(g) : static_cast<V>(truncate_gradient(static_cast<double>(g), r));
}

/// One corner's contribution, (g * w) / count in V: torchvision's order (count = 1 for max pooling).
template <class V, class W>
DETOPS_HOST_DEVICE inline V scatter_contribution(V g, W w, V count) {
  return g * static_cast<V>(w) / count;
}

/// V is the type contributions are computed in: acc_t<T> for kAtomic, double for kTruncated.
template <class T, class V, class Add>
DETOPS_HOST_DEVICE inline void roi_align_backward_scatter_element(std::int64_t i, const BackwardArgs<T>& a,
                                                                  GradRounding rounding, Add&& add) {
  using A = acc_t<T>;
  const RoiAlignShape& s = a.shape;
  const BinIndex bi = split_bin_index(i, s.C, s.PH, s.PW, a.channels_last);
  const RoiBox<A> box = load_roi_box<A>(a.rois, bi.k, s);
  if (box.batch < 0) return;
  const A g_acc = to_acc(a.grad_output[bi.k * a.go.s0 + bi.c * a.go.s1 + bi.ph * a.go.s2 + bi.pw * a.go.s3]);
  const V g = scatter_gradient<V>(g_acc, rounding);
  const std::int64_t base = box.batch * a.gi.s0 + bi.c * a.gi.s1;
  auto scatter = [&](const Bilinear<A>& b, V scale_num, V scale_den) {
    add(base + b.y_low * a.gi.s2 + b.x_low * a.gi.s3, scatter_contribution(scale_num, b.w1, scale_den));
    add(base + b.y_low * a.gi.s2 + b.x_high * a.gi.s3, scatter_contribution(scale_num, b.w2, scale_den));
    add(base + b.y_high * a.gi.s2 + b.x_low * a.gi.s3, scatter_contribution(scale_num, b.w3, scale_den));
    add(base + b.y_high * a.gi.s2 + b.x_high * a.gi.s3, scatter_contribution(scale_num, b.w4, scale_den));
  };
  if (!a.max_pool) {
    const V count = static_cast<V>(box.grid_h * box.grid_w);
    for (std::int64_t iy = 0; iy < box.grid_h; ++iy) {
      const A y = sample_coord(box.start_h, box.bin_h, bi.ph, iy, box.grid_h);
      for (std::int64_t ix = 0; ix < box.grid_w; ++ix) {
        const A x = sample_coord(box.start_w, box.bin_w, bi.pw, ix, box.grid_w);
        const Bilinear<A> b = bilinear(y, x, s.H, s.W);
        if (b.valid) scatter(b, g, count);
      }
    }
  } else {
    const std::int32_t idx = a.argmax[bi.k * a.am.s0 + bi.c * a.am.s1 + bi.ph * a.am.s2 + bi.pw * a.am.s3];
    if (idx < 0 || box.grid_w <= 0 || idx >= box.grid_h * box.grid_w) return;
    const std::int64_t iy = idx / box.grid_w, ix = idx % box.grid_w;
    const A y = sample_coord(box.start_h, box.bin_h, bi.ph, iy, box.grid_h);
    const A x = sample_coord(box.start_w, box.bin_w, bi.pw, ix, box.grid_w);
    const Bilinear<A> b = bilinear(y, x, s.H, s.W);
    if (b.valid) scatter(b, g, V(1));
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, exact mode: an instance of the gather-backward engine (detail/gather_backward.h).
// Phase 1 enumerates every (position, weight, bin, sample) contribution into fixed slots (4 per
// sample; slot order = roi, bin, sample, corner): the engine's records (key = position, source =
// grad_output[k, 0, ph, pw]) plus what max pooling needs (the argmax offset and the sample);
// phase 2 is the engine's sort; phase 3 its run sums without partials (split 0: these bits
// predate the engine), with max pooling's winner test as the engine's `active` predicate.

/// Samples (not slots) of each roi: grid_h * grid_w * PH * PW, 0 for invalid rows.
template <class A>
DETOPS_HOST_DEVICE inline std::int64_t roi_sample_count(const RoiSource& rois, std::int64_t k, const RoiAlignShape& s) {
  const RoiBox<A> box = load_roi_box<A>(rois, k, s);
  return box.batch < 0 ? 0 : box.grid_h * box.grid_w * s.PH * s.PW;
}

/// The roi check, one roi per thread: k in [0, K). Hands an invalid row's index to
/// `report_bad(k)` (the CUDA kernel keeps the smallest with an integer atomicMin, which does not
/// depend on the order) and, when `counts` is given, stores the roi's samples (0 when invalid).
template <class A, class ReportBad>
DETOPS_HOST_DEVICE inline void roi_align_check_element(std::int64_t k, const RoiSource& rois, const RoiAlignShape& s,
                                                       std::int64_t* counts, ReportBad&& report_bad) {
  double row[5];
  load_roi_row(rois.data, rois.dtype, rois.s0, rois.s1, k, row);
  const RoiBox<A> box = make_roi_box<A>(row[0], row + 1, s);
  const bool ok = box.status == RoiStatus::kOk;
  if (!ok) report_bad(k);
  if (counts) counts[k] = ok ? box.grid_h * box.grid_w * s.PH * s.PW : 0;
}

/// Per-roi sample counts for the exact mode's slot offsets, one entry per thread: k in
/// [0, K + 1); entry K is 0, so an exclusive scan over K + 1 entries ends with the total.
template <class A>
DETOPS_HOST_DEVICE inline void roi_align_count_element(std::int64_t k, const RoiSource& rois, const RoiAlignShape& s,
                                                       std::int64_t* counts) {
  counts[k] = k < s.K ? roi_sample_count<A>(rois, k, s) : 0;
}

template <class A>
struct ExactRecords {
  GatherKey* keys;          // position n*H*W + y*W + x, or the sentinel N*H*W for "no contribution"
  GatherIndex* ids;         // slot index (the sort's payload)
  A* weights;               // bilinear weight, divided by count for avg pooling (but see divisors)
  std::int64_t* go_offsets;  // offset of grad_output[k, 0, ph, pw]: the engine's record source
  std::int64_t* am_offsets;  // offset of argmax[k, 0, ph, pw] (max pooling; null for avg)
  std::int32_t* samples;     // iy*grid_w + ix within the bin (max pooling; null for avg)
  /// Only in CUDA's float64 truncated mode (null otherwise): each slot's divisor (count for avg
  /// pooling, 1 for max), and `weights` then holds the bare bilinear weight, so that phase 3 forms
  /// each contribution exactly as the scatter does, (g * w) / count.
  double* divisors = nullptr;

  /// The engine's view of the same slots.
  DETOPS_HOST_DEVICE GatherRecords<A> gather() const { return {keys, ids, weights, go_offsets}; }
};

/// Sets every field of slot j (one slot per thread: j in [0, cap)) before phase 1, so that slots
/// no roi fills (invalid rows, unchecked) sort last with the sentinel and are fully defined.
template <class A>
DETOPS_HOST_DEVICE inline void roi_align_exact_init_slot(std::int64_t j, const ExactRecords<A>& rec,
                                                         GatherKey sentinel) {
  gather_init_record(j, rec.gather(), sentinel);
  if (rec.am_offsets) rec.am_offsets[j] = 0;
  if (rec.samples) rec.samples[j] = -1;
  if (rec.divisors) rec.divisors[j] = 1.0;
}

template <class A>
struct EnumerateArgs {
  RoiSource rois;
  const std::int64_t* roi_offsets;  // exclusive prefix of roi_sample_count, in samples
  RoiAlignShape shape;
  bool max_pool;
  Strides4 go;  // grad_output strides
  Strides4 am;  // argmax strides
  ExactRecords<A> rec;
};

/// Phase 1, one (roi, bin) per thread: t in [0, K*PH*PW).
template <class A>
DETOPS_HOST_DEVICE inline void roi_align_exact_enumerate_bin(std::int64_t t, const EnumerateArgs<A>& a) {
  const RoiAlignShape& s = a.shape;
  const std::int64_t bins = s.PH * s.PW;
  const std::int64_t k = t / bins, bin = t % bins;
  const std::int64_t ph = bin / s.PW, pw = bin % s.PW;
  const RoiBox<A> box = load_roi_box<A>(a.rois, k, s);
  if (box.batch < 0) return;  // contributes no slots (its count is 0)
  const std::int64_t per_bin = box.grid_h * box.grid_w;
  const std::int64_t first = 4 * (a.roi_offsets[k] + bin * per_bin);
  const GatherKey plane = static_cast<GatherKey>(box.batch * s.H * s.W);
  const GatherKey sentinel = static_cast<GatherKey>(s.N * s.H * s.W);
  const A count = static_cast<A>(per_bin);
  const std::int64_t go_offset = k * a.go.s0 + ph * a.go.s2 + pw * a.go.s3;
  const std::int64_t am_offset = k * a.am.s0 + ph * a.am.s2 + pw * a.am.s3;
  for (std::int64_t iy = 0; iy < box.grid_h; ++iy) {
    const A y = sample_coord(box.start_h, box.bin_h, ph, iy, box.grid_h);
    for (std::int64_t ix = 0; ix < box.grid_w; ++ix) {
      const A x = sample_coord(box.start_w, box.bin_w, pw, ix, box.grid_w);
      const Bilinear<A> b = bilinear(y, x, s.H, s.W);
      const std::int64_t sample = iy * box.grid_w + ix;
      const std::int64_t j = first + 4 * sample;
      const std::int64_t ys[4] = {b.y_low, b.y_low, b.y_high, b.y_high};
      const std::int64_t xs[4] = {b.x_low, b.x_high, b.x_low, b.x_high};
      const A ws[4] = {b.w1, b.w2, b.w3, b.w4};
      for (int q = 0; q < 4; ++q) {
        const GatherKey key = b.valid ? plane + static_cast<GatherKey>(ys[q] * s.W + xs[q]) : sentinel;
        if (a.rec.divisors) {  // truncated: the bare weight and the scatter's divisor
          gather_set_record(a.rec.gather(), j + q, key, b.valid ? ws[q] : A(0), go_offset);
          a.rec.divisors[j + q] = a.max_pool ? 1.0 : static_cast<double>(per_bin);
        } else {
          gather_set_record(a.rec.gather(), j + q, key, b.valid ? (a.max_pool ? ws[q] : ws[q] / count) : A(0),
                            go_offset);
        }
        if (a.rec.am_offsets) a.rec.am_offsets[j + q] = am_offset;
        if (a.rec.samples) a.rec.samples[j + q] = static_cast<std::int32_t>(sample);
      }
    }
  }
}

/// Max pooling's winner test, the engine's `active` predicate: sorted slot r contributes to
/// channel c only when its sample won the bin in that channel. Always true for avg pooling.
struct RoiSlotActive {
  const std::int32_t* argmax;
  const std::int64_t* am_offsets;  // in sorted order
  const std::int32_t* samples;     // in sorted order
  std::int64_t am_c;               // argmax channel stride
  bool max_pool;
  DETOPS_HOST_DEVICE bool operator()(std::int64_t r, std::int64_t c) const {
    return !max_pool || argmax[am_offsets[r] + c * am_c] == samples[r];
  }
};

/// Phase 3 input: the slots permuted into sorted order, cut into runs of equal position.
template <class T>
struct GatherArgs {
  GatherSorted<acc_t<T>> sorted;  // runs, weights and grad_output offsets (the engine's sources)
  const T* grad_output;
  std::int64_t go_c;              // grad_output channel stride
  RoiSlotActive active;
  T* grad_input;
  Strides4 gi;
  RoiAlignShape shape;
  /// CUDA's float64 truncated mode only: the slots' divisors in sorted order, and the rounding of
  /// incoming gradients (roi_align_truncated_gather_element).
  const double* divisors = nullptr;
  GradRounding rounding = GradRounding::kNone;
};

/// The fixed-order sum of one run for one channel: the engine's, without partials.
template <class T>
DETOPS_HOST_DEVICE inline acc_t<T> exact_run_sum(const GatherArgs<T>& a, std::int64_t run, std::int64_t c) {
  return gather_run_sum(a.sorted, run, a.grad_output, a.go_c, c, 0, a.active);
}

/// Decodes a run's position into its grad_input offset (without the channel term): the
/// engine's destination map.
struct RoiGatherTarget {
  Strides4 gi;
  std::int64_t H, W;
  DETOPS_HOST_DEVICE std::int64_t operator()(GatherKey key) const {
    const std::int64_t pos = static_cast<std::int64_t>(key);
    const std::int64_t n = pos / (H * W), yx = pos % (H * W);
    return n * gi.s0 + (yx / W) * gi.s2 + (yx % W) * gi.s3;
  }
};
template <class T>
DETOPS_HOST_DEVICE inline RoiGatherTarget roi_gather_target(const GatherArgs<T>& a) {
  return {a.gi, a.shape.H, a.shape.W};
}
template <class T>
DETOPS_HOST_DEVICE inline std::int64_t exact_run_target(const GatherArgs<T>& a, GatherKey key) {
  return roi_gather_target(a)(key);
}

/// The engine's phase-3 arguments for this call: positions N*H*W, no partials.
template <class T>
DETOPS_HOST_DEVICE inline GatherSumArgs<T, acc_t<T>> roi_gather_sum_args(const GatherArgs<T>& a) {
  const RoiAlignShape& s = a.shape;
  return {a.sorted, a.grad_output, a.go_c, a.grad_input, a.gi.s1, s.C, static_cast<GatherKey>(s.N * s.H * s.W), 0};
}

/// Permutes RoIAlign's own slot fields (beyond the engine's weight and source) into sorted order:
/// the r-th sorted slot came from slot sorted_ids[r].
template <class A>
DETOPS_HOST_DEVICE inline void roi_align_permute_extras(std::int64_t r, const GatherIndex* sorted_ids,
                                                        const ExactRecords<A>& from, const ExactRecords<A>& to) {
  const GatherIndex j = sorted_ids[r];
  if (from.am_offsets) to.am_offsets[r] = from.am_offsets[j];
  if (from.samples) to.samples[r] = from.samples[j];
  if (from.divisors) to.divisors[r] = from.divisors[j];
}

/// Permutes every slot field into sorted order: r-th sorted slot came from slot ids[r].
template <class A>
DETOPS_HOST_DEVICE inline void roi_align_exact_permute(std::int64_t r, const GatherIndex* sorted_ids,
                                                       const ExactRecords<A>& from, const ExactRecords<A>& to) {
  gather_permute_record(r, sorted_ids, from.weights, from.go_offsets, to.weights, to.go_offsets);
  roi_align_permute_extras(r, sorted_ids, from, to);
}

// CUDA's float64 truncated mode. Double atomics would add in scheduling order, and with a float64
// grad_input nothing rounds the reordering away afterwards (about 40% of the elements would change
// between runs). So it reuses the exact mode's phases 1 and 2, with bare weights and divisors
// (ExactRecords::divisors), and phase 3 adds the scatter's contributions, (g * w) / count with g
// rounded to float16 or bfloat16, in double, in sorted slot order: the order (roi, bin, sample,
// corner) in which the CPU backend's scatter adds them into its double buffer. So it gives the
// CPU's bits, on every run.

/// The truncated sum of one run for one channel.
template <class T>
DETOPS_HOST_DEVICE inline double truncated_run_sum(const GatherArgs<T>& a, std::int64_t run, std::int64_t c) {
  const std::int64_t begin = a.sorted.run_offsets[run], end = begin + a.sorted.run_lengths[run];
  double acc = 0.0;
  for (std::int64_t r = begin; r < end; ++r) {
    if (!a.active(r, c)) continue;
    const double g = scatter_gradient<double>(to_acc(a.grad_output[a.sorted.sources[r] + c * a.go_c]), a.rounding);
    acc += scatter_contribution(g, a.sorted.weights[r], a.divisors[r]);  // the CPU scatter's contribution
  }
  return acc;
}

/// Phase 3 of the truncated mode, one (run, channel) per thread, mapped as the engine's
/// gather_run_element maps them; each sum rounded once to grad_input's dtype.
template <class T>
DETOPS_HOST_DEVICE inline void roi_align_truncated_gather_element(std::int64_t t, const GatherArgs<T>& a,
                                                                  bool channels_last, std::int64_t runs) {
  const std::int64_t C = a.shape.C;
  const std::int64_t run = channels_last ? t / C : t % runs, c = channels_last ? t % C : t / runs;
  const GatherKey key = a.sorted.run_keys[run];
  if (key >= static_cast<GatherKey>(a.shape.N * a.shape.H * a.shape.W)) return;
  a.grad_input[exact_run_target(a, key) + c * a.gi.s1] = from_double<T>(truncated_run_sum(a, run, c));
}

// ---------------------------------------------------------------------------------------------
// Whole-tensor passes over a strided grad_input: one element per thread, i in [0, N*C*H*W) in
// NCHW order.

/// The truncated mode's last step: element i of the dense NCHW double accumulator, rounded once
/// (to nearest even) into the strided grad_input.
template <class T>
DETOPS_HOST_DEVICE inline void roi_align_truncated_store_element(std::int64_t i, const double* buf, T* p,
                                                                 const Strides4& st, std::int64_t C, std::int64_t H,
                                                                 std::int64_t W) {
  p[nchw_element_offset(i, st, C, H, W)] = from_double<T>(buf[i]);
}

}  // namespace detail
}  // namespace detops
