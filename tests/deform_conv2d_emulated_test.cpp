// The CUDA kernels' per-thread bodies of deform_conv2d, run on the CPU over an emulated grid
// (every thread index, in order) in the CUDA backend's launch sequence, byte for byte against the
// CPU backend. The CPU backend uses its own loops (points computed once per piece and read for
// every channel, the blocked GEMM with k in slices, planes for the scatter, the engine's counting
// sort), so agreement to the bit checks both the kernels' indexing and the claim that the two
// backends evaluate the same arithmetic. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "deform_conv2d_test_util.h"
#include "detops/detail/deform_conv2d_kernels.h"
#include "detops/detail/gather_backward.h"
#include "detops/detail/strided.h"
#include "internal/common.h"
#include "internal/deform_conv2d_backend.h"

namespace detops {
namespace {

using internal::dc_strides;

/// Runs body(t) for every thread index of a launch over n threads, in order.
template <class Body>
void grid(std::int64_t n, const Body& body) {
  for (std::int64_t t = 0; t < n; ++t) body(t);
}

template <class A>
void gemm(const detail::DeformGemmArgs<A>& g) {
  grid(g.G * ((g.M + detail::kDeformGemmRows - 1) / detail::kDeformGemmRows) * g.N,
       [&](std::int64_t t) { detail::deform_gemm_element(t, g); });
}

template <class T>
internal::DeformConv2dCall make_call(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p) {
  internal::DeformConv2dCall call{};
  call.op = "emulated";
  call.input = t.input;
  call.weight = t.weight;
  call.offset = t.offset;
  call.mask = t.mask;
  call.bias = t.bias;
  detail::DeformConv2dShape& s = call.shape;
  s = {p.N, p.Cin, p.H, p.W, p.Cout, p.kh, p.kw, p.Ho(), p.Wo(), p.groups, p.offset_groups, p.opt.stride_h,
       p.opt.stride_w, p.opt.pad_h, p.opt.pad_w, p.opt.dilation_h, p.opt.dilation_w, p.has_mask, p.has_bias};
  return call;
}

/// cuda/deform_conv2d_cuda.cu's forward, launch by launch.
template <class T>
Tensor emulate_forward(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p, Layout layout) {
  using A = acc_t<T>;
  const internal::DeformConv2dCall call = make_call<T>(t, p);
  const detail::DeformConv2dShape& s = call.shape;
  Tensor out = Tensor::empty({p.N, p.Cout, p.Ho(), p.Wo()}, t.input.view().dtype, Device::cpu(), layout);
  const detail::DeformConv2dArgs<T> a = internal::deform_conv2d_args<T>(call);
  const std::int64_t chunk = internal::deform_chunk_images(s), rg = s.group_in() * s.taps();
  std::vector<A> w(static_cast<std::size_t>(s.Cout * rg)), col(static_cast<std::size_t>(s.rows() * chunk * s.positions())),
      acc(static_cast<std::size_t>(s.Cout * chunk * s.positions()));
  grid(s.Cout * rg, [&](std::int64_t i) {
    detail::deform_conv2d_weight_element(i, t.weight.data<T>(), dc_strides(t.weight), s, w.data());
  });
  for (std::int64_t n0 = 0; n0 < s.N; n0 += chunk) {
    const std::int64_t Q = std::min(chunk, s.N - n0) * s.positions();
    grid(s.rows() * Q, [&](std::int64_t i) { detail::deform_conv2d_column_element(i, a, n0, Q, false, col.data()); });
    gemm(internal::deform_forward_gemm(s, w.data(), col.data(), acc.data(), Q));
    grid(s.Cout * Q, [&](std::int64_t i) {
      detail::deform_conv2d_output_element(i, acc.data(), Q, p.has_bias ? t.bias.data<T>() : nullptr,
                                           p.has_bias ? t.bias.view().strides[0] : 0, s, n0, out.data<T>(),
                                           dc_strides(out));
    });
  }
  return out;
}

/// cuda/deform_conv2d_cuda.cu's backward, launch by launch (the exact mode's sort as CUB's: a
/// stable sort by key, runs cut with the sentinel's kept; phase 3 in both thread orders).
template <class T>
test::DeformConv2dRun emulate_backward(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p,
                                       Layout layout, BackwardMode mode, bool channels_fastest) {
  using A = acc_t<T>;
  const DType dt = t.input.view().dtype;
  const internal::DeformConv2dCall call = make_call<T>(t, p);
  const detail::DeformConv2dShape& s = call.shape;
  test::DeformConv2dRun r;
  r.grad_input = Tensor::empty({p.N, p.Cin, p.H, p.W}, dt, Device::cpu(), layout);
  std::memset(r.grad_input.view().data, 0x7f, r.grad_input.nbytes());  // zero_kernel must clear it
  grid(r.grad_input.view().numel(), [&](std::int64_t i) {
    detail::fill_zero_element(i, r.grad_input.data<T>(), dc_strides(r.grad_input), p.Cin, p.H, p.W);
  });
  r.grad_weight = Tensor::empty(std::vector<std::int64_t>(t.weight.view().sizes, t.weight.view().sizes + 4), dt);
  r.grad_offset = Tensor::empty(std::vector<std::int64_t>(t.offset.view().sizes, t.offset.view().sizes + 4), dt,
                                Device::cpu(), layout);
  if (p.has_mask)
    r.grad_mask = Tensor::empty(std::vector<std::int64_t>(t.mask.view().sizes, t.mask.view().sizes + 4), dt,
                                Device::cpu(), layout);
  if (p.has_bias) r.grad_bias = Tensor::empty({p.Cout}, dt);
  const detail::DeformConv2dArgs<T> f = internal::deform_conv2d_args<T>(call);
  const std::int64_t chunk = internal::deform_chunk_images(s), P = s.positions(), rg = s.group_in() * s.taps();
  const std::int64_t cap = chunk * P;
  const auto size = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  std::vector<A> w(size(s.Cout * rg)), col_t(size(s.rows() * cap)), go(size(s.Cout * cap)),
      grad_col(size(s.rows() * cap)), weight_acc(size(s.Cout * rg)), bias_acc(size(s.Cout), A(0));
  grid(s.Cout * rg, [&](std::int64_t i) {
    detail::deform_conv2d_weight_element(i, t.weight.data<T>(), dc_strides(t.weight), s, w.data());
  });
  const std::int64_t records_cap = internal::deform_exact_records(s);
  const auto sentinel = static_cast<std::uint64_t>(internal::deform_exact_positions(s));
  std::vector<std::uint64_t> keys(size(records_cap)), sorted_keys(size(records_cap));
  std::vector<std::int64_t> ids(size(records_cap)), sorted_ids(size(records_cap)), sources(size(records_cap)),
      sorted_sources(size(records_cap));
  std::vector<A> weights(size(records_cap)), sorted_weights(size(records_cap));
  const detail::GatherRecords<A> rec{keys.data(), ids.data(), weights.data(), sources.data()};
  const detail::Strides4 gis = dc_strides(r.grad_input);
  for (std::int64_t n0 = 0; n0 < s.N; n0 += chunk) {
    const std::int64_t images = std::min(chunk, s.N - n0), Q = images * P;
    const bool last = n0 + images >= s.N;
    grid(s.Cout * Q, [&](std::int64_t i) {
      detail::deform_conv2d_grad_output_element(i, t.grad_output.data<T>(), dc_strides(t.grad_output), s, n0, Q,
                                                go.data());
    });
    if (p.has_bias)
      grid(s.Cout, [&](std::int64_t i) {
        detail::deform_conv2d_bias_element(i, go.data(), Q, bias_acc.data(), last, r.grad_bias.data<T>(), 1);
      });
    grid(s.rows() * Q, [&](std::int64_t i) { detail::deform_conv2d_column_element(i, f, n0, Q, true, col_t.data()); });
    gemm(internal::deform_grad_weight_gemm(s, go.data(), col_t.data(), weight_acc.data(), Q, n0 > 0));
    gemm(internal::deform_grad_col_gemm(s, w.data(), go.data(), grad_col.data(), Q));
    const detail::DeformConv2dBackwardArgs<T> a{f, grad_col.data(), n0, Q};
    const std::int64_t points = images * s.offset_groups * s.taps() * P;
    grid(points, [&](std::int64_t i) {
      detail::deform_conv2d_offset_element(i, a, r.grad_offset.data<T>(), dc_strides(r.grad_offset),
                                           p.has_mask ? r.grad_mask.data<T>() : nullptr, dc_strides(r.grad_mask));
    });
    if (mode == BackwardMode::kAtomic) {
      T* gi = r.grad_input.data<T>();
      const auto add = [gi](std::int64_t o, A v) { gi[o] = from_acc<T>(to_acc(gi[o]) + v); };
      grid(s.rows() * Q, [&](std::int64_t i) { detail::deform_conv2d_scatter_element(i, a, gis, add); });
      continue;
    }
    const std::int64_t n = points * 4;
    grid(points, [&](std::int64_t i) { detail::deform_conv2d_enumerate_element(i, a, sentinel, rec); });
    std::vector<std::int64_t> order(ids.begin(), ids.begin() + n);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) { return keys[x] < keys[y]; });
    for (std::int64_t q = 0; q < n; ++q) {
      sorted_ids[q] = order[q];
      sorted_keys[q] = keys[order[q]];
      detail::gather_permute_record(q, sorted_ids.data(), weights.data(), sources.data(), sorted_weights.data(),
                                    sorted_sources.data());
    }
    std::vector<std::uint64_t> run_keys;
    std::vector<std::int64_t> run_offsets, run_lengths;
    for (std::int64_t q = 0; q < n;) {
      std::int64_t e = q + 1;
      while (e < n && sorted_keys[e] == sorted_keys[q]) ++e;
      run_keys.push_back(sorted_keys[q]);
      run_offsets.push_back(q);
      run_lengths.push_back(e - q);
      q = e;
    }
    const auto runs = static_cast<std::int64_t>(run_keys.size());
    const std::int64_t cog = s.offset_group_channels();
    const detail::GatherSumArgs<T, A, A> sa{
        {run_keys.data(), run_offsets.data(), run_lengths.data(), sorted_weights.data(), sorted_sources.data()},
        grad_col.data(), s.taps() * Q, r.grad_input.data<T>(), gis.s1, cog, sentinel, detail::kGatherPartial};
    const detail::DeformConv2dTarget target{n0, s.offset_groups, cog, s.H, s.W, gis};
    grid(runs * cog, [&](std::int64_t i) { detail::gather_run_element(i, sa, runs, channels_fastest, target); });
  }
  grid(s.Cout * rg, [&](std::int64_t i) {
    detail::deform_conv2d_store_weight_element(i, weight_acc.data(), s, r.grad_weight.data<T>(),
                                               dc_strides(r.grad_weight));
  });
  return r;
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  if (!want.view().defined()) return;
  EXPECT_TRUE(test::same_bytes(got, want)) << what;
}

