// deform_conv2d entry points: validate every argument (before anything is allocated, launched or
// written), then hand a DeformConv2dCall to the CPU or CUDA backend.
#include "detops/deform_conv2d.h"

#include <cstdint>
#include <initializer_list>

#include "internal/backend.h"
#include "internal/common.h"
#include "internal/deform_conv2d_backend.h"
#include "internal/scratch.h"
#include "internal/validate.h"

namespace detops {
namespace {

using internal::check_same_device;
using internal::check_tensor;
using internal::fail;
using internal::sizes_str;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
constexpr std::int64_t kMaxColumns = std::int64_t{1} << 55;

constexpr internal::OpBackends<internal::DeformConv2dBackend> kBackends{
    &internal::kDeformConv2dCpu, DETOPS_CUDA_BACKEND(internal::kDeformConv2dCuda)};

const internal::DeformConv2dBackend& backend(const internal::DeformConv2dCall& call) {
  return internal::backend_for(kBackends, call.input.device, call.op);
}

void check_options(const char* op, const DeformConv2dOptions& o) {
  if (o.stride_h <= 0 || o.stride_w <= 0)
    fail(kBad, "{}: stride is ({}, {}); expected positive values", op, o.stride_h, o.stride_w);
  if (o.dilation_h <= 0 || o.dilation_w <= 0)
    fail(kBad, "{}: dilation is ({}, {}); expected positive values", op, o.dilation_h, o.dilation_w);
  if (o.pad_h < 0 || o.pad_w < 0) fail(kBad, "{}: padding is ({}, {}); expected values >= 0", op, o.pad_h, o.pad_w);
}

/// A tensor of input's dtype and device.
void check_dtype_device(const char* op, const char* name, const TensorView& v, const TensorView& input) {
  if (v.dtype != input.dtype)
    fail(kBad, "{}: {} has dtype {}; expected {} (the dtype of input)", op, name, dtype_name(v.dtype),
         dtype_name(input.dtype));
  check_same_device(op, name, v, "input", input);
}

/// input, weight, offset, mask and bias against one another; the shape (groups, offset groups and
/// the output size inferred as torchvision infers them).
detail::DeformConv2dShape check_arguments(const char* op, const TensorView& input, const TensorView& weight,
                                          const TensorView& offset, const TensorView& mask, const TensorView& bias,
                                          const DeformConv2dOptions& o) {
  check_options(op, o);
  check_tensor(op, "input", input, 4);
  internal::check_floating(op, "input", input);
  check_tensor(op, "weight", weight, 4);
  check_dtype_device(op, "weight", weight, input);
  check_tensor(op, "offset", offset, 4);
  check_dtype_device(op, "offset", offset, input);
  detail::DeformConv2dShape s{};
  s.N = input.sizes[0];
  s.Cin = input.sizes[1];
  s.H = input.sizes[2];
  s.W = input.sizes[3];
  s.Cout = weight.sizes[0];
  s.kh = weight.sizes[2];
  s.kw = weight.sizes[3];
  s.stride_h = o.stride_h;
  s.stride_w = o.stride_w;
  s.pad_h = o.pad_h;
  s.pad_w = o.pad_w;
  s.dilation_h = o.dilation_h;
  s.dilation_w = o.dilation_w;
  if (s.kh <= 0 || s.kw <= 0)
    fail(kBad, "{}: weight has sizes {}; expected [Cout, Cin / groups, kh, kw] with kh > 0 and kw > 0", op,
         sizes_str(weight));
  // groups = Cin / weight.sizes[1]: a divisor of Cin and of Cout (Cin = 0 has no groups to infer:
  // weight.sizes[1] must then be 0 too, and there is one).
  const std::int64_t per_group = weight.sizes[1];
  if (s.Cin == 0 ? per_group != 0 : (per_group <= 0 || s.Cin % per_group != 0))
    fail(kBad, "{}: weight has sizes {}; expected [Cout, Cin / groups, kh, kw] with Cin / groups dividing Cin = {}",
         op, sizes_str(weight), s.Cin);
  s.groups = s.Cin == 0 ? 1 : s.Cin / per_group;
  if (s.Cout % s.groups != 0)
    fail(kBad, "{}: weight has sizes {}; expected Cout divisible by groups = {} (Cin / weight.sizes[1])", op,
         sizes_str(weight), s.groups);
  // The output size from the options, each step checked (pad_h = INT64_MAX once wrapped H + 2 *
  // pad_h and gave Ho = 2); the messages show the values given, never a wrapped one.
  std::int64_t padded_h = 0, padded_w = 0, eff_h = 0, eff_w = 0;
  if (!internal::checked_affine(2, s.pad_h, s.H, &padded_h) || !internal::checked_affine(2, s.pad_w, s.W, &padded_w))
    fail(kBad, "{}: padding is ({}, {}) for input sizes {}; H + 2 * pad_h and W + 2 * pad_w must fit in int64; "
         "expected a padded input below 2^63", op, s.pad_h, s.pad_w, sizes_str(input));
  if (!internal::checked_affine(s.dilation_h, s.kh - 1, 1, &eff_h) ||
      !internal::checked_affine(s.dilation_w, s.kw - 1, 1, &eff_w))
    fail(kBad, "{}: dilation is ({}, {}) for a {}x{} kernel (weight sizes {}); dilation * (k - 1) + 1 must fit in "
         "int64; expected a dilated kernel below 2^63", op, s.dilation_h, s.dilation_w, s.kh, s.kw, sizes_str(weight));
  if (padded_h < eff_h || padded_w < eff_w)
    fail(kBad, "{}: input has sizes {}; with padding ({}, {}) it is smaller than the dilated kernel ({}, {}): no "
         "output position", op, sizes_str(input), s.pad_h, s.pad_w, eff_h, eff_w);
  s.Ho = (padded_h - eff_h) / s.stride_h + 1;  // <= 2^63 - 1: padded_h - eff_h < 2^63 - 1
  s.Wo = (padded_w - eff_w) / s.stride_w + 1;
  const std::int64_t taps = s.kh * s.kw;  // fits: weight's element count does
  // One image's columns (Cin * kh * kw rows of Ho * Wo) are one workspace buffer of 4 or 8 bytes
  // an element: more than 2^55 elements could never be allocated (nor sized in int64 below).
  std::int64_t columns = 0;
  if (!internal::checked_product({s.Cin, taps, s.Ho, s.Wo}, &columns) || columns > kMaxColumns)
    fail(kBad, "{}: input with Cin = {} and a {}x{} kernel at {}x{} output positions (padding ({}, {}), dilation "
         "({}, {}), stride ({}, {})) needs Cin * kh * kw * Ho * Wo column elements per image; expected at most 2^55",
         op, s.Cin, s.kh, s.kw, s.Ho, s.Wo, s.pad_h, s.pad_w, s.dilation_h, s.dilation_w, s.stride_h, s.stride_w);
  if (offset.sizes[0] != s.N || offset.sizes[2] != s.Ho || offset.sizes[3] != s.Wo || offset.sizes[1] <= 0 ||
      offset.sizes[1] / 2 % taps != 0 || offset.sizes[1] % 2 != 0)
    fail(kBad, "{}: offset has sizes {}; expected [N, 2 * offset_groups * kh * kw, Ho, Wo] = [{}, 2 * og * {}, {}, "
         "{}]", op, sizes_str(offset), s.N, taps, s.Ho, s.Wo);
  s.offset_groups = offset.sizes[1] / 2 / taps;
  if (s.Cin % s.offset_groups != 0)
    fail(kBad, "{}: offset has {} channels, so {} offset groups; expected a divisor of Cin = {}", op, offset.sizes[1],
         s.offset_groups, s.Cin);
  s.has_mask = mask.defined();
  if (s.has_mask) {
    check_tensor(op, "mask", mask, 4);
    check_dtype_device(op, "mask", mask, input);
    if (mask.sizes[0] != s.N || mask.sizes[1] != s.offset_groups * taps || mask.sizes[2] != s.Ho ||
        mask.sizes[3] != s.Wo)
      fail(kBad, "{}: mask has sizes {}; expected [N, offset_groups * kh * kw, Ho, Wo] = [{}, {}, {}, {}]", op,
           sizes_str(mask), s.N, s.offset_groups * taps, s.Ho, s.Wo);
  }
  s.has_bias = bias.defined();
  if (s.has_bias) {
    check_tensor(op, "bias", bias, 1);
    check_dtype_device(op, "bias", bias, input);
    if (bias.sizes[0] != s.Cout)
      fail(kBad, "{}: bias has sizes {}; expected [Cout] = [{}]", op, sizes_str(bias), s.Cout);
  }
  return s;
}

/// A [N, Cout, Ho, Wo] tensor of input's dtype and device (output, grad_output).
void check_result(const char* op, const char* name, const TensorView& v, const TensorView& input,
                  const detail::DeformConv2dShape& s) {
  check_tensor(op, name, v, 4);
  if (v.sizes[0] != s.N || v.sizes[1] != s.Cout || v.sizes[2] != s.Ho || v.sizes[3] != s.Wo)
    fail(kBad, "{}: {} has sizes {}; expected [N, Cout, Ho, Wo] = [{}, {}, {}, {}]", op, name, sizes_str(v), s.N,
         s.Cout, s.Ho, s.Wo);
  check_dtype_device(op, name, v, input);
}

internal::DeformConv2dCall validate_forward(const char* op, const TensorView& input, const TensorView& weight,
                                            const TensorView& offset, const TensorView& mask, const TensorView& bias,
                                            const TensorView& output, const DeformConv2dOptions& o) {
  internal::DeformConv2dCall call{};
  call.op = op;
  call.shape = check_arguments(op, input, weight, offset, mask, bias, o);
  check_result(op, "output", output, input, call.shape);
  internal::check_outputs(op, {{"output", &output}});
  internal::check_disjoint(op, {"output", &output},
                           {{"input", &input}, {"weight", &weight}, {"offset", &offset}, {"mask", &mask},
                            {"bias", &bias}});
  call.input = input;
  call.weight = weight;
  call.offset = offset;
  call.mask = mask;
  call.bias = bias;
  call.output = output;
  return call;
}

internal::DeformConv2dCall validate_backward(const char* op, const TensorView& grad_output, const TensorView& input,
                                             const TensorView& weight, const TensorView& offset,
                                             const TensorView& mask, const DeformConv2dGrads& g,
                                             const DeformConv2dOptions& o, const DeformConv2dBackwardOptions& b) {
  internal::check_backward_mode(op, kDeformConv2dCapabilities, b.mode);
  if (b.border_rule != DeformBorderRule::kTorchvision && b.border_rule != DeformBorderRule::kMmcv)
    fail(kBad, "{}: border_rule {} is unknown; expected kTorchvision (0) or kMmcv (1)", op,
         static_cast<int>(b.border_rule));
  internal::DeformConv2dCall call{};
  call.op = op;
  call.border_rule = b.border_rule;
  call.shape = check_arguments(op, input, weight, offset, mask, TensorView{}, o);
  check_result(op, "grad_output", grad_output, input, call.shape);
  if (g.grad_input.defined()) internal::check_like(op, "grad_input", g.grad_input, "input", input);
  if (g.grad_weight.defined()) internal::check_like(op, "grad_weight", g.grad_weight, "weight", weight);
  if (g.grad_offset.defined()) internal::check_like(op, "grad_offset", g.grad_offset, "offset", offset);
  if (g.grad_mask.defined()) {
    if (!mask.defined()) fail(kBad, "{}: grad_mask is given but mask is not; expected no grad_mask without mask", op);
    internal::check_like(op, "grad_mask", g.grad_mask, "mask", mask);
  }
  if (g.grad_bias.defined()) {
    check_tensor(op, "grad_bias", g.grad_bias, 1);
    if (g.grad_bias.sizes[0] != call.shape.Cout)
      fail(kBad, "{}: grad_bias has sizes {}; expected [Cout] = [{}]", op, sizes_str(g.grad_bias), call.shape.Cout);
    check_dtype_device(op, "grad_bias", g.grad_bias, input);
  }
  call.shape.has_bias = g.grad_bias.defined();
  // The outputs are written while the inputs are read: no shared byte (not even an exact alias).
  internal::check_outputs(op, {{"grad_input", &g.grad_input},
                               {"grad_weight", &g.grad_weight},
                               {"grad_offset", &g.grad_offset},
                               {"grad_mask", &g.grad_mask},
                               {"grad_bias", &g.grad_bias}});
  for (const internal::NamedView out :
       {internal::NamedView{"grad_input", &g.grad_input}, internal::NamedView{"grad_weight", &g.grad_weight},
        internal::NamedView{"grad_offset", &g.grad_offset}, internal::NamedView{"grad_mask", &g.grad_mask},
        internal::NamedView{"grad_bias", &g.grad_bias}})
    internal::check_disjoint(op, out,
                             {{"grad_output", &grad_output}, {"input", &input}, {"weight", &weight},
                              {"offset", &offset}, {"mask", &mask}});
  call.input = input;
  call.weight = weight;
  call.offset = offset;
  call.mask = mask;
  call.grad_output = grad_output;
  call.grads = g;
  return call;
}

std::size_t forward_bytes(const internal::DeformConv2dCall& call) {
  if (call.output.numel() == 0) return 0;
  return internal::deform_forward_workspace_bytes(call);
}

std::size_t backward_bytes(const internal::DeformConv2dCall& call, BackwardMode mode) {
  const internal::DeformWants w = internal::deform_wants(call);
  if (!w.input && !w.weight && !w.offset && !w.mask && !w.bias) return 0;
  return backend(call).backward_workspace(call, mode);
}

}  // namespace

std::size_t deform_conv2d_forward_workspace_size(const TensorView& input, const TensorView& weight,
                                                 const TensorView& offset, const TensorView& mask,
                                                 const TensorView& bias, const TensorView& output,
                                                 const DeformConv2dOptions& options, const Context& ctx) {
  (void)ctx;  // the size depends on the shapes only
  const internal::DeformConv2dCall call = validate_forward("deform_conv2d_forward_workspace_size", input, weight,
                                                           offset, mask, bias, output, options);
  return internal::workspace_size_with_slack(forward_bytes(call));
}

void deform_conv2d_forward(const TensorView& input, const TensorView& weight, const TensorView& offset,
                           const TensorView& mask, const TensorView& bias, const TensorView& output,
                           const DeformConv2dOptions& options, const Context& ctx, Workspace workspace) {
  const internal::DeformConv2dCall call =
      validate_forward("deform_conv2d_forward", input, weight, offset, mask, bias, output, options);
  const std::size_t bytes = forward_bytes(call);
  const internal::Scratch scratch(call.op, bytes, input.device, ctx, workspace,
                                  {{"input", &input}, {"weight", &weight}, {"offset", &offset}, {"mask", &mask},
                                   {"bias", &bias}, {"output", &output}},
                                  "deform_conv2d_forward_workspace_size");
  if (output.numel() == 0) return;
  backend(call).forward(call, ctx, scratch.workspace(bytes));
}

std::size_t deform_conv2d_backward_workspace_size(const TensorView& grad_output, const TensorView& input,
                                                  const TensorView& weight, const TensorView& offset,
                                                  const TensorView& mask, const DeformConv2dGrads& grads,
                                                  const DeformConv2dOptions& options,
                                                  const DeformConv2dBackwardOptions& backward, const Context& ctx) {
  (void)ctx;
  const internal::DeformConv2dCall call = validate_backward("deform_conv2d_backward_workspace_size", grad_output,
                                                            input, weight, offset, mask, grads, options, backward);
  return internal::workspace_size_with_slack(backward_bytes(call, backward.mode));
}

void deform_conv2d_backward(const TensorView& grad_output, const TensorView& input, const TensorView& weight,
                            const TensorView& offset, const TensorView& mask, const DeformConv2dGrads& grads,
                            const DeformConv2dOptions& options, const DeformConv2dBackwardOptions& backward,
                            const Context& ctx, Workspace workspace) {
  const internal::DeformConv2dCall call = validate_backward("deform_conv2d_backward", grad_output, input, weight,
                                                            offset, mask, grads, options, backward);
  const std::size_t bytes = backward_bytes(call, backward.mode);
  const internal::Scratch scratch(
      call.op, bytes, input.device, ctx, workspace,
      {{"grad_output", &grad_output}, {"input", &input}, {"weight", &weight}, {"offset", &offset}, {"mask", &mask},
       {"grad_input", &grads.grad_input}, {"grad_weight", &grads.grad_weight}, {"grad_offset", &grads.grad_offset},
       {"grad_mask", &grads.grad_mask}, {"grad_bias", &grads.grad_bias}},
      "deform_conv2d_backward_workspace_size");
  // every wanted gradient is written, even where nothing needs workspace (Cin = Cout = 0 still
  // has grad_offset and grad_mask elements: zeros)
  const internal::DeformWants w = internal::deform_wants(call);
  if (!w.input && !w.weight && !w.offset && !w.mask && !w.bias) return;
  backend(call).backward(call, backward.mode, ctx, scratch.workspace(bytes));
}

}  // namespace detops
