// The CUDA backends of RoIAlign and RoIAlignRotated run on the CPU: their own steps
// (internal/roi_align_device.h, internal/roi_align_rotated_device.h and the roi ops' shared
// internal/roi_device.h, the code cuda/roi_align{,_rotated}_cuda.cu run on CudaDevice) on the
// emulated device (tests/emulated_device.h: every thread index in order, CUB's contracts),
// against the CPU backend byte for byte: the roi check, the forward, and every backward mode
// (planned as the front end plans it) from a poisoned grad_input and workspace. The CPU backends
// use their own loop structure, so agreement to the bit checks both the CUDA sequence and the
// claim that the two backends evaluate the same arithmetic. The shared contracts are written once
// over a geometry (tests/roi_test_harness.h) and run for both ops; then each op's own: RoIAlign's
// plane groups, max pooling's NaN and tie rules and slot initialisation, RoIAlignRotated's chunks
// of images. scripts/mutate_cuda_steps.py lists mutations of the steps this suite must catch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "emulated_device.h"
#include "roi_test_harness.h"

namespace detops {
namespace {

using namespace test;  // NOLINT: the harness and the helpers it builds on

/// 40 rois (the geometry's edge rows first) pooled 5 x 4 from two 21 x 26 maps at scale 1/4;
/// C = 11: a channel group of 8 plus a remainder.
template <class G>
Workload<G> make_case(DType dt, Layout layout, PoolMode pool, std::int64_t sr, bool aligned) {
  constexpr WorkloadSize kCase{2, 11, 21, 26, 40, 5, 4, 0.25, 2.0, 90.0, 11, 1.0};
  return make_workload<G>(kCase, dt, layout, pool, sr, aligned);
}

template <class G>
typename G::Call call_of(const Workload<G>& c, const TensorView& features, const TensorView& pooled,
                         const TensorView& argmax) {
  return G::call(features, c.rois.view(), pooled, argmax, c.opt);
}

/// The CUDA backend's forward (argmax too with max pooling) into a poisoned output.
template <class G, class T>
Tensor emulate_forward(const Workload<G>& c, DType dt, Layout layout, Tensor* argmax = nullptr) {
  const std::int64_t PH = c.opt.pooled_height, PW = c.opt.pooled_width;
  Tensor out = Tensor::empty({c.K(), c.C(), PH, PW}, dt, Device::cpu(), layout);
  Tensor am = Tensor::empty({c.K(), c.C(), PH, PW}, DType::kInt32, Device::cpu(), layout);
  out.fill_bytes(0xCD);
  am.fill_bytes(0xCD);
  if (argmax) *argmax = am;
  G::template forward_on<T>(EmulatedDevice{}, call_of(c, c.input.view(), out.view(), am.view()));
  return out;
}

/// The CUDA backend's backward into grad_input `gi` (any strides, gaps kept), planned as the
/// front end plans it (the roi check with the totals the plan needs, an unchecked call's bad rows
/// not raised; the workspace it sizes, poisoned), then the backward.
template <class G>
void emulate_backward_into(const Workload<G>& c, const TensorView& gi, BackwardMode mode,
                           TruncationFormat format = TruncationFormat::kFloat16) {
  const typename G::Call call = call_of(c, gi, c.grad_output.view(), c.argmax.view());
  const EmulatedDevice dev;
  RoiAlignBackwardOptions b;
  b.mode = mode;
  b.truncation = format;
  const internal::RoiBackwardPlan plan = G::plan_on(dev, call, b);
  if (c.opt.check_rois) {
    EXPECT_EQ(plan.check.bad_row, -1);
  }
  PoisonedWorkspace ws(plan.workspace);
  G::backward_on(dev, call, plan, ws.ws);
}
template <class G>
Tensor emulate_backward(const Workload<G>& c, DType dt, Layout layout, BackwardMode mode) {
  Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, dt, Device::cpu(), layout);
  gi.fill_bytes(0xCD);
  emulate_backward_into(c, gi.view(), mode);
  return gi;
}

/// The CPU backend (2 threads) against the emulated CUDA steps: forward (and argmax), every mode.
template <class G, class T>
void check_case(const Workload<G>& c, DType dt, Layout layout) {
  Context ctx;
  ctx.num_threads = 2;
  const std::int64_t PH = c.opt.pooled_height, PW = c.opt.pooled_width;
  Tensor out = Tensor::empty({c.K(), c.C(), PH, PW}, dt, Device::cpu(), layout);
  Tensor am = Tensor::empty({c.K(), c.C(), PH, PW}, DType::kInt32, Device::cpu(), layout);
  const bool max = G::max_pool(c.opt);
  G::forward(c.input, c.rois, out, c.opt, ctx, max ? am.view() : TensorView{});
  Tensor want_am;
  EXPECT_TRUE(same_bytes(out, emulate_forward<G, T>(c, dt, layout, &want_am))) << "forward";
  if (max) {
    EXPECT_TRUE(same_bytes(am, want_am)) << "argmax";
  }
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    Tensor gi = Tensor::empty({c.N(), c.C(), c.H(), c.W()}, dt, Device::cpu(), layout);
    RoiAlignBackwardOptions b;
    b.mode = mode;
    G::backward(c.grad_output, c.rois, gi, c.opt, b, ctx, c.argmax);
    EXPECT_TRUE(same_bytes(gi, emulate_backward(c, dt, layout, mode))) << to_string(mode);
  }
}

