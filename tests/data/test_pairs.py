"""Prepared pairs DIRs: exact ids, offsets, compressed input, resuming, the memmap reader, and
translation training from them (the batches of the in-memory path, nothing encoded twice)."""

from __future__ import annotations

import gzip
import random

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.data import DataError, Seq2SeqBatches, parallel, read_lines, read_parallel, sources
from attnlab.data import pairs as pairs_module
from attnlab.data.pairs import PairShards, prepare_pairs, read_pairs_manifest
from attnlab.data.prepare import prepare
from attnlab.data.shards import MANIFEST, is_prepared
from attnlab.run_config import RunConfig
from attnlab.runs import read_metrics
from attnlab.tasks import TranslationTask, train_tokenizer
from attnlab.tokenizers import SPECIALS, BPETokenizer, CharTokenizer, load_tokenizer

DE = "der die das ein eine hund katze mann frau läuft springt über den zaun im park".split()
EN = "the a dog cat man woman runs jumps over fence in park big small red".split()


def corpus(tmp_path, n: int = 120, seed: int = 0, empty_every: int = 9, name: str = "c"):
    """Two line-aligned files of n lines (a few with an empty side, a few long ones)."""
    rng = random.Random(seed)
    src, tgt = [], []
    for i in range(n):
        long = 4 if i % 11 == 0 else 1
        s = " ".join(rng.choice(DE) for _ in range(rng.randint(1, 6) * long))
        t = " ".join(rng.choice(EN) for _ in range(rng.randint(1, 6) * long))
        if i % empty_every == 0:
            s, t = (s, "  ") if i % 2 else ("", t)
        src.append(s)
        tgt.append(t)
    a, b = tmp_path / f"{name}.de", tmp_path / f"{name}.en"
    a.write_text("\n".join(src) + "\n", encoding="utf-8")
    b.write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return a, b


def in_memory(src, tgt, tok, add_special=False):
    """TranslationTask's encoding before prepared pairs: read whole, encode every pair."""
    return [(tok.encode(s, add_special), tok.encode(t, True)) for s, t in read_parallel(src, tgt)]


def read_all(path, split="train"):
    shards = PairShards(path, split)
    return [(s.tolist(), t.tolist()) for s, t in shards.pairs(range(len(shards)))]


def bpe_of(src, tgt):
    pairs = read_parallel(src, tgt)
    return BPETokenizer.train([s for s, _ in pairs] + [t for _, t in pairs], 300)


def char_of(src, tgt):
    pairs = read_parallel(src, tgt)
    return CharTokenizer.from_text("".join(s + t for s, t in pairs), SPECIALS)


def files_of(path):
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("make_tok, add_special, workers",
                         [(bpe_of, False, 1), (char_of, True, 1), (bpe_of, True, 2)])
def test_ids_equal_the_in_memory_encoding(tmp_path, make_tok, add_special, workers):
    src, tgt = corpus(tmp_path)
    tok = make_tok(src, tgt)
    out = prepare_pairs(src, tgt, tmp_path / "p", tok, src_add_special=add_special,
                        workers=workers, piece_bytes=300)
    assert read_all(out) == in_memory(src, tgt, tok, add_special)
    manifest = read_pairs_manifest(out)
    assert manifest["kind"] == "pairs" and manifest["dtype"] == "uint16"
    assert manifest["lines"] == 120 and manifest["skipped_empty"] == 14
    assert len(manifest["splits"]["train"]["shards"]) > 3  # several pieces
    assert manifest["splits"]["val"]["pairs"] == 0


