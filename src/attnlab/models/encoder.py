"""Encoder-only models (BERT-like): a classifier, and a masked language model to pretrain it.

Shapes: B batch, S length, D d_model, H heads, C classes, V vocab, N masked positions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import DEFAULT_LOSS, LossOptions, ModelConfig
from ..nn import (
    Embeddings,
    Encoder,
    Sites,
    check_ids,
    counted,
    dropout,
    init_weights,
    key_mask,
    loss_only,
    stack_sites,
    token_loss,
    token_positions,
    valid_tokens,
)


class EncoderStack(nn.Module):
    """Embeddings and encoder stack of both encoder models, under the same weight names."""

    def __init__(self, config: ModelConfig, head: str):
        super().__init__()
        if (config.family, config.head) != ("encoder", head):
            raise ValueError(f"{type(self).__name__} needs family='encoder', head={head!r}, "
                             f"got {config.family!r}, {config.head!r}")
        self.config = config
        self.emb = Embeddings(config.vocab_size, config)
        self.encoder = Encoder(config, config.n_layers)

    def encode(self, ids: Tensor, *, valid: Tensor | None) -> Tensor:
        """Hidden states (B, S, D); ``valid`` (B, S): True at real tokens."""
        check_ids(ids)
        positions = token_positions(ids, self.config.max_len)  # (S,)
        x = self.emb(ids, positions)  # (B, S, D)
        return self.encoder(x, key_mask(valid), positions=positions)

    def hidden_states(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """Per-token final hidden states (B, S, D). ``mask`` (B, S): True at real tokens;
        by default every token that is not ``pad_id``."""
        return self.encode(ids, valid=valid_tokens(ids, self.config.pad_id, mask))

    def hook_sites(self) -> dict[str, tuple[Sites, str]]:
        """Every hook site by name: ``embed``, ``blocks.{i}.attn.pattern``, ... (see
        :func:`~attnlab.nn.stack_sites`; read and changed through :mod:`attnlab.interpret`)."""
        return stack_sites("", self.emb, self.encoder)


class EncoderClassifier(EncoderStack):
    """Embeddings, a bidirectional encoder stack, pooling ([CLS] = first token, the mean or
    the per-feature maximum over real tokens, or BERT's ``pooler``: tanh of a D x D linear map
    of [CLS]), dropout and a linear classification ``head``.

    Examples:
        >>> m = EncoderClassifier(ModelConfig(family="encoder", vocab_size=9, d_model=8, n_heads=2))
        >>> m(torch.tensor([[1, 2, 3]]), torch.tensor([1]))[0].shape  # class logits (B, C)
        torch.Size([1, 2])"""

    drop = staticmethod(dropout)  # the dropout kernel: a slot (see attnlab.nn)

    def __init__(self, config: ModelConfig):
        super().__init__(config, "classify")
        # BERT pretrains this map with next-sentence prediction; BertForSequenceClassification
        # reads its output, so converted checkpoints need it to give the same logits
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.pooling == "pooler" \
            else None
        self.head = nn.Linear(config.d_model, config.n_classes)
        init_weights(self, config, config.n_layers)

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
            pooled = self.drop(pooled, self.config.dropout)
        return self.head(pooled)  # (B, C)

    def forward(self, ids: Tensor, targets: Tensor | None = None, *, mask: Tensor | None = None,
                loss: LossOptions = DEFAULT_LOSS) -> tuple[Tensor | None, Tensor | None]:
        """Class logits and, given targets, the cross-entropy.

        Args:
            ids: token ids (with [CLS] first for cls and pooler pooling).
            targets: class indices in [0, n_classes).
            mask: bool, True at real tokens; default: ``ids != pad_id``.
            loss: :class:`~attnlab.config.LossOptions` (label smoothing, reduction;
                ``loss_only``: None for the logits).

        Shape:
            ids, mask (B, S); targets (B,).

        Returns:
            logits (B, C) or None, and the loss (scalar) or None.
        """
        mask = valid_tokens(ids, self.config.pad_id, mask)
        logits = self._logits(self.encode(ids, valid=mask), mask)  # (B, C)
        out = None if targets is None else token_loss(logits, targets, None,
                                                      loss.label_smoothing, loss.reduction)
        return (None if loss_only(loss, targets) else logits), out


class MaskedLM(EncoderStack):
    """BERT's pretraining (Devlin et al. 2019, 3.1): predict the original tokens at masked
    positions through a ``head`` tied to the embedding matrix, with a bias."""

    def __init__(self, config: ModelConfig):
        super().__init__(config, "mlm")
        self.head = nn.Linear(config.d_model, config.vocab_size)
        init_weights(self, config, config.n_layers)
        if config.tie_embeddings:
            self.head.weight = self.emb.tok.weight  # (V, D), shared

    def _logits(self, h: Tensor, mask: Tensor | None) -> Tensor:
        return self.head(h)  # (..., V)

    def forward(self, ids: Tensor, targets: Tensor | None = None, *, mask: Tensor | None = None,
                loss: LossOptions = DEFAULT_LOSS) -> tuple[Tensor | None, Tensor | None]:
        """Logits (B, S, V) of ``ids`` (B, S) and, given ``targets`` (B, S: the original ids at
        masked positions, else -100), the cross-entropy of those N positions; ``loss``:
        :class:`~attnlab.config.LossOptions` (``loss_only``, training: None for the logits, and
        the head run on the N positions only)."""
        h = self.hidden_states(ids, mask)  # (B, S, D)
        if loss_only(loss, targets):
            picked = counted(targets)  # (B, S)
            logits = self._logits(h[picked], None)  # (N, V)
            return None, token_loss(logits, targets[picked], None, loss.label_smoothing,
                                    loss.reduction)
        logits = self._logits(h, None)  # (B, S, V)
        return logits, None if targets is None else token_loss(
            logits, targets, None, loss.label_smoothing, loss.reduction)
