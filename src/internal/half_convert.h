// Block conversions between float16 and float32 for the CPU loops: the F16C instructions where
// the CPU has them and the context allows AVX2 (Context::cpu_isa), else none (the loops keep the
// portable, branch-free conversions of detops/dtype.h). F16C rounds to nearest even and turns a
// NaN into the quiet NaN with the same top payload bits, exactly as the portable code does, so
// the choice never changes a bit (dtype_test compares them over every half and floats of half's
// range, FrozenBatchNorm2d's test over its outputs). Neither depends on DAZ/FTZ: a float
// denormal rounds to a signed zero half either way, half subnormals are exact normal floats.
#pragma once

#include <cstdint>

#include "detops/context.h"
#include "detops/dtype.h"

namespace detops {
namespace internal {

struct HalfConvert {
  void (*to_float)(const Half* src, float* dst, std::int64_t n);
  void (*to_half)(const float* src, Half* dst, std::int64_t n);
};

/// The F16C converters when the CPU has F16C and ctx resolves to AVX2 or wider; nullptr otherwise.
const HalfConvert* half_convert_f16c(const Context& ctx);

}  // namespace internal
}  // namespace detops
