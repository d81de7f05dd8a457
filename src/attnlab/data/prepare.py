"""Tokenize a corpus once, on every core, into the flat token shards of a prepared DIR.

:func:`prepare` streams the documents of its sources (:mod:`attnlab.data.sources`), cuts
them into pieces of about ``PIECE_BYTES`` of text, tokenizes the pieces in worker processes
and writes each as one shard (:mod:`attnlab.data.shards`): memory stays flat whatever the
corpus size. A plain text file is not read here: each worker is sent a byte range of it
(:class:`_Span`), reads it and finds the cuts at its edges itself (:func:`cut`).
:func:`prepare_cached` does it once per raw file, in a cache keyed by the file's content and
the tokenizer settings.
"""

from __future__ import annotations

import logging
import random
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data import pipeline
from attnlab.data.errors import DataError
from attnlab.data.fetch import sha256_of
from attnlab.data.pipeline import PIECE_BYTES, SAMPLE_BYTES, Encoder, Piece, Pieces, write_shard
from attnlab.data.shards import FORMAT, token_dtype
from attnlab.data.sources import (
    NotUTF8Error,
    Source,
    check_source,
    documents,
    find_sources,
    holds_text,
    scan,
    text_blocks_at,
    text_range,
    text_size,
)
from attnlab.devices import usable_cores
from attnlab.tokenizers import BPETokenizer, CharTokenizer, GPT2Tokenizer, Tokenizer

log = logging.getLogger(__name__)

TOKENIZER_KINDS = ("char", "bpe", "gpt2")
SEARCH = 1 << 12  # bytes a worker reads at first around a span's edge to find its cut


@dataclass
class _Piece(Piece):
    """Consecutive text of one split: ``texts[i]`` ends a document when ``ends[i]``."""

    ends: list[bool] = field(default_factory=list)

    @property
    def file(self) -> str:
        return f"{self.name}.bin"

    def read(self) -> list[str]:
        """The texts to tokenize (in a worker process)."""
        return self.texts


@dataclass
class _Span(_Piece):
    """Bytes ``[start, end)`` of a plain text file, all the main process sends of it: the
    worker reads them and moves each edge to the first place at or after it where the text may
    be cut (:func:`cut`), looking only at the bytes near that edge, so the span before ends
    where this one begins (an empty span when none is inside it)."""

    source: Source | None = None
    start: int = 0
    end: int = 0
    size: int = 0  # of the file
    anywhere: bool = False
    errors: str = "strict"

    def read(self) -> list[str]:
        assert self.source is not None
        with open(self.source.path, "rb") as f:
            first = self.split == "train" and self.start == 0  # the file's first span
            begin = 0 if first else _cut_in_file(f, self.start, self.size, self.anywhere,
                                                 stop=self.end)
            if begin is None:  # no cut inside: the span before ends past this one
                return [""]
            end = _cut_in_file(f, self.end, self.size, self.anywhere)
        if end is None or begin >= end:
            return [""]
        return [text_range(self.source, begin, end, self.errors)]


