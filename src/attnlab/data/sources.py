"""Reading the documents of corpus files of any size, one at a time, in their own formats.

A *source* is a file: ``.jsonl`` (one JSON object per line), ``.json`` (an array of objects,
the one format read whole), ``.parquet``, ``.csv`` or ``.tsv`` (one row per document), or text
of any other name, ``.txt``, ``.py``, ``.md`` ... (one document), each plain or ``.gz`` /
``.zst``. Text is UTF-8: an undecodable byte is a :class:`DataError` naming the file and the
offset, unless ``errors="replace"`` (U+FFFD). :func:`scan` finds the sources of folders and
glob patterns, skipping binary files.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.data.errors import DataError, DataFileNotFoundError
from attnlab.data.shards import is_token_dir

FORMATS = (".txt", ".jsonl", ".json", ".parquet", ".csv", ".tsv")
COMPRESSIONS = (".gz", ".zst")
ERRORS = ("strict", "replace")
BLOCK = 1 << 22  # bytes read at a time from a text stream
SNIFF = 1 << 16  # bytes of a folder's file that tell text from binary


def _pyarrow():
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - a core dependency
        raise DataError("reading corpora needs pyarrow: pip install pyarrow") from None
    return pa


@dataclass(frozen=True)
class Source:
    """One corpus file: its path, format (``.txt`` ...) and compression (``""`` or ``.gz`` ...)."""

    path: Path
    format: str
    compression: str

    @property
    def is_text(self) -> bool:
        """A plain-text file: one long document (the others hold one document per row)."""
        return self.format == ".txt"

    def open(self):
        """A binary stream of the (decompressed) bytes."""
        if not self.compression:
            return open(self.path, "rb")  # noqa: SIM115 (the caller closes it)
        return _pyarrow().input_stream(str(self.path), compression="detect")


def source_of(path: Path, default: str = "") -> Source:
    """The :class:`Source` of ``path`` by its name; a :class:`DataError` for another format
    unless ``default`` names the format to assume (``".txt"``)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else ""
    fmt = suffixes[-1] if suffixes else ""
    if fmt not in FORMATS and default:
        fmt = default
    if fmt not in FORMATS:
        raise DataError(f"{path}: cannot read files of this kind; allowed: "
                        + ", ".join(FORMATS) + " (each may end in .gz or .zst)")
    return Source(path, fmt, compression)


@dataclass
class Found:
    """What :func:`scan` found: the sources to read, and the files of folders and glob
    patterns it left out because they hold no text (``binary``: a NUL byte, or not UTF-8,
    in their first ``SNIFF`` bytes) or nothing (``empty``)."""

    sources: list[Source]
    binary: list[Path] = field(default_factory=list)
    empty: list[Path] = field(default_factory=list)

    def skipped_line(self) -> str:
        """One line that says what was skipped, naming a few ("" when nothing was)."""
        parts = []
        for files, what in ((self.binary, "binary file{} (not UTF-8 text: {})"),
                            (self.empty, "empty file{} ({})")):
            if files:
                names = ", ".join(str(f) for f in files[:3]) + (", ..." if len(files) > 3 else "")
                parts.append(f"{len(files)} " + what.format("s" if len(files) > 1 else "", names))
        return "skipped " + " and ".join(parts) if parts else ""


def find_sources(specs: Sequence[str | Path] | str | Path, include: Sequence[str] = (),
                 exclude: Sequence[str] = (), errors: str = "strict") -> list[Source]:
    """The corpus files that ``specs`` name (see :func:`scan`)."""
    return scan(specs, include, exclude, errors).sources


