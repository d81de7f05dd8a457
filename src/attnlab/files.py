"""Files written so that a kill at any moment leaves the old version or the new one, never
half of one: the one home of atomic writes (run dirs, prepared token dirs, plots)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
        set_umask_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def set_umask_mode(path: str | Path) -> None:
    """The mode a plainly created file gets (0666 less the umask): mkstemp makes files 0600,
    which left a run unreadable to the other users who were meant to use it."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def set_umask_modes(folder: str | Path) -> None:
    """:func:`set_umask_mode` for every file under ``folder``, and the mode a plainly made
    folder gets (0777 less the umask) for it and the folders in it: a folder written into a
    ``tempfile.mkdtemp`` (0700) and renamed into place, or files written by a library through
    mkstemp (0600), are then as readable as a run dir."""
    mask = os.umask(0)
    os.umask(mask)
    folder = Path(folder)
    for path in (folder, *folder.rglob("*")):
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def fsync_file(path: str | Path) -> None:
    """Flush a file just written by a library (safetensors) to the disk, as our own writes do:
    a checkpoint's manifest must not land before its tensors."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def fsync_dir(path: Path) -> None:
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
