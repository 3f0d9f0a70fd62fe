// libFuzzer target: detops::sync_batch_norm_forward on one rank (communicator nullptr), training
// and evaluation, default and exact modes (and unknown ones), on arbitrary small shapes,
// strides, dtypes and values; weight/bias, running statistics and num_batches_tracked present,
// absent, alone, of a wrong dtype, size, rank or stride; eps and momentum valid, boundary,
// NaN, infinite, negative, above 1 or unset; y in place (y = x) or not; outputs sometimes
// overlapping other tensors. A call either raises detops::Error (kInvalidArgument, or
// kNotCompiled for a CUDA tensor) with every byte unchanged, or writes only y, save_mean,
// save_invstd and (training, with running statistics) running_mean, running_var and
// num_batches_tracked, with values within the error bound of the float64 reference when the
// inputs are finite and moderate; the same call in the other mode, on dense copies, agrees.
#include "sync_bn_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

struct FwdInputs {
  FbnShape sh;
  SyncBnOptions o;
  DType dt = DType::kFloat32;
  std::vector<double> x, w, b, rm, rv;  // w, b empty: not affine; rm, rv empty: not tracked
  bool has_nbt = false;
  std::int64_t nbt = 0;
};

struct FwdOutputs {
  std::vector<double> y, mean, invstd, rm, rv;
  std::int64_t nbt = 0;
};

/// The float64 reference and its error bounds (`exact`: with the exact mode's grid error).
struct FwdRef {
  FwdOutputs want, tol;
  std::vector<bool> channel_ok;  // invstd and y comparable (var + eps not within the error of 0)
  bool running_ok = true;        // the factor is in [0, 1]
  DType rdt = DType::kFloat32;
};

FwdRef forward_reference(const FwdInputs& in, bool exact, DType rdt) {
  FwdRef r;
  r.rdt = rdt;
  const FbnShape& sh = in.sh;
  const std::int64_t C = sh.C(), HW = sh.HW();
  const std::size_t Cs = static_cast<std::size_t>(C);
  r.want.mean.assign(Cs, 0.0), r.want.invstd.assign(Cs, 0.0), r.tol.mean.assign(Cs, 0.0), r.tol.invstd.assign(Cs, 0.0);
  r.channel_ok.assign(Cs, true);
  r.want.rm = in.rm, r.want.rv = in.rv, r.tol.rm.assign(in.rm.size(), 0.0), r.tol.rv.assign(in.rv.size(), 0.0);
  r.want.nbt = in.nbt;
  const std::vector<ChannelStats> st = channel_stats(in.x, sh);
  const std::int64_t count = sh.N() * HW;
  const double tiny_r = 2 * dtype_min_normal(r.rdt) * unit_roundoff(r.rdt);
  for (std::size_t c = 0; c < Cs; ++c) {
    const ChannelStats& s = st[c];
    double mean, invstd, mean_tol, var_tol, var;
    if (in.o.training) {
      if (s.n == 0) {
        r.want.mean[c] = r.want.invstd[c] = 0.0;
        continue;
      }
      const double G = exact ? exact_grid(s.maxabs) : 0.0;
      mean = s.mean;
      var = s.var;
      mean_tol = 8 * kU64 * s.maxabs + G;
      var_tol = 16 * kU64 * (s.maxabs * s.maxdev + static_cast<double>(s.n) * s.var) + 2 * G * s.maxdev + G * G;
    } else {
      mean = in.rm[c];
      var = in.rv[c];
      mean_tol = 0.0;
      var_tol = 0.0;
    }
    invstd = 1.0 / std::sqrt(var + in.o.eps);
    r.want.mean[c] = mean;
    r.want.invstd[c] = invstd;
    r.tol.mean[c] = mean_tol;
    if (!(var + in.o.eps > 8 * var_tol) && in.o.training) {
      r.channel_ok[c] = false;
    } else {
      r.tol.invstd[c] = (0.75 * var_tol / (var + in.o.eps) + 4 * kU64) * std::fabs(invstd);
    }
    if (in.o.training && !in.rm.empty() && s.n >= 2) {
      // the library's counter + 1 in int64 (the harness wraps instead of overflowing)
      const double tracked = in.has_nbt ? static_cast<double>(saturating_increment(in.nbt)) : 1.0;
      const double f = in.o.momentum ? *in.o.momentum : 1.0 / tracked;
      if (!(f >= 0.0 && f <= 1.0)) {
        r.running_ok = false;
        continue;
      }
      const double unb_tol = var_tol * static_cast<double>(s.n) / static_cast<double>(s.n - 1);
      r.want.rm[c] = (1 - f) * in.rm[c] + f * mean;
      r.want.rv[c] = (1 - f) * in.rv[c] + f * s.unbiased;
      r.tol.rm[c] = f * mean_tol + 4 * kU64 * (std::fabs(in.rm[c]) + f * std::fabs(mean)) +
                    2 * unit_roundoff(r.rdt) * std::fabs(r.want.rm[c]) + tiny_r;
      r.tol.rv[c] = f * unb_tol + 4 * kU64 * (std::fabs(in.rv[c]) + f * s.unbiased) +
                    2 * unit_roundoff(r.rdt) * std::fabs(r.want.rv[c]) + tiny_r;
    }
  }
  if (in.o.training && !in.rm.empty() && in.has_nbt && count >= 2) r.want.nbt = saturating_increment(in.nbt);
  // y
  const double eps_t = unit_roundoff(in.dt), tiny = 2 * dtype_min_normal(in.dt) * eps_t;
  r.want.y.resize(in.x.size());
  r.tol.y.resize(in.x.size());
  for (std::size_t i = 0; i < in.x.size(); ++i) {
    const std::size_t c = (i / static_cast<std::size_t>(HW)) % Cs;
    const double w = in.w.empty() ? 1.0 : in.w[c], b = in.b.empty() ? 0.0 : in.b[c];
    const double d = in.x[i] - r.want.mean[c], scale = w * r.want.invstd[c];
    r.want.y[i] = d * scale + b;
    r.tol.y[i] = std::fabs(d * w) * r.tol.invstd[c] + std::fabs(scale) * r.tol.mean[c] +
                 8 * kU64 * (std::fabs(d * scale) + std::fabs(b) + std::fabs(in.x[i] * scale)) +
                 2 * eps_t * std::fabs(r.want.y[i]) + tiny;
  }
  return r;
}