class _Pieces(Pieces[_Piece]):
    """Cuts the documents of the sources into pieces, in an order fixed by the input alone,
    and counts documents per split."""

    piece = _Piece

    def __init__(self, sources: list[Source], val_fraction: float, seed: int, text_field: str,
                 errors: str, piece_bytes: int, anywhere: bool = False,
                 spans: bool = False) -> None:
        super().__init__(piece_bytes)
        self.sources, self.val_fraction, self.seed = sources, val_fraction, seed
        self.text_field, self.errors = text_field, errors
        self.anywhere = anywhere  # characters: a text may be cut at any character
        self.spans = spans  # a plain text file as spans that the workers read (else: read here)
        self.documents = {"train": 0, "val": 0}

    def _add(self, split: str, text: str, ends: bool) -> Iterator[_Piece]:
        self.open(split).ends.append(ends)
        if ends:
            self.documents[split] += 1
        yield from self.add(split, text, len(text))

    def __iter__(self) -> Iterator[_Piece]:
        for i, source in enumerate(self.sources):
            if source.is_text and self.spans and not source.compression:
                yield from self._spans(source)
            elif source.is_text:
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
        yield from self.rest()

    def _spans(self, source: Source) -> Iterator[_Piece]:
        """A plain ``.txt`` file as :class:`_Span` s of ``piece_bytes``: bytes up to
        ``int(size * (1 - val_fraction))`` to train, the rest to val, each edge moved to the
        next cut (:func:`cut`). Here only its start is read, to tell an empty file."""
        if not holds_text(source, self.errors):
            raise DataError(f"source {source.path} is empty (or only whitespace)")
        yield from self.rest()  # the pieces open before it first: each split keeps its order
        size = source.path.stat().st_size
        val_at = int(size * (1 - self.val_fraction)) if self.val_fraction else size
        parts = [("train", 0, val_at)] + ([("val", val_at, size)] if self.val_fraction else [])
        for split, lo, hi in parts:
            self.documents[split] += 1  # (a file split in two counts in both)
            for start in range(lo, hi, self.piece_bytes) or [lo]:
                end = min(start + self.piece_bytes, hi)
                yield self.numbered(_Span(
                    -1, split, nbytes=end - start, ends=[end == size], source=source,
                    start=start, end=end, size=size, anywhere=self.anywhere,
                    errors=self.errors))

    def _text(self, source: Source) -> Iterator[_Piece]:
        """A ``.txt`` file read here (compressed, or the plan of an earlier attnlab): its first
        part to train, its last ``val_fraction`` to val, cut by :func:`cut`."""
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
        return cut(text, at, self.anywhere)  # (an int: the text is final)


def _chars_after(text: str, nbytes: int) -> int:
    """How many characters at the end of ``text`` make up its last ``nbytes`` UTF-8 bytes."""
    if nbytes <= 0:
        return 0
    tail = text.encode()[-nbytes:]
    return len(tail.decode("utf-8", "ignore"))


def cut(text: str | bytes, at: int, anywhere: bool = False, final: bool = True) -> int | None:
    """The first place at or after ``at`` where ``text`` (or its UTF-8 bytes) may be cut
    without changing its tokens: after a newline at or after ``at`` (and after the first
    character) with a non-space character on each side (a byte-level pre-tokenizer joins runs
    of whitespace, and a run cut in two would tokenize differently); with ``anywhere`` (the
    char tokenizer), the first character boundary. The end of the text when there is none.

    Only the characters next to the place decide, so the same rule gives the same place
    whether it reads the whole text or the bytes near ``at``: bytes that are not the ``final``
    part of the file give None when their end leaves it open."""
    n = len(text)
    if anywhere:
        at = min(max(at, 0), n)
        while isinstance(text, bytes) and at < n and text[at] & 0xC0 == 0x80:
            at += 1  # a continuation byte: inside a character
        return at if at < n or final else None
    newline = "\n" if isinstance(text, str) else b"\n"
    at = max(1, min(at, n))
    while (i := text.find(newline, at)) >= 0:
        if i + 1 >= n or (not final and i + 5 > n):  # the character after it is not all here
            break
        if not _char_before(text, i).isspace() and not _char_at(text, i + 1).isspace():
            return i + 1
        at = i + 1
    return n if final else None


def _char_before(text: str | bytes, i: int) -> str:
    """The character that ends where ``text[i]`` begins (of bytes: as decoding the whole file
    with ``errors="replace"`` reads it; U+FFFD when not UTF-8)."""
    if isinstance(text, str):
        return text[i - 1]
    for k in range(i - 1, max(i - 4, 0) - 1, -1):
        if text[k] & 0xC0 != 0x80:  # ASCII or a lead byte: where that character begins
            return text[k:i].decode("utf-8", "replace")[-1]
    return "\ufffd"


def _char_at(text: str | bytes, i: int) -> str:
    """The character that begins at ``text[i]`` (as :func:`_char_before` reads bytes)."""
    if isinstance(text, str):
        return text[i]
    return text[i:i + 4].decode("utf-8", "replace")[0]


