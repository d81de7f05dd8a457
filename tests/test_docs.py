"""The documentation runs: every code block of every page under docs/, the nav, the site build.

Conventions (the header comment of mkdocs.yml; this file implements them):

* ```` ```python ```` blocks of a page (with or without markdown-exec's ``exec="on"``) run in
  order, in one namespace (``exec``, in this process), in a fresh temporary folder (the
  working directory, also first on ``sys.path``). Tracebacks name the page and its line
  numbers. (The site build runs only the ``exec="on"`` blocks, each in a namespace of its
  own: a figure block imports and computes what it draws.)
* ```` ```bash ```` blocks run with ``bash -e`` in that same folder, ``.venv/bin`` (the bin
  folder of the Python running the tests) first on PATH.
* ``<!-- docs-test: skip REASON -->`` before a block: the block is not run; the reasons are
  reported as one :class:`DocsBlockSkipped` warning per page (pytest's warnings summary). A
  skip without a reason fails the page's test. A page whose every block is skipped is reported
  as a skipped test.
* ``<!-- docs-test: args ARGS -->`` before a block: ARGS are appended to each command of the
  block that starts with ``attnlab train`` (before a trailing ``# comment``, after the last
  line of a ``\\``-continued command). Bash expands them: ``$ATTNLAB_DATA`` works.
* Any other ``docs-test:`` comment, or a marker with no block after it, fails the test.
* Other fences (``text``, ``toml``, ``console``, ``sh``, ...) are shown, never run. A marker
  quoted in inline code (between backticks, as in a page that explains them) is prose.

Each page is one test (``test_page[tutorials/01-attention.md]``), so a broken page names
itself; a failing block is reported with its first line number in the page.

Environment of every block: ``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``,
``MPLBACKEND=Agg``, ``OMP_NUM_THREADS=1`` unless already set (tiny models on a shared
2-core machine), ``ATTNLAB_DATA`` (below), and ``HTTP(S)_PROXY`` pointing at a closed local
port: nothing a page runs can download.

Data sets. ``attnlab.data.fetch`` verifies what its cache holds (sha256 for Tiny Shakespeare
and Multi30k, exactly 67,349 parsed rows for SST-2) and fetches again any file that fails, so
tiny stand-in files in the cache are not used by a recipe that reads the cache: it would try
to download (and fail here at once, naming ``data.path``). Pages therefore always name their
data files. ``ATTNLAB_DATA`` points at a fresh per-page cache that this test fills with tiny
files of the real names and formats (:func:`fill_data_cache`):

* ``$ATTNLAB_DATA/shakespeare/input.txt``  (8 KB: the play's opening, repeated)
* ``$ATTNLAB_DATA/multi30k/{train,val}.{de,en}``  (64 / 8 German-English caption pairs)
* ``$ATTNLAB_DATA/sst2/train.tsv``  (40 sentences, ``sentence<TAB>label`` with a header)

The recipes run on them with tiny settings (``shakespeare_char``: also
``--set train.compile=false``, whose compilation alone takes longer than a tiny run).

A page shows the real command and adds the tiny data with a marker, e.g.::

    <!-- docs-test: args --set data.path=$ATTNLAB_DATA/shakespeare/input.txt
         --set train.max_steps=3 -->

(Multi30k: ``data.src_path``, ``data.tgt_path``, ``data.val_src_path``,
``data.val_tgt_path``), or writes small files of its own in its folder and passes those.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
BIN = Path(sys.executable).parent  # .venv/bin: not resolved (a venv's python is a symlink)
BLOCK_TIMEOUT_S = 600

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
MARKER = re.compile(r"<!--\s*docs-test:(?P<body>.*?)-->", re.S)


class DocsBlockSkipped(UserWarning):
    """A code block of a page that the docs test did not run, and why."""


@dataclass
class Block:
    lang: str  # "python" or "bash" (run), else the fence's language (shown only)
    info: str  # the whole info string, e.g. 'python exec="on" html="1"'
    code: str
    line: int  # line number of the first code line in the page (1-based)
    skip: str | None = None
    args: list[str] = field(default_factory=list)


class PageError(Exception):
    """A page that breaks the conventions (not a failing block: a malformed marker)."""


def pages() -> list[str]:
    """Every page under docs/, as a path relative to docs/ (the ids of the page tests)."""
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def parse_blocks(text: str, page: str = "<page>") -> list[Block]:
    """The fenced code blocks of a page with the markers that apply to them."""
    lines = text.split("\n")
    blocks: list[Block] = []
    pending: list[tuple[int, str, str]] = []  # (line, kind, value) of markers before a block
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            quoted = [c.span() for c in re.finditer(r"`[^`]*`", lines[i])]  # `inline code`
            for mm in MARKER.finditer(lines[i]):
                if not any(a <= mm.start() < b for a, b in quoted):  # quoted: prose, not one
                    pending.append((i + 1, *_marker(mm.group("body"), page, i + 1)))
            # a marker spread over several lines
            opening = lines[i].find("<!--")
            if opening >= 0 and not any(a <= opening < b for a, b in quoted) and \
                    "docs-test:" in lines[i] and "-->" not in lines[i]:
                end = next((j for j in range(i + 1, len(lines)) if "-->" in lines[j]), None)
                if end is None:
                    raise PageError(f"{page}:{i + 1}: docs-test marker is never closed (-->)")
                joined = " ".join(s.strip() for s in lines[i:end + 1])
                for mm in MARKER.finditer(joined):
                    pending.append((i + 1, *_marker(mm.group("body"), page, i + 1)))
                i = end
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:
            raise PageError(f"{page}:{i + 1}: code fence {fence} is never closed")
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                for ln in lines[i + 1:end]]
        word = info.split()[0].strip("{}.").lower() if info else ""
        block = Block(word, info, "\n".join(body) + "\n", i + 2)
        for _, kind, value in pending:
            if kind == "skip":
                block.skip = value
            else:
                block.args.append(value)
        if pending and block.lang not in ("python", "bash"):
            raise PageError(f"{page}:{pending[0][0]}: docs-test marker before a block that is "
                            f"not run ({info or 'no language'}): only python and bash blocks "
                            "run")
        if block.args and block.lang != "bash":
            raise PageError(f"{page}:{pending[0][0]}: docs-test: args applies to bash blocks "
                            "(their `attnlab train` lines)")
        if block.args and block.skip is None and not any(
                _is_train(ln) for ln in block.code.splitlines()):
            raise PageError(f"{page}:{pending[0][0]}: docs-test: args before a block without "
                            "an `attnlab train` line")
        pending = []
        blocks.append(block)
        i = end + 1
    if pending:
        raise PageError(f"{page}:{pending[0][0]}: docs-test marker with no code block after it")
    return blocks


def _marker(body: str, page: str, line: int) -> tuple[str, str]:
    kind, _, value = body.strip().partition(" ")
    value = " ".join(value.split())
    if kind not in ("skip", "args"):
        raise PageError(f"{page}:{line}: unknown marker docs-test: {kind!r}; allowed: "
                        "`docs-test: skip REASON`, `docs-test: args ARGS`")
    if not value:
        what = "a reason (say why the block is not run)" if kind == "skip" else "ARGS"
        raise PageError(f"{page}:{line}: `docs-test: {kind}` needs {what}")
    return kind, value


def _is_train(line: str) -> bool:
    return re.match(r"\s*attnlab\s+train(\s|$)", line) is not None


def _comment_at(line: str) -> int | None:
    """Index of an unquoted ``#`` that starts a shell comment in ``line``, else None."""
    quote, k = None, 0
    while k < len(line):
        ch = line[k]
        if ch == "\\" and quote != "'":
            k += 2  # an escaped character (outside quotes or inside double quotes)
            continue
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return k
        k += 1
    return None


