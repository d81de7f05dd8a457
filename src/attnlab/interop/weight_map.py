"""Checked weight loading shared by the converters.

Every converter builds an attnlab state dict (name -> tensor) from the foreign weights and
loads it with :func:`load_mapped`, which fails loudly on a missing, unknown or misshapen
parameter instead of leaving a randomly initialised weight behind.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


def load_mapped(model: nn.Module, mapped: dict[str, Tensor],
                keep: Iterable[str] = ()) -> None:
    """Load ``mapped`` into ``model``; parameters whose names start with a ``keep`` prefix may
    stay as they are (e.g. a classifier head that the source model does not have).

    Raises:
        ValueError: a name of ``mapped`` is not in the model, a shape differs, or a model
            parameter is neither mapped nor kept.
    """
    keep = tuple(keep)
    state = model.state_dict()
    unknown = sorted(set(mapped) - set(state))
    if unknown:
        raise ValueError(f"converter bug: attnlab has no parameter {unknown[0]!r}")
    missing = sorted(k for k in state if k not in mapped and not k.startswith(keep))
    if missing:
        raise ValueError(f"converter bug: attnlab parameter {missing[0]!r} was not mapped")
    for name, tensor in mapped.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(
                f"shape mismatch for {name!r}: source {tuple(tensor.shape)} vs attnlab "
                f"{tuple(state[name].shape)}"
            )
    with torch.no_grad():
        for name, tensor in mapped.items():
            state[name].copy_(tensor.detach())  # state_dict tensors share the parameters' storage
