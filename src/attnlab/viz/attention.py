"""Static attention heatmaps: a layers x heads grid, and encoder-decoder alignments.

``weights`` follow the model convention: rows are queries, columns are keys, and each row is
a softmax distribution (or all zeros for a fully masked row).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ._common import (
    check_attention,
    check_labels,
    check_tokens,
    new_figure,
    save_figure,
    short_label,
)

# Figure geometry, in inches: one heatmap cell per token pair, clamped per panel and overall.
_INCH_PER_TOKEN = 0.2
_PANEL_MIN, _PANEL_MAX = 1.8, 8.0
_FIG_MAX = 40.0
# Roughly one readable tick label per this many inches of axis.
_INCH_PER_TICK = 0.16


def _panel_size(n_tokens: int, n_panels: int, extra: float) -> float:
    """Side of one panel in inches for ``n_tokens`` tokens, ``n_panels`` panels on that side."""
    side = min(max(_INCH_PER_TOKEN * n_tokens + 0.6, _PANEL_MIN), _PANEL_MAX)
    room = (_FIG_MAX - extra) / n_panels
    return max(min(side, room), 1.0)


def _tick_positions(n_tokens: int, axis_inches: float) -> list[int]:
    """Token indices to label: all of them when they fit, else every k-th one."""
    max_ticks = max(2, int(axis_inches / _INCH_PER_TICK))
    step = max(1, math.ceil(n_tokens / max_ticks))
    return list(range(0, n_tokens, step))


def _draw_grid(
    weights: np.ndarray,
    row_tokens: list[str],
    col_tokens: list[str],
    out_path: str | Path,
    panel_titles: list[list[str]] | None,
    title: str | None,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Draw an (L, H) grid of (T, S) heatmaps sharing one colour scale and one colorbar."""
    n_layers, n_heads, n_rows, n_cols = weights.shape
    cell_w = _panel_size(n_cols, n_heads, extra=2.5)
    cell_h = _panel_size(n_rows, n_layers, extra=2.0)
    fig = new_figure(n_heads * cell_w + 2.5, n_layers * cell_h + 2.0)
    # No shared axes: a shared locator would give every panel the outer panels' ticks, and
    # laying out thousands of hidden tick labels is most of the drawing time of a big grid.
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    vmax = float(weights.max()) or 1.0  # one scale for every panel, so the colorbar is valid
    x_ticks = _tick_positions(n_cols, cell_w)
    y_ticks = _tick_positions(n_rows, cell_h)
    x_labels = [short_label(col_tokens[i]) for i in x_ticks]
    y_labels = [short_label(row_tokens[i]) for i in y_ticks]
    image = None
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer, head]
            image = ax.imshow(
                weights[layer, head],
                cmap="viridis",
                vmin=0.0,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
            if panel_titles is not None:
                ax.set_title(panel_titles[layer][head], fontsize=9)
            ax.tick_params(labelsize=7, length=2)
            # only the outer panels are labelled: the grid's panels share their token axes
            if layer == n_layers - 1:
                ax.set_xticks(x_ticks, x_labels, rotation=90, parse_math=False)
            else:
                ax.set_xticks([])
            if head == 0:
                ax.set_yticks(y_ticks, y_labels, parse_math=False)
            else:
                ax.set_yticks([])
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.9, label="attention weight")
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_path)


def plot_attention(
    weights: Any,
    row_tokens: Any,
    col_tokens: Any,
    out_path: str | Path,
    *,
    layer_labels: Any = None,
    head_labels: Any = None,
    title: str | None = None,
) -> Path:
    """Plot attention maps as a grid of heatmaps: layers as rows, heads as columns.

    Args:
        weights: (L, H, T, S) array or tensor; ``weights[l, h, t, s]`` is how much query ``t``
            attends to key ``s`` in layer ``l``, head ``h``.
        row_tokens: the T query tokens (y axis).
        col_tokens: the S key tokens (x axis).
        out_path: image path; the suffix picks the format (``.png``, ``.svg``, ``.pdf``, ...).
        layer_labels: L names for the layers (default ``0..L-1``), e.g. the model layer ids.
        head_labels: H names for the heads (default ``0..H-1``).
        title: figure title.

    Returns:
        The written path. Long sequences get every k-th tick label; long tokens are shortened.
    """
    arr = check_attention(weights, rank=4)
    n_layers, n_heads = arr.shape[:2]
    rows = _tokens_for_axis(row_tokens, "row_tokens", arr.shape, "T", "query tokens")
    cols = _tokens_for_axis(col_tokens, "col_tokens", arr.shape, "S", "key tokens")
    layers = check_labels(layer_labels, n_layers, "layer_labels")
    heads = check_labels(head_labels, n_heads, "head_labels")
    titles = [[f"layer {lyr} / head {hd}" for hd in heads] for lyr in layers]
    return _draw_grid(arr, rows, cols, out_path, titles, title, "key", "query")


def plot_alignment(
    weights: Any,
    src_tokens: Any,
    tgt_tokens: Any,
    out_path: str | Path,
    title: str | None = None,
) -> Path:
    """Plot one encoder-decoder cross-attention map: source on x, target on y.

    Args:
        weights: (T, S) array; row ``t`` is how target token ``t`` attends over the S source
            tokens (e.g. one head, or the mean over heads, of a decoder cross-attention layer).
        src_tokens: the S source tokens (x axis).
        tgt_tokens: the T target tokens (y axis).
        out_path: image path; the suffix picks the format.
        title: figure title.
    """
    arr = check_attention(weights, rank=2)
    cols = _tokens_for_axis(src_tokens, "src_tokens", arr.shape, "S", "source tokens")
    rows = _tokens_for_axis(tgt_tokens, "tgt_tokens", arr.shape, "T", "target tokens")
    return _draw_grid(arr[None, None], rows, cols, out_path, None, title, "source", "target")


def _tokens_for_axis(
    tokens: Any, name: str, shape: tuple[int, ...], axis: str, what: str
) -> list[str]:
    """Check that ``tokens`` matches axis ``axis`` ("T" rows or "S" columns) of the weights."""
    out = check_tokens(tokens, name)
    expected = shape[-2] if axis == "T" else shape[-1]
    if len(out) != expected:
        dims = "(L, H, T, S)" if len(shape) == 4 else "(T, S)"
        raise ValueError(
            f"{name} has {len(out)} tokens but weights has shape {dims} = {tuple(shape)}, "
            f"which needs {axis}={expected} {what}"
        )
    return out
