"""`attnlab sample | translate | classify` end to end on tiny run dirs, and their errors."""

from __future__ import annotations

import io
import os
import re
import sys

import pytest
import torch

from _runs import TEXT, classifier_run, lm_run, seq2seq_run
from attnlab.cli import main
from attnlab.decoding import classify_texts, translate_texts
from attnlab.decoding.lm import window_keep
from attnlab.runs import load_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {"lm": lm_run(root / "lm"), "mt": seq2seq_run(root / "mt"),
            "cls": classifier_run(root / "cls"),
            "empty": lm_run(root / "empty", checkpoint=False)}


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_sample_streams_prompt_and_continuation(runs, capsys):
    code, out, err = run_cli(capsys, "sample", runs["lm"], "--prompt", "the ",
                             "--max-new-tokens", 20, "--seed", 1)
    assert code == 0, err
    assert out.startswith("the ") and out.endswith("\n")
    assert len(out) == len("the ") + 20 + 1  # char tokenizer without eos: exactly 20 chars
    assert set(out) <= set(TEXT)
    again = run_cli(capsys, "sample", runs["lm"], "--prompt", "the ", "--max-new-tokens", 20,
                    "--seed", 1)[1]
    other = run_cli(capsys, "sample", runs["lm"], "--prompt", "the ", "--max-new-tokens", 20,
                    "--seed", 2)[1]
    assert again == out and other != out


def test_sample_writes_each_piece_as_it_comes(runs, monkeypatch):
    writes = []

    class Recorder(io.StringIO):
        def write(self, s):
            writes.append(s)
            return super().write(s)

    monkeypatch.setattr(sys, "stdout", Recorder())
    assert main(["sample", str(runs["lm"]), "--prompt", "a", "--max-new-tokens", "12",
                 "--temperature", "0"]) == 0
    assert len([w for w in writes if w and w != "\n"]) >= 12  # the prompt, then piece by piece


def test_sample_several_samples_top_k_top_p_stop(runs, capsys):
    code, out, err = run_cli(capsys, "sample", runs["lm"], "--prompt", "dog", "--num-samples", 3,
                             "--max-new-tokens", 15, "--top-k", 5, "--top-p", 0.9, "--seed", 0)
    assert code == 0, err
    assert out.count("--- sample") == 3
    samples = [s.strip("\n") for s in out.split("--- sample")[1:]]
    assert all(s.split("\n", 1)[1].startswith("dog") for s in samples)
    code, out, _ = run_cli(capsys, "sample", runs["lm"], "--prompt", "dog", "--temperature", 0,
                           "--max-new-tokens", 30)
    stop = out[5:7]
    code, cut, _ = run_cli(capsys, "sample", runs["lm"], "--prompt", "dog", "--temperature", 0,
                           "--max-new-tokens", 30, "--stop", stop)
    assert code == 0 and cut == out[:out.index(stop, 3)] + "\n"


def test_translate_file_and_stdin(runs, capsys, tmp_path, monkeypatch):
    src = tmp_path / "src.txt"
    src.write_text("the dog\n\nquick fox.\nlazy\n")
    code, out, err = run_cli(capsys, "translate", runs["mt"], "--input", src, "--beam", 3,
                             "--max-len", 10, "--batch-size", 2)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 4 and lines[1] == ""  # aligned with the input, blanks kept
    run = load_run(runs["mt"])
    add = bool(run.data.get("src_add_special", False))
    expected = translate_texts(run.model, ["the dog", "quick fox.", "lazy"], run.tokenizer,
                               add_special=add, beam=3, max_len=10)
    assert [lines[0], lines[2], lines[3]] == expected
    monkeypatch.setattr(sys, "stdin", io.StringIO("the dog\nquick fox.\n"))
    code, out, _ = run_cli(capsys, "translate", runs["mt"], "--max-len", 10)
    greedy = translate_texts(run.model, ["the dog", "quick fox."], run.tokenizer,
                             add_special=add, beam=1, max_len=10)
    assert code == 0 and out == "\n".join(greedy) + "\n"


