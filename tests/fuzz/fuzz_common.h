// Shared machinery of the detops fuzz targets (libFuzzer, built by the "fuzz" preset with
// ASan + UBSan; see tests/fuzz/README.md):
//   - Reader: decodes the fuzz bytes; an exhausted input reads as zeros, and every decoder is
//     written so that zeros give a small, valid problem (so short inputs are meaningful).
//   - Arena / Buffer: every tensor lives in its own heap block with guard bytes before and after
//     the addressed range (ASan-poisoned, and compared after the call); gaps between strided
//     elements are filled with 0xFF (NaN for every float dtype, so reading one shows up in the
//     values) and outputs are poisoned with 0xCD. After a call every byte that is not an element
//     of an output must be unchanged, and after a detops::Error every byte must be unchanged.
//   - value generators (moderate values exactly representable in every dtype, and specials),
//     stride generators (dense NCHW/NHWC, padded, permuted, broadcast, overlapping, negative).
//   - FUZZ_CHECK: prints the decoded case and aborts, so libFuzzer saves the input.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "detops/detops.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DETOPS_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DETOPS_FUZZ_ASAN 1
#endif
#if defined(DETOPS_FUZZ_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define DETOPS_FUZZ_POISON(p, n) __asan_poison_memory_region((p), (n))
#define DETOPS_FUZZ_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define DETOPS_FUZZ_POISON(p, n) ((void)(p), (void)(n))
#define DETOPS_FUZZ_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace detops {
namespace fuzz {

// ---------------------------------------------------------------------------------------------
// Failure reporting

/// The description of the case being run, printed when a check fails.
inline std::string& case_description() {
  static std::string s;
  return s;
}

template <class... Args>
void describe(fmt::format_string<Args...> f, Args&&... args) {
  case_description() += fmt::format(f, std::forward<Args>(args)...);
  case_description() += '\n';
}

[[noreturn]] inline void fail_check(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "\n==== detops fuzz check failed (%s:%d) ====\n%s\n---- case ----\n%s\n", file, line,
               what.c_str(), case_description().c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond, ...)                                                                   \
  do {                                                                                          \
    if (!(cond)) ::detops::fuzz::fail_check(__FILE__, __LINE__, std::string("check `" #cond "`: ") + \
                                                                    fmt::format(__VA_ARGS__)); \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Statistics: DETOPS_FUZZ_STATS=1 prints them at exit (what the runs exercised).

struct Stats {
  std::uint64_t runs = 0, returned = 0, raised = 0, skipped = 0, compared = 0, in_place = 0, overlapping = 0;
  std::uint64_t expected_error = 0, expected_either = 0;
};
inline Stats& stats() {
  static Stats s;
  static const bool registered = [] {
    const char* env = std::getenv("DETOPS_FUZZ_STATS");
    if (env && env[0] == '1')
      std::atexit([] {
        const Stats& t = stats();
        std::fprintf(stderr,
                     "detops fuzz stats: %llu runs, %llu returned, %llu raised detops::Error, %llu skipped (slow by "
                     "design), %llu values compared with the float64 reference, %llu in-place, %llu with overlapping "
                     "tensors, %llu expected to raise, %llu either way\n",
                     static_cast<unsigned long long>(t.runs), static_cast<unsigned long long>(t.returned),
                     static_cast<unsigned long long>(t.raised), static_cast<unsigned long long>(t.skipped),
                     static_cast<unsigned long long>(t.compared), static_cast<unsigned long long>(t.in_place),
                     static_cast<unsigned long long>(t.overlapping), static_cast<unsigned long long>(t.expected_error),
                     static_cast<unsigned long long>(t.expected_either));
      });
    return true;
  }();
  (void)registered;
  return s;
}

/// DETOPS_FUZZ_PRINT=1: print what each input decodes to (for choosing seeds, or reading an
/// input that hangs).
inline bool print_cases() {
  static const bool on = [] {
    const char* env = std::getenv("DETOPS_FUZZ_PRINT");
    return env && env[0] == '1';
  }();
  return on;
}

/// Starts a run: clears the case description and counts it.
inline void begin_run() {
  static const bool once = [] {
    case_description();  // constructed before the handler below is registered, so it outlives it
#if defined(DETOPS_FUZZ_ASAN)
    // A sanitizer report ends the process: print the case it was running first.
    __sanitizer_set_death_callback([] {
      std::fprintf(stderr, "---- case being run ----\n%s", case_description().c_str());
    });
#endif
    return true;
  }();
  (void)once;
  case_description().clear();
  ++stats().runs;
}

/// Called just before the library call: the description is complete.
inline void announce() {
  if (print_cases()) {
    std::fprintf(stderr, "---- case ----\n%s", case_description().c_str());
    std::fflush(stderr);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding the fuzz bytes

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(u16()) | (static_cast<std::uint32_t>(u16()) << 16); }
  std::uint64_t u64() { return static_cast<std::uint64_t>(u32()) | (static_cast<std::uint64_t>(u32()) << 32); }
  /// Uniform-ish in [lo, hi] (inclusive); lo when the input is exhausted.
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    const std::uint64_t v = span <= 256 ? u8() : span <= 65536 ? u16() : u32();
    return lo + static_cast<std::int64_t>(v % span);
  }
  /// True with probability 1/n (false when exhausted, for n > 1).
  bool one_in(int n) { return u8() % n == static_cast<unsigned>(n - 1); }
  double raw_f64() {
    const std::uint64_t b = u64();
    double d;
    std::memcpy(&d, &b, 8);
    return d;
  }
  std::size_t remaining() const { return n_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

/// A former gap of the library, now closed (see README.md in this directory): a DType value
/// outside the float dtypes (int32 where a float is needed, or a value outside the enumeration,
/// e.g. static_cast<DType>(9)) fails is_floating(), so the call must raise kInvalidArgument.
/// false would tolerate the old behaviour (calls returning, the fold reading such a buffer as 0).
constexpr bool kRejectsUnknownDTypes = true;

/// What a call must do, from what the decoder injected.
enum class Expect { kSuccess, kError, kEither };
inline void expect_error(Expect* e) { *e = Expect::kError; }
inline void expect_maybe(Expect* e) {
  if (*e == Expect::kSuccess) *e = Expect::kEither;
}
/// For a DType outside the enumeration.
inline void expect_unknown_dtype(Expect* e) {
  if (kRejectsUnknownDTypes) *e = Expect::kError;
  else if (*e == Expect::kSuccess) *e = Expect::kEither;
}
/// A data dtype from one byte: one of the four float dtypes, or now and then int32 (an error) or a
/// value outside DType (grid_sample's and deform_conv2d's cases).
inline DType decode_float_dtype(Reader& r, Expect* e) {
  const int v = r.u8() % 34;
  if (v == 32) {
    expect_error(e);
    return DType::kInt32;
  }
  if (v == 33) {
    expect_unknown_dtype(e);
    return static_cast<DType>(9);
  }
  static const DType kinds[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  return kinds[v % 4];
}
/// Counts what a decoded case expects (for the statistics).
inline void note_expect(Expect e, bool in_place, bool overlapping) {
  if (e == Expect::kError) ++stats().expected_error;
  if (e == Expect::kEither) ++stats().expected_either;
  if (in_place) ++stats().in_place;
  if (overlapping) ++stats().overlapping;
}
inline const char* expect_name(Expect e) {
  return e == Expect::kSuccess ? "success" : e == Expect::kError ? "error" : "either";
}

// ---------------------------------------------------------------------------------------------
// Element access (any dtype, element offsets)

inline float to_float_saturating(double d) {
  if (std::isnan(d)) return std::numeric_limits<float>::quiet_NaN();
  if (d > static_cast<double>(std::numeric_limits<float>::max()) * (1 + 1e-9))
    return std::numeric_limits<float>::infinity();
  if (d < -static_cast<double>(std::numeric_limits<float>::max()) * (1 + 1e-9))
    return -std::numeric_limits<float>::infinity();
  return static_cast<float>(d);
}

inline void store(void* base, DType dt, std::int64_t off, double v) {
  switch (dt) {
    case DType::kFloat64: static_cast<double*>(base)[off] = v; break;
    case DType::kFloat32: static_cast<float*>(base)[off] = to_float_saturating(v); break;
    case DType::kFloat16: static_cast<Half*>(base)[off] = from_double<Half>(v); break;
    case DType::kBFloat16: static_cast<BFloat16*>(base)[off] = from_double<BFloat16>(v); break;
    case DType::kInt32: {
      const double c = std::isnan(v) ? 0 : std::max(-2147483648.0, std::min(2147483647.0, v));
      static_cast<std::int32_t*>(base)[off] = static_cast<std::int32_t>(c);
      break;
    }
    default: std::memset(static_cast<unsigned char*>(base) + off * 4, 0x5A, 4); break;
  }
}

inline double load(const void* base, DType dt, std::int64_t off) {
  switch (dt) {
    case DType::kFloat64: return static_cast<const double*>(base)[off];
    case DType::kFloat32: return static_cast<const float*>(base)[off];
    case DType::kFloat16: return static_cast<float>(static_cast<const Half*>(base)[off]);
    case DType::kBFloat16: return static_cast<float>(static_cast<const BFloat16*>(base)[off]);
    case DType::kInt32: return static_cast<const std::int32_t*>(base)[off];
    default: return 0;
  }
}

/// Element size as the fuzzer lays tensors out (unknown dtypes: 4 bytes, as the library assumes).
inline std::int64_t esize(DType dt) { return static_cast<std::int64_t>(dtype_size(dt)); }

inline bool is_float_dtype(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 || dt == DType::kBFloat16;
}

/// Unit roundoff of a storage dtype.
inline double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::kFloat64: return std::ldexp(1.0, -53);
    case DType::kFloat32: return std::ldexp(1.0, -24);
    case DType::kFloat16: return std::ldexp(1.0, -11);
    case DType::kBFloat16: return std::ldexp(1.0, -8);
    default: return 1.0;
  }
}
/// Unit roundoff of the accumulation type of a dtype (float, or double for float64).
inline double acc_roundoff(DType dt) { return dt == DType::kFloat64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24); }
/// Largest finite value of a storage dtype.
inline double dtype_max(DType dt) {
  switch (dt) {
    case DType::kFloat64: return std::numeric_limits<double>::max();
    case DType::kFloat32: return std::numeric_limits<float>::max();
    case DType::kFloat16: return 65504.0;
    case DType::kBFloat16: return 3.3895313892515355e38;
    default: return 2147483647.0;
  }
}
/// Smallest positive normal value (below it, relative error bounds do not hold).
inline double dtype_min_normal(DType dt) {
  switch (dt) {
    case DType::kFloat64: return std::numeric_limits<double>::min();
    case DType::kFloat16: return std::ldexp(1.0, -14);
    default: return std::numeric_limits<float>::min();
  }
}

/// A value after a round trip through dtype (what the library will read).
inline double round_trip(double v, DType dt) {
  unsigned char b[8];
  store(b, dt, 0, v);
  return load(b, dt, 0);
}

// ---------------------------------------------------------------------------------------------
// Values

/// A moderate value: k/32 for k in [-128, 128), exact in every floating dtype.
inline double moderate(Reader& r) { return (static_cast<int>(r.u8()) - 128) / 32.0; }

/// A special value: non-finite, huge, tiny, signed zero, boundaries of the 16-bit formats.
inline double special(Reader& r) {
  static const double table[] = {std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity(),
                                 0.0,
                                 -0.0,
                                 1e-40,    // float32 subnormal
                                 6e-8,     // float16 subnormal
                                 -1e-310,  // float64 subnormal
                                 65504.0,
                                 65520.0,  // rounds to inf in float16
                                 -1e5,
                                 3.4e38,
                                 -3.5e38,  // inf in float32
                                 1e300,
                                 2147483648.0,
                                 9007199254740993.0,
                                 0.5,
                                 -1.0,
                                 1e30,
                                 -1e-30};
  return table[r.u8() % (sizeof(table) / sizeof(table[0]))];
}

// ---------------------------------------------------------------------------------------------
// Memory: buffers with guards, views, snapshots

constexpr std::size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xA7;
constexpr unsigned char kGapByte = 0xFF;     // NaN in every float dtype, -1 as int32
constexpr unsigned char kPoisonByte = 0xCD;  // outputs before the call

/// One heap block: [guard][data region][guard]. The guards are ASan-poisoned while the library
/// runs; their bytes are checked afterwards too.
struct Buffer {
  unsigned char* mem = nullptr;
  std::size_t total = 0;
  std::size_t region = 0;  // data region bytes, starting at mem + kGuard
  std::vector<unsigned char> before;

  unsigned char* data() const { return mem + kGuard; }
};

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (Buffer& b : buffers_) {
      DETOPS_FUZZ_UNPOISON(b.mem, b.total);
      std::free(b.mem);
    }
  }

