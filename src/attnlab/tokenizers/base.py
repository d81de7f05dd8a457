"""The :class:`Tokenizer` interface every tokenizer of attnlab implements, and the names of
attnlab's own special tokens."""

from __future__ import annotations

import json
import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

FORMAT = "attnlab-tokenizer"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # attnlab's own, in id order (BPE, char)
MASK = "<mask>"  # masked-language-model inputs (BPETokenizer.train(mask=True))
ROLE_NAMES = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "mask": MASK}


def visible(s: str) -> str:
    """Make whitespace visible for plot labels (space -> '␣', newline -> '\\n')."""
    return s.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


class Tokenizer(ABC):
    """Common interface: text <-> list of integer ids, serialisable to JSON.

    Every tokenizer has ``vocab_size``, the special ids ``pad_id``, ``bos_id``, ``eos_id``,
    ``unk_id``, ``mask_id`` (None when it has no such token), ``encode(text, add_special)``,
    ``decode(ids, skip_special)``, ``token_strings(ids)`` (one printable string per id, for
    attention plots), ``to_dict()`` and ``save(path)``.
    """

    kind: ClassVar[str]
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    mask_id: int | None = None

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct ids; every id is in ``range(vocab_size)``."""

    @property
    def lm_pad_id(self) -> int | None:
        """The ``pad_id`` of a decoder over this tokenizer, whose loss leaves it out: the
        padding, unless it is also the end of text (GPT-2's), which the loss must see."""
        return self.pad_id if self.pad_id != self.eos_id else None

    @abstractmethod
    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of ``text``; with ``add_special`` wrapped in bos ... eos."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text (no specials added), each a 1-D ``np.uint32`` array.

        For tokenizing corpora: the caller runs one worker process per core, so this runs on
        the calling thread only, and the caller casts to its shard dtype. uint32 holds every
        id of any vocabulary and is what the fast paths produce without a copy. This default
        loops over ``encode``; tokenizers with a faster path override it.
        """
        return [np.asarray(self.encode(t, add_special=False), dtype=np.uint32)
                for t in self._check_texts(texts)]

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of ``ids`` (special tokens left out unless ``skip_special`` is False)."""

    @abstractmethod
    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One printable string per id, for axis labels of attention plots."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description; ``tokenizer_from_dict`` rebuilds the tokenizer."""

    @classmethod
    @abstractmethod
    def from_dict(cls, d: dict[str, Any]) -> Tokenizer:
        """Rebuild a tokenizer of this kind from ``to_dict()`` output."""

    def save(self, path: str | Path) -> None:
        """Write the tokenizer to one JSON file."""
        Path(path).write_text(json.dumps({"format": FORMAT, **self.to_dict()}), encoding="utf-8")

    @staticmethod
    def _check_texts(texts: Sequence[str]) -> list[str]:
        """``texts`` as a list of strings; a lone string (a batch of its characters) is named."""
        if isinstance(texts, (str, bytes)):
            raise TypeError(f"encode_batch takes a sequence of texts, got the single "
                            f"{type(texts).__name__} {texts[:20]!r} (pass [text], or use encode)")
        texts = list(texts)
        bad = next((t for t in texts if not isinstance(t, str)), None)
        if bad is not None:
            raise TypeError(f"encode_batch takes a sequence of str, got an item of type "
                            f"{type(bad).__name__}: {str(bad)[:40]}")
        return texts

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        """Ids as a list of ints, each checked to lie in ``range(vocab_size)``."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"ids must be integer token ids, got the string {ids[:20]!r} (text "
                            "goes to encode)")
        if hasattr(ids, "tolist"):
            ids = ids.tolist()  # torch / numpy
        try:
            out = [operator.index(i) for i in ids]  # ints only: no silent int(2.7) or int("3")
        except TypeError:
            raise TypeError(f"ids must be a flat sequence of integer token ids, got "
                            f"{str(ids)[:60]}") from None
        bad = [i for i in out if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are out of range for a {self.kind} tokenizer "
                             f"(ids must be in 0..{self.vocab_size - 1})")
        return out

    def _add_special(self, ids: list[int], add_special: bool) -> list[int]:
        """Wrap ids in bos/eos when asked; error if this tokenizer has none."""
        if not add_special:
            return ids
        if self.bos_id is None or self.eos_id is None:
            raise ValueError(f"this {self.kind} tokenizer has no bos/eos tokens, so "
                             "add_special=True is not possible (build it with those specials)")
        return [self.bos_id, *ids, self.eos_id]
