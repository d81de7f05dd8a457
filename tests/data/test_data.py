"""Tests for attnlab.data: readers, synthetic tasks, batching and fetching (no network)."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import logging
import re
import urllib.error
import zipfile

import pytest
import torch

from _oracles import LMData
from attnlab.data import (
    ClassificationBatches,
    DataError,
    DataFileNotFoundError,
    DownloadError,
    Seq2SeqBatches,
    SyntheticData,
    embedded_corpus,
    pad,
    read_labelled_tsv,
    read_parallel,
    read_text,
    split_holdout,
    split_sentences,
    whole_sentences,
)
from attnlab.data.fetch import DatasetInfo, RemoteFile, fetch

fetch_mod = importlib.import_module("attnlab.data.fetch")  # attnlab.data.fetch is the function


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- text ------------------------------------------------------------------------------------

def test_read_text_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_text(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="is a directory"):
        read_text(tmp_path)
    (tmp_path / "empty.txt").write_text(" \n", encoding="utf-8")
    with pytest.raises(DataError, match="is empty"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "latin1.txt").write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8 .* 0xe9 at byte offset 6 \\(line 2\\)"):
        read_text(tmp_path / "latin1.txt")
    (tmp_path / "ok.txt").write_text("héllo\n", encoding="utf-8")
    assert read_text(tmp_path / "ok.txt") == "héllo\n"


def test_embedded_corpus_is_large_printable_ascii() -> None:
    text = embedded_corpus()
    assert len(text) > 200_000
    assert all(c == "\n" or " " <= c <= "~" for c in text)
    assert len(set(text)) < 100
    assert "assert" in text and text == embedded_corpus()


def test_lmdata_split_and_batches_are_shifted_windows() -> None:
    data = LMData(list(range(1000)))
    assert data.train.tolist() == list(range(900)) and data.val.tolist() == list(range(900, 1000))
    x, y = data.get_batch("train", batch_size=8, block_size=16, generator=gen(1))
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert int(x.max()) < 900
    x2, _ = data.get_batch("train", 8, 16, gen(1))
    x3, _ = data.get_batch("train", 8, 16, gen(2))
    assert torch.equal(x, x2) and not torch.equal(x, x3)
    xv, _ = data.get_batch("val", 4, 99, gen(0))  # the longest window val allows
    assert torch.equal(xv[0], torch.arange(900, 999))


def test_lmdata_errors() -> None:
    data = LMData(torch.arange(100))
    with pytest.raises(DataError, match="block_size 10 is too long for the val split of 10"):
        data.get_batch("val", 2, 10, gen())
    with pytest.raises(DataError, match="allowed: train, val"):
        data.get_batch("test", 2, 4, gen())
    with pytest.raises(DataError, match="train_frac"):
        LMData(torch.arange(100), train_frac=1.0)
    with pytest.raises(DataError, match="too short"):
        LMData([1, 2], train_frac=0.1)


# --- parallel ----------------------------------------------------------------------------------

def test_read_parallel_strips_and_skips_empty(tmp_path, caplog) -> None:
    (tmp_path / "a.de").write_bytes(b"Hallo Welt \r\n\r\nzwei\r\nda\r\n")
    (tmp_path / "a.en").write_text("hello world\nempty src\ntwo\n\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="attnlab.data.parallel"):
        pairs = read_parallel(tmp_path / "a.de", tmp_path / "a.en")
    assert pairs == [("Hallo Welt", "hello world"), ("zwei", "two")]
    assert "skipped 2 of 4 pairs" in caplog.text
    # old Mac line ends (a lone CR) are line ends too, as in Python's universal newlines (the
    # whole file was one pair)
    (tmp_path / "b.de").write_bytes(b"a\rb\rc\r")
    (tmp_path / "b.en").write_bytes(b"x\ny\r\nz\n")
    assert read_parallel(tmp_path / "b.de", tmp_path / "b.en") == [("a", "x"), ("b", "y"),
                                                                   ("c", "z")]


def test_a_byte_order_mark_is_not_text(tmp_path) -> None:
    """Files saved as "UTF-8 with BOM" (Notepad, Excel) read as the same text without it."""
    (tmp_path / "a.de").write_bytes("\ufeffein Mann\n".encode())
    (tmp_path / "a.en").write_bytes("\ufeffa man\n".encode())
    assert read_parallel(tmp_path / "a.de", tmp_path / "a.en") == [("ein Mann", "a man")]
    assert read_text(tmp_path / "a.de") == "ein Mann\n"


def test_read_parallel_errors(tmp_path) -> None:
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(DataError, match="has 3 lines but target .* has 2 lines"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")
    with pytest.raises(DataFileNotFoundError, match="target file .*missing.en does not exist"):
        read_parallel(tmp_path / "a.de", tmp_path / "missing.en")
    (tmp_path / "e.en").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="target file .*e.en is empty"):
        read_parallel(tmp_path / "a.de", tmp_path / "e.en")


# --- labelled ----------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [
    b"label\tsentence\r\n0\tbad film\r\n1\t good one \r\n",
    b"sentence\tlabel\nbad film \t0\ngood one\t1\n\n",
    "\ufeffsentence\tlabel\r\nbad film\t0\r\ngood one\t1\r\n".encode(),  # Excel's UTF-8
])
def test_read_labelled_tsv_either_column_order(tmp_path, content) -> None:
    (tmp_path / "t.tsv").write_bytes(content)
    assert read_labelled_tsv(tmp_path / "t.tsv") == [("bad film", 0), ("good one", 1)]


@pytest.mark.parametrize("content, message", [
    ("label\tsentence\n0\tok\npos\tnice\n",
     "line 3: label 'pos' is not an integer \\(expected 0 or 1\\)"),
    ("label\tsentence\n0\tok\n2\tnice\n",
     "line 3: label 2 is out of range \\(expected 0 or 1; for more classes set data.label_names"),
    ("label\ttext\n0\tok\n", "line 1: header has no 'sentence' column"),
    ("label\tsentence\n0\tok\textra\n", "line 2: has 3 tab-separated fields, expected 2"),
    ("label\tsentence\n1\t \n", "line 2: the 'sentence' field is empty"),
    ("label\tsentence\n", "header but no data rows"),
])
def test_read_labelled_tsv_errors(tmp_path, content, message) -> None:
    path = tmp_path / "x.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=f"file {re.escape(str(path))} {message}"
                       if "line" in message else message):
        read_labelled_tsv(path)


def test_split_holdout_is_deterministic_and_disjoint() -> None:
    items = list(range(100))
    kept, held = split_holdout(items, 0.2, seed=7)
    assert len(held) == 20 and sorted(kept + held) == items
    assert kept == sorted(kept) and held == sorted(held)  # original order kept
    assert split_holdout(items, 0.2, seed=7) == (kept, held)
    assert split_holdout(items, 0.2, seed=8)[1] != held
    with pytest.raises(DataError, match="between 0 and 1"):
        split_holdout(items, 1.5, seed=0)
    with pytest.raises(DataError, match="both parts"):
        split_holdout([1, 2], 0.1, seed=0)


# Made-up SST-style rows: two whole sentences and the phrases cut from them, plus sentences of
# their own. "he" is a word of its own, not part of "the".
PHRASED = [("the movie is good , he said", 1), ("the movie", 1), ("is good", 1),
           ("he said", 1), ("he", 1), ("a dull and lifeless film", 0), ("dull", 0),
           ("lifeless film", 0), ("the", 1)]
PHRASED += [(f"sentence number {i} stands alone", i % 2) for i in range(18)]


def _inside(row: str, sentence: str) -> bool:
    """Brute force: ``row`` is a run of consecutive words of ``sentence``."""
    words, part = sentence.split(), row.split()
    return any(words[i:i + len(part)] == part for i in range(len(words) - len(part) + 1))


def test_whole_sentences_are_the_rows_no_other_row_contains() -> None:
    found = whole_sentences([s for s, _ in PHRASED] + ["the   movie"])
    texts = [s for s, _ in PHRASED]
    want = {s for s in texts if not any(s != t and _inside(s, t) for t in texts)}
    assert set(found) == want and len(found) == 20
    assert found == sorted(found, key=lambda t: (-len(t), t))  # longest first
    assert "he" not in found and "the" not in found  # inside "..., he said" / "the movie ..."
    assert whole_sentences(["he", "the end"]) == ["the end", "he"]  # by words, not letters


@pytest.mark.parametrize("seed", range(6))
def test_split_sentences_holds_out_whole_sentences_and_drops_their_phrases(tmp_path, seed):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in PHRASED))
    items = read_labelled_tsv(path)
    kept, held = split_sentences(items, 0.2, seed=seed)
    sentences = whole_sentences([s for s, _ in items])
    assert len(held) == 4 and all(s in sentences for s, _ in held)
    # kept = exactly the rows that are no run of words of a held-out sentence
    want = [(s, y) for s, y in items if not any(_inside(s, h) for h, _ in held)]
    assert kept == want
    assert [x for x in items if x in held] == held  # original order
    assert split_sentences(items, 0.2, seed=seed) == (kept, held)
    assert {s for s, _ in kept}.isdisjoint({s for s, _ in held})


def test_split_sentences_drops_the_phrases_of_a_held_out_sentence() -> None:
    items = PHRASED
    for seed in range(40):  # a seed that holds out the sentence with phrases
        kept, held = split_sentences(items, 0.1, seed=seed)
        if ("the movie is good , he said", 1) in held:
            break
    else:
        raise AssertionError("no seed held out the phrased sentence")
    texts = {s for s, _ in kept}
    assert not texts & {"the movie", "is good", "he said", "he", "the"}
    assert {"a dull and lifeless film", "dull", "lifeless film"} <= texts or \
        ("a dull and lifeless film", 0) in held
    with pytest.raises(DataError, match="between 0 and 1"):
        split_sentences(items, 1.0, seed=0)
    with pytest.raises(DataError, match="whole sentences"):  # 3 sentences, 9 rows
        split_sentences(PHRASED[:9], 0.1, seed=0)


def test_classification_batches_bucket_by_length_and_resume() -> None:
    gen_ = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (400,), generator=gen_).tolist()
    examples = [(list(range(1, n + 1)), i % 2) for i, n in enumerate(lengths)]
    plain = ClassificationBatches(examples, 8, pad_id=0, seed=3)
    bucketed = ClassificationBatches(examples, 8, pad_id=0, seed=3, bucket=True)

    def epoch(batches):
        it = iter(batches)
        return [next(it) for _ in range(50)]

    a, b = epoch(plain), epoch(bucketed)
    # the same examples, each once per epoch (a row's ids are 1..n: its length is its sum)
    assert sorted(n for ids, _ in b for n in (ids != 0).sum(1).tolist()) == sorted(lengths)
    padded = [sum(ids.numel() for ids, _ in x) for x in (a, b)]
    assert padded[1] < 1.05 * sum(lengths) < 1.5 * sum(lengths) < padded[0]  # little padding
    again = ClassificationBatches(examples, 8, pad_id=0, seed=3, bucket=True)
    it = iter(again)
    first = [next(it) for _ in range(7)]
    state = again.state_dict()
    rest = list(it)  # the rest of the epoch
    resumed = ClassificationBatches(examples, 8, pad_id=0, seed=3, bucket=True)
    resumed.load_state_dict(state)
    again_rest = list(iter(resumed))
    assert len(rest) == len(again_rest) == 43
    assert all(torch.equal(x[0], y[0]) for x, y in zip(rest, again_rest))
    assert all(torch.equal(x[0], y[0]) for x, y in zip(first, b[:7]))


# --- synthetic ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("copy", [5, 3, 9, 4]), ("reverse", [4, 9, 3, 5]), ("sort", [3, 4, 5, 9])])
def test_synthetic_answers(name, expected) -> None:
    assert SyntheticData(name, 10, 1, 5).answer([5, 3, 9, 4, 0, 0]) == expected


def test_synthetic_sample_layout() -> None:
    data = SyntheticData("reverse", vocab_size=12, min_len=2, max_len=6)
    src, tgt = data.sample(64, gen(3))
    assert src.dtype == tgt.dtype == torch.long and tgt.shape[1] == src.shape[1] + 2
    lengths = (src != 0).sum(1)
    assert int(lengths.min()) >= 2 and int(lengths.max()) == src.shape[1] <= 6
    for s, t, n in zip(src, tgt, lengths.tolist()):
        assert bool((s[:n] >= 3).all() and (s[:n] < 12).all() and (s[n:] == 0).all())
        assert t[: n + 2].tolist() == [1, *s[:n].flip(0).tolist(), 2]
        assert bool((t[n + 2:] == 0).all())
    assert torch.equal(data.sample(64, gen(3))[0], src)


def test_synthetic_errors() -> None:
    with pytest.raises(DataError, match="allowed: copy, reverse, sort"):
        SyntheticData("add", 10, 1, 5)
    with pytest.raises(DataError, match="vocab_size must be > 3"):
        SyntheticData("copy", 3, 1, 5)
    with pytest.raises(DataError, match="min_len <= max_len"):
        SyntheticData("copy", 10, 5, 2)
    with pytest.raises(DataError, match="not content tokens"):
        SyntheticData("copy", 10, 1, 5).answer([1, 4])


# --- batching ----------------------------------------------------------------------------------

def test_pad() -> None:
    ids, mask = pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and ids.dtype == torch.long
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    ids, mask = pad([[1, 2, 3], [4]], pad_id=9, left=True)
    assert ids.tolist() == [[1, 2, 3], [9, 9, 4]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]
    ids, mask = pad([torch.tensor([5, 6]), []], pad_id=None)  # tensors, empty rows, pad 0
    assert ids.tolist() == [[5, 6], [0, 0]] and mask.tolist() == [[True, True], [False, False]]
    with pytest.raises(DataError, match="at least one"):
        pad([], 0)


def test_ids_that_would_be_truncated_or_misread_are_named() -> None:
    """Floats were cast to long (1.7 -> 1, a pad id 0.5 -> 0), strings misread or failed inside
    torch, negative ids failed later in the model ("index out of range in self")."""
    with pytest.raises(DataError, match="pad takes integer token ids and pad_id, got "
                                        "torch.float32 values"):
        pad([[1.7, 2.2], [3]], 0)
    with pytest.raises(DataError, match="integer token ids and pad_id"):
        pad([[1, 2], [3]], 0.5)
    with pytest.raises(DataError, match=r"a list of id sequences \(one sequence: \[ids\]\)"):
        pad(torch.tensor([1, 2, 3]), 0)
    with pytest.raises(DataError, match="integer token ids \\(encode text first\\)"):
        pad([["a"], ["b"]], 0)
    with pytest.raises(DataError, match="LMData needs integer token ids, got torch.float32"):
        LMData([1.5, 2.7, 3.2, 4.9])
    with pytest.raises(DataError, match="LMData needs token ids >= 0, got -1"):
        LMData([-1, 5, 6, 7])
    with pytest.raises(DataError, match="encode the text first, or use LMData.from_text"):
        LMData("abcdef")
    for label, shown in ((1.7, "1.7"), ("pos", "'pos'"), (-1, "-1")):
        with pytest.raises(DataError, match=f"example 0: label {shown} is not a class id"):
            ClassificationBatches([([1, 2], label), ([3], 0)], 2, 0)
    assert ClassificationBatches([([1, 2], torch.tensor(1)), ([3], 0)], 2, 0).labels == [1, 0]
    task = SyntheticData("copy", 10, 1, 3)
    for bad in ([3.7, 4], "345"):
        with pytest.raises(DataError, match="answer takes one source sequence of integer"):
            task.answer(bad)


def _pairs(n: int = 200) -> list[tuple[list[int], list[int]]]:
    g = gen(0)
    lengths = torch.randint(1, 20, (n, 2), generator=g).tolist()
    return [([3 + i % 7] * a, [1] + [10 + i] * b + [2]) for i, (a, b) in enumerate(lengths)]


def _all(batches) -> list[list[torch.Tensor]]:
    return [list(b) for b in batches]


def test_seq2seq_batches_cover_epoch_within_budget() -> None:
    pairs = _pairs()  # target i is [1] + [10 + i] * n + [2], so t[1] - 10 identifies it
    batches = Seq2SeqBatches(pairs, max_tokens=64, pad_id=0, seed=1)
    seen = []
    for src, tgt_in, tgt_out in batches:
        assert src.shape[0] * max(src.shape[1], tgt_in.shape[1] + 1) <= 64
        for s_row, i_row, o_row in zip(src.tolist(), tgt_in.tolist(), tgt_out.tolist()):
            i = i_row[1] - 10
            src_ids, tgt_ids = pairs[i]
            assert s_row == src_ids + [0] * (len(s_row) - len(src_ids))
            full = tgt_ids + [0] * (len(i_row) + 1 - len(tgt_ids))  # padded, then shifted
            assert i_row == full[:-1] and o_row == full[1:]
            seen.append(i)
    assert sorted(seen) == list(range(len(pairs)))
    assert len(batches) > 5 and batches.state_dict()["epoch"] == 1
    widths = [src.shape[1] for src, _, _ in batches]  # batches come in shuffled order
    assert widths != sorted(widths)
    in_order = [src.shape[1] for src, _, _ in Seq2SeqBatches(pairs, 64, 0, shuffle=False)]
    assert in_order == sorted(in_order)


def test_seq2seq_batches_shuffle_per_epoch_and_resume_exactly() -> None:
    pairs = _pairs()
    reference = Seq2SeqBatches(pairs, max_tokens=80, pad_id=0, seed=5)
    epoch0, epoch1 = _all(reference), _all(reference)
    assert [b[0].tolist() for b in epoch0] != [b[0].tolist() for b in epoch1]
    run = Seq2SeqBatches(pairs, max_tokens=80, pad_id=0, seed=5)
    iterator = iter(run)
    for _ in range(3):
        next(iterator)
    state = run.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3)
    resumed = Seq2SeqBatches(pairs, max_tokens=80, pad_id=0, seed=5)
    resumed.load_state_dict(state)
    rest = _all(resumed) + _all(resumed)
    expected = epoch0[3:] + epoch1
    assert len(rest) == len(expected)
    for got, want in zip(rest, expected):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_seq2seq_batches_errors() -> None:
    with pytest.raises(DataError, match="max_tokens=5 is smaller than"):
        Seq2SeqBatches([([3] * 9, [1, 4, 2])], max_tokens=5, pad_id=0)
    with pytest.raises(DataError, match="targets need \\[bos\\] ... \\[eos\\]"):
        Seq2SeqBatches([([3], [1])], max_tokens=5, pad_id=0)
    batches = Seq2SeqBatches(_pairs(), max_tokens=64, pad_id=0, seed=1)
    with pytest.raises(DataError, match="saved seed=2 but this iterator has seed=1"):
        batches.load_state_dict({**batches.state_dict(), "seed": 2})


def test_classification_batches() -> None:
    examples = [([5 + i] * (1 + i % 4), i % 2) for i in range(10)]
    batches = ClassificationBatches(examples, batch_size=4, pad_id=0, cls_id=101, seed=3)
    out = _all(batches)
    assert [ids.shape[0] for ids, _ in out] == [4, 4, 2]
    seen = {}
    for ids, y in out:
        assert y.dtype == torch.long
        for row, label in zip(ids.tolist(), y.tolist()):
            i = row[1] - 5
            seen[i] = label
            assert row == [101, *examples[i][0]] + [0] * (len(row) - 1 - len(examples[i][0]))
    assert seen == {i: i % 2 for i in range(10)}
    resumed = ClassificationBatches(examples, batch_size=4, pad_id=0, cls_id=101, seed=3)
    batches_iter = iter(batches)
    next(batches_iter)
    resumed.load_state_dict(batches.state_dict())
    assert [b[0].tolist() for b in _all(resumed)] == [b[0].tolist() for b in _all(batches)]
    short = ClassificationBatches(examples, batch_size=10, pad_id=0, cls_id=101, max_len=2,
                                  shuffle=False)
    assert next(iter(short))[0].shape == (10, 2)


# --- fetch -------------------------------------------------------------------------------------

CONTENT = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"


def _toy(*files: RemoteFile) -> DatasetInfo:
    """A data set's files as a task declares them (fetch takes the declaration)."""
    return DatasetInfo("toy", "a toy data set", tuple(files), "toydir", "--set data.path=X")


