"""Translation corpora tokenized once into flat memory: prepared pairs DIRs, read through maps.

:func:`prepare_pairs` tokenizes line-aligned source/target files in worker processes (the
machinery of :mod:`attnlab.data.prepare`) into shards of four files each: the source ids and
their offsets, the target ids (``[bos] ... [eos]``) and theirs (layout: :func:`prepare_pairs`).
:class:`PairShards` reads a split, its lengths from the offsets alone and the rows of one batch
through maps that are closed again, so a corpus of any size trains in flat memory.
"""

from __future__ import annotations

import copy
import logging
import random
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.config import check_int
from attnlab.data import pipeline
from attnlab.data.errors import DataError
from attnlab.data.fetch import sha256_of
from attnlab.data.parallel import aligned_lines, iter_parallel
from attnlab.data.pipeline import PIECE_BYTES, SAMPLE_BYTES, Encoder, Piece, Pieces, write_shard
from attnlab.data.shards import DTYPES, FORMAT, read_manifest, token_dtype
from attnlab.data.sources import NotUTF8Error, check_source, source_of
from attnlab.data.text import check_text_file
from attnlab.devices import usable_cores
from attnlab.errors import VocabularyError
from attnlab.tokenizers import SPECIALS, BPETokenizer, CharTokenizer, Tokenizer

log = logging.getLogger(__name__)

KIND = "pairs"  # the manifest's "kind": a DIR of sentence pairs, not one token stream
SIDES = ("src", "tgt")
TOKENIZER_KINDS = ("char", "bpe")


# ---- reading the pairs -----------------------------------------------------------------------
@dataclass
class _PairPiece(Piece):
    """Consecutive pairs of one split: ``texts`` holds (source, target) sentences."""

    pairs: int = 0  # len(texts), still known once the texts went to a worker

    def file(self, side: str, ext: str) -> str:
        return f"{self.name}.{side}.{ext}"


class _PairPieces(Pieces[_PairPiece]):
    """Cuts the non-empty pairs of the files into pieces, in an order fixed by the input alone
    (each pair drawn to val with probability ``val_fraction``, seeded), and counts them."""

    piece = _PairPiece

    def __init__(self, files: list[tuple[Path, Path]], val_fraction: float, seed: int,
                 errors: str, piece_bytes: int) -> None:
        super().__init__(piece_bytes)
        self.files, self.val_fraction, self.seed = files, val_fraction, seed
        self.errors = errors
        self.lines, self.skipped = 0, 0  # line pairs read; those with an empty side

    def __iter__(self) -> Iterator[_PairPiece]:
        rng = random.Random(f"{self.seed}:pairs")  # one draw per pair, in order
        for src, tgt in self.files:
            kept = 0
            for s, t in iter_parallel(src, tgt, self.errors):
                self.lines += 1
                if not s or not t:
                    self.skipped += 1
                    continue
                kept += 1
                split = "val" if rng.random() < self.val_fraction else "train"
                self.open(split).pairs += 1
                yield from self.add(split, (s, t), len(s) + len(t))
            if not kept:
                raise DataError(f"parallel files {src} and {tgt} have no pair of non-empty "
                                "lines")
        yield from self.rest()


