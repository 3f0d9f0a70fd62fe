// LibTorch adapter (the optional detops::torch component): at::Tensor -> TensorView without a
// copy, a Context from torch's state, and detops::Error -> torch's error types.
//
// Header-only; needs LibTorch's headers and C++17. Link detops::torch (CMake), which carries
// detops::detops, torch's include directories and DETOPS_TORCH_CUDA (1 when the torch it was
// built against has CUDA; then <c10/cuda/...> are included and CUDA tensors get torch's current
// stream and caching allocator).
//
//   #include <detops/torch.h>
//   at::Tensor out = at::empty({k, c, 7, 7}, input.options());
//   detops::torch::guarded([&] {
//     detops::roi_align_forward(detops::torch::view(input, "input"), detops::torch::view(rois, "rois"),
//                               detops::torch::view(out, "output"), opts, detops::torch::context(input));
//   });
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "detops/context.h"
#include "detops/error.h"
#include "detops/tensor.h"

#ifndef DETOPS_TORCH_CUDA
#define DETOPS_TORCH_CUDA 0
#endif
#if DETOPS_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace detops {
namespace torch {

/// detops' dtype of a torch scalar type; throws Error (kInvalidArgument) naming `what` for the
/// types detops has no kernels for (integers other than int32/int64, complex, bool, ...).
inline DType dtype_of(c10::ScalarType type, const char* what = "tensor") {
  switch (type) {
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Double: return DType::kFloat64;
    case c10::ScalarType::Half: return DType::kFloat16;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    case c10::ScalarType::Int: return DType::kInt32;
    case c10::ScalarType::Long: return DType::kInt64;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("detops: ") + what + " has dtype " + c10::toString(type) +
                      "; expected float32, float64, float16, bfloat16, int32 or int64");
  }
}

/// detops' device of a torch device: CPU, or CUDA with its index. Anything else (meta, mps, a
/// CUDA tensor in a build without CUDA) is an Error (kInvalidArgument) naming `what`.
inline Device device_of(const c10::Device& device, const char* what = "tensor") {
  if (device.is_cpu()) return Device::cpu();
#if DETOPS_TORCH_CUDA
  if (device.is_cuda()) return Device::cuda(device.has_index() ? device.index() : 0);
#endif
  throw Error(ErrorCode::kInvalidArgument, std::string("detops: ") + what + " is on device " + device.str() +
                                               "; expected cpu" + (DETOPS_TORCH_CUDA ? " or cuda" : "") +
                                               " (this binding was built " +
                                               (DETOPS_TORCH_CUDA ? "with" : "without") + " CUDA)");
}

/// A view of t's memory: data_ptr() (storage offset included), sizes and strides in elements,
/// dtype and device. No copy: a channels-last or otherwise strided tensor stays a strided view,
/// and writes through the view land in t. An undefined tensor gives the absent view (detops'
/// "optional argument not given"). Throws Error (kInvalidArgument) for a dtype or device detops
/// does not take, a rank above kMaxRank, or a view detops rejects (see TensorView).
inline TensorView view(const at::Tensor& t, const char* what = "tensor") {
  if (!t.defined()) return {};
  const DType dtype = dtype_of(t.scalar_type(), what);
  const Device device = device_of(t.device(), what);
  if (t.dim() > kMaxRank) {
    throw Error(ErrorCode::kInvalidArgument, std::string("detops: ") + what + " has " + std::to_string(t.dim()) +
                                                 " dimensions; expected at most " + std::to_string(kMaxRank));
  }
  // data_ptr() is storage.data() + storage_offset * itemsize: the view starts where t starts.
  return TensorView(t.data_ptr(), dtype, device, static_cast<int>(t.dim()), t.sizes().data(),
                    t.strides().data());
}

/// Workspace allocations from torch's allocators, so that detops' scratch memory is counted and
/// cached by torch like any other tensor's (torch.cuda.memory_allocated, max_memory_allocated):
/// c10's CPU allocator on the CPU; on CUDA, the caching allocator, stream-ordered on the stream
/// detops passes (the semantics detops::Allocator asks for).
class TorchAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device, void* stream) override {
    if (bytes == 0) return nullptr;
#if DETOPS_TORCH_CUDA
    if (device.is_cuda()) {
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
    }
#else
    (void)stream;
#endif
    (void)device;
    return c10::GetCPUAllocator()->raw_allocate(bytes);
  }
  void deallocate(void* ptr, std::size_t bytes, Device device, void* stream) override {
    (void)bytes;
    (void)stream;
    if (ptr == nullptr) return;
#if DETOPS_TORCH_CUDA
    if (device.is_cuda()) {
      // The caching allocator recorded the stream at allocation: the block is reused on that
      // stream only after the work enqueued so far, which is what stream-ordered freeing means.
      c10::cuda::CUDACachingAllocator::raw_delete(ptr);
      return;
    }
#endif
    (void)device;
    c10::GetCPUAllocator()->raw_deallocate(ptr);
  }
};

/// The process's one TorchAllocator (stateless; a function-local static, so a header suffices).
inline Allocator& torch_allocator() {
  static TorchAllocator allocator;
  return allocator;
}

/// The Context for work on `like`'s device: torch's intra-op thread count
/// (at::get_num_threads(), what torch.set_num_threads sets), and on CUDA the current stream of
/// like's device (so detops' kernels are ordered with torch's) and the caching allocator.
inline Context context(const at::Tensor& like) {
  Context ctx;
  ctx.num_threads = at::get_num_threads();
  ctx.allocator = &torch_allocator();
#if DETOPS_TORCH_CUDA
  if (like.defined() && like.is_cuda()) {
    ctx.cuda_stream = static_cast<void*>(c10::cuda::getCurrentCUDAStream(like.device().index()).stream());
  }
#else
  (void)like;
#endif
  return ctx;
}

/// Rethrows a detops::Error as torch's error type, with detops' message verbatim:
/// kInvalidArgument -> c10::ValueError (Python ValueError), kOutOfMemory -> c10::OutOfMemoryError
/// (torch.cuda.OutOfMemoryError in Python), anything else -> c10::Error (RuntimeError).
[[noreturn]] inline void rethrow(const Error& error) {
  switch (error.code()) {
    case ErrorCode::kInvalidArgument: TORCH_CHECK_VALUE(false, error.what()); break;
    case ErrorCode::kOutOfMemory: TORCH_CHECK_WITH(OutOfMemoryError, false, error.what()); break;
    default: TORCH_CHECK(false, error.what()); break;
  }
  // TORCH_CHECK* with a false condition always throws; this keeps [[noreturn]] honest.
  throw std::runtime_error(error.what());
}

/// Runs f() and rethrows any detops::Error as torch's (see rethrow); returns what f returns.
template <class F>
auto guarded(F&& f) -> decltype(std::forward<F>(f)()) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& error) {
    rethrow(error);
  }
}

}  // namespace torch
}  // namespace detops