def _plain(content: bytes = CONTENT) -> RemoteFile:
    return RemoteFile("input.txt", "https://example.invalid/input.txt",
                      hashlib.sha256(content).hexdigest())


def _serve(monkeypatch, payload: bytes, calls: list[str] | None = None) -> None:
    def fake(url, dest, timeout):
        if calls is not None:
            calls.append(url)
        dest.write_bytes(payload)
    monkeypatch.setattr(fetch_mod, "download_url", fake)


def test_fetch_downloads_verifies_and_skips_when_present(tmp_path, monkeypatch) -> None:
    toy = _toy(_plain())
    calls: list[str] = []
    _serve(monkeypatch, CONTENT, calls)
    root = fetch(toy, tmp_path)
    assert root == tmp_path / "toy" and (root / "input.txt").read_bytes() == CONTENT
    assert fetch(toy, tmp_path) == root and len(calls) == 1
    assert [p.name for p in root.iterdir()] == ["input.txt"]


def test_fetch_says_what_it_downloads_and_keeps_quiet_about_files_present(
        tmp_path, monkeypatch, caplog) -> None:
    """A download is an info line; a file already present and valid (every run that reads a
    fetched data set) is a debug line, shown with -v only."""
    toy = _toy(_plain())
    _serve(monkeypatch, CONTENT)
    with caplog.at_level(logging.INFO, logger="attnlab.data.fetch"):
        fetch(toy, tmp_path)
        assert "downloading https://example.invalid/input.txt" in caplog.text
        caplog.clear()
        fetch(toy, tmp_path)
        assert caplog.records == []
    with caplog.at_level(logging.DEBUG, logger="attnlab.data.fetch"):
        fetch(toy, tmp_path)
    assert "already present and valid" in caplog.text


