"""Freed memory kept between training steps (:mod:`attnlab.speed.memory`)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from attnlab.speed import memory
from attnlab.tasks import build_task
from attnlab.train import RunConfig, TrainConfig, Trainer

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# A "step" that makes 40 blocks of 1 MiB and frees them, as a CPU step frees its activations;
# prints the page faults of 5 steps after the first.
STEPS = """
import resource, sys, torch
from attnlab.speed import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():
    blocks = [torch.ones(2**18) for _ in range(40)]
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(how: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in memory.OWN_SETTINGS}
    out = subprocess.run([sys.executable, "-c", STEPS, how], env=env, check=True,
                         capture_output=True, text=True).stdout
    return int(out)


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc malloc's; other C libraries "
                    "are left as they are")
def test_freed_memory_is_taken_again_without_page_faults():
    # glibc as it starts hands the 40 MiB back (unmapped, or trimmed from the heap's top) in
    # some of the steps, each time 10,240 pages that the next step faults in again
    assert page_faults("default") > 5000
    assert page_faults("keep") < 1000


@pytest.mark.parametrize("name", memory.OWN_SETTINGS)
def test_the_users_own_malloc_settings_are_left_as_they_are(monkeypatch, name):
    monkeypatch.setenv(name, "131072")
    assert memory.keep_freed_memory.__wrapped__() is False


def test_training_on_a_cpu_keeps_freed_memory(monkeypatch):
    called = []
    monkeypatch.setattr("attnlab.train.loop.keep_freed_memory", lambda: called.append(1))
    rc = RunConfig.from_dict({
        "model": {"vocab_size": 12, "d_model": 16, "n_heads": 2,
                  "n_layers": 1, "max_len": 16},
        "data": {"name": "copy", "synth_vocab": 12},
        "train": {"batch_size": 4, "max_steps": 1, "device": "cpu", "precision": "fp32"}})
    Trainer(rc, build_task(rc))
    assert called == [1]


def test_sharded_training_hands_freed_memory_back(monkeypatch):
    """Under FSDP the weights each block gathers, kept in the heap once freed, held what the
    shards save (85M parameters: a process's peak 2.39 / 2.47 GB against 1.92-2.26 GB with
    glibc's malloc as it starts), at no speed gain: a sharded run leaves malloc as it is."""
    called = []
    monkeypatch.setattr("attnlab.train.loop.keep_freed_memory", lambda: called.append(1))
    cpu = torch.device("cpu")
    Trainer._set_process(SimpleNamespace(cfg=TrainConfig(parallel="fsdp"), device=cpu))
    assert called == []
    Trainer._set_process(SimpleNamespace(cfg=TrainConfig(parallel="ddp"), device=cpu))
    assert called == [1]


def test_evaluating_on_a_cpu_keeps_freed_memory(monkeypatch, tmp_path):
    """`attnlab eval` makes and frees each batch's (B, T, V) logits: with glibc's own settings
    a GPT-2-vocabulary run's evaluation took 11.8M page faults, 1.46x the time."""
    from attnlab.train import evaluate_run, train_run

    rc = RunConfig.from_dict({
        "model": {"vocab_size": 12, "d_model": 16, "n_heads": 2, "n_layers": 1,
                  "max_len": 16},
        "data": {"name": "copy", "synth_vocab": 12},
        "train": {"batch_size": 4, "max_steps": 1, "device": "cpu", "precision": "fp32",
                  "eval_batches": 1, "samples": 0, "progress": False, "tensorboard": False}})
    train_run(rc, tmp_path / "run")
    called = []
    monkeypatch.setattr("attnlab.train.evaluate.keep_freed_memory",
                        lambda: called.append(1))
    assert "val_loss" in evaluate_run(tmp_path / "run", device="cpu")
    assert called == [1]
