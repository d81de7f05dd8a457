"""Tokenize a corpus once, on every core, into the flat token shards of a prepared DIR.

:func:`prepare` streams the documents of its sources (:mod:`attnlab.data.sources`), cuts
them into pieces of about ``PIECE_BYTES`` of text, tokenizes the pieces in worker processes
and writes each as one shard (:mod:`attnlab.data.shards`): memory stays flat whatever the
corpus size. :func:`prepare_cached` does it once per raw file, in a cache keyed by the
file's content and the tokenizer settings.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import shlex
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.config import check_int
from attnlab.data.errors import DataError
from attnlab.data.fetch import sha256_of
from attnlab.data.shards import FORMAT, MANIFEST, PLAN, TOKENIZER, read_manifest, token_dtype
from attnlab.data.sources import (
    ERRORS,
    NotUTF8Error,
    Source,
    check_source,
    documents,
    find_sources,
    scan,
    text_blocks_at,
    text_size,
)
from attnlab.files import atomic_write_bytes, atomic_write_json
from attnlab.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)

log = logging.getLogger(__name__)

TOKENIZER_KINDS = ("char", "bpe", "gpt2")
PIECE_BYTES = 1 << 22  # text per shard: small enough to keep every core busy, large enough
# that a GB corpus is a few hundred files
SAMPLE_BYTES = 100 << 20  # text a BPE vocabulary is trained on


class DiskFullError(DataError):
    """A shard could not be written for want of space (the finished ones are kept)."""


@dataclass
class _Piece:
    """Consecutive text of one split: the unit of work and of one shard file."""

    index: int
    split: str
    texts: list[str] = field(default_factory=list)
    ends: list[bool] = field(default_factory=list)  # does texts[i] end a document?
    nbytes: int = 0

    @property
    def file(self) -> str:
        return f"{self.split}/{self.index:06d}.bin"


class _Pieces:
    """Cuts the documents of the sources into pieces, in an order fixed by the input alone,
    and counts documents per split."""

    def __init__(self, sources: list[Source], val_fraction: float, seed: int, text_field: str,
                 errors: str, piece_bytes: int, anywhere: bool = False) -> None:
        self.sources, self.val_fraction, self.seed = sources, val_fraction, seed
        self.text_field, self.errors, self.piece_bytes = text_field, errors, piece_bytes
        self.anywhere = anywhere  # characters: a text may be cut at any character
        self.documents = {"train": 0, "val": 0}
        self.text_bytes = 0
        self._next = 0
        self._open: dict[str, _Piece] = {}

    def _add(self, split: str, text: str, ends: bool) -> Iterator[_Piece]:
        piece = self._open.get(split)
        if piece is None:
            piece = self._open[split] = _Piece(-1, split)
        piece.texts.append(text)
        piece.ends.append(ends)
        piece.nbytes += len(text)
        self.text_bytes += len(text)
        if ends:
            self.documents[split] += 1
        if piece.nbytes >= self.piece_bytes:
            yield self._close(split)

    def _close(self, split: str) -> _Piece:
        piece = self._open.pop(split)
        piece.index, self._next = self._next, self._next + 1
        return piece

    def __iter__(self) -> Iterator[_Piece]:
        for i, source in enumerate(self.sources):
            if source.is_text:
                yield from self._text(source)
            else:
                rng = random.Random(f"{self.seed}:{i}")  # one draw per document, in order
                n = 0
                for doc in documents(source, self.text_field, self.errors):
                    n += 1
                    split = "val" if rng.random() < self.val_fraction else "train"
                    yield from self._add(split, doc, True)
                if not n:
                    raise DataError(f"source {source.path} holds no document")
        for split in ("train", "val"):
            if split in self._open:
                yield self._close(split)

    def _text(self, source: Source) -> Iterator[_Piece]:
        """A ``.txt`` file: its first part to train, its last ``val_fraction`` to val, cut at
        places where tokenizing the parts gives the ids of the whole."""
        size = text_size(source)
        val_at = int(size * (1 - self.val_fraction)) if self.val_fraction else size + 1
        buf, split, empty = "", "train", True
        for block, pos in text_blocks_at(source, self.errors):  # pos: bytes read so far
            empty = empty and not block.strip()
            buf += block
            if split == "train" and pos >= val_at:  # the split point is in this buffer
                cut = self._cut(buf, len(buf) - _chars_after(buf, pos - val_at))
                train, buf, split = buf[:cut], buf[cut:], "val"
                train = yield from self._chop("train", train)
                if train:
                    yield from self._add("train", train, False)
                self.documents["train"] += 1  # its first part: counted in both splits
            buf = yield from self._chop(split, buf)
        if empty:
            raise DataError(f"source {source.path} is empty (or only whitespace)")
        yield from self._add(split, buf, True)

    def _chop(self, split: str, text: str):
        """Add whole pieces from the start of ``text``; returns what is left (a generator's
        return value: ``rest = yield from self._chop(...)``)."""
        while len(text) >= 2 * self.piece_bytes:
            cut = self._cut(text, self.piece_bytes)
            if cut >= len(text):
                break
            yield from self._add(split, text[:cut], False)
            text = text[cut:]
        return text

    def _cut(self, text: str, at: int) -> int:
        return at if self.anywhere else _cut(text, at)


def _chars_after(text: str, nbytes: int) -> int:
    """How many characters at the end of ``text`` make up its last ``nbytes`` UTF-8 bytes."""
    if nbytes <= 0:
        return 0
    tail = text.encode()[-nbytes:]
    return len(tail.decode("utf-8", "ignore"))


def _cut(text: str, at: int) -> int:
    """A place at or after ``at`` where ``text`` may be cut without changing its tokens: after
    a newline with a non-space character on each side (a byte-level pre-tokenizer joins runs of
    whitespace, and a run cut in two would tokenize differently). The end of the text when
    there is none."""
    at = max(1, min(at, len(text)))
    while True:
        i = text.find("\n", at)
        if i < 0 or i + 1 >= len(text):
            return len(text)
        if not text[i + 1].isspace() and not text[i - 1].isspace():
            return i + 1
        at = i + 1


# ---- tokenizing in worker processes ----------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: dict[str, Any]) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per process: the pool uses the others
    _WORKER["tokenizer"] = tokenizer_from_dict(tokenizer)


def _encode(texts: list[str], ends: list[bool], eot: int | None, dtype: str,
            tokenizer: Tokenizer | None = None) -> np.ndarray:
    """The ids of one piece, ``eot`` after every document end, as ``dtype``."""
    tokenizer = tokenizer or _WORKER["tokenizer"]
    parts = []
    for ids, end in zip(tokenizer.encode_batch(texts), ends):
        parts.append(ids)  # uint32
        if end and eot is not None:
            parts.append(np.array([eot], dtype=np.uint32))
    ids = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    if ids.size and int(ids.max()) > np.iinfo(dtype).max:  # attnlab's fault, not the input's
        raise AssertionError(f"bug: id {int(ids.max())} does not fit the shards' {dtype}")
    return ids.astype(dtype, copy=False)


def _encode_piece(tokenizer: Tokenizer, piece: _Piece, *, eot: int | None,
                  dtype: str) -> np.ndarray:
    """The work of :func:`prepare` on one piece (an :class:`Encoder`'s ``work``)."""
    return _encode(piece.texts, piece.ends, eot, dtype, tokenizer)


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


# ---- the tokenizer ---------------------------------------------------------------------------
def _sample(pieces: _Pieces, budget: int) -> Iterator[str]:
    """Up to ``budget`` bytes of text, an equal share from the start of each source."""
    share = max(1, budget // len(pieces.sources))
    for source in pieces.sources:
        one = _Pieces([source], 0.0, pieces.seed, pieces.text_field, pieces.errors,
                      min(pieces.piece_bytes, share))
        taken = 0
        for piece in one:
            yield from piece.texts
            taken += piece.nbytes
            if taken >= share:
                break


def _build_tokenizer(kind: str | Tokenizer, pieces: _Pieces, vocab_size: int,
                     pre_tokenizer: str) -> Tokenizer:
    if isinstance(kind, Tokenizer):
        return kind
    if kind == "gpt2":
        return GPT2Tokenizer.from_package()
    if kind == "bpe":
        return BPETokenizer.train(_sample(pieces, SAMPLE_BYTES), vocab_size, pre_tokenizer)
    if kind == "char":  # every character of the corpus: one pass over it
        chars: set[str] = set()
        one = _Pieces(pieces.sources, 0.0, pieces.seed, pieces.text_field, pieces.errors,
                      pieces.piece_bytes)
        docs = 0
        for piece in one:
            for text in piece.texts:
                chars.update(text)
            docs += sum(piece.ends)
        if not chars:
            raise DataError("the sources hold no text")
        return CharTokenizer(sorted(chars), ("<eos>",) if docs > 1 else ())
    raise DataError(f"tokenizer {kind!r} is not allowed: one of {', '.join(TOKENIZER_KINDS)} "
                    "or a run dir")


def build_tokenizer(sources: Sequence[str | Path], kind: str, *, vocab_size: int = 8000,
                    pre_tokenizer: str = "byte_level", text_field: str = "text",
                    errors: str = "strict") -> Tokenizer:
    """A new tokenizer of ``kind`` for the text of ``sources``, as :func:`prepare` makes one:
    ``char`` (every character, ``<eos>`` when there is more than one document), ``bpe``
    (trained on at most ``SAMPLE_BYTES``, an equal share of each source) or ``gpt2``."""
    pieces = _Pieces(find_sources(sources, errors=errors), 0.0, 0, text_field, errors, PIECE_BYTES)
    return _build_tokenizer(kind, pieces, vocab_size, pre_tokenizer)


# ---- prepare ---------------------------------------------------------------------------------
def check_args(val_fraction: float, seed: int, workers: int, errors: str,
                vocab_size: int) -> None:
    if not isinstance(val_fraction, (int, float)) or not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}")
    check_int("seed", seed, 0)
    check_int("workers", workers, 0)
    check_int("vocab_size", vocab_size, 8)
    if errors not in ERRORS:
        raise DataError(f"errors={errors!r} is not allowed: one of {', '.join(ERRORS)}")


def prepare(sources: Sequence[str | Path] | str | Path, out: str | Path,
            tokenizer: str | Tokenizer = "char", *, vocab_size: int = 8000,
            pre_tokenizer: str = "byte_level", val_fraction: float = 0.1,
            text_field: str = "text", seed: int = 1337, workers: int = 0,
            errors: str = "strict", progress: bool = False, include: Sequence[str] = (),
            exclude: Sequence[str] = (), piece_bytes: int = PIECE_BYTES) -> Path:
    """Tokenize ``sources`` into the prepared DIR ``out`` and return its path.

    Args:
        sources: files, folders or glob patterns (see :func:`attnlab.data.sources.scan`:
            a folder's text files of any name are read, its binary files skipped).
        out: the DIR to write; an unfinished one of the same arguments is resumed.
        tokenizer: ``"char"``, ``"bpe"`` (``vocab_size``, ``pre_tokenizer``), ``"gpt2"``,
            or a tokenizer (a run's).
        val_fraction: the share of documents (of a ``.txt`` file: its tail) that goes to val.
        text_field: the JSON field or table column that holds the text.
        seed: the seed of the document split.
        workers: tokenizing processes; 0 = one per core.
        errors: ``"strict"`` (an undecodable byte is an error) or ``"replace"``.
        progress: show a progress bar (MB/s, tokens) on stderr.
        include: glob patterns: only the files of folders and patterns that match one are
            read (a file named on its own is always read).
        exclude: glob patterns: the files (and folders) of folders and patterns that match
            one are skipped.

    Returns:
        ``out``, laid out as::

            DIR/prepared.json     the manifest, written last: a DIR without it is unfinished
            DIR/tokenizer.json    the tokenizer that made the ids (Tokenizer.save)
            DIR/train/000000.bin  token ids, little-endian uint16 (vocabulary <= 65,536) or
                                  uint32, numbered by the piece of input they hold
            DIR/val/000003.bin

        A row of ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` / ``.tsv`` is a
        document that goes to val with probability ``val_fraction`` (seeded); a text file
        (``.txt`` or any other name) is one long document whose last ``val_fraction`` goes
        to val, as nanoGPT splits Tiny Shakespeare. The tokenizer's end-of-text id follows
        every document (``char`` adds ``<eos>`` when there is more than one). Each shard is
        written atomically and ``prepared.json`` last: a killed prepare leaves no DIR that
        looks complete, and the same call again keeps the finished shards and tokenizes only
        the rest.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from attnlab.data.prepare import prepare
        >>> from attnlab.data.shards import TokenShards
        >>> tmp = Path(tempfile.mkdtemp())
        >>> _ = (tmp / "corpus.txt").write_text("to be or not to be, that is the question.\\n" * 50)
        >>> out = prepare(tmp / "corpus.txt", tmp / "prepared", "char", workers=1)
        >>> sorted(p.name for p in out.iterdir())
        ['prepared.json', 'tokenizer.json', 'train', 'val']
    """
    check_args(val_fraction, seed, workers, errors, vocab_size)
    out = Path(out)
    new = not out.exists()
    try:
        return _prepare(sources, out, tokenizer, vocab_size=vocab_size,
                        pre_tokenizer=pre_tokenizer, val_fraction=val_fraction,
                        text_field=text_field, seed=seed, workers=workers, errors=errors,
                        progress=progress, include=include, exclude=exclude,
                        piece_bytes=piece_bytes)
    except DiskFullError:
        raise  # the finished shards stay: the same command continues once there is space
    except DataError:
        if new:
            shutil.rmtree(out, ignore_errors=True)  # bad input: leave nothing behind
        raise


def _prepare(sources: Sequence[str | Path] | str | Path, out: Path, tokenizer: str | Tokenizer,
             *, vocab_size: int, pre_tokenizer: str, val_fraction: float, text_field: str,
             seed: int, workers: int, errors: str, progress: bool, include: Sequence[str],
             exclude: Sequence[str], piece_bytes: int) -> Path:
    """:func:`prepare` of checked arguments: plan, tokenizer, shards, manifest last."""
    found = _found(sources, include, exclude, errors)
    workers = workers or usable_cores()
    described = [{"path": str(s.path.resolve()), "bytes": s.path.stat().st_size,
                  "sha256": sha256_of(s.path)} for s in found]
    kind = tokenizer.kind if isinstance(tokenizer, Tokenizer) else tokenizer
    plan = {"sources": described, "val_fraction": val_fraction, "seed": seed,
            "text_field": text_field, "errors": errors, "piece_bytes": piece_bytes,
            "tokenizer": kind if kind != "bpe" else [kind, vocab_size, pre_tokenizer],
            "given": tokenizer.to_dict() if isinstance(tokenizer, Tokenizer) else None}
    if start(out, plan):
        return out
    pieces = _Pieces(found, val_fraction, seed, text_field, errors, piece_bytes)
    tok = resumed_tokenizer(out) or _build_tokenizer(tokenizer, pieces, vocab_size,
                                                      pre_tokenizer)
    pieces.anywhere = tok.kind == "char"
    if not (out / TOKENIZER).is_file():
        tok.save(out / TOKENIZER)
    dtype = token_dtype(tok.vocab_size)
    shards: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    encoder = Encoder(tok, workers, partial(_encode_piece, eot=tok.eos_id, dtype=dtype))
    bar = progress_bar(progress, sum(d["bytes"] for d in described))
    tokens = 0
    try:
        for piece, ids in encoder.map(_todo(pieces, out, shards, dtype, bar)):
            write_shard(out / piece.file, ids)
            shards[piece.split].append({"file": piece.file, "tokens": int(ids.size)})
            tokens += int(ids.size)
            if bar is not None:
                bar.update(piece.nbytes)
                bar.set_postfix_str(f"{tokens / 1e6:.1f}M tokens")
    finally:
        if bar is not None:
            bar.close()
    if not shards["train"] or not any(s["tokens"] for s in shards["train"]):
        raise DataError("the sources hold no text for the train split")
    for split in shards:
        shards[split].sort(key=lambda s: s["file"])
    manifest = {
        "format": FORMAT, "kind": "tokens", "dtype": dtype, "plan": plan, "sources": described,
        "val_fraction": val_fraction, "seed": seed, "text_field": text_field,
        "tokenizer": {"kind": tok.kind, "vocab_size": tok.vocab_size, "eot_id": tok.eos_id},
        "splits": {split: {"shards": s, "tokens": sum(x["tokens"] for x in s),
                           "documents": pieces.documents[split]}
                   for split, s in shards.items()},
    }
    atomic_write_json(out / MANIFEST, manifest)
    (out / PLAN).unlink(missing_ok=True)
    return out


def _found(sources: Sequence[str | Path] | str | Path, include: Sequence[str],
           exclude: Sequence[str], errors: str) -> list[Source]:
    """The sources to read; says which files of folders and patterns it skips."""
    scanned = scan(sources, include, exclude, errors)
    if scanned.skipped_line():
        n = len(scanned.sources)
        log.info("%s; reading %d file%s", scanned.skipped_line(), n, "" if n == 1 else "s")
    return scanned.sources


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
    out.mkdir(parents=True, exist_ok=True)
    if read_plan(out) != plan:  # a new prepare, or an unfinished one of other settings
        clear_unfinished(out)
        atomic_write_json(out / PLAN, plan)
    return False


def _todo(pieces: _Pieces, out: Path, shards: dict[str, list[dict[str, Any]]], dtype: str,
          bar) -> Iterator[_Piece]:
    """The pieces still to tokenize; those with a finished shard are only recorded."""
    size = np.dtype(dtype).itemsize
    for piece in pieces:
        path = out / piece.file
        if path.is_file():
            shards[piece.split].append({"file": piece.file, "tokens": path.stat().st_size // size})
            if bar is not None:
                bar.update(piece.nbytes)
            continue
        yield piece


def write_shard(path: Path, ids: np.ndarray) -> None:
    try:
        atomic_write_bytes(path, ids.astype(ids.dtype.newbyteorder("<"), copy=False).tobytes())
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DiskFullError(f"the disk is full: shard {path} was not written (nothing partial "
                            "is left); free some space and run the same command again to "
                            "continue") from None
        raise


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # the cores this process may use (taskset, cgroups)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def read_plan(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / PLAN).read_text())
    except (OSError, ValueError):
        return None


def clear_unfinished(out: Path) -> None:
    """Empty an unfinished DIR of another prepare (its shards would not fit this one)."""
    for name in ("train", "val"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (TOKENIZER, PLAN):
        (out / name).unlink(missing_ok=True)


def resumed_tokenizer(out: Path) -> Tokenizer | None:
    """The tokenizer an unfinished prepare of the same plan saved (a BPE is not retrained)."""
    if (out / TOKENIZER).is_file():
        try:
            return load_tokenizer(out / TOKENIZER)
        except (OSError, ValueError):
            (out / TOKENIZER).unlink(missing_ok=True)
    return None


def progress_bar(show: bool, total: int):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare",
                dynamic_ncols=True)


# ---- the cache of raw files ------------------------------------------------------------------
def prepare_cached(path: str | Path, cache_dir: str | Path, tokenizer: str | Tokenizer = "char",
                   *, vocab_size: int = 8000, pre_tokenizer: str = "byte_level",
                   val_fraction: float = 0.1) -> Path:
    """The prepared DIR of the text file (or folder of text files) ``path`` under
    ``cache_dir/prepared/``, made once.

    The key is the files' content hashes and the tokenizer settings: a second call reads no
    text and tokenizes nothing; a changed file gets a new DIR. The text is read through once
    before anything is said or tokenized: bad input is one line and leaves nothing in the
    cache. Processes that ask at once (the ranks of a distributed run) wait for the one that
    prepares it (and checks the text).
    """
    path = Path(path)
    found = _raw_sources(path)
    settings = {"tokenizer": tokenizer.to_dict() if isinstance(tokenizer, Tokenizer)
                else tokenizer, "vocab_size": vocab_size, "pre_tokenizer": pre_tokenizer,
                "val_fraction": val_fraction}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    if path.is_dir():  # the files' names below it and their contents
        listed = [[s.path.relative_to(path).as_posix(), sha256_of(s.path)] for s in found]
        content = hashlib.sha256(json.dumps(listed).encode()).hexdigest()
        name = path.resolve().name or "root"
        out = Path(cache_dir) / "prepared" / f"{name}-{content[:16]}-{key}"
    else:
        out = Path(cache_dir) / "prepared" / f"{path.stem}-{sha256_of(path)[:16]}-{key}"
    if (out / MANIFEST).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.with_name(out.name + ".lock")):  # (removed again, whatever happens)
        if not (out / MANIFEST).is_file():
            _check_raw(path, found)  # bad text stops here: before a word is said
            log.info("preparing %s once into %s", path, out)
            prepare([path], out, tokenizer, vocab_size=vocab_size, pre_tokenizer=pre_tokenizer,
                    val_fraction=val_fraction,
                    workers=1 if sum(s.path.stat().st_size for s in found) < 4 * PIECE_BYTES
                    else 0)  # one process is quicker than starting more
    return out


def _check_raw(path: Path, found: list[Source]) -> None:
    """Read the sources of :func:`prepare_cached` through once; the first bad one is one line
    that says what `attnlab train` can do about it."""
    for source in found:
        try:
            check_source(source)
        except NotUTF8Error as e:
            raise DataError(f"{e.fact}; convert it to UTF-8, or prepare {path} with `attnlab "
                            f"data prepare {shlex.quote(str(path))} --errors replace --out DIR` "
                            "(U+FFFD in its place) and give DIR in its place") from None


def _raw_sources(path: Path) -> list[Source]:
    """The sources of a raw text file or folder given to :func:`prepare_cached`; one line when
    there is none, which says what a folder may be."""
    if not path.is_dir():
        return find_sources([path])  # one message for a missing file
    try:
        return find_sources([path])
    except DataError as e:
        raise DataError(f"{e}; or a prepared data dir, which `attnlab data prepare SRC... "
                        "--out DIR` makes") from None


def one_process_suffices(path: Path) -> bool:
    return path.stat().st_size < 4 * PIECE_BYTES  # one process is quicker than starting more


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
