"""Reading the residual stream in the vocabulary: the logit lens and direct logit attribution.

Both read the stream that the language-model head reads: a DecoderLM's decoder, a MaskedLM's
encoder, the encoder-decoder's decoder (``src=`` gives its source). Shapes: R rows of the lens
(the embeddings, then each block's output), L layers, H heads, B batch, T positions, D width,
V vocabulary. The analyses' own axes come first and the batch after them: nothing is averaged
over the batch except the lens's loss.

    lens = logit_lens(model, ids)                    # lens.top_ids: (R, B, T, k)
    lens.layers                                      # ["blocks.0.resid_pre", ...resid_post]
    attr = direct_logit_attribution(model, ids, token=tok.encode(" Paris")[0])
    attr.heads                                       # (L, H, B): each head's share of the logit
    attr.total()                                     # == attr.logit, the model's own logit

Both run one forward pass in eval mode without gradients (and put the model's mode back).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import UsageError
from ..models import DecoderLM, MaskedLM, Transformer
from ..nn import IGNORE_INDEX, RMSNorm, counted
from .hooks import ActivationCache, check_index, hooks

LM_MODELS = (DecoderLM, MaskedLM, Transformer)  # the families with a language-model head


# ---- what the head reads --------------------------------------------------------------------
def lm_stack(model: nn.Module, analysis: str) -> tuple[str, nn.Module]:
    """The stack the LM head reads: its site prefix ("" or "decoder.") and the stack module
    (its ``norm`` is the final norm, None for post-norm)."""
    if not isinstance(model, LM_MODELS):
        raise UsageError(f"the {analysis} needs a language-model head (DecoderLM, MaskedLM or "
                         f"the encoder-decoder Transformer); {type(model).__name__} has none")
    if isinstance(model, Transformer):
        return "decoder.", model.decoder
    return "", model.encoder if isinstance(model, MaskedLM) else model.decoder


def check_token_ids(ids: object, vocab: int, name: str) -> None:
    """``ids`` must be a (B, T) integer tensor of ids in 0..vocab-1."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point \
            or ids.dtype == torch.bool:
        got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise UsageError(f"{name} must be a (B, T) tensor of integer token ids, got {got}")
    bad = ids[(ids < 0) | (ids >= vocab)]
    if bad.numel():
        raise UsageError(f"{name} holds token id {int(bad[0])}, out of the vocabulary: "
                         f"ids are 0..{vocab - 1}")


def check_token(token: object, vocab: int, name: str) -> int:
    """One token id (an int) in 0..vocab-1."""
    try:
        value = operator.index(token)
    except TypeError:
        raise UsageError(f"{name} must be one token id (an int in 0..{vocab - 1}), "
                         f"got {type(token).__name__}") from None
    if not 0 <= value < vocab:
        raise UsageError(f"{name}={value} is out of the vocabulary: token ids are "
                         f"0..{vocab - 1}")
    return value


def forward_cached(model: nn.Module, ids: Tensor, src: Tensor | None,
                   names: list[str]) -> tuple[Tensor, ActivationCache]:
    """The logits (B, T, V) of one forward of ``ids`` (the encoder-decoder: ``src``, ``ids``)
    in eval mode, without gradients, and the cache of the sites ``names``."""
    cfg = model.config
    check_token_ids(ids, model.head.out_features, "ids")
    if isinstance(model, Transformer):
        if src is None:
            raise UsageError("the encoder-decoder needs src= (the source ids, (B, S)) as well "
                             "as ids (the decoder input, (B, T))")
        check_token_ids(src, cfg.vocab_size, "src")
        if src.size(0) != ids.size(0):
            raise UsageError(f"src has {src.size(0)} rows but ids has {ids.size(0)}: one "
                             "source per decoder input")
        inputs = (src, ids)
    elif src is not None:
        raise UsageError(f"src= is for the encoder-decoder only; a {type(model).__name__} "
                         "reads ids alone")
    else:
        inputs = (ids,)
    for name, x in zip(("src", "ids") if src is not None else ("ids",), inputs):
        if x.size(1) > cfg.max_len:
            raise UsageError(f"{name} has {x.size(1)} positions; the model takes at most "
                             f"max_len={cfg.max_len}")
    was_training = model.training
    model.eval()  # dropout off: the lens reads the model's real forward
    try:
        with torch.no_grad(), hooks(model, cache=names) as cache:
            logits = model(*inputs)[0]  # (B, T, V)
    finally:
        model.train(was_training)
    return logits, cache


