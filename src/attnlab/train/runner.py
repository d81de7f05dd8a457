"""Whole training runs: check the run dir, build the task and trainer, train or resume, and
record the results. (Evaluating a finished run: :mod:`attnlab.train.evaluate`; its samples:
:mod:`attnlab.train.sample`.)

Everything that can be wrong with the input (config, data, run dir, a checkpoint from another
config) is checked before the first file is written, so a bad command never damages a run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..config import ModelConfig
from ..devices import resolve_device
from ..errors import DataError, InputError
from ..files import check_writable
from ..info import FAMILY_WORDS
from ..run_config import DEMO, SECTIONS, RunConfig, upgrade
from ..run_config import load_config as load_run_config
from ..runs import RunDir, RunError
from ..tasks import Task, build_task, config_keys, data_words, resolve_data, task_class
from ..tokenizers import Tokenizer
from .distributed import DistInfo, cleanup, describe, env_info, init_distributed
from .finetune import (
    InitSource,
    init_config,
    keep_split,
    keeps_head,
    load_init_weights,
    load_source,
)
from .loop import Trainer, TrainResult
from .monitor import plot_curves
from .optim import schedule_warnings
from .sample import sample_texts

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    """A finished training run: its result, the trained model (last weights) and tokenizer.
    A sharded run (``train.parallel = "fsdp"``) gathers the model on the first process alone:
    ``model`` is None on the others (``is_main`` False)."""

    result: TrainResult
    model: nn.Module | None
    tokenizer: Tokenizer | None
    run_dir: Path
    config: RunConfig
    is_main: bool = True

    def samples(self) -> list[str]:
        """``train.samples`` continuations from the trained model, each from a new line (or
        from its first token, for a vocabulary without a newline); none unless it is a
        language model with a tokenizer."""
        tokenizer = self.tokenizer
        if not self.config.train.samples or self.config.model.family != "decoder" \
                or tokenizer is None or self.model is None:
            return []
        return sample_texts(self.model, tokenizer, self.config, default_prompt(tokenizer))


def default_prompt(tokenizer: Tokenizer) -> str:
    """The prompt of a run's samples: a newline where ``tokenizer`` reads it as a token, else
    the text of its first ordinary token that it encodes back to at least one token (a
    whitespace pre-tokenizer drops a newline; a special token decodes to nothing)."""
    candidates = ["\n"] + [tokenizer.decode([i]) for i in range(min(tokenizer.vocab_size, 1024))]
    for text in candidates:
        try:
            if text.strip("\ufffd") and tokenizer.encode(text):
                return text
        except (ValueError, InputError):  # a character outside the vocabulary
            continue
    raise DataError("this run's tokenizer encodes none of its first tokens' texts: no prompt "
                    "to sample from (set train.samples=0)")


def check_checkpoints(run: RunDir, resume: bool) -> None:
    """A resume needs a checkpoint to go on from, a new run a run dir without one (reads
    only: ``attnlab launch`` asks it before torchrun starts the processes)."""
    if resume and not run.has_checkpoint("last") and not run.has_checkpoint("best"):
        raise RunError(f"cannot resume: {run.path} has no last/ checkpoint (train without "
                       "--resume first, or give the --out of an earlier run)")
    if not resume and run.has_checkpoint():
        raise RunError(f"run dir {run.path} already holds a checkpoint; pass --resume to "
                       "continue it, or choose another --out")


def check_run_dir(run: RunDir, resume: bool) -> None:
    """Fail early, with one clear line, when the run dir cannot take this run."""
    run_dir = run.path
    if run_dir.exists() and not run_dir.is_dir():
        raise RunError(f"run dir {run_dir} is a file, not a folder; choose another --out")
    try:
        check_writable(run_dir)
    except OSError as e:
        raise RunError(f"cannot write to run dir {run_dir} ({e.strerror or e}); choose a "
                       "writable --out folder") from None
    check_checkpoints(run, resume)
    others = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    if not resume and others:  # the files of a run stopped before its first checkpoint go
        try:
            run.read_config()
        except RunError:  # the user's own files: none is overwritten
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise RunError(f"--out {run_dir} holds other files ({shown}) and is not an "
                           "attnlab run dir; choose a new or empty folder") from None


# train keys that decide what an evaluation measures (the sampled LM windows, the synthetic
# validation set) and the training windows: a resume that changed one would rank its new
# evaluations against best/'s value measured on other data
RESUME_TRAIN_KEYS = ("seed", "block_size", "eval_batches", "eval_batch_size")


def _differing(saved: dict, new: dict, section: str, keys: tuple[str, ...] = ()) -> list[str]:
    """The keys of ``section`` (``keys``, or every key of either) whose values differ."""
    a, b = saved.get(section) or {}, new.get(section) or {}
    return [key for key in keys or sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def _first_difference(saved: dict, new: dict, section: str,
                      keys: tuple[str, ...] = ()) -> str | None:
    differing = _differing(saved, new, section, keys)
    if not differing:
        return None
    key, a, b = differing[0], saved.get(section) or {}, new.get(section) or {}
    return f"{section}.{key} is {a.get(key)!r} there but {b.get(key)!r} here"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> RunConfig:
    """:func:`attnlab.run_config.load_config`, with the data checked against the tasks: a
    ``data.name`` that no task trains (or data a task cannot take) is one
    :class:`~attnlab.config.ConfigError` now, before anything is read or written."""
    rc = load_run_config(path, overrides, base)
    task_class(rc)
    return rc


def check_same_config(run_dir: Path, saved: dict, new: RunConfig, files: bool = True) -> None:
    """A checkpoint only continues the model and data it was trained with, and evaluates as
    it did (:data:`RESUME_TRAIN_KEYS`). Old spellings in ``saved`` are read as today's.
    ``files=False`` leaves the data files out (``data.*path``, ``data.mix``): reading them
    says more (a DIR of another vocabulary) than that they changed."""
    saved, d = upgrade(saved), new.to_dict()
    for section, keys in (("model", ()), ("data", ()), ("train", RESUME_TRAIN_KEYS)):
        if not files and section == "data":
            keys = tuple(k for k in sorted(set(saved.get("data", {})) | set(d["data"]))
                         if not (k.endswith("path") or k == "mix"))
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
    theirs = RunConfig.of_run(run)  # (a broken config.json: one line naming it and the key)
    family = task_class(rc).family
    if theirs.model.family != family:  # a merge of two families would be nonsense
        raise RunError(f"run dir {run.path} holds {FAMILY_WORDS[theirs.model.family]} run "
                       f"({data_words(theirs.data)}), which cannot be resumed with "
                       f"{FAMILY_WORDS[family]} recipe ({data_words(rc.data)}); resume it "
                       f"without a recipe (attnlab train --out {run.path} --resume) or train "
                       "into a new --out")
    mine, merged = rc.to_dict(), {s: dict(upgrade(saved).get(s) or {}) for s in SECTIONS}
    for key in rc.explicit:
        section, name = key.split(".", 1)
        merged[section][name] = mine[section][name]
    return RunConfig.from_dict(merged)


def unsharded_alone(run: RunDir, rc: RunConfig, saved: dict[str, Any]) -> RunConfig:
    """``rc`` of a run resumed by one process (no torchrun): a run trained sharded
    (``train.parallel = "fsdp"`` in its config, ``saved``) goes on unsharded, its checkpoint
    loaded whole; fsdp for a run that was not sharded is refused (by the trainer)."""
    sharded = (saved.get("train") or {}).get("parallel") == "fsdp"
    if rc.train.parallel != "fsdp" or not sharded or env_info().world_size > 1:
        return rc
    log.info("%s was trained sharded over processes (train.parallel='fsdp'); one process goes "
             "on with the whole model (train.parallel='ddp')", run.path)
    return rc.replace("train", parallel="ddp")


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


@dataclass
class RunStart:
    """What a run starts from: the config it trains and what it continues or begins with."""

    rc: RunConfig
    resume: bool = False  # go on from last/ (False for a --resume that starts again)
    saved: dict[str, Any] | None = None  # the run dir's config.json, when resuming
    tokenizer: Tokenizer | None = None  # the run's, or that of the --init-from source
    source: InitSource | None = None  # the --init-from weights to load


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
    """Train (or with ``resume`` continue) the run described by ``rc`` in ``run_dir``: check
    the input and build the trainer, fit, then write the loss plot and results.json.

    A call that fails before it wrote a file leaves no new folder behind."""
    run = RunDir(run_dir)
    info = init_distributed(resolve_device(rc.train.device, env_info()).type,
                            rc.train.dist_timeout_s)
    created = _first_missing(run.path) if info.is_main else None
    try:
        trainer = _ready_trainer(rc, run, resume, info)
        result = trainer.fit()
        if info.is_main:
            _write_results(run, result, trainer, info)
        return RunOutcome(result, trainer.whole_model(), trainer.task.tokenizer, run.path,
                          trainer.rc, info.is_main)
    except BaseException:
        if created is not None:
            _remove_if_empty(created, run.path)
        raise
    finally:
        cleanup()


def _ready_trainer(rc: RunConfig, run: RunDir, resume: bool, info: DistInfo) -> Trainer:
    """The trainer of the run, ready to fit: every check of the input first, then the run's
    config and tokenizer written (by the first process) and what is trained logged."""
    if info.is_main:
        check_run_dir(run, resume)
    start = _resumed_start(rc, run) if resume else RunStart(rc)
    if start.rc.train.init_from:
        start = _init_from(start, run)
    # text the source's tokenizer cannot encode fails here, bad data in check_data: before
    # any file is written or any step is taken
    # data.name = "" without a file: the default data set, which the run's config records
    task = build_task(resolve_data(start.rc), start.tokenizer)
    task.check_data()
    resolved = dataclasses.replace(task.rc, model=task.model_config)
    if start.saved is not None:
        check_same_config(run.path, start.saved, resolved)
    trainer = _build_trainer(start, resolved, task, run, info)
    if info.is_main:
        run.write_config(resolved.to_dict())
        if task.tokenizer is not None and not (start.resume and start.tokenizer is not None):
            run.save_tokenizer(task.tokenizer)
    # a resume's keys are the run's own (its config.json), said at its start: only those it
    # changes are the user's now
    _announce(trainer, resolved, info, rc.explicit if start.saved is None
              else _changed_keys(start.saved, start.rc))
    return trainer


def _changed_keys(saved: dict[str, Any], rc: RunConfig) -> frozenset[str]:
    """The keys whose value in ``rc`` is not the one in the run's ``config.json``."""
    saved, mine = upgrade(saved), rc.to_dict()
    return frozenset(f"{section}.{key}" for section in SECTIONS
                     for key in _differing(saved, mine, section, tuple(mine[section])))


