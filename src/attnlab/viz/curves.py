"""Training curves: loss against step, from Python lists or from the trainer's metrics log.

Missing values (``None``, NaN, or an empty CSV cell) are allowed, e.g. a validation loss
logged every 100 steps; each series is drawn through the points it has.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._common import new_figure, save_figure

log = logging.getLogger(__name__)

LOSS_COLUMNS = ("train_loss", "val_loss")
METRIC_COLUMNS = ("bleu", "accuracy", "f1")  # task metrics drawn in a panel of their own
METRIC_NAMES = {"bleu": "BLEU", "accuracy": "accuracy", "f1": "F1"}
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


def _plot_series(ax: Any, steps: np.ndarray, series: dict[str, np.ndarray], log_y: bool) -> Any:
    """Draw each series of ``series`` through its present (finite) points on ``ax``; returns
    ``ax``. (A series without values is left out.)"""
    for name, values in series.items():
        keep = np.isfinite(values)
        if not keep.any():
            continue
        if log_y and (values[keep] <= 0).any():
            raise ValueError(f"log_y=True needs positive values, but series {name!r} has some <= 0")
        marker = "o" if keep.sum() <= 30 else None
        ax.plot(steps[keep], values[keep], label=name, marker=marker, markersize=3)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=8)
    return ax


def _loss_figure(
    steps: np.ndarray,
    series: dict[str, np.ndarray],
    lr: np.ndarray | None,
    out_path: str | Path,
    title: str | None,
    log_y: bool,
    metrics: dict[str, np.ndarray] | None = None,
) -> Path:
    """A panel of losses, one of task ``metrics`` (BLEU, accuracy, ...) and one of the learning
    rate, each only when it has values (a log of metrics alone draws their panel alone)."""
    drawn = {**series, **(metrics or {}), **({} if lr is None else {"lr": lr})}
    for name, values in drawn.items():  # (a diverged loss would vanish from the plot)
        infinite = np.isinf(values)
        if infinite.any():
            log.warning("%d %s values are infinite (first at step %g) and are not drawn",
                        int(infinite.sum()), name, steps[infinite.argmax()])
    has_lr = lr is not None and bool(np.isfinite(lr).any())
    metrics = {k: v for k, v in (metrics or {}).items() if np.isfinite(v).any()}
    has_loss = any(np.isfinite(v).any() for v in series.values())
    for name, values in series.items():
        if not np.isfinite(values).any():
            log.warning("series %r has no values; not drawn", name)
    if not (has_loss or metrics or has_lr):
        raise ValueError("nothing to plot: every series is empty (all values missing)")
    ratios = [2.0] * has_loss + [1.2 + 0.8 * (not has_loss)] * bool(metrics) + [1.0] * has_lr
    fig = new_figure(8.0, 4.5 + 1.5 * (len(ratios) - 1))
    axes = list(fig.subplots(len(ratios), 1, sharex=True, height_ratios=ratios,
                             squeeze=False)[:, 0])
    if has_loss:
        _plot_series(axes.pop(0), steps, series, log_y).set_ylabel("loss")
    if metrics:
        ax = axes.pop(0)
        _plot_series(ax, steps, {METRIC_NAMES.get(k, k): v for k, v in metrics.items()},
                     log_y=False)
        ax.set_ylabel(" / ".join(METRIC_NAMES.get(k, k) for k in metrics))
    if has_lr:
        ax = axes.pop(0)
        _plot_series(ax, steps, {"lr": lr}, log_y=False)
        ax.set_ylabel("learning rate")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax = fig.axes[-1]
    ax.set_xlabel("step")
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


def _number(value: Any, where: str, row: int, column: str) -> float:
    """A cell as a float (NaN when empty), or a ValueError naming its row and column."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: row {row} has {column}={value!r}, not a number") from None


def _csv_series(
    source: str | Path | Sequence[Mapping[str, float | None]], where: str
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(steps, columns)`` of a metrics log (a path, or its rows as dicts): each of
    ``train_loss``, ``val_loss``, ``lr`` and the task metrics present as a float array (NaN
    where a cell is empty).
    Other columns are ignored."""
    if isinstance(source, (str, Path)):
        from ..runs import read_metrics  # the one reader of the trainer's log

        rows = read_metrics(source)
    else:
        rows = list(source)
        if isinstance(source, Mapping) or not all(isinstance(r, Mapping) for r in rows):
            raise ValueError(f"{where} must be a list of dicts, one per logged step (e.g. "
                             "{'step': 10, 'train_loss': 2.1}), or a CSV path")
    header = list(dict.fromkeys(k for r in rows for k in r))  # every row's keys, in order
    drawable = (*CSV_COLUMNS[1:], *METRIC_COLUMNS)
    if rows and ("step" not in header or not set(header) & set(drawable)):
        raise ValueError(f"{where} must have a header with 'step' and at least one of "
                         f"{', '.join(drawable)}; got header {header}")
    if not rows:
        raise ValueError(f"{where} has a header but no data rows")
    wanted = [c for c in (*CSV_COLUMNS, *METRIC_COLUMNS) if c in header]
    cols = {c: np.array([_number(r.get(c), where, i, c) for i, r in enumerate(rows)])
            for c in wanted}
    return cols.pop("step"), cols


def plot_loss_csv(
    source: str | Path | Sequence[Mapping[str, float | None]],
    out_path: str | Path,
    *,
    title: str | None = None,
    log_y: bool = False,
) -> Path:
    """Plot ``train_loss`` / ``val_loss``, the task metrics (``bleu``, ``accuracy``, ``f1``)
    and ``lr`` of a metrics log, one panel each.

    Args:
        source: the trainer's CSV log (a ``step`` column and any of ``train_loss``,
            ``val_loss``, ``lr``; empty cells allowed; read with :func:`attnlab.runs.read_metrics`),
            or its rows as dicts.
        out_path: image path; the suffix picks the format.
        title: figure title (default: what is drawn, and the run dir's name for a path).
        log_y: logarithmic loss axis.

    Returns:
        The written path.
    """
    is_path = isinstance(source, (str, Path))
    steps, columns = _csv_series(source, str(source) if is_path else "the metrics rows")
    lr = columns.pop("lr", None)
    losses = {name: columns[name] for name in LOSS_COLUMNS if name in columns}
    metrics = {name: columns[name] for name in METRIC_COLUMNS
               if name in columns and np.isfinite(columns[name]).any()}
    if title is None:
        has_loss = any(np.isfinite(v).any() for v in losses.values())
        shown = ["loss"] * has_loss + [METRIC_NAMES[k] for k in metrics] + ["learning rate"] * (
            lr is not None and bool(np.isfinite(lr).any()))
        shown = shown or ["loss"]  # nothing has values: _loss_figure says so
        title = ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]
        title = f"{title} by training step" + (f" ({Path(source).parent.name})"
                                               if is_path else "")
    return _loss_figure(steps, losses, lr, out_path, title, log_y, metrics)
