# SyncBatchNorm over torch.distributed: detops' int64 statistics records all-gathered with any process group.
"""Deterministic SyncBatchNorm for PyTorch.

``SyncBatchNorm`` is a subclass of ``torch.nn.SyncBatchNorm`` (same constructor plus ``mode``, same
state dict, so ``isinstance`` checks, checkpoints and DDP keep working) whose training forward and
backward drive detops' SyncBatchNorm phases (``torch.ops.detops.sync_batch_norm_*``):

  forward:  [exact: local_scales -> all_gather -> merge_scales] -> local_stats -> all_gather
            -> finalize_stats -> apply
  backward: [exact: local_scales -> all_gather -> merge_scales] -> local_backward -> all_gather
            -> finalize_backward -> backward_apply

Only int64 records travel (``torch.distributed.all_gather``, list form: gloo on torch 1.13 has no
``all_gather_into_tensor``) and every rank merges them in rank order, so no result depends on the
backend's reduction algorithm: every rank holds the same statistics bit for bit, on every run.
``mode="exact"`` also gives the same bits for any number of ranks and any split of the batch (a
multi-rank run replays on one process bit for bit); ``mode="default"`` agrees with other splits
within float64 rounding. Any process group works: gloo on the CPU (which torch's own
SyncBatchNorm refuses) and NCCL on CUDA.

Before its records, every training call all-gathers detops' rank-agreement header (8 int64
words: direction, channels, dtype, device type, mode, the optional parts, eps, momentum, element
count, local failure; ``torch.ops.detops.sync_batch_norm_header``, the words detops' C++ API
exchanges itself) and checks every rank's (``sync_batch_norm_check_headers``): ranks that
disagree, or a rank whose own checks failed, make EVERY rank raise ``ValueError`` instead of
hanging or mixing layers. Set ``module.check_ranks = False`` to skip that exchange
(one small collective per layer and direction) once a step has run with it.

Gradients follow ``torch.nn.SyncBatchNorm``: grad_input uses the global sums; grad_weight and
grad_bias are this rank's local contributions, not reduced (DDP averages them with the other
parameters).
"""
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..._errors import DetopsError, run

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]

_MODES = ("default", "exact")
# The phases are looked up at call time so that importing this module needs no loaded op library.
_OPS_NAMESPACE = "detops"

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _ops():
    return getattr(torch.ops, _OPS_NAMESPACE)


def _check_mode(mode, what="mode"):
    if mode not in _MODES:
        raise DetopsError(f"SyncBatchNorm: {what} is {mode!r}; expected 'default' or 'exact'")


class _Comm:
    """The process group a training call synchronizes over (None: this process alone)."""

    def __init__(self, group, device):
        self.group = group
        if group is None:
            self.world, self.rank, self.device = 1, 0, device
            return
        import torch.distributed as dist
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # NCCL moves device memory only; gloo gathers host memory (it needs no CUDA build and
        # the records are a few words per channel).
        backend = str(dist.get_backend(group)).lower()
        if "nccl" in backend:
            self.device = device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def gather(self, t):
        """[words] int64 on any device -> [world, words] int64, rank r's row r, on t's device.

        The result is always a fresh contiguous tensor (never a view of t): detops' overlap
        checks reject a gathered tensor that shares memory with an output."""
        if self.group is None or self.world == 1:
            return t.reshape(1, -1).clone()
        import torch.distributed as dist
        local = t.to(self.device).contiguous()
        rows = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(rows, local, group=self.group)
        return torch.stack(rows).to(t.device)


