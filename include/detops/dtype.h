// Element types of detops tensors: DType, the 16-bit storage types Half and BFloat16, and the
// accumulation-type trait. Conversions round to nearest even and are bit-identical on host and
// device for every value that is not a NaN (the host path is portable, branch-free bit
// manipulation, which assumes the default round-to-nearest mode like all host arithmetic of
// detops; the device path the CUDA intrinsics, which implement the same IEEE rounding), so CPU and
// CUDA results agree to the last bit where no NaN is involved. A NaN converts to a NaN on both,
// not necessarily to the same bits: the host keeps the sign and the top payload bits (half
// 0x7e00 | payload, bfloat16 (x >> 16) | 0x40); the device intrinsics and GPU arithmetic need not
// (bfloat16's software conversion below sm_80 returns 0x7fff for any NaN, and the PTX conversions
// and arithmetic may return a canonical NaN). Compare NaN results across backends as a class,
// not by their bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "detops/detail/host_device.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace detops {

/// Element type of a tensor. kInt32 is only used for index outputs (max-pool argmax); kInt64 for
/// counters and SyncBatchNorm's statistics records (int64 words exchanged between ranks).
enum class DType : std::uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64 };

/// Size of one element in bytes.
constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    default: return 4;
  }
}

/// Name as used in error messages: "float32", "float64", "float16", "bfloat16", "int32", "int64".
constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "unknown";
}

namespace detail {
DETOPS_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if DETOPS_ON_DEVICE
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
DETOPS_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if DETOPS_ON_DEVICE
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE binary16 on the host, round to nearest even, with overflow to inf, subnormals, and NaN kept
// (quiet, with its sign and top 10 payload bits; the device's __float2half_rn need not keep them).
// Branch-free, so that the CPU loops storing half vectorize: every case is computed and one is
// selected.
//   * normal results: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest
//     even by adding 0xfff plus the kept last bit before the shift (a carry may step into the
//     exponent, which is the correct result);
//   * subnormal results (|f| < 2^-14; other inputs replaced by 0 first, so that no NaN or large
//     value enters the float addition): 0.5f + |f| lies in [0.5, 1), where float's spacing is
//     2^-24, half's subnormal spacing, so the addition itself rounds |f| to a multiple of 2^-24,
//     and the bits above those of 0.5f count the multiples (2^-14 - tiny rounds up to 0x400, the
//     smallest normal half, which is the correct result). That addition rounds in the current
//     rounding mode, which must be the default round-to-nearest, as for all of detops' host
//     arithmetic (a mode-independent formulation, by truncation and the fraction, kept GCC from
//     vectorizing the loops storing half from double).
DETOPS_HOST_DEVICE inline std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  const std::uint32_t normal = (absx - 0x38000000u + 0xfffu + ((absx >> 13) & 1u)) >> 13;  // unsigned: wraps harmlessly
  const std::uint32_t subnormal = float_bits(bits_float(absx < 0x38800000u ? absx : 0u) + 0.5f) - 0x3f000000u;
  const std::uint32_t nan = 0x7e00u | ((absx >> 13) & 0x3ffu);
  std::uint32_t h = absx < 0x38800000u ? subnormal : normal;
  h = absx >= 0x477ff000u ? 0x7c00u : h;  // rounds to >= 65520: inf (and inf itself)
  h = absx > 0x7f800000u ? nan : h;
  return static_cast<std::uint16_t>(sign | h);
}

// Branch-free binary16 -> binary32 (vectorizes in the CPU loops): a normal or special half is
// the float with the exponent rebased (2^-112 scaling is exact); a subnormal half m * 2^-24 is
// built as (2^-1 * (1 + m * 2^-23)) - 0.5, also exact.
DETOPS_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;  // drops the sign
  const float normalized = bits_float((two_w >> 4) + (0xe0u << 23)) * bits_float(0x7800000u);  // * 2^-112
  const float denormalized = bits_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const std::uint32_t magnitude = two_w < (1u << 27) ? float_bits(denormalized) : float_bits(normalized);
  return bits_float(sign | magnitude);
}

// bfloat16 is the top half of a float32: round to nearest even; on the host a NaN is kept quiet
// with its sign and payload (the device's __float2bfloat16_rn need not: below sm_80 it returns
// 0x7fff).
DETOPS_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}
DETOPS_HOST_DEVICE inline float bfloat16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}
}  // namespace detail

/// IEEE-754 binary16 storage type (layout-compatible with CUDA's __half).
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  DETOPS_HOST_DEVICE explicit Half(float f) {
#if DETOPS_ON_DEVICE
    bits = __half_as_ushort(__float2half_rn(f));
#else
    bits = detail::float_to_half_bits(f);
#endif
  }
  DETOPS_HOST_DEVICE explicit operator float() const {
#if DETOPS_ON_DEVICE
    return __half2float(__ushort_as_half(bits));
#else
    return detail::half_bits_to_float(bits);
#endif
  }
  DETOPS_HOST_DEVICE static Half from_bits(std::uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16 storage type (layout-compatible with CUDA's __nv_bfloat16).
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  DETOPS_HOST_DEVICE explicit BFloat16(float f) {
#if DETOPS_ON_DEVICE
    bits = __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    bits = detail::float_to_bfloat16_bits(f);
#endif
  }
  DETOPS_HOST_DEVICE explicit operator float() const {
#if DETOPS_ON_DEVICE
    return __bfloat162float(__ushort_as_bfloat16(bits));
#else
    return detail::bfloat16_bits_to_float(bits);
#endif
  }
  DETOPS_HOST_DEVICE static BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

/// Accumulation type: float for float/half/bfloat16, double for double.
template <class T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <class T> using acc_t = typename AccType<T>::type;

/// C++ type -> DType.
template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<std::int64_t> { static constexpr DType value = DType::kInt64; };

/// Load a stored element as its accumulation type, and store an accumulator back (RNE).
template <class T> DETOPS_HOST_DEVICE inline acc_t<T> to_acc(T v) { return static_cast<acc_t<T>>(v); }
template <class T> DETOPS_HOST_DEVICE inline T from_acc(acc_t<T> v) { return T(v); }
namespace detail {
// double -> float rounded to odd: truncate, then set the last bit if anything was dropped. A
// second rounding of the result to a format with at most 22 significand bits (half, bfloat16) is
// then the correctly rounded double -> half/bfloat16 conversion (no double-rounding error).
// Branch-free (selects) so that loops storing half or bfloat16 from double vectorize.
DETOPS_HOST_DEVICE inline float double_to_float_round_odd(double d) {
  const float f = static_cast<float>(d);
  const std::uint32_t u = float_bits(f);
  const double af = f < 0 ? -static_cast<double>(f) : static_cast<double>(f);
  const double ad = d < 0 ? -d : d;
  // rounded away from zero: step back towards zero (inf -> FLT_MAX); NaN is never "away"
  const std::uint32_t towards_zero = u - (af > ad ? 1u : 0u);
  return bits_float(static_cast<double>(f) != d ? towards_zero | 1u : u);  // inexact (or NaN): odd
}
}  // namespace detail

/// Correctly rounded (nearest even) conversion from double to any storage type.
template <class T> DETOPS_HOST_DEVICE inline T from_double(double v) {
  if constexpr (sizeof(T) == 2) return T(detail::double_to_float_round_odd(v));
  else return static_cast<T>(v);
}

}  // namespace detops
