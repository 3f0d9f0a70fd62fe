// detops reproducibility demo: RoIAlign on a Mask R-CNN workload, run on the CPU and (when there is
// one) a CUDA GPU. The forward runs twice (the first to warm up); each backward mode (atomic,
// truncated, exact) runs the same backward R times. For every run the demo hashes grad_input's
// bytes and counts the different results, times it, and measures the largest distance to a float64
// reference, so the trade-off between the modes is visible in one table:
//
//   device  mode       fwd ms  bwd ms (median)  distinct hashes / runs  max |diff| vs float64  ...
//
//   detops_demo [--runs N] [--threads N] [--quick] [--json PATH]
//     --runs N      backward runs per mode (default 5 on the CPU, 20 on the GPU)
//     --threads N   CPU threads (default: all hardware threads)
//     --quick       a smaller workload (64 channels, 256 rois) for smoke tests
//     --json PATH   also write the figures as JSON
//
// Then SyncBatchNorm: a batch of 8 images split over 4 ranks (threads of one process, 3/0/4/1
// images) against the whole batch on one process, in both modes, hashing the statistics and
// grad_x: the exact mode must give the one-process bytes on every rank.
//
// Exit status: 0 when exact mode gave one result per device (and the same bytes on the CPU and the
// GPU) and SyncBatchNorm's exact mode replayed the 4-rank run bit for bit, 1 when not or on an
// error, 2 on a bad command line.
//
// Workload (the P2 level of Mask R-CNN R50-FPN on two 800x1088 images): features [2, 256, 200, 272]
// float32 NCHW, 1024 rois (512 per image, boxes 16..400 px), 7x7 box head, sampling_ratio 2,
// aligned, spatial_scale 0.25. Inputs, rois and upstream gradients are seeded random values.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "detops/detops.h"
#include "reference/roi_align_reference.h"  // float64 reference, from detops' tests/
#include "test_util.h"                      // make_tensor, to_vector, random_*, hash_bytes

