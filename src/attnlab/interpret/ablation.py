"""Ablation: how much the loss changes when one head or one feed-forward block is taken out.

Any family, through one family-agnostic loss: a :class:`Batch` holds the model's positional
inputs and the targets, :func:`row_loss` turns the model's logits into each row's mean loss::

    result = ablate(model, lm_batch(ids))            # ids (B, T + 1)
    result.heads                                     # (L, H): loss with the head gone - base
    result.ffn                                       # (L,): the same for each feed-forward
    result.top(5)                                    # the five heads that matter most

Zero ablation sets the head's ``attn.z`` (its output before the output projection) to 0;
mean ablation puts its mean over the batch's real positions there instead (the feed-forward
blocks: ``ffn_out``, the same way).

**Batched.** Each forward runs many ablations: the batch is repeated K times along the batch
dimension (K = ``rows_per_forward // B``), and one edit per site ablates a different head in
each copy (:func:`run_variants`, which :mod:`~attnlab.interpret.patching` uses too). In a
decoder-only LM the copies are made inside the forward, at the ``resid_pre`` of the first
layer the forward changes: a head of layer l cannot change anything before layer l, so the
layers before it run once on B rows, not K times. (Encoders and the encoder-decoder carry a
per-row padding mask or the encoder memory past that point: there the inputs are repeated.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UsageError
from ..nn import IGNORE_INDEX, counted, upcast
from .hooks import check_index, hooks, pattern_sites, run_with_cache, sites_of

KINDS = ("zero", "mean")
TOKEN_BUDGET = 2048  # default rows per forward: this many tokens (the logits are rows x T x V)


# ---- a family-agnostic loss -----------------------------------------------------------------
@dataclass(frozen=True)
class Batch:
    """What a model is called with and what its loss compares against, for any family.

    ``inputs`` are passed positionally, batch first: ``(ids,)`` for the decoder LM, the
    classifier and the masked LM, ``(src, tgt_in)`` for the encoder-decoder. ``targets``: the
    next tokens (B, T) of a language model (``pad_id`` and -100 do not count), the class
    labels (B,) of the classifier, the masked LM's targets (B, S) (-100 where unmasked).
    """

    inputs: tuple[Tensor, ...]
    targets: Tensor

    def __post_init__(self):
        if not isinstance(self.inputs, tuple) or not self.inputs:
            raise UsageError("Batch.inputs must be a non-empty tuple of tensors, such as (ids,)")
        rows = {t.size(0) for t in self.inputs} | {self.targets.size(0)}
        if len(rows) > 1:
            raise UsageError(f"Batch inputs and targets must have the same rows (batch first); "
                             f"got {sorted(rows)}")

    @property
    def rows(self) -> int:
        """B, the number of examples."""
        return self.targets.size(0)

    def repeat(self, k: int) -> Batch:
        """The batch ``k`` times along dim 0 (copy c holds rows c*B .. c*B + B - 1)."""
        return Batch(tuple(repeat_rows(t, k) for t in self.inputs), repeat_rows(self.targets, k))


def repeat_rows(x: Tensor, k: int) -> Tensor:
    """x (B, ...) -> (k * B, ...): ``k`` copies of the batch, one after the other."""
    return x if k == 1 else x.repeat(k, *([1] * (x.dim() - 1)))


def lm_batch(ids: Tensor) -> Batch:
    """A decoder LM's batch from token ids (B, T + 1): inputs ``ids[:, :-1]``, targets
    ``ids[:, 1:]`` (B, T)."""
    if ids.dim() != 2 or ids.size(1) < 2:
        raise UsageError(f"lm_batch needs token ids (B, T + 1) with at least 2 tokens per row; "
                         f"got shape {tuple(ids.shape)}")
    return Batch((ids[:, :-1],), ids[:, 1:])


def seq2seq_batch(src: Tensor, tgt: Tensor) -> Batch:
    """An encoder-decoder's batch: source ids (B, S) and target ids (B, T + 1) (``<bos>`` first):
    inputs ``(src, tgt[:, :-1])``, targets ``tgt[:, 1:]``."""
    if tgt.dim() != 2 or tgt.size(1) < 2:
        raise UsageError(f"seq2seq_batch needs target ids (B, T + 1) with at least 2 tokens per "
                         f"row; got shape {tuple(tgt.shape)}")
    return Batch((src, tgt[:, :-1]), tgt[:, 1:])


def text_batch(model: nn.Module, ids: Tensor, src: Tensor | None = None,
               name: str = "the text") -> Batch:
    """The batch whose loss an ablation of one input measures, by what ``model`` predicts:
    a decoder LM's next tokens of ``ids`` (1, T + 1) (:func:`lm_batch`), an encoder-decoder's
    target ``ids`` (``<bos>`` first) from source ``src`` (1, S) (:func:`seq2seq_batch`), a
    classifier's own answer on ``ids`` (its label). ``name``: what the error calls a
    one-token text. A masked LM's loss needs masked positions: build its :class:`Batch`."""
    cfg = model.config
    if src is not None:
        return seq2seq_batch(src, ids)
    if cfg.family == "decoder":
        if ids.size(1) < 2:
            raise UsageError(f"{name} is one token: the loss needs at least two")
        return lm_batch(ids)
    if cfg.head == "mlm":
        raise UsageError("text_batch of a masked LM: its loss needs masked positions; build "
                         "a Batch((masked ids,), targets) instead")
    with torch.no_grad():
        label = logits_of(model(ids)).argmax(-1)  # (1,): the classifier's own answer
    return Batch((ids,), label)


