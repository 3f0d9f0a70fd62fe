// Half and BFloat16 conversions: exhaustive round trips, and round-to-nearest-even against an
// independent reference (the compiler's _Float16, or exact double arithmetic for bfloat16),
// including the correctly rounded double -> 16-bit path the truncated backward relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "detops/dtype.h"

namespace detops {
namespace {

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
