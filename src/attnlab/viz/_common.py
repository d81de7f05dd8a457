"""Shared input checks and the lazy matplotlib import for :mod:`attnlab.viz`.

Every public function converts its arrays with :func:`to_numpy` and checks them here, so a
bad input fails early with one ``ValueError`` that names the argument, what was received and
what is allowed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, MissingDependencyError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

# Tolerance for attention weights that are a softmax output computed in low precision
# (bfloat16 steps by 2**-7 just above 1.0); raw scores are usually far outside [0, 1].
_WEIGHT_TOL = 1e-2
# Longest token label drawn on a plot axis; longer ones end with an ellipsis.
MAX_LABEL_CHARS = 14


def to_numpy(x: Any, name: str) -> np.ndarray:
    """Return ``x`` (NumPy array, torch tensor or nested lists) as a float64 NumPy array.

    A list of tensors (e.g. one attention map per layer) is stacked along a new first axis.
    """
    if isinstance(x, (list, tuple)) and x and all(hasattr(e, "detach") for e in x):
        parts = [to_numpy(e, name) for e in x]
        shapes = sorted({p.shape for p in parts})
        if len(shapes) > 1:
            raise ValueError(f"{name}: the {len(parts)} tensors stacked along a new first axis "
                             f"must have one shape, got shapes {shapes}")
        return np.stack(parts)
    if hasattr(x, "detach"):  # torch.Tensor / nn.Parameter, without importing torch
        x = x.detach().cpu().float().numpy()
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{name} must be a numeric array (NumPy array, torch tensor or nested lists), "
            f"got {type(x).__name__}: {err}"
        ) from err
    return arr


def check_finite(arr: np.ndarray, name: str) -> None:
    """Reject NaN / inf values, which usually mean a fully masked softmax row."""
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise ValueError(
            f"{name} contains NaN or inf (first at index {bad}); all values must be finite "
            "(a fully masked attention row should be all zeros, not NaN)"
        )


def check_attention(weights: Any, rank: int, name: str = "weights") -> np.ndarray:
    """Convert and validate attention weights: the given rank, finite, within [0, 1]."""
    arr = to_numpy(weights, name)
    if arr.ndim != rank:
        dims = "(L, H, T, S)" if rank == 4 else "(T, S)"
        raise ValueError(
            f"{name} must have rank {rank} with shape {dims}, got shape {tuple(arr.shape)}"
        )
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(arr.shape)}")
    check_finite(arr, name)
    lo, hi = float(arr.min()), float(arr.max())
    if lo < -_WEIGHT_TOL or hi > 1 + _WEIGHT_TOL:
        raise ValueError(
            f"{name} must be attention probabilities in [0, 1], got values in "
            f"[{lo:.4g}, {hi:.4g}]; pass the softmax output, not the raw scores"
        )
    return np.clip(arr, 0.0, 1.0)


def check_tokens(tokens: Any, name: str) -> list[str]:
    """Return ``tokens`` (a list, tuple or 1-D array) as a list of strings."""
    if isinstance(tokens, np.ndarray) and tokens.ndim == 1:
        tokens = tokens.tolist()
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise ValueError(
            f"{name} must be a list of token strings, got {type(tokens).__name__}"
            + (" (split the text into tokens first)" if isinstance(tokens, str) else "")
        )
    return [str(t) for t in tokens]


def check_labels(labels: Any, count: int, name: str) -> list[str]:
    """Return ``count`` display labels: ``0..count-1`` when ``labels`` is None."""
    if labels is None:
        return [str(i) for i in range(count)]
    out = check_tokens(labels, name)
    if len(out) != count:
        raise ValueError(f"{name} has {len(out)} entries, expected {count} (one per slice)")
    return out


def short_label(token: str, limit: int = MAX_LABEL_CHARS) -> str:
    """Make a token printable on an axis: visible whitespace, at most ``limit`` characters."""
    shown = token.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    if shown.strip() == "":
        shown = repr(token)
    return shown if len(shown) <= limit else shown[: limit - 1] + "\u2026"


def _matplotlib() -> tuple[type, type]:
    """matplotlib's Figure and Agg canvas classes (a :class:`MissingDependencyError`, an
    ImportError, naming the extra when it is missing)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise MissingDependencyError(
            "attnlab.viz plots need matplotlib; install it with: pip install 'attnlab[viz]'"
        ) from err
    return Figure, FigureCanvasAgg


def new_figure(width: float, height: float, layout: str = "constrained") -> Figure:
    """Create a matplotlib Figure drawn by the Agg backend (no window, no pyplot state)."""
    figure, canvas = _matplotlib()
    fig = figure(figsize=(width, height), layout=layout)
    canvas(fig)
    return fig


def check_image_path(out_path: str | Path, name: str = "out_path") -> tuple[Path, str]:
    """``out_path`` as a Path and its image format (from the suffix); an
    :class:`~attnlab.errors.InputError` naming ``name`` and the allowed suffixes when
    matplotlib cannot write that format."""
    path = Path(out_path)
    fmt = path.suffix.lower().lstrip(".")
    supported = _matplotlib()[1].get_supported_filetypes()
    if fmt not in supported:
        raise InputError(
            f"{name} {str(path)!r} must end in a supported image suffix "
            f"({', '.join('.' + s for s in sorted(supported))}), got {path.suffix or 'none'!r}"
        )
    return path, fmt


def save_figure(fig: Figure, out_path: str | Path, dpi: int = 110) -> Path:
    """Save ``fig`` to ``out_path`` (format from the suffix), creating parent folders."""
    path, fmt = check_image_path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format=fmt)
    log.info("wrote %s", path)
    return path
