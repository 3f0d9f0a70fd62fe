// libFuzzer target: detops::roi_align_rotated_backward_workspace_size and
// roi_align_rotated_backward (atomic, truncated, exact) on arbitrary small shapes, strides,
// dtypes, options and roi values. Each call either raises detops::Error (naming the op) before
// writing anything, or returns with every grad_input element written and nothing else touched.
// A returned call on a finite grad_output gives a gradient whose total mass is at most
// grad_output's (every bin spreads its gradient with weights summing to at most 1); the exact
// mode's bits do not depend on the thread count (the call is repeated on one and three threads).
// When every row is comparable (see classify_rotated_row) or rejected, grad_input agrees with the
// float64 reference (tests/reference/roi_align_rotated_reference.h) within the mode's and dtype's
// tolerance.
#include "roi_align_rotated_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

void check_values(const RotatedCase& c, const std::vector<double>& got) {
  if (c.K == 0) {
    for (std::size_t i = 0; i < got.size(); ++i) FUZZ_CHECK(got[i] == 0.0, "no rois: grad_input[{}] is {}", i, got[i]);
    return;
  }
  if (c.C == 0 || c.pooled_maxabs > 1e4) return;
  for (const RotatedRow& row : c.rows)
    if (row.valid && !row.comparable) return;
  const ref::RotatedParamsRef p = rotated_params(c);
  const std::int64_t per_roi = c.C * p.PH * p.PW;
  const std::vector<double> grad = read_values(c.pooled.view);
  const std::size_t total = static_cast<std::size_t>(c.N * c.C * c.H * c.W);
  // per element: the sum of |contributions|, their count, and the position-error allowance
  std::vector<double> absmag(total, 0.0), absgd(total, 0.0), count(total, 0.0);
  std::vector<double> rois_f, grad_f;
  std::int64_t kept = 0;
  for (std::int64_t k = 0; k < c.K; ++k) {
    const RotatedRow& row = c.rows[static_cast<std::size_t>(k)];
    if (!row.valid) continue;  // rejected with check_rois off: contributes nothing
    ++kept;
    rois_f.insert(rois_f.end(), row.v, row.v + 6);
    grad_f.insert(grad_f.end(), grad.begin() + k * per_roi, grad.begin() + (k + 1) * per_roi);
    const std::int64_t b = static_cast<std::int64_t>(row.v[0]);
    for (const ref::RotatedSampleRef& s : ref::rotated_samples_ref(row.v, p)) {
      std::int64_t idx[4];
      double w[4];
      const int n = ref::bilinear_ref(s.y, s.x, c.H, c.W, idx, w);
      for (std::int64_t ch = 0; ch < c.C; ++ch) {
        const double gv = grad[static_cast<std::size_t>(k * per_roi + ch * p.PH * p.PW + s.bin)];
        const std::size_t plane = static_cast<std::size_t>((b * c.C + ch) * c.H * c.W);
        for (int q = 0; q < n; ++q) {
          absmag[plane + static_cast<std::size_t>(idx[q])] += std::fabs(gv * w[q] / s.count);
          count[plane + static_cast<std::size_t>(idx[q])] += 1;
        }
        // The weights move by up to delta, and a sample within delta of a pixel row or column
        // may take the neighbours on its other side: allow delta |g| / count on the 4x4 patch.
        if (n == 0 || row.delta == 0) continue;
        const std::int64_t y0 = idx[0] / c.W, x0 = idx[0] % c.W;
        for (std::int64_t yy = std::max<std::int64_t>(y0 - 1, 0); yy <= std::min(y0 + 2, c.H - 1); ++yy)
          for (std::int64_t xx = std::max<std::int64_t>(x0 - 1, 0); xx <= std::min(x0 + 2, c.W - 1); ++xx)
            absgd[plane + static_cast<std::size_t>(yy * c.W + xx)] += row.delta * std::fabs(gv) / s.count;
      }
    }
  }
  const std::vector<double> want = ref::roi_align_rotated_backward_ref(grad_f, c.N, c.C, c.H, c.W, rois_f, kept, p);
  check_scattered_gradient(got, want, absgd, absmag, count, c.C, c.H, c.W, c.dt, c.bwd);
}

}  // namespace

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
  // A sum past the dtype's largest value rounds to inf (float16: 65504, with grad_output's values
  // 65504 or rois piled on one spot): the dtype's range, not a mass bound.
  if (upstream * (1 + 1.0 / 16) < dtype_max(c.dt))
    FUZZ_CHECK(mass <= upstream * (1 + 1.0 / 16) + 1e-30, "grad_input mass {} exceeds grad_output's {}", mass,
               upstream);
  check_values(c, grad);
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