def scan(specs: Sequence[str | Path] | str | Path, include: Sequence[str] = (),
         exclude: Sequence[str] = (), errors: str = "strict") -> Found:
    """The corpus files that ``specs`` name: files, folders and glob patterns (expanded here,
    sorted). Each file once, in the order given.

    A file named on its own is read in its format, and as text when its name is of no format
    above. The files of a folder (every one below it; hidden files and folders such as
    ``.git`` left out) and of a pattern are filtered by ``include`` and ``exclude`` (glob
    patterns matched against a file's name and its path below the folder; ``*`` also matches
    ``/``; an ``exclude`` pattern that matches a folder leaves out all below it), then read in
    their format (``.jsonl`` ...) or as text when their first ``SNIFF`` bytes are text: a file
    with a NUL byte there, or (``errors="strict"``) a byte that is not UTF-8, is binary and
    skipped, and so is an empty one.
    """
    if isinstance(specs, (str, Path)):
        specs = [specs]
    if not specs:
        raise DataError("no source given: name files, folders or glob patterns")
    for option, patterns in (("--include", include), ("--exclude", exclude)):
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern.strip():
                raise DataError(f"{option} {pattern!r} is not allowed: a glob pattern such as "
                                "'*.py' or 'docs/*'")
    found = Found([])
    seen: set[Path] = set()
    for spec in specs:
        path, skipped = Path(spec), Found([])  # (what this spec skips)
        if path.is_dir():
            picked = _pick(_walk(path), path, include, exclude, errors, skipped)
            if not picked:
                raise DataError(f"folder {path} holds no file attnlab can read"
                                + _why_none(skipped, include, exclude))
        elif path.exists():
            picked = [source_of(path, ".txt")]
        elif glob.has_magic(str(spec)):
            matches = sorted(Path(p) for p in glob.glob(str(spec), recursive=True))
            files = [f for m in matches if not is_token_dir(m)  # (an --out it matches)
                     for f in (_walk(m) if m.is_dir() else [m])]
            if not files:
                raise DataFileNotFoundError(f"no file matches the pattern {spec} (relative to "
                                            f"{Path.cwd()}); allowed: a pattern that matches "
                                            "files, such as 'mytext/*.py' or 'docs/**/*.md'")
            picked = _pick(files, None, include, exclude, errors, skipped)
            if not picked:
                raise DataError(f"the pattern {spec} matches no file attnlab can read"
                                + _why_none(skipped, include, exclude))
        else:
            raise DataFileNotFoundError(f"source {path} does not exist")
        found.binary += skipped.binary
        found.empty += skipped.empty
        for source in picked:
            if source.path not in seen:
                seen.add(source.path)
                found.sources.append(source)
    return found


def _why_none(found: Found, include: Sequence[str], exclude: Sequence[str]) -> str:
    skipped = found.skipped_line()
    filters = " ".join([f"--include {shlex.quote(p)}" for p in include]
                       + [f"--exclude {shlex.quote(p)}" for p in exclude])
    return ((f" ({skipped})" if skipped else "") + (f" after {filters}" if filters else "")
            + "; allowed: UTF-8 text files of any name, and " + ", ".join(FORMATS[1:])
            + " (each may end in .gz or .zst)")


def _walk(folder: Path) -> list[Path]:
    """Every file below ``folder``, sorted; hidden files and folders (``.git``) and prepared
    DIRs (an earlier ``--out``: token ids, not text) left out."""
    if is_token_dir(folder):
        raise DataError(f"folder {folder} is a prepared data dir (token ids, not text): train "
                        f"on it with --set data.path={folder}, or name the text files it was "
                        "made from")
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and not is_token_dir(Path(root) / d))
        files += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
    return sorted(f for f in files if f.is_file())


def _matches(path: Path, base: Path | None, patterns: Sequence[str], folders: bool) -> bool:
    """Does one of ``patterns`` match ``path``'s name or its path below ``base`` (with
    ``folders``: or those of a folder above it, up to ``base``)?"""
    rel = path.relative_to(base) if base is not None else path
    names = [rel.name, rel.as_posix()]
    if folders:
        names += [p.name for p in rel.parents if p.name] + [
            p.as_posix() for p in rel.parents if p.name]
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


def _pick(files: list[Path], base: Path | None, include: Sequence[str],
          exclude: Sequence[str], errors: str, found: Found) -> list[Source]:
    """The sources among the files of a folder or a pattern (see :func:`scan`)."""
    picked = []
    for f in files:
        if include and not _matches(f, base, include, folders=False):
            continue
        if exclude and _matches(f, base, exclude, folders=True):
            continue
        source = source_of(f, ".txt")
        if not source.is_text:
            picked.append(source)
            continue
        kind = _sniff(source, errors)
        if kind == "text":
            picked.append(source)
        else:
            getattr(found, kind).append(f)
    return picked


def _sniff(source: Source, errors: str) -> str:
    """``"text"``, ``"binary"`` or ``"empty"``: what the first ``SNIFF`` bytes of a file
    found in a folder or by a pattern hold (git tells binary files the same way)."""
    try:
        with source.open() as f:
            head = f.read(SNIFF)
            whole = len(head) < SNIFF or not f.read(1)
    except (OSError, ValueError) as e:
        if source.compression:  # a .gz / .zst that does not decompress: not text
            return "binary"
        raise DataError(f"{source.path} cannot be read ({getattr(e, 'strerror', e)}); "
                        "allowed: files you may read") from None
    if b"\0" in head:
        return "binary"
    if errors == "strict":
        cut = len(head) if whole else _utf8_boundary(head)
        try:
            head[:cut].decode("utf-8")
        except UnicodeDecodeError:
            return "binary"
    if whole and not head.decode("utf-8", "replace").strip(" \t\r\n\ufeff"):
        return "empty"
    return "text"


