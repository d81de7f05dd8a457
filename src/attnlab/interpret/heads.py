"""Head scores: which attention heads do a known job, measured on repeated random tokens.

Each sequence is ``[bos] r_1 .. r_n r_1 .. r_n`` (``bos`` only when given): n random token ids
and the same n again. With ``o`` = 1 with a ``bos``, else 0, the query of the second copy's
j-th token sits at ``o + n + j`` (j = 0 .. n-1), its first occurrence at ``o + j``. Each score
is one (L, H) grid per stack, the mean attention weight over the query positions named and
over the sequences (the induction and previous-token heads of Olsson et al. 2022, "In-context
Learning and Induction Heads"):

- ``previous_token``: from position i to i - 1, over i = 1 .. T-1;
- ``induction``: from ``o + n + j`` to ``o + j + 1``, the token after the previous occurrence
  of the current one (where an induction head looks to copy what came next);
- ``duplicate_token``: from ``o + n + j`` to ``o + j``, the previous occurrence itself;
- ``first_token``: to position 0, over i = 1 .. T-1 (position 0's own row, all 1 in a causal
  model, is left out): a head "resting" on the first token.

An encoder's (bidirectional) heads get the same four scores on the same sequences. The
encoder-decoder gets one random sequence on each side (``src="random"``, drawn apart; or
``src="same"``: the target's tokens as the source too, for copy-like models whose vocabularies
agree): "encoder" and "decoder" hold the four scores of each self-attention stack, and "cross"
holds ``first_token`` only (attention from each target position to source position 0): the
other three compare a query's position with earlier keys of the same sequence, which a
cross-attention's keys (the source) are not.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..errors import UsageError
from .hooks import Edit, hooks, pattern_sites

Vocab = Collection[int] | tuple[int, int] | None  # a range, a (lo, hi) pair or ids
SCORES = ("previous_token", "induction", "duplicate_token", "first_token")


@dataclass
class HeadScores:
    """Head scores by stack and score: ``scores["decoder"]["induction"]`` is (L, H), the mean
    attention weight of each layer's heads on that job (the module docstring defines each)."""

    scores: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    n: int = 0  # random tokens in each half of the sequences
    n_seqs: int = 0

    def __getitem__(self, stack: str) -> dict[str, Tensor]:
        if stack not in self.scores:
            raise UsageError(f"no stack {stack!r} in these head scores: there are "
                             f"{', '.join(map(repr, self.scores))}")
        return self.scores[stack]

    def best(self, score: str, stack: str | None = None) -> tuple[int, int, float]:
        """(layer, head, value) of the head with the highest ``score`` in ``stack`` (default:
        "decoder" if there is one, else the only stack)."""
        if stack is None:
            stack = "decoder" if "decoder" in self.scores else next(iter(self.scores))
        grids = self[stack]
        if score not in grids:
            raise UsageError(f"no score {score!r} for stack {stack!r}: there are "
                             f"{', '.join(map(repr, grids))}")
        grid = grids[score]  # (L, H)
        flat = int(grid.argmax())
        return flat // grid.size(1), flat % grid.size(1), float(grid.flatten()[flat])

    def __str__(self) -> str:
        lines = []
        for stack, grids in self.scores.items():
            for score, grid in grids.items():
                lines.append(f"{stack} {score} (layer x head):")
                lines += ["  " + " ".join(f"{v:.3f}" for v in row.tolist()) for row in grid]
        return "\n".join(lines)


def allowed_ids(vocab: Vocab, size: int,
                special: set[int]) -> Tensor:
    """The token ids to draw from: ``vocab`` (a ``range``, a (lo, hi) pair, hi excluded, or ids)
    or the whole vocabulary ``0 .. size-1``, less the ``special`` ones (pad, bos)."""
    if vocab is None:
        ids = range(size)
    elif isinstance(vocab, tuple) and len(vocab) == 2:
        ids = range(int(vocab[0]), int(vocab[1]))
    else:
        ids = vocab
    bad = [i for i in ids if not 0 <= int(i) < size]
    if bad:
        raise UsageError(f"vocab id {bad[0]} is outside the vocabulary: ids are 0..{size - 1}")
    kept = sorted({int(i) for i in ids} - special)
    if len(kept) < 2:
        raise UsageError(f"vocab leaves {len(kept)} token ids once pad/bos are taken out: give "
                         "at least 2 (a range, a (lo, hi) pair or a list of ids)")
    return torch.tensor(kept)


def repeated_tokens(ids: Tensor, n_seqs: int, n: int, bos: int | None,
                    generator: torch.Generator) -> Tensor:
    """(n_seqs, o + 2n) sequences ``[bos] r r``, ``r`` n draws (with replacement) from
    ``ids``."""
    r = ids[torch.randint(0, len(ids), (n_seqs, n), generator=generator)]  # (n_seqs, n)
    parts = [r, r] if bos is None else [torch.full((n_seqs, 1), bos), r, r]
    return torch.cat(parts, dim=1)


def self_scores(w: Tensor, n: int, o: int) -> dict[str, Tensor]:
    """The four scores of one stack: ``w`` (L, B, H, T, T) -> {score: (L, H)}."""
    j = torch.arange(n)
    i = torch.arange(1, w.size(-1))
    second = o + n + j  # the second copy's query positions
    return {"previous_token": w[..., i, i - 1].mean(dim=(1, 3)),
            "induction": w[..., second, o + j + 1].mean(dim=(1, 3)),
            "duplicate_token": w[..., second, o + j].mean(dim=(1, 3)),
            "first_token": w[..., i, 0].mean(dim=(1, 3))}


