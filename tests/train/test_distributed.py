"""`attnlab train` under torchrun: 2 CPU processes (gloo) train exactly what one process trains
on the same global batch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.runs import read_metrics

TEXT = "".join(f"all the world's a stage, and all the men and women merely players {i}.\n"
               for i in range(40))


def command(text, out):
    return ["train", "--set", f"data.path={text}",
            "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
            "--set", "model.max_len=16", "--set", "model.dropout=0.0",
            "--set", "train.precision=fp32", "--set", "train.device='cpu'",
            "--set", "train.progress=false",
            "--set", "train.tensorboard=false", "--set", "train.batch_size=6",
            "--set", "train.grad_accum=2", "--set", "train.max_steps=3",
            "--set", "train.log_every=1", "--set", "train.eval_every=0",
            "--set", "train.eval_batches=2", "--set", "train.lr=1e-2",
            "--out", str(out)]


MAIN = "import sys\nfrom attnlab.cli import main\nsys.exit(main())\n"
# rank 1 alone gets a SIGTERM during step 5 (as `kill` of one process would send it)
SIGNALLED = """import os, signal, sys
from attnlab.cli import main
from attnlab.train import Trainer
plain = Trainer.train_step
def train_step(self):
    if self.step == 4 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGTERM)
    return plain(self)
Trainer.train_step = train_step
sys.exit(main())
"""


ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
WARM: dict[str, str] = {}


@pytest.fixture(scope="session", autouse=True)
def _warm():
    """`attnlab` commands run by one warm server (docs/warm.py: forked, with torch imported
    once); the scripts that patch attnlab (SIGNALLED, KILLED) run as fresh processes."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "docs"))
    from warm import warm_attnlab

    with warm_attnlab({**os.environ, **ENV}) as env:
        WARM.update(env)
        yield
        WARM.clear()


def run(args, nproc, tmp_path, ok=True, main=MAIN):
    script = tmp_path / "attnlab_main.py"
    script.write_text(main)
    env = {**os.environ, **ENV, "ATTNLAB_CACHE_DIR": str(tmp_path / "cache")}
    if WARM and main == MAIN:
        env.update(WARM)
        client = shutil.which("attnlab", path=WARM["PATH"])
        launcher = [client] if nproc == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "--no-python", client]
    else:
        launcher = [sys.executable, str(script)] if nproc == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", str(script)]
    proc = subprocess.run(launcher + args, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_two_processes_equal_one_process_on_the_same_global_batch(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    run(command(text, tmp_path / "one"), 1, tmp_path)
    ddp = run(command(text, tmp_path / "two"), 2, tmp_path)
    assert "2 processes (DDP, gloo)" in ddp.stderr
    # the second process keeps quiet (its lines repeated the first's); errors would still show
    assert ddp.stderr.count("training a decoder-only model") == 1, ddp.stderr[-3000:]
    one = read_metrics(tmp_path / "one" / "metrics.csv")
    two = read_metrics(tmp_path / "two" / "metrics.csv")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3]
    for a, b in zip(one, two):  # the first step's loss, and the later ones
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)
    assert one[-1]["val_loss"] == pytest.approx(two[-1]["val_loss"], abs=1e-5)
    wa = load_file(tmp_path / "one" / "last" / "model.safetensors")
    wb = load_file(tmp_path / "two" / "last" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-6)
    # only rank 0 wrote: the run dirs hold the same files
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == \
        sorted(p.name for p in (tmp_path / "two").iterdir())


