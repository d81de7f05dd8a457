"""What the Hugging Face ``transformers`` converters share: the lazy import, loading a local model
directory, activation names and the nn.Linear / LayerNorm weight mappings.

``transformers`` is imported lazily (``pip install attnlab[hf]``). Each architecture has its own
module (:mod:`.gpt2`, :mod:`.bert`) holding its parameter-name mapping in both directions; the
converted models compute the same function as the originals in eval mode (tested to 1e-4 in
fp32, on random weights and on the real all-MiniLM-L6-v2 checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import Tensor, nn

_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh formula, written differently
    "gelu": "gelu",
    "relu": "relu",
}
_TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "Hugging Face interop needs transformers: pip install attnlab[hf]"
        ) from e
    return transformers


def _load(model_or_dir: Any, cls_name: str) -> nn.Module:
    """``model_or_dir`` itself, or ``transformers.<cls_name>`` loaded from a local directory."""
    if not isinstance(model_or_dir, (str, os.PathLike)):
        return model_or_dir
    path = Path(model_or_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory: no config.json")
    return getattr(_transformers(), cls_name).from_pretrained(path, local_files_only=True)


def _activation(name: str, allowed: tuple[str, ...]) -> str:
    if name not in allowed:
        raise ValueError(f"activation {name!r} is not supported: one of {', '.join(allowed)}")
    return _ACTIVATIONS[name]


def _linear(sd: dict[str, Tensor], src: str, dst: str, conv1d: bool = False) -> dict[str, Tensor]:
    """nn.Linear ``src`` -> ``dst``; GPT-2's Conv1D stores the weight (in, out): transpose."""
    w = sd[f"{src}.weight"]
    return {f"{dst}.weight": w.t() if conv1d else w, f"{dst}.bias": sd[f"{src}.bias"]}


def _norm(sd: dict[str, Tensor], src: str, dst: str) -> dict[str, Tensor]:
    return {f"{dst}.weight": sd[f"{src}.weight"], f"{dst}.bias": sd[f"{src}.bias"]}
