// The CUDA kernels' per-thread bodies of deform_conv2d, run on the CPU over an emulated grid
// (every thread index, in order) as the steps of the sequence both backends share
// (internal::deform_forward_steps / deform_backward_steps, here with an executor that mirrors the
// CUDA backend's CudaSteps), byte for byte against the CPU backend. The CPU backend uses its own loops (points computed once per piece and read for
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

template <class T>
internal::DeformConv2dCall make_call(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p) {
  internal::DeformConv2dCall call{};
  call.op = "emulated";
  call.input = t.input;
  call.weight = t.weight;
  call.offset = t.offset;
  call.mask = t.mask;
  call.bias = t.bias;
  call.grad_output = t.grad_output;
  call.border_rule = p.border_rule;
  detail::DeformConv2dShape& s = call.shape;
  s = {p.N, p.Cin, p.H, p.W, p.Cout, p.kh, p.kw, p.Ho(), p.Wo(), p.groups, p.offset_groups, p.opt.stride_h,
       p.opt.stride_w, p.opt.pad_h, p.opt.pad_w, p.opt.dilation_h, p.opt.dilation_w, p.has_mask, p.has_bias};
  return call;
}

/// cuda/deform_conv2d_cuda.cu's executor (CudaSteps), launch by launch: each step runs its
/// kernel's body over the emulated grid. The exact mode's sort is CUB's: a stable sort by key,
/// runs cut with the sentinel's kept; its phase 3 in either thread order (`channels_fastest`).
template <class T>
struct EmulatedSteps {
  using A = acc_t<T>;
  const internal::DeformConv2dCall& call;
  BackwardMode mode = BackwardMode::kExact;
  bool channels_fastest = false;

  const detail::DeformConv2dShape& s() const { return call.shape; }
  void widen_weight(A* w) const {
    grid(s().Cout * s().group_in() * s().taps(), [&](std::int64_t i) {
      detail::deform_conv2d_weight_element(i, static_cast<const T*>(call.weight.data), dc_strides(call.weight), s(), w);
    });
  }
  void columns(const detail::DeformConv2dArgs<T>& f, std::int64_t n0, std::int64_t images, bool transposed,
               A* col) const {
    const std::int64_t Q = images * s().positions();
    grid(s().rows() * Q, [&](std::int64_t i) { detail::deform_conv2d_column_element(i, f, n0, Q, transposed, col); });
  }
  void gemm(const detail::DeformGemmArgs<A>& g) const {
    grid(g.G * ((g.M + detail::kDeformGemmRows - 1) / detail::kDeformGemmRows) * g.N,
         [&](std::int64_t t) { detail::deform_gemm_element(t, g); });
  }
  void output(std::int64_t n0, std::int64_t Q, const A* acc) const {
    const T* bias = s().has_bias ? static_cast<const T*>(call.bias.data) : nullptr;
    const std::int64_t bs = s().has_bias ? call.bias.strides[0] : 0;
    grid(s().Cout * Q, [&](std::int64_t i) {
      detail::deform_conv2d_output_element(i, acc, Q, bias, bs, s(), n0, static_cast<T*>(call.output.data),
                                           dc_strides(call.output));
    });
  }
  void zero_grad_input() const {
    const TensorView& gi = call.grads.grad_input;
    grid(gi.numel(), [&](std::int64_t i) {
      detail::fill_zero_element(i, static_cast<T*>(gi.data), dc_strides(gi), gi.sizes[1], gi.sizes[2], gi.sizes[3]);
    });
  }
  void zero(A* p, std::int64_t n) const { std::fill(p, p + n, A(0)); }
  void grad_output(std::int64_t n0, std::int64_t Q, A* go) const {
    grid(s().Cout * Q, [&](std::int64_t i) {
      detail::deform_conv2d_grad_output_element(i, static_cast<const T*>(call.grad_output.data),
                                                dc_strides(call.grad_output), s(), n0, Q, go);
    });
  }
  void bias(const A* go, std::int64_t Q, A* sums, bool last) const {
    grid(s().Cout, [&](std::int64_t i) {
      detail::deform_conv2d_bias_element(i, go, Q, sums, last, static_cast<T*>(call.grads.grad_bias.data),
                                         call.grads.grad_bias.strides[0]);
    });
  }
  void offsets(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    T* mask = s().has_mask ? static_cast<T*>(call.grads.grad_mask.data) : nullptr;
    grid(images * s().offset_groups * s().taps() * s().positions(), [&](std::int64_t i) {
      detail::deform_conv2d_offset_element(i, a, static_cast<T*>(call.grads.grad_offset.data),
                                           dc_strides(call.grads.grad_offset), mask, dc_strides(call.grads.grad_mask));
    });
  }
  void input(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    T* gi = static_cast<T*>(call.grads.grad_input.data);
    const detail::Strides4 gis = dc_strides(call.grads.grad_input);
    if (mode == BackwardMode::kAtomic) {  // atomicAdd in thread order
      const auto add = [gi](std::int64_t o, A v) { gi[o] = from_acc<T>(to_acc(gi[o]) + v); };
      grid(s().rows() * a.Q, [&](std::int64_t i) { detail::deform_conv2d_scatter_element(i, a, gis, add); });
      return;
    }
    const std::int64_t points = images * s().offset_groups * s().taps() * s().positions(), n = points * 4;
    const auto sentinel = static_cast<std::uint64_t>(internal::deform_exact_positions(s()));
    const auto size = static_cast<std::size_t>(n);
    std::vector<std::uint64_t> keys(size), sorted_keys(size);
    std::vector<std::int64_t> ids(size), sorted_ids(size), sources(size), sorted_sources(size);
    std::vector<A> weights(size), sorted_weights(size);
    const detail::GatherRecords<A> rec{keys.data(), ids.data(), weights.data(), sources.data()};
    grid(points, [&](std::int64_t i) { detail::deform_conv2d_enumerate_element(i, a, sentinel, rec); });
    std::vector<std::int64_t> order(ids.begin(), ids.end());
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
    const std::int64_t cog = s().offset_group_channels();
    const detail::GatherSumArgs<T, A, A> sa{
        {run_keys.data(), run_offsets.data(), run_lengths.data(), sorted_weights.data(), sorted_sources.data()},
        a.grad_col, s().taps() * a.Q, gi, gis.s1, cog, sentinel, detail::kGatherPartial};
    const detail::DeformConv2dTarget target{a.n0, s().offset_groups, cog, s().H, s().W, gis};
    grid(runs * cog, [&](std::int64_t i) { detail::gather_run_element(i, sa, runs, channels_fastest, target); });
  }
  void store_weight(const A* sums) const {
    grid(s().Cout * s().group_in() * s().taps(), [&](std::int64_t i) {
      detail::deform_conv2d_store_weight_element(i, sums, s(), static_cast<T*>(call.grads.grad_weight.data),
                                                 dc_strides(call.grads.grad_weight));
    });
  }
};

