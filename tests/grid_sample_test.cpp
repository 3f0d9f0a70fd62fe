// grid_sample on the CPU: every interpolation x padding x align_corners x dtype against the
// float64 reference (forward, grad_input in both modes, grad_grid), bitwise reproducibility of the
// exact mode (runs, 1/2/3/8 threads, NCHW vs NHWC, chunked images), atomic against exact, the
// caller's workspace, non-finite grids, empty problems, and the bad-input matrix with poisoned outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "grid_sample_test_util.h"

namespace detops {
namespace {

using test::GridSampleProblem;
using test::GridSampleRun;
using test::make_tensor;
using test::to_vector;

double tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat64: return 1e-12;
    case DType::kFloat32: return 1e-5;
    case DType::kFloat16: return 4e-3;
    default: return 3e-2;
  }
}

/// The grid dtypes a test pairs with an input dtype: its own, and the other of float32/float64.
DType other_grid_dtype(DType dt) { return dt == DType::kFloat32 ? DType::kFloat64 : DType::kFloat32; }

std::string name(const GridSampleOptions& o, DType dt, DType gdt, BackwardMode mode) {
  return std::string(to_string(o.interpolation)) + "/" + to_string(o.padding) + "/ac" +
         std::to_string(o.align_corners) + "/" + std::string(dtype_name(dt)) + "/grid " +
         std::string(dtype_name(gdt)) + "/" + to_string(mode);
}

TEST(GridSample, MatchesReferenceEveryModeAndDtype) {
  for (const GridSampleOptions& o : test::all_grid_options()) {
    const GridSampleProblem p = test::make_grid_problem(2, 3, 5, 7, 4, 6, o, 100);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const bool wide = dt == DType::kFloat32 || dt == DType::kFloat64;
      for (DType gdt : {dt, wide ? other_grid_dtype(dt) : dt}) {
        const GridSampleProblem q = test::rounded_problem(p, dt, gdt);
        // the reference sees the grid as the op does: rounded to the accumulation type
        GridSampleProblem qa = q;
        if (dt != DType::kFloat64) qa.grid = to_vector(make_tensor({static_cast<std::int64_t>(q.grid.size())},
                                                                   DType::kFloat32, q.grid));
        const test::GridSampleResult ref = test::grid_sample_reference(qa);
        for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
          const GridSampleRun r = test::run_grid_sample(p, dt, gdt, Layout::kNCHW, mode, 2);
          const double tol = tolerance(dt);
          EXPECT_LE(test::max_rel_error(to_vector(r.output), ref.output), tol) << name(o, dt, gdt, mode);
          EXPECT_LE(test::max_rel_error(to_vector(r.grad_input), ref.grad_input), tol) << name(o, dt, gdt, mode);
          // grad_grid is stored in the grid's dtype, and scales with the map size (its multiplier
          // is (size - 1) / 2 or size / 2)
          const double gtol = 4 * std::max(tol, tolerance(gdt));
          EXPECT_LE(test::max_rel_error(to_vector(r.grad_grid), ref.grad_grid), gtol) << name(o, dt, gdt, mode);
        }
      }
    }
  }
}

/// Many points outside a small map: with border padding about 340 records per image meet on each
/// corner pixel, so runs longer than the engine's partial (256) are summed.
GridSampleProblem crowded_problem(GridSamplePadding pad, GridSampleInterpolation interp) {
  return test::make_grid_problem(3, 5, 6, 5, 40, 60, {interp, pad, false}, 200, 4.0);
}

