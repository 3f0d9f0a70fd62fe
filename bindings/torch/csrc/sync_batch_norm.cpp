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

int64_t channels_of(const char* op, const char* arg, const Tensor& x) {
  require_dim(op, arg, x, 4, "[N, C, H, W]");
  return x.size(1);
}

// Channels of a gathered [world, words] statistics record tensor (words = 1 + 2C, 1 + 4C exact).
int64_t channels_of_gathered(const char* op, const Tensor& gathered, SyncBnMode mode) {
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

TensorView view_opt(const Optional<Tensor>& t, const char* what) {
  return view(value_or_undefined(t), what);
}

// torch keeps num_batches_tracked as a 0-d int64 tensor; detops takes [1]: same storage.
TensorView view_counter(const Optional<Tensor>& t) {
  TensorView v = view(value_or_undefined(t), "num_batches_tracked");
  if (v.data != nullptr && v.rank == 0) v = TensorView(v.data, v.dtype, v.device, {1});
  return v;
}

// ---- The rank-agreement header (include/detops/sync_batch_norm.h: one copy of the protocol) ------
// detops_torch.distributed all-gathers these words with torch.distributed and checks the rows here.

/// This rank's header ([kSyncBnHeaderWords] int64, host memory) for a call on x: only x's
/// metadata is read, and any x is accepted (a rank whose own checks failed sends one too).
Tensor header_kernel(const Tensor& x, bool backward, bool part0, bool part1, bool part2, Str mode, bool training,
                     double eps, Optional<double> momentum, bool failed) {
  return guarded([&] {
    const char* op = "detops::sync_batch_norm_header";
    SyncBnOptions opts;
    opts.mode = parse_sync_mode(op, mode);
    opts.training = training;
    opts.eps = eps;
    opts.momentum = momentum.has_value() ? std::optional<double>(*momentum) : std::nullopt;
    TensorView v;
    if (!failed) v = view(x, "x");  // a failed rank's x may be of any dtype or rank
    Tensor header = empty_cpu_int64({kSyncBnHeaderWords});
    sync_batch_norm_header(v, SyncBnCall{backward, {part0, part1, part2}}, opts, 0, failed,
                           static_cast<std::int64_t*>(header.data_ptr()));
    return header;
  });
}

/// Checks the gathered headers ([ranks, kSyncBnHeaderWords] int64 in host memory): the same
/// error on every rank, a ValueError (the binding's type for arguments the ranks disagree on).
int64_t check_headers_kernel(const Tensor& gathered, Str what) {
  return guarded([&] {
    const char* op = "detops::sync_batch_norm_check_headers";
    const TensorView g = view(gathered, "gathered");
    if (g.rank != 2 || g.sizes[1] != kSyncBnHeaderWords || g.dtype != DType::kInt64 || !g.device.is_cpu() ||
        !g.is_contiguous())
      throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": gathered must be a contiguous [ranks, " +
                                                   std::to_string(kSyncBnHeaderWords) + "] int64 tensor in host memory");
    const std::string name(sv(what));
    try {
      sync_batch_norm_check_headers(name.c_str(), static_cast<const std::int64_t*>(g.data),
                                    static_cast<int>(g.sizes[0]));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kCommunication) throw;
      throw Error(ErrorCode::kInvalidArgument, e.what());
    }
    return g.sizes[0];
  });
}

int64_t record_words_kernel(int64_t channels, Str mode) {
  return guarded([&] {
    const auto m = parse_sync_mode("detops::sync_batch_norm_record_words", mode);
    return sync_batch_norm_record_words(channels, m);
  });
}

// ---- CPU and CUDA ----------------------------------------------------------------------------