def test_offsets_index_the_token_files(tmp_path):
    src, tgt = corpus(tmp_path, 40)
    tok = bpe_of(src, tgt)
    out = prepare_pairs(src, tgt, tmp_path / "p", tok, workers=1, piece_bytes=200)
    expected = in_memory(src, tgt, tok)
    shards = read_pairs_manifest(out)["splits"]["train"]["shards"]
    rows = []
    for shard in shards:
        side = {}
        for name in ("src", "tgt"):
            off = np.fromfile(out / f"{shard['name']}.{name}.idx", dtype="<i8")
            ids = np.fromfile(out / f"{shard['name']}.{name}.bin", dtype="<u2")
            assert len(off) == shard["pairs"] + 1 and off[0] == 0 and off[-1] == len(ids)
            side[name] = [ids[a:b].tolist() for a, b in zip(off[:-1], off[1:])]
        rows += list(zip(side["src"], side["tgt"]))
    assert rows == expected
    reader = PairShards(out, "train")
    src_len, tgt_len = reader.lengths()
    assert src_len.tolist() == [len(s) for s, _ in expected]
    assert tgt_len.tolist() == [len(t) for _, t in expected]
    s, t = reader.pair(5)
    assert (s.tolist(), t.tolist()) == expected[5]
    view = reader.select([7, 2, 7])
    assert len(view) == 3 and view.lengths()[0].tolist() == [len(expected[i][0]) for i in (7, 2, 7)]
    assert [(a.tolist(), b.tolist()) for a, b in view.pairs([2, 0])] == [expected[7], expected[7]]
    with pytest.raises(DataError, match=f"pair 40 is outside the train split of {len(expected)} "
                                        "pairs"):
        reader.pair(40)


@pytest.mark.parametrize("text", ["a\r\nb\rc\n\nd", "a\r\n\r\nb\n", "\ufeffx\ry\r", "one"])
def test_streamed_lines_split_as_read_lines(tmp_path, monkeypatch, text):
    """Blocks of 3 bytes cut CRLFs and characters: the lines are still read_lines's."""
    path = tmp_path / "f.txt"
    path.write_bytes(text.encode())
    monkeypatch.setattr(sources, "BLOCK", 3)
    monkeypatch.setattr(parallel, "BLOCK", 3)
    lines = read_lines(path)
    assert list(parallel.iter_lines(path)) == lines
    assert parallel.count_lines(path) == len(lines)


def test_gz_input_gives_the_ids_of_plain_text(tmp_path):
    src, tgt = corpus(tmp_path)
    tok = bpe_of(src, tgt)
    gz_src, gz_tgt = tmp_path / "c.de.gz", tmp_path / "c.en.gz"
    gz_src.write_bytes(gzip.compress(src.read_bytes()))
    gz_tgt.write_bytes(gzip.compress(tgt.read_bytes()))
    out = prepare_pairs(gz_src, gz_tgt, tmp_path / "p", tok, workers=1)
    assert read_all(out) == in_memory(src, tgt, tok)


def test_a_line_count_mismatch_is_one_error_naming_both_files(tmp_path):
    src, tgt = corpus(tmp_path, 30)
    tgt.write_text(tgt.read_text() + "one more\n")
    tok = bpe_of(*corpus(tmp_path, 30, name="ok"))
    with pytest.raises(DataError, match=f"source {src} has 30 lines but target {tgt} has 31 "
                                        "lines"):
        prepare_pairs(src, tgt, tmp_path / "p", tok)
    assert not (tmp_path / "p").exists()  # bad input leaves nothing behind
    with pytest.raises(DataError, match="no pair of non-empty lines"):
        (tmp_path / "e.de").write_text("\n \n")
        (tmp_path / "e.en").write_text("x\n\n")
        prepare_pairs(tmp_path / "e.de", tmp_path / "e.en", tmp_path / "p", tok)
    with pytest.raises(DataError, match="not allowed for translation pairs: one of char, bpe"):
        prepare_pairs(src, src, tmp_path / "p", "gpt2")