TEST(GridSample, ExactIsBitwiseAcrossRunsThreadsAndLayouts) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    for (auto pad : {GridSamplePadding::kBorder, GridSamplePadding::kReflection, GridSamplePadding::kZeros}) {
      for (auto interp : {GridSampleInterpolation::kBilinear, GridSampleInterpolation::kNearest}) {
        const GridSampleProblem p = crowded_problem(pad, interp);
        const GridSampleRun base = test::run_grid_sample(p, dt, dt, Layout::kNCHW, BackwardMode::kExact, 1);
        for (int threads : {1, 2, 3, 8}) {
          for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
            const GridSampleRun r = test::run_grid_sample(p, dt, dt, layout, BackwardMode::kExact, threads);
            const std::string what = std::string(dtype_name(dt)) + " " + to_string(pad) + " " + to_string(interp) +
                                     " threads " + std::to_string(threads) + (layout == Layout::kNHWC ? " nhwc" : "");
            // NCHW-ordered values compared as bytes: the layout must not change a bit
            const std::vector<double> a = to_vector(r.grad_input), b = to_vector(base.grad_input);
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << what;
            const std::vector<double> c = to_vector(r.output), d = to_vector(base.output);
            EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * sizeof(double)), 0) << what;
            EXPECT_TRUE(test::same_bytes(r.grad_grid, base.grad_grid)) << what;
          }
        }
      }
    }
  }
}

TEST(GridSample, AtomicMatchesExactWithinRounding) {
  for (DType dt : {DType::kFloat32, DType::kFloat16}) {
    const GridSampleProblem p = crowded_problem(GridSamplePadding::kBorder, GridSampleInterpolation::kBilinear);
    const GridSampleRun e = test::run_grid_sample(p, dt, dt, Layout::kNCHW, BackwardMode::kExact, 2);
    const GridSampleRun a = test::run_grid_sample(p, dt, dt, Layout::kNHWC, BackwardMode::kAtomic, 2);
    // the atomic mode rounds after every add (in the 16-bit dtype for float16)
    EXPECT_LE(test::max_error_to_peak(to_vector(a.grad_input), to_vector(e.grad_input)),
              dt == DType::kFloat16 ? 2e-2 : 1e-5);
    EXPECT_TRUE(test::same_bytes(a.grad_grid, e.grad_grid));
  }
}

TEST(GridSample, ExactChunksImagesLikeOneCall) {
  // 60000 points per image (240000 records): two images fit in the 2^19-record floor, so three
  // images run as a chunk of two and a partial chunk of one; each image must come out as when it
  // is run alone.
  static_assert(2 * 4 * 200 * 300 <= detail::kGatherChunkRecords && 3 * 4 * 200 * 300 > detail::kGatherChunkRecords,
                "the case must make a chunk of two images");
  GridSampleOptions o{GridSampleInterpolation::kBilinear, GridSamplePadding::kBorder, true};
  const std::int64_t Ho = 200, Wo = 300, plane = 64;
  const GridSampleProblem p = test::make_grid_problem(3, 1, 8, 8, Ho, Wo, o, 300);
  const GridSampleRun whole = test::run_grid_sample(p, DType::kFloat32, DType::kFloat32, Layout::kNCHW,
                                                    BackwardMode::kExact, 2);
  const std::vector<double> got = to_vector(whole.grad_input);
  for (std::int64_t n = 0; n < 3; ++n) {
    GridSampleProblem one = p;
    one.N = 1;
    const std::int64_t gn = Ho * Wo * 2, gon = Ho * Wo;
    one.input.assign(p.input.begin() + n * plane, p.input.begin() + (n + 1) * plane);
    one.grid.assign(p.grid.begin() + n * gn, p.grid.begin() + (n + 1) * gn);
    one.grad_output.assign(p.grad_output.begin() + n * gon, p.grad_output.begin() + (n + 1) * gon);
    const GridSampleRun r = test::run_grid_sample(one, DType::kFloat32, DType::kFloat32, Layout::kNCHW,
                                                  BackwardMode::kExact, 1);
    const std::vector<double> want = to_vector(r.grad_input);
    EXPECT_EQ(std::memcmp(got.data() + n * plane, want.data(), plane * sizeof(double)), 0) << "image " << n;
  }
}

