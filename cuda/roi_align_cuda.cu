// CUDA backend of RoIAlign: thin __global__ wrappers around the per-thread bodies of
// include/detops/detail/roi_align_kernels.h, plus the launch sequences (CUB radix sort, run-length
// encode and scans for the exact mode). All work is enqueued on the caller's stream.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>
#include <type_traits>

#include "atomic_add.cuh"
#include "cuda_check.cuh"
#include "detops/detail/roi_align_kernels.h"
#include "gather_backward.cuh"
#include "internal/roi_align_backend.h"
#include "internal/scratch.h"

namespace detops {
namespace internal {

namespace {

using detail::Strides4;

// ---------------------------------------------------------------------------------------------
// Kernels (each a one-line wrapper of a shared body)

template <class T>
__global__ void forward_kernel(detail::ForwardArgs<T> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::roi_align_forward_element(i, a);
}

template <class T, class V, class Target>
__global__ void scatter_kernel(detail::BackwardArgs<T> a, std::int64_t n, Target* target, detail::GradRounding rounding) {
  DETOPS_GRID_STRIDE(i, n) {
    detail::roi_align_backward_scatter_element<T, V>(i, a, rounding,
                                                     [target](std::int64_t off, V v) { atomic_add(target + off, v); });
  }
}

template <class A>
__global__ void check_kernel(detail::RoiSource rois, detail::RoiAlignShape s, unsigned long long* first_bad,
                             std::int64_t* counts) {
  DETOPS_GRID_STRIDE(k, s.K) {
    detail::roi_align_check_element<A>(k, rois, s, counts, [first_bad](std::int64_t bad) {
      atomicMin(first_bad, static_cast<unsigned long long>(bad));  // integer min: order-independent
    });
  }
}

template <class A>
__global__ void count_kernel(detail::RoiSource rois, detail::RoiAlignShape s, std::int64_t* counts) {
  DETOPS_GRID_STRIDE(k, s.K + 1) detail::roi_align_count_element<A>(k, rois, s, counts);
}

template <class A>
__global__ void init_slots_kernel(detail::ExactRecords<A> rec, std::int64_t n, std::uint64_t sentinel) {
  DETOPS_GRID_STRIDE(j, n) detail::roi_align_exact_init_slot(j, rec, sentinel);
}

template <class A>
__global__ void enumerate_kernel(detail::EnumerateArgs<A> a, std::int64_t n) {
  DETOPS_GRID_STRIDE(t, n) detail::roi_align_exact_enumerate_bin(t, a);
}

/// RoIAlign's own slot fields into sorted order (the engine permutes weights and sources).
template <class A>
__global__ void permute_extras_kernel(const std::int64_t* sorted_ids, detail::ExactRecords<A> from,
                                      detail::ExactRecords<A> to, std::int64_t n) {
  DETOPS_GRID_STRIDE(r, n) detail::roi_align_permute_extras(r, sorted_ids, from, to);
}

/// Phase 3 of the float64 truncated mode: the scatter's contributions in the CPU's order.
template <class T>
__global__ void truncated_gather_kernel(detail::GatherArgs<T> a, const std::int64_t* num_runs, bool channels_last) {
  DETOPS_GRID_STRIDE(t, *num_runs * a.shape.C) detail::roi_align_truncated_gather_element(t, a, channels_last, *num_runs);
}

/// Writes zero into every element of a strided 4-d tensor (gaps keep their bytes).
template <class T>
__global__ void fill_zero_kernel(T* p, Strides4 st, std::int64_t C, std::int64_t H, std::int64_t W, std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::fill_zero_element(i, p, st, C, H, W);
}

template <class T>
__global__ void cast_kernel(const double* buf, T* p, Strides4 st, std::int64_t C, std::int64_t H, std::int64_t W,
                            std::int64_t n) {
  DETOPS_GRID_STRIDE(i, n) detail::roi_align_truncated_store_element(i, buf, p, st, C, H, W);
}

// ---------------------------------------------------------------------------------------------
// Host helpers

/// A dense view (contiguous NCHW or NHWC with no gaps) can be zeroed with one memset.
bool is_dense(const TensorView& v) {
  return v.span_bytes() == v.numel() * static_cast<std::int64_t>(dtype_size(v.dtype));
}

template <class T>
void zero_fill(const TensorView& v, const Context& ctx, const char* op) {
  const std::int64_t n = v.numel();
  if (n == 0) return;
  if (is_dense(v)) {
    DETOPS_CUDA_CHECK(cudaMemsetAsync(v.data, 0, static_cast<std::size_t>(n) * sizeof(T), stream_of(ctx)), op);
    return;
  }
  fill_zero_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(static_cast<T*>(v.data), strides4(v), v.sizes[1],
                                                                   v.sizes[2], v.sizes[3], n);
  check_launch("fill_zero_kernel", op, ctx);
}

/// The exact mode's device workspace, in one fixed order (used for sizing and for carving): the
/// engine's arrays, RoIAlign's own slot fields (unsorted and sorted), and the per-roi counts and
/// offsets. The float64 truncated mode uses it too, with divisors (`with_divisors`).
template <class A>
struct ExactDeviceBuffers {
  GatherCudaBuffers<A> engine{};
  detail::ExactRecords<A> slots{};   // views: the engine's records plus the extras below
  detail::ExactRecords<A> sorted{};
  std::int64_t* counts = nullptr;
  std::int64_t* roi_offsets = nullptr;
};

std::uint64_t sentinel_of(const detail::RoiAlignShape& s) { return static_cast<std::uint64_t>(s.N * s.H * s.W); }

/// CUB's temporary bytes: the engine's phase 2, and the scan of the per-roi counts.
template <class A>
std::size_t cub_temp_bytes(const detail::RoiAlignShape& s, std::int64_t cap, const char* op) {
  std::size_t scan_rois = 0;
  DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_rois, static_cast<const std::int64_t*>(nullptr),
                                                  static_cast<std::int64_t*>(nullptr), s.K + 1),
                    op);
  return std::max(gather_cuda_temp_bytes(cap, sentinel_of(s), op), scan_rois);
}

template <class A>
void add_extras(WorkspaceLayout& l, std::int64_t cap, bool with_divisors) {
  l.add<std::int64_t>(cap);
  l.add<std::int32_t>(cap);
  if (with_divisors) l.add<double>(cap);
}
template <class A>
void take_extras(WorkspaceLayout& l, detail::ExactRecords<A>& r, bool with_divisors) {
  r.am_offsets = l.take<std::int64_t>();
  r.samples = l.take<std::int32_t>();
  r.divisors = with_divisors ? l.take<double>() : nullptr;
}

template <class A>
WorkspaceLayout exact_device_layout(const detail::RoiAlignShape& s, std::int64_t cap, std::size_t temp_bytes,
                                    bool with_divisors) {
  WorkspaceLayout l;
  add_gather_cuda<A>(l, cap, temp_bytes);
  add_extras<A>(l, cap, with_divisors);  // slots
  add_extras<A>(l, cap, with_divisors);  // sorted
  l.add<std::int64_t>(s.K + 1);
  l.add<std::int64_t>(s.K + 1);
  return l;
}

template <class A>
ExactDeviceBuffers<A> carve(WorkspaceLayout& l, void* base, std::size_t temp_bytes, bool with_divisors) {
  l.bind(base);
  ExactDeviceBuffers<A> b;
  b.engine = take_gather_cuda<A>(l, temp_bytes);
  const GatherCudaBuffers<A>& g = b.engine;
  b.slots.keys = g.records.keys;
  b.slots.ids = g.records.ids;
  b.slots.weights = g.records.weights;
  b.slots.go_offsets = g.records.sources;
  take_extras<A>(l, b.slots, with_divisors);
  b.sorted.keys = g.sorted_keys;
  b.sorted.ids = g.sorted_ids;
  b.sorted.weights = g.sorted_weights;
  b.sorted.go_offsets = g.sorted_sources;
  take_extras<A>(l, b.sorted, with_divisors);
  b.counts = l.take<std::int64_t>();
  b.roi_offsets = l.take<std::int64_t>();
  return b;
}

/// The exact mode; with `rounding` (kFloat16 or kBFloat16) the float64 truncated mode, which runs
/// the same phases with divisors and sums truncated contributions in phase 3.
template <class T>
void exact_backward(const RoiAlignCall& call, const RoiCheck& check, const Context& ctx, Workspace ws,
                    detail::GradRounding rounding = detail::GradRounding::kNone) {
  using A = acc_t<T>;
  const bool truncated = rounding != detail::GradRounding::kNone;
  const detail::RoiAlignShape& s = call.shape;
  const char* op = call.op;
  cudaStream_t stream = stream_of(ctx);
  const std::int64_t cap = exact_slot_capacity(s, check);
  if (cap == 0 || s.K == 0) {
    zero_fill<T>(call.features, ctx, op);
    return;
  }
  const std::size_t temp_bytes = cub_temp_bytes<A>(s, cap, op);
  WorkspaceLayout layout = exact_device_layout<A>(s, cap, temp_bytes, truncated);
  if (layout.bytes() > ws.bytes)
    fail(ErrorCode::kInvalidArgument, "{}: workspace has {} bytes; the exact mode needs {} here", op, ws.bytes,
         layout.bytes());
  ExactDeviceBuffers<A> b = carve<A>(layout, ws.data, temp_bytes, truncated);
  const detail::RoiSource rois = roi_source(call.rois);
  const std::uint64_t sentinel = sentinel_of(s);

  zero_fill<T>(call.features, ctx, op);
  // Phase 1: slot offsets per roi, then enumerate.
  count_kernel<A><<<grid_for(s.K + 1), kBlock, 0, stream>>>(rois, s, b.counts);
  check_launch("count_kernel", op, ctx);
  std::size_t tb = temp_bytes;
  DETOPS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(b.engine.temp, tb, b.counts, b.roi_offsets, s.K + 1, stream), op);
  init_slots_kernel<A><<<grid_for(cap), kBlock, 0, stream>>>(b.slots, cap, sentinel);
  check_launch("init_slots_kernel", op, ctx);
  detail::EnumerateArgs<A> ea{rois, b.roi_offsets, s, call.max_pool, strides4(call.pooled),
                              call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0}, b.slots};
  enumerate_kernel<A><<<grid_for(s.K * s.PH * s.PW), kBlock, 0, stream>>>(ea, s.K * s.PH * s.PW);
  check_launch("enumerate_kernel", op, ctx);
  // Phase 2: the engine's stable radix sort by position, permutation and runs; then RoIAlign's
  // own slot fields in sorted order.
  const detail::GatherSorted<A> sorted = gather_sort_cuda(b.engine, cap, sentinel, ctx, op);
  permute_extras_kernel<A><<<grid_for(cap), kBlock, 0, stream>>>(b.sorted.ids, b.slots, b.sorted, cap);
  check_launch("permute_extras_kernel", op, ctx);
  // Phase 3: one fixed-order sum per (run, channel).
  detail::GatherArgs<T> ga = make_gather_args<T>(call, b.sorted, sorted.run_keys, sorted.run_offsets,
                                                 sorted.run_lengths);
  ga.rounding = rounding;
  const bool channels_last = channels_innermost(call.features);
  const std::int64_t max_runs = std::min(cap, s.N * s.H * s.W + 1);
  if (truncated) {
    truncated_gather_kernel<T><<<grid_for(max_runs * s.C), kBlock, 0, stream>>>(ga, b.engine.num_runs, channels_last);
    check_launch("truncated_gather_kernel", op, ctx);
  } else {
    gather_sum_cuda(detail::roi_gather_sum_args(ga), b.engine.num_runs, max_runs, channels_last,
                    detail::roi_gather_target(ga), ctx, op, ga.active);
  }
}

