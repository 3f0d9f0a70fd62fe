// TensorView, the non-owning strided view every detops op takes, and Tensor, a small owning
// tensor for tests, examples and callers without a framework. Layout is read from the strides:
// an NCHW-contiguous and an NHWC (channels-last) tensor are both views of sizes {N, C, H, W}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "detops/dtype.h"

namespace detops {

enum class DeviceType : std::uint8_t { kCPU, kCUDA };

/// A device: CPU, or a CUDA device with its ordinal.
struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend bool operator==(Device a, Device b) { return a.type == b.type && (a.is_cpu() || a.index == b.index); }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};
/// "cpu" or "cuda:1".
std::string to_string(Device d);

/// Memory format of a 4-d tensor.
enum class Layout : std::uint8_t { kNCHW, kNHWC };

inline constexpr int kMaxRank = 6;

/// A non-owning view: pointer, dtype, device, sizes and strides (in elements, 64-bit).
/// A default-constructed view is "absent" (data == nullptr and rank 0); it is used for optional
/// arguments.
///
/// Valid views. Every constructor (and every op, for each tensor argument, because the fields
/// are public and may be assigned directly) requires:
///   - 0 <= rank <= kMaxRank, sizes >= 0 and strides >= 0 (negative strides are rejected: no op
///     walks a tensor backwards);
///   - the extent fits: the product of the sizes, each 0 counted as 1, fits in int64 (so every
///     element count and every product of sizes an op forms fits too), the byte span
///     span_bytes() fits in int64, and data + span_bytes() does not wrap the address space.
/// A view that breaks a rule is a detops::Error (ErrorCode::kInvalidArgument) from the
/// constructor, from Tensor::empty / zeros, or from the op it is given to, before any memory is
/// touched. The constructors accept a null data pointer (a shape only); ops reject it when the
/// view has elements.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  int rank = 0;
  std::int64_t sizes[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};

  TensorView() = default;
  /// A view with explicit strides (in elements). Throws Error (kInvalidArgument) when the view is
  /// not valid (see above) or the number of strides differs from the number of sizes.
  TensorView(void* data, DType dtype, Device device, std::initializer_list<std::int64_t> sizes,
             std::initializer_list<std::int64_t> strides);
  /// A contiguous (row-major) view.
  TensorView(void* data, DType dtype, Device device, std::initializer_list<std::int64_t> sizes);
  /// The same from sizes (and strides) known at run time.
  TensorView(void* data, DType dtype, Device device, const std::vector<std::int64_t>& sizes);
  TensorView(void* data, DType dtype, Device device, const std::vector<std::int64_t>& sizes,
             const std::vector<std::int64_t>& strides);
  /// From `rank` sizes (and `rank` strides) at the given addresses; strides == nullptr means
  /// contiguous (row-major). sizes may be nullptr only for rank 0.
  TensorView(void* data, DType dtype, Device device, int rank, const std::int64_t* sizes,
             const std::int64_t* strides = nullptr);

  bool defined() const { return rank > 0 || data != nullptr; }
  std::int64_t size(int d) const { return sizes[d]; }
  std::int64_t stride(int d) const { return strides[d]; }
  /// Number of elements (1 for rank 0). Never wraps: throws Error (kInvalidArgument) when rank is
  /// outside [0, kMaxRank], a size is negative, or the product of the sizes (each 0 counted as 1)
  /// does not fit in int64.
  std::int64_t numel() const;
  /// Row-major contiguous (false for a rank outside [0, kMaxRank]; never throws).
  bool is_contiguous() const;
  /// For 4-d views: NHWC when the channel stride is 1 and C > 1 (or the strides are exactly
  /// channels-last), NCHW otherwise.
  Layout layout() const;
  /// Bytes spanned from data to one past the last addressable element (0 when empty). Never
  /// wraps: throws Error (kInvalidArgument) where numel() does, when a stride is negative, or when
  /// the span does not fit in int64. (Whether data + span wraps the address space is checked by
  /// the constructors and the ops, not here.)
  std::int64_t span_bytes() const;
  /// "[2, 256, 200, 272] float32 cuda:0 strides [..]" for messages. Never throws on a bad view
  /// (a rank outside [0, kMaxRank] is described as such).
  std::string describe() const;
};

/// Row-major strides for sizes, or channels-last strides for a 4-d NHWC layout (sizes of 0
/// count as 1). Throws Error (kInvalidArgument) when a stride does not fit in int64.
void contiguous_strides(int rank, const std::int64_t* sizes, std::int64_t* strides, Layout layout = Layout::kNCHW);

/// An owning tensor (CPU memory, or CUDA memory when the CUDA backend is built). Move-only.
class Tensor {
 public:
  Tensor() = default;
  /// Uninitialized tensor of the given sizes; 4-d tensors may be laid out channels-last.
  /// Errors: kInvalidArgument for a shape that is not a valid view (rank above kMaxRank, a
  /// negative size, an element count or byte size that does not fit in int64), before anything
  /// is allocated; kOutOfMemory when the allocation fails (the message names the bytes and the
  /// device; on the CPU a request above 2^57 bytes, more than any 64-bit address space, fails
  /// without being tried); kNotCompiled for a CUDA device in a CPU-only build.
  static Tensor empty(std::initializer_list<std::int64_t> sizes, DType dtype, Device device = Device::cpu(),
                      Layout layout = Layout::kNCHW);
  static Tensor empty(const std::vector<std::int64_t>& sizes, DType dtype, Device device = Device::cpu(),
                      Layout layout = Layout::kNCHW);
  /// As empty(), then every byte set to 0.
  static Tensor zeros(std::initializer_list<std::int64_t> sizes, DType dtype, Device device = Device::cpu(),
                      Layout layout = Layout::kNCHW);
  static Tensor zeros(const std::vector<std::int64_t>& sizes, DType dtype, Device device = Device::cpu(),
                      Layout layout = Layout::kNCHW);
  /// A copy on another device, same sizes and strides (synchronous). Allocation errors as empty().
  Tensor to(Device device) const;
  /// A copy laid out as requested on the same device (4-d only).
  Tensor contiguous(Layout layout = Layout::kNCHW) const;

  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }  // NOLINT: a Tensor is usable wherever a view is
  template <class T> T* data() const { return static_cast<T*>(view_.data); }
  std::int64_t numel() const { return view_.numel(); }
  std::int64_t size(int d) const { return view_.sizes[d]; }
  std::size_t nbytes() const { return bytes_; }
  /// Fill every byte with the given value (a "poisoned" buffer in tests). Synchronous, as zeros()
  /// and to() are: a device fill is complete on return, whatever stream the next op runs on.
  void fill_bytes(unsigned char value);

 private:
  static Tensor allocate(const char* op, int rank, const std::int64_t* sizes, DType dtype, Device device,
                         Layout layout);
  TensorView view_{};
  std::shared_ptr<void> storage_;
  std::size_t bytes_ = 0;
};

}  // namespace detops