def test_classify_prints_label_probability_text(runs, capsys, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("the quick dog\n\nlazy fox.\nover\n")
    code, out, err = run_cli(capsys, "classify", runs["cls"], "--input", src)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4 and lines[1] == ""  # one line per input line: `paste` lines up
    rows = [line.split("\t") for line in lines if line]
    assert [r[2] for r in rows] == ["the quick dog", "lazy fox.", "over"]
    assert all(r[0] in {"neg", "neutral", "pos"} and 1 / 3 <= float(r[1]) <= 1 for r in rows)
    run = load_run(runs["cls"])
    expected = classify_texts(run.model, run.tokenizer, ["the quick dog", "lazy fox.", "over"],
                              label_names=run.label_names, max_len=run.data.get("max_len"))
    assert [(r[0], round(p, 4)) for r, (_, p) in zip(rows, expected)] == [
        (label, float(r[1])) for r, (label, _) in zip(rows, expected)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "int8"])
def test_sample_dtype_runs_and_stays_close_to_fp32(runs, capsys, dtype, monkeypatch):
    if dtype != "bf16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("FBGEMM kernels (x86) are not in this PyTorch build")
    from attnlab.decoding import quant

    argv = ["sample", runs["lm"], "--prompt", "the ", "--max-new-tokens", 30,
            "--temperature", 0]
    code, ref, err = run_cli(capsys, *argv)
    assert code == 0, err
    converted = []
    real = quant.to_inference_dtype
    monkeypatch.setattr(quant, "to_inference_dtype",
                        lambda model, d: converted.append(real(model, d)) or converted[-1])
    code, out, err = run_cli(capsys, *argv, "--dtype", dtype)
    assert code == 0, err
    model = converted[0]  # the model that sampled really is in the new dtype
    assert ({p.dtype for p in model.parameters()} == {torch.bfloat16} if dtype == "bf16"
            else any(isinstance(m, quant.PackedLinear) for m in model.modules()))
    assert len(out) == len(ref) and out.startswith("the ")
    # greedy: given the fp32 text so far, the converted model picks fp32's next character at
    # >= 90% of the positions (a free-running comparison goes apart for good at the first
    # near-tie: this tiny model repeats characters); tolerances in test_generate.py bound the
    # logits themselves
    from attnlab.runs import load_run

    run = load_run(runs["lm"])
    text = ref.rstrip("\n")
    ids = torch.tensor([run.tokenizer.encode(text)])[:, :run.model.config.max_len]
    with torch.inference_mode():
        fp32_next = run.model(ids)[0].argmax(-1)[0, :-1]
        low_next = model(ids)[0].argmax(-1)[0, :-1]
    assert torch.equal(fp32_next[3:], ids[0, 4:])  # the fp32 text is fp32's greedy choice
    assert (low_next[3:] == fp32_next[3:]).float().mean() >= 0.9, (out, ref)


