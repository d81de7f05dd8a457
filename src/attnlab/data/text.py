"""Plain-text corpora for language modelling.

:func:`read_text` reads a UTF-8 file with clear errors; :func:`embedded_corpus` returns an
English corpus that every Python install has offline (the documentation topics of
``pydoc_data``). Training reads a corpus through the memory maps of a prepared token dir
(:mod:`attnlab.data.shards`).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from attnlab.data.errors import DataError, DataFileNotFoundError

# Typographic characters in the pydoc topics and their ASCII spellings.
_ASCII_SUBSTITUTES = {"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'",
                      "\u2013": "-", "\u2014": "--", "\u2026": "...", "\u00b0": " degrees",
                      "\u00df": "ss", "\t": "    ", "\u00a0": " "}


def check_text_file(path: str | Path, what: str = "text file") -> Path:
    """``path``, a file that exists: :class:`DataFileNotFoundError` when it does not exist,
    :class:`DataError` when it is a folder. ``what`` names its role in messages."""
    path = Path(path)
    if not path.exists():
        raise DataFileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise DataError(f"{what} {path} is a directory; expected a UTF-8 text file")
    return path


def read_text(path: str | Path, what: str = "text file") -> str:
    """Read a non-empty UTF-8 text file.

    Raises :class:`DataFileNotFoundError` when ``path`` does not exist and
    :class:`DataError` when it is a directory, is empty, or is not valid UTF-8.
    ``what`` names the file's role in messages (e.g. ``"source file"``).
    """
    path = check_text_file(path, what)
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