def _cut_in_file(f, at: int, size: int, anywhere: bool, stop: int | None = None) -> int | None:
    """:func:`cut` of the whole file ``f`` (``size`` bytes) at byte ``at``, read near ``at``
    (``SEARCH`` bytes, more while the rule is undecided); None when it is not decided by byte
    ``stop``: it is at or after ``stop``."""
    lo, more = max(0, at - 4), SEARCH  # (4: the character before a newline at ``at``)
    limit = size if stop is None else min(size, stop + 4)  # (4: the character after one)
    while True:
        hi = min(max(at + more, lo), limit)
        f.seek(lo)
        found = cut(f.read(hi - lo), at - lo, anywhere, final=hi >= size)
        if found is not None:
            return lo + found
        if hi >= limit:
            return None
        more *= 4


# ---- tokenizing (in worker processes) ------------------------------------------------------
def _encode(texts: list[str], ends: list[bool], eot: int | None, dtype: str,
            tokenizer: Tokenizer) -> np.ndarray:
    """The ids of one piece, ``eot`` after every document end, as ``dtype``."""
    parts = []
    for ids, end in zip(tokenizer.encode_batch(texts), ends):
        parts.append(ids)  # uint32
        if end and eot is not None:
            parts.append(np.array([eot], dtype=np.uint32))
    return pipeline.joined(parts, dtype)


def _encode_piece(tokenizer: Tokenizer, piece: _Piece, *, eot: int | None,
                  dtype: str) -> np.ndarray:
    """The work of :func:`prepare` on one piece (an :class:`Encoder`'s ``work``)."""
    return _encode(piece.read(), piece.ends, eot, dtype, tokenizer)


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
        to val, as nanoGPT splits Tiny Shakespeare: from the first newline at or after byte
        ``int(size * (1 - val_fraction))`` with a non-space character on each side (``char``:
        the first character that starts there or after; val is empty when there is none).
        The tokenizer's end-of-text id follows
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
    pipeline.check_args(val_fraction, seed, workers, errors, vocab_size)
    out = Path(out)
    with pipeline.removed_on_bad_input(out):  # (a full disk keeps the finished shards)
        return _prepare(sources, out, tokenizer, vocab_size=vocab_size,
                        pre_tokenizer=pre_tokenizer, val_fraction=val_fraction,
                        text_field=text_field, seed=seed, workers=workers, errors=errors,
                        progress=progress, include=include, exclude=exclude,
                        piece_bytes=piece_bytes)


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
            "given": tokenizer.to_dict() if isinstance(tokenizer, Tokenizer) else None,
            "pieces": "byte-ranges"}  # plain text files: spans read by the workers
    # a DIR an earlier attnlab made (no "pieces": it read and cut text files here) goes on so
    plan = pipeline.made_plan(out, plan, {k: v for k, v in plan.items() if k != "pieces"})
    if pipeline.start(out, plan):
        return out
    pieces = _Pieces(found, val_fraction, seed, text_field, errors, piece_bytes,
                     spans="pieces" in plan)
    tok = pipeline.kept_tokenizer(out, lambda: _build_tokenizer(tokenizer, pieces, vocab_size,
                                                                pre_tokenizer))
    pieces.anywhere = tok.kind == "char"
    dtype = token_dtype(tok.vocab_size)
    encoder = Encoder(tok, workers, partial(_encode_piece, eot=tok.eos_id, dtype=dtype))
    shards = pipeline.write_pieces(encoder, pieces, partial(_finished, out, dtype=dtype),
                                   partial(_write, out), progress=progress,
                                   total_bytes=sum(d["bytes"] for d in described))
    if not shards["train"] or not any(s["tokens"] for s in shards["train"]):
        raise DataError("the sources hold no text for the train split")
    return pipeline.finish(out, {
        "format": FORMAT, "kind": "tokens", "dtype": dtype, "plan": plan, "sources": described,
        "val_fraction": val_fraction, "seed": seed, "text_field": text_field,
        "tokenizer": {"kind": tok.kind, "vocab_size": tok.vocab_size, "eot_id": tok.eos_id},
        "splits": {split: {"shards": s, "tokens": sum(x["tokens"] for x in s),
                           "documents": pieces.documents[split]}
                   for split, s in shards.items()},
    })