def test_fetch_checksum_mismatch_keeps_nothing(tmp_path, monkeypatch) -> None:
    toy = info = _toy(_plain())
    _serve(monkeypatch, b"tampered")
    with pytest.raises(DownloadError, match="checksum mismatch .* expected sha256 "
                       f"{info.files[0].sha256}, got {hashlib.sha256(b'tampered').hexdigest()}"):
        fetch(toy, tmp_path)
    assert not (tmp_path / "toy").exists()  # not even the empty folder it made


def test_failed_download_leaves_no_partial_file(tmp_path, monkeypatch) -> None:
    toy = _toy(_plain())

    def broken(url, dest, timeout):
        dest.write_bytes(CONTENT[:10])
        raise TimeoutError("timed out")
    monkeypatch.setattr(fetch_mod, "download_url", broken)
    with pytest.raises(DownloadError, match="failed .*--set data.path=X.*attnlab data fetch toy"):
        fetch(toy, tmp_path)
    assert not (tmp_path / "toy").exists()  # not even the empty folder it made


def test_download_url_network_error_is_reported(tmp_path, monkeypatch) -> None:
    toy = _toy(_plain())

    def offline(request, timeout):
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(fetch_mod.urllib.request, "urlopen", offline)
    with pytest.raises(DownloadError, match="downloading toy file input.txt from https://"):
        fetch(toy, tmp_path)
    assert not (tmp_path / "toy").exists()  # not even the empty folder it made