def _resumed_start(rc: RunConfig, run: RunDir) -> RunStart:
    """The start of ``--resume``: the run's own config where ``rc`` leaves a key out, its
    tokenizer, and whether there is a last/ to go on from (with steps left to train)."""
    saved = run.read_config()
    rc = unsharded_alone(run, resumed_config(run, saved, rc), saved)
    tokenizer = run.load_tokenizer()
    resume = not _restart_from_nothing(run)
    if resume:
        check_steps_left(run, rc)
    # a changed key said as itself, before the data it changes is read (a changed
    # data.synth_vocab would fail as a model.vocab_size too small for it)
    check_same_config(run.path, saved, rc, files=False)
    return RunStart(rc, resume, saved, tokenizer)


def _init_from(start: RunStart, run: RunDir) -> RunStart:
    """``train.init_from``: the model config (and data split) of the source, whose weights and
    tokenizer the run begins with; a resumed fine-tuning takes them from its own run dir."""
    rc, spec = start.rc, start.rc.train.init_from
    if start.resume:  # the run holds the fine-tuned model: no source read
        rc = init_config(rc, ModelConfig.from_dict(start.saved["model"]), str(run.path))
        return dataclasses.replace(start, rc=keep_split(rc, start.saved, str(run.path)))
    source = load_source(spec)  # (also a --resume that starts again from step 0)
    rc = init_config(rc, source.config, spec)
    return dataclasses.replace(start, rc=keep_split(rc, source.run_config, spec),
                               tokenizer=source.tokenizer, source=source)


