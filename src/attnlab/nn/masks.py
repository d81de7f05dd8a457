"""Attention masks. One convention everywhere: bool, ``True`` = may attend (as in
``F.scaled_dot_product_attention``). Masks broadcast to (B, H, T, S).

Shapes: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(t: int, s: int | None = None, *, offset: int | None = None,
                device: torch.device | str | None = None) -> Tensor:
    """(T, S) mask where query i may attend key j iff j <= i + offset.

    ``offset`` defaults to ``S - T``: the queries are the last T of S positions, which is the
    KV-cache case (T new tokens after S - T cached ones). Paper section 3.2.3: "we mask out
    (setting to -inf) all values in the input of the softmax which correspond to illegal
    connections".
    """
    s = t if s is None else s
    offset = s - t if offset is None else offset
    q = torch.arange(t, device=device).unsqueeze(1)  # (T, 1)
    k = torch.arange(s, device=device).unsqueeze(0)  # (1, S)
    return k <= q + offset  # (T, S)


def padding_mask(lengths: Tensor, s: int | None = None) -> Tensor:
    """(B, 1, 1, S) mask from sequence lengths: key j of row b is real iff j < lengths[b]."""
    s = int(lengths.max()) if s is None else s
    keys = torch.arange(s, device=lengths.device)  # (S,)
    return (keys.unsqueeze(0) < lengths.unsqueeze(1))[:, None, None, :]  # (B, 1, 1, S)


def pad_mask_from_ids(ids: Tensor, pad_id: int) -> Tensor:
    """(B, 1, 1, S) mask that is False at every ``pad_id`` token of ``ids`` (B, S)."""
    return (ids != pad_id)[:, None, None, :]


def left_padding_mask(lengths: Tensor, s: int) -> Tensor:
    """(B, 1, 1, S) mask for left-padded rows: the real tokens are the last lengths[b]."""
    keys = torch.arange(s, device=lengths.device)
    return (keys.unsqueeze(0) >= (s - lengths).unsqueeze(1))[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the given masks (broadcasting), ignoring ``None``; ``None`` if none."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise TypeError(f"attention masks must be bool (True = may attend), got {m.dtype}")
        out = m if out is None else out & m
    return out


def as_4d(mask: Tensor | None) -> Tensor | None:
    """Broadcast a (T, S), (B, T, S) or (B, H, T, S) mask to 4-D."""
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        raise TypeError(f"attention masks must be bool (True = may attend), got {mask.dtype}")
    if mask.dim() == 2:
        return mask[None, None]
    if mask.dim() == 3:
        return mask[:, None]
    if mask.dim() == 4:
        return mask
    raise ValueError(f"attention mask must have 2, 3 or 4 dims, got shape {tuple(mask.shape)}")