Tensor local_scales_kernel(const Tensor& x, const Optional<Tensor>& grad_y,
                           const Optional<Tensor>& save_mean) {
  return guarded([&] {
    const char* op = "detops::sync_batch_norm_local_scales";
    DeviceGuard guard(x);
    const bool backward = has_tensor(grad_y);
    Tensor scales =
        empty_on(x, {sync_batch_norm_scale_words(channels_of(op, "x", x), backward)}, DType::kInt64);
    sync_batch_norm_local_scales(view(x, "x"), view_opt(grad_y, "grad_y"),
                                 view_opt(save_mean, "save_mean"), view(scales, "scales"),
                                 context(x));
    return scales;
  });
}

Tensor merge_scales_kernel(const Tensor& gathered) {
  return guarded([&] {
    require_dim("detops::sync_batch_norm_merge_scales", "gathered", gathered, 2, "[world, words]");
    DeviceGuard guard(gathered);
    Tensor scales = empty_on(gathered, {gathered.size(1)}, DType::kInt64);
    sync_batch_norm_merge_scales(view(gathered, "gathered"), view(scales, "scales"),
                                 context(gathered));
    return scales;
  });
}

Tensor local_stats_kernel(const Tensor& x, Str mode, const Optional<Tensor>& scales) {
  return guarded([&] {
    const char* op = "detops::sync_batch_norm_local_stats";
    const SyncBnMode m = parse_sync_mode(op, mode);
    DeviceGuard guard(x);
    Tensor record = empty_on(x, {sync_batch_norm_record_words(channels_of(op, "x", x), m)}, DType::kInt64);
    sync_batch_norm_local_stats(view(x, "x"), view(record, "record"), m,
                                view_opt(scales, "scales"), context(x));
    return record;
  });
}

std::tuple<Tensor, Tensor> finalize_stats_kernel(
    const Tensor& gathered, const Optional<Tensor>& weight, const Optional<Tensor>& running_mean,
    const Optional<Tensor>& running_var, const Optional<Tensor>& num_batches_tracked, double eps,
    Optional<double> momentum, Str mode, const Optional<Tensor>& scales) {
  return guarded([&] {
    const char* op = "detops::sync_batch_norm_finalize_stats";
    SyncBnOptions opts;
    opts.mode = parse_sync_mode(op, mode);
    opts.eps = eps;
    opts.momentum = momentum.has_value() ? std::optional<double>(*momentum) : std::nullopt;
    opts.training = true;
    DeviceGuard guard(gathered);
    const int64_t C = channels_of_gathered(op, gathered, opts.mode);
    Tensor save_mean = empty_on(gathered, {C}, DType::kFloat64);
    Tensor save_invstd = empty_on(gathered, {C}, DType::kFloat64);
    SyncBnParams params;
    params.weight = view_opt(weight, "weight");
    // finalize only validates the affine parameters against the records (it reads neither);
    // detops takes weight and bias together, the schema carries weight alone: it stands for both.
    params.bias = params.weight;
    params.running_mean = view_opt(running_mean, "running_mean");
    params.running_var = view_opt(running_var, "running_var");
    params.num_batches_tracked = view_counter(num_batches_tracked);
    sync_batch_norm_finalize_stats(view(gathered, "gathered"), params,
                                   view(save_mean, "save_mean"),
                                   view(save_invstd, "save_invstd"), opts, view_opt(scales, "scales"),
                                   context(gathered));
    return std::make_tuple(save_mean, save_invstd);
  });
}

Tensor apply_kernel(const Tensor& x, const Optional<Tensor>& weight, const Optional<Tensor>& bias,
                    const Tensor& save_mean, const Tensor& save_invstd) {
  return guarded([&] {
    channels_of("detops::sync_batch_norm_apply", "x", x);
    DeviceGuard guard(x);
    Tensor y = empty_like_format(x);  // x's memory format
    SyncBnParams params;
    params.weight = view_opt(weight, "weight");
    params.bias = view_opt(bias, "bias");
    sync_batch_norm_apply(view(x, "x"), params, view(save_mean, "save_mean"),
                          view(save_invstd, "save_invstd"), view(y, "y"),
                          context(x));
    return y;
  });
}

