// SyncBatchNorm phase kernels of torch.ops.detops (CPU, CUDA when built with it, Meta). The
// Python module (detops_torch.distributed) drives them with torch.distributed all-gathers of the
// int64 records and owns the gradient: no Autograd kernels here.
//
// Shapes: records, scales and gathered tensors are int64 on x's device; gathered is
// [world, words], rank r's record in row r. save_mean, save_invstd, sums, grad_weight and
// grad_bias are float64 (detops' statistics dtype): the caller casts grad_weight/grad_bias to the
// parameter's dtype (one rounding of the same float64 value, the bits detops would store).
#include "common.h"

namespace detops {
namespace torch_ops {
namespace {

at::TensorOptions int64_like(const at::Tensor& t) { return t.options().dtype(at::kLong); }
at::TensorOptions float64_like(const at::Tensor& t) { return t.options().dtype(at::kDouble); }

int64_t channels_of(const char* op, const char* arg, const at::Tensor& x) {
  require_dim(op, arg, x, 4, "[N, C, H, W]");
  return x.size(1);
}

// Channels of a gathered [world, words] statistics record tensor (words = 1 + 2C, 1 + 4C exact).
int64_t channels_of_gathered(const char* op, const at::Tensor& gathered, SyncBnMode mode) {
  require_dim(op, "gathered", gathered, 2, "[world, words]");
  const int64_t per_channel = mode == SyncBnMode::kExact ? 4 : 2;
  const int64_t words = gathered.size(1);
  if (words < 1 || (words - 1) % per_channel != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": gathered has " + std::to_string(words) + " words per rank; expected 1 + " +
                    std::to_string(per_channel) + " * channels (mode " + (per_channel == 4 ? "'exact'" : "'default'") +
                    ")");
  }
  return (words - 1) / per_channel;
}

TensorView view_opt(const optional<at::Tensor>& t, const char* what) {
  return detops::torch::view(value_or_undefined(t), what);
}

// torch keeps num_batches_tracked as a 0-d int64 tensor; detops takes [1]: same storage.
TensorView view_counter(const optional<at::Tensor>& t) {
  at::Tensor v = value_or_undefined(t);
  if (v.defined() && v.dim() == 0) v = v.view({1});
  return detops::torch::view(v, "num_batches_tracked");
}

// ---- CPU and CUDA ----------------------------------------------------------------------------

at::Tensor local_scales_kernel(const at::Tensor& x, const optional<at::Tensor>& grad_y,
                               const optional<at::Tensor>& save_mean) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_local_scales";
    c10::DeviceGuard guard(x.device());
    const bool backward = grad_y.has_value() && grad_y->defined();
    at::Tensor scales =
        at::empty({sync_batch_norm_scale_words(channels_of(op, "x", x), backward)}, int64_like(x));
    sync_batch_norm_local_scales(detops::torch::view(x, "x"), view_opt(grad_y, "grad_y"),
                                 view_opt(save_mean, "save_mean"), detops::torch::view(scales, "scales"),
                                 detops::torch::context(x));
    return scales;
  });
}

at::Tensor merge_scales_kernel(const at::Tensor& gathered) {
  return detops::torch::guarded([&] {
    require_dim("detops::sync_batch_norm_merge_scales", "gathered", gathered, 2, "[world, words]");
    c10::DeviceGuard guard(gathered.device());
    at::Tensor scales = at::empty({gathered.size(1)}, int64_like(gathered));
    sync_batch_norm_merge_scales(detops::torch::view(gathered, "gathered"), detops::torch::view(scales, "scales"),
                                 detops::torch::context(gathered));
    return scales;
  });
}

at::Tensor local_stats_kernel(const at::Tensor& x, string_view mode, const optional<at::Tensor>& scales) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_local_stats";
    const SyncBnMode m = parse_sync_mode(op, mode);
    c10::DeviceGuard guard(x.device());
    at::Tensor record = at::empty({sync_batch_norm_record_words(channels_of(op, "x", x), m)}, int64_like(x));
    sync_batch_norm_local_stats(detops::torch::view(x, "x"), detops::torch::view(record, "record"), m,
                                view_opt(scales, "scales"), detops::torch::context(x));
    return record;
  });
}

