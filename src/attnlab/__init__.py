"""attnlab: the Transformer of "Attention Is All You Need" and its encoder-only and
decoder-only descendants, as small, readable, tested PyTorch.

The names below are imported on first use, so ``import attnlab.cli`` (and ``attnlab --help``)
does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "AttentionMaps": ".models",
    "ConfigError": ".config",
    "DecoderLM": ".models",
    "EncoderClassifier": ".models",
    "MaskedLM": ".models",
    "ModelConfig": ".config",
    "Transformer": ".models",
    "build_model": ".models",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