  /// A new buffer with `region` data bytes filled with `fill`; returns its index.
  int add(std::size_t region, unsigned char fill) {
    Buffer b;
    b.region = region;
    b.total = region + 2 * kGuard;
    b.mem = static_cast<unsigned char*>(std::malloc(b.total));
    if (!b.mem) std::abort();
    std::memset(b.mem, kGuardByte, kGuard);
    std::memset(b.mem + kGuard, fill, region);
    std::memset(b.mem + kGuard + region, kGuardByte, kGuard);
    buffers_.push_back(std::move(b));
    return static_cast<int>(buffers_.size() - 1);
  }
  Buffer& operator[](int i) { return buffers_[static_cast<std::size_t>(i)]; }
  std::size_t size() const { return buffers_.size(); }

  /// Snapshot every data region and poison the guards (just before the call).
  void arm() {
    for (Buffer& b : buffers_) {
      b.before.assign(b.data(), b.data() + b.region);
      DETOPS_FUZZ_POISON(b.mem, kGuard);
      DETOPS_FUZZ_POISON(b.mem + kGuard + b.region, kGuard);
    }
  }
  /// Unpoison the guards and check them (just after the call).
  void disarm() {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      Buffer& b = buffers_[i];
      DETOPS_FUZZ_UNPOISON(b.mem, b.total);
      for (std::size_t j = 0; j < kGuard; ++j) {
        FUZZ_CHECK(b.mem[j] == kGuardByte, "buffer {}: guard byte {} before the data was overwritten (0x{:02x})", i,
                   kGuard - j, b.mem[j]);
        FUZZ_CHECK(b.mem[kGuard + b.region + j] == kGuardByte,
                   "buffer {}: guard byte {} after the data was overwritten (0x{:02x})", i, j,
                   b.mem[kGuard + b.region + j]);
      }
    }
  }

 private:
  std::vector<Buffer> buffers_;
};

