"""Tasks: the per-data-set glue between the data and the training loop.

Each task class declares the data sets it trains and everything that varies with them (their
files, the model family, what evaluation can do); ``@register`` enters it into the one
registry (:mod:`attnlab.tasks.registry`), from which :func:`task_class` finds the task of a
run config: its ``data.name``, or for ``data.name = ""`` its files. A new task is one class in
one file (see the registry's docstring); importing the file registers it.
"""

from __future__ import annotations

from ..run_config import RunConfig
from ..tokenizers import Tokenizer
from .base import Amp, DataSet, Progress, Task, no_progress, train_tokenizer
from .lm import LMTask  # registered in this order: the lists of names read in it
from .seq2seq import Seq2SeqTask, TranslationTask

# isort: split
from .classification import ClassifyTask, MaskedLMTask
from .registry import (
    config_keys,
    config_text,
    data_sets,
    data_words,
    default_data_set,
    download,
    downloads,
    names_files,
    register,
    resolve_data,
    task_class,
)
from .synthetic import SyntheticTask


def build_task(rc: RunConfig, tokenizer: Tokenizer | None = None) -> Task:
    """The task that trains ``rc`` (:func:`task_class`); ``tokenizer`` (a resumed run's)
    skips training one. A new run's config goes through :func:`resolve_data` first (the
    trainer does it), so that ``data.name = ""`` without a file trains the default data set;
    a run dir's ``""`` without a file names no data (a model imported from Hugging Face)."""
    return task_class(rc)(rc, tokenizer)


__all__ = [
    "Amp",
    "ClassifyTask",
    "DataSet",
    "LMTask",
    "MaskedLMTask",
    "Progress",
    "Seq2SeqTask",
    "SyntheticTask",
    "Task",
    "TranslationTask",
    "build_task",
    "config_keys",
    "config_text",
    "data_sets",
    "data_words",
    "default_data_set",
    "download",
    "downloads",
    "names_files",
    "no_progress",
    "register",
    "resolve_data",
    "task_class",
    "train_tokenizer",
]
