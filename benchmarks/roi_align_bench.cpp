// Google Benchmark suite of RoIAlign forward and backward on Mask R-CNN R50-FPN shapes, on the CPU
// and (when a device is present) CUDA. Run `detops_bench --benchmark_filter=Forward.*cpu` to pick a
// subset, `--detops_full` to register every combination instead of the default selection.
//
// Workload: the P2 level of an FPN, features [2, 256, 200, 272] (two 800x1088 images at stride 4,
// spatial_scale 0.25), 1024 rois (512 per image, boxes 16..400 px from test::random_rois with a
// fixed seed), aligned = true, box head 7x7 and mask head 14x14, sampling_ratio 2 or adaptive.
//
// Names: BM_RoiAlignForward/<device>/<dtype>/<layout>/<head>/<sampling>/<pool>[/t<threads>]
//        BM_RoiAlignBackward/<device>/<dtype>/<layout>/<head>/<sampling>/<pool>/<mode>[/t<threads>]
//   device cpu|cuda, dtype f32|f16|bf16|f64, layout nchw|nhwc (the pooled tensors and grad_input
//   follow the input's layout), head box (7x7)|mask (14x14), sampling sr2|adaptive, pool avg|max,
//   mode atomic|truncated|exact, t<n> = Context::num_threads (CPU only). Google Benchmark appends
//   /real_time (CPU: wall clock, since the op runs its own threads) or /manual_time (CUDA: events).
//
// Counters: items = output elements (K*C*PH*PW, both passes). bytes = an estimate of the bytes the
// op touches, not measured DRAM traffic (caches absorb most corner re-reads):
//   samples  = C * sum over rois of PH*PW*grid_h*grid_w      (each reads or updates 4 corners)
//   forward  = 4*samples*sizeof(T) + output (+ int32 argmax for max pooling) + rois
//   backward = grad_output + grad_input (written once in full) + 4*samples*sizeof(T) + rois
//              (+ argmax), with samples = K*C*PH*PW for max pooling (only the argmax sample scatters)
// The backward figure leaves out each mode's workspace traffic on purpose, so the three modes share
// one denominator and bytes/s compares them on the same useful work.
//
// Inputs are not rotated between iterations: the smallest feature map (float16, 55 MB) already
// exceeds the L2 of an H100/H200 (50 MB), and a CPU's last-level cache.
//
// Everything (inputs, outputs, the backward workspace sized once with
// roi_align_backward_workspace_size) is allocated and touched before the timed loop. CUDA timing
// uses events on the stream the op runs on (the legacy default stream), needs the CUDA runtime
// header, and so is compiled only with DETOPS_BENCH_CUDA=1 (benchmarks/CMakeLists.txt defines it
// in CUDA builds); without a device the CUDA benchmarks skip, they never fail. The 16..400 px boxes
// on P2 are heavier than FPN level assignment would give P2 (boxes under ~112 px): with adaptive
// sampling the large boxes dominate (a 400 px box has 15x15 samples per 7x7 bin).
// Timed on CUDA by the gpu preset (cmake/DetopsGpuCheck.cmake):
// gpu-check bench: ^BM_RoiAlign(Forward|Backward)/cuda/(f32|f16)/(nchw|nhwc)/(box|mask)/sr2/avg|^BM_RoiAlign(Forward|Backward)/cuda/f32/nchw/box/(adaptive/avg|sr2/max)

#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.h"  // dtype_short_name, timed_loop; DETOPS_BENCH_CUDA
#include "detops/detops.h"
#include "reference/roi_align_reference.h"  // roi_geometry_ref: sample counts for the byte estimate
#include "test_util.h"

namespace {

using namespace detops;
using bench::dtype_short_name;

// ---------------------------------------------------------------------------------------------
// Workload

constexpr std::int64_t kN = 2, kC = 256, kH = 200, kW = 272;
constexpr std::int64_t kRoisPerImage = 512, kK = kN * kRoisPerImage;
constexpr double kSpatialScale = 0.25;
constexpr double kImageH = 800, kImageW = 1088, kMinBox = 16, kMaxBox = 400;
constexpr std::uint64_t kFeatureSeed = 20240601, kRoiSeed = 20240602, kGradSeed = 20240603;

enum class Head { kBox, kMask };  // 7x7 box head, 14x14 mask head
std::int64_t pooled_size(Head h) { return h == Head::kBox ? 7 : 14; }

/// One benchmark: which pass, and every choice that names it.
struct Config {
  bool backward = false;
  Device device = Device::cpu();
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  Head head = Head::kBox;
  std::int64_t sampling_ratio = 2;  // 0 = adaptive
  PoolMode pool = PoolMode::kAvg;
  BackwardMode mode = BackwardMode::kExact;
  int threads = 1;  // CPU only