// The exact mode's workspace: none on the CPU for NCHW (its scatter path keeps no records); the
// engine's for channels-last (several channels), where a caller's buffer, at any alignment, gives
// the bits of an allocated one and a buffer one byte short is refused.
TEST(GridSample, CallerWorkspaceGivesTheSameBits) {
  const GridSampleProblem p = crowded_problem(GridSamplePadding::kZeros, GridSampleInterpolation::kBilinear);
  GridSampleBackwardOptions b;
  {
    test::GridSampleTensors t = test::grid_tensors(p, DType::kFloat32, DType::kFloat32, Layout::kNCHW);
    Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, DType::kFloat32);
    EXPECT_EQ(grid_sample_backward_workspace_size(t.grad_output, t.input, t.grid, gi, {}, p.opt, b), 0u);
  }
  const GridSampleRun base = test::run_grid_sample(p, DType::kFloat32, DType::kFloat32, Layout::kNHWC,
                                                   BackwardMode::kExact, 2);
  test::GridSampleTensors t = test::grid_tensors(p, DType::kFloat32, DType::kFloat32, Layout::kNHWC);
  Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, DType::kFloat32, Device::cpu(), Layout::kNHWC);
  const std::size_t bytes = grid_sample_backward_workspace_size(t.grad_output, t.input, t.grid, gi, {}, p.opt, b);
  ASSERT_GT(bytes, 0u);
  std::vector<unsigned char> buf(bytes + 3);
  grid_sample_backward(t.grad_output, t.input, t.grid, gi, {}, p.opt, b, {}, Workspace{buf.data() + 3, bytes});
  EXPECT_TRUE(test::same_bytes(gi, base.grad_input));
  EXPECT_THROW(grid_sample_backward(t.grad_output, t.input, t.grid, gi, {}, p.opt, b, {},
                                    Workspace{buf.data(), bytes - 1}),
               Error);
  b.mode = BackwardMode::kAtomic;
  EXPECT_EQ(grid_sample_backward_workspace_size(t.grad_output, t.input, t.grid, gi, {}, p.opt, b), 0u);
}

// Non-finite coordinates as PyTorch's CPU kernel treats them: border and reflection padding clip
// NaN to 0 (and infinities to their edge, or to 0 after reflection makes NaN of them), so the
// point samples an edge pixel; zeros padding keeps them: nearest samples nothing (0), bilinear
// reads no pixel but weighs with NaN fractions, so its sample is NaN, and grad_grid NaN along
// the other axis' derivative. grad_input never gets anything non-finite. The float64 reference
// states the same; every element is checked against it (NaN where it has NaN).
// The float32 bilinear forward runs in vector lanes (src/cpu/grid_sample_cpu_kernels.inc, one
// variant per instruction set): every variant, and every way of walking the grid (rows continuing
// one another or not, point_sample's [N, P, 1, 2], a strided grid, blocks of 512 points crossed),
// gives the bits of the scalar path (the NHWC layout's), over every padding and alignment, with
// coordinates far outside the map, on its edges, and NaN, infinite or huge.
TEST(GridSample, InstructionSetVariantsGiveTheSameBits) {
  std::vector<CpuIsa> variants{CpuIsa::kBaseline};
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
    else std::printf("[ note ] this CPU has no %s: that variant is not compared\n", cpu_isa_name(isa));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const GridSampleOptions& o : test::all_grid_options()) {
    if (o.interpolation != GridSampleInterpolation::kBilinear) continue;
    for (const auto& [Ho, Wo] : {std::pair<std::int64_t, std::int64_t>{700, 1}, {23, 37}}) {
      GridSampleProblem p = test::make_grid_problem(2, 20, 9, 11, Ho, Wo, o, 500, 3.0);
      const double odd[] = {nan, inf, -inf, 1e30, -1e30, 1e-30, -0.0, 1.0 + 1e-7};
      for (std::size_t i = 3; i < p.grid.size(); i += 11) p.grid[i] = odd[(i / 11) % 8];
      auto forward = [&](CpuIsa isa, Layout layout, bool strided_grid) {
        const test::GridSampleTensors t = test::grid_tensors(p, DType::kFloat32, DType::kFloat32, layout);
        // a strided grid: the pairs 3 floats apart, the rows one pair further
        Tensor wide = Tensor::empty({p.N, p.Ho, p.Wo + 1, 3}, DType::kFloat32);
        wide.fill_bytes(0xFF);
        const std::vector<std::int64_t> sizes{p.N, p.Ho, p.Wo, 2};
        const std::vector<std::int64_t> strides{p.Ho * (p.Wo + 1) * 3, (p.Wo + 1) * 3, 3, 1};
        TensorView grid(wide.data<float>(), DType::kFloat32, Device::cpu(), sizes, strides);
        const std::vector<double> g = to_vector(t.grid);
        for (std::int64_t i = 0; i < p.N * p.Ho * p.Wo; ++i) {
          const std::int64_t n = i / (p.Ho * p.Wo), h = i / p.Wo % p.Ho, w = i % p.Wo;
          float* q = wide.data<float>() + n * strides[0] + h * strides[1] + w * strides[2];
          q[0] = static_cast<float>(g[static_cast<std::size_t>(2 * i)]);
          q[1] = static_cast<float>(g[static_cast<std::size_t>(2 * i + 1)]);
        }
        Tensor out = Tensor::empty({p.N, p.C, p.Ho, p.Wo}, DType::kFloat32, Device::cpu(), layout);
        Context ctx;
        ctx.num_threads = 2;
        ctx.cpu_isa = isa;
        grid_sample_forward(t.input, strided_grid ? grid : t.grid.view(), out, p.opt, ctx);
        return to_vector(out);
      };
      const std::vector<double> scalar = forward(CpuIsa::kBaseline, Layout::kNHWC, false);
      std::size_t nans = 0;
      for (double v : scalar) nans += std::isnan(v) ? 1 : 0;
      if (o.padding == GridSamplePadding::kZeros) {
        EXPECT_GT(nans, 0u) << "the NaN points sample NaN";
      }
      for (CpuIsa isa : variants) {
        for (bool strided : {false, true}) {
          const std::vector<double> got = forward(isa, Layout::kNCHW, strided);
          EXPECT_EQ(std::memcmp(got.data(), scalar.data(), got.size() * sizeof(double)), 0)
              << to_string(o.padding) << " ac" << o.align_corners << " " << Ho << "x" << Wo << " "
              << cpu_isa_name(isa) << (strided ? " strided grid" : "");
        }
      }
    }
  }
}

