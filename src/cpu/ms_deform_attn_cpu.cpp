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
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

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

/// Gathers the four corner rows of sample s (channels of head m in image b) into cv[c * D + d],
/// zeros for a corner outside the level: the values msda_corner_value reads.
template <class T, class Loc, class A>
void gather_corners(const detail::MsdaInputs<T, Loc>& in, const MsdaSample<A>& s, std::int64_t b, std::int64_t m,
                    A* cv) {
  const std::int64_t D = in.shape.D, sd = in.vs[3];
  if (D == 0) return;  // nothing to gather, and value may be null (null plus an offset is undefined)
  for (int c = 0; c < kMsdaCorners; ++c) {
    A* row = cv + c * D;
    if (!s.inside[c]) {
      std::fill(row, row + D, A(0));
      continue;
    }
    const T* v = in.value + b * in.vs[0] + s.row[c] * in.vs[1] + m * in.vs[2];
    if (sd == 1) {
      for (std::int64_t d = 0; d < D; ++d) row[d] = to_acc(v[d]);
    } else {
      for (std::int64_t d = 0; d < D; ++d) row[d] = to_acc(v[d * sd]);
    }
  }
}

/// Grain of (b, m, q) units per thread chunk: about 64k sampled channels. The units run with q
/// fastest, so that a thread's gathers stay in one head's rows of value (a few MB at DINO scale,
/// which the caches hold) rather than all heads' at once.
std::int64_t unit_grain(const MsdaShape& s) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(1, s.L * s.P * s.D));
}

/// Starts loading the cache lines of one corner row (its D channels when they are contiguous).
template <class T>
void prefetch_row(const T* row, std::int64_t D, std::int64_t sd) {
  if (D <= 0) return;  // no row to load (and an empty tensor's data may be null: no arithmetic on it)
#if defined(__GNUC__) || defined(__clang__)
  const char* first = reinterpret_cast<const char*>(row);
  const char* last = reinterpret_cast<const char*>(row + (sd == 1 ? D - 1 : 0));
  for (const char* c = first; c < last; c += 64) __builtin_prefetch(c);
  __builtin_prefetch(last);
#else
  (void)row, (void)D, (void)sd;
#endif
}

/// The L * P samples of one (b, m, q) unit with their attention weights, computed one unit ahead
/// of their use: their corner rows are prefetched while the unit before is summed, since the
/// gathers are random and a miss costs more than a sample's arithmetic.
template <class A>
struct UnitSamples {
  std::int64_t b = 0, m = 0, q = 0;
  std::vector<MsdaSample<A>> samples;
  std::vector<A> attn;
  explicit UnitSamples(const MsdaShape& sh)
      : samples(static_cast<std::size_t>(sh.L * sh.P)), attn(static_cast<std::size_t>(sh.L * sh.P)) {}

  /// `rows` [B, S, M, D] with strides `rs`: the tensor whose corner rows the unit will touch
  /// (value, or grad_value for the scatter).
  template <class T, class Loc>
  void prepare(const detail::MsdaInputs<T, Loc>& in, const std::vector<MsdaLevel>& levels, std::int64_t u,
               const T* rows, const std::int64_t* rs) {
    const MsdaShape& sh = in.shape;
    q = u % sh.Q;
    m = (u / sh.Q) % sh.M;
    b = u / (sh.Q * sh.M);
    // no channels: the data may be null, and null plus an offset is undefined (clang's UBSan)
    const T* head = sh.D > 0 && rows != nullptr ? rows + b * rs[0] + m * rs[2] : nullptr;
    for (std::int64_t l = 0, k = 0; l < sh.L; ++l) {
      for (std::int64_t p = 0; p < sh.P; ++p, ++k) {
        A x, y;
        detail::msda_load_location(in, b, q, m, l, p, x, y);
        MsdaSample<A>& s = samples[static_cast<std::size_t>(k)];
        s = detail::msda_sample(x, y, levels[static_cast<std::size_t>(l)]);
        if (!s.valid) continue;
        attn[static_cast<std::size_t>(k)] = detail::msda_load_attention<A>(in, b, q, m, l, p);
        for (int c = 0; c < kMsdaCorners && head != nullptr; ++c)
          if (s.inside[c]) prefetch_row(head + s.row[c] * rs[1], sh.D, rs[3]);
      }
    }
  }
};

