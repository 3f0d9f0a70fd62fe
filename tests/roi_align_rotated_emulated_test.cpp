// The CUDA backend of RoIAlignRotated run on the CPU: its own steps (internal/roi_align_rotated_device.h
// and the roi ops' shared internal/roi_device.h, the code cuda/roi_align_rotated_cuda.cu runs on
// CudaDevice) on the emulated device (tests/emulated_device.h: every thread index in order, CUB's
// contracts), against the CPU backend byte for byte: the roi check, forward, the atomic and
// truncated scatters (the emulated atomic add is the CPU's: per element the same order of adds),
// the exact mode's three phases and the float64 truncated mode's, from a poisoned grad_input and
// workspace; a batch whose images fill more than one chunk runs the chunk loop. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "detops/detail/roi_align_rotated_kernels.h"
#include "emulated_device.h"
#include "internal/roi_align_rotated_backend.h"
#include "internal/roi_align_rotated_device.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;

struct Case {
  Tensor input, rois, grad_output;
  RoiAlignRotatedOptions opt;
  detail::RoiAlignRotatedShape shape{};
  detail::RoiSource source() const { return {rois.view().data, DType::kFloat32, 6, 1}; }
};

Case make_case(DType dt, Layout layout, std::int64_t sr, bool aligned) {
  Case c;
  const std::int64_t N = 2, C = 11, H = 21, W = 26, K = 40;
  c.opt.pooled_height = 5;
  c.opt.pooled_width = 4;
  c.opt.spatial_scale = 0.25;
  c.opt.sampling_ratio = sr;
  c.opt.aligned = aligned;
  c.input = make_tensor({N, C, H, W}, dt, test::random_values(static_cast<std::size_t>(N * C * H * W), 11), layout);
  std::vector<double> r = test::random_values(static_cast<std::size_t>(K * 6), 12, 0.0, 1.0);
  for (std::int64_t k = 0; k < K; ++k) {
    double* row = &r[static_cast<std::size_t>(k * 6)];
    row[0] = k % N, row[1] = -10 + 124 * row[1], row[2] = -10 + 104 * row[2];
    row[3] = 2 + 60 * row[3], row[4] = 2 + 50 * row[4], row[5] = -180 + 360 * row[5];
  }
  r[1] = 52, r[2] = 42, r[3] = 150, r[4] = 140;  // bigger than the map, over the apron
  c.rois = make_tensor({K, 6}, DType::kFloat32, r);
  c.grad_output = make_tensor({K, C, 5, 4}, dt, test::random_values(static_cast<std::size_t>(K * C * 20), 13), layout);
  c.shape.N = N, c.shape.C = C, c.shape.H = H, c.shape.W = W, c.shape.K = K, c.shape.PH = 5, c.shape.PW = 4;
  c.shape.spatial_scale = 0.25, c.shape.sampling_ratio = sr, c.shape.aligned = aligned;
  c.shape.max_samples_per_roi = c.opt.max_samples_per_roi;
  c.shape.angle_radians = false, c.shape.clockwise = false;
  return c;
}

using Param = std::tuple<DType, Layout, std::int64_t /*sampling*/, bool /*aligned*/>;

class RoiAlignRotatedEmulated : public ::testing::TestWithParam<Param> {};

internal::RoiAlignRotatedCall make_call(const Case& c, const TensorView& features, const TensorView& pooled) {
  internal::RoiAlignRotatedCall call{};
  call.op = "emulated";
  call.features = features;
  call.rois = c.rois.view();
  call.pooled = pooled;
  call.shape = c.shape;
  return call;
}

template <class T>
Tensor emulate_forward(const Case& c, DType dt, Layout layout) {
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, c.shape.PH, c.shape.PW}, dt, Device::cpu(), layout);
  out.fill_bytes(0xCD);
  const internal::RoiAlignRotatedCall call = make_call(c, c.input.view(), out.view());
  internal::rotated_forward_on<T>(test::EmulatedDevice{}, call);
  return out;
}

