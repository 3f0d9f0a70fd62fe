// libFuzzer target: detops::frozen_batch_norm_forward (epilogues none, relu, add_relu) on
// arbitrary shapes, strides, dtypes and values, in place (y = x, y = residual) or not, with
// outputs sometimes overlapping an input. A call either raises detops::Error before writing
// anything, or writes every element of y and nothing else, with values within the dtype's
// tolerance of the float64 reference (NaN and infinities propagate as the reference says).
#include "frozen_bn_case.h"

using namespace detops;
using namespace detops::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  Expect e = Expect::kSuccess;

  FrozenBnEpilogue epi = static_cast<FrozenBnEpilogue>(r.u8() % 3);
  if (r.one_in(64)) {
    epi = static_cast<FrozenBnEpilogue>(3 + r.u8() % 200);
    expect_error(&e);
  }
  const FbnShape sh = decode_shape(r);
  const DType dt = decode_data_dtype(r, &e);
  Spec xs = make_spec(r, "x", dt, 4, sh.sizes, false);
  Spec ys = make_spec(r, "y", dt, 4, sh.sizes, true);
  if (r.one_in(64)) {
    ys.dtype = dt == DType::kFloat32 ? DType::kFloat16 : DType::kFloat32;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    ys.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    xs.rank = 3;
    expect_error(&e);
  }
  bool has_residual = epi == FrozenBnEpilogue::kAddRelu;
  if (r.one_in(48)) {
    has_residual = !has_residual;
    expect_error(&e);
  }
  Spec rs = make_spec(r, "residual", dt, 4, sh.sizes, false);
  if (has_residual && r.one_in(64)) {
    rs.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  const Spec ss = decode_param(r, "scale", sh.C(), dt, &e);
  const Spec ts = decode_param(r, "shift", sh.C(), dt, &e);

  Tensor4 x = place(arena, xs, r.one_in(8) ? 1 : 0);
  Tensor4 res = has_residual ? place(arena, rs) : Tensor4{};
  Tensor4 scale = place(arena, ss), shift = place(arena, ts);
  Tensor4 y;
  const int placement = r.u8() % 16;
  bool placed = false, y_is_input = false;
  Tensor4 moved;
  switch (placement) {
    case 0:
    case 1:  // in place: y is x
      if (ys.dtype == xs.dtype && ys.rank == xs.rank && std::equal(ys.sizes, ys.sizes + 4, xs.sizes)) {
        y = x, y.output = true, y.name = "y (= x)", placed = y_is_input = true;
      }
      break;
    case 2:  // y is the residual
      if (has_residual && ys.dtype == rs.dtype && std::equal(ys.sizes, ys.sizes + 4, rs.sizes)) {
        y = res, y.output = true, y.name = "y (= residual)", placed = y_is_input = true;
      }
      break;
    case 3:
      if (place_inside(arena, x, ys, r.range(0, 32) * 2, &moved)) y = moved, placed = true;
      break;
    case 4:
      if (place_inside(arena, r.one_in(2) ? scale : shift, ys, r.range(0, 8) * 4, &moved)) y = moved, placed = true;
      break;
    case 5:
      if (has_residual && place_inside(arena, res, ys, r.range(0, 32) * 2, &moved)) y = moved, placed = true;
      break;
    case 6:  // residual is x (allowed: both are read)
      if (has_residual && rs.dtype == xs.dtype && std::equal(rs.sizes, rs.sizes + 4, xs.sizes)) {
        res = x, res.name = "residual (= x)";
      }
      break;
    case 7: {  // scale inside x's buffer (allowed: both are read)
      Tensor4 s2;
      if (place_inside(arena, x, ss, r.range(0, 16) * 8, &s2)) scale = s2;
      break;
    }
    default: break;
  }
  if (!placed) y = place(arena, ys, r.one_in(8) ? 1 : 0);

  // What the library must reject: negative strides, an output with overlapping elements, or an
  // output sharing bytes with an input other than being that input exactly (y = x, y = residual).
  for (const Tensor4* t : {&x, &y, &res, &scale, &shift})
    for (int d = 0; t->view.defined() && d < t->view.rank; ++d)
      if (t->view.strides[d] < 0) expect_error(&e);
  if (self_overlapping_conservative(y.view)) expect_error(&e);
  if (spans_intersect(y.view, x.view) && !same_view(y.view, x.view)) expect_error(&e);
  if (spans_intersect(y.view, scale.view) || spans_intersect(y.view, shift.view)) expect_error(&e);
  if (has_residual && spans_intersect(y.view, res.view) && !same_view(y.view, res.view)) expect_error(&e);

  if (r.one_in(64)) {  // a device or pointer the CPU build cannot use
    Tensor4* ts4[4] = {&x, &y, &scale, &shift};
    Tensor4* t = ts4[r.u8() % 4];
    if (r.one_in(2) || count(t->view) == 0) t->view.device = Device::cuda(r.one_in(2) ? 0 : -1);
    else t->view.data = nullptr;
    if (t == &x && y_is_input) y.view = x.view;  // keep in-place views identical
    expect_error(&e);
  }

  fill_values(r, x);
  if (has_residual && res.buffer != x.buffer) fill_values(r, res);
  fill_values(r, scale);
  fill_values(r, shift);
  if (!y_is_input && y.view.data && y.view.device.is_cpu()) poison(y.view);

  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("op frozen_batch_norm_forward epilogue {} dtype {} threads {} placement {}", epilogue_str(epi), dtype_str(dt),
           ctx.num_threads, placement);
  for (const Tensor4* t : {&x, &y, &res, &scale, &shift})
    if (t->view.defined()) describe("  {} (buffer {}): {}", t->name, t->buffer, describe_view(t->view));
  describe("expect {}", expect_name(e));
  note_expect(e, y_is_input, placed && !y_is_input && (spans_intersect(y.view, x.view) || spans_intersect(y.view, res.view) ||
                                                       spans_intersect(y.view, scale.view) || spans_intersect(y.view, shift.view)));

  // Inputs as the library sees them, read before the call (y may be x).
  const bool readable = e != Expect::kError;
  std::vector<double> xv, rv, sv, tv;
  if (readable) {
    xv = read_values(x.view);
    sv = read_values(scale.view);
    tv = read_values(shift.view);
    rv = has_residual ? read_values(res.view) : std::vector<double>(xv.size(), 0.0);
  }

  announce();
  arena.arm();
  ErrorCode code{};
  std::string msg;
  const TensorView residual = has_residual ? res.view : TensorView{};
  const bool ok = run_call([&] { frozen_batch_norm_forward(x.view, scale.view, shift.view, y.view, epi, residual, ctx); },
                           &code, &msg);
  check_memory(arena, {&x, &y, &res, &scale, &shift}, ok);
  FUZZ_CHECK(alloc.live() == 0 && alloc.requests == 0, "the forward allocated workspace");
  if (!ok) {
    FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kNotCompiled, "unexpected error code {} ({})",
               static_cast<int>(code), msg);
    FUZZ_CHECK(!msg.empty(), "empty error message");
    FUZZ_CHECK(e != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(e != Expect::kError, "an invalid call returned normally");
  if (e != Expect::kSuccess || sh.numel() == 0) return 0;

  const std::vector<double> got = read_values(y.view);
  const std::vector<double> want =
      ref::frozen_bn_forward_ref(xv, sv, tv, rv, sh.N(), sh.C(), sh.HW(), to_ref(epi));
  const double eps_a = acc_roundoff(dt), eps_t = unit_roundoff(dt), tiny = 2 * dtype_min_normal(dt) * eps_t;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::size_t c = (i / static_cast<std::size_t>(sh.HW())) % static_cast<std::size_t>(sh.C());
    const double in[4] = {xv[i], sv[c], tv[c], rv[i]};
    bool mod = true, spec = false, huge = false;
    for (double v : in) {
      mod = mod && moderate_value(v);
      spec = spec || !std::isfinite(v);
      huge = huge || (std::isfinite(v) && !moderate_value(v));
    }
    mod = mod && std::fabs(want[i]) <= 0.5 * dtype_max(dt);
    const double tol = 4 * eps_a * (std::fabs(xv[i] * sv[c]) + std::fabs(tv[c]) + std::fabs(rv[i])) +
                       2 * eps_t * std::fabs(want[i]) + tiny;
    check_element("y", i, got[i], want[i], tol, mod, spec && !huge);
  }
  return 0;
}
