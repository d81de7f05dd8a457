"""The building blocks of the three families, in the order a Transformer is built from them.

Attention (paper 3.2) and its masks, the KV cache, multi-head attention; the feed-forward
network (3.3); norms and the residual connection around each sub-layer (3.1); token
embeddings (3.4) and positional encodings (3.5); the encoder and decoder layers and stacks
(3.1); then what every model needs around them: initialisation, the loss, its hook sites by
name (read and changed through :mod:`attnlab.interpret`). The families
(:mod:`attnlab.models`) are built from these and read top to bottom.

Shapes: B batch, T query (target) length, S key (source) length, D d_model, H heads,
Dh head dim, V vocab, L layers.

Conventions:

* Masks are bool, ``True`` = may attend (as in ``F.scaled_dot_product_attention``) and
  broadcast to (B, H, T, S); a query row with nothing to attend gives zeros, never NaN.
* Two attention paths, tested equal: :func:`reference_attention` (written out, returns the
  weights) and :func:`fused_attention` (SDPA, the default). A faster kernel can be put in a
  :class:`MultiHeadAttention`'s ``sdpa`` slot (:mod:`attnlab.speed` does, on CPUs); nothing
  here measures the machine or reads a cache.
* Softmax, norms, rotations and losses run in at least float32 (:func:`upcast`).
* Dropout is called only in training with p > 0, so evaluation and decoding make no
  dropout calls at all; each module that drops holds :func:`dropout` in its ``drop`` slot,
  where :mod:`attnlab.speed` puts a faster one for CPUs (training does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import LossOptions, ModelConfig

LOW_PRECISION = (torch.float16, torch.bfloat16)
IGNORE_INDEX = -100  # targets with this value (and pad targets) do not count in the loss


def upcast(x: Tensor) -> Tensor:
    """float16/bfloat16 -> float32; float32/float64 unchanged (float64 gradchecks stay exact)."""
    return x.float() if x.dtype in LOW_PRECISION else x


def dropout(x: Tensor, p: float) -> Tensor:
    """Training-time dropout (Srivastava et al. 2014): each element is zeroed with probability
    ``p`` and the rest scaled by 1 / (1 - p), so the expectation is unchanged. What a module's
    ``drop`` slot holds unless :func:`attnlab.speed.use_cpu_dropout` put another there."""
    return F.dropout(x, p, training=True)


# ---- hook sites: where a forward pass can be read or changed --------------------------------
Hook = Callable[[Tensor], "Tensor | None"]  # a site's tensor -> the one to use (None: the same)


class Sites(nn.Module):
    """A module with named hook sites, listed in ``sites`` in the order the forward meets
    them. ``x = self.site("resid_pre", x)`` is ``x`` unless ``hooks`` has a function for that
    site, which then reads or replaces it (:mod:`attnlab.interpret` sets and clears them);
    with no hook set nothing else runs, so the forward is the plain one."""

    def __init__(self, *sites: str):
        super().__init__()
        self.sites, self.hooks = sites, {}  # hooks: {site: Hook}

    def site(self, name: str, x: Tensor) -> Tensor:
        if self.hooks and name in self.hooks:
            out = self.hooks[name](x)
            return x if out is None else out
        return x


# ---- masks ----------------------------------------------------------------------------------
def causal_mask(t: int, s: int | None = None, *, offset: int | None = None,
                device: torch.device | str | None = None) -> Tensor:
    """(T, S) mask where query i may attend key j iff j <= i + offset.

    ``offset`` defaults to ``S - T``: the queries are the last T of S positions, the KV-cache
    case (T new tokens after S - T cached ones). Paper 3.2.3: "we mask out (setting to -inf)
    all values in the input of the softmax which correspond to illegal connections".
    """
    s = t if s is None else s
    offset = s - t if offset is None else offset
    q = torch.arange(t, device=device).unsqueeze(1)  # (T, 1)
    k = torch.arange(s, device=device).unsqueeze(0)  # (1, S)
    return k <= q + offset  # (T, S)


def key_mask(valid: Tensor | None) -> Tensor | None:
    """(B, S) bool of real tokens -> (B, 1, 1, S) attention mask (every query may attend to
    the real keys); combine masks with ``&``, which broadcasts."""
    return None if valid is None else valid[:, None, None, :]


def valid_tokens(ids: Tensor, pad_id: int | None, mask: Tensor | None = None) -> Tensor | None:
    """(B, S) bool, True at real tokens: ``mask`` if given, else ``ids != pad_id`` (None
    without a pad id: every token is real)."""
    if mask is None and pad_id is not None:
        mask = ids != pad_id  # (B, S)
    return mask


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


# ---- scaled dot-product attention (paper 3.2.1) ---------------------------------------------
class AttentionOutput(NamedTuple):
    """Output of an attention call; ``weights`` is (B, H, T, S) only when asked for."""

    output: Tensor
    weights: Tensor | None = None


def reference_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                        dropout_p: float = 0.0, is_causal: bool = False,
                        generator: torch.Generator | None = None,
                        pattern: Hook | None = None) -> AttentionOutput:
    """softmax(Q K^T / sqrt(d_k)) V, written out (paper eq. 1). Returns the weights too.

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh) (v may have another last dim).
        mask: bool, True = may attend, broadcastable to (B, H, T, S).
        is_causal: add the causal mask (aligned to the end: KV-cache friendly).
        pattern: a function of the weights that returns the ones to use (a hook site).
    """
    t, s = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, T, S)
    mask = as_4d(mask)
    if is_causal:
        causal = causal_mask(t, s, device=q.device)  # (T, S), aligned to the end
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(upcast(scores), dim=-1).to(q.dtype)
    if mask is not None:  # a fully masked row is NaN after softmax: make it zeros
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if pattern is not None:
        weights = pattern(weights)
    attn = weights
    if dropout_p > 0.0:
        keep = torch.rand(attn.shape, device=attn.device, generator=generator) >= dropout_p
        attn = attn * keep / (1.0 - dropout_p)
    return AttentionOutput(attn @ v, weights)  # (B, H, T, Dh), (B, H, T, S)


# A kernel with the signature of F.scaled_dot_product_attention(q, k, v, attn_mask=,
# dropout_p=, is_causal=): the one slot through which a faster kernel enters the core.
SDPA = Callable[..., Tensor]


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, *,
                    sdpa: SDPA = F.scaled_dot_product_attention) -> Tensor:
    """The same as :func:`reference_attention` through ``F.scaled_dot_product_attention``
    (or ``sdpa``, a kernel with its signature), without the weights."""
    t, s = q.size(-2), k.size(-2)
    if v.size(-2) != s:  # torch's CPU kernel does not check this, and returns a result
        raise ValueError(f"k and v must have the same length S, got {s} and {v.size(-2)}")
    mask = as_4d(mask)
    if is_causal and t == 1:  # one query at the end may see every key: nothing to mask
        is_causal = False
    if is_causal and (mask is not None or t != s):
        # SDPA's is_causal aligns to the top-left corner; we want the end (KV cache)
        causal = causal_mask(t, s, device=q.device)  # (T, S)
        mask = causal if mask is None else mask & causal
        is_causal = False
    return sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)


# ---- the KV cache ---------------------------------------------------------------------------
class KVCache:
    """Keys and values of every layer, preallocated to ``max_len`` for step-by-step decoding.

    Each layer appends its new K/V with :meth:`update`; the model calls :meth:`advance` once
    per forward, after its last layer. :meth:`reorder` picks batch rows (beam search);
    :meth:`restart` empties it for a new prefill (a sliding context window).
    """

    def __init__(self, n_layers: int, batch: int, n_heads: int, head_dim: int, max_len: int,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32):
        shape = (batch, n_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.length, self.max_len = 0, max_len
        # Left padding of each row (B,), or None: row b's real tokens start at column pad[b],
        # so the token in column j has position j - pad[b] (see `positions`).
        self.pad: Tensor | None = None
        # Cross-attention keys/values of the encoder memory, computed once per layer.
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers

    def set_padding(self, valid: Tensor) -> None:
        """Record the left padding of a prompt from its mask (B, T) (True at real tokens)."""
        self.pad = (valid.long().cumsum(1) == 0).sum(1)  # (B,) pad columns before each row

    def positions(self, t: int, max_len: int | None = None) -> Tensor:
        """Positions of the next ``t`` tokens, after the cached ones: (t,), or (B, t) when the
        rows are left-padded (pad columns get position 0). No host sync."""
        return padded_positions(self.length, t, self.pad, max_len=max_len,
                                device=self.k[0].device if self.k else None)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, H, t, Dh) after the cached positions; return all of them so far."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} positions > max_len {self.max_len}")
        kc, vc = self.k[layer], self.v[layer]  # narrow, not indexing: fewer ops per step
        kc.narrow(2, self.length, k.size(2)).copy_(k)
        vc.narrow(2, self.length, v.size(2)).copy_(v)
        kc, vc = kc.narrow(2, 0, end), vc.narrow(2, 0, end)  # (B, H, S, Dh)
        # in the model's dtype if kept in another (e.g. bf16 to halve the cache)
        return (kc, vc) if kc.dtype == k.dtype else (kc.to(k.dtype), vc.to(v.dtype))

    def advance(self, t: int) -> None:
        """Count ``t`` more cached positions (after every layer wrote them)."""
        self.length += t

    def restart(self, pad: Tensor | None = None) -> None:
        """Empty the self-attention positions for a new prefill whose rows are left-padded by
        ``pad`` (B,) columns (None: not padded). The buffers and the cross-attention keys and
        values are kept. A sliding context window restarts its cache so: its kept tokens move
        to positions from 0, so their keys must be computed again."""
        self.length, self.pad = 0, pad

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) of every cached tensor, e.g. unfinished sentences."""
        self.reorder_self(index)
        self.reorder_cross(index)

    def reorder_self(self, index: Tensor) -> None:
        """Self-attention keys/values of batch rows ``index`` (B',), e.g. the beams each
        surviving hypothesis came from; only the filled positions are copied, in place."""
        n, end = index.numel(), self.length
        if self.pad is not None:
            self.pad = self.pad.index_select(0, index)
        for buffers in (self.k, self.v):
            for i, buf in enumerate(buffers):
                if n > buf.size(0):  # more rows than before: a new buffer
                    buffers[i] = buf.index_select(0, index)
                    continue
                buf[:n, :, :end] = buf[:, :, :end].index_select(0, index)
                buffers[i] = buf[:n]  # a view of the first B' rows

    def reorder_cross(self, index: Tensor) -> None:
        """Cross-attention keys/values of batch rows ``index``. Beam search calls it only when
        sentences leave the batch: all beams of a sentence share one memory."""
        self.cross = [
            None if c is None else (c[0].index_select(0, index), c[1].index_select(0, index))
            for c in self.cross
        ]