@pytest.mark.slow
def test_one_process_under_torchrun_goes_through_ddp_and_trains_the_same(tmp_path):
    """As in nanoGPT, torchrun with one process joins a process group and wraps the model in
    DDP (the path of K processes, and of one GPU with nccl); it trains what a plain process
    trains."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    plain = run(command(text, tmp_path / "one"), 1, tmp_path)
    script = tmp_path / "attnlab_main.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNLAB_CACHE_DIR": str(tmp_path / "cache")}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=1", str(script), *command(text, tmp_path / "ddp")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "1 process (DDP, gloo)" in ddp.stderr, ddp.stderr[-3000:]
    assert "DDP" not in plain.stderr
    one = read_metrics(tmp_path / "one" / "metrics.csv")
    two = read_metrics(tmp_path / "ddp" / "metrics.csv")
    assert [r["train_loss"] for r in one] == pytest.approx([r["train_loss"] for r in two],
                                                            abs=1e-6)


# A run in a process that imported torch.distributed.nn before its group formed (as the warm
# server of these tests does; the module's defaults keep the group otherwise): the gloo
# threads of the group, counted before and after the run and after the exit-time release.
OUTLIVES = """import os, socket, sys
import torch.distributed.nn
from attnlab.cli import main
from attnlab.train import distributed
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port))
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
assert main(sys.argv[1:]) == 0
print("threads:", before, threads(), flush=True)
distributed._release_left()
print("threads:", threads())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_the_process_group_outlives_the_ddp_model_and_ends_at_exit(tmp_path):
    """DDP's C++ reducer holds its process group: were it the last holder, the group would be
    destroyed with the model, joining gloo's threads while holding Python's lock, which a gloo
    thread freeing a finished all-reduce's tensors may wait for (a hang after the run, now and
    then). The group stays up after the model is gone and ends at exit, where its destructor
    lets go of the lock."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    script = tmp_path / "outlives.py"
    script.write_text(OUTLIVES)
    proc = subprocess.run([sys.executable, str(script), *command(text, tmp_path / "run")],
                          env={**os.environ, **ENV}, capture_output=True, text=True, timeout=120)
    counts = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("threads:")]
    (before, after), *released = [[int(n) for n in c] for c in counts]
    assert after > before  # the group's threads are up after the run (its model is gone)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert released == [[before]]  # and end when the groups left are let go of


@pytest.mark.slow
def test_the_precision_probe_agrees_over_processes_and_a_small_batch_writes_nothing(tmp_path):
    """precision = "auto": one process measured a batch of 3 rows; two processes on a batch
    of 5 (3 + 2 rows) must agree on measuring again (rank 0 once found its 3 rows cached and
    went on while rank 1 waited for it: a hang). A batch smaller than the processes fails
    before the run dir gets a file."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    auto = ["--set", "train.precision='auto'"]
    run(command(text, tmp_path / "one") + auto + ["--set", "train.batch_size=3"], 1, tmp_path)
    two = run(command(text, tmp_path / "two") + auto + ["--set", "train.batch_size=5"], 2,
              tmp_path)
    assert "train.batch_size=5 over 2 processes: 3 + 2 rows (every loss is averaged over all " \
        "of them, so the run is one process's" in two.stderr, two.stderr[-3000:]
    small = run(command(text, tmp_path / "small") + ["--set", "train.batch_size=1"], 2,
                tmp_path, ok=False)
    assert "cannot be split over 2 processes" in small.stderr
    assert not (tmp_path / "small").exists() or not any((tmp_path / "small").iterdir())


@pytest.mark.slow
def test_two_processes_with_dropout_resume_exactly(tmp_path):
    """Dropout on 3 rows on one process and 2 on the other uses up different amounts of
    randomness: each process's RNG state is saved and restored (once only rank 0's was)."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    extra = ["--set", "model.dropout=0.1", "--set", "train.batch_size=5", "--set",
             "train.grad_accum=1", "--set", "train.decay_steps=6", "--set", "train.eval_every=3"]

    def args(out, steps, *more):
        return command(text, out) + extra + ["--set", f"train.max_steps={steps}", *more]

    run(args(tmp_path / "whole", 6), 2, tmp_path)
    run(args(tmp_path / "split", 3), 2, tmp_path)
    run(args(tmp_path / "split", 6, "--resume"), 2, tmp_path)
    same_weights_and_losses(tmp_path / "whole", tmp_path / "split")
    # a signal to one process between two evaluations: both stop after the same step, saved
    stopped = run(args(tmp_path / "signalled", 6), 2, tmp_path, ok=False, main=SIGNALLED)
    # rank 0 alone says it
    assert stopped.stderr.count("holds step 5; resume with") == 1, stopped.stderr[-3000:]
    run(args(tmp_path / "signalled", 6, "--resume"), 2, tmp_path)
    same_weights_and_losses(tmp_path / "whole", tmp_path / "signalled")


def same_weights_and_losses(a, b):
    ra, rb = (read_metrics(r / "metrics.csv") for r in (a, b))
    assert [r["train_loss"] for r in ra] == [r["train_loss"] for r in rb]
    wa, wb = (load_file(r / "last" / "model.safetensors") for r in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


# ---- train.parallel = "fsdp" ----------------------------------------------------------------
FSDP = ["--set", "train.parallel='fsdp'"]
# rank 1 alone dies at once during step 5 (kill -9); torchrun then ends the other process
KILLED = SIGNALLED.replace("signal.SIGTERM", "signal.SIGKILL")
# each process saves the weights of the model its train_run returns (None: no model) beside
# the run dir
OUTCOME = """import os, sys, torch
import attnlab.train
from attnlab.cli import main
plain = attnlab.train.train_run
def train_run(*args, **kwargs):
    out = plain(*args, **kwargs)
    torch.save(out.model and out.model.state_dict(), f"{out.run_dir}.{os.environ['RANK']}.pt")
    return out
