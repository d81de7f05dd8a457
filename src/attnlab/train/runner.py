"""Whole runs: check the run dir, build the task and trainer, train or resume, evaluate.

Everything that can be wrong with the input (config, data, run dir, a checkpoint from another
config) is checked before the first file is written, so a bad command never damages a run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..runs import RunDir, RunError, load_run
from ..tasks import build_task, task_class
from ..tokenizers import Tokenizer
from .config import RunConfig
from .distributed import cleanup, init_distributed
from .loop import Trainer, TrainResult, resolve_device
from .monitor import plot_curves
from .precision import autocast, resolve_precision

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    """A finished training run: its result, the trained model (last weights) and tokenizer."""

    result: TrainResult
    model: nn.Module
    tokenizer: Tokenizer | None
    run_dir: Path
    config: RunConfig
    is_main: bool = True


def check_run_dir(run: RunDir, resume: bool) -> None:
    """Fail early, with one clear line, when the run dir cannot take this run."""
    run_dir = run.path
    if run_dir.exists() and not run_dir.is_dir():
        raise RunError(f"run dir {run_dir} is a file, not a folder; choose another --out")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=run_dir, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise RunError(f"cannot write to run dir {run_dir} ({e.strerror or e}); choose a "
                       "writable --out folder") from None
    if resume and not run.has_checkpoint("last"):
        raise RunError(f"cannot resume: {run_dir} has no last/ checkpoint (train without "
                       "--resume first, or give the --out of an earlier run)")
    if not resume and run.has_checkpoint():
        raise RunError(f"run dir {run_dir} already holds a checkpoint; pass --resume to "
                       "continue it, or choose another --out")


def _first_difference(saved: dict, new: dict, section: str) -> str | None:
    a, b = saved.get(section, {}), new.get(section, {})
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return f"{section}.{key} is {a.get(key)!r} there but {b.get(key)!r} here"
    return None


def check_same_config(run_dir: Path, saved: dict, new: RunConfig) -> None:
    """A checkpoint only continues the model and data it was trained with."""
    d = new.to_dict()
    for section in ("model", "data"):
        diff = _first_difference(saved, d, section)
        if diff is not None:
            raise RunError(f"the checkpoint in {run_dir} was trained with a different config: "
                           f"{diff}; resume with the run's own config (attnlab train --out "
                           f"{run_dir} --resume) or train into a new --out")


def train_run(rc: RunConfig, run_dir: str | Path, resume: bool = False) -> RunOutcome:
    """Train (or with ``resume`` continue) the run described by ``rc`` in ``run_dir``."""
    run = RunDir(run_dir)
    info = init_distributed(resolve_device(rc.train.device).type)
    try:
        if info.is_main:
            check_run_dir(run, resume)
        tokenizer = saved = None
        if resume:
            saved = run.read_config()
            tokenizer = run.load_tokenizer()
        task = build_task(rc, tokenizer)
        resolved = dataclasses.replace(rc, model=task.model_config)
        if saved is not None:
            check_same_config(run.path, saved, resolved)
        trainer = Trainer(resolved, task, run, info)
        if resume:
            trainer.resume()
            log.info("resuming %s at step %d", run.path, trainer.step)
        if info.is_main:
            run.write_config(resolved.to_dict())
            if task.tokenizer is not None and not (resume and tokenizer is not None):
                run.save_tokenizer(task.tokenizer)
        n_params = sum(p.numel() for p in trainer.model.parameters())
        log.info("training a %s model (%.2fM parameters) on %s, %s, %s%s", resolved.model.family,
                 n_params / 1e6, trainer.device, trainer.precision, resolved.data.name,
                 f", {info.world_size} processes" if info.enabled else "")
        result = trainer.fit()
        if info.is_main:
            plot_curves(run)
            run.write_results({
                "step": result.step, "metrics": result.metrics, "best": result.best,
                "stopped_early": result.stopped_early, "wall_s": round(result.wall_s, 2),
                "precision": trainer.precision, "device": str(trainer.device),
                "world_size": info.world_size})
        return RunOutcome(result, trainer.model, task.tokenizer, run.path, resolved, info.is_main)
    finally:
        cleanup()


def _eval_overrides(rc: RunConfig, split: str, data: list[str]) -> RunConfig:
    """Point the ``split`` of ``rc`` at the files given to ``attnlab eval --data``."""
    task = task_class(rc.data.name)
    keys = task.eval_data_keys
    if not keys:
        raise ValueError(f"a {task.kind} {rc.data.name!r} run makes its own data; --data is "
                         "not allowed")
    if len(data) != len(keys):
        what = "SRC TGT (two line-aligned files)" if len(keys) == 2 else "one file"
        raise ValueError(f"--data for a {task.kind} run takes {what}, got {len(data)} paths")
    for path in data:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--data file {path} does not exist")
    trained_on = [Path(p) for p in (rc.data.path, rc.data.src_path, rc.data.tgt_path)
                  if p and Path(p).is_file()]
    for path in data:
        if any(os.path.samefile(path, t) for t in trained_on):
            log.warning("--data %s is the file this run trained on: the %s metrics include "
                        "text the model has seen (leave --data out to evaluate the held-out "
                        "%s split)", path, split, split)
    return rc.replace("data", **{f"{split}_{key}": path for key, path in zip(keys, data)})


def evaluate_run(run_dir: str | Path, split: str = "val", data: list[str] | None = None,
                 checkpoint: str = "best", device: str = "auto") -> dict[str, Any]:
    """Metrics of a trained run on ``split``: loss + perplexity / BLEU (greedy) / accuracy+F1.

    LM perplexity runs over every window of the split (not a sample)."""
    if split not in ("val", "test"):
        raise ValueError(f"--split {split!r} is not allowed: val or test")
    rd = RunDir(run_dir)
    rc = RunConfig.from_dict(rd.read_config())
    if data:
        rc = _eval_overrides(rc, split, data)
    tokenizer = rd.load_tokenizer()
    if tokenizer is None and task_class(rc.data.name).uses_tokenizer:
        raise RunError(f"run dir {rd.path} has no {rd.tokenizer_file.name}")
    task = build_task(rc, tokenizer)
    dev = resolve_device(device)
    run = load_run(rd.path, checkpoint, device=str(dev))
    if run.model.config.family != "encoder" and dev.type == "cpu":
        from ..decoding import inference_layout

        inference_layout(run.model)  # faster token-by-token decoding on CPU; same values
    # "auto" means what training measured fastest and used; a checkpoint records it
    name = rc.train.precision
    if name == "auto" and checkpoint in ("best", "last"):
        name = rd.checkpoint_meta(checkpoint).get("precision", name)
    precision = resolve_precision(name, dev)
    metrics = task.evaluate(run.model, split, dev, lambda: autocast(precision, dev), 0)
    return {"split": split, "checkpoint": str(run.checkpoint), **metrics}


def sample_texts(model: nn.Module, tokenizer: Tokenizer, rc: RunConfig,
                 prompt: str = "\n") -> list[str]:
    """``train.samples`` continuations of ``prompt`` from a trained LM (top-k sampling)."""
    from ..decoding import generate_text

    t = rc.train
    model.eval()
    return generate_text(model, tokenizer, prompt, t.sample_tokens,
                         temperature=t.temperature, top_k=t.top_k or None, seed=t.seed,
                         num_samples=t.samples)