/// f(G{}, T{}) for the case's op and dtype.
template <class F>
void with_geometry_and_type(RoiOp op, DType dt, F&& f) {
  with_geometry(op, [&](auto g) { internal::dispatch_floating(dt, [&](auto t) { f(g, t); }); });
}

class RoiEmulatedGrid : public ::testing::TestWithParam<RoiParam> {};

TEST_P(RoiEmulatedGrid, KernelBodiesMatchTheCpuBackendBitwise) {
  const RoiParam& p = GetParam();
  with_geometry_and_type(p.op, p.dt, [&](auto g, auto t) {
    using G = decltype(g);
    check_case<G, decltype(t)>(make_case<G>(p.dt, p.layout, p.pool, p.sr, p.aligned), p.dt, p.layout);
  });
}

const RoiGrid kEmulatedGrid{kRoiDtypes, kRoiLayouts, {}, kRoiPools, {true, false}, {0, 2}};
DETOPS_ROI_INSTANTIATE(RoiEmulatedGrid, kEmulatedGrid);

// ---------------------------------------------------------------------------------------------
// The launchers' bookkeeping (strided zero fill and store, the roi check and counts, unchecked
// rows) over their grids, against the CPU backend; both ops.

template <class G>
class RoiEmulated : public ::testing::Test {};
TYPED_TEST_SUITE(RoiEmulated, RoiGeometries, RoiNames);

/// Drops every roi (K = 0): each mode then only zero-fills grad_input.
template <class G>
void make_empty(Workload<G>& c, DType dt, Layout layout) {
  const std::int64_t PH = c.opt.pooled_height, PW = c.opt.pooled_width;
  c.rois = Tensor::empty({0, G::kColumns}, DType::kFloat32);
  c.grad_output = Tensor::empty({0, c.C(), PH, PW}, dt, Device::cpu(), layout);
  if (G::max_pool(c.opt)) c.argmax = Tensor::empty({0, c.C(), PH, PW}, DType::kInt32, Device::cpu(), layout);
}

