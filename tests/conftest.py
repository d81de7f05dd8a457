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
    """precision = "auto" caches what it measured; tests keep that cache out of the home dir
    (subprocesses inherit the variable)."""
    import os

    before = os.environ.get("ATTNLAB_CACHE_DIR")
    os.environ["ATTNLAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("attnlab-cache"))
    yield
    if before is None:
        os.environ.pop("ATTNLAB_CACHE_DIR", None)
    else:
        os.environ["ATTNLAB_CACHE_DIR"] = before
