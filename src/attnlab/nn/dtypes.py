"""Precision helper: softmax, norms, rotations and losses run in at least float32."""

import torch
from torch import Tensor

LOW_PRECISION = (torch.float16, torch.bfloat16)


def upcast(x: Tensor) -> Tensor:
    """float16/bfloat16 -> float32; float32/float64 unchanged (float64 gradchecks stay exact)."""
    return x.float() if x.dtype in LOW_PRECISION else x