@pytest.mark.parametrize("argv, message", [
    (["sample", "lm", "--prompt", ""], "prompt is empty"),
    (["sample", "lm", "--prompt", "QZ!"], "not in the vocabulary"),
    (["sample", "lm", "--prompt", "the", "--top-p", "0"], "top_p"),
    (["sample", "lm", "--prompt", "the", "--top-p", "1.5"], "top_p"),
    (["sample", "lm", "--prompt", "the", "--temperature", "-1"], "temperature"),
    (["sample", "empty", "--prompt", "the"], "no checkpoint"),
    (["sample", "cls", "--prompt", "the"], "needs a decoder-only"),
    (["translate", "lm", "--input", "IN"], "needs an encoder-decoder"),
    (["classify", "mt", "--input", "IN"], "needs an encoder-only (family 'encoder') run"),
    (["sample", "missing", "--prompt", "the"], "does not exist"),
    (["translate", "mt", "--input", "nowhere.txt"], "does not exist"),
    (["translate", "mt", "--input", "IN", "--beam", "0"], "--beam"),
    (["translate", "mt", "--input", "IN", "--beam", "3", "--length-penalty", "nan"],
     "--length-penalty nan is not allowed"),
    (["translate", "mt", "--input", "IN", "--max-len", "1000"], "max_len"),
    (["classify", "cls", "--input", "EMPTY"], "no text"),
    (["sample", "lm", "--prompt", "the", "--dtype", "int4"],
     "--dtype 'int4' is not allowed; allowed: fp32, bf16, fp16, int8"),
])
def test_bad_input_is_one_line_and_exit_code_2(runs, capsys, tmp_path, argv, message):
    (tmp_path / "in.txt").write_text("the dog\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    names = {**{k: str(v) for k, v in runs.items()}, "missing": str(tmp_path / "nope"),
             "IN": str(tmp_path / "in.txt"), "EMPTY": str(tmp_path / "empty.txt")}
    code, out, err = run_cli(capsys, *[names.get(a, a) for a in argv])
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert message in err, err


def test_eval_and_classify_take_a_weights_file_as_checkpoint(tmp_path, capsys):
    """--checkpoint FILE.safetensors (the help offers it) loads that file; its metadata is the
    manifest beside it."""
    run = classifier_run(tmp_path / "cls")
    weights = run / "best" / "model.safetensors"
    (tmp_path / "in.txt").write_text("the quick fox\n")
    assert main(["classify", str(run), "--input", str(tmp_path / "in.txt"),
                 "--checkpoint", str(weights)]) == 0
    assert capsys.readouterr().out.strip().endswith("the quick fox")


@pytest.mark.parametrize("how", ["-", "/dev/stdin"])
def test_classify_and_translate_read_a_pipe(runs, capsys, monkeypatch, tmp_path, how):
    """`--input -` and `--input /dev/stdin` (a pipe, not a regular file) read standard input;
    the output is what --input FILE gives, blank lines kept in place."""
    text = "the quick dog\n\nlazy fox.\n"
    (tmp_path / "in.txt").write_text(text)
    for command, run in (("classify", runs["cls"]), ("translate", runs["mt"])):
        code, expected, err = run_cli(capsys, command, run, "--input", tmp_path / "in.txt")
        assert code == 0, err
        if how == "/dev/stdin":  # a real pipe behind file descriptor 0
            r, w = os.pipe()
            os.write(w, text.encode())
            os.close(w)
            saved = os.dup(0)
            os.dup2(r, 0)
            os.close(r)
            try:
                code, out, err = run_cli(capsys, command, run, "--input", how)
            finally:
                os.dup2(saved, 0)
                os.close(saved)
        else:
            monkeypatch.setattr(sys, "stdin", io.StringIO(text))
            code, out, err = run_cli(capsys, command, run, "--input", how)
        assert code == 0, err
        assert out == expected and out.splitlines()[1] == ""


def test_inputs_longer_than_max_len_are_read_in_part_and_say_so(runs, capsys, tmp_path,
                                                                 caplog):
    """A text longer than max_len is cut to it (as in training) with one warning (the CLI
    logs warnings to stderr); shorter ones give none."""
    long = tmp_path / "long.txt"
    long.write_text("the fox " * 40 + "\nto be\n")

    def warnings_of(*argv) -> list[str]:
        caplog.clear()
        code, out, err = run_cli(capsys, *argv)
        assert code == 0 and len(out.splitlines()) == len(argv[-1].read_text().splitlines()), err
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]

    for command, run in (("translate", runs["mt"]), ("classify", runs["cls"])):
        (line,) = warnings_of(command, run, "--input", long)
        assert line.startswith("1 of 2 ") and "tokens (max_len): only their first" in line
        (line,) = warnings_of(command, run, "--batch-size", 1, "--input", long)
        assert line.startswith("1 of 1 ")  # only the long one's batch
    short = tmp_path / "short.txt"
    short.write_text("to be\n")
    assert warnings_of("classify", runs["cls"], "--input", short) == []
    # a prompt: sampling continues from its end, so its last tokens are read
    max_len = load_run(runs["lm"]).model.config.max_len
    for prompts, said in ((["--prompt", "the dog", "--prompt-file", long], [
            f"1 of 3 prompts have more than {max_len} tokens (max_len): only their last "
            f"{window_keep(max_len)} are read"]), (["--prompt-file", short], [])):
        caplog.clear()
        code, out, err = run_cli(capsys, "sample", runs["lm"], "--max-new-tokens", 2, *prompts)
        assert code == 0, err
        assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == said


