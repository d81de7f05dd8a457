"""The one registry of tasks: ``data.name`` -> the task that trains it, and which task trains the
user's own files when ``data.name`` is left out.

A task class declares its data sets, files, model family and abilities itself
(:class:`~attnlab.tasks.base.Task`); ``@register`` on the class enters it here, and every
table of names (allowed ``data.name`` values, ``attnlab data fetch`` / ``data list``, a data
set's family) is read from the registered classes. A new task is one class in one file:

    @register
    class CountTask(Task):
        family = "decoder"
        datasets = (DataSet("count", "counting in words"),)
        ...

With ``data.name = ""`` (the default) the paths decide: a task that claims them (translation
pairs, a labelled .tsv), else the task of the default data set (a language model: any other
text, a prepared DIR, ``data.mix``; no file at all: the embedded corpus). ``model.family``,
where set, picks the own-files task of that family.
"""

from __future__ import annotations

import dataclasses

from ..config import FROM_DATA_KEYS, ConfigError, family_keys
from ..data import DataError, DatasetInfo
from ..run_config import (
    SECTIONS,
    TASK_TRAIN_KEYS,
    TOKENIZER_ONLY_KEYS,
    DataConfig,
    RunConfig,
    TrainConfig,
    config_toml,
    recipe_comments,
    toml_value,
)
from .base import DataSet, Task

REGISTRY: list[type[Task]] = []  # the registered task classes, in the order registered


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: enter task ``cls`` and its :attr:`~Task.datasets` into the registry.

    Raises:
        ValueError: a data set name already taken, an empty one, a second default data set,
            or a class that declares no family (mistakes in code, not in a user's input).
    """
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ValueError(f"@register takes a Task subclass, got {cls!r}")
    if cls.family not in ("decoder", "encoder", "encoder_decoder"):
        raise ValueError(f"{cls.__name__}.family={cls.family!r}: declare the model family it "
                         "trains ('decoder', 'encoder' or 'encoder_decoder')")
    taken = data_sets()
    for ds in cls.datasets:
        if not ds.name or ds.name in taken:
            owner = taken[ds.name][0].__name__ if ds.name in taken else ""
            raise ValueError(f"{cls.__name__} declares data set {ds.name!r}, "
                             + (f"already {owner}'s" if owner else "an empty name"))
        if ds.default and default_data_set() is not None:
            raise ValueError(f"{cls.__name__} declares a second default data set {ds.name!r}")
        taken[ds.name] = (cls, ds)
    if cls not in REGISTRY:
        REGISTRY.append(cls)
    return cls


def data_sets() -> dict[str, tuple[type[Task], DataSet]]:
    """Every registered data set by name, with the task that trains it."""
    return {ds.name: (cls, ds) for cls in REGISTRY for ds in cls.datasets}


def default_data_set() -> DataSet | None:
    """The data set trained when the config names neither a data set nor a file."""
    return next((ds for _, ds in data_sets().values() if ds.default), None)


def downloads() -> dict[str, DatasetInfo]:
    """The data sets ``attnlab data fetch`` downloads, by name."""
    return {name: ds.download for name, (_, ds) in data_sets().items() if ds.download}


def download(name: str) -> DatasetInfo:
    """What ``attnlab data fetch NAME`` downloads; a :class:`DataError` naming the fetchable
    data sets for any other name."""
    found = downloads()
    if name not in found:
        what = (f"data set {name!r} has nothing to download" if name in data_sets()
                else f"unknown data set {name!r}")
        raise DataError(f"{what}; allowed: {', '.join(found)}")
    return found[name]


def _named(d: DataConfig) -> type[Task]:
    known = data_sets()
    if d.name not in known:
        raise ConfigError(f"data.name={d.name!r} is not allowed: one of "
                          + ", ".join(repr(n) for n in known)
                          + " (or leave data.name out to train on your files, named by "
                          "data.path or data.src_path + data.tgt_path)")
    return known[d.name][0]


def _own_files(d: DataConfig, family: str | None) -> type[Task]:
    """The task of the user's files: the one that claims them, else the default data set's;
    ``family`` (model.family where the user set it) picks among the tasks of that family."""
    own = [c for c in REGISTRY if c.own_files and family in (None, c.family)]
    if not own:
        raise ConfigError(f"model.family={family!r} is not allowed without data.name: no task "
                          "trains your files for it; allowed: "
                          + ", ".join(repr(c.family) for c in REGISTRY if c.own_files)
                          + " (or set data.name: attnlab data list)")
    claimed = [c for c in own if c.claims_files(d)]
    if len(claimed) > 1:
        raise ConfigError("the data paths name files of several kinds ("
                          + ", ".join(c.kind for c in claimed) + "); allowed: the files of one "
                          "(set data.path, or data.src_path and data.tgt_path)")
    if claimed:
        return claimed[0]
    default = default_data_set()
    fallback = data_sets()[default.name][0] if default else None
    if fallback in own:
        return fallback
    return own[0]


def task_class(rc: RunConfig, family: str | None = None) -> type[Task]:
    """The task that trains the data of ``rc``: its data set's, or for ``data.name = ""`` the
    one its files and ``family`` (default: ``model.family`` where the user set it) decide;
    with ``model.head = "mlm"``, that task's masked-LM pretraining.

    Raises:
        ConfigError: an unknown ``data.name`` (naming the allowed ones), ``data.mix`` for a
            task that reads no mix, or ``model.head = "mlm"`` on data that has no masked LM.
    """
    d = rc.data
    if family is None and "model.family" in rc.explicit:
        family = rc.model.family
    cls = _named(d) if d.name else _own_files(d, family)
    if d.mix is not None and not cls.reads_mix:
        raise ConfigError(f"data.mix={d.mix!r} is not allowed: only for language models (the "
                          f"data of {data_words(d)} trains a {cls.kind} model)")
    if rc.model.head == "mlm":
        if cls.masked_lm is None:
            names = ", ".join(repr(n) for n, (c, _) in data_sets().items() if c.masked_lm)
            raise ConfigError(f"model.head='mlm' pretrains an encoder on labelled sentences, "
                              f"but {data_words(d)} trains a {cls.kind} model; allowed: "
                              f"data.name one of {names}, or a labelled .tsv in data.path (or "
                              "model.head='classify')")
        cls = cls.masked_lm
    return cls


def data_words(d: DataConfig) -> str:
    """The data of ``d``, as a message names it."""
    if d.name:
        return f"data.name={d.name!r}"
    given = [f"data.{k}={getattr(d, k)!r}" for k in ("path", "src_path") if getattr(d, k)]
    return given[0] if given else "data.mix" if d.mix else "no data set and no file"


def names_files(d: DataConfig) -> bool:
    """Does ``d`` name training files of the user's (``data.path``, ``data.mix``,
    ``data.src_path``, ``data.tgt_path``)?"""
    return bool(d.path or d.mix is not None or d.src_path or d.tgt_path)


def resolve_data(rc: RunConfig) -> RunConfig:
    """``rc`` with ``data.name`` filled in where it names no data set and no file: the default
    data set, which the run's config then records."""
    d = rc.data
    if d.name or names_files(d):
        return rc
    default = default_data_set()
    if default is None or data_sets()[default.name][0] is not task_class(rc):
        return rc
    return dataclasses.replace(rc, data=dataclasses.replace(d, name=default.name))


