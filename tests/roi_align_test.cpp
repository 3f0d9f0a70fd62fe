// RoIAlign on the CPU: every dtype x layout x backward mode x pool mode against the float64
// reference, bitwise reproducibility of the truncated and exact modes (runs, thread counts,
// layouts), empty problems, and the bad-input matrix with poisoned outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "detops/detail/roi_align_math.h"
#include "reference/roi_align_reference.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;
using test::to_vector;

/// Values as the library sees them after storing in dtype (so the reference sees the same input).
std::vector<double> rounded(const std::vector<double>& v, DType dt) {
  Tensor t = make_tensor({static_cast<std::int64_t>(v.size())}, dt, v);
  return to_vector(t);
}

double forward_tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 2e-6;
    case DType::kFloat16: return 2e-3;
    default: return 1.6e-2;
  }
}

double backward_tolerance(DType dt, BackwardMode mode) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 5e-6;
    case DType::kFloat16: return mode == BackwardMode::kAtomic ? 1.5e-2 : 2e-3;
    default: return mode == BackwardMode::kAtomic ? 8e-2 : 1.6e-2;
  }
}

struct Problem {
  std::int64_t N = 2, C = 5, H = 13, W = 17, K = 12;
  RoiAlignOptions opt;
  std::vector<double> input, rois, grad;
};

Problem make_problem(std::int64_t sampling_ratio, bool aligned, PoolMode pool, std::uint64_t seed) {
  Problem p;
  p.opt.pooled_height = 3;
  p.opt.pooled_width = 4;
  p.opt.spatial_scale = 0.5;
  p.opt.sampling_ratio = sampling_ratio;
  p.opt.aligned = aligned;
  p.opt.pool_mode = pool;
  p.input = test::random_values(static_cast<std::size_t>(p.N * p.C * p.H * p.W), seed, -2.0, 2.0);
  p.rois = test::random_rois(p.K, p.N, p.H / 0.5, p.W / 0.5, seed + 1, 1.0, 20.0);
  // edge cases: a box beyond the apron, a zero-size box, a box covering the whole map
  p.rois[0 * 5 + 1] = -20, p.rois[0 * 5 + 2] = -20, p.rois[0 * 5 + 3] = -6, p.rois[0 * 5 + 4] = -4;
  p.rois[1 * 5 + 1] = 7, p.rois[1 * 5 + 2] = 9, p.rois[1 * 5 + 3] = 7, p.rois[1 * 5 + 4] = 9;
  p.rois[2 * 5 + 1] = -3, p.rois[2 * 5 + 2] = -3, p.rois[2 * 5 + 3] = 40, p.rois[2 * 5 + 4] = 30;
  p.grad = test::random_values(static_cast<std::size_t>(p.K * p.C * p.opt.pooled_height * p.opt.pooled_width),
                               seed + 2, -1.0, 1.0);
  return p;
}

using Param = std::tuple<DType, Layout, BackwardMode, PoolMode, bool /*aligned*/, std::int64_t /*sampling*/>;

class RoiAlignCpu : public ::testing::TestWithParam<Param> {};

TEST_P(RoiAlignCpu, MatchesFloat64Reference) {
  const auto [dt, layout, mode, pool, aligned, sr] = GetParam();
  Problem p = make_problem(sr, aligned, pool, 1234 + static_cast<std::uint64_t>(sr) * 7 + (aligned ? 1 : 0));
  const std::int64_t PH = p.opt.pooled_height, PW = p.opt.pooled_width;
  const std::vector<double> in_r = rounded(p.input, dt);
  Tensor input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input, layout);
  Tensor rois = make_tensor({p.K, 5}, dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32, p.rois);
  Tensor output = Tensor::empty({p.K, p.C, PH, PW}, dt, Device::cpu(), layout);
  Tensor argmax;
  if (pool == PoolMode::kMax) argmax = Tensor::empty({p.K, p.C, PH, PW}, DType::kInt32, Device::cpu(), layout);
  output.fill_bytes(0xCD);
  Context ctx;
  ctx.num_threads = 2;
  roi_align_forward(input, rois, output, p.opt, ctx, argmax);

  std::vector<double> rois_used = to_vector(rois);
  std::vector<double> ref_out;
  std::vector<std::int32_t> ref_argmax;
  ref::roi_align_forward_ref(in_r, p.N, p.C, p.H, p.W, rois_used, p.K, PH, PW, p.opt.spatial_scale, sr, aligned,
                             pool == PoolMode::kMax, &ref_out, &ref_argmax);
  EXPECT_LE(test::max_rel_error(to_vector(output), ref_out), forward_tolerance(dt));

  // Backward against the reference fed with the same (possibly truncated) gradients.
  Tensor grad_output = make_tensor({p.K, p.C, PH, PW}, dt, p.grad, layout);
  std::vector<double> g = to_vector(grad_output);
  if (mode == BackwardMode::kTruncated)
    for (double& x : g) x = static_cast<float>(from_double<Half>(x));
  std::vector<std::int32_t> am;
  if (pool == PoolMode::kMax) {
    const std::vector<double> a = to_vector(argmax);
    am.assign(a.begin(), a.end());
  }
  const std::vector<double> ref_grad =
      ref::roi_align_backward_ref(g, p.N, p.C, p.H, p.W, rois_used, p.K, PH, PW, p.opt.spatial_scale, sr, aligned,
                                  pool == PoolMode::kMax, pool == PoolMode::kMax ? &am : nullptr);
  Tensor grad_input = Tensor::empty({p.N, p.C, p.H, p.W}, dt, Device::cpu(), layout);
  grad_input.fill_bytes(0xCD);  // fully overwritten, including untouched positions
  RoiAlignBackwardOptions b;
  b.mode = mode;
  roi_align_backward(grad_output, rois, grad_input, p.opt, b, ctx, argmax);
  EXPECT_LE(test::max_rel_error(to_vector(grad_input), ref_grad), backward_tolerance(dt, mode));
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dt, layout, mode, pool, aligned, sr] = info.param;
  return std::string(dtype_name(dt)) + (layout == Layout::kNHWC ? "_nhwc_" : "_nchw_") + to_string(mode) + "_" +
         to_string(pool) + (aligned ? "_aligned" : "_legacy") + (sr > 0 ? "_sr" + std::to_string(sr) : "_adaptive");
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, RoiAlignCpu,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(Layout::kNCHW, Layout::kNHWC),
                       ::testing::Values(BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact),
                       ::testing::Values(PoolMode::kAvg, PoolMode::kMax), ::testing::Bool(),
                       ::testing::Values<std::int64_t>(0, 2)),
    param_name);

// ---------------------------------------------------------------------------------------------
// Bitwise reproducibility

struct Workload {
  Tensor input, rois, grad_output, argmax;
  RoiAlignOptions opt;
};

