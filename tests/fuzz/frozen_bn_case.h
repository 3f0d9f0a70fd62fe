// Pieces shared by the FrozenBatchNorm2d fuzz targets: shapes, [C] parameter tensors, element
// values, and the elementwise comparison with the float64 reference
// (tests/reference/frozen_batch_norm_reference.h).
#pragma once

#include "fuzz_common.h"
#include "reference/frozen_batch_norm_reference.h"

namespace detops {
namespace fuzz {

inline const char* epilogue_str(FrozenBnEpilogue e) {
  switch (e) {
    case FrozenBnEpilogue::kNone: return "none";
    case FrozenBnEpilogue::kRelu: return "relu";
    case FrozenBnEpilogue::kAddRelu: return "add_relu";
  }
  return "unknown";
}

inline ref::FbnEpilogueRef to_ref(FrozenBnEpilogue e) {
  return e == FrozenBnEpilogue::kAddRelu ? ref::FbnEpilogueRef::kAddRelu
         : e == FrozenBnEpilogue::kRelu  ? ref::FbnEpilogueRef::kRelu
                                         : ref::FbnEpilogueRef::kNone;
}

inline const char* dtype_str(DType dt) {
  return is_float_dtype(dt) || dt == DType::kInt32 ? dtype_name(dt).data() : "unknown";
}

/// [N, C, H, W] of a FrozenBatchNorm2d call: small, sometimes empty, sometimes 16+ channels.
struct FbnShape {
  std::int64_t sizes[4] = {1, 1, 1, 1};
  std::int64_t N() const { return sizes[0]; }
  std::int64_t C() const { return sizes[1]; }
  std::int64_t HW() const { return sizes[2] * sizes[3]; }
  std::int64_t numel() const { return sizes[0] * sizes[1] * sizes[2] * sizes[3]; }
};

inline FbnShape decode_shape(Reader& r) {
  FbnShape s;
  s.sizes[0] = 1 + r.range(0, 2);
  s.sizes[1] = 1 + r.range(0, 4);
  s.sizes[2] = 1 + r.range(0, 5);
  s.sizes[3] = 1 + r.range(0, 5);
  if (r.one_in(16)) s.sizes[1] = 16 + r.range(0, 3);
  if (r.one_in(16)) s.sizes[3] = 9 + r.range(0, 40);
  if (r.one_in(20)) s.sizes[r.u8() % 4] = 0;
  return s;
}

inline DType decode_data_dtype(Reader& r, Expect* e) {
  static const DType floats[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  DType dt = floats[r.u8() % 4];
  if (r.one_in(64)) {
    dt = DType::kInt32;
    expect_error(e);
  } else if (r.one_in(128)) {
    dt = static_cast<DType>(5 + r.u8() % 200);
    expect_unknown_dtype(e);
  }
  return dt;
}

/// A [C] parameter (scale or shift): float32 (float64 for float64 data), contiguous; rarely a bad
/// dtype, size, rank or stride.
inline Spec decode_param(Reader& r, const char* name, std::int64_t C, DType data_dt, Expect* e) {
  Spec s;
  s.name = name;
  s.dtype = data_dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  s.rank = 1;
  s.sizes[0] = C;
  s.strides[0] = 1;
  if (r.one_in(64)) {
    s.dtype = s.dtype == DType::kFloat64 ? DType::kFloat32 : r.one_in(2) ? DType::kFloat64 : DType::kFloat16;
    expect_error(e);
  }
  if (r.one_in(64)) {
    s.sizes[0] = C + (r.one_in(2) ? 1 : -1);
    if (s.sizes[0] < 0) s.sizes[0] = C + 1;
    expect_error(e);
  }
  if (r.one_in(48)) {
    s.strides[0] = r.one_in(2) ? 0 : 2;  // broadcast or strided: the library wants [C] contiguous
    if (s.sizes[0] > 1) expect_error(e);
  }
  if (r.one_in(64)) {
    s.rank = 2;
    s.sizes[1] = 1;
    s.strides[1] = 1;
    expect_error(e);
  }
  return s;
}

/// Values for a data tensor: moderate, with specials in one tensor of eight.
inline void fill_values(Reader& r, const Tensor4& t) {
  if (!t.view.defined() || !t.view.data || !t.view.device.is_cpu() || count(t.view) <= 0) return;
  const bool specials = r.one_in(8);
  std::vector<double> v(static_cast<std::size_t>(count(t.view)));
  for (double& x : v) x = specials && r.one_in(3) ? special(r) : moderate(r);
  write_values(t.view, v);
}

/// Whether x is finite and moderate (|x| <= 1e4), the domain where the tolerance holds.
inline bool moderate_value(double x) { return std::isfinite(x) && std::fabs(x) <= 1e4; }

/// Compares one element: with moderate inputs, within tol; with a non-finite input (the others
/// moderate), the same class (NaN, the same infinity, or exactly the same finite value: a ReLU of
/// -inf is 0). Returns false when the element is not comparable (huge finite inputs).
inline void check_element(const char* what, std::size_t i, double got, double want, double tol, bool inputs_moderate,
                          bool inputs_special) {
  if (inputs_moderate) {
    FUZZ_CHECK(close(got, want, tol), "{}[{}] = {} but the float64 reference gives {} (tol {:.3g})", what, i, got, want, tol);
  } else if (inputs_special) {
    const bool same = (std::isnan(got) && std::isnan(want)) || got == want;
    FUZZ_CHECK(same, "{}[{}] = {} but the float64 reference gives {} (a non-finite input)", what, i, got, want);
  }
}

}  // namespace fuzz
}  // namespace detops
