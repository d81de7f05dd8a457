"""Masked-language-model pretraining (``model.head = "mlm"``): BERT's masking, the model's
logits and loss, the run, and its fine-tuning into a classifier. Tiny data made in tmp_path."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.config import ConfigError, LossOptions, ModelConfig
from attnlab.interpret import attention_maps
from attnlab.models import MaskedLM, build_model
from attnlab.runs import load_run, read_metrics
from attnlab.tasks import MaskedLMTask, build_task
from attnlab.tasks.classification import MASK_RATE, mask_tokens
from attnlab.tokenizers import BPETokenizer
from attnlab.train import RunConfig, train_run

WORDS = ["good", "bad", "fine", "dull", "bright", "slow", "warm", "cold"]
# sentences and phrases cut from them, as in SST-2's train.tsv
SENTENCES = [f"a {WORDS[i % 8]} film with a {WORDS[(i * 3) % 8]} story number {i}"
             for i in range(40)]
ROWS = [(s, i % 2) for i, s in enumerate(SENTENCES)] + \
    [(" ".join(s.split()[1:4]), i % 2) for i, s in enumerate(SENTENCES)]
TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "dropout": 0.0, "norm": "pre",
        "max_len": 64, "pooling": "mean", "pos": "rope"}
TRAIN = {"precision": "fp32", "progress": False, "tensorboard": False, "log_every": 1,
         "warmup_steps": 2, "lr": 3e-3, "seed": 3, "batch_size": 8, "max_steps": 6,
         "eval_every": 3}


def tsv(path: Path) -> str:
    path.write_text("label\tsentence\n" + "".join(f"{y}\t{s}\n" for s, y in ROWS))
    return str(path)


def mlm_dict(tmp_path: Path, **train) -> dict:
    return {"model": {**TINY, "head": "mlm"},
            "data": {"path": tsv(tmp_path / "train.tsv"), "tokenizer": "char",
                     "holdout": 0.2},
            "train": {**TRAIN, "best_metric": "val_loss", **train}}


def test_mask_tokens_follows_bert_and_replays_from_the_generator():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (400, 50), generator=gen)
    ids[:, 40:] = 0  # padding
    ids[:, 0] = 1  # a [CLS]-like special
    ids[7] = 0  # a row of padding only
    inputs, targets = mask_tokens(ids, 4, 100, torch.Generator().manual_seed(1), keep=(0, 1, None))
    again = mask_tokens(ids, 4, 100, torch.Generator().manual_seed(1), keep=(0, 1))
    assert torch.equal(inputs, again[0]) and torch.equal(targets, again[1])
    picked = targets != -100
    assert torch.equal(targets[picked], ids[picked])  # the original ids, where picked
    assert not picked[:, 40:].any() and not picked[:, 0].any() and not picked[7].any()
    real = ids >= 5
    assert picked[real.any(dim=1)].any(dim=1).all()  # at least one per row with tokens
    share = picked.sum() / real.sum()
    assert abs(float(share) - MASK_RATE) < 0.01
    masked = (inputs == 4) & picked
    kept = (inputs == ids) & picked
    swapped = picked & ~masked & ~kept
    n = picked.sum()
    assert abs(float(masked.sum() / n) - 0.8) < 0.02
    assert abs(float(kept.sum() / n) - 0.1) < 0.02  # ~0.1 plus the random ids equal by chance
    assert abs(float(swapped.sum() / n) - 0.1) < 0.02
    assert (inputs[swapped] >= 5).all()  # random ids never a special one (0, 1, 4 here)
    assert torch.equal(inputs[~picked], ids[~picked])  # the rest untouched


def test_masked_lm_logits_and_loss_at_the_targets_equal_the_full_pass():
    """Given targets, the logits keep their (B, S, V) shape and the loss is of the N masked
    positions; asked for the loss only, the head runs on those N positions alone."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="encoder", head="mlm", vocab_size=40, **{**TINY, "dropout": 0.0})
    model = build_model(cfg).eval()
    assert isinstance(model, MaskedLM)
    assert model.head.weight is model.emb.tok.weight and model.head.bias is not None
    ids = torch.randint(1, 40, (3, 10))
    ids[2, 6:] = 0
    targets = torch.full_like(ids, -100)
    targets[0, 2], targets[1, 5], targets[2, 0] = 7, 9, 11
    full, none = model(ids)  # (B, S, V)
    assert full.shape == (3, 10, 40) and none is None
    at, loss = model(ids, targets)  # (B, S, V)
    picked = targets != -100
    torch.testing.assert_close(at, full)
    torch.testing.assert_close(loss, F.cross_entropy(full[picked], targets[picked]))
    rows = []
    model.head.register_forward_hook(lambda m, inp, out: rows.append(inp[0].shape[:-1]))
    none, only = model(ids, targets, loss=LossOptions(0.1, "sum", loss_only=True))
    assert none is None and rows == [(int(picked.sum()),)]
    torch.testing.assert_close(only, F.cross_entropy(full[picked], targets[picked],
                                                     label_smoothing=0.1, reduction="sum"))
    hidden = model.hidden_states(ids)  # the head is the tied embedding matrix and a bias
    torch.testing.assert_close(full, hidden @ model.emb.tok.weight.T + model.head.bias)
    maps = attention_maps(model, ids, layers=[1])
    assert maps["encoder"][1].shape == (3, 2, 10, 10)
    torch.testing.assert_close(maps.logits, full)
    with pytest.raises(ValueError, match="MaskedLM needs family='encoder', head='mlm'"):
        MaskedLM(cfg.replace(head="classify"))