/// Runs body(unit) over units [u0, u1), each prepared one unit ahead (corner rows of `rows`, by
/// default value, prefetched).
template <class A, class T, class Loc, class Body>
void pipelined_units(const detail::MsdaInputs<T, Loc>& in, const std::vector<MsdaLevel>& levels, std::int64_t u0,
                     std::int64_t u1, Body&& body, const T* rows = nullptr, const std::int64_t* rs = nullptr) {
  if (rows == nullptr) rows = in.value, rs = in.vs;
  UnitSamples<A> cur(in.shape), next(in.shape);
  if (u0 < u1) cur.prepare(in, levels, u0, rows, rs);
  for (std::int64_t u = u0; u < u1; ++u) {
    if (u + 1 < u1) next.prepare(in, levels, u + 1, rows, rs);
    body(static_cast<const UnitSamples<A>&>(cur));
    std::swap(cur, next);
  }
}

template <class T, class Loc>
void forward_impl(const MsdaCall& call, const Context& ctx) {
  using A = acc_t<T>;
  const MsdaShape& sh = call.shape;
  const detail::MsdaInputs<T, Loc> in = msda_inputs<T, Loc>(call, call.levels.data());
  T* out = static_cast<T*>(call.output.data);
  const std::int64_t* os = call.output.strides;
  const std::int64_t D = sh.D, LP = sh.L * sh.P;
  parallel_for(sh.B * sh.M * sh.Q, unit_grain(sh), ctx.resolved_threads(), [&](std::int64_t u0, std::int64_t u1) {
    std::vector<A> buf(static_cast<std::size_t>(5 * D));
    A* cv = buf.data();
    A* acc = cv + 4 * D;
    pipelined_units<A>(in, call.levels, u0, u1, [&](const UnitSamples<A>& unit) {
      std::fill(acc, acc + D, A(0));
      for (std::int64_t k = 0; k < LP; ++k) {
        // a copy: the compiler then knows the channel loop's stores do not change it
        const MsdaSample<A> s = unit.samples[static_cast<std::size_t>(k)];
        if (!s.valid) continue;
        const A attn = unit.attn[static_cast<std::size_t>(k)];
        gather_corners(in, s, unit.b, unit.m, cv);
        const A *v0 = cv, *v1 = cv + D, *v2 = cv + 2 * D, *v3 = cv + 3 * D;
        for (std::int64_t d = 0; d < D; ++d) acc[d] = acc[d] + detail::msda_bilinear(s, v0[d], v1[d], v2[d], v3[d]) * attn;
      }
      T* o = out + unit.b * os[0] + unit.q * os[1] + unit.m * D * os[2];
      for (std::int64_t d = 0; d < D; ++d) o[d * os[2]] = from_acc<T>(acc[d]);
    });
  });
}

void forward(const MsdaCall& call, const Context& ctx) {
  dispatch_msda(call.value.dtype, call.sampling_locations.dtype, [&](auto t, auto loc) {
    forward_impl<decltype(t), decltype(loc)>(call, ctx);
  });
}

