"""Encoder-only classifier (BERT-like).

Shapes: B batch, S length, D d_model, H heads, C classes.
"""

from __future__ import annotations

from collections.abc import Collection

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
    make_positions,
    resolve_layers,
    select_heads,
)


class EncoderClassifier(nn.Module):
    """Embeddings, a bidirectional encoder stack, pooling ([CLS] = first token, or the mean over
    real tokens) and a linear classification head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.family != "encoder":
            raise ValueError(
                f"EncoderClassifier needs family='encoder', got family={config.family!r}"
            )
        self.config = config
        self.emb = Embeddings(config.vocab_size, config)
        self.encoder = Encoder(config, config.n_layers)
        self.head = nn.Sequential(nn.Dropout(config.dropout),
                                  nn.Linear(config.d_model, config.n_classes))
        init_weights(self, config, config.n_layers)

    def _valid(self, ids: Tensor, mask: Tensor | None) -> Tensor | None:
        if mask is None and self.config.pad_id is not None:
            mask = ids != self.config.pad_id  # (B, S)
        return mask

    def _encode(self, ids: Tensor, mask: Tensor | None, capture: Collection[int] = ()):
        positions = make_positions(ids.size(1), None, self.config.max_len, ids.device)
        x = self.emb(ids, positions)  # (B, S, D)
        return self.encoder(x, key_mask(mask), positions=positions, capture=capture)

    def hidden_states(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """Per-token final hidden states (B, S, D). ``mask`` (B, S): True at real tokens;
        by default every token that is not ``pad_id``."""
        h, _ = self._encode(ids, self._valid(ids, mask))
        return h

    def pool(self, h: Tensor, mask: Tensor | None) -> Tensor:
        """(B, S, D) -> (B, D): the first ([CLS]) token, or the mean over real tokens."""
        if self.config.pooling == "cls":
            return h[:, 0]
        if mask is None:
            return h.mean(dim=1)
        m = mask.unsqueeze(-1).to(h.dtype)  # (B, S, 1)
        return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)

    def forward(self, ids: Tensor, labels: Tensor | None = None, *,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Class logits (B, C) and, given labels (B,), the mean cross-entropy.

        Args:
            ids: (B, S) token ids (with [CLS] first for cls pooling).
            labels: (B,) class indices in [0, n_classes).
            mask: (B, S) bool, True at real tokens; default: ``ids != pad_id``.
        """
        mask = self._valid(ids, mask)
        h, _ = self._encode(ids, mask)
        logits = self.head(self.pool(h, mask))  # (B, C)
        loss = None if labels is None else nn.functional.cross_entropy(upcast(logits), labels)
        return logits, loss

    def attention_maps(self, ids: Tensor, *, layers: Collection[int] | bool = True,
                       heads: Collection[int] | None = None,
                       mask: Tensor | None = None) -> AttentionMaps:
        """Self-attention weights of the chosen layers (``maps["encoder"][l]``: (B, H, S, S))
        and the class logits, from one forward pass."""
        mask = self._valid(ids, mask)
        h, maps = self._encode(ids, mask, resolve_layers(layers, self.config.n_layers))
        out = AttentionMaps({"encoder": maps}, self.head(self.pool(h, mask)))
        select_heads(out, heads, self.config.n_heads)
        return out

    def num_parameters(self, by_component: bool = False) -> int | dict[str, int]:
        return count_parameters(self, by_component)


