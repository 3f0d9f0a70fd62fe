// Multi-scale deformable attention on the CPU: against the float64 reference in every dtype
// (samples on and near the kernels' bounds, NaN locations), bitwise determinism of the exact mode
// (runs, thread counts, layouts, chunks of planes, caller workspace), atomic against exact, and
// bad input (a detops::Error naming the argument, every output's bytes untouched).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "ms_deform_attn_test_util.h"

namespace detops {
namespace {

using test::MsdaBuf;
using test::MsdaGrads;
using test::MsdaTensors;

// levels 3x5, 4x4, 1x2: odd sizes, a power of two (exact boundary locations), a one-row level
const std::vector<std::int64_t> kShapes = {3, 5, 4, 4, 1, 2};

double tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 2e-5;
    case DType::kFloat16: return 4e-3;
    default: return 3e-2;
  }
}

struct Checked {
  double forward, value, loc, attn;
};

/// Runs forward and backward (mode) and returns each result's error to the reference's peak.
Checked check_against_reference(const ref::MsdaProblemRef& pr, DType dt, DType loc_dt, BackwardMode mode,
                                bool strided = false) {
  const MsdaTensors t(pr, dt, loc_dt, strided);
  const ref::MsdaProblemRef r = t.rounded(pr);
  const MsdaBuf out = test::msda_run_forward(t, strided);
  const std::vector<double> go = test::random_values(static_cast<std::size_t>(pr.B * pr.Q * pr.M * pr.D), 99);
  const MsdaBuf grad_out = test::msda_filled({pr.B, pr.Q, pr.M * pr.D}, dt, go, strided);
  const MsdaGrads g = test::msda_run_backward(t, grad_out, mode, strided);
  const ref::MsdaGradsRef rg = ref::msda_backward_ref(r, test::to_vector(grad_out.view));
  return {test::max_error_to_peak(test::to_vector(out.view), ref::msda_forward_ref(r)),
          test::max_error_to_peak(test::to_vector(g.value.view), rg.value),
          test::max_error_to_peak(test::to_vector(g.loc.view), rg.loc),
          test::max_error_to_peak(test::to_vector(g.attn.view), rg.attn)};
}

TEST(MsDeformAttn, MatchesReferenceInEveryDtype) {
  const ref::MsdaProblemRef pr = test::msda_random_problem(2, 3, 5, 7, 3, kShapes, 11);
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (DType loc_dt : {DType::kFloat32, DType::kFloat64, dt}) {
      for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " locations " + std::string(dtype_name(loc_dt)) + " " + to_string(mode));
        const Checked c = check_against_reference(pr, dt, loc_dt, mode);
        // the location gradient is the derivative of a rounded bilinear (judged at 4x), stored in
        // the locations' dtype
        EXPECT_LE(c.forward, tolerance(dt));
        EXPECT_LE(c.value, tolerance(dt));
        EXPECT_LE(c.loc, 4 * std::max(tolerance(dt), tolerance(loc_dt)));
        EXPECT_LE(c.attn, tolerance(dt));
      }
    }
  }
}

/// A problem whose samples sit on the kernels' bounds: x = -1 and x = W exactly (skipped), just
/// inside them, and NaN (skipped), on a 4x4 level where these locations are exact.
ref::MsdaProblemRef boundary_problem() {
  ref::MsdaProblemRef pr = test::msda_random_problem(1, 2, 3, 1, 8, {4, 4}, 21);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double eps = std::ldexp(1.0, -12);
  // (x, y) per point: -0.125 -> -1, 1.125 -> 4 (= size)
  const double pts[8][2] = {{-0.125, 0.5},       {0.5, -0.125},  {1.125, 0.5}, {0.5, 1.125},
                            {-0.125 + eps, 0.5}, {1.125 - eps, 1.125 - eps}, {nan, 0.5}, {0.5, nan}};
  for (std::int64_t m = 0; m < 2; ++m)
    for (int p = 0; p < 8; ++p) {
      pr.loc[static_cast<std::size_t>((m * 8 + p) * 2)] = pts[p][0];
      pr.loc[static_cast<std::size_t>((m * 8 + p) * 2 + 1)] = pts[p][1];
    }
  return pr;
}

