// The stable registration layer's tensor backend: LibTorch's stable ABI only (torch/csrc/stable,
// the C shim), for the wheel's _C.so, which one build serves on every torch from the floor up
// (DETOPS_TORCH_STABLE_FLOOR in cmake/DetopsTorch.cmake sets TORCH_TARGET_VERSION). The op glue is
// the classic layer's (bindings/torch/csrc/common.h picks the backend); what the stable boundary
// cannot carry is done in Python (detops_torch/_registry.py): autograd, fake kernels, the error
// types, the nondeterminism alert.
#pragma once

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "detops/detops.h"

#if DETOPS_TORCH_CUDA
// The shim declares aoti_torch_get_current_cuda_stream only with USE_CUDA defined before its
// first inclusion (torch's stable headers include it): cmake/DetopsTorch.cmake defines it.
#ifndef USE_CUDA
#error "the stable layer's CUDA kernels need USE_CUDA defined on the command line"
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#endif

namespace detops {
namespace torch_ops {

using Tensor = torch::stable::Tensor;
template <class T>
using Optional = std::optional<T>;
// TORCH_BOX unboxes a std::string_view parameter as a std::string that lives for the call.
using Str = std::string_view;
constexpr auto kNone = std::nullopt;

inline std::string_view sv(Str s) { return s; }

using ScalarType = torch::headeronly::ScalarType;

inline Tensor undefined() { return Tensor(); }

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  const auto s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}

inline bool is_cuda(const Tensor& t) { return t.is_cuda(); }
/// Whether t holds float32, float64, float16 or bfloat16, and torch's name of its dtype.
inline bool is_float(const Tensor& t) {
  using torch::headeronly::ScalarType;
  const ScalarType type = t.scalar_type();
  return type == ScalarType::Float || type == ScalarType::Double || type == ScalarType::Half ||
         type == ScalarType::BFloat16;
}
inline std::string dtype_name(const Tensor& t) { return torch::headeronly::toString(t.scalar_type()); }

/// torch's suggest_memory_format() for 4-d tensors (c10's is_channels_last_strides_2d_s4), which
/// the stable ABI does not offer: the same answer, so outputs get the layout the classic layer
/// (and torch) would give them.
inline bool is_channels_last(const Tensor& t) {
  if (t.dim() != 4) return false;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  int64_t min = 0;
  if (strides[1] == 0) return false;
  for (int d : {1, 3, 2, 0}) {
    if (sizes[d] == 0) return false;
    if (strides[d] < min) return false;
    // N111 tensors and N11W slices are ambiguous: torch calls them contiguous.
    if (d == 0 && min == strides[1]) return false;
    min = strides[d];
    if (sizes[d] > 1) min *= sizes[d];
  }
  return true;
}

inline ScalarType scalar_type_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ScalarType::Float;
    case DType::kFloat64: return ScalarType::Double;
    case DType::kFloat16: return ScalarType::Half;
    case DType::kBFloat16: return ScalarType::BFloat16;
    case DType::kInt32: return ScalarType::Int;
    case DType::kInt64: return ScalarType::Long;
  }
  return ScalarType::Float;
}

inline DType dtype_of(ScalarType type, const char* what) {
  switch (type) {
    case ScalarType::Float: return DType::kFloat32;
    case ScalarType::Double: return DType::kFloat64;
    case ScalarType::Half: return DType::kFloat16;
    case ScalarType::BFloat16: return DType::kBFloat16;
    case ScalarType::Int: return DType::kInt32;
    case ScalarType::Long: return DType::kInt64;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("detops: ") + what + " has dtype " + torch::headeronly::toString(type) +
                      "; expected float32, float64, float16, bfloat16, int32 or int64");
  }
}

/// torch's name of a device ("cpu", "cuda:1", "meta", ...), for messages.
inline std::string device_name(const torch::stable::Device& device) {
  using torch::headeronly::DeviceType;
  std::string name;
  switch (device.type()) {
    case DeviceType::CPU: name = "cpu"; break;
    case DeviceType::CUDA: name = "cuda"; break;
    case DeviceType::Meta: name = "meta"; break;
    case DeviceType::MPS: name = "mps"; break;
    case DeviceType::XPU: name = "xpu"; break;
    default: name = "device type " + std::to_string(static_cast<int>(device.type())); break;
  }
  if (device.has_index() && device.type() != DeviceType::CPU) name += ":" + std::to_string(device.index());
  return name;
}

inline Device device_of(const Tensor& t, const char* what) {
  const torch::stable::Device device = t.device();
  if (device.is_cpu()) return Device::cpu();
#if DETOPS_TORCH_CUDA
  if (device.is_cuda()) return Device::cuda(device.has_index() ? device.index() : 0);
#endif
  throw Error(ErrorCode::kInvalidArgument, std::string("detops: ") + what + " is on device " + device_name(device) +
                                               "; expected cpu" + (DETOPS_TORCH_CUDA ? " or cuda" : "") +
                                               " (this binding was built " +
                                               (DETOPS_TORCH_CUDA ? "with" : "without") + " CUDA)");
}

