// Google Benchmark suite of FrozenBatchNorm2d forward and backward on ResNet-50 backbone activations,
// on the CPU and (in CUDA builds, with a device) CUDA, with a plain copy of the same bytes as the
// bandwidth baseline and an unfused sequence against the fused epilogues. This file only registers
// benchmarks (statically); main() is in bench_main.cpp (one detops_bench executable).
//
// Workload: two backbone activations of Mask R-CNN R50-FPN on two 800x1088 images:
//   res2 [2, 256, 200, 272] (stride 4, 27.9M elements: 111 MB in float32) and
//   res5 [2, 2048, 25, 34]  (stride 32, 3.5M elements: the deep, narrow end; H*W = 850).
// x in [-3, 3), residual in [-2, 2), grad_y in [-1, 1) (random, fixed seed), scale and shift from
// random buffers (so about half of the ReLU masks are open).
//
// Names: BM_FrozenBnForward/<device>/<shape>/<dtype>/<layout>/<epilogue>[/t<threads>]
//        BM_FrozenBnBackward/<device>/<shape>/<dtype>/<layout>/<epilogue>[/t<threads>]
//        BM_FrozenBnCopy/<device>/<shape>/<dtype>[/t<threads>]         baseline: copy x to y
//        BM_FrozenBnUnfused/<device>/<shape>/<dtype>/<layout>/<relu|add_relu>[/t<threads>]
//   device cpu|cuda, shape res2|res5, dtype f32|f16|bf16, layout nchw|nhwc, epilogue
//   none|relu|add_relu, t<n> = Context::num_threads (CPU only). Google Benchmark appends /real_time
//   (CPU: wall clock, since the op runs its own threads) or /manual_time (CUDA: events).
//
// Counters: items = N*C*H*W elements. bytes = bytes read + written, counted per tensor pass
// (scale and shift included):
//   forward   none/relu: x + y;           add_relu: x + residual + y
//   backward  none: grad_y + grad_x;      relu: grad_y + y + grad_x;
//             add_relu: grad_y + y + grad_x + grad_residual
//   copy      x + y (std::memcpy on the CPU, split over the same thread count; cudaMemcpyAsync
//             device to device on CUDA): the ceiling every pass above can reach in bytes/s
//   unfused   what the unfused sequence moves: forward none (x + y), then on the CPU a hand-written
//             residual add pass (y + residual + y) and a ReLU pass (y + y), each rounded to the
//             dtype; relu: forward none + the ReLU pass. On CUDA (a .cpp file holds no kernels) the
//             add and the ReLU are one extra library pass, an identity FrozenBatchNorm2d with
//             kAddRelu (or kRelu) in place on y. Compare its time with BM_FrozenBnForward/.../add_relu.
//
// Default selection (38 runs, 49 s measured on a 2-core VM): float32 NCHW res2 carries every
// epilogue x pass x {1, 2} threads; NHWC, float16, bfloat16 and res5 get add_relu (the bottleneck
// tail) at 2 threads; copy and unfused baselines next to them. DETOPS_BENCH_FULL=1 in the environment
// registers the whole grid (2 shapes x 3 dtypes x 2 layouts x 3 epilogues x 2 passes x {1, 2}
// threads, plus baselines). CUDA builds (DETOPS_BENCH_CUDA=1) register the CUDA grid (1 thread
// count, every combination); without a device each CUDA benchmark skips, it never fails.
//
// Inputs are built once per (device, shape, dtype, layout) and kept only while benchmarks of that
// key run (the registration order groups them), so memory stays bounded (~700 MB for res2 f32).
// Outputs are allocated and touched before the timed loop; the backward's y comes from an untimed
// forward. Inputs are not rotated: res2 exceeds any CPU's last-level cache and an H100/H200's L2
// even in 16-bit (56 MB); res5 (7-14 MB) may partly stay in a GPU's L2.
// Timed on CUDA by the gpu preset (cmake/DetopsGpuCheck.cmake):
// gpu-check bench: ^BM_FrozenBnCopy/cuda/res2/|^BM_FrozenBn(Forward|Backward)/cuda/res2/(f32|f16|bf16)/(nchw|nhwc)/(none|add_relu)/|^BM_FrozenBnUnfused/cuda/res2/f32/nchw/add_relu/

