"""Tokenizers behind one small interface (:class:`Tokenizer`): characters (:class:`CharTokenizer`),
ids (:class:`IdTokenizer`), trained BPE, GPT-2's BPE, BERT's WordPiece and any Hugging Face
``tokenizer.json`` (:class:`PretrainedTokenizer`).

Special tokens come only from ``add_special=True``: a special token's spelling inside a text
(``"<|endoftext|>"``, ``"[SEP]"``) is encoded as ordinary text, so no text forges one.
Tokenizers round-trip through JSON (:func:`tokenizer_from_dict`, :func:`load_tokenizer`);
:mod:`attnlab.interop.hf_tokenizer` reads and writes Hugging Face's files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import DataError, DataFileNotFoundError, InputError
from .base import FORMAT, MASK, SPECIALS, Tokenizer
from .simple import CharTokenizer, IdTokenizer
from .subword import (
    BPETokenizer,
    GPT2Tokenizer,
    PretrainedTokenizer,
    WordPieceTokenizer,
)

_KINDS: dict[str, type[Tokenizer]] = {
    k.kind: k for k in (CharTokenizer, BPETokenizer, GPT2Tokenizer, WordPieceTokenizer,
                        PretrainedTokenizer, IdTokenizer)}


def tokenizer_from_dict(d: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from ``Tokenizer.to_dict()`` output."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind not in _KINDS:
        raise DataError(f"unknown tokenizer kind {kind!r}; allowed: {', '.join(_KINDS)}")
    try:
        return _KINDS[kind].from_dict(d)
    except (KeyError, TypeError) as e:
        raise DataError(f"malformed {kind} tokenizer description: missing or bad field {e}") from e
    except InputError:
        raise
    except Exception as e:  # a bad value, or tokenizers' bare Exception for a malformed hf_json
        raise DataError(f"malformed {kind} tokenizer description: {e}") from None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a tokenizer written by ``Tokenizer.save``."""
    path = Path(path)
    if not path.is_file():
        raise DataFileNotFoundError(f"tokenizer file {path} does not exist")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"tokenizer file {path} is not valid JSON ({e})") from e
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise DataError(f"{path} is not an attnlab tokenizer file (expected a JSON object with "
                        f"\"format\": \"{FORMAT}\", as written by Tokenizer.save)")
    return tokenizer_from_dict(d)


__all__ = [
    "FORMAT",
    "MASK",
    "SPECIALS",
    "BPETokenizer",
    "CharTokenizer",
    "GPT2Tokenizer",
    "IdTokenizer",
    "PretrainedTokenizer",
    "Tokenizer",
    "WordPieceTokenizer",
    "load_tokenizer",
    "tokenizer_from_dict",
]