# ---- multi-head attention (paper 3.2.2) -----------------------------------------------------
class MultiHeadAttention(Sites):
    """Multi-head attention, for self- and cross-attention.

    Hook sites: ``q``, ``k``, ``v`` (B, H, T or S, Dh; after the rotation of rope),
    ``pattern`` (B, H, T, S: asking for it takes the written-out path) and ``z``
    (B, H, T, Dh: each head's output before the output projection).

    Args:
        d_model: model width D.
        n_heads: number of heads H.
        head_dim: Dh; defaults to D // H, which then must divide exactly.
        dropout: dropout on the attention weights.
        bias: whether the projections (stacked q/k/v and output) have biases.
        rope: rotary embedding applied to queries and keys (self-attention).

    Shape:
        x: (B, T, D); context (cross-attention): (B, S, D); mask: bool broadcastable to
        (B, H, T, S); positions: (T,) or (B, T) absolute positions (for rope); output (B, T, D).
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None,
                 dropout: float = 0.0, bias: bool = True, rope: RotaryEmbedding | None = None):
        super().__init__("q", "k", "v", "pattern", "z")
        if head_dim is None:
            if d_model % n_heads != 0:
                raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}: choose "
                                 "n_heads that divides d_model, or pass head_dim explicitly (then "
                                 "the heads are projected from H*Dh back to d_model)")
            head_dim = d_model // n_heads
        self.n_heads, self.head_dim, self.dropout = n_heads, head_dim, dropout
        self.inner = inner = n_heads * head_dim
        # W^Q, W^K, W^V of all heads stacked into one (3*H*Dh, D) matrix, in that order (as
        # torch.nn.MultiheadAttention's in_proj and GPT-2's c_attn): self-attention projects x
        # with one matmul; cross-attention applies the W^Q rows to x and the W^K, W^V rows to
        # the context (see `project`).
        self.qkv_proj = nn.Linear(d_model, 3 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)  # W^O: (H*Dh) -> D
        self.rope = rope
        self.sdpa: SDPA = F.scaled_dot_product_attention  # the fused path's kernel

    def _rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """``x`` times rows ``start:stop`` of the stacked projection (plus their bias)."""
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        return F.linear(x, w[start:stop], None if b is None else b[start:stop])

    def project(self, x: Tensor, context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-attention projections: queries x W^Q (B, T, H*Dh) and keys, values
        ``context`` W^K, W^V (B, S, H*Dh)."""
        k, v = self._rows(context, self.inner, 3 * self.inner).split(self.inner, dim=-1)
        return self._rows(x, 0, self.inner), k, v

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def forward(self, x: Tensor, context: Tensor | None = None, *, mask: Tensor | None = None,
                is_causal: bool = False, positions: Tensor | None = None,
                cache: KVCache | None = None, layer: int = 0,
                need_weights: bool = False) -> AttentionOutput:
        """Attend from ``x`` to ``context`` (cross) or to ``x`` itself (self).

        With a ``cache``, self-attention appends this step's keys/values to layer ``layer``'s
        cache; cross-attention computes the context's keys/values once and reuses them.
        ``need_weights`` takes the reference path and returns the weights.

        Returns:
            :class:`AttentionOutput`: output (B, T, D) and weights (B, H, T, S) or None.
        """
        b, t, _ = x.shape
        if context is None:  # self-attention: q, k, v from one matmul
            qkv = self.qkv_proj(x).view(b, t, 3, self.n_heads, self.head_dim)  # (B, T, 3, H, Dh)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, T, Dh) each
            if self.rope is not None:
                q, k = self.rope(q, positions), self.rope(k, positions)
            if cache is not None:
                k, v = cache.update(layer, k, v)  # (B, H, S, Dh): the cached positions too
        elif cache is not None and cache.cross[layer] is not None:
            q = self._heads(self._rows(x, 0, self.inner))
            k, v = cache.cross[layer]  # (B, H, S, Dh), computed at the first step
        else:
            q, k, v = (self._heads(z) for z in self.project(x, context))
            if cache is not None:
                cache.cross[layer] = (k, v)
        q, k, v = self.site("q", q), self.site("k", k), self.site("v", v)
        p = self.dropout if self.training else 0.0
        if need_weights or "pattern" in self.hooks:
            out, weights = reference_attention(q, k, v, mask, p, is_causal,
                                               pattern=partial(self.site, "pattern"))
        else:
            out, weights = fused_attention(q, k, v, mask, p, is_causal, sdpa=self.sdpa), None
        out = self.site("z", out).transpose(1, 2).reshape(b, t, self.inner)  # (B, T, H*Dh)
        return AttentionOutput(self.out_proj(out), weights)  # (B, T, D)


