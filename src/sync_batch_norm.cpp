// SyncBatchNorm entry points: validation, the rank-agreement header, the phases, and the
// one-call forward/backward that drive them over a Communicator.
#include "detops/sync_batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "internal/backend.h"
#include "internal/common.h"
#include "internal/runtime.h"
#include "internal/scratch.h"
#include "internal/sync_batch_norm_backend.h"
#include "internal/validate.h"

namespace detops {
namespace {

using internal::fail;
using internal::NamedView;
using internal::SbnPass;
using internal::SyncBnBackend;
constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;

constexpr internal::OpBackends<SyncBnBackend> kBackends{&internal::kSyncBnCpu,
                                                       DETOPS_CUDA_BACKEND(internal::kSyncBnCuda)};

/// The backend of `device` (kNotCompiled for a CUDA tensor in a CPU-only build).
const SyncBnBackend& backend(Device device, const char* op) { return internal::backend_for(kBackends, device, op); }

// ---------------------------------------------------------------------------------------------
// Validation

/// x: [N, C, H, W] of a floating dtype, on a device this build has a backend for.
void check_input(const char* op, const char* name, const TensorView& v) {
  internal::check_tensor(op, name, v, 4);
  internal::check_floating(op, name, v);
  backend(v.device, op);
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

/// save_mean / save_invstd: [C] float64 contiguous; when written, disjoint from each other and
/// from `others`.
void check_saved(const char* op, const TensorView& mean, const TensorView& invstd, const TensorView& x, bool written,
                 std::initializer_list<NamedView> others) {
  const std::int64_t C = x.sizes[1];
  check_vec(op, "save_mean", mean, C, VecKind::kFloat64, "x", x);
  check_vec(op, "save_invstd", invstd, C, VecKind::kFloat64, "x", x);
  if (!written) return;
  const NamedView m{"save_mean", &mean}, s{"save_invstd", &invstd};
  internal::check_outputs(op, {m, s});
  internal::check_disjoint(op, m, others);
  internal::check_disjoint(op, s, others);
}

// ---------------------------------------------------------------------------------------------
// Collectives

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
// The rank-agreement header: kSyncBnHeaderWords int64 words, exchanged in host memory. The one
// copy of the protocol: the one-call API exchanges it over its Communicator; a framework that
// runs the collectives itself (detops_torch) builds it with sync_batch_norm_header and checks the
// gathered rows with sync_batch_norm_check_headers.

constexpr std::int64_t kMagic = 0x44544f5053424e03;  // "DTOPSBN" + version 3 (2: no eps, momentum)
enum : std::int64_t { kOpForward = 1, kOpBackward = 2 };
/// momentum's word when it is unset (torch's None: the cumulative average); a NaN pattern no
/// valid momentum has.
constexpr std::int64_t kNoMomentum = -1;

struct Header {
  std::int64_t magic, channels, flags, sequence, failed;
  std::int64_t count;     // this rank's N * H * W (the exact forward checks the total)
  std::int64_t eps;       // the bits of opts.eps
  std::int64_t momentum;  // the bits of *opts.momentum, or kNoMomentum
};
static_assert(sizeof(Header) == sizeof(std::int64_t) * kSyncBnHeaderWords, "");

std::int64_t double_bits(double v) {
  std::int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

double bits_double(std::int64_t bits) {
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// The optional tensors a call was given, by direction: bit 17 + i of the header's flags.
constexpr const char* kForwardParts[] = {"weight/bias", "running_mean/var"};
constexpr const char* kBackwardParts[] = {"grad_x", "grad_weight", "grad_bias"};

/// op (4 bits) | dtype (8) | mode (4) | training (1) | the parts given (bits 17..19) | device type
/// (bits 24..27).
std::int64_t make_flags(std::int64_t op, const TensorView& x, const SyncBnOptions& o, const bool* given, int parts) {
  std::int64_t f = op | (static_cast<std::int64_t>(x.dtype) << 4) | (static_cast<std::int64_t>(o.mode) << 12) |
                   (std::int64_t{o.training} << 16) | (static_cast<std::int64_t>(x.device.type) << 24);
  for (int i = 0; i < parts; ++i) f |= std::int64_t{given[i]} << (17 + i);
  return f;
}

/// "forward float32 training on cpu, default mode, weight/bias given, running_mean/var absent".
std::string describe_flags(std::int64_t f) {
  const bool forward = (f & 15) == kOpForward;
  std::string s = fmt::format("{} {} {} on {}, {} mode", forward ? "forward" : "backward",
                              dtype_name(static_cast<DType>((f >> 4) & 255)), (f >> 16) & 1 ? "training" : "evaluation",
                              ((f >> 24) & 15) == static_cast<std::int64_t>(DeviceType::kCUDA) ? "cuda" : "cpu",
                              ((f >> 12) & 15) == 0 ? "default" : "exact");
  int bit = 17;
  const auto add = [&](const char* part) { s += fmt::format(", {} {}", part, (f >> bit++) & 1 ? "given" : "absent"); };
  if (forward) {
    for (const char* part : kForwardParts) add(part);
  } else {
    for (const char* part : kBackwardParts) add(part);
  }
  return s;
}

/// What x says of the call: channels and count when it is [N, C, H, W], else -1 and 0 (a rank
/// whose checks fail still sends a header; its `failed` word is what the others read).
Header make_header(const TensorView& x, const SyncBnCall& call, const SyncBnOptions& o, std::int64_t sequence,
                   bool failed) {
  Header h{};
  h.magic = kMagic;
  const bool shaped = x.defined() && x.rank == 4;
  h.channels = shaped ? x.sizes[1] : -1;
  std::int64_t count = 0;
  if (shaped && !internal::checked_product({x.sizes[0], x.sizes[2], x.sizes[3]}, &count)) count = -1;
  h.count = count;
  h.flags = make_flags(call.backward ? kOpBackward : kOpForward, x, o, call.parts, call.backward ? 3 : 2);
  h.sequence = sequence;
  h.failed = failed ? 1 : 0;
  h.eps = double_bits(o.eps);
  h.momentum = o.momentum ? double_bits(*o.momentum) : kNoMomentum;
  return h;
}

std::string describe_momentum(std::int64_t bits) {
  return bits == kNoMomentum ? std::string("None (cumulative average)") : fmt::format("{}", bits_double(bits));
}

/// Every rank's header, rank r's at all[r]: throws the same error on every rank when one is not a
/// header of this version, a rank failed its own checks, or they disagree.
void check_headers(const char* op, const Header* all, int n) {
  for (int r = 0; r < n; ++r) {
    const Header& h = all[r];
    if (h.magic != kMagic)
      fail(ErrorCode::kCommunication, "{}: rank {} of {} is not in a detops SyncBatchNorm call of this version "
           "(header {:#x}; expected {:#x})", op, r, n, static_cast<std::uint64_t>(h.magic),
           static_cast<std::uint64_t>(kMagic));
    if (h.failed)
      fail(ErrorCode::kCommunication, "{}: rank {} of {} failed its argument checks (its own error says why); every "
           "rank raises", op, r, n);
  }
  const Header& h0 = all[0];
  for (int r = 1; r < n; ++r) {
    const Header& h = all[r];
    if (h.sequence != h0.sequence)
      fail(ErrorCode::kCommunication, "{}: the ranks are at different calls: rank 0 at call #{} of its communicator, "
           "rank {} at #{} (a rank skipped or added a SyncBatchNorm call)", op, h0.sequence, r, h.sequence);
    if (h.flags != h0.flags)
      fail(ErrorCode::kCommunication, "{}: the ranks disagree: rank 0 runs {}, rank {} runs {}", op,
           describe_flags(h0.flags), r, describe_flags(h.flags));
    if (h.channels != h0.channels)
      fail(ErrorCode::kCommunication, "{}: the ranks disagree on the channel count: rank 0 has {}, rank {} has {}", op,
           h0.channels, r, h.channels);
    if (h.eps != h0.eps)
      fail(ErrorCode::kCommunication, "{}: the ranks disagree on eps: rank 0 has {}, rank {} has {}", op,
           bits_double(h0.eps), r, bits_double(h.eps));
    if (h.momentum != h0.momentum)
      fail(ErrorCode::kCommunication, "{}: the ranks disagree on momentum: rank 0 has {}, rank {} has {}", op,
           describe_momentum(h0.momentum), r, describe_momentum(h.momentum));
  }
  // the exact forward's sum of squares takes fewer than 2^39 elements per channel in total (each
  // rank checked its own count): every rank sees the same headers and raises the same error
  if ((h0.flags & 15) == kOpForward && ((h0.flags >> 12) & 15) == static_cast<std::int64_t>(SyncBnMode::kExact) &&
      ((h0.flags >> 16) & 1)) {
    std::int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      const std::int64_t c = all[r].count;
      total = c < 0 || c > detail::kSbnExactMaxCount - total ? detail::kSbnExactMaxCount + 1 : total + c;
    }
    if (total > detail::kSbnExactMaxCount)
      fail(kBad, "{}: the {} ranks hold at least 2^39 elements per channel together; the exact mode supports fewer "
           "(use the default mode)", op, n);
  }
}

/// Exchanges headers when asked; throws the local error (on the failing rank) or a
/// kCommunication error (on the others) when any rank failed, and kCommunication on any
/// disagreement. Without a check, only rethrows the local error.
void agree(const char* op, Communicator* comm, const SyncBnOptions& o, const TensorView& x, const SyncBnCall& call,
           std::exception_ptr local_error) {
  // every training call counts (only they are collective), exchanged or not
  const std::int64_t sequence = comm && o.training ? static_cast<std::int64_t>(comm->next_sequence()) : 0;
  // evaluation communicates nothing (a rank may evaluate alone), not even the header
  const bool exchange = comm && comm->size() > 1 && o.check_ranks && o.training;
  if (!exchange) {
    if (local_error) std::rethrow_exception(local_error);
    return;
  }
  const int n = comm->size();
  const Header mine = make_header(x, call, o, sequence, local_error != nullptr);
  std::vector<Header> all(static_cast<std::size_t>(n));
  comm->all_gather(&mine, all.data(), sizeof(Header), Device::cpu(), nullptr);
  if (local_error) std::rethrow_exception(local_error);
  check_headers(op, all.data(), n);
}

// ---------------------------------------------------------------------------------------------
// Calls to the backend

detail::SbnParam param_of(const TensorView& v) {
  return {v.data, v.dtype == DType::kFloat64, v.defined() ? v.strides[0] : 0};
}

const std::int64_t* i64(const TensorView& v) { return static_cast<const std::int64_t*>(v.data); }
std::int64_t* i64_out(const TensorView& v) { return static_cast<std::int64_t*>(v.data); }
const double* f64(const TensorView& v) { return static_cast<const double*>(v.data); }
double* f64_out(const TensorView& v) { return static_cast<double*>(v.data); }

/// Runs f(ws) with `pass`'s backend scratch from ctx.allocator (the phases take no workspace).
template <class F>
void with_pass_scratch(const char* op, const SyncBnBackend& be, SbnPass pass, const TensorView& x, bool exact,
                       const Context& ctx, F&& f) {
  const std::size_t bytes = be.scratch_bytes(pass, x, exact);
  const internal::Scratch scratch(op, bytes, x.device, ctx);
  f(scratch.workspace(bytes));
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

/// Merges `ranks` gathered backward records of `words` words: sums, and row `rank`'s grad_weight
/// and grad_bias.
detail::SbnBackwardFinalizeArgs finalize_backward_args(const std::int64_t* gathered, std::int64_t ranks,
                                                       std::int64_t words, std::int64_t C, std::int64_t rank,
                                                       bool exact, const std::int64_t* exponents, const double* invstd,
                                                       double* sums, const TensorView& grad_weight,
                                                       const TensorView& grad_bias) {
  detail::SbnBackwardFinalizeArgs a{};
  a.gathered = gathered;
  a.ranks = ranks;
  a.words = words;
  a.channels = C;
  a.rank = rank;
  a.exact = exact;
  a.exponents = exponents;
  a.save_invstd = invstd;
  a.sums = sums;
  a.grad_weight = param_of(grad_weight);
  a.grad_bias = param_of(grad_bias);
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

// ---------------------------------------------------------------------------------------------
// The one-call forward and backward: validation, workspace, run

/// What a one-call direction does and the workspace it carves, in one order (sizing and carving):
/// exact mode [local scales | gathered scales (ranks > 1) | merged scales], this rank's record,
/// the gathered records (ranks > 1), the backward's sums (2C + 1 float64), the backend's scratch.
/// An evaluation forward carves nothing.
struct Plan {
  bool exact = false;
  std::int64_t ranks = 1;        // rows gathered (1: no collective)
  std::int64_t scale_words = 0;  // exact mode: C (forward) or 2C (backward)
  std::int64_t words = 0;        // record words
  std::size_t backend_bytes = 0;
  internal::WorkspaceLayout layout;
};

Plan make_plan(const SyncBnBackend& be, const TensorView& x, bool backward, bool global, const TensorView& grad_x,
               const Communicator* comm, SyncBnMode mode) {
  Plan p;
  const std::int64_t C = x.sizes[1];
  p.exact = global && mode == SyncBnMode::kExact;
  p.ranks = global && comm ? comm->size() : 1;
  p.scale_words = p.exact ? (backward ? 2 * C : C) : 0;
  p.words = detail::sbn_record_words(C, p.exact);
  const std::int64_t gathered_rows = p.ranks > 1 ? p.ranks : 0;
  p.layout.add<std::int64_t>(p.scale_words);
  p.layout.add<std::int64_t>(gathered_rows * p.scale_words);
  p.layout.add<std::int64_t>(p.scale_words);
  p.layout.add<std::int64_t>(p.words);
  p.layout.add<std::int64_t>(gathered_rows * p.words);
  p.layout.add<double>(backward ? 2 * C + 1 : 0);
  if (backward) {
    p.backend_bytes = be.scratch_bytes(SbnPass::kLocalBackward, x, p.exact);
    if (grad_x.defined()) p.backend_bytes = std::max(p.backend_bytes, be.scratch_bytes(SbnPass::kBackwardApply, x, false));
  } else {
    p.backend_bytes = be.scratch_bytes(SbnPass::kLocalStats, x, p.exact);
  }
  p.layout.add_bytes(p.backend_bytes);
  return p;
}

Plan forward_plan(const TensorView& x, const Communicator* comm, const SyncBnOptions& o, const char* op) {
  if (!o.training) return Plan{};  // evaluation: the running statistics, no records
  return make_plan(backend(x.device, op), x, false, true, TensorView{}, comm, o.mode);
}

/// Training with grad_x: global sums over the ranks; otherwise (evaluation, or only the parameter
/// gradients) this rank's sums in the default mode, no communication.
Plan backward_plan(const TensorView& x, const TensorView& grad_x, const Communicator* comm, const SyncBnOptions& o,
                   const char* op) {
  return make_plan(backend(x.device, op), x, true, o.training && grad_x.defined(), grad_x, comm, o.mode);
}

/// The plan's arrays in the scratch memory.
struct Carved {
  std::int64_t *local_scales, *gathered_scales, *scales, *record, *gathered;
  double* sums;
  Workspace backend;
};

Carved carve(Plan& p, const internal::Scratch& scratch) {
  scratch.bind(p.layout);
  Carved c{};
  c.local_scales = p.layout.take<std::int64_t>();
  c.gathered_scales = p.layout.take<std::int64_t>();
  c.scales = p.layout.take<std::int64_t>();
  c.record = p.layout.take<std::int64_t>();
  c.gathered = p.layout.take<std::int64_t>();
  c.sums = p.layout.take<double>();
  c.backend = Workspace{p.layout.take<unsigned char>(), p.backend_bytes};
  return c;
}

void check_comm(const char* op, const Communicator* comm, const SyncBnOptions& opts) {
  if (comm && opts.training && comm->size() < 1)
    fail(kBad, "{}: communicator {} has size {}; expected >= 1", op, comm->name(), comm->size());
}

/// Exact mode: this rank's exponents (x's, or grad_y's and grad_y * (x - mean)'s), gathered over
/// the ranks and merged into c.scales.
void agree_scales(const SyncBnBackend& be, Communicator* comm, const Plan& p, const Carved& c, const TensorView& x,
                  const TensorView& dy, const double* mean, const Context& ctx) {
  be.local_scales({x, dy, mean, true, nullptr, c.local_scales}, ctx);
  if (p.ranks > 1) gather_words(*comm, c.local_scales, p.scale_words, c.gathered_scales, x.device, ctx);
  be.merge_scales({p.ranks > 1 ? c.gathered_scales : c.local_scales, p.ranks, p.scale_words, c.scales, x.device}, ctx);
}

/// Validates the forward's arguments (writing the header's fields); returns whether running
/// statistics are tracked.
bool validate_forward(const char* op, const TensorView& x, const SyncBnParams& params, const TensorView& y,
                      const TensorView& save_mean, const TensorView& save_invstd, const Communicator* comm,
                      const SyncBnOptions& opts) {
  check_options(op, opts);
  check_input(op, "x", x);
  internal::check_like(op, "y", y, "x", x);
  internal::check_non_overlapping(op, "y", y);
  internal::check_no_partial_overlap(op, "y", y, "x", x, true);
  const bool running = check_params(op, params, x, opts, !opts.training);
  const NamedView xs{"x", &x}, ys{"y", &y}, w{"weight", &params.weight}, b{"bias", &params.bias},
      rm{"running_mean", &params.running_mean}, rv{"running_var", &params.running_var},
      nbt{"num_batches_tracked", &params.num_batches_tracked}, sm{"save_mean", &save_mean},
      si{"save_invstd", &save_invstd};
  check_saved(op, save_mean, save_invstd, x, true, {xs, ys, w, b, rm, rv});
  internal::check_disjoint(op, ys, {w, b, rm, rv});
  if (opts.training && running) {
    // Updated in place after x, weight and bias are first read and before they are read again
    // (apply): the running statistics must not share bytes with them, nor the counter with any
    // other tensor (check_params compared it with the running statistics).
    internal::check_disjoint(op, rm, {xs, w, b});
    internal::check_disjoint(op, rv, {xs, w, b});
    internal::check_disjoint(op, nbt, {xs, ys, w, b, sm, si});
  }
  if (opts.training && opts.mode == SyncBnMode::kExact) check_exact_count(op, x.sizes[0] * x.sizes[2] * x.sizes[3]);
  check_comm(op, comm, opts);
  return running;
}

void validate_backward(const char* op, const TensorView& grad_y, const TensorView& x, const TensorView& weight,
                       const TensorView& save_mean, const TensorView& save_invstd, const TensorView& grad_x,
                       const TensorView& grad_weight, const TensorView& grad_bias, const Communicator* comm,
                       const SyncBnOptions& opts) {
  check_options(op, opts);
  check_input(op, "x", x);
  const std::int64_t C = x.sizes[1];
  internal::check_like(op, "grad_y", grad_y, "x", x);
  if (weight.defined()) check_vec(op, "weight", weight, C, VecKind::kParam, "x", x);
  check_saved(op, save_mean, save_invstd, x, false, {});
  if (grad_x.defined()) internal::check_like(op, "grad_x", grad_x, "x", x);
  if (grad_weight.defined()) check_vec(op, "grad_weight", grad_weight, C, VecKind::kParam, "x", x);
  if (grad_bias.defined()) check_vec(op, "grad_bias", grad_bias, C, VecKind::kParam, "x", x);
  const NamedView xs{"x", &x}, gy{"grad_y", &grad_y}, w{"weight", &weight}, sm{"save_mean", &save_mean},
      si{"save_invstd", &save_invstd}, gx{"grad_x", &grad_x}, gw{"grad_weight", &grad_weight},
      gb{"grad_bias", &grad_bias};
  internal::check_outputs(op, {gx, gw, gb});
  internal::check_no_partial_overlap(op, "grad_x", grad_x, "grad_y", grad_y, true);  // may be in place
  internal::check_disjoint(op, gx, {xs, w, sm, si});
  internal::check_disjoint(op, gw, {xs, gy, w, sm, si});
  internal::check_disjoint(op, gb, {xs, gy, w, sm, si});
  if (grad_weight.defined() && !weight.defined())
    fail(kBad, "{}: grad_weight is given but weight is absent; expected weight (affine) for a weight gradient", op);
  if (opts.training && opts.mode == SyncBnMode::kExact) check_exact_count(op, x.sizes[0] * x.sizes[2] * x.sizes[3]);
  check_comm(op, comm, opts);
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
    internal::check_like(op, "grad_y", grad_y, "x", x);
    check_vec(op, "save_mean", save_mean, x.sizes[1], VecKind::kFloat64, "x", x);
  }
  check_vec(op, "scales", scales, sync_batch_norm_scale_words(x.sizes[1], backward), VecKind::kInt64, "x", x);
  internal::check_disjoint(op, {"scales", &scales}, {{"x", &x}, {"grad_y", &grad_y}, {"save_mean", &save_mean}});
  backend(x.device, op).local_scales({x, grad_y, backward ? f64(save_mean) : nullptr, true, nullptr, i64_out(scales)},
                                     ctx);
}

void sync_batch_norm_merge_scales(const TensorView& gathered, const TensorView& scales, const Context& ctx) {
  const char* op = "sync_batch_norm_merge_scales";
  internal::check_tensor(op, "scales", scales, 1);
  const std::int64_t ranks = check_gathered(op, gathered, scales.sizes[0], "scales", scales);
  check_vec(op, "scales", scales, gathered.sizes[1], VecKind::kInt64, "gathered", gathered);
  internal::check_disjoint(op, {"scales", &scales}, {{"gathered", &gathered}});
  backend(scales.device, op).merge_scales({i64(gathered), ranks, gathered.sizes[1], i64_out(scales), scales.device}, ctx);
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
  internal::check_disjoint(op, {"record", &record}, {{"x", &x}, {"scales", exact ? &scales : &absent_view()}});
  const SyncBnBackend& be = backend(x.device, op);
  with_pass_scratch(op, be, SbnPass::kLocalStats, x, exact, ctx, [&](Workspace ws) {
    be.local_stats({x, TensorView{}, nullptr, exact, exact ? i64(scales) : nullptr, i64_out(record)}, ctx, ws);
  });
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
  const NamedView sc{"scales", exact ? &scales : &absent_view()}, g{"gathered", &gathered},
      sm{"save_mean", &save_mean}, si{"save_invstd", &save_invstd}, w{"weight", &params.weight},
      b{"bias", &params.bias};
  // weight and bias are not read here, but an output inside them would corrupt the apply phase's
  // parameters: refused like any output that shares memory with an argument of the call.
  internal::check_disjoint(op, sm, {sc, w, b});
  internal::check_disjoint(op, si, {sc, w, b});
  if (running && opts.training) {  // updated in place
    internal::check_disjoint(op, {"running_mean", &params.running_mean}, {g, sc, sm, si, w, b});
    internal::check_disjoint(op, {"running_var", &params.running_var}, {g, sc, sm, si, w, b});
    internal::check_disjoint(op, {"num_batches_tracked", &params.num_batches_tracked}, {g, sc, sm, si, w, b});
  }
  backend(save_mean.device, op)
      .finalize(finalize_args(i64(gathered), ranks, C, opts, exact ? i64(scales) : nullptr, params,
                              running && opts.training, f64_out(save_mean), f64_out(save_invstd)),
                save_mean.device, ctx);
}

void sync_batch_norm_apply(const TensorView& x, const SyncBnParams& params, const TensorView& save_mean,
                           const TensorView& save_invstd, const TensorView& y, const Context& ctx) {
  const char* op = "sync_batch_norm_apply";
  check_input(op, "x", x);
  internal::check_like(op, "y", y, "x", x);
  internal::check_non_overlapping(op, "y", y);
  internal::check_no_partial_overlap(op, "y", y, "x", x, true);
  SyncBnOptions o;
  check_params(op, params, x, o, false);
  check_saved(op, save_mean, save_invstd, x, false, {});
  internal::check_disjoint(op, {"y", &y},
                           {{"weight", &params.weight}, {"bias", &params.bias}, {"running_mean", &params.running_mean},
                            {"running_var", &params.running_var}, {"save_mean", &save_mean},
                            {"save_invstd", &save_invstd}});
  backend(x.device, op).apply({x, param_of(params.weight), param_of(params.bias), f64(save_mean), f64(save_invstd), y},
                              ctx);
}

void sync_batch_norm_local_backward(const TensorView& grad_y, const TensorView& x, const TensorView& save_mean,
                                    const TensorView& record, SyncBnMode mode, const TensorView& scales,
                                    const Context& ctx) {
  const char* op = "sync_batch_norm_local_backward";
  check_mode(op, mode);
  check_input(op, "x", x);
  internal::check_like(op, "grad_y", grad_y, "x", x);
  check_vec(op, "save_mean", save_mean, x.sizes[1], VecKind::kFloat64, "x", x);
  const bool exact = mode == SyncBnMode::kExact;
  check_vec(op, "record", record, detail::sbn_record_words(x.sizes[1], exact), VecKind::kInt64, "x", x);
  if (exact) {
    check_vec(op, "scales", scales, 2 * x.sizes[1], VecKind::kInt64, "x", x);
    check_exact_count(op, x.sizes[0] * x.sizes[2] * x.sizes[3]);
  }
  internal::check_disjoint(
      op, {"record", &record},
      {{"grad_y", &grad_y}, {"x", &x}, {"save_mean", &save_mean}, {"scales", exact ? &scales : &absent_view()}});
  const SyncBnBackend& be = backend(x.device, op);
  with_pass_scratch(op, be, SbnPass::kLocalBackward, x, exact, ctx, [&](Workspace ws) {
    be.local_backward({x, grad_y, f64(save_mean), exact, exact ? i64(scales) : nullptr, i64_out(record)}, ctx, ws);
  });
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
  const NamedView g{"gathered", &gathered}, si{"save_invstd", &save_invstd}, sc{"scales", exact ? &scales : &absent_view()},
      su{"sums", &sums}, gw{"grad_weight", &grad_weight}, gb{"grad_bias", &grad_bias};
  internal::check_disjoint(op, su, {g, si, sc});
  internal::check_outputs(op, {gw, gb});
  internal::check_disjoint(op, gw, {g, si, sc, su});
  internal::check_disjoint(op, gb, {g, si, sc, su});
  backend(gathered.device, op)
      .finalize_backward(finalize_backward_args(i64(gathered), ranks, gathered.sizes[1], C, rank,
                                                exact, exact ? i64(scales) : nullptr, f64(save_invstd), f64_out(sums),
                                                grad_weight, grad_bias),
                         gathered.device, ctx);
}

void sync_batch_norm_backward_apply(const TensorView& grad_y, const TensorView& x, const TensorView& weight,
                                    const TensorView& save_mean, const TensorView& save_invstd, const TensorView& sums,
                                    const TensorView& grad_x, const Context& ctx) {
  const char* op = "sync_batch_norm_backward_apply";
  check_input(op, "x", x);
  internal::check_like(op, "grad_y", grad_y, "x", x);
  internal::check_like(op, "grad_x", grad_x, "x", x);
  internal::check_non_overlapping(op, "grad_x", grad_x);
  internal::check_no_partial_overlap(op, "grad_x", grad_x, "grad_y", grad_y, true);
  internal::check_no_partial_overlap(op, "grad_x", grad_x, "x", x, false);
  if (weight.defined()) check_vec(op, "weight", weight, x.sizes[1], VecKind::kParam, "x", x);
  check_saved(op, save_mean, save_invstd, x, false, {});
  check_vec(op, "sums", sums, 2 * x.sizes[1] + 1, VecKind::kFloat64, "x", x);
  internal::check_disjoint(op, {"grad_x", &grad_x},
                           {{"weight", &weight}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd},
                            {"sums", &sums}});
  const SyncBnBackend& be = backend(x.device, op);
  with_pass_scratch(op, be, SbnPass::kBackwardApply, x, false, ctx, [&](Workspace ws) {
    be.backward_apply({grad_y, x, param_of(weight), f64(save_mean), f64(save_invstd), f64(sums), grad_x}, ctx, ws);
  });
}

// ---------------------------------------------------------------------------------------------
// One call per direction

std::size_t sync_batch_norm_forward_workspace_size(const TensorView& x, const Communicator* comm,
                                                   const SyncBnOptions& opts) {
  const char* op = "sync_batch_norm_forward_workspace_size";
  check_options(op, opts);
  check_input(op, "x", x);
  check_comm(op, comm, opts);
  return internal::workspace_size_with_slack(forward_plan(x, comm, opts, op).layout.bytes());
}

std::size_t sync_batch_norm_backward_workspace_size(const TensorView& x, const TensorView& grad_x,
                                                    const Communicator* comm, const SyncBnOptions& opts) {
  const char* op = "sync_batch_norm_backward_workspace_size";
  check_options(op, opts);
  check_input(op, "x", x);
  if (grad_x.defined()) internal::check_like(op, "grad_x", grad_x, "x", x);
  check_comm(op, comm, opts);
  return internal::workspace_size_with_slack(backward_plan(x, grad_x, comm, opts, op).layout.bytes());
}

void sync_batch_norm_forward(const TensorView& x, const SyncBnParams& params, const TensorView& y,
                             const TensorView& save_mean, const TensorView& save_invstd, Communicator* comm,
                             const SyncBnOptions& opts, const Context& ctx, Workspace workspace) {
  const char* op = "sync_batch_norm_forward";
  std::exception_ptr local_error;
  bool running = false;
  Plan plan;
  std::optional<internal::Scratch> scratch;  // in the checks: a bad workspace fails every rank
  try {
    running = validate_forward(op, x, params, y, save_mean, save_invstd, comm, opts);
    plan = forward_plan(x, comm, opts, op);
    scratch.emplace(op, plan.layout.bytes(), x.device, ctx, workspace,
                    std::initializer_list<NamedView>{
                        {"x", &x}, {"y", &y}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd},
                        {"weight", &params.weight}, {"bias", &params.bias}, {"running_mean", &params.running_mean},
                        {"running_var", &params.running_var}, {"num_batches_tracked", &params.num_batches_tracked}},
                    "sync_batch_norm_forward_workspace_size");
  } catch (const Error&) {
    local_error = std::current_exception();
  }
  agree(op, comm, opts, x, SyncBnCall{false, {params.weight.defined(), params.running_mean.defined(), false}},
        local_error);

  const SyncBnBackend& be = backend(x.device, op);
  const std::int64_t C = x.sizes[1];
  double* mean = f64_out(save_mean);
  double* invstd = f64_out(save_invstd);
  const internal::SbnApplyCall apply{x, param_of(params.weight), param_of(params.bias), mean, invstd, y};
  if (!opts.training) {
    be.eval_stats({param_of(params.running_mean), param_of(params.running_var), opts.eps, C, mean, invstd, x.device},
                  ctx);
    be.apply(apply, ctx);
    return;
  }
  const Carved c = carve(plan, *scratch);
  if (plan.exact) agree_scales(be, comm, plan, c, x, TensorView{}, nullptr, ctx);
  be.local_stats({x, TensorView{}, nullptr, plan.exact, plan.exact ? c.scales : nullptr, c.record}, ctx, c.backend);
  if (plan.ranks > 1) gather_words(*comm, c.record, plan.words, c.gathered, x.device, ctx);
  be.finalize(finalize_args(plan.ranks > 1 ? c.gathered : c.record, plan.ranks, C, opts,
                            plan.exact ? c.scales : nullptr, params, running, mean, invstd),
              x.device, ctx);
  be.apply(apply, ctx);
}

void sync_batch_norm_backward(const TensorView& grad_y, const TensorView& x, const TensorView& weight,
                              const TensorView& save_mean, const TensorView& save_invstd, const TensorView& grad_x,
                              const TensorView& grad_weight, const TensorView& grad_bias, Communicator* comm,
                              const SyncBnOptions& opts, const Context& ctx, Workspace workspace) {
  const char* op = "sync_batch_norm_backward";
  std::exception_ptr local_error;
  Plan plan;
  std::optional<internal::Scratch> scratch;  // in the checks: a bad workspace fails every rank
  try {
    validate_backward(op, grad_y, x, weight, save_mean, save_invstd, grad_x, grad_weight, grad_bias, comm, opts);
    plan = backward_plan(x, grad_x, comm, opts, op);
    scratch.emplace(op, plan.layout.bytes(), x.device, ctx, workspace,
                    std::initializer_list<NamedView>{
                        {"grad_y", &grad_y}, {"x", &x}, {"weight", &weight}, {"save_mean", &save_mean},
                        {"save_invstd", &save_invstd}, {"grad_x", &grad_x}, {"grad_weight", &grad_weight},
                        {"grad_bias", &grad_bias}},
                    "sync_batch_norm_backward_workspace_size");
  } catch (const Error&) {
    local_error = std::current_exception();
  }
  agree(op, comm, opts, x, SyncBnCall{true, {grad_x.defined(), grad_weight.defined(), grad_bias.defined()}},
        local_error);

  const SyncBnBackend& be = backend(x.device, op);
  const std::int64_t C = x.sizes[1];
  const double* mean = f64(save_mean);
  const double* invstd = f64(save_invstd);
  const Carved c = carve(plan, *scratch);
  if (plan.exact) agree_scales(be, comm, plan, c, x, grad_y, mean, ctx);
  be.local_backward({x, grad_y, mean, plan.exact, plan.exact ? c.scales : nullptr, c.record}, ctx, c.backend);
  const bool gathered = plan.ranks > 1;
  if (gathered) gather_words(*comm, c.record, plan.words, c.gathered, x.device, ctx);
  be.finalize_backward(finalize_backward_args(gathered ? c.gathered : c.record, plan.ranks, plan.words, C,
                                              gathered ? comm->rank() : 0, plan.exact, plan.exact ? c.scales : nullptr, invstd,
                                              c.sums, grad_weight, grad_bias),
                       x.device, ctx);
  if (grad_x.defined())
    be.backward_apply({grad_y, x, param_of(weight), mean, invstd, opts.training ? c.sums : nullptr, grad_x}, ctx,
                      c.backend);
}

// ---------------------------------------------------------------------------------------------
// Rank agreement for phase drivers

void sync_batch_norm_header(const TensorView& x, const SyncBnCall& call, const SyncBnOptions& opts,
                            std::int64_t sequence, bool failed, std::int64_t* header) {
  if (header == nullptr) fail(kBad, "sync_batch_norm_header: header is null; expected {} int64 words", kSyncBnHeaderWords);
  const Header h = make_header(x, call, opts, sequence, failed);
  std::memcpy(header, &h, sizeof h);
}

void sync_batch_norm_check_headers(const char* op, const std::int64_t* gathered, int ranks) {
  const char* name = op != nullptr ? op : "sync_batch_norm_check_headers";
  if (gathered == nullptr || ranks < 1)
    fail(kBad, "{}: gathered headers at {} for {} ranks; expected [ranks >= 1, {}] int64 words", name,
         static_cast<const void*>(gathered), ranks, kSyncBnHeaderWords);
  std::vector<Header> all(static_cast<std::size_t>(ranks));
  std::memcpy(all.data(), gathered, all.size() * sizeof(Header));
  check_headers(name, all.data(), ranks);
}

}  // namespace detops