/// A tensor of the case: a view into one arena buffer.
struct Tensor4 {
  TensorView view;
  int buffer = -1;
  bool output = false;
  std::string name;
};

/// Visits the element offsets of a view (any rank <= 6, any strides), in row-major index order.
template <class F>
void for_each_offset(const TensorView& v, F&& f) {
  if (v.rank < 0 || v.rank > kMaxRank) return;
  std::int64_t n = 1;
  for (int d = 0; d < v.rank; ++d) {
    if (v.sizes[d] <= 0) return;
    n *= v.sizes[d];
  }
  std::int64_t idx[kMaxRank] = {};
  for (std::int64_t lin = 0; lin < n; ++lin) {
    std::int64_t o = 0;
    for (int d = 0; d < v.rank; ++d) o += idx[d] * v.strides[d];
    f(lin, o);
    for (int d = v.rank - 1; d >= 0; --d) {
      if (++idx[d] < v.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

/// Lowest and highest element offsets a view addresses (0, -1 when empty).
inline std::pair<std::int64_t, std::int64_t> offset_range(int rank, const std::int64_t* sizes, const std::int64_t* strides) {
  std::int64_t lo = 0, hi = 0;
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] <= 0) return {0, -1};
    const std::int64_t e = (sizes[d] - 1) * strides[d];
    if (e < 0) lo += e;
    else hi += e;
  }
  return {lo, hi};
}

/// Reads a view's elements (row-major index order) as doubles.
inline std::vector<double> read_values(const TensorView& v) {
  std::vector<double> out;
  for_each_offset(v, [&](std::int64_t, std::int64_t o) { out.push_back(load(v.data, v.dtype, o)); });
  return out;
}

/// The element count of a view the harness built, or -1 when the library would refuse it
/// (a negative size or a count past int64): TensorView::numel() throws there.
inline std::int64_t count(const TensorView& v) {
  std::int64_t n = 1;
  for (int d = 0; d < v.rank; ++d) {
    if (v.sizes[d] < 0 || __builtin_mul_overflow(n, v.sizes[d], &n)) return -1;
  }
  return n;
}

/// Whether the byte ranges [data + lo*es, data + (hi+1)*es) of two non-empty views intersect
/// (the library's own test for overlap).
inline bool spans_intersect(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined() || count(a) <= 0 || count(b) <= 0 || !a.data || !b.data) return false;
  if (a.device != b.device) return false;
  const auto ra = offset_range(a.rank, a.sizes, a.strides), rb = offset_range(b.rank, b.sizes, b.strides);
  const auto* pa = static_cast<const unsigned char*>(a.data);
  const auto* pb = static_cast<const unsigned char*>(b.data);
  const unsigned char* a0 = pa + ra.first * esize(a.dtype);
  const unsigned char* a1 = pa + (ra.second + 1) * esize(a.dtype);
  const unsigned char* b0 = pb + rb.first * esize(b.dtype);
  const unsigned char* b1 = pb + (rb.second + 1) * esize(b.dtype);
  return a0 < b1 && b0 < a1;
}

