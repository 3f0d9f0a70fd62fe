// SyncBatchNorm entry points: validation, the rank-agreement header, the phases, and the
// one-call forward/backward that drive them over a Communicator.
#include "detops/sync_batch_norm.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "internal/common.h"
#include "internal/runtime.h"
#include "internal/sync_batch_norm_backend.h"
#include "internal/validate.h"

namespace detops {
namespace {

using internal::fail;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

// ---------------------------------------------------------------------------------------------
// Validation

void check_input(const char* op, const char* name, const TensorView& v) {
  internal::check_tensor(op, name, v, 4);
  if (!internal::is_floating(v.dtype))
    fail(kBad, "{}: {} has dtype {}; expected float32, float64, float16 or bfloat16", op, name, dtype_name(v.dtype));
  if (v.device.is_cuda() && !internal::cuda_backend_compiled())
    fail(ErrorCode::kNotCompiled, "{}: {} is on {}; this build of detops has no CUDA backend", op, name,
         to_string(v.device));
}

void check_like(const char* op, const char* name, const TensorView& v, const char* ref_name, const TensorView& ref) {
  internal::check_tensor(op, name, v, 4);
  for (int d = 0; d < 4; ++d)
    if (v.sizes[d] != ref.sizes[d])
      fail(kBad, "{}: {} has sizes {}; expected the sizes of {}, {}", op, name, internal::sizes_str(v), ref_name,
           internal::sizes_str(ref));
  if (v.dtype != ref.dtype)
    fail(kBad, "{}: {} has dtype {}; expected {}'s dtype {}", op, name, dtype_name(v.dtype), ref_name,
         dtype_name(ref.dtype));
  internal::check_same_device(op, name, v, ref_name, ref);
}

enum class VecKind { kFloat64, kParam, kInt64 };

/// A [n] vector on ref's device: float64 and contiguous (kFloat64), float32 or float64 with any
/// stride (kParam), or contiguous int64 (kInt64).
void check_vec(const char* op, const char* name, const TensorView& v, std::int64_t n, VecKind kind,
               const char* ref_name, const TensorView& ref) {
  internal::check_tensor(op, name, v, 1);
  if (v.sizes[0] != n) fail(kBad, "{}: {} has sizes {}; expected [{}]", op, name, internal::sizes_str(v), n);
  switch (kind) {
    case VecKind::kFloat64:
      if (v.dtype != DType::kFloat64) fail(kBad, "{}: {} has dtype {}; expected float64", op, name, dtype_name(v.dtype));
      break;
    case VecKind::kParam:
      if (v.dtype != DType::kFloat32 && v.dtype != DType::kFloat64)
        fail(kBad, "{}: {} has dtype {}; expected float32 or float64", op, name, dtype_name(v.dtype));
      break;
    case VecKind::kInt64:
      if (v.dtype != DType::kInt64) fail(kBad, "{}: {} has dtype {}; expected int64", op, name, dtype_name(v.dtype));
      break;
  }
  if (kind != VecKind::kParam && n > 1 && v.strides[0] != 1)
    fail(kBad, "{}: {} has stride {}; expected a contiguous vector (stride 1)", op, name, v.strides[0]);
  internal::check_same_device(op, name, v, ref_name, ref);
}

/// Gathered records: [ranks >= 1, words] int64, contiguous, on ref's device.
std::int64_t check_gathered(const char* op, const TensorView& g, std::int64_t words, const char* ref_name,
                            const TensorView& ref) {
  internal::check_tensor(op, "gathered", g, 2);
  if (g.dtype != DType::kInt64) fail(kBad, "{}: gathered has dtype {}; expected int64", op, dtype_name(g.dtype));
  if (g.sizes[0] < 1 || g.sizes[1] != words)
    fail(kBad, "{}: gathered has sizes {}; expected [ranks >= 1, {}]", op, internal::sizes_str(g), words);
  if (!g.is_contiguous()) fail(kBad, "{}: gathered is not contiguous; expected row-major records", op);
  internal::check_same_device(op, "gathered", g, ref_name, ref);
  return g.sizes[0];
}

void check_mode(const char* op, SyncBnMode mode) {
  if (mode != SyncBnMode::kDefault && mode != SyncBnMode::kExact)
    fail(kBad, "{}: mode {} is unknown; expected kDefault or kExact", op, static_cast<int>(mode));
}

void check_options(const char* op, const SyncBnOptions& o) {
  check_mode(op, o.mode);
  if (!(o.eps >= 0.0) || !std::isfinite(o.eps)) fail(kBad, "{}: eps is {}; expected a finite value >= 0", op, o.eps);
  if (o.momentum && !(*o.momentum >= 0.0 && *o.momentum <= 1.0))
    fail(kBad, "{}: momentum is {}; expected a value in [0, 1] (or unset for a cumulative average)", op, *o.momentum);
}

detail::SbnParam param_of(const TensorView& v) {
  return {v.data, v.dtype == DType::kFloat64, v.defined() ? v.strides[0] : 0};
}

/// weight/bias and running stats: pairs, [C], float32/float64, on x's device; num_batches_tracked
/// [1] int64. Returns whether running statistics are tracked.
bool check_params(const char* op, const SyncBnParams& p, const TensorView& x, const SyncBnOptions& o,
                  bool needs_running) {
  const std::int64_t C = x.sizes[1];
  if (p.weight.defined() != p.bias.defined())
    fail(kBad, "{}: weight is {} but bias is {}; expected both (affine) or neither", op,
         p.weight.defined() ? "given" : "absent", p.bias.defined() ? "given" : "absent");
  if (p.weight.defined()) {
    check_vec(op, "weight", p.weight, C, VecKind::kParam, "x", x);
    check_vec(op, "bias", p.bias, C, VecKind::kParam, "x", x);
  }
  if (p.running_mean.defined() != p.running_var.defined())
    fail(kBad, "{}: running_mean is {} but running_var is {}; expected both (track_running_stats) or neither", op,
         p.running_mean.defined() ? "given" : "absent", p.running_var.defined() ? "given" : "absent");
  const bool running = p.running_mean.defined();
  if (running) {
    check_vec(op, "running_mean", p.running_mean, C, VecKind::kParam, "x", x);
    check_vec(op, "running_var", p.running_var, C, VecKind::kParam, "x", x);
    internal::check_non_overlapping(op, "running_mean", p.running_mean);
    internal::check_non_overlapping(op, "running_var", p.running_var);
    internal::check_no_partial_overlap(op, "running_var", p.running_var, "running_mean", p.running_mean, false);
  } else if (needs_running) {
    fail(kBad, "{}: running_mean and running_var are absent; expected them in evaluation mode", op);
  }
  if (p.num_batches_tracked.defined()) {
    check_vec(op, "num_batches_tracked", p.num_batches_tracked, 1, VecKind::kInt64, "x", x);
    if (running) {
      internal::check_no_partial_overlap(op, "num_batches_tracked", p.num_batches_tracked, "running_mean",
                                         p.running_mean, false);
      internal::check_no_partial_overlap(op, "num_batches_tracked", p.num_batches_tracked, "running_var",
                                         p.running_var, false);
    }
  }
  if (o.training && running && !o.momentum && !p.num_batches_tracked.defined())
    fail(kBad, "{}: momentum is unset (cumulative average) but num_batches_tracked is absent; expected a [1] int64 "
               "counter", op);
  return running;
}

/// save_mean / save_invstd: [C] float64 contiguous, disjoint from each other and from `others`.
void check_saved(const char* op, const TensorView& mean, const TensorView& invstd, const TensorView& x, bool written,
                 std::initializer_list<std::pair<const char*, const TensorView*>> others) {
  const std::int64_t C = x.sizes[1];
  check_vec(op, "save_mean", mean, C, VecKind::kFloat64, "x", x);
  check_vec(op, "save_invstd", invstd, C, VecKind::kFloat64, "x", x);
  if (!written) return;
  internal::check_no_partial_overlap(op, "save_invstd", invstd, "save_mean", mean, false);
  for (const auto& o : others) {
    if (!o.second->defined()) continue;
    internal::check_no_partial_overlap(op, "save_mean", mean, o.first, *o.second, false);
    internal::check_no_partial_overlap(op, "save_invstd", invstd, o.first, *o.second, false);
  }
}

/// A phase's output must not share bytes with any of the other tensors of the call (the phases
/// read their inputs while they write; the one-call path never aliases its scratch).
void check_disjoint(const char* op, const char* out_name, const TensorView& out,
                    std::initializer_list<std::pair<const char*, const TensorView*>> others) {
  for (const auto& o : others)
    if (o.second->defined()) internal::check_no_partial_overlap(op, out_name, out, o.first, *o.second, false);
}

// ---------------------------------------------------------------------------------------------
// Scratch memory on a device, stream-ordered on CUDA.

class Scratch {
 public:
  Scratch(std::size_t bytes, Device device, const Context& ctx) : device_(device), ctx_(ctx), bytes_(bytes) {
    if (device.is_cpu()) {
      host_.resize((bytes + 7) / 8);
      data_ = host_.data();
    } else if (bytes) {
      alloc_ = ctx.allocator ? ctx.allocator : &default_allocator();
      data_ = alloc_->allocate(bytes, device, ctx.cuda_stream);
    }
  }
  ~Scratch() {
    if (alloc_ && data_) alloc_->deallocate(data_, bytes_, device_, ctx_.cuda_stream);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  Device device_;
  const Context& ctx_;
  std::size_t bytes_;
  std::vector<std::int64_t> host_;
  Allocator* alloc_ = nullptr;
  void* data_ = nullptr;
};

/// All-gathers `words` int64 words per rank (on `device`) into gathered [size * words].
void gather_words(Communicator& comm, const std::int64_t* local, std::int64_t words, std::int64_t* gathered,
                  Device device, const Context& ctx) {
  const std::size_t bytes = static_cast<std::size_t>(words) * sizeof(std::int64_t);
  if (device.is_cpu()) {
    comm.all_gather(local, gathered, bytes, device, nullptr);
    return;
  }
  if (comm.accepts_device_memory()) {
    comm.all_gather(local, gathered, bytes, device, ctx.cuda_stream);
    return;
  }
  // stage through the host: wait for the record, gather, copy back
  std::vector<std::int64_t> host_local(static_cast<std::size_t>(words));
  std::vector<std::int64_t> host_all(static_cast<std::size_t>(words) * static_cast<std::size_t>(comm.size()));
  internal::copy_bytes_async(host_local.data(), Device::cpu(), local, device, bytes, ctx.cuda_stream);
  internal::cuda_stream_synchronize(device, ctx.cuda_stream);
  comm.all_gather(host_local.data(), host_all.data(), bytes, Device::cpu(), nullptr);
  internal::copy_bytes_async(gathered, device, host_all.data(), Device::cpu(), host_all.size() * sizeof(std::int64_t),
                             ctx.cuda_stream);
  // the host vectors die here: wait until the copy has read them
  internal::cuda_stream_synchronize(device, ctx.cuda_stream);
}

// ---------------------------------------------------------------------------------------------
// The rank-agreement header: 6 int64 words, exchanged in host memory.

constexpr std::int64_t kMagic = 0x44544f5053424e02;  // "DTOPSBN" + version 2 (version 1: no count)
enum : std::int64_t { kOpForward = 1, kOpBackward = 2 };

struct Header {
  std::int64_t magic, channels, flags, sequence, failed;
  std::int64_t count;  // this rank's N * H * W (the exact forward checks the total)
};
static_assert(sizeof(Header) == 48, "");

std::int64_t make_flags(std::int64_t op, const TensorView& x, const SyncBnOptions& o, bool a, bool b, bool c) {
  return op | (static_cast<std::int64_t>(x.dtype) << 4) | (static_cast<std::int64_t>(o.mode) << 12) |
         (std::int64_t{o.training} << 16) | (std::int64_t{a} << 17) | (std::int64_t{b} << 18) | (std::int64_t{c} << 19);
}

std::string describe_flags(std::int64_t f) {
  return fmt::format("{} {} {} mode {}{}{}{}", (f & 15) == kOpForward ? "forward" : "backward",
                     dtype_name(static_cast<DType>((f >> 4) & 255)), (f >> 16) & 1 ? "training" : "evaluation",
                     ((f >> 12) & 15) == 0 ? "default" : "exact", (f >> 17) & 1 ? " +a" : "", (f >> 18) & 1 ? " +b" : "",
                     (f >> 19) & 1 ? " +c" : "");
}

/// A header before validation: the communicator's next sequence number (only training calls
/// are collective, so only they count), channels unknown.
Header start_header(Communicator* comm, const SyncBnOptions& o, std::int64_t op) {
  Header h{};
  h.sequence = comm && o.training ? static_cast<std::int64_t>(comm->next_sequence()) : 0;
  h.channels = -1;
  h.flags = op;
  return h;
}

/// Exchanges headers when asked; throws the local error (on the failing rank) or a
/// kCommunication error (on the others) when any rank failed, and kCommunication on any
/// disagreement. Without a check, only rethrows the local error.
void agree(const char* op, Communicator* comm, const SyncBnOptions& o, Header mine, std::exception_ptr local_error) {
  // evaluation communicates nothing (a rank may evaluate alone), not even the header
  const bool exchange = comm && comm->size() > 1 && o.check_ranks && o.training;
  if (!exchange) {
    if (local_error) std::rethrow_exception(local_error);
    return;
  }
  const int n = comm->size();
  std::vector<Header> all(static_cast<std::size_t>(n));
  mine.magic = kMagic;
  mine.failed = local_error ? 1 : 0;
  comm->all_gather(&mine, all.data(), sizeof(Header), Device::cpu(), nullptr);
  if (local_error) std::rethrow_exception(local_error);
  for (int r = 0; r < n; ++r) {
    const Header& h = all[static_cast<std::size_t>(r)];
    if (h.magic != kMagic)
      fail(ErrorCode::kCommunication, "{}: rank {} of {} ({}) is not in a detops SyncBatchNorm call of this version", op,
           r, n, comm->name());
    if (h.failed)
      fail(ErrorCode::kCommunication, "{}: rank {} of {} failed its argument checks (its own error says why); every "
           "rank raises", op, r, n);
  }
  const Header& h0 = all[0];
  for (int r = 1; r < n; ++r) {
    const Header& h = all[static_cast<std::size_t>(r)];
    if (h.sequence != h0.sequence)
      fail(ErrorCode::kCommunication, "{}: the ranks are at different calls: rank 0 at call #{} of its communicator, "
           "rank {} at #{} (a rank skipped or added a SyncBatchNorm call)", op, h0.sequence, r, h.sequence);
    if (h.flags != h0.flags)
      fail(ErrorCode::kCommunication, "{}: the ranks disagree: rank 0 runs {}, rank {} runs {}", op,
           describe_flags(h0.flags), r, describe_flags(h.flags));
    if (h.channels != h0.channels)
      fail(ErrorCode::kCommunication, "{}: the ranks disagree on the channel count: rank 0 has {}, rank {} has {}", op,
           h0.channels, r, h.channels);
  }
  // the exact forward's sum of squares takes fewer than 2^39 elements per channel in total (each
  // rank checked its own count): every rank sees the same headers and raises the same error
  if ((h0.flags & 15) == kOpForward && ((h0.flags >> 12) & 15) == static_cast<std::int64_t>(SyncBnMode::kExact)) {
    std::int64_t total = 0;
    for (const Header& h : all) total = h.count > detail::kSbnExactMaxCount - total ? detail::kSbnExactMaxCount + 1 : total + h.count;
    if (total > detail::kSbnExactMaxCount)
      fail(kBad, "{}: the {} ranks hold at least 2^39 elements per channel together; the exact mode supports fewer "
           "(use the default mode)", op, n);
  }
}

// ---------------------------------------------------------------------------------------------
// Backend dispatch

bool on_cpu(const TensorView& v) { return v.device.is_cpu(); }

void local_scales(const TensorView& x, const TensorView& dy, const double* mean, std::int64_t* out, const Context& ctx) {
  if (on_cpu(x)) internal::sbn_local_scales_cpu(x, dy, mean, out, ctx);
  else internal::sbn_local_scales_cuda(x, dy, mean, out, ctx);
}
void merge_scales(const std::int64_t* g, std::int64_t ranks, std::int64_t words, std::int64_t* out, Device dev,
                  const Context& ctx) {
  if (dev.is_cpu()) internal::sbn_merge_scales_cpu(g, ranks, words, out);
  else internal::sbn_merge_scales_cuda(g, ranks, words, out, dev, ctx);
}
void local_stats(const TensorView& x, bool exact, const std::int64_t* scales, std::int64_t* record, const Context& ctx) {
  if (on_cpu(x)) internal::sbn_local_stats_cpu(x, exact, scales, record, ctx);
  else internal::sbn_local_stats_cuda(x, exact, scales, record, ctx);
}
void local_backward(const TensorView& dy, const TensorView& x, const double* mean, bool exact,
                    const std::int64_t* scales, std::int64_t* record, const Context& ctx) {
  if (on_cpu(x)) internal::sbn_local_backward_cpu(dy, x, mean, exact, scales, record, ctx);
  else internal::sbn_local_backward_cuda(dy, x, mean, exact, scales, record, ctx);
}
void finalize(const detail::SbnFinalizeArgs& a, Device dev, const Context& ctx) {
  if (dev.is_cpu()) internal::sbn_finalize_cpu(a);
  else internal::sbn_finalize_cuda(a, dev, ctx);
}
void finalize_backward(const detail::SbnBackwardFinalizeArgs& a, Device dev, const Context& ctx) {
  if (dev.is_cpu()) internal::sbn_finalize_backward_cpu(a);
  else internal::sbn_finalize_backward_cuda(a, dev, ctx);
}
void apply(const TensorView& x, const SyncBnParams& p, const double* mean, const double* invstd, const TensorView& y,
           const Context& ctx) {
  if (on_cpu(x)) internal::sbn_apply_cpu(x, param_of(p.weight), param_of(p.bias), mean, invstd, y, ctx);
  else internal::sbn_apply_cuda(x, param_of(p.weight), param_of(p.bias), mean, invstd, y, ctx);
}
void backward_apply(const TensorView& dy, const TensorView& x, const TensorView& weight, const double* mean,
                    const double* invstd, const double* sums, const TensorView& dx, const Context& ctx) {
  if (on_cpu(x)) internal::sbn_backward_apply_cpu(dy, x, param_of(weight), mean, invstd, sums, dx, ctx);
  else internal::sbn_backward_apply_cuda(dy, x, param_of(weight), mean, invstd, sums, dx, ctx);
}

/// Exact mode: this rank's exponents, gathered over the ranks and merged, in scratch laid out as
/// [local words | gathered ranks * words | merged words]; returns the merged ones.
std::int64_t* agree_scales(Communicator* comm, std::int64_t ranks, const TensorView& x, const TensorView& dy,
                           const double* mean, std::int64_t words, std::int64_t* scratch, const Context& ctx) {
  std::int64_t* local = scratch;
  std::int64_t* all = scratch + words;
  std::int64_t* merged = all + ranks * words;
  local_scales(x, dy, mean, local, ctx);
  if (ranks > 1) gather_words(*comm, local, words, all, x.device, ctx);
  merge_scales(ranks > 1 ? all : local, ranks > 1 ? ranks : 1, words, merged, x.device, ctx);
  return merged;
}

detail::SbnFinalizeArgs finalize_args(const std::int64_t* gathered, std::int64_t ranks, std::int64_t C,
                                      const SyncBnOptions& o, const std::int64_t* scales, const SyncBnParams& p,
                                      bool update_running, double* mean, double* invstd) {
  detail::SbnFinalizeArgs a{};
  a.gathered = gathered;
  a.ranks = ranks;
  a.words = detail::sbn_record_words(C, o.mode == SyncBnMode::kExact);
  a.channels = C;
  a.exact = o.mode == SyncBnMode::kExact;
  a.exponents = scales;
  a.eps = o.eps;
  a.has_momentum = o.momentum.has_value();
  a.momentum = o.momentum.value_or(0.0);
  if (update_running) {
    a.running_mean = param_of(p.running_mean);
    a.running_var = param_of(p.running_var);
    a.num_batches_tracked = static_cast<std::int64_t*>(p.num_batches_tracked.data);
  } else {
    a.running_mean = a.running_var = detail::SbnParam{nullptr, false, 0};
    a.num_batches_tracked = nullptr;
  }
  a.save_mean = mean;
  a.save_invstd = invstd;
  return a;
}

/// An absent tensor, for the optional entries of check_disjoint.
const TensorView& absent_view() {
  static const TensorView none{};
  return none;
}

void check_exact_count(const char* op, std::int64_t count) {
  if (count > detail::kSbnExactMaxCount)
    fail(kBad, "{}: {} elements per channel; the exact mode supports fewer than 2^39", op, count);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Phases

std::int64_t sync_batch_norm_record_words(std::int64_t channels, SyncBnMode mode) {
  check_mode("sync_batch_norm_record_words", mode);
  const std::int64_t per_channel = mode == SyncBnMode::kExact ? 4 : 2;
  const std::int64_t max_channels = (std::numeric_limits<std::int64_t>::max() - 1) / per_channel;
  if (channels < 0 || channels > max_channels)
    fail(kBad, "sync_batch_norm_record_words: channels is {}; expected [0, {}] (1 + {} * channels words fit in int64)",
         channels, max_channels, per_channel);
  return detail::sbn_record_words(channels, mode == SyncBnMode::kExact);
}

std::int64_t sync_batch_norm_scale_words(std::int64_t channels, bool backward) {
  const std::int64_t max_channels = std::numeric_limits<std::int64_t>::max() / (backward ? 2 : 1);
  if (channels < 0 || channels > max_channels)
    fail(kBad, "sync_batch_norm_scale_words: channels is {}; expected [0, {}]", channels, max_channels);
  return backward ? 2 * channels : channels;
}

void sync_batch_norm_local_scales(const TensorView& x, const TensorView& grad_y, const TensorView& save_mean,
                                  const TensorView& scales, const Context& ctx) {
  const char* op = "sync_batch_norm_local_scales";
  check_input(op, "x", x);
  const bool backward = grad_y.defined();
  if (backward) {
    check_like(op, "grad_y", grad_y, "x", x);
    check_vec(op, "save_mean", save_mean, x.sizes[1], VecKind::kFloat64, "x", x);
  }
  check_vec(op, "scales", scales, sync_batch_norm_scale_words(x.sizes[1], backward), VecKind::kInt64, "x", x);
  check_disjoint(op, "scales", scales, {{"x", &x}, {"grad_y", &grad_y}, {"save_mean", &save_mean}});
  local_scales(x, grad_y, backward ? static_cast<const double*>(save_mean.data) : nullptr,
               static_cast<std::int64_t*>(scales.data), ctx);
}

void sync_batch_norm_merge_scales(const TensorView& gathered, const TensorView& scales, const Context& ctx) {
  const char* op = "sync_batch_norm_merge_scales";
  internal::check_tensor(op, "scales", scales, 1);
  const std::int64_t ranks = check_gathered(op, gathered, scales.sizes[0], "scales", scales);
  check_vec(op, "scales", scales, gathered.sizes[1], VecKind::kInt64, "gathered", gathered);
  check_disjoint(op, "scales", scales, {{"gathered", &gathered}});
  merge_scales(static_cast<const std::int64_t*>(gathered.data), ranks, gathered.sizes[1],
               static_cast<std::int64_t*>(scales.data), scales.device, ctx);
}

void sync_batch_norm_local_stats(const TensorView& x, const TensorView& record, SyncBnMode mode,
                                 const TensorView& scales, const Context& ctx) {
  const char* op = "sync_batch_norm_local_stats";
  check_mode(op, mode);
  check_input(op, "x", x);
  const bool exact = mode == SyncBnMode::kExact;
  check_vec(op, "record", record, detail::sbn_record_words(x.sizes[1], exact), VecKind::kInt64, "x", x);
  if (exact) {
    check_vec(op, "scales", scales, x.sizes[1], VecKind::kInt64, "x", x);
    check_exact_count(op, x.sizes[0] * x.sizes[2] * x.sizes[3]);
  }
  check_disjoint(op, "record", record, {{"x", &x}, {"scales", exact ? &scales : &absent_view()}});
  local_stats(x, exact, exact ? static_cast<const std::int64_t*>(scales.data) : nullptr,
              static_cast<std::int64_t*>(record.data), ctx);
}

void sync_batch_norm_finalize_stats(const TensorView& gathered, const SyncBnParams& params, const TensorView& save_mean,
                                    const TensorView& save_invstd, const SyncBnOptions& opts, const TensorView& scales,
                                    const Context& ctx) {
  const char* op = "sync_batch_norm_finalize_stats";
  check_options(op, opts);
  internal::check_tensor(op, "save_mean", save_mean, 1);
  const std::int64_t C = save_mean.sizes[0];
  const bool exact = opts.mode == SyncBnMode::kExact;
  const std::int64_t ranks = check_gathered(op, gathered, detail::sbn_record_words(C, exact), "save_mean", save_mean);
  // a stand-in for x with the channel count, for the parameter checks
  TensorView like = save_mean;
  like.rank = 4;
  like.sizes[0] = 1, like.sizes[1] = C, like.sizes[2] = 1, like.sizes[3] = 1;
  const bool running = check_params(op, params, like, opts, false);
  check_saved(op, save_mean, save_invstd, like, true,
              {{"running_mean", &params.running_mean}, {"running_var", &params.running_var}, {"gathered", &gathered}});
  if (exact) check_vec(op, "scales", scales, C, VecKind::kInt64, "save_mean", save_mean);
  const TensorView& sc = exact ? scales : absent_view();
  check_disjoint(op, "save_mean", save_mean, {{"scales", &sc}});
  check_disjoint(op, "save_invstd", save_invstd, {{"scales", &sc}});
  if (running && opts.training) {  // updated in place
    for (const auto& out : {std::make_pair("running_mean", &params.running_mean),
                            std::make_pair("running_var", &params.running_var),
                            std::make_pair("num_batches_tracked", &params.num_batches_tracked)})
      if (out.second->defined())
        check_disjoint(op, out.first, *out.second,
                       {{"gathered", &gathered}, {"scales", &sc}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd},
                        {"weight", &params.weight}, {"bias", &params.bias}});
  }
  finalize(finalize_args(static_cast<const std::int64_t*>(gathered.data), ranks, C, opts,
                         exact ? static_cast<const std::int64_t*>(scales.data) : nullptr, params,
                         running && opts.training, static_cast<double*>(save_mean.data),
                         static_cast<double*>(save_invstd.data)),
           save_mean.device, ctx);
}

void sync_batch_norm_apply(const TensorView& x, const SyncBnParams& params, const TensorView& save_mean,
                           const TensorView& save_invstd, const TensorView& y, const Context& ctx) {
  const char* op = "sync_batch_norm_apply";
  check_input(op, "x", x);
  check_like(op, "y", y, "x", x);
  internal::check_non_overlapping(op, "y", y);
  internal::check_no_partial_overlap(op, "y", y, "x", x, true);
  SyncBnOptions o;
  check_params(op, params, x, o, false);
  check_saved(op, save_mean, save_invstd, x, false, {});
  check_disjoint(op, "y", y,
                 {{"weight", &params.weight}, {"bias", &params.bias}, {"running_mean", &params.running_mean},
                  {"running_var", &params.running_var}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd}});
  apply(x, params, static_cast<const double*>(save_mean.data), static_cast<const double*>(save_invstd.data), y, ctx);
}

void sync_batch_norm_local_backward(const TensorView& grad_y, const TensorView& x, const TensorView& save_mean,
                                    const TensorView& record, SyncBnMode mode, const TensorView& scales,
                                    const Context& ctx) {
  const char* op = "sync_batch_norm_local_backward";
  check_mode(op, mode);
  check_input(op, "x", x);
  check_like(op, "grad_y", grad_y, "x", x);
  check_vec(op, "save_mean", save_mean, x.sizes[1], VecKind::kFloat64, "x", x);
  const bool exact = mode == SyncBnMode::kExact;
  check_vec(op, "record", record, detail::sbn_record_words(x.sizes[1], exact), VecKind::kInt64, "x", x);
  if (exact) {
    check_vec(op, "scales", scales, 2 * x.sizes[1], VecKind::kInt64, "x", x);
    check_exact_count(op, x.sizes[0] * x.sizes[2] * x.sizes[3]);
  }
  check_disjoint(op, "record", record,
                 {{"grad_y", &grad_y}, {"x", &x}, {"save_mean", &save_mean}, {"scales", exact ? &scales : &absent_view()}});
  local_backward(grad_y, x, static_cast<const double*>(save_mean.data), exact,
                 exact ? static_cast<const std::int64_t*>(scales.data) : nullptr,
                 static_cast<std::int64_t*>(record.data), ctx);
}

void sync_batch_norm_finalize_backward(const TensorView& gathered, int rank, SyncBnMode mode,
                                       const TensorView& save_invstd, const TensorView& sums,
                                       const TensorView& grad_weight, const TensorView& grad_bias,
                                       const TensorView& scales, const Context& ctx) {
  const char* op = "sync_batch_norm_finalize_backward";
  check_mode(op, mode);
  internal::check_tensor(op, "save_invstd", save_invstd, 1);
  const std::int64_t C = save_invstd.sizes[0];
  const bool exact = mode == SyncBnMode::kExact;
  const std::int64_t ranks = check_gathered(op, gathered, detail::sbn_record_words(C, exact), "save_invstd", save_invstd);
  if (rank < 0 || rank >= ranks) fail(kBad, "{}: rank is {}; expected [0, {})", op, rank, ranks);
  check_vec(op, "save_invstd", save_invstd, C, VecKind::kFloat64, "gathered", gathered);
  check_vec(op, "sums", sums, 2 * C + 1, VecKind::kFloat64, "gathered", gathered);
  if (grad_weight.defined()) check_vec(op, "grad_weight", grad_weight, C, VecKind::kParam, "gathered", gathered);
  if (grad_bias.defined()) check_vec(op, "grad_bias", grad_bias, C, VecKind::kParam, "gathered", gathered);
  if (exact) check_vec(op, "scales", scales, 2 * C, VecKind::kInt64, "gathered", gathered);
  const TensorView& sc = exact ? scales : absent_view();
  check_disjoint(op, "sums", sums, {{"gathered", &gathered}, {"save_invstd", &save_invstd}, {"scales", &sc}});
  for (const auto& g : {std::make_pair("grad_weight", &grad_weight), std::make_pair("grad_bias", &grad_bias)}) {
    if (!g.second->defined()) continue;
    internal::check_non_overlapping(op, g.first, *g.second);
    check_disjoint(op, g.first, *g.second,
                   {{"gathered", &gathered}, {"save_invstd", &save_invstd}, {"scales", &sc}, {"sums", &sums}});
  }
  if (grad_weight.defined() && grad_bias.defined())
    internal::check_no_partial_overlap(op, "grad_bias", grad_bias, "grad_weight", grad_weight, false);
  detail::SbnBackwardFinalizeArgs a{};
  a.gathered = static_cast<const std::int64_t*>(gathered.data);
  a.ranks = ranks;
  a.words = gathered.sizes[1];
  a.channels = C;
  a.rank = rank;
  a.exact = exact;
  a.exponents = exact ? static_cast<const std::int64_t*>(scales.data) : nullptr;
  a.save_invstd = static_cast<const double*>(save_invstd.data);
  a.sums = static_cast<double*>(sums.data);
  a.grad_weight = param_of(grad_weight);
  a.grad_bias = param_of(grad_bias);
  finalize_backward(a, gathered.device, ctx);
}

void sync_batch_norm_backward_apply(const TensorView& grad_y, const TensorView& x, const TensorView& weight,
                                    const TensorView& save_mean, const TensorView& save_invstd, const TensorView& sums,
                                    const TensorView& grad_x, const Context& ctx) {
  const char* op = "sync_batch_norm_backward_apply";
  check_input(op, "x", x);
  check_like(op, "grad_y", grad_y, "x", x);
  check_like(op, "grad_x", grad_x, "x", x);
  internal::check_non_overlapping(op, "grad_x", grad_x);
  internal::check_no_partial_overlap(op, "grad_x", grad_x, "grad_y", grad_y, true);
  internal::check_no_partial_overlap(op, "grad_x", grad_x, "x", x, false);
  if (weight.defined()) check_vec(op, "weight", weight, x.sizes[1], VecKind::kParam, "x", x);
  check_saved(op, save_mean, save_invstd, x, false, {});
  check_vec(op, "sums", sums, 2 * x.sizes[1] + 1, VecKind::kFloat64, "x", x);
  check_disjoint(op, "grad_x", grad_x,
                 {{"weight", &weight}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd}, {"sums", &sums}});
  backward_apply(grad_y, x, weight, static_cast<const double*>(save_mean.data),
                 static_cast<const double*>(save_invstd.data), static_cast<const double*>(sums.data), grad_x, ctx);
}

// ---------------------------------------------------------------------------------------------
// One call per direction

void sync_batch_norm_forward(const TensorView& x, const SyncBnParams& params, const TensorView& y,
                             const TensorView& save_mean, const TensorView& save_invstd, Communicator* comm,
                             const SyncBnOptions& opts, const Context& ctx) {
  const char* op = "sync_batch_norm_forward";
  Header mine = start_header(comm, opts, kOpForward);
  std::exception_ptr local_error;
  bool running = false;
  try {
    check_options(op, opts);
    check_input(op, "x", x);
    mine.channels = x.sizes[1];
    mine.count = x.sizes[0] * x.sizes[2] * x.sizes[3];
    mine.flags = make_flags(kOpForward, x, opts, params.weight.defined(), params.running_mean.defined(), false);
    check_like(op, "y", y, "x", x);
    internal::check_non_overlapping(op, "y", y);
    internal::check_no_partial_overlap(op, "y", y, "x", x, true);
    running = check_params(op, params, x, opts, !opts.training);
    check_saved(op, save_mean, save_invstd, x, true,
                {{"x", &x}, {"y", &y}, {"weight", &params.weight}, {"bias", &params.bias},
                 {"running_mean", &params.running_mean}, {"running_var", &params.running_var}});
    for (const auto& pr : {std::make_pair("weight", &params.weight), std::make_pair("bias", &params.bias),
                           std::make_pair("running_mean", &params.running_mean),
                           std::make_pair("running_var", &params.running_var)}) {
      if (!pr.second->defined()) continue;
      internal::check_no_partial_overlap(op, "y", y, pr.first, *pr.second, false);
    }
    if (opts.training && running) {
      // Updated in place after x, weight and bias are first read and before they are read again
      // (apply): the running statistics must not share bytes with them, nor the counter with
      // any other tensor (check_params compared it with the running statistics).
      for (const auto& out : {std::make_pair("running_mean", &params.running_mean),
                              std::make_pair("running_var", &params.running_var)})
        for (const auto& in : {std::make_pair("x", &x), std::make_pair("weight", &params.weight),
                               std::make_pair("bias", &params.bias)})
          if (in.second->defined()) internal::check_no_partial_overlap(op, out.first, *out.second, in.first, *in.second, false);
      if (params.num_batches_tracked.defined())
        for (const auto& in : {std::make_pair("x", &x), std::make_pair("y", &y), std::make_pair("weight", &params.weight),
                               std::make_pair("bias", &params.bias), std::make_pair("save_mean", &save_mean),
                               std::make_pair("save_invstd", &save_invstd)})
          if (in.second->defined())
            internal::check_no_partial_overlap(op, "num_batches_tracked", params.num_batches_tracked, in.first,
                                               *in.second, false);
    }
    if (opts.training && opts.mode == SyncBnMode::kExact) check_exact_count(op, x.sizes[0] * x.sizes[2] * x.sizes[3]);
    if (comm && opts.training && comm->size() < 1)
      fail(kBad, "{}: communicator {} has size {}; expected >= 1", op, comm->name(), comm->size());
  } catch (const Error&) {
    local_error = std::current_exception();
  }
  agree(op, comm, opts, mine, local_error);

  const std::int64_t C = x.sizes[1];
  double* mean = static_cast<double*>(save_mean.data);
  double* invstd = static_cast<double*>(save_invstd.data);
  if (!opts.training) {
    if (x.device.is_cpu()) {
      internal::sbn_eval_stats_cpu(param_of(params.running_mean), param_of(params.running_var), opts.eps, C, mean, invstd);
    } else {
      internal::sbn_eval_stats_cuda(param_of(params.running_mean), param_of(params.running_var), opts.eps, C, mean,
                                    invstd, x.device, ctx);
    }
    apply(x, params, mean, invstd, y, ctx);
    return;
  }
  const bool exact = opts.mode == SyncBnMode::kExact;
  const std::int64_t ranks = comm ? comm->size() : 1;
  const std::int64_t words = detail::sbn_record_words(C, exact);
  // one scratch buffer: [scales_local C | scales_gathered ranks*C | scales C] (exact),
  // record [words], gathered [ranks * words]
  const std::int64_t scale_words = exact ? C * (2 + ranks) : 0;
  Scratch scratch(static_cast<std::size_t>(scale_words + words * (1 + ranks)) * sizeof(std::int64_t), x.device, ctx);
  std::int64_t* base = scratch.as<std::int64_t>();
  std::int64_t* scales = nullptr;
  if (exact) scales = agree_scales(comm, ranks, x, TensorView{}, nullptr, C, base, ctx);
  std::int64_t* record = base + scale_words;
  std::int64_t* gathered = record + words;
  local_stats(x, exact, scales, record, ctx);
  if (ranks > 1) gather_words(*comm, record, words, gathered, x.device, ctx);
  else gathered = record;
  finalize(finalize_args(gathered, ranks, C, opts, scales, params, running, mean, invstd), x.device, ctx);
  apply(x, params, mean, invstd, y, ctx);
}

void sync_batch_norm_backward(const TensorView& grad_y, const TensorView& x, const TensorView& weight,
                              const TensorView& save_mean, const TensorView& save_invstd, const TensorView& grad_x,
                              const TensorView& grad_weight, const TensorView& grad_bias, Communicator* comm,
                              const SyncBnOptions& opts, const Context& ctx) {
  const char* op = "sync_batch_norm_backward";
  Header mine = start_header(comm, opts, kOpBackward);
  std::exception_ptr local_error;
  try {
    check_options(op, opts);
    check_input(op, "x", x);
    mine.channels = x.sizes[1];
    mine.count = x.sizes[0] * x.sizes[2] * x.sizes[3];
    mine.flags = make_flags(kOpBackward, x, opts, grad_x.defined(), grad_weight.defined(), grad_bias.defined());
    check_like(op, "grad_y", grad_y, "x", x);
    if (weight.defined()) check_vec(op, "weight", weight, x.sizes[1], VecKind::kParam, "x", x);
    check_saved(op, save_mean, save_invstd, x, false, {});
    if (grad_x.defined()) {
      check_like(op, "grad_x", grad_x, "x", x);
      internal::check_non_overlapping(op, "grad_x", grad_x);
      internal::check_no_partial_overlap(op, "grad_x", grad_x, "grad_y", grad_y, true);
      internal::check_no_partial_overlap(op, "grad_x", grad_x, "x", x, false);
      for (const auto& pr : {std::make_pair("weight", &weight), std::make_pair("save_mean", &save_mean),
                             std::make_pair("save_invstd", &save_invstd)})
        if (pr.second->defined()) internal::check_no_partial_overlap(op, "grad_x", grad_x, pr.first, *pr.second, false);
    }
    for (const auto& g : {std::make_pair("grad_weight", &grad_weight), std::make_pair("grad_bias", &grad_bias)}) {
      if (!g.second->defined()) continue;
      check_vec(op, g.first, *g.second, x.sizes[1], VecKind::kParam, "x", x);
      internal::check_non_overlapping(op, g.first, *g.second);
      for (const auto& in : {std::make_pair("x", &x), std::make_pair("grad_y", &grad_y), std::make_pair("weight", &weight),
                             std::make_pair("save_mean", &save_mean), std::make_pair("save_invstd", &save_invstd),
                             std::make_pair("grad_x", &grad_x)})
        if (in.second->defined()) internal::check_no_partial_overlap(op, g.first, *g.second, in.first, *in.second, false);
    }
    if (grad_weight.defined() && grad_bias.defined())
      internal::check_no_partial_overlap(op, "grad_bias", grad_bias, "grad_weight", grad_weight, false);
    if (grad_weight.defined() && !weight.defined())
      fail(kBad, "{}: grad_weight is given but weight is absent; expected weight (affine) for a weight gradient", op);
    if (opts.training && opts.mode == SyncBnMode::kExact) check_exact_count(op, x.sizes[0] * x.sizes[2] * x.sizes[3]);
  } catch (const Error&) {
    local_error = std::current_exception();
  }
  agree(op, comm, opts, mine, local_error);

  const std::int64_t C = x.sizes[1];
  const double* mean = static_cast<const double*>(save_mean.data);
  const double* invstd = static_cast<const double*>(save_invstd.data);
  // training with grad_x: global sums over the ranks; otherwise (evaluation, or only the
  // parameter gradients) this rank's sums in the default mode, no communication
  const bool global = opts.training && grad_x.defined();
  const bool exact = global && opts.mode == SyncBnMode::kExact;
  const std::int64_t ranks = global && comm ? comm->size() : 1;
  const std::int64_t words = detail::sbn_record_words(C, exact);
  const std::int64_t scale_words = exact ? 2 * C * (2 + ranks) : 0;
  const std::int64_t sums_words = 2 * C + 1;  // doubles
  Scratch scratch(static_cast<std::size_t>(scale_words + words * (1 + ranks) + sums_words) * sizeof(std::int64_t),
                  x.device, ctx);
  std::int64_t* base = scratch.as<std::int64_t>();
  std::int64_t* scales = nullptr;
  if (exact) scales = agree_scales(comm, ranks, x, grad_y, mean, 2 * C, base, ctx);
  std::int64_t* record = base + scale_words;
  std::int64_t* gathered = record + words;
  double* sums = reinterpret_cast<double*>(gathered + ranks * words);
  local_backward(grad_y, x, mean, exact, scales, record, ctx);
  std::int64_t my_row = 0;
  if (ranks > 1) {
    gather_words(*comm, record, words, gathered, x.device, ctx);
    my_row = comm->rank();
  } else {
    gathered = record;
  }
  detail::SbnBackwardFinalizeArgs a{};
  a.gathered = gathered;
  a.ranks = ranks;
  a.words = words;
  a.channels = C;
  a.rank = my_row;
  a.exact = exact;
  a.exponents = scales;
  a.save_invstd = invstd;
  a.sums = sums;
  a.grad_weight = param_of(grad_weight);
  a.grad_bias = param_of(grad_bias);
  finalize_backward(a, x.device, ctx);
  if (grad_x.defined()) backward_apply(grad_y, x, weight, mean, invstd, opts.training ? sums : nullptr, grad_x, ctx);
}

}  // namespace detops
