"""attnlab.viz: plots are written and valid, inputs are checked, the HTML page is safe."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import viz
from attnlab.nn import sinusoidal_table as model_sinusoidal_table
from attnlab.runs import read_metrics
from attnlab.viz.attention import _tick_positions
from attnlab.viz.explorer import MAX_PAGE_BYTES, SCALE

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL = "</script><script>alert(1)</script>"
W1234 = np.full((1, 2, 3, 4), 0.25)


def _attention(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random softmax rows of the given shape."""
    x = np.random.default_rng(seed).normal(size=shape) * 2
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


# ---------------------------------------------------------------- attention heatmaps


def test_plot_attention_grid_writes_png(tmp_path: Path) -> None:
    w = _attention((2, 3, 4, 5))
    out = viz.plot_attention(
        w, list("abcd"), list("vwxyz"), tmp_path / "sub" / "grid.png",
        layer_labels=[0, 5], head_labels=["h0", "h1", "h2"], title="t",
    )  # fmt: skip
    assert out == tmp_path / "sub" / "grid.png" and _is_png(out)


def test_plot_attention_single_panel_torch_and_svg(tmp_path: Path) -> None:
    w = torch.softmax(torch.randn(1, 1, 3, 3, dtype=torch.bfloat16), dim=-1)
    out = viz.plot_attention(w, ["$x$", "<b>", "\n"], ["a", "b", "c"], tmp_path / "one.svg")
    assert out.read_text().lstrip().startswith("<?xml")


def test_plot_attention_accepts_a_list_of_per_layer_tensors(tmp_path: Path) -> None:
    layers = [torch.softmax(torch.randn(2, 3, 3, requires_grad=True), dim=-1) for _ in range(2)]
    assert _is_png(viz.plot_attention(layers, list("abc"), list("xyz"), tmp_path / "l.png"))


def test_plot_attention_long_sequence_caps_ticks(tmp_path: Path) -> None:
    ticks = _tick_positions(500, axis_inches=8.0)
    assert ticks[0] == 0 and len(ticks) <= 8.0 / 0.16 and ticks[-1] >= 450
    assert _tick_positions(6, axis_inches=8.0) == list(range(6))
    tokens = [f"token_with_a_long_name_{i}" for i in range(150)]
    out = viz.plot_attention(_attention((1, 1, 150, 150)), tokens, tokens, tmp_path / "l.png")
    assert _is_png(out)