def logits_of(out: Any) -> Tensor:
    """The logits of a model's output: ``(logits, loss)`` -> logits; a tensor as is."""
    return out[0] if isinstance(out, tuple) else out


def row_loss(logits: Tensor, targets: Tensor, pad_id: int | None = None) -> Tensor:
    """Each row's mean cross-entropy (B,), float32.

    logits (B, C) with class labels (B,), or (B, T, V) with targets (B, T), where -100 and
    ``pad_id`` targets do not count (a row with none counted: 0)."""
    if logits.dim() == 2 and targets.dim() == 1:
        return F.cross_entropy(upcast(logits), targets, reduction="none")
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise UsageError(f"row_loss takes logits (B, C) with targets (B,) or logits (B, T, V) "
                         f"with targets (B, T); got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    keep = counted(targets, pad_id)  # (B, T)
    # (B * T, V) rows, not (B, V, T): the class dim contiguous is 3x faster for a large V
    per_token = F.cross_entropy(upcast(logits).flatten(0, 1),
                                targets.masked_fill(~keep, IGNORE_INDEX).flatten(),
                                ignore_index=IGNORE_INDEX, reduction="none")  # (B * T,)
    return per_token.view(targets.shape).sum(1) / keep.sum(1).clamp(min=1)


def batch_loss(model: nn.Module, batch: Batch) -> Tensor:
    """Each row's mean loss (B,) of ``model(*batch.inputs)`` (no gradient)."""
    with torch.no_grad():
        logits = logits_of(model(*batch.inputs))
    return row_loss(logits, batch.targets, model.config.pad_id)


# ---- many variants of one forward -----------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One changed forward: at site ``site``, ``fn(x)`` gives this copy's rows (B, ...)
    instead of x. ``start``: the earliest site it can change (its layer's ``resid_pre``), where
    a decoder LM's copies are made."""

    site: str
    fn: Callable[[Tensor], Tensor]
    start: str


def expands_inside(model: nn.Module) -> bool:
    """True when the batch may be repeated at a ``resid_pre`` (the decoder LM: nothing per-row
    but the residual stream flows past it)."""
    return model.config.family == "decoder"


def copies_edit(variants: Sequence[Variant], rows: int, expand_at: str | None) -> Callable:
    """The edit of one forward of len(variants) copies of ``rows`` rows: at ``expand_at`` the
    B rows become K * B; at each variant's site, its copy's rows go through its ``fn``."""
    k = len(variants)
    by_site: dict[str, list[tuple[int, Callable]]] = {}
    for i, v in enumerate(variants):
        by_site.setdefault(v.site, []).append((i, v.fn))

    def edit(x: Tensor, name: str) -> Tensor:
        if name == expand_at:
            x = repeat_rows(x, k)
        if name in by_site:
            x = x.unflatten(0, (k, rows)).clone()  # (K, B, ...)
            for i, fn in by_site[name]:
                x[i] = fn(x[i])
            x = x.flatten(0, 1)
        return x
    return edit


def chunks(variants: Sequence[Variant], per: int, by_start: bool) -> Iterator[list[Variant]]:
    """``variants`` in runs of at most ``per``; with ``by_start``, a run never mixes start
    sites (a copy made before its own layer would run the layers in between for nothing)."""
    run: list[Variant] = []
    for v in variants:
        if run and (len(run) == per or (by_start and v.start != run[0].start)):
            yield run
            run = []
        run.append(v)
    if run:
        yield run


def run_variants(model: nn.Module, inputs: Sequence[Tensor], variants: Sequence[Variant],
                 measure: Callable[[Tensor], Tensor], *, rows_per_forward: int | None = None,
                 narrow: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """``measure`` (logits (K * B, ...) -> (K * B,)) of each variant's forward, averaged over
    its B rows: (len(variants),). Up to ``rows_per_forward`` rows per forward (default: about
    2,048 tokens). ``narrow``: a decoder LM's last hidden states (N, T, D) -> the positions
    ``measure`` reads (so the head runs on those only)."""
    rows, sites = inputs[0].size(0), list(sites_of(model))
    per = max(1, (rows_per_forward or TOKEN_BUDGET // max(t.size(-1) for t in inputs)) // rows)
    inside = expands_inside(model)
    out = []
    with torch.no_grad():
        for chunk in chunks(variants, per, by_start=inside):
            expand_at = min((v.start for v in chunk), key=sites.index) if inside else None
            edit = copies_edit(chunk, rows, expand_at)
            edits = {name: edit for name in {v.site for v in chunk} | {expand_at} - {None}}
            if inside and narrow is not None:
                edits[sites[-1]] = lambda x, name: narrow(x)
            args = inputs if inside else [repeat_rows(t, len(chunk)) for t in inputs]
            with hooks(model, edits):
                logits = logits_of(model(*args))
            out.append(measure(logits).float().view(len(chunk), rows).mean(1))
    return torch.cat(out) if out else torch.zeros(0)


# ---- the attention stacks of a model --------------------------------------------------------
@dataclass(frozen=True)
class StackSites:
    """One attention stack's site names, ``{}`` for the layer: ``z`` (B, H, T, Dh), ``ffn``
    (B, T, D; None for cross-attention or attention-only blocks), ``resid`` (``resid_pre``);
    ``layers`` and ``heads`` its grid, ``input`` the index of its ids in the model's inputs."""

    z: str
    ffn: str | None
    resid: str
    layers: int
    heads: int
    input: int


def attention_stacks(model: nn.Module) -> dict[str, StackSites]:
    """The model's attention stacks by name: "decoder" (decoder LM), "encoder" (classifier,
    masked LM), or "encoder", "decoder" and "cross" (encoder-decoder)."""
    sites = sites_of(model)
    out = {}
    for stack, pattern in pattern_sites(model).items():
        block = pattern[:pattern.index("blocks.")] + "blocks.{}."
        layers = 0
        while pattern.format(layers) in sites:
            layers += 1
        ffn = block + "ffn_out" if stack != "cross" else None
        out[stack] = StackSites(
            z=pattern.replace(".pattern", ".z"),
            ffn=ffn if ffn is not None and ffn.format(0) in sites else None,
            resid=block + "resid_pre", layers=layers, heads=model.config.n_heads,
            input=1 if stack != "encoder" and model.config.family == "encoder_decoder" else 0)
    return out


def pick_stacks(model: nn.Module, stack: str | Collection[str] | None) -> dict[str, StackSites]:
    """The stacks named by ``stack`` (a name, names, or None: all)."""
    stacks = attention_stacks(model)
    names = list(stacks) if stack is None else [stack] if isinstance(stack, str) else list(stack)
    bad = [s for s in names if s not in stacks]
    if bad:
        raise UsageError(f"stack {bad[0]!r} is not in this {type(model).__name__}: its stacks "
                         f"are {', '.join(stacks)}")
    return {s: stacks[s] for s in names}


def real_positions(ids: Tensor, pad_id: int | None) -> Tensor:
    """Bool (B, T): the tokens that are not ``pad_id``."""
    return torch.ones_like(ids, dtype=torch.bool) if pad_id is None else ids != pad_id


def masked_mean(x: Tensor, real: Tensor, dims: tuple[int, int]) -> Tensor:
    """The mean of x over its batch and position dims ``dims`` where ``real`` (B, T) is True:
    z (B, H, T, Dh) with dims (0, 2) -> (H, Dh); ffn_out (B, T, D) with (0, 1) -> (D,)."""
    shape = [1] * x.dim()
    shape[dims[0]], shape[dims[1]] = real.shape
    w = real.view(shape).to(x.dtype)
    return (x * w).sum(dims) / w.sum().clamp(min=1)


# ---- ablation -------------------------------------------------------------------------------
@dataclass
class Ablation:
    """The loss change of each ablation (ablated loss - ``base_loss``; > 0: it mattered).

    ``grids[stack]`` (L, H) for each attention stack ("decoder" of a decoder LM, "encoder" of
    the encoder families, "encoder", "decoder" and "cross" of the encoder-decoder), NaN where
    not asked for; ``ffns[stack]`` (L,) (empty (0,) for attention-only models and "cross").
    ``heads`` and ``ffn``: those of the model's ``main`` stack."""

    kind: str
    base_loss: float
    grids: dict[str, Tensor] = field(default_factory=dict)
    ffns: dict[str, Tensor] = field(default_factory=dict)
    main: str = "decoder"

    @property
    def heads(self) -> Tensor:
        """(L, H) loss deltas of the main stack's heads."""
        return self.grids[self.main]

    @property
    def ffn(self) -> Tensor:
        """(L,) loss deltas of the main stack's feed-forward blocks (empty if none)."""
        return self.ffns[self.main]

    def top(self, n: int = 5, stack: str | None = None) -> list[tuple[int, int, float]]:
        """The ``n`` heads of ``stack`` (default: main) whose ablation raises the loss most:
        (layer, head, delta), largest first."""
        grid = self.grids[stack or self.main]
        flat = grid.nan_to_num(float("-inf")).flatten()
        order = flat.argsort(descending=True)[:n]
        return [(int(i) // grid.size(1), int(i) % grid.size(1), float(flat[i])) for i in order]


def ablation_variants(stacks: dict[str, StackSites], means: dict[str, Tensor] | None,
                      layers: Collection[int] | None, heads: Collection[int] | None,
                      ) -> list[tuple[str, int, int | None, Variant]]:
    """(stack, layer, head or None for the ffn, variant) of each ablation, layer by layer.
    ``means``: {site: mean value} for mean ablation, None for zero ablation."""
    out = []
    for name, st in stacks.items():
        for layer in range(st.layers) if layers is None else sorted(layers):
            start, z = st.resid.format(layer), st.z.format(layer)
            for h in range(st.heads) if heads is None else sorted(heads):
                value = 0.0 if means is None else means[z][h][None]  # (1, Dh)
                out.append((name, layer, h, Variant(z, set_head(h, value), start)))
            if st.ffn is not None and heads is None:
                ffn = st.ffn.format(layer)
                value = 0.0 if means is None else means[ffn]  # (D,)
                out.append((name, layer, None, Variant(ffn, set_all(value), start)))
    return out


def set_head(h: int, value: Tensor | float) -> Callable[[Tensor], Tensor]:
    """x (B, H, T, Dh) -> a copy with head ``h`` set to ``value`` (0 or (1, Dh))."""
    def fn(x: Tensor) -> Tensor:
        x[:, h] = value
        return x
    return fn


def set_all(value: Tensor | float) -> Callable[[Tensor], Tensor]:
    """x (B, T, D) -> ``value`` (0 or (D,)) at every position."""
    def fn(x: Tensor) -> Tensor:
        x[:] = value
        return x
    return fn


def check_grid(stacks: dict[str, StackSites], layers: Collection[int] | None,
               heads: Collection[int] | None) -> None:
    """Each of ``layers`` and ``heads`` must exist in every stack asked for."""
    for name, st in stacks.items():
        check_index(layers or (), st.layers, "layer", f"the {name} stack")
        check_index(heads or (), st.heads, "head", f"the {name} stack")


def ablate(model: nn.Module, batch: Batch, *, kind: str = "zero",
           stack: str | Collection[str] | None = None, layers: Collection[int] | None = None,
           heads: Collection[int] | None = None, rows_per_forward: int | None = None,
           ) -> Ablation:
    """The change of the loss on ``batch`` when each head (and each feed-forward block) is
    ablated, ``kind`` "zero" (its ``attn.z`` / ``ffn_out`` set to 0) or "mean" (set to its mean
    over the batch's real positions, the tokens that are not ``pad_id``).

    ``stack``: the attention stacks to ablate (default all; the encoder-decoder's are
    "encoder", "decoder" and "cross"); ``layers``, ``heads``: only those (the feed-forward
    blocks are skipped when ``heads`` is given); ``rows_per_forward``: rows per forward (the
    batch repeated ``rows_per_forward // B`` times; default: about 2,048 tokens).

    Returns an :class:`Ablation`: ``heads`` (L, H), ``ffn`` (L,), ``base_loss``, ``grids`` and
    ``ffns`` by stack (the mean over rows of each row's mean loss; see :func:`row_loss`).
    """
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    stacks = pick_stacks(model, stack)
    check_grid(stacks, layers, heads)
    was_training = model.training
    model.eval()
    try:
        return run_ablation(model, batch, kind, stacks, layers, heads, rows_per_forward)
    finally:
        model.train(was_training)


def run_ablation(model: nn.Module, batch: Batch, kind: str, stacks: dict[str, StackSites],
                 layers: Collection[int] | None, heads: Collection[int] | None,
                 rows_per_forward: int | None) -> Ablation:
    """:func:`ablate` once its arguments are checked (the model in eval mode)."""
    pad_id = model.config.pad_id
    wanted = [s.format(i) for st in stacks.values() for s in (st.z, st.ffn) if s is not None
              for i in range(st.layers)]
    with torch.no_grad():
        out, cache = run_with_cache(model, *batch.inputs, names=wanted)
    base = float(row_loss(logits_of(out), batch.targets, pad_id).mean())
    means = None if kind == "zero" else site_means(stacks, cache, batch.inputs, pad_id)
    del cache
    jobs = ablation_variants(stacks, means, layers, heads)
    targets = batch.targets

    def measure(logits: Tensor) -> Tensor:
        k = logits.size(0) // batch.rows
        return row_loss(logits, repeat_rows(targets, k), pad_id)
    losses = run_variants(model, batch.inputs, [j[3] for j in jobs], measure,
                          rows_per_forward=rows_per_forward)
    main = "decoder" if "decoder" in stacks else next(iter(stacks))
    result = Ablation(kind, base, main=main)
    for name, st in stacks.items():
        result.grids[name] = torch.full((st.layers, st.heads), float("nan"))
        result.ffns[name] = torch.full((st.layers if st.ffn else 0,), float("nan"))
    for (name, layer, h, _), loss in zip(jobs, losses.tolist()):
        if h is None:
            result.ffns[name][layer] = loss - base
        else:
            result.grids[name][layer, h] = loss - base
    return result


def site_means(stacks: dict[str, StackSites], cache: dict[str, Tensor],
               inputs: Sequence[Tensor], pad_id: int | None) -> dict[str, Tensor]:
    """{site: its mean over the real positions}: each ``attn.z`` (H, Dh) and ``ffn_out`` (D,)
    of ``stacks`` in ``cache``; ``inputs``: the model's, whose ids say which tokens are real."""
    means = {}
    for st in stacks.values():
        real = real_positions(inputs[st.input], pad_id)
        for i in range(st.layers):
            means[st.z.format(i)] = masked_mean(cache[st.z.format(i)], real, (0, 2))
            if st.ffn is not None:
                means[st.ffn.format(i)] = masked_mean(cache[st.ffn.format(i)], real, (0, 1))
    return means
