"""Parallel corpora for translation: two line-aligned text files (e.g. Multi30k train.de/en).

:func:`read_parallel` reads both files whole (a val or test split); :func:`iter_parallel`
streams the line pairs of files of any size, plain or ``.gz`` / ``.zst``, a block at a time
(:func:`attnlab.data.pairs.prepare_pairs` tokenizes a training corpus from it), splitting
lines exactly as :func:`read_lines` does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from attnlab.data.errors import DataError
from attnlab.data.sources import BLOCK, Source, source_of, text_blocks
from attnlab.data.text import check_text_file, read_text

log = logging.getLogger(__name__)


def read_lines(path: str | Path, what: str = "text file") -> list[str]:
    """Lines of a UTF-8 file (LF, CRLF or a lone CR, as Python's universal newlines); a final
    newline does not add an empty line."""
    lines = read_text(path, what).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> list[tuple[str, str]]:
    """Read line-aligned source/target files into ``(source, target)`` sentence pairs.

    Line ``i`` of ``src_path`` translates line ``i`` of ``tgt_path``. Lines are stripped;
    pairs where either side is empty are skipped (their number is logged at INFO).

    Raises:
        DataFileNotFoundError: a file is missing.
        DataError: a file is empty or not UTF-8, the files have different numbers of lines,
            or no non-empty pair is left.
    """
    src = read_lines(src_path, "source file")
    tgt = read_lines(tgt_path, "target file")
    if len(src) != len(tgt):
        raise _misaligned(src_path, tgt_path, len(src), len(tgt))
    pairs = [(s.strip(), t.strip()) for s, t in zip(src, tgt)]
    kept = [(s, t) for s, t in pairs if s and t]
    skipped = len(pairs) - len(kept)
    if skipped:
        log.info("read_parallel: skipped %d of %d pairs with an empty side (%s, %s)",
                 skipped, len(pairs), src_path, tgt_path)
    if not kept:
        raise DataError(f"parallel files {src_path} and {tgt_path} have no pair of non-empty "
                        "lines")
    return kept


def _misaligned(src_path: str | Path, tgt_path: str | Path, n_src: int, n_tgt: int) -> DataError:
    return DataError(f"parallel files are not aligned: source {src_path} has {n_src} lines but "
                     f"target {tgt_path} has {n_tgt} lines (line i of one must translate line i "
                     "of the other)")


def _source(path: str | Path, what: str) -> Source:
    """The :class:`~attnlab.data.sources.Source` of a line-aligned file (any name is text;
    ``.gz`` / ``.zst`` are decompressed)."""
    return source_of(check_text_file(path, what), ".txt")


def iter_lines(path: str | Path, what: str = "text file", errors: str = "strict"
               ) -> Iterator[str]:
    """The lines of a UTF-8 file one at a time, split as :func:`read_lines` splits them (LF,
    CRLF or a lone CR; a final newline adds no empty line), read a block at a time."""
    pending = ""
    for block in text_blocks(_source(path, what), errors):
        text = pending + block
        held = ""
        if text.endswith("\r"):  # perhaps the first half of a CRLF cut by the block
            text, held = text[:-1], "\r"
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        pending = lines.pop() + held
        yield from lines
    if pending.endswith("\r"):
        yield pending[:-1]
    elif pending:
        yield pending


def count_lines(path: str | Path, what: str = "text file") -> int:
    """How many lines :func:`iter_lines` yields, counted in the raw bytes (a newline byte is
    never part of another UTF-8 character): a quick first pass that checks alignment before
    any work."""
    source = _source(path, what)
    n, size, prev_cr, last, bom = 0, 0, False, b"", False
    with source.open() as f:
        while data := f.read(BLOCK):
            if not size:
                bom = data.startswith(b"\xef\xbb\xbf")
            crlf = data.count(b"\r\n") + (prev_cr and data.startswith(b"\n"))
            n += data.count(b"\n") + data.count(b"\r") - crlf
            size += len(data)
            prev_cr, last = data.endswith(b"\r"), data[-1:]
    if size - 3 * bom > 0 and last not in (b"\n", b"\r"):
        n += 1  # a last line without a newline
    return n


def aligned_lines(src_path: str | Path, tgt_path: str | Path) -> int:
    """The number of lines of two line-aligned files; one :class:`DataError` naming both
    files and both counts when they differ, or when they are empty."""
    n_src = count_lines(src_path, "source file")
    n_tgt = count_lines(tgt_path, "target file")
    if n_src != n_tgt:
        raise _misaligned(src_path, tgt_path, n_src, n_tgt)
    if not n_src:
        raise DataError(f"parallel files {src_path} and {tgt_path} are empty; expected UTF-8 "
                        "text, one sentence per line")
    return n_src


def iter_parallel(src_path: str | Path, tgt_path: str | Path, errors: str = "strict"
                  ) -> Iterator[tuple[str, str]]:
    """Every line pair of two line-aligned files, stripped, streamed a block at a time; pairs
    with an empty side included (the caller skips them, as :func:`read_parallel` does).
    Call :func:`aligned_lines` first: a difference found only here is one error at the end."""
    src = iter_lines(src_path, "source file", errors)
    tgt = iter_lines(tgt_path, "target file", errors)
    n = 0
    try:
        for s, t in zip(src, tgt, strict=True):
            n += 1
            yield s.strip(), t.strip()
    except ValueError as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"parallel files {src_path} and {tgt_path} are not aligned: one ends "
                        f"after line {n}, the other goes on (did one change while it was "
                        "read?)") from None
