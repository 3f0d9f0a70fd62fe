// The CUDA kernels' per-thread bodies of grid_sample (and of the gather engine's exact phases),
// run on the CPU over an emulated grid (every thread index, in order), byte for byte against the
// CPU backend. The CPU backend uses its own loops (points with channels inside, planes for the
// scatter, the engine's counting sort), so agreement to the bit checks both the kernels' indexing
// and the claim that the two backends evaluate the same arithmetic. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "detops/detail/gather_backward.h"
#include "detops/detail/grid_sample_kernels.h"
#include "detops/detail/strided.h"
#include "grid_sample_test_util.h"
#include "internal/grid_sample_backend.h"

namespace detops {
namespace {

using detail::GridSampleStrides;
using internal::gs_strides;

struct Case {
  test::GridSampleProblem p;
  test::GridSampleTensors t;
  detail::GridSampleShape shape;
};

/// Sizes of a case: [N, C, H, W] sampled at [N, Ho, Wo].
struct Sizes {
  std::int64_t N, C, H, W, Ho, Wo;
};

// By default many points outside a small map: long runs on the border pixels with border padding.
Case make_case(DType dt, DType gdt, Layout layout, const GridSampleOptions& o, const Sizes& z = {2, 5, 6, 7, 9, 11}) {
  Case c;
  c.p = test::make_grid_problem(z.N, z.C, z.H, z.W, z.Ho, z.Wo, o, 500, 2.5);
  c.t = test::grid_tensors(c.p, dt, gdt, layout);
  c.shape = {z.N, z.C, z.H, z.W, z.Ho, z.Wo, o.interpolation == GridSampleInterpolation::kNearest,
             static_cast<int>(o.padding), o.align_corners};
  return c;
}

template <class T>
detail::GridSampleBackwardArgs<T> backward_args(const Case& c, const TensorView& gi, bool channels_last) {
  detail::GridSampleBackwardArgs<T> a{};
  a.g = detail::make_grid_sample_args<T>(c.t.input.data<T>(), gs_strides(c.t.input), c.t.grid.view().data,
                                         c.t.grid.view().dtype, gs_strides(c.t.grid), c.shape);
  a.grad_output = c.t.grad_output.data<T>();
  a.go = gs_strides(c.t.grad_output);
  a.gi = gs_strides(gi);
  a.channels_last = channels_last;
  return a;
}

template <class T>
void check_forward(const Case& c, Layout layout, const std::string& what) {
  const test::GridSampleProblem& p = c.p;
  Tensor want = Tensor::empty({p.N, p.C, p.Ho, p.Wo}, c.t.input.view().dtype, Device::cpu(), layout);
  grid_sample_forward(c.t.input, c.t.grid, want, p.opt);
  for (bool channels_last : {false, true}) {
    Tensor got = Tensor::empty({p.N, p.C, p.Ho, p.Wo}, c.t.input.view().dtype, Device::cpu(), layout);
    detail::GridSampleForwardArgs<T> a{};
    a.g = backward_args<T>(c, got, false).g;
    a.output = got.data<T>();
    a.out = gs_strides(got);
    a.channels_last = channels_last;
    for (std::int64_t t = 0; t < got.numel(); ++t) detail::grid_sample_forward_element(t, a);
    EXPECT_TRUE(test::same_bytes(got, want)) << what << " forward, channels_last threads " << channels_last;
  }
}

/// The CUDA backend's atomic path in thread order: zero_kernel's body over a strided view, then
/// scatter_kernel's body with a plain add rounded per add (what one atomicAdd does).
template <class T>
void check_atomic(const Case& c, Layout layout, const std::string& what) {
  const test::GridSampleProblem& p = c.p;
  Tensor want = Tensor::empty({p.N, p.C, p.H, p.W}, c.t.input.view().dtype, Device::cpu(), layout);
  GridSampleBackwardOptions b;
  b.mode = BackwardMode::kAtomic;
  grid_sample_backward(c.t.grad_output, c.t.input, c.t.grid, want, {}, p.opt, b);
  for (bool channels_last : {false, true}) {
    Tensor got = Tensor::empty({p.N, p.C, p.H, p.W}, c.t.input.view().dtype, Device::cpu(), layout);
    got.fill_bytes(0xCD);
    const GridSampleStrides g = gs_strides(got);
    for (std::int64_t i = 0; i < got.numel(); ++i)
      detail::fill_zero_element(i, got.data<T>(), detail::Strides4{g.s0, g.s1, g.s2, g.s3}, p.C, p.H, p.W);
    const auto a = backward_args<T>(c, got, channels_last);
    T* base = got.data<T>();
    auto add = [base](std::int64_t off, acc_t<T> v) { base[off] = from_acc<T>(to_acc(base[off]) + v); };
    for (std::int64_t t = 0; t < c.t.grad_output.numel(); ++t) detail::grid_sample_scatter_element(t, a, add);
    EXPECT_TRUE(test::same_bytes(got, want)) << what << " atomic, channels_last threads " << channels_last;
  }
}

/// The CUDA backend's exact path: per chunk, enumerate_kernel's body, then the engine's phases as
/// cuda/gather_backward.cuh runs them (init_records_kernel's body, a stable sort standing in for
/// CUB's radix sort, permute_records_kernel's body, run-length encoding with the sentinel's run
/// kept, run_sums_kernel's body over runs x channels in both thread orders).
template <class T>
void check_exact(const Case& c, Layout layout, const std::string& what) {
  using A = acc_t<T>;
  const test::GridSampleProblem& p = c.p;
  Tensor want = Tensor::empty({p.N, p.C, p.H, p.W}, c.t.input.view().dtype, Device::cpu(), layout);
  grid_sample_backward(c.t.grad_output, c.t.input, c.t.grid, want, {}, p.opt, {});
  const std::int64_t images = internal::grid_sample_chunk_images(c.shape);
  const std::int64_t cap = images * internal::grid_sample_image_records(c.shape);
  const auto sentinel = static_cast<std::uint64_t>(images * p.H * p.W);
  for (bool channels_fastest : {false, true}) {
    Tensor got = Tensor::empty({p.N, p.C, p.H, p.W}, c.t.input.view().dtype, Device::cpu(), layout);
    std::memset(got.view().data, 0, got.nbytes());
    const auto a = backward_args<T>(c, got, false);
    std::vector<std::uint64_t> keys(cap), sorted_keys(cap);
    std::vector<std::int64_t> ids(cap), sorted_ids(cap), sources(cap), sorted_sources(cap);
    std::vector<A> weights(cap), sorted_weights(cap);
    const detail::GatherRecords<A> rec{keys.data(), ids.data(), weights.data(), sources.data()};
    for (std::int64_t n0 = 0; n0 < p.N; n0 += images) {
      const std::int64_t points = std::min(images, p.N - n0) * p.Ho * p.Wo;
      const std::int64_t n = points * detail::grid_sample_records_per_point(c.shape);
      for (std::int64_t j = 0; j < n; ++j) detail::gather_init_record(j, rec, sentinel);
      for (std::int64_t t = 0; t < points; ++t) detail::grid_sample_enumerate_element(t, a, n0, sentinel, rec);
      std::vector<std::int64_t> order(ids.begin(), ids.begin() + n);
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) { return keys[x] < keys[y]; });
      for (std::int64_t r = 0; r < n; ++r) {
        sorted_ids[r] = order[r];
        sorted_keys[r] = keys[order[r]];
        detail::gather_permute_record(r, sorted_ids.data(), weights.data(), sources.data(), sorted_weights.data(),
                                      sorted_sources.data());
      }
      std::vector<std::uint64_t> run_keys;
      std::vector<std::int64_t> run_offsets, run_lengths;
      for (std::int64_t r = 0; r < n;) {
        std::int64_t e = r + 1;
        while (e < n && sorted_keys[e] == sorted_keys[r]) ++e;
        run_keys.push_back(sorted_keys[r]);
        run_offsets.push_back(r);
        run_lengths.push_back(e - r);
        r = e;
      }
      const auto runs = static_cast<std::int64_t>(run_keys.size());
      const detail::GatherSumArgs<T, A> sa{
          {run_keys.data(), run_offsets.data(), run_lengths.data(), sorted_weights.data(), sorted_sources.data()},
          a.grad_output,
          a.go.s1,
          got.data<T>(),
          a.gi.s1,
          p.C,
          sentinel,
          detail::kGatherPartial};
      const detail::GridSampleTarget target{n0, p.H, p.W, a.gi};
      for (std::int64_t t = 0; t < runs * p.C; ++t) detail::gather_run_element(t, sa, runs, channels_fastest, target);
    }
    EXPECT_TRUE(test::same_bytes(got, want)) << what << " exact, channels_fastest " << channels_fastest;
  }
}

