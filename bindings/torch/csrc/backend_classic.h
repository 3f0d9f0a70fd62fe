// The classic registration layer's tensor backend (at::Tensor, the dispatcher, C++ autograd):
// source builds against one LibTorch (Debian's 1.13, or pip's torch for LibTorch C++ programs).
// bindings/torch/csrc/common.h includes this or backend_stable.h; the op glue is written once
// against the names below (Tensor, Optional, Str, view, context, new_empty, DeviceGuard, ...).
#pragma once

// torch 1.13's <torch/library.h> does not declare c10::Dispatcher, which the autograd kernels'
// typed calls need.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "detops/detops.h"
#include "detops/torch.h"

namespace detops {
namespace torch_ops {

using Tensor = at::Tensor;
// Kernel signatures use c10::string_view for `str` arguments and c10::optional for `T?`: the
// spellings both torch 1.13 and 2.x accept (in 2.x they alias the std types).
template <class T>
using Optional = c10::optional<T>;
using Str = c10::string_view;
constexpr auto kNone = c10::nullopt;

inline std::string_view sv(Str s) { return std::string_view(s.data(), s.size()); }

inline Tensor undefined() { return Tensor(); }
inline std::vector<int64_t> sizes_of(const Tensor& t) { return t.sizes().vec(); }
inline bool is_cuda(const Tensor& t) { return t.is_cuda(); }
/// Whether t holds float32, float64, float16 or bfloat16, and torch's name of its dtype.
inline bool is_float(const Tensor& t) {
  const auto type = t.scalar_type();
  return type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16;
}
inline std::string dtype_name(const Tensor& t) { return c10::toString(t.scalar_type()); }
/// torch's own answer (suggest_memory_format), so outputs keep the layout torch would give them.
inline bool is_channels_last(const Tensor& t) {
  return t.dim() == 4 && t.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
}

inline TensorView view(const Tensor& t, const char* what) { return detops::torch::view(t, what); }
inline Context context(const Tensor& like) { return detops::torch::context(like); }

/// A new tensor on like's device: like's dtype unless `dtype` is given, channels-last strides
/// when asked (4-d only).
inline Tensor empty_on(const Tensor& like, const std::vector<int64_t>& sizes, Optional<DType> dtype = kNone,
                        bool channels_last = false) {
  at::TensorOptions options = like.options();
  if (dtype.has_value()) {
    switch (*dtype) {
      case DType::kFloat32: options = options.dtype(at::kFloat); break;
      case DType::kFloat64: options = options.dtype(at::kDouble); break;
      case DType::kFloat16: options = options.dtype(at::kHalf); break;
      case DType::kBFloat16: options = options.dtype(at::kBFloat16); break;
      case DType::kInt32: options = options.dtype(at::kInt); break;
      case DType::kInt64: options = options.dtype(at::kLong); break;
    }
  }
  if (channels_last) options = options.memory_format(at::MemoryFormat::ChannelsLast);
  return at::empty(sizes, options);
}

/// A new int64 tensor in host memory.
inline Tensor empty_cpu_int64(const std::vector<int64_t>& sizes) {
  return at::empty(sizes, at::TensorOptions().dtype(at::kLong).device(at::kCPU));
}

/// Makes t's device current for the scope (CUDA kernels launch on it, torch's stream is its).
class DeviceGuard {
 public:
  explicit DeviceGuard(const Tensor& t) : guard_(t.device()) {}

 private:
  c10::DeviceGuard guard_;
};

/// torch.use_deterministic_algorithms' alert (error or warning, as the user chose).
inline void alert_not_deterministic(const char* what) { at::globalContext().alertNotDeterministic(what); }

/// Runs f() and rethrows a detops::Error as torch's own type (c10::ValueError -> ValueError, ...).
template <class F>
auto guarded(F&& f) -> decltype(std::forward<F>(f)()) {
  return detops::torch::guarded(std::forward<F>(f));
}

}  // namespace torch_ops
}  // namespace detops