namespace {

using namespace detops;
using Clock = std::chrono::steady_clock;

struct Args {
  int runs = 0;     // 0: 5 on the CPU, 20 on the GPU
  int threads = 0;  // 0: all hardware threads
  bool quick = false;
  std::string json;
};

/// One SyncBatchNorm row: 4 ranks against one process.
struct SbnRow {
  std::string mode;
  bool same_bits = false;  // every rank: statistics and its slice of y and grad_x equal one process's
  double max_diff = 0;     // largest |4 ranks - one process| over the statistics and grad_x
};

/// The problem: shapes, options, and the tensors (on the CPU) every device starts from.
struct Workload {
  std::int64_t N = 2, C = 256, H = 200, W = 272, K = 1024;
  RoiAlignOptions options;
  Tensor input, rois, grad_output;  // float32; input [N, C, H, W] NCHW, rois [K, 5], grad [K, C, 7, 7]
};

/// One line of the table.
struct Row {
  Row(std::string device_name, std::string mode_name) : device(std::move(device_name)), mode(std::move(mode_name)) {}
  std::string device, mode;                 // mode: "forward" or a backward mode
  double ms = 0;                            // forward: the second run; backward: median of the runs
  int runs = 0, distinct = 0;               // runs and different results (by FNV-1a hash of the bytes)
  double max_diff = 0;                      // largest |result - float64 reference| over all results
  std::optional<bool> same_as_cpu;          // GPU rows: every run gave the CPU's bytes
  std::vector<std::uint64_t> hashes;        // the distinct hashes, in order of appearance
};

void progress(const std::string& what) { fmt::print(stderr, "[detops_demo] {}\n", what); }

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Waits until the work queued on a device is done. detops never synchronizes a device itself (see
/// context.h); a blocking 4-byte copy to the host on the legacy default stream, where the ops below
/// run, waits for everything queued before it. A program with its own stream would call
/// cudaStreamSynchronize (or time with CUDA events) instead.
class DeviceWait {
 public:
  explicit DeviceWait(Device device)
      : probe_(device.is_cpu() ? Tensor() : Tensor::zeros({1}, DType::kFloat32, device)) {}
  void operator()() const {
    if (probe_.view().defined()) (void)probe_.to(Device::cpu());
  }

 private:
  Tensor probe_;
};

/// A result's bytes in host memory: the tensor itself on the CPU, a copy of it from a GPU.
class HostCopy {
 public:
  explicit HostCopy(const Tensor& t)
      : copy_(t.view().device.is_cpu() ? Tensor() : t.to(Device::cpu())),
        host_(t.view().device.is_cpu() ? t : copy_) {}
  const Tensor& get() const { return host_; }

 private:
  Tensor copy_;
  const Tensor& host_;
};

/// Largest |a - b| between a host tensor and float64 reference values.
double max_abs_diff(const Tensor& host, const std::vector<double>& ref) {
  const std::vector<double> v = test::to_vector(host);
  double m = 0;
  for (std::size_t i = 0; i < v.size(); ++i) m = std::max(m, std::abs(v[i] - ref[i]));
  return m;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

Workload make_workload(bool quick) {
  Workload w;
  if (quick) {
    w.C = 64;
    w.K = 256;
  }
  w.options.pooled_height = w.options.pooled_width = 7;
  w.options.spatial_scale = 0.25;  // the P2 level: stride 4
  w.options.sampling_ratio = 2;
  w.options.aligned = true;        // half-pixel offset, as detectron2's ROIAlignV2

  // Boxes of 16..400 px in 800x1088 images, half of them in each image.
  std::vector<double> boxes = test::random_rois(w.K, w.N, 800.0, 1088.0, /*seed=*/2, 16.0, 400.0);
  for (std::int64_t k = 0; k < w.K; ++k) boxes[k * 5] = static_cast<double>(k * w.N / w.K);

  w.input = test::make_tensor({w.N, w.C, w.H, w.W}, DType::kFloat32, test::random_values(w.N * w.C * w.H * w.W, 1));
  w.rois = test::make_tensor({w.K, 5}, DType::kFloat32, boxes);
  w.grad_output = test::make_tensor({w.K, w.C, 7, 7}, DType::kFloat32, test::random_values(w.K * w.C * 49, 3));
  return w;
}

/// The float64 reference of the forward output and of grad_input, on the float32 values exactly as
/// stored (so the differences measure the op's rounding, not the inputs').
struct Reference {
  std::vector<double> output, grad_input;
};

Reference make_reference(const Workload& w) {
  const RoiAlignOptions& o = w.options;
  const std::vector<double> input = test::to_vector(w.input), rois = test::to_vector(w.rois);
  Reference r;
  progress("computing the float64 reference forward (slow, simple code)...");
  ref::roi_align_forward_ref(input, w.N, w.C, w.H, w.W, rois, w.K, o.pooled_height, o.pooled_width, o.spatial_scale,
                             o.sampling_ratio, o.aligned, /*max_pool=*/false, &r.output);
  progress("computing the float64 reference backward...");
  r.grad_input = ref::roi_align_backward_ref(test::to_vector(w.grad_output), w.N, w.C, w.H, w.W, rois, w.K,
                                             o.pooled_height, o.pooled_width, o.spatial_scale, o.sampling_ratio,
                                             o.aligned, /*max_pool=*/false);
  return r;
}

/// What the CPU produced (its last result of each row), for the GPU rows' "same bytes" column.
struct CpuResults {
  Tensor output;
  Tensor grad_input[3];  // by BackwardMode
};

/// Records one result (in host memory) of a row: counts it, and measures its error when it is new.
void add_result(Row& row, const Tensor& result, const std::vector<double>& ref, const Tensor* cpu_result) {
  const std::uint64_t h = test::hash_bytes(result);
  ++row.runs;
  if (std::find(row.hashes.begin(), row.hashes.end(), h) == row.hashes.end()) {
    row.hashes.push_back(h);
    row.max_diff = std::max(row.max_diff, max_abs_diff(result, ref));
  }
  row.distinct = static_cast<int>(row.hashes.size());
  if (cpu_result != nullptr) row.same_as_cpu = row.same_as_cpu.value_or(true) && test::same_bytes(result, *cpu_result);
}

/// Runs the forward and each backward mode `runs` times on `device`, appends the rows. On the CPU
/// it keeps the results in `cpu`; on a GPU it compares with them.
void run_device(Device device, const Workload& w, const Reference& ref, int runs, const Context& ctx,
                CpuResults* cpu, std::vector<Row>* rows) {
  const std::string dev = to_string(device);
  const bool on_cpu = device.is_cpu();
  const DeviceWait synchronize(device);

  // The inputs: the workload's tensors on the CPU, copies of them on a GPU.
  Tensor gpu_input, gpu_rois, gpu_grad;
  if (!on_cpu) {
    gpu_input = w.input.to(device);
    gpu_rois = w.rois.to(device);
    gpu_grad = w.grad_output.to(device);
  }
  const Tensor& input = on_cpu ? w.input : gpu_input;
  const Tensor& rois = on_cpu ? w.rois : gpu_rois;
  const Tensor& grad_output = on_cpu ? w.grad_output : gpu_grad;

  // Forward, twice: the first call pays one-time costs (CUDA module loading, page faults), the
  // table shows the second.
  progress(fmt::format("{}: forward", dev));
  const std::int64_t P = w.options.pooled_height;
  Tensor output = Tensor::empty({w.K, w.C, P, P}, DType::kFloat32, device);
  Row fwd(dev, "forward");
  for (int i = 0; i < 2; ++i) {
    const auto start = Clock::now();
    roi_align_forward(input, rois, output, w.options, ctx);
    synchronize();
    fwd.ms = ms_since(start);
    add_result(fwd, HostCopy(output).get(), ref.output, on_cpu ? nullptr : &cpu->output);
  }
  rows->push_back(fwd);
  if (on_cpu) cpu->output = std::move(output);

  // Backward: each mode `runs` times into the same grad_input, which every call fully overwrites.
  // A training loop would also pass a Workspace sized once with roi_align_backward_workspace_size,
  // so that no call allocates (see benchmarks/roi_align_bench.cpp); the demo keeps to the simplest
  // call, which takes its workspace from ctx.allocator.
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    RoiAlignBackwardOptions backward;
    backward.mode = mode;
    const int m = static_cast<int>(mode);
    Tensor grad_input = Tensor::empty({w.N, w.C, w.H, w.W}, DType::kFloat32, device);
    Row row(dev, to_string(mode));
    std::vector<double> times;
    progress(fmt::format("{}: backward {}, {} runs", dev, to_string(mode), runs));
    for (int i = 0; i < runs; ++i) {
      const auto start = Clock::now();
      roi_align_backward(grad_output, rois, grad_input, w.options, backward, ctx);
      synchronize();
      times.push_back(ms_since(start));
      add_result(row, HostCopy(grad_input).get(), ref.grad_input, on_cpu ? nullptr : &cpu->grad_input[m]);
    }
    row.ms = median(times);
    rows->push_back(row);
    if (on_cpu) cpu->grad_input[m] = std::move(grad_input);
  }
}

// ---------------------------------------------------------------------------------------------
// Output

std::string fixed_or_dash(bool show, double v) { return show ? fmt::format("{:.2f}", v) : "-"; }

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<8} {:<10} {:>10} {:>16} {:>23} {:>23} {:>18}\n", "device", "mode", "fwd ms", "bwd ms (median)",
             "distinct hashes / runs", "max |diff| vs float64", "CPU == CUDA bytes");
  for (const Row& r : rows) {
    const bool fwd = r.mode == "forward";
    const std::string same = r.same_as_cpu ? (*r.same_as_cpu ? "yes" : "no") : "-";
    fmt::print("{:<8} {:<10} {:>10} {:>16} {:>23} {:>23.3e} {:>18}\n", r.device, r.mode, fixed_or_dash(fwd, r.ms),
               fixed_or_dash(!fwd, r.ms), fmt::format("{} / {}", r.distinct, r.runs), r.max_diff, same);
  }
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

