// libFuzzer target: detops::sync_batch_norm_backward on one rank (communicator nullptr), training
// and evaluation, default and exact modes (and unknown ones), on arbitrary small shapes,
// strides, dtypes and values; weight, grad_x, grad_weight and grad_bias present or absent, of a
// wrong dtype, size, rank or stride; save_mean / save_invstd consistent with x (as the forward
// leaves them) or arbitrary; eps and momentum as the forward target decodes them; grad_x in
// place (grad_x = grad_y) or not; outputs sometimes overlapping other tensors. A call either
// raises detops::Error (kInvalidArgument, or kNotCompiled for a CUDA tensor) with every byte
// unchanged, or writes only grad_x, grad_weight and grad_bias, with values within the error
// bound of the float64 reference when the inputs are finite and moderate; the same call in the
// other mode, on dense copies, agrees.
#include "sync_bn_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

struct BwdInputs {
  FbnShape sh;
  SyncBnOptions o;
  DType dt = DType::kFloat32, pdt = DType::kFloat32;  // pdt: the coarser of grad_weight's, grad_bias's
  std::vector<double> gy, x, w, mean, invstd;           // w empty: no weight
  bool has_gx = false;
};

struct BwdOutputs {
  std::vector<double> gx, gw, gb;
};

struct BwdRef {
  BwdOutputs want, tol;
};

BwdRef backward_reference(const BwdInputs& in, bool exact) {
  BwdRef r;
  const FbnShape& sh = in.sh;
  const std::size_t C = static_cast<std::size_t>(sh.C()), HW = static_cast<std::size_t>(sh.HW());
  const double n = static_cast<double>(sh.N() * sh.HW());
  const bool global = in.o.training && in.has_gx;
  exact = exact && global;
  std::vector<long double> sdy(C, 0), sg(C, 0);
  std::vector<double> ady(C, 0), ag(C, 0), axm(C, 0), mdy(C, 0), mg(C, 0);
  for (std::size_t i = 0; i < in.x.size(); ++i) {
    const std::size_t c = (i / HW) % C;
    const double d = in.x[i] - in.mean[c], g = in.gy[i] * d;
    sdy[c] += in.gy[i];
    sg[c] += static_cast<long double>(in.gy[i]) * (static_cast<long double>(in.x[i]) - in.mean[c]);
    ady[c] += std::fabs(in.gy[i]);
    ag[c] += std::fabs(g);
    axm[c] += std::fabs(in.gy[i]) * (std::fabs(in.x[i]) + std::fabs(in.mean[c]));
    mdy[c] = std::max(mdy[c], std::fabs(in.gy[i]));
    mg[c] = std::max(mg[c], std::fabs(g));
  }
  const double eps_p = unit_roundoff(in.pdt), tiny_p = 2 * dtype_min_normal(in.pdt) * eps_p;
  std::vector<double> sdy_tol(C), sg_tol(C);
  for (std::size_t c = 0; c < C; ++c) {
    const double Gdy = exact ? exact_grid(mdy[c]) : 0.0, Gg = exact ? exact_grid(mg[c]) : 0.0;
    // Each of the n products gy * (x - mean) may land below the normal range (an absolute error
    // of up to underflow_error each); invstd^2 / n then scales that error in grad_x.
    const double under = n * underflow_error(DType::kFloat64);
    sdy_tol[c] = (n + 8) * kU64 * ady[c] + n * Gdy + under;
    sg_tol[c] = (n + 8) * kU64 * ag[c] + 4 * kU64 * axm[c] + n * Gg + under;
    const double gb = static_cast<double>(sdy[c]), gw = static_cast<double>(sg[c]) * in.invstd[c];
    r.want.gb.push_back(gb);
    r.tol.gb.push_back(sdy_tol[c] + 2 * eps_p * std::fabs(gb) + tiny_p);
    r.want.gw.push_back(gw);
    r.tol.gw.push_back(sg_tol[c] * std::fabs(in.invstd[c]) + (4 * kU64 + 2 * eps_p) * std::fabs(gw) + tiny_p);
  }
  if (!in.has_gx) return r;
  const double eps_t = unit_roundoff(in.dt), tiny = 2 * dtype_min_normal(in.dt) * eps_t;
  for (std::size_t i = 0; i < in.x.size(); ++i) {
    const std::size_t c = (i / HW) % C;
    const double w = in.w.empty() ? 1.0 : in.w[c], is = in.invstd[c], k = w * is, d = in.x[i] - in.mean[c];
    double want, tol;
    if (global) {
      const double m = static_cast<double>(sdy[c]) / n, kx = is * is * static_cast<double>(sg[c]) / n;
      want = (in.gy[i] - m - d * kx) * k;
      // The bracket's four operations (d, d * kx, two subtractions) may land below the normal
      // range, where each errs by up to an absolute underflow_error; k then scales that error
      // (k = w * invstd is large exactly when the variance is tiny).
      tol = std::fabs(k) * (sdy_tol[c] / n + std::fabs(d) * is * is * sg_tol[c] / n) +
            8 * kU64 * std::fabs(k) *
                (std::fabs(in.gy[i]) + std::fabs(m) + (std::fabs(d) + std::fabs(in.x[i]) + std::fabs(in.mean[c])) * std::fabs(kx)) +
            4 * underflow_error(DType::kFloat64) * std::fabs(k);
    } else {
      want = in.gy[i] * k;
      tol = 4 * kU64 * std::fabs(want);
    }
    r.want.gx.push_back(want);
    r.tol.gx.push_back(tol + 2 * eps_t * std::fabs(want) + tiny);
  }
  return r;
}

