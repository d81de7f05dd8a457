"""Parallel corpora for translation: two line-aligned text files (e.g. Multi30k train.de/en)."""

from __future__ import annotations

import logging
from pathlib import Path

from attnlab.data.errors import DataError
from attnlab.data.text import read_text

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
        raise DataError(f"parallel files are not aligned: source {src_path} has {len(src)} "
                        f"lines but target {tgt_path} has {len(tgt)} lines (line i of one must "
                        "translate line i of the other)")
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