def test_input_that_is_a_folder_is_one_line(runs, capsys, tmp_path):
    code, out, err = run_cli(capsys, "classify", runs["cls"], "--input", tmp_path)
    assert code == 2 and out == "" and "is a folder" in err


def test_sample_a_word_level_run_continues_after_a_space(tmp_path, capsys):
    """A whitespace-split BPE run: the continuation keeps the space after the prompt (it was
    glued on), and a prompt of spaces alone, no token for it, is one line before any output."""
    from _runs import tiny_lm, write_run
    from attnlab.tokenizers import BPETokenizer

    tok = BPETokenizer.train([TEXT * 3] * 20, 60, "whitespace")
    run = write_run(tmp_path / "bpe", tiny_lm(vocab_size=tok.vocab_size, max_len=32), tok)
    code, out, err = run_cli(capsys, "sample", run, "--prompt", "the quick",
                             "--max-new-tokens", 6, "--temperature", 0)
    assert code == 0, err
    model = load_run(run).model
    from attnlab.decoding import generate

    ids = tok.encode("the quick")
    assert out == tok.decode(ids + generate(model, [ids], 6, temperature=0)[0]) + "\n"
    code, out, err = run_cli(capsys, "sample", run, "--prompt", "  ")
    assert code == 2 and out == "" and "is no token for this run's tokenizer" in err


def test_label_names_that_do_not_fit_the_classes_are_named(tmp_path):
    """Three names for a 2-class head, or a string, were replaced by "0", "1" in silence (and
    exported so); none at all still gives "0", "1", ..."""
    import json

    from attnlab.runs import RunError

    run_dir = classifier_run(tmp_path / "cls")
    assert load_run(run_dir).label_names == ["neg", "neutral", "pos"]
    config = json.loads((run_dir / "config.json").read_text())
    for names in (["neg", "pos"], "abc"):
        (run_dir / "config.json").write_text(json.dumps({**config, "data": {"label_names":
                                                                            names}}))
        run = load_run(run_dir)
        with pytest.raises(RunError, match=re.escape(f"data.label_names is {names!r}, but the "
                                                     "model has 3 classes")):
            run.label_names  # noqa: B018 (the property raises)
    (run_dir / "config.json").write_text(json.dumps({**config, "data": {}}))
    assert load_run(run_dir).label_names == ["0", "1", "2"]


def test_a_run_without_the_checkpoint_asked_for_says_which_it_uses(runs, tmp_path, capsys,
                                                                  caplog):
    """A run stopped before its first evaluation has last/ but no best/: ``best`` (the
    default) reads last/ and says so; a run with best/ says nothing."""
    import logging
    import shutil

    run = tmp_path / "stopped"
    shutil.copytree(runs["lm"], run)
    (run / "best").rename(run / "last")
    for path, said in ((run, [f"{run} has no best/ checkpoint: using its last/"]),
                       (runs["lm"], [])):
        caplog.clear()
        with caplog.at_level(logging.INFO):  # (main resets the attnlab logger's level)
            code, out, err = run_cli(capsys, "sample", path, "--prompt", "the",
                                     "--max-new-tokens", 2)
        assert code == 0, err
        assert [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()] == said
