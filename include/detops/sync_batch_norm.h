// SyncBatchNorm on CPU and CUDA: BatchNorm2d whose training statistics are those of the global
// batch, over every rank of a Communicator, with statistics that are the same bits on every rank
// and on every run.
//
// Two levels of API:
//   * one call per direction, sync_batch_norm_forward / sync_batch_norm_backward, which drive the
//     phases below over a Communicator (nullptr = one rank, i.e. torch.nn.BatchNorm2d);
//   * the phases themselves, for a framework that runs its own collectives (the mmcv design):
//       forward:  [exact: local_scales -> all-gather -> merge_scales] -> local_stats -> all-gather
//                 -> finalize_stats -> apply
//       backward: [exact: local_scales -> all-gather -> merge_scales] -> local_backward
//                 -> all-gather -> finalize_backward -> backward_apply
//     Every collective is an all-gather of int64 words, merged by every rank in rank order.
//
// Semantics follow torch.nn.SyncBatchNorm / BatchNorm2d in training mode:
//   y = (x - mean) / sqrt(var + eps) * weight + bias, mean and biased var over (N, H, W) of all
//   ranks; running_mean/var <- (1 - m) * running + m * (mean, unbiased var with the global count),
//   m = momentum, or 1 / num_batches_tracked (cumulative average) when momentum is unset;
//   grad_x uses the global sums; grad_weight and grad_bias are this rank's contributions
//   (invstd * sum_local dy * (x - mean), sum_local dy), NOT reduced over ranks: a data-parallel
//   engine reduces them with the other parameters (their sum over ranks is the gradient of the
//   sum of the ranks' losses; DDP's average is that of the mean loss).
// Edge cases: ranks with no elements take part with count 0 (no NaN); a global count of 0 gives
// save_mean = save_invstd = 0; a global count of 1 gives var = 0. Running statistics and
// num_batches_tracked change only when the global count is at least 2.
//
// Modes (SyncBnMode):
//   kDefault  per-rank (count, mean, M2) in float64 from exact two-pass chunk moments merged with
//             Chan's formula in a fixed tree; ranks merged in rank order. Bitwise identical on all
//             ranks, across runs, thread counts, CPU vs CUDA, NCHW vs NHWC; for other rank counts
//             or splits of the batch, equal within float64 rounding.
//   kExact    fixed-point sums on a per-channel grid the ranks agree on (one extra all-gather of
//             C words per direction): the same bits for ANY number of ranks and ANY split of the
//             batch, so a multi-rank run can be replayed on one process bit for bit. The values
//             are rounded to the grid 2^(E - 44), 2^E the power of two above the channel's
//             largest |x|, before summing (|error| of each value, and of the mean,
//             <= 2^-44 max|x|). Fewer than 2^39 elements per channel in all: each rank
//             checks its own count, the rank-agreement header the total (every rank raises
//             kInvalidArgument); without the header (check_ranks off, hand-driven phases) a total
//             past the limit gives NaN statistics and updates nothing.
//             Accuracy: the grid follows max|x|, not the spread, so statistics and gradients
//             carry a relative error of about 2^-44 max|x| / sigma (sigma = sqrt(var + eps);
//             the mean's is at most that, in units of sigma; measured 0.03-0.25 of it for
//             every output), about 500x kDefault's 2^-53 max|x| / sigma. float32 inputs lose
//             nothing at any mean/spread ratio (stored values within 2^21 of max|x| lie on the
//             grid): the same errors as kDefault. float64 inputs: below 1e-9 while
//             max|x| / sigma < ~5e5, below float32 rounding (6e-8) while < ~2e7; 3e-7 at
//             mean/spread 1e8, 3e-6 at 1e9. Past that, use kDefault or center the data
//             (tests/sync_batch_norm_accuracy_test.cpp; benchmarks/results/sync-bn-exact-accuracy-*).
// Every dtype (float32, float64, float16, bfloat16) computes in float64 and rounds once to the
// stored type. Shapes: x, y, grad_* are [N, C, H, W], NCHW, NHWC or any strides.
// Errors are detops::Error, raised before anything is written, on every rank when
// opts.check_ranks (see sync_batch_norm_forward).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "detops/communicator.h"
#include "detops/context.h"
#include "detops/tensor.h"

