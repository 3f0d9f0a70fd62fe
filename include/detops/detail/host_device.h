// Portability macros shared by host and device code: the one place that knows about __CUDACC__.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DETOPS_HOST_DEVICE __host__ __device__
#define DETOPS_DEVICE __device__
#else
#define DETOPS_HOST_DEVICE
#define DETOPS_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define DETOPS_ON_DEVICE 1
#else
#define DETOPS_ON_DEVICE 0
#endif

// Inlined into every caller, whatever instruction set the caller is compiled for: the shared loops
// that take a caller's loader (a lambda) must become part of the caller to be vectorized with it
// (the CPU's instruction-set variants, src/internal/cpu_isa.h, cannot inline their lambdas into a
// baseline function otherwise).
#if defined(__CUDACC__)
#define DETOPS_FORCEINLINE __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define DETOPS_FORCEINLINE inline __attribute__((always_inline))
#else
#define DETOPS_FORCEINLINE inline
#endif
