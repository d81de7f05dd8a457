"""Activation patching: which activations carry the difference between a clean and a
corrupted prompt.

The metric is ``logit(answer) - logit(wrong)`` at ``position`` (mean over the rows). Each
patch runs the corrupted prompt with one activation taken from the clean run:

- ``resid`` (L, T): ``blocks.{l}.resid_pre`` at one position;
- ``heads`` (L, H): head h's ``attn.z`` of layer l (its output before the output
  projection), at every position.

::

    result = patch(model, clean_ids, corrupted_ids, answer=mary, wrong=john)
    result.clean, result.corrupted                   # the metric of the two runs
    result.normalized(result.heads)                  # 0: as corrupted, 1: as clean

Batched as :func:`~attnlab.interpret.ablation.ablate` is: many patches per forward, each in
its own copy of the corrupted batch (:func:`~attnlab.interpret.ablation.run_variants`); in a
decoder LM the logits are made at ``position`` only.

**The encoder-decoder** asks one of two questions. With ``src=`` (the source both runs
share), ``clean`` and ``corrupted`` are decoder inputs: the grids are those of the decoder
stack, ``resid`` and ``heads``, and of its cross-attention, ``grids["cross"]`` (the encoder,
the same in both runs, is not patched). With ``tgt=`` (the decoder input both runs share),
``clean`` and ``corrupted`` are *sources*: which activations carry a source word into the
translation. ``resid`` is then the encoder's residual stream per (layer, source position),
and every head grid is patched: ``grids["encoder"]``, ``grids["decoder"]`` and
``grids["cross"]`` (the main one: the cross-attention heads that read the word).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..errors import UsageError
from .ablation import (
    StackSites,
    Variant,
    attention_stacks,
    check_grid,
    expands_inside,
    logits_of,
    run_variants,
)
from .hooks import run_with_cache

GRIDS = ("resid", "heads")


@dataclass
class Patching:
    """The metric (``logit(answer) - logit(wrong)`` at the position, mean over rows) of the
    clean run, the corrupted run, and the corrupted run with each patch: ``resid`` (L, T) per
    layer and position, ``heads`` (L, H) per head of the main stack; ``grids`` every head grid
    by stack ("decoder", and "cross" in the encoder-decoder; "encoder" in the encoder
    families, where the metric of the classifier's (B, C) logits has no position)."""

    clean: float
    corrupted: float
    resid: Tensor
    grids: dict[str, Tensor] = field(default_factory=dict)
    main: str = "decoder"

    @property
    def heads(self) -> Tensor:
        """(L, H) metric with each head of the main stack patched."""
        return self.grids[self.main]

    def normalized(self, grid: Tensor) -> Tensor:
        """``grid`` rescaled: 0 where the patch leaves the corrupted metric, 1 where it
        restores the clean one."""
        return (grid - self.corrupted) / (self.clean - self.corrupted)


def token_ids(x: int | Sequence[int] | Tensor, rows: int, vocab: int, what: str) -> Tensor:
    """``answer`` / ``wrong``: one id, or one per row -> (B,) long, each checked < ``vocab``."""
    ids = torch.as_tensor(x, dtype=torch.long).reshape(-1)
    if ids.numel() == 1:
        ids = ids.expand(rows)
    if ids.numel() != rows:
        raise UsageError(f"{what} must be one token id or one per row ({rows}); got "
                         f"{ids.numel()}")
    bad = [int(i) for i in ids if not 0 <= i < vocab]
    if bad:
        raise UsageError(f"{what} {bad[0]} is not in the vocabulary: token ids are 0..{vocab - 1}")
    return ids


def output_size(model: nn.Module) -> int:
    """The size of the model's logits' last dim: the (target) vocabulary, or the classes."""
    cfg = model.config
    if cfg.family == "encoder" and cfg.head == "classify":
        return cfg.n_classes
    return (cfg.tgt_vocab_size if cfg.family == "encoder_decoder" else None) or cfg.vocab_size


def check_prompts(clean: Tensor, corrupted: Tensor, position: int) -> None:
    """Both (B, T) with the same B and T, ``position`` in -T..T-1."""
    if clean.dim() != 2 or corrupted.dim() != 2:
        raise UsageError(f"clean and corrupted must be token ids (B, T); got shapes "
                         f"{tuple(clean.shape)} and {tuple(corrupted.shape)}")
    if clean.size(1) != corrupted.size(1):
        raise UsageError(f"clean and corrupted must have the same length: clean has "
                         f"{clean.size(1)} tokens, corrupted {corrupted.size(1)}")
    if clean.size(0) != corrupted.size(0):
        raise UsageError(f"clean and corrupted must have the same rows: clean has "
                         f"{clean.size(0)}, corrupted {corrupted.size(0)}")
    t = clean.size(1)
    if not -t <= position < t:
        raise UsageError(f"position {position} is out of range: the prompts have {t} tokens "
                         f"(-{t}..{t - 1})")


def patch_stacks(model: nn.Module, src: Tensor | None,
                 tgt: Tensor | None) -> dict[str, StackSites]:
    """The stacks that patching changes: the decoder LM's; the encoder-decoder's decoder and
    cross-attention (``src`` given), or all three (``tgt`` given: the sources differ). One of
    ``src`` and ``tgt`` is required there, and both are refused elsewhere."""
    stacks = attention_stacks(model)
    if model.config.family == "encoder_decoder":
        if (src is None) == (tgt is None):
            raise UsageError("patching an encoder-decoder needs one of src= (the source ids "
                             "(B, S) both runs share; clean and corrupted are decoder inputs) "
                             "and tgt= (the decoder input both share; they are sources)")
        return stacks if tgt is not None else {k: stacks[k] for k in ("decoder", "cross")}
    if src is not None or tgt is not None:
        raise UsageError(f"src= and tgt= are for the encoder-decoder only; this is a "
                         f"{type(model).__name__}")
    return stacks


def replace_at(index: tuple, clean: Tensor) -> Callable[[Tensor], Tensor]:
    """x (B, ...) -> x with ``x[index]`` taken from ``clean`` (the clean run's tensor)."""
    def fn(x: Tensor) -> Tensor:
        x[index] = clean[index]
        return x
    return fn


def patch_variants(stacks: dict[str, StackSites], cache: dict[str, Tensor], t: int,
                   grids: Collection[str], layers: Collection[int] | None = None,
                   heads: Collection[int] | None = None) -> list[tuple[str, int, int, Variant]]:
    """("resid" or a stack, layer, position or head, variant) of each patch of ``grids``,
    layer by layer (only ``layers`` and ``heads`` if given; no residual stream with
    ``heads``); the residual stream is patched in the first stack (the one whose inputs
    differ: the encoder's when the sources do)."""
    out = []
    for name, st in stacks.items():
        for layer in range(st.layers) if layers is None else sorted(layers):
            start, z = st.resid.format(layer), st.z.format(layer)
            if name == next(iter(stacks)) and "resid" in grids and heads is None:
                out += [("resid", layer, p, Variant(start, replace_at((slice(None), p),
                                                                      cache[start]), start))
                        for p in range(t)]
            if "heads" in grids:
                out += [(name, layer, h, Variant(z, replace_at((slice(None), h), cache[z]),
                                                 start))
                        for h in (range(st.heads) if heads is None else sorted(heads))]
    return out


def patch(model: nn.Module, clean: Tensor, corrupted: Tensor, *,
          answer: int | Sequence[int] | Tensor, wrong: int | Sequence[int] | Tensor,
          position: int = -1, src: Tensor | None = None, tgt: Tensor | None = None,
          grids: Collection[str] = GRIDS, layers: Collection[int] | None = None,
          heads: Collection[int] | None = None, rows_per_forward: int | None = None,
          ) -> Patching:
    """Activation patching of ``corrupted`` (B, T) with activations of ``clean`` (B, T).

    Args:
        answer, wrong: token ids (one, or one per row): the metric is ``logit(answer) -
            logit(wrong)`` at ``position`` (default the last), mean over the rows.
        src: the encoder-decoder's source ids (B, S), the same for both runs (see the module
            doc); None for the decoder LM.
        tgt: the encoder-decoder's decoder input (B, T) shared by both runs, whose
            ``clean`` and ``corrupted`` are then sources (B, S); ``position`` is in ``tgt``.
        grids: the grids to compute, "resid" and/or "heads" (the others stay NaN).
        layers, heads: only those layers and heads (the rest stay NaN; ``resid``, which has
            no head, is skipped when ``heads`` is given), as in
            :func:`~attnlab.interpret.ablation.ablate`.
        rows_per_forward: rows per forward (the corrupted batch repeated that many // B
            times); default about 2,048 tokens.

    Returns a :class:`Patching`: ``clean``, ``corrupted``, ``resid`` (L, T), ``heads``
    (L, H) and ``grids`` (every head grid by stack), each the patched run's metric.
    """
    stacks = patch_stacks(model, src, tgt)
    check_grid(stacks, layers, heads)
    check_prompts(clean, corrupted, 0 if tgt is not None else position)
    if tgt is not None:
        check_prompts(tgt, tgt, position)
    bad = [g for g in grids if g not in GRIDS]
    if bad or isinstance(grids, str):
        raise UsageError(f"grids must be a collection of {', '.join(map(repr, GRIDS))}; got "
                         f"{grids!r}")
    vocab, rows = output_size(model), clean.size(0)
    tokens = (token_ids(answer, rows, vocab, "answer").to(clean.device),
              token_ids(wrong, rows, vocab, "wrong").to(clean.device))
    was_training = model.training
    model.eval()
    try:
        return run_patching(model, clean, corrupted, tokens, position, (src, tgt), stacks,
                            (set(grids), layers, heads, rows_per_forward))
    finally:
        model.train(was_training)


def run_patching(model: nn.Module, clean: Tensor, corrupted: Tensor, tokens: tuple,
                 position: int, shared: tuple[Tensor | None, Tensor | None],
                 stacks: dict[str, StackSites], how: tuple) -> Patching:
    """:func:`patch` once its arguments are checked (the model in eval mode); ``tokens``:
    (answer, wrong) ids (B,), ``shared``: (src, tgt), ``how``: (grids, layers, heads,
    rows_per_forward)."""
    (right, other), (grids, layers, heads, rows_per_forward), (src, tgt) = tokens, how, shared
    rows, t = clean.shape
    pre, post = (() if src is None else (src,)), (() if tgt is None else (tgt,))
    names = [s.format(i) for st in stacks.values() for s in (st.z, st.resid)
             for i in range(st.layers)]
    with torch.no_grad():
        clean_out, cache = run_with_cache(model, *pre, clean, *post, names=names)
        corrupted_logits = logits_of(model(*pre, corrupted, *post))
    pos = position % (t if tgt is None else tgt.size(1))
    # a decoder LM makes the logits at the position only (its last site narrowed to it)
    narrow = (lambda h: h[:, pos:pos + 1]) if expands_inside(model) else None

    def metric(logits: Tensor, at: int = pos) -> Tensor:  # (K * B, T, V) or (K * B, C)
        k = logits.size(0) // rows
        chosen = (logits[:, at] if logits.dim() == 3 else logits).float()  # (K * B, V)
        return (chosen.gather(1, right.repeat(k)[:, None])
                - chosen.gather(1, other.repeat(k)[:, None])).squeeze(1)  # (K * B,)
    jobs = patch_variants(stacks, cache, t, grids, layers, heads)
    values = run_variants(model, [*pre, corrupted, *post], [j[3] for j in jobs],
                          (lambda lg: metric(lg, 0)) if narrow else metric,
                          rows_per_forward=rows_per_forward, narrow=narrow)
    clean_logits = logits_of(clean_out)
    layers = next(iter(stacks.values())).layers
    result = Patching(float(metric(clean_logits).mean()), float(metric(corrupted_logits).mean()),
                      torch.full((layers, t), float("nan")),
                      main="cross" if tgt is not None else
                      "decoder" if "decoder" in stacks else "encoder")
    for name, st in stacks.items():
        result.grids[name] = torch.full((st.layers, st.heads), float("nan"))
    for (name, layer, i, _), v in zip(jobs, values.tolist()):
        (result.resid if name == "resid" else result.grids[name])[layer, i] = v
    return result