def _finished(out: Path, piece: _Piece, dtype: str) -> dict[str, Any] | None:
    """The record of a piece whose shard a killed prepare finished (written atomically: one
    that is there is whole), else None."""
    path = out / piece.file
    if not path.is_file():
        return None
    return {"file": piece.file, "tokens": path.stat().st_size // np.dtype(dtype).itemsize}


def _write(out: Path, piece: _Piece, ids: np.ndarray) -> tuple[dict[str, Any], int]:
    """Write the shard of ``piece``; its record and token count."""
    write_shard(out / piece.file, ids)
    return {"file": piece.file, "tokens": int(ids.size)}, int(ids.size)


def _found(sources: Sequence[str | Path] | str | Path, include: Sequence[str],
           exclude: Sequence[str], errors: str) -> list[Source]:
    """The sources to read; says which files of folders and patterns it skips."""
    scanned = scan(sources, include, exclude, errors)
    if scanned.skipped_line():
        n = len(scanned.sources)
        log.info("%s; reading %d file%s", scanned.skipped_line(), n, "" if n == 1 else "s")
    return scanned.sources


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
    out = _cached_dir(path, found, cache_dir, tokenizer, vocab_size=vocab_size,
                      pre_tokenizer=pre_tokenizer, val_fraction=val_fraction)

    def make() -> None:
        check_raw(path, found)  # bad text stops here: before a word is said
        log.info("preparing %s once into %s", path, out)
        prepare([path], out, tokenizer, vocab_size=vocab_size, pre_tokenizer=pre_tokenizer,
                val_fraction=val_fraction,
                workers=1 if pipeline.one_process_suffices([s.path for s in found]) else 0)

    return pipeline.cached(out, make)


def cached_dir(path: str | Path, cache_dir: str | Path, tokenizer: str | Tokenizer = "char",
               *, vocab_size: int = 8000, pre_tokenizer: str = "byte_level",
               val_fraction: float = 0.1) -> Path:
    """Where :func:`prepare_cached` keeps the DIR of the text file or folder ``path`` and
    these settings (made or not): under ``cache_dir/prepared/``, keyed by the files' contents
    (a folder's: their names below it too) and the tokenizer settings."""
    path = Path(path)
    return _cached_dir(path, _raw_sources(path), cache_dir, tokenizer, vocab_size=vocab_size,
                       pre_tokenizer=pre_tokenizer, val_fraction=val_fraction)


def _cached_dir(path: Path, found: list[Source], cache_dir: str | Path,
                tokenizer: str | Tokenizer, *, vocab_size: int, pre_tokenizer: str,
                val_fraction: float) -> Path:
    settings = {"tokenizer": tokenizer.to_dict() if isinstance(tokenizer, Tokenizer)
                else tokenizer, "vocab_size": vocab_size, "pre_tokenizer": pre_tokenizer,
                "val_fraction": val_fraction}
    key = pipeline.cache_key(settings, 12)
    if path.is_dir():  # the files' names below it and their contents
        listed = [[s.path.relative_to(path).as_posix(), sha256_of(s.path)] for s in found]
        name = path.resolve().name or "root"
        return Path(cache_dir) / "prepared" / f"{name}-{pipeline.cache_key(listed, 16)}-{key}"
    return Path(cache_dir) / "prepared" / f"{path.stem}-{sha256_of(path)[:16]}-{key}"


def check_raw(path: str | Path, found: list[Source] | None = None) -> None:
    """Read the sources of the raw text file or folder ``path`` given to training (their
    ``found`` list, when known) through once; the first bad one is one line that says what
    `attnlab train` can do about it."""
    path = Path(path)
    for source in _raw_sources(path) if found is None else found:
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
