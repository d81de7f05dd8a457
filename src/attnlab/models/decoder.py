"""Decoder-only language model (GPT-like).

Shapes: B batch, T length, D d_model, H heads, V vocab.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn.attention import KVCache
from .common import (
    AttentionMaps,
    Decoder,
    Embeddings,
    check_positions,
    count_parameters,
    init_weights,
    key_mask,
    make_positions,
    resolve_layers,
    select_heads,
    token_loss,
)


class DecoderLM(nn.Module):
    """Token embeddings, a stack of causal self-attention blocks (no cross-attention), and a
    projection to the vocabulary that shares the embedding matrix (``tie_embeddings``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.family != "decoder":
            raise ValueError(f"DecoderLM needs family='decoder', got family={config.family!r}")
        self.config = config
        self.emb = Embeddings(config.vocab_size, config)
        self.decoder = Decoder(config, config.n_layers, cross=False)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_weights(self, config, config.n_layers)
        if config.tie_embeddings:
            self.lm_head.weight = self.emb.tok.weight  # (V, D), shared

    def _hidden(self, idx: Tensor, mask: Tensor | None, positions: Tensor | None,
                cache: KVCache | None, capture: Collection[int]):
        if positions is None:
            positions = make_positions(idx.size(1), cache, self.config.max_len, idx.device)
        else:
            check_positions(positions, idx.size(1), self.config.max_len)
        x = self.emb(idx, positions)  # (B, T, D)
        return self.decoder(x, self_mask=key_mask(mask), positions=positions, cache=cache,
                            capture=capture)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *, mask: Tensor | None = None,
                positions: Tensor | None = None, cache: KVCache | None = None,
                last_only: bool = False) -> tuple[Tensor, Tensor | None]:
        """Next-token logits and, given targets, the mean cross-entropy.

        Args:
            idx: (B, T) token ids.
            targets: (B, T) next-token ids; ``-100`` (and ``pad_id``) positions are ignored.
            mask: (B, S) bool, True at real tokens of the keys (left-padded prompts); S counts
                cached positions too.
            positions: (T,) or (B, T) absolute positions; default: after the cached ones.
            cache: a :class:`KVCache` from :meth:`new_cache` for step-by-step decoding.
            last_only: return the logits of the last position only, (B, 1, V).

        Returns:
            logits (B, T, V) and the loss (scalar) or None.
        """
        h, _, _ = self._hidden(idx, mask, positions, cache, ())
        if last_only and h.size(1) > 1:
            h = h[:, -1:]
        logits = self.lm_head(h)  # (B, T, V)
        loss = None if targets is None else token_loss(logits, targets, self.config.pad_id)
        return logits, loss

    def attention_maps(self, idx: Tensor, *, layers: Collection[int] | bool = True,
                       heads: Collection[int] | None = None, mask: Tensor | None = None,
                       ) -> AttentionMaps:
        """One forward pass that returns the self-attention weights of the chosen layers
        (``maps["decoder"][layer]``, (B, H, T, T)) and the logits; the other layers stay on
        the fused path."""
        chosen = resolve_layers(layers, self.config.n_layers)
        h, maps, _ = self._hidden(idx, mask, None, None, chosen)
        out = AttentionMaps({"decoder": maps}, self.lm_head(h))
        select_heads(out, heads, self.config.n_heads)
        return out

    def new_cache(self, batch: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        p = self.lm_head.weight
        return self.decoder.new_cache(batch, max_len or self.config.max_len, p.device,
                                      dtype or p.dtype)

    def num_parameters(self, by_component: bool = False) -> int | dict[str, int]:
        return count_parameters(self, by_component)