@pytest.mark.parametrize(
    ("weights", "rows", "cols", "match"),
    [
        (np.full((2, 3, 4), 0.25), list("abc"), list("abcd"), r"rank 4.*\(2, 3, 4\)"),
        (W1234, list("ab"), list("abcd"), r"row_tokens has 2.*\(1, 2, 3, 4\).*T=3"),
        (W1234, list("abc"), list("abcde"), r"col_tokens has 5.*\(1, 2, 3, 4\).*S=4"),
        (np.full((1, 1, 2, 2), 3.0), list("ab"), list("ab"), r"\[0, 1\].*raw scores"),
        (np.full((1, 1, 2, 2), np.nan), list("ab"), list("ab"), "NaN"),
        (np.full((1, 1, 2, 2), 0.5), "ab", list("ab"), "list of token strings"),
        (np.zeros((1, 0, 2, 2)), list("ab"), list("ab"), "empty"),
        # one map per layer, of two shapes (numpy's "all input arrays must have the same
        # shape", naming nothing)
        ([torch.full((1, 2, 2), 0.5), torch.full((2, 2, 2), 0.5)], list("ab"), list("ab"),
         r"weights: the 2 tensors .* must have one shape, got shapes \[\(1, 2, 2\), "
         r"\(2, 2, 2\)\]"),
    ],
)
def test_plot_attention_rejects_bad_input(tmp_path, weights, rows, cols, match) -> None:
    with pytest.raises(ValueError, match=match):
        viz.plot_attention(weights, rows, cols, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plot_attention_rejects_bad_labels_and_suffix(tmp_path: Path) -> None:
    w = _attention((2, 1, 2, 2))
    with pytest.raises(ValueError, match="layer_labels has 1 entries, expected 2"):
        viz.plot_attention(w, list("ab"), list("ab"), tmp_path / "x.png", layer_labels=[0])
    with pytest.raises(ValueError, match=r"supported image suffix.*'\.nope'"):
        viz.plot_attention(w, list("ab"), list("ab"), tmp_path / "x.nope")


def test_plot_alignment(tmp_path: Path) -> None:
    w = _attention((3, 4))  # 3 target tokens x 4 source tokens
    out = viz.plot_alignment(w, list("abcd"), list("xyz"), tmp_path / "a.png", title="cross")
    assert _is_png(out)
    with pytest.raises(ValueError, match=r"src_tokens has 3 tokens.*\(3, 4\)"):
        viz.plot_alignment(w, list("abc"), list("xyz"), tmp_path / "b.png")
    with pytest.raises(ValueError, match=r"rank 2"):
        viz.plot_alignment(w[None], list("abcd"), list("xyz"), tmp_path / "b.png")


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install 'attnlab\[viz\]'"):
        viz.plot_alignment(_attention((2, 2)), list("ab"), list("ab"), tmp_path / "a.png")


# ---------------------------------------------------------------- positions


def test_sinusoidal_table_matches_the_formula_loop() -> None:
    max_len, d_model = 12, 10
    expected = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            expected[pos, 2 * i] = math.sin(angle)
            expected[pos, 2 * i + 1] = math.cos(angle)
    table = viz.sinusoidal_table(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == np.float64
    np.testing.assert_allclose(table, expected, rtol=0, atol=1e-12)


def test_sinusoidal_table_agrees_with_the_model_table() -> None:
    model_table = model_sinusoidal_table(50, 16)
    np.testing.assert_allclose(viz.sinusoidal_table(50, 16), model_table.numpy(), atol=1e-6)


@pytest.mark.parametrize(
    ("max_len", "d_model", "match"),
    [(10, 7, "must be even"), (0, 8, "max_len must be a positive integer"),
     (10, 8.0, "d_model must be a positive integer"), (True, 8, "max_len")],
)  # fmt: skip
def test_sinusoidal_table_rejects(max_len, d_model, match) -> None:
    with pytest.raises(ValueError, match=match):
        viz.sinusoidal_table(max_len, d_model)


def test_plot_positions_sinusoidal_and_learned(tmp_path: Path) -> None:
    assert _is_png(viz.plot_positions(viz.sinusoidal_table(64, 32), tmp_path / "sin.png"))
    learned = torch.nn.Parameter(torch.randn(20, 6) * 0.02)  # D < 8: default curves adapt
    out = viz.plot_positions(learned, tmp_path / "learned.png", curves=[0, 5], title="learned")
    assert _is_png(out)
    assert _is_png(viz.plot_positions(learned, tmp_path / "default.png"))


def test_plot_positions_rejects(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"curves entry 8.*0\.\.7"):
        viz.plot_positions(np.zeros((5, 8)), tmp_path / "p.png", curves=(1, 8))
    with pytest.raises(ValueError, match=r"shape \(N positions, D dimensions\).*\(5,\)"):
        viz.plot_positions(np.zeros(5), tmp_path / "p.png")
    with pytest.raises(ValueError, match="NaN or inf"):
        viz.plot_positions(np.full((3, 4), np.inf), tmp_path / "p.png")


# ---------------------------------------------------------------- loss curves


def test_plot_loss_curve_with_gaps(tmp_path: Path) -> None:
    steps = [0, 10, 20, 30]
    series = {"train": [4.0, 3.0, 2.5, 2.2], "val": [None, 3.2, None, float("nan")]}
    out = viz.plot_loss_curve(steps, series, tmp_path / "loss.png", title="t", log_y=True)
    assert _is_png(out)


@pytest.mark.parametrize(
    ("steps", "series", "kwargs", "match"),
    [
        ([0, 1], {"train": [1.0]}, {}, "has 1 values but steps has 2"),
        ([0, 1], {}, {}, "non-empty dict"),
        ([0, 1], {"train": [1.0, 0.0]}, {"log_y": True}, "positive"),
        ([0, None], {"train": [1.0, 2.0]}, {}, "steps must be"),
        ([0, 1], {"train": [None, None]}, {}, "nothing to plot"),
        ([0, 1], {"train": ["a", 1.0]}, {}, "only numbers"),
    ],
)
def test_plot_loss_curve_rejects(tmp_path, steps, series, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        viz.plot_loss_curve(steps, series, tmp_path / "loss.png", **kwargs)


def test_plot_loss_csv_reads_empty_cells(tmp_path: Path) -> None:
    csv_path = tmp_path / "log.csv"
    csv_path.write_text(
        "step,train_loss,val_loss,lr,tokens_per_s\n"
        "0,4.0,,0.0001,10\n10,3.0,3.5,0.0002,10\n20,2.5,,0.0002,\n"
    )
    rows = read_metrics(csv_path)  # the one reader of the trainer's log
    assert [r["step"] for r in rows] == [0, 10, 20]
    assert list(rows[0]) == ["step", "train_loss", "val_loss", "lr", "tokens_per_s"]
    assert [r["val_loss"] is None for r in rows] == [True, False, True]
    assert _is_png(viz.plot_loss_csv(csv_path, tmp_path / "loss.png"))
    assert _is_png(viz.plot_loss_csv(rows, tmp_path / "rows.png"))  # from rows as well
    # saved again by a spreadsheet, with a byte order mark (its header read '\ufeffstep')
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + csv_path.read_bytes())
    assert read_metrics(bom) == rows


def test_plot_loss_csv_says_when_infinite_values_are_not_drawn(tmp_path, caplog) -> None:
    rows = [{"step": 0, "train_loss": 2.0}, {"step": 10, "train_loss": float("inf")},
            {"step": 20, "train_loss": 1.0}]
    with caplog.at_level("WARNING", logger="attnlab.viz.curves"):
        assert _is_png(viz.plot_loss_csv(rows, tmp_path / "loss.png"))
    assert "1 train_loss values are infinite (first at step 10) and are not drawn" in caplog.text


def test_plot_loss_csv_rows_whose_first_lacks_a_column_keep_it() -> None:
    """Rows as dicts where only later rows have val_loss (the first step is logged before the
    first evaluation): the column was read from the first row's keys and left out."""
    from attnlab.viz.curves import _csv_series

    steps, columns = _csv_series([{"step": 0, "train_loss": 1.0},
                                  {"step": 1, "train_loss": 2.0, "val_loss": 1.5}], "rows")
    assert steps.tolist() == [0, 1] and set(columns) == {"train_loss", "val_loss"}
    np.testing.assert_array_equal(columns["val_loss"], [np.nan, 1.5])
    with pytest.raises(ValueError, match="rows: row 1 has train_loss='abc', not a number"):
        _csv_series([{"step": 0, "train_loss": 1.0}, {"step": 1, "train_loss": "abc"}], "rows")
    with pytest.raises(ValueError, match="must be a list of dicts, one per logged step"):
        _csv_series({"step": [0, 1], "train_loss": [1, 2]}, "rows")  # (read as header s,t,e,p)


@pytest.mark.parametrize("text", ["step,accuracy\n1,0.5\n2,0.75\n",
                                  "step,bleu,f1\n1,3.0,\n2,7.5,0.5\n"])
def test_plot_loss_csv_draws_a_log_of_metrics_alone(tmp_path, text) -> None:
    """A log with task metrics but no loss or lr column (an evaluation log) draws one panel:
    the metrics', titled by them, no empty loss panel."""
    import matplotlib.figure

    (tmp_path / "log.csv").write_text(text)
    figures = []
    real = matplotlib.figure.Figure.savefig
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig",
                   lambda fig, *a, **k: figures.append(fig) or real(fig, *a, **k))
        assert _is_png(viz.plot_loss_csv(tmp_path / "log.csv", tmp_path / "loss.png"))
    (fig,) = figures
    (ax,) = fig.axes
    drawn = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert drawn == ({"accuracy": [0.5, 0.75]} if "accuracy" in text
                     else {"BLEU": [3.0, 7.5], "F1": [0.5]})
    title = fig._suptitle.get_text()
    assert ax.get_ylabel() != "loss" and title.startswith(("accuracy by", "BLEU and F1 by"))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("train_loss,val_loss\n1,2\n", "header with 'step'"),
        ("step,tokens_per_s\n1,2\n", "at least one of train_loss"),
        ("step,accuracy,lr\n1,,\n", "nothing to plot"),
        ("step,train_loss\n", "no data rows"),
        ("step,train_loss\n0,1.0\n1,oops\n", r"line 3, column 'train_loss': 'oops'"),
        ("step,train_loss\n,1.0\n", "line 2: the step cell is empty"),
    ],
)
def test_plot_loss_csv_rejects(tmp_path, text, match) -> None:
    (tmp_path / "log.csv").write_text(text)
    with pytest.raises(ValueError, match=match):
        viz.plot_loss_csv(tmp_path / "log.csv", tmp_path / "loss.png")


