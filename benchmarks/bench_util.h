// Helpers shared by the benchmark files of detops_bench: deterministic input fill, the
// DETOPS_BENCH_FULL switch, the CUDA device check and the timed loop (wall clock on the CPU,
// CUDA events with manual time on a GPU). Header-only; benchmarks only, not part of the library.
#pragma once

#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifndef DETOPS_BENCH_CUDA
#define DETOPS_BENCH_CUDA 0
#endif
#if DETOPS_BENCH_CUDA
#include <cuda_runtime.h>
#endif

#include "detops/context.h"
#include "detops/dtype.h"
#include "detops/tensor.h"

namespace detops {
namespace bench {

/// "f32", "f16", "bf16", "f64": the dtype segment of benchmark names.
inline const char* dtype_short_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat64: return "f64";
    default: return "?";
  }
}

/// Fills a dense CPU tensor with uniform values in [lo, hi) in memory order (a fast LCG: the
/// 28M-element tensors are built in a fraction of a second).
inline void fill_uniform(const Tensor& t, std::uint64_t seed, float lo, float hi) {
  std::uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  const std::int64_t n = t.numel();
  const DType dt = t.view().dtype;
  for (std::int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(s >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float v = lo + (hi - lo) * u;
    switch (dt) {
      case DType::kFloat32: t.data<float>()[i] = v; break;
      case DType::kFloat64: t.data<double>()[i] = v; break;
      case DType::kFloat16: t.data<Half>()[i] = Half(v); break;
      case DType::kBFloat16: t.data<BFloat16>()[i] = BFloat16(v); break;
      default: break;
    }
  }
}

/// DETOPS_BENCH_FULL set (and not "0") in the environment: register the whole grid. Read at
/// static registration time, before main() sees the command line.
inline bool full_grid_requested() {
  const char* v = std::getenv("DETOPS_BENCH_FULL");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

/// Whether a CUDA device is usable; asked once, when the first CUDA benchmark runs (never at
/// static registration time, so a machine without a driver still lists every benchmark).
inline bool have_cuda_device() {
  static const int devices = cuda_compiled() ? cuda_device_count() : 0;
  return devices > 0;
}

#if DETOPS_BENCH_CUDA
inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

/// Times each iteration with a pair of events around the op on its stream.
class EventTimer {
 public:
  explicit EventTimer(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    cuda_check(cudaEventCreate(&start_), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  template <class F>
  double seconds(F&& op) {
    cuda_check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    op();
    cuda_check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_{}, stop_{};
};
#endif

/// CUDA iterations time this many back-to-back calls between one pair of events and report the
/// average per call: the host enqueues the next call while the device runs the last (as in a
/// training loop), so a fast kernel is not timed as its launch latency. Equal to CUDA_CHAIN in
/// benchmarks/bench_common.py, which times torch the same way.
constexpr int kCudaChain = 10;

/// Runs `op` in the timed loop: wall clock on the CPU (register with UseRealTime), events on
/// CUDA around kCudaChain calls (register with UseManualTime; one untimed call first).
template <class F>
void timed_loop(benchmark::State& state, Device device, const Context& ctx, F&& op) {
  if (device.is_cpu()) {
    for (auto _ : state) {
      op();
      benchmark::ClobberMemory();
    }
    return;
  }
#if DETOPS_BENCH_CUDA
  op();
  cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.cuda_stream)), "cudaStreamSynchronize");
  EventTimer timer(ctx.cuda_stream);
  for (auto _ : state)
    state.SetIterationTime(timer.seconds([&] {
                             for (int i = 0; i < kCudaChain; ++i) op();
                           }) /
                           kCudaChain);
#else
  (void)ctx;
  state.SkipWithError("CUDA benchmarks need DETOPS_BENCH_CUDA=1 (CUDA runtime header) at compile time");
#endif
}

/// Registers `run(state)` as benchmark `name`: an error (detops::Error, no device, out of memory)
/// skips it, never aborts the suite; milliseconds; wall clock on the CPU (the op runs its own
/// threads), manual (event) time on CUDA.
template <class Run>
void register_op(const std::string& name, Device device, Run run) {
  benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(name.c_str(), [run](benchmark::State& s) {
    try {
      run(s);
    } catch (const std::exception& e) {
      s.SkipWithError(e.what());
    }
  });
  b->Unit(benchmark::kMillisecond);
  if (device.is_cpu()) b->UseRealTime();
  else b->UseManualTime();
}

}  // namespace bench
}  // namespace detops
