"""`attnlab interpret` end to end on tiny random run dirs made here: each analysis's table,
its --json (the library call's numbers), its --html page, and bad input (one line, exit 2,
nothing written)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from _runs import classifier_run, lm_run, seq2seq_run
from attnlab.cli import main
from attnlab.runs import load_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("interpret")
    return {"lm": lm_run(base / "lm"), "mt": seq2seq_run(base / "mt"),
            "cls": classifier_run(base / "cls")}


def _json(capsys, argv):
    assert main(["interpret", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out)


def _ids(run, text):
    return torch.tensor([run.tokenizer.encode(text)])


def _page_data(path):
    page = path.read_text()
    return json.loads(re.search(r'id="attnlab-data">(.*?)</script>', page, re.S).group(1))


def test_lens_json_matches_the_library_and_prints_a_table(runs, capsys, tmp_path):
    from attnlab.interpret.lens import logit_lens

    got = _json(capsys, ["lens", str(runs["lm"]), "--text", "the fox", "--k", "3"])
    run = load_run(runs["lm"])
    want = logit_lens(run.model, _ids(run, "the fox"), k=3)
    assert got["top_ids"] == want.top_ids.tolist()
    assert torch.allclose(torch.tensor(got["loss"]), want.loss)
    assert "logits" not in got  # (R, B, T, V): too big to print
    html = tmp_path / "lens.html"
    assert main(["interpret", "lens", str(runs["lm"]), "--text", "the fox",
                 "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "embed" in out and "layer 1" in out and "real" in out
    lens = _page_data(html)["analyses"][0]
    assert lens["kind"] == "lens" and lens["layers"] == ["embed", "layer 0", "layer 1"]
    assert len(lens["tokens"]) == 7 and lens["targets"][-1] is None


def test_attribute_json_matches_and_shares_sum_to_the_logit(runs, capsys):
    from attnlab.interpret.lens import direct_logit_attribution

    got = _json(capsys, ["attribute", str(runs["lm"]), "--text", "the qu", "--token", "i",
                         "--other", "e"])
    run = load_run(runs["lm"])
    tok = run.tokenizer
    want = direct_logit_attribution(run.model, _ids(run, "the qu"), token=tok.encode("i")[0],
                                    other=tok.encode("e")[0])
    assert torch.allclose(torch.tensor(got["heads"]), want.heads, atol=1e-6)
    total = sum(sum(h[0] for h in row) for row in got["heads"]) + sum(
        f[0] for f in got["ffn"]) + got["embed"][0] + got["bias"][0]
    assert total == pytest.approx(got["logit"][0], abs=1e-3)


def test_ablate_text_file_and_json(runs, capsys, tmp_path):
    from attnlab.interpret.ablation import ablate, lm_batch

    got = _json(capsys, ["ablate", str(runs["lm"]), "--text", "the lazy dog", "--kind", "mean"])
    run = load_run(runs["lm"])
    want = ablate(run.model, lm_batch(_ids(run, "the lazy dog")), kind="mean")
    assert got["kind"] == "mean" and got["base_loss"] == pytest.approx(want.base_loss)
    assert torch.allclose(torch.tensor(got["grids"]["decoder"]), want.heads, atol=1e-5)
    text = tmp_path / "t.txt"
    text.write_text("the lazy dog", encoding="utf-8")
    assert _json(capsys, ["ablate", str(runs["lm"]), "--file", str(text), "--kind", "mean"]
                 )["grids"] == got["grids"]


def test_ablate_encoder_decoder_and_classifier_write_pages(runs, capsys, tmp_path):
    for name, extra in (("mt", ["--target", "the dog"]), ("cls", [])):
        html = tmp_path / f"{name}.html"
        assert main(["interpret", "ablate", str(runs[name]), "--text", "the fox", *extra,
                     "--html", str(html)]) == 0
        data = _page_data(html)
        stacks = [a["name"] for a in data["analyses"]]
        assert all(a["kind"] == "heads" for a in data["analyses"])
        if name == "mt":
            assert len(stacks) == 3 and data["analyses"][2]["view"] == 2  # cross -> cross view
    assert "heads" in capsys.readouterr().out


@pytest.mark.parametrize("head", ["classify", "mlm"])
def test_ablate_split_of_a_classifier_or_masked_lm_measures_its_evaluation_batches(
        head, tmp_path, capsys):
    """--split val of an encoder run: the sentences evaluation reads first, with their
    labels (a masked LM's: masked as evaluation masks them)."""
    from attnlab.interpret import ablate
    from attnlab.run_config import RunConfig
    from attnlab.runs import RunDir
    from attnlab.tasks import build_task
    from attnlab.train import train_run

    tsv = tmp_path / "reviews.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(
        f"{'a fine' if i % 2 else 'a dull'} film, number {i}\t{i % 2}\n" for i in range(60)))
    out = tmp_path / "run"
    train_run(RunConfig.from_dict({
        "model": {"family": "encoder", "head": head, "d_model": 32, "n_heads": 2,
                  "n_layers": 1, "max_len": 40, "dropout": 0.0},
        "data": {"path": str(tsv)},
        "train": {"max_steps": 2, "batch_size": 8, "eval_every": 2, "precision": "fp32",
                  "progress": False, "tensorboard": False, "device": "cpu",
                  "eval_batch_size": 4}}), out)
    got = _json(capsys, ["ablate", str(out), "--split", "val", "--batches", "1"])
    run = load_run(out)
    task = build_task(RunConfig.of_run(RunDir(out)), run.tokenizer)
    batch = task.ablation_batch("val", 1)  # one evaluation batch: 4 of the 6 val sentences
    sentences = task.items("val")[:4]
    ids = batch.inputs[0]
    assert ids.size(0) == 4 and len(task.items("val")) == 6
    if head == "classify":
        assert batch.targets.tolist() == [y for _, y in sentences]
        assert [run.tokenizer.decode([t for t in row if t != run.tokenizer.pad_id])
                for row in ids.tolist()] == [s for s, _ in sentences]
    else:  # the sentences, some tokens masked; the targets: the masked tokens' own ids
        picked = batch.targets != -100
        assert picked.any(dim=1).all() and (ids[picked] != batch.targets[picked]).any()
        whole = ids.where(~picked, batch.targets)
        assert [run.tokenizer.decode([t for t in row if t != run.tokenizer.pad_id])
                for row in whole.tolist()] == [s for s, _ in sentences]
    want = ablate(run.model, batch)
    assert got["base_loss"] == pytest.approx(want.base_loss, abs=1e-5)
    assert torch.allclose(torch.tensor(got["grids"]["encoder"]), want.heads, atol=1e-5)


