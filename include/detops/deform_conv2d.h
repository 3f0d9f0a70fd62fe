// Deformable convolution (v1, and v2 with a modulation mask) forward and backward on CPU and CUDA,
// with the semantics of torchvision.ops.deform_conv2d, which mmcv's ModulatedDeformConv2d and
// detectron2's DeformConv follow except for one border rule of the offset gradient (border_rule
// below picks either). Two backward modes: atomic (grad_input scattered with atomicAdd on CUDA,
// as every anchor does: fast, not reproducible there, and silent: none of them raises PyTorch's
// nondeterminism alert) and exact (bitwise reproducible by construction: the same bits across
// runs, CPU thread counts, layouts, and CPU vs CUDA).
//
// Shapes (any non-negative strides; NCHW and NHWC are both read from the strides):
//   input        [N, Cin, H, W]                float32 | float64 | float16 | bfloat16
//   weight       [Cout, Cin / groups, kh, kw]  dtype of input
//   offset       [N, 2 * og * kh * kw, Ho, Wo] dtype of input; og = offset groups, Cin % og == 0;
//                                              channel 2 * (g * kh * kw + i * kw + j) is the
//                                              y offset of tap (i, j) of offset group g, +1 its x
//   mask         [N, og * kh * kw, Ho, Wo]     dtype of input; empty view: no mask (v1)
//   bias         [Cout]                        dtype of input; empty view: no bias
//   output       [N, Cout, Ho, Wo]             Ho = (H + 2 pad_h - (dilation_h (kh - 1) + 1)) / stride_h + 1
//   groups = Cin / weight.sizes[1] (Cout % groups == 0); og = offset.sizes[1] / (2 kh kw), as
//   torchvision infers them.
//
// Semantics (torchvision's; A is the accumulation type: float for float32 and 16-bit, double for
// float64):
//   sample(n, c, i, j, ho, wo) = m * bilinear(input[n, c], y, x) with
//     y = ho * stride_h - pad_h + i * dilation_h + offset[n, 2 t, ho, wo]
//     x = wo * stride_w - pad_w + j * dilation_w + offset[n, 2 t + 1, ho, wo]
//     t = g * kh * kw + i * kw + j (g = c's offset group), m = mask[n, t, ho, wo] (1 without mask)
//     bilinear: 0 when y <= -1, y >= H, x <= -1 or x >= W (an infinite offset included); else
//     the four corners floor(y), floor(y) + 1 (and x), a corner outside the map reading 0. A NaN
//     coordinate gives a NaN sample and NaN coordinate derivatives (so NaN in the output at
//     that position, grad_weight, grad_mask and that sample's grad_offset; nothing in
//     grad_input). torchvision's kernels cast floor(NaN) to an integer (undefined): they return
//     NaN or read out of bounds (a crash, seen with torchvision 0.14 and 0.29 on the CPU); NaN
//     is what their weights make of it.
//   output[n, o, ho, wo] = bias[o] + sum over (c, i, j) of o's group of
//     weight[o, c, i, j] * sample(n, c, i, j, ho, wo)
//   grad_offset and grad_mask: torchvision's derivatives (a coordinate on a pixel row or column
//   takes the derivative from above, as torchvision's), one writer each, summed over the offset
//   group's channels in order. At a coordinate of exactly -1 torchvision's grad_offset is the
//   one-sided derivative and mmcv's/detectron2's is 0: DeformConv2dBackwardOptions::border_rule
//   picks (mmcv and detectron2 otherwise share these semantics).
//
// Arithmetic: the two products (columns = samples, then weight x columns) use one fixed-order,
// FMA-free GEMM shared by the CPU and CUDA backends (detail/deform_conv2d_math.h): every output
// element is acc = acc + a * b over the reduction index in increasing order, each product and sum
// rounded in A, never fused. So the forward, grad_offset, grad_mask, grad_weight and grad_bias are
// bitwise identical across runs, thread counts, layouts, ISA variants and the CPU and CUDA
// backends in every mode; grad_weight and grad_bias sum over (n, ho, wo) in that order. A BLAS or
// cuBLAS GEMM is not used: its order and FMA use vary by library, CPU and GPU.
//
// Backward modes (only grad_input differs):
//   kAtomic  a scatter into grad_input (atomicAdd on CUDA: not reproducible there; a race-free
//            per-plane scatter on the CPU, deterministic but not CUDA's bits).
//   kExact   the gather-backward engine (docs/design.md): per image, records (input pixel,
//            m * corner weight, column) in the order (offset group, i, j, ho, wo, corner), a
//            stable sort by pixel, fixed-order sums in partials of detail::kGatherPartial.
//   kTruncated is refused (kExact is exact).
//
// Workspace: the columns of a chunk of images ([Cin * kh * kw, images * Ho * Wo] in A; the
// backward also their gradient, grad_output widened to A and the exact mode's records, or the
// atomic mode's table of samples on the CPU): a chunk holds as many whole images as fit in
// max(one image, 2^22 column elements), so about 16 MB (float) per column buffer whatever N is
// (one image of ResNet-50's c3 at 800x1333 is 77 MB, as torchvision's own buffer).
// Caller-supplied through `workspace`, or from ctx.allocator.
//
// Errors (detops::Error, thrown before anything is written, outputs left untouched): wrong ranks
// or sizes (including an output size that is not positive, channels not divisible by groups or
// offset groups), dtypes or devices that do not match, non-positive stride or dilation, negative
// padding, an output that shares memory with another argument, a workspace too small,
// BackwardMode::kTruncated, a mode or border rule outside its enum. N = 0, Cout = 0 and Cin = 0
// succeed (outputs are zero-filled where they have elements: the output is then the bias).
//
// CUDA: work is enqueued on Context::cuda_stream, no host synchronization.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detops/backward_mode.h"
#include "detops/context.h"
#include "detops/tensor.h"

