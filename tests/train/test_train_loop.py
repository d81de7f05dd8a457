"""The training loop: accumulation = one big batch, resume = uninterrupted, compile fallback,
best checkpoint and early stopping. Tiny models and data made in tmp_path; CPU."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from attnlab.config import DEFAULT_LOSS, ConfigError
from attnlab.data import pad
from attnlab.models import build_model, token_loss
from attnlab.runs import RunDir, RunError, read_metrics
from attnlab.tasks import build_task
from attnlab.train import RunConfig, Trainer, train_run

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog; {i * 7 % 13}.\n"
               for i in range(60))
PAIRS = [(f"ein {w} hund {i}", f"a {w} dog {i}") for i, w in
         enumerate(["kleiner", "grosser", "roter", "alter", "junger", "brauner"] * 6)]
SENTENCES = [(f"a {'good' if i % 2 else 'bad'} movie number {i}", i % 2) for i in range(60)]

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "dropout": 0.1, "norm": "pre"}
# the training loop on a CPU (tests/train/test_cuda.py has the device's own tests)
TRAIN = {"device": "cpu", "precision": "fp32", "progress": False, "tensorboard": False,
         "log_every": 1, "warmup_steps": 2, "lr": 3e-3, "seed": 3}


def lm_dict(tmp_path, **train) -> dict:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return {"model": {**TINY, "max_len": 16}, "data": {"path": str(path)},
            "train": {**TRAIN, "batch_size": 4, "max_steps": 6, "eval_every": 3, **train}}


def translation_dict(tmp_path, **train) -> dict:
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("\n".join(s for s, _ in PAIRS) + "\n")
    tgt.write_text("\n".join(t for _, t in PAIRS) + "\n")
    data = {"src_path": str(src), "tgt_path": str(tgt),
            "val_src_path": str(src), "val_tgt_path": str(tgt), "tokenizer": "char"}
    return {"model": {**TINY, "max_len": 32}, "data": data,
            "train": {**TRAIN, "max_tokens": 120, "max_steps": 6, "eval_every": 3, **train}}


def classify_dict(tmp_path, **train) -> dict:
    path = tmp_path / "train.tsv"
    path.write_text("label\tsentence\n" + "".join(f"{y}\t{s}\n" for s, y in SENTENCES))
    return {"model": {**TINY, "max_len": 32}, "data": {"path": str(path),
                                                      "tokenizer": "char"},
            "train": {**TRAIN, "batch_size": 8, "max_steps": 6, "eval_every": 3, **train}}


def test_split_seed_fixes_the_held_out_set_while_train_seed_varies(tmp_path):
    def val(seed, split_seed=None):
        d = classify_dict(tmp_path, seed=seed)
        d["data"]["split_seed"] = split_seed
        return [s for s, _ in build_task(RunConfig.from_dict(d)).items("val")]

    assert val(3) != val(4)  # by default train.seed draws the split too
    assert val(3, split_seed=9) == val(4, split_seed=9) == val(9)


def test_tokens_per_s_counts_training_time_only(tmp_path, monkeypatch):
    """Each step takes 1 s and each evaluation 100 s on a fake clock: every log row reads the
    step's tokens per second, also when an evaluation falls between two log rows (it once
    dropped that window's start time but kept its tokens)."""
    from attnlab.train import loop

    now = [0.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: now[0])
    step, evaluate = Trainer.train_step, Trainer.evaluate

    def timed_step(self):
        now[0] += 1.0
        return step(self)

    def timed_eval(self, *a, **k):
        now[0] += 100.0
        return evaluate(self, *a, **k)

    monkeypatch.setattr(Trainer, "train_step", timed_step)
    monkeypatch.setattr(Trainer, "evaluate", timed_eval)
    rc = RunConfig.from_dict(lm_dict(tmp_path, log_every=4, eval_every=6, max_steps=12))
    train_run(rc, tmp_path / "run")
    rates = [r["tokens_per_s"] for r in read_metrics(tmp_path / "run" / "metrics.csv")
             if r["tokens_per_s"] is not None]
    assert len(rates) == 3 and all(r == pytest.approx(4 * 16) for r in rates), rates
    # elapsed_s goes on across a resume: stopped at step 6 and resumed, the same clock readings
    whole = read_metrics(tmp_path / "run" / "metrics.csv")
    half = lm_dict(tmp_path, log_every=4, eval_every=6, max_steps=6)
    train_run(RunConfig.from_dict(half), tmp_path / "split")
    result = train_run(rc, tmp_path / "split", resume=True).result
    split = read_metrics(tmp_path / "split" / "metrics.csv")
    logged = lambda rows: {r["step"]: r["elapsed_s"] for r in rows if r["step"] % 4 == 0}  # noqa: E731
    assert logged(split) == logged(whole) == {4: 4.0, 8: 108.0, 12: 112.0}
    assert result.wall_s == pytest.approx(12 + 2 * 100 + 100)  # + the final evaluation


