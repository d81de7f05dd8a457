"""What a run reports while it trains: metrics.csv, TensorBoard (tb/), a progress bar, loss.png.

``metrics.csv`` has one row per logged or evaluated step with the header
``step,train_loss,val_loss,lr,tokens_per_s,elapsed_s`` followed by the task's metrics (``ppl``,
``bleu``, ``accuracy``, ``f1``); a cell is empty when that value was not measured at that
step. On resume, rows after the checkpoint's step are dropped, so the file reads as if the run
had never stopped.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from pathlib import Path
from typing import Any

from ..runs import atomic_write_bytes

log = logging.getLogger(__name__)

BASE_COLUMNS = ("step", "train_loss", "val_loss", "lr", "tokens_per_s", "elapsed_s")
CSV_NAME = "metrics.csv"


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.8g}"
    return str(v)


def read_metrics(path: str | Path) -> list[dict[str, float | None]]:
    """The rows of a metrics.csv, numbers as floats (``step`` as int), empty cells as None."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out = []
    for row in rows:
        out.append({k: (None if v == "" else (int(v) if k == "step" else float(v)))
                    for k, v in row.items()})
    return out


class Monitor:
    """CSV + TensorBoard + tqdm, all on rank 0 only (``enabled=False`` elsewhere)."""

    def __init__(self, run_dir: Path | None, metric_names: tuple[str, ...], *, total: int,
                 start: int, progress: bool, tensorboard: bool, enabled: bool = True):
        self.columns = BASE_COLUMNS + tuple(metric_names)
        self.enabled = enabled and run_dir is not None
        self.file = self.tb = self.bar = None
        if self.enabled:
            path = Path(run_dir) / CSV_NAME
            self._start_csv(path, start)
            self.file = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115
            self.writer = csv.writer(self.file)
            if tensorboard:
                self.tb = _summary_writer(Path(run_dir) / "tb", start)
        if enabled and progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True,
                            desc="train")

    def _start_csv(self, path: Path, start: int) -> None:
        """A fresh header, or on resume the rows up to ``start`` (written atomically)."""
        kept = []
        if start > 0 and path.is_file():
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if header is not None and tuple(header) == self.columns:
                    kept = [r for r in reader if r and int(r[0]) <= start]
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(self.columns)
        w.writerows(kept)
        atomic_write_bytes(path, buf.getvalue().encode())

    def row(self, step: int, values: dict[str, Any]) -> None:
        """Append one row (missing columns stay empty) and send the values to TensorBoard."""
        if not self.enabled:
            return
        self.writer.writerow([_cell(step)] + [_cell(values.get(c)) for c in self.columns[1:]])
        self.file.flush()
        if self.tb is not None:
            for name, v in values.items():
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    self.tb.add_scalar(name, v, step)

    def progress(self, n: int = 1, **postfix: Any) -> None:
        if self.bar is not None:
            if postfix:
                short = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in postfix.items()}
                self.bar.set_postfix(short, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
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
        log.warning("tensorboard is not installed: no tb/ logs (pip install attnlab[log], or "
                    "--set train.tensorboard=false to silence this)")
        return None
    return SummaryWriter(str(path), purge_step=start if start > 0 else None)


def plot_curves(run_dir: Path) -> Path | None:
    """loss.png from metrics.csv with :func:`attnlab.viz.plot_loss_csv`; None if not possible."""
    try:
        from ..viz import plot_loss_csv
    except ImportError as e:
        log.warning("no loss plot: %s (pip install attnlab[viz])", e)
        return None
    try:
        return plot_loss_csv(Path(run_dir) / CSV_NAME, Path(run_dir) / "loss.png")
    except (ImportError, ValueError, OSError) as e:
        log.warning("no loss plot: %s", e)
        return None