inline bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.rank != b.rank || a.dtype != b.dtype || a.device != b.device) return false;
  for (int d = 0; d < a.rank; ++d)
    if (a.sizes[d] != b.sizes[d] || a.strides[d] != b.strides[d]) return false;
  return true;
}

/// Whether two elements of a view share memory (the library requires outputs not to; its test is
/// conservative: sorted strides, each at least the extent of the smaller ones).
inline bool self_overlapping_conservative(const TensorView& v) {
  if (count(v) <= 1) return false;
  std::vector<int> dims;
  for (int d = 0; d < v.rank; ++d)
    if (v.sizes[d] > 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return v.strides[a] < v.strides[b]; });
  std::int64_t need = 1;
  for (int d : dims) {
    if (v.strides[d] < need) return true;
    need = v.strides[d] * v.sizes[d];
  }
  return false;
}

/// Exact test: do two distinct indices address one element?
inline bool self_overlapping_exact(const TensorView& v) {
  std::set<std::int64_t> seen;
  bool dup = false;
  for_each_offset(v, [&](std::int64_t, std::int64_t o) { dup = dup || !seen.insert(o).second; });
  return dup;
}

// ---------------------------------------------------------------------------------------------
// Strides

enum class Form : std::uint8_t { kDense, kNHWC, kPadded, kPermuted, kBroadcast, kOverlap, kNegative, kTransposed };

