// Argument checks shared by every op's entry point.
#include "internal/validate.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "internal/common.h"

namespace detops {
namespace internal {

namespace {
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
}

// An explicit allow-list: any other value (int32, a dtype added later, or a value outside the
// enumeration) is rejected.
bool is_floating(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16: return true;
    default: return false;
  }
}

bool checked_affine(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t* out) {
  std::int64_t ab = 0;
  return !__builtin_mul_overflow(a, b, &ab) && !__builtin_add_overflow(ab, c, out);
}

bool checked_product(std::initializer_list<std::int64_t> factors, std::int64_t* out) {
  std::int64_t p = 1;
  bool over = false;
  for (std::int64_t f : factors) {
    if (f == 0) {
      *out = 0;
      return true;
    }
    over = over || __builtin_mul_overflow(p, f, &p);
  }
  if (!over) *out = p;
  return !over;
}

std::string sizes_str(const TensorView& v) {
  std::vector<std::int64_t> s(v.sizes, v.sizes + v.rank);
  return fmt::format("[{}]", fmt::join(s, ", "));
}

void check_tensor(const char* op, const char* name, const TensorView& v, int rank) {
  // The fields are public, so a view may never have met a TensorView constructor: every check the
  // constructors make is repeated here, in an order that reads no field out of range and
  // computes no product that could wrap (the ops then index within the span checked below).
  if (v.rank < 0 || v.rank > kMaxRank)
    fail(kBad, "{}: {} has rank {}; expected rank {}", op, name, v.rank, rank);
  if (v.rank != rank)
    fail(kBad, "{}: {} has rank {} (sizes {}); expected rank {}", op, name, v.rank, sizes_str(v), rank);
  for (int d = 0; d < rank; ++d) {
    if (v.sizes[d] < 0) fail(kBad, "{}: {} has negative size {} in dim {}; expected sizes >= 0", op, name, v.sizes[d], d);
    if (v.strides[d] < 0)
      fail(kBad, "{}: {} has negative stride {} in dim {}; expected strides >= 0", op, name, v.strides[d], d);
  }
  // Element count: the product of the sizes with 0 counted as 1 must fit, so that every product
  // of sizes an op forms (C * H * W, K * C, ...) fits as well, empty tensors included.
  std::int64_t count = 1;
  bool empty = false;
  for (int d = 0; d < rank; ++d) {
    empty = empty || v.sizes[d] == 0;
    if (__builtin_mul_overflow(count, std::max<std::int64_t>(v.sizes[d], 1), &count))
      fail(kBad, "{}: {} has sizes {}, more elements than int64 counts; expected a product of the sizes (0 counted "
           "as 1) below 2^63", op, name, sizes_str(v));
  }
  if (empty) count = 0;
  // Byte span: offset of the last element + 1, times the element size, in int64; and data + span
  // must not wrap the address space.
  std::int64_t span = 0;
  if (count > 0) {
    std::int64_t last = 0;
    bool over = false;
    for (int d = 0; d < rank && !over; ++d) {
      std::int64_t step = 0;
      over = __builtin_mul_overflow(v.sizes[d] - 1, v.strides[d], &step) || __builtin_add_overflow(last, step, &last);
    }
    over = over || __builtin_add_overflow(last, 1, &last) ||
           __builtin_mul_overflow(last, static_cast<std::int64_t>(dtype_size(v.dtype)), &span);
    if (over)
      fail(kBad, "{}: {} with sizes {} and strides [{}] of {} spans more than 2^63 - 1 bytes; expected a byte span "
           "that fits in int64", op, name, sizes_str(v), fmt::join(v.strides, v.strides + rank, ", "),
           dtype_name(v.dtype));
  }
  if (count > 0 && v.data == nullptr) fail(kBad, "{}: {} has {} elements but a null data pointer", op, name, count);
  if (count > 0 && static_cast<std::uint64_t>(span) > UINTPTR_MAX - reinterpret_cast<std::uintptr_t>(v.data))
    fail(kBad, "{}: {} spans {} bytes from address {}, past the end of the address space; expected data + span to fit",
         op, name, span, v.data);
  if (!v.device.is_cpu() && !v.device.is_cuda())
    fail(kBad, "{}: {} has device type {}, not a DeviceType; expected cpu or cuda", op, name,
         static_cast<int>(v.device.type));
  if (v.device.is_cuda() && v.device.index < 0)
    fail(kBad, "{}: {} is on cuda:{}; expected a device index >= 0", op, name, v.device.index);
}

void check_non_overlapping(const char* op, const char* name, const TensorView& v) {
  if (v.numel() <= 1) return;
  std::vector<int> dims;
  for (int d = 0; d < v.rank; ++d)
    if (v.sizes[d] > 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return v.strides[a] < v.strides[b]; });
  std::int64_t need = 1;
  for (int d : dims) {
    if (v.strides[d] < need)
      fail(kBad, "{}: {} {} has overlapping elements (strides [{}]); expected a non-overlapping output", op, name,
           sizes_str(v), fmt::join(std::vector<std::int64_t>(v.strides, v.strides + v.rank), ", "));
    need = v.strides[d] * v.sizes[d];
  }
}