def stepping_on(grad_accum: int, batches: list) -> Trainer:
    """A trainer of the copy task (no dropout, no clipping) whose steps take ``batches`` in
    turn and, instead of updating the weights, keep the gradients the optimizer is given (in
    its ``grads``)."""
    rc = RunConfig.from_dict({"model": {**TINY, "dropout": 0.0, "max_len": 16},
                              "data": {"name": "copy", "synth_vocab": 12},
                              "train": {**TRAIN, "grad_accum": grad_accum, "grad_clip": 0.0}})
    trainer = Trainer(rc, build_task(rc))
    feed, trainer.grads = iter(batches), []
    trainer.task.next_batch = lambda: next(feed)
    trainer.optimizer.step = lambda *a, **k: trainer.grads.append(
        [p.grad.clone() for p in trainer.model.parameters()])
    return trainer


def test_accumulated_micro_batches_equal_one_big_batch_with_uneven_padding(tmp_path):
    gen = torch.Generator().manual_seed(0)
    rows = []  # (src, tgt) of very different lengths: micro-batches pad very differently
    for n in (1, 2, 9, 3, 8, 2, 1, 9, 5, 1, 4, 7):
        toks = torch.randint(3, 12, (n,), generator=gen).tolist()
        rows.append((toks, [1, *toks, 2]))

    def batch(part):
        src = pad([s for s, _ in part], 0)[0]
        tgt = pad([t for _, t in part], 0)[0]
        return src, tgt[:, :-1], tgt[:, 1:]

    micro = [batch(rows[i:i + 3]) for i in range(0, 12, 3)]
    four, one = stepping_on(4, micro), stepping_on(1, [batch(rows)])
    for a, b in zip(four.model.parameters(), one.model.parameters()):
        assert torch.equal(a, b)  # the same weights (the same seed) to start from
    (loss_a, n_a), (loss_b, n_b) = four.train_step(), one.train_step()
    (g_a,), (g_b,) = four.grads, one.grads  # one optimizer step each
    assert float(n_a) == float(n_b) == sum(len(t) - 1 for _, t in rows)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
    for a, b in zip(g_a, g_b):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # averaging per-micro-batch means instead would NOT match: the test can tell them apart
    four.optimizer.zero_grad(set_to_none=True)
    for b in micro:
        (four.task.loss_sum(four.model, b) / four.task.count(b) / 4).backward()
    wrong = [p.grad for p in four.model.parameters()]
    assert not all(torch.allclose(a, b, rtol=1e-3) for a, b in zip(wrong, g_b))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("make", [lm_dict, translation_dict, classify_dict],
                         ids=["lm", "translation", "classification"])
def test_resume_gives_the_same_losses_and_weights(tmp_path, make, optimizer):
    d = make(tmp_path, grad_accum=2, decay_steps=6, optimizer=optimizer)
    whole = train_run(RunConfig.from_dict(d), tmp_path / "whole")
    half = {**d, "train": {**d["train"], "max_steps": 3}}
    train_run(RunConfig.from_dict(half), tmp_path / "split")
    resumed = train_run(RunConfig.from_dict(d), tmp_path / "split", resume=True)
    assert resumed.result.step == whole.result.step == 6
    assert [r["step"] for r in read_metrics(tmp_path / "whole" / "metrics.csv")] == [
        1, 2, 3, 4, 5, 6]
    same_run(tmp_path / "whole", tmp_path / "split")


