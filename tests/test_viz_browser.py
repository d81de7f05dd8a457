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
        self.send("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
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
        AttentionView("cross-attention", tgt, src, cross_w, layer_ids=[3]),
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
        " stroke: l.getAttribute('stroke')}))"
    )


def test_hover_single_head_draws_the_weight_row(page: Any) -> None:
    browser, tokens, self_w, _ = page
    browser.choose("view", "0")
    browser.choose("layer", "1")
    browser.choose("head", "2")
    browser.hover("#queries .tok:not(.head)", 4)
    state = browser.js("window.attnlab.state()")
    assert (state["view"], state["layer"], state["layer_id"], state["head"], state["query"]) == (
        0, 1, 3, 2, 4,
    )  # fmt: skip
    expected = self_w[1, 2, 4]
    np.testing.assert_allclose(state["weights"], expected, atol=1e-3)
    lines = sorted(_drawn_lines(browser), key=lambda d: int(d["key"]))
    assert [int(d["key"]) for d in lines] == list(range(len(tokens)))
    assert {d["query"] for d in lines} == {"4"} and {d["head"] for d in lines} == {"2"}
    np.testing.assert_allclose([float(d["weight"]) for d in lines], expected, atol=1e-3)
    shades = browser.js(
        "Array.from(document.querySelectorAll('#keys .key .tok'), t => Number(t.dataset.weight))"
    )
    np.testing.assert_allclose(shades, expected, atol=1e-3)


def test_mean_and_overlay_of_heads(page: Any) -> None:
    browser, tokens, self_w, _ = page
    browser.choose("view", "0")
    browser.choose("layer", "0")
    browser.choose("head", "mean")
    browser.hover("#queries .tok:not(.head)", 5)
    state = browser.js("window.attnlab.state()")
    assert state["head"] == "mean" and state["query"] == 5
    np.testing.assert_allclose(state["weights"], self_w[0, :, 5].mean(axis=0), atol=1e-3)

    browser.choose("head", "all")
    browser.hover("#queries .tok:not(.head)", 3)
    state = browser.js("window.attnlab.state()")
    np.testing.assert_allclose(state["weights"], self_w[0, :, 3], atol=1e-3)
    lines = _drawn_lines(browser)
    assert len(lines) == 3 * len(tokens)
    assert len({d["stroke"] for d in lines}) == 3  # one distinct colour per head


def test_cross_attention_view_and_mouse_leave(page: Any) -> None:
    browser, _, _, cross_w = page
    browser.choose("view", "1")
    browser.choose("head", "1")
    browser.hover("#queries .tok:not(.head)", 2)
    state = browser.js("window.attnlab.state()")
    assert state["view_name"] == "cross-attention" and state["query"] == 2
    np.testing.assert_allclose(state["weights"], cross_w[0, 1, 2], atol=1e-3)
    assert browser.js("document.querySelectorAll('#keys .key .tok').length") == 3

    browser.hover("h1", 0)  # leave the query column: nothing hovered, all lines faint
    state = browser.js("window.attnlab.state()")
    assert state["query"] is None and state["weights"] is None and state["lines"] > 0


def test_click_pins_a_query_token(page: Any) -> None:
    browser, _, _, cross_w = page
    browser.choose("view", "1")
    browser.choose("head", "0")
    browser.click("#queries .tok:not(.head)", 1)
    browser.hover("#queries .tok:not(.head)", 3)  # pinned: hovering elsewhere changes nothing
    browser.hover("h1", 0)
    state = browser.js("window.attnlab.state()")
    assert state["pinned"] and state["query"] == 1
    np.testing.assert_allclose(state["weights"], cross_w[0, 0, 1], atol=1e-3)
    browser.click("#queries .tok:not(.head)", 1)  # click again: released
    browser.hover("h1", 0)
    state = browser.js("window.attnlab.state()")
    assert not state["pinned"] and state["query"] is None


def test_tokens_are_literal_text_and_nothing_executes(page: Any) -> None:
    browser, tokens, _, _ = page
    browser.choose("view", "0")
    shown = browser.js(
        "Array.from(document.querySelectorAll('#queries .tok:not(.head)')).map(t => t.textContent)"
    )
    assert shown == tokens
    assert browser.js("document.getElementById('title').textContent") == EVIL
    assert browser.js("document.title") == EVIL
    assert browser.js("typeof window.__pwned") == "undefined"
    assert browser.js("document.querySelectorAll('script').length") == 2
    assert browser.js("document.querySelectorAll('img').length") == 0
    assert browser.events_named("Page.javascriptDialogOpening") == []
    assert browser.events_named("Runtime.exceptionThrown") == []