TEST(MsDeformAttn, BoundaryAndNaNSamplesFollowTheKernels) {
  const ref::MsdaProblemRef pr = boundary_problem();
  for (DType dt : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(dt));
    const MsdaTensors t(pr, dt, dt, false);
    const ref::MsdaProblemRef r = t.rounded(pr);
    const MsdaBuf out = test::msda_run_forward(t, false);
    const std::vector<double> go = test::random_values(static_cast<std::size_t>(2 * 3), 5);
    const MsdaBuf grad_out = test::msda_filled({1, 1, 6}, dt, go, false);
    const MsdaGrads g = test::msda_run_backward(t, grad_out, BackwardMode::kExact, false);
    const ref::MsdaGradsRef rg = ref::msda_backward_ref(r, go);
    EXPECT_LE(test::max_error_to_peak(test::to_vector(out.view), ref::msda_forward_ref(r)), tolerance(dt));
    EXPECT_LE(test::max_error_to_peak(test::to_vector(g.value.view), rg.value), tolerance(dt));
    EXPECT_LE(test::max_error_to_peak(test::to_vector(g.loc.view), rg.loc), tolerance(dt));
    EXPECT_LE(test::max_error_to_peak(test::to_vector(g.attn.view), rg.attn), tolerance(dt));
    // the skipped samples (points 0-3, 6, 7) get exact zeros; the two just inside do not
    const std::vector<double> gl = test::to_vector(g.loc.view), ga = test::to_vector(g.attn.view);
    for (std::int64_t m = 0; m < 2; ++m)
      for (int p = 0; p < 8; ++p) {
        const bool skipped = p < 4 || p > 5;
        const std::size_t i = static_cast<std::size_t>(m * 8 + p);
        EXPECT_EQ(ga[i] == 0.0, skipped) << "head " << m << " point " << p;
        if (skipped) {
          EXPECT_TRUE(gl[2 * i] == 0.0 && gl[2 * i + 1] == 0.0) << "head " << m << " point " << p;
        }
      }
  }
}

TEST(MsDeformAttn, ExactIsBitwiseAcrossRunsThreadsAndLayouts) {
  // a 1x1 level that every sample of a head hits: runs of 280 records, longer than one partial (256)
  const ref::MsdaProblemRef pr = test::msda_random_problem(2, 2, 6, 70, 4, {5, 3, 1, 1, 2, 7}, 31);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const MsdaTensors t(pr, dt, DType::kFloat32, false), ts(pr, dt, DType::kFloat32, true);
    const MsdaBuf go = test::msda_filled({2, 70, 12}, dt, test::random_values(2 * 70 * 12, 7), false);
    const MsdaBuf gos = test::msda_filled({2, 70, 12}, dt, test::random_values(2 * 70 * 12, 7), true);
    Context one;
    one.num_threads = 1;
    const MsdaBuf out1 = test::msda_run_forward(t, false, one);
    const MsdaGrads g1 = test::msda_run_backward(t, go, BackwardMode::kExact, false, one);
    for (int threads : {1, 2, 3, 8}) {
      Context ctx;
      ctx.num_threads = threads;
      SCOPED_TRACE(threads);
      EXPECT_TRUE(test::msda_same(out1, test::msda_run_forward(t, false, ctx)));
      const MsdaGrads g = test::msda_run_backward(t, go, BackwardMode::kExact, false, ctx);
      EXPECT_TRUE(test::msda_same(g1.value, g.value));
      EXPECT_TRUE(test::msda_same(g1.loc, g.loc));
      EXPECT_TRUE(test::msda_same(g1.attn, g.attn));
      // strided, permuted views: the same element bits, and the gaps untouched (poison kept)
      EXPECT_TRUE(test::msda_same_values(out1, test::msda_run_forward(ts, true, ctx)));
      const MsdaGrads s = test::msda_run_backward(ts, gos, BackwardMode::kExact, true, ctx);
      EXPECT_TRUE(test::msda_same_values(g1.value, s.value));
      EXPECT_TRUE(test::msda_same_values(g1.loc, s.loc));
      EXPECT_TRUE(test::msda_same_values(g1.attn, s.attn));
      EXPECT_TRUE(test::msda_gaps_untouched(s.value));
      EXPECT_TRUE(test::msda_gaps_untouched(s.loc));
      EXPECT_TRUE(test::msda_gaps_untouched(s.attn));
    }
    EXPECT_LE(test::max_error_to_peak(test::to_vector(g1.value.view),
                                      ref::msda_backward_ref(t.rounded(pr), test::to_vector(go.view)).value),
              tolerance(dt));
  }
}

