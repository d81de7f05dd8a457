"""`attnlab train | eval | data` end to end, and one-line errors (exit 2) on bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import shutil

import pytest
import torch

import _runs
from attnlab.cli import main
from attnlab.runs import RunDir, load_run, read_metrics

TEXT = "".join(f"to be or not to be, line {i}; that is the question.\n" for i in range(80))
MODEL = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
         "--set", "model.max_len=16"]
FAST = ["--set", "train.precision=fp32", "--set", "train.progress=false",
        "--set", "train.tensorboard=false", "--set", "train.log_every=2"]



@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def lm_args(text, out, steps=4, *extra):
    return ["train", "--set", f"data.path={text}", *MODEL, *FAST,
            "--set", f"train.max_steps={steps}", "--set", "train.eval_every=2",
            "--set", "train.batch_size=4", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """One small LM run shared by the tests that only read it."""
    base = tmp_path_factory.mktemp("lm")
    text = base / "text.txt"
    text.write_text(TEXT)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    args = lm_args(text, base / "run", 4, "--set", "train.samples=2", "--set",
                   "train.sample_tokens=20", "--set", "train.tensorboard=true")
    assert main(args) == 0
    torch.set_num_threads(before)
    return base / "run"


def test_train_writes_the_run_dir_and_prints_samples(lm_run, capsys):
    files = {p.name for p in lm_run.iterdir()}
    assert {"config.json", "tokenizer.json", "metrics.csv", "results.json", "last", "best",
            "tb", "loss.png"} <= files
    rows = read_metrics(lm_run / "metrics.csv")
    assert list(rows[0])[:4] == ["step", "train_loss", "val_loss", "lr"] and "ppl" in rows[0]
    assert [r["step"] for r in rows] == [2, 4] and all(r["val_loss"] for r in rows)
    cfg = json.loads((lm_run / "config.json").read_text())
    assert cfg["model"]["vocab_size"] == len(set(TEXT)) and cfg["model"]["family"] == "decoder"
    assert cfg["train"]["max_steps"] == 4
    assert any(p.name.startswith("events") for p in (lm_run / "tb").iterdir())


def test_eval_prints_loss_and_perplexity(lm_run, text, tmp_path, capsys, caplog):
    assert main(["eval", str(lm_run)]) == 0
    out = capsys.readouterr().out
    assert "val_loss:" in out and "ppl:" in out
    other = tmp_path / "other.txt"
    other.write_text(TEXT[::-1])
    assert main(["eval", str(lm_run), "--split", "test", "--data", str(other), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["data"] == str(other) and "split" not in result
    assert result["ppl"] == pytest.approx(
        torch.tensor(result["val_loss"]).exp().item(), rel=1e-5)
    assert "trained on" not in caplog.text


def test_eval_on_the_training_file_warns(lm_run, caplog):
    trained_on = json.loads((lm_run / "config.json").read_text())["data"]["path"]
    assert main(["eval", str(lm_run), "--data", trained_on, "--json"]) == 0
    assert "is the file this run trained on" in caplog.text


def test_demo_is_the_default_command(monkeypatch, tmp_path, capsys):
    """`attnlab` alone = `attnlab train` with the built-in demo config (shortened here)."""
    from attnlab import run_config as config

    small = {"model": {**config.DEMO["model"], "d_model": 32, "n_layers": 1, "max_len": 16},
             "data": {"name": "embedded"},
             "train": {**config.DEMO["train"], "max_steps": 2, "eval_every": 0,
                       "final_eval_batches": 1, "eval_batches": 1, "batch_size": 2,
                       "samples": 1, "sample_tokens": 10, "progress": False,
                       "tensorboard": False, "precision": "fp32"}}
    monkeypatch.setattr(config, "DEMO", small)
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "run dir: runs/demo" in out and "--- sample 1 ---" in out
    assert main([]) == 0  # a second demo does not clash with the first run dir
    assert "run dir: runs/demo-2" in capsys.readouterr().out
    # --resume without --out goes on with the newest run (it took the first, finished one)
    assert main(["train", "--resume", "--set", "train.max_steps=3"]) == 0
    assert "run dir: runs/demo-2" in capsys.readouterr().out
    assert RunDir(tmp_path / "runs" / "demo-2").read_metrics()[-1]["step"] == 3
    assert RunDir(tmp_path / "runs" / "demo").read_metrics()[-1]["step"] == 2


def test_classification_and_translation_end_to_end(tmp_path, capsys):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("label\tsentence\n" + "".join(
        f"{i % 2}\t{'great' if i % 2 else 'awful'} film {i}\n" for i in range(40)))
    args = ["train", "--set", f"data.path={tsv}", *MODEL, *FAST,
            "--set", "data.tokenizer=char", "--set", "train.max_steps=2",
            "--set", "train.batch_size=8", "--out", str(tmp_path / "cls")]
    assert main(args) == 0
    assert main(["eval", str(tmp_path / "cls")]) == 0
    out = capsys.readouterr().out
    assert "accuracy:" in out and "f1:" in out
    # names that contradict an explicit n_classes (they trained, then were dropped at use)
    assert main([*args[:-1], str(tmp_path / "cls3"), "--set", 'data.label_names=["a","b"]',
                 "--set", "model.n_classes=3"]) == 2
    assert "data.label_names has 2 names but model.n_classes=3" in capsys.readouterr().err
    assert not (tmp_path / "cls3").exists()
    src, tgt = tmp_path / "s.de", tmp_path / "t.en"
    src.write_text("".join(f"ein hund {i}\n" for i in range(20)))
    tgt.write_text("".join(f"a dog {i}\n" for i in range(20)))
    args = ["train", "--set", f"data.src_path={src}",
            "--set", f"data.tgt_path={tgt}", "--set", f"data.val_src_path={src}",
            "--set", f"data.val_tgt_path={tgt}", "--set", "data.tokenizer=bpe",
            "--set", "data.vocab_size=300", "--set", "data.pre_tokenizer=byte_level", *MODEL,
            *FAST, "--set", "train.max_steps=2", "--set", "train.max_tokens=64",
            "--set", "train.label_smoothing=0.1", "--set", "train.schedule=inverse_sqrt",
            "--out", str(tmp_path / "mt")]
    assert main(args) == 0
    assert main(["eval", str(tmp_path / "mt"), "--split", "test", "--data", str(src),
                 str(tgt)]) == 0
    assert "bleu:" in capsys.readouterr().out


def test_synthetic_task_needs_no_files(tmp_path, capsys):
    args = ["train", "--set", "data.name=reverse", *MODEL, *FAST, "--set", "train.max_steps=2",
            "--set", "data.val_size=8", "--out", str(tmp_path / "rev")]
    assert main(args) == 0
    assert "accuracy" in capsys.readouterr().out
    assert main(["eval", str(tmp_path / "rev"), "--stride", "4"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--stride is for language-model runs (perplexity); a synthetic run is "
        "scored without it (leave --stride out)")


def test_resume_continues_the_logged_losses(text, tmp_path, capsys):
    args = lm_args(text, tmp_path / "a", 4, "--set", "train.decay_steps=4",
                   "--set", "train.log_every=1")
    assert main(args) == 0
    half = lm_args(text, tmp_path / "b", 2, "--set", "train.decay_steps=4",
                   "--set", "train.log_every=1")
    assert main(half) == 0
    # resume with the run's own config, only max_steps raised
    assert main(["train", "--out", str(tmp_path / "b"), "--resume",
                 "--set", "train.max_steps=4"]) == 0
    a = read_metrics(tmp_path / "a" / "metrics.csv")
    b = read_metrics(tmp_path / "b" / "metrics.csv")
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b]
    assert len(a) == 4


def test_resume_drops_a_log_row_cut_after_the_checkpoint(text, tmp_path):
    # a kill or a full disk cut the row of step 3 (after last/ was saved at step 2) mid-number
    run = tmp_path / "b"
    assert main(lm_args(text, run, 2, "--set", "train.decay_steps=4",
                        "--set", "train.log_every=1")) == 0
    with (run / "metrics.csv").open("a", encoding="utf-8") as f:
        f.write("3,2.9e")  # no newline: the write never finished
    with pytest.raises(ValueError, match="line 4"):  # as it is, the log does not parse
        read_metrics(run / "metrics.csv")
    assert main(["train", "--out", str(run), "--resume", "--set", "train.max_steps=4"]) == 0
    rows = read_metrics(run / "metrics.csv")
    assert [r["step"] for r in rows if r["train_loss"] is not None] == [1, 2, 3, 4]
    a = tmp_path / "a"
    assert main(lm_args(text, a, 4, "--set", "train.decay_steps=4",
                        "--set", "train.log_every=1")) == 0
    assert [r["train_loss"] for r in read_metrics(a / "metrics.csv")] == \
        [r["train_loss"] for r in rows]


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", [
    "missing_file", "empty_file", "bad_label", "unknown_key", "wrong_type", "token_out_of_range",
    "other_config", "unwritable", "existing_checkpoint", "no_checkpoint_to_resume",
    "fetch_unknown", "fetch_offline", "eval_missing_run", "bad_recipe_name", "eval_unknown_chars",
    "eval_wrong_data_count", "resume_with_init_from", "resume_with_set_init_from",
    "resume_below_checkpoint", "resume_at_checkpoint", "resume_other_family", "eval_bad_device",
    "fetch_from_a_file", "eval_stride_past_the_block", "eval_negative_stride", "eval_zero_stride",
    "eval_length_penalty_of_an_lm",
])
def test_bad_input_is_one_line_exit_2_and_leaves_checkpoints_alone(case, lm_run, text, tmp_path,
                                                                   capsys, monkeypatch):
    before = digest(lm_run)
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("label\tsentence\n1\tfine\nmaybe\tnot a number\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("ZZZ qqq ~~~ @@@\n")
    run = str(lm_run)
    cases = {
        "missing_file": (lm_args(tmp_path / "nope.txt", tmp_path / "o"), "does not exist"),
        "empty_file": (lm_args(empty, tmp_path / "o"), "is empty"),
        "bad_label": (["train", "--set", f"data.path={tsv}",
                       "--out", str(tmp_path / "o")], "'maybe' is not an integer"),
        "unknown_key": (lm_args(text, tmp_path / "o", 4, "--set", "train.learning_rate=1"),
                        "unknown config key 'train.learning_rate'"),
        "wrong_type": (lm_args(text, tmp_path / "o", 4, "--set", "model.d_model=big"),
                       "model.d_model='big' has the wrong type: expected int"),
        "token_out_of_range": (lm_args(text, tmp_path / "o", 4, "--set", "model.vocab_size=5"),
                               "out of range; allowed: >= "),
        "other_config": (lm_args(text, run, 8, "--resume", "--set", "model.d_model=64"),
                         "different config: model.d_model is 32 there but 64 here"),
        "unwritable": (lm_args(text, blocker / "run"), "cannot write to run dir"),
        "existing_checkpoint": (lm_args(text, run), "already holds a checkpoint; pass --resume"),
        "no_checkpoint_to_resume": (lm_args(text, tmp_path / "fresh", 4, "--resume"),
                                    "has no last/ checkpoint"),
        "fetch_unknown": (["data", "fetch", "imagenet", "--cache", str(tmp_path)],
                          "unknown data set 'imagenet'"),
        "fetch_offline": (["train", "shakespeare_char", "--set",
                           f"data.cache_dir={tmp_path / 'cache'}", "--out", str(tmp_path / "o")],
                          "--set data.path=/path/to/input.txt"),
        "eval_missing_run": (["eval", str(tmp_path / "nothing")], "does not exist"),
        "bad_recipe_name": (["train", "no_such_recipe"], "recipes: "),
        "eval_unknown_chars": (["eval", run, "--data", str(unknown)], "not in the vocabulary"),
        "eval_wrong_data_count": (["eval", run, "--data", str(text), str(text)],
                                  "takes one file, got 2 paths"),
        "resume_with_init_from": (lm_args(text, run, 8, "--resume", "--init-from", run),
                                  "--resume continues the run in --out from its own checkpoint"),
        "resume_with_set_init_from": (lm_args(text, run, 8, "--resume", "--set",
                                              f"train.init_from={run}"),
                                      "--init-from (train.init_from) starts a new run"),
        "resume_below_checkpoint": (lm_args(text, run, 2, "--resume"),
                                    "train.max_steps=2 is not beyond the checkpoint's step 4: "
                                    "nothing to train"),
        "resume_at_checkpoint": (lm_args(text, run, 4, "--resume"),
                                 "train.max_steps=4 is not beyond the checkpoint's step 4"),
        "resume_other_family": (["train", "sst2", "--out", run, "--resume",
                                 "--set", f"data.path={tsv}"],
                                f"run dir {run} holds a decoder-only run (data.path="
                                f"{str(lm_run.parent / 'text.txt')!r}), "
                                "which cannot be resumed with an encoder-only recipe"),
        "eval_bad_device": (["eval", run, "--device", "cuda:99"], "--device 'cuda:99' but"),
        "eval_stride_past_the_block": (["eval", run, "--stride", "17"],
                                       "stride 17: allowed a whole number from 1 to the run's "
                                       "block of 16 tokens"),
        "eval_negative_stride": (["eval", run, "--stride", "-1"], "stride -1: allowed"),
        "eval_zero_stride": (["eval", run, "--stride", "0"], "stride 0: allowed a whole "
                             "number from 1 to the run's block of 16 tokens"),
        "eval_length_penalty_of_an_lm": (["eval", run, "--length-penalty", "1.0"],
                                         "--length-penalty is for beam search of translation "
                                         "runs; a language-model run is scored without it "
                                         "(leave --length-penalty out)"),
        "fetch_from_a_file": (["data", "fetch", "shakespeare", "--from", str(text), "--cache",
                               str(tmp_path / "cache")],
                              f"{text} is a file, not a folder: --from takes the folder "
                              f"holding the shakespeare files (here {text.parent})"),
    }
    if case == "fetch_offline":
        fetch_module = importlib.import_module("attnlab.data.fetch")  # (the package exports
        # a function of the same name)

        def offline(url, dest, timeout):
            raise OSError("network is unreachable")

        monkeypatch.setattr(fetch_module, "download_url", offline)
    argv, message = cases[case]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in err
    assert digest(lm_run) == before


def test_an_out_folder_of_other_files_is_refused_and_a_stopped_runs_files_are_not(
        text, tmp_path, capsys):
    """--out a folder of the user's own files: one line, none overwritten (its config.json
    was replaced by the run's); the files of a run stopped before its first checkpoint are
    trained over."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": 1}')
    (mine / "notes.txt").write_text("notes")
    assert main(lm_args(text, mine)) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"attnlab train: error: --out {mine} holds other files "
                                "(config.json, notes.txt) and is not an attnlab run dir; "
                                "choose a new or empty folder"]
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "notes.txt"]
    assert (mine / "config.json").read_text() == '{"mine": 1}'
    stopped = tmp_path / "stopped"  # config.json and tokenizer.json written, no checkpoint
    assert main(lm_args(text, stopped, 2)) == 0
    for folder in ("best", "last"):
        shutil.rmtree(stopped / folder, ignore_errors=True)
    assert main(lm_args(text, stopped, 2)) == 0
    assert RunDir(stopped).has_checkpoint("last")


