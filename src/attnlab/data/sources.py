"""Reading the documents of corpus files of any size, one at a time, in their own formats.

A *source* is a file: ``.txt`` (one document), ``.jsonl`` (one JSON object per line), ``.json``
(an array of objects, the one format read whole), ``.parquet``, ``.csv`` or ``.tsv`` (one row
per document), each plain or ``.gz`` / ``.zst``. Text is UTF-8: an undecodable byte is a
:class:`DataError` naming the file and the offset, unless ``errors="replace"`` (U+FFFD).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnlab.data.errors import DataError, DataFileNotFoundError

FORMATS = (".txt", ".jsonl", ".json", ".parquet", ".csv", ".tsv")
COMPRESSIONS = (".gz", ".zst")
ERRORS = ("strict", "replace")
BLOCK = 1 << 22  # bytes read at a time from a text stream


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


def find_sources(specs: Sequence[str | Path]) -> list[Source]:
    """The corpus files that ``specs`` name: files, folders (every readable file below them,
    sorted) and glob patterns. Each file once, in the order given; a file named directly whose
    name is of no known format is read as text (``.txt``)."""
    if isinstance(specs, (str, Path)):
        specs = [specs]
    if not specs:
        raise DataError("no source given: name files, folders or glob patterns")
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and _readable_name(p))
            if not files:
                raise DataError(f"folder {path} holds no file attnlab can read ("
                                + ", ".join(FORMATS) + ")")
        elif path.exists():
            files = [path]
        elif glob.has_magic(str(spec)):
            files = sorted(Path(p) for p in glob.glob(str(spec), recursive=True)
                           if Path(p).is_file())
            if not files:
                raise DataFileNotFoundError(f"no file matches the pattern {spec}")
        else:
            raise DataFileNotFoundError(f"source {path} does not exist")
        found += [f for f in files if f not in found]
    named = {Path(s) for s in specs}
    return [source_of(f, ".txt" if f in named else "") for f in found]


def _readable_name(path: Path) -> bool:
    try:
        source_of(path)
    except DataError:
        return False
    return not path.name.startswith(".")


class _Decoder:
    """UTF-8 decoding of a byte stream block by block, knowing each byte's offset."""

    def __init__(self, source: Source, errors: str) -> None:
        self.source, self.errors = source, errors
        self.offset, self.carry, self.first = 0, b"", True

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
            raise DataError(f"{self.source.path} is not UTF-8 text: undecodable byte "
                            f"0x{chunk[e.start]:02x} at byte offset {start + e.start}"
                            f"{' (decompressed)' if self.source.compression else ''}; convert "
                            "it to UTF-8, or pass --errors replace to read it with U+FFFD in "
                            "its place") from None


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


def _field(row: object, field: str, where: str) -> str:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with a {field!r} field, got "
                        f"{type(row).__name__}")
    if field not in row:
        raise DataError(f"{where}: no field {field!r} (it has "
                        + ", ".join(repr(k) for k in list(row)[:10])
                        + "); name the text field with --text-field")
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
                        + "); name the text column with --text-field")


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
