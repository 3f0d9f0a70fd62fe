// libFuzzer target: the SyncBatchNorm phase functions (include/detops/sync_batch_norm.h), each on
// its own. Per input the first byte picks a phase (or a whole pipeline of phases); the arguments
// are decoded from the rest (see README.md in this directory):
//   - record_words / scale_words: channel counts from 0 to INT64_MAX and negative, both modes and
//     unknown ones; the result must be exact or the call must raise.
//   - local_scales, merge_scales, local_stats, finalize_stats, apply, local_backward,
//     finalize_backward, backward_apply: tensors of tiny shapes (empty too), rarely of a wrong
//     rank, size, dtype (int32, int64, a value outside DType), stride (padded, broadcast,
//     overlapping, negative) or absent; gathered buffers [ranks, words] of a wrong width, rank,
//     dtype or non-contiguous, zero rows; rank out of range; modes valid or not; scales present
//     or not; one output rarely placed inside another tensor (an exact alias or a partial one).
//     Records, gathered rows and exponents hold arbitrary int64 words (raw bytes, or counts 0 ..
//     INT64_MAX and negative, i128 sums near +-2^127, doubles that are NaN/inf/huge, exponents
//     outside the sentinel range), or records made by local_stats / local_backward from data.
//     Checks: the call raises detops::Error (kInvalidArgument; exactly when an injected defect
//     says it must) and changes no byte, or it returns and changes output elements only, and
//     its outputs equal (bit for bit, NaN = NaN) those of the same call on dense, separate
//     copies of its arguments (so an aliased or strided output that the library accepts must
//     give the same result). merge_scales is compared with the maximum it documents.
//   - pipeline (forward or backward): x split over 1 rank (default mode) or 1..3 ranks (exact
//     mode), the phases run for every rank as the one-call path does; save_mean, save_invstd,
//     the running statistics, num_batches_tracked, y, grad_x (and grad_weight / grad_bias with
//     one rank) must equal sync_batch_norm_forward / _backward (communicator nullptr) bit for bit.
#include <functional>

#include "detops/detail/sync_batch_norm_math.h"
#include "sync_bn_case.h"

using namespace detops;
using namespace detops::fuzz;