# ---- position-wise feed-forward (paper 3.3) -------------------------------------------------
class FeedForward(nn.Module):
    """Position-wise feed-forward network (paper eq. 2): W2 act(W1 x + b1) + b2.

    ``activation`` is "relu" (paper), "gelu", "gelu_tanh" (GPT-2's approximation) or "swiglu"
    (Shazeer 2020: W2 (silu(W1 x) * W3 x)).
    """

    drop = staticmethod(dropout)  # the dropout kernel: a slot (see the module docstring)

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
            h = self.drop(h, self.dropout)
        return self.w2(h)  # (B, T, D)


# ---- norms and the residual connection (paper 3.1) ------------------------------------------
class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016): (x - mean) / sqrt(var + eps) * g + b.

    Uses the biased variance, as ``torch.nn.LayerNorm`` does. (A common bug writes
    ``(var**2 + eps)**1/2``, which is (var^2 + eps) / 2, not a square root.)
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        # the formula above in one fused kernel; written out: `reference`, tested equal
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
    if cfg.norm_type == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return LayerNorm(cfg.d_model, cfg.norm_eps, cfg.bias)


class ResidualBlock(Sites):
    """What the encoder and decoder layers share: each sub-layer sits in a residual
    connection with a norm, after the sum ("post", the paper: ``LayerNorm(x + Dropout(y))``)
    or before the sub-layer ("pre", GPT-2 and most modern models: ``x + Dropout(y)`` with y
    computed from ``LayerNorm(x)``). Hook sites, each (B, T, D): the residual stream
    ``resid_pre``, ``resid_mid`` (after self-attention), ``resid_cross`` (after
    cross-attention), ``resid_post``, and the sub-layers' outputs ``attn_out``,
    ``cross_out``, ``ffn_out``."""

    drop = staticmethod(dropout)  # the dropout kernel: a slot (see the module docstring)

    def __init__(self, cfg: ModelConfig, *sites: str):
        super().__init__(*(s for s in sites if s != "ffn_out" or cfg.ffn != "none"))
        self.pre_norm, self.p_drop = cfg.norm == "pre", cfg.dropout

    def normed(self, x: Tensor, norm: nn.Module) -> Tensor:
        """The sub-layer's input: ``norm(x)`` for pre-norm, ``x`` for post-norm."""
        return norm(x) if self.pre_norm else x

    def residual(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        """x, y (B, T, D) -> the residual stream after the sub-layer (B, T, D)."""
        if self.training and self.p_drop > 0:
            y = self.drop(y, self.p_drop)
        return x + y if self.pre_norm else norm(x + y)

    def feed_forward(self, x: Tensor) -> Tensor:
        """The feed-forward sub-layer in its residual connection (none: ``ffn="none"``)."""
        if self.ffn is None:
            return x
        return self.residual(x, self.site("ffn_out", self.ffn(self.normed(x, self.norm2))),
                             self.norm2)


# ---- embeddings and positions (paper 3.4, 3.5) ----------------------------------------------
def padded_positions(start: int, t: int, pad: Tensor | None = None, device=None, *,
                     max_len: int | None = None) -> Tensor:
    """Positions of the columns ``start..start+t-1`` (e.g. after ``start`` cached tokens).

    Returns (T,), or (B, T) for rows left-padded by ``pad`` (B,) columns: column j of row b
    holds position j - pad[b], and pad columns get 0. ``start`` and ``t`` are Python ints, so
    the ``max_len`` check needs no host sync (it runs once per decoding step).
    """
    if max_len is not None and start + t > max_len:
        raise ValueError(f"sequence length {start + t} exceeds max_len={max_len}: the model "
                         f"has positions 0..{max_len - 1} only; shorten the input or build the "
                         "model with a larger max_len")
    pos = torch.arange(start, start + t, device=device)  # (T,)
    return pos if pad is None else (pos - pad[:, None]).clamp(min=0)  # (B, T)


def check_positions(positions: Tensor, t: int, max_len: int) -> None:
    """Explicit positions must be (T,) or (B, T) integers in 0..max_len-1 (one host sync, only
    for positions a caller passes: training and KV-cache decoding make their own)."""
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise TypeError(f"positions must be integer token positions, got dtype {positions.dtype}")
    if positions.dim() not in (1, 2) or positions.size(-1) != t:
        raise ValueError(f"positions must have shape (T,) or (B, T) with T={t}, got "
                         f"{tuple(positions.shape)}")
    if positions.numel() and not torch.compiler.is_compiling():
        low, high = torch.stack(torch.aminmax(positions)).tolist()
        if low < 0 or high >= max_len:
            raise ValueError(f"positions must be in 0..{max_len - 1} (the model's max_len is "
                             f"{max_len}), got values from {low} to {high}")


def token_positions(ids: Tensor, max_len: int, *, valid: Tensor | None = None,
                    cache: KVCache | None = None) -> Tensor:
    """Absolute positions of ``ids`` (B, T): after the cached tokens, or for left-padded rows
    (``valid`` (B, T), True at real tokens) counted from each row's first real token. A
    left-padded prefill (an empty cache and ``valid``) records its padding in the cache, so
    the later steps count on from each row's real tokens.

    Returns (T,) or (B, T).
    """
    t = ids.size(1)
    if cache is not None:
        if cache.length == 0 and valid is not None and cache.pad is None:
            cache.set_padding(valid)
        return cache.positions(t, max_len)
    pos = padded_positions(0, t, None, ids.device, max_len=max_len)  # (T,)
    return pos if valid is None else (valid.long().cumsum(1) - 1).clamp(min=0)  # (B, T)


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


class Embeddings(Sites):
    """Token embedding (times sqrt(D), paper 3.4) plus absolute positions (3.5; rope: none
    here, they rotate queries and keys inside attention), then optionally a norm (BERT).
    Hook sites: ``embed`` (B, T, D) and ``pos_embed`` ((T, D) or (B, T, D); not for rope)."""

    drop = staticmethod(dropout)  # the dropout kernel: a slot (see the module docstring)

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        kind = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}.get(cfg.pos)
        super().__init__(*(("embed", "pos_embed") if kind else ("embed",)))
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.max_len = cfg.max_len
        self.pos = kind(cfg.d_model, cfg.max_len) if kind else None
        self.norm = make_norm(cfg) if cfg.embed_norm else None
        self.p_drop = cfg.dropout

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        """ids (B, T), positions (T,) or (B, T) -> embeddings (B, T, D)."""
        x = self.tok(ids)  # (B, T, D)
        if self.scale != 1.0:
            x = x * self.scale
        x = self.site("embed", x)
        if self.pos is not None:  # out of place: never touches the caller's tensors
            x = x + self.site("pos_embed", self.pos(positions))
        if self.norm is not None:
            x = self.norm(x)
        if self.training and self.p_drop > 0:
            x = self.drop(x, self.p_drop)
        return x


