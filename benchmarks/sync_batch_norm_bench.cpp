// Google Benchmark suite of SyncBatchNorm in training mode on one rank (communicator nullptr: what
// torch.nn.BatchNorm2d computes), on the CPU and (in CUDA builds, with a device) CUDA: the one-call
// forward and backward, a whole training step, the two heavy phases alone, and two in-process
// ranks (ThreadGroup) for the cost of the rank-agreement header and the all-gathers. This file
// only registers benchmarks (statically); main() is in bench_main.cpp (one detops_bench).
//
// Workload: activations of Mask R-CNN R50-FPN on two 800x1088 images:
//   res2 [2, 256, 200, 272]  (stride 4, 27.9M elements: 111 MB in float32; H*W = 54400),
//   res5 [2, 2048, 25, 34]   (stride 32, 3.5M elements: deep and narrow; H*W = 850),
//   box  [512, 256, 7, 7]    (the 4conv1fc box head's RoI features, 512 RoIs: 6.4M elements,
//                             H*W = 49, so every image is one short chunk of the statistics).
// x in [-3, 3), grad_y in [-1, 1) (random, fixed seed), weight in [0.2, 2), bias in [-1, 1),
// running_mean 0, running_var 1 (float32), num_batches_tracked [1] int64; eps 1e-5, momentum 0.1,
// check_ranks on (it costs nothing on one rank).
//
// Names: BM_SyncBnForward/<device>/<shape>/<dtype>/<layout>/<mode>[/t<threads>]   training forward:
//                                   stats + finalize + apply (sync_batch_norm_forward)
//        BM_SyncBnBackward/...      training backward with grad_x, grad_weight, grad_bias
//                                   (sync_batch_norm_backward; save_mean/invstd from an untimed
//                                   forward)
//        BM_SyncBnTrainStep/...     forward + backward: the figure to compare with
//                                   torch.nn.BatchNorm2d training forward+backward
//                                   (benchmarks/compare_torch_bn.py)
//        BM_SyncBnLocalStats/...    sync_batch_norm_local_stats alone (exact: with the scales of
//                                   an untimed local_scales + merge_scales)
//        BM_SyncBnApply/<device>/<shape>/<dtype>/<layout>[/t<threads>]   sync_batch_norm_apply
//                                   alone (no mode: it does not depend on it)
//        BM_SyncBnLocalBackward/... sync_batch_norm_local_backward alone (exact: with untimed scales)
//        BM_SyncBnBackwardApply/<device>/<shape>/<dtype>/<layout>[/t<threads>]
//                                   sync_batch_norm_backward_apply alone (grad_x; no mode)
//        BM_SyncBnThreadGroup/cpu/<shape>/<dtype>/<layout>/<mode>/r2/t<threads>   a training step
//                                   on 2 ranks of one ThreadGroup, each a thread with
//                                   Context::num_threads = <threads> on its half of the batch
//                                   (N/2 images): compare r2/t1 with BM_SyncBnTrainStep/.../t2;
//                                   the difference is the header exchange, the all-gathers (2 per
//                                   direction in exact mode, 1 in default) and their waits, plus
//                                   one std::thread started per step for rank 1.
//   device cpu|cuda, dtype f32|f16|bf16, layout nchw|nhwc, mode default|exact (SyncBnMode),
//   t<n> = Context::num_threads (CPU only); a suffix /isa_baseline or /isa_avx2 sets
//   Context::cpu_isa (CPU train step only; without it the kernels use the widest set the CPU
//   has). Google Benchmark appends /real_time (CPU: wall clock,
//   since the op runs its own threads) or /manual_time (CUDA: events).
//
// Counters: items = N*C*H*W elements. bytes = one tensor (N*C*H*W * dtype size) per pass over a
// tensor, read or written, as a kernel streaming it from memory would (the second pass of the
// default mode's two-pass chunk moments reads the chunk from cache, so it is not counted;
// [C]-sized parameters and statistics are not counted):
//   local_stats   x                                          (1 tensor)
//   apply         x + y                                      (2)
//   local_backward grad_y + x                                (2)
//   backward_apply grad_y + x + grad_x                       (3)
//   forward       default: stats x, apply x + y              (3)
//                 exact:   + local_scales x                  (4)
//   backward      default: local_backward grad_y + x, backward_apply grad_y + x + grad_x (5)
//                 exact:   + local_scales grad_y + x         (7)
//   train step    forward + backward                         (default 8, exact 11)
//   thread group  the train step's, over both ranks
//
// Default selection (43 runs, about 50 s on a loaded 2-core VM): float32; res5 NCHW carries every
// benchmark in default mode at 1 and 2 threads, plus the exact train step (t1, t2) and exact
// local stats (t2); res5 NHWC the train step (t1, t2, exact t2) and the four phases at t2; the
// 2-rank thread group for res5 (both layouts) and box; res2 and box the train step at 1 and 2
// threads (NCHW) and 2 threads (NHWC), plus res2's forward and backward at 2 threads; the train
// step of res5 and box, both layouts, 1 thread, at /isa_baseline and /isa_avx2.
// DETOPS_BENCH_FULL=1 in the environment registers the whole grid (3 shapes x 2 layouts x 2 modes
// x every benchmark x {1, 2} threads, float32; float16 and bfloat16 for the train step; the
// float32 default-mode train step also at /isa_baseline and /isa_avx2). CUDA
// builds (DETOPS_BENCH_CUDA=1) register the CUDA grid (float32: forward, backward and train step
// for every shape, layout and mode; the four phases for res2 default; all of it with
// DETOPS_BENCH_FULL); without a device each CUDA benchmark skips, it never fails. The
// thread-group benchmark is CPU only.
//
// Inputs are built once per (device, shape, dtype, layout) and kept only while benchmarks of that
// key run (the registration order groups them). Outputs, statistics and parameter gradients are
// allocated and touched before the timed loop; the running statistics are each benchmark's own
// and keep being updated by the timed forwards, as in training. Inputs are not rotated: res2 and
// box exceed any CPU's last-level cache; res5 (14 MB) may partly stay in a GPU's L2.
// Timed on CUDA by the gpu preset (cmake/DetopsGpuCheck.cmake):
// gpu-check bench: ^BM_SyncBnTrainStep/cuda/|^BM_SyncBn(Forward|Backward|LocalStats|Apply)/cuda/res2/f32/nchw/

