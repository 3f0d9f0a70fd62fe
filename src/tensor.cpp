// TensorView helpers and the owning Tensor.
#include "detops/tensor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <numeric>
#include <vector>

#include "internal/common.h"
#include "internal/runtime.h"

namespace detops {

std::string to_string(Device d) { return d.is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", d.index); }

namespace {
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

/// Largest CPU allocation tried: no 64-bit CPU addresses more than 2^57 bytes (5-level paging),
/// so a larger request fails up front instead of in operator new (and instead of aborting under
/// AddressSanitizer, whose operator new never throws).
constexpr std::size_t kMaxCpuAllocation = std::size_t{1} << 57;

std::string dims_str(int rank, const std::int64_t* v) {
  return fmt::format("[{}]", fmt::join(v, v + rank, ", "));
}

/// The product of the sizes with each 0 counted as 1, or false when it does not fit in int64.
/// Sizes must be >= 0.
bool padded_count(int rank, const std::int64_t* sizes, std::int64_t* out) {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d)
    if (__builtin_mul_overflow(n, std::max<std::int64_t>(sizes[d], 1), &n)) return false;
  *out = n;
  return true;
}

/// Byte span of non-negative sizes and strides (0 when a size is 0), or false on overflow.
bool checked_span(int rank, const std::int64_t* sizes, const std::int64_t* strides, DType dtype, std::int64_t* out) {
  std::int64_t last = 0;
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] == 0) {
      *out = 0;
      return true;
    }
  }
  for (int d = 0; d < rank; ++d) {
    std::int64_t step = 0;
    if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &step) || __builtin_add_overflow(last, step, &last))
      return false;
  }
  std::int64_t span = 0;
  if (__builtin_add_overflow(last, 1, &last) ||
      __builtin_mul_overflow(last, static_cast<std::int64_t>(dtype_size(dtype)), &span))
    return false;
  *out = span;
  return true;
}

/// The caller's enumerations: a value outside DType, DeviceType or Layout (a cast integer, a
/// newer header) is an error, never read as its neighbour (DType(200) once sized 4-byte elements).
void check_kinds(const char* who, DType dtype, Device device, Layout layout) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt32:
    case DType::kInt64: break;
    default:
      internal::fail(kBad, "{}: dtype is {}, not a DType; expected float32, float64, float16, bfloat16, int32 or "
                     "int64", who, static_cast<int>(dtype));
  }
  if (!device.is_cpu() && !device.is_cuda())
    internal::fail(kBad, "{}: device type is {}, not a DeviceType; expected cpu or cuda", who,
                   static_cast<int>(device.type));
  if (layout != Layout::kNCHW && layout != Layout::kNHWC)
    internal::fail(kBad, "{}: layout is {}, not a Layout; expected NCHW or NHWC", who, static_cast<int>(layout));
}

/// The one validating constructor behind every TensorView constructor: rank in [0, kMaxRank],
/// sizes and strides >= 0, and an extent that fits (see tensor.h). strides == nullptr:
/// contiguous in `layout`.
void init_view(const char* who, TensorView& v, int rank, const std::int64_t* sizes, const std::int64_t* strides,
               Layout layout = Layout::kNCHW) {
  check_kinds(who, v.dtype, v.device, layout);
  if (rank < 0 || rank > kMaxRank)
    internal::fail(kBad, "{}: rank is {}; expected a rank in [0, {}]", who, rank, kMaxRank);
  if (rank > 0 && sizes == nullptr)
    internal::fail(kBad, "{}: sizes is a null pointer for rank {}; expected {} sizes", who, rank, rank);
  for (int d = 0; d < rank; ++d)
    if (sizes[d] < 0)
      internal::fail(kBad, "{}: sizes {} has negative size {} in dim {}; expected sizes >= 0", who,
                     dims_str(rank, sizes), sizes[d], d);
  std::int64_t count = 0;
  if (!padded_count(rank, sizes, &count))
    internal::fail(kBad, "{}: sizes {} hold more elements than int64 counts (the product of the sizes, 0 counted as "
                   "1, exceeds 2^63 - 1); expected a product below 2^63", who, dims_str(rank, sizes));
  v.rank = rank;
  std::copy(sizes, sizes + rank, v.sizes);
  if (strides) {
    for (int d = 0; d < rank; ++d)
      if (strides[d] < 0)
        internal::fail(kBad, "{}: strides {} has negative stride {} in dim {}; expected strides >= 0", who,
                       dims_str(rank, strides), strides[d], d);
    std::copy(strides, strides + rank, v.strides);
  } else {
    contiguous_strides(rank, sizes, v.strides, layout);  // cannot overflow: count fits
  }
  std::int64_t span = 0;
  if (!checked_span(rank, v.sizes, v.strides, v.dtype, &span))
    internal::fail(kBad, "{}: sizes {} with strides {} of {} span more than 2^63 - 1 bytes; expected a byte span that "
                   "fits in int64", who, dims_str(rank, v.sizes), dims_str(rank, v.strides), dtype_name(v.dtype));
  const auto base = reinterpret_cast<std::uintptr_t>(v.data);
  if (v.data && static_cast<std::uint64_t>(span) > UINTPTR_MAX - base)
    internal::fail(kBad, "{}: sizes {} with strides {} span {} bytes from address {}, past the end of the address "
                   "space; expected data + span to fit", who, dims_str(rank, v.sizes), dims_str(rank, v.strides),
                   span, v.data);
}