def check_ids(ids: Tensor) -> None:
    """Token ids must be a (B, T) integer tensor."""
    if ids.dim() != 2 or ids.dtype.is_floating_point:
        raise ValueError(f"ids must be (B, T) integer ids, got {tuple(ids.shape)} {ids.dtype}")


# ---- encoder and decoder layers (paper 3.1) -------------------------------------------------
def attention_of(cfg: ModelConfig, rope: bool) -> MultiHeadAttention:
    """Multi-head attention of ``cfg``; self-attention gets the rotary embedding (pos="rope")."""
    rotary = RotaryEmbedding(cfg.head_dim, cfg.max_len, cfg.rope_base) if rope else None
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.attn_dropout,
                              cfg.bias, rotary)


def feed_forward_of(cfg: ModelConfig) -> tuple[FeedForward | None, nn.Module | None]:
    """The feed-forward sub-layer of ``cfg`` and its norm; none for attention-only blocks."""
    if cfg.ffn == "none":
        return None, None
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.ffn, cfg.dropout, cfg.bias), make_norm(cfg)


class EncoderLayer(ResidualBlock):
    """Self-attention then feed-forward, each in a residual connection with a norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, "resid_pre", "attn_out", "resid_mid", "ffn_out", "resid_post")
        self.self_attn = attention_of(cfg, rope=cfg.pos == "rope")
        self.norm1 = make_norm(cfg)
        self.ffn, self.norm2 = feed_forward_of(cfg)

    def forward(self, x: Tensor, mask: Tensor | None = None, *,
                positions: Tensor | None = None) -> Tensor:
        """Residual stream x (B, S, D) -> (B, S, D). ``mask``: bool, True = may attend,
        broadcastable to (B, H, S, S); ``positions`` (S,) or (B, S), for rope."""
        x = self.site("resid_pre", x)
        attn = self.self_attn(self.normed(x, self.norm1), mask=mask, positions=positions).output
        x = self.site("resid_mid", self.residual(x, self.site("attn_out", attn), self.norm1))
        return self.site("resid_post", self.feed_forward(x))


class DecoderLayer(ResidualBlock):
    """Masked self-attention, cross-attention to the encoder memory (if ``cross``), then FFN.

    Queries of the cross-attention come from the decoder, keys and values from the memory
    (paper 3.2.3). ``cross=False`` gives the decoder-only (GPT) block.
    """

    def __init__(self, cfg: ModelConfig, cross: bool = True):
        super().__init__(cfg, "resid_pre", "attn_out", "resid_mid",
                         *(("cross_out", "resid_cross") if cross else ()), "ffn_out", "resid_post")
        self.self_attn = attention_of(cfg, rope=cfg.pos == "rope")
        self.norm1 = make_norm(cfg)
        self.cross_attn = attention_of(cfg, rope=False) if cross else None
        self.norm_cross = make_norm(cfg) if cross else None
        self.ffn, self.norm2 = feed_forward_of(cfg)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, is_causal: bool = True,
                positions: Tensor | None = None, cache: KVCache | None = None,
                layer: int = 0) -> Tensor:
        """One decoder layer.

        Args:
            x: the residual stream (B, T, D).
            memory: the encoder output (B, S, D), needed iff the layer has cross-attention.
            self_mask: bool, True = may attend, broadcastable to (B, H, T, T_total); added to
                the causal mask (``is_causal``: later target positions hidden).
            memory_mask: bool, True = may attend, broadcastable to (B, H, T, S).
            is_causal: hide later target positions.
            positions: (T,) or (B, T) absolute positions, for rope.
            cache: keys/values of earlier steps; this layer's are at index ``layer``.
            layer: this layer's index in the stack (its place in the cache).

        Returns:
            x (B, T, D).
        """
        x = self.site("resid_pre", x)
        attn = self.self_attn(self.normed(x, self.norm1), mask=self_mask, is_causal=is_causal,
                              positions=positions, cache=cache, layer=layer).output
        x = self.site("resid_mid", self.residual(x, self.site("attn_out", attn), self.norm1))
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this decoder layer has cross-attention: pass the encoder memory")
            cross = self.cross_attn(self.normed(x, self.norm_cross), memory, mask=memory_mask,
                                    cache=cache, layer=layer).output
            cross = self.site("cross_out", cross)
            x = self.site("resid_cross", self.residual(x, cross, self.norm_cross))
        return self.site("resid_post", self.feed_forward(x))


# ---- the stacks (paper 3.1) -----------------------------------------------------------------
class Stack(Sites):
    """What both stacks share: the final norm (pre-norm), hook site ``final_norm``."""

    def __init__(self, cfg: ModelConfig, layers: list[nn.Module]):
        super().__init__(*(("final_norm",) if cfg.final_norm else ()))
        self.layers = nn.ModuleList(layers)
        self.norm = make_norm(cfg) if cfg.final_norm else None

    def final(self, x: Tensor) -> Tensor:
        return x if self.norm is None else self.site("final_norm", self.norm(x))


class Encoder(Stack):
    """A stack of :class:`EncoderLayer` and, for pre-norm, a final norm."""

    def __init__(self, cfg: ModelConfig, n_layers: int | None = None):
        super().__init__(cfg, [EncoderLayer(cfg) for _ in range(n_layers or cfg.n_layers)])

    def forward(self, x: Tensor, mask: Tensor | None = None, *,
                positions: Tensor | None = None) -> Tensor:
        """x (B, S, D); mask bool (B, 1, 1, S) or broadcastable -> (B, S, D)."""
        for layer in self.layers:
            x = layer(x, mask, positions=positions)
        return self.final(x)


class Decoder(Stack):
    """A stack of :class:`DecoderLayer` (with cross-attention iff ``cross``) and a final norm."""

    def __init__(self, cfg: ModelConfig, n_layers: int, cross: bool = True):
        super().__init__(cfg, [DecoderLayer(cfg, cross) for _ in range(n_layers)])
        self.max_len = cfg.max_len

    def forward(self, x: Tensor, memory: Tensor | None = None, *, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, positions: Tensor | None = None,
                cache: KVCache | None = None, is_causal: bool = True) -> Tensor:
        """x (B, T, D), memory (B, S, D) -> (B, T, D).

        The layers write this step's keys/values into ``cache``; the caller advances it.
        ``is_causal=False`` lets every target position attend to every other (a plain
        ``nn.TransformerDecoder`` without ``tgt_mask``); language models keep the default."""
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask,
                      is_causal=is_causal, positions=positions, cache=cache, layer=i)
        return self.final(x)

    def new_cache(self, batch: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` rows of up to ``max_len`` positions (default:
        the model's), on the stack's device, in its dtype unless ``dtype`` is given."""
        first = self.layers[0]
        p = first.norm1.weight  # not a linear layer's: inference may quantize those
        return KVCache(len(self.layers), batch, first.self_attn.n_heads, first.self_attn.head_dim,
                       max_len or self.max_len, p.device, dtype or p.dtype)