def append_train_args(code: str, args: list[str]) -> str:
    """``code`` with ``args`` appended to each command that starts with ``attnlab train``."""
    lines, extra = code.split("\n"), " ".join(args)
    k = 0
    while k < len(lines):
        if not _is_train(lines[k]):
            k += 1
            continue
        last = k
        while lines[last].rstrip().endswith("\\") and last + 1 < len(lines):
            last += 1  # the command goes on: append after its last line
        ln = lines[last]
        cut = _comment_at(ln)
        head, tail = (ln, "") if cut is None else (ln[:cut].rstrip(), "  " + ln[cut:])
        lines[last] = f"{head} {extra}{tail}"
        k = last + 1
    return "\n".join(lines)


# ---- tiny stand-ins for the data sets ---------------------------------------------------------
_SHAKESPEARE = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.

All:
We know't, we know't.

First Citizen:
Let us kill him, and we'll have corn at our own price.
Is't a verdict?

All:
No more talking on't; let it be done: away, away!

Second Citizen:
One word, good citizens.

First Citizen:
We are accounted poor citizens, the patricians good.
What authority surfeits on would relieve us: if they
would yield us but the superfluity, while it were
wholesome, we might guess they relieved us humanely;
but they think we are too dear: the leanness that
afflicts us, the object of our misery, is as an
inventory to particularise their abundance; our
sufferance is a gain to them. Let us revenge this with
our pikes, ere we become rakes: for the gods know I
speak this in hunger for bread, not in thirst for revenge.

