"""Download (or copy from a local directory) the public data sets, verified by checksum.

:func:`fetch` fills ``<cache_dir>/<name>/`` with the files of a :class:`DatasetInfo`. Each file
is written under a temporary name, verified, then renamed, so a failed fetch never leaves a
partial file, and a file already present and valid is not fetched again. Without network,
``attnlab data fetch NAME --from DIR`` copies the files from a local folder instead.

The data sets themselves (their URLs and checksums) are declared by the tasks that train them
(:mod:`attnlab.tasks`: ``attnlab data list`` names them); this module is the machinery.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import os
import shutil
import urllib.error
import urllib.request
import uuid
import zipfile
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

from attnlab.data.errors import DataError, DataFileNotFoundError, DownloadError
from attnlab.data.labelled import read_labelled_tsv
from attnlab.files import atomic_write

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RemoteFile:
    """One file of a data set: where it comes from and how to check it."""

    name: str  # file name in the data set's cache directory
    url: str
    sha256: str | None  # of the final (decompressed) file; None when unknown
    archive: str = ""  # "" (plain file), "gzip" or "zip"
    member: str = ""  # path inside a zip archive
    tsv_rows: int | None = None  # without sha256: labelled-TSV rows expected


@dataclass(frozen=True)
class DatasetInfo:
    """A downloadable data set."""

    name: str
    description: str
    files: tuple[RemoteFile, ...]
    local_dir: str  # sub-directory name of the data set in a ``--from DIR`` tree
    local_hint: str  # config options that point training at local files instead


def default_cache_dir() -> Path:
    """``$ATTNLAB_DATA`` if set, else ``~/.cache/attnlab/data``."""
    env = os.environ.get("ATTNLAB_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "attnlab" / "data"


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_url(url: str, dest: Path, timeout: float) -> None:
    """Stream ``url`` into ``dest`` (network errors propagate as OSError/HTTPException)."""
    request = urllib.request.Request(url, headers={"User-Agent": "attnlab-data-fetch"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)


def _verify(path: Path, spec: RemoteFile, origin: str, info: DatasetInfo) -> None:
    """Raise :class:`DownloadError` unless ``path`` is the expected file."""
    if spec.sha256 is not None:
        got = sha256_of(path)
        if got != spec.sha256:
            raise DownloadError(
                f"checksum mismatch for {info.name} file {spec.name} from {origin}: expected "
                f"sha256 {spec.sha256}, got {got}. The file was not kept; the source may have "
                f"changed or the transfer was corrupted. Use a verified local copy instead: "
                f"{info.local_hint}")
        return
    try:
        rows = len(read_labelled_tsv(path))
    except DataError as e:
        raise DownloadError(f"{info.name} file {spec.name} from {origin} is not the expected "
                            f"labelled TSV: {e}") from e
    if rows != spec.tsv_rows:
        raise DownloadError(f"{info.name} file {spec.name} from {origin} has {rows} rows, "
                            f"expected {spec.tsv_rows}; the file was not kept")
    with open(path, "rb") as f:  # a copy cut inside its last row still has every row
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            raise DownloadError(f"{info.name} file {spec.name} from {origin} ends inside a "
                                "row (cut short?); the file was not kept")


def _unpack(packed: Path, spec: RemoteFile, dest: Path, info: DatasetInfo) -> None:
    """Write the final file ``dest`` from the downloaded ``packed`` file."""
    try:
        if spec.archive == "gzip":
            with gzip.open(packed, "rb") as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        elif spec.archive == "zip":
            with zipfile.ZipFile(packed) as archive, archive.open(spec.member) as src, \
                    open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        else:
            shutil.copyfile(packed, dest)
    except (OSError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise DownloadError(f"unpacking {info.name} file {spec.name} from {spec.url} failed "
                            f"({type(e).__name__}: {e}); expected a {spec.archive or 'plain'} "
                            f"file{' with ' + spec.member if spec.member else ''}") from e


def _local_source(source_dir: Path, spec: RemoteFile, info: DatasetInfo) -> Path:
    """The copy of ``spec`` inside ``source_dir`` (directly or in a data-set sub-directory)."""
    candidates = [source_dir / sub / spec.name for sub in dict.fromkeys(
        (info.local_dir, info.name, "."))]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise DataFileNotFoundError(f"no local copy of {info.name} file {spec.name}: looked for "
                                f"{', '.join(str(c) for c in candidates)}")


def _failure_hint(info: DatasetInfo) -> str:
    """How to proceed without the network."""
    names = " ".join(f.name for f in info.files)
    return (f"To use a local file instead, pass {info.local_hint}, or copy the files into the "
            f"cache with `attnlab data fetch {info.name} --from DIR` (DIR holding {names}, "
            f"directly or under {info.local_dir}/)")


def _fetch_file(spec: RemoteFile, info: DatasetInfo, final: Path, source_dir: Path | None,
                timeout: float) -> None:
    """Fetch one file to ``final``, verified before it is renamed into place; the download
    (an archive, before unpacking) is always removed."""
    packed = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}.download")

    def write(part: Path) -> None:
        if source_dir is not None:
            origin = str(_local_source(source_dir, spec, info))
            log.info("copying %s to %s", origin, final)
            shutil.copyfile(origin, part)
        else:
            origin = spec.url
            log.info("downloading %s to %s", spec.url, final)
            try:
                download_url(spec.url, packed, timeout)
            except (OSError, HTTPException) as e:
                raise DownloadError(f"downloading {info.name} file {spec.name} from {spec.url} "
                                    f"failed ({type(e).__name__}: {e}). "
                                    f"{_failure_hint(info)}") from e
            _unpack(packed, spec, part, info)
        _verify(part, spec, origin, info)

    try:
        atomic_write(final, write)
    finally:
        packed.unlink(missing_ok=True)


def fetch(info: DatasetInfo, cache_dir: str | Path | None = None,
          source_dir: str | Path | None = None, timeout: float = 60.0) -> Path:
    """Make data set ``info`` available and return its directory ``<cache_dir>/<name>``.

    Files already present and valid are kept. Missing or invalid ones are downloaded (or
    copied from ``source_dir``) and verified before being renamed into place.

    Args:
        info: the data set's files (a task's declaration: ``attnlab.tasks.download(name)``).
        cache_dir: default ``$ATTNLAB_DATA`` if set, else ``~/.cache/attnlab/data``.
        source_dir: a local folder holding the files, directly or in a sub-directory named
            after the data set (``tinyshakespeare/``, ``multi30k/``, ``sst2/``): copied, not
            downloaded.
        timeout: seconds a download may wait for the server.

    Raises:
        DownloadError: a network failure or a bad file, with a message saying how to use a
            local file instead (``DatasetInfo.local_hint``).
    """
    if cache_dir is not None and not str(cache_dir).strip():
        raise DataError("cache_dir is empty: give a folder, or None for the default "
                        f"({default_cache_dir()})")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root = root / info.name
    clash = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if clash is not None:
        raise DataError(f"cannot keep {info.name} in {root}: {clash} is a file, not a folder")
    if source_dir is not None and Path(source_dir).is_file():
        raise DataFileNotFoundError(f"source directory {source_dir} is a file, not a folder: "
                                    f"--from takes the folder holding the {info.name} files "
                                    f"(here {Path(source_dir).parent})")
    if source_dir is not None and not Path(source_dir).is_dir():
        raise DataFileNotFoundError(f"source directory {source_dir} does not exist")
    created = [p for p in (root, *root.parents) if not p.exists()]  # innermost first
    root.mkdir(parents=True, exist_ok=True)
    try:
        for spec in info.files:
            final = root / spec.name
            if final.is_file():
                try:
                    _verify(final, spec, str(final), info)
                    # -v only: every run of a fetched data set reads its files again
                    log.debug("%s is already present and valid", final)
                    continue
                except DownloadError as e:
                    log.warning("fetching %s again: %s", final, e)
            _fetch_file(spec, info, final,
                        None if source_dir is None else Path(source_dir), timeout)
    except BaseException:
        # a failed fetch leaves no empty folder behind (one that kept a verified file stays)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return root
