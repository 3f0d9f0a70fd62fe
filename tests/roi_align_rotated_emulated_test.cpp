// The CUDA kernels' per-thread bodies of RoIAlignRotated (detail/roi_align_rotated_kernels.h and
// the engine's), run on the CPU over an emulated grid (every thread index, in order, in both
// thread orders), against the CPU backend byte for byte: forward, the atomic and truncated
// scatters (with the CPU's add: per element the same order of adds), the exact mode's three
// phases as the launcher sequences them (std::stable_sort in place of CUB's stable radix sort),
// the float64 truncated mode's phases, and the roi check. The exact phases run per chunk of whole
// images as the launcher plans them (one chunk here) and in chunks of one image, with the same
// bytes. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "detops/detail/roi_align_rotated_kernels.h"
#include "internal/roi_align_rotated_backend.h"
#include "test_util.h"

namespace detops {
namespace {

using test::make_tensor;

detail::Strides4 st(const TensorView& v) { return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]}; }

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

template <class T>
Tensor emulate_forward(const Case& c, DType dt, Layout layout, bool channels_last_threads) {
  Tensor out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
  detail::RotatedForwardArgs<T> a{};
  a.input = c.input.data<T>();
  a.in = st(c.input);
  a.rois = c.source();
  a.output = out.data<T>();
  a.out = st(out);
  a.shape = c.shape;
  a.channels_last = channels_last_threads;
  for (std::int64_t i = 0; i < out.numel(); ++i) detail::roi_align_rotated_forward_element(i, a);
  return out;
}

/// The launcher's atomic (rounding kNone) and truncated paths: zero fill, the scatter body over
/// the grid (the CPU's add in place of atomicAdd), and for truncated the dense double sums
/// rounded once (cast kernel's body).
template <class T>
Tensor emulate_scatter(const Case& c, DType dt, Layout layout, detail::GradRounding rounding, bool channels_last_threads) {
  const auto& s = c.shape;
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  T* p = gi.data<T>();
  const detail::Strides4 gs = st(gi);
  const std::int64_t total = s.N * s.C * s.H * s.W;
  detail::RotatedBackwardArgs<T> a{};
  a.grad_output = c.grad_output.data<T>();
  a.go = st(c.grad_output);
  a.rois = c.source();
  a.shape = s;
  a.channels_last = channels_last_threads;
  if (rounding == detail::GradRounding::kNone) {
    for (std::int64_t i = 0; i < total; ++i) detail::fill_zero_element(i, p, gs, s.C, s.H, s.W);
    a.gi = gs;
    for (std::int64_t i = 0; i < c.grad_output.numel(); ++i)
      detail::roi_align_rotated_backward_scatter_element<T, acc_t<T>>(
          i, a, rounding, [p](std::int64_t off, acc_t<T> v) { p[off] = from_acc<T>(to_acc(p[off]) + v); });
    return gi;
  }
  std::vector<double> buf(static_cast<std::size_t>(total), 0.0);
  a.gi = {s.C * s.H * s.W, s.H * s.W, s.W, 1};
  for (std::int64_t i = 0; i < c.grad_output.numel(); ++i)
    detail::roi_align_rotated_backward_scatter_element<T, double>(i, a, rounding,
                                                                  [&buf](std::int64_t off, double v) { buf[off] += v; });
  for (std::int64_t i = 0; i < total; ++i) detail::roi_align_truncated_store_element(i, buf.data(), p, gs, s.C, s.H, s.W);
  return gi;
}

/// The roi check as the CUDA launcher runs it for the backward (need_total): the check body over
/// every roi with per-roi counts and per-image sums, then the device reductions (sum, max).
internal::RotatedRoiCheck emulate_check(const Case& c) {
  const auto& s = c.shape;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(s.K), -1), images(static_cast<std::size_t>(s.N), 0);
  for (std::int64_t k = s.K - 1; k >= 0; --k)  // threads in reverse order: the sums are integers
    detail::roi_align_rotated_check_element<float>(
        k, c.source(), s, counts.data(), [](std::int64_t) { ADD_FAILURE() << "no bad row here"; },
        [&images](std::int64_t n, std::int64_t v) { images[static_cast<std::size_t>(n)] += v; });
  internal::RotatedRoiCheck check;
  check.total_samples = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  check.max_image_samples = *std::max_element(images.begin(), images.end());
  return check;
}

