// The CUDA backend of RoIAlign run on the CPU: its own steps (internal/roi_align_device.h and the
// roi ops' shared internal/roi_device.h, the code cuda/roi_align_cuda.cu runs on CudaDevice) on
// the emulated device (tests/emulated_device.h: every thread index in order, CUB's contracts),
// against the CPU backend: the roi check, forward (average and max pooling), and every backward
// mode from a poisoned workspace. The CPU backend uses its own loop structure, so agreement to
// the bit checks both the CUDA sequence and the claim that the two backends evaluate the same
// arithmetic. The bodies' own contracts (slot initialisation, the check and count bodies, max
// pooling's NaN and tie rules) are tested on them directly. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>
#include <type_traits>

#include "detops/detail/roi_align_kernels.h"
#include "emulated_device.h"
#include "internal/roi_align_backend.h"
#include "internal/roi_align_device.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;

struct Case {
  Tensor input, rois, grad_output, argmax;
  RoiAlignOptions opt;
  detail::RoiAlignShape shape;
};

Case make_case(DType dt, Layout layout, PoolMode pool, std::int64_t sr, bool aligned) {
  Case c;
  const std::int64_t N = 2, C = 11, H = 21, W = 26, K = 40;  // C = 11: a channel group of 8 plus a remainder
  c.opt.pooled_height = 5;
  c.opt.pooled_width = 4;
  c.opt.spatial_scale = 0.25;
  c.opt.sampling_ratio = sr;
  c.opt.aligned = aligned;
  c.opt.pool_mode = pool;
  c.input = make_tensor({N, C, H, W}, dt, test::random_values(static_cast<std::size_t>(N * C * H * W), 11), layout);
  std::vector<double> r = test::random_rois(K, N, H * 4.0, W * 4.0, 12, 2.0, 90.0);
  r[1] = -30, r[2] = -30, r[3] = 150, r[4] = 140;  // bigger than the map, over the apron
  c.rois = make_tensor({K, 5}, DType::kFloat32, r);
  c.grad_output =
      make_tensor({K, C, 5, 4}, dt, test::random_values(static_cast<std::size_t>(K * C * 20), 13), layout);
  if (pool == PoolMode::kMax) {
    c.argmax = Tensor::empty({K, C, 5, 4}, DType::kInt32, Device::cpu(), layout);
    Tensor out = Tensor::empty({K, C, 5, 4}, dt, Device::cpu(), layout);
    roi_align_forward(c.input, c.rois, out, c.opt, {}, c.argmax);
  }
  c.shape = {N, C, H, W, K, 5, 4, 0.25, sr, aligned, c.opt.max_samples_per_roi};
  return c;
}

internal::RoiAlignCall make_call(const Case& c, const TensorView& features, const TensorView& pooled,
                                 const TensorView& argmax) {
  internal::RoiAlignCall call{};
  call.op = "emulated";
  call.features = features;
  call.rois = c.rois.view();
  call.pooled = pooled;
  call.max_pool = c.opt.pool_mode == PoolMode::kMax;
  call.argmax = call.max_pool ? argmax : TensorView{};
  call.shape = c.shape;
  return call;
}

/// The CUDA backend's forward (argmax too with max pooling).
template <class T>
Tensor emulate_forward(const Case& c, DType dt, Layout layout, Tensor* argmax = nullptr) {
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
  Tensor am = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, DType::kInt32, Device::cpu(), layout);
  out.fill_bytes(0xCD);
  am.fill_bytes(0xCD);
  if (argmax) *argmax = am;
  internal::roi_align_forward_on<T>(test::EmulatedDevice{}, make_call(c, c.input.view(), out.view(), am.view()));
  return out;
}