inline const char* form_name(Form f) {
  switch (f) {
    case Form::kDense: return "dense";
    case Form::kNHWC: return "nhwc";
    case Form::kPadded: return "padded";
    case Form::kPermuted: return "permuted";
    case Form::kBroadcast: return "broadcast";
    case Form::kOverlap: return "overlap";
    case Form::kNegative: return "negative";
    case Form::kTransposed: return "transposed";
  }
  return "?";
}

/// Picks a memory form. `reads_only`: broadcast (stride 0) is a legal input; for outputs it is
/// an overlap. Weights: dense 6, NHWC 4 (4-d only), padded 2, permuted 2, then one each.
inline Form pick_form(Reader& r, int rank) {
  const int v = r.u8() % 20;
  if (v < 7) return Form::kDense;
  if (v < 11) return rank == 4 ? Form::kNHWC : Form::kDense;
  if (v < 13) return Form::kPadded;
  if (v < 15) return Form::kPermuted;
  if (v < 16) return Form::kTransposed;
  if (v < 17) return Form::kBroadcast;
  if (v < 18) return Form::kOverlap;
  if (v < 19) return Form::kNegative;
  return Form::kDense;
}

/// Strides for `sizes` in the given form (may decode a few more bytes).
inline void make_strides(Reader& r, Form form, int rank, const std::int64_t* sizes, std::int64_t* strides) {
  std::int64_t order[kMaxRank];
  for (int d = 0; d < rank; ++d) order[d] = d;  // order[0] = outermost
  switch (form) {
    case Form::kNHWC:
      if (rank == 4) order[0] = 0, order[1] = 2, order[2] = 3, order[3] = 1;
      break;
    case Form::kPermuted:
      for (int d = rank - 1; d > 0; --d) std::swap(order[d], order[r.u8() % (d + 1)]);
      break;
    case Form::kTransposed:
      std::reverse(order, order + rank);
      break;
    default: break;
  }
  std::int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    const int d = static_cast<int>(order[i]);
    std::int64_t pad = 0;
    if (form == Form::kPadded || (form == Form::kPermuted && r.one_in(3))) pad = r.range(0, 3);
    strides[d] = s + (i == rank - 1 && form == Form::kPadded ? r.range(0, 2) : 0);  // innermost may be > 1
    s = strides[d] * std::max<std::int64_t>(sizes[d], 1) + pad;
  }
  if (form == Form::kBroadcast && rank > 0) strides[r.u8() % rank] = 0;
  if (form == Form::kOverlap && rank > 0) {
    const int d = r.u8() % rank;  // shrink one stride below the extent of an inner dimension
    strides[d] = strides[d] > 1 ? r.range(0, strides[d] - 1) : 0;
  }
  if (form == Form::kNegative && rank > 0) {
    const int d = r.u8() % rank;
    strides[d] = -std::max<std::int64_t>(strides[d], 1);
  }
}

