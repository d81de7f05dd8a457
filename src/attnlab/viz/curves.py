"""Training curves: loss against step, from Python lists or from the trainer's CSV log.

Missing values (``None``, NaN, or an empty CSV cell) are allowed, e.g. a validation loss
logged every 100 steps; each series is drawn through the points it has.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._common import new_figure, save_figure

log = logging.getLogger(__name__)

LOSS_COLUMNS = ("train_loss", "val_loss")
CSV_COLUMNS = ("step", *LOSS_COLUMNS, "lr")


def _as_values(values: Any, name: str, length: int | None) -> np.ndarray:
    """Convert a list of numbers (``None`` allowed) to a float array of the given length."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a list of numbers, got {type(values).__name__}")
    try:
        arr = np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must contain only numbers or None: {err}") from err
    if length is not None and len(arr) != length:
        raise ValueError(f"{name} has {len(arr)} values but steps has {length}; they must match")
    return arr


def _plot_series(ax: Any, steps: np.ndarray, series: dict[str, np.ndarray], log_y: bool) -> int:
    """Draw each series through its present (finite) points; returns how many were drawn."""
    drawn = 0
    for name, values in series.items():
        keep = np.isfinite(values)
        if not keep.any():
            log.warning("series %r has no values; not drawn", name)
            continue
        if log_y and (values[keep] <= 0).any():
            raise ValueError(f"log_y=True needs positive values, but series {name!r} has some <= 0")
        marker = "o" if keep.sum() <= 30 else None
        ax.plot(steps[keep], values[keep], label=name, marker=marker, markersize=3)
        drawn += 1
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    return drawn


def _loss_figure(
    steps: np.ndarray,
    series: dict[str, np.ndarray],
    lr: np.ndarray | None,
    out_path: str | Path,
    title: str | None,
    log_y: bool,
) -> Path:
    """One panel of losses, plus a learning-rate panel below when ``lr`` has values."""
    has_lr = lr is not None and bool(np.isfinite(lr).any())
    fig = new_figure(8.0, 6.0 if has_lr else 4.5)
    if has_lr:
        loss_ax, lr_ax = fig.subplots(2, 1, sharex=True, height_ratios=[2.0, 1.0])
    else:
        loss_ax, lr_ax = fig.subplots(1, 1), None
    drawn = _plot_series(loss_ax, steps, series, log_y)
    if not drawn and not has_lr:
        raise ValueError("nothing to plot: every series is empty (all values missing)")
    loss_ax.set_ylabel("loss")
    if lr_ax is not None:
        _plot_series(lr_ax, steps, {"lr": lr}, log_y=False)
        lr_ax.set_ylabel("learning rate")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        lr_ax.set_xlabel("step")
    else:
        loss_ax.set_xlabel("step")
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_path)


def plot_loss_curve(
    steps: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    out_path: str | Path,
    *,
    title: str | None = None,
    log_y: bool = False,
) -> Path:
    """Plot loss series against training step.

    Args:
        steps: N step numbers.
        series: name -> N values, e.g. ``{"train": [...], "val": [...]}``; ``None`` or NaN
            marks a step without a value.
        out_path: image path; the suffix picks the format.
        title: figure title.
        log_y: logarithmic loss axis (values must then be positive).

    Returns:
        The written path.
    """
    steps_arr = _as_values(steps, "steps", None)
    if len(steps_arr) == 0 or not np.isfinite(steps_arr).all():
        raise ValueError("steps must be a non-empty list of numbers without None/NaN")
    if not isinstance(series, Mapping) or not series:
        raise ValueError("series must be a non-empty dict of name -> list of values")
    values = {
        str(name): _as_values(vals, f"series[{name!r}]", len(steps_arr))
        for name, vals in series.items()
    }
    return _loss_figure(steps_arr, values, None, out_path, title, log_y)


def read_loss_csv(csv_path: str | Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Read a training log CSV: a ``step`` column and any of ``train_loss``, ``val_loss``, ``lr``.

    Returns ``(steps, columns)`` where ``columns`` maps each of those present column names to
    a float array (NaN for empty cells). Other columns are ignored.
    """
    path = Path(csv_path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = [(h or "").strip() for h in (reader.fieldnames or [])]
        if "step" not in header or not set(header) & set(CSV_COLUMNS[1:]):
            raise ValueError(
                f"{path} must have a header with 'step' and at least one of "
                f"{', '.join(CSV_COLUMNS[1:])}; got header {header}"
            )
        reader.fieldnames = header
        wanted = [c for c in CSV_COLUMNS if c in header]
        rows: dict[str, list[float]] = {c: [] for c in wanted}
        for line_no, row in enumerate(reader, start=2):
            for col in wanted:
                cell = (row.get(col) or "").strip()
                if col == "step" and not cell:
                    raise ValueError(f"{path} line {line_no}: the step cell is empty")
                try:
                    rows[col].append(float(cell) if cell else math.nan)
                except ValueError as err:
                    raise ValueError(
                        f"{path} line {line_no}, column {col!r}: {cell!r} is not a number "
                        "(cells must be numbers or empty)"
                    ) from err
    if not rows["step"]:
        raise ValueError(f"{path} has a header but no data rows")
    steps = np.array(rows.pop("step"))
    return steps, {name: np.array(vals) for name, vals in rows.items()}


def plot_loss_csv(
    csv_path: str | Path,
    out_path: str | Path,
    *,
    title: str | None = None,
    log_y: bool = False,
) -> Path:
    """Plot ``train_loss`` / ``val_loss`` (and ``lr`` in a second panel) from a CSV log.

    See :func:`read_loss_csv` for the format. Returns the written path.
    """
    steps, columns = read_loss_csv(csv_path)
    lr = columns.pop("lr", None)
    losses = {name: columns[name] for name in LOSS_COLUMNS if name in columns}
    return _loss_figure(steps, losses, lr, out_path, title or Path(csv_path).name, log_y)
