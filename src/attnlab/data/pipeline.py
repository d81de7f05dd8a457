"""The one preparation pipeline that :mod:`attnlab.data.prepare` (documents -> token shards)
and :mod:`attnlab.data.pairs` (sentence pairs -> shards) both run.

A corpus is cut into :class:`Piece` s by a :class:`Pieces` cutter, in an order fixed by the
input alone, so the same call always makes the same pieces. :func:`start` makes the DIR ready
(or finds it finished); :func:`write_pieces` records the pieces a killed run finished and
tokenizes the rest on the workers of an :class:`Encoder`, each written as its shard;
:func:`finish` writes the manifest last, so a DIR without one is never taken for finished.
:func:`cached` makes a DIR of the data cache once, under a lock the ranks of a distributed run
share, and :func:`cache_key` is the one hash that every name in the data cache is built from.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from attnlab.config import check_int
from attnlab.data.errors import DataError
from attnlab.data.shards import MANIFEST, PLAN, TOKENIZER, read_manifest
from attnlab.data.sources import ERRORS
from attnlab.devices import usable_cores
from attnlab.errors import InputError
from attnlab.files import atomic_write_bytes, atomic_write_json
from attnlab.tokenizers import Tokenizer, load_tokenizer, tokenizer_from_dict

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
PIECE_BYTES = 1 << 22  # text per shard: small enough to keep every core busy, large enough
# that a GB corpus is a few hundred files
SAMPLE_BYTES = 100 << 20  # text a BPE vocabulary is trained on

Records = dict[str, list[dict[str, Any]]]  # a split's shard records, as the manifest lists them


class DiskFullError(DataError):
    """A shard could not be written for want of space (the finished ones are kept)."""


def cache_key(value: Any, chars: int = 64) -> str:
    """The first ``chars`` hex digits of the SHA-256 of ``value``: a string's UTF-8 bytes,
    anything else's JSON with its keys sorted. Every name in the data cache is made of these
    (and of files' content hashes, :func:`~attnlab.data.fetch.sha256_of`): the same files and
    settings always find the same DIR, and other ones never do."""
    data = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:chars]


# ---- pieces ----------------------------------------------------------------------------------
@dataclass
class Piece:
    """Consecutive units (documents, sentence pairs) of one split: the unit of work and of one
    shard, numbered in the order pieces fill."""

    index: int
    split: str
    texts: list[Any] = field(default_factory=list)  # what a worker is sent
    nbytes: int = 0

    @property
    def name(self) -> str:
        return f"{self.split}/{self.index:06d}"


P = TypeVar("P", bound=Piece)


class Pieces(Generic[P]):
    """Fills one open piece per split and hands each out once it holds ``piece_bytes``;
    a subclass reads the input (``__iter__``) and says what a piece of it is (``piece``)."""

    piece: Callable[[int, str], P]

    def __init__(self, piece_bytes: int) -> None:
        self.piece_bytes = piece_bytes
        self._next = 0
        self._open: dict[str, P] = {}

    def __iter__(self) -> Iterator[P]:
        raise NotImplementedError

    def open(self, split: str) -> P:
        """The piece of ``split`` being filled (a new one when there is none)."""
        if split not in self._open:
            self._open[split] = self.piece(-1, split)
        return self._open[split]

    def add(self, split: str, text: Any, nbytes: int) -> Iterator[P]:
        """Add ``text`` (``nbytes`` long) to the open piece of ``split``; that piece, numbered,
        once it holds ``piece_bytes``."""
        piece = self.open(split)
        piece.texts.append(text)
        piece.nbytes += nbytes
        if piece.nbytes >= self.piece_bytes:
            yield self._close(split)

    def rest(self) -> Iterator[P]:
        """The pieces still open at the end of the input."""
        for split in SPLITS:
            if split in self._open:
                yield self._close(split)

    def _close(self, split: str) -> P:
        return self.numbered(self._open.pop(split))

    def numbered(self, piece: P) -> P:
        """``piece``, given the next number (a piece made whole, not filled)."""
        piece.index, self._next = self._next, self._next + 1
        return piece


# ---- tokenizing in worker processes ----------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: dict[str, Any]) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per process: the pool uses the others
    _WORKER["tokenizer"] = tokenizer_from_dict(tokenizer)


def _in_worker(work: Callable[[Tokenizer, Any], Any], piece: Any) -> Any:
    return work(_WORKER["tokenizer"], piece)


class Encoder:
    """Pieces in, ``work(tokenizer, piece)`` out in the same order: in this process
    (``workers == 1``) or in a pool with a few pieces in flight per worker (memory stays
    bounded). ``work`` is a module-level function (or a partial of one), so a worker process
    can run it; a piece's ``texts`` are what it sends (prepare's documents, the sentence pairs
    of :mod:`attnlab.data.pairs`)."""

    def __init__(self, tokenizer: Tokenizer, workers: int,
                 work: Callable[[Tokenizer, Any], Any]) -> None:
        self.tokenizer, self.workers, self.work = tokenizer, workers, work

    def map(self, pieces: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
        if self.workers == 1:
            for p in pieces:
                yield p, self.work(self.tokenizer, p)
            return
        with ProcessPoolExecutor(self.workers, mp_context=get_context("fork"),
                                 initializer=_init_worker,
                                 initargs=(self.tokenizer.to_dict(),)) as pool:
            flight: deque[tuple[Any, Future]] = deque()
            for p in pieces:
                # (the piece is pickled later, by the pool's feeder thread: never mutate it)
                flight.append((p, pool.submit(_in_worker, self.work, p)))
                if len(flight) >= 2 * self.workers:
                    q, fut = flight.popleft()
                    yield q, fut.result()
            while flight:
                q, fut = flight.popleft()
                yield q, fut.result()


def joined(parts: list[np.ndarray], dtype: str) -> np.ndarray:
    """The id arrays ``parts`` one after another, as the shards' ``dtype``."""
    ids = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    if ids.size and int(ids.max()) > np.iinfo(dtype).max:  # attnlab's fault, not the input's
        raise AssertionError(f"bug: id {int(ids.max())} does not fit the shards' {dtype}")
    return ids.astype(dtype, copy=False)


