"""The metrics log of a training run: its CSV format, written by
:class:`attnlab.train.monitor.Monitor` and read back by :func:`read_metrics`.

One row per logged or evaluated step, with the header :data:`BASE_COLUMNS` followed by the
task's metrics (``ppl``, ``bleu``, ``accuracy``, ``f1``); a cell is empty when that value was
not measured at that step.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from .errors import RunError

BASE_COLUMNS = ("step", "train_loss", "val_loss", "lr", "tokens_per_s", "elapsed_s")

Row = dict[str, int | float | None]


def format_cell(value: Any) -> str:
    """A value as its CSV cell: empty for None, floats to 8 significant digits."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.8g}"
    return str(value)


def read_metrics(path: str | Path, complete: bool = False) -> list[Row]:
    """The rows of a metrics log: one dict per row in header order, ``step`` as int, other
    cells as floats, empty cells as None.

    Args:
        path: the CSV file (a byte-order mark, as Excel saves it, is allowed).
        complete: leave out a last line without its newline (a row cut by a kill or a full
            disk).

    Raises:
        RunError: a header without ``step``, an empty step cell, a step that is not a whole
            number >= 0, or a cell that is not a number; names the line and column.
    """
    path = Path(path)
    with path.open(newline="", encoding="utf-8-sig") as f:
        text = f.read()
    if complete and not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    if "step" not in header:
        raise RunError(f"{path} must have a header with 'step'; got header {header}")
    return [_parse_row(path, line_no, header, cells)
            for line_no, cells in enumerate(reader, start=2)
            if any(c.strip() for c in cells)]  # (a blank line: no row)


def _parse_row(path: Path, line_no: int, header: list[str], cells: list[str]) -> Row:
    """One line of the log as numbers (missing trailing cells are empty)."""
    row: Row = {}
    for col, cell in zip(header, [*cells, *[""] * (len(header) - len(cells))]):
        cell = cell.strip()
        if not cell and col == "step":
            raise RunError(f"{path} line {line_no}: the step cell is empty")
        try:
            value = float(cell) if cell else None
        except ValueError as e:
            raise RunError(f"{path} line {line_no}, column {col!r}: {cell!r} is not a "
                           "number (cells must be numbers or empty)") from e
        if col == "step" and not (value.is_integer() and value >= 0):  # (inf, nan too)
            raise RunError(f"{path} line {line_no}: step {cell!r} is not a whole number >= 0")
        row[col] = int(value) if col == "step" else value
    return row