def _agree(comm, x, backward, parts, mode, eps, momentum, local_error, what):
    """All-gathers this rank's rank-agreement header (detops' own protocol: the words of
    ``sync_batch_norm_header``) and checks every rank's: raises on every rank when any rank failed
    or they disagree.

    local_error (an exception or None) is raised on its own rank after the exchange, so the
    other ranks are not left waiting in a collective this rank never joins."""
    ops = _ops()
    momentum = None if momentum is None else float(momentum)

    def header(failed):
        return ops.sync_batch_norm_header(x, backward, parts[0], parts[1], parts[2],
                                          mode if mode in _MODES else "default", True, float(eps), momentum, failed)

    try:
        mine = header(local_error is not None)
    except Exception as e:  # noqa: BLE001 -- this rank still takes part, as a failed one
        local_error = local_error or e
        mine = header(True)
    rows = comm.gather(mine)
    if local_error is not None:
        raise local_error
    run(ops.sync_batch_norm_check_headers, rows.cpu().contiguous(), what)  # DetopsError on every rank


def _check_vector(what, name, v, channels, device):
    if v is None:
        return
    if v.dim() != 1 or v.shape[0] != channels:
        raise DetopsError(f"{what}: {name} has sizes {list(v.shape)}; expected [{channels}] (the input's channels)")
    if v.dtype not in (torch.float32, torch.float64):
        raise DetopsError(f"{what}: {name} has dtype {v.dtype}; expected torch.float32 or torch.float64")
    if v.device != device:
        raise DetopsError(f"{what}: {name} is on {v.device}; expected the input's device ({device})")


def _check_input(what, x, mode):
    if x.dim() != 4:
        raise DetopsError(f"{what}: input has {x.dim()} dimensions; expected 4 ([N, C, H, W])")
    if x.dtype not in _DTYPES:
        raise DetopsError(f"{what}: input has dtype {x.dtype}; expected float32, float64, float16 or bfloat16")
    _check_mode(mode)


