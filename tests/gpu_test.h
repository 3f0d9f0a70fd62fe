// The gpu suites' skip: each test skips, saying why, where detops has no CUDA backend or sees no
// device (the runtime's own error when it failed, e.g. a driver older than the toolkit).
#pragma once

#include <gtest/gtest.h>

#include "detops/context.h"

#define DETOPS_REQUIRE_GPU()                                                                          \
  do {                                                                                                \
    if (::detops::cuda_device_count() == 0)                                                           \
      GTEST_SKIP() << "no CUDA device: " << ::detops::cuda_unavailable_reason() << "; GPU test skipped"; \
  } while (0)