/// grad_sampling_locations and grad_attention_weights (when requested: either may be absent) of
/// units [begin, end), and then `also(unit)` for each unit: the exact mode writes its records in
/// the same pass, from the same samples.
template <class T, class Loc, class Also>
void location_grads(const MsdaCall& call, const detail::MsdaBackwardArgs<T, Loc>& a, std::int64_t begin,
                    std::int64_t end, int threads, const Also& also) {
  using A = acc_t<T>;
  const MsdaShape& sh = call.shape;
  const std::int64_t D = sh.D;
  const bool wanted = a.grad_loc || a.grad_attn;
  parallel_for(end - begin, unit_grain(sh), threads, [&](std::int64_t c0, std::int64_t c1) {
    const std::int64_t u0 = begin + c0, u1 = begin + c1;
    std::vector<A> buf(static_cast<std::size_t>(8 * D));
    A* cv = buf.data();
    A* g = cv + 4 * D;
    A *rx = g + D, *ry = rx + D, *ra = ry + D;
    pipelined_units<A>(a.in, call.levels, u0, u1, [&](const UnitSamples<A>& unit) {
      also(unit);
      if (!wanted) return;
      const std::int64_t b = unit.b, m = unit.m, q = unit.q;
      if (D > 0) {  // without channels grad_out may be null
        const T* go = a.grad_out + b * a.gos[0] + q * a.gos[1] + m * D * a.gos[2];
        for (std::int64_t d = 0; d < D; ++d) g[d] = to_acc(go[d * a.gos[2]]);
      }
      for (std::int64_t l = 0, k = 0; l < sh.L; ++l) {
        const MsdaLevel& lv = call.levels[static_cast<std::size_t>(l)];
        for (std::int64_t p = 0; p < sh.P; ++p, ++k) {
          const MsdaSample<A> s = unit.samples[static_cast<std::size_t>(k)];  // a copy, as in forward_impl
          A gx = A(0), gy = A(0), ga = A(0);
          if (s.valid) {
            const A attn = unit.attn[static_cast<std::size_t>(k)];
            gather_corners(a.in, s, b, m, cv);
            const A *v0 = cv, *v1 = cv + D, *v2 = cv + 2 * D, *v3 = cv + 3 * D;
            for (std::int64_t d = 0; d < D; ++d) {  // independent per channel: vectorizable
              const detail::MsdaSampleGrad<A> r = detail::msda_sample_grad(s, lv, g[d], attn, v0[d], v1[d], v2[d], v3[d]);
              rx[d] = r.x;
              ry[d] = r.y;
              ra[d] = r.attention;
            }
            for (std::int64_t d = 0; d < D; ++d) {  // the sums, in channel order
              gx = gx + rx[d];
              gy = gy + ry[d];
              ga = ga + ra[d];
            }
          }
          if (a.grad_loc) {
            Loc* o = a.grad_loc + b * a.gls[0] + q * a.gls[1] + m * a.gls[2] + l * a.gls[3] + p * a.gls[4];
            o[0] = static_cast<Loc>(gx);
            o[a.gls[5]] = static_cast<Loc>(gy);
          }
          if (a.grad_attn)
            a.grad_attn[b * a.gas[0] + q * a.gas[1] + m * a.gas[2] + l * a.gas[3] + p * a.gas[4]] = from_acc<T>(ga);
        }
      }
    });
  });
}

/// Every element of grad_value set to zero, planes in parallel.
template <class T>
void zero_value(const MsdaCall& call, int threads) {
  const MsdaShape& sh = call.shape;
  T* gv = static_cast<T*>(call.grad_value.data);
  const std::int64_t* st = call.grad_value.strides;
  parallel_for(sh.B * sh.S, 1024, threads, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      T* row = gv + (r / sh.S) * st[0] + (r % sh.S) * st[1];
      for (std::int64_t m = 0; m < sh.M; ++m)
        for (std::int64_t d = 0; d < sh.D; ++d) row[m * st[2] + d * st[3]] = T(0.0f);
    }
  });
}

/// The atomic mode on the CPU: threads own (b, m) planes; each plane's adds in (q, l, p, corner)
/// order, each rounded to T.
template <class T, class Loc>
void scatter_value(const MsdaCall& call, const detail::MsdaBackwardArgs<T, Loc>& a, int threads) {
  using A = acc_t<T>;
  const MsdaShape& sh = call.shape;
  const std::int64_t D = sh.D, gd = a.gvs[3];
  parallel_for(sh.B * sh.M, 1, threads, [&](std::int64_t p0, std::int64_t p1) {
    std::vector<A> g(static_cast<std::size_t>(D));
    const auto add_unit = [&](const UnitSamples<A>& unit) {
      const T* go = a.grad_out + unit.b * a.gos[0] + unit.q * a.gos[1] + unit.m * D * a.gos[2];
      for (std::int64_t d = 0; d < D; ++d) g[d] = to_acc(go[d * a.gos[2]]);
      T* head = a.grad_value + unit.b * a.gvs[0] + unit.m * a.gvs[2];
      for (std::int64_t k = 0; k < sh.L * sh.P; ++k) {
        const MsdaSample<A> s = unit.samples[static_cast<std::size_t>(k)];
        if (!s.valid) continue;
        for (int c = 0; c < kMsdaCorners; ++c) {
          if (!s.inside[c]) continue;
          const A w = detail::msda_corner_weight(s, c, unit.attn[static_cast<std::size_t>(k)]);
          T* row = head + s.row[c] * a.gvs[1];
          for (std::int64_t d = 0; d < D; ++d) row[d * gd] = from_acc<T>(to_acc(row[d * gd]) + g[d] * w);
        }
      }
    };
    // a plane's units are consecutive in the (b, m, q) order
    pipelined_units<A>(a.in, call.levels, p0 * sh.Q, p1 * sh.Q, add_unit, static_cast<const T*>(a.grad_value), a.gvs);
  });
}