/// The CUDA backend's backward into grad_input `gi` (any strides, gaps kept), mode by mode,
/// planned as the front end plans it (plan_roi_align_backward over the CUDA steps: the roi check
/// with the sample total when the plan needs it, an unchecked call's bad rows not raised; the
/// workspace it sizes, poisoned), then the backward.
void emulate_backward_into(const Case& c, const TensorView& gi, BackwardMode mode, TruncationFormat format) {
  const internal::RoiAlignCall call = make_call(c, gi, c.grad_output.view(), c.argmax.view());
  const test::EmulatedDevice dev;
  RoiAlignBackwardOptions b;
  b.mode = mode;
  b.truncation = format;
  const internal::RoiBackwardPlan plan = internal::plan_roi_align_backward(
      call, b, internal::roi_backward_enumerates(gi.dtype, mode),
      [&](bool need_total) { return internal::roi_align_check_rois_on(dev, call, need_total); },
      [&](const internal::RoiBackwardPlan& p) { return internal::roi_align_backward_workspace_on(dev, call, p); });
  if (c.opt.check_rois) {
    EXPECT_EQ(plan.check.bad_row, -1);
  }
  test::PoisonedWorkspace ws(plan.workspace);
  internal::roi_align_backward_on(dev, call, plan, ws.ws);
}
Tensor emulate_backward(const Case& c, DType dt, Layout layout, BackwardMode mode,
                        TruncationFormat format = TruncationFormat::kFloat16) {
  const auto& s = c.shape;
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  gi.fill_bytes(0xCD);
  emulate_backward_into(c, gi.view(), mode, format);
  return gi;
}

/// The NCHW forward and the scatter backward walk planes in groups sized by the plane's bytes,
/// pool sparse rois group by group in blocks of tables and dense rois one by one (the backward
/// picks one walk for all rois). 181 x 181 planes give groups of 16 (half), 8 (float) and 4
/// (double) planes in the forward; C = 7 leaves tails. Adaptive: tiny and huge rois on three
/// images in mixed order take both forward walks, the huge ones fill several table blocks, and
/// the backward takes the roi walk. Sampling ratio 2 with 3400 rois: the backward takes the
/// plane-group walk over several blocks. Every thread count gives the kernel bodies' bits.
template <class T>
void check_plane_groups(DType dt, PoolMode pool, std::int64_t sr) {
  Case c;
  const std::int64_t N = 3, C = 7, H = 181, W = 181, K = sr > 0 ? 3400 : 30;  // adaptive: 324,000 samples
  c.opt.pooled_height = 5;
  c.opt.pooled_width = 4;
  c.opt.spatial_scale = 0.5;
  c.opt.sampling_ratio = sr;
  c.opt.aligned = true;
  c.opt.pool_mode = pool;
  c.input = make_tensor({N, C, H, W}, dt, test::random_values(static_cast<std::size_t>(N * C * H * W), 21));
  std::vector<double> r = test::random_rois(K, N, H * 2.0, W * 2.0, 22, 2.0, sr > 0 ? 300.0 : 12.0);
  for (std::int64_t k = 0; sr == 0 && k < K; k += 3) {  // every third roi covers most of the map
    r[k * 5 + 1] = 5.0 + static_cast<double>(k);
    r[k * 5 + 2] = 3.0;
    r[k * 5 + 3] = 2.0 * W - 4.0;
    r[k * 5 + 4] = 2.0 * H - 7.0 - static_cast<double>(k);
  }
  c.rois = make_tensor({K, 5}, DType::kFloat32, r);
  c.grad_output = make_tensor({K, C, 5, 4}, dt, test::random_values(static_cast<std::size_t>(K * C * 20), 23));
  c.shape = {N, C, H, W, K, 5, 4, 0.5, sr, true, c.opt.max_samples_per_roi};
  if (pool == PoolMode::kMax) {  // the argmax of the emulated forward
    c.argmax = Tensor::empty({K, C, 5, 4}, DType::kInt32, Device::cpu());
    Tensor out = Tensor::empty({K, C, 5, 4}, dt, Device::cpu());
    roi_align_forward(c.input, c.rois, out, c.opt, {}, c.argmax);
  }
  const Tensor expected = emulate_forward<T>(c, dt, Layout::kNCHW);
  const Tensor expected_atomic = emulate_backward(c, dt, Layout::kNCHW, BackwardMode::kAtomic);
  const Tensor expected_truncated = emulate_backward(c, dt, Layout::kNCHW, BackwardMode::kTruncated);
  Tensor expected_am;
  for (int threads : {1, 2, 3}) {
    Context ctx;
    ctx.num_threads = threads;
    Tensor out = Tensor::empty({K, C, 5, 4}, dt, Device::cpu());
    Tensor am = Tensor::empty({K, C, 5, 4}, DType::kInt32, Device::cpu());
    roi_align_forward(c.input, c.rois, out, c.opt, ctx, pool == PoolMode::kMax ? am.view() : TensorView{});
    EXPECT_TRUE(test::same_bytes(out, expected)) << dtype_name(dt) << " " << threads << " threads";
    if (pool == PoolMode::kMax) {
      if (threads == 1) expected_am = am;
      EXPECT_TRUE(test::same_bytes(am, expected_am)) << "argmax, " << threads << " threads";
    }
    for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated}) {
      Tensor gi = Tensor::empty({N, C, H, W}, dt, Device::cpu());
      RoiAlignBackwardOptions b;
      b.mode = mode;
      roi_align_backward(c.grad_output, c.rois, gi, c.opt, b, ctx, c.argmax);
      EXPECT_TRUE(test::same_bytes(gi, mode == BackwardMode::kAtomic ? expected_atomic : expected_truncated))
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

using Param = std::tuple<DType, Layout, PoolMode, std::int64_t, bool>;
class RoiAlignEmulatedGrid : public ::testing::TestWithParam<Param> {};

template <class T>
void check_all(const Param& p) {
  const auto [dt, layout, pool, sr, aligned] = p;
  const Case c = make_case(dt, layout, pool, sr, aligned);
  Context ctx;
  ctx.num_threads = 2;
  // forward
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
  Tensor am = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, DType::kInt32, Device::cpu(), layout);
  roi_align_forward(c.input, c.rois, out, c.opt, ctx, pool == PoolMode::kMax ? am.view() : TensorView{});
  EXPECT_TRUE(test::same_bytes(out, emulate_forward<T>(c, dt, layout))) << "forward";
  // backward, each mode
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    Tensor gi = Tensor::empty({c.shape.N, c.shape.C, c.shape.H, c.shape.W}, dt, Device::cpu(), layout);
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_backward(c.grad_output, c.rois, gi, c.opt, b, ctx, c.argmax);
    EXPECT_TRUE(test::same_bytes(gi, emulate_backward(c, dt, layout, mode))) << to_string(mode);
  }
}

