"""Plain-text corpora for language modelling, and nanoGPT-style random-window batches.

:func:`read_text` reads a UTF-8 file with clear errors; :func:`embedded_corpus` returns an
English corpus that every Python install has offline (the documentation topics of
``pydoc_data``); :class:`LMData` splits a token stream into train/val and samples
``(x, y)`` windows, ``y`` being ``x`` shifted by one token.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path

import torch

from attnlab.data.errors import DataError, DataFileNotFoundError
from attnlab.tokenizers import Tokenizer

SPLITS = ("train", "val")

# Typographic characters in the pydoc topics and their ASCII spellings.
_ASCII_SUBSTITUTES = {"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'",
                      "\u2013": "-", "\u2014": "--", "\u2026": "...", "\u00b0": " degrees",
                      "\u00df": "ss", "\t": "    ", "\u00a0": " "}


def read_text(path: str | Path, what: str = "text file") -> str:
    """Read a non-empty UTF-8 text file.

    Raises :class:`DataFileNotFoundError` when ``path`` does not exist and
    :class:`DataError` when it is a directory, is empty, or is not valid UTF-8.
    ``what`` names the file's role in messages (e.g. ``"source file"``).
    """
    path = Path(path)
    if not path.exists():
        raise DataFileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise DataError(f"{what} {path} is a directory; expected a UTF-8 text file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark (Notepad, Excel) is dropped
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{what} {path} is not UTF-8 text: undecodable byte "
                        f"0x{raw[e.start]:02x} at byte offset {e.start} (line {line}); "
                        "convert the file to UTF-8") from e
    if not text.strip():  # (after decoding: a byte-order mark alone is empty too)
        raise DataError(f"{what} {path} is empty (or only whitespace); expected UTF-8 text")
    return text


def to_printable_ascii(text: str) -> str:
    """Normalise text to printable ASCII plus newline (typographic quotes become ASCII ones)."""
    text = text.replace("\r\n", "\n")
    text = "".join(_ASCII_SUBSTITUTES.get(c, c) for c in text)
    text = unicodedata.normalize("NFKD", text)
    return "".join(c for c in text if c == "\n" or " " <= c <= "~")


def embedded_corpus() -> str:
    """English text available offline in every Python install: the ``pydoc_data`` topics.

    The topic texts (the language reference sections that ``help()`` shows) are joined in
    sorted topic order and normalised to printable ASCII plus
    newline, so a character vocabulary has fewer than 100 symbols. The exact text depends on
    the Python version.
    """
    from pydoc_data.topics import topics

    joined = "\n\n".join(topics[k].strip("\n") for k in sorted(topics))
    return to_printable_ascii(joined) + "\n"


class LMData:
    """A token stream split into ``train`` (first part) and ``val`` (last part) tensors.

    Args:
        ids: the whole corpus as token ids (a list or 1-D tensor).
        train_frac: fraction of tokens that go to ``train`` (default 0.9, as in nanoGPT).
    """

    def __init__(self, ids: Sequence[int] | torch.Tensor, train_frac: float = 0.9) -> None:
        try:
            data = torch.as_tensor(ids)  # (its dtype first: dtype=long would truncate 2.7)
        except (TypeError, ValueError, RuntimeError):
            raise DataError("LMData needs token ids (encode the text first, or use "
                            f"LMData.from_text), got {str(ids)[:40]}") from None
        if data.dim() != 1:
            raise DataError(f"LMData needs a 1-D sequence of token ids, got shape "
                            f"{tuple(data.shape)}")
        if data.dtype.is_floating_point:
            raise DataError(f"LMData needs integer token ids, got {data.dtype} values")
        if len(data) and int(data.min()) < 0:
            raise DataError(f"LMData needs token ids >= 0, got {int(data.min())}")
        data = data.long()
        if not 0.0 < train_frac < 1.0:
            raise DataError(f"train_frac must be between 0 and 1 (exclusive), got {train_frac}")
        n = int(train_frac * len(data))
        if n < 1 or n >= len(data):
            raise DataError(f"a corpus of {len(data)} tokens is too short to split with "
                            f"train_frac={train_frac}: both train and val need tokens")
        self.train, self.val = data[:n], data[n:]

    @classmethod
    def from_text(cls, text: str, tokenizer: Tokenizer, train_frac: float = 0.9) -> LMData:
        """Encode ``text`` with any :class:`attnlab.tokenizers.Tokenizer` and split it."""
        return cls(tokenizer.encode(text), train_frac)

    def split(self, name: str) -> torch.Tensor:
        """The token tensor of split ``name`` (``"train"`` or ``"val"``)."""
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r}; allowed: {', '.join(SPLITS)}")
        return self.train if name == "train" else self.val

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: torch.Generator,
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``batch_size`` random windows of ``block_size`` tokens, as nanoGPT does.

        Returns ``(x, y)``, both ``[batch_size, block_size]`` long tensors with
        ``y[:, t] == x[:, t + 1]`` inside the window (``y`` is the next token of each position).
        """
        data = self.split(split)
        if batch_size < 1 or block_size < 1:
            raise DataError(f"batch_size and block_size must be >= 1, got {batch_size} and "
                            f"{block_size}")
        if block_size + 1 > len(data):
            raise DataError(f"block_size {block_size} is too long for the {split} split of "
                            f"{len(data)} tokens (need block_size + 1 <= {len(data)}); use a "
                            "smaller block_size or more data")
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
        x = torch.stack([data[i: i + block_size] for i in ix.tolist()])
        y = torch.stack([data[i + 1: i + 1 + block_size] for i in ix.tolist()])
        if device is not None:
            x, y = x.to(device), y.to(device)
        return x, y