def test_val_fraction_max_len_and_trained_tokenizers(tmp_path):
    src, tgt = corpus(tmp_path)
    out = prepare_pairs(src, tgt, tmp_path / "p", "bpe", vocab_size=300,
                        pre_tokenizer="whitespace", val_fraction=0.25, seed=3, workers=1,
                        max_len=12)
    # the BPE is trained on what TranslationTask trained it on: every source, then every
    # target (BPE training itself is not bit-reproducible: HF breaks ties of counts by chance)
    pairs = read_parallel(src, tgt)
    assert pairs_module.sample_pairs([(src, tgt)]) == [s for s, _ in pairs] + [t for _, t in pairs]
    tok = load_tokenizer(out / "tokenizer.json")
    assert tok.kind == "bpe" and tok.vocab_size <= 300
    expected = in_memory(src, tgt, tok)
    fits = [p for p in expected if max(len(p[0]), len(p[1])) <= 12]
    train, val = read_all(out, "train"), read_all(out, "val")
    assert 0 < len(val) < len(train) and sorted(train + val) == sorted(fits)
    manifest = read_pairs_manifest(out)
    dropped = sum(manifest["splits"][s]["dropped"] for s in ("train", "val"))
    assert dropped == len(expected) - len(fits)
    again = prepare_pairs(src, tgt, tmp_path / "q", "bpe", vocab_size=300,
                          pre_tokenizer="whitespace", val_fraction=0.25, seed=3, workers=1,
                          max_len=12)
    assert read_all(again, "val") == val  # the split is seeded
    out = prepare_pairs(src, tgt, tmp_path / "c", "char", workers=1)
    assert read_all(out) == in_memory(src, tgt, char_of(src, tgt))


def test_a_killed_prepare_resumes_to_the_same_dir(tmp_path, monkeypatch):
    src, tgt = corpus(tmp_path, 200)
    tok = bpe_of(src, tgt)
    whole = prepare_pairs(src, tgt, tmp_path / "whole", tok, workers=1, piece_bytes=300)
    real, written = pairs_module.write_shard, []

    def dies(path, ids):
        if len(written) == 10:
            raise KeyboardInterrupt  # a kill in the middle of a shard's four files
        real(path, ids)
        written.append(path)

    monkeypatch.setattr(pairs_module, "write_shard", dies)
    with pytest.raises(KeyboardInterrupt):
        prepare_pairs(src, tgt, tmp_path / "p", tok, workers=1, piece_bytes=300)
    assert not is_prepared(tmp_path / "p")
    with pytest.raises(DataError, match="no prepared.json"):
        PairShards(tmp_path / "p", "train")
    monkeypatch.setattr(pairs_module, "write_shard", real)
    (tmp_path / "p" / "train" / "000000.tgt.bin").unlink()  # a finished shard lost a file
    encoded, real_encode = [], pairs_module._encode_pairs
    monkeypatch.setattr(pairs_module, "_encode_pairs",
                        lambda *a, **k: encoded.append(1) or real_encode(*a, **k))
    out = prepare_pairs(src, tgt, tmp_path / "p", tok, workers=1, piece_bytes=300)
    n = len(read_pairs_manifest(whole)["splits"]["train"]["shards"])
    assert len(encoded) == n - 1  # the one whole finished shard was kept, not encoded again
    assert files_of(out) == files_of(whole)
    # a finished DIR that lost its manifest and a shard file is made again, the same
    (out / MANIFEST).unlink()
    (out / "train" / "000003.src.idx").unlink()
    encoded.clear()
    prepare_pairs(src, tgt, tmp_path / "p", tok, workers=1, piece_bytes=300)
    assert len(encoded) == n and files_of(out) == files_of(whole)
    assert prepare_pairs(src, tgt, tmp_path / "p", tok, workers=1, piece_bytes=300) == out
    assert len(encoded) == n  # a finished DIR is kept as it is
    with pytest.raises(DataError, match="already holds a prepared corpus made from other"):
        prepare_pairs(src, tgt, tmp_path / "p", tok, workers=1, seed=4)