def _build_trainer(start: RunStart, rc: RunConfig, task: Task, run: RunDir,
                   info: DistInfo) -> Trainer:
    """The trainer of ``rc`` with the weights it starts from: fresh, the ``--init-from``
    source's, or with everything else of last/ when resuming."""
    # a resumed "auto" run goes on in the precision it measured and trained in
    trainer = Trainer(rc, task, run, info,
                      run.checkpoint_meta("last").get("precision") if start.resume else None)
    if start.source is not None:
        load_init_weights(trainer.model, start.source, not keeps_head(rc, start.source))
    if start.resume:
        trainer.resume()
        log.info("resuming %s at step %d", run.path, trainer.step)
    return trainer


def unused_keys(rc: RunConfig, given: frozenset[str] | None = None) -> list[str]:
    """A line for each key of ``given`` (the recipe's and ``--set``'s; by default
    ``rc.explicit``) that the run of ``rc`` does not read (a ``data.seq_max`` of a synthetic
    task on a language model's text): it changes nothing. The keys a resume or
    ``train.init_from`` takes from a run dir are not the user's: pass the given ones."""
    keys = config_keys(rc)
    lines = []
    for key in sorted(rc.explicit if given is None else given):
        section, name = key.split(".", 1)
        demo = DEMO.get(section, {})  # (the base of a run without a recipe: not the user's)
        if name in demo and getattr(getattr(rc, section), name) == demo[name]:
            continue
        if name not in keys.get(section, (name,)):
            lines.append(f"{key} does not apply to this run ({FAMILY_WORDS[rc.model.family]} "
                         f"model, {data_words(rc.data)}) and is ignored; its {section} keys: "
                         f"{', '.join(keys[section])}")
    return lines


