"""Positional encodings: sinusoidal (paper section 3.5), learned, and rotary (RoPE).

Shapes: B batch, T length, D d_model, H heads, Dh head dim. ``positions`` are absolute
positions, (T,) shared by the batch or (B, T) per row (left-padded batches, KV cache).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .dtypes import upcast


def padded_positions(start: int, t: int, pad: Tensor | None = None, device=None, *,
                     max_len: int | None = None) -> Tensor:
    """Positions of the columns ``start..start+t-1`` (e.g. after ``start`` cached tokens).

    Returns (T,), or (B, T) for rows left-padded by ``pad`` (B,) columns: column j of row b
    holds position j - pad[b], and pad columns get 0. ``start`` and ``t`` are Python ints, so
    the ``max_len`` check needs no host sync (it matters once per decoding step).
    """
    if max_len is not None and start + t > max_len:
        raise ValueError(f"sequence length {start + t} exceeds max_len={max_len}: the model "
                         f"has positions 0..{max_len - 1} only; shorten the input or build the "
                         "model with a larger max_len")
    pos = torch.arange(start, start + t, device=device)  # (T,)
    return pos if pad is None else (pos - pad[:, None]).clamp(min=0)  # (B, T)


def sinusoidal_table(max_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    Returns a (max_len, d_model) table, computed in float64 and cast to ``dtype``. (A common
    bug computes the exponent as ``dim // d_model``, which is always 0, so every position
    gets the same encoding.)
    """
    if d_model % 2:
        raise ValueError(f"d_model={d_model} must be even for sinusoidal positions")
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (N, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (N, D/2)
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return table.to(dtype)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings, added to the token embeddings."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        """positions (T,) or (B, T) -> (T, D) or (B, T, D)."""
        return self.table[positions]


class LearnedPositions(nn.Module):
    """A learned embedding per position (GPT, BERT)."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, positions: Tensor) -> Tensor:
        """positions (T,) or (B, T) -> (T, D) or (B, T, D)."""
        return self.weight[positions]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021), applied to queries and keys per head.

    Uses the "rotate half" layout: dimension i is paired with i + Dh/2.
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even for rotary embeddings")
        self.max_len = max_len
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angle = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (N, Dh/2)
        angle = torch.cat([angle, angle], dim=-1)  # (N, Dh)
        self.register_buffer("cos", angle.cos().float(), persistent=False)
        self.register_buffer("sin", angle.sin().float(), persistent=False)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x (B, H, T, Dh); positions (T,) or (B, T), default 0..T-1 -> same shape as x."""
        if positions is None:
            positions = padded_positions(0, x.size(-2), max_len=self.max_len, device=x.device)
        cos, sin = self.cos[positions], self.sin[positions]  # (T, Dh) or (B, T, Dh)
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, Dh)
        half = x.size(-1) // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (B, H, T, Dh)
        return (upcast(x) * cos + upcast(rotated) * sin).to(x.dtype)
