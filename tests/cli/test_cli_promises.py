"""What the README and the command line promise a new user, end to end on tiny data: beam
search in `eval`, several prompts in `sample`, evaluations shown while training, usable
synthetic runs, `info` on recipes, and messages that say what they measured."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
import torch

from _runs import TEXT, lm_run, seq2seq_run
from attnlab.cli import main
from attnlab.decoding import translate_texts
from attnlab.metrics import bleu
from attnlab.runs import load_run, read_metrics
from attnlab.tokenizers import IdTokenizer, load_tokenizer, tokenizer_from_dict

MODEL = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
         "--set", "model.max_len=16"]
FAST = ["--set", "train.progress=false", "--set", "train.tensorboard=false",
        "--set", "train.log_every=2"]


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    """A reverse run trained for 4 steps in bf16 (evaluated at steps 2 and 4)."""
    out = tmp_path_factory.mktemp("rev") / "run"
    assert main(["train", "reverse", *MODEL, *FAST, "--set", "train.precision=bf16",
                 "--set", "train.max_steps=4", "--set", "train.eval_every=2",
                 "--set", "data.val_size=16", "--set", "data.seq_max=6",
                 "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory):
    """A tiny translation run whose val split is a file of sentences from TEXT's characters."""
    base = tmp_path_factory.mktemp("mt")
    src, tgt = base / "val.src", base / "val.tgt"
    src.write_text("the dog\nlazy fox\nquick brown\n")
    tgt.write_text("a dog\nthe fox\nbrown quick\n")
    data = {"src_path": str(src), "tgt_path": str(tgt),
            "val_src_path": str(src), "val_tgt_path": str(tgt)}
    return seq2seq_run(base / "run", data=data), src, tgt