TEST(MsDeformAttn, InstructionSetVariantsGiveTheSameBits) {
  // The CPU loops are compiled per instruction set (ms_deform_attn_cpu_kernels.inc): every variant
  // the CPU has must give the baseline's bytes, forward and both backward modes, on the scatter
  // path (4 planes) and the engine's (2), with a hot 1x1 level (runs past one partial), channel
  // counts on and off the vector widths, and non-finite locations.
  std::vector<CpuIsa> variants;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
  if (variants.empty()) GTEST_SKIP() << "this CPU has no AVX2: only the baseline variant runs";
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const auto& [B, M, D] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{2, 2, 32}, {1, 2, 6}, {2, 2, 19}}) {
    ref::MsdaProblemRef pr = test::msda_random_problem(B, M, D, 70, 4, {5, 3, 1, 1, 2, 7}, 61);
    const double odd[] = {nan, inf, -inf, 1e30};
    for (std::size_t i = 5; i < pr.loc.size(); i += 37) pr.loc[i] = odd[(i / 37) % 4];
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
      const MsdaTensors t(pr, dt, dt == DType::kBFloat16 ? DType::kFloat32 : dt, false);
      const MsdaBuf go = test::msda_filled({B, 70, M * D}, dt, test::random_values(B * 70 * M * D, 8), false);
      const auto run = [&](CpuIsa isa, BackwardMode mode) {
        Context ctx;
        ctx.num_threads = 2;
        ctx.cpu_isa = isa;
        return std::pair{test::msda_run_forward(t, false, ctx), test::msda_run_backward(t, go, mode, false, ctx)};
      };
      for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
        const auto base = run(CpuIsa::kBaseline, mode);
        for (CpuIsa isa : variants) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B " << B << " M " << M << " D " << D << " "
                                            << to_string(mode) << " " << cpu_isa_name(isa));
          const auto got = run(isa, mode);
          EXPECT_TRUE(test::msda_same(base.first, got.first));
          EXPECT_TRUE(test::msda_same(base.second.value, got.second.value));
          EXPECT_TRUE(test::msda_same(base.second.loc, got.second.loc));
          EXPECT_TRUE(test::msda_same(base.second.attn, got.second.attn));
        }
      }
    }
  }
}

TEST(MsDeformAttn, AtomicAgreesWithExactAndIsFixedOnTheCpu) {
  const ref::MsdaProblemRef pr = test::msda_random_problem(1, 4, 8, 40, 4, kShapes, 41);
  const MsdaTensors t(pr, DType::kFloat32, DType::kFloat32, false);
  const MsdaBuf go = test::msda_filled({1, 40, 32}, DType::kFloat32, test::random_values(40 * 32, 3), false);
  const MsdaGrads e = test::msda_run_backward(t, go, BackwardMode::kExact, false);
  const MsdaGrads a = test::msda_run_backward(t, go, BackwardMode::kAtomic, false);
  EXPECT_LE(test::max_error_to_peak(test::to_vector(a.value.view), test::to_vector(e.value.view)), 1e-6);
  // the location and attention gradients do not depend on the mode
  EXPECT_TRUE(test::msda_same(e.loc, a.loc));
  EXPECT_TRUE(test::msda_same(e.attn, a.attn));
  // 4 planes: up to 4 threads walk each plane once for both gradients, more take two passes
  for (int threads : {1, 3, 8}) {
    Context ctx;
    ctx.num_threads = threads;
    const MsdaGrads b = test::msda_run_backward(t, go, BackwardMode::kAtomic, false, ctx);
    EXPECT_TRUE(test::msda_same(a.value, b.value)) << threads;
    EXPECT_TRUE(test::msda_same(a.loc, b.loc)) << threads;
    EXPECT_TRUE(test::msda_same(a.attn, b.attn)) << threads;
  }
}