/// grad_input as a view with gaps (NCHW rows padded by 3; NHWC pixels holding every other
/// channel) into a storage of 0xCD bytes, compared whole: a write into a gap shows.
template <class G>
void check_gapped(DType dt, Layout layout, PoolMode pool, std::int64_t sr, bool empty) {
  Workload<G> c = make_case<G>(dt, layout, pool, sr, true);
  if (empty) make_empty(c, dt, layout);
  Placement place;
  place.channels_last = layout == Layout::kNHWC;
  if (place.channels_last) place.c_step = 2;
  else place.w_pad = 3;
  const Shape shape{c.N(), c.C(), c.H(), c.W()};
  Context ctx;
  ctx.num_threads = 2;
  struct Mode {
    BackwardMode mode;
    TruncationFormat format;
  };
  for (const Mode m : {Mode{BackwardMode::kAtomic, TruncationFormat::kFloat16},
                       Mode{BackwardMode::kTruncated, TruncationFormat::kFloat16},
                       Mode{BackwardMode::kTruncated, TruncationFormat::kBFloat16},
                       Mode{BackwardMode::kExact, TruncationFormat::kFloat16}}) {
    const StridedBuf got = StridedBuf::make(shape, place, dt, Device::cpu());
    const StridedBuf want = StridedBuf::make(shape, place, dt, Device::cpu());
    RoiAlignBackwardOptions b;
    b.mode = m.mode;
    b.truncation = m.format;
    G::backward(c.grad_output, c.rois, got.view, c.opt, b, ctx, c.argmax);
    emulate_backward_into(c, want.view, m.mode, m.format);
    EXPECT_TRUE(same_bytes(got.storage, want.storage))
        << to_string(m.mode) << (m.format == TruncationFormat::kBFloat16 ? " (bfloat16 rounding)" : "");
    // the comparison sees the gaps: they must still hold the poison, and some element must not
    const auto* bytes = static_cast<const unsigned char*>(got.storage.view().data);
    EXPECT_EQ(bytes[got.storage.nbytes() - 1], 0xCD) << "a gap was written";
    EXPECT_FALSE(same_bytes(got.storage, StridedBuf::make(shape, place, dt, Device::cpu()).storage))
        << "nothing was written";
  }
}

TYPED_TEST(RoiEmulated, StridedGradInputGetsTheKernelBits) {
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
    for (PoolMode pool : pool_modes<TypeParam>())
      for (std::int64_t sr : {0, 2})
        for (bool empty : {false, true}) {
          SCOPED_TRACE(::testing::Message() << (layout == Layout::kNHWC ? "nhwc " : "nchw ") << to_string(pool)
                                            << " sr " << sr << (empty ? " K=0" : ""));
          for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16})
            check_gapped<TypeParam>(dt, layout, pool, sr, empty);
        }
}

/// Rows the roi check rejects, each for another reason: 3 (batch index not an integer), 9 (out
/// of range), 14 and 20 (not finite), 31 (a grid over max_samples_per_roi, adaptive sampling
/// only), and where the geometry has them 7 (a negative size). Returns how many rows are bad.
template <class G>
int corrupt_rois(Workload<G>& c, std::int64_t max_samples) {
  std::vector<double> r = to_vector(c.rois);
  const int n = G::kColumns;
  r[3 * n + 0] = 0.5;
  r[9 * n + 0] = 2;  // N = 2
  r[14 * n + 2] = std::numeric_limits<double>::quiet_NaN();
  r[20 * n + 3] = std::numeric_limits<double>::infinity();
  G::huge(&r[31 * n], 3500);
  int bad = c.opt.sampling_ratio > 0 ? 4 : 5;
  bad += G::invalid_size(&r[7 * n]);
  c.rois = make_tensor({c.K(), n}, DType::kFloat32, r);
  c.opt.max_samples_per_roi = max_samples;
  return bad;
}