void write_json(const std::string& path, const Workload& w, bool quick, const Reference& ref, int threads,
                const std::string& cuda, const std::vector<Row>& rows, const std::vector<SbnRow>& sbn, bool ok) {
  std::string s = "{\n";
  s += fmt::format("  \"detops_version\": \"{}\",\n", version_string());
  s += fmt::format(
      "  \"workload\": {{\"input\": [{}, {}, {}, {}], \"dtype\": \"float32\", \"layout\": \"NCHW\", \"rois\": {}, "
      "\"pooled\": [{}, {}], \"sampling_ratio\": {}, \"aligned\": {}, \"spatial_scale\": {}, \"quick\": {}}},\n",
      w.N, w.C, w.H, w.W, w.K, w.options.pooled_height, w.options.pooled_width, w.options.sampling_ratio,
      w.options.aligned ? "true" : "false", w.options.spatial_scale, quick ? "true" : "false");
  s += fmt::format("  \"cpu_threads\": {},\n  \"cpu_isa\": \"{}\",\n  \"cuda\": \"{}\",\n", threads,
                   cpu_isa_name(cpu_isa_supported()), cuda);
  s += fmt::format("  \"reference_max_abs\": {{\"output\": {}, \"grad_input\": {}}},\n",
                   json_number(max_abs(ref.output)), json_number(max_abs(ref.grad_input)));
  s += "  \"results\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::vector<std::string> hashes;
    for (std::uint64_t h : r.hashes) hashes.push_back(fmt::format("\"{:016x}\"", h));
    s += fmt::format(
        "    {{\"device\": \"{}\", \"mode\": \"{}\", \"{}\": {}, \"runs\": {}, \"distinct_hashes\": {}, "
        "\"hashes\": [{}], \"max_abs_diff_vs_float64\": {}, \"same_bytes_as_cpu\": {}}}{}\n",
        r.device, r.mode, r.mode == "forward" ? "forward_ms" : "backward_ms_median", json_number(r.ms), r.runs,
        r.distinct, fmt::join(hashes, ", "), json_number(r.max_diff),
        r.same_as_cpu ? (*r.same_as_cpu ? "true" : "false") : "null", i + 1 < rows.size() ? "," : "");
  }
  s += "  ],\n  \"sync_batch_norm_4_ranks_vs_one_process\": [";
  for (std::size_t i = 0; i < sbn.size(); ++i)
    s += fmt::format("{}{{\"mode\": \"{}\", \"same_bits\": {}, \"max_abs_diff\": {}}}", i ? ", " : "", sbn[i].mode,
                     sbn[i].same_bits ? "true" : "false", json_number(sbn[i].max_diff));
  s += fmt::format("],\n  \"exact_reproducible\": {}\n}}\n", ok ? "true" : "false");

  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error(fmt::format("cannot open {} for writing", path));
  const bool written = std::fputs(s.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !written) throw std::runtime_error(fmt::format("cannot write {}", path));
}

