"""Choices measured on the machine that runs them, once, and cached.

A CPU flag says whether an instruction set exists, not how much it pays, so which of a few
ways to run something is fastest is measured where it runs (:func:`fastest`) and the answer
kept under a key naming the machine and what was measured (:func:`machine_key`), in
``$ATTNLAB_CACHE_DIR`` or ``~/.cache/attnlab`` (file ``precision.json``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write_json

log = logging.getLogger(__name__)


def _cpuinfo(field: str) -> str | None:
    """The value of ``field`` on the first line of ``/proc/cpuinfo`` that has it, or None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


# the CPU flags that decide how fast bf16 runs: one model name (as a VM reports it) covers
# generations with and without them, so a measured answer is keyed on them too
BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f", "avx2")


def cpu_features() -> list[str]:
    """Which of :data:`BF16_FLAGS` this CPU has (``/proc/cpuinfo``; empty where unreadable)."""
    have = set((_cpuinfo("flags") or "").split())
    return [f for f in BF16_FLAGS if f in have]


def machine_key(*parts: Any) -> str:
    """A key for an answer measured here about ``parts`` (JSON values): the machine (CPU model
    and :func:`cpu_features`), torch's version and thread count, then ``parts``."""
    text = json.dumps([cpu_model(), cpu_features(), torch.__version__, torch.get_num_threads(),
                       *parts], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cache_file() -> Path:
    root = os.environ.get("ATTNLAB_CACHE_DIR") or Path.home() / ".cache" / "attnlab"
    return Path(root) / "precision.json"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # no cache yet, or a damaged one: measure again


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a read-only home only costs a probe next time
        atomic_write_json(path, {**_read_cache(path), key: entry}, indent=1)


def cached(key: str) -> dict[str, Any] | None:
    """The cached entry of ``key`` (the answer's field, ``ms`` of each candidate, ...), or
    None."""
    entry = _read_cache(cache_file()).get(key)
    return entry if isinstance(entry, dict) else None


def forget(key: str) -> None:
    """Drop the cached answer of ``key``: the next :func:`fastest` measures again."""
    path = cache_file()
    entries = _read_cache(path)
    if entries.pop(key, None) is not None:
        with contextlib.suppress(OSError):
            atomic_write_json(path, entries, indent=1)


# a candidate that takes this many times the default's time in each of the first two rounds
# cannot win most rounds: :func:`fastest` (with a margin) times it no more
SLOWER = 3.0


def fastest(step: Callable[[str], None], key: str, candidates: Sequence[str], *,
            field: str, what: str, rounds: int = 5, margin: float = 0.0,
            clock: Callable[[], float] = time.perf_counter,
            reduce: Callable[[list[float]], list[float]] = lambda t: t) -> str:
    """The one of ``candidates`` whose ``step(candidate)`` takes least time, cached under
    ``key`` (the entry's ``field``; ``what`` names it in the log line).

    One untimed warm-up call each, then ``rounds`` timed calls each, alternating, so a change
    in machine load falls on all. A candidate's time is its fastest call: on a shared machine
    the slow calls measure the other jobs. ``reduce`` combines times over processes, which
    must agree: all measure unless every one has a cached answer, then take the most common.
    With a ``margin`` (0.1: 10%), the first candidate (the default) stays unless another is
    faster by more than the margin AND faster by it in most rounds: a choice measured while
    the machine was busy does not stick on a close call. There a candidate :data:`SLOWER`
    times slower than the default in each of the first two rounds is timed no more (bf16
    without bf16 units: 22x slower, 5 s a step, was seen).
    """
    path = cache_file()
    hit = _read_cache(path).get(key)
    hit = hit.get(field) if isinstance(hit, dict) else None
    votes = reduce([float(hit == c) for c in candidates] + [float(hit not in candidates)])
    if votes[-1] == 0:  # no process misses
        return candidates[max(range(len(candidates)), key=lambda i: (votes[i], -i))]
    for c in candidates:
        step(c)
    n = len(candidates)
    best_s = [math.inf] * n
    wins = [0.0] * n  # rounds each beat the default by the margin
    slow = [0] * n  # rounds in which each took SLOWER times the default's time, or more
    timed = [True] * n
    for r in range(rounds):
        order = range(n) if r % 2 == 0 else reversed(range(n))
        took = [0.0] * n
        for i in order:
            if not timed[i]:
                continue
            t0 = clock()
            step(candidates[i])
            took[i] = clock() - t0
            best_s[i] = min(best_s[i], took[i])
        wins = [w + (on and t < (1 - margin) * took[0]) for w, t, on in zip(wins, took, timed)]
        if margin > 0:  # over every process's times: all of them drop the same candidates
            both = reduce(took)
            slow = [k + (i > 0 and both[i] >= SLOWER * both[0]) for i, k in enumerate(slow)]
            timed = [on and not (r >= 1 and k == r + 1) for on, k in zip(timed, slow)]
    summed = reduce(best_s + wins + [1.0])  # over processes: times, wins, processes
    best_s, wins, procs = summed[:n], summed[n:2 * n], summed[-1]
    i = min(range(n), key=best_s.__getitem__)
    if i and margin > 0 and not (best_s[i] < (1 - margin) * best_s[0]
                                 and wins[i] > rounds * procs / 2):
        i = 0  # not a clear win: the default stays
    best = candidates[i]
    ms = {c: round(1000 * t, 2) for c, t in zip(candidates, best_s)}
    # a note for -v (debug): the first run of a command on a machine is no time to print it
    log.debug("%s: %s (fastest of %d rounds, ms: %s; cached in %s)", what, best, rounds,
             ", ".join(f"{c} {v}" for c, v in ms.items()), path)
    _write_cache(path, key, {field: best, "ms": ms, "cpu": cpu_model(),
                             "torch": torch.__version__})
    return best