#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "detops/context.h"
#include "detops/dtype.h"
#include "detops/error.h"
#include "detops/frozen_batch_norm.h"
#include "detops/tensor.h"

namespace {

using namespace detops;
using namespace detops::bench;  // fill_uniform, timed_loop, full_grid_requested, ...
using Epi = FrozenBnEpilogue;

// ---------------------------------------------------------------------------------------------
// Configurations

struct Shape {
  const char* name;
  std::int64_t N, C, H, W;
  std::int64_t numel() const { return N * C * H * W; }
};
constexpr Shape kRes2{"res2", 2, 256, 200, 272};
constexpr Shape kRes5{"res5", 2, 2048, 25, 34};

enum class Kind { kForward, kBackward, kCopy, kUnfused };

struct Config {
  Kind kind = Kind::kForward;
  Device device = Device::cpu();
  Shape shape = kRes2;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  Epi epi = Epi::kNone;
  int threads = 1;  // CPU only

  static const char* short_name(DType t) {
    switch (t) {
      case DType::kFloat32: return "f32";
      case DType::kFloat16: return "f16";
      case DType::kBFloat16: return "bf16";
      case DType::kFloat64: return "f64";
      default: return "?";
    }
  }
  static const char* epi_name(Epi e) {
    switch (e) {
      case Epi::kNone: return "none";
      case Epi::kRelu: return "relu";
      case Epi::kAddRelu: return "add_relu";
    }
    return "?";
  }
  std::string name() const {
    const char* dev = device.is_cpu() ? "cpu" : "cuda";
    const char* lay = layout == Layout::kNHWC ? "nhwc" : "nchw";
    std::string n;
    switch (kind) {
      case Kind::kForward:
      case Kind::kBackward:
        n = fmt::format("BM_FrozenBn{}/{}/{}/{}/{}/{}", kind == Kind::kForward ? "Forward" : "Backward", dev,
                        shape.name, short_name(dtype), lay, epi_name(epi));
        break;
      case Kind::kCopy: n = fmt::format("BM_FrozenBnCopy/{}/{}/{}", dev, shape.name, short_name(dtype)); break;
      case Kind::kUnfused:
        n = fmt::format("BM_FrozenBnUnfused/{}/{}/{}/{}/{}", dev, shape.name, short_name(dtype), lay, epi_name(epi));
        break;
    }
    if (device.is_cpu()) n += fmt::format("/t{}", threads);
    return n;
  }
  /// Inputs are shared by every benchmark with the same key.
  std::string input_key() const {
    return fmt::format("{}/{}/{}/{}", device.is_cpu() ? "cpu" : "cuda", shape.name, short_name(dtype),
                       static_cast<int>(layout));
  }
};

// ---------------------------------------------------------------------------------------------
// Inputs

Tensor param_tensor(std::int64_t C, std::uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty({C}, DType::kFloat32);
  fill_uniform(t, seed, lo, hi);
  return t;
}

struct Inputs {
  std::string key;
  Tensor x, residual, grad_y;
  FrozenBatchNorm2d fbn;       // folded from random buffers
  FrozenBatchNorm2d identity;  // for the CUDA unfused sequence
};

/// The inputs of `c`, built on first use and kept until a benchmark with another key asks.
const Inputs& inputs(const Config& c) {
  static std::unique_ptr<Inputs> slot;
  const std::string key = c.input_key();
  if (slot && slot->key == key) return *slot;
  slot.reset();  // free the previous key's tensors first
  auto in = std::make_unique<Inputs>();
  in->key = key;
  const Shape& s = c.shape;
  auto make = [&](std::uint64_t seed, float lo, float hi) {
    Tensor t = Tensor::empty({s.N, s.C, s.H, s.W}, c.dtype, Device::cpu(), c.layout);
    fill_uniform(t, seed, lo, hi);  // memory order: the values do not depend on the layout's meaning
    return c.device.is_cpu() ? std::move(t) : t.to(c.device);
  };
  in->x = make(1, -3, 3);
  in->residual = make(2, -2, 2);
  in->grad_y = make(3, -1, 1);
  const Tensor w = param_tensor(s.C, 4, 0.2f, 2.0f), b = param_tensor(s.C, 5, -1, 1), m = param_tensor(s.C, 6, -1, 1),
               v = param_tensor(s.C, 7, 0.1f, 3.0f);
  in->fbn = FrozenBatchNorm2d::from_state(BatchNormState{w, b, m, v, 1e-5}, c.device);
  in->identity = FrozenBatchNorm2d::identity(s.C, 1e-5, c.device);
  slot = std::move(in);
  return *slot;
}

/// An output in the config's layout and device, touched now so page faults stay out of the loop.
Tensor prepared(const Config& c) {
  const Shape& s = c.shape;
  Tensor t = Tensor::empty({s.N, s.C, s.H, s.W}, c.dtype, c.device, c.layout);
  t.fill_bytes(0);
  return t;
}

// ---------------------------------------------------------------------------------------------
// CPU helpers: the copy baseline and the hand-written passes of the unfused sequence, split over
// the same number of threads as the op (contiguous chunks, std::threads started per call, as the
// library does).

void parallel_chunks(std::int64_t n, int threads, const std::function<void(std::int64_t, std::int64_t)>& f) {
  const int t = std::max(1, threads);
  if (t == 1 || n < 2) {
    f(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int i = 1; i < t; ++i) pool.emplace_back([&, i] { f(n * i / t, n * (i + 1) / t); });
  f(0, n / t);
  for (auto& th : pool) th.join();
}

void copy_bytes_parallel(void* dst, const void* src, std::int64_t bytes, int threads) {
  parallel_chunks(bytes, threads, [&](std::int64_t lo, std::int64_t hi) {
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, static_cast<std::size_t>(hi - lo));
  });
}

template <class T>
void add_pass(T* y, const T* r, std::int64_t n, int threads) {
  parallel_chunks(n, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) y[i] = from_acc<T>(to_acc(y[i]) + to_acc(r[i]));
  });
}