  std::string name() const {
    std::string n = fmt::format("BM_RoiAlign{}/{}/{}/{}/{}/{}/{}", backward ? "Backward" : "Forward",
                                device.is_cpu() ? "cpu" : "cuda", dtype_short_name(dtype),
                                layout == Layout::kNHWC ? "nhwc" : "nchw", head == Head::kBox ? "box" : "mask",
                                sampling_ratio > 0 ? fmt::format("sr{}", sampling_ratio) : "adaptive",
                                to_string(pool));
    if (backward) n += fmt::format("/{}", to_string(mode));
    if (device.is_cpu()) n += fmt::format("/t{}", threads);
    return n;
  }
};

/// 16-bit inputs keep their boxes in float32, as mixed-precision detectors do.
DType roi_dtype(DType input) { return input == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

std::string device_key(Device d) { return d.is_cpu() ? "cpu" : fmt::format("cuda{}", d.index); }

// ---------------------------------------------------------------------------------------------
// Inputs, built once per (dtype, layout, device) and shared by every benchmark that needs them:
// building the 28M-element feature map takes longer than many CPU runs.

/// The tensor cached under `key`, made by make() on first use.
template <class Make>
const Tensor& cached(const std::string& key, Make make) {
  static std::map<std::string, Tensor> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make()).first;
  return it->second;
}

/// Random features in [-1, 1), [N, C, H, W] in the config's dtype, layout and device.
const Tensor& features(const Config& c) {
  const std::string key = fmt::format("features/{}/{}/{}", dtype_short_name(c.dtype), static_cast<int>(c.layout),
                                      device_key(c.device));
  return cached(key, [&] {
    if (c.device.is_cuda()) {
      Config host = c;
      host.device = Device::cpu();
      return features(host).to(c.device);  // same bytes as the CPU benchmarks', same strides
    }
    static const std::vector<double> values = test::random_values(kN * kC * kH * kW, kFeatureSeed);
    return test::make_tensor({kN, kC, kH, kW}, c.dtype, values, c.layout);
  });
}

/// The 1024 rois, [K, 5] (batch, x1, y1, x2, y2) in image coordinates.
const std::vector<double>& roi_values() {
  static const std::vector<double> v = [] {
    std::vector<double> r = test::random_rois(kK, kN, kImageH, kImageW, kRoiSeed, kMinBox, kMaxBox);
    for (std::int64_t k = 0; k < kK; ++k) r[k * 5] = static_cast<double>(k / kRoisPerImage);  // 512 per image
    return r;
  }();
  return v;
}

const Tensor& rois(const Config& c) {
  const DType dt = roi_dtype(c.dtype);
  return cached(fmt::format("rois/{}/{}", dtype_short_name(dt), device_key(c.device)), [&] {
    Tensor t = test::make_tensor({kK, 5}, dt, roi_values());
    return c.device.is_cpu() ? std::move(t) : t.to(c.device);
  });
}

/// Random upstream gradients [K, C, PH, PW] in the config's dtype, layout and device.
const Tensor& grad_output(const Config& c) {
  const std::int64_t P = pooled_size(c.head);
  const std::string key = fmt::format("grad/{}/{}/{}/{}", dtype_short_name(c.dtype), static_cast<int>(c.layout), P,
                                      device_key(c.device));
  return cached(key, [&] {
    if (c.device.is_cuda()) {
      Config host = c;
      host.device = Device::cpu();
      return grad_output(host).to(c.device);
    }
    static std::map<std::int64_t, std::vector<double>> values;  // per pooled size, for every dtype
    auto v = values.find(P);
    if (v == values.end()) v = values.emplace(P, test::random_values(kK * kC * P * P, kGradSeed)).first;
    return test::make_tensor({kK, kC, P, P}, c.dtype, v->second, c.layout);
  });
}

/// Bilinear samples per channel: sum over rois of PH*PW*grid_h*grid_w (the float64 reference's
/// geometry, on the rois as stored in roi_dtype).
std::int64_t samples_per_channel(const Config& c) {
  const std::int64_t P = pooled_size(c.head);
  const std::vector<double> r = test::to_vector(test::make_tensor({kK, 5}, roi_dtype(c.dtype), roi_values()));
  std::int64_t total = 0;
  for (std::int64_t k = 0; k < kK; ++k) {
    const ref::RoiGeometryRef g = ref::roi_geometry_ref(&r[k * 5], P, P, kSpatialScale, c.sampling_ratio, true);
    total += P * P * g.grid_h * g.grid_w;
  }
  return total;
}

RoiAlignOptions options(const Config& c) {
  RoiAlignOptions o;
  o.pooled_height = o.pooled_width = pooled_size(c.head);
  o.spatial_scale = kSpatialScale;
  o.sampling_ratio = c.sampling_ratio;
  o.aligned = true;
  o.pool_mode = c.pool;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Timing

// bench::timed_loop (bench_util.h): wall clock on the CPU, events on CUDA. One untimed call first on
// CUDA (module load, the stream-ordered allocator's pool); on the CPU the buffers were prefaulted
// instead (prepared()), since one more call costs seconds there.

/// Outputs are written in the input's layout; the bytes are touched now so that page faults (CPU)
/// stay out of the timed loop.
Tensor prepared(std::initializer_list<std::int64_t> sizes, DType dt, const Config& c) {
  Tensor t = Tensor::empty(sizes, dt, c.device, c.layout);
  t.fill_bytes(0);
  return t;
}

// ---------------------------------------------------------------------------------------------
// The benchmarks

void set_counters(benchmark::State& state, const Config& c) {
  const std::int64_t P = pooled_size(c.head);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(c.dtype));
  const std::int64_t pooled = kK * kC * P * P;
  // Max pooling's backward scatters one sample per bin (the argmax), its forward reads them all.
  const std::int64_t samples = c.backward && c.pool == PoolMode::kMax ? pooled : kC * samples_per_channel(c);
  const std::int64_t corners = 4 * samples * es;
  const std::int64_t roi_bytes = kK * 5 * static_cast<std::int64_t>(dtype_size(roi_dtype(c.dtype)));
  const std::int64_t argmax_bytes = c.pool == PoolMode::kMax ? pooled * 4 : 0;  // written, then read back
  const std::int64_t bytes = c.backward ? pooled * es + kN * kC * kH * kW * es + corners + roi_bytes + argmax_bytes
                                        : corners + pooled * es + roi_bytes + argmax_bytes;
  state.SetItemsProcessed(state.iterations() * pooled);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void bm_forward(benchmark::State& state, const Config& c) {
  const Tensor& input = features(c);
  const Tensor& boxes = rois(c);
  const RoiAlignOptions opt = options(c);
  const std::int64_t P = pooled_size(c.head);
  Context ctx;
  ctx.num_threads = c.threads;
  Tensor output = prepared({kK, kC, P, P}, c.dtype, c);
  Tensor argmax = c.pool == PoolMode::kMax ? prepared({kK, kC, P, P}, DType::kInt32, c) : Tensor();
  bench::timed_loop(state, c.device, ctx, [&] { roi_align_forward(input, boxes, output, opt, ctx, argmax); });
  set_counters(state, c);
}

void bm_backward(benchmark::State& state, const Config& c) {
  const Tensor& input = features(c);
  const Tensor& boxes = rois(c);
  const Tensor& grad = grad_output(c);
  const RoiAlignOptions opt = options(c);
  RoiAlignBackwardOptions bopt;
  bopt.mode = c.mode;
  const std::int64_t P = pooled_size(c.head);
  Context ctx;
  ctx.num_threads = c.threads;

  // Max pooling's backward needs the forward's argmax (computed here, untimed).
  Tensor argmax;
  if (c.pool == PoolMode::kMax) {
    Tensor output = prepared({kK, kC, P, P}, c.dtype, c);
    argmax = prepared({kK, kC, P, P}, DType::kInt32, c);
    roi_align_forward(input, boxes, output, opt, ctx, argmax);
  }
  Tensor grad_input = prepared({kN, kC, kH, kW}, c.dtype, c);

  // Caller-provided workspace, sized once: the size query re-reads the rois (and on CUDA, for
  // exact mode with adaptive sampling, waits on the stream), which is not what we time. The query
  // takes no argmax and so rejects pool_mode max; the size does not depend on the pool mode (max
  // pooling scatters at most what avg does), so max asks with avg.
  RoiAlignOptions size_opt = opt;
  size_opt.pool_mode = PoolMode::kAvg;
  const std::size_t ws_bytes = roi_align_backward_workspace_size(grad, boxes, grad_input, size_opt, bopt, ctx);
  Tensor ws_storage;
  Workspace ws;
  if (ws_bytes > 0) {
    ws_storage = Tensor::empty({static_cast<std::int64_t>((ws_bytes + 7) / 8)}, DType::kFloat64, c.device);
    ws_storage.fill_bytes(0);
    ws = Workspace{ws_storage.view().data, ws_bytes};
  }
  bench::timed_loop(state, c.device, ctx,
                   [&] { roi_align_backward(grad, boxes, grad_input, opt, bopt, ctx, argmax, ws); });
  set_counters(state, c);
}

void run(benchmark::State& state, const Config& c) {
  try {
    if (c.backward) bm_backward(state, c);
    else bm_forward(state, c);
  } catch (const std::exception& e) {  // detops::Error, CUDA errors, out of memory: skip, never abort
    state.SkipWithError(e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Registration

void add(const Config& c) {
  benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(c.name().c_str(), [c](benchmark::State& s) { run(s, c); });
  b->Unit(benchmark::kMillisecond);
  if (c.device.is_cpu()) b->UseRealTime();  // the op runs its own threads; CPU time of ours says little
  else b->UseManualTime();
}

void add_modes(Config c, std::initializer_list<BackwardMode> modes) {
  c.backward = true;
  for (BackwardMode m : modes) {
    c.mode = m;
    add(c);
  }
}

constexpr std::initializer_list<BackwardMode> kAllModes = {BackwardMode::kAtomic, BackwardMode::kTruncated,
                                                           BackwardMode::kExact};

/// A grid of configs, each with its forward and the three backward modes. float32: both layouts x
/// both heads x both samplings, plus max pooling (box head, sampling ratio 2); float16: both layouts
/// x both heads at sampling ratio 2, plus max pooling; bfloat16: both layouts, box head, ratio 2;
/// float64: NCHW, box head, ratio 2. With every_combination each dtype gets float32's grid. The
/// default on CUDA (76 runs, a minute or so); on the CPU only with --detops_full (every
/// combination, 1 and 2 threads: 320 runs, roughly half an hour on 2 cores).
void register_grid(Device device, std::initializer_list<int> thread_counts, bool every_combination) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64})
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
      for (Head head : {Head::kBox, Head::kMask})
        for (std::int64_t sr : {2, 0})
          for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax}) {
            const bool f32_grid = (head == Head::kBox && sr == 2) || pool == PoolMode::kAvg;
            bool wanted = f32_grid;
            if (!every_combination) {
              switch (dt) {
                case DType::kFloat16: wanted = f32_grid && sr == 2; break;
                case DType::kBFloat16: wanted = head == Head::kBox && sr == 2 && pool == PoolMode::kAvg; break;
                case DType::kFloat64:
                  wanted = layout == Layout::kNCHW && head == Head::kBox && sr == 2 && pool == PoolMode::kAvg;
                  break;
                default: break;
              }
            }
            if (!wanted) continue;
            for (int t : thread_counts) {
              Config c{false, device, dt, layout, head, sr, pool};
              c.threads = t;
              add(c);
              add_modes(c, kAllModes);
            }
          }
}