def old_plan(pairs, max_tokens, seed, epoch, shuffle=True):
    """Seq2SeqBatches._plan as it was over a list (Python sort by length tuples)."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))
    order = list(range(len(pairs)))
    if shuffle:
        order = torch.randperm(len(order), generator=generator).tolist()
    order.sort(key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    batches, current, longest = [], [], 0
    for i in order:
        size = max(len(pairs[i][0]), len(pairs[i][1]))
        if current and (len(current) + 1) * max(longest, size) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    batches.append(current)
    if shuffle:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=generator)]
    return batches


def as_lists(batches):
    return [[t.tolist() for t in batch] for batch in batches]


def test_seq2seq_batches_over_pair_shards_equal_those_over_the_list(tmp_path):
    src, tgt = corpus(tmp_path, 300)
    tok = bpe_of(src, tgt)
    out = prepare_pairs(src, tgt, tmp_path / "p", tok, workers=1, piece_bytes=400)
    pairs = in_memory(src, tgt, tok)
    listed = Seq2SeqBatches(pairs, 100, tok.pad_id, seed=5)
    mapped = Seq2SeqBatches(PairShards(out, "train"), 100, tok.pad_id, seed=5)
    def plan(batches, epoch):
        return [b.tolist() for b in batches._plan(epoch)]

    for epoch in range(2):
        assert plan(mapped, epoch) == plan(listed, epoch) == old_plan(pairs, 100, 5, epoch)
    in_order = Seq2SeqBatches(pairs, 100, 0, shuffle=False)
    assert plan(in_order, 0) == old_plan(pairs, 100, 0, 0, shuffle=False)
    assert as_lists(mapped) == as_lists(listed) and len(mapped) == len(listed)
    # resuming from a state of the list's iterator continues the same batches
    iterator = iter(listed)
    for _ in range(3):
        next(iterator)
    resumed = Seq2SeqBatches(PairShards(out, "train"), 100, tok.pad_id, seed=5)
    resumed.load_state_dict(listed.state_dict())
    assert as_lists(resumed) == as_lists(iterator)
    # a selection, as training keeps the pairs that fit the model
    keep = [i for i, (s, t) in enumerate(pairs) if max(len(s), len(t)) <= 10]
    sub = Seq2SeqBatches(PairShards(out, "train").select(keep), 40, tok.pad_id, seed=2)
    assert as_lists(sub) == as_lists(Seq2SeqBatches([pairs[i] for i in keep], 40, tok.pad_id,
                                                    seed=2))


def run_config(tmp_path, src, tgt, **data):
    return RunConfig.from_dict({
        "data": {"src_path": str(src), "tgt_path": str(tgt),
                 "val_src_path": str(src), "val_tgt_path": str(tgt),
                 "cache_dir": str(tmp_path / "cache"), **data},
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_len": 16},
        "train": {"max_tokens": 64, "seed": 7}})


@pytest.mark.parametrize("data", [
    {"tokenizer": "bpe", "vocab_size": 300, "pre_tokenizer": "byte_level"},
    {"tokenizer": "char", "src_add_special": True}])
def test_translation_batches_equal_the_in_memory_ones(tmp_path, data):
    src, tgt = corpus(tmp_path, 200)
    rc = run_config(tmp_path, src, tgt, **data)
    task = TranslationTask(rc)
    pairs = read_parallel(src, tgt)  # the task as it was: every pair read and encoded
    tok = train_tokenizer(rc, [s for s, _ in pairs] + [t for _, t in pairs])
    if tok.kind == "char":  # (two BPE trainings may break ties of counts differently)
        assert task.tokenizer.to_dict() == tok.to_dict()
    tok = task.tokenizer
    encoded = in_memory(src, tgt, tok, rc.data.src_add_special)
    kept = [(s, t) for s, t in encoded if len(s) <= 16 and len(t) <= 16]
    assert len(kept) < len(encoded)  # some are too long for the model
    old = Seq2SeqBatches(kept, 64, tok.pad_id, 7)
    new = task._train_batches()
    assert isinstance(new.pairs, PairShards)
    assert as_lists(new) + as_lists(new) == as_lists(old) + as_lists(old)


MODEL = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
         "--set", "model.max_len=16"]
FAST = ["--set", "train.precision=fp32", "--set", "train.progress=false",
        "--set", "train.tensorboard=false", "--set", "train.log_every=1"]


def train_args(tmp_path, out, steps, *data):
    return ["train", *data, "--set", "data.tokenizer=bpe",
            "--set", "data.vocab_size=300", "--set", "data.pre_tokenizer=byte_level",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", *MODEL, *FAST,
            "--set", f"train.max_steps={steps}", "--set", "train.decay_steps=4",
            "--set", "train.eval_every=2", "--set", "train.max_tokens=64", "--out", str(out)]


def test_translation_prepares_once_then_reads_the_cache(tmp_path, monkeypatch, capsys):
    src, tgt = corpus(tmp_path, 60)
    files = ["--set", f"data.src_path={src}", "--set", f"data.tgt_path={tgt}",
             "--set", f"data.val_src_path={src}", "--set", f"data.val_tgt_path={tgt}"]
    assert main(train_args(tmp_path, tmp_path / "a", 4, *files)) == 0
    prepared = [p.parent for p in (tmp_path / "cache" / "prepared").glob("*/prepared.json")]
    assert len(prepared) == 1 and read_pairs_manifest(prepared[0])["kind"] == "pairs"

    def no(*args, **kwargs):
        raise AssertionError("the training pairs were encoded (or a BPE trained) again")

    monkeypatch.setattr(pairs_module, "_encode_pairs", no)
    monkeypatch.setattr(BPETokenizer, "train", no)
    assert main(train_args(tmp_path, tmp_path / "b", 2, *files)) == 0  # a second run
    assert main(["train", "--out", str(tmp_path / "b"), "--resume",
                 "--set", "train.max_steps=4"]) == 0
    assert main(["eval", str(tmp_path / "b")]) == 0
    assert "bleu:" in capsys.readouterr().out
    a = read_metrics(tmp_path / "a" / "metrics.csv")
    b = read_metrics(tmp_path / "b" / "metrics.csv")
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b]
    assert len(list((tmp_path / "cache" / "prepared").glob("*/prepared.json"))) == 1
    # the prepared DIR as data.path trains the same
    assert main(train_args(tmp_path, tmp_path / "c", 4, "--set", f"data.path={prepared[0]}",
                           "--set", f"data.val_src_path={src}",
                           "--set", f"data.val_tgt_path={tgt}")) == 0
    c = read_metrics(tmp_path / "c" / "metrics.csv")
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in c]


def test_data_path_must_be_a_prepared_pairs_dir(tmp_path, capsys):
    src, tgt = corpus(tmp_path, 30)
    lm = prepare([src], tmp_path / "lm", "char", workers=1)
    val = ["--set", f"data.val_src_path={src}", "--set", f"data.val_tgt_path={tgt}"]
    assert main(train_args(tmp_path, tmp_path / "r", 2, "--set", f"data.path={lm}", *val)) == 2
    assert "is a prepared token dir of documents (for a language model), not of sentence " \
           "pairs" in capsys.readouterr().err
    assert main(train_args(tmp_path, tmp_path / "r", 2, "--set", f"data.path={src}", *val)) == 2
    assert "for translation it names a prepared pairs dir" in capsys.readouterr().err
    out = prepare_pairs(src, tgt, tmp_path / "p", "bpe", vocab_size=300, val_fraction=0.3,
                        workers=1)
    with pytest.raises(ConfigError, match="both name the training pairs"):
        TranslationTask(run_config(tmp_path, src, tgt, path=str(out)))
    with pytest.raises(ConfigError, match="data.src_add_special=True does not fit data.path"):
        TranslationTask(RunConfig.from_dict({"data": {
            "path": str(out), "src_add_special": True}}))
    # no val files: the DIR's own val split, its ids as prepared
    task = TranslationTask(RunConfig.from_dict({"data": {"path": str(out)}}))
    assert task.encode("val") == read_all(out, "val")
    assert [t for _, t in task.pairs("val")] == [task.tokenizer.decode(t)
                                                  for _, t in read_all(out, "val")]