/// The exact mode's workspace: the engine's arrays for one chunk.
template <class A>
WorkspaceLayout exact_layout(const MsdaShape& sh) {
  const std::int64_t planes = msda_chunk_planes(sh);
  WorkspaceLayout l;
  add_gather_cpu<A>(l, planes * msda_plane_records(sh), planes * sh.S);
  return l;
}

template <class T, class Loc>
void exact_value(const MsdaCall& call, const detail::MsdaBackwardArgs<T, Loc>& a, int threads, Workspace ws) {
  using A = acc_t<T>;
  const MsdaShape& sh = call.shape;
  WorkspaceLayout layout = exact_layout<A>(sh);
  if (layout.bytes() > ws.bytes)
    fail(ErrorCode::kInvalidArgument, "{}: workspace has {} bytes; the exact mode needs {} here", call.op, ws.bytes,
         layout.bytes());
  layout.bind(ws.data);
  const GatherCpuBuffers<A> buf = take_gather_cpu<A>(layout);
  const std::int64_t chunk = msda_chunk_planes(sh), per_plane = msda_plane_records(sh) / kMsdaCorners;
  for (std::int64_t plane0 = 0; plane0 < sh.B * sh.M; plane0 += chunk) {
    const std::int64_t planes = std::min(chunk, sh.B * sh.M - plane0);
    const std::uint64_t sentinel = static_cast<std::uint64_t>(planes * sh.S);
    // phase 1 with the chunk's location gradients, one pass over its samples: unit (plane, q) owns
    // records 4 t .. 4 t + 3 of its samples t = (local plane * Q + q) * L * P + k
    location_grads(call, a, plane0 * sh.Q, (plane0 + planes) * sh.Q, threads, [&](const UnitSamples<A>& unit) {
      const std::int64_t local = unit.b * sh.M + unit.m - plane0;
      const std::int64_t source = unit.b * a.gos[0] + unit.q * a.gos[1] + unit.m * sh.D * a.gos[2];
      const std::int64_t t0 = (local * sh.Q + unit.q) * sh.L * sh.P;
      for (std::int64_t k = 0; k < sh.L * sh.P; ++k) {
        const MsdaSample<A>& s = unit.samples[static_cast<std::size_t>(k)];
        detail::msda_sample_records(s, s.valid ? unit.attn[static_cast<std::size_t>(k)] : A(0), t0 + k, local, sh.S,
                                    source, sentinel, buf.records);
      }
    });
    detail::GatherSorted<A> sorted{};
    const std::int64_t runs = gather_sort_cpu(buf, planes * per_plane * kMsdaCorners, sentinel, threads, sorted);
    detail::GatherSumArgs<T, A> sum{sorted, a.grad_out, a.gos[2], a.grad_value, a.gvs[3], sh.D, sentinel,
                                    detail::kGatherPartial};
    gather_sum_cpu(sum, runs, msda_value_target(call, plane0), threads);
  }
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

/// Exact mode without the engine: threads own (b, m) planes, as in the atomic mode, and walk each
/// plane's units in (q, l, p, corner) order, which is the engine's canonical order for every row
/// of grad_value (msda_sample_records numbers the records so, and the engine sorts them stably by
/// row), adding the D channels of a record into its row with the engine's partials
/// (PlaneScatter, one row of D per destination), so every element gets the engine's bits. The
/// location gradients come from the same pass over the samples. 16-bit types add in a float
/// plane of their own, rounded once into grad_value at the plane's end.
template <class T, class Loc>
void exact_scatter_value(const MsdaCall& call, const detail::MsdaBackwardArgs<T, Loc>& a, int threads) {
  using A = acc_t<T>;
  constexpr bool kSameType = std::is_same_v<T, A>;
  const MsdaShape& sh = call.shape;
  const std::int64_t D = sh.D, gd = kSameType ? a.gvs[3] : 1;
  const auto make = [&] {
    return ScatterThread<A>{std::vector<A>(static_cast<std::size_t>(D)),
                            PlaneScatter<A>(sh.S, detail::kGatherPartial, D),
                            std::vector<A>(kSameType ? 0 : static_cast<std::size_t>(sh.S * D))};
  };
  const auto walk = [&](ScatterThread<A>& state, std::int64_t p0, std::int64_t p1) {
    std::vector<A>& g = state.g;
    PlaneScatter<A>& scatter = state.scatter;
    std::vector<A>& sums = state.sums;
    for (std::int64_t plane = p0; plane < p1; ++plane) {
      T* head = a.grad_value + (plane / sh.M) * a.gvs[0] + (plane % sh.M) * a.gvs[2];
      const auto row_of = [&](std::int64_t r) -> A* {
        if constexpr (kSameType) return head + r * a.gvs[1];
        else return sums.data() + r * D;
      };
      scatter.next_plane();
      if constexpr (!kSameType) std::fill(sums.begin(), sums.end(), A(0));
      location_grads(call, a, plane * sh.Q, (plane + 1) * sh.Q, 1, [&](const UnitSamples<A>& unit) {
        const T* go = a.grad_out + unit.b * a.gos[0] + unit.q * a.gos[1] + unit.m * D * a.gos[2];
        for (std::int64_t d = 0; d < D; ++d) g[static_cast<std::size_t>(d)] = to_acc(go[d * a.gos[2]]);
        for (std::int64_t k = 0; k < sh.L * sh.P; ++k) {
          const MsdaSample<A>& s = unit.samples[static_cast<std::size_t>(k)];
          if (!s.valid) continue;
          for (int c = 0; c < kMsdaCorners; ++c) {
            if (!s.inside[c]) continue;
            const A w = detail::msda_corner_weight(s, c, unit.attn[static_cast<std::size_t>(k)]);
            A* row = row_of(s.row[c]);
            if (scatter.count(s.row[c])) scatter.fold(s.row[c], row, gd);
            for (std::int64_t d = 0; d < D; ++d) row[d * gd] = row[d * gd] + g[static_cast<std::size_t>(d)] * w;
          }
        }
      });
      scatter.finish(row_of, gd);
      if constexpr (!kSameType) {
        for (std::int64_t r = 0; r < sh.S; ++r)
          for (std::int64_t d = 0; d < D; ++d)
            head[r * a.gvs[1] + d * a.gvs[3]] = from_acc<T>(sums[static_cast<std::size_t>(r * D + d)]);
      }
    }
  };
  run_owned(call.op, sh.B * sh.M, threads, scatter_thread_bytes<T>(sh), make, [&] { zero_value<T>(call, threads); },
            walk);
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

std::size_t backward_workspace(const MsdaCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  return ms_deform_attn_cpu_exact_workspace(call, exact_path(call));
}

void backward_on_path(const MsdaCall& call, BackwardMode mode, CpuExactPath path, const Context& ctx, Workspace ws) {
  const int threads = ctx.resolved_threads();
  dispatch_msda(call.value.dtype, call.sampling_locations.dtype, [&](auto t, auto loc) {
    using T = decltype(t);
    using Loc = decltype(loc);
    const detail::MsdaBackwardArgs<T, Loc> a = msda_backward_args<T, Loc>(call, call.levels.data());
    const MsdaShape& sh = call.shape;
    const bool value_grad = a.grad_value && call.grad_value.numel() > 0;
    const bool exact = value_grad && mode == BackwardMode::kExact && msda_has_samples(sh);
    // the exact mode computes the location gradients in its own pass over the samples
    if (!exact && (a.grad_loc || a.grad_attn))
      location_grads(call, a, 0, sh.B * sh.M * sh.Q, threads, [](const UnitSamples<acc_t<T>>&) {});
    if (!value_grad) return;
    if (exact && path == CpuExactPath::kScatter) {
      exact_scatter_value(call, a, threads);  // zero-fills once its scratch is allocated
      return;
    }
    zero_value<T>(call, threads);
    if (exact) {
      exact_value(call, a, threads, ws);
    } else if (mode == BackwardMode::kAtomic) {
      scatter_value(call, a, threads);
    }
  });
}

void backward(const MsdaCall& call, BackwardMode mode, const Context& ctx, Workspace ws) {
  backward_on_path(call, mode, exact_path(call), ctx, ws);
}

}  // namespace

std::size_t ms_deform_attn_cpu_exact_workspace(const MsdaCall& call, CpuExactPath path) {
  if (path == CpuExactPath::kScatter) return 0;
  return call.value.dtype == DType::kFloat64 ? exact_layout<double>(call.shape).bytes()
                                              : exact_layout<float>(call.shape).bytes();
}

void ms_deform_attn_cpu_exact_backward(const MsdaCall& call, CpuExactPath path, const Context& ctx, Workspace ws) {
  backward_on_path(call, BackwardMode::kExact, path, ctx, ws);
}

extern const MsdaBackend kMsDeformAttnCpu = {read_levels, forward, backward_workspace, backward};

}  // namespace internal
}  // namespace detops
