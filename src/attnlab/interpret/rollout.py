"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"): how
much each position's final state draws on each input token, if every layer mixed its input
only through its attention weights and the residual connection.

One layer's mixing matrix is ``M = norm(0.5 A + 0.5 I)``: ``A`` (B, T, S) the attention
weights fused over the heads (their mean by default), ``I`` the residual connection, ``norm``
rows scaled to sum to 1. A stack's rollout is the product from the first layer to the last,
``R = M_L ... M_2 M_1``: row ``i`` of ``R`` is a distribution over the input tokens.

Padding: the columns of padded keys (the model's mask) and the rows of padded queries are set
to zero in every ``M`` before the rows are renormalised, so padding gets zero everywhere, as a
source of the other rows and as a row of its own (a real row never reads padding: its weights
there are 0 already, and so the masking changes none of its numbers).

The encoder-decoder's cross rollout (B, T, S) follows the same bookkeeping through the
decoder. Write the decoder state at target position ``i`` as a mixture of the target tokens
(``D_T``, (B, T, T)) and the source tokens (``D_S``, (B, T, S)); the embeddings start it at
``D_T = I``, ``D_S = 0``. Per decoder layer ``l``:

1. self-attention mixes the target positions' states, each already a mixture:
   ``D_T <- M_l D_T``, ``D_S <- M_l D_S`` (``M_l`` the decoder self-attention matrix above);
2. cross-attention adds, with the residual's weight 0.5 against the state's 0.5, the memory
   rows it reads, each of which is the encoder's final state, a mixture of the source tokens
   given by the encoder rollout ``R_enc`` (B, S, S):
   ``D_S <- 0.5 D_S + 0.5 C_l R_enc``, ``D_T <- 0.5 D_T`` (``C_l`` the cross-attention
   weights fused over heads, rows renormalised over the real source tokens).

The cross rollout is ``D_S``: each row sums to the share of the source in that final state
(``D_T``'s row sum is the rest: ``[D_T | D_S]`` rows sum to 1); divide by the row sum for a
distribution over source tokens. This is Abnar & Zuidema's rule, with the 0.5 / 0.5 residual
at every sub-layer, carried through the cross-attention the way Chefer et al. 2021 ("Generic
Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers",
eq. 10-11) carry relevance: target-to-source relevance is the decoder self-attention's mixing
applied to it, plus the cross-attention times the encoder's self relevance; here
multiplicative, with attention weights alone (no gradients).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UsageError
from ..nn import valid_tokens
from .hooks import attention_maps

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(weights: Tensor, head_fusion: str) -> Tensor:
    """(B, H, T, S) attention weights -> (B, T, S): the mean, max or min over the heads."""
    if head_fusion == "mean":
        return weights.mean(dim=1)
    if head_fusion == "max":
        return weights.amax(dim=1)
    return weights.amin(dim=1)


def renormalise(m: Tensor, keys: Tensor | None, queries: Tensor | None = None) -> Tensor:
    """(B, T, S) with the columns of padded keys (``keys`` (B, S) False) and the rows of padded
    queries (``queries`` (B, T) False) set to zero, the other rows scaled to sum to 1 (a row
    left all zero stays zero)."""
    if keys is not None:
        m = m * keys[:, None, :].to(m.dtype)
    if queries is not None:
        m = m * queries[:, :, None].to(m.dtype)
    total = m.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, m / total.clamp_min(torch.finfo(m.dtype).tiny), m)


def residual_mix(a: Tensor, valid: Tensor | None) -> Tensor:
    """One self-attention layer's mixing matrix ``norm(0.5 A + 0.5 I)``: (B, T, T)."""
    eye = torch.eye(a.size(-1), dtype=a.dtype, device=a.device)
    return renormalise(0.5 * a + 0.5 * eye, valid, valid)


def stack_rollout(layers: list[Tensor], valid: Tensor | None) -> Tensor:
    """``M_L ... M_1`` of the fused (B, T, T) weights of one stack, first layer first."""
    out = None
    for a in layers:
        m = residual_mix(a, valid)
        out = m if out is None else m @ out
    return out


def cross_rollout(self_layers: list[Tensor], cross_layers: list[Tensor], encoder: Tensor,
                  tgt_valid: Tensor | None, src_valid: Tensor | None) -> Tensor:
    """``D_S`` (B, T, S) of the module docstring: the decoder's fused self-attention and
    cross-attention weights per layer ((B, T, T), (B, T, S)) and the encoder rollout (B, S, S)."""
    b, t, s = cross_layers[0].shape
    d_s = encoder.new_zeros(b, t, s)
    for a, c in zip(self_layers, cross_layers, strict=True):
        d_s = residual_mix(a, tgt_valid) @ d_s
        d_s = 0.5 * d_s + 0.5 * renormalise(c, src_valid, tgt_valid) @ encoder
    return d_s


def valid_keys(model: nn.Module, inputs: tuple[Tensor, ...],
               kwargs: dict[str, Any]) -> dict[str, Tensor | None]:
    """The (B, S) bool of real keys per stack ("encoder", "decoder"), as the model masks them:
    ``mask=`` (the encoder's default: ``ids != pad_id``), ``src_mask=`` / ``tgt_mask=``."""
    cfg = model.config
    if cfg.family == "encoder_decoder":
        return {"encoder": valid_tokens(inputs[0], cfg.pad_id, kwargs.get("src_mask")),
                "decoder": kwargs.get("tgt_mask")}
    mask = kwargs.get("mask")
    if cfg.family == "encoder":
        mask = valid_tokens(inputs[0], cfg.pad_id, mask)
    return {cfg.family: mask}


def attention_rollout(model: nn.Module, *inputs: Tensor, head_fusion: str = "mean",
                      **kwargs: Any) -> dict[str, Tensor]:
    """Attention rollout of one forward pass ``model(*inputs, **kwargs)`` (``ids``, with
    ``mask=``; ``src, tgt`` with ``src_mask=`` / ``tgt_mask=`` for the encoder-decoder), by
    stack: "encoder" (B, S, S), "decoder" (B, T, T) (self-attention), and for the
    encoder-decoder "cross" (B, T, S): how much each target position's final state draws on
    each source token. The rule, padding included, is in the module docstring.

    ``head_fusion``: how the heads of a layer are combined: "mean" (Abnar & Zuidema's),
    "max" or "min".
    """
    if head_fusion not in HEAD_FUSIONS:
        raise UsageError(f"head_fusion={head_fusion!r} is not known: use one of "
                         f"{', '.join(map(repr, HEAD_FUSIONS))}")
    if not inputs:
        raise UsageError("attention_rollout needs the model's inputs: ids (src, tgt for the "
                         "encoder-decoder)")
    with torch.no_grad():
        maps = attention_maps(model, *inputs, **kwargs)
        valid = valid_keys(model, inputs, kwargs)
        fused = {stack: [fuse_heads(w.float(), head_fusion) for _, w in sorted(by.items())]
                 for stack, by in maps.items()}
        out = {stack: stack_rollout(fused[stack], valid[stack])
               for stack in fused if stack != "cross"}
        if "cross" in fused:
            out["cross"] = cross_rollout(fused["decoder"], fused["cross"], out["encoder"],
                                         valid["decoder"], valid["encoder"])
    return out
