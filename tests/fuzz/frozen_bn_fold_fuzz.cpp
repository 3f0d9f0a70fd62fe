// libFuzzer target: detops::frozen_batch_norm_fold, FrozenBatchNorm2d::from_state and
// FrozenBatchNorm2d::identity on arbitrary [C] buffers (any floating dtype each, any strides,
// broadcast), eps, running_var values (zero, negative, NaN, inf, subnormal) and scale/shift
// tensors (float32 or float64, sometimes overlapping each other or a buffer). A call either
// raises detops::Error before writing anything, or writes scale and shift (and nothing else)
// within the parameter dtype's tolerance of the float64 reference fold; from_state folds the same
// bits and keeps the buffers' values; identity is exactly the identity.
#include "frozen_bn_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

/// The fold in the parameter dtype P rounds the buffers to P first (then w * (1 / sqrt(v + eps)),
/// b - m * s); this bounds the difference from the float64 fold of the unrounded buffers.
void check_fold(const std::vector<double>& w, const std::vector<double>& b, const std::vector<double>& m,
                const std::vector<double>& v, double eps, DType pdt, const std::vector<double>& got_s,
                const std::vector<double>& got_t, const char* who) {
  std::vector<double> want_s, want_t;
  ref::frozen_bn_fold_ref(w, b, m, v, eps, &want_s, &want_t);
  const double u = unit_roundoff(pdt);
  const double big = pdt == DType::kFloat64 ? 1e300 : 1e30, small = pdt == DType::kFloat64 ? 1e-300 : 1e-30;
  for (std::size_t c = 0; c < w.size(); ++c) {
    const double in[4] = {w[c], b[c], m[c], v[c]};
    bool finite = std::isfinite(eps), moderate = true;
    for (double x : in) {
      finite = finite && std::isfinite(x);
      moderate = moderate && std::isfinite(x) && std::fabs(x) <= big && (x == 0 || std::fabs(x) >= small);
    }
    // Where the float64 values are far inside P's range, the relative error is a few units.
    const double denom = v[c] + eps;
    moderate = moderate && denom >= small && std::fabs(want_s[c]) <= big && std::fabs(want_t[c]) <= big &&
               (eps == 0 || eps >= small);
    if (moderate) {
      const double under = dtype_min_normal(pdt);  // products may underflow in P
      const double tol_s = 8 * u * std::fabs(want_s[c]) + under;
      const double tol_t = 8 * u * (std::fabs(b[c]) + 2 * std::fabs(m[c] * want_s[c])) + std::fabs(m[c]) * tol_s + under;
      FUZZ_CHECK(close(got_s[c], want_s[c], tol_s), "{}: scale[{}] = {} but the float64 fold gives {}", who, c, got_s[c],
                 want_s[c]);
      FUZZ_CHECK(close(got_t[c], want_t[c], tol_t), "{}: shift[{}] = {} but the float64 fold gives {}", who, c, got_t[c],
                 want_t[c]);
    } else if (!finite) {
      // A NaN weight, bias or mean gives NaN; an infinite running_var gives scale 0 (or NaN).
      if (std::isnan(w[c])) FUZZ_CHECK(std::isnan(got_s[c]), "{}: NaN weight[{}] but scale {}", who, c, got_s[c]);
      if (std::isnan(b[c]) || std::isnan(m[c]))
        FUZZ_CHECK(std::isnan(got_t[c]), "{}: NaN bias/mean[{}] but shift {}", who, c, got_t[c]);
    }
  }
}

