// What the deform_conv2d entry points hand to a backend after validation, the chunking, the
// workspace layout and the sequence of steps both backends share, and the backend table. Shared
// by src/cpu/deform_conv2d_cpu.cpp and cuda/deform_conv2d_cuda.cu.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "detops/context.h"
#include "detops/deform_conv2d.h"
#include "detops/detail/deform_conv2d_kernels.h"
#include "internal/common.h"

namespace detops {
namespace internal {

/// One validated call. Forward: input, weight, offset, mask, bias, output. Backward: grad_output
/// and the gradients wanted (absent ones are empty views).
struct DeformConv2dCall {
  const char* op;
  TensorView input, weight, offset, mask, bias;
  TensorView output;       // forward
  TensorView grad_output;  // backward
  DeformConv2dGrads grads;  // backward
  DeformBorderRule border_rule = DeformBorderRule::kTorchvision;  // backward
  detail::DeformConv2dShape shape;
};

inline detail::Strides4 dc_strides(const TensorView& v) {
  if (!v.defined() || v.rank != 4) return {0, 0, 0, 0};
  return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
}

template <class T>
detail::DeformConv2dArgs<T> deform_conv2d_args(const DeformConv2dCall& call) {
  detail::DeformConv2dArgs<T> a{};
  a.input = static_cast<const T*>(call.input.data);
  a.in = dc_strides(call.input);
  a.offset = static_cast<const T*>(call.offset.data);
  a.off = dc_strides(call.offset);
  a.mask = call.shape.has_mask ? static_cast<const T*>(call.mask.data) : nullptr;
  a.mk = dc_strides(call.mask);
  a.s = call.shape;
  return a;
}

/// Column elements a chunk aims for: as many whole images as fit in max(one image's columns,
/// 2^22), so each column buffer stays near 16 MB (float) whatever N is.
constexpr std::int64_t kDeformColumnBudget = std::int64_t{1} << 22;

inline std::int64_t deform_chunk_images(const detail::DeformConv2dShape& s) {
  const std::int64_t per_image = s.rows() * s.positions();
  if (per_image == 0) return std::max<std::int64_t>(s.N, 1);
  return std::max<std::int64_t>(1, std::min(s.N, std::max(per_image, kDeformColumnBudget) / per_image));
}

/// The exact mode's chunk capacity: records (4 per image, offset group, tap and position) and
/// positions, the engine's sentinel key ((image, offset group, pixel) keys).
inline std::int64_t deform_exact_records(const detail::DeformConv2dShape& s) {
  return deform_chunk_images(s) * s.offset_groups * s.taps() * s.positions() * 4;
}
inline std::int64_t deform_exact_positions(const detail::DeformConv2dShape& s) {
  return deform_chunk_images(s) * s.offset_groups * s.H * s.W;
}

/// Which parts of the backward a call wants.
struct DeformWants {
  bool input, weight, offset, mask, bias;
  bool columns() const { return input || offset || mask; }  // grad_columns needed
};
inline DeformWants deform_wants(const DeformConv2dCall& call) {
  auto want = [](const TensorView& v) { return v.defined() && v.numel() > 0; };
  return {want(call.grads.grad_input), want(call.grads.grad_weight), want(call.grads.grad_offset),
          want(call.grads.grad_mask), want(call.grads.grad_bias)};
}

/// The arrays of the forward's workspace (each backend adds its own after them).
template <class A>
struct DeformForwardBuffers {
  A* weight;  // [Cout, Rg]
  A* col;     // [R, Q]
  A* acc;     // [Cout, Q]
};
template <class A>
void add_deform_forward(WorkspaceLayout& l, const detail::DeformConv2dShape& s) {
  const std::int64_t Q = deform_chunk_images(s) * s.positions();
  l.add<A>(s.Cout * s.group_in() * s.taps());
  l.add<A>(s.rows() * Q);
  l.add<A>(s.Cout * Q);
}
/// Bytes of the forward's layout (without the alignment slack).
inline std::size_t deform_forward_workspace_bytes(const DeformConv2dCall& call) {
  return dispatch_floating(call.input.dtype, [&](auto tag) {
    WorkspaceLayout l;
    add_deform_forward<acc_t<decltype(tag)>>(l, call.shape);
    return l.bytes();
  });
}
template <class A>
DeformForwardBuffers<A> take_deform_forward(WorkspaceLayout& l) {
  DeformForwardBuffers<A> b;
  b.weight = l.take<A>();
  b.col = l.take<A>();
  b.acc = l.take<A>();
  return b;
}

/// The arrays of the backward's workspace (the exact mode's records are the backend's own).
template <class A>
struct DeformBackwardBuffers {
  A* weight;     // [Cout, Rg]
  A* col_t;      // [Q, R], for grad_weight
  A* go;         // [Cout, Q]
  A* grad_col;   // [R, Q]
  A* weight_acc; // [Cout, Rg], grad_weight's running sums
  A* bias_acc;   // [Cout], grad_bias's running sums
};
template <class A>
void add_deform_backward(WorkspaceLayout& l, const detail::DeformConv2dShape& s, const DeformWants& w) {
  const std::int64_t Q = deform_chunk_images(s) * s.positions();
  const std::int64_t wsize = s.Cout * s.group_in() * s.taps();
  l.add<A>(wsize);
  l.add<A>(w.weight ? s.rows() * Q : 0);
  l.add<A>(s.Cout * Q);
  l.add<A>(w.columns() ? s.rows() * Q : 0);
  l.add<A>(w.weight ? wsize : 0);
  l.add<A>(w.bias ? s.Cout : 0);
}
template <class A>
DeformBackwardBuffers<A> take_deform_backward(WorkspaceLayout& l) {
  DeformBackwardBuffers<A> b;
  b.weight = l.take<A>();
  b.col_t = l.take<A>();
  b.go = l.take<A>();
  b.grad_col = l.take<A>();
  b.weight_acc = l.take<A>();
  b.bias_acc = l.take<A>();
  return b;
}

/// The GEMMs of a chunk (Q columns), each over the weight groups.
/// Forward: acc[Cout, Q] = W[Cout, Rg] x col[R, Q] per group.
template <class A>
detail::DeformGemmArgs<A> deform_forward_gemm(const detail::DeformConv2dShape& s, const A* w, const A* col, A* acc,
                                              std::int64_t Q) {
  const std::int64_t rg = s.group_in() * s.taps(), mg = s.group_out();
  return {w, mg * rg, rg, 1, col, rg * Q, Q, acc, mg * Q, Q, s.groups, mg, Q, rg, false};
}
/// grad_columns[R, Q] = W^T x go per group.
template <class A>
detail::DeformGemmArgs<A> deform_grad_col_gemm(const detail::DeformConv2dShape& s, const A* w, const A* go,
                                               A* grad_col, std::int64_t Q) {
  const std::int64_t rg = s.group_in() * s.taps(), mg = s.group_out();
  return {w, mg * rg, 1, rg, go, mg * Q, Q, grad_col, rg * Q, Q, s.groups, rg, Q, mg, false};
}
/// grad_weight's sums [Cout, Rg] continued by go[Cout, Q] x col_t[Q, R] per group.
template <class A>
detail::DeformGemmArgs<A> deform_grad_weight_gemm(const detail::DeformConv2dShape& s, const A* go, const A* col_t,
                                                  A* weight_acc, std::int64_t Q, bool accumulate) {
  const std::int64_t rg = s.group_in() * s.taps(), mg = s.group_out();
  return {go, mg * Q, Q, 1, col_t, rg, s.rows(), weight_acc, mg * rg, rg, s.groups, mg, rg, Q, accumulate};
}

/// The forward's and the backward's steps, written once for every backend (and for the
/// emulated-grid test, tests/deform_conv2d_emulated_test.cpp): the chunking, the order of the
/// steps and each step's arguments. A backend supplies the executor `x`, which carries out each
/// step on its device (CPU loops, CUDA launches on the caller's stream). The forward lays out its
/// workspace (`ws`, deform_forward_workspace_bytes()) itself; the backward takes the shared
/// arrays of the backend's layout. The steps:
///   widen_weight(A* w)                     weight as A, [Cout, Rg]
///   columns(f, n0, images, transposed, col) the chunk's columns, [R, Q] or [Q, R]
///   gemm(const detail::DeformGemmArgs<A>&) the fixed-order GEMM
///   output(n0, Q, const A* acc)            forward: acc (+ bias) into output
///   zero_grad_input(), zero(A* p, n)       grad_input, and running sums, set to 0
///   grad_output(n0, Q, A* go)              the chunk's grad_output as A, [Cout, Q]
///   bias(const A* go, Q, A* sums, last)    grad_bias's sums (stored when `last`)
///   offsets(a, images)                     the chunk's grad_offset / grad_mask
///   input(a, images)                       the chunk's share of grad_input, the mode's way
///   store_weight(const A* sums)            grad_weight from its sums
/// A step over nothing (a zero count) must be a no-op.
template <class T, class X>
void deform_forward_steps(const DeformConv2dCall& call, Workspace ws, X& x) {
  using A = acc_t<T>;
  WorkspaceLayout layout;  // the same on every backend (deform_forward_workspace_bytes)
  add_deform_forward<A>(layout, call.shape);
  layout.bind(ws.data);
  const DeformForwardBuffers<A> buf = take_deform_forward<A>(layout);
  const detail::DeformConv2dShape& s = call.shape;
  const detail::DeformConv2dArgs<T> f = deform_conv2d_args<T>(call);
  x.widen_weight(buf.weight);
  const std::int64_t chunk = deform_chunk_images(s);
  for (std::int64_t n0 = 0; n0 < s.N; n0 += chunk) {
    const std::int64_t images = std::min(chunk, s.N - n0), Q = images * s.positions();
    x.columns(f, n0, images, false, buf.col);
    x.gemm(deform_forward_gemm(s, buf.weight, buf.col, buf.acc, Q));
    x.output(n0, Q, buf.acc);
  }
}

/// See deform_forward_steps. Per chunk of whole images: grad_output widened, grad_bias's and
/// grad_weight's running sums continued, grad_columns = W^T x go, then grad_offset / grad_mask
/// (one writer each) and grad_input from grad_columns.
template <class T, class X>
void deform_backward_steps(const DeformConv2dCall& call, const DeformBackwardBuffers<acc_t<T>>& buf, X& x) {
  const detail::DeformConv2dShape& s = call.shape;
  const DeformWants w = deform_wants(call);
  if (w.input) x.zero_grad_input();
  x.widen_weight(buf.weight);
  if (w.bias) x.zero(buf.bias_acc, s.Cout);
  if (w.weight && s.N == 0) x.zero(buf.weight_acc, s.Cout * s.group_in() * s.taps());  // no chunk starts them
  const detail::DeformConv2dArgs<T> f = deform_conv2d_args<T>(call);
  const std::int64_t chunk = deform_chunk_images(s);
  for (std::int64_t n0 = 0; n0 < s.N; n0 += chunk) {
    const std::int64_t images = std::min(chunk, s.N - n0), Q = images * s.positions();
    x.grad_output(n0, Q, buf.go);
    if (w.bias) x.bias(buf.go, Q, buf.bias_acc, n0 + images >= s.N);
    if (w.weight) {
      x.columns(f, n0, images, true, buf.col_t);
      x.gemm(deform_grad_weight_gemm(s, buf.go, buf.col_t, buf.weight_acc, Q, n0 > 0));
    }
    if (!w.columns()) continue;
    x.gemm(deform_grad_col_gemm(s, buf.weight, buf.go, buf.grad_col, Q));
    const detail::DeformConv2dBackwardArgs<T> a{f, buf.grad_col, n0, Q,
                                                call.border_rule == DeformBorderRule::kMmcv};
    if (w.offset || w.mask) x.offsets(a, images);
    if (w.input) x.input(a, images);
  }
  if (w.weight) x.store_weight(buf.weight_acc);
  if (w.bias && s.N == 0) x.bias(buf.go, 0, buf.bias_acc, true);  // no chunk stored it: the sums of nothing
}

/// A deform_conv2d backend: one table per device (internal/backend.h), defined at the bottom of
/// src/cpu/deform_conv2d_cpu.cpp and cuda/deform_conv2d_cuda.cu.
struct DeformConv2dBackend {
  /// The forward into call.output; ws is deform_forward_workspace_bytes() of memory,
  /// kWorkspaceAlign-aligned (the forward's layout is the same on every backend).
  void (*forward)(const DeformConv2dCall& call, const Context& ctx, Workspace ws);
  /// Bytes of the backward's WorkspaceLayout for `mode`.
  std::size_t (*backward_workspace)(const DeformConv2dCall& call, BackwardMode mode);
  /// Every wanted gradient of call.grads; ws is the layout's memory, kWorkspaceAlign-aligned.
  void (*backward)(const DeformConv2dCall& call, BackwardMode mode, const Context& ctx, Workspace ws);
};
extern const DeformConv2dBackend kDeformConv2dCpu;
extern const DeformConv2dBackend kDeformConv2dCuda;

}  // namespace internal
}  // namespace detops
