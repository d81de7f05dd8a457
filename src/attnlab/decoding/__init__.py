"""Decoding: turning trained models into outputs, one module per job.

:mod:`~attnlab.decoding.lm` (generation with a decoder-only LM), ``sampling`` (the next-token
rules), ``stream`` (stop strings, incremental detokenising), ``translate`` (greedy and beam
search), ``classify`` (an encoder classifier's predictions) and ``quant`` (reduced-precision
weights). Every function takes a model (and tokenizers), never a run dir. The speed tools the
loops apply live in :mod:`attnlab.speed` and are re-exported here. The package attributes
``stream``, ``translate`` and ``classify`` are the functions, not the modules of those names.
"""

from ..speed import decoding_kernels, direct_attributes, inference_layout, layout_pays
from .classify import Classification, classify, classify_texts
from .lm import FINISHED, generate, generate_text, stream, stream_text, window_keep
from .quant import INFERENCE_DTYPES, PackedLinear, to_inference_dtype
from .sampling import Sampler, filter_logits, make_generator
from .stream import StopChecker, TextStream, cut_at_stop
from .translate import (
    beam_search,
    decode_limit,
    greedy_search,
    translate,
    translate_texts,
)

__all__ = [
    "FINISHED",
    "INFERENCE_DTYPES",
    "Classification",
    "Sampler",
    "StopChecker",
    "TextStream",
    "beam_search",
    "classify",
    "classify_texts",
    "cut_at_stop",
    "decode_limit",
    "decoding_kernels",
    "direct_attributes",
    "filter_logits",
    "generate",
    "generate_text",
    "greedy_search",
    "inference_layout",
    "layout_pays",
    "make_generator",
    "PackedLinear",
    "stream",
    "stream_text",
    "translate",
    "to_inference_dtype",
    "translate_texts",
    "window_keep",
]
