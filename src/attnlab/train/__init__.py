"""Training: run configs, optimizer groups and schedules, the loop, checkpoints, DDP.

``train_run(load_config("configs/x.toml", ["train.lr=3e-4"]), "runs/x")`` is what
``attnlab train configs/x.toml --set train.lr=3e-4 --out runs/x`` does.
"""

from .checkpoint import load_checkpoint, load_state, save_checkpoint
from .config import DEMO, DataConfig, RunConfig, TrainConfig, apply_overrides, load_config
from .loop import Trainer, TrainResult, resolve_device, resolve_precision
from .optim import build_optimizer, cosine_lr, inverse_sqrt_lr, lr_at, noam_peak, param_groups
from .runner import RunOutcome, evaluate_run, sample_texts, train_run
from .tasks import Task, build_task

__all__ = [
    "DEMO",
    "DataConfig",
    "RunConfig",
    "RunOutcome",
    "Task",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "apply_overrides",
    "build_optimizer",
    "build_task",
    "cosine_lr",
    "evaluate_run",
    "inverse_sqrt_lr",
    "load_checkpoint",
    "load_config",
    "load_state",
    "lr_at",
    "noam_peak",
    "param_groups",
    "resolve_device",
    "resolve_precision",
    "sample_texts",
    "save_checkpoint",
    "train_run",
]
