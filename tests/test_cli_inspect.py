"""`attnlab info` and `attnlab viz` end to end on tiny run dirs made here."""

import pytest
import torch

from attnlab import ModelConfig, build_model
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
        assert main(["viz", "attention", str(run), "--text", "the lazy fox", "--target",
                     "the dog", "--out", str(png), "--html", str(html), "--layer", "1"]) == 0
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
    (["--text", "x" * 60], "60 tokens long but the model attends to at most 40"),
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