/// The check kernel's body (threads in reverse order: the smallest bad row must win anyway; with
/// and without counts) and the count kernel's, against the CPU backend's check of the same call.
template <class G, class A>
void check_roi_bodies(DType dt, std::int64_t sr) {
  Workload<G> c = make_case<G>(dt, Layout::kNCHW, PoolMode::kAvg, sr, true);
  const int bad_rows = corrupt_rois(c, 4000);
  const std::int64_t K = c.K(), N = c.N();
  const typename G::Shape s = G::shape(c.input.view(), K, c.opt);
  const detail::RoiSource rois{c.rois.view().data, DType::kFloat32, G::kColumns, 1};
  unsigned long long first_bad = static_cast<unsigned long long>(K), first_bad_no_counts = first_bad;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(K), -1), counted(static_cast<std::size_t>(K + 1), -1);
  std::vector<std::int64_t> reported, images(static_cast<std::size_t>(N), 0);
  for (std::int64_t k = K - 1; k >= 0; --k) {
    G::template check_element<A>(
        k, rois, s, counts.data(),
        [&](std::int64_t bad) {
          first_bad = std::min(first_bad, static_cast<unsigned long long>(bad));
          reported.push_back(bad);
        },
        [&](std::int64_t image, std::int64_t v) { images[static_cast<std::size_t>(image)] += v; });
    G::template check_element<A>(
        k, rois, s, nullptr,
        [&](std::int64_t bad) {
          first_bad_no_counts = std::min(first_bad_no_counts, static_cast<unsigned long long>(bad));
        },
        [](std::int64_t, std::int64_t) {});
  }
  for (std::int64_t k = 0; k < K + 1; ++k) G::template count_element<A>(k, rois, s, counted.data());
  const internal::RoiCheck cpu =
      G::cpu_backend().check_rois(call_of(c, c.input.view(), c.grad_output.view(), {}), true, Context{});
  EXPECT_EQ(cpu.bad_row, 3);
  EXPECT_EQ(static_cast<std::int64_t>(first_bad), cpu.bad_row);
  EXPECT_EQ(static_cast<std::int64_t>(first_bad_no_counts), cpu.bad_row);
  EXPECT_EQ(static_cast<int>(reported.size()), bad_rows);
  for (std::int64_t k : reported) EXPECT_EQ(counts[static_cast<std::size_t>(k)], 0) << "bad roi " << k;
  std::int64_t total = 0, zeros = 0;
  const std::vector<double> r = to_vector(c.rois);
  std::vector<std::int64_t> want_images(static_cast<std::size_t>(N), 0);
  for (std::int64_t k = 0; k < K; ++k) {
    EXPECT_EQ(counts[k], counted[k]) << "roi " << k;
    total += counts[k];
    zeros += counts[k] == 0;
    if (std::find(reported.begin(), reported.end(), k) == reported.end())
      want_images[static_cast<std::size_t>(r[static_cast<std::size_t>(k * G::kColumns)])] += counts[k];
  }
  EXPECT_EQ(counted[K], 0);
  // bad rows count nothing, and so does row 1 (the zero-size edge row) with adaptive sampling only
  EXPECT_EQ(zeros, bad_rows + (sr > 0 ? 0 : 1));
  EXPECT_EQ(total, cpu.total_samples);
  if (cpu.max_image_samples >= 0) {  // RoIAlignRotated: the per-image sums that size its chunks
    EXPECT_EQ(images, want_images);
    EXPECT_EQ(*std::max_element(images.begin(), images.end()), cpu.max_image_samples);
  }
  // the front end reports the first bad row
  Tensor out = Tensor::empty({K, c.C(), c.opt.pooled_height, c.opt.pooled_width}, dt);
  EXPECT_THROW(G::forward(c.input, c.rois, out, c.opt), Error);
}

TYPED_TEST(RoiEmulated, CheckAndCountBodiesMatchTheCpuBackend) {
  for (std::int64_t sr : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "sr " << sr);
    check_roi_bodies<TypeParam, float>(DType::kFloat32, sr);
    check_roi_bodies<TypeParam, double>(DType::kFloat64, sr);
  }
}

TYPED_TEST(RoiEmulated, TheCudaCheckReportsTheFirstBadRow) {
  using G = TypeParam;
  Workload<G> c = make_case<G>(DType::kFloat32, Layout::kNCHW, PoolMode::kAvg, 0, true);
  set_roi<G>(c.rois, 7, 3, -1);  // RoIAlignRotated: a negative width; RoIAlign: a box with x2 < x1, valid
  set_roi<G>(c.rois, 3, 0, 5);   // batch index out of range
  const internal::RoiCheck check =
      G::check_rois_on(EmulatedDevice{}, call_of(c, c.input.view(), c.grad_output.view(), {}), true);
  EXPECT_EQ(check.bad_row, 3);
  EXPECT_EQ(check.row[0], 5.0);
  EXPECT_NE(check.status, detail::RoiStatus::kOk);
}

