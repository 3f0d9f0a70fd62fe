# FrozenBatchNorm2d's functional forms: the fold of the buffers and the fused apply.
"""FrozenBatchNorm2d's functional forms: ``frozen_batch_norm_fold`` folds the buffers into
``(scale, shift)``; ``frozen_batch_norm`` applies them with an optional fused epilogue."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..._errors import eager, run

__all__ = ["EPILOGUES", "frozen_batch_norm", "frozen_batch_norm_fold"]


EPILOGUES = ("none", "relu", "add_relu")


def frozen_batch_norm_fold(
    weight: Tensor, bias: Tensor, running_mean: Tensor, running_var: Tensor, eps: float = 1e-5
) -> Tuple[Tensor, Tensor]:
    """Folds BatchNorm buffers into ``(scale, shift)``: ``scale = weight * (1 / sqrt(running_var + eps))``,
    ``shift = bias - running_mean * scale`` (float64 buffers fold in float64, others in float32)."""
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.frozen_batch_norm_fold, weight, bias, running_mean, running_var, eps)
    scale, shift = torch.ops.detops.frozen_batch_norm_fold(weight, bias, running_mean, running_var, eps)
    return scale, shift


def frozen_batch_norm(
    x: Tensor, scale: Tensor, shift: Tensor, epilogue: str = "none", residual: Optional[Tensor] = None
) -> Tensor:
    """``epilogue(x * scale + shift [+ residual])`` with epilogue ``"none"``, ``"relu"`` or
    ``"add_relu"`` (residual required). Gradients flow to ``x`` (and ``residual``), never to the
    frozen ``scale``/``shift``."""
    if not torch.jit.is_scripting():
        if eager():  # the op library's errors as detops' types
            return run(torch.ops.detops.frozen_batch_norm, x, scale, shift, epilogue, residual)
    return torch.ops.detops.frozen_batch_norm(x, scale, shift, epilogue, residual)
