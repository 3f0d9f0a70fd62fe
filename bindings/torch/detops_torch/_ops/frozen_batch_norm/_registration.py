# FrozenBatchNorm2d's fake kernels and (stable layer) autograd: the fold, the forward with its epilogues and the backward op.
import torch

from ... import _registry as r
from ..._errors import DetopsError
from .functional import EPILOGUES


def check_residual(op, epilogue, residual):
    if epilogue == "add_relu" and residual is None:
        raise DetopsError(f"{op}: residual is None; expected a tensor of x's shape with epilogue 'add_relu'")
    if epilogue != "add_relu" and residual is not None:
        raise DetopsError(f"{op}: residual is given with epilogue other than 'add_relu'; expected None")


@r.fake("frozen_batch_norm_fold")
def _(weight, bias, running_mean, running_var, eps):
    op = "detops::frozen_batch_norm_fold"
    r.require_meta_or_fake(op, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    r.require_dim(op, "weight", weight, 1, "[C]")
    # detops folds float64 buffers into float64 scale/shift and everything else into float32.
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    return weight.new_empty(weight.shape, dtype=dtype), weight.new_empty(weight.shape, dtype=dtype)


@r.fake("frozen_batch_norm")
def _(x, scale, shift, epilogue="none", residual=None):
    op = "detops::frozen_batch_norm"
    r.require_meta_or_fake(op, x=x, scale=scale, shift=shift, residual=residual)
    r.check_choice(op, "epilogue", epilogue, EPILOGUES)
    check_residual(op, epilogue, residual)
    r.require_dim(op, "x", x, 4, "[N, C, H, W]")
    return r.empty_like_format(x)


@r.fake("_frozen_batch_norm_backward")
def _(grad_y, scale, epilogue, y=None):
    op = "detops::_frozen_batch_norm_backward"
    r.require_meta_or_fake(op, grad_y=grad_y, scale=scale, y=y)
    r.check_choice(op, "epilogue", epilogue, EPILOGUES)
    return r.empty_like_format(grad_y), r.empty_like_format(grad_y) if epilogue == "add_relu" else None


def _frozen(inputs):
    # Frozen means frozen: a gradient asked of scale or shift would silently be None otherwise.
    for name, t in (("scale", inputs[1]), ("shift", inputs[2])):
        if t is not None and t.requires_grad:
            raise DetopsError(f"detops::frozen_batch_norm: {name} requires grad; expected a frozen buffer "
                             "(FrozenBatchNorm2d has no parameter gradients: detach it or use BatchNorm2d)")


def _setup(ctx, inputs, output):
    epilogue = inputs[3]
    # The ReLU epilogues mask the gradient by y > 0: keep y (an output: saved without a copy).
    ctx.save_for_backward(inputs[1], None if epilogue == "none" else output)
    ctx.epilogue = epilogue


def _backward(ctx, needs, grad):
    scale, y = ctx.saved_tensors
    gx, gr = torch.ops.detops._frozen_batch_norm_backward(grad, scale, ctx.epilogue, y)
    return gx, None, None, None, gr


r.autograd("frozen_batch_norm", _setup, _backward, check=_frozen)
r.autograd("_frozen_batch_norm_backward",
           double_backward_error="detops::frozen_batch_norm: double backward is not supported")
r.autograd("frozen_batch_norm_fold")  # buffers in, buffers out: no gradient, errors translated