/// check_rois = false: invalid rows pool to zero and contribute nothing. Exact mode with a fixed
/// sampling ratio then has slots no roi fills (the sentinels of the slots' initialisation);
/// adaptive sampling sizes them from the counts.
template <class G, class T>
void check_unchecked(DType dt, Layout layout, PoolMode pool, std::int64_t sr) {
  Workload<G> c = make_case<G>(dt, layout, pool, sr, true);  // argmax from the valid rois
  corrupt_rois(c, 4000);
  c.opt.check_rois = false;
  check_case<G, T>(c, dt, layout);
}

TYPED_TEST(RoiEmulated, UncheckedInvalidRowsGiveTheKernelBits) {
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
    for (PoolMode pool : pool_modes<TypeParam>())
      for (std::int64_t sr : {0, 2}) {
        SCOPED_TRACE(::testing::Message() << (layout == Layout::kNHWC ? "nhwc " : "nchw ") << to_string(pool)
                                          << " sr " << sr);
        check_unchecked<TypeParam, float>(DType::kFloat32, layout, pool, sr);
        check_unchecked<TypeParam, double>(DType::kFloat64, layout, pool, sr);
        check_unchecked<TypeParam, Half>(DType::kFloat16, layout, pool, sr);
      }
}

// ---------------------------------------------------------------------------------------------
// RoIAlign's own

/// The NCHW forward and the scatter backward walk planes in groups sized by the plane's bytes,
/// pool sparse rois group by group in blocks of tables and dense rois one by one (the backward
/// picks one walk for all rois). 181 x 181 planes give groups of 16 (half), 8 (float) and 4
/// (double) planes in the forward; C = 7 leaves tails. Adaptive: tiny and huge rois on three
/// images in mixed order take both forward walks, the huge ones fill several table blocks, and
/// the backward takes the roi walk. Sampling ratio 2 with 3400 rois: the backward takes the
/// plane-group walk over several blocks. Every thread count gives the kernel bodies' bits.
template <class T>
void check_plane_groups(DType dt, PoolMode pool, std::int64_t sr) {
  using G = AxisAlignedRois;
  Workload<G> c;
  const std::int64_t N = 3, C = 7, H = 181, W = 181, K = sr > 0 ? 3400 : 30;  // adaptive: 324,000 samples
  c.opt = G::options(5, 4, 0.5, sr, true, pool);
  c.input = make_tensor({N, C, H, W}, dt, random_values(static_cast<std::size_t>(N * C * H * W), 21));
  std::vector<double> r = random_rois(K, N, H * 2.0, W * 2.0, 22, 2.0, sr > 0 ? 300.0 : 12.0);
  for (std::int64_t k = 0; sr == 0 && k < K; k += 3) {  // every third roi covers most of the map
    r[k * 5 + 1] = 5.0 + static_cast<double>(k);
    r[k * 5 + 2] = 3.0;
    r[k * 5 + 3] = 2.0 * W - 4.0;
    r[k * 5 + 4] = 2.0 * H - 7.0 - static_cast<double>(k);
  }
  c.rois = make_tensor({K, 5}, DType::kFloat32, r);
  c.grad_output = make_tensor({K, C, 5, 4}, dt, random_values(static_cast<std::size_t>(K * C * 20), 23));
  if (pool == PoolMode::kMax) {  // the argmax of the emulated forward
    c.argmax = Tensor::empty({K, C, 5, 4}, DType::kInt32, Device::cpu());
    Tensor out = Tensor::empty({K, C, 5, 4}, dt, Device::cpu());
    roi_align_forward(c.input, c.rois, out, c.opt, {}, c.argmax);
  }
  const Tensor expected = emulate_forward<G, T>(c, dt, Layout::kNCHW);
  const Tensor expected_atomic = emulate_backward(c, dt, Layout::kNCHW, BackwardMode::kAtomic);
  const Tensor expected_truncated = emulate_backward(c, dt, Layout::kNCHW, BackwardMode::kTruncated);
  Tensor expected_am;
  for (int threads : {1, 2, 3}) {
    Context ctx;
    ctx.num_threads = threads;
    Tensor out = Tensor::empty({K, C, 5, 4}, dt, Device::cpu());
    Tensor am = Tensor::empty({K, C, 5, 4}, DType::kInt32, Device::cpu());
    roi_align_forward(c.input, c.rois, out, c.opt, ctx, pool == PoolMode::kMax ? am.view() : TensorView{});
    EXPECT_TRUE(same_bytes(out, expected)) << dtype_name(dt) << " " << threads << " threads";
    if (pool == PoolMode::kMax) {
      if (threads == 1) expected_am = am;
      EXPECT_TRUE(same_bytes(am, expected_am)) << "argmax, " << threads << " threads";
    }
    for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated}) {
      Tensor gi = Tensor::empty({N, C, H, W}, dt, Device::cpu());
      RoiAlignBackwardOptions b;
      b.mode = mode;
      roi_align_backward(c.grad_output, c.rois, gi, c.opt, b, ctx, c.argmax);
      EXPECT_TRUE(same_bytes(gi, mode == BackwardMode::kAtomic ? expected_atomic : expected_truncated))
          << to_string(mode) << " " << dtype_name(dt) << " " << threads << " threads";
    }
  }
}

