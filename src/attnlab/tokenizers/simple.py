"""Tokenizers without a learned vocabulary: one id per character, or the ids themselves."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import VocabularyError
from .base import ROLE_NAMES, Tokenizer, visible


class CharTokenizer(Tokenizer):
    """One id per character; special tokens (e.g. ``"<pad>"``) take the first ids.

    Unknown characters raise ``ValueError`` unless ``"<unk>"`` is one of the specials, in
    which case they map to it. Specials recognised by name: ``<pad> <bos> <eos> <unk> <mask>``.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str], specials: Sequence[str] = ()) -> None:
        chars, specials = list(chars), list(specials)
        if not chars:
            raise ValueError("CharTokenizer needs at least one character")
        if any(len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer chars must be distinct single characters")
        if any(len(s) < 2 for s in specials) or len(set(specials)) != len(specials):
            raise ValueError(f"special tokens must be distinct strings of 2+ characters such as "
                             f"'<pad>', got {specials!r}")
        self._chars, self._specials = chars, specials
        self._itos = specials + chars
        self._stoi = {s: i for i, s in enumerate(self._itos)}
        for role, name in ROLE_NAMES.items():
            setattr(self, f"{role}_id", self._stoi.get(name))

    @classmethod
    def from_text(cls, text: str, specials: Sequence[str] = ()) -> CharTokenizer:
        """Vocabulary = sorted unique characters of ``text``, after the ``specials``."""
        if not text:
            raise ValueError("cannot build a CharTokenizer from an empty text")
        return cls(sorted(set(text)), specials)

    def with_unk(self) -> CharTokenizer:
        """This vocabulary with ``<unk>`` (after the other specials), which every character
        outside it maps to (``data.unk = true``); itself when it has one."""
        if self.unk_id is not None:
            return self
        return CharTokenizer(self._chars, [*self._specials, "<unk>"])

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self._add_special(self._ids(text).tolist(), add_special)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = self._check_texts(texts)
        if not texts:
            return []
        ids = self._ids("".join(texts)).view(np.uint32)  # one pass: no per-text overhead
        return np.split(ids, np.cumsum([len(t) for t in texts[:-1]]))

    def _ids(self, text: str) -> np.ndarray:
        """Ids of ``text`` as int32 (the one implementation behind encode and encode_batch):
        code points looked up in a dense table, so a corpus costs numpy work, not a dict
        lookup per character."""
        # surrogatepass: a lone surrogate is one code point, as it is one character of text
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        table = self._table()
        ids = table[np.minimum(points, len(table) - 1)]
        unknown = ids < 0
        if unknown.any():
            if self.unk_id is None:
                bad = [chr(p) for p in np.unique(points[unknown]).tolist()]
                shown = ", ".join(repr(c) for c in bad[:10]) + (" ..." if len(bad) > 10 else "")
                raise VocabularyError(
                    f"{len(bad)} character(s) not in the vocabulary of this character "
                    f"tokenizer: {shown}. The vocabulary has {len(self._chars)} characters, taken "
                    "from the training text; use only characters that occur there (or train "
                    "with --set data.unk=true, a tokenizer that maps unknown characters to "
                    "<unk>)")
            ids[unknown] = self.unk_id
        return ids

    def _table(self) -> np.ndarray:
        """Code point -> id, -1 where not in the vocabulary, built on first use; its last entry
        (-1) stands for every code point above the vocabulary's largest."""
        table = self.__dict__.get("_lookup")
        if table is None:
            points = np.array([ord(c) for c in self._chars], dtype=np.int64)
            table = np.full(int(points.max()) + 2, -1, dtype=np.int32)
            table[points] = np.arange(len(self._specials), len(self._itos), dtype=np.int32)
            self._lookup = table
        return table

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        n_special = len(self._specials) if skip_special else 0
        return "".join(self._itos[i] for i in self._check_ids(ids) if i >= n_special)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [visible(self._itos[i]) for i in self._check_ids(ids)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": "".join(self._chars), "specials": self._specials}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CharTokenizer:
        return cls(d["chars"], d.get("specials", ()))


class IdTokenizer(Tokenizer):
    """Text = token ids written as decimal numbers separated by spaces (``"5 9 4 12"``).

    For data made of ids (the synthetic copy / reverse / sort tasks): the first
    ``len(specials)`` ids are the special tokens (``<pad> <bos> <eos>`` by default), the others
    are content ids. Encoding accepts only content ids; anything else raises ``ValueError``.
    """

    kind = "ids"

    def __init__(self, vocab_size: int, specials: Sequence[str] = ("<pad>", "<bos>", "<eos>")):
        specials = list(specials)
        if vocab_size <= len(specials):
            raise ValueError(f"IdTokenizer vocab_size must be > {len(specials)} (the specials "
                             f"{specials}), got {vocab_size}")
        self._size, self._specials = int(vocab_size), specials
        for role, name in ROLE_NAMES.items():
            setattr(self, f"{role}_id", specials.index(name) if name in specials else None)

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        first, last = len(self._specials), self._size - 1
        ids = []
        for word in text.split():
            if not (word.isascii() and word.isdigit()) or not first <= int(word) <= last:
                raise VocabularyError(f"{word!r} is not a token id of this run: the text must be "
                                      f"token ids separated by spaces, each in {first}..{last}")
            ids.append(int(word))
        return self._add_special(ids, add_special)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        first = len(self._specials) if skip_special else 0
        return " ".join(self.token_strings([i for i in self._check_ids(ids) if i >= first]))

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        n = len(self._specials)
        return [self._specials[i] if i < n else str(i) for i in self._check_ids(ids)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self._size, "specials": self._specials}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IdTokenizer:
        return cls(d["vocab_size"], d.get("specials", ("<pad>", "<bos>", "<eos>")))
