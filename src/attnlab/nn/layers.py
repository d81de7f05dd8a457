"""Feed-forward, normalisation, and the encoder and decoder layers (paper section 3.1).

Shapes: B batch, T target length, S source length, D d_model.

Each sub-layer sits in a residual connection ``x + Dropout(Sublayer(..))`` with a norm: after
the sum ("post", the paper: ``LayerNorm(x + Sublayer(x))``) or before the sub-layer ("pre",
GPT-2 and most modern models: ``x + Sublayer(LayerNorm(x))``).

Dropout is ``F.dropout``, called only in training with p > 0: one-token decoding on CPU is
bound by per-call overhead, so eval mode makes no dropout (or identity) calls at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from .attention import KVCache, MultiHeadAttention
from .dtypes import upcast
from .positional import RotaryEmbedding


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016), written out: (x - mean) / sqrt(var + eps) * g + b.

    Uses the biased variance, as ``torch.nn.LayerNorm`` does. (A common bug writes
    ``(var**2 + eps)**1/2``, which is (var^2 + eps) / 2, not a square root.)
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        # the formula above in one fused kernel; written out: `reference` below, tested equal
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


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The norm of ``cfg.norm_type`` ("layernorm" or "rmsnorm"), D wide."""
    if cfg.norm_type == "layernorm":
        return LayerNorm(cfg.d_model, cfg.norm_eps, cfg.bias)
    if cfg.norm_type == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    raise ValueError(f"norm_type={cfg.norm_type!r} is not allowed: one of 'layernorm', 'rmsnorm'")


class FeedForward(nn.Module):
    """Position-wise feed-forward network (paper eq. 2): W2 act(W1 x + b1) + b2.

    ``activation`` is "relu" (paper), "gelu", "gelu_tanh" (GPT-2's approximation) or "swiglu"
    (Shazeer 2020: W2 (silu(W1 x) * W3 x)).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if activation not in ("relu", "gelu", "gelu_tanh", "swiglu"):
            raise ValueError(f"activation={activation!r} is not allowed: one of 'relu', "
                             "'gelu', 'gelu_tanh', 'swiglu'")
        self.activation = activation
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = dropout

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
            h = F.silu(h) * self.w3(x)  # (B, T, d_ff)
        if self.training and self.dropout > 0:
            h = F.dropout(h, self.dropout, training=True)
        return self.w2(h)  # (B, T, D)


class _Block(nn.Module):
    """What the two layers share: the norm placement, and the residual connection."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre_norm, self.p_drop = cfg.norm == "pre", cfg.dropout

    def residual(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        """``x + Dropout(y)``, then ``norm`` for post-norm (pre-norm normed the input of y)."""
        if self.training and self.p_drop > 0:
            y = F.dropout(y, self.p_drop, training=True)
        return x + y if self.pre_norm else norm(x + y)


def _attention(cfg: ModelConfig, rope: bool) -> MultiHeadAttention:
    """Multi-head attention of ``cfg``; self-attention gets the rotary embedding (pos="rope")."""
    rotary = RotaryEmbedding(cfg.head_dim, cfg.max_len, cfg.rope_base) if rope else None
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.attn_dropout, cfg.bias, rotary)


class EncoderLayer(_Block):
    """Self-attention then feed-forward, each in a residual connection with a norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.self_attn = _attention(cfg, rope=cfg.pos == "rope")
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.ffn, cfg.dropout, cfg.bias)
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, positions: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Residual stream x (B, S, D) -> (B, S, D), and the attention weights (B, H, S, S) if
        ``need_weights`` (the written-out path) else None. ``mask``: bool, True = may attend,
        broadcastable to (B, H, S, S); ``positions`` (S,) or (B, S), for rope."""
        h = self.norm1(x) if self.pre_norm else x
        attn = self.self_attn(h, mask=mask, positions=positions, need_weights=need_weights)
        x = self.residual(x, attn.output, self.norm1)
        h = self.norm2(x) if self.pre_norm else x
        x = self.residual(x, self.ffn(h), self.norm2)
        return x, attn.weights


class DecoderLayer(_Block):
    """Masked self-attention, cross-attention to the encoder memory (if ``cross``), then FFN.

    Queries of the cross-attention come from the decoder, keys and values from the memory
    (paper 3.2.3). ``cross=False`` gives the decoder-only (GPT) block.
    """

    def __init__(self, cfg: ModelConfig, cross: bool = True):
        super().__init__(cfg)
        self.self_attn = _attention(cfg, rope=cfg.pos == "rope")
        self.norm1 = make_norm(cfg)
        self.cross_attn = _attention(cfg, rope=False) if cross else None
        self.norm_cross = make_norm(cfg) if cross else None
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.ffn, cfg.dropout, cfg.bias)
        self.norm2 = make_norm(cfg)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, is_causal: bool = True,
                positions: Tensor | None = None, cache: KVCache | None = None, layer: int = 0,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Residual stream x (B, T, D) -> (B, T, D), and if ``need_weights`` (the written-out
        path) the self- and cross-attention weights (B, H, T, T_total), (B, H, T, S), else None.

        ``memory`` (B, S, D): the encoder output (needed iff ``cross``). ``self_mask`` (to (B, H,
        T, T_total)), ``memory_mask`` (to (B, H, T, S)): bool, True = may attend, added to the
        causal mask (``is_causal``: later target positions hidden). ``positions`` (T,) or (B,
        T), for rope; ``cache``: keys/values of earlier steps, ``layer`` its index.
        """
        h = self.norm1(x) if self.pre_norm else x
        attn = self.self_attn(h, mask=self_mask, is_causal=is_causal, positions=positions,
                              cache=cache, layer=layer, need_weights=need_weights)
        x = self.residual(x, attn.output, self.norm1)
        w_cross = None
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer has cross-attention: pass the encoder memory")
            h = self.norm_cross(x) if self.pre_norm else x
            cross = self.cross_attn(h, memory, mask=memory_mask, cache=cache, layer=layer,
                                    need_weights=need_weights)
            x = self.residual(x, cross.output, self.norm_cross)
            w_cross = cross.weights
        h = self.norm2(x) if self.pre_norm else x
        x = self.residual(x, self.ffn(h), self.norm2)
        return x, attn.weights, w_cross
