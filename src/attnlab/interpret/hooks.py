"""Reading and changing a forward pass at its hook sites, the same way in all three families.

Every model names its sites (``model.hook_sites()``, in the order a forward meets them):
``embed``, ``pos_embed``, then per block ``blocks.{i}.resid_pre``, ``blocks.{i}.attn.q``,
``.attn.k``, ``.attn.v`` (B, H, T, Dh), ``.attn.pattern`` (B, H, T, S), ``.attn.z`` (B, H, T,
Dh: each head's output before the output projection), ``blocks.{i}.attn_out``,
``blocks.{i}.resid_mid``, in a decoder with cross-attention ``.cross.*``, ``.cross_out`` and
``.resid_cross``, then ``blocks.{i}.ffn_out``, ``blocks.{i}.resid_post`` (all (B, T, D)),
and ``final_norm`` for pre-norm models. The encoder-decoder puts ``encoder.`` or ``decoder.``
before each name. Patterns are globs (``blocks.*.attn.pattern``; ``*`` matches dots too).

A site costs nothing until asked for: the cache holds only the sites named, and a forward
with no hook runs the plain path (the fused attention kernel included; asking for a
``pattern`` takes the written-out path for that attention only)::

    logits, cache = run_with_cache(model, ids, names="blocks.*.attn.pattern")
    cache["blocks.1.attn.pattern"]                    # (B, H, T, T)
    with hooks(model, {"blocks.1.attn.z": zero_heads([3])}):
        logits, loss = model(ids, targets)            # head 1.3 ablated
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UsageError
from ..nn import Sites

Edit = Callable[[Tensor, str], "Tensor | None"]  # (the site's tensor, its name) -> new or None


def sites_of(model: nn.Module) -> dict[str, tuple[Sites, str]]:
    """The model's hook sites by name -> (module, site)."""
    if not callable(getattr(model, "hook_sites", None)):
        raise UsageError(f"{type(model).__name__} has no hook sites: attnlab's models "
                         "(DecoderLM, EncoderClassifier, MaskedLM, Transformer) have them")
    return model.hook_sites()


def describe_sites(names: Iterable[str]) -> str:
    """The names, with the block numbers folded (``blocks.{i}.resid_pre`` once, and i's range)."""
    folded: dict[str, set[int]] = {}
    for name in names:
        m = re.search(r"blocks\.(\d+)\.", name)
        key = name if m is None else name[:m.start(1)] + "{i}" + name[m.end(1):]
        folded.setdefault(key, set()).update([] if m is None else [int(m.group(1))])
    return ", ".join(k if not i else f"{k} (i in {min(i)}..{max(i)})" if "{i}" in k else k
                     for k, i in folded.items())


def select(sites: Iterable[str], patterns: str | Iterable[str]) -> list[str]:
    """The site names that match any of ``patterns`` (exact names or globs), in forward order.
    A pattern that matches nothing is an error that lists the valid names."""
    names = list(sites)
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for pattern in patterns:
        if not any(fnmatchcase(n, pattern) for n in names):
            raise UsageError(f"no hook site matches {pattern!r}; the sites are: "
                             f"{describe_sites(names)}")
    return [n for n in names if any(fnmatchcase(n, p) for p in patterns)]


class ActivationCache(dict):
    """The tensors of one forward pass by site name (only the sites asked for)."""

    def __missing__(self, name: str) -> Tensor:
        raise KeyError(f"{name!r} is not in the cache; it holds: {describe_sites(self)}")

    def stack(self, pattern: str) -> Tensor:
        """The cached tensors whose names match ``pattern``, stacked in forward order
        (``cache.stack("blocks.*.resid_post")``: (L, B, T, D))."""
        return torch.stack([self[n] for n in select(self, pattern)])


def _chain(name: str, edits: list[Edit], cache: ActivationCache | None) -> Callable:
    """One site's function: the edits in order, then the result stored in ``cache``."""
    def run(x: Tensor) -> Tensor:
        for fn in edits:
            out = fn(x, name)
            x = x if out is None else out
        if cache is not None:
            cache[name] = x
        return x
    return run


