// Multi-scale deformable attention on CUDA against the CPU backend (label gpu; each test skips
// without a device): forward, location and attention-weight gradients and the exact mode's
// grad_value bitwise equal to the CPU's in every dtype, strided too; the exact mode bitwise equal
// from run to run on a DINO-like level pyramid; the atomic mode within rounding of the exact one;
// the level table on the host or on the device.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "ms_deform_attn_test_util.h"

namespace detops {
namespace {

using test::MsdaBuf;
using test::MsdaGrads;
using test::MsdaTensors;

/// The same bytes and view on another device.
MsdaBuf to_device(const MsdaBuf& b, Device dev) {
  MsdaBuf d;
  d.storage = b.storage.to(dev);
  d.view = b.view;
  d.view.data = static_cast<char*>(d.storage.view().data) +
                (static_cast<const char*>(b.view.data) - static_cast<const char*>(b.storage.view().data));
  d.view.device = dev;
  return d;
}
MsdaBuf to_host(const MsdaBuf& b) { return to_device(b, Device::cpu()); }

struct DeviceCall {
  MsdaBuf value, shapes, starts, loc, attn, go;
  DeviceCall(const MsdaTensors& t, const MsdaBuf& grad_out, bool levels_on_host) {
    const Device dev = Device::cuda(0);
    value = to_device(t.value, dev);
    shapes = levels_on_host ? to_device(t.shapes, Device::cpu()) : to_device(t.shapes, dev);
    starts = levels_on_host ? to_device(t.starts, Device::cpu()) : to_device(t.starts, dev);
    loc = to_device(t.loc, dev);
    attn = to_device(t.attn, dev);
    go = to_device(grad_out, dev);
  }
  MsdaBuf forward(const MsdaTensors& t, bool strided) const {
    MsdaBuf out = to_device(test::msda_buf({t.B, t.Q, t.M * t.D}, t.value.view.dtype, strided), Device::cuda(0));
    ms_deform_attn_forward(value.view, shapes.view, starts.view, loc.view, attn.view, out.view);
    return to_host(out);
  }
  MsdaGrads backward(const MsdaTensors& t, BackwardMode mode, bool strided) const {
    const Device dev = Device::cuda(0);
    MsdaGrads g;
    g.value = to_device(test::msda_buf({t.B, t.S, t.M, t.D}, t.value.view.dtype, strided), dev);
    g.loc = to_device(test::msda_buf({t.B, t.Q, t.M, t.L, t.P, 2}, t.loc.view.dtype, strided), dev);
    g.attn = to_device(test::msda_buf({t.B, t.Q, t.M, t.L, t.P}, t.value.view.dtype, strided), dev);
    MsDeformAttnBackwardOptions opt;
    opt.mode = mode;
    ms_deform_attn_backward(value.view, shapes.view, starts.view, loc.view, attn.view, go.view, g.value.view,
                            g.loc.view, g.attn.view, opt);
    return {to_host(g.value), to_host(g.loc), to_host(g.attn)};
  }
};

TEST(MsDeformAttnCuda, MatchesTheCpuBitwiseInEveryDtype) {
  DETOPS_REQUIRE_GPU();
  const ref::MsdaProblemRef pr = test::msda_random_problem(2, 3, 8, 300, 4, {12, 17, 6, 9, 3, 5, 1, 1}, 101);
  for (bool strided : {false, true}) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (DType loc_dt : {DType::kFloat32, dt}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " locations " + std::string(dtype_name(loc_dt)) +
                     (strided ? " strided" : ""));
        const MsdaTensors t(pr, dt, loc_dt, strided);
        const MsdaBuf go = test::msda_filled({t.B, t.Q, t.M * t.D}, dt, test::random_values(t.B * t.Q * t.M * t.D, 5),
                                             strided);
        const DeviceCall dc(t, go, strided);  // the level table on the host for the strided runs
        EXPECT_TRUE(test::msda_same(test::msda_run_forward(t, strided), dc.forward(t, strided)));
        const MsdaGrads cpu = test::msda_run_backward(t, go, BackwardMode::kExact, strided);
        const MsdaGrads gpu = dc.backward(t, BackwardMode::kExact, strided);
        EXPECT_TRUE(test::msda_same(cpu.value, gpu.value)) << "grad_value";
        EXPECT_TRUE(test::msda_same(cpu.loc, gpu.loc)) << "grad_sampling_locations";
        EXPECT_TRUE(test::msda_same(cpu.attn, gpu.attn)) << "grad_attention_weights";
        const MsdaGrads atomic = dc.backward(t, BackwardMode::kAtomic, strided);
        EXPECT_TRUE(test::msda_same(cpu.loc, atomic.loc));
        EXPECT_TRUE(test::msda_same(cpu.attn, atomic.attn));
        const double tol = dt == DType::kFloat64 ? 1e-12 : dt == DType::kFloat32 ? 1e-5 : 3e-2;
        EXPECT_LE(test::max_error_to_peak(test::to_vector(atomic.value.view), test::to_vector(cpu.value.view)), tol);
      }
    }
  }
}

TEST(MsDeformAttnCuda, ExactIsBitwiseFromRunToRun) {
  DETOPS_REQUIRE_GPU();
  // DINO-4scale's pyramid at a quarter of the side, 8 heads of 32 channels, Q = S
  const std::vector<std::int64_t> shapes = {25, 42, 13, 21, 7, 11, 4, 6};
  std::int64_t S = 0;
  for (std::size_t l = 0; l < shapes.size(); l += 2) S += shapes[l] * shapes[l + 1];
  const ref::MsdaProblemRef pr = test::msda_random_problem(1, 8, 32, S, 4, shapes, 111);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const MsdaTensors t(pr, dt, DType::kFloat32, false);
    const MsdaBuf go = test::msda_filled({t.B, t.Q, t.M * t.D}, dt, test::random_values(t.B * t.Q * t.M * t.D, 6),
                                         false);
    const DeviceCall dc(t, go, false);
    const MsdaGrads first = dc.backward(t, BackwardMode::kExact, false);
    for (int run = 0; run < 3; ++run) {
      const MsdaGrads again = dc.backward(t, BackwardMode::kExact, false);
      EXPECT_TRUE(test::msda_same(first.value, again.value)) << "run " << run;
      EXPECT_TRUE(test::msda_same(first.loc, again.loc)) << "run " << run;
      EXPECT_TRUE(test::msda_same(first.attn, again.attn)) << "run " << run;
    }
    const MsdaGrads cpu = test::msda_run_backward(t, go, BackwardMode::kExact, false);
    EXPECT_TRUE(test::msda_same(cpu.value, first.value)) << "CPU vs CUDA";
  }
}

}  // namespace
}  // namespace detops
