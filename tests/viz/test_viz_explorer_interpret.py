"""The explorer's analysis views: logit lens, head grids and patching heatmaps.

The page checks need nothing; the browser test drives a headless Chromium as
tests/viz/test_viz_browser.py does (skipped, with the reason, when chromium is absent) and saves
a screenshot of each view in /tmp/explorer_shots/.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_viz_browser import CHROMIUM, EVIL, Chromium

from attnlab.viz import AttentionView
from attnlab.viz.explorer import HeadGrid, LensView, PositionGrid, attention_html
from attnlab.viz.explorer import write_attention_html as write_page

SHOTS = Path("/tmp/explorer_shots")
TOKENS = ["<bos>", "the", " cat", EVIL, " sat", "."]


def _views() -> list[AttentionView]:
    rng = np.random.default_rng(0)
    n = len(TOKENS)
    x = np.where(np.tril(np.ones((n, n), bool)), rng.normal(size=(2, 3, n, n)) * 2, -np.inf)
    w = np.exp(x - x.max(-1, keepdims=True))
    return [AttentionView("decoder self-attention", TOKENS, TOKENS, w / w.sum(-1, keepdims=True))]


def _analyses() -> list[Any]:
    rng = np.random.default_rng(1)
    rows, n, k = ["embed", "layer 0", "layer 1"], len(TOKENS), 3
    probs = np.sort(rng.dirichlet(np.ones(8), size=(3, n))[..., :k], -1)[..., ::-1]
    top = [[[TOKENS[(r + t + j) % n] for j in range(k)] for t in range(n)] for r in range(3)]
    target_prob = rng.uniform(size=(3, n))
    target_prob[:, -1] = np.nan
    rank = rng.integers(0, 9, size=(3, n)).astype(float)
    rank[:, -1] = -1
    return [
        LensView("logit lens", TOKENS, rows, top, probs, TOKENS[1:] + [None], target_prob, rank),
        HeadGrid("ablation: decoder heads", np.array([[0.5, -0.25, 0.0], [1.5, -1.0, 0.1]]),
                 view="decoder self-attention", note="loss change"),
        PositionGrid("patching: residual stream", rng.normal(size=(2, n)), TOKENS),
    ]


def _data(page: str) -> dict:
    return json.loads(re.search(r'id="attnlab-data">(.*?)</script>', page, re.S).group(1))


def test_page_is_offline_and_embeds_the_analyses_safely() -> None:
    page = attention_html(_views(), title=EVIL, analyses=_analyses())
    assert not re.search(r"(https?:)?//[a-z0-9]", page.split("<script>")[0].lower()
                         .replace("http-equiv", ""))
    assert "http://" not in page and "https://" not in page and "default-src 'none'" in page
    assert page.count("</script>") == 2  # the data block's and the code's: no token closes one
    data = _data(page)["analyses"]
    assert [a["kind"] for a in data] == ["lens", "heads", "positions"]
    assert data[0]["tokens"][3] == EVIL and data[0]["targets"][-1] is None
    assert data[0]["target_prob"][0][-1] is None and data[0]["target_rank"][0][-1] is None
    assert data[1]["signed"] and data[1]["view"] == 0 and data[1]["values"][1][0] == 1.5
    assert data[1]["limit"] is None  # the scale's end: the largest |value| unless given
    fixed = attention_html(_views(), analyses=[HeadGrid("scores", np.full((2, 3), 0.002),
                                                         limit=1.0)])
    assert _data(fixed)["analyses"][0]["limit"] == 1.0  # scores near 0 stay pale


@pytest.mark.parametrize("analysis, match", [
    (HeadGrid("g", np.ones((2, 2)), view="nope"), "not one of the attention views"),
    (HeadGrid("g", np.ones(3)), "must have shape"),
    (HeadGrid("g", np.array([[np.inf]])), "NaN or inf"),
    (PositionGrid("p", np.ones((2, 3)), ["a", "b"]), r"shape \(n, 2\)"),
    (LensView("l", ["a"], ["r"], [[["x", "y"]]], np.ones((1, 1, 3))), "top_tokens must be"),
    (HeadGrid("", np.ones((1, 1))), "name must be"),
    (HeadGrid("g", np.ones((1, 1)), limit=0.0), "limit must be a finite number > 0"),
    ("a grid", "must be a LensView, HeadGrid or PositionGrid"),
])
def test_bad_analyses_are_refused(analysis: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        attention_html(_views(), analyses=[analysis])


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not CHROMIUM:
        pytest.skip("chromium not installed (apt-get install chromium): browser test skipped")
    root = tmp_path_factory.mktemp("analysis")
    path = write_page(root / "page.html", _views(), title="analysis views", analyses=_analyses())
    (root / "profile").mkdir()
    chromium = Chromium(CHROMIUM, root / "profile")
    try:
        chromium.open(path.resolve().as_uri())
        yield chromium
    finally:
        chromium.close()


def _key(browser: Chromium, key: str, code: str = "") -> None:
    text = "\r" if key == "Enter" else key if len(key) == 1 else ""
    for kind in ("keyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", type=kind, key=key, code=code or key,
                     windowsVirtualKeyCode={"Enter": 13, "Tab": 9}.get(key, 0),
                     text=text if kind == "keyDown" else "")


def _shot(browser: Chromium, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    png = browser.send("Page.captureScreenshot", format="png")["data"]
    (SHOTS / f"{name}.png").write_bytes(base64.b64decode(png))


def test_tab_to_a_head_cell_and_enter_opens_that_head(browser: Chromium) -> None:
    browser.js("document.getElementById('tab-analysis').click()")
    browser.choose("analysis", "1")
    state = browser.js("window.attnlab.state()")
    assert state["tab"] == "analysis" and state["analysis_kind"] == "heads"
    assert state["cells"] == 6
    _shot(browser, "head_grid")
    # from the last button of the bar, Tab through the cells to layer 1, head 1 (the fifth)
    browser.js("document.getElementById('help').focus()")
    for _ in range(5):
        _key(browser, "Tab")
    focused = browser.js("[document.activeElement.dataset.row, document.activeElement.dataset.col]")
    assert focused == ["1", "1"]
    _key(browser, "Enter")
    state = browser.js("window.attnlab.state()")
    assert state["tab"] == "head" and state["layer_id"] == 1 and state["head_ids"] == [1]


def test_signed_grid_uses_a_diverging_scale(browser: Chromium) -> None:
    browser.js("document.getElementById('tab-analysis').click()")
    browser.choose("analysis", "1")
    colours = browser.js("Array.from(document.querySelectorAll('#anatable td')).map("
                         "td => getComputedStyle(td).backgroundColor)")
    rgb = [tuple(map(int, re.findall(r"\d+", c)[:3])) for c in colours]
    assert rgb[3][0] > rgb[3][2]  # 1.5: red
    assert rgb[4][2] > rgb[4][0]  # -1.0: blue
    assert rgb[2] == (255, 255, 255)  # 0.0: the background


def test_lens_and_patching_views_show_tokens_as_text(browser: Chromium) -> None:
    browser.js("document.getElementById('tab-analysis').click()")
    browser.choose("analysis", "0")
    cells = browser.js("Array.from(document.querySelectorAll('#anatable td')).map("
                       "td => [td.textContent, td.title])")
    assert len(cells) == 18 and cells[3][0].startswith("</script>")
    assert "real next" in cells[0][1] and "rank" in cells[0][1] and "top 3" in cells[0][1]
    assert browser.js("window.__pwned === undefined")
    _shot(browser, "logit_lens")
    browser.choose("analysis", "2")
    heads = browser.js("Array.from(document.querySelectorAll('#anatable thead th')).map("
                       "th => th.textContent)")
    assert heads[1:] == [t for t in TOKENS]
    _shot(browser, "patching")
    browser.js("document.getElementById('theme').click(); document.getElementById('theme')"
               ".click()")  # dark
    _shot(browser, "patching_dark")