void compare(const char* what, const FwdOutputs& got, const FwdRef& ref, const FbnShape& sh, DType dt,
             bool training, bool running_written, double scale_tol) {
  const std::size_t HW = static_cast<std::size_t>(sh.HW()), C = static_cast<std::size_t>(sh.C());
  for (std::size_t c = 0; c < C; ++c) {
    FUZZ_CHECK(close(got.mean[c], ref.want.mean[c], scale_tol * ref.tol.mean[c]),
               "{}: save_mean[{}] = {} but the float64 reference gives {} (tol {:.3g})", what, c, got.mean[c],
               ref.want.mean[c], scale_tol * ref.tol.mean[c]);
    if (ref.channel_ok[c])
      FUZZ_CHECK(close(got.invstd[c], ref.want.invstd[c], scale_tol * ref.tol.invstd[c]),
                 "{}: save_invstd[{}] = {} but the float64 reference gives {} (tol {:.3g})", what, c, got.invstd[c],
                 ref.want.invstd[c], scale_tol * ref.tol.invstd[c]);
  }
  for (std::size_t i = 0; i < got.y.size(); ++i) {
    const std::size_t c = (i / HW) % C;
    if (!ref.channel_ok[c] || !(std::fabs(ref.want.y[i]) <= 0.5 * dtype_max(dt))) continue;
    FUZZ_CHECK(close(got.y[i], ref.want.y[i], scale_tol * ref.tol.y[i]),
               "{}: y[{}] = {} but the float64 reference gives {} (tol {:.3g})", what, i, got.y[i], ref.want.y[i],
               scale_tol * ref.tol.y[i]);
  }
  if (training && running_written && ref.running_ok) {
    for (std::size_t c = 0; c < got.rm.size(); ++c) {
      FUZZ_CHECK(close(got.rm[c], ref.want.rm[c], scale_tol * ref.tol.rm[c]),
                 "{}: running_mean[{}] = {} but the float64 reference gives {} (tol {:.3g})", what, c, got.rm[c],
                 ref.want.rm[c], scale_tol * ref.tol.rm[c]);
      FUZZ_CHECK(close(got.rv[c], ref.want.rv[c], scale_tol * ref.tol.rv[c]),
                 "{}: running_var[{}] = {} but the float64 reference gives {} (tol {:.3g})", what, c, got.rv[c],
                 ref.want.rv[c], scale_tol * ref.tol.rv[c]);
    }
  }
  FUZZ_CHECK(got.nbt == ref.want.nbt, "{}: num_batches_tracked = {} but the reference gives {}", what, got.nbt,
             ref.want.nbt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  Expect e = Expect::kSuccess;

  const SbnCase k = decode_case(r, 24, &e);
  const int pl = k.placement;
  const SyncBnOptions& opts = k.opts;
  const FbnShape& sh = k.sh;
  const std::int64_t C = sh.C();
  const DType dt = k.dt;
  Spec xs = make_spec(r, "x", dt, 4, sh.sizes, false);
  Spec ys = make_spec(r, "y", dt, 4, sh.sizes, true);
  if (r.one_in(64)) {
    ys.dtype = dt == DType::kFloat32 ? DType::kFloat64 : DType::kFloat32;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    ys.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    xs.rank = 3;
    expect_error(&e);
  }
  // weight / bias
  bool has_w = !r.one_in(4), has_b = has_w;
  if (r.one_in(48)) {
    if (r.one_in(2)) has_w = !has_w;
    else has_b = !has_b;
    expect_error(&e);
  }
  const DType wdt = decode_param_dtype(r), bdt = r.one_in(4) ? decode_param_dtype(r) : wdt;
  // (a bad spec of an absent tensor is no error)
  Expect ew = Expect::kSuccess, eb = Expect::kSuccess, erm = Expect::kSuccess, erv = Expect::kSuccess,
         enbt = Expect::kSuccess;
  Spec ws = decode_vec(r, "weight", C, wdt, false, false, &ew);
  Spec bs = decode_vec(r, "bias", C, bdt, false, false, &eb);
  if ((has_w && ew == Expect::kError) || (has_b && eb == Expect::kError)) expect_error(&e);
  // running statistics and the counter
  bool has_rm = !r.one_in(4), has_rv = has_rm;
  if (r.one_in(48)) {
    if (r.one_in(2)) has_rm = !has_rm;
    else has_rv = !has_rv;
    expect_error(&e);
  }
  const DType rdt = decode_param_dtype(r);
  Spec rms = decode_vec(r, "running_mean", C, rdt, false, true, &erm);
  Spec rvs = decode_vec(r, "running_var", C, r.one_in(8) ? decode_param_dtype(r) : rdt, false, true, &erv);
  if ((has_rm && erm == Expect::kError) || (has_rv && erv == Expect::kError)) expect_error(&e);
  const bool running = has_rm && has_rv;
  const bool updates = opts.training && running;
  rms.output = rvs.output = updates;
  if (!opts.training && !has_rm && !has_rv) expect_error(&e);
  bool has_nbt = r.one_in(2);
  if (updates && !opts.momentum && !r.one_in(8)) has_nbt = true;
  if (updates && !opts.momentum && !has_nbt) expect_error(&e);
  Spec nbs = decode_vec(r, "num_batches_tracked", 1, DType::kInt64, true, updates, &enbt);
  if (has_nbt && enbt == Expect::kError) expect_error(&e);
  const std::int64_t nbt0 = decode_counter(r);
  Spec sms = decode_vec(r, "save_mean", C, DType::kFloat64, true, true, &e, false);
  Spec sis = decode_vec(r, "save_invstd", C, DType::kFloat64, true, true, &e, false);

  // placement
  Tensor4 x = place(arena, xs, r.one_in(8) ? 1 : 0);
  Tensor4 y;
  bool y_is_x = false;
  if ((pl == 14 || pl == 15) && same_shape(ys, xs)) {
    y = x, y.output = true, y.name = "y (= x)", y_is_x = true;
  } else if (!(pl == 2 && place_inside(arena, x, ys, r.range(0, 32) * 2, &y))) {
    y = place(arena, ys, r.one_in(8) ? 1 : 0);
  }
  auto put = [&](const Spec& s, bool present, const Tensor4* host, int want_pl) {
    return place_optional(arena, r, s, present, host, pl == want_pl);
  };
  Tensor4 w = put(ws, has_w, &y, 10);
  Tensor4 b;
  if (pl == 8 && has_w && has_b && same_shape(bs, ws)) b = w, b.name = "bias (= weight)";
  else b = put(bs, has_b, nullptr, -1);
  Tensor4 rm = put(rms, has_rm, &w, 4);
  Tensor4 rv = put(rvs, has_rv, pl == 6 ? &x : &rm, pl == 6 ? 6 : 9);
  Tensor4 sm = put(sms, true, &x, 3);
  Tensor4 si;
  if (pl == 7 && same_shape(sis, sms)) si = sm, si.name = "save_invstd (= save_mean)";
  else si = put(sis, true, &y, 12);
  Tensor4 nbt = put(nbs, has_nbt, pl == 5 ? &sm : pl == 11 ? &x : &w, pl == 5 ? 5 : pl == 11 ? 11 : 13);

  // What the library must reject.
  auto X = [](const Tensor4& a, const Tensor4& b) { return spans_intersect(a.view, b.view); };
  for (const Tensor4* t : {&x, &y, &w, &b, &rm, &rv, &nbt, &sm, &si})
    for (int d = 0; t->view.defined() && d < t->view.rank; ++d)
      if (t->view.strides[d] < 0) expect_error(&e);
  for (const Tensor4* t : {&y, &rm, &rv})
    if (t->view.defined() && self_overlapping_conservative(t->view)) expect_error(&e);
  if (X(y, x) && !same_view(y.view, x.view)) expect_error(&e);
  for (const Tensor4* t : {&w, &b, &rm, &rv})
    if (X(y, *t)) expect_error(&e);
  for (const Tensor4* s : {&sm, &si})
    for (const Tensor4* t : {&x, &y, &w, &b, &rm, &rv})
      if (X(*s, *t)) expect_error(&e);
  if (X(sm, si)) expect_error(&e);
  if (X(rm, rv)) expect_error(&e);
  if (has_rm && (X(nbt, rm) || X(nbt, rv))) expect_error(&e);
  bool overlapping = false;
  for (const Tensor4* t : {&x, &w, &b})
    if (X(rm, *t) || X(rv, *t)) {
      overlapping = true;
      if (updates && kSbnRejectsRunningOverlap) expect_error(&e);
      else if (updates) expect_maybe(&e);
    }
  for (const Tensor4* t : {&x, &y, &w, &b, &sm, &si})
    if (X(nbt, *t)) {
      overlapping = true;
      if (updates && kSbnRejectsRunningOverlap) expect_error(&e);
      else expect_maybe(&e);
    }

  if (inject_bad_device(r, {&x, &y, &w, &rm, &sm, &si, &nbt}, &e) == &x && y_is_x) y.view = x.view;

  fill_data(r, x);
  fill_vec(r, w, false);
  if (b.buffer != w.buffer || !has_w) fill_vec(r, b, false);
  fill_vec(r, rm, false);
  fill_vec(r, rv, true);
  if (nbt.view.defined() && nbt.view.data && nbt.view.device.is_cpu() && nbt.view.dtype == DType::kInt64 &&
      count(nbt.view) > 0)
    std::memcpy(nbt.view.data, &nbt0, 8);
  if (!y_is_x && y.view.data && y.view.device.is_cpu()) poison(y.view);
  for (const Tensor4* t : {&sm, &si})
    if (t->view.data && t->view.device.is_cpu()) poison(t->view);

  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("op sync_batch_norm_forward {} mode {} dtype {} eps {} momentum {} threads {} placement {}",
           opts.training ? "training" : "evaluation", mode_str(opts.mode), dtype_str(dt), opts.eps,
           opts.momentum ? fmt::format("{}", *opts.momentum) : std::string("unset"), ctx.num_threads, pl);
  for (const Tensor4* t : {&x, &y, &w, &b, &rm, &rv, &nbt, &sm, &si})
    if (t->view.defined()) describe("  {} (buffer {}): {}", t->name, t->buffer, describe_view(t->view));
  if (nbt.view.defined()) describe("  num_batches_tracked = {}", nbt0);
  describe("expect {}", expect_name(e));
  note_expect(e, y_is_x, overlapping);

  // Inputs as the library sees them, read before the call (y may be x).
  FwdInputs in;
  in.sh = sh;
  in.o = opts;
  in.dt = dt;
  if (e == Expect::kSuccess) {
    in.x = read_values(x.view);
    if (has_w) in.w = read_values(w.view), in.b = read_values(b.view);
    if (running) in.rm = read_values(rm.view), in.rv = read_values(rv.view);
    in.has_nbt = has_nbt;
    in.nbt = has_nbt ? load_i64(nbt.view) : 0;
  }

  announce();
  arena.arm();
  ErrorCode code{};
  std::string msg;
  SyncBnParams params{w.view, b.view, rm.view, rv.view, nbt.view};
  const bool ok = run_call([&] { sync_batch_norm_forward(x.view, params, y.view, sm.view, si.view, nullptr, opts, ctx); },
                           &code, &msg);
  check_memory(arena, {&x, &y, &w, &b, &rm, &rv, &nbt, &sm, &si}, ok);
  FUZZ_CHECK(alloc.live() == 0, "workspace leaked");
  if (!check_outcome(ok, e, code, msg)) return 0;

  FwdOutputs got;
  got.y = read_values(y.view);
  got.mean = read_values(sm.view);
  got.invstd = read_values(si.view);
  if (running) got.rm = read_values(rm.view), got.rv = read_values(rv.view);
  got.nbt = has_nbt ? load_i64(nbt.view) : 0;

  // The same call in the other mode on dense copies (no crash, and the same values within the
  // two modes' bounds).
  SyncBnOptions o2 = opts;
  o2.mode = opts.mode == SyncBnMode::kExact ? SyncBnMode::kDefault : SyncBnMode::kExact;
  const Tensor x2 = dense_copy({sh.sizes[0], C, sh.sizes[2], sh.sizes[3]}, dt, in.x);
  const Tensor y2 = Tensor::empty({sh.sizes[0], C, sh.sizes[2], sh.sizes[3]}, dt);
  const Tensor w2 = dense_copy({C}, wdt, in.w), b2 = dense_copy({C}, bdt, in.b);
  const Tensor rm2 = dense_copy({C}, rms.dtype, in.rm), rv2 = dense_copy({C}, rvs.dtype, in.rv);
  Tensor nbt2 = Tensor::zeros({1}, DType::kInt64);
  *nbt2.data<std::int64_t>() = in.nbt;
  const Tensor sm2 = Tensor::empty({C}, DType::kFloat64), si2 = Tensor::empty({C}, DType::kFloat64);
  SyncBnParams p2{has_w ? w2.view() : TensorView{}, has_w ? b2.view() : TensorView{},
                  running ? rm2.view() : TensorView{}, running ? rv2.view() : TensorView{},
                  has_nbt ? nbt2.view() : TensorView{}};
  const bool ok2 = run_call([&] { sync_batch_norm_forward(x2, p2, y2, sm2, si2, nullptr, o2, Context{}); }, &code, &msg);
  FUZZ_CHECK(ok2, "the same call in mode {} on dense copies raised: {}", mode_str(o2.mode), msg);

  if (sh.numel() == 0 && C == 0) return 0;
  const bool moderate_inputs = all_moderate(in.x) && all_moderate(in.w) && all_moderate(in.b) &&
                               all_moderate(in.rm) && all_moderate(in.rv);
  if (!moderate_inputs) return 0;
  const DType rdt_ref = rms.dtype == DType::kFloat64 && rvs.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  const FwdRef ref = forward_reference(in, opts.mode == SyncBnMode::kExact, rdt_ref);
  compare("this call", got, ref, sh, dt, opts.training, running, 1.0);
  FwdOutputs got2;
  got2.y = read_values(y2.view());
  got2.mean = read_values(sm2.view());
  got2.invstd = read_values(si2.view());
  if (running) got2.rm = read_values(rm2.view()), got2.rv = read_values(rv2.view());
  got2.nbt = has_nbt ? *nbt2.data<std::int64_t>() : 0;
  const FwdRef ref_exact = forward_reference(in, true, rdt_ref);
  compare("the other mode", got2, ref_exact, sh, dt, opts.training, running, 1.0);
  // the two modes agree with each other within the sum of their bounds
  FwdRef between = ref_exact;
  between.want = got;
  compare("default vs exact", got2, between, sh, dt, opts.training, running, 2.0);
  return 0;
}
