// libFuzzer target: detops::ms_deform_attn_forward on arbitrary shapes, strides, dtypes, level
// tables and locations. Each call either raises detops::Error before writing anything, or
// returns with every output element written, nothing else touched, and, for finite inputs,
// values within rounding of the float64 reference (tests/reference/ms_deform_attn_reference.h).
#include "ms_deform_attn_case.h"

using namespace detops;
using namespace detops::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  MsdaCase c = decode_msda(r, arena, /*backward=*/false);
  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("op ms_deform_attn_forward {} dtype {} locations {} threads {}", msda_describe(c), dtype_name(c.dt),
           dtype_name(c.loc_dt), ctx.num_threads);
  for (const Tensor4* t : {&c.value, &c.spatial_shapes, &c.level_start, &c.loc, &c.attn, &c.output})
    describe("  {}: {}", t->name, describe_view(t->view));
  describe("expect {}", expect_name(c.expect));
  note_expect(c.expect, false, false);
  announce();

  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] {
    ms_deform_attn_forward(c.value.view, c.spatial_shapes.view, c.level_start.view, c.loc.view, c.attn.view,
                           c.output.view, ctx);
  }, &code, &msg);
  const std::vector<const Tensor4*> all = {&c.value, &c.spatial_shapes, &c.level_start, &c.loc, &c.attn, &c.output};
  check_memory(arena, all, ok);
  FUZZ_CHECK(alloc.live() == 0 && alloc.requests == 0, "the forward allocated workspace");
  if (!ok) {
    FUZZ_CHECK(code == ErrorCode::kInvalidArgument, "unexpected error code {} ({})", static_cast<int>(code), msg);
    FUZZ_CHECK(c.expect != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (c.expect != Expect::kSuccess || !c.finite) return 0;

  const ref::MsdaProblemRef pr = msda_problem(c), abs_pr = msda_problem(c, true);
  const std::vector<double> want = ref::msda_forward_ref(pr), mag = ref::msda_forward_ref(abs_pr);
  const DType acc = c.dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  const double pos = 16 * acc_roundoff(acc) * (2 * msda_max_side(c) + 8) * max_abs_of(pr.value) * max_abs_of(pr.attn) *
                     static_cast<double>(c.L * c.P);
  msda_compare("output", read_values(c.output.view), want, mag, static_cast<double>(4 * c.L * c.P), c.dt, acc, pos);
  return 0;
}
