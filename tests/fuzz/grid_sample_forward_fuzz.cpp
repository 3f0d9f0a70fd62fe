// libFuzzer target: detops::grid_sample_forward on arbitrary shapes, strides, dtypes, options and
// values. Each call either raises detops::Error before writing anything, or returns with every
// output element written, nothing else touched, and, where every value is a moderate k/32 (exact
// coordinates and weights in every dtype), values within rounding of the float64 reference.
#include "grid_sample_case.h"

using namespace detops;
using namespace detops::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  GridSampleCase c = decode_grid_sample(r, arena, /*backward=*/false);
  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("threads {}", ctx.num_threads);
  announce();

  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] { grid_sample_forward(c.input.view, c.grid.view, c.sampled.view, c.opt, ctx); },
                           &code, &msg);
  check_memory(arena, {&c.input, &c.grid, &c.sampled}, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  if (!ok) {
    check_error_code(code, msg);
    FUZZ_CHECK(c.expect != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (!c.moderate_values || c.expect != Expect::kSuccess) return 0;
  const std::vector<double> got = read_values(c.sampled.view);
  const test::GridSampleResult want = test::grid_sample_reference(reference_problem(c, false));
  for (std::size_t i = 0; i < got.size(); ++i) {
    // four products of exact values summed in the accumulation type, then one rounding
    const double tol = 16 * acc_roundoff(c.dt) * 4 + 2 * unit_roundoff(c.dt) * std::fabs(want.output[i]);
    FUZZ_CHECK(close(got[i], want.output[i], tol), "output element {} is {} but the reference gives {}", i, got[i],
               want.output[i]);
  }
  return 0;
}