"""

_PAIRS = [
    ("Ein Mann fährt Fahrrad.", "A man rides a bicycle."),
    ("Eine Frau liest ein Buch.", "A woman reads a book."),
    ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
    ("Ein Kind isst einen Apfel.", "A child eats an apple."),
    ("Ein Mann spielt Gitarre.", "A man plays guitar."),
    ("Eine Frau trinkt Kaffee.", "A woman drinks coffee."),
    ("Ein Junge springt ins Wasser.", "A boy jumps into the water."),
    ("Ein Mädchen läuft am Strand.", "A girl runs on the beach."),
    ("Zwei Männer sitzen auf einer Bank.", "Two men sit on a bench."),
    ("Ein Hund rennt über das Gras.", "A dog runs across the grass."),
    ("Eine Gruppe von Menschen tanzt.", "A group of people dances."),
    ("Ein Mann kocht in der Küche.", "A man cooks in the kitchen."),
    ("Eine Frau fährt ein rotes Auto.", "A woman drives a red car."),
    ("Ein Kind malt ein Bild.", "A child paints a picture."),
    ("Zwei Mädchen lachen zusammen.", "Two girls laugh together."),
    ("Ein Mann schläft auf dem Sofa.", "A man sleeps on the sofa."),
]

_REVIEWS = [
    ("a gorgeous , witty , seductive movie", 1),
    ("the film is a charming and often affecting journey", 1),
    ("one of the best films of the year", 1),
    ("a warm , funny and engaging film", 1),
    ("beautifully shot and wonderfully acted", 1),
    ("an absorbing and moving story", 1),
    ("smart , sharp and very funny", 1),
    ("a delightful comedy with a big heart", 1),
    ("the acting is superb", 1),
    ("a triumph of style and substance", 1),
    ("it 's a tired , predictable mess", 0),
    ("the plot is thin and the jokes fall flat", 0),
    ("a dull , lifeless film", 0),
    ("boring and far too long", 0),
    ("the worst movie of the year", 0),
    ("an ugly , pointless exercise", 0),
    ("the characters are flat and the dialogue is awful", 0),
    ("a clumsy and tedious mess", 0),
    ("nothing here is funny", 0),
    ("it never comes to life", 0),
    ("a moving portrait of a family", 1),
    ("funny , tender and true", 1),
    ("the cast is excellent and the script is clever", 1),
    ("a rare film that earns its tears", 1),
    ("an exhilarating ride from start to finish", 1),
    ("thoughtful , honest and beautifully made", 1),
    ("the director 's best work in years", 1),
    ("a small gem of a movie", 1),
    ("inventive and deeply satisfying", 1),
    ("you will leave the theater smiling", 1),
    ("a muddled , overlong drama", 0),
    ("the story makes no sense at all", 0),
    ("flat , lazy and forgettable", 0),
    ("a waste of a talented cast", 0),
    ("painfully slow and utterly predictable", 0),
    ("the jokes are stale and the pacing is off", 0),
    ("a loud , empty spectacle", 0),
    ("i wanted to walk out", 0),
    ("dreary and without a single surprise", 0),
    ("an embarrassment for everyone involved", 0),
]


def fill_data_cache(root: Path) -> Path:
    """Tiny files of the real names and formats in fetch's cache layout ``root/<name>/``."""
    shakespeare = root / "shakespeare"
    shakespeare.mkdir(parents=True)
    (shakespeare / "input.txt").write_text(_SHAKESPEARE * 8, encoding="utf-8")  # 8 KB
    multi30k = root / "multi30k"
    multi30k.mkdir()
    for split, rows in (("train", _PAIRS * 4), ("val", _PAIRS[:8])):
        for lang, col in (("de", 0), ("en", 1)):
            (multi30k / f"{split}.{lang}").write_text(
                "".join(r[col] + "\n" for r in rows), encoding="utf-8")
    sst2 = root / "sst2"
    sst2.mkdir()
    rows = [f"{s}\t{y}\n" for s, y in _REVIEWS]
    (sst2 / "train.tsv").write_text("sentence\tlabel\n" + "".join(rows), encoding="utf-8")
    return root