template <class T>
detail::BackwardArgs<T> backward_args(const RoiAlignCall& call, const Strides4& target) {
  detail::BackwardArgs<T> a{};
  a.grad_output = static_cast<const T*>(call.pooled.data);
  a.go = strides4(call.pooled);
  a.rois = roi_source(call.rois);
  a.gi = target;
  a.argmax = static_cast<const std::int32_t*>(call.argmax.data);
  a.am = call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0};
  a.shape = call.shape;
  a.max_pool = call.max_pool;
  a.channels_last = channels_innermost(call.pooled);
  return a;
}

// ---------------------------------------------------------------------------------------------
// Entry points

RoiCheck check_rois(const RoiAlignCall& call, bool need_total, const Context& ctx) {
  const char* op = call.op;
  DeviceGuard guard(call.features.device.index, op);
  cudaStream_t stream = stream_of(ctx);
  const detail::RoiAlignShape& s = call.shape;
  const detail::RoiSource rois = roi_source(call.rois);
  // A forward call only validates: no per-roi counts, no reduction (need_total is the backward's).
  std::size_t reduce_bytes = 0;
  if (need_total)
    DETOPS_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, reduce_bytes, static_cast<const std::int64_t*>(nullptr),
                                             static_cast<std::int64_t*>(nullptr), s.K),
                      op);
  WorkspaceLayout l;
  l.add<unsigned long long>(1);
  l.add<std::int64_t>(1);
  l.add<std::int64_t>(need_total ? s.K : 0);
  l.add_bytes(reduce_bytes);
  const Scratch scratch(op, l.bytes(), call.features.device, ctx);
  scratch.bind(l);
  auto* first_bad = l.take<unsigned long long>();
  auto* total = l.take<std::int64_t>();
  std::int64_t* counts = l.take<std::int64_t>();
  if (!need_total) counts = nullptr;  // check_kernel then only validates
  void* temp = l.take<unsigned char>();

  const unsigned long long none = static_cast<unsigned long long>(s.K);
  DETOPS_CUDA_CHECK(cudaMemcpyAsync(first_bad, &none, sizeof(none), cudaMemcpyHostToDevice, stream), op);
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using A = acc_t<decltype(tag)>;
    check_kernel<A><<<grid_for(s.K), kBlock, 0, stream>>>(rois, s, first_bad, counts);
  });
  check_launch("check_kernel", op, ctx);
  if (need_total) DETOPS_CUDA_CHECK(cub::DeviceReduce::Sum(temp, reduce_bytes, counts, total, s.K, stream), op);
  unsigned long long bad = none;
  std::int64_t sum = 0;
  DETOPS_CUDA_CHECK(cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream), op);
  if (need_total)
    DETOPS_CUDA_CHECK(cudaMemcpyAsync(&sum, total, sizeof(sum), cudaMemcpyDeviceToHost, stream), op);
  DETOPS_CUDA_CHECK(cudaStreamSynchronize(stream), op);  // the one documented wait

  RoiCheck check;
  check.total_samples = sum;
  if (bad < none) {
    // Bring the offending row to the host and re-run the shared check there for the message.
    check.bad_row = static_cast<std::int64_t>(bad);
    const std::size_t es = dtype_size(call.rois.dtype);
    alignas(8) unsigned char host_row[5 * 8];  // read back as float or double
    for (int i = 0; i < 5; ++i) {
      const auto* src = static_cast<const unsigned char*>(call.rois.data) +
                        (check.bad_row * call.rois.strides[0] + i * call.rois.strides[1]) * es;
      DETOPS_CUDA_CHECK(cudaMemcpyAsync(host_row + i * es, src, es, cudaMemcpyDeviceToHost, stream), op);
    }
    DETOPS_CUDA_CHECK(cudaStreamSynchronize(stream), op);  // an error path: a second wait is fine
    detail::load_roi_row(host_row, call.rois.dtype, 1, 1, 0, check.row);
    dispatch_floating(call.features.dtype, [&](auto tag) {
      using A = acc_t<decltype(tag)>;
      const detail::RoiBox<A> box = detail::make_roi_box<A>(check.row[0], check.row + 1, s);
      check.status = box.status;
      check.grid_h = box.grid_h;
      check.grid_w = box.grid_w;
    });
  }
  return check;
}

