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

from ..runs import RunError, atomic_write_json, checkpoint_dir, load_run, read_run_config
from ..tokenizers import Tokenizer, load_tokenizer
from .config import RunConfig
from .distributed import cleanup, init_distributed
from .loop import Trainer, TrainResult, autocast, resolve_device, resolve_precision
from .monitor import plot_curves
from .tasks import build_task

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


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """Fail early, with one clear line, when ``run_dir`` cannot take this run."""
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
    has_last = checkpoint_dir(run_dir / "last") is not None
    if resume and not has_last:
        raise RunError(f"cannot resume: {run_dir} has no last/ checkpoint (train without "
                       "--resume first, or give the --out of an earlier run)")
    if not resume and (has_last or checkpoint_dir(run_dir / "best") is not None):
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
    run_dir = Path(run_dir)
    info = init_distributed(resolve_device(rc.train.device).type)
    try:
        if info.is_main:
            check_run_dir(run_dir, resume)
        tokenizer = saved = None
        if resume:
            saved = read_run_config(run_dir)
            if (run_dir / "tokenizer.json").is_file():
                tokenizer = load_tokenizer(run_dir / "tokenizer.json")
        task = build_task(rc, tokenizer)
        resolved = dataclasses.replace(rc, model=task.model_config)
        if saved is not None:
            check_same_config(run_dir, saved, resolved)
        trainer = Trainer(resolved, task, run_dir, info)
        if resume:
            trainer.resume()
            log.info("resuming %s at step %d", run_dir, trainer.step)
        if info.is_main:
            atomic_write_json(run_dir / "config.json", resolved.to_dict())
            if task.tokenizer is not None and not (resume and tokenizer is not None):
                task.tokenizer.save(run_dir / "tokenizer.json")
        n_params = sum(p.numel() for p in trainer.model.parameters())
        log.info("training a %s model (%.2fM parameters) on %s, %s, %s%s", resolved.model.family,
                 n_params / 1e6, trainer.device, trainer.precision, resolved.data.name,
                 f", {info.world_size} processes" if info.enabled else "")
        result = trainer.fit()
        if info.is_main:
            plot_curves(run_dir)
            atomic_write_json(run_dir / "results.json", {
                "step": result.step, "metrics": result.metrics, "best": result.best,
                "stopped_early": result.stopped_early, "wall_s": round(result.wall_s, 2),
                "precision": trainer.precision, "device": str(trainer.device),
                "world_size": info.world_size})
        return RunOutcome(result, trainer.model, task.tokenizer, run_dir, resolved, info.is_main)
    finally:
        cleanup()


def _eval_overrides(rc: RunConfig, split: str, data: list[str]) -> RunConfig:
    """Point the ``split`` of ``rc`` at the files given to ``attnlab eval --data``."""
    name, family = rc.data.name, rc.data.family
    if name in ("copy", "reverse", "sort"):
        raise ValueError(f"a synthetic {name!r} run makes its own data; --data is not allowed")
    want = 2 if family == "encoder_decoder" else 1
    if len(data) != want:
        what = "SRC TGT (two line-aligned files)" if want == 2 else "one file"
        kind = {"decoder": "language-model", "encoder": "classification",
                "encoder_decoder": "translation"}[family]
        raise ValueError(f"--data for a {kind} run takes {what}, got {len(data)} paths")
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
    if want == 2:
        return rc.replace("data", **{f"{split}_src_path": data[0], f"{split}_tgt_path": data[1]})
    return rc.replace("data", **{f"{split}_path": data[0]})


def evaluate_run(run_dir: str | Path, split: str = "val", data: list[str] | None = None,
                 checkpoint: str = "best", device: str = "auto") -> dict[str, Any]:
    """Metrics of a trained run on ``split``: loss + perplexity / BLEU (greedy) / accuracy+F1.

    LM perplexity runs over every window of the split (not a sample)."""
    if split not in ("val", "test"):
        raise ValueError(f"--split {split!r} is not allowed: val or test")
    run_dir = Path(run_dir)
    rc = RunConfig.from_dict(read_run_config(run_dir))
    if data:
        rc = _eval_overrides(rc, split, data)
    tok_path = run_dir / "tokenizer.json"
    tokenizer = load_tokenizer(tok_path) if tok_path.is_file() else None
    if tokenizer is None and rc.data.name not in ("copy", "reverse", "sort"):
        raise RunError(f"run dir {run_dir} has no tokenizer.json")
    task = build_task(rc, tokenizer)
    dev = resolve_device(device)
    run = load_run(run_dir, checkpoint, device=str(dev))
    precision = resolve_precision(rc.train.precision, dev)
    metrics = task.evaluate(run.model, split, dev, lambda: autocast(precision, dev), 0)
    return {"split": split, "checkpoint": str(run.checkpoint), **metrics}


def sample_texts(model: nn.Module, tokenizer: Tokenizer, rc: RunConfig,
                 prompt: str = "\n") -> list[str]:
    """``train.samples`` continuations of ``prompt`` from a trained LM (top-k sampling)."""
    from ..generate import generate_text

    t = rc.train
    model.eval()
    return generate_text(model, tokenizer, prompt, t.sample_tokens,
                         temperature=t.temperature, top_k=t.top_k or None, seed=t.seed,
                         num_samples=t.samples)