TEST(RoiAlignCpu, PlaneGroupsAndTableBlocksGiveTheKernelBits) {
  for (std::int64_t sr : {0, 2})
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax}) {
      check_plane_groups<Half>(DType::kFloat16, pool, sr);
      check_plane_groups<float>(DType::kFloat32, pool, sr);
      check_plane_groups<double>(DType::kFloat64, pool, sr);
    }
}

// Max pooling's rules where the data is not plain: a NaN sample wins once and sticks, inf and
// -inf compete as values, ties keep the first sample, an out-of-apron sample counts as 0. The CPU
// loops (selects, validity decided per sample, F16C for float16) against the kernel body:
// outputs equal bit for bit except NaN vs NaN (payloads are not part of the guarantee), argmax
// equal everywhere.
template <class T>
void check_max_specials(DType dt, Layout layout, std::int64_t sr) {
  using G = AxisAlignedRois;
  Workload<G> c = make_case<G>(dt, layout, PoolMode::kMax, sr, true);
  std::vector<double> v = to_vector(c.input);
  const double inf = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < v.size(); i += 97) v[i] = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t i = 13; i < v.size(); i += 89) v[i] = inf;
  for (std::size_t i = 29; i < v.size(); i += 83) v[i] = -inf;
  for (std::size_t i = 200; i < 600; ++i) v[i] = 0.5;  // ties
  c.input = make_tensor({c.N(), c.C(), c.H(), c.W()}, dt, v, layout);
  Tensor want_am;
  const Tensor want = emulate_forward<G, T>(c, dt, layout, &want_am);
  for (int threads : {1, 2}) {
    Context ctx;
    ctx.num_threads = threads;
    Tensor out = Tensor::empty({c.K(), c.C(), 5, 4}, dt, Device::cpu(), layout);
    Tensor am = Tensor::empty({c.K(), c.C(), 5, 4}, DType::kInt32, Device::cpu(), layout);
    roi_align_forward(c.input, c.rois, out, c.opt, ctx, am);
    EXPECT_TRUE(same_bytes(am, want_am)) << "argmax, " << threads << " threads";
    const std::vector<double> got = to_vector(out), ref = to_vector(want);
    std::int64_t differ = 0, nans = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const bool both_nan = got[i] != got[i] && ref[i] != ref[i];
      nans += both_nan;
      differ += !both_nan && std::memcmp(&got[i], &ref[i], sizeof(double)) != 0;
    }
    EXPECT_EQ(differ, 0) << threads << " threads";
    EXPECT_GT(nans, 0) << "the data should reach some NaN outputs";
  }
}

TEST(RoiAlignEmulated, MaxPoolingWithNanInfAndTiesIsTheKernelBody) {
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
    for (std::int64_t sr : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << (layout == Layout::kNHWC ? "nhwc" : "nchw") << " sr " << sr);
      check_max_specials<float>(DType::kFloat32, layout, sr);
      check_max_specials<double>(DType::kFloat64, layout, sr);
      check_max_specials<Half>(DType::kFloat16, layout, sr);
      check_max_specials<BFloat16>(DType::kBFloat16, layout, sr);
    }
}