/// p rounded up to the workspace alignment (the backends' workspaces are aligned).
void* aligned(unsigned char* p) {
  constexpr std::uintptr_t a = internal::WorkspaceLayout::kAlign;
  return reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(p) + a - 1) / a * a);
}

/// The CUDA backend's forward: the shared sequence of steps, each emulated.
template <class T>
Tensor emulate_forward(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p, Layout layout) {
  internal::DeformConv2dCall call = make_call<T>(t, p);
  Tensor out = Tensor::empty({p.N, p.Cout, p.Ho(), p.Wo()}, t.input.view().dtype, Device::cpu(), layout);
  call.output = out.view();
  const std::size_t bytes = internal::deform_forward_workspace_bytes(call);
  std::vector<unsigned char> ws(bytes + internal::WorkspaceLayout::kAlign);
  EmulatedSteps<T> x{call};
  internal::deform_forward_steps<T>(call, Workspace{aligned(ws.data()), bytes}, x);
  return out;
}

/// The CUDA backend's backward: the shared sequence of steps, each emulated.
template <class T>
test::DeformConv2dRun emulate_backward(const test::DeformConv2dTensors& t, const test::DeformConv2dProblem& p,
                                       Layout layout, BackwardMode mode, bool channels_fastest) {
  using A = acc_t<T>;
  const DType dt = t.input.view().dtype;
  internal::DeformConv2dCall call = make_call<T>(t, p);
  test::DeformConv2dRun r;
  r.grad_input = Tensor::empty({p.N, p.Cin, p.H, p.W}, dt, Device::cpu(), layout);
  std::memset(r.grad_input.view().data, 0x7f, r.grad_input.nbytes());  // the zero fill must clear it
  r.grad_weight = Tensor::empty(std::vector<std::int64_t>(t.weight.view().sizes, t.weight.view().sizes + 4), dt);
  r.grad_offset = Tensor::empty(std::vector<std::int64_t>(t.offset.view().sizes, t.offset.view().sizes + 4), dt,
                                Device::cpu(), layout);
  if (p.has_mask)
    r.grad_mask = Tensor::empty(std::vector<std::int64_t>(t.mask.view().sizes, t.mask.view().sizes + 4), dt,
                                Device::cpu(), layout);
  if (p.has_bias) r.grad_bias = Tensor::empty({p.Cout}, dt);
  call.grads = {r.grad_input.view(), r.grad_weight.view(), r.grad_offset.view(), r.grad_mask.view(),
                r.grad_bias.view()};
  internal::WorkspaceLayout l;
  internal::add_deform_backward<A>(l, call.shape, internal::deform_wants(call));
  std::vector<unsigned char> ws(l.bytes() + internal::WorkspaceLayout::kAlign);
  l.bind(aligned(ws.data()));
  EmulatedSteps<T> x{call, mode, channels_fastest};
  internal::deform_backward_steps<T>(call, internal::take_deform_backward<A>(l), x);
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
  // and a fresh mmcv DCN layer under mmcv's border rule (every border tap at exactly -1)
  for (std::size_t i = 0; i <= configs.size(); ++i) {
    const test::DeformConv2dProblem p = i < configs.size() ? test::make_deform_problem(configs[i], 40 + i, 2.5)
                                                           : test::fresh_dcn_problem(DeformBorderRule::kMmcv, 40 + i);
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
