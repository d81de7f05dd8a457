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
