// Shared helpers of the op library's kernels (bindings/torch/csrc): includes, mode-string
// parsing, argument pre-checks that must run before an output can be shaped, device guards.
#pragma once

// torch 1.13's <torch/library.h> does not declare c10::Dispatcher, which the autograd kernels'
// typed calls need.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "detops/detops.h"
#include "detops/torch.h"

namespace detops {
namespace torch_ops {

// Kernel signatures use c10::string_view for `str` arguments and c10::optional for `T?`: the
// spellings both torch 1.13 and 2.x accept (in 2.x they alias the std types).
using c10::optional;
using c10::string_view;

inline std::string quoted(string_view s) { return "'" + std::string(s.data(), s.size()) + "'"; }

/// Throws ValueError (a detops::Error kInvalidArgument, through guarded()) for a mode string that
/// is none of the allowed ones; the message names the op, the argument, the allowed values and
/// what was given. Called by every forward kernel (CPU, CUDA, Meta), so a bad mode fails at once,
/// not in the backward.
[[noreturn]] inline void bad_mode(const char* op, const char* arg, string_view given, const char* allowed) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(op) + ": " + arg + " is " + quoted(given) + "; expected one of " + allowed);
}

inline BackwardMode parse_backward_mode(const char* op, string_view s) {
  if (s == "exact") return BackwardMode::kExact;
  if (s == "truncated") return BackwardMode::kTruncated;
  if (s == "atomic") return BackwardMode::kAtomic;
  bad_mode(op, "backward_mode", s, "'exact', 'truncated', 'atomic'");
}

/// The backward modes of grid_sample and ms_deform_attn (they offer no truncated mode).
inline BackwardMode parse_exact_or_atomic(const char* op, string_view s) {
  if (s == "exact") return BackwardMode::kExact;
  if (s == "atomic") return BackwardMode::kAtomic;
  bad_mode(op, "mode", s, "'exact', 'atomic'");
}

/// The unit of RoIAlignRotated's angle column: detectron2's degrees or mmcv's radians.
inline AngleUnit parse_angle_unit(const char* op, string_view s) {
  if (s == "degrees") return AngleUnit::kDegrees;
  if (s == "radians") return AngleUnit::kRadians;
  bad_mode(op, "angle_unit", s, "'degrees', 'radians'");
}

inline GridSampleInterpolation parse_interpolation(const char* op, string_view s) {
  if (s == "bilinear") return GridSampleInterpolation::kBilinear;
  if (s == "nearest") return GridSampleInterpolation::kNearest;
  bad_mode(op, "interpolation", s, "'bilinear', 'nearest'");
}

inline GridSamplePadding parse_padding(const char* op, string_view s) {
  if (s == "zeros") return GridSamplePadding::kZeros;
  if (s == "border") return GridSamplePadding::kBorder;
  if (s == "reflection") return GridSamplePadding::kReflection;
  bad_mode(op, "padding_mode", s, "'zeros', 'border', 'reflection'");
}

inline TruncationFormat parse_truncation(const char* op, string_view s) {
  if (s == "float16") return TruncationFormat::kFloat16;
  if (s == "bfloat16") return TruncationFormat::kBFloat16;
  bad_mode(op, "truncation", s, "'float16', 'bfloat16'");
}

inline FrozenBnEpilogue parse_epilogue(const char* op, string_view s) {
  if (s == "none") return FrozenBnEpilogue::kNone;
  if (s == "relu") return FrozenBnEpilogue::kRelu;
  if (s == "add_relu") return FrozenBnEpilogue::kAddRelu;
  bad_mode(op, "epilogue", s, "'none', 'relu', 'add_relu'");
}

inline SyncBnMode parse_sync_mode(const char* op, string_view s) {
  if (s == "default") return SyncBnMode::kDefault;
  if (s == "exact") return SyncBnMode::kExact;
  bad_mode(op, "mode", s, "'default', 'exact'");
}

/// Outputs are shaped from their inputs before detops sees anything, so a tensor whose rank is
/// wrong must be refused here (in detops' style) rather than by an index error of torch's.
inline void require_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim, const char* shape) {
  if (!t.defined()) {
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + arg + " is undefined; expected " + shape);
  }
  if (t.dim() != dim) {
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + arg + " has " + std::to_string(t.dim()) +
                                                 " dimensions (sizes " + c10::str(t.sizes()) + "); expected " + shape);
  }
}

/// Meta kernels: the dispatcher picks Meta when any argument is a meta tensor, so a mix of meta
/// and real tensors arrives here and must be refused (shaping an output on the real device would
/// hide the mistake). Undefined tensors (absent optionals) are skipped.
inline void require_meta(const char* op, std::initializer_list<std::pair<const char*, const at::Tensor*>> args) {
  for (const auto& arg : args) {
    const at::Tensor& t = *arg.second;
    if (t.defined() && !t.is_meta()) {
      throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + arg.first + " is on device " +
                                                   t.device().str() + "; expected meta like the other arguments");
    }
  }
}

/// The optional tensor's value, or an undefined tensor (detops' absent view).
inline at::Tensor value_or_undefined(const optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

/// Memory format of a 4-d tensor's layout as torch reports it (channels_last stays channels_last).
inline at::MemoryFormat format_of(const at::Tensor& t) {
  return t.dim() == 4 ? t.suggest_memory_format() : at::MemoryFormat::Contiguous;
}

// The RoI ops' (roi_align, roi_align_rotated) output sizes [K, C, PH, PW] from the inputs. Ranks
// are checked here (torch would fail on size(1) first); a negative pooled size is clamped so that
// the allocation succeeds and detops reports it. rois_shape: "[K, 5]" or "[K, 6]".
inline std::vector<int64_t> roi_output_sizes(const char* op, const at::Tensor& input, const at::Tensor& rois,
                                             int64_t pooled_height, int64_t pooled_width, const char* rois_shape) {
  require_dim(op, "input", input, 4, "[N, C, H, W]");
  require_dim(op, "rois", rois, 2, rois_shape);
  return {rois.size(0), input.size(1), std::max<int64_t>(pooled_height, 0), std::max<int64_t>(pooled_width, 0)};
}

// Their backward's grad_input [N, C, H, W] (sizes checked, as the forward's input had them).
inline at::Tensor roi_grad_input_like(const char* op, const at::Tensor& grad, int64_t batch_size, int64_t channels,
                                      int64_t height, int64_t width, bool channels_last) {
  require_dim(op, "grad", grad, 4, "[K, C, PH, PW]");
  for (int64_t s : {batch_size, channels, height, width}) {
    if (s < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(op) + ": input sizes [" + std::to_string(batch_size) + ", " + std::to_string(channels) +
                      ", " + std::to_string(height) + ", " + std::to_string(width) + "] have a negative size");
    }
  }
  return at::empty({batch_size, channels, height, width},
                   grad.options().memory_format(channels_last ? at::MemoryFormat::ChannelsLast
                                                              : at::MemoryFormat::Contiguous));
}

}  // namespace torch_ops
}  // namespace detops
