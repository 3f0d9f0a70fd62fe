// What the deform_conv2d entry points hand to a backend after validation, the chunking and the
// workspace layout both backends share, and the backend table. Shared by
// src/cpu/deform_conv2d_cpu.cpp and cuda/deform_conv2d_cuda.cu.
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