/// Lays a view out in a fresh buffer (plus optional misalignment by whole elements) and returns
/// it. The data region covers exactly the addressed range; gaps are filled with kGapByte.
inline Tensor4 make_tensor(Arena& arena, const char* name, DType dt, int rank, const std::int64_t* sizes,
                           const std::int64_t* strides, bool output, std::int64_t misalign_elems = 0) {
  Tensor4 t;
  t.name = name;
  t.output = output;
  t.view.dtype = dt;
  t.view.device = Device::cpu();
  t.view.rank = rank;
  for (int d = 0; d < rank; ++d) t.view.sizes[d] = sizes[d], t.view.strides[d] = strides[d];
  const auto rg = offset_range(rank, sizes, strides);
  const std::int64_t es = esize(dt);
  const std::int64_t elems = rg.second - rg.first + 1;  // 0 when empty
  const std::size_t region = static_cast<std::size_t>((elems + misalign_elems) * es);
  t.buffer = arena.add(region, kGapByte);
  t.view.data = arena[t.buffer].data() + (misalign_elems - rg.first) * es;
  return t;
}

/// The shape and strides of a tensor before it is placed in memory.
struct Spec {
  std::string name;
  DType dtype = DType::kFloat32;
  int rank = 0;
  std::int64_t sizes[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};
  bool output = false;
  Form form = Form::kDense;
  /// Bytes of the data region the view needs (0 when empty).
  std::int64_t span_bytes() const {
    const auto rg = offset_range(rank, sizes, strides);
    return (rg.second - rg.first + 1) * esize(dtype);
  }
};

/// A spec of the given sizes with strides of a decoded form (`allow_bad`: broadcast, overlap and
/// negative strides may be picked; otherwise they fall back to dense).
inline Spec make_spec(Reader& r, const char* name, DType dt, int rank, const std::int64_t* sizes, bool output,
                      bool allow_bad = true) {
  Spec s;
  s.name = name;
  s.dtype = dt;
  s.rank = rank;
  s.output = output;
  for (int d = 0; d < rank; ++d) s.sizes[d] = sizes[d];
  s.form = pick_form(r, rank);
  if (!allow_bad && (s.form == Form::kBroadcast || s.form == Form::kOverlap || s.form == Form::kNegative))
    s.form = Form::kDense;
  make_strides(r, s.form, rank, s.sizes, s.strides);
  return s;
}

/// Places a spec in a fresh buffer (misaligned by `misalign_elems` whole elements).
inline Tensor4 place(Arena& arena, const Spec& s, std::int64_t misalign_elems = 0) {
  return make_tensor(arena, s.name.c_str(), s.dtype, s.rank, s.sizes, s.strides, s.output, misalign_elems);
}

/// Places a spec inside the buffer of an already placed tensor, starting `byte_offset` bytes
/// into its data region (rounded down to the element size; the buffer must be large enough).
inline bool place_inside(Arena& arena, const Tensor4& host, const Spec& s, std::int64_t byte_offset, Tensor4* out) {
  const auto rg = offset_range(s.rank, s.sizes, s.strides);
  const std::int64_t es = esize(s.dtype);
  byte_offset -= byte_offset % es;
  const Buffer& b = arena[host.buffer];
  if (byte_offset < 0 || byte_offset + s.span_bytes() > static_cast<std::int64_t>(b.region)) return false;
  out->name = s.name;
  out->output = s.output;
  out->buffer = host.buffer;
  out->view = TensorView{};
  out->view.dtype = s.dtype;
  out->view.device = Device::cpu();
  out->view.rank = s.rank;
  for (int d = 0; d < s.rank; ++d) out->view.sizes[d] = s.sizes[d], out->view.strides[d] = s.strides[d];
  out->view.data = b.data() + byte_offset - rg.first * es;
  return true;
}

