"""``attnlab eval``: the metrics of a trained run dir, measured as training measured them.

:func:`evaluate_run` checks the arguments and the run (its config, tokenizer, head and
data) before the model is loaded, then runs the task's evaluation in the precision and with
the attention kernels training evaluated with, so the metrics of ``best/`` are those training
recorded for it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ..data.text import check_text_file
from ..decoding.translate import check_beam_flags
from ..devices import resolve_device
from ..errors import UsageError
from ..run_config import RunConfig
from ..runs import RunDir, RunError, load_run
from ..speed import keep_freed_memory, use_cpu_sdpa
from ..tasks import Progress, Task, build_task, task_class
from .precision import Amp, resolve_precision

log = logging.getLogger(__name__)


def evaluate_run(run_dir: str | Path, split: str = "val", data: list[str] | None = None,
                 checkpoint: str = "best", device: str = "auto", beam: int = 1,
                 length_penalty: float | None = None, stride: int | None = None,
                 progress: Progress | None = None) -> dict[str, Any]:
    """Metrics of a trained run on ``split``: loss + perplexity / BLEU / accuracy+F1.

    The model runs as in training's evaluation (the checkpoint's precision, the same attention
    kernels and batches), so the metrics of ``best/`` are those training recorded for it;
    LM perplexity runs over every window of the split (not a sample).

    Args:
        run_dir: the run dir.
        split: ``val`` or ``test``.
        data: files to evaluate on instead of the run's own split (``attnlab eval --data``).
        checkpoint: ``best``, ``last`` or a .safetensors file.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        beam: translation only: 1 decodes greedily, more is beam search of that width.
        length_penalty: beam search's length penalty (None: GNMT's 0.6).
        stride: language models only: windows of the block every ``stride`` tokens, each
            target scored once (:meth:`attnlab.tasks.LMTask.set_stride`); None, the default:
            non-overlapping windows, as training evaluates.
        progress: told as batches are done (see :meth:`attnlab.tasks.Task.evaluate`).

    Returns:
        The split (or the ``data`` files), the checkpoint, the precision, for translation how
        it decoded, and the metrics.
    """
    rd = RunDir(run_dir)
    rc = _eval_config(rd, split, checkpoint, beam, length_penalty, stride)
    rc = _eval_data(rd, rc, split, data)
    task = _eval_task(rd, rc)
    dev = resolve_device(device, flag="--device")
    if dev.type == "cpu":  # each batch's logits freed and made again, as in training
        keep_freed_memory()
    run = load_run(rd.path, checkpoint, device=str(dev))
    # the precision and attention kernels training evaluated with, as the Trainer enters them
    amp = Amp(_eval_precision(rd, rc, checkpoint, dev), dev, rc.train.sdpa_backend)
    options = task.set_eval_options(beam, length_penalty, stride)  # (how it decodes, windows)
    use_cpu_sdpa(run.model).eval()  # the attention kernels training evaluated with
    metrics = task.evaluate(run.model, split, dev, amp, 0, progress)
    where = {"data": " ".join(data)} if data else {"split": split}
    return {**where, "checkpoint": str(run.checkpoint), "precision": amp.precision, **options,
            **metrics}


def _eval_config(rd: RunDir, split: str, checkpoint: str, beam: int,
                 length_penalty: float | None, stride: int | None) -> RunConfig:
    """The run's config, once the arguments of ``attnlab eval`` that need no data check out."""
    if split not in ("val", "test"):
        raise UsageError(f"--split {split!r} is not allowed: val or test")
    rc = RunConfig.of_run(rd)
    cls = task_class(rc)
    why = rd.untrained_head(checkpoint)
    if why:
        raise RunError(why)
    check_beam_flags(beam, length_penalty, rc.model.tgt_vocab_size or rc.model.vocab_size)
    cls.check_eval_options(beam, stride, length_penalty)
    return rc


def _eval_data(rd: RunDir, rc: RunConfig, split: str, data: list[str] | None) -> RunConfig:
    """``rc`` pointed at the ``--data`` files; without them the run must have ``split`` data
    of its own (a model imported from Hugging Face has none)."""
    if data:
        return _eval_overrides(rc, split, data)
    why = missing_split(rd, rc, split)
    if why:
        cls = task_class(rc)
        files = "SRC TGT" if len(cls.eval_data_keys) == 2 else "FILE"
        raise RunError(f"{why}; pass the {cls.kind} data to evaluate on with --data {files}")
    return rc


def missing_split(rd: RunDir, rc: RunConfig, split: str) -> str | None:
    """Why run dir ``rd`` (of config ``rc``) has no ``split`` data of its own, or None when
    it has: its config names its data set or its own files, and one that names neither (a
    run dir imported from Hugging Face) has none."""
    keys = task_class(rc).eval_data_keys
    if keys and not rc.data.name and not rc.data.mix and not any(
            getattr(rc.data, key) or getattr(rc.data, f"{split}_{key}") for key in keys):
        return (f"run dir {rd.path} has no {split} data of its own (its config names no data "
                f"set and no data.{keys[0]})")
    return None


def _eval_overrides(rc: RunConfig, split: str, data: list[str]) -> RunConfig:
    """Point the ``split`` of ``rc`` at the files given to ``attnlab eval --data``."""
    task = task_class(rc)
    keys = task.eval_data_keys
    if not keys:
        raise UsageError(f"a {task.kind} {rc.data.name!r} run makes its own data; --data is "
                         "not allowed")
    if len(data) != len(keys):
        what = "SRC TGT (two line-aligned files)" if len(keys) == 2 else "one file"
        raise UsageError(f"--data for a {task.kind} run takes {what}, got {len(data)} paths")
    for path in data:
        check_text_file(path, "--data file")
    trained_on = [Path(p) for p in (rc.data.path, rc.data.src_path, rc.data.tgt_path)
                  if p and Path(p).is_file()]
    for path in data:
        if any(os.path.samefile(path, t) for t in trained_on):
            log.warning("--data %s is the file this run trained on: the %s metrics include "
                        "text the model has seen (leave --data out to evaluate the held-out "
                        "%s split)", path, split, split)
    return rc.replace("data", **{f"{split}_{key}": path for key, path in zip(keys, data)})


def _eval_task(rd: RunDir, rc: RunConfig) -> Task:
    """The run's task, with the run's tokenizer."""
    tokenizer = rd.load_tokenizer()
    if tokenizer is None and task_class(rc).uses_tokenizer:
        raise RunError(f"run dir {rd.path} has no {rd.tokenizer_file.name}")
    return build_task(rc, tokenizer)


def _eval_precision(rd: RunDir, rc: RunConfig, checkpoint: str, dev: torch.device) -> str:
    """The precision training evaluated ``checkpoint`` in: for ``auto``, what training
    measured fastest and used (the checkpoint's manifest records it; for a weights file, the
    manifest beside it); fp16 off CUDA is fp32, as evaluation scales no loss."""
    name = rc.train.precision
    if name == "fp16" and dev.type != "cuda":
        name = "fp32"
    return resolve_precision(name, dev, recorded=rd.checkpoint_meta(checkpoint).get(
        "precision"))