TEST(GridSample, GradGridLanesGiveTheScalarBits) {
  // float32 bilinear grad_grid on NCHW planes runs in lanes (grad_grid_lanes); on NHWC one point at
  // a time (grid_sample_grad_grid_element). Both add each point's channels in order with the same
  // operations, so every instruction set's NCHW grad_grid must have the NHWC baseline's bits, with
  // grad_output's points in a row or not (an NHWC grad_output), and through non-finite points.
  std::vector<CpuIsa> variants{CpuIsa::kBaseline};
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const GridSampleOptions& o : test::all_grid_options()) {
    if (o.interpolation != GridSampleInterpolation::kBilinear) continue;
    for (const auto& [Ho, Wo] : {std::pair<std::int64_t, std::int64_t>{700, 1}, {23, 37}, {3, 4500}}) {
      GridSampleProblem p = test::make_grid_problem(2, 20, 9, 11, Ho, Wo, o, 510, 1.3);
      const double odd[] = {nan, inf, -inf, 1e30, -1e30, 1e-30, -0.0, 1.0 + 1e-7};
      for (std::size_t i = 3; i < p.grid.size(); i += 11) p.grid[i] = odd[(i / 11) % 8];
      auto grad_grid = [&](CpuIsa isa, Layout input_layout, Layout go_layout) {
        const test::GridSampleTensors t = test::grid_tensors(p, DType::kFloat32, DType::kFloat32, input_layout);
        const test::GridSampleTensors g = test::grid_tensors(p, DType::kFloat32, DType::kFloat32, go_layout);
        Tensor gg = Tensor::empty({p.N, p.Ho, p.Wo, 2}, DType::kFloat32);
        gg.fill_bytes(0xCD);
        Context ctx;
        ctx.num_threads = 2;
        ctx.cpu_isa = isa;
        grid_sample_backward(g.grad_output, t.input, t.grid, {}, gg, o, {}, ctx);
        return to_vector(gg);
      };
      const std::vector<double> scalar = grad_grid(CpuIsa::kBaseline, Layout::kNHWC, Layout::kNHWC);
      std::size_t nans = 0;
      for (double v : scalar) nans += std::isnan(v) ? 1 : 0;
      if (o.padding == GridSamplePadding::kZeros) {
        EXPECT_GT(nans, 0u) << "the NaN points' grad_grid is NaN";
      }
      for (CpuIsa isa : variants) {
        for (Layout go_layout : {Layout::kNCHW, Layout::kNHWC}) {
          const std::vector<double> got = grad_grid(isa, Layout::kNCHW, go_layout);
          EXPECT_EQ(std::memcmp(got.data(), scalar.data(), got.size() * sizeof(double)), 0)
              << to_string(o.padding) << " ac" << o.align_corners << " " << Ho << "x" << Wo << " "
              << cpu_isa_name(isa) << (go_layout == Layout::kNHWC ? " nhwc grad_output" : "");
        }
      }
    }
  }
}