# ---- running a page ----------------------------------------------------------------------------
def _environment(data: Path) -> dict[str, str]:
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, a download fails at once
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg",
           "ATTNLAB_DATA": str(data), "HTTP_PROXY": closed, "HTTPS_PROXY": closed,
           "http_proxy": closed, "https_proxy": closed, "NO_PROXY": "", "no_proxy": "",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "NO_MKDOCS_2_WARNING": "1",  # mkdocs-material's end-of-life banner
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return env


def _run_python(block: Block, namespace: dict, page: Path, rel: str) -> None:
    # blank lines up to the block keep the page's line numbers in tracebacks
    code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
    try:
        exec(code, namespace)
    except BaseException as e:  # noqa: BLE001 - any failure of the page's code fails the page
        if isinstance(e, KeyboardInterrupt):
            raise
        raise AssertionError(f"{rel}: the python block at line {block.line} failed: "
                             f"{type(e).__name__}: {e}") from e


def _run_bash(block: Block, cwd: Path, env: dict[str, str], rel: str) -> None:
    code = append_train_args(block.code, block.args) if block.args else block.code
    try:
        done = subprocess.run(["bash", "-e", "-c", code], cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{rel}: the bash block at line {block.line} ran over "
                             f"{BLOCK_TIMEOUT_S} s:\n{code}") from e
    if done.returncode != 0:
        raise AssertionError(
            f"{rel}: the bash block at line {block.line} exited with {done.returncode}:\n"
            f"{code}\n--- stdout (end) ---\n{done.stdout[-3000:]}\n"
            f"--- stderr (end) ---\n{done.stderr[-3000:]}")


