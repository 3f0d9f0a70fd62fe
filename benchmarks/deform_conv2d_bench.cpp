// Google Benchmark suite of deform_conv2d (DCNv2: with a mask) forward and backward at ResNet-50's
// DCN stages for one 800x1333 image, on the CPU and (when a device is present) CUDA. The side by
// side with torchvision's CPU deform_conv2d is benchmarks/torch/bench_deform.py (the same shapes).
//
// Workloads (float32, 3x3, stride 1, padding 1, no bias, one offset group, offsets of a few
// pixels, mask in [0, 1]):
//   c3   input [1, 128, 100, 167], 128 -> 128 channels
//   c4   input [1, 256, 50, 84],   256 -> 256
//   c5   input [1, 512, 25, 42],   512 -> 512
// Names: BM_DeformConv2dForward/<device>/f32/nchw/<layer>[/t<threads>]
//        BM_DeformConv2dBackward/<device>/f32/nchw/<layer>/<mode>[/t<threads>]
//   mode atomic|exact (every gradient: input, weight, offset, mask), t<n> = Context::num_threads.
// Counters: items = output elements; FLOPs of the GEMMs as "gemm_flops" (2 R Cout Ho Wo each:
// one forward, three backward). Everything is allocated before the timed loop.
// gpu-check bench: ^BM_DeformConv2d(Forward|Backward)/cuda/f32/nchw/

#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <string>

#include "bench_util.h"
#include "detops/detops.h"
#include "test_util.h"

namespace {

using namespace detops;

struct Layer {
  const char* name;
  std::int64_t C, H, W;
};
constexpr Layer kLayers[] = {{"c3", 128, 100, 167}, {"c4", 256, 50, 84}, {"c5", 512, 25, 42}};

struct Config {
  bool backward = false;
  Device device = Device::cpu();
  Layer layer = kLayers[0];
  BackwardMode mode = BackwardMode::kExact;
  int threads = 1;

  std::string name() const {
    std::string n = fmt::format("BM_DeformConv2d{}/{}/f32/nchw/{}", backward ? "Backward" : "Forward",
                                device.is_cpu() ? "cpu" : "cuda", layer.name);
    if (backward) n += fmt::format("/{}", to_string(mode));
    if (device.is_cpu()) n += fmt::format("/t{}", threads);
    return n;
  }
};

/// Random values in [lo, hi) of the given sizes, cached per (what, layer, device).
const Tensor& cached(const std::string& what, std::initializer_list<std::int64_t> sizes, std::uint64_t seed,
                     const Config& c, double lo = -1.0, double hi = 1.0) {
  static std::map<std::string, Tensor> cache;
  const std::string key = fmt::format("{}/{}/{}", what, c.layer.name, c.device.is_cpu() ? 0 : 1);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::int64_t n = 1;
    for (std::int64_t s : sizes) n *= s;
    Tensor t = test::make_tensor(sizes, DType::kFloat32, test::random_values(static_cast<std::size_t>(n), seed, lo, hi));
    it = cache.emplace(key, t.to(c.device)).first;
  }
  return it->second;
}

void bm(benchmark::State& state, const Config& c) {
  Context ctx;
  ctx.num_threads = c.threads;
  const std::int64_t C = c.layer.C, H = c.layer.H, W = c.layer.W;
  DeformConv2dOptions o;
  o.pad_h = o.pad_w = 1;
  const Tensor& input = cached("input", {1, C, H, W}, 1, c);
  const Tensor& weight = cached("weight", {C, C, 3, 3}, 2, c, -0.05, 0.05);
  const Tensor& offset = cached("offset", {1, 18, H, W}, 3, c, -3.0, 3.0);
  const Tensor& mask = cached("mask", {1, 9, H, W}, 4, c, 0.0, 1.0);
  if (!c.backward) {
    Tensor out = Tensor::empty({1, C, H, W}, DType::kFloat32, c.device);
    const std::size_t bytes = deform_conv2d_forward_workspace_size(input, weight, offset, mask, {}, out, o, ctx);
    Tensor scratch = Tensor::zeros({static_cast<std::int64_t>((bytes + 3) / 4)}, DType::kInt32, c.device);
    const Workspace w{scratch.view().data, bytes};
    bench::timed_loop(state, c.device, ctx,
                      [&] { deform_conv2d_forward(input, weight, offset, mask, {}, out, o, ctx, w); });
  } else {
    const Tensor& go = cached("grad_output", {1, C, H, W}, 5, c);
    Tensor gi = Tensor::empty({1, C, H, W}, DType::kFloat32, c.device);
    Tensor gw = Tensor::empty({C, C, 3, 3}, DType::kFloat32, c.device);
    Tensor goff = Tensor::empty({1, 18, H, W}, DType::kFloat32, c.device);
    Tensor gm = Tensor::empty({1, 9, H, W}, DType::kFloat32, c.device);
    const DeformConv2dGrads g{gi, gw, goff, gm, {}};
    DeformConv2dBackwardOptions b;
    b.mode = c.mode;
    const std::size_t bytes = deform_conv2d_backward_workspace_size(go, input, weight, offset, mask, g, o, b, ctx);
    Tensor scratch = Tensor::zeros({static_cast<std::int64_t>((bytes + 3) / 4)}, DType::kInt32, c.device);
    const Workspace w{scratch.view().data, bytes};
    bench::timed_loop(state, c.device, ctx,
                      [&] { deform_conv2d_backward(go, input, weight, offset, mask, g, o, b, ctx, w); });
  }
  const double gemm = 2.0 * static_cast<double>(C * 9 * C * H * W);
  state.SetItemsProcessed(state.iterations() * C * H * W);
  state.counters["gemm_flops"] = benchmark::Counter(gemm * (c.backward ? 3 : 1), benchmark::Counter::kIsIterationInvariantRate);
}

void add(const Config& c) {
  bench::register_op(c.name(), c.device, [c](benchmark::State& s) { bm(s, c); });
}

const bool kRegistered = [] {
  for (Device device : {Device::cpu(), Device::cuda(0)})
    for (int threads : {1, 2}) {
      if (device.is_cuda() && threads > 1) continue;
      for (const Layer& layer : kLayers) {
        Config c;
        c.device = device, c.layer = layer, c.threads = threads;
        add(c);
        c.backward = true;
        for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kExact}) {
          c.mode = m;
          add(c);
        }
      }
    }
  return true;
}();

}  // namespace