TEST(MsDeformAttn, ExactSpansSeveralChunksOfPlanes) {
  // one plane is 4096 * 4 * 4 * 4 = 2^18 records: two planes per chunk, three planes in all
  static_assert(std::int64_t{2} << 18 <= detail::kGatherChunkRecords && std::int64_t{3} << 18 > detail::kGatherChunkRecords,
                "the case must make a chunk of two planes");
  const ref::MsdaProblemRef pr = test::msda_random_problem(1, 3, 1, 4096, 4, {4, 4, 2, 3, 3, 2, 1, 1}, 51);
  const MsdaTensors t(pr, DType::kFloat64, DType::kFloat64, false);
  const MsdaBuf go = test::msda_filled({1, 4096, 3}, DType::kFloat64, test::random_values(4096 * 3, 9), false);
  Context ctx;
  ctx.num_threads = 2;
  const MsdaGrads e = test::msda_run_backward(t, go, BackwardMode::kExact, false, ctx);
  const ref::MsdaGradsRef rg = ref::msda_backward_ref(t.rounded(pr), test::to_vector(go.view));
  EXPECT_LE(test::max_error_to_peak(test::to_vector(e.value.view), rg.value), 1e-12);
  EXPECT_LE(test::max_error_to_peak(test::to_vector(e.loc.view), rg.loc), 1e-12);
}

TEST(MsDeformAttn, CallerWorkspaceAndOptionalOutputs) {
  const ref::MsdaProblemRef pr = test::msda_random_problem(1, 2, 4, 9, 2, kShapes, 61);
  const MsdaTensors t(pr, DType::kFloat32, DType::kFloat64, false);
  const MsdaBuf go = test::msda_filled({1, 9, 8}, DType::kFloat32, test::random_values(72, 4), false);
  const MsdaGrads full = test::msda_run_backward(t, go, BackwardMode::kExact, false);
  MsDeformAttnBackwardOptions opt;
  const std::size_t bytes =
      ms_deform_attn_backward_workspace_size(t.value.view, t.shapes.view, t.starts.view, t.loc.view, t.attn.view, opt);
  EXPECT_GT(bytes, 0u);
  opt.mode = BackwardMode::kAtomic;
  EXPECT_EQ(ms_deform_attn_backward_workspace_size(t.value.view, t.shapes.view, t.starts.view, t.loc.view,
                                                   t.attn.view, opt),
            0u);
  opt.mode = BackwardMode::kExact;
  std::vector<unsigned char> ws(bytes);
  MsdaBuf gv = test::msda_buf({1, t.S, 2, 4}, DType::kFloat32, false);
  ms_deform_attn_backward(t.value.view, t.shapes.view, t.starts.view, t.loc.view, t.attn.view, go.view, gv.view, {},
                          {}, opt, {}, Workspace{ws.data(), bytes});
  EXPECT_TRUE(test::msda_same(gv, full.value));
  MsdaBuf gl = test::msda_buf({1, 9, 2, 3, 2, 2}, DType::kFloat64, false);
  ms_deform_attn_backward(t.value.view, t.shapes.view, t.starts.view, t.loc.view, t.attn.view, go.view, {}, gl.view,
                          {}, opt);
  EXPECT_TRUE(test::msda_same(gl, full.loc));
  // a workspace one byte short is refused before anything is written
  MsdaBuf untouched = test::msda_buf({1, t.S, 2, 4}, DType::kFloat32, false);
  EXPECT_THROW(ms_deform_attn_backward(t.value.view, t.shapes.view, t.starts.view, t.loc.view, t.attn.view, go.view,
                                       untouched.view, {}, {}, opt, {}, Workspace{ws.data(), bytes - 1}),
               Error);
  EXPECT_TRUE(test::msda_same(untouched, test::msda_buf({1, t.S, 2, 4}, DType::kFloat32, false)));
}