def check_length(seq_len: int, o: int, max_len: int) -> int:
    """n, the random tokens of each half, for sequences of ``seq_len`` tokens (``o`` of them a
    bos); an odd remainder is dropped."""
    if not isinstance(seq_len, int) or seq_len > max_len:
        raise UsageError(f"seq_len={seq_len!r} does not fit the model: give an integer up to "
                         f"its max_len={max_len}")
    n = (seq_len - o) // 2
    if n < 2:
        raise UsageError(f"seq_len={seq_len} is too short: at least {o + 4} tokens "
                         f"({'bos + ' if o else ''}2 random tokens, twice)")
    return n


def score_inputs(cfg: ModelConfig, n: int, n_seqs: int, vocab: Vocab,
                 bos: int | None, src: str, seed: int) -> list[Tensor]:
    """The model's inputs: ``[ids]`` (n_seqs, T), or ``[src, tgt]`` for the encoder-decoder."""
    sizes = {"tgt": cfg.tgt_vocab_size or cfg.vocab_size, "src": cfg.vocab_size}
    special = {i for i in (cfg.pad_id, bos) if i is not None}
    if bos is not None and not 0 <= bos < min(sizes.values()):
        raise UsageError(f"bos={bos} is outside the vocabulary: ids are "
                         f"0..{min(sizes.values()) - 1}")
    gen = torch.Generator().manual_seed(seed)
    tgt = repeated_tokens(allowed_ids(vocab, sizes["tgt"], special), n_seqs, n, bos, gen)
    if cfg.family != "encoder_decoder":
        return [tgt]
    if src == "same":
        if sizes["src"] != sizes["tgt"]:
            raise UsageError("src='same' needs one vocabulary for source and target: this "
                             "model's differ; use src='random'")
        return [tgt, tgt]
    return [repeated_tokens(allowed_ids(vocab, sizes["src"], special), n_seqs, n, bos, gen),
            tgt]


def patterns(model: nn.Module, inputs: list[Tensor],
             edits: Mapping[str, Edit] | None) -> dict[str, Tensor]:
    """Every layer's attention weights by stack, (L, B, H, T, S) in fp32 on the CPU, of one
    forward pass with ``edits`` applied."""
    cfg = model.config
    depth = {"encoder": cfg.n_layers, "decoder": cfg.n_decoder_layers or cfg.n_layers}
    depth["cross"] = depth["decoder"]
    names = {s: [site.format(i) for i in range(depth[s])]
             for s, site in pattern_sites(model).items()}
    with torch.no_grad(), hooks(model, edits, cache=[n for v in names.values() for n in v]) as c:
        model(*inputs)
    return {s: torch.stack([c[n] for n in v]).float().cpu() for s, v in names.items()}


def head_scores(model: nn.Module, *, seq_len: int | None = None, n_seqs: int = 32,
                seed: int = 0, vocab: Vocab = None,
                bos: int | None = None, src: str = "random",
                edits: Mapping[str, Edit] | None = None) -> HeadScores:
    """Previous-token, induction, duplicate-token and first-token scores of every head: one
    (L, H) grid per score and stack, from one forward pass over ``n_seqs`` sequences of
    ``seq_len`` tokens (default: the model's max_len, at most 128) ``[bos] r r`` of random
    tokens (the module docstring defines each score).

    Args:
        vocab: the ids to draw the random tokens from: a ``range``, a (lo, hi) pair (hi
            excluded) or a list of ids; default the whole vocabulary. ``pad_id`` and ``bos``
            are never drawn.
        bos: a token to put first (a model trained with one), or None.
        src: encoder-decoder only: "random" (the source drawn apart, as the target) or "same"
            (the target's tokens as the source).
        seed: of the random tokens.
        edits: hook edits to apply in the forward pass ({site or glob: fn}, as
            :func:`~attnlab.interpret.hooks.hooks`'s): the scores of an ablated or patched
            model; the patterns read are those after the edits.
    """
    cfg = model.config
    if src not in ("random", "same"):
        raise UsageError(f"src={src!r} is not known: use 'random' or 'same'")
    if src != "random" and cfg.family != "encoder_decoder":
        raise UsageError(f"src={src!r} is for the encoder-decoder only: this model is a "
                         f"{cfg.family}")
    if not isinstance(n_seqs, int) or n_seqs < 1:
        raise UsageError(f"n_seqs={n_seqs!r} must be a positive integer")
    o = 0 if bos is None else 1
    n = check_length(min(cfg.max_len, 128) if seq_len is None else seq_len, o, cfg.max_len)
    device = next(model.parameters()).device
    inputs = [x.to(device) for x in score_inputs(cfg, n, n_seqs, vocab, bos, src, seed)]
    was = model.training
    model.eval()
    try:
        maps = patterns(model, inputs, edits)
    finally:
        model.train(was)
    out = {s: self_scores(w, n, o) for s, w in maps.items() if s != "cross"}
    if "cross" in maps:
        out["cross"] = {"first_token": maps["cross"][..., 0].mean(dim=(1, 3))}
    return HeadScores(out, n, n_seqs)
