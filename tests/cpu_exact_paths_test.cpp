// The CPU backends' two exact-mode paths against each other, bit for bit (issue 29; grid_sample
// and multi-scale deformable attention): the gather
// engine (records, a stable sort, fixed-order sums) and the sequential scatter in canonical order
// with the engine's partials (internal::PlaneScatter). Random problems of every dtype and layout,
// one and several threads, including crowded ones whose destinations receive more than
// kGatherPartial records (so the partials, and their folding, are what is compared). Each path
// writes into grad_input filled with a poison pattern first, so a destination either path skips
// shows too.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "emulated_device.h"
#include "grid_sample_test_util.h"
#include "internal/gather_backward_cpu.h"
#include "internal/grid_sample_backend.h"
#include "internal/ms_deform_attn_backend.h"
#include "ms_deform_attn_call.h"
#include "ms_deform_attn_test_util.h"

namespace detops {
namespace {

using internal::CpuExactPath;

// ---- PlaneScatter on its own: the engine's run sum for one destination -----------------------

/// The engine's value for records in order (gather_run_sum over one run), in float.
float engine_sum(const std::vector<float>& values, std::int64_t split) {
  std::vector<detail::GatherKey> keys(1, 0);
  std::vector<detail::GatherIndex> offsets(1, 0), lengths(1, static_cast<detail::GatherIndex>(values.size()));
  std::vector<float> weights(values.size(), 1.0f);
  std::vector<std::int64_t> sources(values.size());
  for (std::size_t i = 0; i < sources.size(); ++i) sources[i] = static_cast<std::int64_t>(i);
  const detail::GatherSorted<float> g{keys.data(), offsets.data(), lengths.data(), weights.data(), sources.data()};
  return detail::gather_run_sum(g, 0, values.data(), 0, 0, split);
}

TEST(PlaneScatter, EveryRunLengthGivesTheEnginesSum) {
  // Values of mixed magnitudes, so that the grouping into partials changes the rounding.
  std::vector<float> all;
  for (int i = 0; i < 1100; ++i) all.push_back((i % 3 == 0 ? 1e7f : 1.0f) * (i % 2 ? 1.0f : -0.75f) + 0.1f * i);
  for (std::int64_t split : {std::int64_t{0}, std::int64_t{4}, detail::kGatherPartial}) {
    for (std::size_t len : {0u, 1u, 3u, 4u, 5u, 8u, 255u, 256u, 257u, 512u, 513u, 1100u}) {
      const std::vector<float> values(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(len));
      internal::PlaneScatter<float> scatter(3, split);
      float acc[3] = {0.0f, 0.0f, 0.0f};
      for (int plane = 0; plane < 2; ++plane) {  // a second plane starts from nothing again
        acc[1] = 0.0f;
        scatter.next_plane();
        for (float v : values) scatter.add(1, acc[1], v * 1.0f);
        scatter.finish([&](std::int64_t d) { return &acc[d]; });
        const float want = len == 0 ? 0.0f : engine_sum(values, split);
        EXPECT_EQ(std::memcmp(&acc[1], &want, sizeof(float)), 0)
            << "split " << split << " length " << len << " plane " << plane << ": " << acc[1] << " vs " << want;
      }
    }
  }
}

TEST(PlaneScatter, ANegativeZeroPartialIsKept) {
  // One partial of -0: the engine returns it as is; a total started from +0 would not.
  internal::PlaneScatter<float> scatter(1, 4);
  float acc = 0.0f;
  scatter.next_plane();
  scatter.add(0, acc, -0.0f);
  scatter.finish([&](std::int64_t) { return &acc; });
  const float want = engine_sum({-0.0f}, 4);
  EXPECT_EQ(std::memcmp(&acc, &want, sizeof(float)), 0);
}

// ---- run_owned: every thread's state before anything is written -----------------------------

TEST(RunOwned, AnAllocationFailureIsOutOfMemoryWithNothingWritten) {
  int made = 0;
  bool prepared = false, ran = false;
  const auto make = [&] {
    if (++made == 2) throw std::bad_alloc();
    return std::vector<int>(4);
  };
  try {
    internal::run_owned("op", 10, 3, 16, make, [&] { prepared = true; },
                        [&](std::vector<int>&, std::int64_t, std::int64_t) { ran = true; });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("op: the exact mode's scratch (16 bytes per thread, 3 threads)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(prepared);
  EXPECT_FALSE(ran);
}

TEST(RunOwned, ThreadsOwnContiguousRangesCoveringEveryItem) {
  for (int threads : {1, 2, 3, 7, 20}) {
    std::vector<int> owner(10, -1);
    internal::run_owned("op", 10, threads, 0, [] { return 0; }, [] {},
                        [&](int&, std::int64_t lo, std::int64_t hi) {
                          for (std::int64_t i = lo; i < hi; ++i) owner[static_cast<std::size_t>(i)] += 1;
                        });
    for (int o : owner) EXPECT_EQ(o, 0) << threads;  // each item run exactly once
  }
}

// ---- grid_sample --------------------------------------------------------------------------

TEST(CpuExactPaths, GridSampleScatterOnlyWithinItsMemoryBound) {
  // One channel (the scatter's case) on a 1024x1024 map: no workspace (16 bytes per pixel per
  // thread); on 2048x2048 a thread's scatter state would pass kScatterThreadBytes (16 MiB), so the
  // engine (and its workspace) instead.
  for (std::int64_t side : {1024, 2048}) {
    Tensor in = Tensor::zeros({1, 1, side, side}, DType::kFloat32);
    Tensor grid = Tensor::zeros({1, 4, 4, 2}, DType::kFloat32);
    Tensor go = Tensor::zeros({1, 1, 4, 4}, DType::kFloat32);
    Tensor gi = Tensor::zeros({1, 1, side, side}, DType::kFloat32);
    const std::size_t bytes = grid_sample_backward_workspace_size(go, in, grid, gi, {}, GridSampleOptions{}, {});
    if (side == 1024) EXPECT_EQ(bytes, 0u);
    else EXPECT_GT(bytes, 0u);
  }
}

struct GridCase {
  const char* name;
  std::int64_t N, C, H, W, Ho, Wo;
  double range;  // grid values in [-range, range]
};

// (The backend itself takes the scatter only below 16 channels; both paths run every case here.)
// "crowded": 4800 points onto 30 pixels (about 300 records per destination, past the partial
// length), with several channels and with one; "points": point_sample's shape (one channel, many
// images); "sparse": fewer points than pixels; "wide": channels across several groups of the NCHW
// walk.
const GridCase kGridCases[] = {
    {"crowded", 2, 3, 6, 5, 40, 60, 1.2},
    {"crowded points", 3, 1, 6, 5, 40, 60, 1.2},
    {"points", 9, 1, 13, 11, 57, 1, 1.1},
    {"sparse", 2, 4, 23, 19, 5, 7, 1.5},
    {"wide", 1, 37, 9, 8, 12, 10, 1.0},
};

Tensor run_grid_path(const test::GridSampleTensors& t, const test::GridSampleProblem& p, Layout layout,
                     CpuExactPath path, int threads) {
  const DType dt = t.input.view().dtype;
  Tensor gi = Tensor::empty({p.N, p.C, p.H, p.W}, dt, Device::cpu(), layout);
  gi.fill_bytes(0xCD);
  internal::GridSampleCall call{};
  call.op = "paths";
  call.input = t.input.view();
  call.grid = t.grid.view();
  call.grad_output = t.grad_output.view();
  call.grad_input = gi.view();
  call.shape = {p.N, p.C, p.H, p.W, p.Ho, p.Wo, p.opt.interpolation == GridSampleInterpolation::kNearest,
                static_cast<int>(p.opt.padding), p.opt.align_corners,
                p.opt.coordinates == GridSampleCoordinates::kUnit};
  test::PoisonedWorkspace ws(internal::grid_sample_cpu_exact_workspace(call, path));
  Context ctx;
  ctx.num_threads = threads;
  internal::grid_sample_cpu_exact_backward(call, path, ctx, ws.ws);
  return gi;
}

TEST(CpuExactPaths, GridSampleEngineAndScatterGiveTheSameBits) {
  int compared = 0;
  for (const GridCase& g : kGridCases) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (const GridSampleOptions& o : test::all_grid_options()) {
        const test::GridSampleProblem p = test::make_grid_problem(g.N, g.C, g.H, g.W, g.Ho, g.Wo, o, 900, g.range);
        for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
          const test::GridSampleTensors t = test::grid_tensors(p, dt, dt, layout);
          const Tensor engine = run_grid_path(t, p, layout, CpuExactPath::kEngine, 1);
          for (int threads : {1, 3}) {
            const Tensor scatter = run_grid_path(t, p, layout, CpuExactPath::kScatter, threads);
            EXPECT_TRUE(test::same_bytes(scatter, engine))
                << g.name << " " << dtype_name(dt) << " " << to_string(o.padding) << " " << to_string(o.interpolation)
                << (o.align_corners ? " align_corners" : "") << (layout == Layout::kNHWC ? " nhwc" : " nchw")
                << " threads " << threads;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 0);
}

TEST(CpuExactPaths, GridSampleScatterBoundIsTight) {
  // The float32 scatter adds without partials when 4 x (the most points counted at one pixel)
  // <= 256 (records_bounded). Here pixel d = (2, 2) of a 6 x 6 map is each of a point's four
  // corners for 65 points apiece: 260 records, each group counted at a different pixel (65 each).
  // A factor below 4 would skip the partials that d's 260 records need.
  GridSampleOptions o;
  o.align_corners = true;  // pixel = (g + 1) / 2 * 5
  for (std::int64_t C : {1, 3}) {
    test::GridSampleProblem p = test::make_grid_problem(1, C, 6, 6, 1, 260, o, 77);
    for (std::int64_t i = 0; i < 260; ++i) {
      const std::int64_t group = i / 65;  // d as nw, ne, sw, se
      const double f = 0.1 + 0.8 * static_cast<double>(i % 65) / 65.0;
      const double x = (group & 1 ? 1.0 : 2.0) + f, y = (group & 2 ? 1.0 : 2.0) + (1.0 - f);
      p.grid[static_cast<std::size_t>(2 * i)] = x / 2.5 - 1.0;
      p.grid[static_cast<std::size_t>(2 * i + 1)] = y / 2.5 - 1.0;
    }
    const test::GridSampleTensors t = test::grid_tensors(p, DType::kFloat32, DType::kFloat32, Layout::kNCHW);
    const Tensor engine = run_grid_path(t, p, Layout::kNCHW, CpuExactPath::kEngine, 1);
    const Tensor scatter = run_grid_path(t, p, Layout::kNCHW, CpuExactPath::kScatter, 1);
    EXPECT_TRUE(test::same_bytes(scatter, engine)) << C << " channels";
  }
}

// ---- multi-scale deformable attention ------------------------------------------------------

struct MsdaCase {
  const char* name;
  std::int64_t B, M, D, Q, P;
  std::vector<std::int64_t> shapes;  // (H, W) per level
};

// "hot": a 1x1 level every sample reaches (runs of several hundred records: the partials fold);
// "one plane" and "many planes": the plane counts on either side of the backend's choice.
const MsdaCase kMsdaCases[] = {
    {"hot", 2, 2, 5, 80, 4, {3, 5, 4, 4, 1, 1}},
    {"one plane", 1, 1, 8, 30, 3, {6, 7, 3, 4}},
    {"many planes", 2, 4, 3, 9, 2, {5, 5, 2, 3}},
};

using MsdaProblem = ::detops::ref::MsdaProblemRef;

test::MsdaGrads run_msda_path(const test::MsdaTensors& t, const MsdaProblem& pr, const test::MsdaBuf& go, bool strided,
                              CpuExactPath path, int threads) {
  test::MsdaGrads g;
  g.value = test::msda_buf({t.B, t.S, t.M, t.D}, t.value.view.dtype, strided);
  g.loc = test::msda_buf({t.B, t.Q, t.M, t.L, t.P, 2}, t.loc.view.dtype, strided);
  g.attn = test::msda_buf({t.B, t.Q, t.M, t.L, t.P}, t.value.view.dtype, strided);
  for (const test::MsdaBuf* b : {&g.value, &g.loc, &g.attn})
    std::memset(b->view.data, 0xCD, static_cast<std::size_t>(b->view.span_bytes()));
  internal::MsdaCall call = test::msda_call(t, pr, "paths");
  call.grad_output = go.view;
  call.grad_value = g.value.view;
  call.grad_sampling_locations = g.loc.view;
  call.grad_attention_weights = g.attn.view;
  test::PoisonedWorkspace ws(internal::ms_deform_attn_cpu_exact_workspace(call, path));
  Context ctx;
  ctx.num_threads = threads;
  internal::ms_deform_attn_cpu_exact_backward(call, path, ctx, ws.ws);
  return g;
}

TEST(CpuExactPaths, MsDeformAttnEngineAndScatterGiveTheSameBits) {
  int compared = 0;
  for (const MsdaCase& m : kMsdaCases) {
    const MsdaProblem pr = test::msda_random_problem(m.B, m.M, m.D, m.Q, m.P, m.shapes, 77);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (bool strided : {false, true}) {
        const test::MsdaTensors t(pr, dt, dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32, strided);
        const auto n = static_cast<std::size_t>(t.B * t.Q * t.M * t.D);
        const test::MsdaBuf go = test::msda_filled({t.B, t.Q, t.M * t.D}, dt, test::random_values(n, 5), strided);
        const test::MsdaGrads engine = run_msda_path(t, pr, go, strided, CpuExactPath::kEngine, 1);
        for (int threads : {1, 3}) {
          const test::MsdaGrads scatter = run_msda_path(t, pr, go, strided, CpuExactPath::kScatter, threads);
          const std::string what = std::string(m.name) + " " + std::string(dtype_name(dt)) +
                                   (strided ? " strided" : "") + " threads " + std::to_string(threads);
          EXPECT_TRUE(test::msda_same(scatter.value, engine.value)) << what << " grad_value";
          EXPECT_TRUE(test::msda_same(scatter.loc, engine.loc)) << what << " grad_sampling_locations";
          EXPECT_TRUE(test::msda_same(scatter.attn, engine.attn)) << what << " grad_attention_weights";
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 0);
}

}  // namespace
}  // namespace detops