#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "detops/communicator.h"
#include "detops/context.h"
#include "detops/dtype.h"
#include "detops/error.h"
#include "detops/sync_batch_norm.h"
#include "detops/tensor.h"

namespace {

using namespace detops;
using namespace detops::bench;  // fill_uniform, timed_loop, full_grid_requested, ...

// ---------------------------------------------------------------------------------------------
// Configurations

struct Shape {
  const char* name;
  std::int64_t N, C, H, W;
  std::int64_t numel() const { return N * C * H * W; }
};
constexpr Shape kRes2{"res2", 2, 256, 200, 272};
constexpr Shape kRes5{"res5", 2, 2048, 25, 34};
constexpr Shape kBox{"box", 512, 256, 7, 7};

enum class Kind { kForward, kBackward, kTrainStep, kLocalStats, kApply, kLocalBackward, kBackwardApply, kThreadGroup };

struct Config {
  Kind kind = Kind::kTrainStep;
  Device device = Device::cpu();
  Shape shape = kRes5;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  SyncBnMode mode = SyncBnMode::kDefault;
  int threads = 1;  // CPU only; per rank for the thread group
  CpuIsa isa = CpuIsa::kAuto;  // CPU only: Context::cpu_isa (a suffix /isa_<name> unless auto)

  static const char* kind_name(Kind k) {
    switch (k) {
      case Kind::kForward: return "Forward";
      case Kind::kBackward: return "Backward";
      case Kind::kTrainStep: return "TrainStep";
      case Kind::kLocalStats: return "LocalStats";
      case Kind::kApply: return "Apply";
      case Kind::kLocalBackward: return "LocalBackward";
      case Kind::kBackwardApply: return "BackwardApply";
      case Kind::kThreadGroup: return "ThreadGroup";
    }
    return "?";
  }
  std::string name() const {
    std::string n = fmt::format("BM_SyncBn{}/{}/{}/{}/{}", kind_name(kind), device.is_cpu() ? "cpu" : "cuda",
                                shape.name, dtype_short_name(dtype), layout == Layout::kNHWC ? "nhwc" : "nchw");
    if (kind != Kind::kApply && kind != Kind::kBackwardApply) n += mode == SyncBnMode::kExact ? "/exact" : "/default";
    if (kind == Kind::kThreadGroup) n += "/r2";
    if (device.is_cpu()) n += fmt::format("/t{}", threads);
    if (device.is_cpu() && isa != CpuIsa::kAuto) n += fmt::format("/isa_{}", cpu_isa_name(isa));
    return n;
  }
  /// Inputs are shared by every benchmark with the same key.
  std::string input_key() const {
    return fmt::format("{}/{}/{}/{}", device.is_cpu() ? "cpu" : "cuda", shape.name, dtype_short_name(dtype),
                       static_cast<int>(layout));
  }
};

// ---------------------------------------------------------------------------------------------
// Inputs and per-benchmark state

/// A [C] float32 parameter with values in [lo, hi), or a constant when lo == hi, on `device`.
Tensor param_tensor(std::int64_t C, std::uint64_t seed, float lo, float hi, Device device) {
  Tensor t = Tensor::empty({C}, DType::kFloat32);
  if (lo == hi) std::fill(t.data<float>(), t.data<float>() + C, lo);
  else fill_uniform(t, seed, lo, hi);
  return device.is_cpu() ? std::move(t) : t.to(device);
}

struct Inputs {
  std::string key;
  Tensor x, grad_y, weight, bias;
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
  in->grad_y = make(3, -1, 1);
  in->weight = param_tensor(s.C, 4, 0.2f, 2.0f, c.device);
  in->bias = param_tensor(s.C, 5, -1, 1, c.device);
  slot = std::move(in);
  return *slot;
}

/// An activation-sized output in the config's layout and device, touched now so page faults
/// stay out of the loop.
Tensor prepared(const Config& c) {
  const Shape& s = c.shape;
  Tensor t = Tensor::empty({s.N, s.C, s.H, s.W}, c.dtype, c.device, c.layout);
  t.fill_bytes(0);
  return t;
}

/// What one rank owns besides the inputs: running statistics, saved statistics, parameter
/// gradients (all [C]).
struct RankState {
  Tensor running_mean, running_var, num_batches_tracked, save_mean, save_invstd, grad_weight, grad_bias;
  RankState(std::int64_t C, Device device)
      : running_mean(param_tensor(C, 0, 0.0f, 0.0f, device)),
        running_var(param_tensor(C, 0, 1.0f, 1.0f, device)),
        num_batches_tracked(Tensor::zeros({1}, DType::kInt64, device)),
        save_mean(Tensor::zeros({C}, DType::kFloat64, device)),
        save_invstd(Tensor::zeros({C}, DType::kFloat64, device)),
        grad_weight(Tensor::zeros({C}, DType::kFloat32, device)),
        grad_bias(Tensor::zeros({C}, DType::kFloat32, device)) {}
  SyncBnParams params(const Inputs& in) const {
    SyncBnParams p;
    p.weight = in.weight, p.bias = in.bias;
    p.running_mean = running_mean, p.running_var = running_var;
    p.num_batches_tracked = num_batches_tracked;
    return p;
  }
};

/// Images [n0, n1) of a 4-d view (any layout: only the data pointer and the batch size change).
TensorView batch_slice(const TensorView& v, std::int64_t n0, std::int64_t n1) {
  TensorView s = v;
  s.data = static_cast<char*>(v.data) + n0 * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  s.sizes[0] = n1 - n0;
  return s;
}

// ---------------------------------------------------------------------------------------------
// The benchmarks

/// Tensor passes counted in bytes (see the file comment).
std::int64_t passes(const Config& c) {
  const bool exact = c.mode == SyncBnMode::kExact;
  switch (c.kind) {
    case Kind::kLocalStats: return 1;
    case Kind::kApply: return 2;
    case Kind::kLocalBackward: return 2;
    case Kind::kBackwardApply: return 3;
    case Kind::kForward: return exact ? 4 : 3;
    case Kind::kBackward: return exact ? 7 : 5;
    case Kind::kTrainStep:
    case Kind::kThreadGroup: return exact ? 11 : 8;
  }
  return 0;
}

/// Two ranks as threads of one ThreadGroup, each on half of the batch: rank 0 on the calling
/// thread, rank 1 on a thread started per step (the library starts its own threads per call too).
void thread_group_loop(benchmark::State& state, const Config& c, const Inputs& in, const Tensor& y, const Tensor& gx,
                       const SyncBnOptions& opts) {
  constexpr int kRanks = 2;
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<RankState>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    comms.push_back(group.communicator(r));
    ranks.push_back(std::make_unique<RankState>(c.shape.C, c.device));
  }
  Context ctx;
  ctx.num_threads = c.threads;
  ctx.cpu_isa = c.isa;
  auto step = [&](int r) {
    const std::int64_t n0 = c.shape.N * r / kRanks, n1 = c.shape.N * (r + 1) / kRanks;
    const TensorView x = batch_slice(in.x, n0, n1), dy = batch_slice(in.grad_y, n0, n1);
    const TensorView yr = batch_slice(y, n0, n1), gxr = batch_slice(gx, n0, n1);
    RankState& st = *ranks[static_cast<std::size_t>(r)];
    Communicator* comm = comms[static_cast<std::size_t>(r)].get();
    sync_batch_norm_forward(x, st.params(in), yr, st.save_mean, st.save_invstd, comm, opts, ctx);
    sync_batch_norm_backward(dy, x, in.weight, st.save_mean, st.save_invstd, gxr, st.grad_weight, st.grad_bias, comm,
                             opts, ctx);
  };
  // a rank that throws aborts the group, so the other one raises instead of waiting for the timeout
  auto guarded = [&](int r, std::exception_ptr* error) {
    try {
      step(r);
    } catch (...) {
      *error = std::current_exception();
      group.abort(fmt::format("rank {} failed", r));
    }
  };
  auto both = [&] {
    std::exception_ptr e0, e1;
    std::thread t1(guarded, 1, &e1);
    guarded(0, &e0);
    t1.join();
    if (e0) std::rethrow_exception(e0);
    if (e1) std::rethrow_exception(e1);
  };
  both();  // untimed: first touch, thread-group setup
  for (auto _ : state) {
    both();
    benchmark::ClobberMemory();
  }
}

