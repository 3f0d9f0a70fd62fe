// libFuzzer target: detops::ms_deform_attn_backward_workspace_size and ms_deform_attn_backward
// (atomic, exact, and the refused truncated mode) on arbitrary shapes, strides, dtypes, level
// tables and locations, with any of the three gradients absent, and with the fuzz allocator, a
// caller workspace of the exact size, or one byte short. Each call either raises detops::Error
// before writing anything, or returns with every requested gradient fully written, nothing else
// touched, and, for finite inputs, values within rounding of the float64 reference; the location
// gradient is compared for samples away from its kinks (pixel centres and the skip bounds).
#include "ms_deform_attn_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

/// Whether sample i's position is at least 1e-3 from a kink on both axes (in float64).
bool smooth_sample(const ref::MsdaProblemRef& pr, std::size_t i) {
  const std::int64_t l = static_cast<std::int64_t>(i / static_cast<std::size_t>(pr.P)) % pr.L;
  for (int axis = 0; axis < 2; ++axis) {
    const double size = static_cast<double>(pr.shapes[static_cast<std::size_t>(2 * l + 1 - axis)]);
    const double x = pr.loc[2 * i + axis] * size - 0.5;
    if (std::fabs(x - std::round(x)) < 1e-3 || std::fabs(x + 1) < 1e-3 || std::fabs(x - size) < 1e-3) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  MsdaCase c = decode_msda(r, arena, /*backward=*/true);
  MsDeformAttnBackwardOptions opt;
  const int mode = r.u8() % 16;
  opt.mode = mode < 7 ? BackwardMode::kExact : mode < 15 ? BackwardMode::kAtomic : BackwardMode::kTruncated;
  if (opt.mode == BackwardMode::kTruncated) expect_error(&c.expect);
  const int ws_pick = r.u8() % 4;  // 0-1 allocator, 2 exact caller buffer, 3 one byte short
  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("op ms_deform_attn_backward {} dtype {} locations {} mode {} workspace {} threads {}", msda_describe(c),
           dtype_name(c.dt), dtype_name(c.loc_dt), to_string(opt.mode), ws_pick, ctx.num_threads);
  const std::vector<const Tensor4*> all = {&c.value, &c.spatial_shapes, &c.level_start, &c.loc, &c.attn,
                                           &c.grad_output, &c.grad_value, &c.grad_loc, &c.grad_attn};
  for (const Tensor4* t : all) describe("  {}: {}", t->name, describe_view(t->view));
  describe("expect {}", expect_name(c.expect));
  note_expect(c.expect, false, false);
  announce();

  // the size query reads only the inputs
  arena.arm();
  ErrorCode code{};
  std::string msg;
  std::size_t bytes = 0;
  const bool sized = run_call([&] {
    bytes = ms_deform_attn_backward_workspace_size(c.value.view, c.spatial_shapes.view, c.level_start.view,
                                                   c.loc.view, c.attn.view, opt, ctx);
  }, &code, &msg);
  check_memory(arena, all, false);  // nothing may change, whatever the outcome
  std::vector<unsigned char> ws_buf;
  Workspace ws;
  bool short_ws = false;
  if (sized && ws_pick >= 2 && bytes > 0) {
    ws_buf.assign(bytes, 0);
    ws = Workspace{ws_buf.data(), ws_pick == 3 ? bytes - 1 : bytes};
    short_ws = ws_pick == 3 && c.grad_value.view.defined();
  }

  arena.arm();
  const bool ok = run_call([&] {
    ms_deform_attn_backward(c.value.view, c.spatial_shapes.view, c.level_start.view, c.loc.view, c.attn.view,
                            c.grad_output.view, c.grad_value.view, c.grad_loc.view, c.grad_attn.view, opt, ctx, ws);
  }, &code, &msg);
  check_memory(arena, all, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  if (!ok) {
    FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kOutOfMemory, "unexpected error code {} ({})",
               static_cast<int>(code), msg);
    FUZZ_CHECK(c.expect != Expect::kSuccess || short_ws || code == ErrorCode::kOutOfMemory, "a valid call raised: {}",
               msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (c.expect != Expect::kSuccess || !c.finite) return 0;

  const ref::MsdaProblemRef pr = msda_problem(c), abs_pr = msda_problem(c, true);
  const std::vector<double> go = read_values(c.grad_output.view);
  std::vector<double> abs_go = go;
  for (double& x : abs_go) x = std::fabs(x);
  const ref::MsdaGradsRef want = ref::msda_backward_ref(pr, go), mag = ref::msda_backward_ref(abs_pr, abs_go);
  const DType acc = c.dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  const double eps = acc_roundoff(acc), side = msda_max_side(c) * 2 + 8;
  const double vmax = max_abs_of(pr.value), amax = max_abs_of(pr.attn), gmax = max_abs_of(go);
  // The atomic mode rounds after every add in 16-bit dtypes: up to Q * L * P * 4 roundings of T.
  const bool narrow_atomic = opt.mode == BackwardMode::kAtomic && acc_roundoff(acc) != unit_roundoff(c.dt);
  const double adds = static_cast<double>(c.Q * c.L * c.P * 4);
  if (c.grad_value.view.defined()) {
    std::vector<double> m = mag.value;
    if (narrow_atomic)
      for (double& x : m) x *= 1 + adds * unit_roundoff(c.dt) / eps;
    msda_compare("grad_value", read_values(c.grad_value.view), want.value, m, adds, c.dt, acc,
                 16 * eps * side * gmax * amax * adds);
  }
  if (c.grad_attn.view.defined())
    msda_compare("grad_attention_weights", read_values(c.grad_attn.view), want.attn, mag.attn,
                 static_cast<double>(4 * c.D), c.dt, acc, 16 * eps * side * gmax * vmax * static_cast<double>(c.D));
  if (c.grad_loc.view.defined()) {
    const std::vector<double> got = read_values(c.grad_loc.view);
    const DType out = c.loc_dt == DType::kFloat64 ? acc : c.loc_dt;
    for (std::size_t i = 0; i < got.size() / 2; ++i) {
      if (!smooth_sample(pr, i)) continue;
      // d/dx sums D channels of W * (corner differences) * g * attn
      const double scale = side * gmax * amax * vmax * 4 * static_cast<double>(c.D);
      for (int axis = 0; axis < 2; ++axis) {
        const double tol = 64 * eps * scale * (1 + side) + 2 * unit_roundoff(out) * std::fabs(want.loc[2 * i + axis]);
        FUZZ_CHECK(close(got[2 * i + axis], want.loc[2 * i + axis], tol),
                   "grad_sampling_locations[{}] = {} but the float64 reference gives {} (tol {:.3g})", 2 * i + axis,
                   got[2 * i + axis], want.loc[2 * i + axis], tol);
      }
    }
  }
  return 0;
}