std::tuple<at::Tensor, at::Tensor> finalize_stats_kernel(
    const at::Tensor& gathered, const optional<at::Tensor>& weight, const optional<at::Tensor>& running_mean,
    const optional<at::Tensor>& running_var, const optional<at::Tensor>& num_batches_tracked, double eps,
    optional<double> momentum, string_view mode, const optional<at::Tensor>& scales) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_finalize_stats";
    SyncBnOptions opts;
    opts.mode = parse_sync_mode(op, mode);
    opts.eps = eps;
    opts.momentum = momentum.has_value() ? std::optional<double>(*momentum) : std::nullopt;
    opts.training = true;
    c10::DeviceGuard guard(gathered.device());
    const int64_t C = channels_of_gathered(op, gathered, opts.mode);
    at::Tensor save_mean = at::empty({C}, float64_like(gathered));
    at::Tensor save_invstd = at::empty({C}, float64_like(gathered));
    SyncBnParams params;
    params.weight = view_opt(weight, "weight");
    // finalize only validates the affine parameters against the records (it reads neither);
    // detops takes weight and bias together, the schema carries weight alone: it stands for both.
    params.bias = params.weight;
    params.running_mean = view_opt(running_mean, "running_mean");
    params.running_var = view_opt(running_var, "running_var");
    params.num_batches_tracked = view_counter(num_batches_tracked);
    sync_batch_norm_finalize_stats(detops::torch::view(gathered, "gathered"), params,
                                   detops::torch::view(save_mean, "save_mean"),
                                   detops::torch::view(save_invstd, "save_invstd"), opts, view_opt(scales, "scales"),
                                   detops::torch::context(gathered));
    return std::make_tuple(save_mean, save_invstd);
  });
}

at::Tensor apply_kernel(const at::Tensor& x, const optional<at::Tensor>& weight, const optional<at::Tensor>& bias,
                        const at::Tensor& save_mean, const at::Tensor& save_invstd) {
  return detops::torch::guarded([&] {
    channels_of("detops::sync_batch_norm_apply", "x", x);
    c10::DeviceGuard guard(x.device());
    at::Tensor y = at::empty_like(x);  // x's memory format
    SyncBnParams params;
    params.weight = view_opt(weight, "weight");
    params.bias = view_opt(bias, "bias");
    sync_batch_norm_apply(detops::torch::view(x, "x"), params, detops::torch::view(save_mean, "save_mean"),
                          detops::torch::view(save_invstd, "save_invstd"), detops::torch::view(y, "y"),
                          detops::torch::context(x));
    return y;
  });
}

at::Tensor local_backward_kernel(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& save_mean,
                                 string_view mode, const optional<at::Tensor>& scales) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_local_backward";
    const SyncBnMode m = parse_sync_mode(op, mode);
    c10::DeviceGuard guard(x.device());
    at::Tensor record = at::empty({sync_batch_norm_record_words(channels_of(op, "x", x), m)}, int64_like(x));
    sync_batch_norm_local_backward(detops::torch::view(grad_y, "grad_y"), detops::torch::view(x, "x"),
                                   detops::torch::view(save_mean, "save_mean"), detops::torch::view(record, "record"),
                                   m, view_opt(scales, "scales"), detops::torch::context(x));
    return record;
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> finalize_backward_kernel(const at::Tensor& gathered, int64_t rank,
                                                                        string_view mode,
                                                                        const at::Tensor& save_invstd,
                                                                        const optional<at::Tensor>& scales,
                                                                        bool weight_grad) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_finalize_backward";
    const SyncBnMode m = parse_sync_mode(op, mode);
    require_dim(op, "save_invstd", save_invstd, 1, "[C]");
    if (rank < 0 || rank > std::numeric_limits<int>::max()) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(op) + ": rank is " + std::to_string(rank) + "; expected a non-negative rank");
    }
    c10::DeviceGuard guard(gathered.device());
    const int64_t C = save_invstd.size(0);
    at::Tensor sums = at::empty({2 * C + 1}, float64_like(gathered));
    at::Tensor grad_weight = weight_grad ? at::empty({C}, float64_like(gathered)) : at::Tensor();
    at::Tensor grad_bias = weight_grad ? at::empty({C}, float64_like(gathered)) : at::Tensor();
    sync_batch_norm_finalize_backward(detops::torch::view(gathered, "gathered"), static_cast<int>(rank), m,
                                      detops::torch::view(save_invstd, "save_invstd"), detops::torch::view(sums, "sums"),
                                      detops::torch::view(grad_weight, "grad_weight"),
                                      detops::torch::view(grad_bias, "grad_bias"), view_opt(scales, "scales"),
                                      detops::torch::context(gathered));
    return std::make_tuple(sums, grad_weight, grad_bias);
  });
}