def same_run(a, b) -> None:
    """Two run dirs hold the same log rows and the same last/ weights."""
    ra, rb = read_metrics(a / "metrics.csv"), read_metrics(b / "metrics.csv")
    for key in ("step", "train_loss", "val_loss", "lr"):
        assert [r.get(key) for r in ra] == [r.get(key) for r in rb], key
    wa, wb = (load_file(r / "last" / "model.safetensors") for r in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def signalled_at(step: int, *signals: int):
    """Trainer.train_step that sends this process ``signals`` during step ``step + 1``."""
    plain = Trainer.train_step

    def train_step(self):
        if self.step == step:
            for s in signals:
                os.kill(os.getpid(), s)
        return plain(self)
    return train_step


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_after_the_step_it_came_in_with_that_step_saved(tmp_path, monkeypatch,
                                                                       sig):
    d = lm_dict(tmp_path, decay_steps=6, keep_checkpoints=2)  # evaluations at steps 3 and 6
    train_run(RunConfig.from_dict(d), tmp_path / "whole")

    def unhandled(signum, frame):  # what the signal meets if training did not take it
        raise AssertionError(f"{signal.Signals(signum).name} was not taken by the training")
    before = signal.signal(sig, unhandled)
    try:
        monkeypatch.setattr(Trainer, "train_step", signalled_at(3, sig))
        with pytest.raises(KeyboardInterrupt):
            train_run(RunConfig.from_dict(d), tmp_path / "split")
        assert signal.getsignal(sig) is unhandled  # the handlers are put back
    finally:
        signal.signal(sig, before)
    split = RunDir(tmp_path / "split")
    assert split.checkpoint_meta("last")["step"] == 4  # not 3, the last evaluation's
    assert [s for s, _ in split.step_checkpoints()] == [3]  # steps/: evaluations only
    monkeypatch.undo()
    resumed = train_run(RunConfig.from_dict(d), tmp_path / "split", resume=True)
    assert resumed.result.step == 6
    same_run(tmp_path / "whole", tmp_path / "split")  # as if it had never stopped
    assert [s for s, _ in split.step_checkpoints()] == [3, 6]


def test_a_second_signal_stops_at_once(tmp_path, monkeypatch):
    d = lm_dict(tmp_path)
    monkeypatch.setattr(Trainer, "train_step", signalled_at(3, signal.SIGTERM, signal.SIGINT))
    # SIGINT as in an interactive shell: a suite run as a background job starts with it ignored
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            train_run(RunConfig.from_dict(d), tmp_path / "run")
    finally:
        signal.signal(signal.SIGINT, before)
    assert RunDir(tmp_path / "run").checkpoint_meta("last")["step"] == 3  # step 4 not taken


def test_a_signal_in_the_last_step_lets_the_run_finish(tmp_path, monkeypatch):
    """Nothing is left to save for: the run ends as usual, its results written (an
    interrupt there would leave a checkpoint with no steps left to resume)."""
    d = lm_dict(tmp_path)
    monkeypatch.setattr(Trainer, "train_step", signalled_at(5, signal.SIGTERM))
    assert train_run(RunConfig.from_dict(d), tmp_path / "run").result.step == 6
    assert RunDir(tmp_path / "run").results_file.is_file()


def test_an_ignored_signal_stays_ignored(tmp_path, monkeypatch):
    """A background job of a non-interactive shell starts with SIGINT ignored: training does
    not start listening to it."""
    d = lm_dict(tmp_path)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        monkeypatch.setattr(Trainer, "train_step", signalled_at(3, signal.SIGINT))
        assert train_run(RunConfig.from_dict(d), tmp_path / "run").result.step == 6
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


class Broken(torch.nn.Module):
    """What torch.compile returns when the compiler cannot handle the model."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, *args, **kwargs):
        raise RuntimeError("backend compiler failed: no C++ compiler found")


def test_compile_failure_falls_back_to_eager_with_a_warning(tmp_path, monkeypatch, caplog):
    eager = train_run(RunConfig.from_dict(lm_dict(tmp_path)), tmp_path / "eager")
    monkeypatch.setattr(torch, "compile", lambda model, **kw: Broken(model))
    with caplog.at_level(logging.WARNING):
        run = train_run(RunConfig.from_dict(lm_dict(tmp_path, compile=True)), tmp_path / "c")
    assert "torch.compile failed" in caplog.text and "eager" in caplog.text
    assert run.result.train_losses == eager.result.train_losses  # the failed try left no trace


@pytest.mark.parametrize("threads", [1, 3])
def test_more_threads_than_cores_is_said(threads, tmp_path, monkeypatch, caplog):
    """train.threads above the cores the process may run on (its affinity) is a warning: the
    threads take turns and each step runs slower."""
    import attnlab.train.loop as loop

    monkeypatch.setattr(loop, "usable_cores", lambda: 2)
    rc = RunConfig.from_dict(lm_dict(tmp_path, threads=threads))
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING):
            Trainer(rc, build_task(rc), tmp_path / "run")
        assert torch.get_num_threads() == threads
    finally:  # (torch's threads are the whole process's)
        torch.set_num_threads(before)
    said = "train.threads=3 is more than the 2 CPU cores this process may run on"
    assert (said in caplog.text) == (threads == 3), caplog.text


def test_best_checkpoint_and_early_stopping(tmp_path):
    rc = RunConfig.from_dict(lm_dict(tmp_path, max_steps=20, eval_every=1, patience=2))
    task = build_task(rc)
    trainer = Trainer(rc, task, tmp_path / "run")
    scores = iter([3.0, 2.0, 2.5, 2.1, 1.0])  # best at step 2, then two evals without gain
    task.evaluate = lambda *args, **kwargs: {"val_loss": next(scores), "ppl": 1.0}
    result = trainer.fit()
    assert result.stopped_early and result.step == 4
    assert result.best == {"step": 2, "metric": "val_loss", "value": 2.0}
    import json

    meta = json.loads((tmp_path / "run" / "best" / "manifest.json").read_text())
    assert meta["step"] == 2 and meta["value"] == 2.0
    assert not (tmp_path / "run" / "best" / "state.json").exists()  # best/ holds weights only
    assert json.loads((tmp_path / "run" / "last" / "manifest.json").read_text())["step"] == 4


def test_diverged_evaluations_count_against_patience_and_the_stop_logs_its_loss(tmp_path):
    """nan evaluations (a diverged run) are no improvement: patience stops the run (it trained
    to the end); the stopping step's row has its training loss though log_every skips it."""
    rc = RunConfig.from_dict(lm_dict(tmp_path, max_steps=20, eval_every=1, patience=2,
                                     log_every=10))
    trainer = Trainer(rc, build_task(rc), tmp_path / "run")
    scores = iter([3.0, float("nan"), float("nan"), 1.0])
    trainer.task.evaluate = lambda *args, **kwargs: {"val_loss": next(scores), "ppl": 1.0}
    result = trainer.fit()
    assert result.stopped_early and result.step == 3
    assert result.best == {"step": 1, "metric": "val_loss", "value": 3.0}
    rows = RunDir(tmp_path / "run").read_metrics()
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["train_loss"] is not None and rows[-1]["lr"] is not None
    assert result.train_losses[-1][0] == 3


def test_a_fresh_start_in_a_used_folder_drops_the_old_tensorboard_events(tmp_path):
    """A try stopped before its first checkpoint left events at steps 1-4; the new run from
    step 0 shows its own steps only (TensorBoard kept the stale ones)."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                             reason="reading tb/ needs tensorboard (log extra)")
    from attnlab.train.monitor import Monitor

    d = lm_dict(tmp_path, tensorboard=True, log_every=1, eval_every=0, max_steps=2)
    stopped = RunDir(tmp_path / "run")  # what the stopped try wrote: its config, then events
    stopped.write_config(RunConfig.from_dict(d).to_dict())
    mon = Monitor(stopped, (), total=4, start=0, progress=False, tensorboard=True)
    for step in range(1, 5):
        mon.row(step, {"train_loss": 9.0})
    mon.close()
    train_run(RunConfig.from_dict(d), tmp_path / "run")
    logs = ea.EventAccumulator(str(tmp_path / "run" / "tb"))
    logs.Reload()
    assert [e.step for e in logs.Scalars("train_loss")] == [1, 2]


def test_a_run_that_stopped_early_stays_stopped_when_resumed(tmp_path):
    """Killed after its last checkpoint but before results.json: --resume goes straight to the
    final evaluation instead of training on."""
    rc = RunConfig.from_dict(lm_dict(tmp_path, max_steps=20, eval_every=1, patience=2))
    trainer = Trainer(rc, build_task(rc), tmp_path / "run")
    scores = [3.0, 2.0, 2.5, 2.1]  # best at step 2, then two evaluations without gain
    trainer.task.evaluate = lambda *args, **kwargs: {"val_loss": scores.pop(0) if scores
                                                     else 2.1, "ppl": 1.0}
    assert trainer.fit().stopped_early
    again = Trainer(rc, build_task(rc), tmp_path / "run")
    again.resume()
    again.task.evaluate = lambda *args, **kwargs: {"val_loss": 9.0, "ppl": 1.0}
    result = again.fit()
    assert result.stopped_early and result.step == 4
    assert result.best == {"step": 2, "metric": "val_loss", "value": 2.0}


def test_resume_refuses_another_best_metric(tmp_path):
    d = lm_dict(tmp_path, max_steps=3)
    train_run(RunConfig.from_dict(d), tmp_path / "run")
    other = {**d, "train": {**d["train"], "max_steps": 6, "best_metric": "ppl"}}
    with pytest.raises(RunError, match="best checkpoint by 'val_loss'.*best_metric='ppl'"):
        train_run(RunConfig.from_dict(other), tmp_path / "run", resume=True)


@pytest.mark.parametrize("first, then", [("adamw", "muon"), ("muon", "adamw")])
def test_a_resume_under_the_other_optimizer_is_refused(tmp_path, first, then):
    d = lm_dict(tmp_path, max_steps=3, optimizer=first)
    train_run(RunConfig.from_dict(d), tmp_path / "run")
    other = {**d, "train": {**d["train"], "max_steps": 6, "optimizer": then}}
    with pytest.raises(RunError, match=f"train.optimizer='{first}'.*resume with "
                                       f"train.optimizer='{first}'"):
        train_run(RunConfig.from_dict(other), tmp_path / "run", resume=True)


def test_tensorboard_keeps_the_checkpoint_step_on_resume(tmp_path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                             reason="reading tb/ needs tensorboard (log extra)")
    d = lm_dict(tmp_path, tensorboard=True, log_every=2, eval_every=2)
    train_run(RunConfig.from_dict({**d, "train": {**d["train"], "max_steps": 4}}),
              tmp_path / "run")
    train_run(RunConfig.from_dict(d), tmp_path / "run", resume=True)
    logs = ea.EventAccumulator(str(tmp_path / "run" / "tb"))
    logs.Reload()
    for tag in ("train_loss", "val_loss"):
        assert [e.step for e in logs.Scalars(tag)] == [2, 4, 6], tag


class Bigram(torch.nn.Module):
    """Logits from the current token alone: each target's loss is the same in any window. A
    model as the tasks use one: ``forward(ids, targets, loss=LossOptions)`` -> (logits, loss)."""

    def __init__(self, vocab: int, fill: float | None = None):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)
        if fill is not None:
            torch.nn.init.constant_(self.table.weight, fill)

    def forward(self, x, targets=None, *, loss=DEFAULT_LOSS):
        logits = self.table(x)  # (B, T, V)
        return logits, None if targets is None else token_loss(
            logits, targets, None, loss.label_smoothing, loss.reduction)


@pytest.mark.parametrize("length", [41, 47, 60])  # targets: 5 windows of 8; 5 + 6; 7 + 3
def test_lm_evaluation_of_the_whole_split_scores_every_target(tmp_path, length):
    rc = RunConfig.from_dict(lm_dict(tmp_path, block_size=8))
    task = build_task(rc)
    data = torch.randint(0, 10, (length,), generator=torch.Generator().manual_seed(length))
    task.split = lambda name: data
    model = Bigram(10)
    out = task.evaluate(model, "val", torch.device("cpu"), contextlib.nullcontext, 0)
    with torch.no_grad():
        want = F.cross_entropy(model.table(data[:-1]), data[1:])
    assert out["val_loss"] == pytest.approx(float(want), rel=1e-6)


def test_a_diverged_model_is_evaluated_as_nan_not_an_error(tmp_path):
    rc = RunConfig.from_dict(lm_dict(tmp_path))
    task = build_task(rc)
    out = task.evaluate(Bigram(task.tokenizer.vocab_size, fill=float("nan")), "val",
                        torch.device("cpu"), contextlib.nullcontext, 2)
    assert math.isnan(out["val_loss"]) and math.isnan(out["ppl"])
    with pytest.raises(ConfigError, match="lr=inf is not allowed"):
        RunConfig.from_dict(lm_dict(tmp_path, lr=float("inf")))


def test_a_resumed_auto_run_goes_on_in_the_precision_it_trained_in(tmp_path, monkeypatch):
    """The probe's answer can differ on the resuming machine (another cache, another load):
    the checkpoint's precision wins, not a new measurement."""
    import json

    from attnlab.train import loop

    d = lm_dict(tmp_path, precision="auto", max_steps=3)
    monkeypatch.setattr(loop, "fastest", lambda *a, **k: "bf16")
    train_run(RunConfig.from_dict(d), tmp_path / "run")
    monkeypatch.setattr(loop, "fastest", lambda *a, **k: "fp32")
    resumed = RunConfig.from_dict({**d, "train": {**d["train"], "max_steps": 5}})
    train_run(resumed, tmp_path / "run", resume=True)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["precision"] == "bf16"


def test_bf16_autocast_trains_on_cpu(tmp_path):
    run = train_run(RunConfig.from_dict(lm_dict(tmp_path, precision="bf16", max_steps=3)),
                    tmp_path / "bf16")
    losses = [loss for _, loss in run.result.train_losses]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses)
    assert next(run.model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_label_smoothing_raises_the_loss_of_a_confident_model(tmp_path):
    from attnlab.models import token_loss

    logits = torch.full((4, 6), -5.0)
    targets = torch.tensor([0, 2, 4, 5])
    logits[range(4), targets] = 10.0  # confident and right
    eps = 0.1
    plain, smooth = (token_loss(logits, targets, None, e, "sum") for e in (0.0, eps))
    logp = logits.log_softmax(-1)
    want = ((1 - eps) * -logp[range(4), targets] - eps * logp.mean(-1)).sum()  # written out
    assert smooth > plain
    torch.testing.assert_close(smooth, want)
    # and the task passes train.label_smoothing through to it
    d = translation_dict(tmp_path)
    rc0 = RunConfig.from_dict(d)
    task = build_task(rc0)
    batch = task.next_batch()
    trainer = Trainer(rc0, task)
    with torch.no_grad():
        assert task.loss_sum(trainer.model, batch, 0.0).item() != \
            task.loss_sum(trainer.model, batch, 0.1).item()


@pytest.mark.parametrize("make", [lm_dict, translation_dict, classify_dict])
def test_precision_auto_measures_without_changing_the_training(tmp_path, monkeypatch, make):
    """precision = "auto" on a CPU times fp32 and bf16 on the first batch, then trains exactly
    as a run that named the chosen precision: the probe puts back the data position and RNG."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    from attnlab.train import precision as prec

    measured = []

    def fastest(step, key, **kw):  # run the real steps, then pick fp32 (as measured here)
        for p in prec.CANDIDATES:
            step(p)
            measured.append(p)
        return "fp32"

    monkeypatch.setattr("attnlab.train.loop.fastest", fastest)
    results = {}
    for name in ("auto", "fp32"):
        (tmp_path / name).mkdir()
        rc = RunConfig.from_dict(make(tmp_path / name, precision=name))
        trainer = Trainer(rc, build_task(rc))
        assert trainer.precision == "fp32"
        results[name] = [float(trainer.train_step()[0]) for _ in range(3)]
        results[name + "_w"] = [p.detach().clone() for p in trainer.model.parameters()]
    assert measured == ["fp32", "bf16"]  # only the auto run measured
    assert results["auto"] == results["fp32"]
    for a, b in zip(results["auto_w"], results["fp32_w"]):
        assert torch.equal(a, b)


def test_resolve_device_is_the_one_check_of_a_device_name(tmp_path):
    from attnlab.devices import available_devices, resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    assert available_devices()[:2] == ["auto", "cpu"]
    for bad in ("foo", "cpu:3", "xla", "cuda:99"):
        with pytest.raises(ValueError, match=r"--device '.*'.*allowed: auto, cpu"):
            resolve_device(bad, flag="--device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here; allowed: auto, cpu"):
            resolve_device("cuda", flag="--device")
    # load_run takes the same check (torch's "Torch not compiled with CUDA enabled" or
    # "Expected one of cpu, cuda, ..." before)
    from _runs import lm_run
    from attnlab.runs import load_run

    with pytest.raises(ValueError, match="device 'gpu' is not a device; allowed: auto, cpu"):
        load_run(lm_run(tmp_path / "lm"), device="gpu")


def test_more_torchrun_processes_than_gpus_is_one_line(monkeypatch):
    from attnlab.train.distributed import DistInfo
    from attnlab.train.loop import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto", DistInfo(0, 2, 0, True)) == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"train.device 'auto': torchrun started process 1 of "
                       r"this machine, which has 1 CUDA device\(s\); allowed: "
                       r"--nproc_per_node <= 1, or train.device='cpu'"):
        resolve_device("auto", DistInfo(1, 2, 1, True))


def test_the_synthetic_validation_set_does_not_depend_on_the_batch_size(tmp_path):
    def rows(size):
        rc = RunConfig.from_dict({"model": {**TINY, "max_len": 16},
                                  "data": {"name": "reverse", "synth_vocab": 12, "val_size": 40},
                                  "train": {**TRAIN, "eval_batch_size": size}})
        out = []
        for src, _, _ in build_task(rc).examples("val"):
            out += [[t for t in row if t != 0] for row in src.tolist()]
        return out

    assert rows(7) == rows(40) and len(rows(7)) == 40


def test_bleu_of_a_perfect_translation_is_100_with_a_whitespace_tokenizer(tmp_path,
                                                                           monkeypatch):
    """A translation can only be what the tokenizer decodes: with a whitespace pre-tokenizer
    "man's" comes back as "man ' s", so the references are read through it too."""
    from attnlab.tasks import seq2seq

    pairs = [(f"des mannes {i} t-shirt", f"the man's t-shirt, number {i}") for i in range(30)]
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("\n".join(s for s, _ in pairs) + "\n")
    tgt.write_text("\n".join(t for _, t in pairs) + "\n")
    data = {"src_path": str(src), "tgt_path": str(tgt),
            "val_src_path": str(src), "val_tgt_path": str(tgt), "tokenizer": "bpe",
            "vocab_size": 120, "pre_tokenizer": "whitespace"}
    rc = RunConfig.from_dict({"model": {**TINY, "max_len": 32}, "data": data, "train": TRAIN})
    task = build_task(rc)
    tok, refs = task.tokenizer, dict(pairs)
    monkeypatch.setattr(seq2seq, "translate_texts", lambda model, sources, *a, **k: [
        tok.decode(tok.encode(refs[s])) for s in sources])
    model = build_model(task.model_config).eval()
    out = task.evaluate(model, "val", torch.device("cpu"), contextlib.nullcontext)
    assert out["bleu"] == pytest.approx(100.0)


def test_eval_of_a_weights_file_runs_in_the_precision_of_its_checkpoint(tmp_path):
    """`eval --checkpoint RUN/best/model.safetensors` is best/: it evaluated in what "auto"
    resolved to now, not in the precision recorded beside the weights."""
    import json

    from attnlab.train import evaluate_run

    train_run(RunConfig.from_dict(lm_dict(tmp_path, precision="auto", max_steps=2)),
              tmp_path / "run")
    manifest = tmp_path / "run" / "best" / "manifest.json"
    meta = json.loads(manifest.read_text())
    other = "bf16" if meta["precision"] == "fp32" else "fp32"  # not what auto measures here
    manifest.write_text(json.dumps({**meta, "precision": other}))
    by_name = evaluate_run(tmp_path / "run", checkpoint="best")
    by_file = evaluate_run(tmp_path / "run", checkpoint=str(tmp_path / "run" / "best" /
                                                              "model.safetensors"))
    assert by_name["precision"] == by_file["precision"] == other
    assert by_file["val_loss"] == by_name["val_loss"]


def test_a_resumed_auto_run_that_trained_in_fp16_elsewhere_measures_again_on_a_cpu(
        tmp_path, monkeypatch):
    """fp16 (a GPU's auto answer) needs CUDA's loss scaling: resumed on a CPU, the run went on
    in fp16 with a grad scaler (and without the kernel-cache bound a measured answer sets);
    `eval` refused the run. Now the resume measures again and eval runs in fp32."""
    import json

    from attnlab.train import evaluate_run, loop, precision

    d = lm_dict(tmp_path, precision="auto", max_steps=3)
    train_run(RunConfig.from_dict(d), tmp_path / "run")
    for which in ("best", "last"):
        manifest = tmp_path / "run" / which / "manifest.json"
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()),
                                        "precision": "fp16"}))
    assert evaluate_run(tmp_path / "run", checkpoint="best", device="cpu")["precision"] == "fp32"
    bounded = []
    monkeypatch.setattr(precision, "bound_kernel_caches", lambda *a: bounded.append(1))
    monkeypatch.setattr(loop, "fastest", lambda *a, **k: "bf16")
    resumed = RunConfig.from_dict({**d, "train": {**d["train"], "max_steps": 5}})
    train_run(resumed, tmp_path / "run", resume=True)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["precision"] == "bf16"
    assert bounded


def test_the_precision_probe_is_keyed_on_the_number_of_processes():
    from attnlab.train.precision import probe_key

    args = ({"d_model": 8}, [(12, 64)], "auto")
    assert probe_key(*args) == probe_key(*args, 1) != probe_key(*args, 2)


def test_run_files_are_readable_as_the_umask_allows_and_a_failed_save_keeps_the_old(
        tmp_path, monkeypatch):
    """mkstemp made every run file 0600 (another user could not sample the run); a full disk
    in a checkpoint save gave a traceback and left the half-written folder taking space."""
    import stat

    import safetensors.torch

    old = os.umask(0o022)
    try:
        train_run(RunConfig.from_dict(lm_dict(tmp_path, max_steps=2)), tmp_path / "run")
    finally:
        os.umask(old)
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.parent.name != "tb":
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    run = RunDir(tmp_path / "run")
    before = (tmp_path / "run" / "last" / "model.safetensors").read_bytes()

    def full_disk(*args, **kwargs):
        raise safetensors.SafetensorError("I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)  # the weights writer
    with pytest.raises(OSError, match="No space left on device"):
        run.save_checkpoint("last", torch.nn.Linear(2, 2))
    assert (tmp_path / "run" / "last" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("edit", [{"window": "ab"}, {"window": [1.0, -3]}, {"step": -5},
                                  {"step": 5.5}, {"bad_evals": -3}, {"elapsed_s": float("nan")},
                                  {"best": [1, 2]}, {"best": {"metric": "val_loss",
                                                              "value": "x", "step": 2}}])
def test_a_hand_edited_training_state_is_refused_in_one_line(tmp_path, edit):
    """Each of these gave a traceback (TypeError, ZeroDivisionError) or was taken as it was
    (training from step -3)."""
    import json

    d = lm_dict(tmp_path, max_steps=2)
    train_run(RunConfig.from_dict(d), tmp_path / "run")
    path = tmp_path / "run" / "last" / "state.json"
    doc = json.loads(path.read_text())
    doc["__dict__"] = [[k, edit.get(k, v)] for k, v in doc["__dict__"]]
    path.write_text(json.dumps(doc))
    resumed = RunConfig.from_dict({**d, "train": {**d["train"], "max_steps": 4}})
    with pytest.raises(RunError, match="cannot be resumed|unreadable training state"):
        train_run(resumed, tmp_path / "run", resume=True)


@pytest.mark.parametrize("step", ["inf", "1e400", "nan", "-1", "2.5"])
def test_a_metrics_log_with_a_step_that_is_no_whole_number_is_one_line(tmp_path, step):
    (tmp_path / "m.csv").write_text(f"step,train_loss\n1,2.0\n{step},1.0\n")
    with pytest.raises(ValueError, match=r"line 3: step .* is not a whole number >= 0"):
        read_metrics(tmp_path / "m.csv")


@pytest.mark.parametrize("make", [lm_dict, translation_dict, classify_dict],
                         ids=["lm", "translation", "classification"])
def test_activation_checkpointing_trains_the_same_run(tmp_path, make):
    """Each block's forward runs again in the backward pass, with the RNG state it first ran
    with: the same dropout masks, so the same losses and weights."""
    d = make(tmp_path, max_steps=3)
    plain = train_run(RunConfig.from_dict(d), tmp_path / "plain")
    ac = {**d, "train": {**d["train"], "activation_checkpointing": True}}
    recomputed = train_run(RunConfig.from_dict(ac), tmp_path / "ac")
    blocks = [m for m in recomputed.model.modules() if "forward" in vars(m)]
    assert len(blocks) >= plain.config.model.n_layers  # every block's forward is checkpointed
    same_run(tmp_path / "plain", tmp_path / "ac")


def test_fsdp_on_one_process_is_refused_in_one_line_before_any_file(tmp_path, capsys):
    from attnlab.cli import main

    d = lm_dict(tmp_path, parallel="fsdp")
    with pytest.raises(ConfigError, match="needs torchrun with 2 or more"):
        train_run(RunConfig.from_dict(d), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    code = main(["train", "--set", f"data.path={tmp_path / 'text.txt'}", "--set",
                 "train.device='cpu'", "--set", "train.parallel='fsdp'", "--out",
                 str(tmp_path / "cli")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs torchrun with 2 or more" in err[0], err
    assert not (tmp_path / "cli").exists()
