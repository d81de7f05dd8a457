"""Training over several machines, and over another number of processes after a resume.

Two "machines" are two torchrun launchers on the loopback address, each with a working folder
of its own (so only the run dir of global rank 0 appears, in its folder), meeting at a c10d
rendezvous; they train the distributed guide's small recipe.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from attnlab.run_config import TrainConfig
from attnlab.runs import read_metrics

RECIPE = """[model]
family = "decoder"
d_model = 32
n_heads = 2
n_layers = 1
max_len = 32
dropout = 0.0

[data]
path = "{path}"

[train]
max_steps = 6
batch_size = 8
eval_every = 3
eval_batches = 2
final_eval_batches = 2
warmup_steps = 1
log_every = 1
precision = "fp32"
progress = false
tensorboard = false
"""
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ATTNLAB = ["-m", "attnlab", "train"]


@pytest.fixture
def recipe(tmp_path):
    """The guide's small recipe on a text the test writes, with a log row every step and no
    dropout (whose masks depend on the number of processes)."""
    text = tmp_path / "story.txt"
    text.write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n"
                            for i in range(1, 301)))
    path = tmp_path / "small_lm.toml"
    path.write_text(RECIPE.format(path=text))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(**more):
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **more}


def train(args, nproc, cwd, ok=True, **env):
    """``attnlab train ARGS`` as one plain process or under torchrun with ``nproc``."""
    launcher = [sys.executable] if nproc == 1 else [
        *TORCHRUN, "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(launcher + ATTNLAB + args, cwd=cwd, env=environment(**env),
                          capture_output=True, text=True, timeout=180)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    return proc


LAUNCH = [sys.executable, "-m", "attnlab", "launch"]


def machines(args, folders, timeout=180):
    """The same command on every "machine" (a folder), at once: their results. The first
    machine starts torchrun, the others `attnlab launch` (torchrun's options, then the
    command): both meet at one rendezvous."""
    port = free_port()
    options = [f"--nnodes={len(folders)}", "--nproc_per_node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=test{port}"]
    procs = []
    for k, folder in enumerate(folders):
        folder.mkdir(parents=True, exist_ok=True)
        command = [*TORCHRUN, *options, *ATTNLAB, *args] if k == 0 else \
            [*LAUNCH, *options, "train", *args]
        procs.append(subprocess.Popen(command, cwd=folder, env=environment(), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    try:
        return [(p.wait(timeout), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            p.kill()


def same_losses(a, b):
    ra, rb = read_metrics(a / "metrics.csv"), read_metrics(b / "metrics.csv")
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(ra, rb):
        assert x["train_loss"] == pytest.approx(y["train_loss"], abs=1e-6), (x, y)
        assert (x["val_loss"] is None) == (y["val_loss"] is None)
        if x["val_loss"] is not None:
            assert x["val_loss"] == pytest.approx(y["val_loss"], abs=1e-5)


@pytest.mark.slow
def test_two_machines_on_loopback_train_what_one_process_trains(tmp_path, recipe):
    train([str(recipe), "--out", "one"], 1, tmp_path)
    done = machines([str(recipe), "--out", "runs/two"], [tmp_path / "a", tmp_path / "b"])
    for rc, _, err in done:
        assert rc == 0, err[-3000:]
    # global rank 0 alone writes (and says) anything: its machine's folder holds the run dir
    written = [m for m in "ab" if (tmp_path / m / "runs" / "two").exists()]
    assert len(written) == 1, written
    two = tmp_path / written[0] / "runs" / "two"
    assert "2 processes (DDP, gloo)" in "".join(err for _, _, err in done)
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in (tmp_path / "one")
                                                           .iterdir())
    same_losses(tmp_path / "one", two)


@pytest.mark.slow
def test_two_machines_on_loopback_train_sharded_into_a_shared_run_dir(tmp_path, recipe):
    """fsdp: every process writes its own shards of the checkpoints, so the machines share
    the run dir's folder (as on a cluster's shared file system: here one absolute path)."""
    train([str(recipe), "--out", "one"], 1, tmp_path)
    shared = tmp_path / "shared" / "two"
    done = machines([str(recipe), "--out", str(shared), "--set", "train.parallel='fsdp'"],
                    [tmp_path / "a", tmp_path / "b"])
    for rc, _, err in done:
        assert rc == 0, err[-3000:]
    assert "2 processes (FSDP, gloo)" in "".join(err for _, _, err in done)
    assert sorted(p.name for p in (shared / "last").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json", "state.json",
        "state.safetensors"]
    same_losses(tmp_path / "one", shared)


@pytest.mark.slow
@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)])
def test_a_run_resumed_on_another_number_of_processes_goes_on(tmp_path, recipe, first, then):
    """The data order, weights and optimizer state go on; the losses are the uninterrupted
    run's up to float rounding (no dropout: the processes' random streams are new ones)."""
    train([str(recipe), "--out", "whole"], 1, tmp_path)
    decay = ["--set", "train.decay_steps=6"]  # the learning rates of 6 steps, in 3 + 3
    train([str(recipe), "--out", "split", "--set", "train.max_steps=3", *decay], first, tmp_path)
    resumed = train([str(recipe), "--out", "split", "--resume", *decay], then, tmp_path)
    assert f"resumed on {then} process" in resumed.stderr, resumed.stderr[-3000:]
    assert f"(saved by {first})" in resumed.stderr
    same_losses(tmp_path / "whole", tmp_path / "split")


@pytest.mark.slow
def test_a_resume_on_more_processes_than_batch_rows_is_one_line(tmp_path, recipe):
    train([str(recipe), "--out", "run", "--set", "train.batch_size=1", "--set",
           "train.max_steps=2"], 1, tmp_path)
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    more = train(["--out", "run", "--resume", "--set", "train.max_steps=4"], 2, tmp_path,
                 ok=False)
    lines = [line for line in more.stderr.splitlines() if line.startswith("attnlab train")]
    assert lines and all(line.startswith("attnlab train: error: a batch of 1 rows cannot be "
                                         "split over 2 processes") for line in lines), lines
    assert "internal error" not in more.stderr  # (torchrun adds its own report of the exit)
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before


@pytest.mark.slow
def test_a_process_group_that_never_forms_ends_in_one_line(tmp_path, recipe):
    """Process 0 of 2 started alone (as srun starts one per task, or a machine whose peer never
    came): one line naming the address, exit 2, after train.dist_timeout_s, nothing written."""
    port = free_port()
    start = time.monotonic()
    alone = train([str(recipe), "--out", "run", "--set", "train.dist_timeout_s=3"], 1, tmp_path,
                  ok=False, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port))
    assert time.monotonic() - start < 60
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines() == [alone.stderr.strip()], alone.stderr
    assert alone.stderr.startswith("attnlab train: error: process 0 of 2 waited "
                                   "train.dist_timeout_s=3 s for the others at "
                                   f"127.0.0.1:{port}"), alone.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("timeout", [["--join-timeout", "3"], ["--rdzv-conf=join_timeout=3"]])
def test_a_machine_that_never_comes_ends_attnlab_launch_in_one_line(tmp_path, recipe, timeout):
    """torchrun waits for every machine before it starts attnlab; `attnlab launch` (its
    ``--join-timeout`` or torchrun's own ``--rdzv-conf join_timeout``) ends the wait with one
    line, exit 2, nothing written (torchrun alone ends it with a traceback)."""
    port = free_port()
    start = time.monotonic()
    proc = subprocess.run([*LAUNCH, "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
                           f"--rdzv-endpoint=127.0.0.1:{port}", *timeout, "train", str(recipe),
                           "--out", "run"], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert time.monotonic() - start < 60
    assert proc.stderr.strip().splitlines() == [
        f"attnlab launch: error: the rendezvous at 127.0.0.1:{port} did not complete in 3 s: "
        "not every machine of "
        "--nnodes 2 joined. Start the same `attnlab launch` (same --nnodes, --rdzv-endpoint "
        "and --rdzv-id) on every machine, and check that the endpoint's host and port can be "
        "reached from each"], proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, says", [
    (["--nproc_per_node=2"], "give an attnlab command after torchrun's options"),
    (["--join-timeout", "soon", "train"], "--join-timeout 'soon': give the seconds"),
    (["--join-timeout=0", "train"], "--join-timeout '0': give the seconds"),
    # torchrun failed an assertion (a traceback) on these, or printed its whole usage
    (["--nproc-per-node", "0", "info", "reverse"], "--nproc-per-node 0 is not allowed: a "
                                                   "number of processes >= 1"),
    (["--nproc_per_node=-1", "info", "reverse"], "--nproc-per-node -1 is not allowed"),
    # torchrun raised (a traceback) on these
    (["--nproc-per-node", "abc", "info", "reverse"], "--nproc-per-node abc is not allowed: a "
                                                     "number of processes >= 1 (or auto, cpu"),
    (["--nproc-per-node", "1.5", "info", "reverse"], "--nproc-per-node 1.5 is not allowed: a"),
    (["--nnodes", "abc", "info", "reverse"], "--nnodes abc is not allowed: a number of machines"),
    (["--nnodes", "0", "info", "reverse"], "--nnodes 0 is not allowed: a number of machines"),
    (["--nnodes", "3:2", "info", "reverse"], "--nnodes 3:2 is not allowed"),
    (["--bogus-flag", "info", "reverse"], "torchrun's options '--bogus-flag': unrecognized "
                                          "arguments: --bogus-flag"),
    (["--nproc-per-node", "1", "launch", "info", "reverse"], "launch takes torchrun's "
                                                             "options, then the command"),
    # a train's config is checked before torchrun starts a process (one line, no banner)
    (["--nproc-per-node", "2", "train", "--set", "model.d_model=-3"], "model.d_model=-3 is not "
                                                                      "allowed: a positive"),
    (["--nproc-per-node", "2", "train", "no.toml"], "config file no.toml does not exist"),
    (["--nproc-per-node", "2", "train", "--resume", "--init-from", "x"], "--init-from "
                                                                         "(train.init_from)"),
    (["--nproc-per-node", "2", "train", "--resume", "--out", "{tmp}/nothing"],
     "cannot resume: {tmp}/nothing has no last/ checkpoint"),
])
def test_attnlab_launch_refuses_bad_words_in_one_line(argv, says, capsys, tmp_path):
    from attnlab.cli import main

    assert main(["launch", *(w.format(tmp=tmp_path) for w in argv)]) == 2
    err = capsys.readouterr().err
    says = says.format(tmp=tmp_path)
    assert err.count("\n") == 1 and err.startswith(f"attnlab launch: error: {says}"), err
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_attnlab_launch_refuses_a_new_run_into_a_checkpoint_before_launching(tmp_path, capsys):
    """A run dir that holds a checkpoint takes a resume, not a new run (the one-process
    line, before torchrun); --print-config writes nothing, so it is let through."""
    from _runs import lm_run
    from attnlab.cli import build_parser, main
    from attnlab.cli.train import _check_before_launch

    run = lm_run(tmp_path / "run")
    assert main(["launch", "--nproc-per-node", "2", "train", "--out", str(run)]) == 2
    assert capsys.readouterr().err == (f"attnlab launch: error: run dir {run} already holds a "
                                       "checkpoint; pass --resume to continue it, or choose "
                                       "another --out\n")
    assert _check_before_launch(build_parser(), ["train", "--out", str(run),
                                                 "--print-config"]) is None


@pytest.mark.parametrize("command, says", [
    (["train", "--bogus"], "attnlab train: error: unrecognized arguments: --bogus; allowed "
                           "arguments: `attnlab train --help`\n"),
    (["eval"], "attnlab eval: error: the following arguments are required: run_dir; allowed "
               "arguments: `attnlab eval --help`\n"),
])
def test_attnlab_launch_says_a_commands_argument_error_once_before_launching(command, says,
                                                                            capsys):
    from attnlab.cli import main

    assert main(["launch", "--nproc-per-node", "2", *command]) == 2
    assert capsys.readouterr().err == says


def test_attnlab_launch_of_a_commands_help_prints_it_once(capsys):
    from attnlab.cli import main

    assert main(["launch", "--nproc-per-node", "2", "train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: attnlab train") and out.count("usage:") == 1, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU refuses gpu")
def test_attnlab_launch_of_a_process_per_gpu_without_one_is_one_line(capsys):
    from attnlab.cli import main

    assert main(["launch", "--nproc-per-node", "gpu", "info", "reverse"]) == 2
    err = capsys.readouterr().err
    assert err == "attnlab launch: error: --nproc-per-node gpu is not allowed (Cuda is not " \
                  "available.): a number of processes >= 1 (or auto, cpu, gpu)\n", err


@pytest.mark.slow
def test_attnlab_launch_returns_the_exit_code_of_its_processes(tmp_path):
    proc = subprocess.run([*LAUNCH, "--standalone", "--nproc_per_node=2", "eval", "no-run"],
                          cwd=tmp_path, env=environment(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("attnlab")]
    assert len(lines) == 2 and all(ln.startswith("attnlab eval: error: run dir no-run does not "
                                                 "exist") for ln in lines), proc.stderr


def test_processes_resumed_on_another_number_draw_from_new_streams_of_their_own():
    """Once, every process of a resume on another number took the first process's saved
    stream: two processes drew the same dropout masks."""
    from attnlab.train.distributed import DistInfo
    from attnlab.train.loop import Trainer, rng_state

    saved = rng_state()
    following = torch.rand(4)  # what the saved stream draws next
    draws = []
    for rank in (0, 1, 0):
        me = SimpleNamespace(info=DistInfo(rank, 2, launched=True), cfg=TrainConfig(seed=7))
        Trainer._resume_rng(me, [saved], saved, 3)
        draws.append(torch.rand(4))
    assert not torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], following) and not torch.equal(draws[1], following)
    assert torch.equal(draws[0], draws[2])  # seeded by train.seed, the step and the rank
    Trainer._resume_rng(SimpleNamespace(info=DistInfo(1, 2, launched=True)), [saved, saved],
                        saved, 3)  # as many processes as saved: each its own, as it was
    assert torch.equal(torch.rand(4), following)
