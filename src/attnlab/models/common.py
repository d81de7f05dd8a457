"""Pieces shared by the three model families: embeddings, the encoder and decoder stacks,
attention capture, initialisation and the loss.

Shapes: B batch, T target length, S source length, D d_model, H heads, V vocab, L layers.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn.attention import KVCache
from ..nn.dtypes import upcast
from ..nn.layers import DecoderLayer, EncoderLayer, make_norm
from ..nn.positional import LearnedPositions, SinusoidalPositions, padded_positions

IGNORE_INDEX = -100  # targets with this value (and pad targets) do not count in the loss


@dataclass
class AttentionMaps:
    """Attention weights captured in one forward pass, by stack and layer.

    ``maps[stack][layer]`` is (B, H, T, S) for the stacks "encoder", "decoder" (self-attention)
    and "cross" (decoder queries over encoder memory). Only the layers asked for are present.
    """

    maps: dict[str, dict[int, Tensor]] = field(default_factory=dict)
    logits: Tensor | None = None

    def __getitem__(self, stack: str) -> dict[int, Tensor]:
        return self.maps[stack]

    def stacked(self, stack: str) -> Tensor:
        """(L, B, H, T, S) tensor of the captured layers of one stack, in layer order."""
        layers = self.maps[stack]
        return torch.stack([layers[i] for i in sorted(layers)])

    def keep_heads(self, heads: Collection[int] | None, n_heads: int) -> AttentionMaps:
        """Keep only the heads ``heads`` (all when None) of every map, in place; returns self."""
        if heads is not None:
            idx = sorted(resolve_layers(heads, n_heads, what="head"))
            for stack in self.maps.values():
                for i, w in stack.items():
                    stack[i] = w[:, idx]  # (B, len(heads), T, S)
        return self


def resolve_layers(layers: Collection[int] | bool | None, n_layers: int, top: int = 0,
                   what: str = "layer") -> set[int]:
    """``True`` (all), ``None``/``False`` (none) or indices as a checked set; indices are
    checked against ``top`` if deeper (of two stacks), and this stack keeps those it has.
    (``what``: "head" when these index heads.)"""
    if layers is None or layers is False:
        return set()
    if layers is True:
        return set(range(n_layers))
    chosen, top = set(), max(top, n_layers)
    for i in layers:
        if not -top <= i < top:
            raise ValueError(f"{what} index {i} is out of range: there are {top} {what}s "
                             f"(0..{top - 1})")
        chosen |= {i % n_layers} if -n_layers <= i < n_layers else set()
    return chosen


class Embeddings(nn.Module):
    """Token embedding (times sqrt(D) as in the paper, section 3.4) plus absolute positions."""

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.max_len = cfg.max_len
        kind = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}.get(cfg.pos)
        self.pos = kind(cfg.d_model, cfg.max_len) if kind else None  # rope: inside attention
        self.norm = make_norm(cfg) if cfg.embed_norm else None
        self.p_drop = cfg.dropout

    def forward(self, ids: Tensor, positions: Tensor | None = None, cache: KVCache | None = None,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """ids (B, T) -> embeddings (B, T, D) and their positions (T,) or (B, T) (rope needs
        them): ``positions`` if given (checked), else those after the cached tokens; rows padded
        per ``mask`` (B, T) (True at real tokens) count their real tokens from 0."""
        if ids.dim() != 2 or ids.dtype.is_floating_point:
            raise ValueError(f"ids must be (B, T) integer ids, got {tuple(ids.shape)} {ids.dtype}")
        t = ids.size(1)
        if positions is None:
            if mask is not None and cache is not None and cache.length == 0 and cache.pad is None:
                cache.pad = (mask.long().cumsum(1) == 0).sum(1)  # left-padded prefill: (B,)
            start, pad = (0, None) if cache is None else (cache.length, cache.pad)
            positions = padded_positions(start, t, pad, ids.device, max_len=self.max_len)
            if mask is not None and cache is None:
                positions = (mask.long().cumsum(1) - 1).clamp(min=0)  # (B, T)
        else:
            check_positions(positions, t, self.max_len)
        x = self.tok(ids)  # (B, T, D)
        if self.scale != 1.0:
            x = x * self.scale
        if self.pos is not None:
            x = x + self.pos(positions)  # out of place: never touches the caller's tensors
        if self.norm is not None:
            x = self.norm(x)
        if self.training and self.p_drop > 0:
            x = F.dropout(x, self.p_drop, training=True)
        return x, positions


class Encoder(nn.Module):
    """A stack of :class:`EncoderLayer` and, for pre-norm, a final norm."""

    def __init__(self, cfg: ModelConfig, n_layers: int | None = None):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(n_layers or cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.final_norm else None

    def forward(self, x: Tensor, mask: Tensor | None = None, *, positions: Tensor | None = None,
                capture: Collection[int] = ()) -> tuple[Tensor, dict[int, Tensor]]:
        """x (B, S, D); mask bool (B, 1, 1, S) or broadcastable -> (B, S, D), {layer: weights}."""
        maps = {}
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, positions=positions, need_weights=i in capture)
            if w is not None:
                maps[i] = w
        return (x if self.norm is None else self.norm(x)), maps


class Decoder(nn.Module):
    """A stack of :class:`DecoderLayer` (with cross-attention iff ``cross``) and a final norm."""

    def __init__(self, cfg: ModelConfig, n_layers: int | None = None, cross: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, cross) for _ in range(n_layers or cfg.n_decoder_layers))
        self.norm = make_norm(cfg) if cfg.final_norm else None

    def forward(self, x: Tensor, memory: Tensor | None = None, *, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, positions: Tensor | None = None,
                cache: KVCache | None = None, capture: Collection[int] = (), is_causal: bool = True,
                ) -> tuple[Tensor, dict[int, Tensor], dict[int, Tensor]]:
        """x (B, T, D), memory (B, S, D) -> (B, T, D), {layer: self weights}, {layer: cross}.

        ``is_causal=False`` lets every target position attend to every other (a plain
        ``nn.TransformerDecoder`` without ``tgt_mask``); language models keep the default."""
        self_maps, cross_maps = {}, {}
        for i, layer in enumerate(self.layers):
            x, ws, wc = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask,
                              is_causal=is_causal, positions=positions, cache=cache, layer=i,
                              need_weights=i in capture)
            if ws is not None:
                self_maps[i] = ws
            if wc is not None:
                cross_maps[i] = wc
        if cache is not None:
            cache.advance(x.size(1))
        return (x if self.norm is None else self.norm(x)), self_maps, cross_maps

    def new_cache(self, batch: int, max_len: int, device, dtype) -> KVCache:
        attn = self.layers[0].self_attn
        return KVCache(len(self.layers), batch, attn.n_heads, attn.head_dim, max_len,
                       device, dtype)


def check_positions(positions: Tensor, t: int, max_len: int) -> None:
    """Explicit positions must be (T,) or (B, T) integers in 0..max_len-1. (One host sync of
    two numbers, only for positions a caller passes: never in training or in KV-cache decoding,
    where positions are made here or by the cache.)"""
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


def key_mask(valid: Tensor | None) -> Tensor | None:
    """(B, S) bool of real tokens -> (B, 1, 1, S) attention mask."""
    return None if valid is None else valid[:, None, None, :]


def token_loss(logits: Tensor, targets: Tensor, pad_id: int | None = None,
               label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits (..., V) for targets (...); ``IGNORE_INDEX`` and ``pad_id``
    targets do not count. ``reduction="sum"``: the loop normalises over several micro-batches."""
    targets = targets.reshape(-1)
    if pad_id is not None:
        targets = targets.masked_fill(targets == pad_id, IGNORE_INDEX)
    return F.cross_entropy(upcast(logits.reshape(-1, logits.size(-1))), targets,
                           ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing,
                           reduction=reduction)


def init_weights(model: nn.Module, cfg: ModelConfig, n_layers: int) -> None:
    """GPT-2 style init: N(0, init_std) weights, zero biases, the projections that write into
    the residual stream (attention ``out_proj``, FFN ``w2``) scaled by 1/sqrt(2L) unless
    ``init_residual_scale`` is off; embeddings N(0, D^-1/2) when they are multiplied by sqrt(D).
    (1/sqrt(2L) keeps deep stacks stable; the small char model of ``shakespeare_char_cpu`` ends
    ~0.14 lower without it, at N(0, 0.06): benchmarks/README.md.)"""
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