def run_page(rel: str, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run every block of ``docs/<rel>`` in ``workdir``; return the skip notes."""
    import torch

    page = DOCS / rel
    blocks = parse_blocks(page.read_text(encoding="utf-8"), rel)
    cwd, data = workdir / "page", fill_data_cache(workdir / "data")
    cwd.mkdir()
    env = {**os.environ, **_environment(data)}
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MPLBACKEND", "ATTNLAB_DATA",
                "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY",
                "no_proxy", "PATH"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))  # as `python` started there: its modules import
    monkeypatch.setattr(sys, "argv", [rel])
    namespace: dict = {"__name__": "__main__", "__file__": str(page)}
    notes, ran = [], 0
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    try:
        for block in blocks:
            if block.lang not in ("python", "bash"):
                continue
            if block.skip is not None:
                notes.append(f"{rel}:{block.line} ({block.lang}) not run: {block.skip}")
                continue
            ran += 1
            if block.lang == "python":
                _run_python(block, namespace, page, rel)
            else:
                _run_bash(block, cwd, env, rel)
    finally:  # what a page may change for the rest of the session
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        _close_figures()
    if notes and not ran:
        pytest.skip("; ".join(notes))
    return notes


def _close_figures() -> None:
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.mark.parametrize("rel", pages())
def test_page(rel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notes = run_page(rel, tmp_path, monkeypatch)
    if notes:
        warnings.warn(DocsBlockSkipped("; ".join(notes)), stacklevel=1)


# ---- the docstrings' examples -----------------------------------------------------------------
# The objects a user calls first: each docstring has an ``Examples:`` section of doctest lines
# (what ``help()`` and the reference pages show), run here. (MaskedLM's is build_model's: the
# models/ files keep under tests/test_layout.py's line budget.)
EXAMPLES = ["attnlab.models.build_model", "attnlab.models.decoder.DecoderLM",
            "attnlab.models.encoder.EncoderClassifier",
            "attnlab.models.encoder_decoder.Transformer", "attnlab.runs.load_run",
            "attnlab.decoding.lm.generate_text", "attnlab.data.prepare.prepare",
            "attnlab.interpret.hooks.run_with_cache", "attnlab.interpret.hooks.hooks"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_docstring_examples_run(name: str) -> None:
    import doctest
    import importlib

    import torch

    module, _, attr = name.rpartition(".")
    obj = getattr(importlib.import_module(module), attr)
    doc = obj.__doc__ or ""
    assert "\n    Examples:\n" in doc and ">>> " in doc, f"{name}: no Examples section"
    # in the namespace of the object's module, as doctest runs them
    globs = dict(vars(importlib.import_module(module)))
    test = doctest.DocTestParser().get_doctest(doc, globs, name, module, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures: list[str] = []
    grad = torch.is_grad_enabled()
    try:
        runner.run(test, out=failures.append)
    finally:
        torch.set_grad_enabled(grad)
    assert runner.failures == 0, f"{name}: its Examples fail:\n" + "".join(failures)


# ---- nav and build -----------------------------------------------------------------------------
def _load_mkdocs_yml() -> dict:
    import yaml

    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python/name or !ENV tags
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load(MKDOCS_YML.read_text(encoding="utf-8"), Loader=Loader)


def nav_pages(nav) -> list[str]:
    """The local pages (``*.md``) of a mkdocs nav, in order (external links left out)."""
    out: list[str] = []
    if isinstance(nav, str):
        if not re.match(r"^[a-z][a-z0-9+.-]*://", nav):
            out.append(nav)
    elif isinstance(nav, list):
        for item in nav:
            out += nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            out += nav_pages(value)
    return out


def test_nav_lists_every_page_and_only_pages_that_exist() -> None:
    listed = nav_pages(_load_mkdocs_yml().get("nav"))
    twice = sorted({p for p in listed if listed.count(p) > 1})
    missing = sorted(set(listed) - set(pages()))
    unlisted = sorted(set(pages()) - set(listed))
    assert not twice, f"pages listed more than once in mkdocs.yml's nav: {twice}"
    assert not missing, f"mkdocs.yml's nav lists pages that docs/ does not have: {missing}"
    assert not unlisted, f"pages in docs/ that mkdocs.yml's nav does not list: {unlisted}"


def test_parse_blocks_and_markers() -> None:
    """The runner's own conventions (cheap; a page author can read the rules here)."""
    page = "\n".join([
        "Text.", "```python", "x = 1", "```",
        "<!-- docs-test: skip needs a `cuda` GPU -->", "```bash", "nvidia-smi", "```",
        "<!-- docs-test: args --set train.max_steps=3 -->", "```bash",
        "attnlab train demo --out 'runs/ #a'  # the demo", "attnlab train \\", "  --out runs/b",
        "attnlab sample runs/a", "```",
        "!!! note", "    ```python", "    y = 2", "    ```",
        "```toml", "[train]", "```",
        "Write `<!-- docs-test: skip REASON -->` before a block.",
    ])
    blocks = parse_blocks(page)
    assert [(b.lang, b.line, b.skip) for b in blocks] == [
        ("python", 3, None), ("bash", 7, "needs a `cuda` GPU"), ("bash", 11, None),
        ("python", 18, None), ("toml", 21, None)]
    assert blocks[3].code == "y = 2\n"
    assert append_train_args(blocks[2].code, blocks[2].args).splitlines() == [
        "attnlab train demo --out 'runs/ #a' --set train.max_steps=3  # the demo",
        "attnlab train \\", "  --out runs/b --set train.max_steps=3", "attnlab sample runs/a"]
    multi = parse_blocks("<!-- docs-test: args --set a=1\n     --set b=2 -->\n"
                         "```bash\nattnlab train x\n```\n")
    assert multi[0].args == ["--set a=1 --set b=2"]
    for bad, says in [
        ("<!-- docs-test: skip -->\n```bash\nls\n```", "needs a reason"),
        ("<!-- docs-test: skip   -->\n```bash\nls\n```", "needs a reason"),
        ("<!-- docs-test: skipp x -->\n```bash\nls\n```", "unknown marker"),
        ("<!-- docs-test: skip later -->\ntext", "no code block after it"),
        ("<!-- docs-test: args --x -->\n```bash\nls\n```", "without an `attnlab train`"),
        ("<!-- docs-test: skip x -->\n```text\nls\n```", "not run"),
        ("```python\nx = 1\n", "never closed"),
    ]:
        with pytest.raises(PageError, match=says):
            parse_blocks(bad)


@dataclass
class Site:
    done: subprocess.CompletedProcess
    path: Path

    def checked(self) -> Path:
        """The site's folder, once the build is known to have passed."""
        assert self.done.returncode == 0, ("mkdocs build --strict failed:\n"
                                           f"{self.done.stdout[-4000:]}\n"
                                           f"{self.done.stderr[-6000:]}")
        return self.path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The site, built once for the tests below as ``make docs`` builds it."""
    tmp = tmp_path_factory.mktemp("site")
    env = {**os.environ, **_environment(fill_data_cache(tmp / "data"))}
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "-f", str(MKDOCS_YML),
                           "-d", str(tmp / "site")], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=1800)
    return Site(done, tmp / "site")


@pytest.mark.slow
def test_site_builds_strict(site: Site) -> None:
    """``mkdocs build --strict`` (as ``make docs``): a warning (a broken link, a nav entry
    without its page, an API name mkdocstrings cannot find, a failing exec block) fails."""
    assert (site.checked() / "index.html").is_file()


# ---- the recipe cards; no developer machine's paths ---------------------------------------------
CARD_MAX_LINES = 30
CARD_NAMES = ("date", "commit", "machine", "command")
DEVELOPER_PATHS = ("../shared", "/work/")


def recipe_cards(page: str) -> dict[str, str]:
    """The cards of docs/recipes.md: each ``## `NAME` `` section, from its heading to the next
    ``## `` heading (or the end), trailing blank lines left out."""
    return {name: f"## `{name}`\n{body}".rstrip("\n")
            for name, body in re.findall(r"^## `([\w-]+)`\n(.*?)(?=^## |\Z)", page, re.M | re.S)}


def card_problems(cards: dict[str, str]) -> list[str]:
    """What is wrong with the cards: one longer than CARD_MAX_LINES, or one whose table does not
    name the date, commit, machine and command of a measured row."""
    problems = []
    for name, card in cards.items():
        lines = card.split("\n")
        if len(lines) > CARD_MAX_LINES:
            problems.append(f"{name}: {len(lines)} lines (at most {CARD_MAX_LINES}; the notes "
                            "go to docs/what-we-tried.md)")
        table = [ln for ln in lines if ln.startswith("|")]
        columns = [c.strip().lower() for c in table[0].strip().strip("|").split("|")] \
            if table else []
        if not set(CARD_NAMES) <= set(columns):
            problems.append(f"{name}: the table does not name {', '.join(CARD_NAMES)}")
        elif len(table) < 3:
            problems.append(f"{name}: no measured row")
    return problems


def test_every_recipe_card_is_short_and_names_date_commit_machine_and_command() -> None:
    from attnlab.recipes import shipped

    page = (DOCS / "recipes.md").read_text(encoding="utf-8")
    cards = recipe_cards(page)
    assert set(cards) == set(shipped()), "one card per shipped recipe"
    assert card_problems(cards) == []
    assert "(what-we-tried.md" in page  # the levers and their measurements are one click away


def test_the_card_check_fails_on_a_long_card_or_a_missing_field() -> None:
    head = "| machine | reaches | time | date | commit | command |\n" + "| --- " * 6 + "|\n"
    row = "| Xeon | 99% | 60 s | 2026-11-26 | abcdef1 | `attnlab train copy` |\n"
    good = "## `copy`\n\nCopies.\n\n" + head + row
    assert card_problems(recipe_cards(good)) == []
    long = "## `copy`\n\n" + "A note.\n" * CARD_MAX_LINES + head + row
    assert "lines (at most" in card_problems(recipe_cards(long))[0]
    no_commit = good.replace(" commit |", " version |")
    assert "does not name" in card_problems(recipe_cards(no_commit))[0]
    assert "no measured row" in card_problems(recipe_cards(good.replace(row, "")))[0]
    two = good + "\n## `sort`\n\nSorts.\n" + head + row
    assert list(recipe_cards(two)) == ["copy", "sort"] and card_problems(recipe_cards(two)) == []


def test_no_page_names_a_path_of_a_developer_machine() -> None:
    """The docs (and the recipes' comments, and how to run the benchmarks) name the data as
    `attnlab data fetch NAME` or DATA (a folder of local copies), never a path of the machine
    that measured a figure."""
    files = [DOCS / rel for rel in pages()] + sorted((ROOT / "src" / "attnlab" / "recipes")
                                                     .glob("*.toml"))
    files += [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    found = [f"{path.relative_to(ROOT)}:{n}: {needle}"
             for path in files
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for needle in DEVELOPER_PATHS if needle in line]
    assert found == []


ROLE_TEXT = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):")


def _without_source(html: str) -> str:
    """A reference page less its source listings (the code, whose docstrings keep the roles)."""
    return re.sub(r'<details class="mkdocstrings-source">.*?</details>', "", html, flags=re.S)


@pytest.mark.slow
def test_reference_roles_are_links(site: Site) -> None:
    """The docstrings' reST roles (``:class:`~attnlab.config.ModelConfig```) are links on the
    reference pages (docs/griffe_roles.py), never raw role text."""
    ref = site.checked() / "reference"
    raw = {}
    for page in sorted(ref.glob("*.html")):
        text = _without_source(page.read_text(encoding="utf-8"))
        found = [text[max(0, m.start() - 60):m.end() + 40] for m in ROLE_TEXT.finditer(text)]
        if found:
            raw[page.name] = found[:3]
    assert not raw, f"raw reST role text on the reference pages: {raw}"
    models = (ref / "models.html").read_text(encoding="utf-8")
    # MaskedLM.forward's :class:`~attnlab.config.LossOptions`: the last name, linked
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="config\.html#'
                     r'attnlab\.config\.LossOptions"[^>]*><code>LossOptions</code></a>', models)
    links = sum(len(re.findall(r'class="autorefs autorefs-internal"', _without_source(
        p.read_text(encoding="utf-8")))) for p in ref.glob("*.html"))
    roles = sum(len(ROLE_TEXT.findall(p.read_text(encoding="utf-8")))
                for p in (ROOT / "src").rglob("*.py"))
    assert links >= roles // 2, f"{links} links on the reference pages for {roles} roles in src/"


