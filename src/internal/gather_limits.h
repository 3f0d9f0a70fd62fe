// The gather engine's limits on one chunk (include/detops/detail/gather_backward.h): 32-bit keys
// and record indices. Checked where an op sizes its exact-mode chunks, on every backend, before
// anything is written. A chunk never splits a plane, so a plane (an image's map, an attention
// (batch, head) plane) past these limits cannot run the exact mode.
#pragma once

#include <cstdint>
#include <limits>

#include "detops/detail/gather_backward.h"
#include "internal/common.h"

namespace detops {
namespace internal {

/// A chunk of `records` records over `positions` destinations fits the engine's types: positions
/// (the sentinel key) below 2^32, records at most 2^31 - 1.
inline void gather_check_chunk(const char* op, std::int64_t records, std::int64_t positions) {
  constexpr std::int64_t kMaxPositions = std::numeric_limits<detail::GatherKey>::max();
  constexpr std::int64_t kMaxRecords = std::numeric_limits<detail::GatherIndex>::max();
  if (positions > kMaxPositions)
    fail(ErrorCode::kOutOfMemory, "{}: the exact mode needs {} destinations in one chunk here; at most 2^32 - 1 are "
         "supported (backward_mode atomic has no such limit)", op, positions);
  if (records > kMaxRecords)
    fail(ErrorCode::kOutOfMemory, "{}: the exact mode needs {} records in one chunk here; at most 2^31 - 1 are "
         "supported (backward_mode atomic has no such limit)", op, records);
}

}  // namespace internal
}  // namespace detops
