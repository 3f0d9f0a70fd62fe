// Half and BFloat16 conversions: exhaustive round trips, and round-to-nearest-even against an
// independent reference (the compiler's _Float16, or exact double arithmetic for bfloat16),
// including the correctly rounded double -> 16-bit path the truncated backward relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "detops/dtype.h"
#include "internal/half_convert.h"

namespace detops {
namespace {

// The straightforward branchy float -> half conversion (the library's until the branch-free one
// replaced it), kept as the reference: the library's must give the same bits for every float.
std::uint16_t reference_float_to_half_bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or NaN (NaN quiet, top 10 payload bits)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0u));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (absx < 0x38800000u) {                                                   // subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);           // < 2^-25 rounds to 0
    const std::uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (absx >> 23);
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (absx - 0x38000000u) >> 13;
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

// Every float whose conversion can be anything but 0, inf or NaN (|f| in [2^-26, 2^16]: 42
// exponents, every significand), every NaN and inf, and the rest (and the negative floats,
// which differ only in the sign bit) in a stride coprime with the significand bits.
TEST(DTypeHalf, EveryFloatConvertsLikeTheReference) {
  std::uint64_t mismatches = 0, checked = 0;
  std::uint32_t first = 0;
  auto check = [&](std::uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    const bool bad = detail::float_to_half_bits(f) != reference_float_to_half_bits(f);
    if (bad && !mismatches) first = b;
    mismatches += bad;
    ++checked;
  };
  for (std::uint32_t b = 0x32800000u; b < 0x47800000u; ++b) check(b);    // exhaustive: 2^-26 .. 2^16
  for (std::uint32_t b = 0x7f800000u; b <= 0x7fffffffu; ++b) check(b);   // inf and every NaN
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 251) check(static_cast<std::uint32_t>(b));
  EXPECT_EQ(mismatches, 0u) << "of " << checked << "; first mismatching float bits 0x" << std::hex << first;
}

// The branchy double -> float round-to-odd, as reference for the branch-free one.
float reference_round_odd(double d) {
  const float f = static_cast<float>(d);
  if (!(static_cast<double>(f) != d)) return f;
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) u -= 1u;
  u |= 1u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

TEST(DTypeHalf, RoundToOddMatchesTheReference) {
  std::mt19937_64 rng(11);
  auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; };
  for (int i = 0; i < 4000000; ++i) {
    std::uint64_t b = rng();
    if (i % 2) b = (b & 0x800fffffffffffffull) | ((std::uint64_t{0x340} + b % 0x180) << 52);  // float's range
    if (i % 5 == 0) b &= ~std::uint64_t{0x1fffffff};  // exactly representable in float
    double d;
    std::memcpy(&d, &b, 8);
    ASSERT_TRUE(same(detail::double_to_float_round_odd(d), reference_round_odd(d))) << std::hexfloat << d;
  }
  for (double d : {0.0, -0.0, 1e300, -1e300, 3.4028235677973366e38, 3.4028235e38, 1e-320,
                   std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min()})
    EXPECT_TRUE(same(detail::double_to_float_round_odd(d), reference_round_odd(d))) << d;
}

// The F16C block conversions (internal/half_convert.h) against the portable ones: every half to
// float; to half, every third float of the range of EveryFloatConvertsLikeTheReference, every
// seventh NaN, the rest in a stride, both signs; block lengths with tails.
TEST(DTypeHalf, F16cConversionsEqualThePortableOnes) {
  const internal::HalfConvert* cv = internal::half_convert_f16c(Context{});
  if (!cv) GTEST_SKIP() << "no F16C (or no AVX2) here";
  std::vector<Half> h(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) h[b] = Half::from_bits(static_cast<std::uint16_t>(b));
  std::vector<float> f(65536);
  cv->to_float(h.data(), f.data(), 65533);  // a tail of 5
  cv->to_float(h.data() + 65533, f.data() + 65533, 3);
  std::uint32_t bad = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float want = static_cast<float>(h[b]);
    bad += std::memcmp(&want, &f[b], 4) != 0;
  }
  EXPECT_EQ(bad, 0u) << "half -> float";
  std::uint64_t mismatches = 0;
  std::uint32_t first = 0;
  constexpr std::size_t kBlock = 4093;  // not a multiple of 8
  std::vector<float> src;
  std::vector<Half> dst(kBlock);
  auto flush = [&] {
    cv->to_half(src.data(), dst.data(), static_cast<std::int64_t>(src.size()));
    for (std::size_t i = 0; i < src.size(); ++i) {
      if (dst[i].bits != Half(src[i]).bits) {
        if (!mismatches) std::memcpy(&first, &src[i], 4);
        ++mismatches;
      }
    }
    src.clear();
  };
  auto check = [&](std::uint32_t b) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      float v;
      const std::uint32_t u = b | sign;
      std::memcpy(&v, &u, 4);
      src.push_back(v);
      if (src.size() == kBlock) flush();
    }
  };
  for (std::uint32_t b = 0x32800000u; b < 0x47800000u; b += 3) check(b);  // 3: every residue of the dropped bits
  for (std::uint32_t b = 0x7f800000u; b <= 0x7fffffffu; b += 7) check(b);
  for (std::uint64_t b = 0; b < 0x80000000u; b += 509) check(static_cast<std::uint32_t>(b));
  flush();
  EXPECT_EQ(mismatches, 0u) << "float -> half; first float bits 0x" << std::hex << first;
}