namespace detops {

/// deform_conv2d offers atomic and exact; both passes take scratch (the columns of the GEMMs).
inline constexpr OpCapabilities kDeformConv2dCapabilities{
    "deform_conv2d", backward_mode_bits({BackwardMode::kAtomic, BackwardMode::kExact}), true, true};

/// torchvision.ops.deform_conv2d's stride, padding and dilation (groups and offset groups are
/// read from the shapes of weight and offset, as torchvision does).
struct DeformConv2dOptions {
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1;
};

/// Which offset gradient a sampling point on or beyond the map's border row or column gets. The
/// two families of kernels differ at exactly one place: a coordinate of exactly -1 (y = -1 or
/// x = -1), where the sample itself is 0.
///   kTorchvision  torchvision's get_coordinate_weight: no early return, only the corners on the
///                 map count, so at y = -1 the y derivative is the one from above (row 0); the
///                 default.
///   kMmcv         mmcv's and detectron2's (get_coordinate_weight / dmcn_get_coordinate_weight,
///                 CPU and CUDA): a zero offset gradient unless -1 < y < H and -1 < x < W. A
///                 freshly built mmcv DCN layer (zero offsets) with padding puts every border tap
///                 exactly at -1, so this changes the very first step: mmcv's stand-ins use it.
/// Nothing else depends on the rule (the output, grad_input, grad_weight, grad_mask and grad_bias
/// are the same under both), nor does the arithmetic inside the map: torchvision's expressions.
enum class DeformBorderRule : std::int32_t {
  kTorchvision = 0,
  kMmcv = 1,
};

struct DeformConv2dBackwardOptions {
  /// kAtomic or kExact (kTruncated is refused).
  BackwardMode mode = BackwardMode::kExact;
  /// The offset gradient's border rule (both backward modes; grad_offset only).
  DeformBorderRule border_rule = DeformBorderRule::kTorchvision;
};

/// Bytes of workspace deform_conv2d_forward needs for these arguments.
std::size_t deform_conv2d_forward_workspace_size(const TensorView& input, const TensorView& weight,
                                                 const TensorView& offset, const TensorView& mask,
                                                 const TensorView& bias, const TensorView& output,
                                                 const DeformConv2dOptions& options, const Context& ctx = {});

/// output = deform_conv2d(input, offset, weight, bias, mask). `workspace`: caller scratch of at
/// least deform_conv2d_forward_workspace_size() bytes, or empty to use ctx.allocator.
void deform_conv2d_forward(const TensorView& input, const TensorView& weight, const TensorView& offset,
                           const TensorView& mask, const TensorView& bias, const TensorView& output,
                           const DeformConv2dOptions& options, const Context& ctx = {}, Workspace workspace = {});

/// The backward's gradients; each may be an empty view (not computed). grad_mask must be empty
/// when mask is. The backward takes no bias (its gradient does not depend on it): a given
/// grad_bias, [Cout] of input's dtype, gets grad_output summed over (n, ho, wo), whether or not
/// the forward had a bias.
struct DeformConv2dGrads {
  TensorView grad_input;   // like input
  TensorView grad_weight;  // like weight
  TensorView grad_offset;  // like offset
  TensorView grad_mask;    // like mask
  TensorView grad_bias;    // [Cout]
};

/// Bytes of workspace deform_conv2d_backward needs for these arguments.
std::size_t deform_conv2d_backward_workspace_size(const TensorView& grad_output, const TensorView& input,
                                                  const TensorView& weight, const TensorView& offset,
                                                  const TensorView& mask, const DeformConv2dGrads& grads,
                                                  const DeformConv2dOptions& options,
                                                  const DeformConv2dBackwardOptions& backward,
                                                  const Context& ctx = {});

/// The gradients of deform_conv2d_forward's output with respect to its arguments, each fully
/// overwritten. `workspace`: caller scratch of at least deform_conv2d_backward_workspace_size()
/// bytes, or empty to use ctx.allocator.
void deform_conv2d_backward(const TensorView& grad_output, const TensorView& input, const TensorView& weight,
                            const TensorView& offset, const TensorView& mask, const DeformConv2dGrads& grads,
                            const DeformConv2dOptions& options, const DeformConv2dBackwardOptions& backward,
                            const Context& ctx = {}, Workspace workspace = {});

}  // namespace detops
