"""attnlab: the Transformer of "Attention Is All You Need" and its encoder-only and
decoder-only descendants, as small, readable, tested PyTorch."""

from .config import ConfigError, ModelConfig
from .models import (
    AttentionMaps,
    DecoderLM,
    EncoderClassifier,
    Transformer,
    build_model,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionMaps",
    "ConfigError",
    "DecoderLM",
    "EncoderClassifier",
    "ModelConfig",
    "Transformer",
    "__version__",
    "build_model",
]