Tensor local_backward_kernel(const Tensor& grad_y, const Tensor& x, const Tensor& save_mean,
                             Str mode, const Optional<Tensor>& scales) {
  return guarded([&] {
    const char* op = "detops::sync_batch_norm_local_backward";
    const SyncBnMode m = parse_sync_mode(op, mode);
    DeviceGuard guard(x);
    Tensor record = empty_on(x, {sync_batch_norm_record_words(channels_of(op, "x", x), m)}, DType::kInt64);
    sync_batch_norm_local_backward(view(grad_y, "grad_y"), view(x, "x"),
                                   view(save_mean, "save_mean"), view(record, "record"),
                                   m, view_opt(scales, "scales"), context(x));
    return record;
  });
}

std::tuple<Tensor, Tensor, Tensor> finalize_backward_kernel(const Tensor& gathered, int64_t rank,
                                                            Str mode,
                                                            const Tensor& save_invstd,
                                                            const Optional<Tensor>& scales,
                                                            bool weight_grad) {
  return guarded([&] {
    const char* op = "detops::sync_batch_norm_finalize_backward";
    const SyncBnMode m = parse_sync_mode(op, mode);
    require_dim(op, "save_invstd", save_invstd, 1, "[C]");
    if (rank < 0 || rank > std::numeric_limits<int>::max()) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(op) + ": rank is " + std::to_string(rank) + "; expected a non-negative rank");
    }
    DeviceGuard guard(gathered);
    const int64_t C = save_invstd.size(0);
    Tensor sums = empty_on(gathered, {2 * C + 1}, DType::kFloat64);
    Tensor grad_weight = weight_grad ? empty_on(gathered, {C}, DType::kFloat64) : undefined();
    Tensor grad_bias = weight_grad ? empty_on(gathered, {C}, DType::kFloat64) : undefined();
    sync_batch_norm_finalize_backward(view(gathered, "gathered"), static_cast<int>(rank), m,
                                      view(save_invstd, "save_invstd"), view(sums, "sums"),
                                      view(grad_weight, "grad_weight"),
                                      view(grad_bias, "grad_bias"), view_opt(scales, "scales"),
                                      context(gathered));
    return std::make_tuple(sums, grad_weight, grad_bias);
  });
}

Tensor backward_apply_kernel(const Tensor& grad_y, const Tensor& x, const Optional<Tensor>& weight,
                             const Tensor& save_mean, const Tensor& save_invstd, const Tensor& sums) {
  return guarded([&] {
    channels_of("detops::sync_batch_norm_backward_apply", "x", x);
    DeviceGuard guard(x);
    Tensor grad_x = empty_like_format(x);  // x's memory format
    sync_batch_norm_backward_apply(view(grad_y, "grad_y"), view(x, "x"),
                                   view_opt(weight, "weight"), view(save_mean, "save_mean"),
                                   view(save_invstd, "save_invstd"), view(sums, "sums"),
                                   view(grad_x, "grad_x"), context(x));
    return grad_x;
  });
}

}  // namespace
}  // namespace torch_ops
}  // namespace detops

namespace ops = detops::torch_ops;