def test_data_fetch_copies_a_local_file(tmp_path, capsys, monkeypatch):
    from attnlab.data.fetch import RemoteFile
    from attnlab.tasks import LMTask

    # a stand-in data set whose checksum we know (the real ones are not read by unit tests),
    # declared on the task as the real one is
    src = tmp_path / "src" / "tinyshakespeare"
    src.mkdir(parents=True)
    (src / "input.txt").write_text(TEXT)
    sha = hashlib.sha256(TEXT.encode()).hexdigest()
    sets = {s.name: s for s in LMTask.datasets}
    info = sets["shakespeare"].download
    fake = dataclasses.replace(info, files=(RemoteFile("input.txt", "http://x", sha),))
    sets["shakespeare"] = dataclasses.replace(sets["shakespeare"], download=fake)
    monkeypatch.setattr(LMTask, "datasets", tuple(sets.values()))
    args = ["data", "fetch", "shakespeare", "--from", str(tmp_path / "src"), "--cache",
            str(tmp_path / "cache")]
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cache" / "shakespeare")
    assert (tmp_path / "cache" / "shakespeare" / "input.txt").read_text() == TEXT


def test_resume_with_a_recipe_keeps_the_run_s_own_data_file(text, tmp_path, monkeypatch):
    """Settings the recipe and --set leave out come from the run: its data.path, not the
    data set the recipe would download."""
    fetch_module = importlib.import_module("attnlab.data.fetch")

    def offline(url, dest, timeout):
        raise OSError("network is unreachable")

    monkeypatch.setattr(fetch_module, "download_url", offline)
    recipe = tmp_path / "shakespeare_tiny.toml"
    recipe.write_text("\n".join([
        "[model]", "d_model = 32", "n_heads = 2", "n_layers = 1", "max_len = 16",
        "[data]", 'name = "shakespeare"', f'cache_dir = "{tmp_path / "cache"}"',
        "[train]", "batch_size = 4", "eval_every = 2", 'precision = "fp32"', "progress = false",
        "tensorboard = false", ""]))
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--set", f"data.path={text}", "--set",
                 "train.max_steps=2", "--out", str(run)]) == 0
    assert main(["train", str(recipe), "--out", str(run), "--resume",
                 "--set", "train.max_steps=4"]) == 0
    assert json.loads((run / "config.json").read_text())["data"]["path"] == str(text)
    assert [r["step"] for r in read_metrics(run / "metrics.csv")] == [2, 4]
    # nothing downloaded (the cache holds only the text file prepared once into prepared/)
    assert not (tmp_path / "cache" / "shakespeare").exists()


