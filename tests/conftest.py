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
