// TensorView helpers and the owning Tensor.
#include "detops/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "internal/common.h"
#include "internal/runtime.h"

namespace detops {

std::string to_string(Device d) { return d.is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", d.index); }

namespace {
void set_shape(TensorView& v, std::initializer_list<std::int64_t> sizes) {
  if (sizes.size() > static_cast<std::size_t>(kMaxRank))
    internal::fail(ErrorCode::kInvalidArgument, "TensorView: rank {} exceeds the maximum {}", sizes.size(), kMaxRank);
  v.rank = static_cast<int>(sizes.size());
  std::copy(sizes.begin(), sizes.end(), v.sizes);
}
/// 64-byte aligned CPU memory, or cudaMalloc memory, released with the last owner.
std::shared_ptr<void> allocate_storage(std::size_t bytes, Device device) {
  const std::size_t alloc = std::max<std::size_t>(bytes, 1);
  if (device.is_cpu()) {
    void* p = ::operator new(alloc, std::align_val_t{64});
    return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t{64}); });
  }
  void* p = internal::cuda_malloc(alloc, device);
  return std::shared_ptr<void>(p, [device](void* q) { internal::cuda_free(q, device); });
}
}  // namespace

void contiguous_strides(int rank, const std::int64_t* sizes, std::int64_t* strides, Layout layout) {
  if (layout == Layout::kNHWC && rank == 4) {
    strides[1] = 1;
    strides[3] = std::max<std::int64_t>(sizes[1], 1);
    strides[2] = strides[3] * std::max<std::int64_t>(sizes[3], 1);
    strides[0] = strides[2] * std::max<std::int64_t>(sizes[2], 1);
    return;
  }
  std::int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = s;
    s *= std::max<std::int64_t>(sizes[d], 1);
  }
}

TensorView::TensorView(void* data_, DType dtype_, Device device_, std::initializer_list<std::int64_t> sizes_,
                       std::initializer_list<std::int64_t> strides_)
    : data(data_), dtype(dtype_), device(device_) {
  set_shape(*this, sizes_);
  if (strides_.size() != sizes_.size())
    internal::fail(ErrorCode::kInvalidArgument, "TensorView: {} strides given for {} sizes", strides_.size(),
                   sizes_.size());
  std::copy(strides_.begin(), strides_.end(), strides);
}

TensorView::TensorView(void* data_, DType dtype_, Device device_, std::initializer_list<std::int64_t> sizes_)
    : data(data_), dtype(dtype_), device(device_) {
  set_shape(*this, sizes_);
  contiguous_strides(rank, sizes, strides);
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= sizes[d];
  return n;
}

bool TensorView::is_contiguous() const {
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

Layout TensorView::layout() const {
  if (rank == 4 && strides[1] == 1 && sizes[1] > 1) return Layout::kNHWC;
  return Layout::kNCHW;
}

std::int64_t TensorView::span_bytes() const {
  if (numel() == 0) return 0;
  std::int64_t last = 0;
  for (int d = 0; d < rank; ++d) last += (sizes[d] - 1) * strides[d];
  return (last + 1) * static_cast<std::int64_t>(dtype_size(dtype));
}

std::string TensorView::describe() const {
  std::vector<std::int64_t> sz(sizes, sizes + rank), st(strides, strides + rank);
  return fmt::format("[{}] {} {} (strides [{}])", fmt::join(sz, ", "), dtype_name(dtype), to_string(device),
                     fmt::join(st, ", "));
}

Tensor Tensor::empty(std::initializer_list<std::int64_t> sizes, DType dtype, Device device, Layout layout) {
  Tensor t;
  set_shape(t.view_, sizes);
  for (auto s : sizes)
    if (s < 0) internal::fail(ErrorCode::kInvalidArgument, "Tensor::empty: negative size {}", s);
  t.view_.dtype = dtype;
  t.view_.device = device;
  contiguous_strides(t.view_.rank, t.view_.sizes, t.view_.strides, layout);
  t.bytes_ = static_cast<std::size_t>(t.view_.numel()) * dtype_size(dtype);
  t.storage_ = allocate_storage(t.bytes_, device);
  t.view_.data = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(std::initializer_list<std::int64_t> sizes, DType dtype, Device device, Layout layout) {
  Tensor t = empty(sizes, dtype, device, layout);
  t.fill_bytes(0);
  return t;
}

void Tensor::fill_bytes(unsigned char value) {
  if (!bytes_) return;
  if (view_.device.is_cpu()) std::memset(view_.data, value, bytes_);
  else internal::cuda_memset(view_.data, value, bytes_, view_.device);
}

Tensor Tensor::to(Device device) const {
  Tensor t;
  t.view_ = view_;
  t.view_.device = device;
  t.bytes_ = bytes_;
  t.storage_ = allocate_storage(bytes_, device);
  t.view_.data = t.storage_.get();
  internal::copy_bytes(t.view_.data, device, view_.data, view_.device, bytes_);
  return t;
}

Tensor Tensor::contiguous(Layout layout) const {
  if (view_.rank != 4) internal::fail(ErrorCode::kInvalidArgument, "Tensor::contiguous: expected a 4-d tensor");
  const Tensor src = view_.device.is_cpu() ? Tensor() : to(Device::cpu());
  const TensorView& s = view_.device.is_cpu() ? view_ : src.view_;
  Tensor dst = empty({s.sizes[0], s.sizes[1], s.sizes[2], s.sizes[3]}, s.dtype, Device::cpu(), layout);
  const std::size_t es = dtype_size(s.dtype);
  const auto* in = static_cast<const unsigned char*>(s.data);
  auto* out = static_cast<unsigned char*>(dst.view_.data);
  for (std::int64_t a = 0; a < s.sizes[0]; ++a)
    for (std::int64_t b = 0; b < s.sizes[1]; ++b)
      for (std::int64_t c = 0; c < s.sizes[2]; ++c)
        for (std::int64_t d = 0; d < s.sizes[3]; ++d) {
          const std::int64_t so = a * s.strides[0] + b * s.strides[1] + c * s.strides[2] + d * s.strides[3];
          const std::int64_t dof = a * dst.view_.strides[0] + b * dst.view_.strides[1] + c * dst.view_.strides[2] +
                                   d * dst.view_.strides[3];
          std::memcpy(out + dof * es, in + so * es, es);
        }
  return view_.device.is_cpu() ? std::move(dst) : dst.to(view_.device);
}

}  // namespace detops