class NotUTF8Error(DataError):
    """A byte that is not UTF-8: ``fact`` says where; the message adds what to do, which a
    caller that knows its command may say otherwise."""

    def __init__(self, fact: str, hint: str) -> None:
        super().__init__(f"{fact}; {hint}")
        self.fact, self.hint = fact, hint

    def __reduce__(self):  # (raised in a worker process, it is pickled back)
        return type(self), (self.fact, self.hint)


def check_source(source: Source, text_field: str = "text") -> None:
    """Read a source through once, as a check before any work is started: a
    :class:`NotUTF8Error` at its first byte that is not UTF-8, a :class:`DataError` at its
    first bad row, or when it holds no text."""
    if not source.is_text:
        if not sum(1 for _ in documents(source, text_field)):  # every row read
            raise DataError(f"source {source.path} holds no document")
        return
    empty = True
    for block in text_blocks(source):
        empty = empty and not block.strip()
    if empty:
        raise DataError(f"source {source.path} is empty (or only whitespace); expected UTF-8 "
                        "text")


class _Decoder:
    """UTF-8 decoding of a byte stream block by block, knowing each byte's offset."""

    def __init__(self, source: Source, errors: str, offset: int = 0) -> None:
        self.source, self.errors = source, errors  # (offset: of the first byte it is given)
        self.offset, self.carry, self.first = offset, b"", offset == 0

    def __call__(self, data: bytes, final: bool = False) -> str:
        data = self.carry + data
        cut = len(data) if final else _utf8_boundary(data)
        self.carry = data[cut:]
        chunk, start = data[:cut], self.offset
        self.offset += cut
        if self.first and chunk:
            self.first = False
            if chunk.startswith(b"\xef\xbb\xbf"):  # a byte-order mark (Notepad, Excel) dropped
                chunk, start = chunk[3:], start + 3
        try:
            return chunk.decode("utf-8", self.errors)
        except UnicodeDecodeError as e:
            raise NotUTF8Error(f"{self.source.path} is not UTF-8 text: undecodable byte "
                               f"0x{chunk[e.start]:02x} at byte offset {start + e.start}"
                               f"{' (decompressed)' if self.source.compression else ''}",
                               "convert it to UTF-8, or pass --errors replace to read it "
                               "with U+FFFD in its place") from None


