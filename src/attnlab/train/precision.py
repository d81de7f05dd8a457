"""Numeric precision of training: autocast, attention kernels, and ``precision = "auto"``.

``auto`` on CUDA is bf16 where the GPU supports it, else fp16 (with loss scaling). On a CPU it
is whichever of fp32 and bf16 autocast runs this model's training step faster on this
machine: a CPU flag says whether bf16 instructions exist, not how much they pay for these
shapes. The probe (:func:`attnlab.speed.fastest`) times a few forward + backward passes in
each precision on a copy of the first batch and caches the answer per machine, model config
and batch shape, so it runs once.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from ..speed import probe

CANDIDATES = ("fp32", "bf16")
# bf16 must beat fp32 by this fraction (and in most rounds) to be chosen
MARGIN = 0.1
# a step this many times slower than the measured forward + backward (optimizer step and
# logging included) means the cached choice no longer fits this machine
STALE = 3.0
# a step this many times FASTER than the measured forward + backward of its precision means
# the machine was busy when it was measured: every time was inflated, and the close "fp32
# stays" call it made may be wrong (fp32 stuck in the cache, its steps 1.3x slower, was seen)
BUSY = 1.5


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


@dataclass(frozen=True)
class Amp:
    """The context of every forward of a model in training and in evaluation, one home for
    both: ``amp()`` enters :func:`autocast` in ``precision`` (resolved: fp32, bf16 or fp16)
    with the attention kernels of ``sdpa_backend`` (``train.sdpa_backend``). A task's
    ``evaluate`` takes it as its ``amp``."""

    precision: str
    device: torch.device
    sdpa_backend: str = "auto"

    def __call__(self) -> contextlib.AbstractContextManager:
        return autocast(self.precision, self.device, sdpa_backends(self.sdpa_backend))


def sdpa_backends(name: str) -> list | None:
    """The attention kernels ``F.scaled_dot_product_attention`` may pick (None = torch's own
    choice). ``auto`` is torch's choice, except on a CPU under bf16 for sequences up to
    :data:`attnlab.speed.attention.SHORT_CPU_SEQ` positions, where every SDPA kernel is slow
    (:func:`attnlab.speed.cpu_sdpa` takes over there). A named kernel is used as named."""
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


def probe_key(model_config: dict[str, Any], batch_shapes: list[tuple[int, ...]],
              sdpa_backend: str = "auto", processes: int = 1) -> str:
    """What the measured answer depends on: machine (model name and bf16-relevant flags),
    torch, threads, model, (global) batch shape, the attention kernels and the number of
    processes sharing the batch."""
    extra = [processes] if processes != 1 else []  # (one process: the keys of earlier caches)
    return probe.machine_key(model_config, batch_shapes, sdpa_backend, *extra)


def fastest(step: Callable[[str], None], key: str, rounds: int = 5,
            clock: Callable[[], float] = time.perf_counter,
            reduce: Callable[[list[float]], list[float]] = lambda t: t) -> str:
    """The precision of ``CANDIDATES`` whose ``step(precision)`` (a forward + backward pass)
    takes least time, cached under ``key`` (:func:`attnlab.speed.fastest`: how it is timed,
    and how ``reduce`` makes distributed processes agree). fp32 stays unless bf16 is faster
    by :data:`MARGIN` and in most rounds (a busy machine measures noise, and a wrong bf16
    choice can cost far more than it could gain)."""
    return probe.fastest(step, key, CANDIDATES, field="precision", what="precision auto",
                         rounds=rounds, margin=MARGIN, clock=clock, reduce=reduce)


def stale(key: str, precision: str, step_s: float, micro_batches: int) -> float | None:
    """How many times slower than measured an ``auto`` choice trains: a training step of
    ``step_s`` seconds (``micro_batches`` forward + backward passes) against the cached
    forward + backward time of ``precision`` under ``key``; None if nothing is cached."""
    entry = probe.cached(key)
    ms = (entry or {}).get("ms", {}).get(precision)
    if not ms:
        return None
    return step_s / (micro_batches * ms / 1000)


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
        raise ConfigError(f"train.precision='fp16' needs CUDA (loss scaling), not "
                         f"{device.type}; allowed here: 'bf16', 'fp32' or 'auto'")
    return name