/// No channels (D = 0): value and grad_output hold nothing and, as an empty framework tensor's may
/// be, their data pointers are null. Both modes must return (the prefetch of a sample's corner
/// rows once walked from a null row minus one element, all of memory) with zero location and
/// weight gradients. Found through the PyTorch binding.
TEST(MsDeformAttn, NoChannelsWithNullDataReturnsZeroGradients) {
  std::vector<std::int64_t> shapes = {2, 2}, starts = {0};
  std::vector<float> loc = {0.5f, 0.5f, 0.3f, 0.9f, 0.1f, 0.2f}, attn = {1.0f, 0.5f, 0.25f};
  const TensorView value(nullptr, DType::kFloat32, Device::cpu(), {1, 4, 1, 0});
  const TensorView ss(shapes.data(), DType::kInt64, Device::cpu(), {1, 2});
  const TensorView ls(starts.data(), DType::kInt64, Device::cpu(), {1});
  const TensorView l(loc.data(), DType::kFloat32, Device::cpu(), {1, 3, 1, 1, 1, 2});
  const TensorView a(attn.data(), DType::kFloat32, Device::cpu(), {1, 3, 1, 1, 1});
  const TensorView go(nullptr, DType::kFloat32, Device::cpu(), {1, 3, 0});
  for (const BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kExact}) {
    std::vector<float> gl(6, 7.0f), ga(3, 7.0f);
    MsDeformAttnBackwardOptions opt;
    opt.mode = mode;
    ms_deform_attn_backward(value, ss, ls, l, a, go, value, TensorView(gl.data(), DType::kFloat32, Device::cpu(), {1, 3, 1, 1, 1, 2}),
                            TensorView(ga.data(), DType::kFloat32, Device::cpu(), {1, 3, 1, 1, 1}), opt);
    for (float x : gl) EXPECT_EQ(x, 0.0f) << to_string(mode);
    for (float x : ga) EXPECT_EQ(x, 0.0f) << to_string(mode);
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input

/// A valid call's tensors that a case then breaks, with outputs to check for untouched bytes.
struct BadCase {
  ref::MsdaProblemRef pr = test::msda_random_problem(1, 2, 3, 4, 2, kShapes, 71);
  MsdaTensors t{pr, DType::kFloat32, DType::kFloat32, false};
  MsdaBuf out = test::msda_buf({1, 4, 6}, DType::kFloat32, false);
  MsdaBuf go = test::msda_filled({1, 4, 6}, DType::kFloat32, test::random_values(24, 1), false);
  MsdaBuf gv = test::msda_buf({1, t.S, 2, 3}, DType::kFloat32, false);
  MsdaBuf gl = test::msda_buf({1, 4, 2, 3, 2, 2}, DType::kFloat32, false);
  MsdaBuf ga = test::msda_buf({1, 4, 2, 3, 2}, DType::kFloat32, false);
  TensorView value = t.value.view, shapes = t.shapes.view, starts = t.starts.view, loc = t.loc.view,
             attn = t.attn.view, output = out.view, grad_out = go.view, grad_value = gv.view, grad_loc = gl.view,
             grad_attn = ga.view;
  MsDeformAttnBackwardOptions opt;
};

/// Calls forward and backward with the case's views: each must throw an Error whose message has
/// every fragment, leaving every output byte as it was.
void expect_rejected(BadCase& c, std::initializer_list<const char*> fragments, bool forward = true,
                     bool backward = true) {
  const MsdaBuf out0 = test::msda_buf({1, 4, 6}, DType::kFloat32, false);
  auto check = [&](auto&& call, const char* which) {
    SCOPED_TRACE(which);
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
    EXPECT_TRUE(test::msda_same(c.out, out0));
    EXPECT_TRUE(test::msda_same(c.gv, test::msda_buf({1, c.t.S, 2, 3}, DType::kFloat32, false)));
    EXPECT_TRUE(test::msda_same(c.gl, test::msda_buf({1, 4, 2, 3, 2, 2}, DType::kFloat32, false)));
    EXPECT_TRUE(test::msda_same(c.ga, test::msda_buf({1, 4, 2, 3, 2}, DType::kFloat32, false)));
  };
  if (forward)
    check([&] { ms_deform_attn_forward(c.value, c.shapes, c.starts, c.loc, c.attn, c.output); }, "forward");
  if (backward)
    check([&] {
      ms_deform_attn_backward(c.value, c.shapes, c.starts, c.loc, c.attn, c.grad_out, c.grad_value, c.grad_loc,
                              c.grad_attn, c.opt);
    }, "backward");
}

void set_int64(const TensorView& v, std::int64_t index, std::int64_t x) { static_cast<std::int64_t*>(v.data)[index] = x; }

TEST(MsDeformAttnBadInput, LevelTableThatDisagrees) {
  {
    BadCase c;
    set_int64(c.starts, 1, 14);  // should be 15
    expect_rejected(c, {"level_start_index[1] is 14", "expected 15"});
  }
  {
    BadCase c;
    set_int64(c.shapes, 5, 3);  // last level 1x3: S would be 34, value has 33
    expect_rejected(c, {"spatial_shapes", "S = 33"});
  }
  {
    BadCase c;
    set_int64(c.shapes, 4, 0);  // last level 0x2: 31 rows for S = 33
    expect_rejected(c, {"31 rows", "S = 33"});
  }
  {
    BadCase c;
    set_int64(c.shapes, 0, -3);
    expect_rejected(c, {"spatial_shapes[0] is (-3, 5)", "H >= 0"});
  }
  {
    BadCase c;
    set_int64(c.shapes, 0, std::int64_t{1} << 40);
    set_int64(c.shapes, 1, std::int64_t{1} << 40);
    expect_rejected(c, {"spatial_shapes[0]", "fit in int64"});
  }
  {
    BadCase c;
    c.shapes.sizes[0] = 2;  // two levels where locations have three
    c.starts.sizes[0] = 2;
    expect_rejected(c, {"sampling_locations has sizes", "[B, Q, M, L, P, 2]"});
  }
  {
    BadCase c;
    c.starts.sizes[0] = 2;
    expect_rejected(c, {"level_start_index has sizes [2]", "[L] = [3]"});
  }
}

TEST(MsDeformAttnBadInput, WrongDtypesRanksAndSizes) {
  {
    BadCase c;
    c.shapes.dtype = DType::kInt32;
    expect_rejected(c, {"spatial_shapes has dtype int32", "int64"});
  }
  {
    BadCase c;
    c.attn.dtype = DType::kFloat64;
    expect_rejected(c, {"attention_weights has dtype float64"});
  }
  {
    BadCase c;
    c.loc.dtype = DType::kFloat16;
    expect_rejected(c, {"sampling_locations has dtype float16"});
  }
  {
    BadCase c;
    c.value.dtype = DType::kInt32;
    expect_rejected(c, {"value"});
  }
  {
    BadCase c;
    c.value.rank = 3;
    expect_rejected(c, {"value"});
  }
  {
    BadCase c;
    c.output.sizes[2] = 5;
    expect_rejected(c, {"output has sizes [1, 4, 5]", "[B, Q, M * D]"}, true, false);
  }
  {
    BadCase c;
    c.grad_out.sizes[1] = 3;
    expect_rejected(c, {"grad_output has sizes"}, false, true);
  }
  {
    BadCase c;
    c.grad_value.dtype = DType::kFloat64;
    expect_rejected(c, {"grad_value has dtype float64"}, false, true);
  }
  {
    BadCase c;
    c.grad_loc.sizes[4] = 3;
    expect_rejected(c, {"grad_sampling_locations has sizes"}, false, true);
  }
  {
    BadCase c;
    c.opt.mode = BackwardMode::kTruncated;
    expect_rejected(c, {"truncated", "expected atomic or exact"}, false, true);
  }
}

TEST(MsDeformAttnBadInput, OverlappingOutputs) {
  {
    BadCase c;  // output over value
    c.output.data = c.value.data;
    expect_rejected(c, {"output", "value"}, true, false);
  }
  {
    BadCase c;  // grad_attention_weights over grad_value
    c.grad_attn.data = c.grad_value.data;
    expect_rejected(c, {"grad_attention_weights", "grad_value"}, false, true);
  }
  {
    BadCase c;  // grad_value over grad_output
    c.grad_value.data = c.grad_out.data;
    expect_rejected(c, {"grad_value", "grad_output"}, false, true);
  }
  {
    BadCase c;  // an output whose elements alias each other
    c.grad_loc.strides[1] = 0;
    expect_rejected(c, {"grad_sampling_locations"}, false, true);
  }
}

}  // namespace
}  // namespace detops
