"""Suite-wide settings."""

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
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) every test file runs on one
    worker, so a module's fixtures are made once, except the docs pages other than the
    tutorials: each is a group of its own and they spread over the workers (test_docs.py
    would otherwise hold one worker for most of the run). The tutorials stay with their file,
    whose site build then shows the outputs their tests kept."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    for item in items:
        group = item.nodeid.split("::")[0]
        params = getattr(getattr(item, "callspec", None), "params", {})
        if group == "tests/test_docs.py" and item.originalname == "test_page" and \
                not str(params.get("rel", "")).startswith("tutorials/"):
            group = item.nodeid
        item.add_marker(pytest.mark.xdist_group(group))
