"""The attention views of a trained run on one text: what ``attnlab viz attention`` draws and
what the explorer page shows beside each ``attnlab interpret`` analysis.

Every family the same way: the run turns the text into the model's inputs as training read
them (:meth:`attnlab.runs.Run.inputs`; an encoder-decoder's target is its greedy translation
unless one is given), one forward pass keeps the attention weights
(:func:`attnlab.interpret.attention_maps`), and each attention stack of the model becomes one
:class:`~attnlab.viz.explorer.AttentionView` with its tokens on the axes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from .explorer import AttentionView

if TYPE_CHECKING:
    from torch import nn

    from ..runs import Run

# (query, key) axis labels of each stack of a model that reads a source and a target
AXES = {"encoder": ("source", "source"), "decoder": ("target", "target"),
        "cross": ("target", "source")}


def view_names(model: nn.Module) -> dict[str, str]:
    """Each attention stack of ``model`` -> the name of its view, in the order shown:
    ``decoder self-attention`` (or ``encoder ...``) for a one-stack model; an encoder-decoder's
    ``encoder self-attention (source)``, ``decoder self-attention (target)`` and
    ``cross-attention (target x source)``."""
    from ..interpret.hooks import pattern_sites

    stacks = pattern_sites(model)
    if "cross" not in stacks:  # one stack: self-attention over the text
        return {s: f"{s} self-attention" for s in stacks}
    return {"encoder": "encoder self-attention (source)",
            "decoder": "decoder self-attention (target)",
            "cross": "cross-attention (target x source)"}


def attention_views(run: Run, text: str, target: str | None = None, *,
                    layers: Collection[int] | None = None, heads: Collection[int] | None = None,
                    names: tuple[str, str] = ("text", "target")) -> list[AttentionView]:
    """One :class:`AttentionView` (weights (L, H, T, S)) per attention stack of the run's
    model on ``text``: a decoder's or an encoder's self-attention over the text's tokens; an
    encoder-decoder's encoder, decoder and cross-attention, ``text`` as the source and
    ``target`` (default: the model's greedy translation) as the target, axes labelled.

    Args:
        run: a loaded run with a tokenizer (:func:`attnlab.runs.load_run`).
        text: the input (the source, for translation).
        target: an encoder-decoder's target text.
        layers: the layers kept (default all).
        heads: the heads kept (default all).
        names: what errors call the text and the target (empty, or too long).
    """
    import torch

    from ..interpret.hooks import attention_maps

    ids, src = run.inputs(text, target, names=names)
    # the decoder reads <bos> ... of the target, not its <eos>
    inputs = (ids,) if src is None else (src, ids[:, :-1])  # (1, T) or (1, S), (1, T)
    with torch.no_grad():
        maps = attention_maps(run.model, *inputs, layers=True if layers is None else layers,
                              heads=heads)
    strings = [run.tokenizer.token_strings(x[0].tolist()) for x in inputs]
    tokens = {None: strings[0]} if src is None else dict(zip(("source", "target"), strings))
    head_ids = sorted(set(heads)) if heads else list(range(run.model.config.n_heads))
    views = []
    for stack, name in view_names(run.model).items():
        q_label, k_label = (None, None) if src is None else AXES[stack]
        views.append(AttentionView(name, tokens[q_label], tokens[k_label],
                                   maps.stacked(stack)[:, 0],  # (L, H, T, S)
                                   sorted(maps[stack]), head_ids, q_label, k_label))
    return views


__all__ = ["attention_views", "view_names"]