Workload detection_workload(DType dt, Layout layout, PoolMode pool, std::int64_t sr) {
  Workload w;
  const std::int64_t N = 2, C = 16, H = 50, W = 68, K = 160;
  w.opt.pooled_height = 7;
  w.opt.pooled_width = 7;
  w.opt.spatial_scale = 0.25;
  w.opt.sampling_ratio = sr;
  w.opt.aligned = true;
  w.opt.pool_mode = pool;
  w.input = make_tensor({N, C, H, W}, dt, test::random_values(static_cast<std::size_t>(N * C * H * W), 7), layout);
  // clustered, heavily overlapping boxes: many contributions per position
  w.rois = make_tensor({K, 5}, DType::kFloat32, test::random_rois(K, N, H * 4.0, W * 4.0, 8, 8.0, 120.0));
  w.grad_output =
      make_tensor({K, C, 7, 7}, dt, test::random_values(static_cast<std::size_t>(K * C * 49), 9, -1e-3, 1e-3), layout);
  if (pool == PoolMode::kMax) {
    w.argmax = Tensor::empty({K, C, 7, 7}, DType::kInt32, Device::cpu(), layout);
    Tensor out = Tensor::empty({K, C, 7, 7}, dt, Device::cpu(), layout);
    roi_align_forward(w.input, w.rois, out, w.opt, {}, w.argmax);
  }
  return w;
}

Tensor run_backward(const Workload& w, BackwardMode mode, int threads, Layout layout, DType dt) {
  Tensor gi = Tensor::empty({w.input.size(0), w.input.size(1), w.input.size(2), w.input.size(3)}, dt, Device::cpu(), layout);
  Context ctx;
  ctx.num_threads = threads;
  RoiAlignBackwardOptions b;
  b.mode = mode;
  roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, ctx, w.argmax);
  return gi;
}

class RoiAlignReproducible : public ::testing::TestWithParam<std::tuple<DType, PoolMode, std::int64_t>> {};

TEST_P(RoiAlignReproducible, TwentyRunsSameBytes) {
  const auto [dt, pool, sr] = GetParam();
  const Workload w = detection_workload(dt, Layout::kNCHW, pool, sr);
  for (BackwardMode mode : {BackwardMode::kTruncated, BackwardMode::kExact}) {
    const Tensor first = run_backward(w, mode, 2, Layout::kNCHW, dt);
    for (int run = 1; run < 20; ++run)
      ASSERT_TRUE(test::same_bytes(first, run_backward(w, mode, 2, Layout::kNCHW, dt)))
          << to_string(mode) << " run " << run;
  }
}

TEST_P(RoiAlignReproducible, ExactSameBytesForAnyThreadCountAndLayout) {
  const auto [dt, pool, sr] = GetParam();
  const Workload w = detection_workload(dt, Layout::kNCHW, pool, sr);
  const Tensor one = run_backward(w, BackwardMode::kExact, 1, Layout::kNCHW, dt);
  for (int threads : {2, 3, 8})
    EXPECT_TRUE(test::same_bytes(one, run_backward(w, BackwardMode::kExact, threads, Layout::kNCHW, dt)))
        << threads << " threads";
  // NHWC output of the same problem holds the same values, bit for bit.
  const Tensor nhwc = run_backward(w, BackwardMode::kExact, 2, Layout::kNHWC, dt);
  EXPECT_TRUE(test::same_bytes(one, nhwc.contiguous(Layout::kNCHW)));
  // ... and so does an NHWC grad_output (the gather reads it channel-contiguous).
  Workload w2 = detection_workload(dt, Layout::kNHWC, pool, sr);
  EXPECT_TRUE(test::same_bytes(one, run_backward(w2, BackwardMode::kExact, 2, Layout::kNCHW, dt)));
}

// The scatter modes on the CPU add into each element in one order (rois, bins, samples, corners)
// whatever the walk: thread counts, NHWC grad_input (the truncated mode's double buffer then is
// NHWC too), NHWC grad_output and a channels-last grad_input with padded channels all give the
// bits of the one-thread NCHW run.
TEST_P(RoiAlignReproducible, ScatterModesSameBytesForAnyThreadCountAndLayout) {
  const auto [dt, pool, sr] = GetParam();
  const Workload w = detection_workload(dt, Layout::kNCHW, pool, sr);
  const Workload w_nhwc = detection_workload(dt, Layout::kNHWC, pool, sr);
  const std::int64_t N = w.input.size(0), C = w.input.size(1), H = w.input.size(2), W = w.input.size(3);
  constexpr std::int64_t kPad = 2;
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated}) {
    const Tensor one = run_backward(w, mode, 1, Layout::kNCHW, dt);
    for (int threads : {2, 3}) {
      EXPECT_TRUE(test::same_bytes(one, run_backward(w, mode, threads, Layout::kNCHW, dt)))
          << to_string(mode) << " " << threads << " threads";
      EXPECT_TRUE(test::same_bytes(one, run_backward(w, mode, threads, Layout::kNHWC, dt).contiguous(Layout::kNCHW)))
          << to_string(mode) << " NHWC, " << threads << " threads";
      EXPECT_TRUE(test::same_bytes(one, run_backward(w_nhwc, mode, threads, Layout::kNHWC, dt).contiguous(Layout::kNCHW)))
          << to_string(mode) << " NHWC grad_output, " << threads << " threads";
    }
    EXPECT_TRUE(test::same_bytes(one, run_backward(w, mode, 1, Layout::kNHWC, dt).contiguous(Layout::kNCHW)))
        << to_string(mode) << " NHWC, 1 thread";
    // channels-last with C + kPad channels per position; the padding stays untouched
    Tensor buf = Tensor::empty({N, H, W, C + kPad}, dt);
    buf.fill_bytes(0xCD);
    const TensorView gi(buf.view().data, dt, Device::cpu(), {N, C, H, W},
                        {H * W * (C + kPad), 1, W * (C + kPad), C + kPad});
    Context ctx;
    ctx.num_threads = 2;
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, ctx, w.argmax);
    Tensor dense = Tensor::empty({N, C, H, W}, dt);
    test::fill_from(dense.view(), test::to_vector(gi));
    EXPECT_TRUE(test::same_bytes(one, dense)) << to_string(mode) << " padded channels-last";
    const auto* bytes = static_cast<const unsigned char*>(buf.view().data);
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt));
    bool untouched = true;
    for (std::int64_t pos = 0; pos < N * H * W; ++pos)
      for (std::int64_t i = C * es; i < (C + kPad) * es; ++i) untouched = untouched && bytes[pos * (C + kPad) * es + i] == 0xCD;
    EXPECT_TRUE(untouched) << to_string(mode) << " padding written";
  }
}

std::string reproducible_name(const ::testing::TestParamInfo<std::tuple<DType, PoolMode, std::int64_t>>& info) {
  const auto [dt, pool, sr] = info.param;
  return std::string(dtype_name(dt)) + "_" + to_string(pool) + (sr > 0 ? "_sr2" : "_adaptive");
}