TEST_P(RoiAlignEmulatedGrid, KernelBodiesMatchCpuBackendBitwise) {
  switch (std::get<0>(GetParam())) {
    case DType::kFloat32: check_all<float>(GetParam()); break;
    case DType::kFloat64: check_all<double>(GetParam()); break;
    case DType::kFloat16: check_all<Half>(GetParam()); break;
    default: check_all<BFloat16>(GetParam()); break;
  }
}

std::string case_name(const ::testing::TestParamInfo<Param>& i) {
  const auto [dt, layout, pool, sr, aligned] = i.param;
  return std::string(dtype_name(dt)) + (layout == Layout::kNHWC ? "_nhwc_" : "_nchw_") + to_string(pool) +
         (sr > 0 ? "_sr2" : "_adaptive") + (aligned ? "_aligned" : "_legacy");
}

// Max pooling's rules where the data is not plain: a NaN sample wins once and sticks, inf and
// -inf compete as values, ties keep the first sample, an out-of-apron sample counts as 0. The CPU
// loops (selects, validity decided per sample, F16C for float16) against the kernel body:
// outputs equal bit for bit except NaN vs NaN (payloads are not part of the guarantee), argmax
// equal everywhere.
template <class T>
void check_max_specials(DType dt, Layout layout, std::int64_t sr) {
  Case c = make_case(dt, layout, PoolMode::kMax, sr, true);
  std::vector<double> v = test::to_vector(c.input);
  const double inf = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < v.size(); i += 97) v[i] = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t i = 13; i < v.size(); i += 89) v[i] = inf;
  for (std::size_t i = 29; i < v.size(); i += 83) v[i] = -inf;
  for (std::size_t i = 200; i < 600; ++i) v[i] = 0.5;  // ties
  c.input = make_tensor({c.shape.N, c.shape.C, c.shape.H, c.shape.W}, dt, v, layout);
  Tensor want_am;
  const Tensor want = emulate_forward<T>(c, dt, layout, &want_am);
  for (int threads : {1, 2}) {
    Context ctx;
    ctx.num_threads = threads;
    Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
    Tensor am = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, DType::kInt32, Device::cpu(), layout);
    roi_align_forward(c.input, c.rois, out, c.opt, ctx, am);
    EXPECT_TRUE(test::same_bytes(am, want_am)) << "argmax, " << threads << " threads";
    const std::vector<double> got = test::to_vector(out), ref = test::to_vector(want);
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

