// deform_conv2d's CUDA steps, written once over the device interface (internal/device_steps.h):
// the executor of deform_forward_steps / deform_backward_steps (internal/deform_conv2d_backend.h)
// as launches of the per-thread bodies of include/detops/detail/deform_conv2d_kernels.h, the exact
// mode's gather engine per chunk of images, and the backward's workspace layout. The CUDA backend
// (cuda/deform_conv2d_cuda.cu) runs it on CudaDevice; tests/deform_conv2d_emulated_test.cpp runs
// the very same code on the emulated device. The GEMMs are the fixed-order body (4 rows of one
// column per thread, k in order): the CPU's bits, not cuBLAS's speed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "detops/detail/deform_conv2d_kernels.h"
#include "detops/detail/gather_backward.h"
#include "internal/deform_conv2d_backend.h"
#include "internal/device_steps.h"

namespace detops {
namespace internal {
namespace deform_device {

using detail::DeformConv2dShape;
using detail::Strides4;

// ---------------------------------------------------------------------------------------------
// The steps' bodies: one thread's work, the arguments of its launch

template <class T>
struct ColumnBody {
  detail::DeformConv2dArgs<T> a;
  std::int64_t n0, Q;
  bool transposed;
  acc_t<T>* col;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::deform_conv2d_column_element(t, a, n0, Q, transposed, col);
  }
};

template <class A>
struct GemmBody {
  detail::DeformGemmArgs<A> g;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const { detail::deform_gemm_element(t, g); }
};

template <class T>
struct WeightBody {
  const T* weight;
  Strides4 ws;
  DeformConv2dShape s;
  acc_t<T>* w;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const { detail::deform_conv2d_weight_element(t, weight, ws, s, w); }
};

template <class T>
struct StoreWeightBody {
  const acc_t<T>* acc;
  DeformConv2dShape s;
  T* gw;
  Strides4 ws;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::deform_conv2d_store_weight_element(t, acc, s, gw, ws);
  }
};

template <class T>
struct OutputBody {
  const acc_t<T>* acc;
  std::int64_t Q;
  const T* bias;
  std::int64_t bias_s;
  DeformConv2dShape s;
  std::int64_t n0;
  T* out;
  Strides4 os;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::deform_conv2d_output_element(t, acc, Q, bias, bias_s, s, n0, out, os);
  }
};

template <class T>
struct GradOutputBody {
  const T* grad_output;
  Strides4 gs;
  DeformConv2dShape s;
  std::int64_t n0, Q;
  acc_t<T>* go;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::deform_conv2d_grad_output_element(t, grad_output, gs, s, n0, Q, go);
  }
};

template <class T>
struct BiasBody {
  const acc_t<T>* go;
  std::int64_t Q;
  acc_t<T>* acc;
  bool last;
  T* grad_bias;
  std::int64_t gbs;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::deform_conv2d_bias_element(t, go, Q, acc, last, grad_bias, gbs);
  }
};

template <class T>
struct OffsetBody {
  detail::DeformConv2dBackwardArgs<T> a;
  T* grad_offset;
  Strides4 gos;
  T* grad_mask;
  Strides4 gms;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::deform_conv2d_offset_element(t, a, grad_offset, gos, grad_mask, gms);
  }
};

template <class T, class Add>
struct ScatterBody {
  detail::DeformConv2dBackwardArgs<T> a;
  Strides4 gi;
  Add add;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const { detail::deform_conv2d_scatter_element(t, a, gi, add); }
};

template <class T>
struct EnumerateBody {
  detail::DeformConv2dBackwardArgs<T> a;
  detail::GatherKey sentinel;
  detail::GatherRecords<acc_t<T>> rec;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::deform_conv2d_enumerate_element(t, a, sentinel, rec);
  }
};

// ---------------------------------------------------------------------------------------------
// The executor of the shared sequences

/// The steps of deform_forward_steps / deform_backward_steps as launches on `dev`, in order.
template <class T, class Dev>
struct DeviceSteps {
  using A = acc_t<T>;
  const DeformConv2dCall& call;
  const Dev& dev;
  BackwardMode mode = BackwardMode::kExact;
  GatherDeviceBuffers<A> gather{};  // exact grad_input

