// Helpers shared by the FrozenBatchNorm2d tests (CPU, CUDA, emulated kernels): readable
// parameters, the layouts each test runs on and the poisoned buffers that hold them.
#pragma once

#include <cstdint>
#include <ostream>

#include "detops/frozen_batch_norm.h"
#include "test_util.h"

namespace detops {

// A namespace of its own: the test binaries link several ops' tests, each with its own Lay.
namespace test::frozen_bn {

using Epi = FrozenBnEpilogue;
using test::Shape;

inline const char* epi_name(Epi e) { return e == Epi::kNone ? "none" : e == Epi::kRelu ? "relu" : "add_relu"; }
inline bool has_relu(Epi e) { return e != Epi::kNone; }

/// Layouts: dense NCHW and NHWC; the same starting one element into their buffer (not 16-byte
/// aligned: the scalar / generic paths); a W-slice of a wider NCHW buffer; every other channel of
/// an NHWC buffer (strided).
enum class Lay { kNchw, kNhwc, kNchwOffset1, kNhwcOffset1, kSlice, kChannelSlice };
constexpr Lay kLays[] = {Lay::kNchw, Lay::kNhwc, Lay::kNchwOffset1, Lay::kNhwcOffset1, Lay::kSlice, Lay::kChannelSlice};
inline const char* lay_name(Lay l) {
  switch (l) {
    case Lay::kNchw: return "nchw";
    case Lay::kNhwc: return "nhwc";
    case Lay::kNchwOffset1: return "nchw_offset1";
    case Lay::kNhwcOffset1: return "nhwc_offset1";
    case Lay::kSlice: return "slice";
    case Lay::kChannelSlice: return "channel_slice";
  }
  return "?";
}
inline void PrintTo(Lay l, std::ostream* os) { *os << lay_name(l); }

/// Where each layout's view sits in its poisoned storage (test_util.h's Placement).
inline Placement placement(Lay lay) {
  switch (lay) {
    case Lay::kNchw: return {};
    case Lay::kNhwc: return {true};
    case Lay::kNchwOffset1: return {false, 0, 1, 1};
    case Lay::kNhwcOffset1: return {true, 0, 1, 1};
    case Lay::kSlice: return {false, 3, 1, 1};        // a W-slice of [N, C, H, W + 3], one element in
    case Lay::kChannelSlice: return {true, 0, 2, 0};  // every other channel of [N, 2C, H, W]
  }
  return {};
}

/// A [N, C, H, W] view in layout `lay` in a 1-d storage poisoned with 0xCD.
inline StridedBuf make_buf(const Shape& s, DType dt, Lay lay, Device dev = Device::cpu()) {
  return StridedBuf::make(s, placement(lay), dt, dev);
}

}  // namespace test::frozen_bn

// Readable parameters in test names and failure messages (found by argument-dependent lookup,
// so in namespace detops).
[[maybe_unused]] static void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
[[maybe_unused]] static void PrintTo(FrozenBnEpilogue e, std::ostream* os) { *os << test::frozen_bn::epi_name(e); }

}  // namespace detops