@contextmanager
def hooks(model: nn.Module, edits: Mapping[str, Edit] | None = None, *,
          cache: str | Iterable[str] = ()) -> Iterator[ActivationCache]:
    """Inside, every forward of ``model`` runs ``edits`` ({site name or glob: fn(x, name)}, a
    function returning the tensor to use instead, or None to keep it) and stores the sites of
    ``cache`` (names or globs; after the edits) in the :class:`ActivationCache` yielded.
    After, the model is plain again. One ``hooks`` at a time per model.

    Examples:
        >>> import torch
        >>> from attnlab import DecoderLM, ModelConfig
        >>> from attnlab.interpret import hooks, zero_heads
        >>> model = DecoderLM(ModelConfig(family="decoder", vocab_size=50, d_model=32, n_heads=2,
        ...                               n_layers=2, max_len=16, dropout=0.0))
        >>> ids = torch.randint(0, 50, (1, 16))
        >>> edits = {"blocks.1.attn.z": zero_heads([0])}  # head 0 of layer 1 ablated
        >>> with hooks(model, edits, cache="blocks.1.resid_post") as c:
        ...     ablated, _ = model(ids)
        >>> plain, _ = model(ids)  # plain again after the block
        >>> bool((ablated != plain).any()), c["blocks.1.resid_post"].shape
        (True, torch.Size([1, 16, 32]))
    """
    sites = sites_of(model)
    edits_at: dict[str, list[Edit]] = {}
    for pattern, fn in (edits or {}).items():
        for name in select(sites, pattern):
            edits_at.setdefault(name, []).append(fn)
    store = ActivationCache()
    kept = set(select(sites, cache)) if cache else set()
    chosen = [n for n in sites if n in edits_at or n in kept]
    busy = [n for n in chosen if sites[n][1] in sites[n][0].hooks]
    if busy:
        raise UsageError(f"hook site {busy[0]!r} is already hooked: one `hooks` at a time")
    try:
        for name in chosen:
            module, site = sites[name]
            module.hooks[site] = _chain(name, edits_at.get(name, []),
                                        store if name in kept else None)
        yield store
    finally:
        for name in chosen:
            module, site = sites[name]
            module.hooks.pop(site, None)


def run_with_cache(model: nn.Module, *inputs: Any, names: str | Iterable[str] = "*",
                   edits: Mapping[str, Edit] | None = None, **kwargs: Any,
                   ) -> tuple[Any, ActivationCache]:
    """``model(*inputs, **kwargs)`` and the tensors of the sites ``names`` (globs; every site
    by default), after ``edits``.

    Examples:
        >>> import torch
        >>> from attnlab import DecoderLM, ModelConfig
        >>> from attnlab.interpret import run_with_cache
        >>> model = DecoderLM(ModelConfig(family="decoder", vocab_size=50, d_model=32, n_heads=2,
        ...                               n_layers=2, max_len=16))
        >>> ids = torch.randint(0, 50, (1, 16))
        >>> (logits, _), cache = run_with_cache(model, ids, names="blocks.*.attn.pattern")
        >>> sorted(cache), cache["blocks.0.attn.pattern"].shape  # (B, H, T, T)
        (['blocks.0.attn.pattern', 'blocks.1.attn.pattern'], torch.Size([1, 2, 16, 16]))
    """
    with hooks(model, edits, cache=names) as cache:
        out = model(*inputs, **kwargs)
    return out, cache


def zero_heads(heads: Collection[int]) -> Edit:
    """An edit that zeroes heads ``heads`` of a (B, H, ...) site (``attn.z``, ``attn.pattern``,
    ``attn.q``, ...): those heads' share of the attention output is gone."""
    index = sorted(set(heads))

    def edit(x: Tensor, name: str) -> Tensor:
        check_index(index, x.size(1), "head", name)
        out = x.clone()
        out[:, index] = 0
        return out
    return edit


def check_index(index: Collection[int], n: int, what: str, where: str) -> None:
    """Each of ``index`` must be in 0..n-1 (a layer or a head); else a one-line error."""
    bad = [i for i in index if not 0 <= i < n]
    if bad:
        raise UsageError(f"{what} {bad[0]} is out of range at {where}: there are {n} {what}s "
                         f"(0..{n - 1})")


