// libFuzzer target: detops::roi_align_backward (atomic, truncated and exact modes, avg and max
// pooling) and roi_align_backward_workspace_size, on arbitrary shapes, strides, dtypes, options,
// roi values, argmax contents and workspaces (none, the default allocator, a counting allocator,
// a caller buffer of exactly the queried size, larger, or one byte short). Each call either raises
// detops::Error before writing anything, or fully overwrites grad_input, touches nothing else and
// agrees with the float64 reference within the mode's and dtype's tolerance where it applies.
// The workspace query must write nothing, agree with the call about validity, and return a size
// no smaller than the mode's arrays need (4 slots of at least 8 bytes per sample in exact mode).
#include <memory>

#include "roi_align_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

void check_values(const RoiAlignCase& c) {
  const RoiAlignOptions& o = c.opt;
  const bool max_pool = o.pool_mode == PoolMode::kMax;
  const std::vector<double> got = read_values(c.features.view);
  if (c.K == 0) {
    for (std::size_t i = 0; i < got.size(); ++i) FUZZ_CHECK(got[i] == 0.0, "no rois: grad_input[{}] is {}", i, got[i]);
    return;
  }
  if (c.C == 0 || !c.pooled_finite || c.pooled_maxabs > 1e4) return;
  for (const RoiRow& row : c.rows)
    if (!row.comparable && row.status != RowStatus::kInvalid) return;
  const std::int64_t PH = o.pooled_height, PW = o.pooled_width, per_roi = c.C * PH * PW;
  const std::vector<double> grad = read_values(c.pooled.view);
  const std::vector<double> am = c.has_argmax ? read_values(c.argmax.view) : std::vector<double>{};
  std::vector<double> rois_f, grad_f;
  std::vector<std::int32_t> am_f;
  const std::size_t total = static_cast<std::size_t>(c.N * c.C * c.H * c.W);
  std::vector<double> absmag(total, 0.0), absgd(total, 0.0), count(total, 0.0);
  std::int64_t kept = 0;
  for (std::int64_t k = 0; k < c.K; ++k) {
    const RoiRow& row = c.rows[static_cast<std::size_t>(k)];
    if (!row.comparable) continue;  // an invalid row with check_rois off: contributes nothing
    ++kept;
    rois_f.insert(rois_f.end(), row.v, row.v + 5);
    const ref::RoiGeometryRef g = ref::roi_geometry_ref(row.v, PH, PW, o.spatial_scale, o.sampling_ratio, o.aligned);
    const std::int64_t n = g.grid_h * g.grid_w;
    for (std::int64_t i = 0; i < per_roi; ++i) {
      const std::size_t at = static_cast<std::size_t>(k * per_roi + i);
      const double gv = grad[at];
      grad_f.push_back(gv);
      const std::int64_t ch = i / (PH * PW), ph = (i / PW) % PH, pw = i % PW;
      const std::size_t plane = static_cast<std::size_t>((g.batch * c.C + ch) * c.H * c.W);
      auto add = [&](double y, double x, double den) {
        ref::BilinearRef b;
        if (!ref::bilinear_ref(c.H, c.W, y, x, &b)) return;
        for (int q = 0; q < 4; ++q) {
          const std::size_t p = plane + static_cast<std::size_t>(b.pos[q]);
          absmag[p] += std::fabs(gv * b.w[q] / den);
          count[p] += 1;
        }
        // Position error (float32 geometry): the weights move by up to delta, and a sample within
        // delta of a pixel row or column may take the neighbours on its other side, with weights
        // up to delta: allow delta * |g| / den on the 4x4 neighbourhood.
        if (row.delta == 0) return;
        const std::int64_t y0 = b.pos[0] / c.W, x0 = b.pos[0] % c.W;
        for (std::int64_t yy = std::max<std::int64_t>(y0 - 1, 0); yy <= std::min(y0 + 2, c.H - 1); ++yy)
          for (std::int64_t xx = std::max<std::int64_t>(x0 - 1, 0); xx <= std::min(x0 + 2, c.W - 1); ++xx)
            absgd[plane + static_cast<std::size_t>(yy * c.W + xx)] += row.delta * std::fabs(gv) / den;
      };
      if (!max_pool) {
        for (std::int64_t iy = 0; iy < g.grid_h; ++iy)
          for (std::int64_t ix = 0; ix < g.grid_w; ++ix)
            add(ref::sample_y_ref(g, ph, iy), ref::sample_x_ref(g, pw, ix), static_cast<double>(n));
      } else {
        const double a = am[at];
        const std::int32_t ai = a >= 0 && a < static_cast<double>(n) ? static_cast<std::int32_t>(a) : -1;
        am_f.push_back(ai);  // the library ignores an argmax outside the bin's samples
        if (ai >= 0) add(ref::sample_y_ref(g, ph, ai / g.grid_w), ref::sample_x_ref(g, pw, ai % g.grid_w), 1.0);
      }
    }
  }
  const std::vector<double> want = ref::roi_align_backward_ref(grad_f, c.N, c.C, c.H, c.W, rois_f, kept, PH, PW,
                                                               o.spatial_scale, o.sampling_ratio, o.aligned, max_pool,
                                                               max_pool ? &am_f : nullptr);
  check_scattered_gradient(got, want, absgd, absmag, count, c.C, c.H, c.W, c.dt, c.bwd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  RoiAlignCase c = decode_roi_align(r, arena, /*backward=*/true);
  FuzzAllocator alloc;
  Context ctx = make_context(r, &alloc);
  // Workspace: 0-3 the counting allocator, 4 the default allocator, 5 a caller buffer of exactly
  // the queried size, 6 a larger one at an 8-byte offset, 7 one byte short (an error).
  const int ws_mode = r.u8() % 8;
  describe("threads {} workspace mode {}", ctx.num_threads, ws_mode);
  const TensorView argmax = c.has_argmax ? c.argmax.view : TensorView{};
  const std::vector<const Tensor4*> tensors = {&c.features, &c.rois, &c.pooled, &c.argmax};

  // The workspace query: writes nothing; its size covers what the mode needs.
  announce();
  arena.arm();
  ErrorCode qcode{};
  std::string qmsg;
  std::size_t need = 0;
  const bool q_ok = run_call(
      [&] { need = roi_align_backward_workspace_size(c.pooled.view, c.rois.view, c.features.view, c.opt, c.bwd, ctx); },
      &qcode, &qmsg);
  check_memory(arena, tensors, false);
  describe("workspace query: {}", q_ok ? fmt::format("{} bytes", need) : qmsg);
  if (q_ok && c.rows.size() == static_cast<std::size_t>(c.K) && c.C > 0) {
    double samples = 0;
    for (const RoiRow& row : c.rows)
      if (row.status == RowStatus::kValid) samples += row.samples_lower;
    if (c.bwd.mode == BackwardMode::kExact)
      FUZZ_CHECK(static_cast<double>(need) >= 4 * samples * 8,
                 "exact-mode workspace of {} bytes for at least {} samples (4 slots of >= 8 bytes each): overflow?", need,
                 samples);
    if (c.bwd.mode == BackwardMode::kTruncated && c.K > 0)
      FUZZ_CHECK(static_cast<double>(need) >= 8.0 * static_cast<double>(c.N * c.C * c.H * c.W),
                 "truncated-mode workspace of {} bytes for {} doubles", need, c.N * c.C * c.H * c.W);
  }
  // An astronomically large workspace (more than 2^40 bytes: sampling ratios of 2^20 and more with
  // the sample guard raised) may be refused by the query itself with kOutOfMemory.
  double samples_upper = 0;
  for (const RoiRow& row : c.rows)
    if (row.status != RowStatus::kInvalid) samples_upper += row.samples_upper;
  const bool astronomic = c.bwd.mode == BackwardMode::kExact && 4 * samples_upper * 8 > std::ldexp(1.0, 40);
  if (!q_ok) {
    check_error_code(qcode, qmsg, alloc);
    FUZZ_CHECK(c.expect != Expect::kSuccess || (astronomic && qcode == ErrorCode::kOutOfMemory),
               "the workspace query raised on a valid call: {}", qmsg);
  }
  // Slow by design (large grids with the sample guard raised): not what this target is for.
  if (c.expect != Expect::kError && c.work > 4e6) {
    ++stats().skipped;
    return 0;
  }

  Workspace ws{};
  std::unique_ptr<unsigned char[]> ws_mem;  // exactly sized: ASan sees any access past its end
  bool short_ws = false;
  if (q_ok && need > 0 && need <= alloc.cap && ws_mode >= 5) {
    const std::size_t offset = ws_mode == 6 ? (kWorkspaceAlignmentHandled && r.one_in(2) ? 4 : 8) : 0;
    const std::size_t bytes = ws_mode == 7 ? need - 1 : ws_mode == 6 ? need + 40 : need;
    ws_mem.reset(new unsigned char[bytes + offset]);
    std::memset(ws_mem.get(), 0xEE, bytes + offset);
    ws = {ws_mem.get() + offset, bytes};
    short_ws = ws_mode == 7;
  } else if (q_ok && need <= alloc.cap && ws_mode == 4) {
    ctx.allocator = nullptr;  // the default allocator (operator new)
  }

  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call(
      [&] { roi_align_backward(c.pooled.view, c.rois.view, c.features.view, c.opt, c.bwd, ctx, argmax, ws); }, &code,
      &msg);
  check_memory(arena, tensors, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  if (q_ok && ws.data == nullptr && ctx.allocator == &alloc && alloc.requests > 0)
    FUZZ_CHECK(alloc.last_request == need, "allocated {} bytes of workspace, the query said {}", alloc.last_request, need);
  if (ws.data) FUZZ_CHECK(alloc.requests == 0, "allocated workspace although the caller gave {} bytes", ws.bytes);
  if (!q_ok) FUZZ_CHECK(!ok, "the workspace query raised ({}) but the call returned", qmsg);
  if (!ok) {
    check_error_code(code, msg, alloc);
    const bool refused = alloc.requests > 0 && alloc.last_request > alloc.cap;
    FUZZ_CHECK(c.expect != Expect::kSuccess || refused || short_ws, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(!short_ws, "returned normally with a workspace one byte short ({} < {})", ws.bytes, need);
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (c.cross_overlap || c.rows.size() != static_cast<std::size_t>(c.K)) return 0;
  check_values(c);
  return 0;
}