void forward(const RoiAlignCall& call, const Context& ctx) {
  DeviceGuard guard(call.features.device.index, call.op);
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::ForwardArgs<T> a{};
    a.input = static_cast<const T*>(call.features.data);
    a.in = strides4(call.features);
    a.rois = roi_source(call.rois);
    a.output = static_cast<T*>(call.pooled.data);
    a.out = strides4(call.pooled);
    a.argmax = static_cast<std::int32_t*>(call.argmax.data);
    a.am = call.max_pool ? strides4(call.argmax) : Strides4{0, 0, 0, 0};
    a.shape = call.shape;
    a.max_pool = call.max_pool;
    a.channels_last = channels_innermost(call.pooled);
    const std::int64_t n = call.pooled.numel();
    forward_kernel<T><<<grid_for(n), kBlock, 0, stream_of(ctx)>>>(a, n);
    check_launch("forward_kernel", call.op, ctx);
  });
}

std::size_t backward_workspace(const RoiAlignCall& call, const RoiCheck& check, BackwardMode mode) {
  DeviceGuard guard(call.features.device.index, call.op);  // CUB's temp sizes depend on the device
  const detail::RoiAlignShape& s = call.shape;
  switch (mode) {
    case BackwardMode::kAtomic: return 0;
    case BackwardMode::kTruncated: {
      if (call.features.dtype == DType::kFloat64) {  // the exact mode's phases, with divisors
        const std::int64_t cap = exact_slot_capacity(s, check);
        return exact_device_layout<double>(s, cap, cub_temp_bytes<double>(s, cap, call.op), true).bytes();
      }
      WorkspaceLayout l;
      l.add<double>(s.N * s.C * s.H * s.W);
      return l.bytes();
    }
    case BackwardMode::kExact:
      return dispatch_floating(call.features.dtype, [&](auto tag) {
        using A = acc_t<decltype(tag)>;
        const std::int64_t cap = exact_slot_capacity(s, check);
        return exact_device_layout<A>(s, cap, cub_temp_bytes<A>(s, cap, call.op), false).bytes();
      });
  }
  return 0;
}