# ---- attention maps -------------------------------------------------------------------------
def resolve_layers(layers: Collection[int] | bool | None, n_layers: int, top: int = 0,
                   what: str = "layer") -> set[int]:
    """``True`` (all), ``None``/``False`` (none) or indices as a checked set; indices are
    checked against ``top`` if deeper (of two stacks), and this stack keeps those it has.
    (``what``: "head" when these index heads.)"""
    if layers is None or layers is False:
        return set()
    if layers is True:
        return set(range(n_layers))
    chosen, top = set(), max(top, n_layers)
    for i in layers:
        if not -top <= i < top:
            raise UsageError(f"{what} index {i} is out of range: there are {top} {what}s "
                             f"(0..{top - 1})")
        chosen |= {i % n_layers} if -n_layers <= i < n_layers else set()
    return chosen


@dataclass
class AttentionMaps:
    """Attention weights captured in one forward pass, by stack and layer.

    ``maps[stack][layer]`` is (B, H, T, S) for the stacks "encoder", "decoder" (self-attention)
    and "cross" (decoder queries over encoder memory). Only the layers asked for are present.
    """

    maps: dict[str, dict[int, Tensor]] = field(default_factory=dict)
    logits: Tensor | None = None

    def __getitem__(self, stack: str) -> dict[int, Tensor]:
        return self.maps[stack]

    def items(self):
        """(stack, {layer: weights}) pairs, as a dict's."""
        return self.maps.items()

    def stacked(self, stack: str) -> Tensor:
        """(L, B, H, T, S) tensor of the captured layers of one stack, in layer order."""
        layers = self.maps[stack]
        return torch.stack([layers[i] for i in sorted(layers)])

    def keep_heads(self, heads: Collection[int] | None, n_heads: int) -> AttentionMaps:
        """Keep only the heads ``heads`` (all when None) of every map, in place; returns self."""
        if heads is not None:
            idx = sorted(resolve_layers(heads, n_heads, what="head"))
            for stack in self.maps.values():
                for i, w in stack.items():
                    stack[i] = w[:, idx]  # (B, len(heads), T, S)
        return self


def pattern_sites(model: nn.Module) -> dict[str, str]:
    """Each attention stack of the model ("encoder", "decoder", "cross") -> its pattern site
    name with ``{}`` for the layer."""
    family = model.config.family
    if family == "encoder_decoder":
        return {"encoder": "encoder.blocks.{}.attn.pattern",
                "decoder": "decoder.blocks.{}.attn.pattern",
                "cross": "decoder.blocks.{}.cross.pattern"}
    return {family: "blocks.{}.attn.pattern"}


def attention_maps(model: nn.Module, *inputs: Tensor, layers: Collection[int] | bool = True,
                   heads: Collection[int] | None = None, **kwargs: Any) -> AttentionMaps:
    """One forward pass, ``model(*inputs, **kwargs)`` (``ids``; ``src, tgt`` for the
    encoder-decoder; ``mask=`` / ``src_mask=``), that keeps the attention weights of the
    chosen layers and heads (``maps["decoder"][layer]``: (B, H, T, S)) and the logits; the
    other layers stay on the fused path."""
    cfg = model.config
    depth = {"encoder": cfg.n_layers, "decoder": cfg.n_decoder_layers or cfg.n_layers,
             "cross": cfg.n_decoder_layers or cfg.n_layers}
    stacks = pattern_sites(model)
    top = max(depth[s] for s in stacks)
    chosen = {s: resolve_layers(layers, depth[s], top) for s in stacks}
    names = {s: {i: site.format(i) for i in sorted(chosen[s])} for s, site in stacks.items()}
    wanted = [n for by in names.values() for n in by.values()]
    with hooks(model, cache=wanted) as cache:
        logits = model(*inputs, **kwargs)[0]
    out = AttentionMaps({s: {i: cache[n] for i, n in by.items()} for s, by in names.items()},
                        logits)
    return out.keep_heads(heads, cfg.n_heads)
