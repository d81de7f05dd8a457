"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017).

Shapes: B batch, S source length, T target length (new tokens), T_total target keys (cached
+ new), D d_model, H heads, V target vocab.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..config import DEFAULT_LOSS, LossOptions, ModelConfig
from ..nn import (
    Decoder,
    Embeddings,
    Encoder,
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
    valid_tokens,
)


class Transformer(nn.Module):
    """Source and target embeddings (optionally one shared matrix), an encoder stack, a decoder
    stack whose cross-attention reads the encoder memory, and a projection ``head`` to the
    target vocabulary (optionally tied to the target embedding, paper section 3.4).

    Examples:
        >>> cfg = ModelConfig(family="encoder_decoder", vocab_size=9, d_model=8, n_heads=2)
        >>> Transformer(cfg)(Tensor([[1, 2, 3, 4]]).long(), Tensor([[5, 6]]).long())[0].shape
        torch.Size([1, 2, 9])"""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.family != "encoder_decoder":
            raise ValueError(f"Transformer needs family='encoder_decoder', "
                             f"got family={config.family!r}")
        self.config = config
        self.src_emb = Embeddings(config.vocab_size, config)
        self.tgt_emb = Embeddings(config.tgt_vocab_size, config)
        self.encoder = Encoder(config, config.n_layers)
        self.decoder = Decoder(config, config.n_decoder_layers, cross=True)
        self.head = nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        self.head_loss = projected_loss  # (h, head.weight, targets) -> loss; a slot
        init_weights(self, config, config.n_layers + config.n_decoder_layers)
        if config.share_embeddings:
            self.tgt_emb.tok.weight = self.src_emb.tok.weight
        if config.tie_embeddings:
            self.head.weight = self.tgt_emb.tok.weight  # (V, D)

    # ---- the two halves ---------------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, D). ``src_mask`` (B, S): True at real tokens."""
        return self.source_memory(src, valid=valid_tokens(src, self.config.pad_id, src_mask))

    def source_memory(self, src: Tensor, *, valid: Tensor | None) -> Tensor:
        """Memory (B, S, D) of ``src``; ``valid`` (B, S): True at real tokens (or None)."""
        check_ids(src)
        positions = token_positions(src, self.config.max_len)  # (S,)
        x = self.src_emb(src, positions)  # (B, S, D)
        return self.encoder(x, key_mask(valid), positions=positions)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None, *,
               tgt_mask: Tensor | None = None, cache: KVCache | None = None,
               positions: Tensor | None = None, last_only: bool = False) -> Tensor:
        """Next-token logits of the target ids given the encoder memory.

        Args:
            tgt: target ids. memory: :meth:`encode`'s output.
            src_mask: bool, True at real source tokens. tgt_mask: bool, True at real target
                keys (only needed for left padding); T_total counts cached positions too.
            cache: a :class:`KVCache` from ``decoder.new_cache`` holding the earlier steps.
            positions: absolute target positions; default: after the cached ones.
            last_only: the logits of the last position only.

        Shape:
            tgt (B, T); memory (B, S, D); src_mask (B, S); tgt_mask (B, T_total).

        Returns:
            logits (B, T, V), or (B, 1, V) with ``last_only``.
        """
        h = self.hidden(tgt, memory, src_valid=src_mask, tgt_valid=tgt_mask, cache=cache,
                        positions=positions)
        return self.head(h[:, -1:] if last_only else h)  # (B, T, V) or (B, 1, V)

    def hidden(self, tgt: Tensor, memory: Tensor, *, src_valid: Tensor | None,
               tgt_valid: Tensor | None = None, cache: KVCache | None = None,
               positions: Tensor | None = None) -> Tensor:
        """Decoder hidden states (B, T, D); with a ``cache``, this step's keys/values are
        added to it."""
        check_ids(tgt)
        if positions is None:  # left-padded targets count from their real tokens
            positions = token_positions(tgt, self.config.max_len, valid=tgt_valid, cache=cache)
        else:
            check_positions(positions, tgt.size(1), self.config.max_len)
        y = self.tgt_emb(tgt, positions)  # (B, T, D)
        h = self.decoder(y, memory, self_mask=key_mask(tgt_valid),
                         memory_mask=key_mask(src_valid), positions=positions, cache=cache)
        if cache is not None:
            cache.advance(tgt.size(1))
        return h  # (B, T, D)

    def forward(self, src: Tensor, tgt: Tensor, targets: Tensor | None = None, *,
                src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                loss: LossOptions = DEFAULT_LOSS) -> tuple[Tensor | None, Tensor | None]:
        """Teacher-forced logits and, given targets, their cross-entropy.

        Args:
            src: source ids. tgt: decoder inputs (``<bos> y1 .. y_{T-1}``).
            targets: next tokens (``y1 .. y_T``); pad and -100 positions are ignored.
            src_mask: bool, True at real tokens; default ``src != pad_id``.
            tgt_mask: bool for left-padded targets; right padding needs none (causal).
            loss: :class:`~attnlab.config.LossOptions`: label smoothing (the paper's 0.1),
                reduction, and ``loss_only`` (training), which returns None for the logits and
                the loss from ``self.head_loss`` (a slot: :func:`~attnlab.nn.projected_loss`,
                or the fused one training puts there) of the counted targets only: the head,
                the largest matrix product of a small model, is not run on target padding.

        Shape:
            src, src_mask (B, S); tgt, targets, tgt_mask (B, T).

        Returns:
            logits (B, T, V) or None, and the loss (scalar) or None.
        """
        src_valid = valid_tokens(src, self.config.pad_id, src_mask)
        memory = self.source_memory(src, valid=src_valid)  # (B, S, D)
        h = self.hidden(tgt, memory, src_valid=src_valid, tgt_valid=tgt_mask)  # (B, T, D)
        if loss_only(loss, targets):
            picked = counted(targets, self.config.pad_id)  # (B, T)
            return None, self.head_loss(h[picked], self.head.weight, targets[picked],
                                        label_smoothing=loss.label_smoothing,
                                        reduction=loss.reduction)
        logits = self.head(h)  # (B, T, V)
        return logits, None if targets is None else token_loss(
            logits, targets, self.config.pad_id, loss.label_smoothing, loss.reduction)

    def hook_sites(self) -> dict[str, tuple[Sites, str]]:
        """Every hook site by name: ``encoder.embed``, ``encoder.blocks.{i}.resid_post``,
        ``decoder.blocks.{i}.cross.pattern``, ... (see :func:`~attnlab.nn.stack_sites`; read
        and changed through :mod:`attnlab.interpret`)."""
        return (stack_sites("encoder.", self.src_emb, self.encoder)
                | stack_sites("decoder.", self.tgt_emb, self.decoder))