// ---------------------------------------------------------------------------------------------
// The launcher's bookkeeping kernels (strided zero fill and store, the roi check and counts,
// slot initialization) over their grids, against the CPU backend.

/// A [N, C, H, W] view with gaps into a storage of 0xA5 bytes: NCHW rows padded by 3 elements, or
/// NHWC pixels padded by 5 channels. Compared whole, so a write into a gap shows.
struct GappedView {
  Tensor storage;
  TensorView view;
};
GappedView gapped(const detail::RoiAlignShape& s, DType dt, Layout layout) {
  GappedView g;
  const std::int64_t N = s.N, C = s.C, H = s.H, W = s.W;
  if (layout == Layout::kNCHW) {
    g.storage = Tensor::empty({N, C, H, W + 3}, dt);
    g.view = TensorView(g.storage.view().data, dt, Device::cpu(), {N, C, H, W}, {C * H * (W + 3), H * (W + 3), W + 3, 1});
  } else {
    g.storage = Tensor::empty({N, H, W, C + 5}, dt);
    g.view = TensorView(g.storage.view().data, dt, Device::cpu(), {N, C, H, W}, {H * W * (C + 5), 1, W * (C + 5), C + 5});
  }
  g.storage.fill_bytes(0xA5);
  return g;
}

/// Drops every roi (K = 0): each mode then only zero-fills grad_input.
void make_empty(Case& c, DType dt, Layout layout) {
  const auto& s = c.shape;
  c.rois = Tensor::empty({0, 5}, DType::kFloat32);
  c.grad_output = Tensor::empty({0, s.C, s.PH, s.PW}, dt, Device::cpu(), layout);
  if (c.opt.pool_mode == PoolMode::kMax)
    c.argmax = Tensor::empty({0, s.C, s.PH, s.PW}, DType::kInt32, Device::cpu(), layout);
  c.shape.K = 0;
}

template <class T>
void check_gapped(DType dt, Layout layout, PoolMode pool, std::int64_t sr, bool empty) {
  Case c = make_case(dt, layout, pool, sr, true);
  if (empty) make_empty(c, dt, layout);
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
    const GappedView got = gapped(c.shape, dt, layout), want = gapped(c.shape, dt, layout);
    RoiAlignBackwardOptions b;
    b.mode = m.mode;
    b.truncation = m.format;
    roi_align_backward(c.grad_output, c.rois, got.view, c.opt, b, ctx, c.argmax);
    emulate_backward_into(c, want.view, m.mode, m.format);
    EXPECT_TRUE(test::same_bytes(got.storage, want.storage))
        << to_string(m.mode) << (m.format == TruncationFormat::kBFloat16 ? " (bfloat16 rounding)" : "");
    // the comparison sees the gaps: they must still hold the poison, and some element must not
    const auto* bytes = static_cast<const unsigned char*>(got.storage.view().data);
    EXPECT_EQ(bytes[got.storage.nbytes() - 1], 0xA5) << "a gap was written";
    EXPECT_FALSE(test::same_bytes(got.storage, gapped(c.shape, dt, layout).storage)) << "nothing was written";
  }
}

