"""Interactive attention explorer: one self-contained HTML file, bertviz-style, offline.

A head view (one line per head and token pair), a matrix beside it, a model view (every
layer and head as a small map), and, when analyses are given, an analysis view: a logit-lens
table (:class:`LensView`), layers x heads grids (:class:`HeadGrid`: head scores, ablation or
patching effects; a cell opens that head in the attention views) and layers x positions
heatmaps (:class:`PositionGrid`: activation patching). The page (template
``explorer.html``) has inline CSS and JS only and a Content-Security-Policy that forbids any
network access. Tokens are data, never markup: the embedded JSON escapes ``<``, ``>`` and
``&`` so no token can close its ``<script>`` block, and the page inserts tokens
with ``textContent``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ._common import check_attention, check_finite, check_labels, check_tokens, to_numpy

log = logging.getLogger(__name__)

# Weights are stored as integers round(w * SCALE): 4 decimals, at most 6 bytes each ("10000,").
SCALE = 10_000
BYTES_PER_WEIGHT = 6
MAX_PAGE_BYTES = 20_000_000
_PLACEHOLDER = re.compile(r"__ATTNLAB_(TITLE|CSP|DATA)__")


@dataclass
class AttentionView:
    """One attention family to show, e.g. "decoder self-attention" or "cross-attention".

    Args:
        name: label in the view selector.
        query_tokens: the T tokens whose attention is shown (left column).
        key_tokens: the S tokens attended to (right column); for cross-attention the source.
        weights: (L, H, T, S) array or tensor of attention probabilities.
        layer_ids: the model layer index of each of the L slices (default ``0..L-1``).
        head_ids: the model head index of each of the H slices (default ``0..H-1``).
        query_label: what the query tokens are, e.g. "target" for cross-attention
            (default: none).
        key_label: what the key tokens are, e.g. "source" for cross-attention (default: none).
    """

    name: str
    query_tokens: Sequence[str]
    key_tokens: Sequence[str]
    weights: Any
    layer_ids: Sequence[int] | None = None
    head_ids: Sequence[int] | None = None
    query_label: str | None = None
    key_label: str | None = None


_VIEW_FIELDS = tuple(f.name for f in fields(AttentionView))


@dataclass
class LensView:
    """A logit lens: what each layer's residual stream predicts at each position.

    Args:
        name: label in the analysis selector.
        tokens: the T input tokens (the columns).
        layers: the R row names (e.g. "embed", "0", ..., "final").
        top_tokens: (R, T, k) token strings, each cell's k most likely next tokens.
        top_probs: (R, T, k) their probabilities.
        targets: the T real next tokens (None where there is none, e.g. the last position;
            default: none at all).
        target_prob: (R, T) the real next token's probability (NaN where there is none).
        target_rank: (R, T) its rank, 0 = the top token (NaN or -1 where there is none).
    """

    name: str
    tokens: Sequence[str]
    layers: Sequence[str]
    top_tokens: Sequence[Sequence[Sequence[str]]]
    top_probs: Any
    targets: Sequence[str | None] | None = None
    target_prob: Any = None
    target_rank: Any = None


@dataclass
class HeadGrid:
    """A layers x heads grid of numbers: head scores, ablation or patching effects.

    Args:
        name: label in the analysis selector.
        values: (L, H) array; signed values get a diverging colour scale; NaN: no value.
        layer_ids: the model layer of each row (default ``0..L-1``).
        head_ids: the model head of each column (default ``0..H-1``).
        view: the name of the attention view a cell opens (default: the first that has the
            cell's layer and head).
        note: one line under the title saying what the numbers are.
        limit: the value at the colour scale's end (head scores, 0..1: 1); default the
            largest absolute value.
    """

    name: str
    values: Any
    layer_ids: Sequence[int] | None = None
    head_ids: Sequence[int] | None = None
    view: str | None = None
    note: str = ""
    limit: float | None = None


@dataclass
class PositionGrid:
    """A layers x positions heatmap (e.g. patching the residual stream), tokens as columns.

    Args:
        name: label in the analysis selector.
        values: (L, T) array; signed values get a diverging colour scale; NaN: no value.
        tokens: the T tokens (column labels).
        layer_ids: the label of each row (default ``0..L-1``).
        note: one line under the title saying what the numbers are.
    """

    name: str
    values: Any
    tokens: Sequence[str]
    layer_ids: Sequence[Any] | None = None
    note: str = ""


ANALYSES = (LensView, HeadGrid, PositionGrid)


def _as_view(item: Any, index: int) -> AttentionView:
    """Accept an AttentionView or a dict with the same keys."""
    if isinstance(item, AttentionView):
        return item
    if not isinstance(item, Mapping):
        raise ValueError(
            f"views[{index}] must be an AttentionView or a dict with keys "
            f"{', '.join(_VIEW_FIELDS)}; got {type(item).__name__}"
        )
    unknown = sorted(set(item) - set(_VIEW_FIELDS))
    missing = [k for k in _VIEW_FIELDS[:4] if k not in item]
    if unknown or missing:
        raise ValueError(
            f"views[{index}] has unknown keys {unknown} / missing keys {missing}; "
            f"allowed keys: {', '.join(_VIEW_FIELDS)} (the last four optional)"
        )
    return AttentionView(**item)


def _view_payload(view: AttentionView, index: int) -> dict[str, Any]:
    """Validate one view and turn it into the JSON structure the page reads."""
    where = f"views[{index}]"
    if not isinstance(view.name, str) or not view.name.strip():
        raise ValueError(f"{where}.name must be a non-empty string, got {view.name!r}")
    arr = check_attention(view.weights, rank=4, name=f"{where}.weights")
    n_layers, _, n_rows, n_cols = arr.shape
    queries = check_tokens(view.query_tokens, f"{where}.query_tokens")
    keys = check_tokens(view.key_tokens, f"{where}.key_tokens")
    if (len(queries), len(keys)) != (n_rows, n_cols):
        raise ValueError(
            f"{where}: weights has shape {tuple(arr.shape)} = (L, H, T, S) but there are "
            f"{len(queries)} query_tokens and {len(keys)} key_tokens; "
            f"need T={n_rows} and S={n_cols}"
        )
    layer_ids = _indices(view.layer_ids, n_layers, f"{where}.layer_ids", "weights[l]")
    head_ids = _indices(view.head_ids, arr.shape[1], f"{where}.head_ids", "weights[:, h]")
    labels = {}
    for key in ("query_label", "key_label"):
        value = getattr(view, key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{where}.{key} must be a string or None, got {value!r}")
        labels[key] = value or ""
    return {
        "name": view.name,
        "query_tokens": queries,
        "key_tokens": keys,
        "layer_ids": layer_ids,
        "head_ids": head_ids,
        **labels,
        "weights": np.rint(arr * SCALE).astype(np.int32).tolist(),
    }


def _numbers(values: Any, shape: tuple[int | None, ...], where: str,
             missing: bool = False) -> np.ndarray:
    """``values`` as a float array of ``shape`` (None: any length), finite; with ``missing``,
    NaN marks a cell without a value (shown blank)."""
    arr = to_numpy(values, where)
    if arr.ndim != len(shape) or arr.size == 0 or any(
            want is not None and got != want for got, want in zip(arr.shape, shape)):
        dims = ", ".join("n" if n is None else str(n) for n in shape)
        raise ValueError(f"{where} must have shape ({dims}) and not be empty, got shape "
                         f"{tuple(arr.shape)}")
    check_finite(np.where(np.isnan(arr), 0.0, arr) if missing else arr, where)
    return arr


def _plain(arr: np.ndarray, digits: int = 5) -> list:
    """``arr`` as nested lists of rounded floats, ``None`` for NaN (JSON has no NaN)."""
    return np.where(np.isnan(arr), None, np.round(arr, digits)).tolist()


def _lens_payload(lens: LensView, where: str) -> dict[str, Any]:
    """Validate a :class:`LensView` into the page's JSON: rows are layers, columns positions."""
    tokens = check_tokens(lens.tokens, f"{where}.tokens")
    layers = check_tokens(lens.layers, f"{where}.layers")
    probs = _numbers(lens.top_probs, (len(layers), len(tokens), None), f"{where}.top_probs")
    k = probs.shape[2]
    top = [[check_tokens(cell, f"{where}.top_tokens") for cell in row]
           for row in (lens.top_tokens if isinstance(lens.top_tokens, Sequence) else [])]
    if len(top) != len(layers) or any(len(r) != len(tokens) or any(len(c) != k for c in r)
                                      for r in top):
        raise ValueError(f"{where}.top_tokens must be (R, T, k) = ({len(layers)}, "
                         f"{len(tokens)}, {k}) token strings, as top_probs")
    targets = [None] * len(tokens) if lens.targets is None else list(lens.targets)
    if len(targets) != len(tokens):
        raise ValueError(f"{where}.targets must have one entry per token ({len(tokens)}), "
                         f"got {len(targets)}")
    out = {"kind": "lens", "name": lens.name, "tokens": tokens, "layers": layers,
           "top_tokens": top, "top_probs": _plain(probs, 4),
           "targets": [None if t is None else str(t) for t in targets]}
    for key in ("target_prob", "target_rank"):
        value = getattr(lens, key)
        arr = (np.full((len(layers), len(tokens)), np.nan) if value is None else
               _numbers(value, (len(layers), len(tokens)), f"{where}.{key}", missing=True))
        if key == "target_rank":
            arr = np.where(arr < 0, np.nan, arr)
        out[key] = _plain(arr, 4)
    return out


def _grid_payload(grid: HeadGrid | PositionGrid, where: str,
                  view_names: list[str]) -> dict[str, Any]:
    """Validate a :class:`HeadGrid` or :class:`PositionGrid` into the page's JSON."""
    if isinstance(grid, PositionGrid):
        tokens = check_tokens(grid.tokens, f"{where}.tokens")
        arr = _numbers(grid.values, (None, len(tokens)), f"{where}.values", missing=True)
        labels = check_labels(grid.layer_ids, arr.shape[0], f"{where}.layer_ids")
        extra = {"kind": "positions", "tokens": tokens, "layer_ids": labels}
    else:
        arr = _numbers(grid.values, (None, None), f"{where}.values", missing=True)
        extra = {"kind": "heads",
                 "layer_ids": _indices(grid.layer_ids, arr.shape[0], f"{where}.layer_ids",
                                       "values[l]"),
                 "head_ids": _indices(grid.head_ids, arr.shape[1], f"{where}.head_ids",
                                      "values[:, h]"), "view": None}
        if grid.view is not None:
            if grid.view not in view_names:
                raise ValueError(f"{where}.view {grid.view!r} is not one of the attention "
                                 f"views: {', '.join(map(repr, view_names))}")
            extra["view"] = view_names.index(grid.view)
    if not isinstance(grid.note, str):
        raise ValueError(f"{where}.note must be a string, got {grid.note!r}")
    limit = getattr(grid, "limit", None)
    if limit is not None and not (isinstance(limit, numbers.Real) and math.isfinite(limit)
                                  and limit > 0):
        raise ValueError(f"{where}.limit must be a finite number > 0 or None, got {limit!r}")
    return {"name": grid.name, "note": grid.note, "values": _plain(arr),
            "signed": bool((arr < 0).any()), "limit": limit, **extra}


def _analysis_payload(item: Any, index: int, view_names: list[str]) -> dict[str, Any]:
    """One analysis (a :class:`LensView`, :class:`HeadGrid` or :class:`PositionGrid`) checked
    and turned into the JSON the page reads."""
    where = f"analyses[{index}]"
    if not isinstance(item, ANALYSES):
        raise ValueError(f"{where} must be a LensView, HeadGrid or PositionGrid; got "
                         f"{type(item).__name__}")
    if not isinstance(item.name, str) or not item.name.strip():
        raise ValueError(f"{where}.name must be a non-empty string, got {item.name!r}")
    if isinstance(item, LensView):
        return _lens_payload(item, where)
    return _grid_payload(item, where, view_names)


def _analysis_size(item: Any) -> int:
    """About how many numbers an analysis puts in the page (for the size check)."""
    values = item.top_probs if isinstance(item, LensView) else getattr(item, "values", None)
    return 3 * _size(values, "an analysis's values") if values is not None else 0


def _size(weights: Any, where: str) -> int:
    """How many numbers ``weights`` holds (before converting them: the page-size check)."""
    try:
        return int(np.prod(np.shape(weights)))
    except ValueError:  # ragged nested lists
        raise ValueError(f"{where} must be one (L, H, T, S) array, got nested lists of "
                         "different lengths") from None


def _indices(values: Sequence[int] | None, n: int, where: str, per: str) -> list[int]:
    """``values`` as n distinct integers >= 0 (default ``0..n-1``), one per slice ``per``
    (the page addresses slices by them)."""
    try:
        out = list(range(n)) if values is None else list(values)
    except TypeError:  # one number, not a sequence
        out = []
    if len(out) != n or len(set(out)) != n or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in out
    ):
        raise ValueError(f"{where} must be {n} distinct integers >= 0 (one per {per}), got "
                         f"{values!r}")
    return [int(i) for i in out]


