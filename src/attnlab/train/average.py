"""Weight averaging: the mean of a run's last N evaluation weights, or the exponential
moving average of its weights over every step, as a new run dir.

Averaging the weights of the last few checkpoints (fairseq's ``average_checkpoints.py``; the
paper's base models average the last 5) smooths the noise of the final updates and often
scores better than any single one. The run keeps them when trained with
``train.keep_checkpoints = N``. The moving average (:class:`WeightEMA`, ``train.ema_decay``:
fairseq's ``--ema-decay``, timm's ``ModelEmaV3``) does the same over every step instead of a
few snapshots; the run keeps it in ``last/``'s training state, so a resumed run goes on with
it. Either average is a run dir like any other (config, tokenizer, ``best/`` and ``last/``
weights), evaluated, sampled from or fine-tuned as such. It holds no optimizer state, so it
cannot be resumed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import RunError, UsageError
from ..models import build_model
from ..runs import RunDir
from ..weights import average_weights, unwrap


class WeightEMA:
    """An exponential moving average of a model's parameters, after every optimizer step:
    ``ema = d * ema + (1 - d) * weights``, with ``d = min(decay, (1 + n) / (10 + n))`` at the
    n-th update (TensorFlow's ``ExponentialMovingAverage`` with ``num_updates``), so the first
    steps' weights, far from trained, fade quickly. Kept in float32, beside the model."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay, self.updates = decay, 0
        self.params = dict(unwrap(model).named_parameters())  # tied weights: once
        self.shadow = {name: p.detach().float().clone() for name, p in self.params.items()}

    @torch.no_grad()
    def update(self) -> None:
        """Fold in the model's current weights (call after the optimizer step)."""
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(list(self.shadow.values()),  # one call for all the tensors
                             [p.detach().float() for p in self.params.values()], 1 - d)

    def state_dict(self) -> dict[str, Any]:
        """For the training state: ``{"updates": n, "weights": {name: tensor}}``."""
        return {"updates": self.updates, "weights": dict(self.shadow)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back :meth:`state_dict`'s average.

        Raises:
            ValueError: another model's parameter names or shapes, or a negative count.
        """
        updates, weights = state["updates"], state["weights"]
        if not (type(updates) is int and updates >= 0) or set(weights) != set(self.shadow):
            raise ValueError("the moving average's updates or parameter names do not match")
        for name, tensor in weights.items():
            if tensor.shape != self.shadow[name].shape:
                raise ValueError(f"the moving average of {name} has shape {tuple(tensor.shape)}"
                                 f", the model {tuple(self.shadow[name].shape)}")
            self.shadow[name].copy_(tensor)
        self.updates = updates

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """``model`` holds the average inside the block (to evaluate or save it) and its own
        weights again after it."""
        params = dict(unwrap(model).named_parameters())
        kept = {name: params[name].detach().clone() for name in self.shadow}
        self.copy_to(model)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, tensor in kept.items():
                    params[name].copy_(tensor)

    def copy_to(self, model: nn.Module) -> None:
        """Load the average into ``model`` (of the same architecture); buffers stay."""
        params = dict(unwrap(model).named_parameters())
        with torch.no_grad():
            for name, tensor in self.shadow.items():
                params[name].copy_(tensor)


def average_run(run_dir: str | Path, last: int, out: str | Path) -> dict[str, object]:
    """Write into ``out`` a run dir whose weights are the mean of ``run_dir``'s last ``last``
    step checkpoints (``steps/``); returns what was averaged (steps, files, out).

    Raises:
        UsageError: ``last`` < 1, or ``out`` is ``run_dir`` or a non-empty folder.
        RunError: the run keeps fewer than ``last`` step checkpoints (names the setting).
    """
    if last < 1:
        raise UsageError(f"--last must be >= 1, got {last}")
    src, dst = _check_out(run_dir, out)
    kept = src.step_checkpoints()
    if len(kept) < last:
        raise RunError(f"{src.path} keeps {len(kept)} step checkpoint(s) "
                       f"({', '.join(str(s) for s, _ in kept) or 'none'}), fewer than "
                       f"--last {last}: train it with --set train.keep_checkpoints={last} "
                       "(or more)")
    chosen = kept[-last:]
    config = src.read_config()
    model = build_model(src.model_config(config))
    average_weights(model, [path for _, path in chosen])
    steps = [s for s, _ in chosen]
    meta = {"step": steps[-1], "averaged_steps": steps, "averaged_from": str(src.path)}
    _write_run(src, dst, config, model, meta)
    return {"averaged_steps": steps, "from": str(src.path), "out": str(dst.path)}


def ema_run(run_dir: str | Path, out: str | Path) -> dict[str, object]:
    """Write into ``out`` a run dir whose weights are ``run_dir``'s moving average
    (``train.ema_decay``) as of its last checkpoint; returns its step, decay, source and out.

    Raises:
        UsageError: ``out`` is ``run_dir`` or a non-empty folder.
        RunError: the run has no last/ training state, or keeps no moving average (names the
            setting).
    """
    src, dst = _check_out(run_dir, out)
    if src.checkpoint_dir("last") is None:
        raise RunError(f"{src.path} has no last/ checkpoint: train it first (with --set "
                       "train.ema_decay=D)")
    state = src.load_state("last")
    config = src.read_config()
    decay = config.get("train", {}).get("ema_decay", 0.0)
    if "ema" not in state:
        raise RunError(f"{src.path} keeps no moving average of its weights: train it with "
                       "--set train.ema_decay=D (0 < D < 1, such as 0.999)")
    model = build_model(src.model_config(config))
    src.load_weights(model, "last")
    ema = WeightEMA(model, decay)
    try:
        ema.load_state_dict(state["ema"])
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(f"the moving average in {src.checkpoint_dir('last')} does not fit the "
                       f"run's model ({e}): the checkpoint is damaged") from None
    ema.copy_to(model)
    meta = {"step": state["step"], "ema_decay": decay, "ema_updates": ema.updates,
            "averaged_from": str(src.path)}
    _write_run(src, dst, config, model, meta)
    return {"step": state["step"], "ema_decay": decay, "from": str(src.path),
            "out": str(dst.path)}


def _check_out(run_dir: str | Path, out: str | Path) -> tuple[RunDir, RunDir]:
    """The source and destination run dirs; the destination new or empty."""
    src, dst = RunDir(run_dir), RunDir(out)
    if not src.path.is_dir():
        src.read_config()  # one line: it does not exist, or is a file
    if dst.path.resolve() == src.path.resolve():
        raise UsageError("--out must be a new run dir, not the run being averaged")
    if dst.path.exists() and any(dst.path.iterdir()):
        raise UsageError(f"--out {dst.path} is not empty: choose a new folder")
    return src, dst


def _write_run(src: RunDir, dst: RunDir, config: dict[str, Any], model: nn.Module,
               meta: dict[str, Any]) -> None:
    """``model``'s weights as ``dst``'s best/ and last/, with ``src``'s config and tokenizer."""
    dst.path.mkdir(parents=True, exist_ok=True)
    dst.write_config(config)
    tokenizer = src.load_tokenizer()
    if tokenizer is not None:
        dst.save_tokenizer(tokenizer)
    for which in ("best", "last"):
        dst.save_checkpoint(which, model, None, meta)