std::vector<double> values_of(const Tensor& t) { return read_values(t.view()); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  Arena arena;
  Expect e = Expect::kSuccess;   // the fold
  Expect es = Expect::kSuccess;  // the buffers and eps alone (what from_state checks)

  std::int64_t C = 1 + r.range(0, 4);
  if (r.one_in(12)) C = 0;
  if (r.one_in(16)) C = 16 + r.range(0, 3);
  static const DType floats[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  const char* names[4] = {"weight", "bias", "running_mean", "running_var"};
  Spec bs[4];
  const DType buffer_dt = floats[r.u8() % 4];  // the four buffers share one dtype
  for (int i = 0; i < 4; ++i) {
    Spec& s = bs[i];
    s.name = names[i];
    s.dtype = buffer_dt;
    if (r.one_in(32)) s.dtype = floats[r.u8() % 4];  // an error unless it happens to match
    s.rank = 1;
    s.sizes[0] = C;
    const int f = r.u8() % 8;
    s.strides[0] = f < 5 ? 1 : f < 6 ? 2 : f < 7 ? 0 : 3;  // dense, strided or broadcast: all readable
    if (r.one_in(64)) {
      s.dtype = DType::kInt32;
      expect_error(&es);
    } else if (r.one_in(128)) {
      s.dtype = static_cast<DType>(5 + r.u8() % 200);  // not a DType at all
      expect_unknown_dtype(&es);
    }
    if (r.one_in(64)) {
      s.sizes[0] = C + 1;
      expect_error(&es);
    }
    if (r.one_in(64)) {
      s.strides[0] = -1;
      expect_error(&es);
    }
    if (r.one_in(96)) {
      s.rank = 2, s.sizes[1] = 1, s.strides[1] = 1;
      expect_error(&es);
    }
  }
  for (int i = 1; i < 4; ++i)
    if (bs[i].dtype != bs[0].dtype) expect_error(&es);  // the four buffers share weight's dtype
  static const double epss[] = {1e-5, 0.0, 1e-3, 1e-5, 0.1, 1e-50, 1e-5, 2.0};
  double eps = epss[r.u8() % 8];
  if (r.one_in(48)) {
    static const double bad[] = {-1e-5, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()};
    eps = bad[r.u8() % 3];
    expect_error(&es);
  }
  const DType pdt = r.one_in(2) ? DType::kFloat64 : DType::kFloat32;
  Spec ss, ts;
  for (Spec* s : {&ss, &ts}) {
    s->name = s == &ss ? "scale" : "shift";
    s->dtype = pdt;
    s->rank = 1;
    s->sizes[0] = C;
    s->strides[0] = 1;
    s->output = true;
  }
  if (r.one_in(64)) {
    ts.dtype = pdt == DType::kFloat64 ? DType::kFloat32 : DType::kFloat64;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    ss.dtype = ts.dtype = DType::kFloat16;
    expect_error(&e);
  }
  if (r.one_in(64)) {
    (r.one_in(2) ? ss : ts).sizes[0] = C + 1;
    expect_error(&e);
  }
  if (r.one_in(48)) {
    (r.one_in(2) ? ss : ts).strides[0] = r.one_in(2) ? 0 : 2;
    if (C > 1) expect_error(&e);
  }

  Tensor4 bufs[4];
  for (int i = 0; i < 4; ++i) bufs[i] = place(arena, bs[i], r.one_in(8) ? 1 : 0);
  Tensor4 scale = place(arena, ss), shift;
  const int placement = r.u8() % 16;
  bool placed = false, params_overlap_state = false;
  Tensor4 moved;
  if (placement == 0 && place_inside(arena, scale, ts, 0, &moved)) {
    shift = moved, placed = true;  // shift is scale: an error
  } else if (placement == 1 && place_inside(arena, scale, ts, r.range(1, 8) * 8, &moved)) {
    shift = moved, placed = true;  // partial overlap, or none
  } else if (placement == 2 && place_inside(arena, bufs[r.u8() % 4], ts, r.range(0, 4) * 8, &moved)) {
    shift = moved, placed = true;  // the output inside an input buffer
  }
  if (!placed) shift = place(arena, ts);
  for (int i = 0; i < 4; ++i) {
    for (int d = 0; d < bufs[i].view.rank; ++d)
      if (bufs[i].view.strides[d] < 0) expect_error(&es);
    if (spans_intersect(shift.view, bufs[i].view) || spans_intersect(scale.view, bufs[i].view)) params_overlap_state = true;
  }
  if (spans_intersect(shift.view, scale.view)) expect_error(&e);
  if (params_overlap_state) expect_maybe(&e);  // not documented either way; computed from a copy

  // Values: running_var mostly positive; sometimes 0, -0, negative, NaN, inf or tiny.
  for (int i = 0; i < 4; ++i) {
    Tensor4& t = bufs[i];
    if (!t.view.data || count(t.view) <= 0) continue;
    std::vector<double> v(static_cast<std::size_t>(count(t.view)));
    const bool specials = r.one_in(6);
    for (double& x : v) {
      x = specials && r.one_in(3) ? special(r) : moderate(r);
      if (i == 3 && !specials) x = std::fabs(x) + (r.one_in(8) ? 0.0 : 1.0 / 64);
    }
    write_values(t.view, v);
  }
  if (r.one_in(64)) {
    const bool buffer = r.one_in(2);
    Tensor4* t = buffer ? &bufs[r.u8() % 4] : &scale;
    if (r.one_in(2) || count(t->view) == 0) t->view.device = Device::cuda(0);
    else t->view.data = nullptr;
    expect_error(buffer ? &es : &e);
  }
  if (es == Expect::kError) expect_error(&e);
  if (es == Expect::kEither) expect_maybe(&e);
  poison(scale.view);
  if (shift.view.data) poison(shift.view);

  // Read the buffers back and predict the running_var errors as the library computes them.
  std::vector<double> vals[4];
  if (es != Expect::kError) {
    for (int i = 0; i < 4; ++i) vals[i] = read_values(bufs[i].view);
    for (std::int64_t c = 0; c < C; ++c) {
      const double v = vals[3][static_cast<std::size_t>(c)];
      if (!(v >= 0)) expect_error(&e);
      const double denom = pdt == DType::kFloat64 ? v + eps
                                                  : static_cast<double>(to_float_saturating(v) + to_float_saturating(eps));
      if (denom == 0) expect_error(&e);
    }
  }
  const BatchNormState state{bufs[0].view, bufs[1].view, bufs[2].view, bufs[3].view, eps};
  FuzzAllocator alloc;
  const Context ctx = make_context(r, &alloc);
  const bool try_class = r.one_in(3);
  describe("op frozen_batch_norm_fold C={} eps={} param dtype {} placement {}", C, eps, dtype_str(pdt), placement);
  for (const Tensor4* t : {&bufs[0], &bufs[1], &bufs[2], &bufs[3], &scale, &shift})
    describe("  {} (buffer {}): {} = [{}]", t->name, t->buffer, describe_view(t->view),
             t->view.data && t->view.device.is_cpu() && (is_float_dtype(t->view.dtype) || t->view.dtype == DType::kInt32) &&
                     !t->output
                 ? fmt::format("{}", fmt::join(read_values(t->view), ", "))
                 : std::string("-"));
  describe("expect {}", expect_name(e));
  note_expect(e, false, placed || params_overlap_state);

  announce();
  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] { frozen_batch_norm_fold(state, scale.view, shift.view, ctx); }, &code, &msg);
  check_memory(arena, {&bufs[0], &bufs[1], &bufs[2], &bufs[3], &scale, &shift}, ok);
  if (!ok) {
    FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kNotCompiled, "unexpected error code {} ({})",
               static_cast<int>(code), msg);
    FUZZ_CHECK(e != Expect::kSuccess, "a valid call raised: {}", msg);
  } else {
    FUZZ_CHECK(e != Expect::kError, "an invalid call returned normally");
    if (e == Expect::kSuccess && C > 0)
      check_fold(vals[0], vals[1], vals[2], vals[3], eps, pdt, read_values(scale.view), read_values(shift.view), "fold");
  }

  // FrozenBatchNorm2d::from_state validates the buffers as the fold does (its scale/shift are
  // float64 iff weight is), folds the same way, and keeps the buffers' values.
  if (try_class && es != Expect::kError) {
    const DType cdt = bufs[0].view.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    bool valid = true;
    for (int i = 0; i < 4; ++i) vals[i] = read_values(bufs[i].view);  // the fold may have written into them
    for (std::int64_t c = 0; c < C; ++c) {
      const double v = vals[3][static_cast<std::size_t>(c)];
      const double denom =
          cdt == DType::kFloat64 ? v + eps : static_cast<double>(to_float_saturating(v) + to_float_saturating(eps));
      if (!(v >= 0) || denom == 0) valid = false;
    }
    ErrorCode ccode{};
    std::string cmsg;
    FrozenBatchNorm2d bn;
    arena.arm();
    const bool cok = run_call([&] { bn = FrozenBatchNorm2d::from_state(state, Device::cpu(), ctx); }, &ccode, &cmsg);
    check_memory(arena, {&bufs[0], &bufs[1], &bufs[2], &bufs[3], &scale, &shift}, false);  // writes none of them
    describe("from_state: {}", cok ? "ok" : cmsg);
    if (cok) {
      FUZZ_CHECK(valid, "from_state accepted buffers with a bad running_var");
      FUZZ_CHECK(bn.channels() == C, "from_state: {} channels, expected {}", bn.channels(), C);
      if (C > 0)
        check_fold(vals[0], vals[1], vals[2], vals[3], eps, cdt, values_of(bn.scale()), values_of(bn.shift()), "from_state");
      const BatchNormState st = bn.state();
      const TensorView kept[4] = {st.weight, st.bias, st.running_mean, st.running_var};
      for (int i = 0; i < 4; ++i) {
        FUZZ_CHECK(kept[i].dtype == bufs[i].view.dtype, "from_state: {} kept as {}", names[i], dtype_str(kept[i].dtype));
        const std::vector<double> kv = read_values(kept[i]);
        FUZZ_CHECK(kv.size() == vals[i].size(), "from_state: {} kept {} values of {}", names[i], kv.size(), vals[i].size());
        for (std::size_t c = 0; c < kv.size(); ++c)
          FUZZ_CHECK((std::isnan(kv[c]) && std::isnan(vals[i][c])) || kv[c] == vals[i][c],
                     "from_state: {}[{}] kept as {}, was {}", names[i], c, kv[c], vals[i][c]);
      }
      FUZZ_CHECK(st.eps == eps, "from_state: eps kept as {}, was {}", st.eps, eps);
    } else {
      FUZZ_CHECK(ccode == ErrorCode::kInvalidArgument, "from_state: unexpected error code {} ({})", static_cast<int>(ccode), cmsg);
      FUZZ_CHECK(!valid, "from_state rejected valid buffers: {}", cmsg);
    }
  }

  // identity(C, eps): scale exactly 1 and shift exactly 0 for the usual eps; an error for
  // eps > 1 (running_var = 1 - eps < 0) or a bad eps.
  if (r.one_in(4)) {
    static const double ieps[] = {1e-5, 0.0, 1e-3, 0.1, 1e-5, 0.5, 1.0, 1.5};
    const double ie = ieps[r.u8() % 8];
    const DType ipdt = r.one_in(2) ? DType::kFloat64 : r.one_in(16) ? DType::kFloat16 : DType::kFloat32;
    const std::int64_t ic = r.one_in(16) ? -1 : C;
    FrozenBatchNorm2d bn;
    ErrorCode icode{};
    std::string imsg;
    const bool iok = run_call([&] { bn = FrozenBatchNorm2d::identity(ic, ie, Device::cpu(), ipdt); }, &icode, &imsg);
    const bool ivalid = ic >= 0 && (ic == 0 || ie <= 1.0) && ipdt != DType::kFloat16;
    describe("identity({}, eps {}, {}): {}", ic, ie, dtype_str(ipdt), iok ? "ok" : imsg);
    FUZZ_CHECK(iok == ivalid, "identity({}, {}, {}) {}", ic, ie, dtype_str(ipdt), iok ? "succeeded" : imsg);
    if (iok && (ie == 1e-5 || ie == 0.0)) {
      const std::vector<double> s = values_of(bn.scale()), t = values_of(bn.shift());
      for (std::size_t c = 0; c < s.size(); ++c)
        FUZZ_CHECK(s[c] == 1.0 && t[c] == 0.0, "identity(eps {}): channel {} has scale {} shift {}", ie, c, s[c], t[c]);
    }
  }
  return 0;
}
