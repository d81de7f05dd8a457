"""Files written so that a kill at any moment leaves the old version or the new one, never
half of one: the one home of atomic writes (run dirs, checkpoint folders, imported and
exported model folders, prepared token dirs, plots)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Create or replace file ``path`` so that a kill at any moment leaves the old file or the
    new one, never a half-written file, and a failed ``write`` leaves nothing new behind.

    ``write(tmp)`` fills a temporary file beside ``path`` (in the same folder, so the rename
    is atomic; a library's writer may replace it); the file is then flushed to the disk,
    given the mode the umask gives (as :func:`set_umask_mode`) and renamed to ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        fsync_file(tmp)
        set_umask_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """:func:`atomic_write` of ``data``."""
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


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


def atomic_write_json(path: Path, obj: Any, indent: int = 2) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as indented JSON with sorted keys."""
    atomic_write_bytes(path, (json.dumps(obj, indent=indent, sort_keys=True) + "\n").encode())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (the renames into it) to the disk, where the platform can."""
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


# ---- folders ------------------------------------------------------------------------------------
def _siblings(dest: Path) -> tuple[Path, Path]:
    """Where a write fills the new copy of ``dest``, and where the old one waits in the swap."""
    return dest.parent / f".{dest.name}.tmp", dest.parent / f".{dest.name}.old"


def missing_files(folder: Path, manifest: str) -> list[str]:
    """The files that ``folder``'s ``manifest`` lists but the folder lacks (or holds with
    another size), in the manifest's order; ``[manifest]`` when it is missing or unreadable."""
    try:
        files = json.loads((folder / manifest).read_text())["files"]
        return [n for n, size in files.items()
                if not ((folder / n).is_file() and (folder / n).stat().st_size == size)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [manifest]


def _is_complete(folder: Path, manifest: str) -> bool:
    """True if ``folder`` holds ``manifest`` and every file it lists, with the listed size."""
    return not missing_files(folder, manifest)


def interrupted_copy(dest: Path, manifest: str) -> Path | None:
    """The complete copy of ``dest`` (the new one or the old one) that a kill between the two
    renames of :func:`write_dir_atomic` left beside it, or None."""
    for candidate in _siblings(Path(dest)):
        if _is_complete(candidate, manifest):
            return candidate
    return None


def write_dir_atomic(dest: Path, write: Callable[[Path], None], *, manifest: str | None = None,
                     meta: dict[str, Any] | None = None, main: bool = True,
                     sync: Callable[[], None] | None = None) -> None:
    """Create or replace folder ``dest`` so that readers see the old folder or the new one,
    never a mix, and a failed ``write`` leaves nothing new behind.

    ``write(tmp)`` fills the sibling ``.NAME.tmp``; its files and folders then get the modes
    the umask gives (as :func:`set_umask_modes`), the manifest is written last, and the
    folder is swapped in with two renames (``NAME`` -> ``.NAME.old``, ``.NAME.tmp`` ->
    ``NAME``).

    Args:
        dest: the folder to write.
        write: fills the folder it is given.
        manifest: the file name of a manifest (``{"files": {name: size}, **meta}``, JSON):
            with one, a kill between the two renames leaves a complete copy that
            :func:`interrupted_copy` finds and the next write puts back first.
        meta: more entries of the manifest.
        main: for a folder that several processes fill (a sharded checkpoint), each calling
            this with the same ``dest``: whether this is the process that makes the temporary
            folder (before ``sync``) and, after ``write``, does the rest. ``write`` must
            return on every process only once all have written (as
            ``torch.distributed.checkpoint.save`` does).
        sync: waits for all of those processes (a barrier).
    """
    dest = Path(dest)
    tmp, old = _siblings(dest)
    if main:
        found = interrupted_copy(dest, manifest) if manifest and not dest.exists() else None
        if found is not None:  # a kill between the renames: put the complete copy back first
            os.replace(found, dest)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if sync is not None:
        sync()
    try:
        write(tmp)
    except BaseException:  # (a full disk: give its space back; the old folder stays)
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not main:
        return
    set_umask_modes(tmp)
    if manifest:
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        atomic_write_json(tmp / manifest, {"files": files, **(meta or {})})
    fsync_dir(tmp)
    if dest.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
    shutil.rmtree(old, ignore_errors=True)


def write_files_atomic(dest: Path, write: Callable[[Path], None]) -> None:
    """Create file ``dest`` and the files its writer puts beside it (an ONNX graph's weights
    in ``NAME.data``) so that a reader who finds ``dest`` finds the others complete, and a
    failed ``write`` leaves nothing new behind.

    ``write(path)`` writes ``path``, named as ``dest``, in a temporary folder beside
    ``dest``; each file it made there is flushed to the disk, gets the mode the umask gives
    and is renamed into ``dest``'s folder, ``dest`` last.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    try:
        write(tmp / dest.name)
        set_umask_modes(tmp)
        made = sorted((f for f in tmp.iterdir() if f.is_file()), key=lambda f: f.name == dest.name)
        for file in made:
            fsync_file(file)
        for file in made:
            os.replace(file, dest.parent / file.name)
        fsync_dir(dest.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and write (and remove) a file in it.

    Raises:
        OSError: the folder cannot be made or written to.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test.")
    os.close(fd)
    os.unlink(probe)
