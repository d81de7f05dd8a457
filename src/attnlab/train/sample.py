"""Samples from a trained language model, as ``attnlab train`` prints them at the end of a run
(``train.samples``, ``train.sample_tokens``, ``train.temperature``, ``train.top_k``)."""

from __future__ import annotations

from torch import nn

from ..run_config import RunConfig
from ..tokenizers import Tokenizer


def sample_texts(model: nn.Module, tokenizer: Tokenizer, rc: RunConfig,
                 prompt: str = "\n") -> list[str]:
    """``train.samples`` continuations of ``prompt`` from a trained LM (top-k sampling)."""
    from ..decoding import generate_text

    t = rc.train
    model.eval()
    return generate_text(model, tokenizer, prompt, t.sample_tokens,
                         temperature=t.temperature, top_k=t.top_k or None, seed=t.seed,
                         num_samples=t.samples)
