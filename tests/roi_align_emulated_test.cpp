// The CUDA kernels' per-thread bodies, run on the CPU over an emulated grid (every thread index,
// in order), against the CPU backend. The CPU backend uses its own loop structure, so agreement
// to the bit checks both the kernels' indexing and the claim that the two backends evaluate the
// same arithmetic. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>

#include "detops/detail/roi_align_kernels.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;

detail::Strides4 st(const TensorView& v) { return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]}; }

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

template <class T>
Tensor emulate_forward(const Case& c, DType dt, Layout layout, bool channels_last_threads, Tensor* argmax = nullptr) {
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
  Tensor am = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, DType::kInt32, Device::cpu(), layout);
  if (argmax) *argmax = am;
  detail::ForwardArgs<T> a{};
  a.input = c.input.data<T>();
  a.in = st(c.input);
  a.rois = {c.rois.view().data, DType::kFloat32, 5, 1};
  a.output = out.data<T>();
  a.out = st(out);
  a.argmax = am.data<std::int32_t>();
  a.am = st(am);
  a.shape = c.shape;
  a.max_pool = c.opt.pool_mode == PoolMode::kMax;
  a.channels_last = channels_last_threads;
  for (std::int64_t i = 0; i < out.numel(); ++i) detail::roi_align_forward_element(i, a);
  return out;
}

/// The scatter body in thread order (k, c, ph, pw): per plane, the same order of adds as the
/// CPU backend's per-channel loop, so the atomic and truncated results agree bit for bit.
template <class T>
Tensor emulate_scatter(const Case& c, DType dt, Layout layout, detail::GradRounding rounding) {
  const auto& s = c.shape;
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  detail::BackwardArgs<T> a{};
  a.grad_output = c.grad_output.data<T>();
  a.go = st(c.grad_output);
  a.rois = {c.rois.view().data, DType::kFloat32, 5, 1};
  a.argmax = c.argmax.data<std::int32_t>();
  a.am = c.argmax.numel() ? st(c.argmax) : detail::Strides4{0, 0, 0, 0};
  a.shape = s;
  a.max_pool = c.opt.pool_mode == PoolMode::kMax;
  a.channels_last = false;
  if (rounding == detail::GradRounding::kNone) {
    std::fill(gi.data<T>(), gi.data<T>() + gi.numel(), from_acc<T>(acc_t<T>(0)));
    a.gi = st(gi);
    T* p = gi.data<T>();
    for (std::int64_t i = 0; i < c.grad_output.numel(); ++i)
      detail::roi_align_backward_scatter_element<T, acc_t<T>>(
          i, a, detail::GradRounding::kNone, [p](std::int64_t off, acc_t<T> v) {
            p[off] = from_double<T>(static_cast<double>(static_cast<acc_t<T>>(to_acc(p[off])) + v));
          });
    return gi;
  }
  std::vector<double> buf(static_cast<std::size_t>(s.N * s.C * s.H * s.W), 0.0);
  a.gi = {s.C * s.H * s.W, s.H * s.W, s.W, 1};
  for (std::int64_t i = 0; i < c.grad_output.numel(); ++i)
    detail::roi_align_backward_scatter_element<T, double>(i, a, rounding,
                                                          [&buf](std::int64_t off, double v) { buf[off] += v; });
  test::fill_from(gi, std::vector<double>(buf.size()));  // zero, then exact values below
  const TensorView& v = gi.view();
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t ch = 0; ch < s.C; ++ch)
      for (std::int64_t y = 0; y < s.H; ++y)
        for (std::int64_t x = 0; x < s.W; ++x)
          gi.data<T>()[n * v.strides[0] + ch * v.strides[1] + y * v.strides[2] + x * v.strides[3]] =
              from_double<T>(buf[static_cast<std::size_t>(((n * s.C + ch) * s.H + y) * s.W + x)]);
  return gi;
}

