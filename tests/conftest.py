"""Suite-wide settings."""

import sys

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny test models gain nothing from intra-op threads, and two OpenMP threads on a busy
    2-core machine can make them hundreds of times slower; results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _torch_backward_as_torch_made_it():
    """nnsight (a test dependency) replaces ``torch.Tensor.backward`` when it is imported, for
    its ``with t.backward():`` traces, and its replacement parses the source file of every
    caller of ``backward`` (a Markdown page that the docs tests run is not Python: a
    SyntaxError). After each test, torch's own is put back, whichever test imported nnsight."""
    yield
    patched = sys.modules.get("nnsight.intervention.backward")
    original = getattr(patched, "_original_backward", None)
    if original is not None and torch.Tensor.backward is not original:
        torch.Tensor.backward = original


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """precision = "auto" caches what it measured, and text is prepared into the data cache;
    tests keep both caches out of the home dir (subprocesses inherit the variables)."""
    import os

    before = {k: os.environ.get(k) for k in ("ATTNLAB_CACHE_DIR", "ATTNLAB_DATA")}
    os.environ["ATTNLAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("attnlab-cache"))
    # the data cache too: text files are prepared into it once (attnlab.data.prepare)
    os.environ["ATTNLAB_DATA"] = str(tmp_path_factory.mktemp("attnlab-data"))
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def pytest_collection_modifyitems(config, items):
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) a test goes to any free
    worker, except where a file shares a module- or class-scoped fixture between its tests:
    those tests run on one worker, so the fixture is made once. The tutorials and the tests
    of the built site stay together too (in that order), so the site build shows the outputs
    the tutorials' tests kept."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    for item in items:
        file = item.nodeid.split("::")[0]
        info = getattr(item, "_fixtureinfo", None)
        shared = info is not None and any(
            d.scope in ("module", "class", "package")
            for defs in info.name2fixturedefs.values() for d in defs)
        params = getattr(getattr(item, "callspec", None), "params", {})
        site = file == "tests/test_docs.py" and (
            "site" in item.fixturenames or (item.originalname == "test_page" and
                                            str(params.get("rel", "")).startswith("tutorials/")))
        item.add_marker(pytest.mark.xdist_group(file if shared or site else item.nodeid))
