"""Position encodings: the model's sinusoidal table as NumPy, and a two-panel plot of a table.

:func:`sinusoidal_table` is the model's own table (:func:`attnlab.nn.sinusoidal_table`,
paper section 3.5) in float64, with argument checks for plotting; the written-out teaching copy
that checks it lives in :mod:`attnlab.numpy_ref`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..nn import sinusoidal_table as _torch_table
from ._common import check_finite, new_figure, save_figure, to_numpy

_DEFAULT_CURVES = (4, 5, 6, 7)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
    """Return the (max_len, d_model) float64 sinusoidal position table.

    ``PE[pos, 2i] = sin(pos / 10000^(2i / d_model))`` and
    ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))``. ``d_model`` must be even.
    """
    max_len = _positive_int(max_len, "max_len")
    d_model = _positive_int(d_model, "d_model")
    if d_model % 2:
        raise ValueError(
            f"d_model must be even (sin and cos fill dimension pairs 2i, 2i+1), got {d_model}"
        )
    return _torch_table(max_len, d_model, dtype=torch.float64).numpy()  # (N, D)


def _check_curves(curves: Sequence[int] | None, n_dims: int) -> list[int]:
    """Dimensions to draw as curves; ``None`` means (4, 5, 6, 7), or those that exist."""
    if curves is None:
        picked = [d for d in _DEFAULT_CURVES if d < n_dims]
        return picked or list(range(min(4, n_dims)))
    if isinstance(curves, (str, bytes)) or not isinstance(curves, Sequence) or not curves:
        raise ValueError(
            f"curves must be a non-empty sequence of dimension indices, got {curves!r}"
        )
    out = []
    for d in curves:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not 0 <= d < n_dims:
            raise ValueError(
                f"curves entry {d!r} is not a dimension of the table: allowed 0..{n_dims - 1}"
            )
        out.append(int(d))
    return out


def plot_positions(
    table: Any,
    out_path: str | Path,
    *,
    curves: Sequence[int] | None = None,
    title: str = "position encodings",
) -> Path:
    """Plot a position table: a (position x dimension) heatmap and a few dimensions' curves.

    Works for the sinusoidal table and for a learned position embedding
    (``model.pos.weight``), which is why the colour scale follows the data.

    Args:
        table: (N, D) array or tensor, one row per position.
        out_path: image path; the suffix picks the format.
        curves: dimensions to draw over the positions (default (4, 5, 6, 7), or the first
            few when D < 8).
        title: figure title.

    Returns:
        The written path.
    """
    arr = to_numpy(table, "table")
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(
            f"table must have shape (N positions, D dimensions) with N, D > 0, "
            f"got shape {tuple(arr.shape)}"
        )
    check_finite(arr, "table")
    n_pos, n_dims = arr.shape
    dims = _check_curves(curves, n_dims)

    fig = new_figure(12.0, 4.5)
    heat_ax, curve_ax = fig.subplots(1, 2, width_ratios=[1.1, 1.0])
    limit = float(np.abs(arr).max()) or 1.0  # symmetric scale: 0 is white
    image = heat_ax.imshow(
        arr, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest"
    )
    heat_ax.set_xlabel("dimension")
    heat_ax.set_ylabel("position")
    heat_ax.set_title(f"table ({n_pos} positions x {n_dims} dims)", fontsize=10)
    fig.colorbar(image, ax=heat_ax, shrink=0.9)

    positions = np.arange(n_pos)
    marker = "o" if n_pos <= 30 else None
    for d in dims:
        curve_ax.plot(positions, arr[:, d], label=f"dim {d}", marker=marker, markersize=3)
    curve_ax.set_xlabel("position")
    curve_ax.set_ylabel("value")
    curve_ax.set_title("selected dimensions over positions", fontsize=10)
    curve_ax.grid(alpha=0.3)
    curve_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title)
    return save_figure(fig, out_path)