# ---- a prepared DIR: start, shards, finish ---------------------------------------------------
def check_args(val_fraction: float, seed: int, workers: int, errors: str,
               vocab_size: int) -> None:
    """The arguments every prepare shares, checked before any work."""
    if not isinstance(val_fraction, (int, float)) or not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}")
    check_int("seed", seed, 0)
    check_int("workers", workers, 0, 4 * usable_cores())  # (0: one per core; more only thrash)
    check_int("vocab_size", vocab_size, 8)
    if errors not in ERRORS:
        raise DataError(f"errors={errors!r} is not allowed: one of {', '.join(ERRORS)}")


@contextlib.contextmanager
def removed_on_bad_input(out: Path, bad: tuple[type[BaseException], ...] = (InputError,)):
    """Remove ``out`` when the block, which made it, stops on bad input (one of ``bad``): it
    leaves nothing behind. A full disk keeps the finished shards: the same call continues once
    there is space."""
    new = not out.exists()
    try:
        yield
    except DiskFullError:
        raise
    except bad:
        if new:
            shutil.rmtree(out, ignore_errors=True)
        raise


def start(out: Path, plan: dict[str, Any]) -> bool:
    """Make ``out`` ready for the prepare that ``plan`` describes; True when it is already
    finished. A finished DIR of another plan is refused; an unfinished one is resumed if its
    plan is this one, else emptied."""
    if (out / MANIFEST).is_file():
        if read_manifest(out).get("plan") == plan:
            log.info("%s is already prepared from these sources and settings", out)
            return True
        raise DataError(f"{out} already holds a prepared corpus made from other sources or "
                        "settings; choose another --out or remove it")
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; expected a directory (new or unfinished)")
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    ours = read_plan(out) is not None or (  # unfinished, or finished and its manifest lost
        names & set(SPLITS) and names <= {*SPLITS, TOKENIZER, PLAN, MANIFEST})
    if names and not ours:  # a run dir, the user's own files
        others = sorted(names)
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise DataError(f"--out {out} holds other files ({shown}) and no prepare of attnlab; "
                        "choose a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    if read_plan(out) != plan:  # a new prepare, or an unfinished one of other settings
        clear_unfinished(out)
        atomic_write_json(out / PLAN, plan)
    return False


def made_plan(out: Path, plan: dict[str, Any], older: dict[str, Any]) -> dict[str, Any]:
    """``older`` when the DIR ``out`` (finished or not) was made by it: the plan an earlier
    attnlab wrote for the prepare that ``plan`` describes, which cut its input otherwise; such
    a DIR is resumed (or kept) the way it was made. Else ``plan``."""
    made = read_plan(out)
    if (out / MANIFEST).is_file():
        with contextlib.suppress(DataError):
            made = read_manifest(out).get("plan")
    return older if made == older else plan


def read_plan(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / PLAN).read_text())
    except (OSError, ValueError):
        return None


