"""Freed memory kept for the next training step, where the C library would hand it back.

A CPU training step frees, at its end, the activations its backward used, and makes them
again in the next step. glibc's ``malloc`` maps a block above a threshold (128 KiB at start,
raised as such blocks are freed, to 32 MiB at most) straight from the operating system and
unmaps it when freed, and trims the top of its heap when more than twice that threshold lies
free there; the next step then takes the same memory back page by page, each page a fault
that the kernel fills with zeros. Whether a run pays this depends on what happened to be freed
before it: the same step of ``shakespeare_char_cpu`` took 5 page faults in one version of
attnlab and 200 to 1,100 in a later one, and the ``multi30k_de_en`` step 15,000 to 25,000
(its loss's 64 MB block of logits is always mapped). :func:`keep_freed_memory` makes every
block come from the heap and keeps up to :data:`TRIM_THRESHOLD` of free memory at its top, so
a step takes the memory the step before freed: no page faults. The resident memory stays at
the step's peak, which each step reaches again anyway (``multi30k_de_en``'s peak 2-4% higher).
An evaluation's batches do the same with their logits: ``attnlab eval`` sets it too.
Figures: docs/what-we-tried.md ("Freed memory kept between steps").
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (glibc's malloc.h)
TRIM_THRESHOLD = 2**30  # free memory at the heap's top that stays in the process
# the user's own settings of glibc's malloc (environment), which are left as they are
OWN_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_",
                "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's ``malloc`` take every block from its heap (none mapped on its own) and
    keep :data:`TRIM_THRESHOLD` of free memory at the heap's top, for this process, once;
    returns whether it did. Nothing changes where the C library is not glibc (macOS,
    Windows, musl) or the environment sets malloc's own settings (:data:`OWN_SETTINGS`)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(os.environ.get(name) for name in OWN_SETTINGS):
        return False
    mallopt = ctypes.CDLL(None).mallopt  # (glibc: 1 on success)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    log.debug("glibc malloc settings %s", "set" if done else "refused")
    return done