/// What torch computes for detectron2's point_sample, `2 * c - 1` in c's dtype: 2c rounded to it,
/// then minus 1 rounded to it (16-bit types compute each step in float and round).
double twice_minus_one(double c, DType gdt) {
  switch (gdt) {
    case DType::kFloat64: return 2.0 * c - 1.0;
    case DType::kFloat16: return static_cast<float>(Half(static_cast<float>(Half(2.0f * static_cast<float>(c))) - 1.0f));
    case DType::kBFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(BFloat16(2.0f * static_cast<float>(c))) - 1.0f));
    default: {
      const float twice = 2.0f * static_cast<float>(c);
      return static_cast<double>(twice - 1.0f);
    }
  }
}

TEST(GridSample, UnitCoordinatesAreTheNormalizedGridAtTwiceMinusOne) {
  // point_sample's unit coordinates c against grid_sample on the grid torch's `2 * c - 1` builds:
  // the same output and grad_input bits, and grad_grid twice the normalized one in the grid's
  // dtype (torch's backward of 2 * c), for every option, dtype pair, layout, mode and
  // instruction set (float32 NCHW runs in lanes), with coordinates whose 2c - 1 rounds.
  std::vector<CpuIsa> variants{CpuIsa::kBaseline};
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (static_cast<int>(isa) <= static_cast<int>(cpu_isa_supported())) variants.push_back(isa);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (GridSampleOptions o : test::all_grid_options()) {
    GridSampleProblem unit = test::make_grid_problem(2, 3, 9, 11, 40, 1, o, 700, 0.7);
    for (double& c : unit.grid) c = 0.5 + 0.5 * c;  // in [0.15, 0.85] (specials moved along)
    const double odd[] = {1e-9, 0.2 + 1e-7, 1.0 - 1e-9, -0.3, 1.4, 0.0, 1.0, nan, inf, -1e-30};
    for (std::size_t i = 5; i < unit.grid.size(); i += 9) unit.grid[i] = odd[(i / 9) % 10];
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const bool wide = dt == DType::kFloat32 || dt == DType::kFloat64;
      for (DType gdt : {dt, wide ? other_grid_dtype(dt) : dt}) {
        GridSampleProblem normalized = test::rounded_problem(unit, dt, gdt);  // the grid as stored
        std::size_t rounded = 0;
        for (double& g : normalized.grid) {
          const double c = g;
          g = twice_minus_one(c, gdt);
          rounded += (g + 1.0) / 2.0 != c ? 1 : 0;
        }
        if (gdt != DType::kFloat64) {
          EXPECT_GT(rounded, 0u) << "some 2c - 1 must round";
        }
        GridSampleProblem u = unit;
        u.opt.coordinates = GridSampleCoordinates::kUnit;
        for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
          for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
            const GridSampleRun want = test::run_grid_sample(normalized, dt, gdt, layout, mode, 2);
            Tensor want_gg = Tensor::empty({u.N, u.Ho, u.Wo, 2}, gdt);
            std::vector<double> doubled = to_vector(want.grad_grid);
            for (double& v : doubled) v *= 2.0;  // exact in every dtype at these magnitudes
            want_gg = make_tensor({u.N, u.Ho, u.Wo, 2}, gdt, doubled);
            for (CpuIsa isa : (dt == DType::kFloat32 && gdt == dt) ? variants : std::vector<CpuIsa>{CpuIsa::kAuto}) {
              const std::string what = name(o, dt, gdt, mode) + (layout == Layout::kNHWC ? " nhwc " : " nchw ") +
                                       cpu_isa_name(isa);
              const GridSampleRun got = test::run_grid_sample(u, dt, gdt, layout, mode, 2, Device::cpu(), isa);
              EXPECT_TRUE(test::same_bytes(got.output, want.output)) << what << " output";
              EXPECT_TRUE(test::same_bytes(got.grad_input, want.grad_input)) << what << " grad_input";
              EXPECT_TRUE(test::same_bytes(got.grad_grid, want_gg)) << what << " grad_grid";
            }
          }
        }
      }
    }
  }
}

