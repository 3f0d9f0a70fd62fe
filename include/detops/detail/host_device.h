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

#define DETOPS_FORCEINLINE inline
