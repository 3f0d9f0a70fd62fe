// Pieces shared by the multi-scale deformable attention fuzz targets: a decoded call (small
// shapes, every dtype, any strides, level tables right or wrong, locations on and beyond the
// kernels' bounds, NaN and infinities), what the library must do with it, and the comparison with
// the float64 reference (tests/reference/ms_deform_attn_reference.h) for calls with finite
// inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "detops/ms_deform_attn.h"
#include "fuzz_common.h"
#include "reference/ms_deform_attn_reference.h"

namespace detops {
namespace fuzz {

struct MsdaCase {
  std::int64_t B = 1, S = 0, M = 1, D = 1, Q = 1, L = 1, P = 1;
  std::vector<std::int64_t> shapes;  // what the level table says (maybe wrong)
  DType dt = DType::kFloat32, loc_dt = DType::kFloat32;
  Tensor4 value, spatial_shapes, level_start, loc, attn, output, grad_output, grad_value, grad_loc, grad_attn;
  Expect expect = Expect::kSuccess;
  bool finite = true;  // every value, location and weight finite
};

/// A location coordinate for a level side of `size`: mostly inside, sometimes exactly on a bound
/// (x = -1 or x = size), just inside one, far outside, NaN or infinite.
inline double decode_location(Reader& r, std::int64_t size, bool* finite) {
  const double s = static_cast<double>(std::max<std::int64_t>(size, 1));
  switch (r.u8() % 16) {
    case 0: return -0.5 / s;                          // x = -1: skipped
    case 1: return (s + 0.5) / s;                     // x = size: skipped
    case 2: return -0.5 / s + std::ldexp(1.0, -10);  // just inside
    case 3: return (r.u8() % 9 - 4) * 1.5;            // far outside (or inside)
    case 4:
      if (r.one_in(4)) {
        *finite = false;
        return r.one_in(2) ? std::nan("") : -std::numeric_limits<double>::infinity();
      }
      return 0.5;
    default: return -0.2 + 1.4 * r.u8() / 255.0;
  }
}

inline double decode_value(Reader& r, bool* finite) {
  if (r.one_in(32)) {
    *finite = false;
    return r.one_in(2) ? std::nan("") : std::numeric_limits<double>::infinity();
  }
  return moderate(r);
}

/// Writes a level table (fuzz_common's store() knows the float dtypes and int32 only).
inline void write_int64(const TensorView& v, const std::vector<std::int64_t>& values) {
  if (!v.data) return;
  for_each_offset(v, [&](std::int64_t lin, std::int64_t o) {
    static_cast<std::int64_t*>(v.data)[o] = values[static_cast<std::size_t>(lin)];
  });
}

inline MsdaCase decode_msda(Reader& r, Arena& arena, bool backward) {
  MsdaCase c;
  static const DType floats[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  c.B = r.range(0, 2);
  c.M = r.range(0, 3);
  c.D = r.range(0, 5);
  c.Q = r.range(0, 5);
  c.L = r.range(0, 3);
  c.P = r.range(0, 3);
  std::vector<std::int64_t> starts;
  for (std::int64_t l = 0; l < c.L; ++l) {
    c.shapes.push_back(r.range(0, 4));
    c.shapes.push_back(r.range(0, 5));
    starts.push_back(c.S);
    c.S += c.shapes[2 * l] * c.shapes[2 * l + 1];
  }
  std::vector<std::int64_t> table = c.shapes;
  std::int64_t S = c.S;
  switch (r.u8() % 24) {  // a level table or S that disagrees
    case 0:
      if (c.L > 0) table[r.u8() % (2 * c.L)] = -1 - r.range(0, 3), expect_error(&c.expect);
      break;
    case 1:
      if (c.L > 1) starts[1] += 1, expect_error(&c.expect);
      break;
    case 2: S += 1, expect_error(&c.expect); break;
    case 3:
      if (c.L > 0) table[0] = table[1] = std::int64_t{1} << 33, expect_error(&c.expect);
      break;
    default: break;
  }
  c.dt = floats[r.u8() % 4];
  const int loc_pick = r.u8() % 3;
  c.loc_dt = loc_pick == 0 ? DType::kFloat32 : loc_pick == 1 ? DType::kFloat64 : c.dt;
  if (r.one_in(48)) c.loc_dt = c.dt == DType::kFloat16 ? DType::kBFloat16 : DType::kFloat16;
  if (c.loc_dt != c.dt && c.loc_dt != DType::kFloat32 && c.loc_dt != DType::kFloat64) expect_error(&c.expect);

  const std::int64_t vs[4] = {c.B, S, c.M, c.D}, ss[2] = {c.L, 2}, ls[1] = {c.L};
  const std::int64_t locs[6] = {c.B, c.Q, c.M, c.L, c.P, 2}, as[5] = {c.B, c.Q, c.M, c.L, c.P};
  const std::int64_t rows[3] = {c.B, c.Q, c.M * c.D};
  const Spec specs[10] = {make_spec(r, "value", c.dt, 4, vs, false),
                          // no broadcast: the table's entries are decoded as distinct values
                          make_spec(r, "spatial_shapes", DType::kInt64, 2, ss, false, false),
                          make_spec(r, "level_start_index", DType::kInt64, 1, ls, false, false),
                          make_spec(r, "sampling_locations", c.loc_dt, 6, locs, false),
                          make_spec(r, "attention_weights", c.dt, 5, as, false),
                          make_spec(r, "output", c.dt, 3, rows, true),
                          make_spec(r, "grad_output", c.dt, 3, rows, false),
                          make_spec(r, "grad_value", c.dt, 4, vs, true),
                          make_spec(r, "grad_sampling_locations", c.loc_dt, 6, locs, true),
                          make_spec(r, "grad_attention_weights", c.dt, 5, as, true)};
  Tensor4* ts[10] = {&c.value, &c.spatial_shapes, &c.level_start, &c.loc, &c.attn,
                     &c.output, &c.grad_output, &c.grad_value, &c.grad_loc, &c.grad_attn};
  for (int i = 0; i < 10; ++i) {
    const bool used = backward ? i != 5 : i <= 5;
    if (!used) continue;
    const bool optional_output = backward && i >= 7;
    if (optional_output && r.one_in(4)) continue;  // a gradient not computed
    *ts[i] = place(arena, specs[i], r.one_in(8) ? 1 : 0);
    for (int d = 0; d < specs[i].rank; ++d)
      if (specs[i].strides[d] < 0) expect_error(&c.expect);
    if (specs[i].output && self_overlapping_conservative(ts[i]->view)) expect_error(&c.expect);
  }
  write_int64(c.spatial_shapes.view, table);
  write_int64(c.level_start.view, starts);
  // values, locations (per level side), weights
  std::vector<double> v(static_cast<std::size_t>(count(c.value.view))), a(static_cast<std::size_t>(count(c.attn.view)));
  for (double& x : v) x = decode_value(r, &c.finite);
  for (double& x : a) x = decode_value(r, &c.finite);
  std::vector<double> lv(static_cast<std::size_t>(count(c.loc.view)));
  for (std::size_t i = 0; i < lv.size(); ++i) {
    const std::int64_t l = static_cast<std::int64_t>(i / 2 / static_cast<std::size_t>(std::max<std::int64_t>(c.P, 1))) %
                           std::max<std::int64_t>(c.L, 1);
    const std::int64_t side = c.L > 0 ? c.shapes[static_cast<std::size_t>(2 * l + (i % 2 == 0 ? 1 : 0))] : 1;
    lv[i] = decode_location(r, side, &c.finite);
  }
  write_values(c.value.view, v);
  write_values(c.attn.view, a);
  write_values(c.loc.view, lv);
  if (backward) {
    std::vector<double> g(static_cast<std::size_t>(count(c.grad_output.view)));
    for (double& x : g) x = decode_value(r, &c.finite);
    write_values(c.grad_output.view, g);
    for (Tensor4* t : {&c.grad_value, &c.grad_loc, &c.grad_attn}) poison(t->view);
  } else {
    poison(c.output.view);
  }
  return c;
}

/// The reference problem from what the tensors hold (inputs rounded to their dtypes).
inline ref::MsdaProblemRef msda_problem(const MsdaCase& c, bool absolute = false) {
  ref::MsdaProblemRef pr;
  pr.B = c.B, pr.S = c.S, pr.M = c.M, pr.D = c.D, pr.Q = c.Q, pr.L = c.L, pr.P = c.P;
  pr.shapes = c.shapes;
  pr.value = read_values(c.value.view);
  pr.loc = read_values(c.loc.view);
  pr.attn = read_values(c.attn.view);
  if (absolute) {
    for (double& x : pr.value) x = std::fabs(x);
    for (double& x : pr.attn) x = std::fabs(x);
  }
  return pr;
}

inline double max_abs_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

/// Largest level side (positions round with it).
inline double msda_max_side(const MsdaCase& c) {
  double m = 1;
  for (std::int64_t s : c.shapes) m = std::max(m, static_cast<double>(s));
  return m;
}

/// Compares got with want element by element: rounding of the sums (`terms` of magnitude `mag`),
/// of the result to the dtype, and of the positions (`pos`, absolute).
inline void msda_compare(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                         const std::vector<double>& mag, double terms, DType out_dt, DType acc_dt, double pos) {
  const double eps_a = acc_roundoff(acc_dt), eps_t = unit_roundoff(out_dt);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = (terms + 8) * eps_a * mag[i] + 2 * eps_t * std::fabs(want[i]) + pos + 1e-30;
    FUZZ_CHECK(close(got[i], want[i], tol), "{}[{}] = {} but the float64 reference gives {} (tol {:.3g})", what, i,
               got[i], want[i], tol);
  }
}

inline std::string msda_describe(const MsdaCase& c) {
  std::string s = fmt::format("B {} S {} M {} D {} Q {} L {} P {} levels", c.B, c.S, c.M, c.D, c.Q, c.L, c.P);
  for (std::size_t i = 0; i + 1 < c.shapes.size(); i += 2) s += fmt::format(" {}x{}", c.shapes[i], c.shapes[i + 1]);
  return s;
}

}  // namespace fuzz
}  // namespace detops