namespace {

/// Garbage records: finalize on words that no local_stats wrote must neither crash nor hit
/// undefined behaviour. Counts that are negative or whose sum overflows int64 give NaN statistics
/// (and leave the running statistics and the counter alone); see the README.
constexpr bool kSbnGarbageCountsNaN = true;

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();

enum Phase : int {
  kRecordWords,
  kScaleWords,
  kLocalScales,
  kMergeScales,
  kLocalStats,
  kFinalizeStats,
  kApply,
  kLocalBackward,
  kFinalizeBackward,
  kBackwardApply,
  kPipelineForward,
  kPipelineBackward,
  kPhases
};
const char* phase_name(int p) {
  static const char* names[] = {"record_words",   "scale_words",     "local_scales",      "merge_scales",
                                "local_stats",    "finalize_stats",  "apply",             "local_backward",
                                "finalize_backward", "backward_apply", "pipeline_forward", "pipeline_backward"};
  return p >= 0 && p < kPhases ? names[p] : "?";
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// A data dtype: mostly a float dtype, rarely int32, int64 or a value outside DType (errors).
DType decode_dtype(Reader& r, Expect* e) {
  const int v = r.u8() % 64;
  if (v < 60) return static_cast<DType>(v % 4);
  expect_unknown_dtype(e);
  return v == 60 ? DType::kInt32 : v == 61 ? DType::kInt64 : static_cast<DType>(6 + r.u8() % 200);
}

SyncBnMode decode_mode(Reader& r, Expect* e) {
  if (r.one_in(48)) {
    expect_error(e);
    return static_cast<SyncBnMode>(2 + r.u8() % 254);
  }
  return static_cast<SyncBnMode>(r.u8() % 2);
}

/// A 4-d shape: each size 0..3 (exhausted: [1, 1, 1, 1]).
void decode_shape4(Reader& r, std::int64_t* s) {
  for (int d = 0; d < 4; ++d) s[d] = (r.u8() + 1) % 4;
}

/// A 4-d data tensor. `like`: the sizes and dtype it must match (null for x itself).
Spec decode_data(Reader& r, const char* name, const std::int64_t* sizes, DType dt, bool output, Expect* e,
                 const Spec* like = nullptr) {
  std::int64_t sz[4] = {sizes[0], sizes[1], sizes[2], sizes[3]};
  if (like && r.one_in(48)) {
    sz[r.u8() % 4] += 1;
    expect_error(e);
  }
  Spec s = make_spec(r, name, dt, 4, sz, output);
  if (like && r.one_in(48)) {
    s.dtype = s.dtype == DType::kFloat64 ? DType::kFloat32 : DType::kFloat64;
    expect_error(e);
  }
  if (r.one_in(64)) {
    s.rank = 3;  // drops W
    expect_error(e);
  }
  if (s.form == Form::kNegative) expect_error(e);
  if (output && s.rank == 4) {
    TensorView v;
    v.dtype = s.dtype;
    v.rank = s.rank;
    for (int d = 0; d < 4; ++d) v.sizes[d] = s.sizes[d], v.strides[d] = s.strides[d];
    if (self_overlapping_conservative(v)) expect_error(e);
  }
  return s;
}

enum class VK { kF64, kParam, kI64 };

/// A [n] vector; rank 0 = absent. Rarely absent, of a wrong length, dtype or rank, or strided.
Spec decode_vec(Reader& r, const char* name, std::int64_t n, VK kind, bool output, bool required, Expect* e,
                DType param_dt = DType::kFloat32) {
  Spec s;
  s.name = name;
  s.output = output;
  s.dtype = kind == VK::kF64 ? DType::kFloat64 : kind == VK::kI64 ? DType::kInt64 : param_dt;
  s.rank = 1;
  s.sizes[0] = n;
  s.strides[0] = 1;
  const int v = r.u8() % 96;
  switch (v) {
    case 0:
      s.rank = 0;  // absent
      if (required) expect_error(e);
      break;
    case 1:
      s.sizes[0] = n + 1;
      expect_error(e);
      break;
    case 2:
      if (n > 0) s.sizes[0] = n - 1, expect_error(e);
      break;
    case 3:
      s.dtype = kind == VK::kI64 ? (r.one_in(2) ? DType::kFloat64 : DType::kInt32)
                : kind == VK::kF64 ? DType::kFloat32
                                   : (r.one_in(2) ? DType::kFloat16 : static_cast<DType>(9));
      expect_error(e);
      break;
    case 4:
      s.rank = 2, s.sizes[1] = 1, s.strides[0] = 1, s.strides[1] = 1;
      expect_error(e);
      break;
    case 5:
    case 6:
      s.strides[0] = 2;  // padded
      if (kind != VK::kParam && n > 1) expect_error(e);
      break;
    case 7:
      s.strides[0] = 0;  // broadcast
      if (kind != VK::kParam && n > 1) expect_error(e);
      if (kind == VK::kParam && output && n > 1) expect_maybe(e);  // an output overlapping itself
      break;
    case 8:
      s.strides[0] = -1;
      expect_error(e);
      break;
    default: break;
  }
  return s;
}

/// Gathered records [ranks, words], int64, row-major; rarely no rows, a wrong width, rank, dtype,
/// or padded rows.
Spec decode_gathered(Reader& r, std::int64_t ranks, std::int64_t words, Expect* e, bool width_defects = true) {
  Spec s;
  s.name = "gathered";
  s.dtype = DType::kInt64;
  s.rank = 2;
  s.sizes[0] = ranks;
  s.sizes[1] = words;
  int v = r.u8() % 96;
  if (!width_defects && (v == 1 || v == 2)) v = 95;  // merge_scales: the width is the scales' length
  if (v == 0) s.sizes[0] = 0, expect_error(e);
  if (v == 1) s.sizes[1] = words + 1, expect_error(e);
  if (v == 2 && words > 0) s.sizes[1] = words - 1, expect_error(e);
  if (v == 3) s.dtype = r.one_in(2) ? DType::kFloat64 : DType::kInt32, expect_error(e);
  if (v == 4) s.rank = 1, s.sizes[0] = ranks * words, expect_error(e);
  s.strides[s.rank - 1] = 1;
  if (s.rank == 2) s.strides[0] = s.sizes[1];
  if (v == 5 && s.rank == 2) {
    s.strides[0] = s.sizes[1] + 1;  // padded rows: not contiguous unless a single row
    if (s.sizes[0] > 1) expect_error(e);
  }
  if (v == 6 && s.rank == 2) {
    s.strides[0] = -std::max<std::int64_t>(s.sizes[1], 1);
    expect_error(e);
  }
  return s;
}

/// An exponent word: mostly plausible, often outside the sentinel range.
std::int64_t decode_exponent(Reader& r) {
  static const std::int64_t table[] = {detail::kSbnZeroExponent,
                                       detail::kSbnNonFiniteExponent,
                                       0,
                                       1,
                                       3,
                                       -5,
                                       44,
                                       -1074,
                                       -1100,
                                       1023,
                                       1024,
                                       1100,
                                       2047,
                                       -2100,
                                       detail::kSbnZeroExponent - 1,
                                       detail::kSbnNonFiniteExponent + 1,
                                       2147483647,
                                       -2147483648LL,
                                       2147483648LL,
                                       std::int64_t{1} << 40,
                                       kI64Max,
                                       kI64Min};
  const int v = r.u8() % 32;
  if (v < 22) return table[v];
  if (v < 28) return r.range(-1100, 1100);
  return static_cast<std::int64_t>(r.u64());
}

/// A count word of a record.
std::int64_t decode_count(Reader& r) {
  static const std::int64_t table[] = {0,  1,  2,  3,  7,  -1, -2, kI64Max, kI64Min, kI64Max / 2 + 1,
                                       std::int64_t{1} << 39, (std::int64_t{1} << 39) + 1, std::int64_t{1} << 62, 64};
  const int v = r.u8() % 16;
  if (v < 14) return table[v];
  return static_cast<std::int64_t>(r.u64());
}

/// A double as a word: moderate, special or raw bits.
std::int64_t decode_double_word(Reader& r) {
  const int v = r.u8() % 8;
  if (v < 4) return detail::sbn_double_word(moderate(r));
  if (v < 7) return detail::sbn_double_word(special(r));
  return static_cast<std::int64_t>(r.u64());
}

/// Fills the words of an int64 tensor (in element order) of a record layout with `channels` and
/// `exact`: raw bytes, or structured counts / doubles / i128 halves, or exponents.
enum class Words { kRecords, kExponents };
void fill_words(Reader& r, const TensorView& v, Words kind, std::int64_t channels, bool exact) {
  if (!v.data || v.dtype != DType::kInt64) return;
  const int style = r.u8() % 4;  // 0: raw; otherwise structured
  const std::int64_t words = exact ? 1 + 4 * channels : 1 + 2 * channels;
  for_each_offset(v, [&](std::int64_t lin, std::int64_t o) {
    std::int64_t w;
    if (style == 0) {
      w = static_cast<std::int64_t>(r.u64());
    } else if (kind == Words::kExponents) {
      w = decode_exponent(r);
    } else {
      const std::int64_t k = words > 0 ? lin % words : 0;
      if (k == 0) {
        w = decode_count(r);
      } else if (!exact) {
        w = decode_double_word(r);
      } else {
        const int q = r.u8() % 8;  // i128 halves: small, or near +-2^127
        const bool hi = ((k - 1) % 2) == 1;
        if (q < 4) w = hi ? 0 : static_cast<std::int64_t>(r.u16()) - 32768;
        else if (q == 4) w = hi ? -1 : -static_cast<std::int64_t>(r.u16());
        else if (q == 5) w = hi ? kI64Max : -1;
        else if (q == 6) w = hi ? kI64Min : 0;
        else w = static_cast<std::int64_t>(r.u64());
        if (q < 4 && !hi && w < 0) w = -w;  // keep a small sum non-negative with a zero high word
      }
    }
    static_cast<std::int64_t*>(v.data)[o] = w;
  });
}

/// Float values of a data tensor / vector.
void fill_float(Reader& r, const TensorView& v, bool positive = false) {
  if (!v.data || !is_float_dtype(v.dtype)) return;
  const int style = r.u8() % 8;
  const double mean = style == 1 ? 1000.0 * (1 + r.u8() % 10) : 0.0;
  for_each_offset(v, [&](std::int64_t, std::int64_t o) {
    double x = moderate(r) + mean;
    if (positive) x = std::fabs(x) + 0.25;
    if (style == 7 && r.one_in(4)) x = special(r);
    store(v.data, v.dtype, o, x);
  });
}

void fill_counter(Reader& r, const TensorView& v) {
  if (!v.data || v.dtype != DType::kInt64) return;
  static const std::int64_t table[] = {0, 1, 5, -3, kI64Max - 1, kI64Max, std::int64_t{1} << 40};
  for_each_offset(v, [&](std::int64_t, std::int64_t o) {
    static_cast<std::int64_t*>(v.data)[o] = table[r.u8() % 7];
  });
}

// ---------------------------------------------------------------------------------------------
// A call on a list of tensors

enum class Fill { kNone, kFloat, kPositive, kRecords, kExponents, kCounter };

struct Slot {
  Spec spec;
  bool present = true;
  bool inout = false;  // read, then maybe updated (running statistics, the counter)
  Fill fill = Fill::kNone;
  Expect expect = Expect::kSuccess;  // from the slot's own defects
};

using Invoke = std::function<void(const std::vector<TensorView>&)>;

/// Bit-for-bit equality of two elements (NaN = NaN); counted as a compared value in the stats.
bool is_raw_equal(const TensorView& a, std::int64_t oa, const TensorView& b, std::int64_t ob) {
  ++stats().compared;
  const std::int64_t es = esize(a.dtype);
  const auto* pa = static_cast<const unsigned char*>(a.data) + oa * es;
  const auto* pb = static_cast<const unsigned char*>(b.data) + ob * es;
  if (std::memcmp(pa, pb, static_cast<std::size_t>(es)) == 0) return true;
  if (is_float_dtype(a.dtype)) return std::isnan(load(a.data, a.dtype, oa)) && std::isnan(load(b.data, b.dtype, ob));
  return false;
}

std::vector<std::int64_t> offsets_of(const TensorView& v) {
  std::vector<std::int64_t> out;
  for_each_offset(v, [&](std::int64_t, std::int64_t o) { out.push_back(o); });
  return out;
}

/// Places the slots, fills them, rarely puts one output inside another tensor's buffer, runs the
/// call with the memory checks, and compares a successful call with the same call on dense,
/// separate copies. Returns whether the call returned.
using Prefill = std::function<void(std::vector<Tensor4>&)>;
bool run_slots(Reader& r, std::vector<Slot>& slots, Expect e, const Invoke& invoke, std::int64_t channels, bool exact,
               const std::function<void(const std::vector<Tensor4>&)>& after = nullptr, const Prefill& prefill = nullptr) {
  for (const Slot& s : slots) {
    if (!s.present) continue;
    if (s.expect == Expect::kError) e = Expect::kError;
    if (s.expect == Expect::kEither) expect_maybe(&e);
  }
  Arena arena;
  std::vector<Tensor4> t(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    if (!s.present || s.spec.rank == 0) {
      t[i].name = s.spec.name;
      t[i].output = s.spec.output;
      continue;
    }
    t[i] = place(arena, s.spec, r.one_in(8) ? 1 : 0);
    switch (s.fill) {
      case Fill::kFloat: fill_float(r, t[i].view); break;
      case Fill::kPositive: fill_float(r, t[i].view, true); break;
      case Fill::kRecords: fill_words(r, t[i].view, Words::kRecords, channels, exact); break;
      case Fill::kExponents: fill_words(r, t[i].view, Words::kExponents, channels, exact); break;
      case Fill::kCounter: fill_counter(r, t[i].view); break;
      case Fill::kNone: break;
    }
    if (s.spec.output && !s.inout) poison(t[i].view);
  }
  if (prefill) prefill(t);
  // rarely: one output inside another tensor's buffer (exact alias or a partial overlap)
  bool aliased = false;
  if (r.one_in(6)) {
    const std::size_t o = r.u8() % slots.size(), h = r.u8() % slots.size();
    if (o != h && t[o].view.defined() && t[o].output && t[h].view.defined() && t[h].buffer >= 0 &&
        count(t[o].view) > 0 && count(t[h].view) > 0) {
      Tensor4 moved;
      bool ok = false;
      // The exact alias takes the host's layout in place of the output's own, so it would drop
      // the output's own defects (a negative or self-overlapping stride) and with them the reason
      // the call must raise: only an output without defects is aliased that way.
      if (r.one_in(2) && slots[o].expect == Expect::kSuccess && slots[o].spec.dtype == t[h].view.dtype &&
          slots[o].spec.rank == t[h].view.rank) {
        bool same = true;
        for (int d = 0; d < t[h].view.rank; ++d) same = same && slots[o].spec.sizes[d] == t[h].view.sizes[d];
        if (same) {
          moved = t[o];
          moved.buffer = t[h].buffer;
          moved.view = t[h].view;
          ok = true;
        }
      }
      if (!ok) {
        const std::int64_t region = static_cast<std::int64_t>(arena[t[h].buffer].region);
        const std::int64_t span = slots[o].spec.span_bytes();
        if (span <= region) ok = place_inside(arena, t[h], slots[o].spec, r.range(0, region - span), &moved);
      }
      if (ok) {
        if (!slots[o].inout) poison(moved.view);
        t[o] = moved;
        aliased = true;
        expect_maybe(&e);
        describe("output {} placed inside {}'s buffer", t[o].name, t[h].name);
      }
    }
  }
  std::vector<TensorView> views;
  for (std::size_t i = 0; i < t.size(); ++i) {
    views.push_back(t[i].view);
    describe("{}{}: {}", t[i].name, t[i].output ? " (out)" : "", describe_view(t[i].view));
  }
  describe("expect {}", expect_name(e));
  note_expect(e, false, aliased);

  // the dense twin, from the bytes the call will see
  Arena twin_arena;
  std::vector<Tensor4> twin(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    twin[i].name = t[i].name;
    twin[i].output = t[i].output;
    const TensorView& v = t[i].view;
    if (!v.defined() || v.rank < 1 || v.rank > kMaxRank) continue;
    bool ok = true;
    for (int d = 0; d < v.rank; ++d) ok = ok && v.sizes[d] >= 0 && v.sizes[d] <= 64;
    if (!ok) continue;
    std::int64_t strides[kMaxRank];
    std::int64_t st = 1;
    for (int d = v.rank - 1; d >= 0; --d) strides[d] = st, st *= v.sizes[d];  // canonical row-major
    twin[i] = make_tensor(twin_arena, t[i].name.c_str(), v.dtype, v.rank, v.sizes, strides, t[i].output);
    const auto src = offsets_of(v), dst = offsets_of(twin[i].view);
    const std::int64_t es = esize(v.dtype);
    for (std::size_t k = 0; k < src.size(); ++k)
      std::memcpy(static_cast<unsigned char*>(twin[i].view.data) + dst[k] * es,
                  static_cast<const unsigned char*>(v.data) + src[k] * es, static_cast<std::size_t>(es));
  }

  announce();
  std::vector<const Tensor4*> ptrs;
  for (const Tensor4& x : t) ptrs.push_back(&x);
  arena.arm();
  ErrorCode code{};
  std::string msg;
  const bool ok = run_call([&] { invoke(views); }, &code, &msg);
  check_memory(arena, ptrs, ok);
  check_outcome(ok, e, code, msg);
  if (!ok) return false;

  // the same call on dense separate copies must return the same outputs
  std::vector<TensorView> tv;
  for (const Tensor4& x : twin) tv.push_back(x.view);
  ErrorCode code2{};
  std::string msg2;
  const bool ok2 = run_call([&] { invoke(tv); }, &code2, &msg2);
  FUZZ_CHECK(ok2, "the call returned, but the same call on dense separate copies raised: {}", msg2);
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (!t[i].output || !t[i].view.defined() || !twin[i].view.defined()) continue;
    const auto a = offsets_of(t[i].view), b = offsets_of(twin[i].view);
    for (std::size_t k = 0; k < a.size() && k < b.size(); ++k)
      FUZZ_CHECK(is_raw_equal(t[i].view, a[k], twin[i].view, b[k]),
                 "output {} element {}: {} here, {} on dense separate copies (raw 0x{:016x} vs 0x{:016x})", t[i].name,
                 k, load(t[i].view.data, t[i].view.dtype, a[k]), load(twin[i].view.data, twin[i].view.dtype, b[k]),
                 t[i].view.dtype == DType::kInt64 || t[i].view.dtype == DType::kFloat64
                     ? static_cast<const std::uint64_t*>(t[i].view.data)[a[k]]
                     : 0,
                 twin[i].view.dtype == DType::kInt64 || twin[i].view.dtype == DType::kFloat64
                     ? static_cast<const std::uint64_t*>(twin[i].view.data)[b[k]]
                     : 0);
  }
  if (after) after(t);  // while the arena lives
  return true;
}

// ---------------------------------------------------------------------------------------------
// Single phases

void fuzz_words(Reader& r, bool record) {
  static const std::int64_t table[] = {0, 1, 3, 64, -1, kI64Min, kI64Max, kI64Max / 2, kI64Max / 2 + 1,
                                       kI64Max / 4, kI64Max / 4 + 1, (kI64Max - 1) / 4, (kI64Max - 1) / 4 + 1,
                                       (kI64Max - 1) / 2, (kI64Max - 1) / 2 + 1};
  const int v = r.u8() % 20;
  const std::int64_t c = v < 15 ? table[v] : static_cast<std::int64_t>(r.u64());
  Expect e = Expect::kSuccess;
  const SyncBnMode mode = record ? decode_mode(r, &e) : SyncBnMode::kDefault;
  const bool flag = r.one_in(2);  // backward (scale_words)
  const std::int64_t k = record ? (mode == SyncBnMode::kExact ? 4 : 2) : (flag ? 2 : 1);
  const std::int64_t base = record ? 1 : 0;
  if (c < 0 || c > (kI64Max - base) / k) expect_error(&e);
  describe("{}: channels {} mode {} backward {} expect {}", record ? "record_words" : "scale_words", c,
           mode_str(mode), flag, expect_name(e));
  announce();
  ErrorCode code{};
  std::string msg;
  std::int64_t got = 0;
  const bool ok = run_call(
      [&] { got = record ? sync_batch_norm_record_words(c, mode) : sync_batch_norm_scale_words(c, flag); }, &code,
      &msg);
  check_outcome(ok, e, code, msg);
  if (ok) FUZZ_CHECK(got == base + k * c, "returned {}; expected {} + {} * {}", got, base, k, c);
}

// ---------------------------------------------------------------------------------------------
// Garbage counts

/// Whether the gathered records' counts are garbage: one is negative, or their sum overflows.
bool counts_garbage(const TensorView& g) {
  std::int64_t n = 0;
  for (std::int64_t q = 0; q < g.sizes[0]; ++q) {
    const std::int64_t c = static_cast<const std::int64_t*>(g.data)[q * g.strides[0]];
    if (c < 0 || __builtin_add_overflow(n, c, &n)) return true;
  }
  return false;
}

bool all_separate(const std::vector<Tensor4>& t) {
  std::set<int> seen;
  for (const Tensor4& x : t)
    if (x.view.defined() && x.buffer >= 0 && !seen.insert(x.buffer).second) return false;
  return true;
}

/// finalize_stats returned on garbage counts: the statistics are NaN.
void check_garbage_counts(const std::vector<Tensor4>& t, std::int64_t C) {
  if (!all_separate(t) || !counts_garbage(t[0].view)) return;
  for (std::int64_t c = 0; c < C; ++c) {
    const double m = static_cast<const double*>(t[6].view.data)[c];
    const double s = static_cast<const double*>(t[7].view.data)[c];
    FUZZ_CHECK(std::isnan(m) && std::isnan(s), "garbage counts: channel {} has save_mean {} save_invstd {}; expected NaN",
               c, m, s);
  }
}

/// finalize_backward returned on garbage counts: the count in sums is NaN.
void check_garbage_backward_count(const std::vector<Tensor4>& t, std::int64_t C) {
  if (!all_separate(t) || !counts_garbage(t[0].view)) return;
  const double n = static_cast<const double*>(t[2].view.data)[2 * C];
  FUZZ_CHECK(std::isnan(n), "garbage counts: sums[2C] is {}; expected NaN", n);
}

// ---------------------------------------------------------------------------------------------
// Pipelines

/// An owning tensor: dense NCHW or NHWC (4-d), or a contiguous vector.
struct Owned {
  std::vector<std::int64_t> mem;  // 8-byte aligned
  TensorView v;
};
Owned make_owned(DType dt, int rank, const std::int64_t* sizes, bool nhwc = false) {
  Owned o;
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= sizes[d];
  o.mem.assign(static_cast<std::size_t>(std::max<std::int64_t>(n, 1) * esize(dt) / 8 + 1), 0);
  o.v.data = o.mem.data();
  o.v.dtype = dt;
  o.v.device = Device::cpu();
  o.v.rank = rank;
  for (int d = 0; d < rank; ++d) o.v.sizes[d] = sizes[d];
  std::int64_t st = 1;
  if (rank == 4 && nhwc) {
    o.v.strides[1] = 1;
    o.v.strides[3] = std::max<std::int64_t>(sizes[1], 1);
    o.v.strides[2] = o.v.strides[3] * std::max<std::int64_t>(sizes[3], 1);
    o.v.strides[0] = o.v.strides[2] * std::max<std::int64_t>(sizes[2], 1);
  } else {
    // canonical row-major strides (an empty [ranks, 0] buffer is contiguous only with these)
    for (int d = rank - 1; d >= 0; --d) o.v.strides[d] = st, st *= sizes[d];
  }
  return o;
}
Owned make_vec(DType dt, std::int64_t n) { return make_owned(dt, 1, &n); }
Owned copy_of(const Owned& a) {
  Owned b = a;
  if (a.v.data) b.v.data = b.mem.data();
  return b;
}
/// Rows [begin, end) of a 4-d tensor (a rank's share of the batch) or of a [rows, words] buffer.
TensorView rows(const TensorView& v, std::int64_t begin, std::int64_t end) {
  TensorView s = v;
  s.sizes[0] = end - begin;
  s.data = static_cast<unsigned char*>(v.data) + begin * v.strides[0] * esize(v.dtype);
  if (end - begin > 0) return s;
  s.data = v.data;  // an empty share still points into the buffer
  return s;
}
TensorView row_vec(const TensorView& g, std::int64_t q) {
  TensorView s = rows(g, q, q + 1);
  s.rank = 1;
  s.sizes[0] = g.sizes[1];
  s.strides[0] = 1;
  return s;
}

void expect_same(const char* what, const TensorView& a, const TensorView& b) {
  if (!a.defined() && !b.defined()) return;
  const auto oa = offsets_of(a), ob = offsets_of(b);
  FUZZ_CHECK(oa.size() == ob.size(), "{}: {} vs {} elements", what, oa.size(), ob.size());
  for (std::size_t k = 0; k < oa.size(); ++k)
    FUZZ_CHECK(is_raw_equal(a, oa[k], b, ob[k]), "{} element {}: phases {} vs one call {}", what, k,
               load(a.data, a.dtype, oa[k]), load(b.data, b.dtype, ob[k]));
}

template <class F>
void must_return(const char* what, F&& f) {
  ErrorCode code{};
  std::string msg;
  FUZZ_CHECK(run_call(std::forward<F>(f), &code, &msg), "{} raised on a valid pipeline: {}", what, msg);
}

void pipeline(Reader& r, bool backward) {
  std::int64_t sizes[4];
  decode_shape4(r, sizes);
  sizes[0] = r.u8() % 5;
  const std::int64_t N = sizes[0], C = sizes[1];
  const DType dt = static_cast<DType>(r.u8() % 4);
  SyncBnOptions opts;
  opts.mode = r.one_in(2) ? SyncBnMode::kExact : SyncBnMode::kDefault;
  const bool exact = opts.mode == SyncBnMode::kExact;
  const int m = r.u8() % 4;
  if (m == 1) opts.momentum = std::nullopt;
  if (m == 2) opts.momentum = 0.5;
  if (r.one_in(4)) opts.eps = 0.0;
  const std::int64_t R = exact ? 1 + r.u8() % 3 : 1;
  std::vector<std::int64_t> start(static_cast<std::size_t>(R + 1), 0);
  start[static_cast<std::size_t>(R)] = N;
  for (std::int64_t q = 1; q < R; ++q) start[static_cast<std::size_t>(q)] = r.range(0, N);
  std::sort(start.begin(), start.end());
  Context ctx;
  ctx.num_threads = 1 + r.u8() % 3;
  const bool nhwc = r.one_in(3);
  describe("pipeline {} sizes [{}, {}, {}, {}] dtype {} mode {} ranks {} nhwc {} threads {} momentum {} eps {}",
           backward ? "backward" : "forward", N, C, sizes[2], sizes[3], dtype_name(dt), mode_str(opts.mode), R, nhwc,
           ctx.num_threads, opts.momentum ? *opts.momentum : -1.0, opts.eps);
  for (std::int64_t q = 0; q <= R; ++q) describe("  split {}", start[static_cast<std::size_t>(q)]);

  Owned x = make_owned(dt, 4, sizes, nhwc);
  fill_float(r, x.v);
  const DType pdt = r.one_in(3) ? DType::kFloat64 : DType::kFloat32;
  const bool affine = !r.one_in(4), running = !r.one_in(4);
  Owned w = make_vec(pdt, C), b = make_vec(pdt, C), rm = make_vec(pdt, C), rv = make_vec(pdt, C),
        nbt = make_vec(DType::kInt64, 1);
  fill_float(r, w.v);
  fill_float(r, b.v);
  fill_float(r, rm.v);
  fill_float(r, rv.v, true);
  fill_counter(r, nbt.v);
  const bool has_nbt = r.one_in(2) || (running && !opts.momentum);
  SyncBnParams pa;
  Owned rm2 = copy_of(rm), rv2 = copy_of(rv), nbt2 = copy_of(nbt);
  if (affine) pa.weight = w.v, pa.bias = b.v;
  SyncBnParams pb = pa;
  if (running) pa.running_mean = rm.v, pa.running_var = rv.v, pb.running_mean = rm2.v, pb.running_var = rv2.v;
  if (has_nbt) pa.num_batches_tracked = nbt.v, pb.num_batches_tracked = nbt2.v;
  describe("affine {} running {} counter {}", affine, running, has_nbt);
  announce();

  // the one-call forward (also the saved statistics of the backward)
  Owned y = make_owned(dt, 4, sizes, nhwc), sm = make_vec(DType::kFloat64, C), si = make_vec(DType::kFloat64, C);
  must_return("sync_batch_norm_forward", [&] { sync_batch_norm_forward(x.v, pa, y.v, sm.v, si.v, nullptr, opts, ctx); });

  const std::int64_t sw = backward ? 2 * C : C;
  const std::int64_t W = sync_batch_norm_record_words(C, opts.mode);
  std::int64_t gs_sizes[2] = {R, sw}, g_sizes[2] = {R, W};
  Owned gs = make_owned(DType::kInt64, 2, gs_sizes), scales = make_vec(DType::kInt64, sw);
  Owned g = make_owned(DType::kInt64, 2, g_sizes);
  auto share = [&](const TensorView& v, std::int64_t q) {
    return rows(v, start[static_cast<std::size_t>(q)], start[static_cast<std::size_t>(q + 1)]);
  };

  if (!backward) {
    if (exact) {
      for (std::int64_t q = 0; q < R; ++q)
        must_return("local_scales", [&] { sync_batch_norm_local_scales(share(x.v, q), {}, {}, row_vec(gs.v, q), ctx); });
      must_return("merge_scales", [&] { sync_batch_norm_merge_scales(gs.v, scales.v, ctx); });
    }
    for (std::int64_t q = 0; q < R; ++q)
      must_return("local_stats", [&] {
        sync_batch_norm_local_stats(share(x.v, q), row_vec(g.v, q), opts.mode, exact ? scales.v : TensorView{}, ctx);
      });
    Owned sm2 = make_vec(DType::kFloat64, C), si2 = make_vec(DType::kFloat64, C), y2 = make_owned(dt, 4, sizes, nhwc);
    must_return("finalize_stats", [&] {
      sync_batch_norm_finalize_stats(g.v, pb, sm2.v, si2.v, opts, exact ? scales.v : TensorView{}, ctx);
    });
    for (std::int64_t q = 0; q < R; ++q)
      must_return("apply", [&] { sync_batch_norm_apply(share(x.v, q), pb, sm2.v, si2.v, share(y2.v, q), ctx); });
    expect_same("save_mean", sm2.v, sm.v);
    expect_same("save_invstd", si2.v, si.v);
    if (running) {
      expect_same("running_mean", rm2.v, rm.v);
      expect_same("running_var", rv2.v, rv.v);
    }
    if (has_nbt) expect_same("num_batches_tracked", nbt2.v, nbt.v);
    expect_same("y", y2.v, y.v);
    return;
  }

  Owned gy = make_owned(dt, 4, sizes, nhwc);
  fill_float(r, gy.v);
  const bool want_gw = affine && !r.one_in(4), want_gb = !r.one_in(4);
  Owned gx = make_owned(dt, 4, sizes, nhwc), gw = make_vec(pdt, C), gb = make_vec(pdt, C);
  describe("grad_weight {} grad_bias {}", want_gw, want_gb);
  const TensorView weight = affine ? w.v : TensorView{};
  must_return("sync_batch_norm_backward", [&] {
    sync_batch_norm_backward(gy.v, x.v, weight, sm.v, si.v, gx.v, want_gw ? gw.v : TensorView{},
                             want_gb ? gb.v : TensorView{}, nullptr, opts, ctx);
  });
  if (exact) {
    for (std::int64_t q = 0; q < R; ++q)
      must_return("local_scales", [&] {
        sync_batch_norm_local_scales(share(x.v, q), share(gy.v, q), sm.v, row_vec(gs.v, q), ctx);
      });
    must_return("merge_scales", [&] { sync_batch_norm_merge_scales(gs.v, scales.v, ctx); });
  }
  for (std::int64_t q = 0; q < R; ++q)
    must_return("local_backward", [&] {
      sync_batch_norm_local_backward(share(gy.v, q), share(x.v, q), sm.v, row_vec(g.v, q), opts.mode,
                                     exact ? scales.v : TensorView{}, ctx);
    });
  Owned gx2 = make_owned(dt, 4, sizes, nhwc), sums0 = make_vec(DType::kFloat64, 2 * C + 1);
  for (std::int64_t q = 0; q < R; ++q) {
    Owned sums = make_vec(DType::kFloat64, 2 * C + 1), gw2 = make_vec(pdt, C), gb2 = make_vec(pdt, C);
    must_return("finalize_backward", [&] {
      sync_batch_norm_finalize_backward(g.v, static_cast<int>(q), opts.mode, si.v, sums.v,
                                        want_gw ? gw2.v : TensorView{}, want_gb ? gb2.v : TensorView{},
                                        exact ? scales.v : TensorView{}, ctx);
    });
    if (q == 0) sums0 = copy_of(sums);
    else expect_same("sums (rank q vs rank 0)", sums.v, sums0.v);
    if (R == 1) {
      if (want_gw) expect_same("grad_weight", gw2.v, gw.v);
      if (want_gb) expect_same("grad_bias", gb2.v, gb.v);
    }
    must_return("backward_apply", [&] {
      sync_batch_norm_backward_apply(share(gy.v, q), share(x.v, q), weight, sm.v, si.v, sums.v, share(gx2.v, q), ctx);
    });
  }
  expect_same("grad_x", gx2.v, gx.v);
}

void fuzz_phase(Reader& r, int phase) {
  Expect e = Expect::kSuccess;
  std::int64_t sizes[4];
  decode_shape4(r, sizes);
  const std::int64_t C = sizes[1];
  Expect dt_expect = Expect::kSuccess;  // only the phases with data tensors read it
  const DType dt = decode_dtype(r, &dt_expect);
  if (phase != kMergeScales && phase != kFinalizeStats && phase != kFinalizeBackward) e = dt_expect;
  const int threads = r.u8() % 4;
  Context ctx;
  ctx.num_threads = threads == 3 ? 0 : threads + 1;
  describe("phase {} sizes [{}, {}, {}, {}] dtype {} threads {}", phase_name(phase), sizes[0], sizes[1], sizes[2],
           sizes[3], static_cast<int>(dt), ctx.num_threads);
  std::vector<Slot> s;
  Expect se = Expect::kSuccess;  // what the slot being decoded expects (counts only if present)
  auto add = [&](Spec spec, Fill fill, bool present = true, bool inout = false) {
    Slot sl;
    sl.expect = se;
    se = Expect::kSuccess;
    sl.spec = std::move(spec);
    sl.fill = fill;
    sl.present = present;  // the harness's choice; a decoded defect may still make it absent (rank 0)
    sl.inout = inout;
    s.push_back(std::move(sl));
    return s.size() - 1;
  };
  auto there = [&](std::size_t i) { return s[i].present && s[i].spec.rank > 0; };
  auto vec = [&](const char* name, std::int64_t n, VK kind, bool output, bool required, Fill fill,
                 DType pdt = DType::kFloat32) {
    return add(decode_vec(r, name, n, kind, output, required, &se, pdt), fill);
  };
  auto pdt = [&] { return r.one_in(3) ? DType::kFloat64 : DType::kFloat32; };
  auto affine = [&] {  // weight, bias: both (0-7), neither (8-13), weight only (14), bias only (15)
    const int aff = r.u8() % 16;
    const DType wdt = pdt();
    vec("weight", C, VK::kParam, false, false, Fill::kFloat, wdt);
    s.back().present = s.back().present && (aff < 8 || aff == 14);
    vec("bias", C, VK::kParam, false, false, Fill::kFloat, wdt);
    s.back().present = s.back().present && (aff < 8 || aff == 15);
    if (there(s.size() - 2) != there(s.size() - 1)) expect_error(&e);  // both or neither
  };
  std::int64_t ranks = 1 + r.u8() % 3;
  bool exact = false;
  switch (phase) {
    case kLocalScales: {
      const Spec x = decode_data(r, "x", sizes, dt, false, &se);
      const bool backward = r.one_in(2);
      add(x, Fill::kFloat);
      add(decode_data(r, "grad_y", sizes, dt, false, &se, &x), Fill::kFloat, backward);
      vec("save_mean", C, VK::kF64, false, backward, Fill::kFloat);
      if (!backward) s.back().present = false;
      vec("scales", backward ? 2 * C : C, VK::kI64, true, true, Fill::kNone);
      run_slots(r, s, e, [&](const std::vector<TensorView>& v) { sync_batch_norm_local_scales(v[0], v[1], v[2], v[3], ctx); },
                C, false);
      return;
    }
    case kMergeScales: {
      const std::int64_t W = r.u8() % 7;
      add(decode_gathered(r, ranks, W, &se, false), Fill::kExponents);
      vec("scales", W, VK::kI64, true, true, Fill::kNone);
      if (s.back().spec.rank == 2) s.back().present = true;
      const auto after = [&](const std::vector<Tensor4>& placed) {
        if (placed[0].buffer == placed[1].buffer) return;
        const TensorView& g = placed[0].view;
        const TensorView& sc = placed[1].view;
        for (std::int64_t w = 0; w < g.sizes[1]; ++w) {
          std::int64_t m = detail::kSbnZeroExponent;
          for (std::int64_t q = 0; q < g.sizes[0]; ++q) m = std::max(m, static_cast<const std::int64_t*>(g.data)[q * g.strides[0] + w]);
          FUZZ_CHECK(static_cast<const std::int64_t*>(sc.data)[w * sc.strides[0]] == m, "merged scale {} is {}; expected {}",
                     w, static_cast<const std::int64_t*>(sc.data)[w * sc.strides[0]], m);
        }
      };
      run_slots(r, s, e, [&](const std::vector<TensorView>& v) { sync_batch_norm_merge_scales(v[0], v[1], ctx); }, 0,
                false, after);
      return;
    }
    case kLocalStats:
    case kLocalBackward: {
      const bool bw = phase == kLocalBackward;
      const SyncBnMode mode = decode_mode(r, &e);
      exact = mode == SyncBnMode::kExact;
      const Spec x = decode_data(r, "x", sizes, dt, false, &se);
      add(x, Fill::kFloat);
      add(decode_data(r, "grad_y", sizes, dt, false, &se, &x), Fill::kFloat, bw);
      if (bw) vec("save_mean", C, VK::kF64, false, true, Fill::kFloat);
      else add(Spec{}, Fill::kNone, false);
      vec("record", detail::sbn_record_words(C, exact), VK::kI64, true, true, Fill::kNone);
      {
        Expect ignored = Expect::kSuccess;  // scales are not read in the default mode
        add(decode_vec(r, "scales", bw ? 2 * C : C, VK::kI64, false, exact, exact ? &se : &ignored), Fill::kExponents);
      }
      const bool consistent = r.one_in(2);
      const Prefill prefill = [&](std::vector<Tensor4>& t) {
        if (!consistent || !t[4].view.data) return;
        try {  // the exponents local_scales gives (the usual case), when it accepts the tensors
          sync_batch_norm_local_scales(t[0].view, bw ? t[1].view : TensorView{}, bw ? t[2].view : TensorView{},
                                       t[4].view, ctx);
        } catch (const Error&) {
        }
      };
      describe("mode {} consistent scales {}", static_cast<int>(mode), consistent);
      run_slots(
          r, s, e,
          [&](const std::vector<TensorView>& v) {
            if (bw) sync_batch_norm_local_backward(v[1], v[0], v[2], v[3], mode, v[4], ctx);
            else sync_batch_norm_local_stats(v[0], v[3], mode, v[4], ctx);
          },
          C, exact, nullptr, prefill);
      return;
    }
    case kFinalizeStats: {
      const SyncBnOptions opts = decode_options(r, &e);
      exact = opts.mode == SyncBnMode::kExact;
      describe("opts mode {} training {} eps {} momentum {}", static_cast<int>(opts.mode), opts.training, opts.eps,
               opts.momentum ? *opts.momentum : -1.0);
      add(decode_gathered(r, ranks, detail::sbn_record_words(C, exact), &se), Fill::kRecords);
      affine();
      const int run = r.u8() % 16;
      const DType rdt = pdt();
      const std::size_t rm = vec("running_mean", C, VK::kParam, true, false, Fill::kFloat, rdt);
      s[rm].inout = true;
      s[rm].present = s[rm].present && (run < 8 || run == 14);
      const std::size_t rv = vec("running_var", C, VK::kParam, true, false, Fill::kPositive, rdt);
      s[rv].inout = true;
      s[rv].present = s[rv].present && (run < 8 || run == 15);
      if (there(rm) != there(rv)) expect_error(&e);
      for (std::size_t i : {rm, rv})
        if (there(rm) && there(rv) && s[i].spec.rank == 1 && s[i].spec.strides[0] == 0 && s[i].spec.sizes[0] > 1)
          expect_error(&e);  // a running statistic overlapping itself
      const std::size_t nbt = vec("num_batches_tracked", 1, VK::kI64, true, false, Fill::kCounter);
      s[nbt].inout = true;
      s[nbt].present = s[nbt].present && r.one_in(2);
      if (opts.training && there(rm) && there(rv) && !opts.momentum && !there(nbt)) expect_error(&e);
      // the running statistics and the counter are outputs only when updated (training with both);
      // otherwise they are inputs that nothing reads
      const bool updated = opts.training && there(rm) && there(rv);
      for (std::size_t i : {rm, rv, nbt}) s[i].spec.output = s[i].inout = updated;
      vec("save_mean", C, VK::kF64, true, true, Fill::kNone);
      vec("save_invstd", C, VK::kF64, true, true, Fill::kNone);
      {
        Expect ignored = Expect::kSuccess;
        add(decode_vec(r, "scales", C, VK::kI64, false, exact, exact ? &se : &ignored), Fill::kExponents);
      }
      run_slots(
          r, s, e,
          [&](const std::vector<TensorView>& v) {
            SyncBnParams p;
            p.weight = v[1], p.bias = v[2], p.running_mean = v[3], p.running_var = v[4], p.num_batches_tracked = v[5];
            sync_batch_norm_finalize_stats(v[0], p, v[6], v[7], opts, v[8], ctx);
          },
          C, exact, [&](const std::vector<Tensor4>& placed) {
            if (kSbnGarbageCountsNaN) check_garbage_counts(placed, C);
          });
      return;
    }
    case kApply: {
      const Spec x = decode_data(r, "x", sizes, dt, false, &se);
      add(x, Fill::kFloat);
      affine();
      const bool run = r.one_in(4);
      const DType rdt = pdt();
      for (const char* name : {"running_mean", "running_var"}) {
        const std::size_t i = vec(name, C, VK::kParam, false, false, Fill::kFloat, rdt);
        s[i].present = s[i].present && run;
      }
      if (there(3) != there(4)) expect_error(&e);
      for (std::size_t i : {std::size_t{3}, std::size_t{4}})  // check_params: running statistics overlapping themselves
        if (there(3) && there(4) && s[i].spec.strides[0] == 0 && s[i].spec.sizes[0] > 1 && s[i].spec.rank == 1)
          expect_error(&e);
      vec("save_mean", C, VK::kF64, false, true, Fill::kFloat);
      vec("save_invstd", C, VK::kF64, false, true, Fill::kPositive);
      add(decode_data(r, "y", sizes, dt, true, &se, &x), Fill::kNone);
      run_slots(
          r, s, e,
          [&](const std::vector<TensorView>& v) {
            SyncBnParams p;
            p.weight = v[1], p.bias = v[2], p.running_mean = v[3], p.running_var = v[4];
            sync_batch_norm_apply(v[0], p, v[5], v[6], v[7], ctx);
          },
          C, false);
      return;
    }
    case kFinalizeBackward: {
      const SyncBnMode mode = decode_mode(r, &e);
      exact = mode == SyncBnMode::kExact;
      add(decode_gathered(r, ranks, detail::sbn_record_words(C, exact), &se), Fill::kRecords);
      int rank = static_cast<int>(r.u8() % ranks);
      if (r.one_in(32)) {
        static const int bad[] = {-1, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()};
        const int k = r.u8() % 4;
        rank = k < 3 ? bad[k] : static_cast<int>(ranks);
        expect_error(&e);
      }
      describe("mode {} rank {}", static_cast<int>(mode), rank);
      vec("save_invstd", C, VK::kF64, false, true, Fill::kPositive);
      vec("sums", 2 * C + 1, VK::kF64, true, true, Fill::kNone);
      const DType gdt = pdt();
      const std::size_t gw = vec("grad_weight", C, VK::kParam, true, false, Fill::kNone, gdt);
      s[gw].present = s[gw].present && !r.one_in(3);
      const std::size_t gb = vec("grad_bias", C, VK::kParam, true, false, Fill::kNone, gdt);
      s[gb].present = s[gb].present && !r.one_in(3);
      {
        Expect ignored = Expect::kSuccess;
        add(decode_vec(r, "scales", 2 * C, VK::kI64, false, exact, exact ? &se : &ignored), Fill::kExponents);
      }
      run_slots(
          r, s, e,
          [&](const std::vector<TensorView>& v) {
            sync_batch_norm_finalize_backward(v[0], rank, mode, v[1], v[2], v[3], v[4], v[5], ctx);
          },
          C, exact, [&](const std::vector<Tensor4>& placed) {
            if (kSbnGarbageCountsNaN) check_garbage_backward_count(placed, C);
          });
      return;
    }
    case kBackwardApply: {
      Expect ex = Expect::kSuccess;  // x is decoded first but added second: its defects are its own
      const Spec x = decode_data(r, "x", sizes, dt, false, &ex);
      add(decode_data(r, "grad_y", sizes, dt, false, &se, &x), Fill::kFloat);
      se = ex;
      add(x, Fill::kFloat);
      const std::size_t w = vec("weight", C, VK::kParam, false, false, Fill::kFloat, pdt());
      s[w].present = s[w].present && !r.one_in(3);
      vec("save_mean", C, VK::kF64, false, true, Fill::kFloat);
      vec("save_invstd", C, VK::kF64, false, true, Fill::kPositive);
      vec("sums", 2 * C + 1, VK::kF64, false, true, Fill::kFloat);
      add(decode_data(r, "grad_x", sizes, dt, true, &se, &x), Fill::kNone);
      run_slots(
          r, s, e,
          [&](const std::vector<TensorView>& v) {
            sync_batch_norm_backward_apply(v[0], v[1], v[2], v[3], v[4], v[5], v[6], ctx);
          },
          C, false);
      return;
    }
    case kPipelineForward:
    case kPipelineBackward: pipeline(r, phase == kPipelineBackward); return;
    default: break;
  }
  (void)exact;
}


}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  begin_run();
  Reader r(data, size);
  const int phase = r.u8() % kPhases;
  switch (phase) {
    case kRecordWords: fuzz_words(r, true); break;
    case kScaleWords: fuzz_words(r, false); break;
    default: fuzz_phase(r, phase); break;
  }
  return 0;
}