/// A view of t's memory (see detops::torch::view in the classic layer: the same contract).
inline TensorView view(const Tensor& t, const char* what) {
  if (!t.defined()) return {};
  const DType dtype = dtype_of(t.scalar_type(), what);
  const Device device = device_of(t, what);
  if (t.dim() > kMaxRank) {
    throw Error(ErrorCode::kInvalidArgument, std::string("detops: ") + what + " has " + std::to_string(t.dim()) +
                                                 " dimensions; expected at most " + std::to_string(kMaxRank));
  }
  return TensorView(t.data_ptr(), dtype, device, static_cast<int>(t.dim()), t.sizes().data(), t.strides().data());
}

/// A new tensor on like's device, from torch's allocator (its caching allocator on CUDA).
inline Tensor empty_on(const Tensor& like, const std::vector<int64_t>& sizes, Optional<DType> dtype = kNone,
                        bool channels_last = false) {
  const ScalarType type = dtype.has_value() ? scalar_type_of(*dtype) : like.scalar_type();
  const auto format = channels_last ? torch::headeronly::MemoryFormat::ChannelsLast
                                    : torch::headeronly::MemoryFormat::Contiguous;
  return torch::stable::empty(torch::headeronly::IntHeaderOnlyArrayRef(sizes.data(), sizes.size()), type,
                              std::nullopt, like.device(), std::nullopt, format);
}

/// A new int64 tensor in host memory.
inline Tensor empty_cpu_int64(const std::vector<int64_t>& sizes) {
  const torch::stable::Device cpu(torch::headeronly::DeviceType::CPU);
  return torch::stable::empty(torch::headeronly::IntHeaderOnlyArrayRef(sizes.data(), sizes.size()),
                              ScalarType::Long, std::nullopt, cpu);
}

/// detops' scratch memory as torch tensors (torch::stable::empty of bytes), so torch counts and
/// caches it like any other allocation; on CUDA the caching allocator orders each block on the
/// current stream, the one detops runs on. A block lives from allocate() to deallocate(), both
/// within one op call; the table only maps the pointer back to its tensor.
class StableAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device, void* stream) override {
    (void)stream;
    if (bytes == 0) return nullptr;
    const auto type = device.is_cuda() ? torch::headeronly::DeviceType::CUDA : torch::headeronly::DeviceType::CPU;
    using DeviceIndex = torch::stable::accelerator::DeviceIndex;
    const torch::stable::Device where(type, static_cast<DeviceIndex>(device.is_cuda() ? device.index : -1));
    Tensor block = torch::stable::empty({static_cast<int64_t>(bytes)}, ScalarType::Byte, std::nullopt, where);
    void* ptr = block.data_ptr();
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.emplace(ptr, std::move(block));
    return ptr;
  }
  void deallocate(void* ptr, std::size_t, Device, void*) override {
    if (ptr == nullptr) return;
    Tensor block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(ptr);
      if (it == blocks_.end()) return;
      block = std::move(it->second);
      blocks_.erase(it);
    }
    // `block` releases its storage here, outside the lock.
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, Tensor> blocks_;
};

inline Allocator& stable_allocator() {
  static StableAllocator allocator;
  return allocator;
}

/// The Context for work on like's device: torch's intra-op thread count, its allocator, and on
/// CUDA the current stream of like's device (through the C shim).
inline Context context(const Tensor& like) {
  Context ctx;
  ctx.num_threads = static_cast<int>(torch::stable::get_num_threads());
  ctx.allocator = &stable_allocator();
#if DETOPS_TORCH_CUDA
  if (like.defined() && like.is_cuda()) {
    void* stream = nullptr;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(like.get_device_index(), &stream));
    ctx.cuda_stream = stream;
  }
#else
  (void)like;
#endif
  return ctx;
}

class DeviceGuard {
 public:
  explicit DeviceGuard(const Tensor& t) {
    if (t.is_cuda()) guard_.emplace(t.get_device_index());
  }

 private:
  std::optional<torch::stable::accelerator::DeviceGuard> guard_;
};

/// The stable ABI has no hook into torch's alert: the Python autograd layer raises it.
inline void alert_not_deterministic(const char*) {}

/// The error type travels as a tag at the start of the message ("[detops:ValueError] ..."): the
/// stable boundary turns every C++ exception into RuntimeError, and detops_torch/_registry.py
/// raises ValueError / torch.OutOfMemoryError from the tag (the classic layer's types).
[[noreturn]] inline void rethrow(const Error& error) {
  switch (error.code()) {
    case ErrorCode::kInvalidArgument: throw std::runtime_error(std::string("[detops:ValueError] ") + error.what());
    case ErrorCode::kOutOfMemory: throw std::runtime_error(std::string("[detops:OutOfMemoryError] ") + error.what());
    default: throw std::runtime_error(error.what());
  }
}

template <class F>
auto guarded(F&& f) -> decltype(std::forward<F>(f)()) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& error) {
    rethrow(error);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("[detops:OutOfMemoryError] detops: out of memory");
  }
}

}  // namespace torch_ops
}  // namespace detops