INSTANTIATE_TEST_SUITE_P(Modes, RoiAlignReproducible,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kFloat64),
                                            ::testing::Values(PoolMode::kAvg, PoolMode::kMax),
                                            ::testing::Values<std::int64_t>(0, 2)),
                         reproducible_name);

TEST(RoiAlignCpuForward, SameBytesForAnyThreadCountAndLayout) {
  const Workload w = detection_workload(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0);
  auto run = [&](int threads, Layout layout) {
    Tensor out = Tensor::empty({160, 16, 7, 7}, DType::kFloat32, Device::cpu(), layout);
    Context ctx;
    ctx.num_threads = threads;
    roi_align_forward(w.input, w.rois, out, w.opt, ctx);
    return out.contiguous(Layout::kNCHW);
  };
  const Tensor a = run(1, Layout::kNCHW);
  EXPECT_TRUE(test::same_bytes(a, run(4, Layout::kNCHW)));
  EXPECT_TRUE(test::same_bytes(a, run(2, Layout::kNHWC)));
}

// num_threads = INT_MAX once split a tiny forward into ~8.6e9 work items and tried to start a
// thread for each (gigabytes, no return): the context caps the threads, with the same bits.
TEST(RoiAlignCpuForward, HugeThreadCountIsCheapAndGivesTheSameBits) {
  Tensor input = make_tensor({1, 2, 4, 4}, DType::kFloat32, test::random_values(32, 77));
  Tensor rois = make_tensor({1, 5}, DType::kFloat32, {0, 0.5, 0.5, 3.0, 2.5});
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 2;
  auto run = [&](int threads) {
    Tensor out = Tensor::empty({1, 2, 2, 2}, DType::kFloat32);
    Context ctx;
    ctx.num_threads = threads;
    roi_align_forward(input, rois, out, o, ctx);
    return out;
  };
  const Tensor one = run(1);
  EXPECT_TRUE(test::same_bytes(one, run(std::numeric_limits<int>::max())));
}

// ---------------------------------------------------------------------------------------------
// Semantics pinned by hand (values from the anchors' measured table: a 4x4 map holding 1..16)

TEST(RoiAlignCpuSemantics, ApronRuleAndCountedZeros) {
  std::vector<double> v(16);
  for (int i = 0; i < 16; ++i) v[i] = i + 1;
  Tensor input = make_tensor({1, 1, 4, 4}, DType::kFloat64, v);
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 1;
  o.sampling_ratio = 1;
  o.aligned = false;
  auto pool_at = [&](double cy) {  // a 1x1 box centred at (cy, 1.5)
    Tensor rois = make_tensor({1, 5}, DType::kFloat64, {0, 1.0, cy - 0.5, 2.0, cy + 0.5});
    Tensor out = Tensor::empty({1, 1, 1, 1}, DType::kFloat64);
    roi_align_forward(input, rois, out, o);
    return out.data<double>()[0];
  };
  EXPECT_EQ(pool_at(-1.5), 0.0);
  EXPECT_EQ(pool_at(-1.0), 2.5);  // -1 is inside the apron (inclusive)
  EXPECT_EQ(pool_at(-0.5), 2.5);
  EXPECT_EQ(pool_at(4.0), 14.5);  // H is inclusive too
  EXPECT_EQ(pool_at(4.0001), 0.0);
}

TEST(RoiAlignCpuSemantics, EmptyRoisAndZeroChannels) {
  Tensor input = make_tensor({1, 3, 4, 4}, DType::kFloat32, test::random_values(48, 1));
  Tensor rois = Tensor::empty({0, 5}, DType::kFloat32);
  Tensor out = Tensor::empty({0, 3, 7, 7}, DType::kFloat32);
  RoiAlignOptions o;
  EXPECT_NO_THROW(roi_align_forward(input, rois, out, o));
  for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    Tensor gi = Tensor::empty({1, 3, 4, 4}, DType::kFloat32);
    gi.fill_bytes(0xCD);
    RoiAlignBackwardOptions b;
    b.mode = m;
    roi_align_backward(out, rois, gi, o, b);
    for (double x : to_vector(gi)) EXPECT_EQ(x, 0.0) << to_string(m);
  }
}

TEST(RoiAlignCpuSemantics, CallerWorkspaceMatchesAllocatedOne) {
  const Workload w = detection_workload(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0);
  RoiAlignBackwardOptions b;
  Tensor gi = Tensor::empty({2, 16, 50, 68}, DType::kFloat32);
  const std::size_t bytes = roi_align_backward_workspace_size(w.grad_output, w.rois, gi, w.opt, b);
  ASSERT_GT(bytes, 0u);
  std::vector<unsigned char> buf(bytes);
  roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{buf.data(), buf.size()});
  EXPECT_TRUE(test::same_bytes(gi, run_backward(w, BackwardMode::kExact, 2, Layout::kNCHW, DType::kFloat32)));
  Tensor gi2 = Tensor::empty({2, 16, 50, 68}, DType::kFloat32);
  gi2.fill_bytes(0xCD);
  EXPECT_THROW(roi_align_backward(w.grad_output, w.rois, gi2, w.opt, b, {}, {}, Workspace{buf.data(), bytes - 1}),
               Error);
  for (double x : to_vector(gi2)) ASSERT_TRUE(std::isnan(x) || x != 0.0);  // untouched poison
}

// A caller's workspace that overlaps one of the call's tensors would be written while that tensor
// is read (or written): rejected up front, naming the tensor, with grad_input untouched.
TEST(RoiAlignCpuSemantics, CallerWorkspaceOverlappingATensorIsRejected) {
  const Workload w = detection_workload(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0);
  RoiAlignBackwardOptions b;
  Tensor gi = Tensor::empty({2, 16, 50, 68}, DType::kFloat32);
  const std::size_t bytes = roi_align_backward_workspace_size(w.grad_output, w.rois, gi, w.opt, b);
  const std::size_t gi_bytes = static_cast<std::size_t>(gi.view().span_bytes());
  // one buffer: grad_input at its start, then room for a workspace
  std::vector<float> buf((gi_bytes + bytes) / sizeof(float) + 64);
  TensorView gi_view = gi.view();
  gi_view.data = buf.data();
  auto* base = reinterpret_cast<unsigned char*>(buf.data());
  for (std::size_t start : {std::size_t{0}, gi_bytes / 2, gi_bytes - 4}) {  // inside grad_input
    std::fill(buf.begin(), buf.end(), -7.0f);
    try {
      roi_align_backward(w.grad_output, w.rois, gi_view, w.opt, b, {}, {}, Workspace{base + start, bytes});
      ADD_FAILURE() << "workspace at +" << start << " overlaps grad_input and was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("grad_input"), std::string::npos) << e.what();
    }
    for (float x : buf) ASSERT_EQ(x, -7.0f);  // nothing written
  }
  // right after grad_input: accepted, and the result is the allocated workspace's
  roi_align_backward(w.grad_output, w.rois, gi_view, w.opt, b, {}, {}, Workspace{base + gi_bytes, bytes});
  Tensor expected = run_backward(w, BackwardMode::kExact, 2, Layout::kNCHW, DType::kFloat32);
  EXPECT_EQ(std::memcmp(buf.data(), expected.view().data, gi_bytes), 0);
  // over grad_output and over rois
  auto* go = static_cast<unsigned char*>(w.grad_output.view().data);
  EXPECT_THROW(roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{go + 8, bytes}), Error);
  auto* rois = static_cast<unsigned char*>(w.rois.view().data);
  EXPECT_THROW(roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{rois, bytes}), Error);
}