@pytest.mark.parametrize("given, missing", [("src_path", "tgt_path"), ("tgt_path", "src_path"),
                                            ("val_src_path", "val_tgt_path"),
                                            ("val_tgt_path", "val_src_path")])
def test_translation_refuses_one_file_of_a_pair(given, missing, text, tmp_path, capsys,
                                                monkeypatch):
    def offline(url, dest, timeout):
        raise OSError("network is unreachable")

    monkeypatch.setattr(importlib.import_module("attnlab.data.fetch"), "download_url", offline)
    argv = ["train", "multi30k_de_en", "--set", f"data.{given}={text}",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(tmp_path / "mt")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"data.{given} is set but data.{missing} is not: give both (or "
                        "neither, to use the downloaded multi30k)"), err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "mt").exists()


def test_eval_of_an_imported_lm_asks_for_data(tmp_path, capsys):
    """A run dir imported from Hugging Face names no data file: eval says to pass --data."""
    run = _runs.lm_run(tmp_path / "imported", data={"name": ""})
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(
        "has no val data of its own (its config names no data set and no data.path); pass "
        "the language-model data to evaluate on with --data FILE"), err
    other = tmp_path / "other.txt"
    other.write_text(_runs.TEXT * 4)
    assert main(["eval", str(run), "--data", str(other)]) == 0
    assert "ppl:" in capsys.readouterr().out