TEST(RoiAlignEmulated, StridedGradInputGetsTheKernelBits) {
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
      for (std::int64_t sr : {0, 2})
        for (bool empty : {false, true}) {
          SCOPED_TRACE(::testing::Message() << (layout == Layout::kNHWC ? "nhwc " : "nchw ") << to_string(pool)
                                            << " sr " << sr << (empty ? " K=0" : ""));
          check_gapped<float>(DType::kFloat32, layout, pool, sr, empty);
          check_gapped<double>(DType::kFloat64, layout, pool, sr, empty);
          check_gapped<Half>(DType::kFloat16, layout, pool, sr, empty);
          check_gapped<BFloat16>(DType::kBFloat16, layout, pool, sr, empty);
        }
}

/// init_slots_kernel's body over a workspace of 0xA5 bytes: every field of every slot gets the
/// documented value (sentinel key, own id, zero weight and offsets, sample -1), byte for byte.
template <class A>
void check_init_slots() {
  constexpr std::int64_t cap = 37;
  const std::uint64_t sentinel = 12345;
  std::vector<std::uint64_t> keys(cap);
  std::vector<std::int64_t> ids(cap), go(cap), am(cap);
  std::vector<A> w(cap);
  std::vector<std::int32_t> smp(cap);
  for (auto* v : {static_cast<void*>(keys.data()), static_cast<void*>(ids.data()), static_cast<void*>(go.data()),
                  static_cast<void*>(am.data())})
    std::memset(v, 0xA5, cap * 8);
  std::memset(w.data(), 0xA5, cap * sizeof(A));
  std::memset(smp.data(), 0xA5, cap * 4);
  const detail::ExactRecords<A> rec{keys.data(), ids.data(), w.data(), go.data(), am.data(), smp.data()};
  for (std::int64_t j = 0; j < cap; ++j) detail::roi_align_exact_init_slot(j, rec, sentinel);
  std::vector<std::int64_t> want_ids(cap);
  std::iota(want_ids.begin(), want_ids.end(), 0);
  EXPECT_EQ(keys, std::vector<std::uint64_t>(cap, sentinel));
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

/// Rows the roi check rejects, each for another reason, at rows 3, 9, 14, 20 and 31 (31: a grid
/// over max_samples_per_roi, adaptive sampling only). Returns how many rows are bad.
int corrupt_rois(Case& c, std::int64_t max_samples) {
  std::vector<double> r = test::to_vector(c.rois);
  r[3 * 5 + 0] = 0.5;                                       // batch index not an integer
  r[9 * 5 + 0] = 2;                                         // batch index out of range (N = 2)
  r[14 * 5 + 2] = std::numeric_limits<double>::quiet_NaN();  // coordinate not finite
  r[20 * 5 + 3] = std::numeric_limits<double>::infinity();
  r[31 * 5 + 1] = -500, r[31 * 5 + 2] = -500, r[31 * 5 + 3] = 3000, r[31 * 5 + 4] = 3000;  // a huge roi
  c.rois = make_tensor({c.shape.K, 5}, DType::kFloat32, r);
  c.opt.max_samples_per_roi = c.shape.max_samples_per_roi = max_samples;
  return c.shape.sampling_ratio > 0 ? 4 : 5;
}

template <class A>
void check_roi_bodies(DType dt, std::int64_t sr) {
  Case c = make_case(dt, Layout::kNCHW, PoolMode::kAvg, sr, true);
  const int bad_rows = corrupt_rois(c, 4000);
  const auto& s = c.shape;
  const detail::RoiSource rois{c.rois.view().data, DType::kFloat32, 5, 1};
  // check_kernel's body, threads in reverse order: the smallest bad row must win anyway
  unsigned long long first_bad = static_cast<unsigned long long>(s.K), first_bad_no_counts = first_bad;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(s.K), -1), counted(static_cast<std::size_t>(s.K + 1), -1);
  for (std::int64_t k = s.K - 1; k >= 0; --k) {
    detail::roi_align_check_element<A>(k, rois, s, counts.data(), [&](std::int64_t bad) {
      first_bad = std::min(first_bad, static_cast<unsigned long long>(bad));
    });
    detail::roi_align_check_element<A>(k, rois, s, nullptr, [&](std::int64_t bad) {
      first_bad_no_counts = std::min(first_bad_no_counts, static_cast<unsigned long long>(bad));
    });
  }
  for (std::int64_t k = 0; k < s.K + 1; ++k) detail::roi_align_count_element<A>(k, rois, s, counted.data());
  // the CPU backend's check of the same call
  const internal::RoiAlignCall call{"test", c.input.view(), c.rois.view(), c.grad_output.view(), TensorView{}, s, false};
  const internal::RoiCheck cpu = internal::kRoiAlignCpu.check_rois(call, true, Context{});
  EXPECT_EQ(cpu.bad_row, 3);
  EXPECT_EQ(static_cast<std::int64_t>(first_bad), cpu.bad_row);
  EXPECT_EQ(static_cast<std::int64_t>(first_bad_no_counts), cpu.bad_row);
  std::int64_t total = 0, zeros = 0;
  for (std::int64_t k = 0; k < s.K; ++k) {
    EXPECT_EQ(counts[k], counted[k]) << "roi " << k;
    total += counts[k];
    zeros += counts[k] == 0;
  }
  EXPECT_EQ(counted[s.K], 0);
  EXPECT_EQ(zeros, bad_rows);
  EXPECT_EQ(total, cpu.total_samples);
}