/// The default CPU selection: 34 runs of 0.1-5 s each, about a minute on 2 cores. float32 carries the
/// layout x head x threads comparisons; the other dtypes, adaptive sampling and max pooling get
/// one representative each (the box head, sampling ratio 2, 2 threads, unless named).
void register_cpu_default() {
  const Device cpu = Device::cpu();
  auto cfg = [&](DType dt, Layout l, Head h, std::int64_t sr, PoolMode p, int t) {
    Config c{false, cpu, dt, l, h, sr, p};
    c.threads = t;
    return c;
  };
  const DType f32 = DType::kFloat32;
  const Layout nchw = Layout::kNCHW, nhwc = Layout::kNHWC;
  const PoolMode avg = PoolMode::kAvg, max = PoolMode::kMax;

  // Forward
  for (Layout l : {nchw, nhwc})
    for (Head h : {Head::kBox, Head::kMask})
      for (int t : {1, 2}) add(cfg(f32, l, h, 2, avg, t));
  add(cfg(f32, nchw, Head::kBox, 0, avg, 2));
  add(cfg(f32, nchw, Head::kBox, 2, max, 2));
  add(cfg(DType::kFloat16, nchw, Head::kBox, 2, avg, 2));
  add(cfg(DType::kFloat16, nhwc, Head::kBox, 2, avg, 2));
  add(cfg(DType::kBFloat16, nchw, Head::kBox, 2, avg, 2));
  add(cfg(DType::kFloat64, nchw, Head::kBox, 2, avg, 2));

  // Backward
  for (int t : {1, 2}) add_modes(cfg(f32, nchw, Head::kBox, 2, avg, t), kAllModes);
  add_modes(cfg(f32, nhwc, Head::kBox, 2, avg, 2), kAllModes);
  add_modes(cfg(f32, nchw, Head::kMask, 2, avg, 2), kAllModes);
  add_modes(cfg(f32, nchw, Head::kBox, 0, avg, 2), {BackwardMode::kExact});
  add_modes(cfg(f32, nchw, Head::kBox, 2, max, 2), {BackwardMode::kAtomic, BackwardMode::kExact});
  add_modes(cfg(DType::kFloat16, nchw, Head::kBox, 2, avg, 2), kAllModes);
  add_modes(cfg(DType::kBFloat16, nchw, Head::kBox, 2, avg, 2), {BackwardMode::kExact});
  add_modes(cfg(DType::kFloat64, nchw, Head::kBox, 2, avg, 2), {BackwardMode::kExact});
}