// ---------------------------------------------------------------------------------------------
// SyncBatchNorm: 4 ranks vs one process

struct SbnRun {
  std::vector<Tensor> y, grad_x;  // per rank (one entry for one process)
  std::vector<Tensor> mean, invstd;
};

/// Forward + backward of images [split[r], split[r + 1]) on rank r of a ThreadGroup (one rank:
/// communicator nullptr).
SbnRun run_sbn(const Tensor& x, const Tensor& dy, const std::vector<std::int64_t>& split, SyncBnMode mode,
               int threads) {
  const int ranks = static_cast<int>(split.size()) - 1;
  const TensorView xv = x.view();
  const std::int64_t C = xv.sizes[1], H = xv.sizes[2], W = xv.sizes[3];
  SbnRun out;
  out.y.resize(static_cast<std::size_t>(ranks));
  out.grad_x.resize(out.y.size());
  out.mean.resize(out.y.size());
  out.invstd.resize(out.y.size());
  ThreadGroup group(ranks);
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> pool;
  for (int r = 0; r < ranks; ++r)
    pool.emplace_back([&, r] {
      try {
        const auto i = static_cast<std::size_t>(r);
        const std::int64_t n0 = split[i], n1 = split[i + 1];
        auto slice = [&](const Tensor& t) {
          TensorView v = t.view();
          v.sizes[0] = n1 - n0;
          v.data = static_cast<float*>(v.data) + n0 * v.strides[0];
          return v;
        };
        Tensor w = test::make_tensor({C}, DType::kFloat32, std::vector<double>(static_cast<std::size_t>(C), 1.0));
        Tensor b = Tensor::zeros({C}, DType::kFloat32);
        Tensor rm = Tensor::zeros({C}, DType::kFloat32);
        Tensor rv = test::make_tensor({C}, DType::kFloat32, std::vector<double>(static_cast<std::size_t>(C), 1.0));
        out.y[i] = Tensor::empty({n1 - n0, C, H, W}, DType::kFloat32);
        out.grad_x[i] = Tensor::empty({n1 - n0, C, H, W}, DType::kFloat32);
        out.mean[i] = Tensor::empty({C}, DType::kFloat64);
        out.invstd[i] = Tensor::empty({C}, DType::kFloat64);
        const std::unique_ptr<Communicator> comm = ranks > 1 ? group.communicator(r) : nullptr;
        SyncBnOptions o;
        o.mode = mode;
        Context ctx;
        ctx.num_threads = threads;
        sync_batch_norm_forward(slice(x), SyncBnParams{w, b, rm, rv, {}}, out.y[i], out.mean[i], out.invstd[i],
                                comm.get(), o, ctx);
        sync_batch_norm_backward(slice(dy), slice(x), w, out.mean[i], out.invstd[i], out.grad_x[i], {}, {}, comm.get(),
                                 o, ctx);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        group.abort(e.what());
      }
    });
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  return out;
}

