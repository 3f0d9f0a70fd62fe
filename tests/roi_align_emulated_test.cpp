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
#include <type_traits>

#include "detops/detail/roi_align_kernels.h"
#include "internal/roi_align_backend.h"
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

/// The CUDA launcher's atomic and truncated paths into grad_input `gi` (any strides, gaps kept):
/// the zero fill (fill_zero_kernel's body), the scatter body in thread order (k, c, ph, pw): per
/// plane, the same order of adds as the CPU backend's per-channel loop, so the atomic and
/// truncated results agree bit for bit; and for truncated the dense double sums rounded once
/// (cast_kernel's body).
template <class T>
void emulate_scatter_into(const Case& c, const TensorView& gi, detail::GradRounding rounding) {
  const auto& s = c.shape;
  T* p = static_cast<T*>(gi.data);
  const detail::Strides4 gs = st(gi);
  const std::int64_t total = s.N * s.C * s.H * s.W;
  detail::BackwardArgs<T> a{};
  a.grad_output = c.grad_output.data<T>();
  a.go = st(c.grad_output);
  a.rois = {c.rois.view().data, DType::kFloat32, 5, 1};
  a.argmax = c.argmax.data<std::int32_t>();
  a.am = c.argmax.numel() ? st(c.argmax) : detail::Strides4{0, 0, 0, 0};
  a.shape = s;
  a.max_pool = c.opt.pool_mode == PoolMode::kMax;
  a.channels_last = false;
  if (rounding == detail::GradRounding::kNone || s.K == 0) {  // the launcher zero-fills first (or only)
    for (std::int64_t i = 0; i < total; ++i) detail::fill_zero_element(i, p, gs, s.C, s.H, s.W);
    if (s.K == 0) return;
  }
  if (rounding == detail::GradRounding::kNone) {
    a.gi = gs;
    for (std::int64_t i = 0; i < c.grad_output.numel(); ++i)
      detail::roi_align_backward_scatter_element<T, acc_t<T>>(
          i, a, detail::GradRounding::kNone, [p](std::int64_t off, acc_t<T> v) {
            p[off] = from_double<T>(static_cast<double>(static_cast<acc_t<T>>(to_acc(p[off])) + v));
          });
    return;
  }
  std::vector<double> buf(static_cast<std::size_t>(total), 0.0);
  a.gi = {s.C * s.H * s.W, s.H * s.W, s.W, 1};
  for (std::int64_t i = 0; i < c.grad_output.numel(); ++i)
    detail::roi_align_backward_scatter_element<T, double>(i, a, rounding,
                                                          [&buf](std::int64_t off, double v) { buf[off] += v; });
  // cast_kernel's body over its grid: the dense NCHW sums rounded once into grad_input's layout
  for (std::int64_t i = 0; i < total; ++i) detail::roi_align_truncated_store_element(i, buf.data(), p, gs, s.C, s.H, s.W);
}

template <class T>
Tensor emulate_scatter(const Case& c, DType dt, Layout layout, detail::GradRounding rounding) {
  const auto& s = c.shape;
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  emulate_scatter_into<T>(c, gi.view(), rounding);
  return gi;
}

