// The decoded case of the grid_sample fuzz targets: dtypes (input, grid), small shapes, options,
// strides of any form for every tensor, injected errors (sizes, dtypes, options, overlapping or
// negative strides, a map without pixels), and values (moderate k/32, so every coordinate and
// weight is exact in every dtype, or specials: NaN, infinities, huge). What the call must do
// follows from what was injected (Expect).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "reference/grid_sample_reference.h"

namespace detops {
namespace fuzz {

struct GridSampleCase {
  DType dt = DType::kFloat32, gdt = DType::kFloat32;
  std::int64_t N = 0, C = 0, H = 0, W = 0, Ho = 0, Wo = 0;
  GridSampleOptions opt;
  GridSampleBackwardOptions backward;
  Tensor4 input, grid, sampled, grad_input, grad_grid;  // sampled: output (forward) or grad_output
  bool has_grad_input = true, has_grad_grid = true;
  bool moderate_values = true;  // every input, grid and grad_output value is a moderate k/32
  Expect expect = Expect::kSuccess;
};

/// A spec with strides of a decoded form; a negative stride anywhere, or an overlapping or
/// broadcast output, makes the call an error. Overlap is a matter of sizes and strides in
/// elements, so it is judged on a float32 view: `dt` may be an injected value outside DType,
/// which a TensorView refuses.
inline Spec grid_spec(Reader& r, const char* name, DType dt, std::int64_t s0, std::int64_t s1, std::int64_t s2,
                      std::int64_t s3, bool output, Expect* e) {
  const std::int64_t sizes[4] = {s0, s1, s2, s3};
  Spec s = make_spec(r, name, dt, 4, sizes, output);
  if (s.form == Form::kNegative) expect_error(e);
  const bool elements = s0 > 0 && s1 > 0 && s2 > 0 && s3 > 0;
  if (output && (s.form == Form::kOverlap || s.form == Form::kBroadcast) && elements &&
      self_overlapping_exact(TensorView(nullptr, DType::kFloat32, Device::cpu(), {s0, s1, s2, s3},
                                        {s.strides[0], s.strides[1], s.strides[2], s.strides[3]})))
    expect_error(e);
  if (output && (s.form == Form::kOverlap || s.form == Form::kBroadcast)) expect_maybe(e);
  return s;
}

/// Input and grid values: moderate k/32 (grid: k/64, about [-2, 2]), or a special now and then.
inline std::vector<double> decode_values(Reader& r, std::int64_t n, double scale, bool* moderate_values) {
  std::vector<double> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (double& x : v) {
    if (r.one_in(24)) {
      x = special(r);
      *moderate_values = false;
    } else {
      x = moderate(r) * scale;
    }
  }
  return v;
}

inline GridSampleCase decode_grid_sample(Reader& r, Arena& arena, bool backward) {
  GridSampleCase c;
  Expect& e = c.expect;
  c.dt = decode_float_dtype(r, &e);
  const int g = r.u8() % 4;
  c.gdt = g == 0 ? DType::kFloat32 : g == 1 ? DType::kFloat64 : c.dt;
  if (g == 3 && r.one_in(8)) {  // a 16-bit grid of the other 16-bit dtype (or with a wide input)
    c.gdt = c.dt == DType::kFloat16 ? DType::kBFloat16 : DType::kFloat16;
    expect_error(&e);
  }
  c.N = r.range(0, 2);
  c.C = r.range(0, 4);
  c.H = r.range(r.one_in(16) ? 0 : 1, 6);
  c.W = r.range(r.one_in(16) ? 0 : 1, 6);
  c.Ho = r.range(0, 4);
  c.Wo = r.range(0, 5);
  c.opt.interpolation = r.u8() % 2 ? GridSampleInterpolation::kNearest : GridSampleInterpolation::kBilinear;
  c.opt.padding = static_cast<GridSamplePadding>(r.u8() % 3);
  c.opt.align_corners = r.u8() % 2 == 1;
  if (r.one_in(32)) {
    c.opt.padding = static_cast<GridSamplePadding>(5);
    expect_error(&e);
  }
  c.opt.coordinates = r.u8() % 2 ? GridSampleCoordinates::kUnit : GridSampleCoordinates::kNormalized;
  if (r.one_in(32)) {
    c.opt.coordinates = static_cast<GridSampleCoordinates>(3);
    expect_error(&e);
  }
  c.backward.mode = r.u8() % 2 ? BackwardMode::kAtomic : BackwardMode::kExact;
  if (backward && r.one_in(32)) {
    c.backward.mode = BackwardMode::kTruncated;
    expect_error(&e);
  }
  const bool points = c.N > 0 && c.Ho > 0 && c.Wo > 0;
  if (points && c.C > 0 && (c.H == 0 || c.W == 0)) expect_error(&e);

  if (backward) {
    c.has_grad_input = !r.one_in(5);
    c.has_grad_grid = !r.one_in(5);
  }
  // an injected size error in one tensor of the call: input, grid, output or grad_output, and
  // the gradients that are requested
  std::int64_t bad[5] = {0, 0, 0, 0, 0};
  if (r.one_in(16)) {
    const int which = r.u8() % 5;
    const bool present = which < 3 || (backward && (which == 3 ? c.has_grad_input : c.has_grad_grid));
    if (present) {
      bad[which] = 1;
      expect_error(&e);
    }
  }
  const Spec in = grid_spec(r, "input", c.dt, c.N, c.C + bad[0], c.H, c.W, false, &e);
  const Spec gr = grid_spec(r, "grid", c.gdt, c.N, c.Ho, c.Wo, 2 + bad[1], false, &e);
  const Spec sa = grid_spec(r, backward ? "grad_output" : "output", c.dt, c.N, c.C, c.Ho + bad[2], c.Wo, !backward, &e);
  c.input = place(arena, in, r.u8() % 2);
  c.grid = place(arena, gr, r.u8() % 2);
  c.sampled = place(arena, sa, r.u8() % 2);
  write_values(c.input.view, decode_values(r, count(c.input.view), 1.0, &c.moderate_values));
  write_values(c.grid.view, decode_values(r, count(c.grid.view), 0.5, &c.moderate_values));
  if (backward) {
    write_values(c.sampled.view, decode_values(r, count(c.sampled.view), 1.0, &c.moderate_values));
    if (c.has_grad_input) {
      c.grad_input = place(arena, grid_spec(r, "grad_input", c.dt, c.N, c.C, c.H + bad[3], c.W, true, &e), r.u8() % 2);
      poison(c.grad_input.view);
    }
    if (c.has_grad_grid) {
      c.grad_grid = place(arena, grid_spec(r, "grad_grid", c.gdt, c.N, c.Ho, c.Wo + bad[4], 2, true, &e), r.u8() % 2);
      poison(c.grad_grid.view);
    }
  } else {
    poison(c.sampled.view);
  }
  describe("grid_sample {} input {} {} grid {} {} sampled {} mode {} padding {} align_corners {} coordinates {} "
           "backward {} expect {}",
           backward ? "backward" : "forward", dtype_name(c.dt), describe_view(c.input.view), dtype_name(c.gdt),
           describe_view(c.grid.view), describe_view(c.sampled.view), to_string(c.opt.interpolation),
           static_cast<int>(c.opt.padding), c.opt.align_corners, static_cast<int>(c.opt.coordinates),
           to_string(c.backward.mode), expect_name(e));
  return c;
}

/// The float64 reference problem of a case (NCHW-ordered values as the library reads them).
inline test::GridSampleProblem reference_problem(const GridSampleCase& c, bool backward) {
  test::GridSampleProblem p{c.N, c.C, c.H, c.W, c.Ho, c.Wo, c.opt, {}, {}, {}};
  p.input = read_values(c.input.view);
  p.grid = read_values(c.grid.view);
  if (backward) p.grad_output = read_values(c.sampled.view);
  return p;
}

inline void check_error_code(ErrorCode code, const std::string& msg) {
  FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kOutOfMemory, "unexpected error code {} ({})",
             static_cast<int>(code), msg);
  FUZZ_CHECK(!msg.empty(), "empty error message");
}

}  // namespace fuzz
}  // namespace detops