/// The three exact-mode phases as the CUDA launcher sequences them, with std::stable_sort in
/// place of CUB's (stable) radix sort.
template <class T>
Tensor emulate_exact(const Case& c, DType dt, Layout layout, bool channels_last_threads) {
  using A = acc_t<T>;
  const auto& s = c.shape;
  const detail::RoiSource rois{c.rois.view().data, DType::kFloat32, 5, 1};
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(s.K + 1), 0);
  for (std::int64_t k = 0; k < s.K; ++k) offsets[k + 1] = offsets[k] + detail::roi_sample_count<A>(rois, k, s);
  const std::int64_t cap = 4 * offsets[s.K];
  const std::uint64_t sentinel = static_cast<std::uint64_t>(s.N * s.H * s.W);
  std::vector<std::uint64_t> keys(cap, sentinel);
  std::vector<std::int64_t> ids(cap), go(cap), am(cap), sgo(cap), sam(cap);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<A> w(cap), sw(cap);
  std::vector<std::int32_t> smp(cap), ssmp(cap);
  detail::ExactRecords<A> rec{keys.data(), ids.data(), w.data(), go.data(), am.data(), smp.data()};
  detail::EnumerateArgs<A> ea{rois, offsets.data(), s, c.opt.pool_mode == PoolMode::kMax, st(c.grad_output),
                              c.argmax.numel() ? st(c.argmax) : detail::Strides4{0, 0, 0, 0}, rec};
  for (std::int64_t t = 0; t < s.K * s.PH * s.PW; ++t) detail::roi_align_exact_enumerate_bin(t, ea);
  std::vector<std::int64_t> sorted(ids);
  std::stable_sort(sorted.begin(), sorted.end(), [&](std::int64_t a, std::int64_t b) { return keys[a] < keys[b]; });
  detail::ExactRecords<A> to{nullptr, nullptr, sw.data(), sgo.data(), sam.data(), ssmp.data()};
  for (std::int64_t r = 0; r < cap; ++r) detail::roi_align_exact_permute(r, sorted.data(), rec, to);
  std::vector<std::uint64_t> run_keys;
  std::vector<std::int64_t> run_offsets, run_lengths;
  for (std::int64_t r = 0; r < cap; ++r) {
    if (r == 0 || keys[sorted[r]] != keys[sorted[r - 1]]) {
      run_keys.push_back(keys[sorted[r]]);
      run_offsets.push_back(r);
      run_lengths.push_back(0);
    }
    ++run_lengths.back();
  }
  Tensor gi = Tensor::zeros({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  detail::GatherArgs<T> ga{};
  ga.run_keys = run_keys.data();
  ga.run_offsets = run_offsets.data();
  ga.run_lengths = run_lengths.data();
  ga.weights = sw.data();
  ga.go_offsets = sgo.data();
  ga.am_offsets = sam.data();
  ga.samples = ssmp.data();
  ga.grad_output = c.grad_output.data<T>();
  ga.go_c = c.grad_output.view().strides[1];
  ga.argmax = c.argmax.data<std::int32_t>();
  ga.am_c = c.argmax.numel() ? c.argmax.view().strides[1] : 0;
  ga.grad_input = gi.data<T>();
  ga.gi = st(gi);
  ga.shape = s;
  ga.max_pool = c.opt.pool_mode == PoolMode::kMax;
  const std::int64_t runs = static_cast<std::int64_t>(run_keys.size());
  for (std::int64_t t = 0; t < runs * s.C; ++t) detail::roi_align_exact_gather_element(t, ga, channels_last_threads, runs);
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
  const Tensor expected = emulate_forward<T>(c, dt, Layout::kNCHW, false);
  const Tensor expected_atomic = emulate_scatter<T>(c, dt, Layout::kNCHW, detail::GradRounding::kNone);
  const Tensor expected_truncated = emulate_scatter<T>(c, dt, Layout::kNCHW, detail::GradRounding::kFloat16);
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
  for (bool cl : {false, true}) EXPECT_TRUE(test::same_bytes(out, emulate_forward<T>(c, dt, layout, cl))) << "forward";
  // backward, each mode
  for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
    Tensor gi = Tensor::empty({c.shape.N, c.shape.C, c.shape.H, c.shape.W}, dt, Device::cpu(), layout);
    RoiAlignBackwardOptions b;
    b.mode = mode;
    roi_align_backward(c.grad_output, c.rois, gi, c.opt, b, ctx, c.argmax);
    if (mode == BackwardMode::kExact) {
      for (bool cl : {false, true}) EXPECT_TRUE(test::same_bytes(gi, emulate_exact<T>(c, dt, layout, cl))) << "exact";
    } else {
      EXPECT_TRUE(test::same_bytes(gi, emulate_scatter<T>(c, dt, layout, mode == BackwardMode::kAtomic ? detail::GradRounding::kNone : detail::GradRounding::kFloat16)))
          << to_string(mode);
    }
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
  const Tensor want = emulate_forward<T>(c, dt, layout, layout == Layout::kNHWC, &want_am);
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

INSTANTIATE_TEST_SUITE_P(
    All, RoiAlignEmulatedGrid,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(Layout::kNCHW, Layout::kNHWC), ::testing::Values(PoolMode::kAvg, PoolMode::kMax),
                       ::testing::Values<std::int64_t>(0, 2), ::testing::Bool()),
    case_name);

}  // namespace
}  // namespace detops
