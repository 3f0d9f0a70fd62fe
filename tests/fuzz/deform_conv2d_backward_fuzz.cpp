// libFuzzer target: detops::deform_conv2d_backward_workspace_size and deform_conv2d_backward
// (atomic, exact, and the refused truncated and unknown modes) on arbitrary shapes, groups, offset
// groups, strides, padding, dilation, dtypes and values, with or without mask, each of the five
// gradients requested or not, and the fuzz allocator or a caller workspace (exact, larger, one
// byte short). Each call either raises detops::Error before writing anything, or returns with
// every element of the requested gradients written, nothing else touched, the workspace the query
// announced, the same bits on another thread count, and, where every value is a moderate k/32,
// values within rounding of the float64 reference (tests/reference/deform_conv2d_reference.h).
#include "deform_conv2d_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

void check_values(const DeformConv2dCase& c) {
  const test::DeformConv2dProblem p = deform_problem(c, true);
  const test::DeformConv2dResult want = test::ref::deform_conv2d(p);
  const test::DeformConv2dResult mag = test::ref::deform_conv2d(deform_problem(c, true, true));
  const DeformBounds b = deform_bounds(p);
  const DType dt = c.dt;
  // Roundings per term (the accumulation type's, then the dtype's before the final store), each
  // count an upper bound:
  //   a column (m * bilinear)          8: 1 - ly, hy * hx, * v, 3 adds, * m, one spare
  //   grad_columns (w * grad_output)   gc = Cout / groups sums and the product
  //   grad_input                       col2im weight 5, * m, * gc, then one add per sample on the
  //                                    pixel (2 more for the exact mode's partials): in the
  //                                    accumulation type (exact mode, or atomic in float32 /
  //                                    float64), and in the 16-bit dtype too in the atomic mode (the
  //                                    CPU rounds every add as CUDA's atomics do)
  //   grad_offset                      coordinate weight 5, * m, * gc, Cin / offset_groups sums
  //   grad_mask                        bilinear 7, * gc, Cin / offset_groups sums
  //   grad_weight                      column 8, * grad_output, N * Ho * Wo sums
  //   grad_bias                        N * Ho * Wo sums
  const double gc = static_cast<double>(c.Cout / c.groups) + 1;
  const double cog = static_cast<double>(c.Cin / c.offset_groups);
  const double NP = static_cast<double>(c.N * c.Ho * c.Wo);
  const bool rounds_adds_in_t = c.backward.mode == BackwardMode::kAtomic && acc_roundoff(dt) != unit_roundoff(dt);
  if (c.has_grad[0])
    deform_compare("grad_input", read_values(c.grad_input.view), want.grad_input, mag.grad_input, dt, [&](std::size_t i) {
      const double adds = b.input_adds[i];
      return deform_tolerance(dt, mag.grad_input[i], want.grad_input[i], gc + 7 + adds + 2, rounds_adds_in_t ? adds : 0);
    });
  if (c.has_grad[1])
    deform_compare("grad_weight", read_values(c.grad_weight.view), want.grad_weight, mag.grad_weight, dt,
                   [&](std::size_t i) { return deform_tolerance(dt, mag.grad_weight[i], want.grad_weight[i], NP + 9, 0); });
  // see kDeformZeroFillsWithoutChannels
  const bool unwritten = !kDeformZeroFillsWithoutChannels && c.Cin == 0 && c.Cout == 0;
  if (c.has_grad[2] && !unwritten)
    deform_compare("grad_offset", read_values(c.grad_offset.view), want.grad_offset, b.offset_mag, dt,
                   [&](std::size_t i) { return deform_tolerance(dt, b.offset_mag[i], want.grad_offset[i], gc + 7 + cog, 0); });
  if (c.has_grad[3] && !unwritten)
    deform_compare("grad_mask", read_values(c.grad_mask.view), want.grad_mask, mag.grad_mask, dt,
                   [&](std::size_t i) { return deform_tolerance(dt, mag.grad_mask[i], want.grad_mask[i], gc + 8 + cog, 0); });
  if (c.has_grad[4])
    deform_compare("grad_bias", read_values(c.grad_bias.view), want.grad_bias, mag.grad_bias, dt,
                   [&](std::size_t i) { return deform_tolerance(dt, mag.grad_bias[i], want.grad_bias[i], NP, 0); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  DeformConv2dCase c = decode_deform_conv2d(r, arena, /*backward=*/true);
  FuzzAllocator alloc;
  Context ctx = make_context(r, &alloc);
  const int ws_pick = r.u8() % 8;
  alloc.fail_always = ws_pick == 0 && r.one_in(8);
  describe("threads {} workspace {}{} grads input {} weight {} offset {} mask {} bias {}", ctx.num_threads, ws_pick,
           alloc.fail_always ? " (allocator fails)" : "", c.has_grad[0], c.has_grad[1], c.has_grad[2], c.has_grad[3],
           c.has_grad[4]);
  announce();
  const TensorView mask = c.has_mask ? c.mask.view : TensorView{};
  DeformConv2dGrads g;
  const Tensor4* grads[5] = {&c.grad_input, &c.grad_weight, &c.grad_offset, &c.grad_mask, &c.grad_bias};
  TensorView* slots[5] = {&g.grad_input, &g.grad_weight, &g.grad_offset, &g.grad_mask, &g.grad_bias};
  for (int i = 0; i < 5; ++i)
    if (c.has_grad[i]) *slots[i] = grads[i]->view;
  const std::vector<const Tensor4*> all = {&c.input,      &c.weight,      &c.offset,      &c.mask,
                                           &c.result,     &c.grad_input,  &c.grad_weight, &c.grad_offset,
                                           &c.grad_mask,  &c.grad_bias};

  // the size query reads only the views
  arena.arm();
  ErrorCode qcode{};
  std::string qmsg;
  std::size_t bytes = 0;
  const bool qok = run_call([&] {
    bytes = deform_conv2d_backward_workspace_size(c.result.view, c.input.view, c.weight.view, c.offset.view, mask, g,
                                                  c.opt, c.backward, ctx);
  }, &qcode, &qmsg);
  check_memory(arena, all, false);
  DeformWorkspace w;
  if (qok) make_deform_workspace(ws_pick, bytes, &w);
  const bool oom = w.ws.data == nullptr && alloc.fail_always && bytes > 0;

  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] {
    deform_conv2d_backward(c.result.view, c.input.view, c.weight.view, c.offset.view, mask, g, c.opt, c.backward, ctx,
                           w.ws);
  }, &code, &msg);
  check_memory(arena, all, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  FUZZ_CHECK(qok || !ok, "the workspace query raised ({}) but the backward returned", qmsg);
  if (qok && !w.short_by_one && !oom)
    FUZZ_CHECK(ok, "the workspace query returned but the backward raised: {}", msg);
  if (w.short_by_one || oom)
    FUZZ_CHECK(!ok, "the backward returned with {}", oom ? "a failing allocator" : "a workspace one byte short");
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

  // the same bits on another thread count (both modes are deterministic on the CPU)
  std::vector<std::vector<unsigned char>> first(5);
  for (int i = 0; i < 5; ++i)
    if (c.has_grad[i]) first[i] = element_bytes(grads[i]->view), poison(grads[i]->view);
  ctx.num_threads = ctx.num_threads == 3 ? 1 : 3;
  arena.arm();
  const bool again = run_call([&] {
    deform_conv2d_backward(c.result.view, c.input.view, c.weight.view, c.offset.view, mask, g, c.opt, c.backward, ctx,
                           w.ws);
  }, &code, &msg);
  check_memory(arena, all, again);
  FUZZ_CHECK(again, "the backward raised on {} threads after returning on another count: {}", ctx.num_threads, msg);
  static const char* const names[5] = {"grad_input", "grad_weight", "grad_offset", "grad_mask", "grad_bias"};
  for (int i = 0; i < 5; ++i)
    if (c.has_grad[i])
      FUZZ_CHECK(element_bytes(grads[i]->view) == first[i], "{}'s bits depend on the thread count ({} mode)", names[i],
                 to_string(c.backward.mode));

  if (c.moderate_values && c.expect == Expect::kSuccess) check_values(c);
  return 0;
}
