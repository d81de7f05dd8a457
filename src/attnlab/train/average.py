"""Checkpoint averaging: the mean of a run's last N evaluation weights, as a new run dir.

Averaging the weights of the last few checkpoints (fairseq's ``average_checkpoints.py``; the
paper's base models average the last 5) smooths the noise of the final updates and often
scores better than any single one. The run keeps them when trained with
``train.keep_checkpoints = N``; the average is a run dir like any other (config, tokenizer,
``best/`` and ``last/`` weights), evaluated, sampled from or fine-tuned as such. It holds no
optimizer state, so it cannot be resumed.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import RunError, UsageError
from ..models import build_model
from ..run_config import RunConfig
from ..runs import RunDir
from ..weights import average_weights


def average_run(run_dir: str | Path, last: int, out: str | Path) -> dict[str, object]:
    """Write into ``out`` a run dir whose weights are the mean of ``run_dir``'s last ``last``
    step checkpoints (``steps/``); returns what was averaged (steps, files, out).

    Raises:
        UsageError: ``last`` < 1, or ``out`` is ``run_dir`` or a non-empty folder.
        RunError: the run keeps fewer than ``last`` step checkpoints (names the setting).
    """
    src, dst = RunDir(run_dir), RunDir(out)
    if last < 1:
        raise UsageError(f"--last must be >= 1, got {last}")
    if dst.path.resolve() == src.path.resolve():
        raise UsageError("--out must be a new run dir, not the run being averaged")
    if dst.path.exists() and any(dst.path.iterdir()):
        raise UsageError(f"--out {dst.path} is not empty: choose a new folder")
    kept = src.step_checkpoints()
    if len(kept) < last:
        raise RunError(f"{src.path} keeps {len(kept)} step checkpoint(s) "
                       f"({', '.join(str(s) for s, _ in kept) or 'none'}), fewer than "
                       f"--last {last}: train it with --set train.keep_checkpoints={last} "
                       "(or more)")
    chosen = kept[-last:]
    config = src.read_config()
    model = build_model(RunConfig.from_dict(config).model)
    average_weights(model, [path for _, path in chosen])
    steps = [s for s, _ in chosen]
    meta = {"step": steps[-1], "averaged_steps": steps, "averaged_from": str(src.path)}
    dst.path.mkdir(parents=True, exist_ok=True)
    dst.write_config(config)
    tokenizer = src.load_tokenizer()
    if tokenizer is not None:
        dst.save_tokenizer(tokenizer)
    for which in ("best", "last"):
        dst.save_checkpoint(which, model, None, meta)
    return {"averaged_steps": steps, "from": str(src.path), "out": str(dst.path)}