attnlab.train.train_run = train_run
sys.exit(main())
"""


def weights(run_dir, which="last"):
    """The weights of a run dir's checkpoint, whole (sharded or not), by name."""
    from attnlab.runs import load_run

    return load_run(run_dir, which).model.state_dict()


def losses(run_dir, key="train_loss"):
    return [r[key] for r in read_metrics(run_dir / "metrics.csv") if r.get(key) is not None]


@pytest.mark.slow
def test_fsdp_trains_what_ddp_and_one_process_train_over_50_steps(tmp_path):
    """fully_shard on 2 CPU processes (gloo): the loss curve of 50 steps is DDP's and one
    process's, up to float rounding; activation checkpointing changes nothing; the
    checkpoints are sharded (each process's own file) and load whole on one process."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    steps = ["--set", "model.n_layers=2", "--set", "train.max_steps=50", "--set",
             "train.eval_every=25", "--set", "train.log_every=5"]
    one = run(command(text, tmp_path / "one") + steps, 1, tmp_path)
    run(command(text, tmp_path / "ddp") + steps, 2, tmp_path)
    fsdp = run(command(text, tmp_path / "fsdp") + steps + FSDP, 2, tmp_path, main=OUTCOME)
    assert "2 processes (FSDP, gloo)" in fsdp.stderr, fsdp.stderr[-3000:]
    # the first process samples from the model gathered there (the others gather nothing)
    gathered, saved = [torch.load(tmp_path / f"fsdp.{r}.pt") for r in (0, 1)], weights(
        tmp_path / "fsdp")
    assert gathered[1] is None and gathered[0].keys() == saved.keys()
    assert all(torch.equal(v, saved[k]) for k, v in gathered[0].items())
    samples = fsdp.stdout[fsdp.stdout.find("--- sample"):]
    assert samples.count("--- sample") == 3 and one.stdout.endswith(samples), fsdp.stdout
    ac = ["--set", "train.activation_checkpointing=true"]
    run(command(text, tmp_path / "ac") + steps + FSDP + ac, 2, tmp_path)
    curve = losses(tmp_path / "fsdp")
    assert len(curve) == 10 and curve[-1] < curve[0] - 0.5  # it learns
    for other in ("one", "ddp"):
        assert losses(tmp_path / other) == pytest.approx(curve, abs=1e-5), other
        assert losses(tmp_path / other, "val_loss") == pytest.approx(
            losses(tmp_path / "fsdp", "val_loss"), abs=1e-5), other
    assert losses(tmp_path / "ac") == pytest.approx(curve, abs=1e-6)
    for which in ("last", "best"):
        folder = tmp_path / "fsdp" / which
        assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= {p.name for p in
                                                                 folder.iterdir()}
        assert not (folder / "model.safetensors").exists()
    whole, sharded = weights(tmp_path / "one"), weights(tmp_path / "fsdp")
    assert whole.keys() == sharded.keys()
    for k in whole:
        torch.testing.assert_close(whole[k], sharded[k], rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder", "encoder_decoder"])
def test_fsdp_shards_the_blocks_of_every_family(tmp_path, family):
    """A classifier (encoder blocks) and a translation model (encoder and decoder blocks)
    train under fsdp what one process trains."""
    if family == "encoder":
        data = tmp_path / "train.tsv"
        data.write_text("label\tsentence\n" + "".join(
            f"{i % 2}\t{'a good' if i % 2 else 'a bad'} movie {i}\n" for i in range(40)))
        task = ["--set", f"data.path='{data}'", "--set", "data.tokenizer='char'",
                "--set", "model.max_len=32"]
    else:
        task = ["--set", "data.name='reverse'", "--set", "data.val_size=16"]
    tiny = command("", "")[3:-2]  # the tiny model and training, without data.path and --out
    args = ["train", *tiny, *task, "--set", f"model.family='{family}'",
            "--set", "model.n_layers=2", "--set", "train.eval_every=3"]
    run(args + ["--out", str(tmp_path / "one")], 1, tmp_path)
    run(args + FSDP + ["--out", str(tmp_path / "fsdp")], 2, tmp_path)
    assert losses(tmp_path / "one") == pytest.approx(losses(tmp_path / "fsdp"), abs=1e-5)
    assert len(losses(tmp_path / "one")) == 3


@pytest.mark.slow
def test_fsdp_resumes_exactly_after_kill_9(tmp_path):
    """Rank 1 is killed (SIGKILL) in step 5: last/ of step 3 is complete, and resuming it on
    the same 2 processes gives the run that never stopped, bit for bit (dropout included)."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    extra = ["--set", "model.dropout=0.1", "--set", "train.batch_size=5", "--set",
             "train.decay_steps=6", "--set", "train.eval_every=3", "--set",
             "train.max_steps=6", *FSDP]
    run(command(text, tmp_path / "whole") + extra, 2, tmp_path)
    killed = run(command(text, tmp_path / "killed") + extra, 2, tmp_path, ok=False, main=KILLED)
    # process 0 says it lost process 1 (unless torchrun's SIGTERM ends it first): not a bug
    assert "internal error" not in killed.stderr, killed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(tmp_path / "killed" / "metrics.csv")] == [
        1, 2, 3, 4]
    run(command(text, tmp_path / "killed") + extra + ["--resume"], 2, tmp_path)
    assert losses(tmp_path / "whole") == losses(tmp_path / "killed")
    wa, wb = weights(tmp_path / "whole"), weights(tmp_path / "killed")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_a_sharded_run_goes_on_alone_and_a_run_of_one_process_goes_on_sharded(tmp_path):
    """A run trained on 2 fsdp processes is resumed, evaluated and sampled by one process (no
    torchrun); a one-process run is resumed on 2 fsdp processes: both end as the one-process
    run that never stopped. A sharded checkpoint missing a file is refused in one line."""
    from attnlab.cli import main

    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    six = ["--set", "train.max_steps=6", "--set", "train.decay_steps=6",
           "--set", "train.eval_every=3"]
    three = six + ["--set", "train.max_steps=3"]
    run(command(text, tmp_path / "one") + six, 1, tmp_path)
    run(command(text, tmp_path / "sharded") + three + FSDP, 2, tmp_path)
    shutil.copytree(tmp_path / "sharded", tmp_path / "broken")
    (tmp_path / "broken" / "last" / "__1_0.distcp").unlink()
    alone = run(command(text, tmp_path / "sharded") + six + ["--resume"], 1, tmp_path)
    assert "goes on with the whole model" in alone.stderr
    run(command(text, tmp_path / "alone") + three, 1, tmp_path)
    run(command(text, tmp_path / "alone") + six + FSDP + ["--resume"], 2, tmp_path)
    for resumed in ("sharded", "alone"):
        assert losses(tmp_path / resumed) == pytest.approx(losses(tmp_path / "one"), abs=1e-5)
    assert (tmp_path / "alone" / "last" / ".metadata").is_file()  # sharded from then on
    assert main(["eval", str(tmp_path / "alone")]) == 0
    assert main(["sample", str(tmp_path / "alone"), "--prompt", "all", "--max-new-tokens",
                 "5"]) == 0
    # exported on one process: transformers' model of the folder computes the run's logits
    assert main(["export", str(tmp_path / "alone"), "--to", "hf", "--checkpoint", "last",
                 "--out", str(tmp_path / "hf")]) == 0
    from transformers import AutoModelForCausalLM

    from attnlab.runs import load_run

    ours = load_run(tmp_path / "alone", "last")
    ids = torch.tensor([ours.encode("all the world")])
    with torch.no_grad():
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()(ids).logits
        assert torch.allclose(ours.model(ids)[0], theirs, atol=1e-4)
    broken = run(command(text, tmp_path / "broken") + six + ["--resume"], 1, tmp_path, ok=False)
    assert broken.returncode == 2
    line = broken.stderr.strip().splitlines()[-1]
    assert str(tmp_path / "broken") in line and "__1_0.distcp missing" in line, line
    assert len(read_metrics(tmp_path / "broken" / "metrics.csv")) == 3  # nothing lost


@pytest.mark.slow
def test_fsdp_in_bf16_gathers_bf16_weights_and_tracks_ddp(tmp_path):
    """precision bf16: fsdp gathers bf16 weights and averages the gradients in float32
    (MixedPrecisionPolicy), DDP runs float32 weights under autocast; the curves agree to
    bf16's rounding, and activation checkpointing changes nothing."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    bf16 = ["--set", "train.precision='bf16'", "--set", "train.max_steps=10"]
    run(command(text, tmp_path / "ddp") + bf16, 2, tmp_path)
    run(command(text, tmp_path / "fsdp") + bf16 + FSDP, 2, tmp_path)
    ac = ["--set", "train.activation_checkpointing=true"]
    run(command(text, tmp_path / "ac") + bf16 + FSDP + ac, 2, tmp_path)
    curve = losses(tmp_path / "fsdp")
    assert losses(tmp_path / "ddp") == pytest.approx(curve, abs=2e-2)
    assert losses(tmp_path / "ddp") != curve  # the weights were gathered in bf16
    assert losses(tmp_path / "ac") == curve
