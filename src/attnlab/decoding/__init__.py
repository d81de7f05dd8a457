"""Decoding: turning trained models into outputs, one module per job.

* :mod:`~attnlab.decoding.lm`: generation with a decoder-only LM (KV cache, left-padded
  batches, sliding context window, stop conditions, streaming).
* :mod:`~attnlab.decoding.sampling`: the next-token rules (greedy, temperature, top-k, top-p).
* :mod:`~attnlab.decoding.stream`: stop strings and incremental detokenisation.
* :mod:`~attnlab.decoding.translate`: greedy and beam search for the encoder-decoder, and
  :func:`translate_texts` (text in, text out).
* :mod:`~attnlab.decoding.classify`: batch prediction with an encoder classifier.
* :mod:`~attnlab.decoding.quant`: reduced-precision inference (bf16, fp16 and int8 weights).

The speed tools the decoding loops apply (:func:`inference_layout`, :func:`layout_pays`,
:func:`decoding_kernels`, :func:`direct_attributes`) live in :mod:`attnlab.speed` and are
re-exported here for callers that prepare a model for decoding.

Nothing here knows about run dirs: every function takes a model (and tokenizers).

The functions ``stream``, ``translate`` and ``classify`` are exported here, so those attributes
of the package are the functions; import from the modules of the same names with
``from attnlab.decoding.stream import ...`` and so on.
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