void check_same_device(const char* op, const char* name, const TensorView& v, const char* ref_name,
                       const TensorView& ref) {
  if (v.device != ref.device)
    fail(kBad, "{}: {} is on {}; expected the device of {} ({})", op, name, to_string(v.device), ref_name,
         to_string(ref.device));
}

void check_no_partial_overlap(const char* op, const char* out_name, const TensorView& out, const char* in_name,
                              const TensorView& in, bool allow_in_place) {
  if (!out.defined() || !in.defined() || out.numel() == 0 || in.numel() == 0) return;
  if (out.device != in.device) return;
  const auto* o0 = static_cast<const unsigned char*>(out.data);
  const auto* i0 = static_cast<const unsigned char*>(in.data);
  const bool disjoint = o0 + out.span_bytes() <= i0 || i0 + in.span_bytes() <= o0;
  if (disjoint) return;
  bool same = out.data == in.data && out.rank == in.rank && out.dtype == in.dtype;
  for (int d = 0; same && d < out.rank; ++d) same = out.sizes[d] == in.sizes[d] && out.strides[d] == in.strides[d];
  if (same && allow_in_place) return;
  fail(kBad, "{}: {} overlaps {} in memory{}; expected {}", op, out_name, in_name,
       same ? "" : " without being the same view",
       allow_in_place ? fmt::format("either {} itself (in place) or disjoint memory", in_name)
                      : std::string("disjoint memory"));
}

void check_backward_mode(const char* op, const OpCapabilities& caps, BackwardMode mode) {
  if (caps.offers(mode)) return;
  std::vector<const char*> offered;
  for (BackwardMode m : kAllBackwardModes)
    if (caps.offers(m)) offered.push_back(to_string(m));
  std::string expected;  // "atomic or exact", "atomic, truncated or exact"
  for (std::size_t i = 0; i < offered.size(); ++i)
    expected += std::string(i == 0 ? "" : i + 1 == offered.size() ? " or " : ", ") + offered[i];
  if (std::find(std::begin(kAllBackwardModes), std::end(kAllBackwardModes), mode) != std::end(kAllBackwardModes))
    fail(kBad, "{}: backward mode {} is not offered by {}; expected {} (exact is bitwise reproducible)", op,
         to_string(mode), caps.name, expected);
  fail(kBad, "{}: backward mode {} is unknown; expected {}", op, static_cast<int>(mode), expected);
}

void check_floating(const char* op, const char* name, const TensorView& v) {
  if (!is_floating(v.dtype))
    fail(kBad, "{}: {} has dtype {}; expected a floating dtype (float32, float64, float16 or bfloat16)", op, name,
         dtype_name(v.dtype));
}

void check_like(const char* op, const char* name, const TensorView& v, const char* ref_name, const TensorView& ref) {
  check_tensor(op, name, v, ref.rank);
  bool same = true;
  for (int d = 0; d < ref.rank; ++d) same = same && v.sizes[d] == ref.sizes[d];
  if (!same)
    fail(kBad, "{}: {} has sizes {}; expected the sizes of {} {}", op, name, sizes_str(v), ref_name, sizes_str(ref));
  if (v.dtype != ref.dtype)
    fail(kBad, "{}: {} has dtype {}; expected {} (the dtype of {})", op, name, dtype_name(v.dtype),
         dtype_name(ref.dtype), ref_name);
  check_same_device(op, name, v, ref_name, ref);
}

void check_disjoint(const char* op, NamedView out, std::initializer_list<NamedView> others) {
  if (!out.view->defined()) return;
  for (const NamedView& o : others)
    if (o.view->defined()) check_no_partial_overlap(op, out.name, *out.view, o.name, *o.view, false);
}

void check_outputs(const char* op, std::initializer_list<NamedView> outputs) {
  for (auto a = outputs.begin(); a != outputs.end(); ++a) {
    if (!a->view->defined()) continue;
    check_non_overlapping(op, a->name, *a->view);
    for (auto b = outputs.begin(); b != a; ++b)
      if (b->view->defined()) check_no_partial_overlap(op, a->name, *a->view, b->name, *b->view, false);
  }
}

}  // namespace internal
}  // namespace detops
