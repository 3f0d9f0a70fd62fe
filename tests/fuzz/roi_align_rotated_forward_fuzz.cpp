// libFuzzer target: detops::roi_align_rotated_forward on arbitrary small shapes, strides, dtypes,
// options and roi values. Each call either raises detops::Error (naming the op) before writing
// anything, or returns with every output element written and nothing else touched; a returned
// call on a finite input gives outputs no larger than the input's largest value (an average of
// bilinear samples), rows the library rejected (check_rois off) pool to zero, and every
// comparable row (see classify_rotated_row) agrees with the float64 reference
// (tests/reference/roi_align_rotated_reference.h) within the dtype's tolerance.
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
  const std::vector<double> out = read_values(c.pooled.view);
  for (double v : out) FUZZ_CHECK(std::isfinite(v) && std::fabs(v) <= bound, "output {} outside [-{}, {}]", v, bound, bound);

  // Against the float64 reference, row by row.
  const std::vector<double> input = read_values(c.features.view);
  std::vector<double> abs_input = input;
  for (double& x : abs_input) x = std::fabs(x);
  const ref::RotatedParamsRef p = rotated_params(c);
  const std::int64_t per_roi = c.C * p.PH * p.PW;
  const double eps_a = acc_roundoff(c.dt), eps_t = unit_roundoff(c.dt);
  const double under = underflow_error(c.dt);
  for (std::int64_t k = 0; k < c.K; ++k) {
    const RotatedRow& row = c.rows[static_cast<std::size_t>(k)];
    const std::size_t base = static_cast<std::size_t>(k * per_roi);
    if (!row.valid) {
      for (std::int64_t i = 0; i < per_roi; ++i)
        FUZZ_CHECK(out[base + static_cast<std::size_t>(i)] == 0.0, "invalid rois[{}] (check_rois off): output {} is {}",
                   k, i, out[base + static_cast<std::size_t>(i)]);
      continue;
    }
    if (!row.comparable || c.features_maxabs > 1e4) continue;
    const std::vector<double> roi(row.v, row.v + 6);
    const std::vector<double> want = ref::roi_align_rotated_forward_ref(input, c.N, c.C, c.H, c.W, roi, 1, p);
    const std::vector<double> mag = ref::roi_align_rotated_forward_ref(abs_input, c.N, c.C, c.H, c.W, roi, 1, p);
    const std::vector<ref::RotatedSampleRef> samples = ref::rotated_samples_ref(row.v, p);
    const double n = samples.empty() ? 1.0 : samples[0].count;  // samples per bin
    const double tiny = 2 * (4 * n + 8) * under;
    for (std::int64_t i = 0; i < per_roi; ++i) {
      const double got = out[base + static_cast<std::size_t>(i)], w = want[static_cast<std::size_t>(i)];
      // a sample moved by delta changes a bilinear value by at most 2 maxabs delta per axis
      const double tol = 8 * row.delta * c.features_maxabs + (4 * n + 8) * eps_a * mag[static_cast<std::size_t>(i)] +
                         2 * eps_t * std::fabs(w) + tiny;
      FUZZ_CHECK(close(got, w, tol), "output[{}, c={}, ph={}, pw={}] = {} but the float64 reference gives {} (tol {:.3g})",
                 k, i / (p.PH * p.PW), (i / p.PW) % p.PH, i % p.PW, got, w, tol);
    }
  }
  return 0;
}