// The channels-last forward and exact backward run sums are compiled once per instruction set
// (src/roi_align_cpu_kernels.inc): every variant gives the baseline's bits, for every dtype, both
// pooling modes, adaptive and fixed sampling, with inf and NaN in the data (NaN payloads too).
TEST(RoiAlignCpuForward, InstructionSetVariantsGiveTheSameBits) {
  std::vector<CpuIsa> variants;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
    else std::printf("[ note ] this CPU has no %s: that variant is not compared\n", cpu_isa_name(isa));
  }
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16})
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
      for (std::int64_t sr : {0, 2}) {
        Workload w = detection_workload(dt, Layout::kNHWC, pool, sr);
        std::vector<double> v = to_vector(w.input);
        v[17] = std::numeric_limits<double>::infinity();
        v[4000] = std::numeric_limits<double>::quiet_NaN();
        Tensor input = make_tensor({2, 16, 50, 68}, dt, v, Layout::kNHWC);
        auto forward = [&](CpuIsa isa, Tensor& am) {
          Context ctx;
          ctx.num_threads = 2;
          ctx.cpu_isa = isa;
          EXPECT_EQ(ctx.resolved_cpu_isa(), isa);
          Tensor out = Tensor::empty({w.rois.size(0), 16, 7, 7}, dt, Device::cpu(), Layout::kNHWC);
          roi_align_forward(input, w.rois, out, w.opt, ctx, pool == PoolMode::kMax ? am.view() : TensorView{});
          return out;
        };
        Tensor am0 = Tensor::empty({w.rois.size(0), 16, 7, 7}, DType::kInt32, Device::cpu(), Layout::kNHWC);
        const Tensor base = forward(CpuIsa::kBaseline, am0);
        // the exact backward's run sums (channels innermost), with inf and NaN among the gradients
        std::vector<double> g = to_vector(w.grad_output);
        g[3] = -std::numeric_limits<double>::infinity();
        g[999] = std::numeric_limits<double>::quiet_NaN();
        const Tensor grad_output = make_tensor({w.rois.size(0), 16, 7, 7}, dt, g, Layout::kNHWC);
        auto backward = [&](CpuIsa isa) {
          Context ctx;
          ctx.num_threads = 2;
          ctx.cpu_isa = isa;
          RoiAlignBackwardOptions b;
          b.mode = BackwardMode::kExact;
          Tensor gi = Tensor::empty({2, 16, 50, 68}, dt, Device::cpu(), Layout::kNHWC);
          roi_align_backward(grad_output, w.rois, gi, w.opt, b, ctx, pool == PoolMode::kMax ? am0.view() : TensorView{});
          return gi;
        };
        const Tensor base_gi = backward(CpuIsa::kBaseline);
        for (CpuIsa isa : variants) {
          Tensor am = Tensor::empty({w.rois.size(0), 16, 7, 7}, DType::kInt32, Device::cpu(), Layout::kNHWC);
          EXPECT_TRUE(test::same_bytes(forward(isa, am), base)) << dtype_name(dt) << " " << cpu_isa_name(isa);
          if (pool == PoolMode::kMax) {
            EXPECT_TRUE(test::same_bytes(am, am0)) << "argmax " << cpu_isa_name(isa);
          }
          EXPECT_TRUE(test::same_bytes(backward(isa), base_gi)) << "exact backward " << dtype_name(dt) << " "
                                                                << cpu_isa_name(isa);
        }
      }
}

// Views that are neither dense NCHW nor dense NHWC (rows padded to W + 3, the padding holding
// 0xCD bytes): the forward reading and writing them, and every backward mode writing grad_input
// through one, give the dense results bit for bit and never write the padding.
TEST(RoiAlignCpuSemantics, PaddedViewsGiveTheDenseBits) {
  constexpr std::int64_t kPad = 3;
  auto padded = [](std::initializer_list<std::int64_t> sizes, DType dt) {
    std::vector<std::int64_t> s(sizes);
    Tensor buf = Tensor::empty({s[0], s[1], s[2], s[3] + kPad}, dt);
    buf.fill_bytes(0xCD);
    return buf;
  };
  auto view_of = [](const Tensor& buf) {
    TensorView v = buf.view();
    v.sizes[3] -= kPad;
    return v;
  };
  auto padding_untouched = [](const Tensor& buf) {
    const auto* b = static_cast<const unsigned char*>(buf.view().data);
    const std::int64_t row = buf.size(3) * static_cast<std::int64_t>(dtype_size(buf.view().dtype));
    const std::int64_t pad = kPad * static_cast<std::int64_t>(dtype_size(buf.view().dtype));
    for (std::int64_t r = 0; r < buf.numel() / buf.size(3); ++r)
      for (std::int64_t i = row - pad; i < row; ++i)
        if (b[r * row + i] != 0xCD) return false;
    return true;
  };
  for (DType dt : {DType::kFloat32, DType::kFloat16})
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax}) {
      const Problem p = make_problem(2, true, pool, 4321);
      const std::int64_t PH = p.opt.pooled_height, PW = p.opt.pooled_width;
      Context ctx;
      ctx.num_threads = 2;
      const Tensor input = make_tensor({p.N, p.C, p.H, p.W}, dt, p.input);
      const Tensor in_buf = padded({p.N, p.C, p.H, p.W}, dt);
      test::fill_from(view_of(in_buf), p.input);
      const Tensor rois = make_tensor({p.K, 5}, DType::kFloat32, p.rois);
      Tensor out = Tensor::empty({p.K, p.C, PH, PW}, dt), am = Tensor::empty({p.K, p.C, PH, PW}, DType::kInt32);
      const Tensor out_buf = padded({p.K, p.C, PH, PW}, dt);
      const Tensor am_buf = padded({p.K, p.C, PH, PW}, DType::kInt32);
      const bool max = pool == PoolMode::kMax;
      roi_align_forward(input, rois, out, p.opt, ctx, max ? TensorView(am) : TensorView{});
      roi_align_forward(view_of(in_buf), rois, view_of(out_buf), p.opt, ctx, max ? view_of(am_buf) : TensorView{});
      EXPECT_EQ(to_vector(view_of(out_buf)), to_vector(out)) << dtype_name(dt) << " " << to_string(pool);
      EXPECT_TRUE(padding_untouched(out_buf));
      if (max) {
        EXPECT_EQ(to_vector(view_of(am_buf)), to_vector(am));
        EXPECT_TRUE(padding_untouched(am_buf));
      }
      const Tensor grad = make_tensor({p.K, p.C, PH, PW}, dt, p.grad);
      for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
        RoiAlignBackwardOptions b;
        b.mode = mode;
        Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, dt);
        const Tensor gi_buf = padded({p.N, p.C, p.H, p.W}, dt);
        roi_align_backward(grad, rois, gi, p.opt, b, ctx, max ? TensorView(am) : TensorView{});
        roi_align_backward(grad, rois, view_of(gi_buf), p.opt, b, ctx, max ? TensorView(am) : TensorView{});
        EXPECT_EQ(to_vector(view_of(gi_buf)), to_vector(gi)) << to_string(mode) << " " << to_string(pool);
        EXPECT_TRUE(padding_untouched(gi_buf)) << to_string(mode);
      }
    }
}