# ---- around the stacks: init, loss, the hook sites by name --------------------------------------
def init_weights(model: nn.Module, cfg: ModelConfig, n_layers: int) -> None:
    """GPT-2 style init: N(0, init_std) weights, zero biases, the projections that write into
    the residual stream (attention ``out_proj``, FFN ``w2``) scaled by 1/sqrt(2L) unless
    ``init_residual_scale`` is off (it keeps deep stacks stable); embeddings N(0, D^-1/2)
    when they are multiplied by sqrt(D)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            std = cfg.init_std
            if cfg.init_residual_scale and name.endswith(("out_proj", "w2")):
                std /= math.sqrt(2 * n_layers)
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = cfg.d_model ** -0.5 if cfg.scale_embeddings else cfg.init_std
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, LearnedPositions):
            nn.init.normal_(module.weight, std=cfg.init_std)


def counted(targets: Tensor, pad_id: int | None = None) -> Tensor:
    """Bool like ``targets``, True where a target counts in the loss: neither
    ``IGNORE_INDEX`` nor ``pad_id``."""
    keep = targets != IGNORE_INDEX
    return keep if pad_id is None else keep & (targets != pad_id)


def token_loss(logits: Tensor, targets: Tensor, pad_id: int | None = None,
               label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits (..., V) for targets (...); ``IGNORE_INDEX`` and ``pad_id``
    targets do not count. ``reduction="sum"``: the loop normalises over several micro-batches."""
    targets = targets.reshape(-1)
    if pad_id is not None:
        targets = targets.masked_fill(~counted(targets, pad_id), IGNORE_INDEX)
    return F.cross_entropy(upcast(logits.reshape(-1, logits.size(-1))), targets,
                           ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing,
                           reduction=reduction)


