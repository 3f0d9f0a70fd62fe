// The backward modes shared by every op whose backward scatters (RoIAlign, grid_sample,
// multi-scale deformable attention): which ones an op offers is in its header.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace detops {

/// How the backward pass accumulates gradients into grad_input (RoIAlign's wording;
/// the other ops' headers say how each mode applies to them).
enum class BackwardMode : std::uint8_t {
  /// Scatter with atomicAdd in grad_input's dtype (CUDA); plain per-plane scatter on the CPU.
  /// Fastest on GPUs; the summation order, and so the rounding, changes from run to run there.
  kAtomic,
  /// Round each incoming gradient to a narrow format (TruncationFormat), compute and accumulate
  /// contributions in double (double atomics on CUDA, into workspace; float64 below), round each
  /// sum to grad_input's dtype. float32, float16, bfloat16: run-to-run differences need a
  /// double-precision reordering error to cross a rounding boundary of the output format, so they
  /// are rare but not excluded: measured, a few elements in 28M per reordering at sampling_ratio 0
  /// (adaptive: about 1e-7 per element), none seen at 2. Not guaranteed; kExact is.
  /// float64: bitwise reproducible, and the same bits on the CPU and CUDA. There the double sums
  /// are the result (nothing rounds a reordering away: with double atomics about 40% of the
  /// elements would change between runs), so CUDA does not use atomics for float64: it enumerates
  /// the contributions and sorts them by position as kExact does, then adds each position's
  /// truncated contributions in double in the order the CPU adds them. It has kExact's cost and
  /// workspace, and with adaptive sampling its workspace query waits on the stream as kExact's does.
  kTruncated,
  /// No floating-point atomics: the (position, weight, bin) contributions are enumerated once,
  /// stably sorted by position (CUB radix sort on CUDA, a stable counting sort on the CPU), and each
  /// position's contributions are summed in that fixed order for every channel. Bitwise identical
  /// across runs, CPU thread counts, and the CPU and CUDA backends.
  kExact,
};

/// The narrow format kTruncated rounds incoming gradients to. float16 (the published trick)
/// overflows above 65504 under AMP loss scaling; bfloat16 keeps float32's range with 8 bits.
enum class TruncationFormat : std::uint8_t { kFloat16, kBFloat16 };

/// Names for messages and tables: "atomic", "truncated", "exact".
const char* to_string(BackwardMode mode);

/// What an op offers, stated once in its header (k<Op>Capabilities): its backward modes and
/// whether its forward and its backward take scratch memory (then the op has a
/// *_workspace_size() query and a `workspace` argument for that pass). The front ends accept a
/// backward mode through it (the error names the modes the op offers), and the PyTorch binding
/// parses its backward_mode strings through it.
struct OpCapabilities {
  const char* name;             ///< the op, as messages name it
  std::uint8_t backward_modes;  ///< bit 1 << mode for each BackwardMode offered (0: no backward modes)
  bool forward_workspace;
  bool backward_workspace;

  constexpr bool offers(BackwardMode mode) const {
    const auto m = static_cast<unsigned>(mode);
    return m < 8u && ((backward_modes >> m) & 1u) != 0;
  }
};

/// The OpCapabilities::backward_modes bits of `modes`.
constexpr std::uint8_t backward_mode_bits(std::initializer_list<BackwardMode> modes) {
  unsigned bits = 0;
  for (BackwardMode m : modes) bits |= 1u << static_cast<unsigned>(m);
  return static_cast<std::uint8_t>(bits);
}

/// Every BackwardMode, in the order messages list them.
inline constexpr BackwardMode kAllBackwardModes[] = {BackwardMode::kAtomic, BackwardMode::kTruncated,
                                                     BackwardMode::kExact};

}  // namespace detops