def test_patch_json_matches_and_page_has_both_grids(runs, capsys, tmp_path):
    from attnlab.interpret.patching import patch

    argv = ["patch", str(runs["lm"]), "--clean", "the fox", "--corrupted", "the dog",
            "--answer", "o", "--wrong", "e"]
    got = _json(capsys, argv)
    run = load_run(runs["lm"])
    tok = run.tokenizer
    want = patch(run.model, _ids(run, "the fox"), _ids(run, "the dog"),
                 answer=tok.encode("o")[0], wrong=tok.encode("e")[0])
    assert got["clean"] == pytest.approx(want.clean)
    assert torch.allclose(torch.tensor(got["resid"]), want.resid, atol=1e-5)
    html = tmp_path / "patch.html"
    assert main(["interpret", *argv, "--html", str(html)]) == 0
    kinds = [a["kind"] for a in _page_data(html)["analyses"]]
    assert kinds == ["positions", "heads"]
    assert _page_data(html)["analyses"][0]["tokens"] == tok.token_strings(tok.encode("the fox"))


def test_patch_of_a_translation_run_corrupts_the_source(runs, capsys, tmp_path):
    from attnlab.interpret.patching import patch

    argv = ["patch", str(runs["mt"]), "--clean", "the fox", "--corrupted", "the dog",
            "--target", "the", "--answer", "o", "--wrong", "e"]
    got = _json(capsys, argv)
    run = load_run(runs["mt"])
    tok = run.tokenizer
    tgt = torch.tensor([tok.encode("the", add_special=True)[:-1]])  # <bos> the (no <eos>)
    want = patch(run.model, _ids(run, "the fox"), _ids(run, "the dog"), tgt=tgt,
                 answer=tok.encode("o")[0], wrong=tok.encode("e")[0])
    assert got["clean"] == pytest.approx(want.clean)
    assert torch.allclose(torch.tensor(got["resid"]), want.resid, atol=1e-5)
    assert set(got["grids"]) == {"encoder", "decoder", "cross"}
    assert main(["interpret", *argv[:-6], "--answer", "o", "--wrong", "e"]) == 2
    assert "needs --target" in capsys.readouterr().err