template <class T>
void relu_pass(T* y, std::int64_t n, int threads) {
  parallel_chunks(n, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const acc_t<T> v = to_acc(y[i]);
      y[i] = from_acc<T>(v > acc_t<T>(0) ? v : acc_t<T>(0));
    }
  });
}

/// Calls f(T{}) with the element type of a floating dtype.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: f(float{}); break;
    case DType::kFloat64: f(double{}); break;
    case DType::kFloat16: f(Half{}); break;
    case DType::kBFloat16: f(BFloat16{}); break;
    default: throw std::runtime_error("not a floating dtype");
  }
}

// ---------------------------------------------------------------------------------------------
// The benchmarks

/// Bytes read + written (see the file comment).
std::int64_t bytes_moved(const Config& c) {
  const std::int64_t t = c.shape.numel() * static_cast<std::int64_t>(dtype_size(c.dtype));
  const std::int64_t params = c.shape.C * 4;  // float32 scale (and shift)
  switch (c.kind) {
    case Kind::kForward: return (c.epi == Epi::kAddRelu ? 3 : 2) * t + 2 * params;
    case Kind::kBackward: return (c.epi == Epi::kNone ? 2 : c.epi == Epi::kRelu ? 3 : 4) * t + params;
    case Kind::kCopy: return 2 * t;
    case Kind::kUnfused:
      if (c.device.is_cpu()) return (c.epi == Epi::kAddRelu ? 2 + 3 + 2 : 2 + 2) * t + 2 * params;
      return (c.epi == Epi::kAddRelu ? 2 + 3 : 2 + 2) * t + 4 * params;
  }
  return 0;
}

