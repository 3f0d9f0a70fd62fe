// Argument checks shared by every op's entry point.
#include "internal/validate.h"

#include <algorithm>
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

std::string sizes_str(const TensorView& v) {
  std::vector<std::int64_t> s(v.sizes, v.sizes + v.rank);
  return fmt::format("[{}]", fmt::join(s, ", "));
}

void check_tensor(const char* op, const char* name, const TensorView& v, int rank) {
  if (v.rank != rank)
    fail(kBad, "{}: {} has rank {} (sizes {}); expected rank {}", op, name, v.rank, sizes_str(v), rank);
  for (int d = 0; d < rank; ++d) {
    if (v.sizes[d] < 0) fail(kBad, "{}: {} has negative size {} in dim {}; expected sizes >= 0", op, name, v.sizes[d], d);
    if (v.strides[d] < 0)
      fail(kBad, "{}: {} has negative stride {} in dim {}; expected strides >= 0", op, name, v.strides[d], d);
  }
  if (v.numel() > 0 && v.data == nullptr) fail(kBad, "{}: {} has {} elements but a null data pointer", op, name, v.numel());
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

}  // namespace internal
}  // namespace detops
