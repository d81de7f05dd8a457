"""Checked weight mapping shared by the converters.

Every converter builds the other model's state dict (name -> tensor) from its source's,
with :func:`linear_weights` and :func:`layer_norm_weights` where the layers line up one to one,
and loads it with :func:`load_mapped`, which fails loudly on a missing, unknown or misshapen
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


def _bias_or_zeros(sd: dict[str, Tensor], name: str, like: Tensor, size: int) -> Tensor:
    """``sd[name]``, or zeros where attnlab has no bias (``bias=False``): a zero bias in the
    other model computes the same function."""
    return sd[name] if name in sd else like.new_zeros(size)


def linear_weights(sd: dict[str, Tensor], src: str, dst: str, *,
                   conv1d: bool = False) -> dict[str, Tensor]:
    """The weight and bias of nn.Linear ``src`` of ``sd``, renamed ``dst``.

    Args:
        conv1d: GPT-2's Conv1D stores the weight (in, out), nn.Linear (out, in): transpose.

    Returns:
        ``{dst.weight, dst.bias}``; a missing bias (attnlab's ``bias=False``) becomes zeros.
    """
    w = sd[f"{src}.weight"]
    return {f"{dst}.weight": w.t() if conv1d else w,
            f"{dst}.bias": _bias_or_zeros(sd, f"{src}.bias", w, w.shape[0])}


def layer_norm_weights(sd: dict[str, Tensor], src: str, dst: str) -> dict[str, Tensor]:
    """The weight and bias of LayerNorm ``src`` of ``sd``, renamed ``dst``; a missing bias
    becomes zeros."""
    w = sd[f"{src}.weight"]
    return {f"{dst}.weight": w,
            f"{dst}.bias": _bias_or_zeros(sd, f"{src}.bias", w, w.shape[0])}


def layer_weights(sd: dict[str, Tensor], src: str, dst: str, *, linears: dict[str, str],
                  norms: dict[str, str], to_hf: bool, conv1d: bool = False) -> dict[str, Tensor]:
    """The linear and LayerNorm weights of one layer, from prefix ``src`` of ``sd`` to prefix
    ``dst``, renamed by the tables ``{attnlab name: Hugging Face name}``.

    Args:
        to_hf: ``sd`` is attnlab's (names go left to right), else the other model's.
        conv1d: see :func:`linear_weights`.
    """
    out: dict[str, Tensor] = {}
    for ours, theirs in linears.items():
        a, b = (ours, theirs) if to_hf else (theirs, ours)
        out |= linear_weights(sd, src + a, dst + b, conv1d=conv1d)
    for ours, theirs in norms.items():
        a, b = (ours, theirs) if to_hf else (theirs, ours)
        out |= layer_norm_weights(sd, src + a, dst + b)
    return out