template <class T>
void check_grad_grid(const Case& c, DType gdt, const std::string& what) {
  const test::GridSampleProblem& p = c.p;
  Tensor want = Tensor::empty({p.N, p.Ho, p.Wo, 2}, gdt);
  grid_sample_backward(c.t.grad_output, c.t.input, c.t.grid, {}, want, p.opt, {});
  Tensor got = Tensor::empty({p.N, p.Ho, p.Wo, 2}, gdt);
  const auto a = backward_args<T>(c, c.t.input, false);
  for (std::int64_t t = 0; t < p.N * p.Ho * p.Wo; ++t)
    detail::grid_sample_grad_grid_element(t, a, got.view().data, gdt, gs_strides(got));
  EXPECT_TRUE(test::same_bytes(got, want)) << what << " grad_grid";
}

TEST(GridSampleEmulated, KernelBodiesMatchTheCpuBackendBitwise) {
  for (const GridSampleOptions& o : test::all_grid_options()) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      const DType gdt = dt == DType::kFloat64 ? DType::kFloat32 : dt;  // a mixed pair for float64
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const Case c = make_case(dt, gdt, layout, o);
        const std::string what = std::string(to_string(o.interpolation)) + "/" + to_string(o.padding) + "/ac" +
                                 std::to_string(o.align_corners) + "/" + std::string(dtype_name(dt)) +
                                 (layout == Layout::kNHWC ? "/nhwc" : "/nchw");
        internal::dispatch_floating(dt, [&](auto tag) {
          using T = decltype(tag);
          check_forward<T>(c, layout, what);
          check_atomic<T>(c, layout, what);
          check_exact<T>(c, layout, what);
          check_grad_grid<T>(c, gdt, what);
        });
      }
    }
  }
}

