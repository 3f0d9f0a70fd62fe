// The CUDA backend of multi-scale deformable attention run on the CPU: its own steps
// (internal/ms_deform_attn_device.h, the code cuda/ms_deform_attn_cuda.cu runs on CudaDevice) on
// the emulated device (tests/emulated_device.h: every thread index in order, CUB's contracts),
// byte for byte against the CPU backend: forward, location and attention-weight gradients, the
// atomic scatter (in thread order, which is the CPU's order of adds per element) and the exact
// mode (records per chunk of planes, the engine's sort, one (run, channel) per thread), the
// backward from poisoned gradients and workspace; a problem of one plane per chunk runs plane0 > 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "emulated_device.h"
#include "internal/ms_deform_attn_backend.h"
#include "internal/ms_deform_attn_device.h"
#include "ms_deform_attn_call.h"
#include "ms_deform_attn_test_util.h"

namespace detops {
namespace {

/// The validated call the backends would get for these tensors.
internal::MsdaCall make_call(const test::MsdaTensors& t, const ref::MsdaProblemRef& pr) {
  return test::msda_call(t, pr, "emulated");
}

/// Fills a buffer's bytes with a pattern (the backward must overwrite every element).
void poison(const test::MsdaBuf& b) {
  if (b.view.numel() > 0) std::memset(b.view.data, 0xCD, static_cast<std::size_t>(b.view.span_bytes()));
}

// a 1x1 level all samples reach: runs of 320 records, longer than one partial (256)
ref::MsdaProblemRef default_problem() { return test::msda_random_problem(2, 2, 5, 80, 4, {3, 5, 4, 4, 1, 1}, 91); }

template <class T, class Loc>
void check_dtype(DType dt, DType loc_dt, bool strided, const ref::MsdaProblemRef& pr = default_problem()) {
  const test::MsdaTensors t(pr, dt, loc_dt, strided);
  const internal::MsdaCall call0 = make_call(t, pr);
  const test::MsdaBuf go = test::msda_filled({t.B, t.Q, t.M * t.D}, dt, test::random_values(t.B * t.Q * t.M * t.D, 3),
                                             strided);
  // forward
  const test::MsdaBuf cpu_out = test::msda_run_forward(t, strided);
  test::MsdaBuf emu_out = test::msda_buf({t.B, t.Q, t.M * t.D}, dt, strided);
  internal::MsdaCall fcall = call0;
  fcall.output = emu_out.view;
  internal::msda_forward_on<T, Loc>(test::EmulatedDevice{}, fcall, fcall.levels.data());
  EXPECT_TRUE(test::msda_same(cpu_out, emu_out)) << "forward";

  for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
    SCOPED_TRACE(to_string(mode));
    const test::MsdaGrads cpu = test::msda_run_backward(t, go, mode, strided);
    test::MsdaGrads emu;
    emu.value = test::msda_buf({t.B, t.S, t.M, t.D}, dt, strided);
    emu.loc = test::msda_buf({t.B, t.Q, t.M, t.L, t.P, 2}, loc_dt, strided);
    emu.attn = test::msda_buf({t.B, t.Q, t.M, t.L, t.P}, dt, strided);
    poison(emu.value);
    poison(emu.loc);
    poison(emu.attn);
    internal::MsdaCall call = call0;
    call.grad_output = go.view;
    call.grad_value = emu.value.view;
    call.grad_sampling_locations = emu.loc.view;
    call.grad_attention_weights = emu.attn.view;
    const test::EmulatedDevice dev;
    test::PoisonedWorkspace ws(internal::msda_backward_workspace_on(dev, call, mode));
    internal::msda_backward_on<T, Loc>(dev, call, mode, call.levels.data(), ws.ws);
    // (values: the poison fills the strided buffers' gaps too)
    EXPECT_TRUE(test::msda_same_values(cpu.value, emu.value)) << "grad_value";
    EXPECT_TRUE(test::msda_same_values(cpu.loc, emu.loc)) << "grad_sampling_locations";
    EXPECT_TRUE(test::msda_same_values(cpu.attn, emu.attn)) << "grad_attention_weights";
  }
}

TEST(MsDeformAttnEmulated, KernelBodiesMatchTheCpuBackendByteForByte) {
  for (bool strided : {false, true}) {
    SCOPED_TRACE(strided ? "strided" : "contiguous");
    check_dtype<float, float>(DType::kFloat32, DType::kFloat32, strided);
    check_dtype<double, float>(DType::kFloat64, DType::kFloat32, strided);
    check_dtype<Half, Half>(DType::kFloat16, DType::kFloat16, strided);
    check_dtype<BFloat16, double>(DType::kBFloat16, DType::kFloat64, strided);
  }
}

TEST(MsDeformAttnEmulated, ChunksOfOnePlaneMatchTheCpuBackend) {
  // 16384 queries x 2 levels x 4 points x 4 corners = 2^19 records per (b, m) plane: a chunk is one
  // plane, so the exact mode runs B * M = 4 chunks (plane0 = 0..3, keys offset per chunk).
  const ref::MsdaProblemRef pr = test::msda_random_problem(2, 2, 2, 16384, 4, {3, 5, 2, 2}, 92);
  const test::MsdaTensors t(pr, DType::kFloat32, DType::kFloat32, false);
  ASSERT_EQ(internal::msda_chunk_planes(make_call(t, pr).shape), 1);
  check_dtype<float, float>(DType::kFloat32, DType::kFloat32, false, pr);
}

}  // namespace
}  // namespace detops
