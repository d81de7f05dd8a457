"""The HTML attention explorer driven in a real headless Chromium.

The browser is driven over the Chrome DevTools Protocol through ``--remote-debugging-pipe``
(JSON messages separated by NUL bytes on file descriptors 3 and 4), so the only requirement
is the Chromium binary itself: ``apt-get install chromium``. Set ``ATTNLAB_CHROMIUM`` to use
another Chromium/Chrome binary. Without one these tests are skipped, never installed here.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnlab.viz import AttentionView, write_attention_html

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM") or shutil.which("chromium")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--remote-debugging-pipe",
]  # fmt: skip
REPLY_TIMEOUT_S = 30.0  # guards against a hung browser; not a speed requirement
EVIL = "</script><script>window.__pwned = 1; alert(1)</script>"
EVIL_IMG = '<img src=x onerror="window.__pwned = 2; alert(2)">'


class Chromium:
    """A headless Chromium with a minimal CDP client: commands, events, one page session."""

    def __init__(self, exe: str, profile: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        self._stderr = (profile / "stderr.log").open("wb")
        # Chromium reads commands on fd 3 and writes replies on fd 4; bash (unlike dash)
        # redirects from fd numbers above 9, and then becomes chromium through exec.
        wrapper = f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        self.proc = subprocess.Popen(
            ["bash", "-c", wrapper, "bash", exe, *FLAGS, f"--user-data-dir={profile}"],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._profile = profile
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _stderr_tail(self) -> str:
        text = (self._profile / "stderr.log").read_text(errors="replace")
        return text[-2000:]

    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], REPLY_TIMEOUT_S)
            chunk = os.read(self._from_browser, 1 << 16) if ready else b""
            if not chunk:
                raise RuntimeError(f"chromium stopped answering; stderr:\n{self._stderr_tail()}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, _session: bool = True, **params: Any) -> dict[str, Any]:
        """Send one command (to the page session unless ``_session=False``); return its result."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if _session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply["result"]
            self._on_event(reply)

    def _on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event.get("method") == "Page.javascriptDialogOpening":  # record it, then dismiss
            msg = {"id": 0, "method": "Page.handleJavaScriptDialog", "params": {"accept": False}}
            msg["sessionId"] = event["sessionId"]
            os.write(self._to_browser, json.dumps(msg).encode() + b"\0")

    def open(self, url: str) -> None:
        """Open ``url`` in a new 1200x900 page and wait for its load event."""
        target = self.send("Target.createTarget", _session=False, url="about:blank")
        attached = self.send(
            "Target.attachToTarget", _session=False, targetId=target["targetId"], flatten=True
        )
        self.session = attached["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=1200, height=900,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        start = len(self.events)  # a second page: wait for its own load event
        self.send("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events[start:]):
            self._on_event(self._read_message())

    def js(self, expression: str) -> Any:
        """Evaluate ``expression`` in the page and return its value (JSON-compatible)."""
        out = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in out:
            details = out["exceptionDetails"]
            raise RuntimeError(f"page raised: {details.get('exception', details)}")
        return out["result"].get("value")

    def _centre(self, selector: str, index: int) -> tuple[float, float]:
        x, y = self.js(
            f"(() => {{ const el = document.querySelectorAll({json.dumps(selector)})[{index}];"
            " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        return x, y

    def hover(self, selector: str, index: int) -> None:
        """Move the real (CDP-dispatched) mouse to the centre of the index-th match."""
        x, y = self._centre(selector, index)
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def click(self, selector: str, index: int) -> None:
        """Move there, press and release the left mouse button."""
        x, y = self._centre(selector, index)
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def choose(self, select_id: str, value: str) -> None:
        """Pick an option of a <select> the way a user's choice arrives: value + change event."""
        self.js(
            f"(() => {{ const s = document.getElementById({json.dumps(select_id)});"
            f" s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()"
        )

    def events_named(self, method: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("method") == method]

    def close(self) -> None:
        try:
            self.send("Browser.close", _session=False)
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._stderr.close()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The explorer for a decoder self-attention view and a cross-attention view, loaded."""
    if not CHROMIUM:
        pytest.skip("chromium not installed (apt-get install chromium): browser test skipped")
    rng = np.random.default_rng(0)
    tokens = ["<bos>", "a", EVIL, "&amp;", EVIL_IMG, "end"]
    n = len(tokens)
    causal = np.tril(np.ones((n, n), dtype=bool))
    self_w = _softmax(np.where(causal, rng.normal(size=(2, 3, n, n)) * 2, -np.inf))
    src, tgt = ["le", "chat", "dort"], ["the", "cat", "sleeps", "."]
    cross_w = _softmax(rng.normal(size=(1, 2, len(tgt), len(src))) * 2)
    views = [
        AttentionView("decoder self-attention", tokens, tokens, self_w, layer_ids=[0, 3]),
        AttentionView("cross-attention", tgt, src, cross_w, layer_ids=[3],
                      query_label="target", key_label="source"),
    ]
    root = tmp_path_factory.mktemp("explorer")
    path = write_attention_html(root / "explorer.html", views, title=EVIL)
    (root / "profile").mkdir()
    browser = Chromium(CHROMIUM, root / "profile")
    try:
        browser.open(path.resolve().as_uri())
        yield browser, tokens, self_w, cross_w
    finally:
        browser.close()


def _drawn_lines(browser: Chromium) -> list[dict[str, str]]:
    return browser.js(
        "Array.from(document.querySelectorAll('#lines line')).map(l => ({...l.dataset,"
        " stroke: l.getAttribute('stroke'), opacity: l.getAttribute('stroke-opacity')}))"
    )


def _key(browser: Chromium, key: str) -> None:
    """Press and release one key as the keyboard sends it (to the focused element)."""
    codes = {"ArrowDown": 40, "ArrowUp": 38, "ArrowLeft": 37, "ArrowRight": 39, "Escape": 27,
             "Enter": 13}
    code = codes.get(key, ord(key.upper()) if len(key) == 1 else 0)
    text = key if len(key) == 1 else ""
    for kind in ("keyDown" if text else "rawKeyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", type=kind, key=key, text=text if kind != "keyUp"
                     else "", windowsVirtualKeyCode=code)


def _pixels(browser: Chromium, selector: str, points: list[tuple[float, float]]) -> np.ndarray:
    """RGB of the canvas ``selector`` at CSS-pixel points (x, y): what is drawn there."""
    rgb = browser.js(
        f"(() => {{ const c = document.querySelector({json.dumps(selector)});"
        " const r = c.width / c.clientWidth;"
        " const ctx = c.getContext('2d');"
        f" return {json.dumps(points)}.map(([x, y]) => Array.from("
        "ctx.getImageData(Math.floor(x * r), Math.floor(y * r), 1, 1).data.slice(0, 3))); })()"
    )
    return np.array(rgb, dtype=float)


def _hex(color: str) -> np.ndarray:
    return np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)], dtype=float)


def _tone(pixels: np.ndarray, background: np.ndarray, color: np.ndarray) -> np.ndarray:
    """Invert the page's colour scale: where each pixel lies between background and colour."""
    axis = int(np.argmax(np.abs(color - background)))
    return (pixels[:, axis] - background[axis]) / (color[axis] - background[axis])


def _reset(browser: Chromium, view: int = 0, layer: int = 0) -> None:
    browser.js("document.activeElement && document.activeElement.blur()")
    _key(browser, "h")
    _key(browser, "Escape")
    browser.choose("view", str(view))
    browser.choose("layer", str(layer))
    _key(browser, "a")  # all heads shown


def test_head_view_overlays_every_head_in_its_colour(page: Any) -> None:
    browser, tokens, self_w, _ = page
    _reset(browser, 0, 1)
    browser.hover("#queries .tok", 4)
    state = browser.js("window.attnlab.state()")
    assert (state["tab"], state["view"], state["layer"], state["layer_id"], state["query"]) == (
        "head", 0, 1, 3, 4,
    )  # fmt: skip
    assert state["heads"] == [0, 1, 2]
    np.testing.assert_allclose(state["weights"], self_w[1, :, 4], atol=1e-3)
    lines = _drawn_lines(browser)
    assert len(lines) == 3 * len(tokens) and {d["query"] for d in lines} == {"4"}
    assert len({d["stroke"] for d in lines}) == 3  # one distinct colour per head
    for d in lines:
        assert float(d["weight"]) == pytest.approx(self_w[1, int(d["head"]), 4, int(d["key"])],
                                                   abs=1e-3)
    # The key tokens are shaded by the mean of the shown heads.
    shades = browser.js("Array.from(document.querySelectorAll('#keys .tok'),"
                        " t => Number(t.dataset.weight))")
    np.testing.assert_allclose(shades, self_w[1, :, 4].mean(axis=0), atol=1e-3)


def test_heads_toggle_one_by_one_with_mouse_and_keyboard(page: Any) -> None:
    browser, tokens, self_w, _ = page
    _reset(browser, 0, 0)
    browser.click("#heads .chip", 1)  # hide head 1
    browser.hover("#queries .tok", 5)
    state = browser.js("window.attnlab.state()")
    assert state["heads"] == [0, 2]
    assert browser.js("Array.from(document.querySelectorAll('#heads .chip'),"
                      " b => b.getAttribute('aria-pressed'))") == ["true", "false", "true"]
    lines = _drawn_lines(browser)
    assert {d["head"] for d in lines} == {"0", "2"} and len(lines) == 2 * len(tokens)
    _key(browser, "0")  # keyboard: hide head 0 as well
    browser.hover("#queries .tok", 5)
    state = browser.js("window.attnlab.state()")
    assert state["heads"] == [2]
    np.testing.assert_allclose(state["weights"], self_w[0, [2], 5], atol=1e-3)
    _key(browser, ".")  # only the next head
    assert browser.js("window.attnlab.state()")["heads"] == [0]


def test_hovering_a_key_shows_what_attends_to_it(page: Any) -> None:
    browser, tokens, self_w, _ = page
    _reset(browser, 0, 1)
    browser.hover("#keys .tok", 2)
    state = browser.js("window.attnlab.state()")
    assert state["key"] == 2 and state["query"] is None
    np.testing.assert_allclose(state["weights"], self_w[1, :, :, 2], atol=1e-3)
    assert {d["key"] for d in _drawn_lines(browser)} == {"2"}


def test_matrix_draws_the_weights_and_reads_the_cell_under_the_pointer(page: Any) -> None:
    browser, tokens, self_w, _ = page
    _reset(browser, 0, 1)
    _key(browser, "1")
    _key(browser, "2")  # only head 0 shown: the matrix is head 0 in its own colour
    state = browser.js("window.attnlab.state()")
    assert state["heads"] == [0]
    geom = state["matrix"]
    n = len(tokens)
    centres = [(geom["left"] + (k + 0.5) * geom["cell"], geom["top"] + (q + 0.5) * geom["cell"])
               for q in range(n) for k in range(n)]
    drawn = _tone(_pixels(browser, "#matrix", centres), _bg(browser), _hex("#1f77b4"))
    np.testing.assert_allclose(drawn.reshape(n, n), self_w[1, 0], atol=0.02)

    # The value under the pointer: move the real mouse over cell (query 3, key 1).
    x, y = browser.js("(() => { const r = document.getElementById('matrix')"
                      ".getBoundingClientRect(); return [r.x, r.y]; })()")
    cx, cy = centres[3 * n + 1]
    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=x + cx, y=y + cy)
    state = browser.js("window.attnlab.state()")
    assert state["cell"] == [3, 1] and state["query"] == 3  # the line view follows
    assert state["cell_weights"][0] == pytest.approx(self_w[1, 0, 3, 1], abs=1e-3)
    readout = browser.js("document.getElementById('readout').textContent")
    assert f"{self_w[1, 0, 3, 1]:.4f}" in readout and "#3" in readout and "#1" in readout

    # Keyboard: focus the matrix, move the cell with the arrow keys.
    browser.js("document.getElementById('matrix').focus()")
    _key(browser, "ArrowRight")
    _key(browser, "ArrowDown")
    state = browser.js("window.attnlab.state()")
    assert state["cell"] == [4, 2] and state["pinned"]
    assert state["cell_weights"][0] == pytest.approx(self_w[1, 0, 4, 2], abs=1e-3)


def _bg(browser: Chromium) -> np.ndarray:
    color = browser.js("getComputedStyle(document.documentElement).getPropertyValue('--bg')")
    return _hex(color.strip())


def test_model_view_grid_and_click_to_open(page: Any) -> None:
    browser, tokens, self_w, _ = page
    _reset(browser, 0, 0)
    _key(browser, "m")
    state = browser.js("window.attnlab.state()")
    assert state["tab"] == "model" and state["thumbs"] == 2 * 3  # layers x heads
    n = len(tokens)
    for layer, head in [(0, 0), (1, 2)]:
        sel = f'#grid canvas[data-layer="{layer}"][data-head="{head}"]'
        rgb = browser.js(
            f"Array.from(document.querySelector({json.dumps(sel)}).getContext('2d')"
            f".getImageData(0, 0, {n}, {n}).data)"
        )
        pixels = np.array(rgb, dtype=float).reshape(-1, 4)[:, :3]
        colour = _hex(["#1f77b4", "#ff7f0e", "#2ca02c"][head])
        np.testing.assert_allclose(_tone(pixels, _bg(browser), colour).reshape(n, n),
                                   self_w[layer, head], atol=0.02)
    browser.click("#grid canvas", 1 * 3 + 2)  # layer 1, head 2
    state = browser.js("window.attnlab.state()")
    assert (state["tab"], state["layer"], state["layer_id"], state["heads"]) == ("head", 1, 3, [2])
    # Keyboard: back to the model view, move to a thumbnail, Enter opens it.
    _key(browser, "m")
    browser.js("document.querySelector('#grid canvas[data-layer=\"0\"][data-head=\"0\"]')"
               ".focus()")
    _key(browser, "ArrowRight")
    _key(browser, "Enter")
    state = browser.js("window.attnlab.state()")
    assert (state["tab"], state["layer"], state["heads"]) == ("head", 0, [1])


def test_cross_attention_labels_source_and_target(page: Any) -> None:
    browser, _, _, cross_w = page
    _reset(browser, 1, 0)
    assert browser.js("document.querySelector('#queries .colhead').textContent") == (
        "query (target)")
    assert browser.js("document.querySelector('#keys .colhead').textContent") == "key (source)"
    browser.hover("#queries .tok", 2)
    state = browser.js("window.attnlab.state()")
    assert state["view_name"] == "cross-attention" and state["query"] == 2
    np.testing.assert_allclose(state["weights"], cross_w[0, :, 2], atol=1e-3)
    assert browser.js("document.querySelectorAll('#keys .tok').length") == 3
    browser.hover("h1", 0)  # leave the tokens: nothing focused, the strong lines faintly
    state = browser.js("window.attnlab.state()")
    assert state["query"] is None and state["weights"] is None and state["lines"] > 0


def test_click_and_arrow_keys_pin_a_query_token(page: Any) -> None:
    browser, _, _, cross_w = page
    _reset(browser, 1, 0)
    browser.click("#queries .tok", 1)
    browser.hover("#queries .tok", 3)  # pinned: hovering elsewhere changes nothing
    browser.hover("h1", 0)
    state = browser.js("window.attnlab.state()")
    assert state["pinned"] and state["query"] == 1
    np.testing.assert_allclose(state["weights"], cross_w[0, :, 1], atol=1e-3)
    _key(browser, "ArrowDown")
    state = browser.js("window.attnlab.state()")
    assert state["pinned"] and state["query"] == 2
    np.testing.assert_allclose(state["weights"], cross_w[0, :, 2], atol=1e-3)
    browser.click("#queries .tok", 2)  # click again: released
    browser.hover("h1", 0)
    state = browser.js("window.attnlab.state()")
    assert not state["pinned"] and state["query"] is None


def test_layers_views_and_theme_from_the_keyboard(page: Any) -> None:
    browser, _, self_w, _ = page
    _reset(browser, 0, 0)
    _key(browser, "]")
    assert browser.js("window.attnlab.state()")["layer_id"] == 3
    _key(browser, "v")
    assert browser.js("window.attnlab.state()")["view_name"] == "cross-attention"
    _key(browser, "v")
    light = browser.js("getComputedStyle(document.body).backgroundColor")
    assert browser.js("window.attnlab.state()")["theme"] == "light"  # the test browser's default
    _key(browser, "t")  # system -> light
    _key(browser, "t")  # light -> dark
    state = browser.js("window.attnlab.state()")
    assert state["theme"] == "dark"
    assert browser.js("getComputedStyle(document.body).backgroundColor") != light
    # The matrix is repainted on the dark background: a zero weight is the background.
    geom = state["matrix"]
    n = self_w.shape[-1]
    centre = [(geom["left"] + (n - 0.5) * geom["cell"], geom["top"] + 0.5 * geom["cell"])]
    assert self_w[state["layer"], :, 0, n - 1].max() == 0  # causal: the first query
    np.testing.assert_allclose(_pixels(browser, "#matrix", centre)[0], _bg(browser), atol=1)
    _key(browser, "t")  # dark -> system
    assert browser.js("window.attnlab.state()")["theme"] == "light"
    browser.send("Emulation.setEmulatedMedia",  # the system asks for dark: the page follows
                 features=[{"name": "prefers-color-scheme", "value": "dark"}])
    try:
        assert browser.js("window.attnlab.state()")["theme"] == "dark"
        assert browser.js("getComputedStyle(document.body).backgroundColor") != light
    finally:
        browser.send("Emulation.setEmulatedMedia", features=[])
    assert browser.js("document.getElementById('keyhelp').textContent").count("head") >= 2


def test_tokens_are_literal_text_and_nothing_executes(page: Any) -> None:
    browser, tokens, _, _ = page
    _reset(browser, 0, 0)
    shown = browser.js(
        "Array.from(document.querySelectorAll('#queries .tok')).map(t => t.textContent)"
    )
    assert shown == tokens
    assert browser.js("document.getElementById('title').textContent") == EVIL
    assert browser.js("document.title") == EVIL
    assert browser.js("typeof window.__pwned") == "undefined"
    assert browser.js("document.querySelectorAll('script').length") == 2
    assert browser.js("document.querySelectorAll('img').length") == 0
    assert browser.events_named("Page.javascriptDialogOpening") == []
    assert browser.events_named("Runtime.exceptionThrown") == []


def test_long_sequences_scroll_and_zoom(page: Any, tmp_path: Path) -> None:
    """130 tokens: every token reachable by scrolling, the matrix zooms with + and -."""
    browser, _, _, _ = page
    n = 130
    tokens = [f"t{i}" for i in range(n)]
    weights = _softmax(np.random.default_rng(1).normal(size=(1, 2, n, n)) * 3)
    path = write_attention_html(tmp_path / "long.html",
                                [AttentionView("long", tokens, tokens, weights)])
    browser.open(path.resolve().as_uri())
    browser.hover("#queries .tok", n - 1)  # scrolled into view first, as a user scrolls
    state = browser.js("window.attnlab.state()")
    assert state["query"] == n - 1
    np.testing.assert_allclose(state["weights"], weights[0, :, n - 1], atol=1e-3)
    zoom = state["zoom"]
    assert zoom >= 4 and state["matrix"]["cell"] == zoom
    _key(browser, "+")
    _key(browser, "+")
    assert browser.js("window.attnlab.state()")["zoom"] == zoom + 4
    box = browser.js("(() => { const b = document.getElementById('matrixbox'); return"
                     " [b.scrollHeight > b.clientHeight, b.scrollWidth > b.clientWidth]; })()")
    assert box == [True, True]  # the zoomed matrix scrolls inside its box


def test_digit_keys_and_the_address_name_heads_and_layers_by_their_ids(page: Any,
                                                                      tmp_path: Path) -> None:
    """A page of heads 1 and 3 of layers 2 and 5 (`viz attention --head 3 --head 1 ...`):
    key 3 toggles head 3 (keys counted places: key 1 hid head 3, key 3 did nothing), and
    #layer=5&heads=3 opens layer 5 with head 3 alone (it showed no head)."""
    browser, _, _, _ = page
    weights = _softmax(np.random.default_rng(2).normal(size=(2, 2, 4, 4)))
    path = write_attention_html(tmp_path / "ids.html", [AttentionView(
        "encoder", list("abcd"), list("abcd"), weights, layer_ids=[2, 5], head_ids=[1, 3])])
    browser.open(path.resolve().as_uri() + "#layer=5&heads=3")
    state = browser.js("window.attnlab.state()")
    assert state["layer_id"] == 5 and state["head_ids"] == [3]
    _key(browser, "1")  # head 1 shown again
    assert browser.js("window.attnlab.state()")["head_ids"] == [1, 3]
    _key(browser, "3")  # head 3 hidden
    assert browser.js("window.attnlab.state()")["head_ids"] == [1]
    _key(browser, "0")  # no head 0 on this page: nothing changes
    assert browser.js("window.attnlab.state()")["head_ids"] == [1]
