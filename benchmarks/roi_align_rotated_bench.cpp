// Google Benchmark suite of RoIAlignRotated forward and backward on a rotated-box head, side by side
// with detops' own RoIAlign on the same boxes (the goal: within 1.3x of RoIAlign), on the
// CPU and (when a device is present) CUDA.
//
// Workload: features [2, 256, 200, 272] (an FPN P2 level of two 800x1088 images, spatial_scale
// 0.25), 1024 boxes (512 per image, 16..400 px, test::random_rois with a fixed seed), 7x7 bins,
// sampling_ratio 2, float32. Three ops on those boxes:
//   rotated     RoIAlignRotated, each box turned by a random angle in [-90, 90) degrees
//   upright     RoIAlignRotated, angle 0 (the same samples as RoIAlign's, up to rounding)
//   roi_align   RoIAlign, aligned = true, the boxes as (x1, y1, x2, y2)
//
// Names: BM_RoiAlignRotatedForward/<device>/f32/<layout>/box/sr2/<op>[/t<threads>]
//        BM_RoiAlignRotatedBackward/<device>/f32/<layout>/box/sr2/<op>/<mode>[/t<threads>]
//   layout nchw|nhwc, mode atomic|truncated|exact, t<n> = Context::num_threads (CPU only).
// Counters: items = output elements (K*C*49); everything is allocated before the timed loop.
// gpu-check bench: ^BM_RoiAlignRotated(Forward|Backward)/cuda/f32/nchw/

#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "detops/detops.h"
#include "test_util.h"

namespace {

using namespace detops;

constexpr std::int64_t kN = 2, kC = 256, kH = 200, kW = 272, kK = 1024, kP = 7;
constexpr double kSpatialScale = 0.25;

enum class Op { kRotated, kUpright, kRoiAlign };
const char* op_name(Op op) { return op == Op::kRotated ? "rotated" : op == Op::kUpright ? "upright" : "roi_align"; }

struct Config {
  bool backward = false;
  Device device = Device::cpu();
  Layout layout = Layout::kNCHW;
  Op op = Op::kRotated;
  BackwardMode mode = BackwardMode::kExact;
  int threads = 1;

  std::string name() const {
    std::string n = fmt::format("BM_RoiAlignRotated{}/{}/f32/{}/box/sr2/{}", backward ? "Backward" : "Forward",
                                device.is_cpu() ? "cpu" : "cuda", layout == Layout::kNHWC ? "nhwc" : "nchw",
                                op_name(op));
    if (backward) n += fmt::format("/{}", to_string(mode));
    if (device.is_cpu()) n += fmt::format("/t{}", threads);
    return n;
  }
};

/// The boxes, as RoIAlign rows (b, x1, y1, x2, y2) in image pixels.
const std::vector<double>& boxes() {
  static const std::vector<double> b = test::random_rois(kK, kN, 800.0, 1088.0, 20240602, 16.0, 400.0);
  return b;
}

/// The rois of an op, in its row format, on `device`.
Tensor rois_for(Op op, Device device) {
  const std::vector<double>& b = boxes();
  if (op == Op::kRoiAlign) return test::make_tensor({kK, 5}, DType::kFloat32, b).to(device);
  std::vector<double> r(static_cast<std::size_t>(kK * 6));
  const std::vector<double> angles = test::random_values(static_cast<std::size_t>(kK), 20240604, -90.0, 90.0);
  for (std::int64_t k = 0; k < kK; ++k) {
    const double* s = &b[static_cast<std::size_t>(k * 5)];
    double* d = &r[static_cast<std::size_t>(k * 6)];
    d[0] = s[0], d[1] = (s[1] + s[3]) / 2, d[2] = (s[2] + s[4]) / 2, d[3] = s[3] - s[1], d[4] = s[4] - s[2];
    d[5] = op == Op::kRotated ? angles[static_cast<std::size_t>(k)] : 0.0;
  }
  return test::make_tensor({kK, 6}, DType::kFloat32, r).to(device);
}

/// Random values of the given sizes, cached per (what, layout, device): the feature map takes
/// longer to build than many runs.
const Tensor& cached(const std::string& what, std::initializer_list<std::int64_t> sizes, std::uint64_t seed,
                     const Config& c) {
  static std::map<std::string, Tensor> cache;
  const std::string key = fmt::format("{}/{}/{}", what, static_cast<int>(c.layout), c.device.is_cpu() ? 0 : 1);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::int64_t n = 1;
    for (std::int64_t s : sizes) n *= s;
    Tensor t = test::make_tensor(sizes, DType::kFloat32, test::random_values(static_cast<std::size_t>(n), seed),
                                 c.layout);
    it = cache.emplace(key, t.to(c.device)).first;
  }
  return it->second;
}

void bm(benchmark::State& state, const Config& c) {
  Context ctx;
  ctx.num_threads = c.threads;
  const Tensor rois = rois_for(c.op, c.device);
  RoiAlignRotatedOptions ro;
  ro.pooled_height = ro.pooled_width = kP;
  ro.spatial_scale = kSpatialScale;
  ro.sampling_ratio = 2;
  RoiAlignOptions ao;
  ao.pooled_height = ao.pooled_width = kP;
  ao.spatial_scale = kSpatialScale;
  ao.sampling_ratio = 2;
  ao.aligned = true;
  RoiAlignBackwardOptions b;
  b.mode = c.mode;
  if (!c.backward) {
    const Tensor& input = cached("features", {kN, kC, kH, kW}, 20240601, c);
    Tensor out = Tensor::empty({kK, kC, kP, kP}, DType::kFloat32, c.device, c.layout);
    bench::timed_loop(state, c.device, ctx, [&] {
      if (c.op == Op::kRoiAlign) roi_align_forward(input, rois, out, ao, ctx);
      else roi_align_rotated_forward(input, rois, out, ro, ctx);
    });
  } else {
    const Tensor& go = cached("grad_output", {kK, kC, kP, kP}, 20240603, c);
    Tensor gi = Tensor::empty({kN, kC, kH, kW}, DType::kFloat32, c.device, c.layout);
    const std::size_t bytes = c.op == Op::kRoiAlign ? roi_align_backward_workspace_size(go, rois, gi, ao, b, ctx)
                                                    : roi_align_rotated_backward_workspace_size(go, rois, gi, ro, b, ctx);
    Tensor scratch = Tensor::zeros({static_cast<std::int64_t>((bytes + 3) / 4)}, DType::kInt32, c.device);
    const Workspace w{scratch.view().data, bytes};
    bench::timed_loop(state, c.device, ctx, [&] {
      if (c.op == Op::kRoiAlign) roi_align_backward(go, rois, gi, ao, b, ctx, {}, w);
      else roi_align_rotated_backward(go, rois, gi, ro, b, ctx, w);
    });
  }
  state.SetItemsProcessed(state.iterations() * kK * kC * kP * kP);
}

void add(const Config& c) {
  bench::register_op(c.name(), c.device, [c](benchmark::State& s) { bm(s, c); });
}

/// Every op side by side: forward, then each backward mode, for each device, layout and (CPU)
/// thread count.
const bool kRegistered = [] {
  for (Device device : {Device::cpu(), Device::cuda(0)})
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
      for (int threads : {1, 2}) {
        if (device.is_cuda() && threads > 1) continue;
        for (Op op : {Op::kRotated, Op::kUpright, Op::kRoiAlign}) {
          Config c;
          c.device = device, c.layout = layout, c.op = op, c.threads = threads;
          add(c);
          c.backward = true;
          for (BackwardMode m : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
            c.mode = m;
            add(c);
          }
        }
      }
  return true;
}();

}  // namespace