/// The three exact-mode phases as the CUDA launcher sequences them, with std::stable_sort in
/// place of CUB's (stable) radix sort. With `rounding` (kFloat16, kBFloat16): the float64
/// truncated mode's variant (divisors, truncated contributions summed in double).
template <class T>
void emulate_exact_into(const Case& c, const TensorView& gi, bool channels_last_threads,
                        detail::GradRounding rounding = detail::GradRounding::kNone) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const auto& s = c.shape;
  const detail::RoiSource rois{c.rois.view().data, DType::kFloat32, 5, 1};
  // count_kernel's body over its grid (K + 1 entries), then the exclusive scan CUB does
  std::vector<std::int64_t> counts(static_cast<std::size_t>(s.K + 1), -7), offsets(counts.size(), 0);
  for (std::int64_t k = 0; k < s.K + 1; ++k) detail::roi_align_count_element<A>(k, rois, s, counts.data());
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), std::int64_t{0});
  // The CUDA launcher's capacity: with a fixed sampling ratio every roi's slots, invalid rows'
  // included (unchecked calls), which then stay as init_slots_kernel left them.
  const std::int64_t cap = s.sampling_ratio > 0 ? 4 * s.K * s.PH * s.PW * s.sampling_ratio * s.sampling_ratio
                                                : 4 * offsets[s.K];
  const std::uint64_t sentinel = static_cast<std::uint64_t>(s.N * s.H * s.W);
  // Garbage first (as in a reused workspace): init_slots_kernel's body must define every field.
  std::vector<std::uint64_t> keys(cap, 0x5a5a5a5a5a5aull);
  std::vector<std::int64_t> ids(cap, -3), go(cap, -3), am(cap, -3), sgo(cap), sam(cap);
  std::vector<A> w(cap, A(-5)), sw(cap);
  std::vector<std::int32_t> smp(cap, 77), ssmp(cap);
  std::vector<double> div(cap, -9.0), sdiv(cap);
  detail::ExactRecords<A> rec{keys.data(), ids.data(), w.data(), go.data(), am.data(), smp.data(),
                              truncated ? div.data() : nullptr};
  for (std::int64_t j = 0; j < cap; ++j) detail::roi_align_exact_init_slot(j, rec, sentinel);
  detail::EnumerateArgs<A> ea{rois, offsets.data(), s, c.opt.pool_mode == PoolMode::kMax, st(c.grad_output),
                              c.argmax.numel() ? st(c.argmax) : detail::Strides4{0, 0, 0, 0}, rec};
  for (std::int64_t t = 0; t < s.K * s.PH * s.PW; ++t) detail::roi_align_exact_enumerate_bin(t, ea);
  std::vector<std::int64_t> sorted(ids);
  std::stable_sort(sorted.begin(), sorted.end(), [&](std::int64_t a, std::int64_t b) { return keys[a] < keys[b]; });
  detail::ExactRecords<A> to{nullptr, nullptr, sw.data(), sgo.data(), sam.data(), ssmp.data(),
                             truncated ? sdiv.data() : nullptr};
  // the engine's permute_records_kernel, then RoIAlign's permute_extras_kernel
  for (std::int64_t r = 0; r < cap; ++r) {
    detail::gather_permute_record(r, sorted.data(), rec.weights, rec.go_offsets, to.weights, to.go_offsets);
    detail::roi_align_permute_extras(r, sorted.data(), rec, to);
  }
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
  // zero_fill: a memset when dense (the same bytes), fill_zero_kernel's body otherwise
  for (std::int64_t i = 0; i < s.N * s.C * s.H * s.W; ++i)
    detail::fill_zero_element(i, static_cast<T*>(gi.data), st(gi), s.C, s.H, s.W);
  if (cap == 0 || s.K == 0) return;
  detail::GatherArgs<T> ga{};
  ga.sorted = {run_keys.data(), run_offsets.data(), run_lengths.data(), sw.data(), sgo.data()};
  ga.grad_output = c.grad_output.data<T>();
  ga.go_c = c.grad_output.view().strides[1];
  ga.active = {c.argmax.data<std::int32_t>(), sam.data(), ssmp.data(), c.argmax.numel() ? c.argmax.view().strides[1] : 0,
               c.opt.pool_mode == PoolMode::kMax};
  ga.grad_input = static_cast<T*>(gi.data);
  ga.gi = st(gi);
  ga.shape = s;
  ga.divisors = to.divisors;
  ga.rounding = rounding;
  const std::int64_t runs = static_cast<std::int64_t>(run_keys.size());
  for (std::int64_t t = 0; t < runs * s.C; ++t) {
    if (truncated) detail::roi_align_truncated_gather_element(t, ga, channels_last_threads, runs);
    else  // the engine's run_sums_kernel body, with RoIAlign's target and winner test
      detail::gather_run_element(t, detail::roi_gather_sum_args(ga), runs, channels_last_threads,
                                 detail::roi_gather_target(ga), ga.active);
  }
}

template <class T>
Tensor emulate_exact(const Case& c, DType dt, Layout layout, bool channels_last_threads,
                     detail::GradRounding rounding = detail::GradRounding::kNone) {
  const auto& s = c.shape;
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  emulate_exact_into<T>(c, gi.view(), channels_last_threads, rounding);
  return gi;
}

detail::GradRounding rounding_of(BackwardMode mode, TruncationFormat format) {
  if (mode != BackwardMode::kTruncated) return detail::GradRounding::kNone;
  return format == TruncationFormat::kFloat16 ? detail::GradRounding::kFloat16 : detail::GradRounding::kBFloat16;
}

/// The CUDA launcher's backward, mode by mode: atomic and truncated scatter, except float64
/// truncated, which takes the exact mode's phases with truncated sums; exact.
template <class T>
void emulate_backward_into(const Case& c, const TensorView& gi, BackwardMode mode, TruncationFormat format,
                           bool channels_last_threads) {
  const detail::GradRounding rounding = rounding_of(mode, format);
  if (mode == BackwardMode::kExact || (mode == BackwardMode::kTruncated && std::is_same_v<T, double>))
    emulate_exact_into<T>(c, gi, channels_last_threads, rounding);
  else
    emulate_scatter_into<T>(c, gi, rounding);
}
template <class T>
Tensor emulate_backward(const Case& c, DType dt, Layout layout, BackwardMode mode, bool channels_last_threads,
                        TruncationFormat format = TruncationFormat::kFloat16) {
  const auto& s = c.shape;
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  emulate_backward_into<T>(c, gi.view(), mode, format, channels_last_threads);
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
    for (bool cl : {false, true})
      EXPECT_TRUE(test::same_bytes(gi, emulate_backward<T>(c, dt, layout, mode, cl))) << to_string(mode);
    if (mode == BackwardMode::kTruncated) {
      // Both truncated paths give the CPU's bits, whatever the dtype: the scatter (CUDA's path for
      // 32- and 16-bit) and the slots summed in sorted order (its path for float64).
      EXPECT_TRUE(test::same_bytes(gi, emulate_scatter<T>(c, dt, layout, detail::GradRounding::kFloat16)))
          << "truncated, scatter";
      for (bool cl : {false, true})
        EXPECT_TRUE(test::same_bytes(gi, emulate_exact<T>(c, dt, layout, cl, detail::GradRounding::kFloat16)))
            << "truncated, slots";
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
    emulate_backward_into<T>(c, want.view, m.mode, m.format, layout == Layout::kNHWC);
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
    EXPECT_TRUE(test::same_bytes(gi, emulate_backward<T>(c, dt, layout, mode, layout == Layout::kNHWC)))
        << to_string(mode);
  }
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
  Tensor am = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, DType::kInt32, Device::cpu(), layout);
  roi_align_forward(c.input, c.rois, out, c.opt, ctx, pool == PoolMode::kMax ? am.view() : TensorView{});
  EXPECT_TRUE(test::same_bytes(out, emulate_forward<T>(c, dt, layout, false))) << "forward";
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
