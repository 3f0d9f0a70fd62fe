# The Python half of each op's registration (fake kernels; autograd for the stable layer), one module per op of DETOPS_OPS.
"""One module per op: its fake kernels (both layers) and, for the stable layer, its autograd
(see ``detops_torch._registry``). Importing this package registers them all."""
from . import (deform_conv2d, frozen_batch_norm, grid_sample, ms_deform_attn, roi_align,  # noqa: F401
               roi_align_rotated, sync_batch_norm)
