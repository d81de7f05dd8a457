"""Interactive attention explorer: one self-contained HTML file, bertviz-style, offline.

A head view (one line per head and token pair), a matrix beside it, and a model view (every
layer and head as a small map). The page (template ``explorer.html``) has inline CSS and JS
only and a Content-Security-Policy that forbids any network access. Tokens are data, never
markup: the embedded JSON escapes ``<``, ``>`` and ``&`` so no token can close its
``<script>`` block, and the page inserts tokens with ``textContent``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ._common import check_attention, check_tokens

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


def attention_html(views: Sequence[Any], title: str = "attention explorer") -> str:
    """Render attention views as one self-contained, offline HTML page.

    Args:
        views: a list of :class:`AttentionView` (or dicts with the same keys). One view for
            a decoder-only model; encoder self, decoder self and cross for encoder-decoder.
        title: page title.

    Returns:
        The page.

    Raises:
        ValueError: malformed views, or a page that would exceed :data:`MAX_PAGE_BYTES`
            (choose fewer layers or heads).

    In the page, ``window.attnlab.state()`` returns what is drawn: ``{tab ("head" | "model"),
    view, view_name, layer, layer_id, heads (shown head indices), head_ids, query, key (the
    focused token or null), pinned, lines, weights (per shown head, the focused token's row or
    column), cell ([query, key] under the pointer in the matrix), cell_weights, scale, theme,
    zoom, matrix (the canvas geometry: left, top, cell), thumbs}``. Each drawn ``<line>`` and
    each shaded token also carries a ``data-weight`` attribute.
    """
    if isinstance(views, (AttentionView, Mapping)) or not isinstance(views, Sequence) or not views:
        raise ValueError("views must be a non-empty list of AttentionView (or dicts)")
    parsed = [_as_view(v, i) for i, v in enumerate(views)]
    n_weights = sum(_size(v.weights, f"views[{i}].weights") for i, v in enumerate(parsed))
    if n_weights * BYTES_PER_WEIGHT > MAX_PAGE_BYTES:
        raise ValueError(_too_big(n_weights * BYTES_PER_WEIGHT, parsed))
    payloads = [_view_payload(v, i) for i, v in enumerate(parsed)]
    payload = {"version": 2, "scale": SCALE, "views": payloads}
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
        "layers/heads (e.g. weights[[0, -1]] with matching layer_ids) or a shorter sequence"
    )


def write_attention_html(
    path: str | Path, views: Sequence[Any], title: str = "attention explorer"
) -> Path:
    """Write :func:`attention_html` to ``path`` (UTF-8), creating parent folders; returns it."""
    page = attention_html(views, title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    log.info("wrote attention explorer %s (%.1f kB)", out, len(page) / 1e3)
    return out
