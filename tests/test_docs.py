"""The documentation runs: every code block of every page under docs/, the nav, the site build.

The conventions of a page (which blocks run, the ``docs-test:`` markers, the tiny data sets,
the environment) are docs/pagerun.py's docstring: the tests and the site build run pages with
the same runner. Each page is one test (``test_page[tutorials/01-attention.md]``), so a broken
page names itself; a failing block is reported with its first line number in the page. The
tutorials' outputs made here are kept for the site build, which shows them under their blocks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
BIN = Path(sys.executable).parent  # .venv/bin: not resolved (a venv's python is a symlink)

sys.path.insert(0, str(DOCS))
import pagerun  # noqa: E402 - docs/ is not a package
from pagerun import (  # noqa: E402
    PageError,
    append_train_args,
    environment,
    fill_data_cache,
    pages,
    parse_blocks,
)


class DocsBlockSkipped(UserWarning):
    """A code block of a page that the docs test did not run, and why."""


@pytest.mark.parametrize("rel", pages())
def test_page(rel: str, tmp_path: Path) -> None:
    run = pagerun.run_page(rel, tmp_path)
    if run.notes and not run.outputs:
        pytest.skip("; ".join(run.notes))
    if pagerun.shows_outputs(rel):
        pagerun.store_outputs(run)  # the site build shows them (same page, same source)
    if run.notes:
        warnings.warn(DocsBlockSkipped("; ".join(run.notes)), stacklevel=1)


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


def test_the_quickstart_is_first_in_the_nav_and_the_readme_links_it() -> None:
    assert nav_pages(_load_mkdocs_yml().get("nav"))[0] == "quickstart.md"
    assert "docs/quickstart.md" in (ROOT / "README.md").read_text(encoding="utf-8")


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


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The site, built once for the tests below as ``make docs`` builds it."""
    tmp = tmp_path_factory.mktemp("site")
    env = {**os.environ, **environment(fill_data_cache(tmp / "data"))}
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


# ---- the tutorials' outputs on the page, and each as a script and a notebook -------------------
_PAGE = "\n".join([
    "# A page", "", "```python", "x = 2", "```", "", "```python", "print('x is', x)", "```",
    "<!-- docs-test: args --set train.max_steps=3 -->", "```bash", "attnlab train demo", "```",
    "", "!!! note", "    ```python", "    print('indented')", "    ```", "",
    '```python exec="on" html="1"', "print('<img>')", "```", "", "The end.",
])


def test_outputs_go_under_the_blocks_that_printed_them() -> None:
    blocks = {b.code.strip(): b for b in parse_blocks(_PAGE)}
    outputs = {blocks["print('x is', x)"].line: "x is 2\n",
               blocks["attnlab train demo"].line: "step 3  val_loss 4.1\n",
               blocks["print('indented')"].line: "indented\n",
               blocks["print('<img>')"].line: "<img>\n"}
    shown = pagerun.with_outputs(_PAGE, outputs).split("\n")
    at = shown.index("print('x is', x)")
    assert shown[at + 1:at + 6] == ["```", "", '```text title="Output"', "x is 2", "```"]
    at = shown.index("attnlab train demo")
    assert shown[at + 3].startswith('```text title="Output of a run with tiny settings')
    at = shown.index("    print('indented')")
    assert shown[at + 1:at + 6] == ["    ```", "", '    ```text title="Output"', "    indented",
                                    "    ```"]
    assert shown.count("x = 2") == 1 and shown[shown.index("x = 2") + 2] == ""  # printed nothing
    assert "<img>" not in shown  # a figure block shows its figure, not its HTML
    assert len(shown) == len(_PAGE.split("\n")) + 3 * 4  # a blank line and a 3-line fence each


def test_a_long_output_shows_its_ends_and_a_fence_longer_than_its_backticks() -> None:
    block = parse_blocks("```python\nprint()\n```\n")[0]
    out = "".join(f"line {k}\n" for k in range(100)) + "````\n"
    shown = pagerun.shown_output(block, out).split("\n")
    assert shown[0].startswith("`````text") and shown[-1] == "`````"
    assert "line 0" in shown and "````" in shown and "line 50" not in shown
    assert any("lines more" in ln for ln in shown)


def test_a_page_as_a_script_and_a_notebook_keeps_every_block_in_order() -> None:
    import ast

    import nbformat

    script = pagerun.to_script(_PAGE, "a.md")
    ast.parse(script)
    assert script.index("x = 2") < script.index("print('x is', x)") < \
        script.index('sh("""\\\nattnlab train demo\n""")') < script.index("print('indented')")
    assert "docs-test" not in script and "# The end." in script
    notebook = nbformat.reads(pagerun.to_notebook(_PAGE, "a.md"), as_version=4)
    nbformat.validate(notebook)
    code = ["".join(c.source) for c in notebook.cells if c.cell_type == "code"]
    assert code == ["x = 2", "print('x is', x)", "%%bash\nattnlab train demo",
                    "print('indented')", "print('<img>')"]


def _tutorials() -> list[str]:
    return [rel for rel in pages() if pagerun.shows_outputs(rel)]


@pytest.mark.parametrize("rel", _tutorials())
def test_every_tutorial_is_a_valid_script_and_notebook(rel: str) -> None:
    import ast

    import nbformat

    text = (DOCS / rel).read_text(encoding="utf-8")
    script = pagerun.to_script(text, rel)
    ast.parse(script)
    notebook = nbformat.reads(pagerun.to_notebook(text, rel), as_version=4)
    nbformat.validate(notebook)
    run = [b for b in parse_blocks(text, rel) if b.lang in ("python", "bash") and b.skip is None]
    code = [c.source for c in notebook.cells if c.cell_type == "code"]
    assert code == [b.code.rstrip("\n") if b.lang == "python" else
                    f"%%bash\n{b.code.rstrip()}" for b in run]