def _announce(trainer: Trainer, rc: RunConfig, info: DistInfo, given: frozenset[str]) -> None:
    """Log what is trained, where and how, before the first step; warn of the ``given`` keys
    that the run does not read."""
    n_params = sum(p.numel() for p in trainer.model.parameters())
    log.info("training %s model (%.2fM parameters) on %s, %s, %s%s",
             FAMILY_WORDS.get(rc.model.family, rc.model.family),
             n_params / 1e6, trainer.device, trainer.precision, data_words(rc.data),
             describe(info, rc.train.parallel))
    if info.is_main:
        for warning in [*schedule_warnings(rc.train), *unused_keys(rc, given)]:
            log.warning("%s", warning)
        rows, k = rc.train.batch_size, info.world_size
        if info.enabled and rows % k and "batch_size" in trainer.task.train_keys:
            split = " + ".join(str(len(range(r, rows, k))) for r in range(k))
            log.info("train.batch_size=%d over %d processes: %s rows (every loss is averaged "
                     "over all of them, so the run is one process's; a multiple of %d "
                     "balances the work)", rows, k, split, k)
    if trainer.compile_pending:
        log.info("compiling the model with torch.compile (train.compile=true) at the first "
                 "step: this takes a while, often a minute or more")


def _write_results(run: RunDir, result: TrainResult, trainer: Trainer, info: DistInfo) -> None:
    """The loss plot and results.json of a finished training."""
    plot_curves(run)
    run.write_results({
        "step": result.step, "metrics": result.metrics, "best": result.best,
        "stopped_early": result.stopped_early, "wall_s": round(result.wall_s, 2),
        "precision": trainer.precision, "device": str(trainer.device),
        "world_size": info.world_size})