def test_fetch_gunzips_and_unzips_with_row_check(tmp_path, monkeypatch) -> None:
    toy = _toy(RemoteFile("train.de", "u", _plain().sha256, "gzip"))
    _serve(monkeypatch, gzip.compress(CONTENT))
    assert (fetch(toy, tmp_path) / "train.de").read_bytes() == CONTENT
    tsv = "sentence\tlabel\nfine \t1\nbad\t0\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("SST-2/train.tsv", tsv)
    toy = _toy(RemoteFile("train.tsv", "u", None, "zip", "SST-2/train.tsv", 2))
    _serve(monkeypatch, buffer.getvalue())
    assert (fetch(toy, tmp_path / "z") / "train.tsv").read_text(encoding="utf-8") == tsv
    toy = _toy(RemoteFile("train.tsv", "u", None, "zip", "SST-2/train.tsv", 3))
    with pytest.raises(DownloadError, match="has 2 rows, expected 3"):
        fetch(toy, tmp_path / "z2")
    _serve(monkeypatch, b"not a zip")
    with pytest.raises(DownloadError, match="unpacking toy file train.tsv"):
        fetch(toy, tmp_path / "z3")
    buffer = io.BytesIO()  # cut inside its last row: every row still there
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("SST-2/train.tsv", "label\tsentence\n1\tfine\n0\tbad mo")
    toy = _toy(RemoteFile("train.tsv", "u", None, "zip", "SST-2/train.tsv", 2))
    _serve(monkeypatch, buffer.getvalue())
    with pytest.raises(DownloadError, match="ends inside a row"):
        fetch(toy, tmp_path / "z4")