TEST(DTypeHalf, EveryBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const Half h = Half::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(Half(f)))) << b;
      continue;
    }
    ASSERT_EQ(Half(f).bits, b) << "bits " << b << " value " << f;
  }
}

TEST(DTypeBFloat16, EveryBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = static_cast<float>(BFloat16::from_bits(static_cast<std::uint16_t>(b)));
    if (std::isnan(f)) continue;
    ASSERT_EQ(BFloat16(f).bits, b) << b;
  }
}

#if defined(__FLT16_MAX__)
TEST(DTypeHalf, RoundsLikeTheCompilersFloat16) {
  std::mt19937 rng(42);
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t u = rng();
    if (i % 3 == 0) u = (u & 0x807fffffu) | ((100u + (u % 60u)) << 23);  // concentrate on half's range
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    const _Float16 r = static_cast<_Float16>(f);
    std::uint16_t rb;
    std::memcpy(&rb, &r, 2);
    ASSERT_EQ(Half(f).bits, rb) << f;
  }
}

TEST(DTypeHalf, FromDoubleIsCorrectlyRounded) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-70000.0, 70000.0);
  for (int i = 0; i < 1000000; ++i) {
    double d = u(rng) * std::pow(2.0, -static_cast<int>(rng() % 30));
    const _Float16 r = static_cast<_Float16>(d);
    std::uint16_t rb;
    std::memcpy(&rb, &r, 2);
    ASSERT_EQ(from_double<Half>(d).bits, rb) << d;
  }
  // A double just above a half tie: float rounding first would land on the tie and round to even.
  const double just_above_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(static_cast<float>(from_double<Half>(just_above_tie)), 1.0f + std::ldexp(1.0f, -10));
}
#endif

float bf16_reference(float f) {
  // nearest of the two bfloat16 neighbours, ties to even, computed in double
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double dl = std::abs(static_cast<double>(f) - flo), dh = std::abs(static_cast<double>(fhi) - f);
  if (dl < dh) return flo;
  if (dh < dl) return fhi;
  return ((lo >> 16) & 1u) ? fhi : flo;
}

TEST(DTypeBFloat16, RoundsToNearestEven) {
  std::mt19937 rng(3);
  for (int i = 0; i < 2000000; ++i) {
    const std::uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f) || std::isinf(f)) continue;
    const float expect = bf16_reference(f);
    const float got = static_cast<float>(BFloat16(f));
    ASSERT_TRUE(got == expect || (std::isinf(got) && std::abs(expect) > 3.38e38f)) << f;
  }
}

TEST(DTypeHalf, OverflowSubnormalsAndSpecials) {
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(65520.0f))));
  EXPECT_EQ(static_cast<float>(Half(65519.0f)), 65504.0f);
  EXPECT_EQ(static_cast<float>(Half(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(static_cast<float>(Half(std::ldexp(1.0f, -26))), 0.0f);
  EXPECT_TRUE(std::signbit(static_cast<float>(Half(-0.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(static_cast<float>(from_double<Half>(1e300))));
  EXPECT_EQ(static_cast<float>(from_double<BFloat16>(1e6)), 999424.0f);
}

TEST(DTypeNames, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
}

}  // namespace
}  // namespace detops
