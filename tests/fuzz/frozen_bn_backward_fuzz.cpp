// libFuzzer target: detops::frozen_batch_norm_backward (epilogues none, relu, add_relu; with
// and without grad_residual) on arbitrary shapes, strides, dtypes and values, in place
// (grad_x = grad_y, grad_x = y, grad_residual = grad_y or y) or not, with outputs sometimes
// overlapping other tensors. A call either raises detops::Error before writing anything, or
// writes every element of grad_x (and grad_residual) and nothing else: grad_x within the dtype's
// tolerance of the float64 reference, grad_residual exactly (it is grad_y, masked).
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
  const bool relu = epi == FrozenBnEpilogue::kRelu || epi == FrozenBnEpilogue::kAddRelu;
  const FbnShape sh = decode_shape(r);
  const DType dt = decode_data_dtype(r, &e);
  Spec gys = make_spec(r, "grad_y", dt, 4, sh.sizes, false);
  Spec gxs = make_spec(r, "grad_x", dt, 4, sh.sizes, true);
  Spec ys = make_spec(r, "y", dt, 4, sh.sizes, false);
  Spec grs = make_spec(r, "grad_residual", dt, 4, sh.sizes, true);
  if (r.one_in(64)) {
    gxs.dtype = dt == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    gxs.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  bool has_y = relu;
  if (r.one_in(32)) {
    has_y = !has_y;  // missing for a ReLU: an error; given with none: ignored
    if (relu) expect_error(&e);
  }
  if (has_y && relu && r.one_in(64)) {
    ys.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  bool has_gr = epi == FrozenBnEpilogue::kAddRelu && !r.one_in(4);
  if (r.one_in(48) && epi != FrozenBnEpilogue::kAddRelu) {
    has_gr = true;
    expect_error(&e);
  }
  const Spec ss = decode_param(r, "scale", sh.C(), dt, &e);

  Tensor4 gy = place(arena, gys, r.one_in(8) ? 1 : 0);
  Tensor4 y = has_y ? place(arena, ys) : Tensor4{};
  Tensor4 scale = place(arena, ss);
  Tensor4 gx, gr;
  bool gx_placed = false, gr_placed = false, gx_is_input = false, gr_is_input = false;
  auto same_shape = [](const Spec& a, const Spec& b) {
    return a.dtype == b.dtype && a.rank == b.rank && std::equal(a.sizes, a.sizes + a.rank, b.sizes);
  };
  const int placement = r.u8() % 16;
  Tensor4 moved;
  switch (placement) {
    case 0:
    case 1:
      if (same_shape(gxs, gys)) gx = gy, gx.output = true, gx.name = "grad_x (= grad_y)", gx_placed = gx_is_input = true;
      break;
    case 2:
      if (has_y && same_shape(gxs, ys)) gx = y, gx.output = true, gx.name = "grad_x (= y)", gx_placed = gx_is_input = true;
      break;
    case 3:
      if (has_gr && same_shape(grs, gys)) gr = gy, gr.output = true, gr.name = "grad_residual (= grad_y)", gr_placed = gr_is_input = true;
      break;
    case 4:
      if (has_gr && has_y && same_shape(grs, ys)) gr = y, gr.output = true, gr.name = "grad_residual (= y)", gr_placed = gr_is_input = true;
      break;
    case 5:
      if (place_inside(arena, gy, gxs, r.range(0, 32) * 2, &moved)) gx = moved, gx_placed = true;
      break;
    case 7:
      if (place_inside(arena, scale, gxs, r.range(0, 8) * 4, &moved)) gx = moved, gx_placed = true;
      break;
    case 8:
      if (has_gr && place_inside(arena, scale, grs, r.range(0, 8) * 4, &moved)) gr = moved, gr_placed = true;
      break;
    case 9:
      if (has_gr && has_y && place_inside(arena, y, grs, r.range(0, 32) * 2, &moved)) gr = moved, gr_placed = true;
      break;
    default: break;
  }
  if (!gx_placed) gx = place(arena, gxs, r.one_in(8) ? 1 : 0);
  if (has_gr && !gr_placed) {
    if (placement == 6 && place_inside(arena, gx, grs, r.range(0, 32) * 2, &moved)) gr = moved;
    else gr = place(arena, grs);
  }

  // What the library must reject (see include/detops/frozen_batch_norm.h): negative strides,
  // outputs with overlapping elements, an output sharing bytes with an input other than being it
  // exactly (grad_x = grad_y or y, grad_residual = grad_y or y), or the two outputs overlapping.
  for (const Tensor4* t : {&gy, &gx, &y, &gr, &scale})
    for (int d = 0; t->view.defined() && d < t->view.rank; ++d)
      if (t->view.strides[d] < 0 && (t != &y || relu)) expect_error(&e);
  if (self_overlapping_conservative(gx.view)) expect_error(&e);
  if (spans_intersect(gx.view, gy.view) && !same_view(gx.view, gy.view)) expect_error(&e);
  if (spans_intersect(gx.view, scale.view)) expect_error(&e);
  if (relu && spans_intersect(gx.view, y.view) && !same_view(gx.view, y.view)) expect_error(&e);
  if (has_gr) {
    if (self_overlapping_conservative(gr.view)) expect_error(&e);
    if (spans_intersect(gr.view, gy.view) && !same_view(gr.view, gy.view)) expect_error(&e);
    if (spans_intersect(gr.view, gx.view)) expect_error(&e);
    if (spans_intersect(gr.view, y.view) && !same_view(gr.view, y.view)) expect_error(&e);
    if (spans_intersect(gr.view, scale.view)) expect_error(&e);
  }

  if (r.one_in(64)) {  // a device or pointer the CPU build cannot use
    Tensor4* ts4[3] = {&gy, &gx, &scale};
    Tensor4* t = ts4[r.u8() % 3];
    if (r.one_in(2) || count(t->view) == 0) t->view.device = Device::cuda(r.one_in(2) ? 0 : -1);
    else t->view.data = nullptr;
    if (t == &gy && gx_is_input && gx.buffer == gy.buffer) gx.view = gy.view;
    expect_error(&e);
  }

  fill_values(r, gy);
  if (has_y) fill_values(r, y);
  fill_values(r, scale);
  if (!gx_is_input && gx.view.data && gx.view.device.is_cpu()) poison(gx.view);
  if (has_gr && !gr_is_input && gr.view.data && gr.view.device.is_cpu()) poison(gr.view);

  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("op frozen_batch_norm_backward epilogue {} dtype {} threads {} placement {}", epilogue_str(epi),
           dtype_str(dt), ctx.num_threads, placement);
  for (const Tensor4* t : {&gy, &gx, &y, &gr, &scale})
    if (t->view.defined()) describe("  {} (buffer {}): {}", t->name, t->buffer, describe_view(t->view));
  describe("expect {}", expect_name(e));
  note_expect(e, gx_is_input || gr_is_input,
              (gx_placed && !gx_is_input) || (gr_placed && !gr_is_input) || (has_gr && spans_intersect(gr.view, gx.view)));

  std::vector<double> gyv, yv, sv;
  if (e != Expect::kError) {
    gyv = read_values(gy.view);
    sv = read_values(scale.view);
    yv = has_y ? read_values(y.view) : std::vector<double>(gyv.size(), 0.0);
  }

  announce();
  arena.arm();
  ErrorCode code{};
  std::string msg;
  const TensorView yview = has_y ? y.view : TensorView{};
  const TensorView grview = has_gr ? gr.view : TensorView{};
  const bool ok = run_call([&] { frozen_batch_norm_backward(gy.view, scale.view, gx.view, epi, yview, grview, ctx); },
                           &code, &msg);
  check_memory(arena, {&gy, &gx, &y, &gr, &scale}, ok);
  FUZZ_CHECK(alloc.live() == 0 && alloc.requests == 0, "the backward allocated workspace");
  if (!ok) {
    FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kNotCompiled, "unexpected error code {} ({})",
               static_cast<int>(code), msg);
    FUZZ_CHECK(!msg.empty(), "empty error message");
    FUZZ_CHECK(e != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(e != Expect::kError, "an invalid call returned normally");
  if (e != Expect::kSuccess || sh.numel() == 0) return 0;

  std::vector<double> want_gr;
  const std::vector<double> want =
      ref::frozen_bn_backward_ref(gyv, sv, yv, sh.N(), sh.C(), sh.HW(), to_ref(epi), &want_gr);
  const std::vector<double> got = read_values(gx.view);
  const double eps_a = acc_roundoff(dt), eps_t = unit_roundoff(dt), tiny = 2 * dtype_min_normal(dt) * eps_t;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::size_t c = (i / static_cast<std::size_t>(sh.HW())) % static_cast<std::size_t>(sh.C());
    const bool mod = moderate_value(gyv[i]) && moderate_value(sv[c]) && std::fabs(want[i]) <= 0.5 * dtype_max(dt);
    const bool spec = (!std::isfinite(gyv[i]) || !std::isfinite(sv[c])) &&
                      (!std::isfinite(gyv[i]) || moderate_value(gyv[i])) && (!std::isfinite(sv[c]) || moderate_value(sv[c]));
    const double tol = 2 * eps_a * std::fabs(gyv[i] * sv[c]) + 2 * eps_t * std::fabs(want[i]) + tiny;
    check_element("grad_x", i, got[i], want[i], tol, mod, spec);
  }
  if (has_gr) {
    const std::vector<double> g2 = read_values(gr.view);
    for (std::size_t i = 0; i < g2.size(); ++i)
      FUZZ_CHECK((std::isnan(g2[i]) && std::isnan(want_gr[i])) || g2[i] == want_gr[i],
                 "grad_residual[{}] = {} but it must be the masked grad_y, {}", i, g2[i], want_gr[i]);
  }
  return 0;
}