# ---------------------------------------------------------------- HTML explorer


def _views() -> list[viz.AttentionView]:
    tokens = ["<bos>", EVIL, "&amp;", "<!--", "caf\u00e9 \u2028", 'it\'s "q"']
    self_weights = _attention((2, 2, 6, 6))
    return [
        viz.AttentionView("decoder self-attention", tokens, tokens, self_weights, [1, 3]),
        viz.AttentionView("cross", ["a", "b"], ["x", "y", "z"], _attention((1, 2, 2, 3), 1)),
    ]


def _embedded_data(page: str) -> dict:
    block = r'<script type="application/json" id="attnlab-data">(.*?)</script>'
    match = re.search(block, page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_attention_html_roundtrips_tokens_and_weights() -> None:
    views = _views()
    data = _embedded_data(viz.attention_html(views, title="demo"))
    assert [v["name"] for v in data["views"]] == ["decoder self-attention", "cross"]
    for got, view in zip(data["views"], views):
        assert got["query_tokens"] == list(view.query_tokens)
        assert got["key_tokens"] == list(view.key_tokens)
        np.testing.assert_allclose(
            np.array(got["weights"]) / data["scale"], view.weights, atol=0.5 / SCALE + 1e-12
        )
    assert data["views"][0]["layer_ids"] == [1, 3] and data["views"][1]["layer_ids"] == [0]


def test_attention_html_carries_head_ids_and_side_labels() -> None:
    view = viz.AttentionView("cross", ["a", "b"], ["x", "y", "z"], _attention((1, 2, 2, 3)),
                             layer_ids=[5], head_ids=[1, 3], query_label="target",
                             key_label="source")
    got = _embedded_data(viz.attention_html([view]))["views"][0]
    assert (got["layer_ids"], got["head_ids"]) == ([5], [1, 3])
    assert (got["query_label"], got["key_label"]) == ("target", "source")
    plain = _embedded_data(viz.attention_html(_views()[:1]))["views"][0]
    assert plain["head_ids"] == [0, 1] and plain["query_label"] == plain["key_label"] == ""


def test_attention_html_is_offline_and_cannot_be_broken_out_of() -> None:
    page = viz.attention_html(_views(), title="<b>title</b> " + EVIL)
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"\b(src|href)\s*=", page, re.I)  # no external resource at all
    assert "</script><script>" not in page and "<!--" not in page.split("<html", 1)[1]
    assert page.count("</script>") == 2  # the JSON block and the code, nothing injected
    assert "<b>title</b>" not in page and "&lt;b&gt;title&lt;/b&gt;" in page
    # The Content-Security-Policy forbids the network and allows exactly the page's own script.
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    code = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
    assert "default-src 'none'" in csp and f"script-src 'sha256-{digest}'" in csp


