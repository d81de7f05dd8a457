"""Checkpoints: no pickle, exact round trips, and atomic folder swaps that survive a kill."""

from __future__ import annotations

import json
import os
import pickle
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open

from attnlab import ModelConfig, build_model
from attnlab.decoding import inference_layout
from attnlab.runs import MODEL_FILE, RunDir, load_run, write_dir_atomic
from attnlab.state_tree import flatten, unflatten
from attnlab.train import TrainConfig, build_optimizer
from attnlab.train.loop import rng_state, set_rng_state


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(family="decoder", vocab_size=11, d_model=16, n_heads=2,
                                   n_layers=1, max_len=8, dropout=0.0))


def trained_optimizer(model):
    opt = build_optimizer(model, TrainConfig(lr=0.01), "cpu")
    for _ in range(2):
        logits, loss = model(torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return opt


def test_flatten_round_trips_optimizer_and_rng_state_exactly():
    model = tiny_model()
    opt = trained_optimizer(model)
    random.random()
    np.random.rand()
    state = {"optimizer": opt.state_dict(), "rng": rng_state(), "gen": torch.Generator()
             .manual_seed(3).get_state(), "best": None, "window": [1.5, 3]}
    tensors: dict = {}
    doc = json.loads(json.dumps(flatten(state, tensors)))  # really JSON-able
    back = unflatten(doc, tensors)
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    for k, v in state["optimizer"]["state"].items():
        for name, t in v.items():
            assert torch.equal(back["optimizer"]["state"][k][name], t)
    # restoring the RNGs replays the same numbers
    set_rng_state(back["rng"])
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(state["rng"])
    assert a == (random.random(), float(np.random.rand()), float(torch.rand(1)))
    opt2 = build_optimizer(model, TrainConfig(lr=0.01), "cpu")
    opt2.load_state_dict(back["optimizer"])  # loads into a real optimizer


def test_checkpoint_round_trip_without_pickle(tmp_path, monkeypatch):
    model = tiny_model()
    opt = trained_optimizer(model)
    run = RunDir(tmp_path)
    run.save_checkpoint("last", model, {"step": 7, "optimizer": opt.state_dict()})
    names = sorted(p.name for p in (tmp_path / "last").iterdir())
    assert names == ["manifest.json", MODEL_FILE, "state.json", "state.safetensors"]

    def no_pickle(*args, **kwargs):
        raise AssertionError("checkpoint loading must not unpickle")

    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    other = tiny_model(seed=1)
    state = run.load_state("last")
    run.load_weights(other, "last")
    assert state["step"] == 7
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    saved, back = opt.state_dict(), state["optimizer"]  # the optimizer state, exactly
    assert back["param_groups"] == saved["param_groups"]
    assert back["state"].keys() == saved["state"].keys() and saved["state"]
    for i, slots in saved["state"].items():
        assert slots.keys() == back["state"][i].keys()
        for name, value in slots.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(back["state"][i][name]))


def test_weights_saved_from_a_compiled_model_have_no_prefix(tmp_path):
    model = tiny_model()
    compiled = torch.compile(model)  # wrapping only; nothing is compiled until it is called
    RunDir(tmp_path).save_checkpoint("best", compiled)
    with safe_open(str(tmp_path / "best" / MODEL_FILE), "pt") as f:
        keys = list(f.keys())
    assert keys and not any(k.startswith(("_orig_mod.", "module.")) for k in keys)


def fill(value: str):
    def write(folder):
        (folder / MODEL_FILE).write_text(value)
    return write


def test_a_kill_while_writing_leaves_the_old_checkpoint(tmp_path):
    dest = tmp_path / "last"
    write_dir_atomic(dest, fill("old"))

    def crash(folder):
        (folder / MODEL_FILE).write_text("half")
        raise KeyboardInterrupt  # killed mid-write

    with pytest.raises(KeyboardInterrupt):
        write_dir_atomic(dest, crash)
    assert (RunDir(tmp_path).checkpoint_dir("last") / MODEL_FILE).read_text() == "old"
    write_dir_atomic(dest, fill("new"))  # the next save cleans up
    assert (dest / MODEL_FILE).read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_a_kill_between_the_two_renames_is_recovered(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"model": ModelConfig(
        family="decoder", vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=8,
        dropout=0.0).to_dict()}))
    model = tiny_model()
    run_dir = RunDir(tmp_path)
    run_dir.save_checkpoint("last", model)
    real_replace = os.replace

    def replace_then_die(src, dst):
        if str(dst) == str(tmp_path / "last"):  # old copy moved away, new one not yet in place
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_dir.save_checkpoint("last", tiny_model(seed=5))
    monkeypatch.setattr(os, "replace", real_replace)
    assert not (tmp_path / "last").exists()
    found = run_dir.find_checkpoint("last")  # the complete new copy is still found
    assert found.parent.name == ".last.tmp"
    run = load_run(tmp_path, "last")
    assert torch.equal(run.model.head.weight, tiny_model(seed=5).head.weight)
    # Loaded for inference: eval mode, weights as saved; the decoding speed layout
    # (column-major weights, `inference_layout`) is the caller's choice.
    assert not run.model.training and run.model.head.weight.stride(1) == 1
    inference_layout(run.model)
    assert run.model.decoder.layers[0].self_attn.qkv_proj.weight.stride(0) == 1
    run_dir.save_checkpoint("last", model)  # the next save puts things back in order
    assert run_dir.checkpoint_dir("last") == tmp_path / "last"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "last"]


def test_load_run_gives_the_data_section_and_label_names(tmp_path):
    from _runs import classifier_run, lm_run

    run = load_run(classifier_run(tmp_path / "cls"))
    assert run.data["label_names"] == ["neg", "neutral", "pos"]
    assert run.label_names == ["neg", "neutral", "pos"]
    # no names: the class ids stand in (names that do not fit n_classes: tests/cli/test_cli_use.py)
    (tmp_path / "cls2").mkdir()
    RunDir(tmp_path / "cls2").write_config({**run.config, "data": {}})
    RunDir(tmp_path / "cls2").save_checkpoint("best", run.model)
    assert load_run(tmp_path / "cls2").label_names == ["0", "1", "2"]
    assert load_run(lm_run(tmp_path / "lm")).data == {"name": "embedded"}


class RunsCode:  # a pickle that would call os.system on load
    def __reduce__(self):
        return os.system, ("echo hacked > hacked.txt",)


def test_a_sharded_checkpoint_round_trips_on_one_process_and_its_index_runs_no_code(
        tmp_path, monkeypatch):
    """save_sharded / load_sharded without a process group (one process: one shard file):
    weights and optimizer moments come back exactly; an index (.metadata) that would run
    code when unpickled is refused in one line, and nothing runs."""
    from attnlab.errors import RunError
    from attnlab.weights import load_sharded, save_sharded

    model = tiny_model(0)
    opt = trained_optimizer(model)
    groups = save_sharded(tmp_path / "ckpt", model, opt)
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {".metadata", "__0_0.distcp"}
    other = tiny_model(1)
    other_opt = build_optimizer(other, TrainConfig(lr=0.01), "cpu")
    load_sharded(tmp_path / "ckpt", other, other_opt, groups)
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    for a, b in zip(opt.state.values(), other_opt.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunError, match="system is no part of a checkpoint's index"):
        load_sharded(tmp_path / "ckpt", tiny_model(0))
    assert not (tmp_path / "hacked.txt").exists()