/// Fills the elements of a view with the given values (row-major index order); outputs should
/// use poison() instead.
inline void write_values(const TensorView& v, const std::vector<double>& values) {
  if (!v.data) return;
  for_each_offset(v, [&](std::int64_t lin, std::int64_t o) { store(v.data, v.dtype, o, values[static_cast<std::size_t>(lin)]); });
}

/// Poisons every element byte of an output.
inline void poison(const TensorView& v) {
  if (!v.data) return;
  const std::int64_t es = esize(v.dtype);
  for_each_offset(v, [&](std::int64_t, std::int64_t o) {
    std::memset(static_cast<unsigned char*>(v.data) + o * es, kPoisonByte, static_cast<std::size_t>(es));
  });
}

/// After a call. `ok`: the call returned (outputs may change, at their elements only); otherwise
/// it threw and nothing may have changed. Checks guards, inputs, and gaps.
inline void check_memory(Arena& arena, const std::vector<const Tensor4*>& tensors, bool ok) {
  arena.disarm();
  for (std::size_t i = 0; i < arena.size(); ++i) {
    Buffer& b = arena[static_cast<int>(i)];
    std::vector<unsigned char> writable(b.region, 0);
    if (ok) {
      for (const Tensor4* t : tensors) {
        if (!t->output || t->buffer != static_cast<int>(i) || !t->view.defined() || !t->view.data) continue;
        const std::int64_t es = esize(t->view.dtype);
        const auto* base = static_cast<const unsigned char*>(t->view.data);
        for_each_offset(t->view, [&](std::int64_t, std::int64_t o) {
          const std::ptrdiff_t at = base + o * es - b.data();
          for (std::int64_t j = 0; j < es; ++j)
            if (at + j >= 0 && static_cast<std::size_t>(at + j) < b.region) writable[static_cast<std::size_t>(at + j)] = 1;
        });
      }
    }
    for (std::size_t j = 0; j < b.region; ++j) {
      if (writable[j] || b.data()[j] == b.before[j]) continue;
      std::string owner = "a gap or an input";
      for (const Tensor4* t : tensors)
        if (t->buffer == static_cast<int>(i)) owner = t->name + (t->output ? " (output, not an element)" : " (input)");
      FUZZ_CHECK(false, "{}: byte {} of buffer {} ({}) changed from 0x{:02x} to 0x{:02x}",
                 ok ? "after a successful call" : "after a detops::Error", j, i, owner, b.before[j], b.data()[j]);
    }
  }
}

/// "sizes [..] strides [..] dtype form" for the case description.
inline std::string describe_view(const TensorView& v) {
  if (!v.defined()) return "absent";
  std::string s = "[";
  for (int d = 0; d < v.rank; ++d) s += fmt::format("{}{}", d ? ", " : "", v.sizes[d]);
  s += "] strides [";
  for (int d = 0; d < v.rank; ++d) s += fmt::format("{}{}", d ? ", " : "", v.strides[d]);
  s += fmt::format("] {} {}{}", is_float_dtype(v.dtype) || v.dtype == DType::kInt32 || v.dtype == DType::kInt64
                                                                                     ? std::string(dtype_name(v.dtype))
                                                                                     : fmt::format("dtype#{}", static_cast<int>(v.dtype)),
                   to_string(v.device), v.data ? "" : " null");
  return s;
}

// ---------------------------------------------------------------------------------------------
// Workspace allocator

/// Tracks every allocation (balanced frees, sizes), and refuses requests above a cap with the
/// error the default allocator raises when memory runs out.
class FuzzAllocator final : public Allocator {
 public:
  std::size_t cap = std::size_t{64} << 20;
  bool fail_always = false;
  std::size_t last_request = 0;
  int requests = 0;

  void* allocate(std::size_t bytes, Device device, void*) override {
    ++requests;
    last_request = bytes;
    FUZZ_CHECK(device.is_cpu(), "workspace requested on {}", to_string(device));
    if (fail_always || bytes > cap)
      throw Error(ErrorCode::kOutOfMemory, fmt::format("fuzz allocator: refusing {} bytes", bytes));
    void* p = ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t{256});
    live_.insert({p, bytes});
    return p;
  }
  void deallocate(void* p, std::size_t bytes, Device, void*) override {
    auto it = live_.find({p, bytes});
    FUZZ_CHECK(it != live_.end(), "deallocate({}, {}) does not match an allocation", p, bytes);
    live_.erase(it);
    ::operator delete(p, std::align_val_t{256});
  }
  std::size_t live() const { return live_.size(); }

 private:
  std::set<std::pair<void*, std::size_t>> live_;
};

