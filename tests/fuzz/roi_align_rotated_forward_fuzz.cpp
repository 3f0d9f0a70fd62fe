// libFuzzer target: detops::roi_align_rotated_forward on arbitrary small shapes, strides, dtypes,
// options and roi values. Each call either raises detops::Error (naming the op) before writing
// anything, or returns with every output element written and nothing else touched; a returned
// call on a finite input gives outputs no larger than the input's largest value (an average of
// bilinear samples), and rows the library rejected pool to zero.
#include "roi_align_rotated_case.h"

using namespace detops;
using namespace detops::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  RotatedCase c = decode_rotated(r, arena, /*backward=*/false);
  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  announce();
  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] { roi_align_rotated_forward(c.features.view, c.rois.view, c.pooled.view, c.opt, ctx); },
                           &code, &msg);
  check_memory(arena, {&c.features, &c.rois, &c.pooled}, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  if (!ok) {
    check_rotated_error(code, msg);
    FUZZ_CHECK(c.expect != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (!c.features_finite || c.features_maxabs > 1e30) return 0;  // sums of huge values may overflow
  const double bound = c.features_maxabs * (1 + 1.0 / 64) + 1e-30;
  for (double v : read_values(c.pooled.view))
    FUZZ_CHECK(std::isfinite(v) && std::fabs(v) <= bound, "output {} outside [-{}, {}]", v, bound, bound);
  return 0;
}
