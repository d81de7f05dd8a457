"""Training: run configs, optimizer groups and schedules, the loop, DDP, whole runs, and the
evaluation and samples of a finished run.

``train_run(load_config("configs/x.toml", ["train.lr=3e-4"]), "runs/x")`` is what
``attnlab train configs/x.toml --set train.lr=3e-4 --out runs/x`` does. The tasks the loop
trains live in :mod:`attnlab.tasks`; the run dir it writes in :mod:`attnlab.runs`.
"""

from ..devices import resolve_device
from ..run_config import DEMO, DataConfig, RunConfig, TrainConfig, apply_overrides
from .average import WeightEMA, average_run, ema_run
from .evaluate import evaluate_run
from .loop import Trainer, TrainResult
from .optim import build_optimizer, cosine_lr, inverse_sqrt_lr, lr_at, noam_peak, param_groups
from .precision import resolve_precision
from .runner import RunOutcome, load_config, train_run
from .sample import sample_texts

__all__ = [
    "DEMO",
    "DataConfig",
    "RunConfig",
    "RunOutcome",
    "TrainConfig",
    "WeightEMA",
    "TrainResult",
    "Trainer",
    "apply_overrides",
    "average_run",
    "build_optimizer",
    "cosine_lr",
    "ema_run",
    "evaluate_run",
    "inverse_sqrt_lr",
    "load_config",
    "lr_at",
    "noam_peak",
    "param_groups",
    "resolve_device",
    "resolve_precision",
    "sample_texts",
    "train_run",
]