def test_fetch_copies_from_local_directory(tmp_path, monkeypatch) -> None:
    toy = _toy(_plain())
    _serve(monkeypatch, b"", calls := [])
    source = tmp_path / "shared" / "toydir"
    source.mkdir(parents=True)
    (source / "input.txt").write_bytes(CONTENT)
    root = fetch(toy, tmp_path / "cache", source_dir=tmp_path / "shared")
    assert (root / "input.txt").read_bytes() == CONTENT and calls == []
    with pytest.raises(DataFileNotFoundError, match="no local copy of toy file input.txt"):
        fetch(toy, tmp_path / "cache2", source_dir=tmp_path)
    (source / "input.txt").write_bytes(b"other")
    with pytest.raises(DownloadError, match="checksum mismatch"):
        fetch(toy, tmp_path / "cache3", source_dir=tmp_path / "shared")


def test_fetch_refuses_an_empty_cache_dir_and_a_file_in_its_path(tmp_path, monkeypatch) -> None:
    """cache_dir="" wrote into the working directory; a file where a folder goes was a raw
    NotADirectoryError / FileExistsError."""
    toy = _toy(_plain())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="cache_dir is empty: give a folder, or None"):
        fetch(toy, "", source_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match=f"{tmp_path / 'afile'} is a file, not a folder"):
        fetch(toy, tmp_path / "afile" / "sub")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "toy").write_text("x")
    with pytest.raises(DataError, match="cannot keep toy in .* is a file, not a folder"):
        fetch(toy, tmp_path / "cache")


