// Helpers shared by the SyncBatchNorm tests (CUDA, emulated kernels): readable parameters, the
// layouts each test runs on and the poisoned buffers that hold them.
#pragma once

#include <cstdint>
#include <ostream>

#include "detops/sync_batch_norm.h"
#include "test_util.h"

namespace detops {

// Readable parameters in test names and failure messages.
[[maybe_unused]] static void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
[[maybe_unused]] static void PrintTo(SyncBnMode m, std::ostream* os) {
  *os << (m == SyncBnMode::kExact ? "exact" : "default");
}

// A namespace of its own: the test binaries link several ops' tests, each with its own Lay.
namespace test::sync_bn {

using test::Shape;

/// Layouts: dense NCHW, dense NHWC, an NCHW W-slice of a wider buffer (rows not contiguous with
/// each other: the kernels' generic position path), and a channels-last W-slice (channels
/// contiguous, positions not uniformly spaced: the channels-last generic path).
enum class Lay { kNchw, kNhwc, kStrided, kNhwcStrided };
inline const char* lay_name(Lay l) {
  switch (l) {
    case Lay::kNchw: return "nchw";
    case Lay::kNhwc: return "nhwc";
    case Lay::kStrided: return "strided";
    case Lay::kNhwcStrided: return "nhwc_strided";
  }
  return "?";
}
inline void PrintTo(Lay l, std::ostream* os) { *os << lay_name(l); }

/// A [N, C, H, W] view in layout `lay` at the start of a 1-d storage poisoned with 0xCD (the
/// strided layouts: W-slices of a W + 3 wide buffer).
inline StridedBuf make_buf(const Shape& s, DType dt, Lay lay, Device dev = Device::cpu()) {
  const bool channels_last = lay == Lay::kNhwc || lay == Lay::kNhwcStrided;
  const std::int64_t w_pad = lay == Lay::kStrided || lay == Lay::kNhwcStrided ? 3 : 0;
  return StridedBuf::make(s, Placement{channels_last, w_pad, 1, 0}, dt, dev);
}

}  // namespace test::sync_bn
}  // namespace detops
