"""Choosing the next token from logits: greedy, temperature, top-k and nucleus (top-p).

Shapes: B batch (rows), V vocab.

Every function works on a whole batch of rows at once and never moves data to the host, so a
decoding loop that calls them does not synchronise with the device at every token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError


@dataclass(frozen=True)
class Sampler:
    """How to pick the next token; validated on construction (a temperature, top-k or top-p
    out of range is a :class:`~attnlab.errors.ConfigError`).

    Args:
        temperature: 0 picks the most likely token (greedy); > 0 divides the logits by it
            before sampling (< 1 sharper, > 1 flatter). Negative values are an error.
        top_k: keep only the k most likely tokens (None or 0 = all).
        top_p: nucleus sampling (Holtzman et al. 2020): keep the smallest set of most likely
            tokens whose probabilities add up to at least ``top_p``; in (0, 1], 1 = all.
        vocab: draw only ids below it (a model with more embedding rows than its tokenizer
            has tokens, e.g. padded to a multiple of 64: the others have no text); None = all.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    vocab: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ConfigError(f"temperature={t!r} is not allowed: a number >= 0 "
                              "(0 = greedy, 1 = the model's distribution)")
        k = self.top_k
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise ConfigError(f"top_k={k!r} is not allowed: a positive integer, or 0/None for "
                              "no top-k filtering")
        v = self.vocab
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"vocab={v!r} is not allowed: a positive integer, or None for all")
        p = self.top_p
        if p is not None and (not isinstance(p, (int, float)) or isinstance(p, bool)
                              or not 0.0 < p <= 1.0):
            raise ConfigError(f"top_p={p!r} is not allowed: a probability in (0, 1] "
                              "(1 or None = no nucleus filtering)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def __call__(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Next token ids (B,) from logits (B, V)."""
        if self.vocab is not None:
            logits = logits[..., :self.vocab]
        logits = logits.float()  # exact from bf16 / fp16, whose argmax is slower on a CPU
        if self.greedy:
            return logits.argmax(dim=-1)
        # The largest logit moved to 0 first, and the temperature kept a normal float32: a tiny
        # temperature gives -inf to the others (the argmax), never inf - inf or 0 / 0 (nan).
        t = max(self.temperature, torch.finfo(torch.float32).tiny)
        logits = (logits - logits.amax(dim=-1, keepdim=True)) / t
        logits = filter_logits(logits, self.top_k, self.top_p)
        probs = torch.softmax(logits, dim=-1)  # (B, V)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set the logits of the tokens that top-k / top-p leave out to -inf.

    logits (B, V) -> (B, V). The most likely token always survives, so no row is empty.
    Ties at the k-th logit are all kept.
    """
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Probability mass strictly before each token: a token is kept while the tokens ahead
        # of it add up to less than top_p, so the set reaches top_p with the fewest tokens.
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def make_generator(seed: int | None, generator: torch.Generator | None,
                   device: torch.device) -> torch.Generator | None:
    """The generator to sample with: ``generator`` as given, else a new one seeded with
    ``seed`` on ``device``, else None (torch's global generator)."""
    if generator is not None:
        if seed is not None:
            raise ValueError("pass either seed or generator, not both")
        return generator
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(seed))


__all__ = ["Sampler", "filter_logits", "make_generator"]