def test_write_attention_html_accepts_dicts_and_tensors(tmp_path: Path) -> None:
    weights = torch.softmax(torch.randn(1, 2, 3, 3), dim=-1)
    view = {"name": "encoder", "query_tokens": list("abc"), "key_tokens": list("abc"),
            "weights": weights}  # fmt: skip
    out = viz.write_attention_html(tmp_path / "deep" / "page.html", [view], title="t")
    data = _embedded_data(out.read_text(encoding="utf-8"))
    np.testing.assert_allclose(np.array(data["views"][0]["weights"]) / SCALE, weights, atol=1e-4)


@pytest.mark.parametrize(
    ("views", "match"),
    [
        ([], "non-empty list"),
        (viz.AttentionView("v", ["a"], ["a"], np.ones((1, 1, 1, 1))), "non-empty list"),
        ([{"name": "v", "query_tokens": ["a"], "key_tokens": ["a"]}], r"missing keys \['weights'"),
        (
            [
                {
                    "name": "v",
                    "query_tokens": ["a"],
                    "key_tokens": ["a"],
                    "weights": [[[[1.0]]]],
                    "heads": 1,
                }
            ],
            r"unknown keys \['heads'\]",
        ),
        (
            [viz.AttentionView("v", ["a", "b"], ["a"], np.ones((1, 1, 1, 1)))],
            r"shape \(1, 1, 1, 1\).*2 query_tokens.*need T=1",
        ),
        ([viz.AttentionView("v", ["a"], ["a"], np.ones((2, 1, 1, 1)), [0])],
         "2 distinct integers"),
        # the page addresses layers and heads by these ids: duplicates were ambiguous
        ([viz.AttentionView("v", ["a"], ["a"], np.ones((2, 1, 1, 1)), [0, 0])],
         r"layer_ids must be 2 distinct integers >= 0 .* got \[0, 0\]"),
        ([viz.AttentionView("v", ["a"], ["a"], np.ones((1, 1, 1, 1)), 0)],
         "layer_ids must be 1 distinct integers >= 0 .* got 0"),
        ([viz.AttentionView("v", ["a"], ["a"], np.ones((1, 1, 1, 1)), head_ids=[-1])],
         r"head_ids must be 1 distinct integers >= 0"),
        ([viz.AttentionView("", ["a"], ["a"], np.ones((1, 1, 1, 1)))], "name must be"),
        ([viz.AttentionView("v", ["a"], ["a"], np.ones((1, 1, 1)))], "rank 4"),
        (["not a view"], "must be an AttentionView or a dict"),
        ([viz.AttentionView("v", ["a"], ["a"], [[[[1.0]]], [[[1.0], [0.5]]]])],
         r"views\[0\].weights must be one \(L, H, T, S\) array, got nested lists"),
        (
            [viz.AttentionView("v", ["a"], ["a"], np.ones((1, 2, 1, 1)) / 2, head_ids=[0])],
            r"head_ids must be 2 distinct integers",
        ),
        (
            [viz.AttentionView("v", ["a"], ["a"], np.ones((1, 1, 1, 1)), query_label=3)],
            "query_label must be a string",
        ),
    ],
)
def test_attention_html_rejects_bad_views(views, match) -> None:
    with pytest.raises(ValueError, match=match):
        viz.attention_html(views)


