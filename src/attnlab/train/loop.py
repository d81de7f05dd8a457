"""The Trainer: one loop for the three families.

Each optimizer step takes ``grad_accum`` micro-batches. Their loss is the SUM over targets
divided by the number of targets in ALL of them (over every process too), so accumulating k
micro-batches gives the gradient of one batch k times the size, however the padding falls.
bf16 autocast (CPU or CUDA) or fp16 with a GradScaler (CUDA); optional ``torch.compile`` with
a fallback to eager; no host-device sync inside the loop except every ``log_every`` steps.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..devices import resolve_device, usable_cores
from ..errors import ConfigError
from ..info import check_fits, check_micro_batches
from ..models import build_model
from ..run_config import RunConfig
from ..runs import RunDir, RunError
from ..speed import keep_freed_memory, probe, use_cpu_dropout, use_cpu_sdpa, use_fused_loss
from ..tasks import Task
from .average import WeightEMA
from .distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce_sum,
    any_process,
    barrier,
    checkpoint_blocks,
    gathered,
    held_gradients,
    load_whole,
    shard,
    whole_state,
    wrap,
)
from .monitor import Monitor
from .optim import build_optimizer, lr_at, optimizer_kind, set_lr
from .precision import BUSY, STALE, Amp, fastest, probe_key, resolve_precision, stale
from .stop import StopSignals

log = logging.getLogger(__name__)
LOWER_IS_BETTER = ("val_loss", "ppl")


def rng_state() -> dict[str, Any]:
    """The global RNG states: python, numpy, torch CPU and every CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def seed_everything(seed: int) -> None:
    """Seed the global RNGs that :func:`rng_state` saves (python, numpy, torch), so that a run
    and everything its checkpoint holds depend on ``seed`` alone."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back the RNG states of :func:`rng_state` (CUDA's where there is a GPU)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class LogWindow:
    """The training steps since the last log row: their losses and targets, summed on the
    device so that no step waits for the host, and the wall time they took.

    The host part (losses and steps folded in since the last row) goes into the training
    state, so a resumed run logs the losses of one that never stopped.
    """

    def __init__(self, device: torch.device, info: DistInfo) -> None:
        self.info = info
        self.loss = torch.zeros((), dtype=torch.float64, device=device)  # since the last fold
        self.tokens = torch.zeros((), dtype=torch.float64, device=device)  # since the last row
        self.loss_sum, self.steps = 0.0, 0  # folded in since the last row, on the host
        self.start(0)

    def start(self, step: int) -> None:
        """Begin measuring at ``step`` (a fit's first): the clock, the progress position, and
        an empty list of the rows logged."""
        self.folded = self.shown = step
        self.clock = time.perf_counter()
        self.logged: list[tuple[int, float]] = []  # (step, train_loss) of each row

    def add(self, loss: torch.Tensor, tokens: torch.Tensor) -> None:
        """One optimizer step's mean loss and number of targets (device tensors)."""
        self.loss += loss.detach()
        self.tokens += tokens

    def fold(self, step: int) -> None:
        """Move the losses summed on the device up to ``step`` to the host: the one host
        sync of a log row, also before a checkpoint (which stores the folded sums)."""
        self.loss_sum += float(all_reduce_sum(self.loss, self.info))
        self.steps += step - self.folded
        self.loss.zero_()
        self.folded = step

    def row(self, step: int, *, lr: float, started: float) -> tuple[dict[str, float], int]:
        """The training columns of the log row at ``step``, and the number of steps since the
        last row; the next window starts here.

        Args:
            step: the step just taken.
            lr: its learning rate.
            started: when training began (``time.perf_counter()``), for ``elapsed_s``.
        """
        self.fold(step)
        now = time.perf_counter()
        row = {"train_loss": self.loss_sum / self.steps, "lr": lr,
               "tokens_per_s": float(self.tokens) / max(now - self.clock, 1e-9),
               "elapsed_s": now - started}
        self.logged.append((step, row["train_loss"]))
        steps, self.shown = step - self.shown, step
        self.took = now - self.clock  # seconds of training in this row (evaluation left out)
        self.loss_sum, self.steps, self.clock = 0.0, 0, now
        self.tokens.zero_()
        return row, steps

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside (evaluation, checkpoints) is not training time: the clock skips
        it."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.clock += time.perf_counter() - begin

    def state_dict(self) -> list[float | int]:
        """The folded sums, for the training state: ``[loss_sum, steps]``."""
        return [self.loss_sum, self.steps]

    def load_state_dict(self, state: list[float | int]) -> None:
        """Put back :meth:`state_dict`'s sums.

        Raises:
            ValueError: not two entries, a loss that is not finite or a step count that is
                not a whole number >= 0 (a hand-edited state).
        """
        loss_sum, steps = state = list(state)
        if not (type(steps) is int and steps >= 0 and math.isfinite(float(loss_sum))):
            raise ValueError(f"window {state!r} out of range")
        self.loss_sum, self.steps = loss_sum, steps


@dataclass
class TrainResult:
    """What a finished (or early-stopped) run reports."""

    step: int
    metrics: dict[str, float]  # the final evaluation (``final_eval_batches``)
    best: dict[str, Any] | None  # {"step", "metric", "value"} of best/
    stopped_early: bool
    wall_s: float
    train_losses: list[tuple[int, float]] = field(default_factory=list)


class Trainer:
    """Trains ``task``'s model under ``rc.train``; writes into ``run_dir`` on rank 0."""

    def __init__(self, rc: RunConfig, task: Task, run_dir: str | Path | RunDir | None = None,
                 info: DistInfo | None = None, precision: str | None = None):
        """``precision``: the one a resumed ``auto`` run trained in (its checkpoint's), to go
        on in (see :func:`~attnlab.train.precision.resolve_precision`)."""
        self.rc, self.cfg, self.task = rc, rc.train, task
        self.info = info or DistInfo()
        if self.cfg.parallel == "fsdp" and self.info.world_size < 2:
            raise ConfigError("train.parallel='fsdp' shards the model over processes: it needs "
                              "torchrun with 2 or more (torchrun --nproc_per_node=2 -m attnlab "
                              "train ...); one process trains with train.parallel='ddp'")
        # one batch drawn, then the data put back as it was: a batch too large for memory, or
        # too small to split over the processes, fails here, before any file is written
        data = self.task.state_dict()
        with torch.random.fork_rng(devices=[]):
            batch = shard(self.task.next_batch(), self.info)
        self.task.load_state_dict(data)
        check_micro_batches(self.cfg.grad_accum, sum(t.nbytes for t in batch))
        self.run = run_dir if run_dir is None or isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.device = resolve_device(self.cfg.device, self.info)
        self._set_process()
        sharded = self.cfg.parallel == "fsdp"  # (each process holds 1/K of the weights)
        check_fits(task.model_config, self.device, self.info.world_size if sharded else 1)
        seed_everything(self.cfg.seed)  # the same initial weights on every process
        self.model = self._build_model()
        self.whole: torch.nn.Module | None = None  # fsdp: the gathered model, once made
        if self.info.enabled:  # then each process its own random stream (dropout masks)
            torch.manual_seed(self.cfg.seed + self.info.rank)
        self.auto_key: str | None = None  # the probe's cache key of a measured "auto"
        self.precision = resolve_precision(self.cfg.precision, self.device,
                                           self._measure_precision, precision)
        self.amp = Amp(self.precision, self.device, self.cfg.sdpa_backend)  # around each forward
        if self.cfg.activation_checkpointing:
            checkpoint_blocks(self.model)
        # (fsdp replaces the parameters by their shards: the optimizer takes those)
        self.ddp = wrap(self.model, self.info, self.device, self.cfg.parallel, self.precision)
        self.optimizer = build_optimizer(self.model, self.cfg, self.device.type, self.precision)
        self.ema = WeightEMA(self.model, self.cfg.ema_decay) if self.cfg.ema_decay else None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.fwd = self.ddp
        self.compile_pending = False
        if self.cfg.compile:
            self.fwd, self.compile_pending = torch.compile(self.ddp), True
        self.step = 0
        self.best: dict[str, Any] | None = None
        self.bad_evals = 0
        self.window = LogWindow(self.device, self.info)
        self.started: float | None = None  # when training began (resumed: its elapsed earlier)
        self.rows = 0  # log rows written by this process's fit (the first has the warm-up)
        metric = self.cfg.best_metric
        self.metric = task.default_metric if metric == "auto" else metric
        if self.metric not in ("val_loss", *task.metric_names):
            raise ConfigError(f"train.best_metric={metric!r} is not measured by this task; "
                              f"allowed: auto, val_loss, {', '.join(task.metric_names)}")

    def _set_process(self) -> None:
        """What training sets for the whole process: torch's threads (``train.threads``) and,
        on a CPU, freed memory kept for the next step (:func:`~attnlab.speed.keep_freed_memory`)
        unless the model is sharded: FSDP's gathered weights, kept, held as much memory as
        the shards save (docs/what-we-tried.md, "Freed memory kept between steps")."""
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
            cores = usable_cores()
            if self.cfg.threads > cores and self.info.is_main:
                log.warning("train.threads=%d is more than the %d CPU cores this process may "
                            "run on: the threads take turns on them and each step runs slower; "
                            "at most %d (0: torch's default)", self.cfg.threads, cores, cores)
        if self.device.type == "cpu" and self.cfg.parallel != "fsdp":
            keep_freed_memory()

    # ---- precision -------------------------------------------------------------------------
    def _measure_precision(self, announce: bool = True) -> str:
        """``precision = "auto"`` on a CPU: time forward + backward of the first training batch
        in fp32 and in bf16 (:func:`attnlab.train.precision.fastest`, cached). The data position
        and the RNG states are put back, so training itself is the same with or without it."""
        data = self.task.state_dict()
        with torch.random.fork_rng(devices=[]):
            whole = self.task.next_batch()  # the key: the global batch, the same on every rank
            batch = tuple(t.to(self.device) for t in shard(whole, self.info))

            def step(precision: str) -> None:
                with Amp(precision, self.device, self.cfg.sdpa_backend)():
                    loss = self.task.loss_sum(self.model, batch)
                loss.backward()
                self.model.zero_grad(set_to_none=True)

            key = probe_key(self.task.model_config.to_dict(), [tuple(t.shape) for t in whole],
                            self.cfg.sdpa_backend, self.info.world_size)
            choice = fastest(step, key, reduce=lambda t: all_reduce_sum(
                torch.tensor(t, dtype=torch.float64, device=self.device), self.info).tolist())
        self.task.load_state_dict(data)
        self.auto_key = key  # the choice is checked against the steps' real time
        if announce and self.info.is_main:  # once per run: the choice, from what, how to change
            ms = (probe.cached(key) or {}).get("ms", {})
            measured = ", ".join(f"{p} {v:g} ms" for p, v in ms.items())
            log.info("train.precision auto: %s (forward + backward on this machine: %s); "
                     "--set train.precision=fp32 or bf16 chooses", choice,
                     measured or "cached")
        return choice

    def _check_auto_precision(self, step_s: float) -> None:
        """Once per run, at the second log row: when the steps of a ``precision = "auto"``
        choice run :data:`~attnlab.train.precision.STALE` times slower than its measured
        forward + backward (the choice no longer fits the machine), or
        :data:`~attnlab.train.precision.BUSY` times faster (it was measured on a busy
        machine), in any process, both precisions are measured again, now, and the cache
        takes the new answer; the user is told if it is another one (the run goes on in
        its precision: a resume must stay exact). The same answer again says nothing."""
        key, self.auto_key = self.auto_key, None
        slower = stale(key, self.precision, step_s, self.cfg.grad_accum)
        if not any_process(slower is not None and not 1 / BUSY <= slower <= STALE, self.info):
            return
        probe.forget(key)
        again = self._measure_precision(announce=False)
        self.auto_key = None  # (measured once more at most)
        if again != self.precision and self.info.is_main:
            ran = (f"{slower:.1f}x slower than measured" if slower and slower > 1 else
                   f"{1 / (slower or 1):.1f}x faster than measured (the machine was busy then)")
            log.warning("train.precision auto chose %s, but its steps ran %s; measured again "
                        "now %s is faster: the next run takes %s (--set "
                        "train.precision=fp32 or bf16 chooses)", self.precision, ran, again,
                        again)

    # ---- one optimizer step ------------------------------------------------------------------
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``grad_accum`` micro-batches: forward and backward of each,
        then the update. Returns (mean loss per target, number of targets).

        The gradients are those of ONE batch holding every micro-batch of every process: each
        micro-batch's loss is its SUM over targets divided by the targets of all of them."""
        pin = self.device.type == "cuda"  # a pinned copy is asynchronous: the GPU keeps busy
        micro = [tuple((t.pin_memory() if pin else t).to(self.device, non_blocking=True)
                       for t in shard(self.task.next_batch(), self.info))
                 for _ in range(self.cfg.grad_accum)]
        local = sum(self.task.count(b) for b in micro)
        n = all_reduce_sum(local.clone(), self.info)  # targets over all micro-batches, ranks
        scale = self.info.world_size / n  # DDP averages gradients over ranks
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro):
            hold = self.info.enabled and i < len(micro) - 1  # all-reduce once, at the last
            with held_gradients(self.ddp, hold):
                with self.amp():
                    loss_sum = self.task.loss_sum(self.fwd, batch, self.cfg.label_smoothing)
                self.scaler.scale(loss_sum * scale).backward()
            total += loss_sum.detach()
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update()
        return total / n, n

    def _first_step_compiled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first step of a compiled model; on a compilation error, eager from here on."""
        data, rng = self.task.state_dict(), rng_state()
        try:
            return self.train_step()
        except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
            log.warning("torch.compile failed (%s: %s); training continues in eager mode",
                        type(e).__name__, str(e).strip().splitlines()[0][:200] if str(e) else "")
            self.fwd = self.ddp
            use_fused_loss(self.model)  # eager: as a run that never compiled
            self.optimizer.zero_grad(set_to_none=True)
            self.task.load_state_dict(data)
            set_rng_state(rng)
            return self.train_step()
        finally:
            self.compile_pending = False

    # ---- evaluation, checkpoints ------------------------------------------------------------
    def evaluate(self, split: str = "val", max_batches: int | None = None) -> dict[str, float]:
        """The task's metrics of the model on ``max_batches`` batches of ``split`` (default:
        ``train.eval_batches``; 0: the whole split), in eval mode and training's precision."""
        with gathered(self.model) as model:  # (fsdp: whole weights, no collective inside)
            model.eval()
            try:
                n = self.cfg.eval_batches if max_batches is None else max_batches
                return self.task.evaluate(model, split, self.device, self.amp, n)
            finally:
                model.train()

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs besides the weights, as the last/ checkpoint stores it."""
        # (sharded: the optimizer's tensors go to the shards, its groups with the rest)
        optimizer = {} if self.cfg.parallel == "fsdp" else {
            "optimizer": self.optimizer.state_dict()}
        return {"step": self.step, **optimizer,
                "scaler": self.scaler.state_dict(), "rng": rng_state(),
                "data": self.task.state_dict(), "best": self.best, "bad_evals": self.bad_evals,
                "window": self.window.state_dict(), "world_size": self.info.world_size,
                "elapsed_s": 0.0 if self.started is None else time.perf_counter() - self.started,
                **({"ema": self.ema.state_dict()} if self.ema is not None else {})}

    def save(self, which: str = "last", *, step_weights: bool = True) -> None:
        """Checkpoint ``which`` (best: weights only; last: also the training state and, with
        ``train.keep_checkpoints`` and ``step_weights``, a copy of the weights under steps/:
        an evaluation's, for ``attnlab average``)."""
        # every process's RNG state (they differ), gathered on all of them before rank 0 writes
        ranks = all_gather_objects(rng_state(), self.info) \
            if which == "last" and self.info.enabled else None
        sharded = self.cfg.parallel == "fsdp"  # (every process writes its shards)
        if self.run is None or not (self.info.is_main or sharded):
            return
        state = self.state_dict() if which == "last" else None
        if ranks:
            state["rng_ranks"] = ranks
        meta = {"step": self.step, "precision": self.precision}
        if which == "best" and self.best is not None:
            meta.update(self.best)
        self.run.save_checkpoint(
            which, self.model, state, meta, shards=self.info.world_size if sharded else 0,
            optimizer=self.optimizer if state and sharded else None, main=self.info.is_main,
            sync=(lambda: barrier(self.info)) if sharded else None)
        if not self.info.is_main:
            return
        if which == "last" and self.cfg.keep_checkpoints and step_weights:
            self.run.save_step_weights(self.step, self.model, meta, self.cfg.keep_checkpoints)

    def resume(self) -> None:
        """Continue from the last checkpoint: weights, optimizer, RNGs, data position, counters."""
        if self.run is None:
            raise ValueError("cannot resume a Trainer without a run dir")
        state = self.run.load_state("last")
        self._check_choices(state)
        try:
            self._load_weights_and_optimizer(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            self.task.load_state_dict(state["data"])
            self._resume_rng(state.get("rng_ranks") or [state["rng"]], state["rng"],
                             state["step"])
            self.step, self.best = state["step"], state["best"]
            self.bad_evals = state["bad_evals"]
            self.window.load_state_dict(state["window"])
            if self.ema is not None and "ema" in state:
                self.ema.load_state_dict(state["ema"])
            elif self.ema is not None:  # train.ema_decay set on resume: it starts here
                log.info("the checkpoint has no moving average of the weights; "
                         "train.ema_decay's starts from its weights at step %d", self.step)
                self.ema = WeightEMA(self.model, self.cfg.ema_decay)
            # elapsed_s and wall_s go on from the checkpoint's (older checkpoints: from 0)
            elapsed = state.get("elapsed_s", 0.0)
            self.started = time.perf_counter() - float(elapsed)
            if not (all(type(n) is int and n >= 0 for n in (self.step, self.bad_evals))
                    and math.isfinite(float(elapsed)) and (self.best is None or (
                        isinstance(self.best, dict) and type(self.best.get("step")) is int
                        and isinstance(self.best.get("value"), (int, float))))):
                raise ValueError("step, bad_evals, window, elapsed_s or best out of range")
        except RunError:  # (the weights': said already)
            raise
        except KeyError as e:
            raise RunError(f"the training state of {self.run.checkpoint_dir('last')} has no "
                           f"{e.args[0]!r} entry (a damaged or foreign checkpoint); it cannot "
                           "be resumed: train into a new --out") from None
        except (TypeError, ValueError, IndexError, RuntimeError) as e:
            raise RunError(f"the training state of {self.run.checkpoint_dir('last')} does not "
                           f"fit this run ({type(e).__name__}: {str(e).splitlines()[0][:150]}); "
                           "it cannot be resumed: train into a new --out") from None

    def _resume_rng(self, ranks: list[dict[str, Any]], main: dict[str, Any], step: int) -> None:
        """Each process's saved random state, when as many processes resume as saved them.

        On another number of processes the streams cannot be handed out (a process's dropout
        masks are drawn for its own rows): every process takes the first process's python and
        numpy states and a new torch stream seeded by ``train.seed``, the step and its rank,
        as fresh as a new run's. The data order goes on exactly (it is the global batch's);
        without dropout the losses are the uninterrupted run's up to float rounding."""
        if len(ranks) == self.info.world_size:
            set_rng_state(ranks[self.info.rank])
            return
        set_rng_state({k: v for k, v in main.items() if k != "cuda"})
        words = np.random.SeedSequence([self.cfg.seed, step, self.info.rank]).generate_state(2)
        torch.manual_seed(int(words[0]) << 32 | int(words[1]))  # (every device's generator)
        if self.info.is_main:
            log.info("resumed on %d process%s (saved by %d): each process draws its random "
                     "numbers (dropout) from a new stream", self.info.world_size,
                     "es" * (self.info.world_size > 1), len(ranks))

    def _check_choices(self, state: dict[str, Any]) -> None:
        """A resume keeps the choices its checkpoint was made under: the best metric (new
        evaluations are ranked against best/'s value) and the optimizer (its state)."""
        best = state.get("best") if isinstance(state, dict) else None
        if isinstance(best, dict) and best.get("metric") not in (None, self.metric):
            raise RunError(f"{self.run.path} chose its best checkpoint by {best['metric']!r}; "
                           f"resuming it with train.best_metric={self.metric!r} would rank new "
                           "evaluations against a value of another metric: resume with "
                           f"train.best_metric={best['metric']!r}, or train into a new --out "
                           "(--init-from the run)")
        opt_state = state.get("optimizer") if isinstance(state, dict) else None
        saved = optimizer_kind(opt_state) if isinstance(opt_state, dict) else self.cfg.optimizer
        if saved != self.cfg.optimizer:  # (a malformed state: refused when loaded)
            raise RunError(f"{self.run.path} was trained with train.optimizer={saved!r}; its "
                           f"optimizer state cannot go on under train.optimizer="
                           f"{self.cfg.optimizer!r}: resume with train.optimizer={saved!r}, or "
                           "train into a new --out (--init-from the run)")

    def _load_weights_and_optimizer(self, optimizer: dict[str, Any]) -> None:
        """last/'s weights and optimizer state (``optimizer``: the training state's), however
        the checkpoint and this run are split over processes: a sharded checkpoint loads under
        any number of them, each its part; a whole one into a sharded model goes through a
        whole copy, of which each process keeps its shards."""
        if self.run.sharded("last"):
            self.run.load_weights(self.model, "last", self.optimizer, optimizer)
        elif self.cfg.parallel == "fsdp":
            whole = build_model(self.task.model_config)
            whole_optimizer = build_optimizer(whole, self.cfg, "cpu", self.precision)
            self.run.load_weights(whole, "last")
            whole_optimizer.load_state_dict(optimizer)
            load_whole(self.model, self.optimizer, whole, whole_optimizer)
        else:
            self.run.load_weights(self.model, "last")
            self.optimizer.load_state_dict(optimizer)

    def _build_model(self) -> torch.nn.Module:
        """The task's model on the device, with the speed layer's kernels."""
        model = use_cpu_dropout(use_cpu_sdpa(build_model(self.task.model_config).to(self.device)))
        if not self.cfg.compile:  # (a compiled model's projection and loss: fused by inductor)
            use_fused_loss(model)
        return model

    def whole_model(self) -> torch.nn.Module | None:
        """The model as one module with its current weights: the model itself, or under fsdp
        its shards gathered into a copy on the first process (every process calls this: a
        collective), None on the others. What runs after training, outside the process group
        (samples), runs on it."""
        if self.cfg.parallel != "fsdp" or not self.info.enabled:
            return self.model
        state = whole_state(self.model)  # ({} on the other processes)
        if not self.info.is_main:
            return None
        if self.whole is None:
            with torch.random.fork_rng(devices=[]):  # (training's random stream untouched)
                self.whole = self._build_model()
        self.whole.load_state_dict(state)
        return self.whole

    # ---- the loop ------------------------------------------------------------------------------
    def _better(self, a: float, b: float) -> float:
        """The better of two values of the best metric (``a`` on a tie)."""
        if self.metric in LOWER_IS_BETTER:
            return a if a <= b else b
        return a if a >= b else b

    def _improved(self, value: float) -> bool:
        """Whether ``value`` of the best metric beats best/'s."""
        if self.best is None:
            return True
        if self.metric in LOWER_IS_BETTER:
            return value < self.best["value"]
        return value > self.best["value"]

    def _after_eval(self, metrics: dict[str, float]) -> bool:
        """Track best/ and patience; True when training should stop early. With a moving
        average (``ema_`` metrics), the better of the model and its average is the candidate,
        and best/'s manifest says which (``"weights": "ema"`` or ``"model"``)."""
        value = metrics.get(self.metric)
        if value is None:
            return False
        weights, ema = "model", metrics.get(f"ema_{self.metric}")
        if ema is not None and not math.isnan(ema) and (
                math.isnan(value) or ema == self._better(ema, value)):
            value, weights = ema, "ema"
        if not math.isnan(value) and self._improved(value):  # nan (diverged): no better
            self.best = {"step": self.step, "metric": self.metric, "value": value}
            if self.ema is not None:
                self.best["weights"] = weights
            self.bad_evals = 0
            with self.ema.applied(self.model) if weights == "ema" \
                    else contextlib.nullcontext():
                self.save("best")
            return False
        self.bad_evals += 1
        return 0 < self.cfg.patience <= self.bad_evals

    def _due(self, every: int) -> bool:
        """Whether a log row (``every=log_every``) or an evaluation is due after this step:
        every ``every`` steps (0: never) and at the last."""
        return bool(every and self.step % every == 0) or self.step == self.cfg.max_steps

    def _train_row(self, mon: Monitor, lr: float) -> dict[str, float]:
        """The training columns of this step's row; the progress bar moves up to this step."""
        row, steps = self.window.row(self.step, lr=lr, started=self.started)
        self.rows += 1
        if self.rows == 2 and self.auto_key is not None:  # the first row has the warm-up
            self._check_auto_precision(self.window.took / max(steps, 1))
        mon.progress(steps, loss=row["train_loss"], lr=lr, tok_s=round(row["tokens_per_s"]))
        return row

    def _evaluate_and_save(self, mon: Monitor, row: dict[str, float],
                           lr: float) -> tuple[dict[str, float], bool]:
        """Evaluate, track best/, write this step's row, then save last/; returns the metrics
        and whether training stops early. The row goes first: a kill between the two loses
        nothing (on resume, rows after last/'s step are dropped and written again)."""
        with self.window.paused():
            metrics = self.evaluate()
            if self.ema is not None:  # the moving average too: best/ keeps the better one
                with self.ema.applied(self.model):
                    metrics.update({f"ema_{k}": v for k, v in self.evaluate().items()})
            stopped = self._after_eval(metrics)
            if stopped and not row:  # the last step: its training loss is logged too
                row = self._train_row(mon, lr)
            self.window.fold(self.step)  # (last/ stores the folded losses)
            mon.row(self.step, {**row, **metrics})
            self.save("last")
        return metrics, stopped

    def _save_and_stop(self, saved: bool) -> None:
        """A signal asked training to stop (in any process): last/ at this step (``saved``:
        the evaluation just wrote it), then ``KeyboardInterrupt``."""
        if not saved:
            with self.window.paused():
                self.window.fold(self.step)
                self.save("last", step_weights=False)
        raise KeyboardInterrupt(f"stopped at step {self.step}, saved")

    def fit(self) -> TrainResult:
        """Train to ``train.max_steps`` (or until patience runs out), with a log row every
        ``log_every`` steps and an evaluation and last/ checkpoint every ``eval_every``; then
        the final evaluation (``final_eval_batches``). Ctrl-C or SIGTERM: the step finishes,
        last/ is saved at it, then ``KeyboardInterrupt`` (:mod:`attnlab.train.stop`)."""
        cfg = self.cfg
        names = self.task.metric_names
        if self.ema is not None:  # the moving average's evaluation, beside the model's
            names += tuple(f"ema_{n}" for n in ("val_loss", *names))
        mon = Monitor(self.run, names, total=cfg.max_steps,
                      start=self.step, progress=cfg.progress, tensorboard=cfg.tensorboard,
                      enabled=self.info.is_main)
        if self.started is None:
            self.started = time.perf_counter()
        self.window.start(self.step)
        # a resumed run that had stopped early stays stopped (straight to its final evaluation)
        stopped, metrics = 0 < cfg.patience <= self.bad_evals, {}
        self.model.train()
        try:
            with StopSignals() as signals:  # Ctrl-C, SIGTERM: stop after the step, saved
                while self.step < cfg.max_steps and not stopped:
                    lr = lr_at(self.step, cfg)
                    set_lr(self.optimizer, lr)
                    # (a compiled model's first step falls back to eager if compiling fails)
                    loss, n = (self._first_step_compiled() if self.compile_pending
                               else self.train_step())
                    self.step += 1
                    self.window.add(loss, n)
                    row = self._train_row(mon, lr) if self._due(cfg.log_every) else {}
                    saved = self._due(cfg.eval_every)
                    if saved:
                        metrics, stopped = self._evaluate_and_save(mon, row, lr)
                    elif row:
                        mon.row(self.step, row)
                    asked = any_process(signals.received is not None, self.info)
                    if asked and self.step < cfg.max_steps and not stopped:  # (else: done)
                        self._save_and_stop(saved)
        finally:
            mon.close()
        resample = self.task.sampled_eval and cfg.final_eval_batches != cfg.eval_batches
        if not metrics or resample:
            metrics = self.evaluate(max_batches=cfg.final_eval_batches)  # 0 = the whole split
        return TrainResult(self.step, metrics, self.best, stopped,
                           time.perf_counter() - self.started, self.window.logged)