def clear_unfinished(out: Path) -> None:
    """Empty an unfinished DIR of another prepare (its shards would not fit this one)."""
    for name in SPLITS:
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (TOKENIZER, PLAN):
        (out / name).unlink(missing_ok=True)


def kept_tokenizer(out: Path, make: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer an unfinished prepare of the same plan saved in ``out`` (a BPE is not
    retrained), else ``make()``'s, saved there first."""
    tok = resumed_tokenizer(out) or make()
    if not (out / TOKENIZER).is_file():
        tok.save(out / TOKENIZER)
    return tok


def resumed_tokenizer(out: Path) -> Tokenizer | None:
    """The tokenizer an unfinished prepare of the same plan saved (a BPE is not retrained)."""
    if (out / TOKENIZER).is_file():
        try:
            return load_tokenizer(out / TOKENIZER)
        except (OSError, ValueError):
            (out / TOKENIZER).unlink(missing_ok=True)
    return None


def write_pieces(encoder: Encoder, pieces: Iterable[P],
                 finished: Callable[[P], dict[str, Any] | None],
                 write: Callable[[P, Any], tuple[dict[str, Any], int]], *, progress: bool,
                 total_bytes: int) -> Records:
    """Tokenize the pieces not yet done on the ``encoder``'s workers and write each; the
    record of every shard by split, in piece order.

    Args:
        finished: the record of a piece whose shard a killed run finished, else None: such a
            piece is only recorded (exact resume).
        write: writes a piece from the ``encoder``'s result; its record and token count.
        progress: show a progress bar of the ``total_bytes`` of text on stderr.
    """
    got: dict[str, list[tuple[int, dict[str, Any]]]] = {split: [] for split in SPLITS}
    bar = progress_bar(progress, total_bytes)
    tokens = 0
    try:
        for piece, result in encoder.map(todo(pieces, finished, got, bar)):
            record, n = write(piece, result)
            got[piece.split].append((piece.index, record))
            tokens += n
            if bar is not None:
                bar.update(piece.nbytes)
                bar.set_postfix_str(f"{tokens / 1e6:.1f}M tokens")
    finally:
        if bar is not None:
            bar.close()
    return {split: [r for _, r in sorted(rs, key=lambda x: x[0])] for split, rs in got.items()}


def todo(pieces: Iterable[P], finished: Callable[[P], dict[str, Any] | None],
         got: dict[str, list[tuple[int, dict[str, Any]]]], bar) -> Iterator[P]:
    """The pieces still to tokenize; those with a finished shard are only recorded in
    ``got``."""
    for piece in pieces:
        record = finished(piece)
        if record is None:
            yield piece
            continue
        got[piece.split].append((piece.index, record))
        if bar is not None:
            bar.update(piece.nbytes)


def write_shard(path: Path, ids: np.ndarray) -> None:
    """One shard file of ``ids``, little-endian, written atomically."""
    try:
        atomic_write_bytes(path, ids.astype(ids.dtype.newbyteorder("<"), copy=False).tobytes())
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DiskFullError(f"the disk is full: shard {path} was not written (nothing partial "
                            "is left); free some space and run the same command again to "
                            "continue") from None
        raise


def finish(out: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest of a DIR whose shards are all there: it is finished."""
    atomic_write_json(out / MANIFEST, manifest)
    (out / PLAN).unlink(missing_ok=True)
    return out


def progress_bar(show: bool, total: int):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare",
                dynamic_ncols=True)


# ---- the data cache --------------------------------------------------------------------------
def cached(out: Path, make: Callable[[], object]) -> Path:
    """``out``, a DIR of the data cache, made by ``make()`` when it is not finished yet.
    Processes that ask at once (the ranks of a distributed run) wait for the one that makes
    it; a finished DIR is returned at once, with no lock taken."""
    if (out / MANIFEST).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.with_name(out.name + ".lock")):  # (removed again, whatever happens)
        if not (out / MANIFEST).is_file():
            make()
    return out


def one_process_suffices(paths: Iterable[Path]) -> bool:
    """True when the files hold so little that one process is quicker than starting more."""
    return sum(p.stat().st_size for p in paths) < 4 * PIECE_BYTES


@contextlib.contextmanager
def file_lock(path: Path):
    """Hold the lock file ``path`` (made here) for the block, and remove it after: a
    process that waited on a lock file removed meanwhile takes the new one instead."""
    import fcntl

    while True:
        f = open(path, "a")  # noqa: SIM115 (closed below)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                break  # the lock file that is there now: ours
        except FileNotFoundError:
            pass  # its holder removed it: take the new one
        f.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # while held: no one else can hold this one
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()