# ---- the logit lens -------------------------------------------------------------------------
@dataclass
class LogitLens:
    """The next-token distribution read from the residual stream after every layer.

    Row 0 is the embeddings (``blocks.0.resid_pre``), row i + 1 the output of block i
    (``blocks.{i}.resid_post``; with ``layers=``, only those outputs); the last block's row
    is the model's own output. Each row is read as the head reads the final stream: through
    the final norm (none in a post-norm model, whose stream is normed inside every block) and
    the head (its bias included).

    Fields (R rows, B batch, T positions, V vocabulary, k top tokens):
        layers: the R rows' site names (with ``decoder.`` in the encoder-decoder).
        logits: (R, B, T, V) the lens logits.
        top_ids, top_probs: (R, B, T, k) the k most likely tokens of each row and position,
            most likely first, and their probabilities.
        targets: (B, T) the targets read (``IGNORE_INDEX`` = -100 where none), or None.
        target_prob: (R, B, T) the target's probability (NaN where there is no target).
        target_rank: (R, B, T) the target's rank, 0 = the top token (-1 where no target).
        loss: (R,) the mean cross-entropy of each row over the batch's counted targets
            (NaN if none counts).
    """

    layers: list[str]
    logits: Tensor
    top_ids: Tensor
    top_probs: Tensor
    targets: Tensor | None
    target_prob: Tensor | None
    target_rank: Tensor | None
    loss: Tensor | None


def lens_targets(model: nn.Module, ids: Tensor, targets: Tensor | bool | None) -> Tensor | None:
    """The (B, T) targets the lens scores: ``targets`` checked, None for ``False``, or by
    default the next token (decoders; the last position has none) or the token itself
    (MaskedLM: what its head predicts at each position)."""
    if targets is False:
        return None
    vocab = model.head.out_features
    if targets is None or targets is True:
        if isinstance(model, MaskedLM):
            return ids.clone()
        shifted = torch.full_like(ids, IGNORE_INDEX)
        shifted[:, :-1] = ids[:, 1:]
        return shifted
    if not isinstance(targets, Tensor) or targets.shape != ids.shape:
        got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
        raise UsageError(f"targets must be a tensor shaped like ids {tuple(ids.shape)} "
                         f"(-100 where none), got {got}")
    check_token_ids(targets.masked_fill(targets == IGNORE_INDEX, 0), vocab, "targets")
    return targets