/// init_slots_kernel's body over a workspace of 0xA5 bytes: every field of every slot gets the
/// documented value (sentinel key, own id, zero weight and offsets, sample -1), byte for byte.
template <class A>
void check_init_slots() {
  constexpr std::int64_t cap = 37;
  const detail::GatherKey sentinel = 12345;
  std::vector<detail::GatherKey> keys(cap);
  std::vector<detail::GatherIndex> ids(cap);
  std::vector<std::int64_t> go(cap), am(cap);
  std::vector<A> w(cap);
  std::vector<std::int32_t> smp(cap);
  std::memset(keys.data(), 0xA5, cap * sizeof(detail::GatherKey));
  std::memset(ids.data(), 0xA5, cap * sizeof(detail::GatherIndex));
  for (auto* v : {static_cast<void*>(go.data()), static_cast<void*>(am.data())}) std::memset(v, 0xA5, cap * 8);
  std::memset(w.data(), 0xA5, cap * sizeof(A));
  std::memset(smp.data(), 0xA5, cap * 4);
  const detail::ExactRecords<A> rec{keys.data(), ids.data(), w.data(), go.data(), am.data(), smp.data()};
  for (std::int64_t j = 0; j < cap; ++j) detail::roi_align_exact_init_slot(j, rec, sentinel);
  std::vector<detail::GatherIndex> want_ids(cap);
  std::iota(want_ids.begin(), want_ids.end(), 0);
  EXPECT_EQ(keys, std::vector<detail::GatherKey>(cap, sentinel));
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(go, std::vector<std::int64_t>(cap, 0));
  EXPECT_EQ(am, std::vector<std::int64_t>(cap, 0));
  EXPECT_EQ(smp, std::vector<std::int32_t>(cap, -1));
  const std::vector<A> zeros(cap, A(0));  // +0: all bytes zero
  EXPECT_EQ(std::memcmp(w.data(), zeros.data(), cap * sizeof(A)), 0);
}

TEST(RoiAlignEmulated, InitSlotsDefinesEveryField) {
  check_init_slots<float>();
  check_init_slots<double>();
}

// ---------------------------------------------------------------------------------------------
// RoIAlignRotated's own

TEST(RoiAlignRotatedEmulatedChunks, ImagesBeyondOneChunkMatchTheCpuBackend) {
  // 3 images of 12 rois 64 x 64 wide with adaptive sampling (13 x 13 samples per bin of 5 x 5):
  // about 2 x 10^5 records per image, so the exact mode's chunks hold 2 images, then 1.
  using G = RotatedRois;
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
      Workload<G> c;
      const std::int64_t N = 3, C = 2, H = 80, W = 80, K = 36;
      c.opt = G::options(5, 5, 1.0, 0, true, PoolMode::kAvg);
      c.input = make_tensor({N, C, H, W}, dt, random_values(static_cast<std::size_t>(N * C * H * W), 21), layout);
      std::vector<double> r(static_cast<std::size_t>(K * 6));
      for (std::int64_t k = 0; k < K; ++k) {
        double* row = &r[static_cast<std::size_t>(k * 6)];
        row[0] = static_cast<double>(k % N), row[1] = 30 + k % 7, row[2] = 35 + k % 5, row[3] = 64, row[4] = 64;
        row[5] = 15.0 * static_cast<double>(k % 12);
      }
      c.rois = make_tensor({K, 6}, DType::kFloat32, r);
      c.grad_output = make_tensor({K, C, 5, 5}, dt, random_values(static_cast<std::size_t>(K * C * 25), 22), layout);
      Tensor gi = Tensor::empty({N, C, H, W}, dt, Device::cpu(), layout);
      const G::Call call = call_of(c, gi.view(), c.grad_output.view(), {});
      const internal::RoiCheck check = G::check_rois_on(EmulatedDevice{}, call, true);
      ASSERT_EQ(internal::rotated_exact_chunks(call.shape, check).images, 2) << "two chunks";
      internal::dispatch_floating(dt, [&](auto tag) { check_case<G, decltype(tag)>(c, dt, layout); });
    }
  }
}

}  // namespace
}  // namespace detops
