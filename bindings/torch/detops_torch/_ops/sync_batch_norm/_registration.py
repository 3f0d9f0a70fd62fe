# SyncBatchNorm's phase ops: fake kernels and (stable layer) error-translating autograd pass-throughs; detops_torch.distributed owns the gradient.
import torch

from ... import _registry as r
from ..._errors import DetopsError

MODES = ("default", "exact")
NAMES = ("sync_batch_norm_local_scales", "sync_batch_norm_merge_scales", "sync_batch_norm_local_stats",
         "sync_batch_norm_finalize_stats", "sync_batch_norm_apply", "sync_batch_norm_local_backward",
         "sync_batch_norm_finalize_backward", "sync_batch_norm_backward_apply", "sync_batch_norm_header",
         "sync_batch_norm_check_headers")
HEADER_WORDS = 8  # kSyncBnHeaderWords (include/detops/sync_batch_norm.h)


# Record sizes as include/detops/sync_batch_norm.h documents them: 1 + 2C words per rank, 1 + 4C
# in exact mode; the exact mode's scale record C words (forward) or 2C (backward).
def per_channel(mode):
    return 4 if mode == "exact" else 2


def channels_of(op, arg, x):
    r.require_dim(op, arg, x, 4, "[N, C, H, W]")
    return x.shape[1]


def channels_of_gathered(op, gathered, mode):
    r.require_dim(op, "gathered", gathered, 2, "[world, words]")
    k, words = per_channel(mode), gathered.shape[1]
    if words < 1 or (words - 1) % k != 0:
        raise DetopsError(f"{op}: gathered has {words} words per rank; expected 1 + {k} * channels "
                         f"(mode '{mode}')")
    return (words - 1) // k


def int64_vector(like, n):
    return like.new_empty((n,), dtype=torch.int64)


def float64_vector(like, n):
    return like.new_empty((n,), dtype=torch.float64)


@r.fake("sync_batch_norm_local_scales")
def _(x, grad_y=None, save_mean=None):
    op = "detops::sync_batch_norm_local_scales"
    r.require_meta_or_fake(op, x=x, grad_y=grad_y, save_mean=save_mean)
    c = channels_of(op, "x", x)
    return int64_vector(x, 2 * c if grad_y is not None else c)


@r.fake("sync_batch_norm_merge_scales")
def _(gathered):
    r.require_dim("detops::sync_batch_norm_merge_scales", "gathered", gathered, 2, "[world, words]")
    return int64_vector(gathered, gathered.shape[1])


@r.fake("sync_batch_norm_local_stats")
def _(x, mode, scales=None):
    op = "detops::sync_batch_norm_local_stats"
    r.require_meta_or_fake(op, x=x, scales=scales)
    r.check_choice(op, "mode", mode, MODES)
    return int64_vector(x, 1 + per_channel(mode) * channels_of(op, "x", x))


@r.fake("sync_batch_norm_finalize_stats")
def _(gathered, weight, running_mean, running_var, num_batches_tracked, eps, momentum, sync_mode, scales=None):
    op = "detops::sync_batch_norm_finalize_stats"
    r.require_meta_or_fake(op, gathered=gathered, weight=weight, running_mean=running_mean, running_var=running_var,
                           num_batches_tracked=num_batches_tracked, scales=scales)
    r.check_choice(op, "mode", sync_mode, MODES)
    c = channels_of_gathered(op, gathered, sync_mode)
    return float64_vector(gathered, c), float64_vector(gathered, c)


@r.fake("sync_batch_norm_apply")
def _(x, weight, bias, save_mean, save_invstd):
    op = "detops::sync_batch_norm_apply"
    r.require_meta_or_fake(op, x=x, weight=weight, bias=bias, save_mean=save_mean, save_invstd=save_invstd)
    channels_of(op, "x", x)
    return r.empty_like_format(x)


@r.fake("sync_batch_norm_local_backward")
def _(grad_y, x, save_mean, mode, scales=None):
    op = "detops::sync_batch_norm_local_backward"
    r.require_meta_or_fake(op, grad_y=grad_y, x=x, save_mean=save_mean, scales=scales)
    r.check_choice(op, "mode", mode, MODES)
    return int64_vector(x, 1 + per_channel(mode) * channels_of(op, "x", x))


@r.fake("sync_batch_norm_finalize_backward")
def _(gathered, rank, mode, save_invstd, scales, weight_grad):
    op = "detops::sync_batch_norm_finalize_backward"
    r.require_meta_or_fake(op, gathered=gathered, save_invstd=save_invstd, scales=scales)
    r.check_choice(op, "mode", mode, MODES)
    r.require_dim(op, "save_invstd", save_invstd, 1, "[C]")
    c = save_invstd.shape[0]
    vector = (lambda: float64_vector(gathered, c)) if weight_grad else (lambda: None)
    return float64_vector(gathered, 2 * c + 1), vector(), vector()


@r.fake("sync_batch_norm_backward_apply")
def _(grad_y, x, weight, save_mean, save_invstd, sums):
    op = "detops::sync_batch_norm_backward_apply"
    r.require_meta_or_fake(op, grad_y=grad_y, x=x, weight=weight, save_mean=save_mean, save_invstd=save_invstd,
                           sums=sums)
    channels_of(op, "x", x)
    return r.empty_like_format(x)


@r.fake("sync_batch_norm_header")
def _(x, backward, part0, part1, part2, mode, training, eps, momentum, failed):
    r.check_choice("detops::sync_batch_norm_header", "mode", mode, MODES)
    return torch.empty((HEADER_WORDS,), dtype=torch.int64)


@r.fake("sync_batch_norm_check_headers")
def _(gathered, what):
    r.require_dim("detops::sync_batch_norm_check_headers", "gathered", gathered, 2, f"[ranks, {HEADER_WORDS}]")
    return gathered.shape[0]


# No gradient of their own (the Python autograd.Function in distributed.py composes them).
for _name in NAMES:
    r.autograd(_name)