void bm(benchmark::State& state, const Config& c) {
  if (c.device.is_cuda()) {
    if (!have_cuda_device()) {
      state.SkipWithError("no CUDA device");
      return;
    }
  }
  const Inputs& in = inputs(c);
  Context ctx;
  ctx.num_threads = c.threads;
  const TensorView res = c.epi == Epi::kAddRelu ? in.residual.view() : TensorView{};
  switch (c.kind) {
    case Kind::kForward: {
      Tensor y = prepared(c);
      timed_loop(state, c.device, ctx, [&] { in.fbn.forward(in.x, y, c.epi, res, ctx); });
      break;
    }
    case Kind::kBackward: {
      Tensor y = prepared(c), gx = prepared(c), gr;
      if (c.epi != Epi::kNone) in.fbn.forward(in.x, y, c.epi, res, ctx);  // the mask, untimed
      if (c.epi == Epi::kAddRelu) gr = prepared(c);
      const TensorView yv = c.epi == Epi::kNone ? TensorView{} : y.view();
      timed_loop(state, c.device, ctx, [&] { in.fbn.backward(in.grad_y, gx, c.epi, yv, gr, ctx); });
      break;
    }
    case Kind::kCopy: {
      Tensor y = prepared(c);
      const std::int64_t bytes = static_cast<std::int64_t>(in.x.nbytes());
      if (c.device.is_cpu()) {
        timed_loop(state, c.device, ctx, [&] { copy_bytes_parallel(y.view().data, in.x.view().data, bytes, c.threads); });
      } else {
#if DETOPS_BENCH_CUDA
        timed_loop(state, c.device, ctx, [&] {
          cuda_check(cudaMemcpyAsync(y.view().data, in.x.view().data, static_cast<std::size_t>(bytes),
                                     cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(ctx.cuda_stream)),
                     "cudaMemcpyAsync");
        });
#else
        timed_loop(state, c.device, ctx, [] {});
#endif
      }
      break;
    }
    case Kind::kUnfused: {
      Tensor y = prepared(c);
      const std::int64_t n = c.shape.numel();
      if (c.device.is_cpu()) {
        with_type(c.dtype, [&](auto tag) {
          using T = decltype(tag);
          T* yp = y.data<T>();
          const T* rp = in.residual.data<T>();
          timed_loop(state, c.device, ctx, [&] {
            in.fbn.forward(in.x, y, Epi::kNone, {}, ctx);
            if (c.epi == Epi::kAddRelu) add_pass(yp, rp, n, c.threads);
            relu_pass(yp, n, c.threads);
          });
        });
      } else {
        timed_loop(state, c.device, ctx, [&] {
          in.fbn.forward(in.x, y, Epi::kNone, {}, ctx);
          in.identity.forward(y, y, c.epi, res, ctx);  // the add and the ReLU, one more pass
        });
      }
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * c.shape.numel());
  state.SetBytesProcessed(state.iterations() * bytes_moved(c));
}

void run(benchmark::State& state, const Config& c) {
  try {
    bm(state, c);
  } catch (const std::exception& e) {  // detops::Error, CUDA errors, out of memory: skip, never abort
    state.SkipWithError(e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Registration (static: main() is in bench_main.cpp)

void add(const Config& c) {
  benchmark::internal::Benchmark* b =
      benchmark::RegisterBenchmark(c.name().c_str(), [c](benchmark::State& s) { run(s, c); });
  b->Unit(benchmark::kMillisecond);
  if (c.device.is_cpu()) b->UseRealTime();  // the op runs its own threads
  else b->UseManualTime();
}

constexpr Epi kEpilogues[] = {Epi::kNone, Epi::kRelu, Epi::kAddRelu};

/// Every combination for one device, grouped by input key (shape, dtype, layout).
void register_grid(Device device, std::initializer_list<int> thread_counts) {
  for (const Shape& s : {kRes2, kRes5})
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (Layout l : {Layout::kNCHW, Layout::kNHWC})
        for (int t : thread_counts) {
          Config c;
          c.device = device, c.shape = s, c.dtype = dt, c.layout = l, c.threads = t;
          if (l == Layout::kNCHW) {
            c.kind = Kind::kCopy;
            add(c);
          }
          for (Kind k : {Kind::kForward, Kind::kBackward})
            for (Epi e : kEpilogues) {
              c.kind = k, c.epi = e;
              add(c);
            }
          c.kind = Kind::kUnfused;
          for (Epi e : {Epi::kRelu, Epi::kAddRelu}) {
            c.epi = e;
            add(c);
          }
        }
}

/// The default CPU selection (see the file comment), grouped by input key.
void register_cpu_default() {
  auto cfg = [](Kind k, const Shape& s, DType dt, Layout l, Epi e, int t) {
    Config c;
    c.kind = k, c.shape = s, c.dtype = dt, c.layout = l, c.epi = e, c.threads = t;
    return c;
  };
  const DType f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16;
  const Layout nchw = Layout::kNCHW, nhwc = Layout::kNHWC;
  const Epi none = Epi::kNone, relu = Epi::kRelu, add_relu = Epi::kAddRelu;

  // res2 float32 NCHW: everything, 1 and 2 threads
  for (int t : {1, 2}) {
    add(cfg(Kind::kCopy, kRes2, f32, nchw, none, t));
    for (Kind k : {Kind::kForward, Kind::kBackward})
      for (Epi e : kEpilogues) add(cfg(k, kRes2, f32, nchw, e, t));
    add(cfg(Kind::kUnfused, kRes2, f32, nchw, add_relu, t));
  }
  add(cfg(Kind::kUnfused, kRes2, f32, nchw, relu, 2));
  // res2 NHWC and 16-bit: the bottleneck tail (add_relu), 2 threads
  add(cfg(Kind::kForward, kRes2, f32, nhwc, none, 2));
  add(cfg(Kind::kForward, kRes2, f32, nhwc, add_relu, 2));
  add(cfg(Kind::kBackward, kRes2, f32, nhwc, add_relu, 2));
  for (DType dt : {f16, bf16}) {
    add(cfg(Kind::kCopy, kRes2, dt, nchw, none, 2));
    add(cfg(Kind::kForward, kRes2, dt, nchw, add_relu, 2));
    add(cfg(Kind::kBackward, kRes2, dt, nchw, add_relu, 2));
    add(cfg(Kind::kUnfused, kRes2, dt, nchw, add_relu, 2));
    add(cfg(Kind::kForward, kRes2, dt, nhwc, add_relu, 2));
    add(cfg(Kind::kBackward, kRes2, dt, nhwc, add_relu, 2));
  }
  // res5: deep and narrow
  add(cfg(Kind::kCopy, kRes5, f32, nchw, none, 2));
  for (Layout l : {nchw, nhwc}) {
    add(cfg(Kind::kForward, kRes5, f32, l, add_relu, 2));
    add(cfg(Kind::kBackward, kRes5, f32, l, add_relu, 2));
  }
  add(cfg(Kind::kForward, kRes5, f16, nhwc, add_relu, 2));
}

[[maybe_unused]] const bool kRegistered = [] {
  if (full_grid_requested()) register_grid(Device::cpu(), {1, 2});
  else register_cpu_default();
#if DETOPS_BENCH_CUDA
  // Registered without asking the driver (static initialization runs before main); each CUDA
  // benchmark checks for a device when it runs and skips without one.
  register_grid(Device::cuda(0), {1});
#endif
  return true;
}();

}  // namespace
