"""The site build's hooks (mkdocs.yml ``hooks:``): the tutorials' outputs and downloads.

Each tutorial page shows, under every block that prints, what it printed: the page is run by
docs/pagerun.py's :func:`run_page` (the function the tests run pages with), unless the tests
already ran the page as it is now and kept its outputs (docs/pagerun.py says when). Each
tutorial is also offered as a ``.py`` script and a ``.ipynb`` notebook, written next to its
HTML page.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pagerun  # noqa: E402 - docs/ is not a package: found through the line above


def _downloads(rel: str) -> tuple[str, str]:
    stem = Path(rel).stem
    return f"{stem}.py", f"{stem}.ipynb"


def on_files(files, config):
    """A ``.py`` script and an ``.ipynb`` notebook of each tutorial, beside its page."""
    for rel in pagerun.pages():
        if pagerun.shows_outputs(rel):
            text = (pagerun.DOCS / rel).read_text(encoding="utf-8")
            folder = Path(rel).parent.as_posix()
            script, notebook = _downloads(rel)
            files.append(File.generated(config, f"{folder}/{script}",
                                        content=pagerun.to_script(text, rel)))
            files.append(File.generated(config, f"{folder}/{notebook}",
                                        content=pagerun.to_notebook(text, rel)))
    return files


def on_page_markdown(markdown, page, config, files):
    """A tutorial's outputs under its blocks, and its download links under its title."""
    rel = page.file.src_uri
    if not pagerun.shows_outputs(rel):
        return markdown
    outputs = pagerun.stored_outputs(rel)
    if outputs is None:
        with tempfile.TemporaryDirectory(prefix="attnlab-docs-") as tmp:
            run = pagerun.run_page(rel, Path(tmp))
        pagerun.store_outputs(run)
        outputs = {block.line: out for block, out in run.outputs}
    markdown = pagerun.with_outputs(markdown, outputs, rel)
    script, notebook = _downloads(rel)
    links = (f"*This page as a [Python script]({script}) or a [notebook]({notebook}); run it "
             "in an empty folder. The outputs below were made when the site was built.*")
    title, sep, rest = markdown.partition("\n")
    return f"{title}\n\n{links}\n{sep}{rest}" if title.startswith("# ") else \
        f"{links}\n\n{markdown}"
