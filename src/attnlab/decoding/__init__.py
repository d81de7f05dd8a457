"""Decoding building blocks: sampling rules, greedy / beam search for translation, and the
text helpers behind the CLI. The public entry points are re-exported by
:mod:`attnlab.generate`."""

from .sampling import Sampler, filter_logits, make_generator
from .text import (
    Classification,
    StopChecker,
    TextStream,
    classify,
    classify_texts,
    cut_at_stop,
    translate_texts,
)
from .translate import beam_search, greedy_search, translate

__all__ = [
    "Classification",
    "Sampler",
    "StopChecker",
    "TextStream",
    "beam_search",
    "classify",
    "classify_texts",
    "cut_at_stop",
    "filter_logits",
    "greedy_search",
    "make_generator",
    "translate",
    "translate_texts",
]
