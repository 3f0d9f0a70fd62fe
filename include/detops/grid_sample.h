// grid_sample 2-d forward and backward on CPU and CUDA, with the semantics of
// torch.nn.functional.grid_sample (4-d input), and two backward modes: atomic (a scatter with
// atomicAdd on CUDA: fast, not reproducible there) and exact (bitwise reproducible by
// construction: the same bits across runs, CPU thread counts, layouts, and CPU vs CUDA).
// PyTorch's CUDA grid_sample backward has no deterministic mode (pytorch#68959).
//
// Shapes (any non-negative strides; NCHW and NHWC are both native, read from the strides):
//   input        [N, C, H, W]        float32 | float64 | float16 | bfloat16
//   grid         [N, Ho, Wo, 2]      (x, y) normalized to [-1, 1] (or in [0, 1]: coordinates
//                                    kUnit); input's dtype, or float32 / float64 whatever input's
//                                    dtype (16-bit grids only with a 16-bit input of that dtype)
//   output       [N, C, Ho, Wo]      dtype of input
//   grad_output  [N, C, Ho, Wo]      dtype of input
//   grad_input   [N, C, H, W]        dtype of input; fully overwritten; may be empty (not needed)
//   grad_grid    [N, Ho, Wo, 2]      dtype of grid; fully overwritten; may be empty (not needed)
//
// Semantics (PyTorch's, in the accumulation type: float for 16-bit and float32, double for
// float64; coordinates in grid's type widened to it):
//   unnormalize: align_corners ? (g + 1) / 2 * (size - 1) : ((g + 1) * size - 1) / 2
//   padding: zeros keeps the coordinate; border clips it to [0, size - 1]; reflection reflects
//     it about the corner pixels' centres (align_corners) or edges (not), then clips.
//   bilinear: the four corners floor(x), floor(x) + 1 (and y), weights (1 - dx)(1 - dy) ...; a
//     corner outside the map contributes nothing (zeros padding); after border/reflection two
//     corners may be the same pixel: they stay distinct contributions.
//   nearest: the pixel nearbyint(x), nearbyint(y) (round half to even), 0 outside the map.
//   Non-finite coordinates as PyTorch's CPU kernel (its forward, and grad_grid where its
//   backward runs): border and reflection clip NaN to 0 and infinities to their edge (to 0 after
//   reflection, which makes NaN of them), so the point samples an edge pixel; under zeros padding
//   nearest samples nothing (0, gradients 0), and bilinear reads no pixel but weighs with NaN
//   fractions, so its output is NaN and grad_grid NaN along the axis weighed by the non-finite
//   coordinate's fraction (the other component 0); grad_input gets nothing from it. (PyTorch's
//   CUDA kernel and its bilinear border/reflection backward differ or fail there.)
//   grad_grid: d(loss)/d(grid), one writer per grid point, summed over channels in order; for
//   nearest it is 0 (as PyTorch).
//   coordinates kUnit (detectron2's point_sample, which Mask2Former's point loss calls): each grid
//   value c in [0, 1] is read as 2c - 1, computed in the grid's dtype (2c, rounded, minus 1,
//   rounded), and grad_grid is 2 times the gradient of that value rounded to the grid's dtype:
//   every output and gradient has the bits of grid_sample at the grid 2c - 1 followed by torch's
//   backward of `2 * c - 1`, in one pass and without the normalized grid in memory.
//   The operations and their order are those of PyTorch's CPU kernel, fused multiply-adds included
//   (detail/grid_sample_math.h): in float64 the forward and grad_grid equal F.grid_sample's on
//   the CPU to the bit, and grad_input to a few ulps (PyTorch adds it in vector-sized groups of
//   points; detops in the exact mode's fixed order).
//
// Errors (detops::Error, thrown before anything is written, outputs left untouched): wrong ranks
// or sizes, dtypes or devices that do not match, an output that shares memory with another
// argument, a workspace too small, BackwardMode::kTruncated (not offered: kExact is exact).
// N = 0, C = 0 or an empty grid succeed (the backward zero-fills what it writes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/backward_mode.h"
#include "detops/context.h"
#include "detops/tensor.h"

namespace detops {

/// grid_sample offers atomic and exact; its backward takes scratch (the exact mode's), its forward none.
inline constexpr OpCapabilities kGridSampleCapabilities{
    "grid_sample", backward_mode_bits({BackwardMode::kAtomic, BackwardMode::kExact}), false, true};

enum class GridSampleInterpolation : std::uint8_t { kBilinear, kNearest };
enum class GridSamplePadding : std::uint8_t { kZeros, kBorder, kReflection };
/// What the grid's values are: kNormalized, torch's [-1, 1]; kUnit, detectron2's point_sample's
/// [0, 1] (see the semantics above).
enum class GridSampleCoordinates : std::uint8_t { kNormalized, kUnit };

struct GridSampleOptions {
  GridSampleInterpolation interpolation = GridSampleInterpolation::kBilinear;
  GridSamplePadding padding = GridSamplePadding::kZeros;
  bool align_corners = false;
  GridSampleCoordinates coordinates = GridSampleCoordinates::kNormalized;
};

struct GridSampleBackwardOptions {
  /// kAtomic or kExact (kTruncated is refused).
  BackwardMode mode = BackwardMode::kExact;
};

/// output[n, c, ho, wo] = input[n, c] sampled at grid[n, ho, wo].
void grid_sample_forward(const TensorView& input, const TensorView& grid, const TensorView& output,
                         const GridSampleOptions& options, const Context& ctx = {});

/// Bytes of workspace grid_sample_backward needs for these arguments (0 for kAtomic).
std::size_t grid_sample_backward_workspace_size(const TensorView& grad_output, const TensorView& input,
                                                const TensorView& grid, const TensorView& grad_input,
                                                const TensorView& grad_grid, const GridSampleOptions& options,
                                                const GridSampleBackwardOptions& backward, const Context& ctx = {});

/// grad_input and grad_grid (either may be an empty view: not computed) from grad_output.
/// `workspace`: caller-provided scratch of at least grid_sample_backward_workspace_size() bytes,
/// or empty to use ctx.allocator (any alignment, as RoIAlign's).
void grid_sample_backward(const TensorView& grad_output, const TensorView& input, const TensorView& grid,
                          const TensorView& grad_input, const TensorView& grad_grid, const GridSampleOptions& options,
                          const GridSampleBackwardOptions& backward, const Context& ctx = {},
                          Workspace workspace = {});

/// Names for messages and tables: "bilinear", "nearest"; "zeros", "border", "reflection";
/// "normalized", "unit".
const char* to_string(GridSampleInterpolation mode);
const char* to_string(GridSamplePadding mode);
const char* to_string(GridSampleCoordinates coordinates);

}  // namespace detops