TEST(GridSample, NonFiniteCoordinatesFollowPyTorch) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const GridSampleOptions& o : test::all_grid_options()) {
    GridSampleProblem p = test::make_grid_problem(1, 2, 4, 4, 1, 4, o, 400);
    p.grid = {nan, 0.25, 0.5, nan, inf, 0.0, -0.75, -inf};
    const test::GridSampleResult ref = test::grid_sample_reference(p);
    const bool zeros_bilinear = o.padding == GridSamplePadding::kZeros &&
                                o.interpolation == GridSampleInterpolation::kBilinear;
    for (DType dt : {DType::kFloat32, DType::kFloat64}) {
      for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
        const std::string what = name(o, dt, dt, mode);
        const GridSampleRun r = test::run_grid_sample(p, dt, dt, Layout::kNCHW, mode, 2);
        for (const auto& [got, want, n] : {std::tuple{to_vector(r.output), ref.output, "output"},
                                           std::tuple{to_vector(r.grad_input), ref.grad_input, "grad_input"},
                                           std::tuple{to_vector(r.grad_grid), ref.grad_grid, "grad_grid"}}) {
          ASSERT_EQ(got.size(), want.size());
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (std::isnan(want[i])) {
              EXPECT_TRUE(std::isnan(got[i])) << what << " " << n << " " << i;
            } else {
              EXPECT_TRUE(std::isfinite(got[i])) << what << " " << n << " " << i;
              EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << what << " " << n << " " << i;
            }
          }
        }
        // the cases that matter, spelled out: zeros + bilinear shows every non-finite point
        for (double v : to_vector(r.output)) EXPECT_EQ(std::isnan(v), zeros_bilinear) << what;
      }
    }
  }
}

TEST(GridSample, EmptyProblemsSucceedAndZeroFill) {
  const GridSampleOptions o;
  for (auto sizes : std::vector<std::vector<std::int64_t>>{{0, 3, 4, 4, 2, 2}, {2, 0, 4, 4, 2, 2}, {2, 3, 4, 4, 0, 2},
                                                           {2, 3, 0, 0, 0, 0}}) {
    const std::int64_t N = sizes[0], C = sizes[1], H = sizes[2], W = sizes[3], Ho = sizes[4], Wo = sizes[5];
    Tensor input = Tensor::zeros({N, C, H, W}, DType::kFloat32), grid = Tensor::zeros({N, Ho, Wo, 2}, DType::kFloat32);
    Tensor out = Tensor::zeros({N, C, Ho, Wo}, DType::kFloat32), go = Tensor::zeros({N, C, Ho, Wo}, DType::kFloat32);
    Tensor gi = Tensor::empty({N, C, H, W}, DType::kFloat32), gg = Tensor::empty({N, Ho, Wo, 2}, DType::kFloat32);
    gi.fill_bytes(0xCD);
    gg.fill_bytes(0xCD);
    grid_sample_forward(input, grid, out, o);
    for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
      GridSampleBackwardOptions b;
      b.mode = mode;
      grid_sample_backward(go, input, grid, gi, gg, o, b);
      for (double v : to_vector(gi)) EXPECT_EQ(v, 0.0);
      for (double v : to_vector(gg)) EXPECT_EQ(v, 0.0);
    }
  }
}

