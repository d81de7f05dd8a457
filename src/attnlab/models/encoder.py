"""Encoder-only classifier (BERT-like).

Shapes: B batch, S length, D d_model, H heads, C classes.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn.dtypes import upcast
from .common import (
    AttentionMaps,
    Embeddings,
    Encoder,
    count_parameters,
    init_weights,
    key_mask,
    resolve_layers,
)


class EncoderClassifier(nn.Module):
    """Embeddings, a bidirectional encoder stack, pooling ([CLS] = first token, the mean or
    the per-feature maximum over real tokens, or BERT's ``pooler``: tanh of a D x D linear map
    of [CLS]), dropout and a linear classification ``head``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.family != "encoder":
            raise ValueError(
                f"EncoderClassifier needs family='encoder', got family={config.family!r}"
            )
        self.config = config
        self.emb = Embeddings(config.vocab_size, config)
        self.encoder = Encoder(config, config.n_layers)
        # BERT pretrains this map with next-sentence prediction; BertForSequenceClassification
        # reads its output, so converted checkpoints need it to give the same logits
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.pooling == "pooler" \
            else None
        self.head = nn.Linear(config.d_model, config.n_classes)
        init_weights(self, config, config.n_layers)

    def _valid(self, ids: Tensor, mask: Tensor | None) -> Tensor | None:
        if mask is None and self.config.pad_id is not None:
            mask = ids != self.config.pad_id  # (B, S)
        return mask

    def _encode(self, ids: Tensor, mask: Tensor | None, capture: Collection[int] = ()):
        x, positions = self.emb(ids)  # (B, S, D), (S,)
        return self.encoder(x, key_mask(mask), positions=positions, capture=capture)

    def hidden_states(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """Per-token final hidden states (B, S, D). ``mask`` (B, S): True at real tokens;
        by default every token that is not ``pad_id``."""
        h, _ = self._encode(ids, self._valid(ids, mask))
        return h

    def pool(self, h: Tensor, mask: Tensor | None) -> Tensor:
        """(B, S, D) -> (B, D): the first ([CLS]) token, the mean or the maximum over real
        tokens, or ``tanh(pooler(first token))``."""
        if self.pooler is not None:
            return torch.tanh(self.pooler(h[:, 0]))  # (B, D)
        if self.config.pooling == "cls":
            return h[:, 0]
        if self.config.pooling == "max":
            if mask is None:
                return h.amax(dim=1)
            # padding never wins; a row without real tokens pools to zeros, as mean does
            lowest = torch.finfo(h.dtype).min
            pooled = h.masked_fill(~mask.unsqueeze(-1), lowest).amax(dim=1)  # (B, D)
            return pooled.masked_fill(~mask.any(dim=1, keepdim=True), 0.0)
        if mask is None:
            return h.mean(dim=1)
        m = mask.unsqueeze(-1).to(h.dtype)  # (B, S, 1)
        return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # (B, D)

    def _logits(self, h: Tensor, mask: Tensor | None) -> Tensor:
        pooled = self.pool(h, mask)  # (B, D)
        if self.training and self.config.dropout > 0:
            pooled = F.dropout(pooled, self.config.dropout, training=True)
        return self.head(pooled)  # (B, C)

    def forward(self, ids: Tensor, labels: Tensor | None = None, *,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Class logits and, given labels, the mean cross-entropy.

        Args:
            ids: token ids (with [CLS] first for cls and pooler pooling).
            labels: class indices in [0, n_classes).
            mask: bool, True at real tokens; default: ``ids != pad_id``.

        Shape:
            ids, mask (B, S); labels (B,).

        Returns:
            logits (B, C) and the loss (scalar) or None.
        """
        mask = self._valid(ids, mask)
        h, _ = self._encode(ids, mask)  # (B, S, D)
        logits = self._logits(h, mask)  # (B, C)
        loss = None if labels is None else F.cross_entropy(upcast(logits), labels)
        return logits, loss

    def attention_maps(self, ids: Tensor, *, layers: Collection[int] | bool = True,
                       heads: Collection[int] | None = None,
                       mask: Tensor | None = None) -> AttentionMaps:
        """Self-attention weights of the chosen layers (``maps["encoder"][l]``: (B, H, S, S))
        and the class logits, from one forward pass."""
        mask = self._valid(ids, mask)
        h, maps = self._encode(ids, mask, resolve_layers(layers, self.config.n_layers))
        out = AttentionMaps({"encoder": maps}, self._logits(h, mask))
        return out.keep_heads(heads, self.config.n_heads)

    def num_parameters(self, by_component: bool = False) -> int | dict[str, int]:
        return count_parameters(self, by_component)