/// 4 ranks vs one process, both modes; prints the table and returns the rows.
std::vector<SbnRow> sync_bn_demo(bool quick, int threads) {
  const std::int64_t N = 8, C = quick ? 16 : 64, H = 28, W = 28;
  const auto n = static_cast<std::size_t>(N * C * H * W);
  std::vector<double> xs = test::random_values(n, 42, -1.0, 1.0);
  for (std::size_t i = 0; i < n; ++i)
    if ((i / static_cast<std::size_t>(H * W)) % static_cast<std::size_t>(C) == 0) xs[i] += 1e4;  // channel 0: mean 1e4
  const Tensor x = test::make_tensor({N, C, H, W}, DType::kFloat32, xs);
  const Tensor dy = test::make_tensor({N, C, H, W}, DType::kFloat32, test::random_values(n, 43, -1.0, 1.0));
  const std::vector<std::int64_t> split{0, 3, 3, 7, 8};
  fmt::print("\nSyncBatchNorm: x [{}, {}, {}, {}] float32 (channel 0 has mean 1e4), 4 ranks as threads holding 3, 0, 4, 1 "
             "images,\nagainst the whole batch on one process (forward + backward)\n",
             N, C, H, W);
  fmt::print("{:<10} {:>36} {:>30}\n", "mode", "4 ranks == one process, bit for bit", "max |diff| (stats, grad_x)");
  std::vector<SbnRow> rows;
  for (SyncBnMode mode : {SyncBnMode::kDefault, SyncBnMode::kExact}) {
    progress(fmt::format("SyncBatchNorm {} mode...", mode == SyncBnMode::kExact ? "exact" : "default"));
    const SbnRun one = run_sbn(x, dy, {0, N}, mode, threads);
    const SbnRun four = run_sbn(x, dy, split, mode, threads);
    SbnRow row;
    row.mode = mode == SyncBnMode::kExact ? "exact" : "default";
    row.same_bits = true;
    const std::vector<double> gx = test::to_vector(one.grad_x[0]), y1 = test::to_vector(one.y[0]);
    const std::size_t per = static_cast<std::size_t>(C * H * W);
    for (std::size_t r = 0; r < four.y.size(); ++r) {
      row.same_bits = row.same_bits && test::same_bytes(four.mean[r], one.mean[0]) &&
                      test::same_bytes(four.invstd[r], one.invstd[0]);
      const std::vector<double> g = test::to_vector(four.grad_x[r]), y = test::to_vector(four.y[r]);
      const std::size_t off = static_cast<std::size_t>(split[r]) * per;
      for (std::size_t i = 0; i < g.size(); ++i) {
        row.same_bits = row.same_bits && g[i] == gx[off + i] && y[i] == y1[off + i];
        row.max_diff = std::max(row.max_diff, std::abs(g[i] - gx[off + i]));
      }
      const std::vector<double> m4 = test::to_vector(four.mean[r]), m1 = test::to_vector(one.mean[0]);
      for (std::size_t c = 0; c < m4.size(); ++c) row.max_diff = std::max(row.max_diff, std::abs(m4[c] - m1[c]));
    }
    fmt::print("{:<10} {:>36} {:>30.3e}\n", row.mode, row.same_bits ? "yes" : "no", row.max_diff);
    rows.push_back(row);
  }
  return rows;
}

// ---------------------------------------------------------------------------------------------

const char* kUsage =
    "usage: detops_demo [--runs N] [--threads N] [--quick] [--json PATH]\n"
    "  --runs N     backward runs per mode (default 5 on the CPU, 20 on the GPU)\n"
    "  --threads N  CPU threads (default: all hardware threads)\n"
    "  --quick      smaller workload (64 channels, 256 rois)\n"
    "  --json PATH  also write the results as JSON\n";