/// The CUDA backend's backward in `mode`, planned as the front end plans it (plan_rotated_backward
/// over the CUDA steps: the roi check with the totals the plan asks for, the workspace it sizes),
/// then the backward into a poisoned grad_input.
Tensor emulate_backward(const Case& c, DType dt, Layout layout, BackwardMode mode) {
  const auto& s = c.shape;
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  gi.fill_bytes(0xCD);
  const internal::RoiAlignRotatedCall call = make_call(c, gi.view(), c.grad_output.view());
  const test::EmulatedDevice dev;
  RoiAlignBackwardOptions b;
  b.mode = mode;
  const internal::RoiBackwardPlan plan = internal::plan_rotated_backward(
      call, b, internal::roi_backward_enumerates(dt, mode),
      [&](bool need_total) { return internal::rotated_check_rois_on(dev, call, need_total); },
      [&](const internal::RoiBackwardPlan& p) { return internal::rotated_backward_workspace_on(dev, call, p); });
  EXPECT_EQ(plan.check.bad_row, -1);
  test::PoisonedWorkspace ws(plan.workspace);
  internal::rotated_backward_on(dev, call, plan, ws.ws);
  return gi;
}

template <class T>
void check_case(const Case& c, DType dt, Layout layout) {
  Tensor cpu_out = Tensor::empty({c.shape.K, c.shape.C, c.shape.PH, c.shape.PW}, dt, Device::cpu(), layout);
  roi_align_rotated_forward(c.input, c.rois, cpu_out, c.opt);
  EXPECT_TRUE(test::same_bytes(emulate_forward<T>(c, dt, layout), cpu_out)) << "forward";
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    SCOPED_TRACE(to_string(mode));
    Tensor cpu_gi = Tensor::empty({c.shape.N, c.shape.C, c.shape.H, c.shape.W}, dt, Device::cpu(), layout);
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_rotated_backward(c.grad_output, c.rois, cpu_gi, c.opt, b);
    EXPECT_TRUE(test::same_bytes(emulate_backward(c, dt, layout, mode), cpu_gi));
  }
}

template <class T>
void check_all(const Param& param) {
  const auto [dt, layout, sr, aligned] = param;
  check_case<T>(make_case(dt, layout, sr, aligned), dt, layout);
}

TEST_P(RoiAlignRotatedEmulated, KernelBodiesMatchTheCpuBackendBitwise) {
  switch (std::get<0>(GetParam())) {
    case DType::kFloat32: check_all<float>(GetParam()); break;
    case DType::kFloat64: check_all<double>(GetParam()); break;
    case DType::kFloat16: check_all<Half>(GetParam()); break;
    default: check_all<BFloat16>(GetParam()); break;
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dt, layout, sr, aligned] = info.param;
  return std::string(dtype_name(dt)) + (layout == Layout::kNHWC ? "_nhwc" : "_nchw") +
         (sr > 0 ? "_sr" + std::to_string(sr) : "_adaptive") + (aligned ? "_aligned" : "_legacy");
}

INSTANTIATE_TEST_SUITE_P(All, RoiAlignRotatedEmulated,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::Values(Layout::kNCHW, Layout::kNHWC),
                                            ::testing::Values(std::int64_t{2}, std::int64_t{0}),
                                            ::testing::Values(true, false)),
                         param_name);

