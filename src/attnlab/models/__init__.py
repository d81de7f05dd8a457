"""The three model families, each built from a :class:`~attnlab.config.ModelConfig`."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from ..nn import token_loss
from .decoder import DecoderLM
from .encoder import EncoderClassifier, MaskedLM
from .encoder_decoder import Transformer


def build_model(config: ModelConfig) -> nn.Module:
    """The model of ``config.family`` (an encoder's by ``config.head``), built from it.

    Examples:
        >>> cfg = ModelConfig(family="encoder", head="mlm", vocab_size=9, d_model=8, n_heads=2)
        >>> type(build_model(cfg)).__name__
        'MaskedLM'"""
    if config.family == "encoder":
        return (MaskedLM if config.head == "mlm" else EncoderClassifier)(config)
    return (DecoderLM if config.family == "decoder" else Transformer)(config)


__all__ = ["DecoderLM", "EncoderClassifier", "MaskedLM",
           "Transformer", "build_model", "token_loss"]