def score_targets(logits: Tensor, targets: Tensor,
                  pad_id: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """Logits (R, B, T, V) and targets (B, T) -> each target's probability and rank
    (R, B, T; NaN and -1 where none counts) and each row's mean cross-entropy (R,)."""
    keep = counted(targets, pad_id)  # (B, T)
    index = targets.masked_fill(~keep, 0)[None, :, :, None].expand(logits.size(0), -1, -1, 1)
    target_logit = logits.gather(-1, index)  # (R, B, T, 1)
    nll = (logits.logsumexp(-1, keepdim=True) - target_logit).squeeze(-1)  # (R, B, T)
    rank = (logits > target_logit).sum(-1)  # (R, B, T): tokens strictly more likely
    loss = (nll * keep).sum((1, 2)) / keep.sum()  # (R,)
    prob = torch.exp(-nll).masked_fill(~keep, float("nan"))
    return prob, rank.masked_fill(~keep, -1), loss


def logit_lens(model: nn.Module, ids: Tensor, *, targets: Tensor | bool | None = None,
               k: int = 5, src: Tensor | None = None,
               layers: Collection[int] | None = None) -> LogitLens:
    """The logit lens: every layer's residual stream read through the final norm and the head.

    Args:
        model: a DecoderLM, MaskedLM or encoder-decoder Transformer (its decoder is read).
        ids: (B, T) token ids (the encoder-decoder: the decoder input).
        targets: (B, T) ids to score (-100: none); default the next token for the decoders
            (the last position has none), the token itself for a MaskedLM; False: none
            (``target_prob``, ``target_rank`` and ``loss`` are then None).
        k: how many top tokens to keep per row and position (1..V).
        src: (B, S) source ids, for the encoder-decoder only.
        layers: only the outputs of these blocks (no embeddings row); default every row.

    Returns:
        :class:`LogitLens` (its tensors keep the batch: (R, B, T, ...); ``logits`` is the
        whole (R, B, T, V), so mind R * B * T * V floats for a large vocabulary).
    """
    prefix, stack = lm_stack(model, "logit lens")
    vocab = model.head.out_features
    if not isinstance(k, int) or not 1 <= k <= vocab:
        raise UsageError(f"k={k!r} must be an int in 1..{vocab} (the vocabulary size)")
    if layers is None:
        rows = [f"{prefix}blocks.0.resid_pre"] + [f"{prefix}blocks.{i}.resid_post"
                                                  for i in range(len(stack.layers))]
    else:
        check_index(layers, len(stack.layers), "layer", "the stack the head reads")
        rows = [f"{prefix}blocks.{i}.resid_post" for i in sorted(set(layers))]
    check_token_ids(ids, vocab, "ids")
    goal = lens_targets(model, ids, targets)  # bad targets fail before the forward
    _, cache = forward_cached(model, ids, src, rows)
    with torch.no_grad():
        resid = torch.stack([cache[n] for n in rows])  # (R, B, T, D)
        logits = model.head(resid if stack.norm is None else stack.norm(resid))  # (R, B, T, V)
        top_probs, top_ids = logits.softmax(-1).topk(k, dim=-1)  # (R, B, T, k)
        scored = (None,) * 3 if goal is None else score_targets(logits, goal, model.config.pad_id)
    return LogitLens(rows, logits, top_ids, top_probs, goal, *scored)


# ---- direct logit attribution ---------------------------------------------------------------
@dataclass
class Attribution:
    """Each component's direct share of one logit (or logit difference) at one position.

    The final residual stream is a sum of writes: the embeddings, each head's (its ``z`` times
    its columns of ``out_proj``), each feed-forward block's (bias included), and the output
    projections' biases. Each write's share is what it adds to the logit when read through the
    final norm with the scale frozen at the real forward's: centred (LayerNorm; not RMSNorm),
    divided by that scale, times the norm weight, dotted with the head's row of ``token``
    (minus ``other``'s). The shares sum to the model's logit (difference): ``total()`` equals
    ``logit``.

    Fields (L layers, H heads, B batch; the batch last):
        token, other: the token ids (``other`` None: the logit itself).
        position: the position read (0..T-1).
        embed: (B,) the embeddings' share (token and position embeddings: ``resid_pre`` of
            block 0).
        heads: (L, H, B) each self-attention head's share.
        cross_heads: (L, H, B) each cross-attention head's (the encoder-decoder; else None).
        ffn: (L, B) each feed-forward block's (zero for attention-only blocks).
        bias: (B,) the biases': the attention output projections', the final norm's and the
            head's.
        logit: (B,) the model's own logit (difference) at ``position``.
    """

    token: int
    other: int | None
    position: int
    embed: Tensor
    heads: Tensor
    cross_heads: Tensor | None
    ffn: Tensor
    bias: Tensor
    logit: Tensor

    def total(self) -> Tensor:
        """(B,) the sum of every share: the logit (difference) again, up to rounding."""
        cross = 0 if self.cross_heads is None else self.cross_heads.sum((0, 1))
        return self.embed + self.heads.sum((0, 1)) + cross + self.ffn.sum(0) + self.bias


def frozen_readout(norm: nn.Module | None, final: Tensor,
                   direction: Tensor) -> Callable[[Tensor], Tensor]:
    """The logit share of a write into the stream: (..., B, D) -> (..., B), read through
    ``norm`` with the scale of the real final stream ``final`` (B, D), frozen so that the
    shares add up (the norm is not linear, its frozen version is), then ``direction`` (D,)."""
    if norm is None:  # no final norm: the head reads the stream itself
        return lambda write: write @ direction
    centre = not isinstance(norm, RMSNorm)  # LayerNorm subtracts the mean; RMSNorm does not
    x = final - final.mean(-1, keepdim=True) if centre else final
    scale = (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()  # (B, 1)
    weighted = norm.weight * direction  # (D,)

    def read(write: Tensor) -> Tensor:
        if centre:
            write = write - write.mean(-1, keepdim=True)
        return (write / scale) @ weighted
    return read


def head_shares(attn: nn.Module, z: Tensor, read: Callable[[Tensor], Tensor]) -> Tensor:
    """Each head's share (H, B) from its output ``z`` (B, H, Dh) at the position: head h
    writes z_h times columns h*Dh:(h+1)*Dh of ``out_proj.weight`` (D, H*Dh)."""
    w = attn.out_proj.weight.view(-1, attn.n_heads, attn.head_dim)  # (D, H, Dh)
    return read(torch.einsum("bhe,dhe->hbd", z, w))  # (H, B)


def bias_share(attns: list[nn.Module], norm: nn.Module | None, head: nn.Linear, token: int,
               other: int | None, read: Callable[[Tensor], Tensor], batch: int) -> Tensor:
    """(B,) the biases' share: each attention output projection's bias read through the
    frozen norm, plus the final norm's bias and the head's bias, which add to the logit as
    they are."""
    total = torch.zeros(batch, device=head.weight.device, dtype=head.weight.dtype)
    for attn in attns:
        if attn.out_proj.bias is not None:
            total = total + read(attn.out_proj.bias.expand(batch, -1))
    direction = head.weight[token] - (0 if other is None else head.weight[other])
    if norm is not None and getattr(norm, "bias", None) is not None:
        total = total + norm.bias @ direction
    if head.bias is not None:
        total = total + head.bias[token] - (0 if other is None else head.bias[other])
    return total


def direct_logit_attribution(model: nn.Module, ids: Tensor, *, token: int,
                             other: int | None = None, position: int = -1,
                             src: Tensor | None = None) -> Attribution:
    """Each head's, feed-forward block's, the embeddings' and the biases' direct share of the
    logit of ``token`` (minus that of ``other``) at ``position``, TransformerLens-style.

    Args:
        model: a pre-norm DecoderLM, MaskedLM or encoder-decoder Transformer.
        ids: (B, T) token ids (the encoder-decoder: the decoder input).
        token, other: token ids in 0..V-1; with ``other``, the logit difference.
        position: the position read, -T..T-1.
        src: (B, S) source ids, for the encoder-decoder only.

    Returns:
        :class:`Attribution`, whose shares sum to the model's logit (difference).
    """
    prefix, stack = lm_stack(model, "direct logit attribution")
    if model.config.norm != "pre":
        raise UsageError("direct logit attribution needs a pre-norm model (norm='pre'): in a "
                         "post-norm model a norm inside every block mixes the writes, so the "
                         f"logit is no sum of them; this model has norm={model.config.norm!r}")
    vocab = model.head.out_features
    check_token_ids(ids, vocab, "ids")
    token = check_token(token, vocab, "token")
    other = None if other is None else check_token(other, vocab, "other")
    t = ids.size(1)
    if isinstance(position, bool) or not isinstance(position, int) or not -t <= position < t:
        raise UsageError(f"position={position!r} is out of range: ids have {t} positions "
                         f"({-t}..{t - 1})")
    blocks = f"{prefix}blocks."
    names = [f"{blocks}0.resid_pre", f"{blocks}{len(stack.layers) - 1}.resid_post",
             f"{blocks}*.attn.z"] + ([f"{blocks}*.cross.z"] if isinstance(model, Transformer)
                                     else []) \
        + ([f"{blocks}*.ffn_out"] if stack.layers[0].ffn is not None else [])
    logits, cache = forward_cached(model, ids, src, names)
    pos = position % t
    at = {name[len(blocks):]: x[:, :, pos] if name.endswith(".z") else x[:, pos]
          for name, x in cache.items()}  # "{i}.attn.z": (B, H, Dh), "{i}.ffn_out": (B, D)
    with torch.no_grad():
        logit = logits[:, pos, token] - (0 if other is None else logits[:, pos, other])
        shares = component_shares(model, stack, at, token, other)
    return Attribution(token, other, pos, *shares, logit)


def component_shares(model: nn.Module, stack: nn.Module, at: dict[str, Tensor], token: int,
                     other: int | None) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """The shares of :class:`Attribution` (embed, heads, cross_heads, ffn, bias) from the
    stack's sites at the position (``at``: names after ``blocks.``)."""
    layers, w = list(stack.layers), model.head.weight
    direction = w[token] - (0 if other is None else w[other])  # (D,)
    read = frozen_readout(stack.norm, at[f"{len(layers) - 1}.resid_post"], direction)
    heads = torch.stack([head_shares(layer.self_attn, at[f"{i}.attn.z"], read)
                         for i, layer in enumerate(layers)])  # (L, H, B)
    cross_heads = None if getattr(layers[0], "cross_attn", None) is None else torch.stack(
        [head_shares(layer.cross_attn, at[f"{i}.cross.z"], read)
         for i, layer in enumerate(layers)])  # (L, H, B)
    embed = read(at["0.resid_pre"])  # (B,)
    ffn = torch.stack([read(at[f"{i}.ffn_out"]) if f"{i}.ffn_out" in at
                       else torch.zeros_like(embed) for i in range(len(layers))])  # (L, B)
    attns = [a for layer in layers for a in (layer.self_attn, getattr(layer, "cross_attn", None))
             if a is not None]
    bias = bias_share(attns, stack.norm, model.head, token, other, read, embed.size(0))
    return embed, heads, cross_heads, ffn, bias
