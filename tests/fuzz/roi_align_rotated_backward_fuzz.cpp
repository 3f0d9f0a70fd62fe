// libFuzzer target: detops::roi_align_rotated_backward_workspace_size and
// roi_align_rotated_backward (atomic, truncated, exact) on arbitrary small shapes, strides,
// dtypes, options and roi values. Each call either raises detops::Error (naming the op) before
// writing anything, or returns with every grad_input element written and nothing else touched.
// A returned call on a finite grad_output gives a gradient whose total mass is at most
// grad_output's (every bin spreads its gradient with weights summing to at most 1); the exact
// mode's bits do not depend on the thread count (the call is repeated on one and three threads).
#include "roi_align_rotated_case.h"

using namespace detops;
using namespace detops::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  RotatedCase c = decode_rotated(r, arena, /*backward=*/true);
  FuzzAllocator alloc;
  Context ctx = make_context(r, &alloc);
  announce();
  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call(
      [&] {
        roi_align_rotated_backward_workspace_size(c.pooled.view, c.rois.view, c.features.view, c.opt, c.bwd, ctx);
        roi_align_rotated_backward(c.pooled.view, c.rois.view, c.features.view, c.opt, c.bwd, ctx);
      },
      &code, &msg);
  check_memory(arena, {&c.features, &c.rois, &c.pooled}, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  if (!ok) {
    check_rotated_error(code, msg);
    FUZZ_CHECK(c.expect != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (!c.pooled_finite || c.pooled_maxabs > 1e30) return 0;  // sums of huge values may overflow
  // Truncated mode rounds each incoming gradient to float16 first: above 65504 that is inf, and
  // inf times a zero bilinear weight is NaN (the documented range of the trick), not a mass bound.
  if (c.bwd.mode == BackwardMode::kTruncated && c.bwd.truncation == TruncationFormat::kFloat16 &&
      c.pooled_maxabs > 65504.0)
    return 0;
  const std::vector<double> grad = read_values(c.features.view);
  double mass = 0, upstream = 0;
  for (double v : grad) mass += std::fabs(v);
  for (double v : read_values(c.pooled.view)) upstream += std::fabs(v);
  FUZZ_CHECK(mass <= upstream * (1 + 1.0 / 16) + 1e-30, "grad_input mass {} exceeds grad_output's {}", mass, upstream);
  if (c.bwd.mode == BackwardMode::kExact) {
    ctx.num_threads = ctx.num_threads == 3 ? 1 : 3;
    roi_align_rotated_backward(c.pooled.view, c.rois.view, c.features.view, c.opt, c.bwd, ctx);
    const std::vector<double> again = read_values(c.features.view);
    for (std::size_t i = 0; i < grad.size(); ++i)
      FUZZ_CHECK(std::memcmp(&grad[i], &again[i], sizeof(double)) == 0 || (std::isnan(grad[i]) && std::isnan(again[i])),
                 "exact grad_input element {} is {} on one thread count and {} on another", i, grad[i], again[i]);
  }
  return 0;
}