class _SyncBatchNormFunction(torch.autograd.Function):
    """Training-mode batch norm with statistics over comm's ranks, driven by the phase ops."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, num_batches_tracked, eps, momentum, mode, comm,
                check_ranks):
        ops = _ops()
        what = "SyncBatchNorm forward"
        exact = mode == "exact"
        sync = comm.world > 1
        scales = record = None
        local_error = None
        try:
            _check_input(what, x, mode)
            channels = x.shape[1]
            for name, v in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                            ("running_var", running_var)):
                _check_vector(what, name, v, channels, x.device)
            # the first phase validates x (and exact mode's element count) before any collective
            if exact:
                scales = ops.sync_batch_norm_local_scales(x, None, None)
            else:
                record = ops.sync_batch_norm_local_stats(x, mode, None)
        except Exception as e:  # noqa: BLE001 -- any local failure must reach the other ranks
            local_error = e
        if sync and check_ranks:
            _agree(comm, x, False, (weight is not None, running_mean is not None, False), mode, eps, momentum,
                   local_error, what)
        elif local_error is not None:
            raise local_error
        if exact:
            scales = ops.sync_batch_norm_merge_scales(comm.gather(scales))
            record = ops.sync_batch_norm_local_stats(x, mode, scales)
        gathered = comm.gather(record)
        save_mean, save_invstd = ops.sync_batch_norm_finalize_stats(
            gathered, weight, running_mean, running_var, num_batches_tracked, eps, momentum, mode, scales)
        y = ops.sync_batch_norm_apply(x, weight, bias, save_mean, save_invstd)
        ctx.save_for_backward(x, weight, save_mean, save_invstd)
        ctx.mode, ctx.comm, ctx.check_ranks, ctx.eps, ctx.momentum = mode, comm, check_ranks, eps, momentum
        ctx.has_bias = bias is not None
        ctx.has_running = running_mean is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        ops = _ops()
        what = "SyncBatchNorm backward"
        x, weight, save_mean, save_invstd = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        weight_grad = weight is not None and (need_w or need_b)
        comm = ctx.comm
        # grad_input needs the global sums; the parameter gradients alone are local (as
        # torch.nn.SyncBatchNorm, and detops' one-call backward: default mode, no collective)
        global_sums = need_x and comm.world > 1
        mode = ctx.mode if need_x else "default"
        exact = mode == "exact"
        if grad_y.stride() and 0 in grad_y.stride() and grad_y.numel() > 1:
            grad_y = grad_y.contiguous()  # an expanded gradient (e.g. of y.sum()) has stride 0
        scales = record = None
        local_error = None
        try:
            if exact:
                scales = ops.sync_batch_norm_local_scales(x, grad_y, save_mean)
            else:
                record = ops.sync_batch_norm_local_backward(grad_y, x, save_mean, mode, None)
        except Exception as e:  # noqa: BLE001
            local_error = e
        if comm.world > 1 and ctx.check_ranks:
            # every rank exchanges the header, also when it needs no grad_input: a rank that
            # does (and so waits for the records) and one that does not both raise
            _agree(comm, x, True, (need_x, weight_grad, weight_grad and ctx.has_bias), ctx.mode, ctx.eps,
                   ctx.momentum, local_error, what)
        elif local_error is not None:
            raise local_error
        rows = comm if global_sums else _Comm(None, x.device)
        if exact:
            scales = ops.sync_batch_norm_merge_scales(rows.gather(scales))
            record = ops.sync_batch_norm_local_backward(grad_y, x, save_mean, mode, scales)
        gathered = rows.gather(record)
        sums, grad_weight, grad_bias = ops.sync_batch_norm_finalize_backward(
            gathered, rows.rank, mode, save_invstd, scales, weight_grad)
        grad_x = None
        if need_x:
            grad_x = ops.sync_batch_norm_backward_apply(grad_y, x, weight, save_mean, save_invstd, sums)
        if not (weight_grad and need_w):
            grad_weight = None
        elif grad_weight.dtype != weight.dtype:
            grad_weight = grad_weight.to(weight.dtype)
        if not (weight_grad and need_b and ctx.has_bias):
            grad_bias = None
        elif grad_bias.dtype != weight.dtype:
            grad_bias = grad_bias.to(weight.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None, None, None, None


def _as_4d(x):
    """[N, C], [N, C, L], [N, C, H, W] or [N, C, D, H, W] as a 4-d view (no copy for the usual
    contiguous and channels_last layouts), so 1d, 2d and 3d batch norm all run on the 4-d ops."""
    if x.dim() == 4:
        return x
    if x.dim() == 2:
        return x.unsqueeze(-1).unsqueeze(-1)
    if x.dim() == 3:
        return x.unsqueeze(-1)
    return x.flatten(3)  # [N, C, D, H, W] -> [N, C, D, H * W]


class _GroupMeanGradient(torch.autograd.Function):
    """Identity forward; the backward replaces the gradient by its mean over ``group``: the ranks'
    gradients gathered and summed in rank order, then divided by the group size (mmcv's
    SyncBatchNorm all-reduces and divides; the order here makes the bits the same on every run)."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist
        grad = grad.contiguous()
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size(ctx.group))]
        dist.all_gather(parts, grad, group=ctx.group)
        return torch.stack(parts).sum(0) / len(parts), None


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    r"""``torch.nn.SyncBatchNorm`` with deterministic statistics from detops, on any process group.

    Args: as ``torch.nn.SyncBatchNorm`` (``num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True, process_group=None, device=None, dtype=None``), plus

    * ``mode``: ``"default"`` (float64 moments merged in rank order; the same bits on every rank
      and run, within float64 rounding of other splits) or ``"exact"`` (fixed-point sums: the same
      bits for any number of ranks and any split of the batch);
    * ``check_ranks``: exchange and compare a small header before each training call (default
      True), so ranks that disagree raise ``ValueError`` on every rank instead of hanging.

    Training uses the global batch over ``process_group`` (default: the world group) when
    ``torch.distributed`` is initialized and the group has more than one rank, else this process's
    batch (BatchNorm2d semantics, through the same ops). Evaluation with running statistics uses
    ``F.batch_norm``: it needs no communication, and so gives torch's own evaluation bits,
    autograd and every device and dtype torch has. ``momentum=None`` is the cumulative average.
    Running statistics and ``num_batches_tracked`` change only when the global batch has at least
    2 elements per channel. Inputs of 2 to 5 dimensions work (as torch's); 16-bit parameters and
    buffers are handled in float32 and written back.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None, mode="default", *, check_ranks=True):
        _check_mode(mode)
        super().__init__(num_features, eps, momentum, affine, track_running_stats, process_group,
                         device=device, dtype=dtype)
        self.mode = mode
        self.check_ranks = check_ranks

    def extra_repr(self):
        return super().extra_repr() + f", mode={self.mode!r}"

    def _group(self):
        """The process group to synchronize over, or None (this process alone)."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        return group if dist.get_world_size(group) > 1 else None

    def _affine(self, group):
        """The weight and bias the training forward uses (torch's semantics: these Parameters, so
        each rank gets its own gradient; mmcv's stand-in averages them over the group)."""
        return self.weight, self.bias

    def forward(self, input):
        self._check_input_dim(input)
        if hasattr(self, "_check_non_zero_input_channels"):
            self._check_non_zero_input_channels(input)
        _check_mode(getattr(self, "mode", "default"))
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        if not bn_training:
            # evaluation with running statistics: a per-element affine map, nothing to agree on
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        update = self.training and self.track_running_stats
        group = self._group() if self.training else None  # torch syncs in training only
        if group is None and input.numel() // max(input.shape[1], 1) == 1 and self.training:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.size()}")
        comm = _Comm(group, input.device)

        weight, bias = self._affine(group)
        if weight is not None and weight.dtype not in (torch.float32, torch.float64):
            weight, bias = weight.float(), bias.float()  # detops takes float32/float64 parameters
        running_mean = self.running_mean if update else None
        running_var = self.running_var if update else None
        nbt = self.num_batches_tracked if update else None
        if nbt is not None and nbt.dim() == 0:
            nbt = nbt.view(1)  # torch's counter is 0-d; detops updates a [1] view of the same storage
        write_back = None
        if running_mean is not None and running_mean.dtype not in (torch.float32, torch.float64):
            write_back = (running_mean, running_var)
            running_mean, running_var = running_mean.float(), running_var.float()
        y = _SyncBatchNormFunction.apply(_as_4d(input), weight, bias, running_mean, running_var, nbt, self.eps,
                                         self.momentum, self.mode, comm, bool(getattr(self, "check_ranks", True)))
        if write_back is not None:
            with torch.no_grad():
                write_back[0].copy_(running_mean)
                write_back[1].copy_(running_var)
        return y.reshape(input.shape) if input.dim() != 4 else y

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None, mode="default"):
        """Replaces every ``_BatchNorm`` (BatchNorm1d/2d/3d, torch's SyncBatchNorm) in ``module``
        with this class, reusing its Parameters and buffers (as torch's classmethod does) and
        copying ``qconfig``; returns the converted module (``module`` itself when it is a
        container)."""
        _check_mode(mode)
        out = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group, mode=mode)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group, mode))
        del module
        return out


def convert_sync_batchnorm(module, process_group=None, mode="default"):
    """``SyncBatchNorm.convert_sync_batchnorm`` as a function (see there)."""
    return SyncBatchNorm.convert_sync_batchnorm(module, process_group, mode)


def _allow_cpu_ddp():
    """DistributedDataParallel refuses every torch.nn.SyncBatchNorm in a CPU module ("SyncBatchNorm
    layers only work with GPU modules"), because torch's own needs CUDA. This subclass runs on the
    CPU, so the check is narrowed to torch's own layers (which still raise as before)."""
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:  # a torch without distributed support
        return
    original = getattr(DDP, "_passing_sync_batchnorm_handle", None)
    if original is None or getattr(original, "_detops_narrowed", False):
        return

    def _passing_sync_batchnorm_handle(self, module):
        if getattr(self, "device_type", None) == "cpu":
            theirs = [m for m in module.modules()
                      if isinstance(m, torch.nn.SyncBatchNorm) and not isinstance(m, SyncBatchNorm)]
            if not theirs:
                return None
        return original(self, module)

    _passing_sync_batchnorm_handle._detops_narrowed = True
    DDP._passing_sync_batchnorm_handle = _passing_sync_batchnorm_handle


_allow_cpu_ddp()