void backward(const RoiAlignCall& call, const RoiCheck& check, const RoiAlignBackwardOptions& opt, const Context& ctx,
              Workspace ws) {
  DeviceGuard guard(call.features.device.index, call.op);
  dispatch_floating(call.features.dtype, [&](auto tag) {
    using T = decltype(tag);
    const detail::RoiAlignShape& s = call.shape;
    cudaStream_t stream = stream_of(ctx);
    const std::int64_t n = call.pooled.numel();
    switch (opt.mode) {
      case BackwardMode::kAtomic: {
        zero_fill<T>(call.features, ctx, call.op);
        if (n == 0) break;
        auto a = backward_args<T>(call, strides4(call.features));
        scatter_kernel<T, acc_t<T>, T><<<grid_for(n), kBlock, 0, stream>>>(a, n, static_cast<T*>(call.features.data),
                                                                            detail::GradRounding::kNone);
        check_launch("scatter_kernel", call.op, ctx);
        break;
      }
      case BackwardMode::kTruncated: {
        if constexpr (std::is_same_v<T, double>) {
          // Double atomics would leave the scheduling order in the result: the CPU's order instead.
          exact_backward<T>(call, check, ctx, ws, grad_rounding(opt));
          break;
        }
        const std::int64_t total = s.N * s.C * s.H * s.W;
        if (s.K == 0) {  // no workspace was sized: nothing to accumulate
          zero_fill<T>(call.features, ctx, call.op);
          break;
        }
        auto* buf = static_cast<double*>(ws.data);
        DETOPS_CUDA_CHECK(cudaMemsetAsync(buf, 0, static_cast<std::size_t>(total) * sizeof(double), stream), call.op);
        if (n > 0) {
          auto a = backward_args<T>(call, Strides4{s.C * s.H * s.W, s.H * s.W, s.W, 1});
          scatter_kernel<T, double, double><<<grid_for(n), kBlock, 0, stream>>>(a, n, buf, grad_rounding(opt));
          check_launch("scatter_kernel", call.op, ctx);
        }
        cast_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(buf, static_cast<T*>(call.features.data),
                                                               strides4(call.features), s.C, s.H, s.W, total);
        check_launch("cast_kernel", call.op, ctx);
        break;
      }
      case BackwardMode::kExact:
        exact_backward<T>(call, check, ctx, ws);
        break;
    }
  });
}

bool uses_slots(const RoiAlignCall& call, BackwardMode mode) {
  return mode == BackwardMode::kExact || (mode == BackwardMode::kTruncated && call.features.dtype == DType::kFloat64);
}

}  // namespace

extern const RoiAlignBackend kRoiAlignCuda = {&check_rois, &forward, &backward_workspace, &backward, &uses_slots};

}  // namespace internal
}  // namespace detops
