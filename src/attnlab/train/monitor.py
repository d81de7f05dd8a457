"""What a run reports while it trains: the metrics log (:mod:`attnlab.metrics_log`),
TensorBoard, a progress bar, a log line per evaluation, a loss plot.

On resume, the rows after the checkpoint's step are dropped, so the log reads as if the run
had never stopped.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
from pathlib import Path
from typing import Any

from ..files import atomic_write_bytes
from ..metrics_log import BASE_COLUMNS, format_cell, read_metrics
from ..runs import RunDir

log = logging.getLogger(__name__)


class Monitor:
    """CSV + TensorBoard + tqdm, all on rank 0 only (``enabled=False`` elsewhere)."""

    def __init__(self, run: RunDir | None, metric_names: tuple[str, ...], *, total: int,
                 start: int, progress: bool, tensorboard: bool, enabled: bool = True):
        self.columns = BASE_COLUMNS + tuple(metric_names)
        self.metric_names = tuple(metric_names)
        self.main = enabled  # rank 0: the one process that reports
        self.enabled = enabled and run is not None
        self.file = self.tb = self.bar = None
        if self.enabled:
            path = run.metrics_file
            self._start_csv(path, start)
            self.file = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115
            self.writer = csv.writer(self.file)
            if tensorboard:
                self.tb = _summary_writer(run.tb_dir, start)
        if enabled and progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True,
                            desc="train")

    def _start_csv(self, path: Path, start: int) -> None:
        """A fresh header, or on resume the rows up to ``start`` (written atomically)."""
        rows = read_metrics(path, complete=True) if start > 0 and path.is_file() else []
        kept = [r for r in rows if tuple(r) == self.columns and r["step"] <= start]
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(self.columns)
        w.writerows([format_cell(v) for v in r.values()] for r in kept)
        atomic_write_bytes(path, buf.getvalue().encode())

    def row(self, step: int, values: dict[str, Any]) -> None:
        """Append one row (missing columns stay empty) and send the values to TensorBoard; an
        evaluation (a row with ``val_loss``) is also logged, as one line, when it happens."""
        if self.main and values.get("val_loss") is not None:
            shown = [f"{k} {values[k]:.4f}" for k in ("val_loss", *self.metric_names)
                     if values.get(k) is not None]
            with self.bar.external_write_mode() if self.bar is not None \
                    else contextlib.nullcontext():  # the line above the bar, not through it
                log.info("step %d  %s", step, "  ".join(shown))
        if not self.enabled:
            return
        self.writer.writerow([format_cell(step)]
                             + [format_cell(values.get(c)) for c in self.columns[1:]])
        self.file.flush()
        if self.tb is not None:
            for name, v in values.items():
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    self.tb.add_scalar(name, v, step)

    def progress(self, n: int = 1, **postfix: Any) -> None:
        """Move the progress bar on by ``n`` steps, showing ``postfix`` (loss, lr, ...)."""
        if self.bar is not None:
            if postfix:
                short = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in postfix.items()}
                self.bar.set_postfix(short, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        """Close the bar, the log file and TensorBoard's writer (idempotent)."""
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
        self.file = self.tb = self.bar = None


def _summary_writer(path: Path, start: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("tensorboard is not installed: no tb/ logs (pip install 'attnlab[log]', or "
                    "--set train.tensorboard=false to silence this)")
        return None
    # A resumed run rewrites the steps after its checkpoint's; the checkpoint's own step was
    # logged before it was saved, so it stays. A run that starts from step 0 in a used folder
    # (an earlier try stopped before its first checkpoint) drops that try's events.
    return SummaryWriter(str(path), purge_step=start + 1)


def plot_curves(run: RunDir) -> Path | None:
    """The run's loss plot from its metrics log (:func:`attnlab.viz.plot_loss_csv`); None if
    not possible."""
    try:
        from ..viz import plot_loss_csv
    except ImportError as e:
        log.warning("no loss plot: %s (pip install 'attnlab[viz]')", e)
        return None
    try:
        return plot_loss_csv(run.metrics_file, run.loss_plot)
    except (ImportError, ValueError, OSError) as e:
        log.warning("no loss plot: %s", e)
        return None
