// The gpu suites' skip: each test skips, saying why, where detops has no CUDA backend or sees no
// device (the runtime's own error when it failed, e.g. a driver older than the toolkit), or fails
// where a device is required.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "detops/context.h"

/// With DETOPS_REQUIRE_GPU=1 in the environment (the gpu test presets set it), a missing device
/// is a failure, not a skip: on the GPU machine "every test skipped" means a broken setup (a
/// driver older than the toolkit reads as "no device").
namespace detops::test {
inline bool gpu_required() {
  const char* v = std::getenv("DETOPS_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace detops::test

#define DETOPS_REQUIRE_GPU()                                                                             \
  do {                                                                                                   \
    if (::detops::cuda_device_count() == 0) {                                                            \
      if (::detops::test::gpu_required())                                                                \
        FAIL() << "no CUDA device: " << ::detops::cuda_unavailable_reason() << " (DETOPS_REQUIRE_GPU=1)"; \
      GTEST_SKIP() << "no CUDA device: " << ::detops::cuda_unavailable_reason() << "; GPU test skipped";  \
    }                                                                                                    \
  } while (0)