TEST(RoiAlignRotatedEmulatedCheck, CheckBodyReportsBadRowsAndCounts) {
  Case c = make_case(DType::kFloat32, Layout::kNCHW, 0, true);
  c.rois.data<float>()[7 * 6 + 3] = -1;  // negative width
  c.rois.data<float>()[3 * 6 + 0] = 5;   // batch index out of range
  std::vector<std::int64_t> counts(static_cast<std::size_t>(c.shape.K), -1), bad;
  std::vector<std::int64_t> images(static_cast<std::size_t>(c.shape.N), 0);
  for (std::int64_t k = 0; k < c.shape.K; ++k)
    detail::roi_align_rotated_check_element<float>(
        k, c.source(), c.shape, counts.data(), [&bad](std::int64_t b) { bad.push_back(b); },
        [&images](std::int64_t n, std::int64_t v) { images[static_cast<std::size_t>(n)] += v; });
  EXPECT_EQ(bad, (std::vector<std::int64_t>{3, 7}));
  EXPECT_EQ(counts[3], 0);
  EXPECT_EQ(counts[7], 0);
  EXPECT_GT(counts[0], 0);
  // the per-image sums (the exact mode's chunk sizes) hold every valid roi's samples once
  std::int64_t even = 0, odd = 0;  // rois alternate between the two images (k % N)
  for (std::int64_t k = 0; k < c.shape.K; ++k) (k % 2 == 0 ? even : odd) += counts[static_cast<std::size_t>(k)];
  EXPECT_EQ(images, (std::vector<std::int64_t>{even, odd}));
  // the CPU backend reports the first one
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, DType::kFloat32);
  EXPECT_THROW(roi_align_rotated_forward(c.input, c.rois, out, c.opt), Error);
}

TEST(RoiAlignRotatedEmulatedChunks, ImagesBeyondOneChunkMatchTheCpuBackend) {
  // 3 images of 12 rois 64 x 64 wide with adaptive sampling (13 x 13 samples per bin of 5 x 5):
  // about 2 x 10^5 records per image, so the exact mode's chunks hold 2 images, then 1.
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
      Case c;
      const std::int64_t N = 3, C = 2, H = 80, W = 80, K = 36;
      c.opt.pooled_height = 5;
      c.opt.pooled_width = 5;
      c.opt.spatial_scale = 1.0;
      c.opt.sampling_ratio = 0;
      c.input = make_tensor({N, C, H, W}, dt, test::random_values(static_cast<std::size_t>(N * C * H * W), 21), layout);
      std::vector<double> r(static_cast<std::size_t>(K * 6));
      for (std::int64_t k = 0; k < K; ++k) {
        double* row = &r[static_cast<std::size_t>(k * 6)];
        row[0] = static_cast<double>(k % N), row[1] = 30 + k % 7, row[2] = 35 + k % 5, row[3] = 64, row[4] = 64;
        row[5] = 15.0 * static_cast<double>(k % 12);
      }
      c.rois = make_tensor({K, 6}, DType::kFloat32, r);
      c.grad_output = make_tensor({K, C, 5, 5}, dt, test::random_values(static_cast<std::size_t>(K * C * 25), 22), layout);
      c.shape.N = N, c.shape.C = C, c.shape.H = H, c.shape.W = W, c.shape.K = K, c.shape.PH = 5, c.shape.PW = 5;
      c.shape.spatial_scale = 1.0, c.shape.sampling_ratio = 0, c.shape.aligned = true;
      c.shape.max_samples_per_roi = c.opt.max_samples_per_roi;
      c.shape.angle_radians = false, c.shape.clockwise = false;
      Tensor gi = Tensor::empty({N, C, H, W}, dt, Device::cpu(), layout);
      const internal::RoiCheck check =
          internal::rotated_check_rois_on(test::EmulatedDevice{}, make_call(c, gi.view(), c.grad_output.view()), true);
      ASSERT_EQ(internal::rotated_exact_chunks(c.shape, check).images, 2) << "two chunks";
      internal::dispatch_floating(dt, [&](auto tag) { check_case<decltype(tag)>(c, dt, layout); });
    }
  }
}

TEST(RoiAlignRotatedEmulatedCheck, TheCudaCheckReportsTheFirstBadRow) {
  Case c = make_case(DType::kFloat32, Layout::kNCHW, 0, true);
  c.rois.data<float>()[7 * 6 + 3] = -1;  // negative width
  c.rois.data<float>()[3 * 6 + 0] = 5;   // batch index out of range
  const internal::RoiCheck check = internal::rotated_check_rois_on(
      test::EmulatedDevice{}, make_call(c, c.input.view(), c.grad_output.view()), true);
  EXPECT_EQ(check.bad_row, 3);
  EXPECT_EQ(check.row[0], 5.0);
  EXPECT_NE(check.status, detail::RoiStatus::kOk);
}

}  // namespace
}  // namespace detops
