// The validated call (internal::MsdaCall) the attention backends get for a test's tensors: for the
// tests that run a backend's steps directly (the emulated CUDA sequence, the CPU's exact paths).
#pragma once

#include <cstdint>

#include "internal/ms_deform_attn_backend.h"
#include "ms_deform_attn_test_util.h"

namespace detops {
namespace test {

/// The call for the tensors of `pr` (levels read on the host), no outputs or gradients set.
inline internal::MsdaCall msda_call(const MsdaTensors& t, const ::detops::ref::MsdaProblemRef& pr,
                                    const char* op = "test") {
  internal::MsdaCall c{};
  c.op = op;
  c.value = t.value.view;
  c.spatial_shapes = t.shapes.view;
  c.level_start_index = t.starts.view;
  c.sampling_locations = t.loc.view;
  c.attention_weights = t.attn.view;
  c.shape = {t.B, t.S, t.M, t.D, t.Q, t.L, t.P};
  for (std::int64_t l = 0; l < t.L; ++l) c.levels.push_back({pr.shapes[2 * l], pr.shapes[2 * l + 1], pr.start(l)});
  return c;
}

}  // namespace test
}  // namespace detops
