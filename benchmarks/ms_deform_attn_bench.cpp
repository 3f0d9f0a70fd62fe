// Multi-scale deformable attention benchmarks at DINO-4scale shapes (one 800x1333 image, levels
// 100x167, 50x84, 25x42, 13x21 at strides 8-64: S = 22223 value rows, M = 8 heads of D = 32
// channels, L = 4 levels, P = 4 points): an encoder layer (Q = S queries) and a decoder layer
// (Q = 900). Forward, backward atomic, backward exact; float32 and bfloat16; CPU with one thread
// and with all of them, CUDA (skips without a device).
//
// Names: BM_MsDeformAttnForward/<device>/<dtype>/<layer>[/t<threads>]
//        BM_MsDeformAttnBackward/<device>/<dtype>/<layer>/<mode>[/t<threads>]   (t0: all threads)
//
// gpu-check bench: ^BM_MsDeformAttn(Forward|Backward)/cuda/
//
// Reference point for the CPU (measured here on one thread, torch 1.13.1): PyTorch's grid_sample
// composition (Deformable-DETR's ms_deform_attn_core_pytorch) takes about 4.8 s for forward +
// backward of one encoder layer; detops aims at a third of that or less.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "detops/ms_deform_attn.h"

namespace {

using namespace detops;

constexpr std::int64_t kM = 8, kD = 32, kL = 4, kP = 4, kDecoderQueries = 900;
const std::int64_t kShapes[kL][2] = {{100, 167}, {50, 84}, {25, 42}, {13, 21}};

std::int64_t value_rows() {
  std::int64_t s = 0;
  for (const auto& hw : kShapes) s += hw[0] * hw[1];
  return s;
}

struct Config {
  Device device;
  DType dtype;
  bool encoder;
  bool backward;
  BackwardMode mode;
  int threads;  // CPU; 0 = all
  std::int64_t Q() const { return encoder ? value_rows() : kDecoderQueries; }
  std::string name() const {
    std::string n = fmt::format("BM_MsDeformAttn{}/{}/{}/{}", backward ? "Backward" : "Forward",
                                device.is_cpu() ? "cpu" : "cuda", bench::dtype_short_name(dtype),
                                encoder ? "encoder" : "decoder");
    if (backward) n += fmt::format("/{}", to_string(mode));
    if (device.is_cpu()) n += fmt::format("/t{}", threads);
    return n;
  }
};

/// A dense tensor on `device` with uniform values in [lo, hi) (filled on the host).
Tensor uniform(std::initializer_list<std::int64_t> sizes, DType dt, Device device, std::uint64_t seed, float lo,
               float hi) {
  Tensor host = Tensor::empty(sizes, dt);
  bench::fill_uniform(host, seed, lo, hi);
  return device.is_cpu() ? std::move(host) : host.to(device);
}

/// Sampling locations as DINO's deformable attention produces them: a reference point per query
/// (encoder: the centre of the query's own pixel, queries being the pixels of every level in
/// order; decoder: a random point) plus offsets of up to 4 pixels of each level, the locality the
/// gathers of a trained model see (uniform random locations over the whole image are much slower
/// for every implementation: each corner then misses the caches).
Tensor locations(std::int64_t Q, bool encoder, Device device) {
  Tensor host = Tensor::empty({1, Q, kM, kL, kP, 2}, DType::kFloat32);
  std::vector<float> ref(static_cast<std::size_t>(2 * Q));
  Tensor random = Tensor::empty({2 * Q + Q * kM * kL * kP * 2}, DType::kFloat32);
  bench::fill_uniform(random, 2, 0.0f, 1.0f);
  const float* u = random.data<float>();
  std::int64_t q = 0;
  if (encoder) {
    for (const auto& hw : kShapes)
      for (std::int64_t i = 0; i < hw[0]; ++i)
        for (std::int64_t j = 0; j < hw[1]; ++j, ++q) {
          ref[2 * q] = (static_cast<float>(j) + 0.5f) / static_cast<float>(hw[1]);
          ref[2 * q + 1] = (static_cast<float>(i) + 0.5f) / static_cast<float>(hw[0]);
        }
  } else {
    for (; q < Q; ++q) ref[2 * q] = u[2 * q], ref[2 * q + 1] = u[2 * q + 1];
  }
  const float* off = u + 2 * Q;
  float* loc = host.data<float>();
  for (std::int64_t k = 0; k < Q; ++k)
    for (std::int64_t m = 0; m < kM; ++m)
      for (std::int64_t l = 0; l < kL; ++l)
        for (std::int64_t p = 0; p < kP; ++p)
          for (int xy = 0; xy < 2; ++xy, ++off, ++loc) {
            const float size = static_cast<float>(kShapes[l][1 - xy]);
            *loc = ref[2 * k + xy] + (*off * 8.0f - 4.0f) / size;
          }
  return device.is_cpu() ? std::move(host) : host.to(device);
}

/// The level table, on the host (allowed for a CUDA call too).
struct Levels {
  Tensor shapes = Tensor::empty({kL, 2}, DType::kInt64), starts = Tensor::empty({kL}, DType::kInt64);
  Levels() {
    std::int64_t start = 0;
    for (std::int64_t l = 0; l < kL; ++l) {
      shapes.data<std::int64_t>()[2 * l] = kShapes[l][0];
      shapes.data<std::int64_t>()[2 * l + 1] = kShapes[l][1];
      starts.data<std::int64_t>()[l] = start;
      start += kShapes[l][0] * kShapes[l][1];
    }
  }
};

void run(benchmark::State& state, const Config& c) {
  try {
    const std::int64_t S = value_rows(), Q = c.Q();
    const Levels levels;
    const Tensor value = uniform({1, S, kM, kD}, c.dtype, c.device, 1, -1.0f, 1.0f);
    const Tensor loc = locations(Q, c.encoder, c.device);
    const Tensor attn = uniform({1, Q, kM, kL, kP}, c.dtype, c.device, 3, 0.0f, 1.0f / (kL * kP));
    Context ctx;
    ctx.num_threads = c.threads;
    if (!c.backward) {
      Tensor out = Tensor::zeros({1, Q, kM * kD}, c.dtype, c.device);
      bench::timed_loop(state, c.device, ctx, [&] {
        ms_deform_attn_forward(value, levels.shapes, levels.starts, loc, attn, out, ctx);
      });
    } else {
      const Tensor grad_out = uniform({1, Q, kM * kD}, c.dtype, c.device, 4, -1.0f, 1.0f);
      Tensor grad_value = Tensor::zeros({1, S, kM, kD}, c.dtype, c.device);
      Tensor grad_loc = Tensor::zeros({1, Q, kM, kL, kP, 2}, DType::kFloat32, c.device);
      Tensor grad_attn = Tensor::zeros({1, Q, kM, kL, kP}, c.dtype, c.device);
      MsDeformAttnBackwardOptions opt;
      opt.mode = c.mode;
      // caller workspace, sized once (the query reads the level table again)
      const std::size_t bytes =
          ms_deform_attn_backward_workspace_size(value, levels.shapes, levels.starts, loc, attn, opt, ctx);
      Tensor ws_storage;
      Workspace ws;
      if (bytes > 0) {
        ws_storage = Tensor::zeros({static_cast<std::int64_t>((bytes + 7) / 8)}, DType::kFloat64, c.device);
        ws = Workspace{ws_storage.view().data, bytes};
      }
      bench::timed_loop(state, c.device, ctx, [&] {
        ms_deform_attn_backward(value, levels.shapes, levels.starts, loc, attn, grad_out, grad_value, grad_loc,
                                grad_attn, opt, ctx, ws);
      });
    }
    state.SetItemsProcessed(state.iterations() * Q * kM * kL * kP);  // samples
  } catch (const std::exception& e) {  // detops::Error, CUDA errors, out of memory: skip, never abort
    state.SkipWithError(e.what());
  }
}

void add(const Config& c) {
  benchmark::internal::Benchmark* b =
      benchmark::RegisterBenchmark(c.name().c_str(), [c](benchmark::State& s) { run(s, c); });
  b->Unit(benchmark::kMillisecond);
  if (c.device.is_cpu()) b->UseRealTime()->Iterations(c.encoder ? 2 : 5);  // seconds per call on one thread
  else b->UseManualTime();
}

void add_all(Device device, std::initializer_list<int> threads) {
  for (bool encoder : {true, false})
    for (DType dt : {DType::kFloat32, DType::kBFloat16})
      for (int t : threads) {
        add({device, dt, encoder, false, BackwardMode::kExact, t});
        add({device, dt, encoder, true, BackwardMode::kAtomic, t});
        add({device, dt, encoder, true, BackwardMode::kExact, t});
      }
}

std::string register_benchmarks(bool /*full*/, const std::string& cuda_skip) {
  add_all(Device::cpu(), {1, 0});
  if (cuda_skip.empty()) {
    add_all(Device::cuda(0), {0});
  } else {
    for (const char* pass : {"Forward", "Backward"})
      benchmark::RegisterBenchmark(fmt::format("BM_MsDeformAttn{}/cuda", pass).c_str(),
                                   [cuda_skip](benchmark::State& s) { s.SkipWithError(cuda_skip.c_str()); });
  }
  return fmt::format("MsDeformAttn: DINO-4scale, one image: S = {} rows (levels 100x167, 50x84, 25x42, 13x21), "
                     "M = {}, D = {}, L = {}, P = {}; encoder Q = S, decoder Q = {}",
                     value_rows(), kM, kD, kL, kP, kDecoderQueries);
}

}  // namespace

namespace detops {
namespace bench {
// Defined in bench_main.cpp, which documents it.
using TakeFlags = int (*)(int* argc, char** argv);
using RegisterBenchmarks = std::string (*)(bool full, const std::string& cuda_skip);
bool add_main_hook(TakeFlags take_flags, RegisterBenchmarks register_benchmarks);
}  // namespace bench
}  // namespace detops

namespace {
[[maybe_unused]] const bool kMainHook = detops::bench::add_main_hook(nullptr, register_benchmarks);
}  // namespace
