// F16C block conversions (see internal/half_convert.h). The converting functions have internal
// linkage and their own target attribute: no exported symbol carries AVX code (the ISA symbol
// check), and nothing runs them on a CPU without F16C.
#include "internal/half_convert.h"

#include "internal/cpu_isa.h"

#if DETOPS_X86_ISA_VARIANTS
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace detops {
namespace internal {

#if DETOPS_X86_ISA_VARIANTS
namespace {

__attribute__((target("avx2,f16c"))) void to_float_f16c(const Half* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if (i < n) {  // the tail through a padded block (the same instruction for every element)
    alignas(16) Half in[8] = {};
    alignas(32) float out[8];
    for (std::int64_t j = i; j < n; ++j) in[j - i] = src[j];
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(in))));
    for (std::int64_t j = i; j < n; ++j) dst[j] = out[j - i];
  }
}

__attribute__((target("avx2,f16c"))) void to_half_f16c(const float* src, Half* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    alignas(32) float in[8] = {};
    alignas(16) Half out[8];
    for (std::int64_t j = i; j < n; ++j) in[j - i] = src[j];
    _mm_store_si128(reinterpret_cast<__m128i*>(out),
                    _mm256_cvtps_ph(_mm256_load_ps(in), _MM_FROUND_TO_NEAREST_INT));
    for (std::int64_t j = i; j < n; ++j) dst[j] = out[j - i];
  }
}

bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

constexpr HalfConvert kF16c{&to_float_f16c, &to_half_f16c};

}  // namespace

const HalfConvert* half_convert_f16c(const Context& ctx) {
  static const bool has = cpu_has_f16c();  // a property of the machine, read once
  // AVX2 resolved: the CPU has it and the OS saves the ymm registers (F16C's are VEX-encoded)
  return has && static_cast<int>(ctx.resolved_cpu_isa()) >= static_cast<int>(CpuIsa::kAvx2) ? &kF16c : nullptr;
}
#else
const HalfConvert* half_convert_f16c(const Context&) { return nullptr; }
#endif

}  // namespace internal
}  // namespace detops