TEST(RoiAlignCpuSemantics, WorkspaceQueryForMaxPoolingNeedsNoArgmax) {
  const Workload w = detection_workload(DType::kFloat32, Layout::kNCHW, PoolMode::kMax, 2);
  RoiAlignBackwardOptions b;
  Tensor gi = Tensor::empty({2, 16, 50, 68}, DType::kFloat32);
  const std::size_t bytes = roi_align_backward_workspace_size(w.grad_output, w.rois, gi, w.opt, b);
  std::vector<unsigned char> buf(bytes);
  roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, {}, w.argmax, Workspace{buf.data(), buf.size()});
  EXPECT_TRUE(test::same_bytes(gi, run_backward(w, BackwardMode::kExact, 2, Layout::kNCHW, DType::kFloat32)));
}

// Regression (found by the fuzzer): NHWC input and output with an NCHW argmax: the vectorized
// max-pool path must write argmax through its own strides.
TEST(RoiAlignCpuSemantics, MaxPoolArgmaxLayoutIndependentOfOutput) {
  const std::vector<double> v = test::random_values(2 * 3 * 6 * 7, 17);
  Tensor in_nchw = make_tensor({2, 3, 6, 7}, DType::kFloat32, v);
  Tensor in_nhwc = make_tensor({2, 3, 6, 7}, DType::kFloat32, v, Layout::kNHWC);
  Tensor rois = make_tensor({2, 5}, DType::kFloat32, {0, 1, 1, 9, 10, 1, 0, 2, 12, 8});
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 2;
  o.sampling_ratio = 2;
  o.pool_mode = PoolMode::kMax;
  Tensor out_a = Tensor::empty({2, 3, 2, 2}, DType::kFloat32), am_a = Tensor::empty({2, 3, 2, 2}, DType::kInt32);
  roi_align_forward(in_nchw, rois, out_a, o, {}, am_a);
  Tensor out_b = Tensor::empty({2, 3, 2, 2}, DType::kFloat32, Device::cpu(), Layout::kNHWC);
  Tensor am_b = Tensor::empty({2, 3, 2, 2}, DType::kInt32);  // NCHW argmax with an NHWC output
  am_b.fill_bytes(0xA5);
  roi_align_forward(in_nhwc, rois, out_b, o, {}, am_b);
  EXPECT_EQ(to_vector(out_a), to_vector(out_b));
  EXPECT_TRUE(test::same_bytes(am_a, am_b));
}

TEST(RoiAlignCpuSemantics, TruncatedBFloat16KeepsLargeGradients) {
  // 1e6 overflows float16 (max 65504) but not bfloat16: loss-scaled gradients survive.
  Tensor input = make_tensor({1, 1, 4, 4}, DType::kFloat32, std::vector<double>(16, 0.0));
  Tensor rois = make_tensor({1, 5}, DType::kFloat32, {0, 0.5, 0.5, 2.5, 2.5});
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 1;
  o.sampling_ratio = 1;
  Tensor go = make_tensor({1, 1, 1, 1}, DType::kFloat32, {1e6});
  Tensor gi = Tensor::empty({1, 1, 4, 4}, DType::kFloat32);
  RoiAlignBackwardOptions b;
  b.mode = BackwardMode::kTruncated;
  b.truncation = TruncationFormat::kFloat16;
  roi_align_backward(go, rois, gi, o, b);
  EXPECT_TRUE(std::isinf(to_vector(gi)[5]));
  b.truncation = TruncationFormat::kBFloat16;
  roi_align_backward(go, rois, gi, o, b);
  // 1e6 rounds to 999424 in bfloat16 (8 significand bits); the centre sample gives 1/4 of it to
  // each of its four neighbours.
  EXPECT_EQ(to_vector(gi)[5], 999424.0 / 4);
}

// ---------------------------------------------------------------------------------------------
// Bad input: the documented error, and outputs left byte for byte as they were.

struct BadCase {
  const char* name;
  std::function<void(Tensor& input, Tensor& rois, Tensor& out, RoiAlignOptions& o, Tensor& argmax)> mutate;
  const char* message;  // expected substring
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class RoiAlignBadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(RoiAlignBadInput, ThrowsAndLeavesOutputsUntouched) {
  const BadCase& bc = GetParam();
  Tensor input = make_tensor({2, 3, 8, 8}, DType::kFloat32, test::random_values(2 * 3 * 64, 3));
  Tensor rois = make_tensor({3, 5}, DType::kFloat32, {0, 1, 1, 5, 5, 1, 0, 0, 7, 7, 0, 2, 2, 3, 6});
  Tensor out = Tensor::empty({3, 3, 2, 2}, DType::kFloat32);
  Tensor argmax;
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 2;
  bc.mutate(input, rois, out, o, argmax);
  out.fill_bytes(0xA5);
  if (argmax.numel() > 0) argmax.fill_bytes(0xA5);
  std::vector<unsigned char> snapshot(static_cast<const unsigned char*>(out.view().data),
                                      static_cast<const unsigned char*>(out.view().data) + out.nbytes());
  try {
    roi_align_forward(input, rois, out, o, {}, argmax);
    FAIL() << "no error for " << bc.name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bc.message), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("roi_align_forward"), std::string::npos) << e.what();
  }
  EXPECT_EQ(0, std::memcmp(snapshot.data(), out.view().data, out.nbytes()));
  // The backward rejects the same rois, leaving grad_input untouched.
  if (std::string(bc.name).rfind("roi_", 0) == 0) {
    Tensor gi = Tensor::empty({input.size(0), input.size(1), input.size(2), input.size(3)}, DType::kFloat32);
    gi.fill_bytes(0x5A);
    std::vector<unsigned char> gsnap(static_cast<const unsigned char*>(gi.view().data),
                                     static_cast<const unsigned char*>(gi.view().data) + gi.nbytes());
    Tensor go = make_tensor({3, 3, 2, 2}, DType::kFloat32, std::vector<double>(36, 1.0));
    for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
      RoiAlignBackwardOptions b;
      b.mode = m;
      EXPECT_THROW(roi_align_backward(go, rois, gi, o, b, {}, argmax), Error);
      EXPECT_EQ(0, std::memcmp(gsnap.data(), gi.view().data, gi.nbytes()));
    }
  }
}