/// 64-byte aligned CPU memory, or cudaMalloc memory, released with the last owner.
std::shared_ptr<void> allocate_storage(const char* op, std::size_t bytes, Device device) {
  const std::size_t alloc = std::max<std::size_t>(bytes, 1);
  if (device.is_cpu()) {
    void* p = alloc > kMaxCpuAllocation ? nullptr : ::operator new(alloc, std::align_val_t{64}, std::nothrow);
    if (!p)
      internal::fail(ErrorCode::kOutOfMemory, "{}: cannot allocate {} bytes on {}{}", op, bytes, to_string(device),
                     alloc > kMaxCpuAllocation ? " (more than 2^57 bytes, beyond any 64-bit address space)" : "");
    return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t{64}); });
  }
  void* p = internal::cuda_malloc(alloc, device, op);
  return std::shared_ptr<void>(p, [device](void* q) { internal::cuda_free(q, device); });
}
}  // namespace

void contiguous_strides(int rank, const std::int64_t* sizes, std::int64_t* strides, Layout layout) {
  check_kinds("contiguous_strides", DType::kFloat32, Device::cpu(), layout);
  auto dim = [&](int d) { return std::max<std::int64_t>(sizes[d], 1); };
  auto mul = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r))
      internal::fail(kBad, "contiguous_strides: sizes {} need a stride above 2^63 - 1; expected sizes whose product "
                     "fits in int64", dims_str(rank, sizes));
    return r;
  };
  if (layout == Layout::kNHWC && rank == 4) {
    strides[1] = 1;
    strides[3] = dim(1);
    strides[2] = mul(strides[3], dim(3));
    strides[0] = mul(strides[2], dim(2));
    return;
  }
  std::int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = s;
    if (d > 0) s = mul(s, dim(d));
  }
}

namespace {
/// The list and vector constructors: `n` sizes and, with `has_strides`, `n_strides` strides (an
/// empty list's pointer may be null, so the flag, not the pointer, says whether strides were given).
void init_listed(TensorView& v, std::size_t n, const std::int64_t* sizes, bool has_strides,
                 const std::int64_t* strides, std::size_t n_strides) {
  if (has_strides && n_strides != n)
    internal::fail(kBad, "TensorView: {} strides given for {} sizes; expected one stride per size", n_strides, n);
  if (n > static_cast<std::size_t>(kMaxRank))
    internal::fail(kBad, "TensorView: rank is {}; expected a rank in [0, {}]", n, kMaxRank);
  init_view("TensorView", v, static_cast<int>(n), sizes, has_strides ? strides : nullptr);
}
}  // namespace

TensorView::TensorView(void* data_, DType dtype_, Device device_, std::initializer_list<std::int64_t> sizes_,
                       std::initializer_list<std::int64_t> strides_)
    : data(data_), dtype(dtype_), device(device_) {
  init_listed(*this, sizes_.size(), sizes_.begin(), true, strides_.begin(), strides_.size());
}

TensorView::TensorView(void* data_, DType dtype_, Device device_, std::initializer_list<std::int64_t> sizes_)
    : data(data_), dtype(dtype_), device(device_) {
  init_listed(*this, sizes_.size(), sizes_.begin(), false, nullptr, 0);
}

TensorView::TensorView(void* data_, DType dtype_, Device device_, const std::vector<std::int64_t>& sizes_)
    : data(data_), dtype(dtype_), device(device_) {
  init_listed(*this, sizes_.size(), sizes_.data(), false, nullptr, 0);
}

TensorView::TensorView(void* data_, DType dtype_, Device device_, const std::vector<std::int64_t>& sizes_,
                       const std::vector<std::int64_t>& strides_)
    : data(data_), dtype(dtype_), device(device_) {
  init_listed(*this, sizes_.size(), sizes_.data(), true, strides_.data(), strides_.size());
}

TensorView::TensorView(void* data_, DType dtype_, Device device_, int rank_, const std::int64_t* sizes_,
                       const std::int64_t* strides_)
    : data(data_), dtype(dtype_), device(device_) {
  init_view("TensorView", *this, rank_, sizes_, strides_);
}

