// Shared helpers of the op library's glue (bindings/torch/csrc/<op>.cpp): the tensor backend of
// the registration layer being built, mode-string parsing, and argument pre-checks that must run
// before an output can be shaped.
//
// Each <op>.cpp is compiled for one of two registration layers:
//   classic (default): at::Tensor, TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL, C++ autograd;
//                      source builds against one LibTorch (torch 1.13 up, C++ programs).
//   stable (DETOPS_TORCH_STABLE=1): torch/csrc/stable only, STABLE_TORCH_LIBRARY_*; autograd and
//                      fake kernels in Python (detops_torch/_ops/); one build serves every torch
//                      from the floor up (the wheel).
// The glue between (argument checks, output shapes, views, the calls into detops) is written once
// against the backend's names: Tensor, Optional<T>, Str, empty_on, view, context, DeviceGuard,
// guarded, alert_not_deterministic. Meta/fake kernels live in Python for both layers.
#pragma once

#ifndef DETOPS_TORCH_STABLE
#define DETOPS_TORCH_STABLE 0
#endif
#ifndef DETOPS_TORCH_CUDA
#define DETOPS_TORCH_CUDA 0
#endif

#if DETOPS_TORCH_STABLE
#include "backend_stable.h"
#else
#include "backend_classic.h"
#endif

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "detops/detops.h"

namespace detops {
namespace torch_ops {

inline std::string quoted(Str s) {
  // Appended piece by piece: GCC 12 in C++20 mode warns (-Wrestrict, a false positive) on
  // "'" + std::string(...) + "'".
  std::string out(1, '\'');
  out.append(sv(s));
  out.push_back('\'');
  return out;
}

/// "[2, 3, 4]", as torch prints sizes.
inline std::string sizes_str(const std::vector<int64_t>& sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}
inline std::string sizes_str(const Tensor& t) { return sizes_str(sizes_of(t)); }

/// The optional tensor's value, or an undefined tensor (detops' absent view).
inline Tensor value_or_undefined(const Optional<Tensor>& t) { return t.has_value() ? *t : undefined(); }
inline bool has_tensor(const Optional<Tensor>& t) { return t.has_value() && t->defined(); }

/// A tensor like t: its sizes, dtype and (4-d) memory format.
inline Tensor empty_like_format(const Tensor& t) { return empty_on(t, sizes_of(t), kNone, is_channels_last(t)); }

/// Throws ValueError (a detops::Error kInvalidArgument, through guarded()) for a mode string that
/// is none of the allowed ones; the message names the op, the argument, the allowed values and
/// what was given. Called by every forward kernel, so a bad mode fails at once, not in the
/// backward.
[[noreturn]] inline void bad_mode(const char* op, const char* arg, Str given, const char* allowed) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(op) + ": " + arg + " is " + quoted(given) + "; expected one of " + allowed);
}

/// A backward_mode string: the name (detops::to_string) of a mode the op offers (`caps`, the op's
/// k<Op>Capabilities).
inline BackwardMode parse_backward_mode(const char* op, Str s, const OpCapabilities& caps) {
  std::string allowed;
  for (BackwardMode m : kAllBackwardModes) {
    if (!caps.offers(m)) continue;
    if (sv(s) == to_string(m)) return m;
    allowed += std::string(allowed.empty() ? "'" : ", '") + to_string(m) + "'";
  }
  bad_mode(op, "backward_mode", s, allowed.c_str());
}

/// The unit of RoIAlignRotated's angle column: detectron2's degrees or mmcv's radians.
inline AngleUnit parse_angle_unit(const char* op, Str s) {
  if (sv(s) == "degrees") return AngleUnit::kDegrees;
  if (sv(s) == "radians") return AngleUnit::kRadians;
  bad_mode(op, "angle_unit", s, "'degrees', 'radians'");
}

inline GridSampleInterpolation parse_interpolation(const char* op, Str s) {
  if (sv(s) == "bilinear") return GridSampleInterpolation::kBilinear;
  if (sv(s) == "nearest") return GridSampleInterpolation::kNearest;
  bad_mode(op, "interpolation", s, "'bilinear', 'nearest'");
}

inline GridSamplePadding parse_padding(const char* op, Str s) {
  if (sv(s) == "zeros") return GridSamplePadding::kZeros;
  if (sv(s) == "border") return GridSamplePadding::kBorder;
  if (sv(s) == "reflection") return GridSamplePadding::kReflection;
  bad_mode(op, "padding_mode", s, "'zeros', 'border', 'reflection'");
}

/// grid_sample's grid values: torch's normalized [-1, 1], or point_sample's unit [0, 1].
inline GridSampleCoordinates parse_coordinates(const char* op, Str s) {
  if (sv(s) == "normalized") return GridSampleCoordinates::kNormalized;
  if (sv(s) == "unit") return GridSampleCoordinates::kUnit;
  bad_mode(op, "coordinates", s, "'normalized', 'unit'");
}