@pytest.mark.slow
def test_site_works_opened_from_disk(site: Site) -> None:
    """mkdocs-material's offline plugin: links name their ``.html`` files (no server to map
    ``page/`` to ``page/index.html``) and the search index is inlined as a script."""
    path = site.checked()
    home = (path / "index.html").read_text(encoding="utf-8")
    assert 'href="quickstart.html"' in home and 'href="reference/index.html"' in home
    index = (path / "search" / "search_index.js").read_text(encoding="utf-8")
    assert index.startswith("var __index = {") and '"location":"quickstart.html' in index


def test_the_pages_give_the_demo_one_measured_time_with_its_machine() -> None:
    """The README, the docs' front page, the train guide and tutorial 6 say how long the demo
    takes with the same figure and machine, and the demo card of docs/recipes.md has a row of
    that machine with that time."""
    root = Path(__file__).resolve().parents[1]
    said = re.compile(r"(\d[\d,]*) s on a 2-core ([A-Z][\w ]+(?:\([^)]*\))?)")
    figures = {}
    for rel in ("README.md", "docs/index.md", "docs/guides/train.md",
                "docs/tutorials/06-char-lm.md"):
        text = (root / rel).read_text(encoding="utf-8")
        found = {m.groups() for m in said.finditer(" ".join(text.split()))}
        assert len(found) == 1, (rel, found)
        figures[rel] = found.pop()
    assert len(set(figures.values())) == 1, figures
    seconds, machine = next(iter(figures.values()))
    card = (root / "docs/recipes.md").read_text(encoding="utf-8").split("## `demo`")[1]
    card = card.split("\n## ")[0]
    rows = [row for row in card.splitlines() if row.startswith("| ") and "2 cores" in row]
    assert any(machine.split(" (")[0] in row and f"{seconds} s" in row for row in rows), rows