def loss_only(options: LossOptions, targets: Tensor | None) -> bool:
    """Whether a forward returns the loss alone, without building the logits
    (``options.loss_only``, which needs targets)."""
    if options.loss_only and targets is None:
        raise ValueError("LossOptions(loss_only=True) needs targets: there is no loss without")
    return options.loss_only


def projected_loss(h: Tensor, weight: Tensor, targets: Tensor, *,
                   label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """:func:`token_loss` of the projection ``h @ weight.T`` (N, V): a model's ``head_loss``
    slot, where :mod:`attnlab.speed` puts the fused one (the same loss and gradients)."""
    return token_loss(h @ weight.t(), targets, label_smoothing=label_smoothing,
                      reduction=reduction)


def stack_sites(prefix: str, emb: Embeddings, stack: Stack) -> dict[str, tuple[Sites, str]]:
    """The hook sites of one stack by name, in the order a forward meets them: ``embed``,
    ``pos_embed``, ``blocks.{i}.resid_pre``, ``blocks.{i}.attn.q`` ... ``.attn.z``,
    ``blocks.{i}.attn_out``, ..., ``blocks.{i}.cross.pattern``, ..., ``final_norm``, each
    after ``prefix`` ("encoder." and "decoder." in the encoder-decoder) -> (module, site)."""
    out = {prefix + s: (emb, s) for s in emb.sites}
    for i, layer in enumerate(stack.layers):
        at = f"{prefix}blocks.{i}."
        parts = {"attn_out": ("attn", layer.self_attn),
                 "cross_out": ("cross", getattr(layer, "cross_attn", None))}
        for s in layer.sites:
            if s in parts:  # the attention's own sites come before its output
                name, attn = parts[s]
                out |= {f"{at}{name}.{a}": (attn, a) for a in attn.sites}
            out[at + s] = (layer, s)
    return out | {prefix + s: (stack, s) for s in stack.sites}