TEST(GridSample, GradInputAndGradGridAreOptional) {
  const GridSampleProblem p = crowded_problem(GridSamplePadding::kReflection, GridSampleInterpolation::kBilinear);
  const GridSampleRun base = test::run_grid_sample(p, DType::kFloat32, DType::kFloat64, Layout::kNCHW,
                                                   BackwardMode::kExact, 2);
  test::GridSampleTensors t = test::grid_tensors(p, DType::kFloat32, DType::kFloat64, Layout::kNCHW);
  Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, DType::kFloat32);
  Tensor gg = Tensor::empty({p.N, p.Ho, p.Wo, 2}, DType::kFloat64);
  grid_sample_backward(t.grad_output, t.input, t.grid, gi, {}, p.opt, {});
  grid_sample_backward(t.grad_output, t.input, t.grid, {}, gg, p.opt, {});
  EXPECT_TRUE(test::same_bytes(gi, base.grad_input));
  EXPECT_TRUE(test::same_bytes(gg, base.grad_grid));
}

/// One bad call: it must throw detops::Error naming `arg`, and write nothing.
struct BadCase {
  std::string what, arg;
  std::function<void(TensorView&, TensorView&, TensorView&, TensorView&, TensorView&, TensorView&,
                     GridSampleOptions&, GridSampleBackwardOptions&)>
      edit;
};