/// Parses the command line; nullopt (after printing why) when it is not valid.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  auto positive = [](const char* flag, const char* text, int* out) {
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1 || v > 1000000) {
      fmt::print(stderr, "detops_demo: {} needs a positive integer, not '{}'\n", flag, text);
      return false;
    }
    *out = static_cast<int>(v);
    return true;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") {
      a.quick = true;
    } else if ((arg == "--runs" || arg == "--threads" || arg == "--json") && !has_value) {
      fmt::print(stderr, "detops_demo: {} needs a value\n{}", arg, kUsage);
      return std::nullopt;
    } else if (arg == "--runs") {
      if (!positive("--runs", argv[++i], &a.runs)) return std::nullopt;
    } else if (arg == "--threads") {
      if (!positive("--threads", argv[++i], &a.threads)) return std::nullopt;
    } else if (arg == "--json") {
      a.json = argv[++i];
    } else {
      fmt::print(stderr, "detops_demo: unknown argument '{}'\n{}", arg, kUsage);
      return std::nullopt;
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      fmt::print("{}", kUsage);
      return 0;
    }
  }
  const std::optional<Args> args = parse_args(argc, argv);
  if (!args) return 2;

  try {
    Context ctx;
    ctx.num_threads = args->threads;  // CPU only; CUDA work goes to ctx.cuda_stream (the default stream)

    const int gpus = cuda_device_count();
    const std::string cuda = !cuda_compiled() ? "not in this build"
                             : gpus == 0      ? fmt::format("compiled, no device ({}; GPU rows skipped)", cuda_unavailable_reason())
                                              : fmt::format("{} device(s), using cuda:0", gpus);

    progress(args->quick ? "building the --quick workload..." : "building the workload...");
    const Workload w = make_workload(args->quick);
    fmt::print("detops {} RoIAlign reproducibility demo\n", version_string());
    fmt::print("workload: input [{}, {}, {}, {}] float32 NCHW, {} rois, {}x{}, sampling_ratio {}, aligned, "
               "spatial_scale {}\n",
               w.N, w.C, w.H, w.W, w.K, w.options.pooled_height, w.options.pooled_width, w.options.sampling_ratio,
               w.options.spatial_scale);
    fmt::print("CPU threads: {}; CPU vector instructions: {}; CUDA: {}\n", ctx.resolved_threads(),
               cpu_isa_name(ctx.resolved_cpu_isa()), cuda);
    std::fflush(stdout);

    const Reference ref = make_reference(w);

    std::vector<Row> rows;
    CpuResults cpu;
    run_device(Device::cpu(), w, ref, args->runs > 0 ? args->runs : 5, ctx, &cpu, &rows);
    if (gpus > 0) run_device(Device::cuda(0), w, ref, args->runs > 0 ? args->runs : 20, ctx, &cpu, &rows);

    print_table(rows);
    fmt::print("(float64 reference: max |output| = {:.3g}, max |grad_input| = {:.3g}. float32 RoIAlign computes sample\n"
               " positions in float32, as torchvision does, which at coordinates in the hundreds moves them by ~1e-5 px:\n"
               " that sets the float32 differences; truncated mode also rounds each incoming gradient to float16.)\n",
               max_abs(ref.output), max_abs(ref.grad_input));

    // The guarantee this demo exists to show: exact mode gives one result, everywhere.
    bool ok = true;
    std::vector<std::string> exact_hashes;
    for (const Row& r : rows) {
      if (r.mode != to_string(BackwardMode::kExact)) continue;
      ok = ok && r.distinct == 1 && r.same_as_cpu.value_or(true);
      exact_hashes.push_back(fmt::format("{} {:016x}", r.device, r.hashes.front()));
    }
    fmt::print("exact-mode grad_input hash: {}\n", fmt::join(exact_hashes, ", "));
    fmt::print("{}\n", ok ? "exact mode: bitwise reproducible" : "exact mode: NOT reproducible (a bug; please report)");

    // SyncBatchNorm's exact mode: a multi-rank run replays on one process
    const std::vector<SbnRow> sbn = sync_bn_demo(args->quick, args->threads);
    for (const SbnRow& r : sbn)
      if (r.mode == "exact") ok = ok && r.same_bits;
    fmt::print("{}\n", ok ? "SyncBatchNorm exact mode: the 4-rank run equals one process bit for bit"
                           : "SyncBatchNorm exact mode: NOT equal (a bug; please report)");

    if (!args->json.empty()) {
      write_json(args->json, w, args->quick, ref, ctx.resolved_threads(), cuda, rows, sbn, ok);
      progress(fmt::format("wrote {}", args->json));
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {  // detops::Error and the rest: say what, and fail
    fmt::print(stderr, "detops_demo: {}\n", e.what());
    return 1;
  }
}
