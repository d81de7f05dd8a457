"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017).

Shapes: B batch, S source length, T target length (new tokens), T_total target keys (cached
+ new), D d_model, H heads, V target vocab.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn import (
    AttentionMaps,
    Decoder,
    Embeddings,
    Encoder,
    KVCache,
    check_ids,
    check_positions,
    count_parameters,
    counted,
    init_weights,
    key_mask,
    projected_loss,
    resolve_layers,
    token_loss,
    token_positions,
)


class Transformer(nn.Module):
    """Source and target embeddings (optionally one shared matrix), an encoder stack, a decoder
    stack whose cross-attention reads the encoder memory, and a projection ``head`` to the
    target vocabulary (optionally tied to the target embedding, paper section 3.4)."""

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

    def src_valid(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor | None:
        """(B, S) bool, True at real source tokens: ``src_mask`` or ``src != pad_id``."""
        if src_mask is None and self.config.pad_id is not None:
            src_mask = src != self.config.pad_id
        return src_mask

    # ---- the two halves ---------------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None, *,
               capture: Collection[int] = ()) -> Tensor:
        """Source ids (B, S) -> memory (B, S, D). ``src_mask`` (B, S): True at real tokens."""
        memory, _ = self.encode_with_maps(src, valid=self.src_valid(src, src_mask),
                                          capture=capture)
        return memory

    def encode_with_maps(self, src: Tensor, *, valid: Tensor | None,
                         capture: Collection[int] = ()) -> tuple[Tensor, dict[int, Tensor]]:
        """Memory (B, S, D) and the encoder weights (B, H, S, S) of the layers in ``capture``."""
        check_ids(src)
        positions = token_positions(src, self.config.max_len)  # (S,)
        x = self.src_emb(src, positions)  # (B, S, D)
        return self.encoder(x, key_mask(valid), positions=positions, capture=capture)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None, *,
               tgt_mask: Tensor | None = None, cache: KVCache | None = None,
               positions: Tensor | None = None, last_only: bool = False) -> Tensor:
        """Next-token logits of the target ids given the encoder memory.

        Args:
            tgt: target ids. memory: :meth:`encode`'s output.
            src_mask: bool, True at real source tokens. tgt_mask: bool, True at real target
                keys (only needed for left padding); T_total counts cached positions too.
            cache: a :class:`KVCache` from :meth:`new_cache` holding the earlier steps.
            positions: absolute target positions; default: after the cached ones.
            last_only: the logits of the last position only.

        Shape:
            tgt (B, T); memory (B, S, D); src_mask (B, S); tgt_mask (B, T_total).

        Returns:
            logits (B, T, V), or (B, 1, V) with ``last_only``.
        """
        h, _, _ = self.decode_with_maps(tgt, memory, src_valid=src_mask, tgt_valid=tgt_mask,
                                        cache=cache, positions=positions)
        return self.head(h[:, -1:] if last_only else h)  # (B, T, V) or (B, 1, V)

    def decode_with_maps(self, tgt: Tensor, memory: Tensor, *, src_valid: Tensor | None,
                         tgt_valid: Tensor | None = None, cache: KVCache | None = None,
                         positions: Tensor | None = None, capture: Collection[int] = (),
                         ) -> tuple[Tensor, dict[int, Tensor], dict[int, Tensor]]:
        """Decoder hidden states (B, T, D) and the self- and cross-attention weights of the
        layers in ``capture``; with a ``cache``, this step's keys/values are added to it."""
        check_ids(tgt)
        if positions is None:  # left-padded targets count from their real tokens
            positions = token_positions(tgt, self.config.max_len, valid=tgt_valid, cache=cache)
        else:
            check_positions(positions, tgt.size(1), self.config.max_len)
        y = self.tgt_emb(tgt, positions)  # (B, T, D)
        out = self.decoder(y, memory, self_mask=key_mask(tgt_valid),
                           memory_mask=key_mask(src_valid), positions=positions, cache=cache,
                           capture=capture)  # (B, T, D), {l: (B, H, T, T_total)}, {l: cross}
        if cache is not None:
            cache.advance(tgt.size(1))
        return out

    def forward(self, src: Tensor, tgt: Tensor, targets: Tensor | None = None, *,
                src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                label_smoothing: float = 0.0, reduction: str = "mean",
                return_logits: bool = True) -> tuple[Tensor | None, Tensor | None]:
        """Teacher-forced logits; given targets, only the counted positions' logits and
        their mean cross-entropy: the head (the largest matrix product of a small model)
        is not run on target padding.

        Args:
            src: source ids. tgt: decoder inputs (``<bos> y1 .. y_{T-1}``).
            targets: next tokens (``y1 .. y_T``); pad and -100 positions are ignored.
            src_mask: bool, True at real tokens; default ``src != pad_id``.
            tgt_mask: bool for left-padded targets; right padding needs none (causal).
            label_smoothing: of the loss (Szegedy et al. 2016; the paper's 0.1).
            reduction: ``"mean"`` over the counted targets, or ``"sum"``.
            return_logits: False: None and the loss, from ``self.head_loss`` (a slot:
                :func:`~attnlab.nn.projected_loss`, or the fused one training puts there).

        Shape:
            src, src_mask (B, S); tgt, targets, tgt_mask (B, T).

        Returns:
            logits (B, T, V) and None; given targets, logits (N, V) of the N counted
            positions (``logits[counted(targets, pad_id)]`` of the full pass) and the loss;
            None and the loss with ``return_logits=False``.
        """
        src_valid = self.src_valid(src, src_mask)
        memory, _ = self.encode_with_maps(src, valid=src_valid)  # (B, S, D)
        h, _, _ = self.decode_with_maps(tgt, memory, src_valid=src_valid, tgt_valid=tgt_mask)
        if targets is None:
            return self.head(h), None  # (B, T, V)
        picked = counted(targets, self.config.pad_id)  # (B, T)
        if not return_logits:  # the loss only (training): head_loss may be a fused one
            return None, self.head_loss(h[picked], self.head.weight, targets[picked],
                                        label_smoothing=label_smoothing, reduction=reduction)
        logits = self.head(h[picked])  # (N, V)
        return logits, token_loss(logits, targets[picked], label_smoothing=label_smoothing,
                                  reduction=reduction)

    def attention_maps(self, src: Tensor, tgt: Tensor, *, layers: Collection[int] | bool = True,
                       heads: Collection[int] | None = None, src_mask: Tensor | None = None,
                       ) -> AttentionMaps:
        """Encoder self-attention (``maps["encoder"]``, (B, H, S, S)), decoder self-attention
        (``maps["decoder"]``, (B, H, T, T)) and cross-attention (``maps["cross"]``,
        (B, H, T, S)) of the chosen layers, from one forward pass."""
        cfg = self.config
        src_valid = self.src_valid(src, src_mask)
        top = max(cfg.n_layers, cfg.n_decoder_layers)  # an index one stack lacks: the other's only
        memory, enc_maps = self.encode_with_maps(
            src, valid=src_valid, capture=resolve_layers(layers, cfg.n_layers, top))
        h, self_maps, cross_maps = self.decode_with_maps(
            tgt, memory, src_valid=src_valid,
            capture=resolve_layers(layers, cfg.n_decoder_layers, top))
        out = AttentionMaps({"encoder": enc_maps, "decoder": self_maps, "cross": cross_maps},
                            self.head(h))
        return out.keep_heads(heads, cfg.n_heads)

    def new_cache(self, batch: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` rows of up to ``max_len`` target positions."""
        p = self.tgt_emb.tok.weight  # not the head's: inference may replace the head
        return self.decoder.new_cache(batch, max_len or self.config.max_len, p.device,
                                      dtype or p.dtype)

    num_parameters = count_parameters  # (by_component=False): the total, or a dict by part
