// libFuzzer target: detops::deform_conv2d_forward_workspace_size and deform_conv2d_forward on
// arbitrary shapes, groups, offset groups, strides, padding, dilation, dtypes and values, with or
// without mask and bias, with the fuzz allocator or a caller workspace (exact, larger, one byte
// short). Each call either raises detops::Error before writing anything, or returns with every
// output element written, nothing else touched, the workspace the query announced, the same bits
// on another thread count, and, where every value is a moderate k/32, values within rounding of
// the float64 reference (tests/reference/deform_conv2d_reference.h).
#include "deform_conv2d_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

void check_values(const DeformConv2dCase& c) {
  const test::DeformConv2dResult want = test::ref::deform_conv2d(deform_problem(c, false));
  const test::DeformConv2dResult mag = test::ref::deform_conv2d(deform_problem(c, false, true));
  // Each term w * m * bilinear: at most 8 roundings in the column (1 - ly, hy * hx, * v, 3 adds, * m,
  // one spare), the product's; then the R = Cin / groups * kh * kw sums of the GEMM and the bias's.
  const double R = static_cast<double>(c.Cin / c.groups * c.kh * c.kw);
  deform_compare("output", read_values(c.result.view), want.output, mag.output, c.dt,
                 [&](std::size_t i) { return deform_tolerance(c.dt, mag.output[i], want.output[i], R + 10, 0); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  DeformConv2dCase c = decode_deform_conv2d(r, arena, /*backward=*/false);
  FuzzAllocator alloc;
  Context ctx = make_context(r, &alloc);
  const int ws_pick = r.u8() % 8;
  alloc.fail_always = ws_pick == 0 && r.one_in(8);
  describe("threads {} workspace {}{}", ctx.num_threads, ws_pick, alloc.fail_always ? " (allocator fails)" : "");
  announce();
  const TensorView mask = c.has_mask ? c.mask.view : TensorView{};
  const TensorView bias = c.has_bias ? c.bias.view : TensorView{};
  const std::vector<const Tensor4*> all = {&c.input, &c.weight, &c.offset, &c.mask, &c.bias, &c.result};

  // the size query reads only the views
  arena.arm();
  ErrorCode qcode{};
  std::string qmsg;
  std::size_t bytes = 0;
  const bool qok = run_call([&] {
    bytes = deform_conv2d_forward_workspace_size(c.input.view, c.weight.view, c.offset.view, mask, bias,
                                                 c.result.view, c.opt, ctx);
  }, &qcode, &qmsg);
  check_memory(arena, all, false);
  DeformWorkspace w;
  if (qok) make_deform_workspace(ws_pick, bytes, &w);
  const bool oom = w.ws.data == nullptr && alloc.fail_always && bytes > 0;

  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] {
    deform_conv2d_forward(c.input.view, c.weight.view, c.offset.view, mask, bias, c.result.view, c.opt, ctx, w.ws);
  }, &code, &msg);
  check_memory(arena, all, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  FUZZ_CHECK(qok || !ok, "the workspace query raised ({}) but the forward returned", qmsg);
  if (qok && !w.short_by_one && !oom)
    FUZZ_CHECK(ok, "the workspace query returned but the forward raised: {}", msg);
  if (w.short_by_one || oom) FUZZ_CHECK(!ok, "the forward returned with {}", oom ? "a failing allocator" : "a workspace one byte short");
  if (w.ws.data) FUZZ_CHECK(alloc.requests == 0, "allocated workspace although the caller gave {} bytes", w.ws.bytes);
  else if (ok)
    FUZZ_CHECK(alloc.requests == (bytes > 0 ? 1 : 0) && alloc.last_request == bytes,
               "{} allocations, the last of {} bytes; the query said {}", alloc.requests, alloc.last_request, bytes);
  if (!ok) {
    if (!qok) check_deform_error_code(qcode, qmsg, false);
    check_deform_error_code(code, msg, oom);
    FUZZ_CHECK(c.expect != Expect::kSuccess || w.short_by_one || oom, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");

  // the same bits on another thread count (a fresh poisoning, the same workspace source)
  const std::vector<unsigned char> first = element_bytes(c.result.view);
  poison(c.result.view);
  ctx.num_threads = ctx.num_threads == 3 ? 1 : 3;
  arena.arm();
  const bool again = run_call([&] {
    deform_conv2d_forward(c.input.view, c.weight.view, c.offset.view, mask, bias, c.result.view, c.opt, ctx, w.ws);
  }, &code, &msg);
  check_memory(arena, all, again);
  FUZZ_CHECK(again, "the forward raised on {} threads after returning on another count: {}", ctx.num_threads, msg);
  FUZZ_CHECK(element_bytes(c.result.view) == first, "the output's bits depend on the thread count");

  if (c.moderate_values && c.expect == Expect::kSuccess) check_values(c);
  return 0;
}
