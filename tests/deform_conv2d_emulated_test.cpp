// The CUDA backend of deform_conv2d run on the CPU: its own steps (internal/deform_conv2d_device.h,
// the code cuda/deform_conv2d_cuda.cu runs on CudaDevice) on the emulated device
// (tests/emulated_device.h: every thread index in order, CUB's contracts), so launch arguments,
// grid sizes, the sort's keys and bit range, the workspace's carving and the zero fills are the
// GPU's own; byte for byte against the CPU backend, from a poisoned workspace. The CPU backend
// uses its own loops (points computed once per piece and read for every channel, the blocked GEMM
// with k in slices, planes for the scatter, the engine's counting sort), so agreement to the bit
// checks both the CUDA sequence and the claim that the two backends evaluate the same
// arithmetic. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "deform_conv2d_test_util.h"
#include "emulated_device.h"
#include "internal/common.h"
#include "internal/deform_conv2d_backend.h"
#include "internal/deform_conv2d_device.h"

namespace detops {
namespace {

template <class T>
internal::DeformConv2dCall make_call(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p) {
  internal::DeformConv2dCall call{};
  call.op = "emulated";
  call.input = t.input;
  call.weight = t.weight;
  call.offset = t.offset;
  call.mask = t.mask;
  call.bias = t.bias;
  call.grad_output = t.grad_output;
  call.border_rule = p.border_rule;
  detail::DeformConv2dShape& s = call.shape;
  s = {p.N, p.Cin, p.H, p.W, p.Cout, p.kh, p.kw, p.Ho(), p.Wo(), p.groups, p.offset_groups, p.opt.stride_h,
       p.opt.stride_w, p.opt.pad_h, p.opt.pad_w, p.opt.dilation_h, p.opt.dilation_w, p.has_mask, p.has_bias};
  return call;
}

/// The CUDA backend's forward: its own steps (internal/deform_conv2d_device.h) on the emulated device.
template <class T>
Tensor emulate_forward(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p, Layout layout) {
  internal::DeformConv2dCall call = make_call<T>(t, p);
  Tensor out = Tensor::empty({p.N, p.Cout, p.Ho(), p.Wo()}, t.input.view().dtype, Device::cpu(), layout);
  call.output = out.view();
  test::PoisonedWorkspace ws(internal::deform_forward_workspace_bytes(call));
  internal::deform_forward_on<T>(test::EmulatedDevice{}, call, ws.ws);
  return out;
}

/// The CUDA backend's backward: its own steps on the emulated device (the exact mode's phase 3
/// runs channel-fastest for an NHWC grad_input, as on the GPU).
template <class T>
test::DeformConv2dRun emulate_backward(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p,
                                       Layout layout, BackwardMode mode) {
  const DType dt = t.input.view().dtype;
  internal::DeformConv2dCall call = make_call<T>(t, p);
  test::DeformConv2dRun r;
  r.grad_input = Tensor::empty({p.N, p.Cin, p.H, p.W}, dt, Device::cpu(), layout);
  std::memset(r.grad_input.view().data, 0x7f, r.grad_input.nbytes());  // the zero fill must clear it
  r.grad_weight = Tensor::empty(std::vector<std::int64_t>(t.weight.view().sizes, t.weight.view().sizes + 4), dt);
  r.grad_offset = Tensor::empty(std::vector<std::int64_t>(t.offset.view().sizes, t.offset.view().sizes + 4), dt,
                                Device::cpu(), layout);
  if (p.has_mask)
    r.grad_mask = Tensor::empty(std::vector<std::int64_t>(t.mask.view().sizes, t.mask.view().sizes + 4), dt,
                                Device::cpu(), layout);
  if (p.has_bias) r.grad_bias = Tensor::empty({p.Cout}, dt);
  call.grads = {r.grad_input.view(), r.grad_weight.view(), r.grad_offset.view(), r.grad_mask.view(),
                r.grad_bias.view()};
  const test::EmulatedDevice dev;
  test::PoisonedWorkspace ws(internal::deform_backward_workspace_on(dev, call, mode));
  internal::deform_backward_on<T>(dev, call, mode, ws.ws);
  return r;
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  if (!want.view().defined()) return;
  EXPECT_TRUE(test::same_bytes(got, want)) << what;
}

void expect_same_gradients(const test::DeformConv2dRun& got, const test::DeformConv2dRun& want,
                           const std::string& what) {
  expect_same(got.grad_input, want.grad_input, what + " grad_input");
  expect_same(got.grad_weight, want.grad_weight, what + " grad_weight");
  expect_same(got.grad_offset, want.grad_offset, what + " grad_offset");
  expect_same(got.grad_mask, want.grad_mask, what + " grad_mask");
  expect_same(got.grad_bias, want.grad_bias, what + " grad_bias");
}

TEST(DeformConv2dEmulated, KernelBodiesMatchTheCpuBackendBitwise) {
  std::vector<test::DeformConv2dConfig> configs = test::deform_configs();
  // many samples on a small map: runs longer than the engine's partial
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  configs.push_back({2, 6, 4, 5, 5, 3, 3, 1, 2, o, true, true});
  // and a fresh mmcv DCN layer under mmcv's border rule (every border tap at exactly -1)
  for (std::size_t i = 0; i <= configs.size(); ++i) {
    const test::DeformConv2dProblem p = i < configs.size() ? test::make_deform_problem(configs[i], 40 + i, 2.5)
                                                           : test::fresh_dcn_problem(DeformBorderRule::kMmcv, 40 + i);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const test::DeformConv2dTensors t = test::deform_tensors(p, dt, layout);
        for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
          const std::string what = "config " + std::to_string(i) + " " + std::string(dtype_name(dt)) +
                                   (layout == Layout::kNHWC ? " nhwc " : " nchw ") + to_string(mode);
          const test::DeformConv2dRun want = test::run_deform_conv2d(p, dt, layout, mode, 3);
          internal::dispatch_floating(dt, [&](auto tag) {
            using T = decltype(tag);
            if (mode == BackwardMode::kExact) expect_same(emulate_forward<T>(t, p, layout), want.output, what + " output");
            expect_same_gradients(emulate_backward<T>(t, p, layout, mode), want, what);
          });
        }
      }
    }
  }
}

TEST(DeformConv2dEmulated, ChunkedBatchMatchesTheCpuBackendBitwise) {
  // 7 images of 663552 column elements each: the 2^22 budget holds 6, so the CUDA sequence runs a
  // chunk of 6 and a chunk of 1 (images offset by n0, grad_weight's sums continued across chunks).
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  const test::DeformConv2dConfig c{7, 32, 48, 48, 2, 3, 3, 1, 1, o, true, true};
  static_assert(6 * 32 * 9 * 48 * 48 <= (1 << 22) && 7 * 32 * 9 * 48 * 48 > (1 << 22), "two chunks");
  const test::DeformConv2dProblem p = test::make_deform_problem(c, 901);
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
    const test::DeformConv2dTensors t = test::deform_tensors(p, DType::kFloat32, layout);
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
      const std::string what = std::string(layout == Layout::kNHWC ? "nhwc " : "nchw ") + to_string(mode);
      const test::DeformConv2dRun want = test::run_deform_conv2d(p, DType::kFloat32, layout, mode, 2);
      if (mode == BackwardMode::kExact) expect_same(emulate_forward<float>(t, p, layout), want.output, what + " output");
      expect_same_gradients(emulate_backward<float>(t, p, layout, mode), want, what);
    }
  }
}

}  // namespace
}  // namespace detops
