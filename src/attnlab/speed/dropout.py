"""Dropout for CPUs from a quarter of the random draws, put into the core's ``drop`` slots.

On a CPU, ``F.dropout`` draws one random number per element from the one (serial) generator,
and those draws are most of its cost (the figures: docs/benchmarks.md). :func:`cpu_dropout`
draws one 64-bit number for four elements; :func:`use_cpu_dropout` puts it into each module
of a model that drops (their ``drop`` slot, :func:`attnlab.nn.dropout` until then). Training
does, so a seed gives the same masks in every run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import dropout


def cpu_dropout(x: Tensor, p: float) -> Tensor:
    """:func:`attnlab.nn.dropout` (zero each element with probability ``p``, scale the rest by
    1 / (1 - p)) from a quarter of the random draws on a CPU.

    On a GPU, and inside ``torch.compile``, this is ``F.dropout``. On a CPU one 64-bit draw
    gives four 16-bit numbers, each compared with a threshold, and ``p`` is rounded to a
    multiple of 1/32768 (0.1 -> 0.100006; the scale is of the rounded p, so the expectation
    stays exact). Both use torch's seeded generator, so a seed gives the same masks every run.
    """
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    k = round(p * 32768)  # drop when a 15-bit uniform < k
    if k >= 32768:  # p = 1 (or within 1/65536 of it): nothing is kept, as F.dropout
        return x * 0.0
    n = x.numel()
    bits = torch.empty(((n + 3) // 4, 4), dtype=torch.int16)
    bits.view(torch.int64).random_()  # [0, 2^63): columns 0-2 span int16, column 3 is >= 0
    # P(keep) = 1 - k/32768 in every column: int16 >= 2k - 32768, or a 15-bit value >= k
    thresholds = torch.tensor([2 * k - 32768] * 3 + [k], dtype=torch.int16)
    keep = (bits >= thresholds).view(-1)[:n].view(x.shape)
    return x * keep.to(x.dtype).mul_(32768 / (32768 - k))  # 1 / (1 - p as rounded)


def use_cpu_dropout(model: nn.Module) -> nn.Module:
    """Put :func:`cpu_dropout` into the ``drop`` slot of every module of ``model`` that still
    holds the core's :func:`~attnlab.nn.dropout`, in place; returns the model."""
    for module in model.modules():
        if getattr(module, "drop", None) is dropout:
            module.drop = cpu_dropout
    return model