def test_attention_html_refuses_huge_pages() -> None:
    # A broadcast view: the shape of a 24-layer, 16-head, 512-token model without the memory.
    huge = np.broadcast_to(np.float32(1 / 512), (24, 16, 512, 512))
    assert huge.size * 6 > MAX_PAGE_BYTES
    tokens = [str(i) for i in range(512)]
    with pytest.raises(ValueError, match=r"over the 20 MB limit.*fewer layers/heads"):
        viz.attention_html([viz.AttentionView("big", tokens, tokens, huge)])


def test_plot_attention_labels_only_the_outer_panels(tmp_path: Path, monkeypatch) -> None:
    """The grid's panels share their token axes: only the bottom row and the left column
    carry ticks (ticks on every panel made a 6 x 12 grid take half a minute to lay out)."""
    from attnlab.viz import attention

    drawn = {}
    save = attention.save_figure
    monkeypatch.setattr(attention, "save_figure",
                        lambda fig, path: drawn.setdefault("fig", fig) and save(fig, path))
    viz.plot_attention(_attention((3, 4, 6, 6)), list("abcdef"), list("uvwxyz"),
                       tmp_path / "g.png")
    axes = [ax for ax in drawn["fig"].axes if ax.images]  # the panels, not the colorbar
    assert len(axes) == 12
    for i, ax in enumerate(axes):
        layer, head = divmod(i, 4)
        assert bool(len(ax.get_xticks())) == (layer == 2), (layer, head)
        assert bool(len(ax.get_yticks())) == (head == 0), (layer, head)
    assert [t.get_text() for t in axes[8].get_xticklabels()] == list("uvwxyz")
    assert [t.get_text() for t in axes[0].get_yticklabels()] == list("abcdef")
