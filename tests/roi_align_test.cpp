// RoIAlign's own tests on the CPU: values pinned by hand (the apron rule), the instruction-set
// variants, max pooling's argmax, the truncated mode's formats, unchecked rows, and the
// regressions of issue 6. What it shares with RoIAlignRotated (the float64 reference over every
// dtype x layout x mode x pool mode, bitwise reproducibility, empty problems, caller workspaces,
// the bad-input matrix) is written once for both in tests/roi_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "detops/detail/roi_align_math.h"
#include "roi_test_harness.h"

namespace detops {
namespace {

using test::make_tensor;
using test::to_vector;
using G = test::AxisAlignedRois;

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
        test::Workload<G> w = test::detection_workload<G>(dt, Layout::kNHWC, pool, sr);
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

TEST(RoiAlignCpuSemantics, WorkspaceQueryForMaxPoolingNeedsNoArgmax) {
  const test::Workload<G> w = test::detection_workload<G>(DType::kFloat32, Layout::kNCHW, PoolMode::kMax, 2);
  RoiAlignBackwardOptions b;
  Tensor gi = Tensor::empty({2, 16, 50, 68}, DType::kFloat32);
  const std::size_t bytes = roi_align_backward_workspace_size(w.grad_output, w.rois, gi, w.opt, b);
  std::vector<unsigned char> buf(bytes);
  roi_align_backward(w.grad_output, w.rois, gi, w.opt, b, {}, w.argmax, Workspace{buf.data(), buf.size()});
  EXPECT_TRUE(test::same_bytes(gi, test::run_backward(w, BackwardMode::kExact, 2, Layout::kNCHW, DType::kFloat32)));
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
