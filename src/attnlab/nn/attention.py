"""Scaled dot-product attention, multi-head attention and the KV cache.

Shapes: B batch, T query length, S key length, D d_model, H heads, Dh head dim.

Two attention paths, tested equal: :func:`reference_attention` (written out, returns the
weights) and :func:`fused_attention` (``F.scaled_dot_product_attention``, the default).
Masks are bool, ``True`` = may attend; a query row with nothing to attend gives zeros.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..probe import one_query_in_fp32
from .dtypes import LOW_PRECISION, upcast
from .masks import as_4d, causal_mask
from .positional import RotaryEmbedding, padded_positions

# Longest sequence for which low-precision attention on a CPU avoids SDPA (fused_attention).
SHORT_CPU_SEQ = 128


class AttentionOutput(NamedTuple):
    """Output of an attention call; ``weights`` is (B, H, T, S) only when asked for."""

    output: Tensor
    weights: Tensor | None = None


def reference_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                        dropout_p: float = 0.0, is_causal: bool = False,
                        generator: torch.Generator | None = None) -> AttentionOutput:
    """softmax(Q K^T / sqrt(d_k)) V, written out (paper eq. 1). Returns the weights too.

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh) (v may have another last dim).
        mask: bool, True = may attend, broadcastable to (B, H, T, S).
        is_causal: add the causal mask (aligned to the end: KV-cache friendly).
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
    attn = weights
    if dropout_p > 0.0:
        keep = torch.rand(attn.shape, device=attn.device, generator=generator) >= dropout_p
        attn = attn * keep / (1.0 - dropout_p)
    return AttentionOutput(attn @ v, weights)  # (B, H, T, Dh), (B, H, T, S)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False) -> Tensor:
    """The same as :func:`reference_attention` through ``F.scaled_dot_product_attention``."""
    t, s = q.size(-2), k.size(-2)
    if v.size(-2) != s:  # (torch's CPU kernel does not check, and returns a result)
        raise ValueError(f"k and v must have the same length S, got {s} and {v.size(-2)}")
    mask = as_4d(mask)
    if is_causal and t == 1:  # one query at the end may see every key: nothing to mask
        is_causal = False
    if is_causal and (mask is not None or t != s):
        # SDPA's is_causal aligns to the top-left corner; we want the end (KV cache).
        causal = causal_mask(t, s, device=q.device)  # (T, S)
        mask = causal if mask is None else mask & causal
        is_causal = False
    if q.device.type == "cpu" and q.dtype in LOW_PRECISION and (
            t == s <= SHORT_CPU_SEQ or (t == 1 and one_query_in_fp32(q.dtype))):
        # bf16/fp16 on a CPU, whole short sequences (training, evaluation, a prompt) or, where
        # measured faster, one query (a decoding step; probe.one_query_in_fp32): torch's
        # kernels are slow here (math upcasts; flash's low-precision backward is several times
        # its fp32 one; benchmarks/README.md). Whole sequences, unmasked, with torch's kernel
        # choice left open: two bmm in this dtype; else fp32 flash, autocast off (it would cast
        # the inputs back).
        own = torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        if mask is None and own and t == s:
            return _short_attention(q, k, v, dropout_p, is_causal)
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                 dropout_p=dropout_p, is_causal=is_causal)
        return out.to(q.dtype)  # (B, H, T, Dh)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=is_causal)


@functools.lru_cache(maxsize=16)
def _score_bias(t: int, dtype: torch.dtype, is_causal: bool) -> Tensor:
    """(T, T): 0, and -inf above the diagonal if causal (made outside inference mode: the
    cached tensor serves training too)."""
    with torch.inference_mode(False):
        return torch.zeros(t, t, dtype=dtype).masked_fill(~causal_mask(t) & is_causal, -math.inf)


def _short_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float,
                     is_causal: bool) -> Tensor:
    """:func:`fused_attention` of unmasked (B, H, T, Dh) in their own dtype, as two bmm."""
    b, h, t, dh = q.shape
    q, k, v = (x.reshape(b * h, t, -1) for x in (q, k, v))
    scores = torch.baddbmm(_score_bias(t, q.dtype, is_causal), q, k.transpose(1, 2),
                           alpha=1 / math.sqrt(dh))  # (B*H, T, T)
    weights = F.dropout(torch.softmax(scores, dim=-1), dropout_p, training=dropout_p > 0)
    return (weights @ v).view(b, h, t, -1)  # (B, H, T, Dh)


class KVCache:
    """Keys and values of every layer, preallocated to ``max_len`` for step-by-step decoding.

    Each layer appends its new K/V with :meth:`update`; the model advances ``length`` once per
    forward (:meth:`advance`). :meth:`reorder` picks batch rows (beam search).
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

    def positions(self, t: int) -> Tensor:
        """Positions of the next ``t`` tokens, after the cached ones: (t,), or (B, t) when the
        rows are left-padded (``pad``; pad columns get position 0). Computed on the device,
        without a host sync."""
        return padded_positions(self.length, t, self.pad,
                                device=self.k[0].device if self.k else None)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, H, t, Dh) after the cached positions; return all of them so far."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} positions > max_len {self.max_len}")
        kc, vc = self.k[layer], self.v[layer]  # (narrow: fewer ops than indexing, per step)
        kc.narrow(2, self.length, k.size(2)).copy_(k)
        vc.narrow(2, self.length, v.size(2)).copy_(v)
        kc, vc = kc.narrow(2, 0, end), vc.narrow(2, 0, end)  # (B, H, S, Dh)
        # in the model's dtype if kept in another (e.g. bf16 to halve the cache)
        return (kc, vc) if kc.dtype == k.dtype else (kc.to(k.dtype), vc.to(v.dtype))

    def advance(self, t: int) -> None:
        self.length += t

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


class MultiHeadAttention(nn.Module):
    """Multi-head attention (paper section 3.2.2), for self- and cross-attention.

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
        super().__init__()
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
        # with one matmul instead of three; cross-attention applies the W^Q rows to x and the
        # W^K, W^V rows to the context (see `project`).
        self.qkv_proj = nn.Linear(d_model, 3 * inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)  # W^O: (H*Dh) -> D
        self.rope = rope

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
        ``need_weights`` takes the reference path and returns the weights. (Shapes: see the
        class docstring.)

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
        p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = reference_attention(q, k, v, mask, p, is_causal)
        else:
            out, weights = fused_attention(q, k, v, mask, p, is_causal), None
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # (B, T, H*Dh)
        return AttentionOutput(self.out_proj(out), weights)  # (B, T, D)