void bm(benchmark::State& state, const Config& c) {
  if (c.device.is_cuda() && !have_cuda_device()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const Inputs& in = inputs(c);
  Context ctx;
  ctx.num_threads = c.threads;
  ctx.cpu_isa = c.isa;
  SyncBnOptions opts;
  opts.mode = c.mode;
  RankState st(c.shape.C, c.device);
  const SyncBnParams params = st.params(in);
  auto forward = [&](const Tensor& y) {
    sync_batch_norm_forward(in.x, params, y, st.save_mean, st.save_invstd, nullptr, opts, ctx);
  };
  auto backward = [&](const Tensor& gx) {
    sync_batch_norm_backward(in.grad_y, in.x, in.weight, st.save_mean, st.save_invstd, gx, st.grad_weight,
                             st.grad_bias, nullptr, opts, ctx);
  };
  switch (c.kind) {
    case Kind::kForward: {
      Tensor y = prepared(c);
      timed_loop(state, c.device, ctx, [&] { forward(y); });
      break;
    }
    case Kind::kBackward: {
      Tensor y = prepared(c), gx = prepared(c);
      forward(y);  // save_mean and save_invstd, untimed
      timed_loop(state, c.device, ctx, [&] { backward(gx); });
      break;
    }
    case Kind::kTrainStep: {
      Tensor y = prepared(c), gx = prepared(c);
      timed_loop(state, c.device, ctx, [&] {
        forward(y);
        backward(gx);
      });
      break;
    }
    case Kind::kLocalStats: {
      const bool exact = c.mode == SyncBnMode::kExact;
      const std::int64_t C = c.shape.C;
      Tensor record = Tensor::zeros({sync_batch_norm_record_words(C, c.mode)}, DType::kInt64, c.device);
      Tensor scales, local;
      if (exact) {  // the agreed exponents of one rank, untimed
        local = Tensor::zeros({C}, DType::kInt64, c.device);
        scales = Tensor::zeros({C}, DType::kInt64, c.device);
        sync_batch_norm_local_scales(in.x, TensorView{}, TensorView{}, local, ctx);
        const TensorView gathered(local.view().data, DType::kInt64, c.device, {1, C});
        sync_batch_norm_merge_scales(gathered, scales, ctx);
      }
      const TensorView sv = exact ? scales.view() : TensorView{};
      timed_loop(state, c.device, ctx, [&] { sync_batch_norm_local_stats(in.x, record, c.mode, sv, ctx); });
      break;
    }
    case Kind::kApply: {
      Tensor y = prepared(c);
      forward(y);  // the statistics, untimed
      SyncBnParams affine;
      affine.weight = in.weight, affine.bias = in.bias;
      timed_loop(state, c.device, ctx,
                 [&] { sync_batch_norm_apply(in.x, affine, st.save_mean, st.save_invstd, y, ctx); });
      break;
    }
    case Kind::kLocalBackward:
    case Kind::kBackwardApply: {
      const bool exact = c.mode == SyncBnMode::kExact;
      const std::int64_t C = c.shape.C, words = sync_batch_norm_record_words(C, c.mode);
      Tensor y = prepared(c), gx = prepared(c);
      forward(y);  // save_mean and save_invstd, untimed
      Tensor record = Tensor::zeros({words}, DType::kInt64, c.device);
      Tensor sums = Tensor::zeros({2 * C + 1}, DType::kFloat64, c.device);
      Tensor scales, local;
      if (exact) {  // the agreed exponents of one rank, untimed
        local = Tensor::zeros({2 * C}, DType::kInt64, c.device);
        scales = Tensor::zeros({2 * C}, DType::kInt64, c.device);
        sync_batch_norm_local_scales(in.x, in.grad_y, st.save_mean, local, ctx);
        sync_batch_norm_merge_scales(TensorView(local.view().data, DType::kInt64, c.device, {1, 2 * C}), scales, ctx);
      }
      const TensorView sv = exact ? scales.view() : TensorView{};
      auto local_backward = [&] {
        sync_batch_norm_local_backward(in.grad_y, in.x, st.save_mean, record, c.mode, sv, ctx);
      };
      if (c.kind == Kind::kLocalBackward) {
        timed_loop(state, c.device, ctx, local_backward);
        break;
      }
      local_backward();  // the global sums of one rank, untimed
      sync_batch_norm_finalize_backward(TensorView(record.view().data, DType::kInt64, c.device, {1, words}), 0,
                                        c.mode, st.save_invstd, sums, st.grad_weight, st.grad_bias, sv, ctx);
      timed_loop(state, c.device, ctx, [&] {
        sync_batch_norm_backward_apply(in.grad_y, in.x, in.weight, st.save_mean, st.save_invstd, sums, gx, ctx);
      });
      break;
    }
    case Kind::kThreadGroup: {
      Tensor y = prepared(c), gx = prepared(c);
      thread_group_loop(state, c, in, y, gx, opts);
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * c.shape.numel());
  state.SetBytesProcessed(state.iterations() * passes(c) * c.shape.numel() *
                          static_cast<std::int64_t>(dtype_size(c.dtype)));
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

Config cfg(Kind k, Device dev, const Shape& s, DType dt, Layout l, SyncBnMode m, int t,
           CpuIsa isa = CpuIsa::kAuto) {
  Config c;
  c.kind = k, c.device = dev, c.shape = s, c.dtype = dt, c.layout = l, c.mode = m, c.threads = t, c.isa = isa;
  return c;
}

/// The narrower instruction sets, for the side-by-side runs of the same configuration.
constexpr CpuIsa kNarrowIsas[] = {CpuIsa::kBaseline, CpuIsa::kAvx2};

constexpr SyncBnMode kModes[] = {SyncBnMode::kDefault, SyncBnMode::kExact};
constexpr Kind kOneRankKinds[] = {Kind::kForward, Kind::kBackward, Kind::kTrainStep, Kind::kLocalStats,
                                  Kind::kLocalBackward};

/// Every combination for one device (CPU: also the thread group), grouped by input key.
void register_grid(Device dev, std::initializer_list<int> thread_counts, bool full) {
  const bool cpu = dev.is_cpu();
  for (const Shape& s : {kRes2, kRes5, kBox})
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (Layout l : {Layout::kNCHW, Layout::kNHWC}) {
        const bool f32 = dt == DType::kFloat32;
        if (!f32 && !full) continue;
        for (SyncBnMode m : kModes)
          for (int t : thread_counts) {
            for (Kind k : kOneRankKinds) {
              // 16-bit: the train step only; CUDA by default: the phases for res2 default only
              if (!f32 && k != Kind::kTrainStep) continue;
              const bool phase = k == Kind::kLocalStats || k == Kind::kLocalBackward;
              if (!cpu && !full && phase && (s.name != kRes2.name || m != SyncBnMode::kDefault))
                continue;
              add(cfg(k, dev, s, dt, l, m, t));
            }
            if (f32 && m == SyncBnMode::kDefault && (full || s.name == kRes2.name)) {
              add(cfg(Kind::kApply, dev, s, dt, l, m, t));
              add(cfg(Kind::kBackwardApply, dev, s, dt, l, m, t));
            }
            if (cpu && f32 && t == 1) add(cfg(Kind::kThreadGroup, dev, s, dt, l, m, t));
            if (cpu && f32 && m == SyncBnMode::kDefault)
              for (CpuIsa isa : kNarrowIsas) add(cfg(Kind::kTrainStep, dev, s, dt, l, m, t, isa));
          }
      }
}

/// The default CPU selection (see the file comment), grouped by input key.
void register_cpu_default() {
  const Device cpu = Device::cpu();
  const DType f32 = DType::kFloat32;
  const Layout nchw = Layout::kNCHW, nhwc = Layout::kNHWC;
  const SyncBnMode def = SyncBnMode::kDefault, exact = SyncBnMode::kExact;

  // res5 NCHW: every pass at 1 and 2 threads, exact on the train step, two ranks
  for (int t : {1, 2}) {
    for (Kind k : kOneRankKinds) add(cfg(k, cpu, kRes5, f32, nchw, def, t));
    add(cfg(Kind::kApply, cpu, kRes5, f32, nchw, def, t));
    add(cfg(Kind::kBackwardApply, cpu, kRes5, f32, nchw, def, t));
    add(cfg(Kind::kTrainStep, cpu, kRes5, f32, nchw, exact, t));
  }
  add(cfg(Kind::kLocalStats, cpu, kRes5, f32, nchw, exact, 2));
  add(cfg(Kind::kThreadGroup, cpu, kRes5, f32, nchw, def, 1));
  // res5 NHWC
  for (int t : {1, 2}) add(cfg(Kind::kTrainStep, cpu, kRes5, f32, nhwc, def, t));
  add(cfg(Kind::kTrainStep, cpu, kRes5, f32, nhwc, exact, 2));
  for (Kind k : {Kind::kLocalStats, Kind::kApply, Kind::kLocalBackward, Kind::kBackwardApply})
    add(cfg(k, cpu, kRes5, f32, nhwc, def, 2));
  add(cfg(Kind::kThreadGroup, cpu, kRes5, f32, nhwc, def, 1));
  // res2 and the box head: the train step
  for (const Shape& s : {kRes2, kBox}) {
    for (int t : {1, 2}) add(cfg(Kind::kTrainStep, cpu, s, f32, nchw, def, t));
    if (s.name == kRes2.name) {
      add(cfg(Kind::kForward, cpu, s, f32, nchw, def, 2));
      add(cfg(Kind::kBackward, cpu, s, f32, nchw, def, 2));
    } else {
      add(cfg(Kind::kThreadGroup, cpu, s, f32, nchw, def, 1));
    }
    add(cfg(Kind::kTrainStep, cpu, s, f32, nhwc, def, 2));
  }
  // the instruction-set variants side by side (/isa_baseline, /isa_avx2 vs the default: the
  // widest this CPU has), one thread
  for (const Shape& s : {kRes5, kBox})
    for (Layout l : {nchw, nhwc})
      for (CpuIsa isa : kNarrowIsas) add(cfg(Kind::kTrainStep, cpu, s, f32, l, def, 1, isa));
}

[[maybe_unused]] const bool kRegistered = [] {
  const bool full = full_grid_requested();
  if (full) register_grid(Device::cpu(), {1, 2}, true);
  else register_cpu_default();
#if DETOPS_BENCH_CUDA
  // Registered without asking the driver (static initialization runs before main); each CUDA
  // benchmark checks for a device when it runs and skips without one.
  register_grid(Device::cuda(0), {1}, full);
#endif
  return true;
}();

}  // namespace
