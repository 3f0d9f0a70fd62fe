// CPU instruction-set variants of a kernel file, chosen at run time (Context::cpu_isa).
//
// A kernel file (src/cpu/<op>_cpu_kernels.inc: templates and functions, no #includes) is compiled
// once per variant by src/cpu/cpu_variants.inc, each time inside its own namespace, the wider
// variants between DETOPS_ISA_BEGIN(...) and DETOPS_ISA_END. Those pragmas give every function
// *declared* in the region the target's instruction set (lambdas included), so:
//   * the variant's own code (internal linkage: keep it in an unnamed namespace) is vectorized
//     for the set;
//   * functions and templates declared before the region (the standard library, detail::
//     math, common.h, the kernel file's interface header) keep the build's baseline set, wherever
//     they are instantiated: a COMDAT copy the linker may pick for another translation unit never
//     holds AVX instructions (the trap of compiling a whole file twice with -mavx2). The ctest
//     detops_isa_symbols (scripts/check_isa_symbols.py) checks it on the object files: no symbol
//     with external or COMDAT linkage may use ymm/zmm registers;
//   * baseline helpers called from a variant are inlined into it (a subset target inlines into a
//     wider one), so the shared math of detops/detail/ is vectorized there too.
// The build has -ffp-contract=off, so no a * b + c is fused behind the code's back: a variant
// evaluates the same IEEE operations in the same order as the baseline, so it gives the same bits
// (only the vector width changes); the tests *.InstructionSetVariantsGiveTheSameBits compare every
// variant with the baseline bit for bit. The sets include FMA only for the math's explicit fma_()
// calls (grid_sample's, which PyTorch's CPU kernel fuses): one correctly rounded operation as
// libm's fma computes it, but an instruction instead of a call, and one that vectorizes.
#pragma once

#include "detops/context.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(DETOPS_NO_ISA_VARIANTS)
#define DETOPS_X86_ISA_VARIANTS 1
#else
#define DETOPS_X86_ISA_VARIANTS 0
#endif

#define DETOPS_ISA_PRAGMA(x) _Pragma(#x)

#if DETOPS_X86_ISA_VARIANTS && defined(__clang__)
#define DETOPS_ISA_BEGIN(targets) \
  DETOPS_ISA_PRAGMA(clang attribute push(__attribute__((target(targets))), apply_to = function))
#define DETOPS_ISA_END DETOPS_ISA_PRAGMA(clang attribute pop)
#elif DETOPS_X86_ISA_VARIANTS
#define DETOPS_ISA_BEGIN(targets) DETOPS_ISA_PRAGMA(GCC push_options) DETOPS_ISA_PRAGMA(GCC target(targets))
#define DETOPS_ISA_END DETOPS_ISA_PRAGMA(GCC pop_options)
#endif

// The instruction sets of the variants (FMA for explicit fma_() calls only: see above).
#define DETOPS_ISA_AVX2_TARGETS "avx2,fma"
#define DETOPS_ISA_AVX512_TARGETS "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma"

namespace detops {
namespace internal {

/// A table of a kernel file's entry points per variant: kernels_for(ctx, baseline, avx2, avx512)
/// returns the one Context::resolved_cpu_isa() selects.
template <class Table>
const Table& kernels_for(const Context& ctx, const Table& baseline, const Table& avx2, const Table& avx512) {
  switch (ctx.resolved_cpu_isa()) {
    case CpuIsa::kAvx512: return avx512;
    case CpuIsa::kAvx2: return avx2;
    default: return baseline;
  }
}

}  // namespace internal
}  // namespace detops
