"""The three model families, each built from a :class:`~attnlab.config.ModelConfig`."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from .common import AttentionMaps, count_parameters, token_loss
from .decoder import DecoderLM
from .encoder import EncoderClassifier
from .encoder_decoder import Transformer

FAMILIES: dict[str, type[nn.Module]] = {
    "encoder_decoder": Transformer,
    "encoder": EncoderClassifier,
    "decoder": DecoderLM,
}


def build_model(config: ModelConfig) -> nn.Module:
    """The model class of ``config.family``, built from ``config``."""
    return FAMILIES[config.family](config)


__all__ = ["FAMILIES", "AttentionMaps", "DecoderLM", "EncoderClassifier", "Transformer",
           "build_model", "count_parameters", "token_loss"]