void compare(const char* what, const BwdOutputs& got, const BwdRef& ref, DType dt, DType pdt, bool has_gw, bool has_gb,
             double scale_tol) {
  auto check = [&](const char* name, const std::vector<double>& g, const std::vector<double>& want,
                   const std::vector<double>& tol, DType t) {
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!(std::fabs(want[i]) <= 0.5 * dtype_max(t))) continue;
      FUZZ_CHECK(close(g[i], want[i], scale_tol * tol[i]), "{}: {}[{}] = {} but the float64 reference gives {} (tol {:.3g})",
                 what, name, i, g[i], want[i], scale_tol * tol[i]);
    }
  };
  check("grad_x", got.gx, ref.want.gx, ref.tol.gx, dt);
  if (has_gw) check("grad_weight", got.gw, ref.want.gw, ref.tol.gw, pdt);
  if (has_gb) check("grad_bias", got.gb, ref.want.gb, ref.tol.gb, pdt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  Expect e = Expect::kSuccess;

  const SbnCase k = decode_case(r, 20, &e);
  const int pl = k.placement;
  const SyncBnOptions& opts = k.opts;
  const FbnShape& sh = k.sh;
  const std::int64_t C = sh.C();
  const DType dt = k.dt;
  Spec gys = make_spec(r, "grad_y", dt, 4, sh.sizes, false);
  Spec xs = make_spec(r, "x", dt, 4, sh.sizes, false);
  Spec gxs = make_spec(r, "grad_x", dt, 4, sh.sizes, true);
  const bool has_gx = !r.one_in(6);
  if (r.one_in(64)) {
    gys.dtype = dt == DType::kFloat32 ? DType::kFloat16 : DType::kFloat32;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    gys.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    xs.rank = 3;
    expect_error(&e);
  }
  if (r.one_in(64) && has_gx) {
    if (r.one_in(2)) gxs.dtype = dt == DType::kFloat64 ? DType::kFloat32 : DType::kFloat64;
    else gxs.sizes[r.u8() % 4] += 1;
    expect_error(&e);
  }
  // weight, save_mean / save_invstd, grad_weight, grad_bias (a bad spec of an absent tensor is
  // no error)
  const bool has_w = !r.one_in(4);
  Expect ew = Expect::kSuccess, egw = Expect::kSuccess, egb = Expect::kSuccess;
  Spec ws = decode_vec(r, "weight", C, decode_param_dtype(r), false, false, &ew);
  if (has_w && ew == Expect::kError) expect_error(&e);
  Spec sms = decode_vec(r, "save_mean", C, DType::kFloat64, true, false, &e, false);
  Expect esi = Expect::kSuccess;  // counted unless save_invstd is placed as save_mean
  Spec sis = decode_vec(r, "save_invstd", C, DType::kFloat64, true, false, &esi, false);
  const bool has_sm = !r.one_in(64), has_si = !r.one_in(64);
  if (!has_sm || !has_si) expect_error(&e);
  const bool has_gw = !r.one_in(3), has_gb = !r.one_in(3);
  if (has_gw && !has_w) expect_error(&e);
  const DType gwdt = decode_param_dtype(r), gbdt = r.one_in(4) ? decode_param_dtype(r) : gwdt;
  Spec gws = decode_vec(r, "grad_weight", C, gwdt, false, true, &egw);
  Spec gbs = decode_vec(r, "grad_bias", C, gbdt, false, true, &egb);
  if ((has_gw && egw == Expect::kError) || (has_gb && egb == Expect::kError)) expect_error(&e);
  const bool consistent = !r.one_in(3);  // save_* from x, as the forward leaves them

  // placement
  Tensor4 gy = place(arena, gys, r.one_in(8) ? 1 : 0);
  Tensor4 x;
  if (pl == 12 && same_shape(xs, gys)) x = gy, x.name = "x (= grad_y)";
  else x = place(arena, xs, r.one_in(8) ? 1 : 0);
  auto put = [&](const Spec& s, bool present, const Tensor4* host, int want_pl) {
    return place_optional(arena, r, s, present, host, pl == want_pl);
  };
  Tensor4 gx;
  bool gx_is_gy = false;
  if (has_gx) {
    if ((pl == 14 || pl == 15) && same_shape(gxs, gys)) {
      gx = gy, gx.output = true, gx.name = "grad_x (= grad_y)", gx_is_gy = true;
    } else if (pl == 1 && same_shape(gxs, xs)) {
      gx = x, gx.output = true, gx.name = "grad_x (= x)";
    } else if (!((pl == 2 && place_inside(arena, gy, gxs, r.range(0, 32) * 2, &gx)) ||
                 (pl == 3 && place_inside(arena, x, gxs, r.range(0, 32) * 2, &gx)))) {
      gx = place(arena, gxs, r.one_in(8) ? 1 : 0);
    }
  }
  Tensor4 w = put(ws, has_w, &gy, 9);
  Tensor4 sm = put(sms, has_sm, &gx, 11);
  Tensor4 si;
  if (pl == 8 && has_sm && has_si && same_shape(sis, sms)) {
    si = sm, si.name = "save_invstd (= save_mean)";
  } else {
    si = put(sis, has_si, nullptr, -1);
    if (has_si && esi == Expect::kError) expect_error(&e);
  }
  Tensor4 gw = put(gws, has_gw, pl == 4 ? &w : &sm, pl == 4 ? 4 : 6);
  Tensor4 gb;
  if (pl == 5 && has_gw && has_gb && same_shape(gbs, gws)) gb = gw, gb.name = "grad_bias (= grad_weight)";
  else gb = put(gbs, has_gb, pl == 7 ? &x : &gx, pl == 7 ? 7 : 10);

  // What the library must reject.
  auto X = [](const Tensor4& a, const Tensor4& b) { return spans_intersect(a.view, b.view); };
  for (const Tensor4* t : {&gy, &x, &gx, &w, &sm, &si, &gw, &gb})
    for (int d = 0; t->view.defined() && d < t->view.rank; ++d)
      if (t->view.strides[d] < 0) expect_error(&e);
  for (const Tensor4* t : {&gx, &gw, &gb})
    if (t->view.defined() && self_overlapping_conservative(t->view)) expect_error(&e);
  if (X(gx, gy) && !same_view(gx.view, gy.view)) expect_error(&e);
  for (const Tensor4* t : {&x, &w, &sm, &si})
    if (X(gx, *t)) expect_error(&e);
  for (const Tensor4* o : {&gw, &gb})
    for (const Tensor4* t : {&x, &gy, &w, &sm, &si, &gx})
      if (X(*o, *t)) expect_error(&e);
  if (X(gw, gb)) expect_error(&e);
  const bool overlapping = X(gx, gy) && !gx_is_gy;

  if (inject_bad_device(r, {&gy, &x, &gx, &w, &sm, &si, &gw, &gb}, &e) == &gy && gx_is_gy) gx.view = gy.view;

  fill_data(r, gy);
  if (x.buffer != gy.buffer || pl != 12) fill_data(r, x);
  fill_vec(r, w, false);
  if (consistent && e != Expect::kError && sm.view.dtype == DType::kFloat64 && si.view.dtype == DType::kFloat64) {
    const std::vector<ChannelStats> st = channel_stats(read_values(x.view), sh);
    std::vector<double> mv(static_cast<std::size_t>(C)), iv(static_cast<std::size_t>(C));
    for (std::size_t c = 0; c < mv.size(); ++c) {
      mv[c] = st[c].n ? st[c].mean : 0.0;
      iv[c] = st[c].n ? 1.0 / std::sqrt(st[c].var + opts.eps) : 0.0;
    }
    write_values(sm.view, mv);
    if (si.buffer != sm.buffer) write_values(si.view, iv);
  } else {
    fill_vec(r, sm, false);
    if (si.buffer != sm.buffer) fill_vec(r, si, true);
  }
  if (!gx_is_gy && gx.view.data && gx.view.device.is_cpu()) poison(gx.view);
  for (const Tensor4* t : {&gw, &gb})
    if (t->view.data && t->view.device.is_cpu()) poison(t->view);

  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  describe("op sync_batch_norm_backward {} mode {} dtype {} eps {} momentum {} threads {} placement {} save_* {}",
           opts.training ? "training" : "evaluation", mode_str(opts.mode), dtype_str(dt), opts.eps,
           opts.momentum ? fmt::format("{}", *opts.momentum) : std::string("unset"), ctx.num_threads, pl,
           consistent ? "from x" : "arbitrary");
  for (const Tensor4* t : {&gy, &x, &gx, &w, &sm, &si, &gw, &gb})
    if (t->view.defined()) describe("  {} (buffer {}): {}", t->name, t->buffer, describe_view(t->view));
  describe("expect {}", expect_name(e));
  note_expect(e, gx_is_gy, overlapping);

  BwdInputs in;
  in.sh = sh;
  in.o = opts;
  in.dt = dt;
  in.pdt = (has_gw && gws.dtype == DType::kFloat32) || (has_gb && gbs.dtype == DType::kFloat32) ? DType::kFloat32
                                                                                                  : DType::kFloat64;
  in.has_gx = has_gx;
  if (e == Expect::kSuccess) {
    in.gy = read_values(gy.view);
    in.x = read_values(x.view);
    if (has_w) in.w = read_values(w.view);
    in.mean = read_values(sm.view);
    in.invstd = read_values(si.view);
  }

  announce();
  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call(
      [&] { sync_batch_norm_backward(gy.view, x.view, w.view, sm.view, si.view, gx.view, gw.view, gb.view, nullptr, opts, ctx); },
      &code, &msg);
  check_memory(arena, {&gy, &x, &gx, &w, &sm, &si, &gw, &gb}, ok);
  FUZZ_CHECK(alloc.live() == 0, "workspace leaked");
  if (!check_outcome(ok, e, code, msg)) return 0;

  BwdOutputs got;
  if (has_gx) got.gx = read_values(gx.view);
  if (has_gw) got.gw = read_values(gw.view);
  if (has_gb) got.gb = read_values(gb.view);

  // The same call in the other mode on dense copies.
  SyncBnOptions o2 = opts;
  o2.mode = opts.mode == SyncBnMode::kExact ? SyncBnMode::kDefault : SyncBnMode::kExact;
  const std::initializer_list<std::int64_t> sz = {sh.sizes[0], C, sh.sizes[2], sh.sizes[3]};
  const Tensor gy2 = dense_copy(sz, dt, in.gy), x2 = dense_copy(sz, dt, in.x), gx2 = Tensor::zeros(sz, dt);
  const Tensor w2 = dense_copy({C}, ws.dtype, in.w), sm2 = dense_copy({C}, DType::kFloat64, in.mean),
               si2 = dense_copy({C}, DType::kFloat64, in.invstd);
  const Tensor gw2 = Tensor::zeros({C}, gws.dtype), gb2 = Tensor::zeros({C}, gbs.dtype);
  const bool ok2 = run_call(
      [&] {
        sync_batch_norm_backward(gy2, x2, has_w ? w2.view() : TensorView{}, sm2, si2,
                                 has_gx ? gx2.view() : TensorView{}, has_gw ? gw2.view() : TensorView{},
                                 has_gb ? gb2.view() : TensorView{}, nullptr, o2, Context{});
      },
      &code, &msg);
  FUZZ_CHECK(ok2, "the same call in mode {} on dense copies raised: {}", mode_str(o2.mode), msg);

  const bool moderate_inputs = all_moderate(in.gy) && all_moderate(in.x) && all_moderate(in.w) &&
                               all_moderate(in.mean) && all_moderate(in.invstd);
  if (!moderate_inputs) return 0;
  const BwdRef ref = backward_reference(in, opts.mode == SyncBnMode::kExact);
  compare("this call", got, ref, dt, in.pdt, has_gw, has_gb, 1.0);
  BwdOutputs got2;
  if (has_gx) got2.gx = read_values(gx2.view());
  if (has_gw) got2.gw = read_values(gw2.view());
  if (has_gb) got2.gb = read_values(gb2.view());
  const BwdRef ref_exact = backward_reference(in, true);
  compare("the other mode", got2, ref_exact, dt, in.pdt, has_gw, has_gb, 1.0);
  BwdRef between = ref_exact;
  between.want = got;
  if (!has_gx) between.want.gx.clear(), between.tol.gx.clear();
  compare("default vs exact", got2, between, dt, in.pdt, has_gw, has_gb, 2.0);
  return 0;
}