# ---- 1. eval --beam ------------------------------------------------------------------------
def test_eval_bleu_with_beam_search_says_which_decoding(mt_run, capsys):
    run, src, tgt = mt_run
    code, out, err = run_cli(capsys, "eval", run, "--beam", 3, "--length-penalty", 1.0,
                             "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["decoding"] == "beam search, beam 3, length penalty 1"
    loaded = load_run(run)
    hyps = translate_texts(loaded.model, src.read_text().splitlines(), loaded.tokenizer,
                           beam=3, length_penalty=1.0)
    assert result["bleu"] == pytest.approx(bleu(hyps, tgt.read_text().splitlines()))
    code, out, _ = run_cli(capsys, "eval", run)
    assert code == 0 and "decoding: greedy" in out


def test_eval_beam_on_a_run_that_does_not_decode_is_one_line(tmp_path, capsys):
    code, out, err = run_cli(capsys, "eval", lm_run(tmp_path / "lm"), "--beam", 4)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--beam is for translation runs" in err


def test_eval_beam_scores_a_synthetic_run_with_beam_search(reverse_run, capsys):
    """`attnlab eval RUN --beam 4` on reverse / copy / sort was refused ("a synthetic run is
    scored without beam search"): its accuracy is exact-match decoding, which a beam can do."""
    from attnlab.decoding import translate
    from attnlab.tasks import build_task
    from attnlab.train import RunConfig

    code, out, err = run_cli(capsys, "eval", reverse_run, "--beam", 4, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["decoding"] == "beam search, beam 4, length penalty 0.6"
    # the same figure by hand: each held-out sequence beam-searched, compared with its answer
    task = build_task(RunConfig.from_dict(json.loads((reverse_run / "config.json").read_text())))
    model, data = load_run(reverse_run).model, task.data
    right = total = 0
    for src, _, _ in task.examples("val"):
        rows = [[t for t in row if t != data.pad_id] for row in src.tolist()]
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the run trained in bf16
            hyps = translate(model, rows, beam=4, max_len=data.max_len + 1, bos_id=data.bos_id,
                             eos_id=data.eos_id, pad_id=data.pad_id)
        right += sum(h == data.answer(r) for r, h in zip(rows, hyps))
        total += len(rows)
    assert result["accuracy"] == pytest.approx(right / total)
    code, out, _ = run_cli(capsys, "eval", reverse_run, "--json")
    assert code == 0 and json.loads(out)["decoding"] == "greedy"


# ---- 8. eval names the data it evaluated ------------------------------------------------------
def test_eval_with_data_files_prints_them_not_the_split(mt_run, capsys):
    run, src, tgt = mt_run
    code, out, _ = run_cli(capsys, "eval", run, "--data", src, tgt)
    assert code == 0
    assert f"data: {src} {tgt}" in out and "split:" not in out


# ---- 2. several prompts ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return lm_run(tmp_path_factory.mktemp("lm") / "run")


def _greedy(capsys, run, *prompt_args):
    return run_cli(capsys, "sample", run, *prompt_args, "--temperature", 0,
                   "--max-new-tokens", 8)


def test_sample_several_prompts_each_labelled_and_equal_to_one_at_a_time(lm, capsys, tmp_path):
    singles = []
    for prompt in ("the ", "lazy dog"):
        code, out, _ = _greedy(capsys, lm, "--prompt", prompt)
        assert code == 0
        singles.append(out.rstrip("\n"))
    code, out, _ = _greedy(capsys, lm, "--prompt", "the ", "--prompt", "lazy dog")
    assert code == 0
    assert out == f"--- prompt 1 ---\n{singles[0]}\n--- prompt 2 ---\n{singles[1]}\n"
    file = tmp_path / "prompts.txt"
    file.write_text("the \n\nlazy dog\n")
    code, from_file, _ = _greedy(capsys, lm, "--prompt-file", file)
    assert code == 0 and from_file == out


def test_sample_prompt_file_errors_are_one_line(lm, capsys, tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    for args, message in ((["--prompt-file", blank], "has no prompt"),
                          (["--prompt-file", tmp_path / "nope.txt"], "does not exist"),
                          ([], "no prompt")):
        code, out, err = run_cli(capsys, "sample", lm, *args)
        assert code == 2 and out == "" and message in err and len(err.splitlines()) == 1


# ---- 3. evaluations are shown while training; -v is attnlab's debug output -----------------
def test_training_logs_each_evaluation_as_it_happens(reverse_run, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert main(["train", "copy", *MODEL, *FAST, "--set", "train.max_steps=4",
                 "--set", "train.eval_every=2", "--set", "data.val_size=8",
                 "--set", "train.precision=fp32", "--out", str(tmp_path / "copy")]) == 0
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    evals = [line for line in lines if line.startswith("step ") and "val_loss" in line]
    assert [e.split()[1] for e in evals] == ["2", "4"]
    assert all("accuracy" in e for e in evals)
    rows = read_metrics(tmp_path / "copy" / "metrics.csv")
    assert f"val_loss {rows[0]['val_loss']:.4f}" in evals[0]
    assert any("training an encoder-decoder model" in line for line in lines)  # 8: in words


def test_verbose_leaves_third_party_loggers_at_warning(lm, capsys, caplog):
    caplog.set_level(logging.DEBUG)  # the root level -v sets
    for name in ("matplotlib", "PIL"):
        logging.getLogger(name).setLevel(logging.NOTSET)
    code, _, _ = run_cli(capsys, "-v", "info", lm)
    assert code == 0
    assert logging.getLogger("matplotlib").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("PIL").getEffectiveLevel() == logging.WARNING


# ---- 4. synthetic runs have a tokenizer of ids -----------------------------------------------
def test_id_tokenizer_text_is_the_ids():
    tok = IdTokenizer(16)
    assert tok.encode("5 9  4 12") == [5, 9, 4, 12]
    assert tok.encode("5 9", add_special=True) == [1, 5, 9, 2]
    assert tok.decode([1, 12, 4, 9, 5, 2, 0]) == "12 4 9 5"
    assert tok.token_strings([1, 5]) == ["<bos>", "5"]
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, None)
    again = tokenizer_from_dict(tok.to_dict())
    assert isinstance(again, IdTokenizer) and again.vocab_size == 16
    for bad in ("5 x", "16", "2", "-3", "5.0"):
        with pytest.raises(ValueError, match="not a token id of this run"):
            tok.encode(bad)


def test_synthetic_run_translates_and_visualises_ids(reverse_run, capsys, monkeypatch, tmp_path):
    tok = load_tokenizer(reverse_run / "tokenizer.json")
    assert isinstance(tok, IdTokenizer) and tok.vocab_size == 16
    monkeypatch.setattr(sys, "stdin", io.StringIO("5 9 4 12\n\n3 3\n"))
    code, out, err = run_cli(capsys, "translate", reverse_run)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    run = load_run(reverse_run)
    assert lines[0] == translate_texts(run.model, ["5 9 4 12"], run.tokenizer)[0]
    for line in (lines[0], lines[2]):
        assert all(w.isdigit() and 3 <= int(w) < 16 for w in line.split())
    monkeypatch.setattr(sys, "stdin", io.StringIO("5 x\n"))
    code, out, err = run_cli(capsys, "translate", reverse_run)
    assert code == 2 and out == "" and "'x' is not a token id" in err
    png = tmp_path / "a.png"
    code, _, err = run_cli(capsys, "viz", "attention", reverse_run, "--text", "5 9 4",
                           "--target", "4 9 5", "--out", png)
    assert code == 0, err
    assert list(tmp_path.glob("a*.png"))


# ---- 9. eval gives the number training recorded for the same checkpoint ----------------------
def test_eval_of_best_equals_what_training_recorded(reverse_run, capsys):
    code, out, _ = run_cli(capsys, "eval", reverse_run, "--json")
    assert code == 0
    result = json.loads(out)
    row = {r["step"]: r for r in read_metrics(reverse_run / "metrics.csv")}
    best_step = json.loads((reverse_run / "results.json").read_text())["best"]["step"]
    assert result["precision"] == "bf16"
    assert result["val_loss"] == pytest.approx(row[best_step]["val_loss"], rel=1e-7, abs=0)
    assert result["accuracy"] == row[best_step]["accuracy"]


# ---- 6. info on recipes ----------------------------------------------------------------------
def test_info_takes_a_recipe_name_and_says_which_vocabulary(capsys):
    code, out, err = run_cli(capsys, "info", "sst2")
    assert code == 0, err
    assert out.startswith("vocabulary: 8000 (data.vocab_size")
    code, out, _ = run_cli(capsys, "info", "multi30k_de_en")
    assert code == 0 and "vocabulary: 8000" in out
    assert "encoder_decoder" in out and "6,002,688" in out  # 8000 x 256 shared embeddings
    code, out, _ = run_cli(capsys, "info", "shakespeare_char")
    assert code == 0 and "assumed" in out.splitlines()[0]
    code, out, err = run_cli(capsys, "info", "no_such_recipe")
    assert code == 2 and "recipes:" in err and len(err.splitlines()) == 1


# ---- 7. compiling says so before it stalls ---------------------------------------------------
def test_compile_is_announced(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)  # the message, not the wait
    caplog.set_level(logging.INFO)
    assert main(["train", "copy", *MODEL, *FAST, "--set", "train.max_steps=1",
                 "--set", "data.val_size=4", "--set", "train.precision=fp32",
                 "--set", "train.compile=true", "--out", str(tmp_path / "c")]) == 0
    assert "compiling the model with torch.compile" in caplog.text
    assert "takes a while" in caplog.text


# ---- 8. the final line and the best line say what they measured ------------------------------
def test_final_and_best_lines_say_which_evaluation(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 40)
    code, out, err = run_cli(capsys, "train", "--set",
                             f"data.path={text}", *MODEL, *FAST, "--set", "train.max_steps=2",
                             "--set", "train.eval_every=2", "--set", "train.eval_batches=1",
                             "--set", "train.batch_size=2", "--set", "train.precision=fp32",
                             "--out", tmp_path / "lm")
    assert code == 0, err
    assert "final evaluation on the whole val split" in out
    assert "(evaluation on 1 sampled val batches)" in out


def test_loss_plot_is_titled_by_what_it_shows_with_a_metric_panel(tmp_path, monkeypatch):
    from attnlab.viz import curves

    csv = tmp_path / "myrun" / "metrics.csv"
    csv.parent.mkdir()
    csv.write_text("step,train_loss,val_loss,lr,tokens_per_s,elapsed_s,accuracy\n"
                   "1,2.0,,0.001,10,1,\n2,1.5,1.6,0.001,10,2,0.25\n4,1.0,1.2,0.0005,10,3,0.5\n")
    figures = []
    real = curves.save_figure
    monkeypatch.setattr(curves, "save_figure", lambda fig, path: figures.append(fig) or
                        real(fig, path))
    curves.plot_loss_csv(csv, tmp_path / "loss.png")
    fig = figures[0]
    title = fig._suptitle.get_text()
    assert "metrics.csv" not in title and "accuracy" in title and "myrun" in title
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "accuracy", "learning rate"]