/// The exact mode's phases as the CUDA launcher runs them, one chunk of whole images at a time
/// (`chunk_images` per chunk, 0: the launcher's plan, rotated_exact_chunks; records of a chunk
/// sized to the plan's capacity); with `rounding` the float64 truncated mode's (divisors, the
/// scatter's contributions summed in double).
template <class T>
Tensor emulate_exact(const Case& c, DType dt, Layout layout, bool channels_last_threads,
                     detail::GradRounding rounding = detail::GradRounding::kNone, std::int64_t chunk_images = 0) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const auto& s = c.shape;
  const detail::RoiSource rois = c.source();
  Tensor gi = Tensor::empty({s.N, s.C, s.H, s.W}, dt, Device::cpu(), layout);
  const std::int64_t total = s.N * s.C * s.H * s.W;
  for (std::int64_t i = 0; i < total; ++i) detail::fill_zero_element(i, gi.data<T>(), st(gi), s.C, s.H, s.W);
  internal::RotatedExactChunks ch = internal::rotated_exact_chunks(s, emulate_check(c));
  if (chunk_images > 0) {  // the largest such chunk's records
    ch.images = chunk_images;
    ch.positions = chunk_images * s.H * s.W;
    ch.records = 0;
    for (std::int64_t n0 = 0; n0 < s.N; n0 += chunk_images) {
      std::int64_t samples = 0;
      for (std::int64_t k = 0; k < s.K; ++k)
        samples += detail::rotated_sample_count<A>(rois, k, s, {n0, std::min(s.N, n0 + chunk_images)});
      ch.records = std::max(ch.records, 4 * samples);
    }
  }
  const std::int64_t cap = ch.records;
  const std::uint64_t sentinel = static_cast<std::uint64_t>(ch.positions);
  std::vector<std::uint64_t> keys(static_cast<std::size_t>(cap));
  std::vector<std::int64_t> ids(keys.size()), sources(keys.size()), sorted_sources(keys.size());
  std::vector<A> weights(keys.size()), sorted_weights(keys.size());
  std::vector<double> divisors(truncated ? keys.size() : 0, 0.0), sorted_divisors(divisors.size());
  const detail::GatherRecords<A> rec{keys.data(), ids.data(), weights.data(), sources.data()};
  for (std::int64_t n0 = 0; n0 < s.N; n0 += ch.images) {
    const detail::ImageRange images{n0, std::min(s.N, n0 + ch.images)};
    // count kernel over K + 1 entries, then CUB's exclusive scan
    std::vector<std::int64_t> counts(static_cast<std::size_t>(s.K + 1), -7), offsets(counts.size(), 0);
    for (std::int64_t k = 0; k < s.K + 1; ++k)
      detail::roi_align_rotated_count_element<A>(k, rois, s, images, counts.data());
    std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), std::int64_t{0});
    EXPECT_LE(4 * offsets.back(), cap);
    for (std::int64_t j = 0; j < cap; ++j) detail::gather_init_record(j, rec, sentinel);
    std::fill(divisors.begin(), divisors.end(), 0.0);
    const detail::RotatedEnumerateArgs<A> ea{rois, offsets.data(), s, st(c.grad_output), rec, images,
                                             truncated ? divisors.data() : nullptr};
    for (std::int64_t t = 0; t < s.K * s.PH * s.PW; ++t) detail::roi_align_rotated_enumerate_bin(t, ea);
    // CUB's stable radix sort of (key, id) pairs, the engine's permutation, run-length encode + scan
    std::vector<std::int64_t> order(keys.size());
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return keys[a] < keys[b]; });
    std::vector<std::int64_t> sorted_ids(order.size());
    for (std::size_t r = 0; r < order.size(); ++r) sorted_ids[r] = ids[static_cast<std::size_t>(order[r])];
    for (std::int64_t r = 0; r < cap; ++r)
      detail::gather_permute_record(r, sorted_ids.data(), weights.data(), sources.data(), sorted_weights.data(),
                                    sorted_sources.data());
    std::vector<std::uint64_t> run_keys;
    std::vector<std::int64_t> run_offsets, run_lengths;
    for (std::int64_t r = 0; r < cap;) {
      std::int64_t e = r + 1;
      while (e < cap && keys[static_cast<std::size_t>(order[e])] == keys[static_cast<std::size_t>(order[r])]) ++e;
      run_keys.push_back(keys[static_cast<std::size_t>(order[r])]);  // the sentinel's run included, as CUB's
      run_offsets.push_back(r);
      run_lengths.push_back(e - r);
      r = e;
    }
    const auto runs = static_cast<std::int64_t>(run_keys.size());
    const detail::GatherSorted<A> sorted{run_keys.data(), run_offsets.data(), run_lengths.data(),
                                         sorted_weights.data(), sorted_sources.data()};
    const auto args = detail::rotated_gather_sum_args<T>(sorted, c.grad_output.data<T>(),
                                                         c.grad_output.view().strides[1],
                                                         gi.data<T>() + n0 * gi.view().strides[0],
                                                         gi.view().strides[1], s.C, sentinel);
    const detail::RoiGatherTarget target{st(gi), s.H, s.W};
    if constexpr (std::is_same_v<T, double>) {
      if (truncated) {
        for (std::int64_t r = 0; r < cap; ++r)
          detail::roi_align_rotated_permute_divisor(r, sorted_ids.data(), divisors.data(), sorted_divisors.data());
        const detail::RotatedTruncatedArgs ta{args, sorted_divisors.data(), target, rounding};
        for (std::int64_t t = 0; t < runs * s.C; ++t)
          detail::roi_align_rotated_truncated_gather_element(t, ta, channels_last_threads, runs);
        continue;
      }
    }
    for (std::int64_t t = 0; t < runs * s.C; ++t)
      detail::gather_run_element(t, args, runs, channels_last_threads, target);
  }
  return gi;
}