def test_the_first_tutorial_as_a_script_prints_what_its_page_shows(tmp_path: Path) -> None:
    """The downloaded script is the page: run on its own, it prints the outputs the page
    shows (tutorial 1: NumPy and attnlab, no data)."""
    rel = "tutorials/01-attention.md"
    page = pagerun.run_page(rel, tmp_path / "page")
    (tmp_path / "alone").mkdir()
    path = tmp_path / "alone" / "01-attention.py"
    path.write_text(pagerun.to_script((DOCS / rel).read_text(encoding="utf-8"), rel),
                    encoding="utf-8")
    env = {**os.environ, **environment(tmp_path / "page" / "data")}
    done = subprocess.run([sys.executable, path.name], cwd=path.parent, env=env, text=True,
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "".join(out for _, out in page.outputs)


@pytest.mark.slow
def test_the_built_tutorials_show_their_outputs_and_downloads(site: Site) -> None:
    """Under every tutorial block that printed, its output (kept from this test session's
    ``test_page`` run or made by the build: the same runner); beside each page its script and
    notebook, linked from the page."""
    import html

    path = site.checked() / "tutorials"
    for rel in _tutorials():
        page = (path / (Path(rel).stem + ".html")).read_text(encoding="utf-8")
        outputs = pagerun.stored_outputs(rel)
        assert outputs is not None, f"{rel}: the build kept no outputs"
        blocks = {b.line: b for b in parse_blocks((DOCS / rel).read_text(encoding="utf-8"))}
        shown = [out for line, out in outputs.items()
                 if pagerun.shown_output(blocks[line], out) is not None]
        assert shown or rel.endswith("05-families.md"), f"{rel}: no block printed anything"
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())
        for out in shown:
            first = " ".join(out.strip("\n").split("\n")[0].split())
            assert first in text, f"{rel}: {first!r} is not on the page"
        assert page.count('<span class="filename">Output') == len(shown), rel
        stem = Path(rel).stem
        assert f'href="{stem}.py"' in page and f'href="{stem}.ipynb"' in page
        assert (path / f"{stem}.py").read_text(encoding="utf-8") == pagerun.to_script(
            (DOCS / rel).read_text(encoding="utf-8"), rel)
        json.loads((path / f"{stem}.ipynb").read_text(encoding="utf-8"))


def test_a_warm_attnlab_prints_and_exits_as_a_fresh_one(tmp_path: Path) -> None:
    """docs/warm.py: the pages' `attnlab` commands (and the distributed tests') run in a child
    forked from one server that imported torch once. Each prints, exits and trains as a fresh
    process does; a signal to the command's script reaches the command."""
    import signal
    import time

    from warm import warm_attnlab

    data = fill_data_cache(tmp_path / "data")
    env = environment(data)
    tiny = ["train", "--set", "model.d_model=16", "--set", "model.n_heads=2", "--set",
            "model.n_layers=1", "--set", "train.max_steps=3", "--set", "train.eval_every=3",
            "--set", "train.eval_batches=1", "--set", "train.final_eval_batches=1",
            "--set", "train.progress=false", "--set", "train.tensorboard=false",
            "--set", "train.precision=fp32"]
    commands = {"list": ["recipes"], "bad": ["train", "--set", "model.d_model=0"],
                "unknown": ["nonsense"]}
    with warm_attnlab(env) as warm:
        assert warm, "the warm server did not start"
        client = warm["PATH"].split(os.pathsep)[0] + "/attnlab"
        for name, argv in {**commands, "run": [*tiny, "--out", "RUN"]}.items():
            done = {}
            for kind, exe, extra in (("fresh", str(BIN / "attnlab"), {}),
                                     ("warm", client, warm)):
                (tmp_path / kind).mkdir(exist_ok=True)
                done[kind] = subprocess.run([exe, *argv], cwd=tmp_path / kind,
                                            env={**os.environ, **env, **extra},
                                            capture_output=True, text=True, timeout=300)
            assert done["warm"].returncode == done["fresh"].returncode, name
            # an eval line gives its wall time, "(0.1 s)": the one figure that may differ
            warm_out, fresh_out = (re.sub(r"\(\d+\.\d s\b", "(T s", done[k].stdout)
                                   for k in ("warm", "fresh"))
            assert warm_out == fresh_out, name
            if name != "run":  # (a run's stderr holds its timings)
                assert done["warm"].stderr == done["fresh"].stderr, name
        assert done["fresh"].returncode == 0
        fresh, warm_run = (json.loads((tmp_path / k / "RUN" / "results.json").read_text())
                           for k in ("fresh", "warm"))
        assert fresh["metrics"] == warm_run["metrics"]
        # SIGTERM to the script: the command stops as it does on SIGTERM (saved, resumable)
        proc = subprocess.Popen([client, *tiny, "--set", "train.max_steps=100000",
                                 "--set", "train.eval_every=0", "--out", "LONG"],
                                cwd=tmp_path / "warm", env={**os.environ, **env, **warm},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while not (tmp_path / "warm" / "LONG" / "metrics.csv").exists():
            time.sleep(0.1)
            assert proc.poll() is None, proc.stdout.read()
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode != 0 and "resume with" in out, out[-2000:]
