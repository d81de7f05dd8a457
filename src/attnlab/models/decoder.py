"""Decoder-only language model (GPT-like).

Shapes: B batch, T new tokens, S keys (cached + new), D d_model, H heads, V vocab.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..config import DEFAULT_LOSS, LossOptions, ModelConfig
from ..nn import (
    IGNORE_INDEX,
    Decoder,
    Embeddings,
    KVCache,
    Sites,
    check_ids,
    check_positions,
    counted,
    init_weights,
    key_mask,
    loss_only,
    projected_loss,
    stack_sites,
    token_loss,
    token_positions,
)


class DecoderLM(nn.Module):
    """Token embeddings, a stack of causal self-attention blocks (no cross-attention), and a
    projection ``head`` to the vocabulary that shares the embedding matrix
    (``tie_embeddings``).

    Examples:
        >>> m = DecoderLM(ModelConfig(family="decoder", vocab_size=9, d_model=8, n_heads=2))
        >>> m(Tensor([[1, 2, 3]]).long())[0].shape  # logits (B, T, V); no targets, no loss
        torch.Size([1, 3, 9])"""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.family != "decoder":
            raise ValueError(f"DecoderLM needs family='decoder', got family={config.family!r}")
        self.config = config
        self.emb = Embeddings(config.vocab_size, config)
        self.decoder = Decoder(config, config.n_layers, cross=False)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head_loss = projected_loss  # (h, head.weight, targets) -> loss; a slot
        init_weights(self, config, config.n_layers)
        if config.tie_embeddings:
            self.head.weight = self.emb.tok.weight  # (V, D), shared

    def hidden(self, ids: Tensor, *, mask: Tensor | None = None,
               positions: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Final hidden states (B, T, D) of ``ids``; with a ``cache``, this step's keys/values
        are added to it."""
        check_ids(ids)
        if positions is None:  # a left-padded prompt counts from its real tokens
            positions = token_positions(ids, self.config.max_len, valid=mask, cache=cache)
        else:
            check_positions(positions, ids.size(1), self.config.max_len)
        x = self.emb(ids, positions)  # (B, T, D)
        x = self.decoder(x, self_mask=key_mask(mask), positions=positions, cache=cache)
        if cache is not None:
            cache.advance(ids.size(1))
        return x  # (B, T, D)

    def forward(self, ids: Tensor, targets: Tensor | None = None, *, mask: Tensor | None = None,
                positions: Tensor | None = None, cache: KVCache | None = None,
                last_only: bool = False, loss: LossOptions = DEFAULT_LOSS,
                ) -> tuple[Tensor | None, Tensor | None]:
        """Next-token logits and, given targets, the cross-entropy.

        Args:
            ids: token ids.
            targets: next-token ids; ``-100`` (and ``pad_id``) positions are ignored.
            mask: bool, True at real tokens of the keys (left-padded prompts); S counts
                cached positions too.
            positions: absolute positions; default: after the cached ones.
            cache: a :class:`KVCache` from ``decoder.new_cache`` for step-by-step decoding.
            last_only: the logits of the last position only (decoding: no targets).
            loss: :class:`~attnlab.config.LossOptions`: label smoothing, reduction, and
                ``loss_only`` (training), which returns None for the logits and the loss from
                ``self.head_loss`` (a slot: :func:`~attnlab.nn.projected_loss`, or the fused one
                training puts there), so the (B, T, V) logits are never made whole.

        Shape:
            ids, targets (B, T); mask (B, S); positions (T,) or (B, T).

        Returns:
            logits (B, T, V) ((B, 1, V) with ``last_only``) or None, and the loss (scalar)
            or None.
        """
        if last_only and targets is not None:
            raise ValueError("last_only=True is for decoding and takes no targets: for a loss, "
                             "pass targets without last_only")
        h = self.hidden(ids, mask=mask, positions=positions, cache=cache)  # (B, T, D)
        if loss_only(loss, targets):  # training: no (B, T, V) logits (GPT-2's V = 50,257)
            ignored = targets.masked_fill(~counted(targets, self.config.pad_id), IGNORE_INDEX)
            return None, self.head_loss(h.flatten(0, 1), self.head.weight, ignored.flatten(),
                                        label_smoothing=loss.label_smoothing,
                                        reduction=loss.reduction)
        if last_only and h.size(1) > 1:
            h = h[:, -1:]  # (B, 1, D)
        logits = self.head(h)  # (B, T, V)
        return logits, None if targets is None else token_loss(
            logits, targets, self.config.pad_id, loss.label_smoothing, loss.reduction)

    def hook_sites(self) -> dict[str, tuple[Sites, str]]:
        """Every hook site by name: ``embed``, ``blocks.{i}.attn.pattern``, ... (see
        :func:`~attnlab.nn.stack_sites`; read and changed through :mod:`attnlab.interpret`)."""
        return stack_sites("", self.emb, self.decoder)
