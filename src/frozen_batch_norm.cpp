// FrozenBatchNorm2d entry points: validation, the fold (a one-time host computation with the
// shared helper), dispatch to the CPU or CUDA elementwise backend, and the FrozenBatchNorm2d class.
#include "detops/frozen_batch_norm.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "detops/detail/frozen_batch_norm_math.h"
#include "internal/backend.h"
#include "internal/common.h"
#include "internal/frozen_batch_norm_backend.h"
#include "internal/runtime.h"
#include "internal/validate.h"

namespace detops {

namespace {

using internal::check_non_overlapping;
using internal::check_like;
using internal::check_no_partial_overlap;
using internal::check_same_device;
using internal::check_tensor;
using internal::fail;
using internal::sizes_str;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

constexpr internal::OpBackends<internal::FrozenBnBackend> kBackends{
    &internal::kFrozenBnCpu, DETOPS_CUDA_BACKEND(internal::kFrozenBnCuda)};

const char* epilogue_name(FrozenBnEpilogue e) {
  switch (e) {
    case FrozenBnEpilogue::kNone: return "none";
    case FrozenBnEpilogue::kRelu: return "relu";
    case FrozenBnEpilogue::kAddRelu: return "add_relu";
  }
  return "unknown";
}

void check_epilogue(const char* op, FrozenBnEpilogue e) {
  if (e != FrozenBnEpilogue::kNone && e != FrozenBnEpilogue::kRelu && e != FrozenBnEpilogue::kAddRelu)
    fail(kBad, "{}: epilogue {} is unknown; expected none, relu or add_relu", op, static_cast<int>(e));
}

/// scale / shift: [C], float32 (float64 for float64 data), contiguous, on the data's device.
void check_param(const char* op, const char* name, const TensorView& p, const TensorView& x, const char* x_name) {
  check_tensor(op, name, p, 1);
  const std::int64_t C = x.sizes[1];
  if (p.sizes[0] != C)
    fail(kBad, "{}: {} has {} channels (sizes {}); expected {} (the channels of {} {})", op, name, p.sizes[0],
         sizes_str(p), C, x_name, sizes_str(x));
  const DType want = x.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  if (p.dtype != want)
    fail(kBad, "{}: {} has dtype {}; expected {} for {} data", op, name, dtype_name(p.dtype), dtype_name(want),
         dtype_name(x.dtype));
  if (C > 1 && p.strides[0] != 1) fail(kBad, "{}: {} has stride {}; expected a contiguous [C] tensor", op, name, p.strides[0]);
  check_same_device(op, name, p, x_name, x);
}

/// Host copy of a [C] buffer (any device, any floating dtype, any stride) as doubles.
std::vector<double> host_values(const TensorView& v) {
  const std::int64_t n = v.sizes[0];
  std::vector<double> out(static_cast<std::size_t>(n));
  if (n == 0) return out;
  const std::size_t es = dtype_size(v.dtype);
  std::vector<unsigned char> bytes(static_cast<std::size_t>(v.span_bytes()));
  internal::copy_bytes(bytes.data(), Device::cpu(), v.data, v.device, bytes.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const unsigned char* p = bytes.data() + static_cast<std::size_t>(i * v.strides[0]) * es;
    switch (v.dtype) {
      case DType::kFloat32: { float f; std::memcpy(&f, p, 4); out[i] = f; break; }
      case DType::kFloat64: { double d; std::memcpy(&d, p, 8); out[i] = d; break; }
      case DType::kFloat16: { Half h; std::memcpy(&h, p, 2); out[i] = static_cast<float>(h); break; }
      case DType::kBFloat16: { BFloat16 h; std::memcpy(&h, p, 2); out[i] = static_cast<float>(h); break; }
      default: break;
    }
  }
  return out;
}

template <class P>
void fold_into(const std::vector<double>& w, const std::vector<double>& b, const std::vector<double>& m,
               const std::vector<double>& v, double eps, const TensorView& scale, const TensorView& shift) {
  const std::size_t C = w.size();
  std::vector<P> s(C), t(C);
  for (std::size_t c = 0; c < C; ++c)
    detail::frozen_bn_fold<P>(static_cast<P>(w[c]), static_cast<P>(b[c]), static_cast<P>(m[c]), static_cast<P>(v[c]),
                              static_cast<P>(eps), &s[c], &t[c]);
  internal::copy_bytes(scale.data, scale.device, s.data(), Device::cpu(), C * sizeof(P));
  internal::copy_bytes(shift.data, shift.device, t.data(), Device::cpu(), C * sizeof(P));
}

}  // namespace

void frozen_batch_norm_fold(const BatchNormState& st, const TensorView& scale, const TensorView& shift,
                            const Context& ctx) {
  const char* op = "frozen_batch_norm_fold";
  const std::pair<const char*, const TensorView*> bufs[] = {
      {"weight", &st.weight}, {"bias", &st.bias}, {"running_mean", &st.running_mean}, {"running_var", &st.running_var}};
  for (const auto& [name, v] : bufs) {
    check_tensor(op, name, *v, 1);
    if (!internal::is_floating(v->dtype)) fail(kBad, "{}: {} has dtype {}; expected a floating dtype", op, name, dtype_name(v->dtype));
    if (v->sizes[0] != st.weight.sizes[0])
      fail(kBad, "{}: {} has {} channels; expected {} (the channels of weight)", op, name, v->sizes[0], st.weight.sizes[0]);
    if (v->dtype != st.weight.dtype)
      fail(kBad, "{}: {} has dtype {}; expected {} (the dtype of weight)", op, name, dtype_name(v->dtype),
           dtype_name(st.weight.dtype));
    check_same_device(op, name, *v, "weight", st.weight);
  }
  if (!(std::isfinite(st.eps) && st.eps >= 0)) fail(kBad, "{}: eps is {}; expected a finite value >= 0", op, st.eps);
  for (const auto& [name, v] : {std::pair<const char*, const TensorView*>{"scale", &scale}, {"shift", &shift}}) {
    check_tensor(op, name, *v, 1);
    if (v->sizes[0] != st.weight.sizes[0])
      fail(kBad, "{}: {} has {} channels; expected {} (the channels of weight)", op, name, v->sizes[0], st.weight.sizes[0]);
    if (v->dtype != DType::kFloat32 && v->dtype != DType::kFloat64)
      fail(kBad, "{}: {} has dtype {}; expected float32 or float64", op, name, dtype_name(v->dtype));
    if (v->dtype != scale.dtype) fail(kBad, "{}: shift has dtype {}; expected {} (the dtype of scale)", op, dtype_name(v->dtype), dtype_name(scale.dtype));
    if (v->sizes[0] > 1 && v->strides[0] != 1) fail(kBad, "{}: {} has stride {}; expected a contiguous [C] tensor", op, name, v->strides[0]);
  }
  check_same_device(op, "scale", scale, "weight", st.weight);
  check_same_device(op, "shift", shift, "scale", scale);
  // scale and shift are written after the state is read: they share no byte with each other or
  // with the state (an output over running_var would overwrite the caller's statistics).
  internal::check_outputs(op, {{"scale", &scale}, {"shift", &shift}});
  for (const internal::NamedView out : {internal::NamedView{"scale", &scale}, internal::NamedView{"shift", &shift}})
    internal::check_disjoint(op, out,
                             {{"weight", &st.weight}, {"bias", &st.bias}, {"running_mean", &st.running_mean},
                              {"running_var", &st.running_var}});
  // The statistics may still be being written on the caller's stream: wait for it before reading.
  if (st.weight.device.is_cuda()) internal::cuda_stream_synchronize(st.weight.device, ctx.cuda_stream);
  const std::vector<double> w = host_values(st.weight), b = host_values(st.bias), m = host_values(st.running_mean),
                            v = host_values(st.running_var);
  for (std::size_t c = 0; c < v.size(); ++c) {
    if (!(v[c] >= 0)) fail(kBad, "{}: running_var[{}] is {}; expected a value >= 0", op, c, v[c]);
    const double denom = scale.dtype == DType::kFloat64 ? v[c] + st.eps
                                                        : static_cast<double>(static_cast<float>(v[c]) + static_cast<float>(st.eps));
    if (denom == 0)
      fail(kBad, "{}: running_var[{}] + eps is 0 (running_var {}, eps {}); expected a positive sum (use eps > 0 "
           "for statistics with dead channels)", op, c, v[c], st.eps);
  }
  if (scale.dtype == DType::kFloat64) fold_into<double>(w, b, m, v, st.eps, scale, shift);
  else fold_into<float>(w, b, m, v, st.eps, scale, shift);
}

void frozen_batch_norm_forward(const TensorView& x, const TensorView& scale, const TensorView& shift,
                               const TensorView& y, FrozenBnEpilogue epilogue, const TensorView& residual,
                               const Context& ctx) {
  const char* op = "frozen_batch_norm_forward";
  check_epilogue(op, epilogue);
  check_tensor(op, "x", x, 4);
  internal::check_floating(op, "x", x);
  check_like(op, "y", y, "x", x);
  check_non_overlapping(op, "y", y);
  check_no_partial_overlap(op, "y", y, "x", x, true);
  check_param(op, "scale", scale, x, "x");
  check_param(op, "shift", shift, x, "x");
  check_no_partial_overlap(op, "y", y, "scale", scale, false);
  check_no_partial_overlap(op, "y", y, "shift", shift, false);
  if (epilogue == FrozenBnEpilogue::kAddRelu) {
    if (!residual.defined()) fail(kBad, "{}: epilogue add_relu needs a residual (sizes {}); none was given", op, sizes_str(x));
    check_like(op, "residual", residual, "x", x);
    check_no_partial_overlap(op, "y", y, "residual", residual, true);
  } else if (residual.defined()) {
    fail(kBad, "{}: a residual was given with epilogue {}; expected epilogue add_relu", op, epilogue_name(epilogue));
  }
  if (x.numel() == 0) return;
  const auto call = internal::FrozenBnCall::for_forward(op, x, scale, shift, y, epilogue, residual);
  internal::backend_for(kBackends, x.device, op).run(call, ctx);
}

void frozen_batch_norm_backward(const TensorView& grad_y, const TensorView& scale, const TensorView& grad_x,
                                FrozenBnEpilogue epilogue, const TensorView& y, const TensorView& grad_residual,
                                const Context& ctx) {
  const char* op = "frozen_batch_norm_backward";
  check_epilogue(op, epilogue);
  check_tensor(op, "grad_y", grad_y, 4);
  internal::check_floating(op, "grad_y", grad_y);
  check_like(op, "grad_x", grad_x, "grad_y", grad_y);
  check_non_overlapping(op, "grad_x", grad_x);
  check_no_partial_overlap(op, "grad_x", grad_x, "grad_y", grad_y, true);
  check_param(op, "scale", scale, grad_y, "grad_y");
  check_no_partial_overlap(op, "grad_x", grad_x, "scale", scale, false);
  const bool relu = epilogue != FrozenBnEpilogue::kNone;
  if (relu) {
    if (!y.defined())
      fail(kBad, "{}: epilogue {} needs the forward's output y for the ReLU mask; none was given", op, epilogue_name(epilogue));
    check_like(op, "y", y, "grad_y", grad_y);
    check_no_partial_overlap(op, "grad_x", grad_x, "y", y, true);
  }
  if (grad_residual.defined()) {
    if (epilogue != FrozenBnEpilogue::kAddRelu)
      fail(kBad, "{}: grad_residual was given with epilogue {}; expected epilogue add_relu", op, epilogue_name(epilogue));
    check_like(op, "grad_residual", grad_residual, "grad_y", grad_y);
    check_non_overlapping(op, "grad_residual", grad_residual);
    check_no_partial_overlap(op, "grad_residual", grad_residual, "grad_y", grad_y, true);
    check_no_partial_overlap(op, "grad_residual", grad_residual, "grad_x", grad_x, false);
    check_no_partial_overlap(op, "grad_residual", grad_residual, "y", y, true);
    check_no_partial_overlap(op, "grad_residual", grad_residual, "scale", scale, false);
  }
  if (grad_y.numel() == 0) return;
  const auto call = internal::FrozenBnCall::for_backward(op, grad_y, scale, grad_x, epilogue, relu ? y : TensorView{},
                                                     grad_residual);
  internal::backend_for(kBackends, grad_y.device, op).run(call, ctx);
}

namespace internal {
std::optional<Layout> frozen_bn_dense_layout(const FrozenBnCall& call) {
  auto matches = [&](Layout layout) {
    std::int64_t dense[4];
    contiguous_strides(4, call.input.sizes, dense, layout);
    for (const TensorView* v : {&call.input, &call.aux, &call.output, &call.grad_residual}) {
      if (!v->defined()) continue;
      for (int d = 0; d < 4; ++d)
        if (v->sizes[d] > 1 && v->strides[d] != dense[d]) return false;
    }
    return true;
  };
  if (matches(Layout::kNCHW)) return Layout::kNCHW;
  if (matches(Layout::kNHWC)) return Layout::kNHWC;
  return std::nullopt;
}
}  // namespace internal

// ---------------------------------------------------------------------------------------------
// FrozenBatchNorm2d

namespace {
Tensor copy_buffer(const TensorView& v, Device device, DType dtype) {
  Tensor t = Tensor::empty({v.sizes[0]}, dtype, device);
  const std::vector<double> values = host_values(v);
  Tensor host = Tensor::empty({v.sizes[0]}, dtype, Device::cpu());
  for (std::int64_t i = 0; i < v.sizes[0]; ++i) {
    switch (dtype) {
      case DType::kFloat64: host.data<double>()[i] = values[i]; break;
      case DType::kFloat16: host.data<Half>()[i] = from_double<Half>(values[i]); break;
      case DType::kBFloat16: host.data<BFloat16>()[i] = from_double<BFloat16>(values[i]); break;
      default: host.data<float>()[i] = static_cast<float>(values[i]); break;
    }
  }
  internal::copy_bytes(t.view().data, device, host.view().data, Device::cpu(), t.nbytes());
  return t;
}
}  // namespace

FrozenBatchNorm2d FrozenBatchNorm2d::from_state(const BatchNormState& state, Device device, const Context& ctx) {
  const char* op = "FrozenBatchNorm2d::from_state";
  check_tensor(op, "weight", state.weight, 1);
  FrozenBatchNorm2d f;
  const DType param = state.weight.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  const std::int64_t C = state.weight.sizes[0];
  // Fold where the buffers are (that validates everything first), then move to `device`.
  Tensor scale = Tensor::empty({C}, param, state.weight.device), shift = Tensor::empty({C}, param, state.weight.device);
  frozen_batch_norm_fold(state, scale, shift, ctx);
  f.scale_ = state.weight.device == device ? std::move(scale) : scale.to(device);
  f.shift_ = state.weight.device == device ? std::move(shift) : shift.to(device);
  f.weight_ = copy_buffer(state.weight, device, state.weight.dtype);
  f.bias_ = copy_buffer(state.bias, device, state.bias.dtype);
  f.running_mean_ = copy_buffer(state.running_mean, device, state.running_mean.dtype);
  f.running_var_ = copy_buffer(state.running_var, device, state.running_var.dtype);
  f.eps_ = state.eps;
  return f;
}

FrozenBatchNorm2d FrozenBatchNorm2d::identity(std::int64_t channels, double eps, Device device, DType param_dtype) {
  if (channels < 0) fail(kBad, "FrozenBatchNorm2d::identity: channels is {}; expected >= 0", channels);
  if (param_dtype != DType::kFloat32 && param_dtype != DType::kFloat64)
    fail(kBad, "FrozenBatchNorm2d::identity: param_dtype is {}; expected float32 or float64", dtype_name(param_dtype));
  Tensor w = Tensor::empty({channels}, param_dtype), b = Tensor::empty({channels}, param_dtype),
         m = Tensor::empty({channels}, param_dtype), v = Tensor::empty({channels}, param_dtype);
  for (std::int64_t c = 0; c < channels; ++c) {
    if (param_dtype == DType::kFloat64) {
      w.data<double>()[c] = 1, b.data<double>()[c] = 0, m.data<double>()[c] = 0, v.data<double>()[c] = 1 - eps;
    } else {
      w.data<float>()[c] = 1, b.data<float>()[c] = 0, m.data<float>()[c] = 0,
      v.data<float>()[c] = 1 - static_cast<float>(eps);
    }
  }
  return from_state({w, b, m, v, eps}, device);
}

BatchNormState FrozenBatchNorm2d::state() const { return {weight_, bias_, running_mean_, running_var_, eps_}; }

void FrozenBatchNorm2d::forward(const TensorView& x, const TensorView& y, FrozenBnEpilogue epilogue,
                                const TensorView& residual, const Context& ctx) const {
  frozen_batch_norm_forward(x, scale_, shift_, y, epilogue, residual, ctx);
}

void FrozenBatchNorm2d::backward(const TensorView& grad_y, const TensorView& grad_x, FrozenBnEpilogue epilogue,
                                 const TensorView& y, const TensorView& grad_residual, const Context& ctx) const {
  frozen_batch_norm_backward(grad_y, scale_, grad_x, epilogue, y, grad_residual, ctx);
}

}  // namespace detops