at::Tensor backward_apply_kernel(const at::Tensor& grad_y, const at::Tensor& x, const optional<at::Tensor>& weight,
                                 const at::Tensor& save_mean, const at::Tensor& save_invstd, const at::Tensor& sums) {
  return detops::torch::guarded([&] {
    channels_of("detops::sync_batch_norm_backward_apply", "x", x);
    c10::DeviceGuard guard(x.device());
    at::Tensor grad_x = at::empty_like(x);  // x's memory format
    sync_batch_norm_backward_apply(detops::torch::view(grad_y, "grad_y"), detops::torch::view(x, "x"),
                                   view_opt(weight, "weight"), detops::torch::view(save_mean, "save_mean"),
                                   detops::torch::view(save_invstd, "save_invstd"), detops::torch::view(sums, "sums"),
                                   detops::torch::view(grad_x, "grad_x"), detops::torch::context(x));
    return grad_x;
  });
}

// ---- Meta: shapes and dtypes only (modes validated, every tensor argument on meta) -----------

at::Tensor local_scales_meta(const at::Tensor& x, const optional<at::Tensor>& grad_y,
                             const optional<at::Tensor>& save_mean) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_local_scales";
    const at::Tensor g = value_or_undefined(grad_y), m = value_or_undefined(save_mean);
    require_meta(op, {{"x", &x}, {"grad_y", &g}, {"save_mean", &m}});
    return at::empty({sync_batch_norm_scale_words(channels_of(op, "x", x), g.defined())}, int64_like(x));
  });
}

at::Tensor merge_scales_meta(const at::Tensor& gathered) {
  return detops::torch::guarded([&] {
    require_dim("detops::sync_batch_norm_merge_scales", "gathered", gathered, 2, "[world, words]");
    return at::empty({gathered.size(1)}, int64_like(gathered));
  });
}

at::Tensor local_stats_meta(const at::Tensor& x, string_view mode, const optional<at::Tensor>& scales) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_local_stats";
    const at::Tensor sc = value_or_undefined(scales);
    require_meta(op, {{"x", &x}, {"scales", &sc}});
    return at::empty({sync_batch_norm_record_words(channels_of(op, "x", x), parse_sync_mode(op, mode))},
                     int64_like(x));
  });
}

std::tuple<at::Tensor, at::Tensor> finalize_stats_meta(const at::Tensor& gathered, const optional<at::Tensor>& weight,
                                                       const optional<at::Tensor>& running_mean,
                                                       const optional<at::Tensor>& running_var,
                                                       const optional<at::Tensor>& num_batches_tracked, double,
                                                       optional<double>, string_view mode,
                                                       const optional<at::Tensor>& scales) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_finalize_stats";
    const at::Tensor w = value_or_undefined(weight), rm = value_or_undefined(running_mean),
                     rv = value_or_undefined(running_var), n = value_or_undefined(num_batches_tracked),
                     sc = value_or_undefined(scales);
    require_meta(op, {{"gathered", &gathered}, {"weight", &w}, {"running_mean", &rm}, {"running_var", &rv},
                      {"num_batches_tracked", &n}, {"scales", &sc}});
    const int64_t C = channels_of_gathered(op, gathered, parse_sync_mode(op, mode));
    return std::make_tuple(at::empty({C}, float64_like(gathered)), at::empty({C}, float64_like(gathered)));
  });
}

at::Tensor apply_meta(const at::Tensor& x, const optional<at::Tensor>& weight, const optional<at::Tensor>& bias,
                      const at::Tensor& save_mean, const at::Tensor& save_invstd) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_apply";
    const at::Tensor w = value_or_undefined(weight), b = value_or_undefined(bias);
    require_meta(op, {{"x", &x}, {"weight", &w}, {"bias", &b}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd}});
    channels_of(op, "x", x);
    return at::empty_like(x);
  });
}

