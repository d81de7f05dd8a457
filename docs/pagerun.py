"""Running a page of the docs: its code blocks, their outputs, the page as a script or notebook.

tests/test_docs.py runs every page with :func:`run_page`; the site build (docs/hooks.py) runs
the tutorials with the same function and shows what each block printed under it, and offers
each tutorial as a ``.py`` script and a ``.ipynb`` notebook (:func:`to_script`,
:func:`to_notebook`). A page's outputs are kept in ``.cache/docs-outputs/`` under a key made
of the page's text, this file and attnlab's source (:func:`outputs_key`): a build after the
tests (as in CI) shows the outputs the tests made, and any change runs the page again.

Conventions (the header comment of mkdocs.yml; this file implements them):

* ```` ```python ```` blocks of a page (with or without markdown-exec's ``exec="on"``) run in
  order, in one namespace (``exec``, in this process), in a fresh temporary folder (the
  working directory, also first on ``sys.path``). Tracebacks name the page and its line
  numbers. (The site build runs only the ``exec="on"`` blocks, each in a namespace of its
  own: a figure block imports and computes what it draws.)
* ```` ```bash ```` blocks run with ``bash -e`` in that same folder, ``.venv/bin`` (the bin
  folder of the Python running the tests) first on PATH. Their ``attnlab`` commands run in
  children of one warm server that imported torch once (docs/warm.py; the same command on
  the same input, without its 2-3 s of imports; ``ATTNLAB_DOCS_COLD=1``: fresh processes).
* ``<!-- docs-test: skip REASON -->`` before a block: the block is not run; the reasons are
  reported as one warning per page (pytest's warnings summary). A
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

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
BIN = Path(sys.executable).parent  # .venv/bin: not resolved (a venv's python is a symlink)
BLOCK_TIMEOUT_S = 600

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
MARKER = re.compile(r"<!--\s*docs-test:(?P<body>.*?)-->", re.S)


@dataclass
class Block:
    lang: str  # "python" or "bash" (run), else the fence's language (shown only)
    info: str  # the whole info string, e.g. 'python exec="on" html="1"'
    code: str
    line: int  # line number of the first code line in the page (1-based)
    end: int = 0  # line number of the closing fence (1-based)
    indent: str = ""  # the fence's indentation (a block inside an admonition or a list)
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
        block = Block(word, info, "\n".join(body) + "\n", i + 2, end + 1, indent)
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
def environment(data: Path) -> dict[str, str]:
    """What every block runs with: offline, Agg, one thread, the tiny data, no downloads."""
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, a download fails at once
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg",
            "ATTNLAB_DATA": str(data), "HTTP_PROXY": closed, "HTTPS_PROXY": closed,
            "http_proxy": closed, "https_proxy": closed, "NO_PROXY": "", "no_proxy": "",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "NO_MKDOCS_2_WARNING": "1",  # mkdocs-material's end-of-life banner
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


_WARM: list[dict[str, str]] = []


def _warm(env: dict[str, str]) -> dict[str, str]:
    """The variables that send the blocks' ``attnlab`` commands to one warm server (docs/warm.py)
    started on first use and kept until this process ends."""
    if not _WARM:
        import atexit
        import importlib.util

        # by its path: the site build's hooks may run this with docs/ off sys.path
        spec = importlib.util.spec_from_file_location("attnlab_docs_warm", DOCS / "warm.py")
        warm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(warm)
        server = contextlib.ExitStack()
        _WARM.append(server.enter_context(warm.warm_attnlab(env)))
        atexit.register(server.close)
    return _WARM[0]


class BlockFailed(AssertionError):
    """A block of a page that raised or exited non-zero (the page's code, not the runner)."""


@dataclass
class PageRun:
    """What running a page gave: per block that ran, what it printed; the skip notes."""

    rel: str
    outputs: list[tuple[Block, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _run_python(block: Block, namespace: dict, page: Path, rel: str) -> str:
    # blank lines up to the block keep the page's line numbers in tracebacks
    code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
    except BaseException as e:  # noqa: BLE001 - any failure of the page's code fails the page
        if isinstance(e, KeyboardInterrupt):
            raise
        raise BlockFailed(f"{rel}: the python block at line {block.line} failed: "
                          f"{type(e).__name__}: {e}") from e
    return out.getvalue()


def _run_bash(block: Block, cwd: Path, env: dict[str, str], rel: str) -> str:
    code = append_train_args(block.code, block.args) if block.args else block.code
    try:  # stdout and stderr in one stream, in the order a terminal shows them
        done = subprocess.run(["bash", "-e", "-c", code], cwd=cwd, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise BlockFailed(f"{rel}: the bash block at line {block.line} ran over "
                          f"{BLOCK_TIMEOUT_S} s:\n{code}") from e
    if done.returncode != 0:
        raise BlockFailed(f"{rel}: the bash block at line {block.line} exited with "
                          f"{done.returncode}:\n{code}\n--- output (end) ---\n"
                          f"{done.stdout[-6000:]}")
    return done.stdout


@contextlib.contextmanager
def _as_a_fresh_process(cwd: Path, env: dict[str, str], rel: str):
    """This process as a page's blocks see it (environment, folder, ``sys.path``, ``argv``),
    and as it was afterwards (with torch's default dtype, grad mode and figures reset)."""
    saved_env = {k: os.environ.get(k) for k in env}
    saved_cwd, saved_path, saved_argv = os.getcwd(), list(sys.path), list(sys.argv)
    torch = sys.modules.get("torch")
    saved_torch = (torch.get_default_dtype(), torch.is_grad_enabled()) if torch else None
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))  # as `python` started there: its modules import
    sys.argv = [rel]
    try:
        yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.chdir(saved_cwd)
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        torch = sys.modules.get("torch")
        if torch is not None:
            dtype, grad = saved_torch or (torch.float32, True)
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")


def run_page(rel: str, workdir: Path) -> PageRun:
    """Run every block of ``docs/<rel>`` in ``workdir`` (a fresh folder); what each printed.

    Raises :class:`BlockFailed` at the first block that fails, naming its line.
    """
    page = DOCS / rel
    blocks = parse_blocks(page.read_text(encoding="utf-8"), rel)
    cwd, data = workdir / "page", fill_data_cache(workdir / "data")
    cwd.mkdir()
    env = environment(data)
    if any(b.lang == "bash" and b.skip is None and "attnlab" in b.code for b in blocks):
        env.update(_warm(env))
    run = PageRun(rel)
    namespace: dict = {"__name__": "__main__", "__file__": str(page)}
    with _as_a_fresh_process(cwd, env, rel):
        for block in blocks:
            if block.lang not in ("python", "bash"):
                continue
            if block.skip is not None:
                run.notes.append(f"{rel}:{block.line} ({block.lang}) not run: {block.skip}")
                continue
            out = _run_python(block, namespace, page, rel) if block.lang == "python" else \
                _run_bash(block, cwd, {**os.environ, **env}, rel)
            run.outputs.append((block, _as_shown(out, cwd, data)))
    return run


def _as_shown(out: str, cwd: Path, data: Path) -> str:
    """An output as a reader's run prints it: the page's folder is ``.``, the tiny data
    ``DATA``, progress lines redrawn with ``\\r`` show their last state."""
    out = out.replace(f"{cwd}{os.sep}", "").replace(str(cwd), ".").replace(str(data), "DATA")
    lines = [line.rsplit("\r", 1)[-1] for line in out.split("\n")]
    bar = re.compile(r"^[\w ]+:\s+\d+%\|")  # a progress bar's state: the last one of a run
    return "\n".join(ln for k, ln in enumerate(lines)
                     if not (bar.match(ln) and k + 1 < len(lines) and bar.match(lines[k + 1])))


# ---- outputs on the page -----------------------------------------------------------------------
OUTPUTS = ROOT / ".cache" / "docs-outputs"
SHOWN_LINES = 40  # an output longer than this shows its first and last lines


def shows_outputs(rel: str) -> bool:
    """The pages whose built HTML shows what their blocks print: the tutorials."""
    return rel.startswith("tutorials/") and rel != "tutorials/index.md"


def _source_digest() -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted((ROOT / "src" / "attnlab").rglob("*")):
        if path.is_file() and path.suffix in (".py", ".toml", ".html", ".js", ".css"):
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def outputs_key(rel: str) -> str:
    """What a page's outputs depend on: the page, this runner, attnlab's source."""
    h = hashlib.sha256(rel.encode())
    h.update((DOCS / rel).read_bytes())
    h.update(_source_digest().encode())
    return h.hexdigest()[:32]


def store_outputs(run: PageRun) -> None:
    """Keep a page's outputs for the site build (by line, under the page's current key)."""
    OUTPUTS.mkdir(parents=True, exist_ok=True)
    path = OUTPUTS / f"{run.rel.replace('/', '__')}.{outputs_key(run.rel)}.json"
    for old in OUTPUTS.glob(f"{run.rel.replace('/', '__')}.*.json"):
        old.unlink(missing_ok=True)  # the page's outputs under an older key
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({str(b.line): out for b, out in run.outputs}), encoding="utf-8")
    os.replace(tmp, path)


def stored_outputs(rel: str) -> dict[int, str] | None:
    """A page's outputs by block line, if a run of the page as it is now was kept."""
    path = OUTPUTS / f"{rel.replace('/', '__')}.{outputs_key(rel)}.json"
    if not path.is_file():
        return None
    return {int(k): v for k, v in json.loads(path.read_text(encoding="utf-8")).items()}


def shown_output(block: Block, out: str) -> str | None:
    """The markdown shown under a block that printed ``out`` (None: nothing to show).

    A figure block (``exec="on"``) shows its figure, not its HTML; a block run with tiny
    settings (``docs-test: args``) says so above its output.
    """
    if 'exec="on"' in block.info or not out.strip():
        return None
    lines = out.strip("\n").split("\n")
    if len(lines) > SHOWN_LINES:
        half = SHOWN_LINES // 2
        lines = lines[:half] + [f"... ({len(lines) - 2 * half} lines more) ..."] + lines[-half:]
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", out)), default=0))
    title = "Output"
    if block.args:
        title = "Output of a run with tiny settings on tiny data, made when the site was built"
    shown = [f'{fence}text title="{title}"', *lines, fence]
    return "\n".join(block.indent + ln if ln else ln for ln in shown)


def with_outputs(text: str, outputs: dict[int, str], rel: str = "<page>") -> str:
    """A page's markdown with each block's output (by its first code line) under the block."""
    lines = text.split("\n")
    for block in reversed(parse_blocks(text, rel)):  # from the end: line numbers stay right
        shown = shown_output(block, outputs.get(block.line, ""))
        if shown is not None:
            lines[block.end:block.end] = ["", shown]
    return "\n".join(lines)


# ---- the page as a script or a notebook --------------------------------------------------------
_SH = ('import subprocess\n\n\ndef sh(script: str) -> None:\n'
       '    """Run a shell block of the page (bash -e), as the page does."""\n'
       '    subprocess.run(["bash", "-e", "-c", script], check=True)\n')


def _cells(text: str, rel: str) -> list[tuple[str, str]]:
    """The page as (kind, source) cells: "markdown", "python", "bash" (skipped blocks are
    markdown, with the reason)."""
    lines, cells, at = text.split("\n"), [], 0
    for block in parse_blocks(text, rel):
        if block.lang not in ("python", "bash"):
            continue
        prose = "\n".join(lines[at:block.line - 2]).strip("\n")
        prose = re.sub(r"<!--\s*docs-test:.*?-->\n?", "", prose, flags=re.S).strip("\n")
        if prose:
            cells.append(("markdown", prose))
        if block.skip is not None:
            cells.append(("markdown", f"Not run here ({block.skip}):\n\n```{block.lang}\n"
                                      f"{block.code}```"))
        else:
            cells.append((block.lang, block.code.rstrip("\n")))
        at = block.end
    rest = "\n".join(lines[at:]).strip("\n")
    if rest:
        cells.append(("markdown", rest))
    return cells


def to_script(text: str, rel: str = "<page>") -> str:
    """A page as a Python script in the percent format (``# %%`` cells: VS Code, Spyder and
    Jupytext open it as a notebook); shell blocks run through ``sh``."""
    out = [f"# {rel}: the page as a script. Run it in an empty folder.", "", _SH]
    for kind, source in _cells(text, rel):
        if kind == "markdown":
            out.append("# %% [markdown]\n" + "\n".join(f"# {ln}".rstrip() for ln in
                                                      source.split("\n")))
        elif kind == "python":
            out.append(f"# %%\n{source}")
        else:
            quoted = source.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
            out.append(f'# %%\nsh("""\\\n{quoted}\n""")')
    return "\n\n".join(out) + "\n"


def to_notebook(text: str, rel: str = "<page>") -> str:
    """A page as a Jupyter notebook (nbformat 4): prose cells, code cells, shell blocks as
    ``%%bash`` cells."""
    def source(s: str) -> list[str]:
        parts = s.split("\n")
        return [p + "\n" for p in parts[:-1]] + [parts[-1]]

    cells = []
    for kind, body in _cells(text, rel):
        if kind == "markdown":
            cells.append({"cell_type": "markdown", "metadata": {}, "source": source(body)})
        else:
            code = body if kind == "python" else f"%%bash\n{body}"
            cells.append({"cell_type": "code", "execution_count": None, "metadata": {},
                          "outputs": [], "source": source(code)})
    notebook = {"cells": cells, "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    for k, cell in enumerate(cells):
        cell["id"] = f"cell-{k}"
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
