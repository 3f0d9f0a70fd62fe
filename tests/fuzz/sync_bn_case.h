// Pieces shared by the SyncBatchNorm fuzz targets (one rank: communicator nullptr): options
// (eps, momentum, mode, training), [C] parameter / statistics vectors, int64 counters, element
// values (moderate, large-mean, specials), the float64 references of the forward and the
// backward (as tests/sync_batch_norm_test.cpp computes them), and their error bounds.
#pragma once

#include "frozen_bn_case.h"

namespace detops {
namespace fuzz {

/// A former gap of the library, now closed (see README.md in this directory): the forward
/// rejects running_mean / running_var overlapping x, weight or bias, and num_batches_tracked
/// overlapping any other tensor, when it updates them (training with running statistics).
/// false tolerates the old behaviour (the call returned; the later reads saw the updated bytes).
constexpr bool kSbnRejectsRunningOverlap = true;

/// An open gap of the library (see README.md in this directory): num_batches_tracked at
/// INT64_MAX overflows (signed, undefined behaviour: UBSan stops the run) when the forward adds 1
/// in training with running statistics and a count >= 2
/// (detail/sync_batch_norm_math.h sbn_finalize_channel, src/sync_batch_norm_cpu.cpp
/// sbn_finalize_cpu, cuda/sync_batch_norm_cuda.cu). false: the decoder never gives the counter
/// INT64_MAX (it gives INT64_MAX - 1, whose increment is defined); true now that the library
/// saturates at INT64_MAX (detail::sbn_next_count; the input is a regression input).
constexpr bool kSbnCounterOverflowHandled = true;

inline const char* mode_str(SyncBnMode m) {
  return m == SyncBnMode::kDefault ? "default" : m == SyncBnMode::kExact ? "exact" : "unknown";
}

/// Options: eps and momentum mostly torch's defaults, sometimes boundary or invalid values;
/// the mode rarely outside the enumeration.
inline SyncBnOptions decode_options(Reader& r, Expect* e) {
  SyncBnOptions o;
  o.mode = static_cast<SyncBnMode>(r.u8() % 2);
  if (r.one_in(64)) {
    o.mode = static_cast<SyncBnMode>(2 + r.u8() % 200);
    expect_error(e);
  }
  o.training = !r.one_in(4);
  if (r.one_in(6)) {
    static const double eps[] = {0.0, -0.0, 1e-3, 1.0, 1e300, 5e-324, 0.1,
                                 std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                 -1e-5, -std::numeric_limits<double>::infinity()};
    o.eps = eps[r.u8() % (sizeof(eps) / sizeof(eps[0]))];
    if (!(o.eps >= 0.0) || !std::isfinite(o.eps)) expect_error(e);
  }
  if (r.one_in(5)) {
    static const double mom[] = {0.0, 1.0, 0.5, 0.01, 1e-300, -0.0,
                                 std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                 -0.1, 1.5, -std::numeric_limits<double>::infinity()};
    const int k = r.u8() % 13;
    if (k >= 11) {
      o.momentum = std::nullopt;  // cumulative moving average
    } else {
      o.momentum = mom[k];
      if (!(mom[k] >= 0.0 && mom[k] <= 1.0)) expect_error(e);
    }
  }
  return o;
}

/// What both targets decode first: the placement (a seed picks it with its first byte; 0, an
/// exhausted input, places every tensor in its own buffer), the options, the shape and dtype.
struct SbnCase {
  int placement = 0;
  SyncBnOptions opts;
  FbnShape sh;
  DType dt = DType::kFloat32;
};

inline SbnCase decode_case(Reader& r, int placements, Expect* e) {
  SbnCase c;
  c.placement = r.u8() % placements;
  c.opts = decode_options(r, e);
  c.sh = decode_shape(r);
  c.dt = decode_data_dtype(r, e);
  return c;
}

/// A [n] vector: `dt` (float32 or float64), contiguous; rarely a bad dtype, size, rank or
/// stride. `contiguous_only`: the library wants stride 1 (save_*, int64 counters); otherwise
/// any stride is read (weight, bias) but outputs must not overlap themselves (running_*).
inline Spec decode_vec(Reader& r, const char* name, std::int64_t n, DType dt, bool contiguous_only, bool output,
                       Expect* e, bool allow_float64_or_32 = true) {
  Spec s;
  s.name = name;
  s.dtype = dt;
  s.rank = 1;
  s.sizes[0] = n;
  s.strides[0] = 1;
  s.output = output;
  if (r.one_in(64)) {
    // a dtype the library refuses here
    if (dt == DType::kInt64) s.dtype = r.one_in(2) ? DType::kInt32 : DType::kFloat64;
    else if (dt == DType::kFloat64 && !allow_float64_or_32) s.dtype = DType::kFloat32;
    else s.dtype = r.one_in(2) ? DType::kFloat16 : r.one_in(2) ? DType::kInt64 : DType::kBFloat16;
    expect_error(e);
  }
  if (r.one_in(64)) {
    s.sizes[0] = n + (r.one_in(2) ? 1 : -1);
    if (s.sizes[0] < 0) s.sizes[0] = n + 1;
    expect_error(e);
  }
  if (r.one_in(32)) {
    s.strides[0] = r.one_in(2) ? 0 : 2 + r.range(0, 1);
    if (s.sizes[0] > 1 && (contiguous_only || (output && s.strides[0] == 0))) expect_error(e);
  }
  if (r.one_in(64)) {
    s.rank = 2;
    s.sizes[1] = 1;
    s.strides[1] = 1;
    expect_error(e);
  }
  return s;
}

/// Whether two specs have the same dtype, rank and sizes (one may be placed as the other).
inline bool same_shape(const Spec& a, const Spec& b) {
  return a.dtype == b.dtype && a.rank == b.rank && std::equal(a.sizes, a.sizes + a.rank, b.sizes);
}

/// Places a spec (absent: an absent tensor): inside `host`'s buffer when `inside` and it fits,
/// otherwise in a fresh buffer.
inline Tensor4 place_optional(Arena& arena, Reader& r, const Spec& s, bool present, const Tensor4* host, bool inside) {
  Tensor4 t;
  if (!present) return t;
  if (inside && host && host->buffer >= 0 && place_inside(arena, *host, s, r.range(0, 16) * 4, &t)) return t;
  return place(arena, s);
}

/// Rarely, a device or a pointer the CPU build cannot use on one of the tensors (an error).
/// Returns the tensor changed, or nullptr.
inline Tensor4* inject_bad_device(Reader& r, std::initializer_list<Tensor4*> tensors, Expect* e) {
  if (!r.one_in(64)) return nullptr;
  Tensor4* t = tensors.begin()[r.u8() % tensors.size()];
  if (!t->view.defined()) return nullptr;
  if (r.one_in(2) || count(t->view) == 0) t->view.device = Device::cuda(r.one_in(2) ? 0 : -1);
  else t->view.data = nullptr;
  expect_error(e);
  return t;
}

/// After the call: an Error must have a sensible code and message and be expected; a return
/// must not be. Returns whether to compare values (a return that was expected).
inline bool check_outcome(bool ok, Expect e, ErrorCode code, const std::string& msg) {
  if (!ok) {
    FUZZ_CHECK(code == ErrorCode::kInvalidArgument || code == ErrorCode::kNotCompiled, "unexpected error code {} ({})",
               static_cast<int>(code), msg);
    FUZZ_CHECK(!msg.empty(), "empty error message");
    FUZZ_CHECK(e != Expect::kSuccess, "a valid call raised: {}", msg);
    return false;
  }
  FUZZ_CHECK(e != Expect::kError, "an invalid call returned normally");
  return e == Expect::kSuccess;
}

/// A dense (NCHW or [C]) owning copy of values, zeros when `v` does not match (an absent tensor).
inline Tensor dense_copy(std::initializer_list<std::int64_t> sizes, DType dt, const std::vector<double>& v) {
  Tensor t = Tensor::zeros(sizes, dt);
  if (static_cast<std::int64_t>(v.size()) == t.numel()) write_values(t.view(), v);
  return t;
}

inline DType decode_param_dtype(Reader& r) { return r.one_in(4) ? DType::kFloat64 : DType::kFloat32; }

/// The element values of a data tensor: moderate (k/32, |x| <= 4), sometimes around a large
/// mean (1e3 .. 1e4, exact in float32), and in one tensor of eight specials.
inline void fill_data(Reader& r, const Tensor4& t) {
  if (!t.view.defined() || !t.view.data || !t.view.device.is_cpu() || count(t.view) <= 0) return;
  if (!is_float_dtype(t.view.dtype)) return;
  const int kind = r.u8() % 16;
  const bool specials = kind == 15 || kind == 14;
  const double offset = kind == 13 ? 1024.0 : kind == 12 ? -4096.0 : kind == 11 ? 9984.0 : 0.0;
  const double spread = kind == 10 ? 1.0 / 64 : 1.0;  // nearly constant channels
  std::vector<double> v(static_cast<std::size_t>(count(t.view)));
  for (double& x : v) x = specials && r.one_in(3) ? special(r) : offset + spread * moderate(r);
  write_values(t.view, v);
}

/// A [C] vector's values: moderate, positive (`positive`: a variance, an invstd), sometimes
/// special.
inline void fill_vec(Reader& r, const Tensor4& t, bool positive) {
  if (!t.view.defined() || !t.view.data || !t.view.device.is_cpu() || count(t.view) <= 0) return;
  if (!is_float_dtype(t.view.dtype)) return;
  const bool specials = r.one_in(12);
  std::vector<double> v(static_cast<std::size_t>(count(t.view)));
  for (double& x : v) {
    x = specials && r.one_in(2) ? special(r) : moderate(r);
    if (positive && !specials) x = std::fabs(x) + 1.0 / 32;
  }
  write_values(t.view, v);
}

/// n + 1 in two's complement (what an int64 counter wraps to; no signed overflow here).
/// The library's num_batches_tracked + 1: saturating at INT64_MAX.
inline std::int64_t saturating_increment(std::int64_t n) {
  return n == std::numeric_limits<std::int64_t>::max() ? n : n + 1;
}

inline std::int64_t load_i64(const TensorView& v) {
  std::int64_t n;
  std::memcpy(&n, v.data, 8);
  return n;
}

/// A counter value (num_batches_tracked): small, sometimes large or negative.
inline std::int64_t decode_counter(Reader& r) {
  static const std::int64_t table[] = {0, 1, 2, 9, 1000, std::int64_t{1} << 40, -1, -7,
                                       std::numeric_limits<std::int64_t>::max() - 1,
                                       std::numeric_limits<std::int64_t>::max()};
  const int k = r.u8() % 40;
  if (k == 9 && !kSbnCounterOverflowHandled) return table[8];
  return k < 10 ? table[k] : k % 3;
}

/// Whether every value is finite and moderate (|x| <= 1e4), the domain of the error bounds.
inline bool all_moderate(const std::vector<double>& v) {
  for (double x : v)
    if (!moderate_value(x)) return false;
  return true;
}

/// The statistics of one channel (float64 reference, long double sums).
struct ChannelStats {
  std::int64_t n = 0;
  double mean = 0, var = 0, unbiased = 0, maxabs = 0, maxdev = 0;
};

inline std::vector<ChannelStats> channel_stats(const std::vector<double>& x, const FbnShape& sh) {
  const std::int64_t C = sh.C(), HW = sh.HW();
  std::vector<ChannelStats> out(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) {
    ChannelStats& s = out[static_cast<std::size_t>(c)];
    long double sum = 0;
    for (std::int64_t b = 0; b < sh.N(); ++b)
      for (std::int64_t q = 0; q < HW; ++q) {
        const double v = x[static_cast<std::size_t>((b * C + c) * HW + q)];
        sum += v;
        s.maxabs = std::max(s.maxabs, std::fabs(v));
        ++s.n;
      }
    if (s.n == 0) continue;
    s.mean = static_cast<double>(sum / s.n);
    long double m2 = 0;
    for (std::int64_t b = 0; b < sh.N(); ++b)
      for (std::int64_t q = 0; q < HW; ++q) {
        const long double d = static_cast<long double>(x[static_cast<std::size_t>((b * C + c) * HW + q)]) - s.mean;
        m2 += d * d;
        s.maxdev = std::max(s.maxdev, static_cast<double>(std::fabs(d)));
      }
    s.var = static_cast<double>(m2 / s.n);
    s.unbiased = s.n > 1 ? static_cast<double>(m2 / (s.n - 1)) : 0.0;
  }
  return out;
}

constexpr double kU64 = 1.1102230246251565e-16;  // 2^-53

/// The exact mode's grid for a channel whose largest |value| is m: 2^(E - 44), 2^E above m.
inline double exact_grid(double m) {
  if (!(m > 0) || !std::isfinite(m)) return 0.0;
  int e;
  std::frexp(m, &e);  // m < 2^e
  return std::ldexp(1.0, e - 44);
}

}  // namespace fuzz
}  // namespace detops
