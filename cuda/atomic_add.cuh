// Floating-point atomicAdd in every gradient dtype, for the atomic backward modes of every op
// (RoIAlign, RoIAlignRotated, grid_sample, ms_deform_attn): the value is rounded to the element's
// dtype and each add rounds in it, as the anchors' kernels do.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "detops/dtype.h"

namespace detops {
namespace internal {

__device__ inline void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ inline void atomic_add(Half* p, float v) {
  atomicAdd(reinterpret_cast<__half*>(p), __float2half_rn(v));
}
// The toolkit's bfloat16 atomicAdd on every architecture: native (atom.add.noftz.bf16) from sm_90,
// a 16-bit compare-and-swap loop below it (cuda_bf16.hpp). One rounding rule on every GPU (v is
// rounded to bfloat16, then each add rounds), and no access outside the element's own 2 bytes.
__device__ inline void atomic_add(BFloat16* p, float v) {
  atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), __float2bfloat16_rn(v));
}

}  // namespace internal
}  // namespace detops
