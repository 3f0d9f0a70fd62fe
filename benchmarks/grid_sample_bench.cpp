// Google Benchmark suite of grid_sample forward and backward on two detection workloads, on the
// CPU and (when a device is present) CUDA:
//   decoder: an RT-DETR-like deformable decoder sampling one level: input [1, 256, 100, 167]
//            (stride 8 of an 800x1333 image), grid [1, 300, 16, 2] (300 queries x 16 points),
//            bilinear, zeros padding, align_corners false;
//   points:  Mask2Former's point loss: mask logits [100, 1, 112, 112] sampled at 12544 points
//            each, grid [100, 12544, 1, 2], bilinear, zeros, align_corners false.
// Grid values are uniform in [-1.1, 1.1] (a few points fall outside), seeded.
//
// Names: BM_GridSampleForward/<device>/<dtype>/<workload>
//        BM_GridSampleBackward/<device>/<dtype>/<workload>/<mode>
//   device cpu|cuda, dtype f32|bf16 (the grid in the input's dtype), workload decoder|points,
//   mode atomic|exact. The backward computes grad_input and grad_grid. CPU: wall clock with
//   Context's default threads; CUDA: events (bench::timed_loop), skipped without a device.
// Counters: items = grid points x channels (output elements).
// gpu-check bench: ^BM_GridSample(Forward|Backward)/cuda/

#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "detops/detops.h"

namespace {

using namespace detops;
using bench::dtype_short_name;

struct Workload {
  const char* name;
  std::int64_t N, C, H, W, Ho, Wo;
};
constexpr Workload kDecoder{"decoder", 1, 256, 100, 167, 300, 16};
constexpr Workload kPoints{"points", 100, 1, 112, 112, 12544, 1};

struct Config {
  Workload w;
  Device device;
  DType dtype;
  bool backward;
  BackwardMode mode;
  std::string name() const {
    std::string n = fmt::format("BM_GridSample{}/{}/{}/{}", backward ? "Backward" : "Forward",
                                device.is_cpu() ? "cpu" : "cuda", dtype_short_name(dtype), w.name);
    return backward ? n + "/" + to_string(mode) : n;
  }
};

/// A tensor filled on the host (seeded) and moved to the device, touched before timing.
Tensor filled(std::initializer_list<std::int64_t> sizes, DType dt, Device dev, std::uint64_t seed, float lo, float hi) {
  Tensor host = Tensor::empty(sizes, dt);
  bench::fill_uniform(host, seed, lo, hi);
  return dev.is_cpu() ? std::move(host) : host.to(dev);
}

void run(benchmark::State& state, const Config& c) {
  if (!c.device.is_cpu() && !bench::have_cuda_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  try {
    const Workload& w = c.w;
    Tensor input = filled({w.N, w.C, w.H, w.W}, c.dtype, c.device, 1, -1.0f, 1.0f);
    Tensor grid = filled({w.N, w.Ho, w.Wo, 2}, c.dtype, c.device, 2, -1.1f, 1.1f);
    GridSampleOptions opt;
    Context ctx;
    if (!c.backward) {
      Tensor output = Tensor::empty({w.N, w.C, w.Ho, w.Wo}, c.dtype, c.device);
      output.fill_bytes(0);
      bench::timed_loop(state, c.device, ctx, [&] { grid_sample_forward(input, grid, output, opt, ctx); });
    } else {
      Tensor go = filled({w.N, w.C, w.Ho, w.Wo}, c.dtype, c.device, 3, -1.0f, 1.0f);
      Tensor gi = Tensor::empty({w.N, w.C, w.H, w.W}, c.dtype, c.device);
      Tensor gg = Tensor::empty({w.N, w.Ho, w.Wo, 2}, c.dtype, c.device);
      gi.fill_bytes(0);
      gg.fill_bytes(0);
      GridSampleBackwardOptions b;
      b.mode = c.mode;
      const std::size_t bytes = grid_sample_backward_workspace_size(go, input, grid, gi, gg, opt, b, ctx);
      Tensor ws = Tensor::empty({static_cast<std::int64_t>(bytes / 8 + 1)}, DType::kFloat64, c.device);
      ws.fill_bytes(0);
      const Workspace workspace{ws.view().data, bytes};
      bench::timed_loop(state, c.device, ctx,
                        [&] { grid_sample_backward(go, input, grid, gi, gg, opt, b, ctx, workspace); });
    }
    state.SetItemsProcessed(state.iterations() * w.N * w.C * w.Ho * w.Wo);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

bool register_all() {
  for (Device dev : {Device::cpu(), Device::cuda(0)}) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      for (const Workload& w : {kDecoder, kPoints}) {
        std::vector<Config> configs = {{w, dev, dt, false, BackwardMode::kExact},
                                       {w, dev, dt, true, BackwardMode::kAtomic},
                                       {w, dev, dt, true, BackwardMode::kExact}};
        for (const Config& c : configs) {
          benchmark::internal::Benchmark* b =
              benchmark::RegisterBenchmark(c.name().c_str(), [c](benchmark::State& s) { run(s, c); });
          b->Unit(benchmark::kMillisecond);
          if (dev.is_cpu()) b->UseRealTime();  // the op runs its own threads
          else b->UseManualTime();
        }
      }
    }
  }
  return true;
}

const bool kRegistered = register_all();

}  // namespace
