// The CUDA step sequences RoIAlign and RoIAlignRotated share, written once over the device
// interface (internal/device_steps.h): the roi check on the device with its one wait, the
// backward's mode dispatch with the scatter modes' sequences (atomic adds into grad_input; the
// truncated mode's dense double buffer, rounded once) and its workspace, and the exact mode's
// per-roi record offsets, temporary bytes and workspace check. An op passes its own launches in
// as callables (src/internal/roi_align_device.h, roi_align_rotated_device.h); the CUDA backends
// run them on CudaDevice, the emulated tests on the emulated device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "detops/detail/roi_align_kernels.h"
#include "internal/device_steps.h"
#include "internal/roi_align_backend.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

// ---------------------------------------------------------------------------------------------
// Roi check

/// What the roi check found on the device: the first invalid row (-1 if none) with its values
/// (the op's columns) read back as doubles; with need_total, the samples of all rois and, when
/// the op counts them per image, the most that one image's rois hold.
struct DeviceRoiCheck {
  std::int64_t bad_row = -1;
  double row[8] = {};
  std::int64_t total_samples = 0;
  std::int64_t max_image_samples = 0;
};

/// The roi check of a call with K rows of `columns` on `dev`, with the one wait both ops
/// document. launch(A{}, first_bad, counts, image_samples) launches the op's check body over the
/// rows in the accumulation type A of the features: it keeps the smallest bad row in *first_bad
/// (an integer min, which does not depend on the order); with need_total it writes each roi's
/// samples to counts (null otherwise) and, with `per_image`, adds them into image_samples[batch]
/// (null otherwise). The sums are reduced on the device and read back with the first bad row; a
/// bad row's values are then read back for the message (an error path: a second wait).
template <class Dev, class Launch>
DeviceRoiCheck roi_check_on(const Dev& dev, const TensorView& features, const TensorView& rois, std::int64_t K,
                            int columns, bool need_total, bool per_image, Launch&& launch) {
  const char* op = dev.op;
  const std::int64_t N = features.sizes[0];
  const bool images = need_total && per_image;
  // A forward call only validates: no per-roi counts, no reduction (need_total is the backward's).
  const std::size_t sum_bytes = need_total ? dev.reduce_sum_bytes(K) : 0;
  const std::size_t max_bytes = images ? dev.reduce_max_bytes(N) : 0;
  WorkspaceLayout l;
  l.add<unsigned long long>(1);
  l.add<std::int64_t>(2);  // the total, the largest image's
  l.add<std::int64_t>(need_total ? K : 0);
  l.add<std::int64_t>(images ? N : 0);
  l.add_bytes(std::max(sum_bytes, max_bytes));
  const Scratch scratch(op, l.bytes(), features.device, dev.ctx);
  scratch.bind(l);
  auto* first_bad = l.take<unsigned long long>();
  auto* sums = l.take<std::int64_t>();
  std::int64_t* counts = l.take<std::int64_t>();
  std::int64_t* image_samples = l.take<std::int64_t>();
  void* temp = l.take<unsigned char>();
  if (!need_total) counts = nullptr;  // the check body then only validates
  if (!images) image_samples = nullptr;

  const auto none = static_cast<unsigned long long>(K);
  dev.copy_to_device(first_bad, &none, sizeof(none));
  if (images) dev.zero(image_samples, static_cast<std::size_t>(N) * sizeof(std::int64_t));
  dispatch_floating(features.dtype,
                    [&](auto tag) { launch(acc_t<decltype(tag)>{}, first_bad, counts, image_samples); });
  if (need_total) dev.reduce_sum(temp, sum_bytes, counts, sums, K);
  if (images) dev.reduce_max(temp, max_bytes, image_samples, sums + 1, N);
  unsigned long long bad = none;
  std::int64_t host_sums[2] = {0, 0};
  dev.copy_to_host(&bad, first_bad, sizeof(bad));
  if (need_total) dev.copy_to_host(host_sums, sums, (images ? 2 : 1) * sizeof(std::int64_t));
  dev.wait();  // the one documented wait

  DeviceRoiCheck check;
  check.total_samples = host_sums[0];
  check.max_image_samples = host_sums[1];
  if (bad < none) {
    // Bring the offending row to the host (the op re-runs its check there for the message).
    check.bad_row = static_cast<std::int64_t>(bad);
    const std::size_t es = dtype_size(rois.dtype);
    alignas(8) unsigned char host_row[sizeof(check.row)];  // read back as float or double
    for (int i = 0; i < columns; ++i) {
      const auto* src = static_cast<const unsigned char*>(rois.data) +
                        (check.bad_row * rois.strides[0] + i * rois.strides[1]) * es;
      dev.copy_to_host(host_row + i * es, src, es);
    }
    dev.wait();  // an error path: a second wait is fine
    detail::load_roi_row(host_row, rois.dtype, 1, 1, 0, check.row, columns);
  }
  return check;
}

/// An op's roi check (RoiCheck, RoiCheck) from the device's: the total, and for a bad row
/// its `columns` values and what the op's host check says of it, make_box(A{}, row) (a box with
/// status, grid_h and grid_w; A the accumulation type of `dtype`, as on the device).
template <class Check, class MakeBox>
Check roi_check_from_device(const DeviceRoiCheck& found, int columns, DType dtype, MakeBox&& make_box) {
  Check check;
  check.total_samples = found.total_samples;
  if (found.bad_row < 0) return check;
  check.bad_row = found.bad_row;
  std::copy(found.row, found.row + columns, check.row);
  dispatch_floating(dtype, [&](auto tag) {
    const auto box = make_box(acc_t<decltype(tag)>{}, check.row);
    check.status = box.status;
    check.grid_h = box.grid_h;
    check.grid_w = box.grid_w;
  });
  return check;
}