def _json_for_script(data: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` characters at all."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@lru_cache(maxsize=1)
def _template() -> tuple[str, str]:
    """The page template and the CSP that allows exactly its inline script and style."""
    try:
        text = resources.files(__package__).joinpath("explorer.html").read_text(encoding="utf-8")
    except FileNotFoundError as err:  # pragma: no cover - a packaging mistake
        raise RuntimeError(
            "attnlab/viz/explorer.html is missing from this installation: the package must "
            "ship it as package data ([tool.setuptools.package-data] attnlab = ['viz/*.html'])"
        ) from err

    def digest(tag: str) -> str:
        match = re.search(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
        if match is None:  # pragma: no cover - the template ships with the package
            raise RuntimeError(f"explorer.html template has no inline <{tag}> block")
        sha = hashlib.sha256(match.group(1).encode("utf-8")).digest()
        return "'sha256-" + base64.b64encode(sha).decode("ascii") + "'"

    csp = f"default-src 'none'; script-src {digest('script')}; style-src {digest('style')}"
    return text, csp


def attention_html(views: Sequence[Any], title: str = "attention explorer",
                   analyses: Sequence[Any] = ()) -> str:
    """Render attention views as one self-contained, offline HTML page.

    Args:
        views: a list of :class:`AttentionView` (or dicts with the same keys). One view for
            a decoder-only model; encoder self, decoder self and cross for encoder-decoder.
        title: page title.
        analyses: :class:`LensView`, :class:`HeadGrid` and :class:`PositionGrid` items, shown
            in an "analysis" tab beside the attention views (a head grid's cell opens that
            head there).

    Returns:
        The page.

    Raises:
        ValueError: malformed views, or a page that would exceed :data:`MAX_PAGE_BYTES`
            (choose fewer layers or heads).

    In the page, ``window.attnlab.state()`` returns what is drawn: ``{tab ("head" | "model"),
    view, view_name, layer, layer_id, heads (shown head indices), head_ids, query, key (the
    focused token or null), pinned, lines, weights (per shown head, the focused token's row or
    column), cell ([query, key] under the pointer in the matrix), cell_weights, scale, theme,
    zoom, matrix (the canvas geometry: left, top, cell), thumbs, analysis (its index or
    null), analysis_name, cells (analysis cells drawn)}``. Each drawn ``<line>`` and each
    shaded token also carries a ``data-weight`` attribute; each analysis cell ``data-value``.
    """
    if isinstance(views, (AttentionView, Mapping)) or not isinstance(views, Sequence) or not views:
        raise ValueError("views must be a non-empty list of AttentionView (or dicts)")
    parsed = [_as_view(v, i) for i, v in enumerate(views)]
    if isinstance(analyses, ANALYSES) or not isinstance(analyses, Sequence):
        raise ValueError("analyses must be a list of LensView, HeadGrid or PositionGrid")
    n_weights = sum(_size(v.weights, f"views[{i}].weights") for i, v in enumerate(parsed))
    n_weights += sum(_analysis_size(a) for a in analyses if isinstance(a, ANALYSES))
    if n_weights * BYTES_PER_WEIGHT > MAX_PAGE_BYTES:
        raise ValueError(_too_big(n_weights * BYTES_PER_WEIGHT, parsed))
    payloads = [_view_payload(v, i) for i, v in enumerate(parsed)]
    names = [v.name for v in parsed]
    extra = [_analysis_payload(a, i, names) for i, a in enumerate(analyses)]
    payload = {"version": 3, "scale": SCALE, "views": payloads, "analyses": extra}
    template, csp = _template()
    values = {
        "TITLE": html.escape(str(title)),
        "CSP": csp,
        "DATA": _json_for_script(payload),
    }
    # One pass, so a title that happens to contain a placeholder is not substituted again.
    page = _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
    if len(page.encode("utf-8")) > MAX_PAGE_BYTES:
        raise ValueError(_too_big(len(page.encode("utf-8")), parsed))
    return page


def _too_big(n_bytes: int, views: list[AttentionView]) -> str:
    shapes = ", ".join(f"{v.name!r}: {tuple(np.shape(v.weights))}" for v in views)
    return (
        f"the attention page would be about {n_bytes / 1e6:.0f} MB, over the "
        f"{MAX_PAGE_BYTES / 1e6:.0f} MB limit (weights (L, H, T, S): {shapes}); choose fewer "
        "layers/heads (e.g. weights[[0, -1]] with matching layer_ids), a shorter sequence "
        "or fewer analyses"
    )


def write_attention_html(
    path: str | Path, views: Sequence[Any], title: str = "attention explorer",
    analyses: Sequence[Any] = (),
) -> Path:
    """Write :func:`attention_html` to ``path`` (UTF-8), creating parent folders; returns it.
    The page is made (and checked) before anything is written."""
    page = attention_html(views, title, analyses)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    log.info("wrote attention explorer %s (%.1f kB)", out, len(page) / 1e3)
    return out