def test_patch_position_reads_the_logits_there(runs, capsys):
    from attnlab.interpret.patching import patch

    argv = ["patch", str(runs["lm"]), "--clean", "the fox", "--corrupted", "the dog",
            "--answer", "o", "--wrong", "e", "--position", "4"]
    got = _json(capsys, argv)
    run = load_run(runs["lm"])
    tok = run.tokenizer
    want = patch(run.model, _ids(run, "the fox"), _ids(run, "the dog"), position=4,
                 answer=tok.encode("o")[0], wrong=tok.encode("e")[0])
    last = patch(run.model, _ids(run, "the fox"), _ids(run, "the dog"),
                 answer=tok.encode("o")[0], wrong=tok.encode("e")[0])
    assert got["clean"] == pytest.approx(want.clean) and want.clean != last.clean
    assert torch.allclose(torch.tensor(got["resid"]), want.resid, atol=1e-5)
    assert main(["interpret", *argv]) == 0
    assert "logit('o') - logit('e') at position 4 is" in capsys.readouterr().out


def test_patch_of_a_classifier_takes_classes_by_name_or_number(runs, capsys, tmp_path):
    """A classifier's metric is logit(answer) - logit(wrong) of its class logits: --answer
    and --wrong name classes (the run's label names, or their numbers)."""
    from attnlab.interpret.patching import patch

    argv = ["patch", str(runs["cls"]), "--clean", "a fine film", "--corrupted", "a dull film",
            "--answer", "pos", "--wrong", "neg"]
    got = _json(capsys, argv)
    run = load_run(runs["cls"])
    ids = [run.inputs(text)[0] for text in ("a fine film", "a dull film")]
    want = patch(run.model, *ids, answer=2, wrong=0)
    assert got["clean"] == pytest.approx(want.clean) and got["clean"] != got["corrupted"]
    assert torch.allclose(torch.tensor(got["resid"]), want.resid, atol=1e-5)
    assert torch.allclose(torch.tensor(got["grids"]["encoder"]), want.heads, atol=1e-5)
    assert _json(capsys, [*argv[:-4], "--answer", "2", "--wrong", "0"]) == got
    html = tmp_path / "patch.html"
    assert main(["interpret", *argv, "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "logit('pos') - logit('neg') of the classifier is" in out
    assert [a["kind"] for a in _page_data(html)["analyses"]] == ["positions", "heads"]


def test_rollout_json_matches_the_library(runs, capsys):
    rollout = pytest.importorskip("attnlab.interpret.rollout")
    got = _json(capsys, ["rollout", str(runs["lm"]), "--text", "the fox"])
    run = load_run(runs["lm"])
    want = rollout.attention_rollout(run.model, _ids(run, "the fox"))
    assert set(got) == set(want)
    for stack, table in want.items():
        assert torch.allclose(torch.tensor(got[stack]), table, atol=1e-6)


def test_heads_json_and_page(runs, capsys, tmp_path):
    pytest.importorskip("attnlab.interpret.heads")
    got = _json(capsys, ["heads", str(runs["lm"])])
    assert got
    html = tmp_path / "heads.html"
    assert main(["interpret", "heads", str(runs["lm"]), "--text", "the fox the fox",
                 "--html", str(html)]) == 0
    assert all(a["kind"] == "heads" for a in _page_data(html)["analyses"])


@pytest.mark.parametrize("argv, message", [
    (["lens", "{nope}", "--text", "the"], "does not exist"),
    (["lens", "{cls}", "--text", "the"], "needs an LM head"),
    (["patch", "{cls}", "--clean", "a", "--corrupted", "b", "--answer", "good", "--wrong",
      "neg"], "--answer 'good' is not a class of "),
    (["patch", "{cls}", "--clean", "a", "--corrupted", "b", "--answer", "pos", "--wrong", "3"],
     "--wrong '3' is not a class of "),
    (["patch", "{cls}", "--clean", "a", "--corrupted", "b", "--answer", "pos", "--wrong", "2"],
     "--answer and --wrong are the same class (pos)"),
    (["patch", "{cls}", "--clean", "a", "--corrupted", "b", "--answer", "pos", "--wrong", "0",
      "--position", "1"], "a classifier's logits are the whole text's, at no position"),
    (["patch", "{lm}", "--clean", "the", "--corrupted", "thy", "--answer", "o", "--wrong",
      "e", "--position", "3"], "--position 3 is out of range: the --clean text is 3 tokens "
                               "(-3..2)"),
    (["patch", "{mt}", "--clean", "the", "--corrupted", "thy", "--target", "a", "--answer",
      "o", "--wrong", "e", "--position", "2"], "--position 2 is out of range: the decoder "
                                               "input (<bos> and --target) is 2 tokens"),
    (["attribute", "{lm}", "--text", "the", "--token", "ox"],
     "--token 'ox' is not one token: it encodes to 2 tokens ['o', 'x']"),
    (["attribute", "{lm}", "--text", "the", "--token", "Z"], "'Z'"),
    (["attribute", "{lm}", "--text", "the", "--token", "o", "--other", "o"],
     "--token and --other are the same token (id "),
    (["patch", "{lm}", "--clean", "the", "--corrupted", "thy", "--answer", "e", "--wrong", "e"],
     "--answer and --wrong are the same token (id "),
    (["attribute", "{lm}", "--text", "the", "--token", "o", "--position", "9"],
     "--position 9 is out of range"),
    (["patch", "{lm}", "--clean", "the fox", "--corrupted", "the foxes", "--answer", "o",
      "--wrong", "e"], "--clean is 7 tokens and --corrupted is 9"),
    (["patch", "{lm}", "--clean", "the", "--corrupted", "thy", "--answer", "Q",
      "--wrong", "e"], "'Q'"),
    (["ablate", "{lm}", "--text", "the fox", "--layer", "5"],
     "--layer 5 is out of range: the model has 2 layers"),
    (["ablate", "{lm}", "--text", "the fox", "--head", "4"],
     "--head 4 is out of range: the model has 4 heads"),
    (["ablate", "{lm}"], "give one of --text TEXT, --file FILE or --split val"),
    (["ablate", "{cls}", "--split", "val"], "--split val: run dir "),  # (no data of its own)
    (["lens", "{lm}", "--text", "the", "--target", "x"], "--target is for encoder-decoder"),
    (["lens", "{lm}", "--text", "the", "--k", "0"], "--k 0 is out of range"),
    (["rollout", "{lm}", "--text", "the", "--layer", "1"],
     "interpret rollout has no layer or head axis"),
    (["rollout", "{lm}", "--text", "the", "--head", "1"],
     "interpret rollout has no layer or head axis"),
    (["lens", "{lm}", "--text", "the", "--head", "1"], "interpret lens has no head axis"),
    (["ablate", "{lm}", "--text", "the fox", "--batches", "3"],
     "interpret ablate --batches is for --split val"),
    (["ablate", "{lm}", "--file", "{nope}"],
     "nope does not exist: give a UTF-8 text file whose loss each ablation changes"),
    (["ablate", "{lm}", "--file", "{folder}"],
     "is a folder: give a UTF-8 text file whose loss each ablation changes"),
    (["ablate", "{lm}", "--text", ""], "--text is empty: give the text whose loss each "
                                       "ablation changes"),
    (["lens", "{lm}", "--text", ""], "--text is empty: give the text whose next tokens"),
    (["attribute", "{lm}", "--text", "", "--token", "o"],
     "--text is empty: give the text whose logit at --position is explained"),
    (["rollout", "{lm}", "--text", ""], "--text is empty: give the text whose attention is "
                                        "rolled out"),
    (["patch", "{lm}", "--clean", "", "--corrupted", "", "--answer", "o", "--wrong", "e"],
     "--clean is empty: give the text the model gets right"),
    (["patch", "{lm}", "--clean", "the", "--corrupted", "", "--answer", "o", "--wrong", "e"],
     "--corrupted is empty: give the --clean text changed"),
    (["patch", "{lm}", "--clean", "the fox " * 10, "--corrupted", "the", "--answer", "o",
      "--wrong", "e"], "--clean is 80 tokens long"),
    (["lens", "{mt}", "--text", "the", "--target", " "], "--target is empty: give the "
                                                         "translation the decoder reads"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(runs, tmp_path, capsys, argv,
                                                         message):
    html = tmp_path / "out" / "page.html"
    argv = [a.format(**{k: str(v) for k, v in runs.items()}, nope=tmp_path / "nope",
                     folder=tmp_path) for a in argv]
    code = main(["interpret", *argv, "--html", str(html)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert message in captured.err and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert not html.exists() and not html.parent.exists()


# ---- --layer / --head choose what is printed ------------------------------------------------
def _only(full, got, layers, heads=None):
    """Each (L, H, ...) cell of ``got`` is null outside ``layers`` x ``heads`` (None: all),
    else the full run's; ``heads`` False: a grid with no head axis (all null with --head)."""
    for layer, (want_row, row) in enumerate(zip(full, got, strict=True)):
        for head, (want, cell) in enumerate(zip(want_row, row, strict=True)):
            if layer in layers and (heads is None or (heads and head in heads)):
                assert cell == pytest.approx(want, abs=1e-5), (layer, head)
            else:
                assert cell is None or cell == [None], (layer, head)


def _table(capsys, argv):
    assert main(["interpret", *argv]) == 0
    return capsys.readouterr().out


def test_lens_layer_keeps_only_that_layers_row(runs, capsys):
    argv = ["lens", str(runs["lm"]), "--text", "the fox", "--k", "2"]
    full, got = _json(capsys, argv), _json(capsys, [*argv, "--layer", "1"])
    assert got["layers"] == ["blocks.1.resid_post"]
    assert got["top_ids"] == full["top_ids"][2:] and got["loss"] == full["loss"][2:]
    table = _table(capsys, [*argv, "--layer", "0"])
    assert "layer 0" in table and "layer 1" not in table and "embed" not in table


def test_attribute_layer_and_head_keep_only_those_shares(runs, capsys):
    argv = ["attribute", str(runs["lm"]), "--text", "the qu", "--token", "i"]
    full = _json(capsys, argv)
    got = _json(capsys, [*argv, "--layer", "1", "--head", "2"])
    _only(full["heads"], got["heads"], [1], [2])
    assert all(f == [None] for f in got["ffn"])  # feed-forward blocks have no head
    assert got["logit"] == full["logit"]
    _only(full["ffn"], _json(capsys, [*argv, "--layer", "0"])["ffn"], [0])
    table = _table(capsys, [*argv, "--layer", "1", "--head", "2"])
    assert "head 2" in table and "head 0" not in table and "layer 0" not in table


def test_patch_layer_and_head_patch_only_those(runs, capsys):
    argv = ["patch", str(runs["lm"]), "--clean", "the fox", "--corrupted", "the dog",
            "--answer", "o", "--wrong", "e"]
    full = _json(capsys, argv)
    got = _json(capsys, [*argv, "--layer", "0"])
    _only(full["resid"], got["resid"], [0])
    _only(full["grids"]["decoder"], got["grids"]["decoder"], [0])
    got = _json(capsys, [*argv, "--head", "3"])
    _only(full["grids"]["decoder"], got["grids"]["decoder"], [0, 1], [3])
    assert all(v is None for row in got["resid"] for v in row)  # no head axis
    table = _table(capsys, [*argv, "--layer", "1", "--head", "3"])
    assert "head 3" in table and "head 0" not in table and "layer 0" not in table


def test_heads_layer_and_head_keep_only_those_scores(runs, capsys):
    full = _json(capsys, ["heads", str(runs["lm"])])["scores"]["decoder"]
    got = _json(capsys, ["heads", str(runs["lm"]), "--layer", "0", "--head", "1",
                         "--head", "2"])["scores"]["decoder"]
    assert set(got) == set(full)
    for name in full:
        _only(full[name], got[name], [0], [1, 2])
    table = _table(capsys, ["heads", str(runs["lm"]), "--layer", "0", "--head", "1"])
    assert "head 1" in table and "head 2" not in table and "layer 1" not in table


def test_ablate_layer_and_head_ablate_only_those(runs, capsys):
    argv = ["ablate", str(runs["lm"]), "--text", "the lazy dog"]
    full = _json(capsys, argv)
    got = _json(capsys, [*argv, "--layer", "1", "--head", "0"])
    _only(full["grids"]["decoder"], got["grids"]["decoder"], [1], [0])
    assert got["ffns"]["decoder"] == [None, None]
    table = _table(capsys, [*argv, "--layer", "1", "--head", "0"])
    assert "head 0" in table and "head 1" not in table and "layer 0" not in table


@pytest.mark.parametrize("argv, message", [
    (["heads", "{lm}", "--text", "the fox"], "interpret heads --text is for --html"),
    (["heads", "{mt}", "--target", "the"], "interpret heads --target is for --html"),
    (["ablate", "{lm}", "--file", "{long}"], "--file is 81 tokens long"),
    (["ablate", "{lm}", "--file", "{one}"], "--file is one token: the loss needs at least two"),
])
def test_ignored_options_and_input_files_are_one_line(runs, tmp_path, capsys, argv, message):
    (tmp_path / "long.txt").write_text("the fox " * 10 + ".", encoding="utf-8")
    (tmp_path / "one.txt").write_text("t", encoding="utf-8")
    argv = [a.format(**{k: str(v) for k, v in runs.items()}, long=tmp_path / "long.txt",
                     one=tmp_path / "one.txt") for a in argv]
    assert main(["interpret", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("action", ["lens", "attribute", "ablate", "patch", "rollout", "heads"])
def test_help_says_what_run_dir_is(capsys, action):
    assert main(["interpret", action, "--help"]) == 0
    assert re.search(r"\n  run_dir +a run dir \(trained, or made by `attnlab import`\)",
                     capsys.readouterr().out)
