// Multi-scale deformable attention's CUDA steps, written once over the device interface
// (internal/device_steps.h): the forward, the location and attention-weight gradients, grad_value's
// zero fill and its atomic scatter or exact mode (the gather engine over chunks of (b, m) planes),
// as launches of the per-thread bodies of include/detops/detail/ms_deform_attn_kernels.h.
// cuda/ms_deform_attn_cuda.cu runs them on CudaDevice with the level table it uploads;
// tests/ms_deform_attn_emulated_test.cpp runs the very same code on the emulated device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "detops/detail/gather_backward.h"
#include "detops/detail/ms_deform_attn_kernels.h"
#include "internal/device_steps.h"
#include "internal/ms_deform_attn_backend.h"

namespace detops {
namespace internal {
namespace msda_device {

template <class T, class Loc>
struct ForwardBody {
  detail::MsdaForwardArgs<T, Loc> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::msda_forward_element(i, a); }
};

template <class T>
struct ZeroValueBody {
  T* p;
  detail::MsdaShape sh;
  std::int64_t s0, s1, s2, s3;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::msda_zero_value_element(i, p, s0, s1, s2, s3, sh); }
};

template <class T, class Loc, class Add>
struct ScatterBody {
  detail::MsdaBackwardArgs<T, Loc> a;
  Add add;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::msda_value_scatter_element(i, a, add); }
};

template <class T, class Loc>
struct LocationGradBody {
  detail::MsdaBackwardArgs<T, Loc> a;
  DETOPS_HOST_DEVICE void operator()(std::int64_t i) const { detail::msda_location_grad_element(i, a); }
};

template <class T, class Loc>
struct RecordsBody {
  detail::MsdaBackwardArgs<T, Loc> a;
  std::int64_t plane0;
  detail::GatherKey sentinel;
  detail::GatherRecords<acc_t<T>> rec;
  DETOPS_HOST_DEVICE void operator()(std::int64_t t) const {
    detail::msda_exact_records_element(t, a, plane0, sentinel, rec);
  }
};

/// The exact mode's records per chunk (see msda_chunk_planes) and the chunk's sentinel.
inline std::int64_t chunk_records(const MsdaCall& call) {
  return msda_chunk_planes(call.shape) * msda_plane_records(call.shape);
}
inline std::int64_t chunk_sentinel(const MsdaCall& call) {
  return msda_chunk_planes(call.shape) * call.shape.S;
}

template <class A>
WorkspaceLayout exact_layout(const MsdaCall& call, std::size_t temp_bytes) {
  WorkspaceLayout l;
  add_gather<A>(l, chunk_records(call), temp_bytes);
  return l;
}

/// Exact mode: per chunk of planes, phase 1, the engine's sort and its sums into grad_value
/// (zeroed before).
template <class T, class Loc, class Dev>
void exact_value(const Dev& dev, const MsdaCall& call, const detail::MsdaBackwardArgs<T, Loc>& a, Workspace ws) {
  using A = acc_t<T>;
  const detail::MsdaShape& sh = call.shape;
  const std::size_t temp_bytes = gather_temp_bytes(dev, chunk_records(call), chunk_sentinel(call));
  WorkspaceLayout layout = exact_layout<A>(call, temp_bytes);
  if (layout.bytes() > ws.bytes)
    fail(ErrorCode::kInvalidArgument, "{}: workspace has {} bytes; the exact mode needs {} here", call.op, ws.bytes,
         layout.bytes());
  layout.bind(ws.data);
  const GatherDeviceBuffers<A> buf = take_gather<A>(layout, temp_bytes);
  const std::int64_t chunk = msda_chunk_planes(sh), per_plane = msda_plane_records(sh) / detail::kMsdaCorners;
  const bool channels_fastest = call.grad_value.strides[3] == 1;
  for (std::int64_t plane0 = 0; plane0 < sh.B * sh.M; plane0 += chunk) {
    const std::int64_t planes = std::min(chunk, sh.B * sh.M - plane0);
    const std::int64_t samples = planes * per_plane, n = samples * detail::kMsdaCorners;
    const auto sentinel = static_cast<detail::GatherKey>(planes * sh.S);
    dev.launch("msda_records", samples, RecordsBody<T, Loc>{a, plane0, sentinel, buf.records});
    const detail::GatherSorted<A> sorted = gather_sort(dev, buf, n, sentinel);
    const detail::GatherSumArgs<T, A> sum{sorted, a.grad_out, a.gos[2], a.grad_value, a.gvs[3], sh.D, sentinel,
                                          detail::kGatherPartial};
    gather_sum(dev, sum, buf.num_runs, std::min<std::int64_t>(n, planes * sh.S + 1), channels_fastest,
               msda_value_target(call, plane0));
  }
}

}  // namespace msda_device

/// The forward on `dev` into call.output; `levels`: the level table where the device reads it.
template <class T, class Loc, class Dev>
void msda_forward_on(const Dev& dev, const MsdaCall& call, const detail::MsdaLevel* levels) {
  detail::MsdaForwardArgs<T, Loc> a{};
  a.in = msda_inputs<T, Loc>(call, levels);
  a.out = static_cast<T*>(call.output.data);
  copy_strides(call.output, a.os);
  dev.launch("msda_forward", call.output.numel(), msda_device::ForwardBody<T, Loc>{a});
}

/// Bytes of the backward's workspace on `dev` for `mode` (the exact mode's engine; 0 otherwise).
template <class Dev>
std::size_t msda_backward_workspace_on(const Dev& dev, const MsdaCall& call, BackwardMode mode) {
  if (mode != BackwardMode::kExact) return 0;
  const std::size_t temp_bytes =
      gather_temp_bytes(dev, msda_device::chunk_records(call), msda_device::chunk_sentinel(call));
  return call.value.dtype == DType::kFloat64 ? msda_device::exact_layout<double>(call, temp_bytes).bytes()
                                              : msda_device::exact_layout<float>(call, temp_bytes).bytes();
}

/// The backward on `dev`: the location / attention-weight gradients, then grad_value (zeroed,
/// then scattered the mode's way).
template <class T, class Loc, class Dev>
void msda_backward_on(const Dev& dev, const MsdaCall& call, BackwardMode mode, const detail::MsdaLevel* levels,
                      Workspace ws) {
  const detail::MsdaShape& sh = call.shape;
  const detail::MsdaBackwardArgs<T, Loc> a = msda_backward_args<T, Loc>(call, levels);
  if (a.grad_loc || a.grad_attn)
    dev.launch("msda_location_grad", sh.B * sh.Q * sh.M * sh.L * sh.P, msda_device::LocationGradBody<T, Loc>{a});
  const std::int64_t n = call.grad_value.defined() ? call.grad_value.numel() : 0;
  if (n == 0) return;
  const std::int64_t* st = call.grad_value.strides;
  dev.launch("msda_zero_value", n, msda_device::ZeroValueBody<T>{a.grad_value, sh, st[0], st[1], st[2], st[3]});
  if (!msda_has_samples(sh)) return;
  if (mode == BackwardMode::kExact) {
    msda_device::exact_value(dev, call, a, ws);
  } else {
    using Add = typename Dev::template Add<T>;
    dev.launch("msda_scatter", sh.B * sh.Q * sh.M * sh.D, msda_device::ScatterBody<T, Loc, Add>{a, Add{a.grad_value}});
  }
}

}  // namespace internal
}  // namespace detops