def sample_pairs(files: Sequence[tuple[str | Path, str | Path]], budget: int = SAMPLE_BYTES,
                 errors: str = "strict") -> list[str]:
    """Sentences to train one joint vocabulary on: the sources of the first non-empty pairs of
    each file pair (up to an equal share of ``budget`` characters), then their targets. A
    corpus smaller than that gives all of it, in the order TranslationTask has always trained
    its tokenizer on (every source, then every target)."""
    share = max(1, budget // max(1, len(files)))
    srcs: list[str] = []
    tgts: list[str] = []
    for src, tgt in files:
        taken = 0
        for s, t in iter_parallel(src, tgt, errors):
            if s and t:
                srcs.append(s)
                tgts.append(t)
                taken += len(s) + len(t)
                if taken >= share:
                    break
    return srcs + tgts


def _build_tokenizer(kind: str | Tokenizer, files: list[tuple[Path, Path]], vocab_size: int,
                     pre_tokenizer: str, errors: str) -> Tokenizer:
    """The given tokenizer, or one trained as ``train_tokenizer`` of a translation run trains
    it: a joint BPE on a sample of both sides, or every character of the pairs (one pass)."""
    if isinstance(kind, Tokenizer):
        return kind
    if kind == "bpe":
        return BPETokenizer.train(sample_pairs(files, SAMPLE_BYTES, errors), vocab_size,
                                  pre_tokenizer)
    chars: set[str] = set()
    for src, tgt in files:
        for s, t in iter_parallel(src, tgt, errors):
            if s and t:
                chars.update(s)
                chars.update(t)
    return CharTokenizer(sorted(chars), SPECIALS)


def _check_tokenizer(tok: Tokenizer) -> None:
    missing = [n for n in ("pad", "bos", "eos") if getattr(tok, f"{n}_id") is None]
    if missing:
        raise DataError(f"translation pairs need a tokenizer with <pad>, <bos> and <eos>; this "
                        f"{tok.kind} tokenizer has no " + ", ".join(f"<{n}>" for n in missing))


def _tokenizer_digest(tok: Tokenizer) -> str:
    return pipeline.cache_key(tok.to_dict())


# ---- tokenizing (in worker processes) --------------------------------------------------------
def _encode_pairs(tokenizer: Tokenizer, piece: _PairPiece, *, src_add_special: bool,
                  dtype: str, max_len: int) -> tuple[np.ndarray, ...]:
    """Source ids and offsets, target ids and offsets of one piece (an ``Encoder``'s work):
    ``encode(s, add_special=src_add_special)`` and ``encode(t, True)``, pairs with a side
    longer than ``max_len`` (> 0) left out."""
    srcs = tokenizer.encode_batch([s for s, _ in piece.texts])
    tgts = tokenizer.encode_batch([t for _, t in piece.texts])
    bos = np.array([tokenizer.bos_id], dtype=np.uint32)
    eos = np.array([tokenizer.eos_id], dtype=np.uint32)
    src_parts: list[np.ndarray] = []
    tgt_parts: list[np.ndarray] = []
    src_len: list[int] = []
    tgt_len: list[int] = []
    for s, t in zip(srcs, tgts):
        ns, nt = len(s) + 2 * src_add_special, len(t) + 2
        if max_len and (ns > max_len or nt > max_len):
            continue
        src_parts += [bos, s, eos] if src_add_special else [s]
        tgt_parts += [bos, t, eos]
        src_len.append(ns)
        tgt_len.append(nt)
    return (*_flat(src_parts, src_len, dtype), *_flat(tgt_parts, tgt_len, dtype))


def _flat(parts: list[np.ndarray], lengths: list[int], dtype: str
          ) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``parts`` make, one after another as ``dtype``, and their (n + 1,) offsets."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pipeline.joined(parts, dtype), offsets


# ---- prepare ---------------------------------------------------------------------------------
def _files(src_files: Sequence[str | Path] | str | Path,
           tgt_files: Sequence[str | Path] | str | Path) -> list[tuple[Path, Path]]:
    srcs = [src_files] if isinstance(src_files, (str, Path)) else list(src_files)
    tgts = [tgt_files] if isinstance(tgt_files, (str, Path)) else list(tgt_files)
    if not srcs or len(srcs) != len(tgts):
        raise DataError(f"give one target file per source file (line-aligned in pairs), got "
                        f"{len(srcs)} source and {len(tgts)} target files")
    return [(Path(s), Path(t)) for s, t in zip(srcs, tgts)]


def prepare_pairs(src_files: Sequence[str | Path] | str | Path,
                  tgt_files: Sequence[str | Path] | str | Path, out: str | Path,
                  tokenizer: str | Tokenizer = "bpe", *, vocab_size: int = 8000,
                  pre_tokenizer: str = "byte_level", src_add_special: bool = False,
                  val_fraction: float = 0.0, seed: int = 1337, workers: int = 0,
                  errors: str = "strict", max_len: int = 0, progress: bool = False,
                  piece_bytes: int = PIECE_BYTES) -> Path:
    """Tokenize line-aligned parallel files into the prepared pairs DIR ``out``; its path.

    Args:
        src_files: a file or a list of them; line i of ``src_files[k]`` translates line i of
            ``tgt_files[k]``. Plain text, ``.gz`` or ``.zst``.
        tgt_files: the target files, one per source file, in the same order.
        out: the DIR to write; an unfinished one of the same arguments is resumed.
        tokenizer: a tokenizer with <pad>, <bos> and <eos> (a run's), ``"bpe"`` (one joint
            BPE of ``vocab_size`` ids and ``pre_tokenizer``, trained on at most
            ``SAMPLE_BYTES`` of both sides) or ``"char"`` (every character of the pairs).
        src_add_special: wrap source ids in bos ... eos (``data.src_add_special``).
        val_fraction: the share of pairs that goes to val (seeded by ``seed``).
        workers: tokenizing processes; 0 = one per core.
        errors: ``"strict"`` (an undecodable byte is an error) or ``"replace"``.
        max_len: leave out pairs with a side longer than this many ids; 0 keeps every pair.
        progress: show a progress bar on stderr.

    Returns:
        ``out``, laid out as::

            DIR/prepared.json         the manifest (format attnlab-tokens/1, "kind": "pairs")
            DIR/tokenizer.json        the tokenizer that made the ids
            DIR/train/000000.src.bin  the source ids of the piece's pairs, one after another,
                                      little-endian uint16 (vocabulary <= 65,536) or uint32
            DIR/train/000000.src.idx  int64 offsets, n + 1: pair i is ids[off[i]:off[i + 1]]
            DIR/train/000000.tgt.bin  the target ids ([bos] ... [eos]) and their offsets
            DIR/train/000000.tgt.idx

        The ids are ``tok.encode(s, add_special=src_add_special)`` and ``tok.encode(t, True)``;
        pairs with an empty side are skipped, as
        :func:`~attnlab.data.parallel.read_parallel` does. Each file is written atomically and
        the manifest last: a killed prepare leaves no DIR that looks complete, and the same
        call again keeps the finished shards.
    """
    pipeline.check_args(val_fraction, seed, workers, errors, vocab_size)
    check_int("max_len", max_len, 0)
    out = Path(out)
    # (bad input leaves nothing behind; a full disk keeps the finished shards)
    with pipeline.removed_on_bad_input(out):
        try:
            return _prepare_pairs(_files(src_files, tgt_files), out, tokenizer,
                                  vocab_size=vocab_size, pre_tokenizer=pre_tokenizer,
                                  src_add_special=bool(src_add_special),
                                  val_fraction=val_fraction, seed=seed, workers=workers,
                                  errors=errors, max_len=max_len, progress=progress,
                                  piece_bytes=piece_bytes)
        except VocabularyError as e:  # the tokenizer cannot encode a sentence
            raise DataError(f"the pairs cannot be encoded: {str(e).split('. ')[0]}; use a "
                            "tokenizer whose vocabulary covers them") from None


def _prepare_pairs(files: list[tuple[Path, Path]], out: Path, tokenizer: str | Tokenizer, *,
                   vocab_size: int, pre_tokenizer: str, src_add_special: bool,
                   val_fraction: float, seed: int, workers: int, errors: str, max_len: int,
                   progress: bool, piece_bytes: int) -> Path:
    """:func:`prepare_pairs` of checked arguments: plan, tokenizer, shards, manifest last."""
    given = _given_tokenizer(tokenizer)
    lines = [aligned_lines(s, t) for s, t in files]  # every file checked before any work
    described = [{"src": _describe(s), "tgt": _describe(t), "lines": n}
                 for (s, t), n in zip(files, lines)]
    plan = {"kind": KIND, "sources": described, "val_fraction": val_fraction, "seed": seed,
            "errors": errors, "max_len": max_len, "piece_bytes": piece_bytes,
            "src_add_special": src_add_special,
            "tokenizer": (given.kind if given else tokenizer if tokenizer == "char"
                          else [tokenizer, vocab_size, pre_tokenizer]),
            "given": _tokenizer_digest(given) if given else None}
    if pipeline.start(out, plan):
        return out
    tok = pipeline.kept_tokenizer(out, lambda: given or _build_tokenizer(
        tokenizer, files, vocab_size, pre_tokenizer, errors))
    _check_tokenizer(tok)
    dtype = token_dtype(tok.vocab_size)
    pieces = _PairPieces(files, val_fraction, seed, errors, piece_bytes)
    work = partial(_encode_pairs, src_add_special=src_add_special, dtype=dtype, max_len=max_len)
    total = sum(d[side]["bytes"] for d in described for side in SIDES)
    encoder = Encoder(tok, workers or usable_cores(), work)
    shards = pipeline.write_pieces(encoder, pieces, partial(_finished, out, dtype=dtype),
                                   partial(_write, out), progress=progress, total_bytes=total)
    if not any(s["pairs"] for s in shards["train"]):
        raise DataError("no pair is left for the train split (" + ", ".join(
            f"{s} / {t}" for s, t in files) + f"; val_fraction={val_fraction}, "
            f"max_len={max_len}); allowed: files with at least one pair that fits")
    return pipeline.finish(out, _manifest(plan, pieces, tok, dtype, shards))


def _given_tokenizer(tokenizer: str | Tokenizer) -> Tokenizer | None:
    """``tokenizer`` when it is a checked tokenizer, None for a kind to train."""
    if isinstance(tokenizer, Tokenizer):
        _check_tokenizer(tokenizer)
        return tokenizer
    if tokenizer not in TOKENIZER_KINDS:
        raise DataError(f"tokenizer {tokenizer!r} is not allowed for translation pairs: one of "
                        f"{', '.join(TOKENIZER_KINDS)} or a tokenizer with <pad>, <bos>, <eos>")
    return None


def _write(out: Path, piece: _PairPiece, arrays: tuple[np.ndarray, ...]
           ) -> tuple[dict[str, Any], int]:
    """Write the four files of ``piece``'s shard, the offsets last (the mark of a finished
    shard); its record and token count."""
    src, src_off, tgt, tgt_off = arrays
    for side, ids in (("src", src), ("tgt", tgt)):
        write_shard(out / piece.file(side, "bin"), ids)
    for side, offsets in (("src", src_off), ("tgt", tgt_off)):
        write_shard(out / piece.file(side, "idx"), offsets)
    return _record(piece, len(src_off) - 1, src.size, tgt.size), int(src.size + tgt.size)


def _manifest(plan: dict[str, Any], pieces: _PairPieces, tok: Tokenizer, dtype: str,
              shards: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The ``prepared.json`` of a finished DIR: the plan, the counts, the tokenizer's ids."""
    return {
        "format": FORMAT, "kind": KIND, "dtype": dtype, "plan": plan,
        "sources": plan["sources"], "val_fraction": plan["val_fraction"], "seed": plan["seed"],
        "src_add_special": plan["src_add_special"], "max_len": plan["max_len"],
        "lines": pieces.lines, "skipped_empty": pieces.skipped,
        "tokenizer": {"kind": tok.kind, "vocab_size": tok.vocab_size, "pad_id": tok.pad_id,
                      "bos_id": tok.bos_id, "eos_id": tok.eos_id},
        "splits": {split: {"shards": s, **{key: sum(x[key] for x in s) for key in
                                           ("pairs", "src_tokens", "tgt_tokens", "dropped")}}
                   for split, s in shards.items()},
    }


def _describe(path: Path) -> dict[str, Any]:
    return {"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha256_of(path)}


def _record(piece: _PairPiece, pairs: int, src_tokens: int, tgt_tokens: int) -> dict[str, Any]:
    """A shard's entry in the manifest; ``dropped``: its pairs longer than ``max_len``."""
    return {"name": piece.name, "pairs": pairs, "src_tokens": src_tokens,
            "tgt_tokens": tgt_tokens, "dropped": piece.pairs - pairs}


def _finished(out: Path, piece: _PairPiece, dtype: str) -> dict[str, Any] | None:
    """The record of a piece whose four files are all there and agree, else None."""
    size = np.dtype(dtype).itemsize
    counts: dict[str, int] = {}
    for side in SIDES:
        idx, ids = out / piece.file(side, "idx"), out / piece.file(side, "bin")
        if not (idx.is_file() and ids.is_file()):
            return None
        n_idx, n_ids = idx.stat().st_size, ids.stat().st_size
        if n_idx < 8 or n_idx % 8 or n_ids % size:
            return None
        last = np.fromfile(idx, dtype="<i8", count=1, offset=n_idx - 8)
        if int(last[0]) != n_ids // size:
            return None
        counts[side], counts[f"{side}_tokens"] = n_idx // 8 - 1, n_ids // size
    if counts["src"] != counts["tgt"]:
        return None
    return _record(piece, counts["src"], counts["src_tokens"], counts["tgt_tokens"])


# ---- the cache of raw files ------------------------------------------------------------------
def cached_pairs_dir(src_file: str | Path, tgt_file: str | Path, cache_dir: str | Path,
                     tokenizer: str | Tokenizer = "bpe", *, vocab_size: int = 8000,
                     pre_tokenizer: str = "byte_level", src_add_special: bool = False) -> Path:
    """Where :func:`prepare_pairs_cached` keeps the DIR of these files and settings (made or
    not): under ``cache_dir/prepared/``, keyed by both files' contents and the tokenizer."""
    src, tgt = check_text_file(src_file, "source file"), check_text_file(tgt_file, "target file")
    settings = {"tokenizer": _tokenizer_digest(tokenizer) if isinstance(tokenizer, Tokenizer)
                else tokenizer, "vocab_size": vocab_size, "pre_tokenizer": pre_tokenizer,
                "sample_bytes": SAMPLE_BYTES, "src_add_special": bool(src_add_special)}
    key = pipeline.cache_key(settings, 12)
    both = pipeline.cache_key(sha256_of(src) + sha256_of(tgt), 16)
    return Path(cache_dir) / "prepared" / f"{src.name}-{tgt.name}-pairs-{both}-{key}"


def prepare_pairs_cached(src_file: str | Path, tgt_file: str | Path, cache_dir: str | Path,
                         tokenizer: str | Tokenizer = "bpe", *, vocab_size: int = 8000,
                         pre_tokenizer: str = "byte_level",
                         src_add_special: bool = False) -> Path:
    """The prepared pairs DIR of two raw files under ``cache_dir/prepared/``, made once.

    A second call reads the files only to hash them and tokenizes nothing; changed files get a
    new DIR. Processes that ask at once (the ranks of a distributed run) wait for the one that
    prepares it.
    """
    out = cached_pairs_dir(src_file, tgt_file, cache_dir, tokenizer, vocab_size=vocab_size,
                           pre_tokenizer=pre_tokenizer, src_add_special=src_add_special)

    def make() -> None:
        src, tgt = Path(src_file), Path(tgt_file)
        _check_files(src, tgt)  # before a word is said
        log.info("preparing %s and %s once into %s", src_file, tgt_file, out)
        prepare_pairs([src], [tgt], out, tokenizer, vocab_size=vocab_size,
                      pre_tokenizer=pre_tokenizer, src_add_special=src_add_special,
                      workers=1 if pipeline.one_process_suffices([src, tgt]) else 0)

    return pipeline.cached(out, make)


def _check_files(src: Path, tgt: Path) -> None:
    """Bad raw pairs stop here, in one line: files of unequal length, or not UTF-8 text."""
    aligned_lines(src, tgt)
    for path in (src, tgt):
        try:
            check_source(source_of(path, ".txt"))
        except NotUTF8Error as e:
            raise DataError(
                f"{e.fact}; convert it to UTF-8, or prepare the pairs with `attnlab data prepare "
                f"{shlex.quote(str(src))} --target {shlex.quote(str(tgt))} --errors replace "
                "--out DIR` (U+FFFD in its place) and give DIR as data.path") from None


# ---- reading a prepared DIR ------------------------------------------------------------------
def read_pairs_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the prepared pairs DIR ``path``; one :class:`DataError` when it is not
    one (a language model's token DIR is named as such)."""
    manifest = read_manifest(path)
    if manifest.get("kind") != KIND:
        raise DataError(f"{path} is a prepared token dir of documents (for a language model), "
                        "not of sentence pairs; prepare translation pairs with `attnlab data "
                        "prepare SRC --target TGT`")
    return manifest


def is_prepared_pairs(path: str | Path) -> bool:
    """True when ``path`` is a finished prepared pairs DIR."""
    try:
        read_pairs_manifest(path)
    except DataError:
        return False
    return True


def _read_rows(path: Path, dtype: np.dtype, lo: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """Rows ``[lo[k], hi[k])`` of the array file ``path`` as int64, copied out of a map that
    is closed again (no page of the corpus stays in this process)."""
    if not int((hi - lo).sum()):
        return [np.zeros(0, np.int64) for _ in lo]
    mm = np.memmap(path, dtype=dtype, mode="r")
    rows = [np.array(mm[a:b], dtype=np.int64) for a, b in zip(lo.tolist(), hi.tolist())]
    del mm
    return rows


class PairShards:
    """One split of a prepared pairs DIR: ``len(self)`` pairs of token ids.

    Args:
        path: the prepared pairs DIR.
        split: ``"train"`` or ``"val"``.

    ``lengths()`` gives the source and target length of every pair from the offsets alone;
    ``pair(i)`` / ``pairs(indices)`` read only those rows. ``select(indices)`` is a view of
    some pairs (training leaves out the ones longer than the model's ``max_len``).
    """

    def __init__(self, path: str | Path, split: str) -> None:
        self.path = Path(path)
        manifest = read_pairs_manifest(self.path)
        if split not in manifest["splits"]:
            raise DataError(f"unknown split {split!r} of {self.path}; it has "
                            + ", ".join(manifest["splits"]))
        self.split = split
        self.dtype = np.dtype(DTYPES[manifest["dtype"]]).newbyteorder("<")
        self.src_add_special = bool(manifest["src_add_special"])
        shards = manifest["splits"][split]["shards"]
        self.names = [s["name"] for s in shards]
        counts = [int(s["pairs"]) for s in shards]
        for k, s in enumerate(shards):
            for side in SIDES:
                for f, n in ((self._file(k, side, "idx"), (counts[k] + 1) * 8),
                             (self._file(k, side, "bin"),
                              int(s[f"{side}_tokens"]) * self.dtype.itemsize)):
                    if not f.is_file() or f.stat().st_size != n:
                        raise DataError(f"shard file {f} is missing or not the size its "
                                        f"manifest records ({n} bytes); prepare the data again")
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])  # (n_shards + 1,)
        self.rows: np.ndarray | None = None  # a selection: the split's pair of each index

    def _file(self, shard: int, side: str, ext: str) -> Path:
        return self.path / f"{self.names[shard]}.{side}.{ext}"

    def __len__(self) -> int:
        return int(self.starts[-1]) if self.rows is None else len(self.rows)

    def _split_rows(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The split's pair of each index (of this view), checked."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise DataError(f"pair {bad} is outside the {self.split} split of {len(self)} pairs")
        return idx if self.rows is None else self.rows[idx]

    def _offsets(self, shard: int, side: str) -> np.ndarray:
        mm = np.memmap(self._file(shard, side, "idx"), dtype="<i8", mode="r")
        out = np.array(mm, dtype=np.int64)
        del mm
        return out

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Source and target lengths, (len(self),) int64 each, read from the offsets alone."""
        out = []
        for side in SIDES:
            parts = [np.diff(self._offsets(k, side)) for k in range(len(self.names))]
            n = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            out.append(n if self.rows is None else n[self.rows])
        return out[0], out[1]

    def pairs(self, indices: Sequence[int] | np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(source ids, target ids)`` of each index, int64 arrays, in the order asked; only
        those rows are read."""
        rows = self._split_rows(indices)
        shard = np.searchsorted(self.starts, rows, side="right") - 1
        got: dict[str, list[np.ndarray | None]] = {side: [None] * len(rows) for side in SIDES}
        for k in np.unique(shard).tolist():
            where = np.flatnonzero(shard == k)
            local = rows[where] - self.starts[k]
            for side in SIDES:
                mm = np.memmap(self._file(k, side, "idx"), dtype="<i8", mode="r")
                lo, hi = np.array(mm[local]), np.array(mm[local + 1])
                del mm
                for w, ids in zip(where.tolist(),
                                  _read_rows(self._file(k, side, "bin"), self.dtype, lo, hi)):
                    got[side][w] = ids
        return list(zip(got["src"], got["tgt"]))

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source ids, target ids)`` of pair ``i``."""
        return self.pairs([i])[0]

    def select(self, indices: Sequence[int] | np.ndarray) -> PairShards:
        """A view of the pairs ``indices`` (of this view), in that order."""
        view = copy.copy(self)
        view.rows = self._split_rows(indices)
        return view
