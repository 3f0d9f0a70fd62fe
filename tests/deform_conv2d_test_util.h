// Helpers shared by the deform_conv2d tests: seeded problems whose offsets reach outside the map,
// onto its borders and onto integer coordinates, and the op run on tensors of any dtype and
// layout (CPU or a device), results kept as tensors for bitwise comparisons.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "detops/detops.h"
#include "reference/deform_conv2d_reference.h"
#include "test_util.h"

namespace detops {
namespace test {

struct DeformConv2dConfig {
  std::int64_t N, Cin, H, W, Cout, kh, kw, groups, offset_groups;
  DeformConv2dOptions opt;
  bool mask, bias;
};

/// A seeded problem: input, weight, bias and grad_output in [-1, 1]; offsets in
/// [-range, range] pixels, every 5th one replaced by an integer (a sample on a pixel row or
/// column, or exactly -1 or H beyond the border); mask in [0, 1].
inline DeformConv2dProblem make_deform_problem(const DeformConv2dConfig& c, std::uint64_t seed, double range = 2.5) {
  DeformConv2dProblem p{};
  p.N = c.N, p.Cin = c.Cin, p.H = c.H, p.W = c.W, p.Cout = c.Cout, p.kh = c.kh, p.kw = c.kw;
  p.groups = c.groups, p.offset_groups = c.offset_groups, p.opt = c.opt, p.has_mask = c.mask, p.has_bias = c.bias;
  const std::int64_t Ho = p.Ho(), Wo = p.Wo(), taps = c.kh * c.kw;
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  p.input = random_values(n(c.N * c.Cin * c.H * c.W), seed);
  p.weight = random_values(n(c.Cout * (c.groups > 0 ? c.Cin / c.groups : 0) * taps), seed + 1);
  p.offset = random_values(n(c.N * 2 * c.offset_groups * taps * Ho * Wo), seed + 2, -range, range);
  for (std::size_t i = 0; i < p.offset.size(); i += 5) p.offset[i] = std::round(p.offset[i]);
  if (c.mask) p.mask = random_values(n(c.N * c.offset_groups * taps * Ho * Wo), seed + 3, 0.0, 1.0);
  if (c.bias) p.bias = random_values(n(c.Cout), seed + 4);
  p.grad_output = random_values(n(c.N * c.Cout * Ho * Wo), seed + 5);
  return p;
}

/// The inputs as tensors of dtype dt and layout `layout` (4-d ones) on `dev`.
struct DeformConv2dTensors {
  Tensor input, weight, offset, mask, bias, grad_output;
};

inline DeformConv2dTensors deform_tensors(const DeformConv2dProblem& p, DType dt, Layout layout,
                                          Device dev = Device::cpu()) {
  DeformConv2dTensors t;
  const std::int64_t Ho = p.Ho(), Wo = p.Wo(), taps = p.kh * p.kw;
  t.input = make_tensor({p.N, p.Cin, p.H, p.W}, dt, p.input, layout).to(dev);
  t.weight = make_tensor({p.Cout, p.groups > 0 ? p.Cin / p.groups : 0, p.kh, p.kw}, dt, p.weight).to(dev);
  t.offset = make_tensor({p.N, 2 * p.offset_groups * taps, Ho, Wo}, dt, p.offset, layout).to(dev);
  if (p.has_mask) t.mask = make_tensor({p.N, p.offset_groups * taps, Ho, Wo}, dt, p.mask, layout).to(dev);
  if (p.has_bias) t.bias = make_tensor({p.Cout}, dt, p.bias).to(dev);
  t.grad_output = make_tensor({p.N, p.Cout, Ho, Wo}, dt, p.grad_output, layout).to(dev);
  return t;
}

/// The problem as the library sees it after storing in dtype dt (for the reference).
inline DeformConv2dProblem rounded_problem(const DeformConv2dProblem& p, DType dt) {
  DeformConv2dProblem r = p;
  const DeformConv2dTensors t = deform_tensors(p, dt, Layout::kNCHW);
  r.input = to_vector(t.input);
  r.weight = to_vector(t.weight);
  r.offset = to_vector(t.offset);
  if (p.has_mask) r.mask = to_vector(t.mask);
  if (p.has_bias) r.bias = to_vector(t.bias);
  r.grad_output = to_vector(t.grad_output);
  return r;
}

/// The forward's and backward's results (CPU tensors).
struct DeformConv2dRun {
  Tensor output, grad_input, grad_weight, grad_offset, grad_mask, grad_bias;
};

inline DeformConv2dRun run_deform_conv2d(const DeformConv2dProblem& p, DType dt, Layout layout, BackwardMode mode,
                                         int threads, Device dev = Device::cpu(), CpuIsa isa = CpuIsa::kAuto) {
  const DeformConv2dTensors t = deform_tensors(p, dt, layout, dev);
  const std::int64_t Ho = p.Ho(), Wo = p.Wo();
  DeformConv2dRun r;
  r.output = Tensor::empty({p.N, p.Cout, Ho, Wo}, dt, dev, layout);
  r.grad_input = Tensor::empty({p.N, p.Cin, p.H, p.W}, dt, dev, layout);
  const std::int64_t taps = p.kh * p.kw;
  r.grad_weight = Tensor::empty({p.Cout, p.groups > 0 ? p.Cin / p.groups : 0, p.kh, p.kw}, dt, dev);
  r.grad_offset = Tensor::empty({p.N, 2 * p.offset_groups * taps, Ho, Wo}, dt, dev, layout);
  if (p.has_mask) r.grad_mask = Tensor::empty({p.N, p.offset_groups * taps, Ho, Wo}, dt, dev, layout);
  if (p.has_bias) r.grad_bias = Tensor::empty({p.Cout}, dt, dev);
  Context ctx;
  ctx.num_threads = threads;
  ctx.cpu_isa = isa;
  deform_conv2d_forward(t.input, t.weight, t.offset, t.mask, t.bias, r.output, p.opt, ctx);
  DeformConv2dGrads g{r.grad_input, r.grad_weight, r.grad_offset, r.grad_mask, r.grad_bias};
  DeformConv2dBackwardOptions b;
  b.mode = mode;
  b.border_rule = p.border_rule;
  deform_conv2d_backward(t.grad_output, t.input, t.weight, t.offset, t.mask, g, p.opt, b, ctx);
  if (!dev.is_cpu()) {
    for (Tensor* x : {&r.output, &r.grad_input, &r.grad_weight, &r.grad_offset, &r.grad_mask, &r.grad_bias})
      if (x->view().defined()) *x = x->to(Device::cpu());
  }
  return r;
}

/// The configurations the CPU, emulated and CUDA tests sweep: plain 3x3, v2 with groups and
/// offset groups, strided / padded / dilated with a non-square kernel, a one-row map.
inline std::vector<DeformConv2dConfig> deform_configs() {
  DeformConv2dOptions plain{}, strided{};
  plain.pad_h = plain.pad_w = 1;
  strided.stride_h = 2, strided.stride_w = 1, strided.pad_h = 2, strided.pad_w = 1, strided.dilation_h = 2,
  strided.dilation_w = 1;
  return {
      {2, 4, 6, 7, 3, 3, 3, 1, 1, plain, false, true},
      {2, 4, 5, 6, 6, 3, 3, 2, 2, plain, true, true},
      {1, 6, 7, 5, 4, 3, 2, 2, 3, strided, true, false},
      {2, 3, 1, 9, 2, 1, 3, 1, 1, plain, true, true},
  };
}

/// A freshly built mmcv DCN layer's first step: zero offsets and padding 1 put every border tap
/// exactly on row or column -1, where the two border rules differ (config 1 of deform_configs:
/// groups, offset groups and a mask).
inline DeformConv2dProblem fresh_dcn_problem(DeformBorderRule rule, std::uint64_t seed) {
  DeformConv2dProblem p = make_deform_problem(deform_configs()[1], seed);
  std::fill(p.offset.begin(), p.offset.end(), 0.0);
  p.border_rule = rule;
  return p;
}

}  // namespace test
}  // namespace detops