TEST(DeformConv2dEmulated, KernelBodiesMatchTheCpuBackendBitwise) {
  std::vector<test::DeformConv2dConfig> configs = test::deform_configs();
  // many samples on a small map: runs longer than the engine's partial
  DeformConv2dOptions o{};
  o.pad_h = o.pad_w = 1;
  configs.push_back({2, 6, 4, 5, 5, 3, 3, 1, 2, o, true, true});
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const test::DeformConv2dProblem p = test::make_deform_problem(configs[i], 40 + i, 2.5);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
        const test::DeformConv2dTensors t = test::deform_tensors(p, dt, layout);
        for (BackwardMode mode : {BackwardMode::kExact, BackwardMode::kAtomic}) {
          const std::string what = "config " + std::to_string(i) + " " + std::string(dtype_name(dt)) +
                                   (layout == Layout::kNHWC ? " nhwc " : " nchw ") + to_string(mode);
          const test::DeformConv2dRun want = test::run_deform_conv2d(p, dt, layout, mode, 3);
          internal::dispatch_floating(dt, [&](auto tag) {
            using T = decltype(tag);
            if (mode == BackwardMode::kExact) expect_same(emulate_forward<T>(t, p, layout), want.output, what + " output");
            for (bool fastest : {false, true}) {
              if (mode == BackwardMode::kAtomic && fastest) continue;  // one scatter order
              const test::DeformConv2dRun got = emulate_backward<T>(t, p, layout, mode, fastest);
              const std::string w = what + (fastest ? " channels fastest" : "");
              expect_same(got.grad_input, want.grad_input, w + " grad_input");
              expect_same(got.grad_weight, want.grad_weight, w + " grad_weight");
              expect_same(got.grad_offset, want.grad_offset, w + " grad_offset");
              expect_same(got.grad_mask, want.grad_mask, w + " grad_mask");
              expect_same(got.grad_bias, want.grad_bias, w + " grad_bias");
            }
          });
        }
      }
    }
  }
}

}  // namespace
}  // namespace detops