def _utf8_boundary(data: bytes) -> int:
    """The end of the last whole UTF-8 character in ``data`` (a character split across
    blocks waits for the next block)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return len(data)
        if b >= 0xC0:  # a lead byte: is its character complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def text_blocks(source: Source, errors: str = "strict") -> Iterator[str]:
    """The decoded text of a ``.txt`` source in blocks of about ``BLOCK`` bytes."""
    for text, _ in text_blocks_at(source, errors):
        yield text


def text_blocks_at(source: Source, errors: str = "strict") -> Iterator[tuple[str, int]]:
    """:func:`text_blocks`, each block with the byte offset where it ends (in the
    decompressed stream), so a caller can place a byte position without encoding again."""
    decode = _Decoder(source, errors)
    with source.open() as f:
        while True:
            data = f.read(BLOCK)
            if not data:
                break
            text = decode(data)
            if text:
                yield text, decode.offset
    tail = decode(b"", final=True)
    if tail:
        yield tail, decode.offset


def text_range(source: Source, start: int, end: int, errors: str = "strict") -> str:
    """The text of bytes ``[start, end)`` of a plain (not compressed) text source, whole
    characters: an undecodable byte is named by its offset in the file, and a byte-order mark
    at byte 0 is dropped, as :func:`text_blocks` does."""
    decode = _Decoder(source, errors, start)
    with source.open() as f:
        f.seek(start)
        return decode(f.read(end - start), final=True)


def holds_text(source: Source, errors: str = "strict") -> bool:
    """Does a ``.txt`` source hold more than whitespace? Read ``SNIFF`` bytes at a time up to
    its first other character (a file of whitespace only: through)."""
    decode = _Decoder(source, errors)
    with source.open() as f:
        while data := f.read(SNIFF):
            if decode(data).strip():
                return True
    return bool(decode(b"", final=True).strip())


def text_size(source: Source) -> int:
    """Bytes of a source once decompressed (a first pass for a compressed file)."""
    if not source.compression:
        return source.path.stat().st_size
    n = 0
    with source.open() as f:
        while data := f.read(BLOCK):
            n += len(data)
    return n


def documents(source: Source, text_field: str = "text", errors: str = "strict") -> Iterator[str]:
    """The documents of a source, one string each (a ``.txt`` source: its whole text, which
    :func:`text_blocks` reads in parts instead)."""
    if source.is_text:
        yield "".join(text_blocks(source, errors))
    elif source.format == ".jsonl":
        yield from _jsonl(source, text_field, errors)
    elif source.format == ".json":
        yield from _json(source, text_field, errors)
    elif source.format == ".parquet":
        yield from _parquet(source, text_field, errors)
    else:
        yield from _csv(source, text_field, errors)


# training reads the field or column "text"; `attnlab data prepare` reads another
ANOTHER_FIELD = ("name the text {what} with `attnlab data prepare --text-field NAME` (and train "
                 "on the folder it prepares)")


def _field(row: object, field: str, where: str) -> str:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with a {field!r} field, got "
                        f"{type(row).__name__}")
    if field not in row:
        raise DataError(f"{where}: no field {field!r} (it has "
                        + ", ".join(repr(k) for k in list(row)[:10])
                        + f"); {ANOTHER_FIELD.format(what='field')}")
    value = row[field]
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} is {type(value).__name__}, not text")
    return value


def _jsonl(source: Source, field: str, errors: str) -> Iterator[str]:
    decode, offset, n = _Decoder(source, errors), 0, 0
    with source.open() as f:
        pending = b""
        while True:
            data = f.read(BLOCK)
            lines = (pending + data).split(b"\n")
            pending = lines.pop() if data else b""
            for raw in lines:
                n += 1
                decode.offset = offset
                offset += len(raw) + 1
                line = decode(raw, final=True).strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{source.path} line {n}: not JSON ({e.msg}); .jsonl holds "
                                    "one JSON object per line") from None
                yield _field(row, field, f"{source.path} line {n}")
            if not data:
                break


def _json(source: Source, field: str, errors: str) -> Iterator[str]:
    with source.open() as f:
        text = _Decoder(source, errors)(f.read(), final=True)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{source.path}: not JSON ({e.msg} at line {e.lineno}); .json holds "
                        "an array of objects (or use .jsonl, one object per line)") from None
    if isinstance(rows, dict):
        rows = [rows]
    if not isinstance(rows, list):
        raise DataError(f"{source.path}: expected an array of objects, got "
                        f"{type(rows).__name__}")
    for i, row in enumerate(rows):
        yield _field(row, field, f"{source.path} item {i}")


def _column(names: list[str], field: str, source: Source) -> None:
    if field not in names:
        raise DataError(f"{source.path}: no column {field!r} (it has "
                        + ", ".join(repr(c) for c in names[:20])
                        + f"); {ANOTHER_FIELD.format(what='column')}")


def _values(source: Source, batches, field: str, errors: str) -> Iterator[str]:
    """Decode the binary values of ``field`` batch by batch, naming a bad row."""
    row = 0
    for batch in batches:
        for value in batch.column(field).to_pylist():
            row += 1
            if value is None:
                continue
            try:
                yield value.decode("utf-8", errors)
            except UnicodeDecodeError as e:
                raise DataError(f"{source.path} row {row}: column {field!r} is not UTF-8 text "
                                f"(undecodable byte 0x{value[e.start]:02x} at byte {e.start} of "
                                "the value); convert it, or pass --errors replace") from None


def _parquet(source: Source, field: str, errors: str) -> Iterator[str]:
    pa = _pyarrow()
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(source.open() if source.compression else str(source.path))
    except pa.ArrowException as e:
        raise DataError(f"{source.path}: not a Parquet file ({e})") from None
    _column(pf.schema_arrow.names, field, source)
    batches = (b.cast(pa.schema([pa.field(field, pa.binary())]))
               for b in pf.iter_batches(columns=[field], batch_size=4096))
    yield from _values(source, batches, field, errors)


def _csv(source: Source, field: str, errors: str) -> Iterator[str]:
    pa = _pyarrow()
    import pyarrow.csv as pcsv

    tsv = source.format == ".tsv"
    parse = pcsv.ParseOptions(delimiter="\t" if tsv else ",", quote_char=False if tsv else '"',
                              newlines_in_values=not tsv)
    try:
        with source.open() as f:  # the header's names, from a first small block
            names = pcsv.open_csv(f, parse_options=parse,
                                  read_options=pcsv.ReadOptions(block_size=1 << 16)).schema.names
        _column(names, field, source)
        reader = pcsv.open_csv(
            source.open(), parse_options=parse,
            read_options=pcsv.ReadOptions(block_size=BLOCK),
            convert_options=pcsv.ConvertOptions(include_columns=[field],
                                                column_types={field: pa.binary()}))
        yield from _values(source, reader, field, errors)
    except pa.ArrowException as e:
        raise DataError(f"{source.path}: cannot be read as {source.format[1:].upper()} ({e})"
                        ) from None