/// A context: 1-3 threads or the default, and the fuzz allocator.
inline Context make_context(Reader& r, FuzzAllocator* alloc) {
  Context ctx;
  const int t = r.u8() % 8;
  ctx.num_threads = t < 4 ? 1 : t < 6 ? 2 : t < 7 ? 3 : 0;
  ctx.allocator = alloc;
  return ctx;
}

/// Runs `call`, returning the error (if any). Anything else than a detops::Error is a failure.
template <class F>
bool run_call(F&& call, ErrorCode* code, std::string* message) {
  try {
    call();
    ++stats().returned;
    return true;
  } catch (const Error& e) {
    ++stats().raised;
    *code = e.code();
    *message = e.what();
    return false;
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, "threw a {} that is not a detops::Error: {}", typeid(e).name(), e.what());
  } catch (...) {
    FUZZ_CHECK(false, "threw something that is not a std::exception");
  }
  return false;
}

/// Whether a value and a reference agree within tol (NaN only matches NaN, inf only itself).
inline bool close(double got, double want, double tol) {
  ++stats().compared;
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= tol;
}

/// Below the normal range the error of each operation is absolute: half a subnormal spacing of
/// the accumulation type, and the storage dtype's rounding near its smallest normal.
inline double underflow_error(DType dt) {
  return (dt == DType::kFloat64 ? std::numeric_limits<double>::denorm_min()
                                : static_cast<double>(std::numeric_limits<float>::denorm_min())) +
         dtype_min_normal(dt) * 2 * unit_roundoff(dt);
}

/// Checks a scattered gradient (RoIAlign's and RoIAlignRotated's grad_input, NCHW values) against
/// the float64 reference. Per element the reference walk gathered `count` contributions whose
/// magnitudes sum to `absmag`, and `absgd`, the sum of the position-error allowances of the
/// samples near it. The sum's error depends on the mode: atomic adds round to the dtype on the
/// CPU, truncated rounds every contribution to 16 bits first (and flushes below their
/// subnormals), exact sums in the accumulation type. An element whose contributions may sum past
/// the dtype's largest value (to inf) is not compared.
inline void check_scattered_gradient(const std::vector<double>& got, const std::vector<double>& want,
                                     const std::vector<double>& absgd, const std::vector<double>& absmag,
                                     const std::vector<double>& count, std::int64_t C, std::int64_t H, std::int64_t W,
                                     DType dt, const RoiAlignBackwardOptions& bwd) {
  const double eps_t = unit_roundoff(dt), eps_a = acc_roundoff(dt);
  double eps = eps_a, abs_per_term = 0;
  switch (bwd.mode) {
    case BackwardMode::kAtomic: eps = std::max(eps_a, eps_t); break;
    case BackwardMode::kTruncated:
      eps = bwd.truncation == TruncationFormat::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      abs_per_term = std::ldexp(1.0, bwd.truncation == TruncationFormat::kFloat16 ? -25 : -134);
      break;
    default: break;
  }
  const double under = underflow_error(dt);
  const std::size_t plane = static_cast<std::size_t>(H * W), image = static_cast<std::size_t>(C) * plane;
  const double top = dtype_max(dt) / (1 + 1.0 / 16);
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (absmag[e] >= top) continue;  // the sum may round past the dtype's range to inf
    const double tol = 8 * absgd[e] + (count[e] + 4) * eps * absmag[e] + count[e] * abs_per_term +
                       2 * eps_t * std::fabs(want[e]) + 2 * (count[e] + 4) * under;
    FUZZ_CHECK(close(got[e], want[e], tol),
               "grad_input[n={}, c={}, y={}, x={}] = {} but the float64 reference gives {} (tol {:.3g}, {} contributions)",
               e / image, (e / plane) % static_cast<std::size_t>(C), (e / static_cast<std::size_t>(W)) % static_cast<std::size_t>(H),
               e % static_cast<std::size_t>(W), got[e], want[e], tol, count[e]);
  }
}

}  // namespace fuzz
}  // namespace detops