  const DeformConv2dShape& s() const { return call.shape; }
  void widen_weight(A* w) const {
    dev.launch("deform_weight", s().Cout * s().group_in() * s().taps(),
               WeightBody<T>{static_cast<const T*>(call.weight.data), dc_strides(call.weight), s(), w});
  }
  void columns(const detail::DeformConv2dArgs<T>& f, std::int64_t n0, std::int64_t images, bool transposed,
               A* col) const {
    const std::int64_t Q = images * s().positions();
    dev.launch("deform_columns", s().rows() * Q, ColumnBody<T>{f, n0, Q, transposed, col});
  }
  void gemm(const detail::DeformGemmArgs<A>& g) const {
    dev.launch("deform_gemm", g.G * ((g.M + detail::kDeformGemmRows - 1) / detail::kDeformGemmRows) * g.N,
               GemmBody<A>{g});
  }
  void output(std::int64_t n0, std::int64_t Q, const A* acc) const {
    const T* bias = s().has_bias ? static_cast<const T*>(call.bias.data) : nullptr;
    dev.launch("deform_output", s().Cout * Q,
               OutputBody<T>{acc, Q, bias, s().has_bias ? call.bias.strides[0] : std::int64_t{0}, s(), n0,
                             static_cast<T*>(call.output.data), dc_strides(call.output)});
  }
  void zero_grad_input() const { zero_fill<T>(dev, call.grads.grad_input); }
  void zero(A* p, std::int64_t n) const {
    if (n > 0) dev.zero(p, sizeof(A) * static_cast<std::size_t>(n));
  }
  void grad_output(std::int64_t n0, std::int64_t Q, A* go) const {
    dev.launch("deform_grad_output", s().Cout * Q,
               GradOutputBody<T>{static_cast<const T*>(call.grad_output.data), dc_strides(call.grad_output), s(), n0,
                                 Q, go});
  }
  void bias(const A* go, std::int64_t Q, A* sums, bool last) const {
    dev.launch("deform_bias", s().Cout,
               BiasBody<T>{go, Q, sums, last, static_cast<T*>(call.grads.grad_bias.data),
                           call.grads.grad_bias.strides[0]});
  }
  void offsets(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    const DeformWants w = deform_wants(call);
    dev.launch("deform_offsets", images * s().offset_groups * s().taps() * s().positions(),
               OffsetBody<T>{a, w.offset ? static_cast<T*>(call.grads.grad_offset.data) : nullptr,
                             dc_strides(call.grads.grad_offset),
                             w.mask ? static_cast<T*>(call.grads.grad_mask.data) : nullptr,
                             dc_strides(call.grads.grad_mask)});
  }
  void input(const detail::DeformConv2dBackwardArgs<T>& a, std::int64_t images) const {
    const Strides4 gi = dc_strides(call.grads.grad_input);
    T* grad_input = static_cast<T*>(call.grads.grad_input.data);
    if (mode != BackwardMode::kExact) {
      using Add = typename Dev::template Add<T>;
      dev.launch("deform_scatter", s().rows() * a.Q, ScatterBody<T, Add>{a, gi, Add{grad_input}});
      return;
    }
    // the engine: records per (image, offset group, tap, position) in canonical order, a stable
    // sort by key, then each destination's run summed in order (the run count stays on the device)
    const auto sentinel = static_cast<detail::GatherKey>(deform_exact_positions(s()));
    const std::int64_t points = images * s().offset_groups * s().taps() * s().positions(), records = points * 4;
    dev.launch("deform_enumerate", points, EnumerateBody<T>{a, sentinel, gather.records});
    const detail::GatherSorted<A> sorted = gather_sort(dev, gather, records, sentinel);
    const detail::GatherSumArgs<T, A, A> sa{sorted,   a.grad_col, s().taps() * a.Q, grad_input, gi.s1,
                                            s().offset_group_channels(), sentinel, detail::kGatherPartial};
    const std::int64_t max_runs = std::min<std::int64_t>(records, static_cast<std::int64_t>(sentinel) + 1);
    gather_sum(dev, sa, gather.num_runs, max_runs, channels_innermost(call.grads.grad_input),
               detail::DeformConv2dTarget{a.n0, s().offset_groups, s().offset_group_channels(), s().H, s().W, gi});
  }
  void store_weight(const A* sums) const {
    dev.launch("deform_store_weight", s().Cout * s().group_in() * s().taps(),
               StoreWeightBody<T>{sums, s(), static_cast<T*>(call.grads.grad_weight.data),
                                  dc_strides(call.grads.grad_weight)});
  }
};

/// The exact mode's temporary bytes (0 when it runs no engine).
template <class Dev>
std::size_t exact_temp_bytes(const Dev& dev, const DeformConv2dCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact || !deform_wants(call).input) return 0;
  return gather_temp_bytes(dev, deform_exact_records(call.shape), deform_exact_positions(call.shape));
}

template <class A>
WorkspaceLayout backward_layout(const DeformConv2dCall& call, BackwardMode mode, std::size_t temp_bytes) {
  WorkspaceLayout l;
  const DeformWants w = deform_wants(call);
  add_deform_backward<A>(l, call.shape, w);
  if (mode == BackwardMode::kExact && w.input) add_gather<A>(l, deform_exact_records(call.shape), temp_bytes);
  return l;
}

}  // namespace deform_device

/// The forward on `dev` into call.output; ws: deform_forward_workspace_bytes(), aligned.
template <class T, class Dev>
void deform_forward_on(const Dev& dev, const DeformConv2dCall& call, Workspace ws) {
  deform_device::DeviceSteps<T, Dev> x{call, dev};
  deform_forward_steps<T>(call, ws, x);
}

/// Bytes of the backward's workspace on `dev` for `mode`.
template <class Dev>
std::size_t deform_backward_workspace_on(const Dev& dev, const DeformConv2dCall& call, BackwardMode mode) {
  const std::size_t temp_bytes = deform_device::exact_temp_bytes(dev, call, mode);
  return dispatch_floating(call.input.dtype, [&](auto tag) {
    return deform_device::backward_layout<acc_t<decltype(tag)>>(call, mode, temp_bytes).bytes();
  });
}

/// Every wanted gradient of call.grads on `dev`; ws: deform_backward_workspace_on() bytes, aligned.
template <class T, class Dev>
void deform_backward_on(const Dev& dev, const DeformConv2dCall& call, BackwardMode mode, Workspace ws) {
  using A = acc_t<T>;
  const std::size_t temp_bytes = deform_device::exact_temp_bytes(dev, call, mode);
  WorkspaceLayout layout = deform_device::backward_layout<A>(call, mode, temp_bytes);
  layout.bind(ws.data);
  const DeformBackwardBuffers<A> buf = take_deform_backward<A>(layout);
  deform_device::DeviceSteps<T, Dev> x{call, dev, mode};
  if (mode == BackwardMode::kExact && deform_wants(call).input) x.gather = take_gather<A>(layout, temp_bytes);
  deform_backward_steps<T>(call, buf, x);
}

}  // namespace internal
}  // namespace detops
