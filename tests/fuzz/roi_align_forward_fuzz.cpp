// libFuzzer target: detops::roi_align_forward on arbitrary shapes, strides, dtypes, options and
// roi values. Each call either raises detops::Error before writing anything, or returns with
// every output element written, nothing else touched, and values within the dtype's tolerance of
// the float64 reference (tests/reference/roi_align_reference.h) wherever that applies: finite
// input, valid moderate rois whose samples are away from the apron's edge.
#include "roi_align_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

void check_values(const RoiAlignCase& c) {
  if (c.K == 0 || c.C == 0) return;
  const RoiAlignOptions& o = c.opt;
  const bool max_pool = o.pool_mode == PoolMode::kMax;
  const std::vector<double> out = read_values(c.pooled.view);
  const std::vector<double> am = c.has_argmax ? read_values(c.argmax.view) : std::vector<double>{};
  const std::int64_t per_roi = c.C * o.pooled_height * o.pooled_width;
  std::vector<double> input, abs_input;
  if (c.features_finite) {
    input = read_values(c.features.view);
    abs_input = input;
    for (double& x : abs_input) x = std::fabs(x);
  }
  for (std::int64_t k = 0; k < c.K; ++k) {
    const RoiRow& row = c.rows[static_cast<std::size_t>(k)];
    const std::size_t base = static_cast<std::size_t>(k * per_roi);
    if (row.status == RowStatus::kInvalid) {  // check_rois = false: the row pools to zero
      for (std::int64_t i = 0; i < per_roi; ++i) {
        FUZZ_CHECK(out[base + static_cast<std::size_t>(i)] == 0.0, "invalid rois[{}] (check_rois off): output {} is {}",
                   k, i, out[base + static_cast<std::size_t>(i)]);
        if (max_pool) FUZZ_CHECK(am[base + static_cast<std::size_t>(i)] == -1, "invalid rois[{}]: argmax {} is {}", k, i,
                                 am[base + static_cast<std::size_t>(i)]);
      }
      continue;
    }
    if (!row.comparable || !c.features_finite || c.features_maxabs > 1e4) continue;
    const std::vector<double> roi(row.v, row.v + 5);
    std::vector<double> want, mag;
    std::vector<std::int32_t> want_am;
    ref::roi_align_forward_ref(input, c.N, c.C, c.H, c.W, roi, 1, o.pooled_height, o.pooled_width, o.spatial_scale,
                               o.sampling_ratio, o.aligned, max_pool, &want, &want_am);
    ref::roi_align_forward_ref(abs_input, c.N, c.C, c.H, c.W, roi, 1, o.pooled_height, o.pooled_width,
                               o.spatial_scale, o.sampling_ratio, o.aligned, false, &mag);
    const double n = static_cast<double>(row.grid_h * row.grid_w);
    const double eps_a = acc_roundoff(c.dt), eps_t = unit_roundoff(c.dt);
    const double under = underflow_error(c.dt);
    const double tiny = 2 * (4 * n + 8) * under;
    const ref::RoiGeometryRef g = ref::roi_geometry_ref(row.v, o.pooled_height, o.pooled_width, o.spatial_scale,
                                                        o.sampling_ratio, o.aligned);
    for (std::int64_t i = 0; i < per_roi; ++i) {
      const std::size_t at = base + static_cast<std::size_t>(i);
      const double got = out[at], w = want[static_cast<std::size_t>(i)];
      const double pos = 8 * row.delta * c.features_maxabs;  // sample positions in the accumulation type
      const double tol = max_pool ? pos + 16 * eps_a * c.features_maxabs + 2 * eps_t * std::fabs(w) + tiny
                                  : pos + (4 * n + 8) * eps_a * mag[static_cast<std::size_t>(i)] + 2 * eps_t * std::fabs(w) + tiny;
      FUZZ_CHECK(close(got, w, tol), "output[{}, c={}, ph={}, pw={}] = {} but the float64 reference gives {} (tol {:.3g})",
                 k, i / (o.pooled_height * o.pooled_width), (i / o.pooled_width) % o.pooled_height, i % o.pooled_width,
                 got, w, tol);
      if (!max_pool) continue;
      // argmax: -1 exactly when the bin has no samples, else a sample whose value is (within the
      // tolerance) the maximum.
      const double a = am[at];
      if (n == 0) {
        FUZZ_CHECK(a == -1, "argmax {} for a bin without samples (expected -1)", a);
        continue;
      }
      FUZZ_CHECK(a >= 0 && a < n, "argmax[{}, {}] = {} outside [0, {})", k, i, a, n);
      const std::int64_t ai = static_cast<std::int64_t>(a);
      const std::int64_t ph = (i / o.pooled_width) % o.pooled_height, pw = i % o.pooled_width;
      const std::int64_t ch = i / (o.pooled_height * o.pooled_width);
      const double* plane = &input[static_cast<std::size_t>((g.batch * c.C + ch) * c.H * c.W)];
      const double v = ref::bilinear_value_ref(plane, c.H, c.W, ref::sample_y_ref(g, ph, ai / g.grid_w),
                                               ref::sample_x_ref(g, pw, ai % g.grid_w));
      FUZZ_CHECK(close(v, w, 2 * tol), "argmax[{}, {}] = {} picks a sample of value {}, but the maximum is {}", k, i, a,
                 v, w);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  RoiAlignCase c = decode_roi_align(r, arena, /*backward=*/false);
  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("threads {}", ctx.num_threads);
  announce();
  // Slow by design (large grids with the sample guard raised): not what this target is for.
  if (c.expect != Expect::kError && c.work > 4e6) {
    // Still validate: the workspace query checks every roi (grids, sample counts) without doing
    // the work, and must neither crash nor overflow nor write anything.
    ++stats().skipped;
    announce();
  arena.arm();
    ErrorCode qcode{};
    std::string qmsg;
    run_call([&] { roi_align_backward_workspace_size(c.pooled.view, c.rois.view, c.features.view, c.opt, {}, ctx); },
             &qcode, &qmsg);
    check_memory(arena, {&c.features, &c.rois, &c.pooled, &c.argmax}, false);
    return 0;
  }
  const TensorView argmax = c.has_argmax ? c.argmax.view : TensorView{};

  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] { roi_align_forward(c.features.view, c.rois.view, c.pooled.view, c.opt, ctx, argmax); },
                           &code, &msg);
  check_memory(arena, {&c.features, &c.rois, &c.pooled, &c.argmax}, ok);
  FUZZ_CHECK(alloc.live() == 0, "{} workspace allocations not freed", alloc.live());
  if (!ok) {
    check_error_code(code, msg, alloc);
    FUZZ_CHECK(c.expect != Expect::kSuccess, "a valid call raised: {}", msg);
    return 0;
  }
  FUZZ_CHECK(c.expect != Expect::kError, "an invalid call returned normally");
  if (c.cross_overlap || (c.expect == Expect::kEither && c.rows.size() != static_cast<std::size_t>(c.K))) return 0;
  if (c.rows.size() == static_cast<std::size_t>(c.K)) check_values(c);
  return 0;
}
