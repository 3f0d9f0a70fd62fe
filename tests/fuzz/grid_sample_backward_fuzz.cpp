// libFuzzer target: detops::grid_sample_backward (both modes; grad_input and grad_grid each
// optional) and its workspace query on arbitrary shapes, strides, dtypes, options and values.
// Each call either raises detops::Error before writing anything, or returns with every element
// of the requested gradients written, nothing else touched, and, where every value is a moderate
// k/32, values within rounding of the float64 reference.
#include "grid_sample_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

void check_values(const GridSampleCase& c) {
  const test::GridSampleProblem p = reference_problem(c, true);
  const test::GridSampleResult want = test::grid_sample_reference(p);
  // |values| <= 4 and |grad_output| <= 4: a bound on every partial sum, per contribution
  const double per = 16.0 * std::max<std::int64_t>(1, c.C) * 4 * std::max<std::int64_t>(c.H, c.W);
  const double contributions = 4.0 * static_cast<double>(c.N * c.Ho * c.Wo) + 1;
  // the atomic mode rounds every add on the CPU in grad_input's dtype
  const double eps = c.backward.mode == BackwardMode::kAtomic ? unit_roundoff(c.dt) : acc_roundoff(c.dt);
  if (c.has_grad_input) {
    const std::vector<double> got = read_values(c.grad_input.view);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double tol = 4 * contributions * eps * 16 + 2 * unit_roundoff(c.dt) * std::fabs(want.grad_input[i]);
      FUZZ_CHECK(close(got[i], want.grad_input[i], tol), "grad_input element {} is {} but the reference gives {}", i,
                 got[i], want.grad_input[i]);
    }
  }
  if (c.has_grad_grid) {
    const std::vector<double> got = read_values(c.grad_grid.view);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double tol = 16 * per * acc_roundoff(c.dt) + 2 * unit_roundoff(c.gdt) * std::fabs(want.grad_grid[i]);
      FUZZ_CHECK(close(got[i], want.grad_grid[i], tol), "grad_grid element {} is {} but the reference gives {}", i,
                 got[i], want.grad_grid[i]);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  GridSampleCase c = decode_grid_sample(r, arena, /*backward=*/true);
  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("threads {} grad_input {} grad_grid {}", ctx.num_threads, c.has_grad_input, c.has_grad_grid);
  announce();
  const TensorView gi = c.has_grad_input ? c.grad_input.view : TensorView{};
  const TensorView gg = c.has_grad_grid ? c.grad_grid.view : TensorView{};

  arena.arm();
  ErrorCode qcode{};
  std::string qmsg;
  const bool qok = run_call(
      [&] { grid_sample_backward_workspace_size(c.sampled.view, c.input.view, c.grid.view, gi, gg, c.opt, c.backward, ctx); },
      &qcode, &qmsg);
  check_memory(arena, {&c.input, &c.grid, &c.sampled, &c.grad_input, &c.grad_grid}, false);

  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call(
      [&] { grid_sample_backward(c.sampled.view, c.input.view, c.grid.view, gi, gg, c.opt, c.backward, ctx); }, &code,
      &msg);
  check_memory(arena, {&c.input, &c.grid, &c.sampled, &c.grad_input, &c.grad_grid}, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  FUZZ_CHECK(qok == ok, "the workspace query {} but the backward {}", qok ? "returned" : "raised: " + qmsg,
             ok ? "returned" : "raised: " + msg);
  if (!ok) {
    check_error_code(code, msg);
    FUZZ_CHECK(c.expect != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (c.moderate_values && c.expect == Expect::kSuccess) check_values(c);
  return 0;
}