def test_bpe_with_a_mask_token():
    tok = BPETokenizer.train(SENTENCES, 300, mask=True)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.mask_id not in tok.encode("a <mask> film")  # typed, it is text
    assert BPETokenizer.train(SENTENCES, 300).mask_id is None


def test_an_mlm_run_trains_on_whole_training_sentences_and_resumes_exactly(tmp_path):
    d = mlm_dict(tmp_path, decay_steps=6)
    rc = RunConfig.from_dict(d)
    task = build_task(rc)
    assert isinstance(task, MaskedLMTask) and task.tokenizer.mask_id is not None
    held = {s for s, _ in task.items("val")}
    texts = {task.tokenizer.decode(ids) for ids in task.batches("train", 8, False).ids}
    assert len(texts) == len(task.batches("train", 8, False).ids)  # each sentence once
    assert texts <= set(SENTENCES) - held  # whole sentences only, never a held-out one
    whole = train_run(rc, tmp_path / "whole")
    assert isinstance(whole.model, MaskedLM)
    train_run(RunConfig.from_dict({**d, "train": {**d["train"], "max_steps": 3}}),
              tmp_path / "split")
    train_run(rc, tmp_path / "split", resume=True)
    a, b = (read_metrics(tmp_path / r / "metrics.csv") for r in ("whole", "split"))
    for key in ("train_loss", "val_loss", "accuracy"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    assert a[-1]["val_loss"] < a[2]["val_loss"]  # it learns
    wa, wb = (load_file(tmp_path / r / "last" / "model.safetensors") for r in ("whole", "split"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_an_mlm_run_fine_tunes_into_a_classifier(tmp_path):
    train_run(RunConfig.from_dict(mlm_dict(tmp_path)), tmp_path / "mlm")
    src = load_file(tmp_path / "mlm" / "best" / "model.safetensors")
    d = {"model": {}, "data": {"path": str(tmp_path / "train.tsv"),
                               "holdout": 0.2, "label_names": ["neg", "pos"]},
         "train": {**TRAIN, "init_from": str(tmp_path / "mlm"), "max_steps": 1, "lr": 1e-12,
                   "min_lr": 0.0, "warmup_steps": 0, "weight_decay": 0.0, "eval_every": 0}}
    out = train_run(RunConfig.from_dict(d), tmp_path / "ft")
    assert out.config.model.head == "classify" and out.config.model.n_classes == 2
    got = load_file(tmp_path / "ft" / "last" / "model.safetensors")
    assert got["head.weight"].shape == (2, 32)  # a fresh classification head
    for key, value in src.items():
        if not key.startswith("head."):
            torch.testing.assert_close(got[key], value, atol=1e-9, rtol=0)
    assert (tmp_path / "ft" / "tokenizer.json").read_bytes() == \
        (tmp_path / "mlm" / "tokenizer.json").read_bytes()  # with its <mask>
    # and an MLM run goes on as one, its head kept
    d = mlm_dict(tmp_path, init_from=str(tmp_path / "mlm"), max_steps=1, lr=1e-12, min_lr=0.0,
                 warmup_steps=0, weight_decay=0.0, eval_every=0)
    d["model"] = {"head": "mlm"}
    train_run(RunConfig.from_dict(d), tmp_path / "more")
    more = load_file(tmp_path / "more" / "last" / "model.safetensors")
    torch.testing.assert_close(more["head.bias"], src["head.bias"], atol=1e-9, rtol=0)


def test_mlm_refusals_are_one_line(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("some text to model\n" * 20)
    lm = {"model": {"head": "mlm"}, "data": {"path": str(text)}, "train": TRAIN}
    with pytest.raises(ConfigError, match=re.escape(
            f"model.head='mlm' pretrains an encoder on labelled sentences, but data.path="
            f"{str(text)!r} trains a language-model model; allowed: data.name one of 'sst2'")):
        build_task(RunConfig.from_dict(lm))
    with pytest.raises(ConfigError, match="head='bert' is not allowed"):
        ModelConfig(family="encoder", head="bert")
    train_run(RunConfig.from_dict(mlm_dict(tmp_path, max_steps=1, eval_every=0)),
              tmp_path / "mlm")
    (tmp_path / "in.txt").write_text("a good film\n")
    assert main(["classify", str(tmp_path / "mlm"), "--input", str(tmp_path / "in.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds a masked language model" in err \
        and "--init-from" in err
    assert main(["export", str(tmp_path / "mlm"), "--to", "hf", "--out",
                 str(tmp_path / "hf")]) == 2
    assert "head='classify' (got 'mlm')" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
    run = load_run(tmp_path / "mlm")
    assert isinstance(run.model, MaskedLM)


def test_mlm_evaluation_masks_each_sentence_the_same_way_in_any_batch(tmp_path):
    d = mlm_dict(tmp_path)
    scores = []
    for size in (3, 16):
        rc = RunConfig.from_dict({**d, "train": {**d["train"], "eval_batch_size": size}})
        task = build_task(rc)
        torch.manual_seed(0)
        model = build_model(task.model_config).eval()
        scores.append(task.evaluate(model, "val", torch.device("cpu"), contextlib.nullcontext))
    assert scores[0] == pytest.approx(scores[1], rel=1e-5)


def test_fine_tuning_holds_out_the_sentences_its_pretraining_held_out(tmp_path, capsys):
    """The MLM run (train.seed 3) held out 20% of the sentences; a fine-tuning on the same file
    with another train.seed validates on exactly those (it used to split by its own seed, so
    most of its validation sentences were pretraining sentences). An explicit other split is
    refused; resuming keeps the split."""
    train_run(RunConfig.from_dict(mlm_dict(tmp_path)), tmp_path / "mlm")
    pre = build_task(RunConfig.from_dict(mlm_dict(tmp_path)))

    def fine_tune(**data):
        return {"model": {}, "data": {"path": str(tmp_path / "train.tsv"),
                                      "holdout": 0.2, **data},
                "train": {**TRAIN, "seed": 11, "init_from": str(tmp_path / "mlm"),
                          "max_steps": 2, "eval_every": 0}}

    out = train_run(RunConfig.from_dict(fine_tune()), tmp_path / "ft")
    assert out.config.data.split_seed == 3 and out.config.train.seed == 11
    ft = build_task(out.config)
    assert ft.items("val") == pre.items("val") and len(pre.items("val")) > 0
    own_split = build_task(RunConfig.from_dict({**fine_tune(), "train": {**TRAIN, "seed": 11}}))
    assert own_split.items("val") != pre.items("val")  # what the fine-tuning used to validate on
    with pytest.raises(ConfigError, match=r"data.split_seed=5 holds out other sentences than "
                                          r"train.init_from=.*data.split_seed=3"):
        train_run(RunConfig.from_dict(fine_tune(split_seed=5)), tmp_path / "ft5")
    assert not (tmp_path / "ft5").exists()
    d = fine_tune()  # resumed from the recipe (no split_seed in it): the run's split
    d["train"]["max_steps"] = 3
    again = train_run(RunConfig.from_dict(d), tmp_path / "ft", resume=True)
    assert again.result.step == 3 and again.config.data.split_seed == 3


def test_mlm_pretraining_reads_any_labels(tmp_path):
    """The labels are not MLM's objective: a 3-class file pretrains without label_names."""
    path = tmp_path / "three.tsv"
    path.write_text("label\tsentence\n" + "".join(f"{i % 3}\t{s}\n"
                                                  for i, s in enumerate(SENTENCES)))
    d = mlm_dict(tmp_path, max_steps=1, eval_every=0)
    d["data"]["path"] = str(path)
    train_run(RunConfig.from_dict(d), tmp_path / "mlm3")
    assert (tmp_path / "mlm3" / "last").is_dir()
