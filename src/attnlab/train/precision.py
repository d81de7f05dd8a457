"""Numeric precision of training: autocast, attention kernels, and ``precision = "auto"``.

``auto`` on CUDA is bf16 where the GPU supports it, else fp16 (with loss scaling). On a CPU it
is whichever of fp32 and bf16 autocast runs THIS model's training step faster on THIS machine:
a CPU flag says whether bf16 instructions exist, not by how much they pay (AMX bf16 units run
the shakespeare_char_cpu step several times faster; AVX512-BF16 alone, about 1.6x; and for
other shapes autocast's casts can cost more than the matrix products gain). The probe times a
few forward + backward passes in each precision, alternately, on a copy of the first batch
(the fastest pass of each counts), and caches the answer per CPU model, torch version, thread
count, model config and batch shape (``$ATTNLAB_CACHE_DIR`` or ``~/.cache/attnlab``, file
``precision.json``), so it runs once.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CANDIDATES = ("fp32", "bf16")


def autocast(precision: str, device: torch.device,
             backends: list | None = None) -> contextlib.AbstractContextManager:
    """The context every forward of training and evaluation runs in: autocast for a resolved
    precision (none for fp32) and, when given, the attention kernels of
    :func:`sdpa_backends`."""
    stack = contextlib.ExitStack()
    if precision != "fp32":
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        stack.enter_context(torch.autocast(device.type, dtype=dtype))
    if backends is not None:
        from torch.nn.attention import sdpa_kernel

        stack.enter_context(sdpa_kernel(backends))
    return stack


def sdpa_backends(name: str) -> list | None:
    """The attention kernels ``F.scaled_dot_product_attention`` may pick (None = torch's own
    choice). ``auto`` is torch's choice, except on a CPU under bf16 for sequences up to
    :data:`attnlab.nn.attention.SHORT_CPU_SEQ` positions, where every SDPA kernel is slow
    (:func:`attnlab.nn.attention.fused_attention`: two bf16 matrix products without a mask,
    fp32 flash with one; benchmarks/README.md). A named kernel is used as named."""
    from torch.nn.attention import SDPBackend

    if name == "auto":
        name = "default"
    table = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return None if name == "default" else [table[name]]


def bound_kernel_caches(capacity: int = 64) -> None:
    """Bound oneDNN's per-shape kernel caches before the first bf16 matrix product on a CPU.

    PyTorch runs CPU bf16 matrix products through oneDNN, which builds (and caches, up to 1024
    entries by default) one primitive per input shape. Batches of varying shape (translation
    batches under a token budget) make a new shape at almost every step, and each cached
    primitive holds megabytes: resident memory then grows by gigabytes over a run
    (benchmarks/memory_growth.py). The caches read these variables lazily, at their first use;
    a value the user set is kept.
    """
    for name in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))


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


# the CPU flags that decide how fast bf16 runs: one model name ("AMD EPYC" in a VM) covers
# generations with and without them, so the probe's answer is keyed on them too
BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f", "avx2")


def cpu_features() -> list[str]:
    """Which of :data:`BF16_FLAGS` this CPU has (``/proc/cpuinfo``; empty where unreadable)."""
    have = set((_cpuinfo("flags") or "").split())
    return [f for f in BF16_FLAGS if f in have]


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
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**_read_cache(path), key: entry}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)


def probe_key(model_config: dict[str, Any], batch_shapes: list[tuple[int, ...]],
              sdpa_backend: str = "auto", processes: int = 1) -> str:
    """What the measured answer depends on: machine (model name and bf16-relevant flags),
    torch, threads, model, (global) batch shape, the attention kernels and the number of
    processes sharing the batch."""
    extra = [processes] if processes != 1 else []  # (one process: the keys of earlier caches)
    text = json.dumps([cpu_model(), cpu_features(), torch.__version__,
                       torch.get_num_threads(), model_config, batch_shapes, sdpa_backend,
                       *extra], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def fastest(step: Callable[[str], None], key: str, rounds: int = 5,
            clock: Callable[[], float] = time.perf_counter,
            reduce: Callable[[list[float]], list[float]] = lambda t: t) -> str:
    """The precision of ``CANDIDATES`` whose ``step(precision)`` takes least time, cached
    under ``key``. One untimed warm-up call each, then ``rounds`` timed calls each,
    alternating (so a change in machine load falls on both); each candidate's time is its
    fastest call, since on a shared machine the slow calls measure the other jobs, not the
    candidate (a sum let one descheduled call pick the slower precision); ``reduce`` combines
    those over processes (distributed training must agree: every process measures unless
    every one has a cached answer, and then they take the same one, the most common)."""
    path = cache_file()
    hit = _read_cache(path).get(key)
    hit = hit.get("precision") if isinstance(hit, dict) else None
    votes = reduce([float(hit == p) for p in CANDIDATES] + [float(hit not in CANDIDATES)])
    if votes[-1] == 0:  # no process misses
        return CANDIDATES[max(range(len(CANDIDATES)), key=lambda i: (votes[i], -i))]
    for p in CANDIDATES:
        step(p)
    best_s = [math.inf] * len(CANDIDATES)
    for r in range(rounds):
        order = range(len(CANDIDATES)) if r % 2 == 0 else reversed(range(len(CANDIDATES)))
        for i in order:
            t0 = clock()
            step(CANDIDATES[i])
            best_s[i] = min(best_s[i], clock() - t0)
    best_s = reduce(best_s)
    best = CANDIDATES[min(range(len(CANDIDATES)), key=best_s.__getitem__)]
    ms = {p: round(1000 * t, 2) for p, t in zip(CANDIDATES, best_s)}
    log.info("precision auto: %s (fastest of %d forward+backward passes, ms: %s; cached in %s)",
             best, rounds, ", ".join(f"{p} {v}" for p, v in ms.items()), path)
    _write_cache(path, key, {"precision": best, "ms": ms, "cpu": cpu_model(),
                             "torch": torch.__version__})
    return best


def resolve_precision(name: str, device: torch.device,
                      measure: Callable[[], str] | None = None,
                      recorded: str | None = None) -> str:
    """The precision to train in: ``name`` checked, or for ``auto`` bf16/fp16 on CUDA and on a
    CPU the result of ``measure()`` (a :func:`fastest` probe; without one, fp32).
    ``recorded``: what an ``auto`` run already trained in (a checkpoint's), kept where this
    device can train in it (fp16 needs CUDA's loss scaling: elsewhere it is measured again)."""
    if device.type == "cpu":
        bound_kernel_caches()  # before any bf16 matrix product of this process
    if name == "auto" and recorded in ("fp32", "bf16", *(("fp16",) * (device.type == "cuda"))):
        return recorded
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if device.type == "cpu" and measure is not None:
            return measure()
        return "fp32"
    if name == "fp16" and device.type != "cuda":
        raise ValueError(f"train.precision='fp16' needs CUDA (loss scaling), not "
                         f"{device.type}; allowed here: 'bf16', 'fp32' or 'auto'")
    return name
