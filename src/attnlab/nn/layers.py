"""Feed-forward, normalisation, and the encoder and decoder layers (paper section 3.1).

Shapes: B batch, T target length, S source length, D d_model.

Each layer is ``x + Dropout(Sublayer(x))`` around a norm: after the residual ("post", the
paper: ``LayerNorm(x + Sublayer(x))``) or before the sub-layer ("pre", GPT-2 and most modern
models: ``x + Sublayer(LayerNorm(x))``).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .dtypes import upcast
from .positional import RotaryEmbedding


def make_dropout(p: float) -> nn.Dropout | None:
    """``nn.Dropout(p)``, or None when ``p == 0``; apply it with :func:`apply_dropout`."""
    return nn.Dropout(p) if p > 0 else None


def apply_dropout(drop: nn.Dropout | None, x: Tensor) -> Tensor:
    """``drop(x)`` in training mode; ``x`` itself when there is no dropout or in eval mode.

    Skipping the call (rather than calling an identity) matters for one-token decoding on CPU,
    which is bound by per-call overhead: a decoder layer makes 3 dropout calls (4 with
    cross-attention).
    """
    return x if drop is None or not drop.training else drop(x)


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016), written out: (x - mean) / sqrt(var + eps) * g + b.

    Uses the biased variance, as ``torch.nn.LayerNorm`` does. (Seed 001 computed
    ``(var**2 + eps)**1/2``, which is (var^2 + eps) / 2, not a square root.)
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        # F.layer_norm computes exactly the formula above in one fused kernel; the written-out
        # version is `reference` below, tested equal.
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)

    def reference(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        y = (x - mean) / torch.sqrt(var + self.eps) * self.weight
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * g."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        xf = upcast(x)
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


def make_norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    if kind == "layernorm":
        return LayerNorm(d_model, eps, bias)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps)
    raise ValueError(f"norm_type={kind!r} is not allowed: one of 'layernorm', 'rmsnorm'")


class FeedForward(nn.Module):
    """Position-wise feed-forward network (paper eq. 2): W2 act(W1 x + b1) + b2.

    ``activation`` is "relu" (paper), "gelu", "gelu_tanh" (GPT-2's approximation) or "swiglu"
    (Shazeer 2020: W2 (silu(W1 x) * W3 x)).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if activation not in ("relu", "gelu", "gelu_tanh", "swiglu"):
            raise ValueError(
                f"activation={activation!r} is not allowed: one of 'relu', 'gelu', "
                f"'gelu_tanh', 'swiglu'"
            )
        self.activation = activation
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = make_dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        h = self.w1(x)  # (B, T, d_ff)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.silu(h) * self.w3(x)
        return self.w2(apply_dropout(self.dropout, h))


class _Sublayers(nn.Module):
    """Shared residual wiring: ``residual(x, i, f)`` applies sub-layer f with norm i."""

    norm: Literal["post", "pre"]

    def residual(self, x: Tensor, norm: nn.Module, f) -> tuple[Tensor, object]:
        if self.norm == "pre":
            y, extra = f(norm(x))
            return x + apply_dropout(self.drop, y), extra
        y, extra = f(x)
        return norm(x + apply_dropout(self.drop, y)), extra


class EncoderLayer(_Sublayers):
    """Self-attention then feed-forward, each wrapped in residual + norm.

    Shape: x (B, S, D); mask bool broadcastable to (B, H, S, S) -> (B, S, D).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, head_dim: int | None = None,
                 dropout: float = 0.1, attn_dropout: float | None = None,
                 norm: Literal["post", "pre"] = "post", norm_type: str = "layernorm",
                 norm_eps: float = 1e-5, ffn: str = "relu", bias: bool = True,
                 rope: RotaryEmbedding | None = None):
        super().__init__()
        p_attn = dropout if attn_dropout is None else attn_dropout
        self.norm = norm
        self.self_attn = MultiHeadAttention(d_model, n_heads, head_dim, p_attn, bias, rope)
        self.ffn = FeedForward(d_model, d_ff, ffn, dropout, bias)
        self.norm1 = make_norm(norm_type, d_model, norm_eps, bias)
        self.norm2 = make_norm(norm_type, d_model, norm_eps, bias)
        self.drop = make_dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, positions: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Returns the new residual stream (B, S, D) and the (B, H, S, S) weights if asked."""
        x, weights = self.residual(
            x, self.norm1,
            lambda h: self.self_attn(h, mask=mask, positions=positions, need_weights=need_weights),
        )
        x, _ = self.residual(x, self.norm2, lambda h: (self.ffn(h), None))
        return x, weights


class DecoderLayer(_Sublayers):
    """Masked self-attention, cross-attention to the encoder memory (if ``cross``), then FFN.

    Queries of the cross-attention come from the decoder, keys and values from the memory
    (paper 3.2.3). ``cross=False`` gives the decoder-only (GPT) block.

    Shape: x (B, T, D); memory (B, S, D) -> (B, T, D).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, cross: bool = True,
                 head_dim: int | None = None, dropout: float = 0.1,
                 attn_dropout: float | None = None, norm: Literal["post", "pre"] = "post",
                 norm_type: str = "layernorm", norm_eps: float = 1e-5, ffn: str = "relu",
                 bias: bool = True, rope: RotaryEmbedding | None = None):
        super().__init__()
        p_attn = dropout if attn_dropout is None else attn_dropout
        self.norm = norm
        self.self_attn = MultiHeadAttention(d_model, n_heads, head_dim, p_attn, bias, rope)
        self.norm1 = make_norm(norm_type, d_model, norm_eps, bias)
        if cross:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, head_dim, p_attn, bias)
            self.norm_cross = make_norm(norm_type, d_model, norm_eps, bias)
        else:
            self.cross_attn = self.norm_cross = None
        self.ffn = FeedForward(d_model, d_ff, ffn, dropout, bias)
        self.norm2 = make_norm(norm_type, d_model, norm_eps, bias)
        self.drop = make_dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, is_causal: bool = True,
                positions: Tensor | None = None, cache: KVCache | None = None, layer: int = 0,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Returns the residual stream (B, T, D) and, if asked, the self- and cross-attention
        weights (B, H, T, T_total) and (B, H, T, S)."""
        x, w_self = self.residual(x, self.norm1, lambda h: self.self_attn(
            h, mask=self_mask, is_causal=is_causal, positions=positions, cache=cache,
            layer=layer, need_weights=need_weights))
        w_cross = None
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer has cross-attention: pass the encoder memory")
            x, w_cross = self.residual(x, self.norm_cross, lambda h: self.cross_attn(
                h, memory, mask=memory_mask, cache=cache, layer=layer,
                need_weights=need_weights))
        x, _ = self.residual(x, self.norm2, lambda h: (self.ffn(h), None))
        return x, w_self, w_cross