def test_labelled_tsv_and_sentence_arguments_are_checked(tmp_path) -> None:
    path = tmp_path / "a.tsv"
    path.write_text("sentence\tlabel\tlabel\nfine\t1\t0\n")
    with pytest.raises(DataError, match="header names 'label' 2 times"):
        read_labelled_tsv(path)
    with pytest.raises(DataError, match="text_column and label_column are both 'label'"):
        read_labelled_tsv(path, text_column="label")
    for n in (0, 1, "2"):
        with pytest.raises(DataError, match=f"num_labels must be an integer >= 2, or None, "
                                            f"got {n!r}"):
            read_labelled_tsv(path, num_labels=n)
    with pytest.raises(DataError, match="whole_sentences got an empty text"):
        whole_sentences(["a b", ""])
    with pytest.raises(DataError, match="a list of texts, not one string"):
        whole_sentences("a b")


def test_fetch_registry_and_defaults(tmp_path, monkeypatch) -> None:
    from attnlab.tasks import download, downloads

    assert set(downloads()) == {"shakespeare", "multi30k", "sst2"}
    for info in downloads().values():
        for spec in info.files:
            assert spec.url.startswith("https://")
            assert spec.sha256 is None and spec.tsv_rows or len(spec.sha256 or "") == 64
    with pytest.raises(DataError, match="unknown data set 'imdb'; allowed: shakespeare, "
                                        "multi30k, sst2"):
        download("imdb")
    with pytest.raises(DataError, match="'copy' has nothing to download; allowed: "):
        download("copy")
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "env"))
    assert fetch_mod.default_cache_dir() == tmp_path / "env"
    monkeypatch.delenv("ATTNLAB_DATA")
    assert fetch_mod.default_cache_dir().parts[-3:] == (".cache", "attnlab", "data")


