"""Whole runs: check the run dir, build the task and trainer, train or resume, evaluate.

Everything that can be wrong with the input (config, data, run dir, a checkpoint from another
config) is checked before the first file is written, so a bad command never damages a run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..config import ModelConfig
from ..devices import resolve_device
from ..run_config import SECTIONS, RunConfig
from ..runs import RunDir, RunError, load_run
from ..tasks import build_task, task_class
from ..tokenizers import Tokenizer
from .distributed import DistInfo, cleanup, describe, env_info, init_distributed
from .finetune import (
    init_config,
    keep_split,
    keeps_head,
    load_init_weights,
    load_source,
)
from .loop import Trainer, TrainResult
from .monitor import plot_curves
from .optim import schedule_warnings
from .precision import autocast, resolve_precision, sdpa_backends

log = logging.getLogger(__name__)
# data.name of the runs trained on the user's own files (attnlab.tasks.TASKS): their config
# names the files, or none at all in a run dir imported from Hugging Face
OWN_FILES = ("text", "tsv", "parallel")
FAMILY_WORDS = {"decoder": "a decoder-only", "encoder": "an encoder-only",
                "encoder_decoder": "an encoder-decoder"}


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
    if resume and not run.has_checkpoint("last") and not run.has_checkpoint("best"):
        raise RunError(f"cannot resume: {run_dir} has no last/ checkpoint (train without "
                       "--resume first, or give the --out of an earlier run)")
    if not resume and run.has_checkpoint():
        raise RunError(f"run dir {run_dir} already holds a checkpoint; pass --resume to "
                       "continue it, or choose another --out")


# train keys that decide what an evaluation measures (the sampled LM windows, the synthetic
# validation set) and the training windows: a resume that changed one would rank its new
# evaluations against best/'s value measured on other data
RESUME_TRAIN_KEYS = ("seed", "block_size", "eval_batches", "eval_batch_size")


def _first_difference(saved: dict, new: dict, section: str,
                      keys: tuple[str, ...] = ()) -> str | None:
    a, b = saved.get(section, {}), new.get(section, {})
    for key in keys or sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return f"{section}.{key} is {a.get(key)!r} there but {b.get(key)!r} here"
    return None


def check_same_config(run_dir: Path, saved: dict, new: RunConfig) -> None:
    """A checkpoint only continues the model and data it was trained with, and evaluates as
    it did (:data:`RESUME_TRAIN_KEYS`)."""
    d = new.to_dict()
    for section, keys in (("model", ()), ("data", ()), ("train", RESUME_TRAIN_KEYS)):
        diff = _first_difference(saved, d, section, keys)
        if diff is not None:
            raise RunError(f"the checkpoint in {run_dir} was trained with a different config: "
                           f"{diff}; resume with the run's own config (attnlab train --out "
                           f"{run_dir} --resume) or train into a new --out")


def resumed_config(run: RunDir, saved: dict, rc: RunConfig) -> RunConfig:
    """``rc`` to continue ``run`` with: every key that the recipe and ``--set`` leave out is
    the run's own (its config.json), so a resume goes on with the data files and settings it
    was trained with instead of the recipe's defaults (which download a data set).

    Raises:
        RunError: ``rc`` trains another model family than the run holds.
    """
    theirs = RunConfig.from_dict(saved)  # (a broken config.json: one line naming the key)
    if theirs.model.family != rc.data.family:  # a merge of two families would be nonsense
        raise RunError(f"run dir {run.path} holds {FAMILY_WORDS[theirs.model.family]} run "
                       f"(data.name={theirs.data.name!r}), which cannot be resumed with "
                       f"{FAMILY_WORDS[rc.data.family]} recipe "
                       f"(data.name={rc.data.name!r}); resume it without a recipe (attnlab "
                       f"train --out {run.path} --resume) or train into a new --out")
    mine, merged = rc.to_dict(), {s: dict(saved.get(s) or {}) for s in SECTIONS}
    for key in rc.explicit:
        section, name = key.split(".", 1)
        merged[section][name] = mine[section][name]
    return RunConfig.from_dict(merged)


def check_steps_left(run: RunDir, rc: RunConfig) -> None:
    """A resume must have steps to train: one that stops at or before the checkpoint would
    only evaluate again and rewrite the run's results."""
    done = run.checkpoint_meta("last").get("step", 0)
    if rc.train.max_steps <= done:
        raise RunError(f"train.max_steps={rc.train.max_steps} is not beyond the checkpoint's "
                       f"step {done}: nothing to train (raise max_steps above {done} to continue)")


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (what a mkdir would create)."""
    path = path.absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _remove_if_empty(top: Path, run_dir: Path) -> None:
    """Remove the empty folders from ``run_dir`` up to ``top`` that this call created; a
    folder holding any file stays (``os.rmdir`` only removes empty folders)."""
    run_dir = run_dir.absolute()
    for folder in sorted((p for p in run_dir.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    for folder in (run_dir, *run_dir.parents):
        with contextlib.suppress(OSError):
            folder.rmdir()
        if folder == top:
            break


def _restart_from_nothing(run: RunDir) -> bool:
    """``--resume`` of a run stopped after its first best/ but before its first last/ (the
    only state that has no last/): there is no training state to continue from, so it starts
    again at step 0 with the same config and seed, which recomputes the same best/."""
    if run.has_checkpoint("last") or not run.has_checkpoint("best"):
        return False
    log.warning("%s has no last/ checkpoint (it was stopped before its first one): training "
                "starts again from step 0 with the run's config; best/ and the metrics log are "
                "rewritten", run.path)
    return True


def train_run(rc: RunConfig, run_dir: str | Path, resume: bool = False) -> RunOutcome:
    """Train (or with ``resume`` continue) the run described by ``rc`` in ``run_dir``.

    A call that fails before it wrote a file leaves no new folder behind."""
    run = RunDir(run_dir)
    info = init_distributed(resolve_device(rc.train.device, env_info()).type)
    created = _first_missing(run.path) if info.is_main else None
    try:
        return _train_run(rc, run, resume, info)
    except BaseException:
        if created is not None:
            _remove_if_empty(created, run.path)
        raise
    finally:
        cleanup()


def _train_run(rc: RunConfig, run: RunDir, resume: bool, info: DistInfo) -> RunOutcome:
    if info.is_main:
        check_run_dir(run, resume)
    tokenizer = saved = source = None
    if resume:
        saved = run.read_config()
        rc = resumed_config(run, saved, rc)
        tokenizer = run.load_tokenizer()
        resume = not _restart_from_nothing(run)
    if resume:
        check_steps_left(run, rc)
    if rc.train.init_from and resume:  # the run holds the fine-tuned model: no source read
        rc = init_config(rc, ModelConfig.from_dict(saved["model"]), str(run.path))
        rc = keep_split(rc, saved, str(run.path))
    elif rc.train.init_from:  # (also a --resume that starts again from step 0)
        source = load_source(rc.train.init_from)
        rc = init_config(rc, source.config, rc.train.init_from)
        rc = keep_split(rc, source.run_config, rc.train.init_from)
        tokenizer = source.tokenizer
    task = build_task(rc, tokenizer)  # (an LM's text the source's tokenizer cannot encode fails)
    task.check_data()  # bad data fails now, before any file is written or step is taken
    resolved = dataclasses.replace(rc, model=task.model_config)
    if saved is not None:
        check_same_config(run.path, saved, resolved)
    # a resumed "auto" run goes on in the precision it measured and trained in
    trainer = Trainer(resolved, task, run, info,
                      run.checkpoint_meta("last").get("precision") if resume else None)
    if source is not None:
        load_init_weights(trainer.model, source, not keeps_head(resolved, source))
    if resume:
        trainer.resume()
        log.info("resuming %s at step %d", run.path, trainer.step)
    if info.is_main:
        run.write_config(resolved.to_dict())
        if task.tokenizer is not None and not (resume and tokenizer is not None):
            run.save_tokenizer(task.tokenizer)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    log.info("training %s model (%.2fM parameters) on %s, %s, %s%s",
             FAMILY_WORDS.get(resolved.model.family, resolved.model.family),
             n_params / 1e6, trainer.device, trainer.precision, resolved.data.name,
             describe(info))
    if info.is_main:
        for warning in schedule_warnings(resolved.train):
            log.warning("%s", warning)
    if trainer.compile_pending:
        log.info("compiling the model with torch.compile (train.compile=true) at the first "
                 "step: this takes a while, often a minute or more")
    result = trainer.fit()
    if info.is_main:
        plot_curves(run)
        run.write_results({
            "step": result.step, "metrics": result.metrics, "best": result.best,
            "stopped_early": result.stopped_early, "wall_s": round(result.wall_s, 2),
            "precision": trainer.precision, "device": str(trainer.device),
            "world_size": info.world_size})
    return RunOutcome(result, trainer.model, task.tokenizer, run.path, resolved, info.is_main)


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
                 checkpoint: str = "best", device: str = "auto", beam: int = 1,
                 length_penalty: float = 0.6) -> dict[str, Any]:
    """Metrics of a trained run on ``split``: loss + perplexity / BLEU / accuracy+F1.

    LM perplexity runs over every window of the split (not a sample). BLEU decodes greedily,
    or with beam search when ``beam`` > 1 (translation only). The model runs as in training's
    evaluation (the checkpoint's precision, the same attention kernels and batches), so the
    metrics of ``best/`` are those training recorded for it."""
    if split not in ("val", "test"):
        raise ValueError(f"--split {split!r} is not allowed: val or test")
    rd = RunDir(run_dir)
    rc = RunConfig.from_dict(rd.read_config())
    cls = task_class(rc.data.name)
    why = rd.untrained_head(checkpoint)
    if why:
        raise RunError(why)
    if beam != 1 and not hasattr(cls, "beam"):
        raise ValueError(f"--beam is for translation runs (BLEU); a {cls.kind} run is scored "
                         "without beam search (leave --beam out)")
    if beam < 1:
        raise ValueError(f"--beam must be >= 1, got {beam}")
    if data:
        rc = _eval_overrides(rc, split, data)
    elif rc.data.name in OWN_FILES and not rc.data.mix and not any(
            getattr(rc.data, key) or getattr(rc.data, f"{split}_{key}")
            for key in cls.eval_data_keys):  # e.g. a model imported from Hugging Face
        files = "SRC TGT" if len(cls.eval_data_keys) == 2 else "FILE"
        raise RunError(f"run dir {rd.path} has no {split} data of its own (its config has "
                       f"data.name={rc.data.name!r} and no data.{cls.eval_data_keys[0]}); "
                       f"pass the {cls.kind} data to evaluate on with --data {files}")
    tokenizer = rd.load_tokenizer()
    if tokenizer is None and cls.uses_tokenizer:
        raise RunError(f"run dir {rd.path} has no {rd.tokenizer_file.name}")
    task = build_task(rc, tokenizer)
    dev = resolve_device(device, flag="--device")
    run = load_run(rd.path, checkpoint, device=str(dev))
    # "auto" means what training measured fastest and used; a checkpoint records it
    name = rc.train.precision
    if name == "fp16" and dev.type != "cuda":  # evaluation scales no loss: fp32 does it here
        name = "fp32"
    # (a weights file: the manifest beside it)
    precision = resolve_precision(name, dev, recorded=rd.checkpoint_meta(checkpoint).get(
        "precision"))
    backends = sdpa_backends(rc.train.sdpa_backend)

    def amp():  # as Trainer.amp: autocast and the attention kernels training evaluated with
        return autocast(precision, dev, backends)

    where = {"data": " ".join(data)} if data else {"split": split}
    decoding = {}
    if hasattr(task, "beam"):
        task.beam, task.length_penalty = beam, length_penalty
        decoding = {"decoding": task.decoding()}
    run.model.eval()
    metrics = task.evaluate(run.model, split, dev, amp, 0)
    return {**where, "checkpoint": str(run.checkpoint), "precision": precision, **decoding,
            **metrics}


def sample_texts(model: nn.Module, tokenizer: Tokenizer, rc: RunConfig,
                 prompt: str = "\n") -> list[str]:
    """``train.samples`` continuations of ``prompt`` from a trained LM (top-k sampling)."""
    from ..decoding import generate_text

    t = rc.train
    model.eval()
    return generate_text(model, tokenizer, prompt, t.sample_tokens,
                         temperature=t.temperature, top_k=t.top_k or None, seed=t.seed,
                         num_samples=t.samples)
