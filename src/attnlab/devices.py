"""Devices: the one check of a device name (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``),
for training, evaluation and inference alike."""

from __future__ import annotations

import os
from typing import Any

import torch

from .errors import ConfigError


def resolve_device(name: str, info: Any = None,
                   flag: str = "train.device") -> torch.device:
    """The one check of a device name (``flag`` names the setting in errors).

    ``auto`` = CUDA (this process's GPU under torchrun: ``info`` is its
    :class:`~attnlab.train.distributed.DistInfo`), else MPS, else CPU. A name that is no
    device, or a device this machine does not have, raises
    :class:`~attnlab.errors.ConfigError` naming the allowed ones."""
    asked = name
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    allowed = available_devices()
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{flag} {name!r} is not a device; allowed: "
                          f"{', '.join(allowed)}") from None
    if dev.type not in ("cpu", "cuda", "mps") or (dev.type == "cpu" and dev.index):
        raise ConfigError(f"{flag} {name!r} is not supported; allowed: {', '.join(allowed)}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{flag} {name!r} but CUDA is not available here; allowed: "
                              f"{', '.join(allowed)}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{flag} {name!r} but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s); allowed: "
                              f"{', '.join(allowed)}")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None)
                                  and torch.backends.mps.is_available()):
        raise ConfigError(f"{flag} {name!r} but MPS is not available here; allowed: "
                          f"{', '.join(allowed)}")
    if name == "cuda" and info is not None and info.enabled:
        if info.local_rank >= torch.cuda.device_count():  # torchrun: one GPU per process
            raise ConfigError(f"{flag} {asked!r}: torchrun started process {info.local_rank} of "
                              f"this machine, which has {torch.cuda.device_count()} CUDA "
                              f"device(s); allowed: --nproc_per_node <= "
                              f"{torch.cuda.device_count()}, or {flag}='cpu'")
        return torch.device(f"cuda:{info.local_rank}")
    return dev


def available_devices() -> list[str]:
    """The device names this machine accepts: auto, cpu, and cuda / cuda:N / mps if present."""
    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        names.append("mps")
    return names


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: taskset, cgroups), else the
    machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


__all__ = ["available_devices", "resolve_device", "usable_cores"]