def test_truncation_keeps_the_end_token_as_hugging_face_does() -> None:
    """WordPiece's [CLS] ... [SEP] cut to max_len keeps [SEP] last (a BERT classifier read
    texts over max_len without it, unlike Hugging Face's truncation)."""
    from attnlab.data.batching import ClassificationBatches, truncate

    assert truncate([101, 5, 6, 7, 102], 4, 102) == [101, 5, 6, 102]
    assert truncate([101, 5, 6, 7, 8], 4, 102) == [101, 5, 6, 7]  # no end token: a plain cut
    assert truncate([101, 5, 102], 4, 102) == [101, 5, 102]
    batches = ClassificationBatches([([101, 5, 6, 7, 102], 1)], 1, 0, max_len=3, end_id=102,
                                    shuffle=False)
    ids, _ = next(iter(batches))
    assert ids.tolist() == [[101, 5, 102]]


def test_batch_iterators_check_their_numbers_up_front() -> None:
    """A float batch size or seed failed only at the first batch, inside Python or torch."""
    from attnlab.config import ConfigError

    examples = [([1, 2], 1), ([3], 0)]
    for kwargs, shown in ((dict(batch_size=2.5), "batch_size=2.5"),
                          (dict(batch_size=2, max_len=1.5), "max_len=1.5"),
                          (dict(batch_size=2, seed=0.5), "seed=0.5")):
        with pytest.raises(ConfigError, match=f"{shown} is not allowed: an integer >= "):
            ClassificationBatches(examples, pad_id=0, **kwargs)
    pairs = [([1, 2], [1, 2, 3])]
    with pytest.raises(ConfigError, match="max_tokens=nan is not allowed: an integer >= 1"):
        Seq2SeqBatches(pairs, float("nan"), 0)
    batches = Seq2SeqBatches(pairs, 10, 0)
    with pytest.raises(DataError, match="the state has no epoch and position"):
        batches.load_state_dict({"seed": 0, "num_examples": 1})