TEST(GridSample, BadInputThrowsAndWritesNothing) {
  const std::int64_t N = 2, C = 3, H = 4, W = 5, Ho = 3, Wo = 2;
  Tensor input = make_tensor({N, C, H, W}, DType::kFloat32, test::random_values(N * C * H * W, 1));
  Tensor grid = make_tensor({N, Ho, Wo, 2}, DType::kFloat32, test::random_values(N * Ho * Wo * 2, 2));
  Tensor go = make_tensor({N, C, Ho, Wo}, DType::kFloat32, test::random_values(N * C * Ho * Wo, 3));
  Tensor grid16 = make_tensor({N, Ho, Wo, 2}, DType::kFloat16, test::random_values(N * Ho * Wo * 2, 2));
  Tensor out = Tensor::empty({N, C, Ho, Wo}, DType::kFloat32), gi = Tensor::empty({N, C, H, W}, DType::kFloat32);
  Tensor gg = Tensor::empty({N, Ho, Wo, 2}, DType::kFloat32);
  Tensor wrong = Tensor::empty({N, C, H + 1, W}, DType::kFloat32), f64 = Tensor::empty({N, C, Ho, Wo}, DType::kFloat64);
  Tensor i32 = Tensor::empty({N, C, H, W}, DType::kInt32);
  const std::vector<BadCase> cases = {
      {"input rank 3", "input", [&](auto& in, auto&, auto&, auto&, auto&, auto&, auto&, auto&) { in.rank = 3; }},
      {"input int32", "input", [&](auto& in, auto&, auto&, auto&, auto&, auto&, auto&, auto&) { in = i32; }},
      {"grid last dim 3", "grid", [&](auto&, auto& g, auto&, auto&, auto&, auto&, auto&, auto&) { g.sizes[3] = 3; }},
      {"grid batch", "grid", [&](auto&, auto& g, auto&, auto&, auto&, auto&, auto&, auto&) { g.sizes[0] = 1; }},
      {"grid float16 with float32 input", "grid",
       [&](auto&, auto& g, auto&, auto&, auto&, auto&, auto&, auto&) { g = grid16; }},
      {"grid negative stride", "grid",
       [&](auto&, auto& g, auto&, auto&, auto&, auto&, auto&, auto&) { g.strides[1] = -1; }},
      {"output sizes", "output", [&](auto&, auto&, auto& o, auto&, auto&, auto&, auto&, auto&) { o.sizes[2] = 9; }},
      {"output dtype", "output", [&](auto&, auto&, auto& o, auto&, auto&, auto&, auto&, auto&) { o = f64; }},
      {"output aliases input", "output",
       [&](auto& in, auto&, auto& o, auto&, auto&, auto&, auto&, auto&) { o.data = in.data; }},
      {"grad_output dtype", "grad_output",
       [&](auto&, auto&, auto&, auto& g, auto&, auto&, auto&, auto&) { g = f64; }},
      {"grad_input sizes", "grad_input", [&](auto&, auto&, auto&, auto&, auto& g, auto&, auto&, auto&) { g = wrong; }},
      {"grad_grid dtype", "grad_grid",
       [&](auto&, auto&, auto&, auto&, auto&, auto& g, auto&, auto&) { g.dtype = DType::kFloat64; }},
      {"grad_grid aliases grid", "grad_grid",
       [&](auto&, auto& gr, auto&, auto&, auto&, auto& g, auto&, auto&) { g.data = gr.data; }},
      {"grad_input overlaps grad_grid", "grad_grid",
       [&](auto&, auto&, auto&, auto&, auto& gin, auto& g, auto&, auto&) { g.data = gin.data; }},
      {"truncated mode", "truncated",
       [&](auto&, auto&, auto&, auto&, auto&, auto&, auto&, auto& b) { b.mode = BackwardMode::kTruncated; }},
      {"unknown padding", "padding",
       [&](auto&, auto&, auto&, auto&, auto&, auto&, auto& o, auto&) { o.padding = static_cast<GridSamplePadding>(7); }},
      {"unknown interpolation", "interpolation",
       [&](auto&, auto&, auto&, auto&, auto&, auto&, auto& o, auto&) {
         o.interpolation = static_cast<GridSampleInterpolation>(5);
       }},
      {"empty map with points", "input",
       [&](auto& in, auto&, auto&, auto&, auto& g, auto&, auto&, auto&) { in.sizes[2] = 0, g.sizes[2] = 0; }},
  };
  for (const BadCase& bc : cases) {
    TensorView vin = input, vgrid = grid, vout = out, vgo = go, vgi = gi, vgg = gg;
    GridSampleOptions o;
    GridSampleBackwardOptions b;
    bc.edit(vin, vgrid, vout, vgo, vgi, vgg, o, b);
    out.fill_bytes(0xAB);
    gi.fill_bytes(0xAB);
    gg.fill_bytes(0xAB);
    Tensor before_out = Tensor::empty({N, C, Ho, Wo}, DType::kFloat32), before_gi = Tensor::empty({N, C, H, W}, DType::kFloat32);
    before_out.fill_bytes(0xAB);
    before_gi.fill_bytes(0xAB);
    auto check_error = [&](const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bc.what;
      EXPECT_NE(std::string(e.what()).find(bc.arg), std::string::npos) << bc.what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << bc.what << ": " << e.what();
    };
    // the forward's own arguments must make it throw; the others only the backward (a forward
    // that succeeds writes output, which is then poisoned again)
    const bool forward_arg = bc.arg == "output" || bc.arg == "input" || bc.arg == "grid" || bc.arg == "padding" ||
                             bc.arg == "interpolation";
    bool forward_threw = false, backward_threw = false, size_threw = false;
    try {
      grid_sample_forward(vin, vgrid, vout, o);
    } catch (const Error& e) {
      forward_threw = true;
      check_error(e);
    }
    EXPECT_EQ(forward_threw, forward_arg) << bc.what;
    if (forward_threw) {
      EXPECT_TRUE(test::same_bytes(out, before_out)) << bc.what;
    }
    out.fill_bytes(0xAB);  // a forward that returned wrote it
    if (bc.arg != "output") {
      try {
        grid_sample_backward_workspace_size(vgo, vin, vgrid, vgi, vgg, o, b);
      } catch (const Error& e) {
        size_threw = true;
        check_error(e);
      }
      try {
        grid_sample_backward(vgo, vin, vgrid, vgi, vgg, o, b);
      } catch (const Error& e) {
        backward_threw = true;
        check_error(e);
      }
      EXPECT_TRUE(size_threw) << bc.what;
      EXPECT_TRUE(backward_threw) << bc.what;
    }
    EXPECT_TRUE(test::same_bytes(gi, before_gi)) << bc.what;
    std::vector<unsigned char> poison(gg.nbytes(), 0xAB);
    EXPECT_EQ(std::memcmp(gg.view().data, poison.data(), poison.size()), 0) << bc.what;
  }
}

}  // namespace
}  // namespace detops