std::int64_t TensorView::numel() const {
  if (rank < 0 || rank > kMaxRank)
    internal::fail(kBad, "TensorView::numel: rank is {}; expected a rank in [0, {}]", rank, kMaxRank);
  for (int d = 0; d < rank; ++d)
    if (sizes[d] < 0)
      internal::fail(kBad, "TensorView::numel: sizes {} has negative size {} in dim {}; expected sizes >= 0",
                     dims_str(rank, sizes), sizes[d], d);
  std::int64_t padded = 0;
  if (!padded_count(rank, sizes, &padded))
    internal::fail(kBad, "TensorView::numel: sizes {} hold more elements than int64 counts; expected a product of the "
                   "sizes (0 counted as 1) below 2^63", dims_str(rank, sizes));
  for (int d = 0; d < rank; ++d)
    if (sizes[d] == 0) return 0;
  return padded;  // no size is 0: the padded count is the count
}

bool TensorView::is_contiguous() const {
  if (rank < 0 || rank > kMaxRank) return false;
  std::int64_t expected = 1;
  bool beyond = false;  // the row-major stride expected next exceeds int64: no stride can match it
  for (int d = rank - 1; d >= 0; --d) {
    if (sizes[d] != 1 && (beyond || strides[d] != expected)) return false;
    if (!beyond && __builtin_mul_overflow(expected, sizes[d], &expected)) beyond = true;
  }
  return true;
}

Layout TensorView::layout() const {
  if (rank == 4 && strides[1] == 1 && sizes[1] > 1) return Layout::kNHWC;
  return Layout::kNCHW;
}

std::int64_t TensorView::span_bytes() const {
  if (numel() == 0) return 0;  // validates rank and sizes
  for (int d = 0; d < rank; ++d)
    if (strides[d] < 0)
      internal::fail(kBad, "TensorView::span_bytes: strides {} has negative stride {} in dim {}; expected strides >= 0",
                     dims_str(rank, strides), strides[d], d);
  std::int64_t span = 0;
  if (!checked_span(rank, sizes, strides, dtype, &span))
    internal::fail(kBad, "TensorView::span_bytes: sizes {} with strides {} of {} span more than 2^63 - 1 bytes; "
                   "expected a byte span that fits in int64", dims_str(rank, sizes), dims_str(rank, strides),
                   dtype_name(dtype));
  return span;
}

std::string TensorView::describe() const {
  if (rank < 0 || rank > kMaxRank)
    return fmt::format("(rank {}, outside [0, {}]) {} {}", rank, kMaxRank, dtype_name(dtype), to_string(device));
  return fmt::format("{} {} {} (strides {})", dims_str(rank, sizes), dtype_name(dtype), to_string(device),
                     dims_str(rank, strides));
}

Tensor Tensor::allocate(const char* op, int rank, const std::int64_t* sizes, DType dtype, Device device,
                        Layout layout) {
  Tensor t;
  t.view_.dtype = dtype;
  t.view_.device = device;
  init_view(op, t.view_, rank, sizes, nullptr, layout);  // all checks before anything is allocated
  t.bytes_ = static_cast<std::size_t>(t.view_.span_bytes());
  t.storage_ = allocate_storage(op, t.bytes_, device);
  t.view_.data = t.storage_.get();
  return t;
}

Tensor Tensor::empty(std::initializer_list<std::int64_t> sizes, DType dtype, Device device, Layout layout) {
  if (sizes.size() > static_cast<std::size_t>(kMaxRank))
    internal::fail(kBad, "Tensor::empty: rank is {}; expected a rank in [0, {}]", sizes.size(), kMaxRank);
  return allocate("Tensor::empty", static_cast<int>(sizes.size()), sizes.begin(), dtype, device, layout);
}

Tensor Tensor::empty(const std::vector<std::int64_t>& sizes, DType dtype, Device device, Layout layout) {
  if (sizes.size() > static_cast<std::size_t>(kMaxRank))
    internal::fail(kBad, "Tensor::empty: rank is {}; expected a rank in [0, {}]", sizes.size(), kMaxRank);
  return allocate("Tensor::empty", static_cast<int>(sizes.size()), sizes.data(), dtype, device, layout);
}

Tensor Tensor::zeros(std::initializer_list<std::int64_t> sizes, DType dtype, Device device, Layout layout) {
  Tensor t = empty(sizes, dtype, device, layout);
  t.fill_bytes(0);
  return t;
}

Tensor Tensor::zeros(const std::vector<std::int64_t>& sizes, DType dtype, Device device, Layout layout) {
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
  check_kinds("Tensor::to", view_.dtype, device, Layout::kNCHW);
  Tensor t;
  t.view_ = view_;
  t.view_.device = device;
  t.bytes_ = bytes_;
  t.storage_ = allocate_storage("Tensor::to", bytes_, device);
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