template <class T>
void check_all(const Param& param) {
  const auto [dt, layout, sr, aligned] = param;
  const Case c = make_case(dt, layout, sr, aligned);
  Tensor cpu_out = Tensor::empty({c.shape.K, c.shape.C, 5, 4}, dt, Device::cpu(), layout);
  roi_align_rotated_forward(c.input, c.rois, cpu_out, c.opt);
  for (bool cl : {false, true}) {
    SCOPED_TRACE(cl ? "channel-fastest threads" : "pw-fastest threads");
    EXPECT_TRUE(test::same_bytes(emulate_forward<T>(c, dt, layout, cl), cpu_out));
    for (BackwardMode mode : {BackwardMode::kAtomic, BackwardMode::kTruncated, BackwardMode::kExact}) {
      SCOPED_TRACE(to_string(mode));
      Tensor cpu_gi = Tensor::empty({c.shape.N, c.shape.C, c.shape.H, c.shape.W}, dt, Device::cpu(), layout);
      RoiAlignBackwardOptions b;
      b.mode = mode;
      roi_align_rotated_backward(c.grad_output, c.rois, cpu_gi, c.opt, b);
      const bool phases = mode == BackwardMode::kExact || (mode == BackwardMode::kTruncated && dt == DType::kFloat64);
      if (!phases) {
        EXPECT_TRUE(test::same_bytes(emulate_scatter<T>(c, dt, layout, mode == BackwardMode::kTruncated
                                                                             ? detail::GradRounding::kFloat16
                                                                             : detail::GradRounding::kNone, cl),
                                     cpu_gi));
        continue;
      }
      // CUDA runs the exact phases (float64 truncated: with divisors), as planned and per image
      const detail::GradRounding r = mode == BackwardMode::kExact ? detail::GradRounding::kNone
                                                                  : detail::GradRounding::kFloat16;
      EXPECT_TRUE(test::same_bytes(emulate_exact<T>(c, dt, layout, cl, r), cpu_gi));
      EXPECT_TRUE(test::same_bytes(emulate_exact<T>(c, dt, layout, cl, r, 1), cpu_gi)) << "chunks of one image";
    }
  }
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

}  // namespace
}  // namespace detops