def config_keys(rc: RunConfig) -> dict[str, tuple[str, ...]]:
    """The keys of each section that apply to the run of ``rc``: the model keys of its task's
    family (:func:`~attnlab.config.family_keys`), the data keys its task reads
    (:attr:`Task.data_keys`) and the train keys of every run and of its task
    (:attr:`Task.train_keys`)."""
    cls = task_class(rc)
    train = tuple(f.name for f in dataclasses.fields(TrainConfig)
                  if f.name not in TASK_TRAIN_KEYS or f.name in cls.train_keys)
    data = tuple(k for k in cls.data_keys
                 if TOKENIZER_ONLY_KEYS.get(k, rc.data.tokenizer) == rc.data.tokenizer)
    return {"model": family_keys(cls.family), "data": data, "train": train}


def config_text(rc: RunConfig, recipe_text: str | None = None) -> str:
    """``rc`` as a TOML recipe (``attnlab train --print-config``): the keys that apply to its
    run (:func:`config_keys`) and those the config gives, with the comments of
    ``recipe_text`` beside their keys; a model size that training takes from the data is a
    comment, unless given. ``attnlab train FILE`` reads it back to ``rc``: a key left out
    is at its default."""
    keys = config_keys(rc)
    full = {**rc.to_dict(), "model": rc.model.to_dict()}  # a derived size stays unset
    shown = {s: {k: v for k, v in full[s].items() if k in keys[s] or f"{s}.{k}" in rc.explicit}
             for s in SECTIONS}
    unset = {f"model.{k}": f"unset: {toml_value(getattr(rc.model, k))}, derived"
             for k, v in shown["model"].items() if v is None and getattr(rc.model, k) is not None}
    unset |= {f"model.{k}": "filled in from the data" for k in FROM_DATA_KEYS
              if k in shown["model"] and f"model.{k}" not in rc.explicit}
    return config_toml(shown, recipe_comments(recipe_text) if recipe_text else None, unset)