TEST(RoiAlignEmulated, RoiCheckAndCountBodiesMatchCpuBackend) {
  for (std::int64_t sr : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "sr " << sr);
    check_roi_bodies<float>(DType::kFloat32, sr);
    check_roi_bodies<double>(DType::kFloat64, sr);
  }
}

/// check_rois = false: invalid rows pool to zero and contribute nothing. Exact mode with a fixed
/// sampling ratio then has slots no roi fills (init_slots_kernel's sentinels); adaptive sampling
/// sizes them from the counts.
template <class T>
void check_unchecked(DType dt, Layout layout, PoolMode pool, std::int64_t sr) {
  Case c = make_case(dt, layout, pool, sr, true);  // argmax from the valid rois
  corrupt_rois(c, 4000);
  c.opt.check_rois = false;
  Context ctx;
  ctx.num_threads = 2;
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    Tensor gi = Tensor::empty({c.shape.N, c.shape.C, c.shape.H, c.shape.W}, dt, Device::cpu(), layout);
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_backward(c.grad_output, c.rois, gi, c.opt, b, ctx, c.argmax);
    EXPECT_TRUE(test::same_bytes(gi, emulate_backward(c, dt, layout, mode))) << to_string(mode);
  }
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
  Tensor am = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, DType::kInt32, Device::cpu(), layout);
  roi_align_forward(c.input, c.rois, out, c.opt, ctx, pool == PoolMode::kMax ? am.view() : TensorView{});
  EXPECT_TRUE(test::same_bytes(out, emulate_forward<T>(c, dt, layout))) << "forward";
}

TEST(RoiAlignEmulated, UncheckedInvalidRowsGiveTheKernelBits) {
  for (Layout layout : {Layout::kNCHW, Layout::kNHWC})
    for (PoolMode pool : {PoolMode::kAvg, PoolMode::kMax})
      for (std::int64_t sr : {0, 2}) {
        SCOPED_TRACE(::testing::Message() << (layout == Layout::kNHWC ? "nhwc " : "nchw ") << to_string(pool)
                                          << " sr " << sr);
        check_unchecked<float>(DType::kFloat32, layout, pool, sr);
        check_unchecked<double>(DType::kFloat64, layout, pool, sr);
        check_unchecked<Half>(DType::kFloat16, layout, pool, sr);
      }
}

INSTANTIATE_TEST_SUITE_P(
    All, RoiAlignEmulatedGrid,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(Layout::kNCHW, Layout::kNHWC), ::testing::Values(PoolMode::kAvg, PoolMode::kMax),
                       ::testing::Values<std::int64_t>(0, 2), ::testing::Bool()),
    case_name);

}  // namespace
}  // namespace detops