/// The CPU backend's other loop shapes: one channel (point by point), one image and several, more
/// channel groups than one (16 channels each) and more points than one piece of grad_grid's
/// channel-outer walk (4096), each against the bodies.
TEST(GridSampleEmulated, CpuLoopShapesMatchTheBodies) {
  const GridSampleOptions bilinear_zeros{GridSampleInterpolation::kBilinear, GridSamplePadding::kZeros, false};
  const GridSampleOptions bilinear_border{GridSampleInterpolation::kBilinear, GridSamplePadding::kBorder, true};
  for (const Sizes& z : {Sizes{1, 1, 9, 10, 70, 71}, Sizes{3, 1, 9, 10, 20, 21}, Sizes{2, 40, 8, 9, 70, 71},
                         Sizes{3, 20, 7, 8, 12, 13}}) {
    for (const GridSampleOptions& o : {bilinear_zeros, bilinear_border}) {
      for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
        for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
          const Case c = make_case(dt, dt, layout, o, z);
          const std::string what = "N" + std::to_string(z.N) + " C" + std::to_string(z.C) + " " +
                                   to_string(o.padding) + "/" + std::string(dtype_name(dt)) +
                                   (layout == Layout::kNHWC ? "/nhwc" : "/nchw");
          internal::dispatch_floating(dt, [&](auto tag) {
            using T = decltype(tag);
            check_forward<T>(c, layout, what);
            check_atomic<T>(c, layout, what);
            check_exact<T>(c, layout, what);
            check_grad_grid<T>(c, dt, what);
          });
        }
      }
    }
  }
}

}  // namespace
}  // namespace detops
