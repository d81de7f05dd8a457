"""Tasks: the per-data-set glue between the data and the training loop.

:data:`TASKS` gives each data set of :data:`attnlab.run_config.DATA_FAMILIES` the task class
that trains it, and through the class its metrics and which files ``attnlab eval --data`` may
replace. (The run config, below the tasks, names the data sets and their families.)
"""

from __future__ import annotations

from ..config import ConfigError
from ..data import SYNTHETIC_NAMES
from ..run_config import RunConfig
from ..tokenizers import Tokenizer
from .base import Amp, Progress, Task, data_file, no_progress, resolve_model, train_tokenizer
from .classification import ClassifyTask, MaskedLMTask
from .lm import LMTask
from .seq2seq import Seq2SeqTask, TranslationTask
from .synthetic import SyntheticTask

TASKS: dict[str, type[Task]] = {
    "embedded": LMTask,  # the pydoc topics every Python install has
    "text": LMTask,  # your own text file
    "shakespeare": LMTask,
    "multi30k": TranslationTask,
    "parallel": TranslationTask,  # your own line-aligned files
    "sst2": ClassifyTask,
    "tsv": ClassifyTask,  # your own labelled TSV
    **{name: SyntheticTask for name in SYNTHETIC_NAMES},
}


def task_class(name: str) -> type[Task]:
    """The task class of data set ``name``."""
    if name not in TASKS:
        raise ConfigError(f"name={name!r} is not allowed: one of "
                          + ", ".join(repr(n) for n in TASKS))
    return TASKS[name]


def build_task(rc: RunConfig, tokenizer: Tokenizer | None = None) -> Task:
    """The task for ``rc.data.name`` (for labelled sentences and ``model.head = "mlm"``,
    masked-language-model pretraining); ``tokenizer`` (a resumed run's) skips training one."""
    cls = task_class(rc.data.name)
    if rc.model.head == "mlm":
        if cls is not ClassifyTask:
            names = ", ".join(repr(n) for n, c in TASKS.items() if c is ClassifyTask)
            raise ConfigError(f"model.head='mlm' pretrains an encoder on labelled sentences; "
                              f"data.name={rc.data.name!r} is not allowed: one of {names} "
                              "(or model.head='classify')")
        cls = MaskedLMTask
    return cls(rc, tokenizer)


__all__ = [
    "TASKS",
    "Amp",
    "ClassifyTask",
    "LMTask",
    "MaskedLMTask",
    "Progress",
    "Seq2SeqTask",
    "SyntheticTask",
    "Task",
    "TranslationTask",
    "build_task",
    "data_file",
    "no_progress",
    "resolve_model",
    "train_tokenizer",
    "task_class",
]