at::Tensor local_backward_meta(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& save_mean,
                               string_view mode, const optional<at::Tensor>& scales) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_local_backward";
    const at::Tensor sc = value_or_undefined(scales);
    require_meta(op, {{"grad_y", &grad_y}, {"x", &x}, {"save_mean", &save_mean}, {"scales", &sc}});
    return at::empty({sync_batch_norm_record_words(channels_of(op, "x", x), parse_sync_mode(op, mode))},
                     int64_like(x));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> finalize_backward_meta(const at::Tensor& gathered, int64_t,
                                                                      string_view mode, const at::Tensor& save_invstd,
                                                                      const optional<at::Tensor>& scales,
                                                                      bool weight_grad) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_finalize_backward";
    const at::Tensor sc = value_or_undefined(scales);
    require_meta(op, {{"gathered", &gathered}, {"save_invstd", &save_invstd}, {"scales", &sc}});
    parse_sync_mode(op, mode);
    require_dim(op, "save_invstd", save_invstd, 1, "[C]");
    const int64_t C = save_invstd.size(0);
    auto vec = [&] { return weight_grad ? at::empty({C}, float64_like(gathered)) : at::Tensor(); };
    return std::make_tuple(at::empty({2 * C + 1}, float64_like(gathered)), vec(), vec());
  });
}

at::Tensor backward_apply_meta(const at::Tensor& grad_y, const at::Tensor& x, const optional<at::Tensor>& weight,
                               const at::Tensor& save_mean, const at::Tensor& save_invstd, const at::Tensor& sums) {
  return detops::torch::guarded([&] {
    const char* op = "detops::sync_batch_norm_backward_apply";
    const at::Tensor w = value_or_undefined(weight);
    require_meta(op, {{"grad_y", &grad_y}, {"x", &x}, {"weight", &w}, {"save_mean", &save_mean},
                      {"save_invstd", &save_invstd}, {"sums", &sums}});
    channels_of(op, "x", x);
    return at::empty_like(x);
  });
}

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

// The same kernels serve CPU and CUDA: detops runs the backend of the tensors' device.
#define DETOPS_SBN_IMPL(m)                                                               \
  m.impl("sync_batch_norm_local_scales", TORCH_FN(ops::local_scales_kernel));            \
  m.impl("sync_batch_norm_merge_scales", TORCH_FN(ops::merge_scales_kernel));            \
  m.impl("sync_batch_norm_local_stats", TORCH_FN(ops::local_stats_kernel));              \
  m.impl("sync_batch_norm_finalize_stats", TORCH_FN(ops::finalize_stats_kernel));        \
  m.impl("sync_batch_norm_apply", TORCH_FN(ops::apply_kernel));                          \
  m.impl("sync_batch_norm_local_backward", TORCH_FN(ops::local_backward_kernel));        \
  m.impl("sync_batch_norm_finalize_backward", TORCH_FN(ops::finalize_backward_kernel));  \
  m.impl("sync_batch_norm_backward_apply", TORCH_FN(ops::backward_apply_kernel))

TORCH_LIBRARY_IMPL(detops, CPU, m) { DETOPS_SBN_IMPL(m); }

#if DETOPS_TORCH_CUDA
TORCH_LIBRARY_IMPL(detops, CUDA, m) { DETOPS_SBN_IMPL(m); }
#endif

TORCH_LIBRARY_IMPL(detops, Meta, m) {
  m.impl("sync_batch_norm_local_scales", TORCH_FN(ops::local_scales_meta));
  m.impl("sync_batch_norm_merge_scales", TORCH_FN(ops::merge_scales_meta));
  m.impl("sync_batch_norm_local_stats", TORCH_FN(ops::local_stats_meta));
  m.impl("sync_batch_norm_finalize_stats", TORCH_FN(ops::finalize_stats_meta));
  m.impl("sync_batch_norm_apply", TORCH_FN(ops::apply_meta));
  m.impl("sync_batch_norm_local_backward", TORCH_FN(ops::local_backward_meta));
  m.impl("sync_batch_norm_finalize_backward", TORCH_FN(ops::finalize_backward_meta));
  m.impl("sync_batch_norm_backward_apply", TORCH_FN(ops::backward_apply_meta));
}

// No gradient of their own (the Python autograd.Function composes them): autograd passes through,
// which also lets meta tensors reach the Meta kernels (torch 1.13 has no autograd fallback for the
// AutogradMeta key).
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  for (const char* name : {"sync_batch_norm_local_scales", "sync_batch_norm_merge_scales", "sync_batch_norm_local_stats",
                           "sync_batch_norm_finalize_stats", "sync_batch_norm_apply", "sync_batch_norm_local_backward",
                           "sync_batch_norm_finalize_backward", "sync_batch_norm_backward_apply"}) {
    m.impl(name, ::torch::CppFunction::makeFallthrough());
  }
}
