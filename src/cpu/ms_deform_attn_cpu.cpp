// CPU backend of multi-scale deformable attention. Work is cut into (b, m, q) units (q fastest:
// a thread's gathers stay in one head's rows of value) or (b, m) planes, each one thread's, so no
// two threads write one element; the arithmetic per element is the shared math of
// include/detops/detail/ms_deform_attn_math.h in the kernels' order, so the bits are those of the
// CUDA bodies (tests/ms_deform_attn_emulated_test.cpp):
//  - forward: per unit, the four corner rows of each sample are gathered (zeros outside the
//    level) and every channel gets acc + bilinear * attention, (l, p) in order, as
//    msda_forward_element computes it one channel at a time;
//  - location / attention-weight gradients: per sample, the channels' shares summed in channel
//    order (msda_location_grad_element's sums);
//  - grad_value, atomic: threads own (b, m) planes and add in (q, l, p, corner) order, rounding to
//    grad_value's dtype after each add as atomicAdd does;
//  - grad_value, exact: with planes enough for the threads, the atomic mode's per-plane walk
//    with the engine's partials (PlaneScatter: no records, no sort); otherwise the gather-backward
//    engine (src/internal/gather_backward_cpu.h) over chunks of planes, whose phase 1
//    (msda_sample_records, as msda_exact_records_element) runs in the same pass over the samples
//    as the location gradients. Both give the engine's bits (exact_path).
// Each unit's samples are computed one unit ahead and their corner rows prefetched (UnitSamples).
// The loops live in ms_deform_attn_cpu_kernels.inc, compiled here once per instruction-set
// variant (cpu/cpu_variants.inc); this file keeps the choices that do not depend on it (the exact
// path, the workspace). No result depends on the thread count or the instruction set.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "internal/cpu_isa.h"
#include "internal/gather_backward_cpu.h"
#include "internal/ms_deform_attn_backend.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

namespace {

using detail::kMsdaCorners;
using detail::MsdaLevel;
using detail::MsdaSample;
using detail::MsdaShape;

/// Reads a strided int64 tensor of `n` rows and `cols` columns (cols = 1: rank 1) row-major.
void read_int64(const TensorView& v, std::int64_t n, std::int64_t cols, std::int64_t* out) {
  const auto* p = static_cast<const std::int64_t*>(v.data);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < cols; ++j) out[i * cols + j] = p[i * v.strides[0] + (cols > 1 ? j * v.strides[1] : 0)];
}

void read_levels(const MsdaCall& call, std::int64_t* shapes, std::int64_t* starts, const Context&) {
  read_int64(call.spatial_shapes, call.shape.L, 2, shapes);
  read_int64(call.level_start_index, call.shape.L, 1, starts);
}

/// Grain of (b, m, q) units per thread chunk: about 64k sampled channels. The units run with q
/// fastest, so that a thread's gathers stay in one head's rows of value (a few MB at DINO scale,
/// which the caches hold) rather than all heads' at once.
std::int64_t unit_grain(const MsdaShape& s) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(1, s.L * s.P * s.D));
}

/// The exact mode's workspace: the engine's arrays for one chunk.
template <class A>
WorkspaceLayout exact_layout(const MsdaShape& sh, const char* op) {
  const std::int64_t planes = msda_chunk_planes(sh);
  WorkspaceLayout l;
  add_gather_cpu<A>(l, planes * msda_plane_records(sh), planes * sh.S, op);
  return l;
}

/// A thread's state in the scatter path, all allocated before any gradient is written.
template <class A>
struct ScatterThread {
  std::vector<A> g;       // the unit's grad_output row
  PlaneScatter<A> scatter;
  std::vector<A> sums;    // 16-bit types: the plane's sums
};

/// Bytes of one thread's ScatterThread: per value row a stamped count and D totals, and a 16-bit
/// type's float plane of S x D.
template <class T>
std::size_t scatter_thread_bytes(const MsdaShape& sh) {
  using A = acc_t<T>;
  const std::size_t per_row = sizeof(std::uint64_t) + static_cast<std::size_t>(sh.D) * sizeof(A) *
                                                          (std::is_same_v<T, A> ? 1 : 2);
  return static_cast<std::size_t>(sh.S) * per_row;
}

/// Which exact path the CPU backend runs (either gives the same bits): the scatter when there are
/// planes enough for the threads to own (heads times batch; DINO's encoder: 8) and a thread's
/// scatter state within kScatterThreadBytes, the engine otherwise (its phases use every thread
/// whatever the planes, and its workspace is bounded by its chunks).
CpuExactPath exact_path(const MsdaCall& call) {
  const std::size_t bytes =
      dispatch_floating(call.value.dtype, [&](auto tag) { return scatter_thread_bytes<decltype(tag)>(call.shape); });
  return call.shape.B * call.shape.M >= 4 && bytes <= kScatterThreadBytes ? CpuExactPath::kScatter
                                                                           : CpuExactPath::kEngine;
}

}  // namespace

/// The per-instruction-set entry points (ms_deform_attn_cpu_kernels.inc): the whole forward, and
/// the backward on a given exact path.
struct MsdaCpuKernels {
  void (*forward)(const MsdaCall& call, const Context& ctx);
  void (*backward)(const MsdaCall& call, BackwardMode mode, CpuExactPath path, const Context& ctx, Workspace ws);
};

#define DETOPS_CPU_KERNELS_FILE "ms_deform_attn_cpu_kernels.inc"
#include "cpu/cpu_variants.inc"

namespace {

void forward(const MsdaCall& call, const Context& ctx) { cpu_kernels(ctx).forward(call, ctx); }

std::size_t backward_workspace(const MsdaCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  return ms_deform_attn_cpu_exact_workspace(call, exact_path(call));
}

void backward(const MsdaCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  cpu_kernels(ctx).backward(call, mode, exact_path(call), ctx, ws);
}

}  // namespace

std::size_t ms_deform_attn_cpu_exact_workspace(const MsdaCall& call, CpuExactPath path) {
  if (path == CpuExactPath::kScatter) return 0;
  return call.value.dtype == DType::kFloat64 ? exact_layout<double>(call.shape, call.op).bytes()
                                              : exact_layout<float>(call.shape, call.op).bytes();
}

void ms_deform_attn_cpu_exact_backward(const MsdaCall& call, CpuExactPath path, const Context& ctx, Workspace ws) {
  cpu_kernels(ctx).backward(call, BackwardMode::kExact, path, ctx, ws);
}

extern const MsdaBackend kMsDeformAttnCpu = {read_levels, forward, backward_workspace, backward};

}  // namespace internal
}  // namespace detops