/// Without a device (or a CUDA build), one placeholder per pass says why there are no CUDA figures.
void register_cuda_placeholders(const std::string& why) {
  for (const char* pass : {"Forward", "Backward"}) {
    benchmark::RegisterBenchmark(fmt::format("BM_RoiAlign{}/cuda", pass).c_str(),
                                 [why](benchmark::State& s) { s.SkipWithError(why.c_str()); });
  }
}

/// Removes `prefix` + VALUE (e.g. "--detops_dump_rois=") from argv; VALUE, or "" when absent.
std::string take_value(int* argc, char** argv, const char* prefix) {
  const std::size_t n = std::strlen(prefix);
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], prefix, n) == 0) {
      std::string value = argv[i] + n;
      for (int j = i; j + 1 < *argc; ++j) argv[j] = argv[j + 1];
      --*argc;
      return value;
    }
  }
  return {};
}

/// Writes the benchmark rois, one per line (batch x1 y1 x2 y2, image coordinates, %.17g: the
/// doubles exactly), for benchmarks/compare_torchvision.py. The float32 benchmarks round them to
/// nearest.
int dump_rois(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "detops_bench: cannot write %s\n", path.c_str());
    return 1;
  }
  const std::vector<double>& r = roi_values();
  std::fprintf(f, "# detops_bench rois: %lld x (batch, x1, y1, x2, y2), seed %llu\n", static_cast<long long>(kK),
               static_cast<unsigned long long>(kRoiSeed));
  for (std::int64_t k = 0; k < kK; ++k)
    std::fprintf(f, "%.17g %.17g %.17g %.17g %.17g\n", r[k * 5], r[k * 5 + 1], r[k * 5 + 2], r[k * 5 + 3], r[k * 5 + 4]);
  return std::fclose(f) == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// RoIAlign's part of detops_bench's main() (benchmarks/bench_main.cpp): --detops_dump_rois=PATH,
// and the registrations, which depend on --detops_full and on the device.

int take_flags(int* argc, char** argv) {
  const std::string rois_path = take_value(argc, argv, "--detops_dump_rois=");
  return rois_path.empty() ? -1 : dump_rois(rois_path);
}

std::string register_benchmarks(bool full, const std::string& cuda_skip) {
  if (full) register_grid(Device::cpu(), {1, 2}, true);
  else register_cpu_default();
  if (cuda_skip.empty()) register_grid(Device::cuda(0), {1}, full);
  else register_cuda_placeholders(cuda_skip);
  return fmt::format(
      "RoIAlign: input [{}, {}, {}, {}] (P2 of {}x{} images), {} rois ({}/image, {}..{} px), spatial_scale {}, "
      "aligned",
      kN, kC, kH, kW, kImageH, kImageW, kK, kRoisPerImage, kMinBox, kMaxBox, kSpatialScale);
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
[[maybe_unused]] const bool kMainHook = detops::bench::add_main_hook(take_flags, register_benchmarks);
}  // namespace
