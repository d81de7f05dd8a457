"""`attnlab info` and `attnlab viz` end to end on tiny run dirs made here."""

import json
import os
import re
from pathlib import Path

import pytest
import torch

from attnlab import ModelConfig, attention_maps, build_model
from attnlab.cli import main
from attnlab.runs import RunDir
from attnlab.tokenizers import BPETokenizer, CharTokenizer

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def make_run(path, family, pos="learned"):
    if family == "decoder":
        tok = CharTokenizer.from_text(TEXT)
        pad = None
    else:
        tok = BPETokenizer.train([TEXT, "der schnelle braune fuchs"], vocab_size=80,
                                pre_tokenizer="whitespace")
        pad = tok.pad_id
    cfg = ModelConfig(family=family, vocab_size=tok.vocab_size, d_model=16, n_heads=2,
                      n_layers=2, max_len=40, pos=pos, pad_id=pad, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg)
    run = RunDir(path)
    path.mkdir(parents=True, exist_ok=True)
    run.write_config({"model": cfg.to_dict(), "data": {}, "train": {}})
    run.save_tokenizer(tok)
    run.save_checkpoint("best", model)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return {f: make_run(base / f, f) for f in ("decoder", "encoder", "encoder_decoder")}


def test_info_on_run_and_config(runs, tmp_path, capsys):
    assert main(["info", str(runs["decoder"]), "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "decoder.1.ffn" in out and "FLOPs per token" in out and "memory" in out
    toml = tmp_path / "m.toml"
    toml.write_text('[model]\nfamily = "encoder_decoder"\nvocab_size = 100\nd_model = 64\n'
                    'n_heads = 4\nn_layers = 2\n')
    assert main(["info", str(toml)]) == 0
    assert "decoder.1.cross_attention" in capsys.readouterr().out


def test_viz_attention_png_and_html_for_each_family(runs, tmp_path):
    for family, run in runs.items():
        png, html = tmp_path / f"{family}.png", tmp_path / f"{family}.html"
        target = ["--target", "the dog"] if family == "encoder_decoder" else []
        assert main(["viz", "attention", str(run), "--text", "the lazy fox", *target,
                     "--out", str(png), "--html", str(html), "--layer", "1"]) == 0
        pngs = list(tmp_path.glob(f"{family}*.png"))
        assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
        page = html.read_text()
        assert "cross-attention" in page if family == "encoder_decoder" else "self" in page
    assert len(list(tmp_path.glob("encoder_decoder*.png"))) == 3


def test_viz_positions(runs, tmp_path):
    assert main(["viz", "positions", "--d-model", "32", "--out", str(tmp_path / "s.png")]) == 0
    assert main(["viz", "positions", str(runs["decoder"]), "--out", str(tmp_path / "l.png")]) == 0
    assert (tmp_path / "l.png").stat().st_size > 1000


@pytest.mark.parametrize("argv, message", [
    (["--layer", "7"], "--layer 7 is out of range: the model has 2 layers"),
    (["--head", "2"], "--head 2 is out of range: the model has 2 heads"),
    (["--text", "x" * 60], "--text is 60 tokens long as the model reads it, but it attends to "
                           "at most 40"),
    (["--text", ""], "--text is empty"),
    (["--text", "ZZZ"], "'Z'"),
])
def test_viz_bad_input_is_one_line_exit_2(runs, tmp_path, capsys, argv, message):
    args = ["viz", "attention", str(runs["decoder"]), "--text", "the fox",
            "--out", str(tmp_path / "a.png")]
    code = main(args + argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_viz_missing_checkpoint_and_no_run(tmp_path, capsys):
    assert main(["viz", "attention", str(tmp_path / "nope"), "--text", "a", "--out", "x.png"]) == 2
    assert "does not exist" in capsys.readouterr().err
    run = make_run(tmp_path / "r", "decoder")
    (run / "best" / "model.safetensors").unlink()
    assert main(["viz", "attention", str(run), "--text", "the", "--out", "x.png"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["viz", "positions", str(run), "--out", str(tmp_path / "p.png")]) == 2


@pytest.mark.parametrize("flag", ["--out", "--html"])
def test_viz_output_under_a_file_is_one_line_exit_2(runs, tmp_path, capsys, flag):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    name = "a.png" if flag == "--out" else "a.html"
    code = main(["viz", "attention", str(runs["decoder"]), "--text", "the fox",
                 flag, str(afile / name)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(afile) in err and "not a folder" in err
    assert afile.read_text() == "keep me"


def test_viz_encoder_decoder_greedy_target_fits_max_len(tmp_path, capsys):
    """A model that never emits <eos>: its greedy output is what `attnlab translate` gives
    (1.5 x the source + 10 tokens), and for a long source capped so that <bos> + output still
    fits the model's target positions."""
    from attnlab.runs import load_run

    run = make_run(tmp_path / "mt", "encoder_decoder")
    loaded = load_run(run, "best")
    assert loaded.tokenizer.eos_id != 0
    with torch.no_grad():  # every logit 0: the argmax is always id 0, never <eos>
        loaded.model.head.weight.zero_()
    RunDir(run).save_checkpoint("best", loaded.model)
    html = tmp_path / "mt.html"
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 3)
    n_src = len(loaded.tokenizer.encode(long))
    assert 1.5 * n_src + 10 > 40 >= n_src
    for text, tokens in (("the lazy fox", 1 + 10 + int(1.5 * len(loaded.tokenizer.encode(
            "the lazy fox")))), (long, 40)):  # 40: the model's max_len, <bos> + 39 tokens
        assert main(["viz", "attention", str(run), "--text", text, "--html", str(html)]) == 0
        page = html.read_text()
        assert "cross-attention" in page
        data = json.loads(re.search(r'id="attnlab-data">(.*?)</script>', page, re.S).group(1))
        cross = [v for v in data["views"] if v["name"].startswith("cross")][0]
        assert len(cross["query_tokens"]) == tokens


def test_viz_encoder_decoder_page_labels_source_target_and_heads(runs, tmp_path):
    html = tmp_path / "mt.html"
    assert main(["viz", "attention", str(runs["encoder_decoder"]), "--text", "the lazy fox",
                 "--target", "the dog", "--head", "1", "--html", str(html)]) == 0
    data = json.loads(re.search(r'id="attnlab-data">(.*?)</script>', html.read_text(),
                                re.S).group(1))
    sides = [(v["query_label"], v["key_label"]) for v in data["views"]]
    assert sides == [("source", "source"), ("target", "target"), ("target", "source")]
    assert all(v["head_ids"] == [1] and len(v["weights"][0]) == 1 for v in data["views"])
    enc, dec, cross = data["views"]
    assert cross["query_tokens"] == dec["query_tokens"] and cross["key_tokens"] == enc["key_tokens"]


def _views(html):
    return json.loads(re.search(r'id="attnlab-data">(.*?)</script>', html.read_text(),
                                re.S).group(1))["views"]


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_viz_shows_an_encoder_the_input_it_was_trained_on(tmp_path, pooling):
    """A classifier reads bare tokens (mean pooling) or [CLS] first (cls pooling), as in
    training and `classify`; never the <bos> ... <eos> it never saw."""
    run = make_run(tmp_path / pooling, "encoder")
    cfg = RunDir(run).read_config()
    cfg["model"]["pooling"] = pooling
    RunDir(run).write_config(cfg)
    tok = RunDir(run).load_tokenizer()
    html = tmp_path / "enc.html"
    assert main(["viz", "attention", str(run), "--text", " the lazy fox ", "--html",
                 str(html)]) == 0
    bare = tok.token_strings(tok.encode("the lazy fox"))
    first = tok.token_strings([tok.bos_id]) if pooling == "cls" else []
    assert _views(html)[0]["key_tokens"] == first + bare


@pytest.mark.parametrize("add_special", [False, True])
def test_viz_encodes_a_translation_source_as_training_did(runs, tmp_path, add_special):
    run = runs["encoder_decoder"]
    cfg = RunDir(run).read_config()
    html = tmp_path / "mt.html"
    try:
        RunDir(run).write_config({**cfg, "data": {"src_add_special": add_special}})
        assert main(["viz", "attention", str(run), "--text", "the lazy fox", "--target",
                     "the dog", "--html", str(html)]) == 0
    finally:
        RunDir(run).write_config(cfg)
    tok = RunDir(run).load_tokenizer()
    source = _views(html)[0]["key_tokens"]
    assert source == tok.token_strings(tok.encode("the lazy fox", add_special=add_special))


def test_viz_labels_each_head_with_its_own_weights_in_any_order(runs, tmp_path):
    from attnlab.runs import load_run

    html = tmp_path / "heads.html"
    assert main(["viz", "attention", str(runs["decoder"]), "--text", "the lazy fox",
                 "--head", "1", "--head", "0", "--head", "1", "--html", str(html)]) == 0
    view = _views(html)[0]
    assert view["head_ids"] == [0, 1]
    run = load_run(runs["decoder"])
    ids = run.tokenizer.encode("the lazy fox")
    with torch.no_grad():
        true = attention_maps(run.model, torch.tensor([ids]))["decoder"]
    for layer, weights in zip(view["layer_ids"], view["weights"]):
        for slot, head in enumerate(view["head_ids"]):
            got = torch.tensor(weights[slot], dtype=torch.float32) / 10_000  # stored w * 1e4
            torch.testing.assert_close(got, true[layer][0, head], atol=2e-4, rtol=0)


def test_info_of_a_fine_tuning_recipe_counts_the_source_model(runs, tmp_path, capsys):
    recipe = tmp_path / "ft.toml"
    recipe.write_text(f'[data]\nlabel_names = ["a", "b", "c"]\n'
                      f'[train]\ninit_from = "{runs["encoder"]}"\n')
    assert main(["info", str(recipe)]) == 0
    out = capsys.readouterr().out
    cfg = RunDir(runs["encoder"]).read_config()["model"]
    want = build_model(ModelConfig.from_dict({**cfg, "n_classes": 3}))
    assert f"{sum(p.numel() for p in want.parameters()):,}" in out and "init_from" in out


def test_viz_of_a_masked_lm_shows_no_cls_it_never_read(tmp_path):
    """An MLM run reads bare tokens (its pooling is for the classifier it becomes): the page
    put a [CLS] (<bos>) first that training never showed it, shifting every position."""
    run = make_run(tmp_path / "mlm", "encoder")
    cfg = RunDir(run).read_config()
    cfg["model"].update(head="mlm", pooling="cls")
    RunDir(run).write_config(cfg)
    from attnlab.runs import load_run

    model = build_model(ModelConfig.from_dict(cfg["model"]))
    RunDir(run).save_checkpoint("best", model)
    tok = load_run(run).tokenizer
    html = tmp_path / "mlm.html"
    assert main(["viz", "attention", str(run), "--text", "the lazy fox", "--html",
                 str(html)]) == 0
    assert _views(html)[0]["key_tokens"] == tok.token_strings(tok.encode("the lazy fox"))


def test_viz_picks_a_layer_only_the_deeper_stack_has(tmp_path):
    """1 encoder layer, 3 decoder layers: --layer 2 shows decoder layer 2 (it was refused as
    out of range; the page without --layer showed it)."""
    run = make_run(tmp_path / "mt", "encoder_decoder")
    cfg = RunDir(run).read_config()
    cfg["model"].update(n_layers=1, n_decoder_layers=3)
    RunDir(run).write_config(cfg)
    RunDir(run).save_checkpoint("best", build_model(ModelConfig.from_dict(cfg["model"])))
    html = tmp_path / "u.html"
    assert main(["viz", "attention", str(run), "--text", "the fox", "--target", "the fox",
                 "--layer", "2", "--layer", "0", "--html", str(html)]) == 0
    layers = {v["name"].split()[0]: v["layer_ids"] for v in _views(html)}
    assert layers == {"encoder": [0], "decoder": [0, 2], "cross-attention": [0, 2]}
    assert main(["viz", "attention", str(run), "--text", "the fox", "--layer", "3",
                 "--html", str(html)]) == 2


def test_viz_target_length_counts_what_the_decoder_reads_and_names_the_flag(runs, tmp_path,
                                                                           capsys):
    """The decoder reads <bos> + the target (not its <eos>): a target of max_len such tokens
    fits; one more is refused naming --target (it said --text, and was one token short)."""
    tok = RunDir(runs["encoder_decoder"]).load_tokenizer()
    words = "the quick brown fox jumps over the lazy dog".split()
    target = " ".join(words * 5)
    while len(tok.encode(target)) > 39:  # <bos> + 39 tokens = 40 = max_len positions
        target = target.rsplit(" ", 1)[0]
    base = ["viz", "attention", str(runs["encoder_decoder"]), "--text", "the fox",
            "--out", str(tmp_path / "t.png")]
    if len(tok.encode(target)) == 39:
        assert main(base + ["--target", target]) == 0
    over = target + " the the the the"
    assert main(base + ["--target", over]) == 2
    err = capsys.readouterr().err
    assert "--target is" in err and "as the model reads it" in err
    assert main(base + ["--target", " "]) == 2
    assert "--target is empty" in capsys.readouterr().err


def test_info_of_a_json_that_is_not_a_table_is_one_line(tmp_path, capsys):
    for text in ("null", "5", "true", '"data"'):
        (tmp_path / "c.json").write_text(text)
        assert main(["info", str(tmp_path / "c.json")]) == 2
        err = capsys.readouterr().err
        assert "expected a table of model settings" in err and len(err.splitlines()) == 1


def test_viz_positions_needs_no_tokenizer(runs, tmp_path):
    import shutil

    shutil.copytree(runs["decoder"], tmp_path / "run")
    (tmp_path / "run" / "tokenizer.json").unlink()
    assert main(["viz", "positions", str(tmp_path / "run"), "--out",
                 str(tmp_path / "p.png")]) == 0


def test_info_refuses_a_length_the_model_cannot_read(runs, capsys):
    """--length 100000 on a max_len-40 model printed 745 GiB estimates for inputs it refuses."""
    assert main(["info", str(runs["decoder"]), "--length", "41"]) == 2
    err = capsys.readouterr().err
    assert "--length 41 is more than the model's max_len=40" in err and err.count("\n") == 1
    assert main(["info", str(runs["decoder"]), "--length", "40"]) == 0


def test_info_says_the_memory_of_each_process_for_a_world_size(runs, capsys):
    assert main(["info", str(runs["decoder"]), "--batch", "4", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "per process, 2 processes" in out and "\n  DDP " in out and "\n  FSDP " in out
    _one_line_exit_2(main(["info", str(runs["decoder"]), "--world-size", "0"]), capsys,
                     "--world-size 0 must be")


def _one_line_exit_2(code, capsys, *wanted):
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert all(w in err for w in wanted), err


@pytest.mark.parametrize("argv, message", [
    (["--max-len", "100000000", "--d-model", "4096"],
     "--max-len 100000000 x --d-model 4096 = 409,600,000,000 values is too many to plot: "
     "allowed max_len x d_model up to 4,194,304"),
    (["--max-len", "0"], "--max-len 0 is not allowed: give a number >= 1"),
    (["--max-len", "-5"], "--max-len -5 is not allowed"),
    (["--d-model", "0"], "--d-model 0 is not allowed: give an even number >= 2"),
    (["--d-model", "-4"], "--d-model -4 is not allowed"),
    (["--d-model", "7"], "--d-model 7 is not allowed"),
])
def test_viz_positions_refuses_sizes_it_cannot_plot(tmp_path, capsys, argv, message):
    """--max-len 100000000 --d-model 4096 died allocating 1.6 TB (a traceback, exit 1)."""
    out = tmp_path / "p.png"
    _one_line_exit_2(main(["viz", "positions", *argv, "--out", str(out)]), capsys, message)
    assert not out.exists()


def test_viz_positions_refuses_a_run_dir_with_table_sizes(runs, tmp_path, capsys):
    """`viz positions RUN --d-model 64`: RUN is the optional run_dir positional, so the run's
    learned table was plotted and --d-model silently ignored."""
    out = tmp_path / "p.png"
    for flag in ("--d-model", "--max-len"):
        code = main(["viz", "positions", str(runs["decoder"]), flag, "64", "--out", str(out)])
        _one_line_exit_2(code, capsys, "give either a run dir or --d-model/--max-len")
    assert not out.exists()


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_viz_target_is_refused_outside_encoder_decoder(runs, tmp_path, capsys, family):
    out = tmp_path / "v.png"
    code = main(["viz", "attention", str(runs[family]), "--text", "the fox", "--target", "x",
                 "--out", str(out)])
    _one_line_exit_2(code, capsys, f"--target is for encoder-decoder runs; {runs[family]} is "
                                   f"a {family} run")
    assert not out.exists()


@pytest.mark.parametrize("bad", ["html_folder", "out_folder", "out_suffix", "html_unwritable"])
def test_viz_checks_every_output_before_writing_any(runs, tmp_path, capsys, bad):
    """--html pointing at a folder: the PNG was written (and printed), then the HTML failed."""
    folder = tmp_path / "folder"
    folder.mkdir()
    png, html = tmp_path / "v.png", tmp_path / "v.html"
    paths = {"html_folder": (png, folder), "out_folder": (folder, html),
             "out_suffix": (tmp_path / "v.txt", html),
             "html_unwritable": (png, folder / "v.html")}[bad]
    wanted = {"html_folder": f"--html {folder} is a folder: give a file path",
              "out_folder": f"--out {folder} is a folder: give a file path",
              "out_suffix": f"--out {str(tmp_path / 'v.txt')!r} must end in a supported image",
              "html_unwritable": f"cannot write {folder / 'v.html'} (Permission denied)"}[bad]
    if bad == "html_unwritable":  # (root can write anywhere: pretend it cannot)
        real = os.access
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "access", lambda p, mode: Path(p) != folder and real(p, mode))
            code = main(["viz", "attention", str(runs["decoder"]), "--text", "the fox",
                         "--out", str(paths[0]), "--html", str(paths[1])])
    else:
        code = main(["viz", "attention", str(runs["decoder"]), "--text", "the fox",
                     "--out", str(paths[0]), "--html", str(paths[1])])
    _one_line_exit_2(code, capsys, wanted)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"] and not any(folder.iterdir())


@pytest.mark.parametrize("name, text, message", [
    ("e3.json", "{a", "e3.json is not valid JSON: Expecting property name"),
    ("bin.json", b"\x00\xd0\xff", "bin.json is not valid JSON: 'utf-8' codec"),
    ("bad.toml", "[model\nd_model = 8\n", "bad.toml is not valid TOML: Expected ']'"),
    ("nothing.json", None, "nothing.json is neither a run dir, a config file nor a recipe"),
    ("adir", "dir", "adir is not an attnlab run dir"),
])
def test_info_names_the_file_it_cannot_read(tmp_path, capsys, name, text, message):
    """Invalid JSON printed only the decoder's message, without the file's name."""
    path = tmp_path / name
    if text == "dir":
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    _one_line_exit_2(main(["info", str(path)]), capsys, message)


def test_info_memory_is_in_the_runs_precision_and_an_encoder_has_no_kv_cache(runs, tmp_path,
                                                                            capsys):
    """An encoder reads its input in one pass (no KV cache line); a bf16 run holds 2 bytes a
    parameter, not fp32's 4; counts have thousands separators."""
    from attnlab.info import count_parameters, estimate, human_bytes

    def memory(out: str) -> dict[str, str]:
        pairs = (line.strip().rsplit(":", 1) for line in out.splitlines()
                 if line.strip().startswith("memory, "))
        return {label: value.strip() for label, value in pairs}

    assert main(["info", str(runs["encoder"])]) == 0
    out = capsys.readouterr().out
    assert "KV" not in out and "memory, inference (fp32)" in memory(out)
    assert main(["info", str(runs["decoder"])]) == 0
    out = capsys.readouterr().out
    assert "memory, inference (fp32 + KV cache)" in memory(out)
    model = build_model(ModelConfig.from_dict(RunDir(runs["decoder"]).read_config()["model"]))
    n = count_parameters(model)
    assert out.splitlines()[0].startswith(f"model: decoder, {n:,} parameters, ")
    bf16 = tmp_path / "bf16"
    make_run(bf16, "decoder")
    config = RunDir(bf16).read_config()
    RunDir(bf16).write_config({**config, "train": {"precision": "auto"}})  # measured: bf16
    RunDir(bf16).save_checkpoint("best", model, meta={"step": 1, "precision": "bf16"})
    assert main(["info", str(bf16)]) == 0
    got = memory(capsys.readouterr().out)
    cfg = model.config
    want = estimate(cfg, n, 1, cfg.max_len, bytes_per_value=2)
    assert got["memory, inference (bf16 + KV cache)"] == human_bytes(
        want.inference_memory_bytes)
    assert want.inference_memory_bytes == 2 * n + want.kv_cache_bytes
    assert got["memory, training (bf16 autocast, fp32 weights + AdamW)"] == human_bytes(
        want.train_memory_bytes)


def test_viz_of_a_big_grid_says_what_it_draws_and_how_to_draw_less(tmp_path, capsys):
    """Dozens of heatmaps take seconds to draw: the command says how many and names
    --layer / --head first (a small grid draws without a word)."""
    from attnlab.cli.inspect import BIG_GRID

    tok = CharTokenizer.from_text(TEXT)
    cfg = ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=16, n_heads=4,
                      n_layers=7, max_len=40, dropout=0.0)
    assert cfg.n_layers * cfg.n_heads > BIG_GRID
    torch.manual_seed(0)
    run = RunDir(tmp_path / "big")
    (tmp_path / "big").mkdir()
    run.write_config({"model": cfg.to_dict(), "data": {}, "train": {}})
    run.save_tokenizer(tok)
    run.save_checkpoint("best", build_model(cfg))
    assert main(["viz", "attention", str(tmp_path / "big"), "--text", "the fox",
                 "--out", str(tmp_path / "a.png")]) == 0
    err = capsys.readouterr().err
    assert "7 layers x 4 heads = 28 heatmaps" in err and "--layer" in err
    assert main(["viz", "attention", str(tmp_path / "big"), "--text", "the fox", "--layer", "0",
                 "--out", str(tmp_path / "b.png")]) == 0
    assert "heatmaps" not in capsys.readouterr().err