inline TruncationFormat parse_truncation(const char* op, Str s) {
  if (sv(s) == "float16") return TruncationFormat::kFloat16;
  if (sv(s) == "bfloat16") return TruncationFormat::kBFloat16;
  bad_mode(op, "truncation", s, "'float16', 'bfloat16'");
}

inline FrozenBnEpilogue parse_epilogue(const char* op, Str s) {
  if (sv(s) == "none") return FrozenBnEpilogue::kNone;
  if (sv(s) == "relu") return FrozenBnEpilogue::kRelu;
  if (sv(s) == "add_relu") return FrozenBnEpilogue::kAddRelu;
  bad_mode(op, "epilogue", s, "'none', 'relu', 'add_relu'");
}

inline SyncBnMode parse_sync_mode(const char* op, Str s) {
  if (sv(s) == "default") return SyncBnMode::kDefault;
  if (sv(s) == "exact") return SyncBnMode::kExact;
  bad_mode(op, "mode", s, "'default', 'exact'");
}

/// Outputs are shaped from their inputs before detops sees anything, so a tensor whose rank is
/// wrong must be refused here (in detops' style) rather than by an index error of torch's.
inline void require_dim(const char* op, const char* arg, const Tensor& t, int64_t dim, const char* shape) {
  if (!t.defined()) {
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + arg + " is undefined; expected " + shape);
  }
  if (t.dim() != dim) {
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + arg + " has " + std::to_string(t.dim()) +
                                                 " dimensions (sizes " + sizes_str(t) + "); expected " + shape);
  }
}

/// The ops compute in floating point: the tensor an output is made like is checked first, so that
/// a bool, complex or integer one is refused under its own name, with the dtypes the op takes
/// (not as the output's dtype, with the integer dtypes detops' views also take).
inline void require_float(const char* op, const char* arg, const Tensor& t) {
  if (!t.defined() || is_float(t)) return;
  throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + arg + " has dtype " + dtype_name(t) +
                                               "; expected float32, float64, float16 or bfloat16");
}

// The RoI ops' (roi_align, roi_align_rotated) output sizes [K, C, PH, PW] from the inputs. Ranks
// are checked here (torch would fail on size(1) first); a negative pooled size is clamped so that
// the allocation succeeds and detops reports it. rois_shape: "[K, 5]" or "[K, 6]".
inline std::vector<int64_t> roi_output_sizes(const char* op, const Tensor& input, const Tensor& rois,
                                             int64_t pooled_height, int64_t pooled_width, const char* rois_shape) {
  require_dim(op, "input", input, 4, "[N, C, H, W]");
  require_dim(op, "rois", rois, 2, rois_shape);
  require_float(op, "input", input);
  return {rois.size(0), input.size(1), std::max<int64_t>(pooled_height, 0), std::max<int64_t>(pooled_width, 0)};
}

// Their backward's grad_input [N, C, H, W] (sizes checked, as the forward's input had them).
inline Tensor roi_grad_input_like(const char* op, const Tensor& grad, int64_t batch_size, int64_t channels,
                                  int64_t height, int64_t width, bool channels_last) {
  require_dim(op, "grad", grad, 4, "[K, C, PH, PW]");
  for (int64_t s : {batch_size, channels, height, width}) {
    if (s < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(op) + ": input sizes [" + std::to_string(batch_size) + ", " + std::to_string(channels) +
                      ", " + std::to_string(height) + ", " + std::to_string(width) + "] have a negative size");
    }
  }
  return empty_on(grad, {batch_size, channels, height, width}, kNone, channels_last);
}

}  // namespace torch_ops
}  // namespace detops

// One registration block per op file serves both layers: the schema fragment and the CPU/CUDA
// kernels. Autograd is C++ in the classic layer (TORCH_LIBRARY_IMPL(detops, Autograd, ...)) and
// Python in the stable one.
#if DETOPS_TORCH_STABLE
#define DETOPS_LIBRARY_FRAGMENT(m) STABLE_TORCH_LIBRARY_FRAGMENT(detops, m)
#define DETOPS_LIBRARY_IMPL(key, m) STABLE_TORCH_LIBRARY_IMPL(detops, key, m)
#define DETOPS_KERNEL(fn) TORCH_BOX(&fn)
#else
#define DETOPS_LIBRARY_FRAGMENT(m) TORCH_LIBRARY_FRAGMENT(detops, m)
#define DETOPS_LIBRARY_IMPL(key, m) TORCH_LIBRARY_IMPL(detops, key, m)
#define DETOPS_KERNEL(fn) TORCH_FN(fn)
#endif

// An op file's kernels serve CPU and CUDA alike: detops picks the backend from the tensors'
// device (on CUDA, torch's current stream). `kernels` is the file's
// `template <class Library> void kernels(Library& m)` (in an anonymous namespace), which lists
// them once for both keys and both layers.
#if DETOPS_TORCH_CUDA
#define DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels) \
  DETOPS_LIBRARY_IMPL(CPU, m) { kernels(m); } \
  DETOPS_LIBRARY_IMPL(CUDA, m) { kernels(m); }
#else
#define DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels) \
  DETOPS_LIBRARY_IMPL(CPU, m) { kernels(m); }
#endif