void set_roi(Tensor& rois, int row, int col, double v) { rois.data<float>()[row * 5 + col] = static_cast<float>(v); }

const BadCase kBadCases[] = {
    {"roi_batch_fractional", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { set_roi(r, 2, 0, 1.5); },
     "rois[2] has batch index 1.5; expected an integer in [0, 2)"},
    {"roi_batch_too_large", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { set_roi(r, 1, 0, 2); },
     "rois[1] has batch index 2; expected an integer in [0, 2)"},
    {"roi_batch_negative", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { set_roi(r, 0, 0, -1); },
     "rois[0] has batch index -1"},
    {"roi_batch_nan", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { set_roi(r, 0, 0, NAN); },
     "rois[0] has batch index nan"},
    {"roi_batch_huge", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { set_roi(r, 0, 0, 1e30); },
     "rois[0] has batch index 1.00000001504"},
    {"roi_coord_nan", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { set_roi(r, 1, 3, NAN); },
     "rois[1] has coordinates"},
    {"roi_coord_inf", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { set_roi(r, 2, 1, -INFINITY); },
     "expected finite values"},
    {"roi_adaptive_grid_too_large",
     [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions& o, Tensor&) {
       o.sampling_ratio = 0;
       set_roi(r, 1, 3, 3e7);
     },
     "max_samples_per_roi"},
    {"input_rank", [](Tensor& in, Tensor&, Tensor&, RoiAlignOptions&, Tensor&) { in = Tensor::empty({2, 3, 64}, DType::kFloat32); },
     "input has rank 3 (sizes [2, 3, 64]); expected rank 4"},
    {"rois_columns", [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { r = Tensor::empty({3, 4}, DType::kFloat32); },
     "rois has sizes [3, 4]; expected [K, 5]"},
    {"rois_dtype",
     [](Tensor&, Tensor& r, Tensor&, RoiAlignOptions&, Tensor&) { r = Tensor::zeros({3, 5}, DType::kFloat16); },
     "rois has dtype float16; expected float32"},
    {"output_dtype",
     [](Tensor&, Tensor&, Tensor& out, RoiAlignOptions&, Tensor&) { out = Tensor::empty({3, 3, 2, 2}, DType::kFloat64); },
     "output has dtype float64; expected float32"},
    {"output_sizes",
     [](Tensor&, Tensor&, Tensor& out, RoiAlignOptions&, Tensor&) { out = Tensor::empty({3, 3, 2, 3}, DType::kFloat32); },
     "output has sizes [3, 3, 2, 3]; expected [K, C, PH, PW] = [3, 3, 2, 2]"},
    {"pooled_zero", [](Tensor&, Tensor&, Tensor&, RoiAlignOptions& o, Tensor&) { o.pooled_width = 0; },
     "expected pooled_height and pooled_width > 0"},
    {"scale_nan", [](Tensor&, Tensor&, Tensor&, RoiAlignOptions& o, Tensor&) { o.spatial_scale = NAN; },
     "spatial_scale is nan; expected a finite value > 0"},
    {"scale_negative", [](Tensor&, Tensor&, Tensor&, RoiAlignOptions& o, Tensor&) { o.spatial_scale = -0.25; },
     "spatial_scale is -0.25"},
    {"sampling_ratio_huge", [](Tensor&, Tensor&, Tensor&, RoiAlignOptions& o, Tensor&) { o.sampling_ratio = 100000; },
     "sampling_ratio 100000"},
    {"max_without_argmax", [](Tensor&, Tensor&, Tensor&, RoiAlignOptions& o, Tensor&) { o.pool_mode = PoolMode::kMax; },
     "pool_mode max needs argmax"},
    {"argmax_dtype",
     [](Tensor&, Tensor&, Tensor&, RoiAlignOptions& o, Tensor& am) {
       o.pool_mode = PoolMode::kMax;
       am = Tensor::empty({3, 3, 2, 2}, DType::kFloat32);
     },
     "argmax has dtype float32; expected int32"},
};

// Device, overlap, null-data and stride cases need hand-made views: tested directly below.
INSTANTIATE_TEST_SUITE_P(Matrix, RoiAlignBadInput, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

TEST(RoiAlignBadInputViews, DeviceMismatchAndOverlapAndNullData) {
  Tensor input = make_tensor({1, 2, 4, 4}, DType::kFloat32, test::random_values(32, 5));
  Tensor rois = make_tensor({1, 5}, DType::kFloat32, {0, 0, 0, 2, 2});
  Tensor out = Tensor::empty({1, 2, 2, 2}, DType::kFloat32);
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 2;
  auto message = [&](const TensorView& in, const TensorView& r, const TensorView& ou) {
    try {
      roi_align_forward(in, r, ou, o);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TensorView r_cuda = rois.view();
  r_cuda.device = Device::cuda(0);
  EXPECT_EQ(message(input, r_cuda, out), "roi_align_forward: rois is on cuda:0; expected the device of input (cpu)");
  TensorView overlapping = out.view();
  overlapping.strides[1] = 0;  // both channels write the same element
  EXPECT_NE(message(input, rois, overlapping).find("overlapping elements"), std::string::npos);
  TensorView null_out = out.view();
  null_out.data = nullptr;
  EXPECT_NE(message(input, rois, null_out).find("null data pointer"), std::string::npos);
  TensorView neg = input.view();
  neg.strides[3] = -1;
  EXPECT_NE(message(neg, rois, out).find("negative stride"), std::string::npos);
  TensorView empty_map = input.view();
  empty_map.sizes[2] = 0;
  EXPECT_NE(message(empty_map, rois, out).find("expected H > 0 and W > 0"), std::string::npos);
}

TEST(RoiAlignBadInputViews, UncheckedInvalidRowsPoolToZero) {
  Tensor input = make_tensor({1, 1, 4, 4}, DType::kFloat32, std::vector<double>(16, 3.0));
  Tensor rois = make_tensor({2, 5}, DType::kFloat32, {0, 0, 0, 2, 2, 5, 0, 0, 2, 2});
  Tensor out = Tensor::empty({2, 1, 1, 1}, DType::kFloat32);
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 1;
  o.check_rois = false;
  roi_align_forward(input, rois, out, o);
  EXPECT_EQ(out.data<float>()[0], 3.0f);
  EXPECT_EQ(out.data<float>()[1], 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Regressions of issue 6 (reliability), each also kept as a fuzz input in tests/fuzz/regressions/.

// A roi of zero width with adaptive sampling has no samples along x, whatever its height: the
// shared geometry helper zeroes both grid axes, so no loop runs over the other axis for nothing
// (it did grid_h * PH * PW empty iterations: seconds for an all-zero result).
TEST(RoiAlignRegressions, ZeroWidthAdaptiveRoiHasAnEmptyGrid) {
  detail::RoiAlignShape s{};
  s.N = 1, s.C = 1, s.H = 8, s.W = 8, s.K = 1, s.PH = 7, s.PW = 7;
  s.spatial_scale = 1.0;
  s.sampling_ratio = 0;
  s.aligned = true;
  s.max_samples_per_roi = std::int64_t{1} << 40;
  const double zero_w[4] = {3, 0, 3, 1e11};  // x1 == x2; tall: grid_h would be ~1.4e10
  const auto box_f = detail::make_roi_box<float>(0, zero_w, s);
  EXPECT_EQ(box_f.status, detail::RoiStatus::kOk);
  EXPECT_EQ(box_f.grid_h, 0);
  EXPECT_EQ(box_f.grid_w, 0);
  EXPECT_EQ(box_f.count, 1.0f);
  const double zero_h[4] = {0, 2, 1e11, 2};  // and the transpose
  const auto box = detail::make_roi_box<double>(0, zero_h, s);
  EXPECT_EQ(box.grid_h, 0);
  EXPECT_EQ(box.grid_w, 0);
  EXPECT_EQ(box.count, 1.0);
}

TEST(RoiAlignRegressions, ZeroWidthAdaptiveRoiPoolsToZero) {
  Tensor input = make_tensor({1, 2, 8, 8}, DType::kFloat32, test::random_values(128, 9, 1.0, 2.0));
  // 16 zero-width rois of height 1e9 (the fuzz input had 16 such rows: 3.5 s of forward).
  std::vector<double> rv;
  for (int k = 0; k < 16; ++k) rv.insert(rv.end(), {0, 1.0 + k % 5, 0, 1.0 + k % 5, 1e9});
  Tensor rois = make_tensor({16, 5}, DType::kFloat32, rv);
  RoiAlignOptions o;
  o.sampling_ratio = 0;
  o.aligned = true;
  o.max_samples_per_roi = std::int64_t{1} << 40;
  Tensor out = Tensor::empty({16, 2, 7, 7}, DType::kFloat32);
  out.fill_bytes(0xCD);
  roi_align_forward(input, rois, out, o);
  for (double x : to_vector(out)) ASSERT_EQ(x, 0.0);  // avg: 0, not NaN (0 / max(count, 1))
  o.pool_mode = PoolMode::kMax;
  Tensor am = Tensor::empty({16, 2, 7, 7}, DType::kInt32);
  out.fill_bytes(0xCD);
  roi_align_forward(input, rois, out, o, {}, am);
  for (double x : to_vector(out)) ASSERT_EQ(x, 0.0);  // max of an empty bin: 0
  for (double x : to_vector(am)) ASSERT_EQ(x, -1.0);  // argmax -1
  Tensor go = make_tensor({16, 2, 7, 7}, DType::kFloat32, std::vector<double>(16 * 2 * 49, 1.0));
  for (PoolMode pm : {PoolMode::kAvg, PoolMode::kMax}) {
    o.pool_mode = pm;
    for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
      RoiAlignBackwardOptions b;
      b.mode = m;
      Tensor gi = Tensor::empty({1, 2, 8, 8}, DType::kFloat32);
      gi.fill_bytes(0xCD);
      roi_align_backward(go, rois, gi, o, b, {}, pm == PoolMode::kMax ? am.view() : TensorView{});
      for (double x : to_vector(gi)) ASSERT_EQ(x, 0.0) << to_string(m) << " " << to_string(pm);
    }
  }
}

// Outputs sharing memory with another argument are rejected (kInvalidArgument, naming both)
// before anything is written. Every view lives in one arena so the whole of it is compared.
TEST(RoiAlignRegressions, OutputsOverlappingOtherArgumentsAreRejected) {
  const std::int64_t kArena = 4096;  // floats
  Tensor arena = make_tensor({kArena}, DType::kFloat32, test::random_values(kArena, 21, 0.5, 1.5));
  float* base = arena.data<float>();
  auto view = [&](std::int64_t offset, std::initializer_list<std::int64_t> sizes, DType dt = DType::kFloat32) {
    TensorView v{};
    v.data = base + offset;
    v.dtype = dt;
    v.device = Device::cpu();
    v.rank = static_cast<int>(sizes.size());
    int d = 0;
    for (std::int64_t n : sizes) v.sizes[d++] = n;
    std::int64_t stride = 1;
    for (int i = v.rank - 1; i >= 0; --i) v.strides[i] = stride, stride *= v.sizes[i];
    return v;
  };
  // Disjoint placement: input [0, 128), rois [1000, 1010), output [2000, 2032), argmax [3000, 3032).
  const TensorView input = view(0, {1, 2, 8, 8});
  TensorView rois = view(1000, {2, 5});
  const float rv[10] = {0, 1, 1, 6, 6, 0, 0, 2, 7, 5};
  std::copy(rv, rv + 10, base + 1000);
  const TensorView output = view(2000, {2, 2, 2, 4});
  const TensorView argmax = view(3000, {2, 2, 2, 4}, DType::kInt32);
  RoiAlignOptions o;
  o.pooled_height = 2;
  o.pooled_width = 4;
  o.sampling_ratio = 2;
  auto expect_rejected = [&](const char* what, const std::function<void()>& call, const std::string& message) {
    const std::vector<double> before = to_vector(arena);
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << what << ": " << e.what();
    }
    const std::vector<double> after = to_vector(arena);
    for (std::size_t i = 0; i < before.size(); ++i)
      ASSERT_TRUE(before[i] == after[i] || (std::isnan(before[i]) && std::isnan(after[i]))) << what << " wrote " << i;
  };
  // The disjoint placement works (avg and max).
  EXPECT_NO_THROW(roi_align_forward(input, rois, output, o));
  // forward: output over input, partly and exactly over its start; output over rois.
  expect_rejected("output in input", [&] { roi_align_forward(input, rois, view(100, {2, 2, 2, 4}), o); },
                  "roi_align_forward: output overlaps input in memory without being the same view; expected "
                  "disjoint memory");
  expect_rejected("output at input", [&] { roi_align_forward(input, rois, view(0, {2, 2, 2, 4}), o); },
                  "output overlaps input");
  expect_rejected("output over rois", [&] { roi_align_forward(input, rois, view(990, {2, 2, 2, 4}), o); },
                  "output overlaps rois");
  o.pool_mode = PoolMode::kMax;
  EXPECT_NO_THROW(roi_align_forward(input, rois, output, o, {}, argmax));
  expect_rejected("argmax in input",
                  [&] { roi_align_forward(input, rois, output, o, {}, view(64, {2, 2, 2, 4}, DType::kInt32)); },
                  "argmax overlaps input");
  expect_rejected("argmax over rois",
                  [&] { roi_align_forward(input, rois, output, o, {}, view(1005, {2, 2, 2, 4}, DType::kInt32)); },
                  "argmax overlaps rois");
  expect_rejected("argmax in output",
                  [&] { roi_align_forward(input, rois, output, o, {}, view(2016, {2, 2, 2, 4}, DType::kInt32)); },
                  "argmax overlaps output");
  // backward: grad_input over grad_output, rois, argmax (reusing output as grad_output).
  const TensorView& grad_output = output;
  RoiAlignBackwardOptions b;
  for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    b.mode = m;
    o.pool_mode = PoolMode::kAvg;
    EXPECT_NO_THROW(roi_align_backward(grad_output, rois, view(128, {1, 2, 8, 8}), o, b));
    expect_rejected("grad_input over grad_output",
                    [&] { roi_align_backward(grad_output, rois, view(1900, {1, 2, 8, 8}), o, b); },
                    "roi_align_backward: grad_input overlaps grad_output in memory");
    expect_rejected("grad_input over rois", [&] { roi_align_backward(grad_output, rois, view(900, {1, 2, 8, 8}), o, b); },
                    "grad_input overlaps rois");
    o.pool_mode = PoolMode::kMax;
    expect_rejected("grad_input over argmax",
                    [&] { roi_align_backward(grad_output, rois, view(2950, {1, 2, 8, 8}), o, b, {}, argmax); },
                    "grad_input overlaps argmax");
  }
}

// A caller workspace at any alignment: the library rounds its base up to 256 bytes (the size it
// reports includes the slack), so int64 and double arrays are never stored misaligned.
TEST(RoiAlignRegressions, CallerWorkspaceAtAnyAlignment) {
  const Workload w = detection_workload(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0);
  for (BackwardMode m : {BackwardMode::kTruncated, BackwardMode::kExact}) {
    RoiAlignBackwardOptions b;
    b.mode = m;
    Tensor gi0 = Tensor::empty({2, 16, 50, 68}, DType::kFloat32);
    const std::size_t bytes = roi_align_backward_workspace_size(w.grad_output, w.rois, gi0, w.opt, b);
    ASSERT_GT(bytes, 255u);
    roi_align_backward(w.grad_output, w.rois, gi0, w.opt, b);  // allocated workspace
    std::vector<unsigned char> buf(bytes + 512);
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{8}, std::size_t{255}}) {
      // Start exactly `offset` bytes past a 256-byte boundary.
      const auto addr = reinterpret_cast<std::uintptr_t>(buf.data());
      unsigned char* p = buf.data() + ((256 - addr % 256) % 256) + offset;
      ASSERT_LE(p + bytes, buf.data() + buf.size());
      Tensor gi = Tensor::empty({2, 16, 50, 68}, DType::kFloat32);
      gi.fill_bytes(0xCD);
      roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{p, bytes});
      EXPECT_TRUE(test::same_bytes(gi, gi0)) << to_string(m) << " offset " << offset;
      // One byte short is still an error naming the argument, whatever the alignment.
      gi.fill_bytes(0xCD);
      try {
        roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, {}, {}, Workspace{p, bytes - 1});
        ADD_FAILURE() << "no error for a workspace one byte short";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("workspace has"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(RoiAlignRegressions, UnknownDTypesAreRejected) {
  Tensor input = make_tensor({1, 1, 4, 4}, DType::kFloat32, test::random_values(16, 2));
  Tensor rois = make_tensor({1, 5}, DType::kFloat32, {0, 0, 0, 2, 2});
  Tensor out = Tensor::empty({1, 1, 2, 2}, DType::kFloat32);
  out.fill_bytes(0xA5);
  const std::vector<unsigned char> poison(out.nbytes(), 0xA5);
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 2;
  // int32, the value after the last dtype (a dtype added later must be opted in), far outside.
  for (int raw : {static_cast<int>(DType::kInt32), static_cast<int>(DType::kInt32) + 1, 9, 200, 255}) {
    const DType bad = static_cast<DType>(raw);
    EXPECT_FALSE(dtype_name(bad).empty());
    EXPECT_GT(dtype_size(bad), 0u);
    TensorView in = input.view(), r = rois.view(), ou = out.view();
    in.dtype = ou.dtype = bad;
    try {
      roi_align_forward(in, rois, ou, o);
      ADD_FAILURE() << "no error for dtype " << raw;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("input has dtype"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected a floating dtype"), std::string::npos) << e.what();
    }
    r.dtype = bad;
    EXPECT_THROW(roi_align_forward(input, r, out, o), Error) << raw;
    TensorView gi = input.view();
    gi.dtype = bad;
    EXPECT_THROW(roi_align_backward(ou, rois, gi, o, {}), Error) << raw;
    EXPECT_THROW(roi_align_backward_workspace_size(ou, rois, gi, o, {}), Error) << raw;
  }
  EXPECT_EQ(0, std::memcmp(poison.data(), out.view().data, out.nbytes()));  // untouched
}

// PoolMode(7) was pooled as avg; every entry point now refuses a pool_mode outside the enum.
TEST(RoiAlignRegressions, UnknownPoolModesAreRejected) {
  Tensor input = make_tensor({1, 1, 4, 4}, DType::kFloat32, test::random_values(16, 3));
  Tensor rois = make_tensor({1, 5}, DType::kFloat32, {0, 0, 0, 2, 2});
  Tensor out = Tensor::empty({1, 1, 2, 2}, DType::kFloat32);
  Tensor grad_input = Tensor::empty({1, 1, 4, 4}, DType::kFloat32);
  out.fill_bytes(0xA5);
  grad_input.fill_bytes(0xA5);
  const Tensor out0 = out.to(Device::cpu()), gi0 = grad_input.to(Device::cpu());
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = 2;
  for (int raw : {2, 7, 255}) {
    o.pool_mode = static_cast<PoolMode>(raw);
    const std::vector<std::pair<const char*, std::function<void()>>> calls = {
        {"roi_align_forward", [&] { roi_align_forward(input, rois, out, o); }},
        {"roi_align_backward", [&] { roi_align_backward(out0, rois, grad_input, o, {}); }},
        {"roi_align_backward_workspace_size",
         [&] { (void)roi_align_backward_workspace_size(out0, rois, grad_input, o, {}); }},
    };
    for (const auto& [op, run] : calls) {
      try {
        run();
        ADD_FAILURE() << op << ": no error for pool_mode " << raw;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_EQ(std::string(e.what()), std::string(op) + ": pool_mode " + std::to_string(raw) +
                                             " is unknown; expected avg or max");
      }
    }
  }
  EXPECT_TRUE(test::same_bytes(out, out0));
  EXPECT_TRUE(test::same_bytes(grad_input, gi0));
}

}  // namespace
}  // namespace detops