@pytest.mark.parametrize("stride", [32, 7, 1])
def test_a_strided_eval_scores_each_target_once_from_its_first_window(tmp_path, capsys, stride):
    """``eval --stride N``: windows of the block every N tokens and one ending at the last
    token, each target scored once by the first window that holds it; checked against a loop
    that scores each target on its own, in that window."""
    tok = _runs.char_tokenizer()  # (no pad id: every character is a target)
    run = _runs.write_run(tmp_path / "run", _runs.tiny_lm(vocab_size=tok.vocab_size, max_len=32,
                                                          pad_id=None), tok, {"name": ""})
    text = tmp_path / "val.txt"
    text.write_text(_runs.TEXT * 5)  # 225 characters: 224 targets
    assert main(["eval", str(run), "--data", str(text), "--stride", str(stride), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    loaded = load_run(run)
    ids = torch.tensor(loaded.tokenizer.encode(text.read_text()))
    block, n = 32, len(ids)
    starts = [*range(0, n - block, stride), n - 1 - block]
    losses = []
    for j in range(n - 1):  # target j: the token j + 1
        w = min(s for s in starts if s <= j < s + block)  # the first window holding it
        if stride < block and w >= stride:
            assert j - w >= block - stride  # at least block - stride tokens before it
        with torch.no_grad():
            logits, _ = loaded.model(ids[None, w:w + block])
        losses.append(torch.nn.functional.cross_entropy(logits[0, j - w], ids[j + 1]).item())
    assert got["stride"] == stride and got["window"] == block
    assert got["val_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    if stride == block:  # non-overlapping windows: the evaluation without --stride
        assert main(["eval", str(run), "--data", str(text), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["val_loss"] == got["val_loss"]


@pytest.mark.parametrize("failure", ["offline", "bad_checksum"])
def test_a_failed_fetch_leaves_no_folder_behind(failure, tmp_path, capsys, monkeypatch):
    fetch_module = importlib.import_module("attnlab.data.fetch")

    def download(url, dest, timeout):
        if failure == "offline":
            raise OSError("network is unreachable")
        dest.write_text("not the data set")

    monkeypatch.setattr(fetch_module, "download_url", download)
    assert main(["data", "fetch", "shakespeare", "--cache", str(tmp_path / "c" / "d")]) == 2
    err = capsys.readouterr().err
    assert ("downloading" if failure == "offline" else "checksum mismatch") in err
    assert not (tmp_path / "c").exists()


def test_the_translation_recipe_is_deterministic_for_a_seed(tmp_path):
    """`attnlab train multi30k_de_en` twice with one seed, in fresh processes with other hash
    seeds: the same BPE vocabulary, the same losses and BLEU, the same weights bit for bit
    (dropout on, so the random streams are exercised); another seed trains other weights."""
    import os
    import subprocess
    import sys

    pairs = [("ein hund läuft schnell .", "a dog runs fast ."),
             ("eine katze schläft hier .", "a cat sleeps here ."),
             ("zwei männer gehen heim .", "two men walk home ."),
             ("ein kind spielt im park .", "a child plays in the park .")]
    for split, n in (("train", 40), ("val", 2)):
        for side, lang in ((0, "de"), (1, "en")):
            (tmp_path / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs * n))

    def train(out: str, seed: int, hash_seed: str) -> dict:
        argv = [sys.executable, "-m", "attnlab", "train", "multi30k_de_en", "--out",
                str(tmp_path / out), "--seed", str(seed), *FAST,
                *(f"--set=data.{k}_path={tmp_path}/{f}" for k, f in (
                    ("src", "train.de"), ("tgt", "train.en"), ("val_src", "val.de"),
                    ("val_tgt", "val.en"))),
                "--set", "data.vocab_size=300", "--set", "model.d_model=32",
                "--set", "model.n_heads=2", "--set", "model.d_ff=64",
                "--set", "train.max_steps=6", "--set", "train.eval_every=3",
                "--set", "train.warmup_steps=2", "--set", "train.max_tokens=256"]
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        run = RunDir(tmp_path / out)
        rows = [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")}
                for r in read_metrics(run.path / "metrics.csv")]
        return {"tokenizer": (run.path / "tokenizer.json").read_bytes(), "metrics": rows,
                "weights": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                            for p in sorted((run.path / "last").glob("*.safetensors"))}}

    first, again, other = train("a", 7, "1"), train("b", 7, "2"), train("c", 8, "1")
    assert first["weights"] and any("bleu" in r and r["bleu"] is not None
                                    for r in first["metrics"])
    assert first == again
    assert other["tokenizer"] == first["tokenizer"]  # the vocabulary depends on the text alone
    assert other["weights"] != first["weights"]


@pytest.mark.parametrize("key", ["model.n_head", "data.nam", "train.lrr"])
def test_an_unknown_key_is_one_same_line_from_a_recipe_a_set_and_a_run_dirs_config(
        key, tmp_path, capsys):
    """A recipe file, --set and a run dir's config.json (read by eval, a resume, and by
    sample for the model) check their keys in one place: the same line from each, the run
    dir's naming its file first."""
    section, name = key.split(".")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f"[{section}]\n{name} = 1\n")
    run = RunDir(_runs.lm_run(tmp_path / "run"))
    config = run.read_config()
    config[section][name] = 1
    run.write_config(config)
    calls = [["train", recipe, "--print-config"],
             ["train", "--set", f"{key}=1", "--print-config"], ["eval", run.path],
             ["train", "--out", run.path, "--resume", "--print-config"]]
    if section == "model":  # (sample reads the model's section alone)
        calls.append(["sample", run.path, "--prompt", "the", "--max-new-tokens", "1"])
    lines = set()
    for argv in calls:
        assert main([str(a) for a in argv]) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, (argv, err)
        line = err.strip().partition(": error: ")[2]
        if run.path in argv:  # (the file the key is in)
            assert line.startswith(f"{run.config_file}: "), (argv, line)
            line = line.removeprefix(f"{run.config_file}: ")
        lines.add(line)
    assert len(lines) == 1, lines
    head, _, allowed = lines.pop().partition("]: ")
    assert head == f"unknown config key '{key}'; allowed keys in [{section}", head
    assert {"model": {"d_model", "n_heads"}, "data": {"name", "path"},
            "train": {"lr", "seed"}}[section] <= set(allowed.split(", ")), allowed


def test_data_unk_maps_unknown_characters_so_a_prompt_may_hold_any(text, tmp_path, capsys):
    """data.unk = true: the char vocabulary has <unk>, so sampling from a prompt with a
    character the training text lacks works; without it, the error names the setting."""
    out = tmp_path / "unk"
    assert main(lm_args(text, out, 2, "--set", "data.unk=true")) == 0
    tok = RunDir(out).load_tokenizer()
    assert tok.unk_id is not None and tok.encode("Z") == [tok.unk_id]
    capsys.readouterr()
    prompt = ["--prompt", "Zebra €", "--max-new-tokens", "3"]
    assert main(["sample", str(out), *prompt]) == 0
    plain = tmp_path / "plain"
    assert main(lm_args(text, plain, 2)) == 0
    capsys.readouterr()
    assert main(["sample", str(plain), *prompt]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--set data.unk=true" in err and "specials=" not in err
    assert main(lm_args(text, tmp_path / "bpe", 2, "--set", "data.unk=true", "--set",
                        "data.tokenizer=bpe")) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "data.unk=True is not allowed" in err


def test_a_whitespace_bpe_run_prints_its_samples_from_the_default_prompt(text, tmp_path,
                                                                         capsys):
    """A whitespace pre-tokenizer drops a newline: the default prompt of the samples is then
    a token the tokenizer reads back."""
    from attnlab.train.runner import default_prompt

    out = tmp_path / "bpe"
    args = lm_args(text, out, 2, "--set", "data.tokenizer=bpe", "--set",
                   "data.pre_tokenizer=whitespace", "--set", "data.vocab_size=64", "--set",
                   "train.samples=1", "--set", "train.sample_tokens=5")
    assert main(args) == 0, capsys.readouterr().err
    assert "--- sample 1 ---" in capsys.readouterr().out
    tok = RunDir(out).load_tokenizer()
    assert tok.encode("\n") == [] and tok.encode(default_prompt(tok))
    assert default_prompt(load_run(_runs.lm_run(tmp_path / "char")).tokenizer) == "\n"


def test_a_key_the_run_does_not_read_is_said_once_not_on_resume_or_init_from(text, tmp_path,
                                                                            caplog):
    """``--set data.seq_max`` on a language model: one warning when the run starts; resuming
    it (its config.json holds every key of every family) and starting a run from its
    weights say nothing of the keys the run dir brought; a resume's own ``--set`` of a key
    it does not read is said."""
    import logging

    def warned(argv) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="attnlab"):
            assert main(argv) == 0
        return [r.getMessage() for r in caplog.records if "does not apply" in r.getMessage()]

    said = warned(lm_args(text, tmp_path / "a", 2, "--set", "data.seq_max=30",
                          "--set", "train.warmup_steps=1"))
    assert len(said) == 1 and said[0].startswith("data.seq_max does not apply to this run"), said
    assert warned(["train", "--out", str(tmp_path / "a"), "--resume",
                   "--set", "train.max_steps=4"]) == []
    said = warned(["train", "--out", str(tmp_path / "a"), "--resume", "--set",
                   "train.max_steps=6", "--set", "train.max_tokens=512"])
    assert len(said) == 1 and said[0].startswith("train.max_tokens does not apply"), said
    assert warned(lm_args(text, tmp_path / "b", 2, "--init-from", str(tmp_path / "a"),
                          "--set", "train.warmup_steps=1")) == []
