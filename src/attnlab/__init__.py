"""attnlab: the Transformer of "Attention Is All You Need" and its encoder-only and
decoder-only descendants, as small, readable, tested PyTorch.

A trained run in three lines (after ``attnlab train shakespeare_char``, or any decoder run)::

    import attnlab

    run = attnlab.load_run("runs/shakespeare_char")  # model (eval mode) + tokenizer + config
    print(attnlab.generate_text(run.model, run.tokenizer, "ROMEO:", 100, top_k=40, seed=0)[0])

The names below are imported on first use, so ``import attnlab.cli`` (and ``attnlab --help``)
does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS = {
    "AttentionMaps": ".interpret",
    "ConfigError": ".errors",
    "InputError": ".errors",
    "DecoderLM": ".models",
    "EncoderClassifier": ".models",
    "MaskedLM": ".models",
    "ModelConfig": ".config",
    "Transformer": ".models",
    "attention_maps": ".interpret",
    "build_model": ".models",
    "count_parameters": ".info",
    "generate_text": ".decoding",
    "load_run": ".runs",
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
