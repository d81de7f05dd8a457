"""Run directories: what training writes and what sample / translate / eval / viz read.

Layout of a run dir::

    config.json          the resolved run config: {"model": {...}, "data": {...}, "train": {...}}
    tokenizer.json       the tokenizer (attnlab.tokenizers), when the run has one
    metrics.csv, tb/, loss.png   training logs (train/monitor.py)
    best/model.safetensors, last/model.safetensors (+ training state beside it, see train/)

Weights are safetensors (loading never unpickles); the model is rebuilt from the config.
Every write is atomic: a temporary file in the same folder, then ``os.replace``. Checkpoint
folders are written whole into ``.NAME.tmp/`` (``manifest.json`` last), then swapped in with
two renames (``NAME`` -> ``.NAME.old``, ``.NAME.tmp`` -> ``NAME``); a kill at any moment leaves
a complete copy that :func:`checkpoint_dir` finds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .config import ModelConfig
from .models import build_model

MODEL_FILE = "model.safetensors"
MANIFEST = "manifest.json"


class RunError(ValueError):
    """A run dir or checkpoint that cannot be used."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a kill at any moment leaves the old file or the new
    one, never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_weights(model: nn.Module, path: Path) -> None:
    """Model weights as safetensors (tied weights stored once; no ``_orig_mod.`` prefixes)."""
    from safetensors.torch import save_model

    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    model = getattr(model, "module", model)  # DistributedDataParallel wrapper
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_model(model, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_weights(model: nn.Module, path: Path) -> None:
    """Load safetensors weights into ``model``; a mismatch names the differing tensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    if not path.is_file():
        raise RunError(f"no checkpoint at {path}")
    try:
        missing, unexpected = load_model(model, path, strict=False)
    except (SafetensorError, OSError) as e:
        raise RunError(f"checkpoint {path} is not a readable safetensors file: {e}") from e
    except RuntimeError as e:  # shape mismatch
        first = str(e).strip().splitlines()[-1].strip()
        raise RunError(
            f"checkpoint {path} does not fit this model (was it trained with a different "
            f"config?): {first}"
        ) from e
    if missing or unexpected:
        raise RunError(
            f"checkpoint {path} does not fit this model (different config?): "
            f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )


def read_run_config(run_dir: Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run dir {run_dir} does not exist (give the --out folder of a training)")
    path = run_dir / "config.json"
    if not path.is_file():
        raise RunError(f"{run_dir} is not an attnlab run dir: it has no config.json")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{path} is not valid JSON: {e}") from e
    if "model" not in cfg:
        raise RunError(f"{path} has no 'model' section")
    return cfg


@dataclass
class Run:
    """A trained model loaded from a run dir, ready for inference (eval mode)."""

    model: nn.Module
    config: dict[str, Any]
    tokenizer: Any
    run_dir: Path
    checkpoint: Path


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not possible on every platform; the renames are atomic anyway
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_complete(folder: Path) -> bool:
    """True if ``folder`` holds a manifest whose files all exist with the recorded sizes."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        return all((folder / n).is_file() and (folder / n).stat().st_size == size
                   for n, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _siblings(dest: Path) -> tuple[Path, Path]:
    return dest.parent / f".{dest.name}.tmp", dest.parent / f".{dest.name}.old"


def checkpoint_dir(dest: Path) -> Path | None:
    """The usable copy of checkpoint folder ``dest``: ``dest`` itself, or after a kill between
    the two renames of :func:`write_dir_atomic`, its complete temporary or previous copy."""
    if (dest / MODEL_FILE).is_file():
        return dest
    for candidate in _siblings(dest):
        if is_complete(candidate):
            return candidate
    return None


def write_dir_atomic(dest: Path, write: Callable[[Path], None], meta: dict | None = None) -> None:
    """Create folder ``dest`` so that readers see the old folder or the new one, never a mix.

    ``write(tmp)`` fills a temporary sibling folder; then ``manifest.json`` (file sizes and
    ``meta``) is written last and the folder is swapped in with two renames.
    """
    tmp, old = _siblings(dest)
    found = checkpoint_dir(dest)
    if found is not None and found != dest:  # a kill between the renames: put it back first
        os.replace(found, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    atomic_write_json(tmp / MANIFEST, {"files": files, **(meta or {})})
    _fsync_dir(tmp)
    if dest.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(tmp, dest)
    _fsync_dir(dest.parent)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(run_dir: Path, which: str = "best") -> Path:
    """``best`` falls back to ``last``; an explicit path to a .safetensors file is taken as is."""
    run_dir = Path(run_dir)
    order = {"best": ["best", "last"], "last": ["last", "best"]}.get(which)
    if order is None:
        path = Path(which)
        if path.is_file():
            return path
        raise RunError(f"checkpoint {which!r} is not 'best', 'last' or a .safetensors file")
    for name in order:
        folder = checkpoint_dir(run_dir / name)
        if folder is not None:
            return folder / MODEL_FILE
    raise RunError(f"run dir {run_dir} has no checkpoint yet (no best/ or last/{MODEL_FILE}): "
                   f"train first, or wait for the first checkpoint")


def load_run(run_dir: str | Path, which: str = "best", device: str = "cpu") -> Run:
    """Rebuild the model of a run from its config.json and load its weights, for inference:
    eval mode and, on CPU, models that decode token by token get
    :func:`~attnlab.generate.inference_layout` (column-major weights, same values)."""
    from .generate import inference_layout
    from .tokenizers import load_tokenizer

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    model_cfg = ModelConfig.from_dict(cfg["model"])
    model = build_model(model_cfg)
    ckpt = find_checkpoint(run_dir, which)
    load_weights(model, ckpt)
    model = model.to(device).eval()
    if model_cfg.family != "encoder" and next(model.parameters()).device.type == "cpu":
        inference_layout(model)
    tok_path = run_dir / "tokenizer.json"
    tokenizer = load_tokenizer(tok_path) if tok_path.is_file() else None
    return Run(model, cfg, tokenizer, run_dir, ckpt)