// ---------------------------------------------------------------------------------------------
// Backward

/// Whether the backward in `mode` runs the exact mode's phases, so that its workspace follows the
/// rois' samples: the exact mode, and the float64 truncated mode (double atomics would leave the
/// scheduling order in its sums; the phases give the CPU's order).
inline bool roi_backward_enumerates(DType dtype, BackwardMode mode) {
  return mode == BackwardMode::kExact || (mode == BackwardMode::kTruncated && dtype == DType::kFloat64);
}

/// Bytes of a roi op's device backward workspace in `mode`: none for kAtomic, the dense double
/// buffer for the 16- and 32-bit truncated mode, and otherwise exact_bytes(A{}, with_divisors),
/// the op's exact-mode layout in accumulation type A (float64's truncated mode: with divisors).
template <class ExactBytes>
std::size_t roi_backward_workspace_bytes(DType dtype, BackwardMode mode, const detail::RoiAlignShape& s,
                                         ExactBytes&& exact_bytes) {
  switch (mode) {
    case BackwardMode::kAtomic: return 0;
    case BackwardMode::kTruncated:
      if (dtype == DType::kFloat64) return exact_bytes(double{}, true);
      return truncated_buffer_bytes(s);
    case BackwardMode::kExact:
      return dispatch_floating(dtype, [&](auto tag) { return exact_bytes(acc_t<decltype(tag)>{}, false); });
  }
  return 0;
}

/// The type the scatter modes compute a contribution in: the accumulation type for the atomic mode
/// (adding into grad_input's T), double for the truncated mode (adding into its double buffer).
template <class T, class Target>
using scatter_value_t = std::conditional_t<std::is_same_v<Target, T>, acc_t<T>, double>;

/// The truncated mode's last step: the dense NCHW double buffer rounded once into grad_input.
template <class T>
struct TruncatedStoreBody {
  const double* buf;
  T* p;
  detail::Strides4 st;
  std::int64_t C, H, W;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const {
    detail::roi_align_truncated_store_element(i, buf, p, st, C, H, W);
  }
};

/// A roi op's backward into grad_input on `dev` in plan.mode, with the op's launches (T is
/// grad_input's element type):
///   scatter(T{}, target, strides, rounding): the op's scatter over its n > 0 grad_output
///     elements, adding into `target` with `strides` (grad_input itself for kAtomic; the dense NCHW
///     double buffer in ws for kTruncated), contributions in scatter_value_t<T, Target>;
///   exact(T{}, rounding): the exact mode's phases (rounding kNone), or the float64 truncated mode's.
template <class Dev, class Plan, class Scatter, class Exact>
void roi_backward_on(const Dev& dev, const TensorView& grad_input, const detail::RoiAlignShape& s, std::int64_t n,
                     const Plan& plan, Workspace ws, Scatter&& scatter, Exact&& exact) {
  dispatch_floating(grad_input.dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (plan.mode) {
      case BackwardMode::kAtomic:
        zero_fill<T>(dev, grad_input);
        if (n > 0) scatter(tag, static_cast<T*>(grad_input.data), strides4(grad_input), detail::GradRounding::kNone);
        break;
      case BackwardMode::kTruncated: {
        if constexpr (std::is_same_v<T, double>) {
          // Double atomics would leave the scheduling order in the result: the CPU's order instead.
          exact(tag, plan.rounding);
          break;
        }
        const std::int64_t total = s.N * s.C * s.H * s.W;
        if (s.K == 0) {  // no workspace was sized: nothing to accumulate
          zero_fill<T>(dev, grad_input);
          break;
        }
        auto* buf = static_cast<double*>(ws.data);
        dev.zero(buf, static_cast<std::size_t>(total) * sizeof(double));
        if (n > 0) scatter(tag, buf, detail::Strides4{s.C * s.H * s.W, s.H * s.W, s.W, 1}, plan.rounding);
        dev.launch("roi_truncated_store", total,
                   TruncatedStoreBody<T>{buf, static_cast<T*>(grad_input.data), strides4(grad_input), s.C, s.H, s.W});
        break;
      }
      case BackwardMode::kExact:
        exact(tag, detail::GradRounding::kNone);
        break;
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Exact mode

/// Temporary bytes of the exact mode: the engine's phase 2 over `records` records with keys up to
/// `sentinel`, and the scan of K + 1 per-roi counts into record offsets.
template <class Dev>
std::size_t roi_exact_temp_bytes_on(const Dev& dev, std::int64_t K, std::int64_t records, std::int64_t sentinel) {
  return std::max(gather_temp_bytes(dev, records, sentinel), dev.exclusive_sum_bytes(K + 1));
}

/// Phase 1's record offsets per roi: the exclusive scan of the K + 1 counts (the last is 0, so the
/// last offset is the total), in the engine's temporary memory.
template <class A, class Dev>
void scan_roi_offsets_on(const Dev& dev, const GatherDeviceBuffers<A>& g, const std::int64_t* counts,
                         std::int64_t* offsets, std::int64_t K) {
  dev.exclusive_sum(g.temp, g.temp_bytes, counts, offsets, K + 1);
}

/// The workspace given to the backward holds the exact mode's layout (`mode` names the mode that
/// runs its phases, for the message).
inline void check_exact_workspace(const char* op, const char* mode, std::size_t need, const Workspace& ws) {
  if (need > ws.bytes)
    fail(ErrorCode::kInvalidArgument, "{}: workspace has {} bytes; the {} mode needs {} here", op, ws.bytes, mode,
         need);
}

}  // namespace internal
}  // namespace detops