namespace detops {

enum class SyncBnMode : std::uint8_t { kDefault, kExact };

struct SyncBnOptions {
  double eps = 1e-5;
  /// Running-statistics momentum in [0, 1]; unset = cumulative moving average (torch's None).
  std::optional<double> momentum = 0.1;
  SyncBnMode mode = SyncBnMode::kDefault;
  /// Training (global batch statistics) or evaluation (running statistics, no communication).
  bool training = true;
  /// In training, before the statistics, exchange a 48-byte header (channels, dtype, mode,
  /// flags, call sequence number, whether this rank's arguments are valid, this rank's element
  /// count per channel: the exact forward checks the total) and raise on every
  /// rank when the ranks disagree or one of them failed its checks, instead of hanging or mixing
  /// layers. Costs one small all-gather of host memory; over NCCL the host then waits for the
  /// communicator's earlier collectives (a CPU/GPU pipeline stall per layer). Turn off for speed
  /// once a training step has run with it on.
  bool check_ranks = true;
};

/// The module's parameters and buffers, each [C] on x's device. weight and bias (affine): both
/// or neither, float32 or float64. running_mean and running_var (track_running_stats): both or
/// neither, float32 or float64, updated in place in training mode. num_batches_tracked: [1]
/// int64, optional, incremented with the running statistics; required when momentum is unset.
struct SyncBnParams {
  TensorView weight, bias;
  TensorView running_mean, running_var;
  TensorView num_batches_tracked;
};

/// Forward. Training: global statistics over `comm` (nullptr: this process alone), written to
/// save_mean and save_invstd ([C] float64 on x's device, needed by the backward), running
/// statistics updated, y written. Evaluation (opts.training = false): running statistics are
/// used (and required), save_mean/save_invstd receive them, nothing is communicated (a rank may
/// evaluate alone).
/// y may be x (in place). Every rank of comm must call it, in the same order as its other
/// detops collective calls; with opts.check_ranks a disagreement raises on every rank.
/// CUDA: work is ordered on ctx.cuda_stream; engines that do not take device memory (threads,
/// MPI) are staged through the host, which waits on the stream.
/// `workspace`: caller-provided scratch of at least sync_batch_norm_forward_workspace_size() bytes
/// (any alignment), sharing no byte with the call's tensors, on x's device; absent (the default):
/// the scratch comes from ctx.allocator. A workspace too small or overlapping a tensor raises
/// kInvalidArgument (on every rank, as the other argument checks).
void sync_batch_norm_forward(const TensorView& x, const SyncBnParams& params, const TensorView& y,
                             const TensorView& save_mean, const TensorView& save_invstd, Communicator* comm = nullptr,
                             const SyncBnOptions& opts = {}, const Context& ctx = {}, Workspace workspace = {});

/// Bytes of workspace sync_batch_norm_forward needs for x (its sizes, dtype and device), the
/// communicator (nullptr: one rank; its size counts in training) and opts (training and mode):
/// records of every rank and, on CUDA, the per-chunk partials; 0 in evaluation mode. The lifecycle
/// of every op with scratch: validate -> workspace size -> run.
std::size_t sync_batch_norm_forward_workspace_size(const TensorView& x, const Communicator* comm = nullptr,
                                                   const SyncBnOptions& opts = {});

/// Backward from the forward's save_mean and save_invstd. grad_x (optional: absent skips it and
/// the collective) uses the global sums over comm; grad_weight and grad_bias (optional, [C],
/// float32 or float64; grad_weight needs weight) are this rank's local contributions. In
/// evaluation mode (opts.training = false) the statistics are constants: grad_x = grad_y * weight
/// * invstd, with no communication. grad_x may be grad_y (in place). `workspace`: as the
/// forward's, of at least sync_batch_norm_backward_workspace_size() bytes.
void sync_batch_norm_backward(const TensorView& grad_y, const TensorView& x, const TensorView& weight,
                              const TensorView& save_mean, const TensorView& save_invstd, const TensorView& grad_x,
                              const TensorView& grad_weight, const TensorView& grad_bias, Communicator* comm = nullptr,
                              const SyncBnOptions& opts = {}, const Context& ctx = {}, Workspace workspace = {});

/// Bytes of workspace sync_batch_norm_backward needs for x, grad_x (absent: not computed, which
/// needs no collective), the communicator and opts. Never 0: the sums live in it.
std::size_t sync_batch_norm_backward_workspace_size(const TensorView& x, const TensorView& grad_x = {},
                                                    const Communicator* comm = nullptr,
                                                    const SyncBnOptions& opts = {});

// ---------------------------------------------------------------------------------------------
// The phases. Records are int64 tensors on x's device; gathered records are [ranks, words],
// rank r's record in row r.

/// Words of one rank's statistics record (forward and backward alike): 1 + 2C, or 1 + 4C in
/// exact mode.
std::int64_t sync_batch_norm_record_words(std::int64_t channels, SyncBnMode mode);
/// Words of the exact mode's scale record: C for the forward, 2C for the backward.
std::int64_t sync_batch_norm_scale_words(std::int64_t channels, bool backward);

/// Exact mode, first phase: this rank's per-channel exponents (the forward's of x when grad_y is
/// absent; the backward's of grad_y and grad_y * (x - save_mean) otherwise) into `scales`.
void sync_batch_norm_local_scales(const TensorView& x, const TensorView& grad_y, const TensorView& save_mean,
                                  const TensorView& scales, const Context& ctx = {});
/// Exact mode: the agreed exponents (the maximum over the gathered [ranks, words] rows).
void sync_batch_norm_merge_scales(const TensorView& gathered, const TensorView& scales, const Context& ctx = {});

/// This rank's statistics record of x ([words] int64). Exact mode needs the merged scales.
void sync_batch_norm_local_stats(const TensorView& x, const TensorView& record, SyncBnMode mode,
                                 const TensorView& scales = {}, const Context& ctx = {});
/// Merges the gathered records in rank order into save_mean and save_invstd and updates the
/// running statistics (params.running_*, params.num_batches_tracked) as the one-call forward does.
/// Records are data, not arguments (on CUDA they are never read by the host): corrupt ones (a
/// negative count, counts whose sum overflows, exponents out of range) give NaN statistics and
/// leave the running statistics alone; they never crash.
void sync_batch_norm_finalize_stats(const TensorView& gathered, const SyncBnParams& params, const TensorView& save_mean,
                                    const TensorView& save_invstd, const SyncBnOptions& opts = {},
                                    const TensorView& scales = {}, const Context& ctx = {});
/// y = (x - save_mean) * save_invstd * weight + bias (params.weight/bias, optional).
void sync_batch_norm_apply(const TensorView& x, const SyncBnParams& params, const TensorView& save_mean,
                           const TensorView& save_invstd, const TensorView& y, const Context& ctx = {});

/// This rank's backward record (sums of grad_y and grad_y * (x - save_mean)).
void sync_batch_norm_local_backward(const TensorView& grad_y, const TensorView& x, const TensorView& save_mean,
                                    const TensorView& record, SyncBnMode mode, const TensorView& scales = {},
                                    const Context& ctx = {});
/// Merges the gathered backward records: `sums` ([2C + 1] float64) receives the global sum of
/// grad_y, of grad_y * (x - mean), and the global count; grad_weight and grad_bias (optional)
/// receive row `rank`'s local contributions.
void sync_batch_norm_finalize_backward(const TensorView& gathered, int rank, SyncBnMode mode,
                                       const TensorView& save_invstd, const TensorView& sums,
                                       const TensorView& grad_weight, const TensorView& grad_bias,
                                       const TensorView& scales = {}, const Context& ctx = {});
/// grad_x = (grad_y - sum_dy / n - (x - mean) * invstd^2 * sum_dyxmu / n) * weight * invstd.
void sync_batch_norm_backward_apply(const TensorView& grad_y, const TensorView& x, const TensorView& weight,
                                    const TensorView& save_mean, const TensorView& save_invstd,
                                    const TensorView& sums, const TensorView& grad_x, const Context& ctx = {});

// ---------------------------------------------------------------------------------------------
// Rank agreement for phase drivers. The header sync_batch_norm_forward/backward exchange when
// opts.check_ranks (one copy of the protocol), for a framework that runs the collectives itself:
// every rank writes its header (also a rank whose own checks failed: `failed`), all-gathers the
// kSyncBnHeaderWords words of every rank, raises its own error if it has one, and otherwise
// checks the rows, so every rank raises instead of hanging or mixing layers.

/// int64 words of one rank's header: a magic word with the version, channels, flags (direction,
/// dtype, mode, training, the parts given, device type), the call's sequence number, whether the
/// rank failed its checks, its element count per channel, eps and momentum.
constexpr std::int64_t kSyncBnHeaderWords = 8;

/// What a call is, as the ranks compare it.
struct SyncBnCall {
  bool backward = false;
  /// forward: {weight/bias given, running statistics given, unused}; backward: {grad_x,
  /// grad_weight, grad_bias given}.
  bool parts[3] = {false, false, false};
};

/// This rank's header for a call on x (channels and count from x when it is [N, C, H, W]; any
/// view otherwise, a failed rank's included) into header[0 .. kSyncBnHeaderWords), host memory.
/// `sequence`: the caller's count of its collective SyncBatchNorm calls (the one-call API uses
/// its Communicator's; 0 when the caller does not count).
void sync_batch_norm_header(const TensorView& x, const SyncBnCall& call, const SyncBnOptions& opts,
                            std::int64_t sequence, bool failed, std::int64_t* header);

/// Checks the gathered headers (host memory, [ranks][kSyncBnHeaderWords], rank r's in row r):
/// throws kCommunication, the same on every rank, when a row is no header of this version, a rank
/// failed its checks (its own error is its to raise), or the ranks disagree (call sequence,
/// direction, dtype, device type, mode, training, the parts given, channels, eps, momentum);
/// kInvalidArgument when the exact forward's ranks hold 2^39 or more elements per channel
/// together. `op` starts the message.
void sync_batch_norm_check_headers(const char* op, const std::int64_t* gathered, int ranks);

}  // namespace detops