DETOPS_LIBRARY_FRAGMENT(m) {
  // SyncBatchNorm's phases, driven by detops_torch.distributed with torch.distributed.
  m.def("sync_batch_norm_record_words(int channels, str mode) -> int");
  // The rank-agreement header: this rank's words, and the check of every rank's (parts: forward
  // weight/bias and running statistics given; backward grad_x, grad_weight, grad_bias wanted).
  m.def("sync_batch_norm_header(Tensor x, bool backward, bool part0, bool part1, bool part2, str mode, "
        "bool training, float eps, float? momentum, bool failed) -> Tensor");
  m.def("sync_batch_norm_check_headers(Tensor gathered, str what) -> int");
  m.def("sync_batch_norm_local_scales(Tensor x, Tensor? grad_y, Tensor? save_mean) -> Tensor");
  m.def("sync_batch_norm_merge_scales(Tensor gathered) -> Tensor");
  m.def("sync_batch_norm_local_stats(Tensor x, str mode, Tensor? scales) -> Tensor");
  // The mode argument is named sync_mode here (mode elsewhere): this op mutates its arguments, and
  // torch.compile wraps such ops in auto_functionalized(_mutable_op, mode?, **kwargs), whose own
  // `mode` parameter collides with an argument of that name (measured on torch 2.11: opcheck's
  // test_aot_dispatch_dynamic failed). Positional calls are unaffected.
  m.def("sync_batch_norm_finalize_stats(Tensor gathered, Tensor? weight, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, float eps, float? momentum, str sync_mode, "
        "Tensor? scales) -> (Tensor save_mean, Tensor save_invstd)");
  m.def("sync_batch_norm_apply(Tensor x, Tensor? weight, Tensor? bias, Tensor save_mean, "
        "Tensor save_invstd) -> Tensor");
  m.def("sync_batch_norm_local_backward(Tensor grad_y, Tensor x, Tensor save_mean, str mode, "
        "Tensor? scales) -> Tensor");
  m.def("sync_batch_norm_finalize_backward(Tensor gathered, int rank, str mode, Tensor save_invstd, "
        "Tensor? scales, bool weight_grad) -> (Tensor sums, Tensor grad_weight, Tensor grad_bias)");
  m.def("sync_batch_norm_backward_apply(Tensor grad_y, Tensor x, Tensor? weight, Tensor save_mean, "
        "Tensor save_invstd, Tensor sums) -> Tensor");
}

namespace {
template <class Library>
void kernels(Library& m) {
  m.impl("sync_batch_norm_local_scales", DETOPS_KERNEL(ops::local_scales_kernel));
  m.impl("sync_batch_norm_merge_scales", DETOPS_KERNEL(ops::merge_scales_kernel));
  m.impl("sync_batch_norm_local_stats", DETOPS_KERNEL(ops::local_stats_kernel));
  m.impl("sync_batch_norm_finalize_stats", DETOPS_KERNEL(ops::finalize_stats_kernel));
  m.impl("sync_batch_norm_apply", DETOPS_KERNEL(ops::apply_kernel));
  m.impl("sync_batch_norm_local_backward", DETOPS_KERNEL(ops::local_backward_kernel));
  m.impl("sync_batch_norm_finalize_backward", DETOPS_KERNEL(ops::finalize_backward_kernel));
  m.impl("sync_batch_norm_backward_apply", DETOPS_KERNEL(ops::backward_apply_kernel));
}
}  // namespace

DETOPS_LIBRARY_IMPL_CPU_CUDA(kernels)

// No tensor argument, nothing to dispatch on: one kernel for every backend.
DETOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  m.impl("sync_batch_norm_record_words", DETOPS_KERNEL(ops::record_words_kernel));
  // metadata and host memory only: the same kernel whatever x's device
  m.impl("sync_batch_norm_header", DETOPS_KERNEL(ops::header_kernel));
  m.impl("sync_batch_norm_check_headers", DETOPS_KERNEL(ops::check_headers_kernel));
}


// No gradient of their own (the Python autograd.Function composes them): autograd passes through,
// which also lets meta tensors reach the Meta kernels (torch 1.13 has no autograd fallback for the
// AutogradMeta key).
#if !DETOPS_TORCH_STABLE
TORCH_LIBRARY_IMPL(detops, Autograd, m) {
  for (const char* name : {"sync_batch_norm_local_scales", "sync_batch_norm_merge_scales", "sync_batch_norm_local_stats",
                           "sync_batch_norm_finalize_stats", "sync_batch_norm_apply", "sync_batch_norm_local_backward",
                           "sync_batch_norm_finalize_backward", "sync_batch_norm_backward_apply",
                           "sync_batch_norm_header", "sync_batch_norm_check_headers"}) {
    m.impl(name, ::torch::CppFunction::makeFallthrough());
  }
}
#endif
