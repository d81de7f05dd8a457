"""Fine-tuning: start a run from trained weights (``train.init_from`` / ``--init-from``).

The source (:func:`load_source`) gives the new run its model config (:func:`init_config`),
its tokenizer (no new one is trained) and its weights (:func:`load_init_weights`; an encoder's
classification head starts fresh unless :func:`keeps_head`). Resuming a fine-tuned run never
reads the source again: the run dir holds everything.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import ConfigError, ModelConfig
from ..errors import InputError, MissingFileError
from ..info import FAMILY_WORDS
from ..run_config import RunConfig, upgrade
from ..runs import RunDir, RunError, load_run
from ..tasks import data_words, names_files, task_class
from ..tokenizers import Tokenizer

log = logging.getLogger(__name__)

MINILM = "all-MiniLM-L6-v2"
# [model] keys a fine-tuning recipe may set to other values than its source's: they change no
# weight's shape (pooling and dropout), or only the head's, which then starts fresh
TUNABLE = ("dropout", "attn_dropout", "pooling", "n_classes", "head")
HEAD = "head."  # the classification head's parameter names (EncoderClassifier.head)
POOLER = "pooler."  # BERT's pooler (EncoderClassifier.pooler, pooling="pooler")


@dataclass
class InitSource:
    """What a run starts from: a model config, its weights, tokenizer and class names."""

    spec: str  # train.init_from as given
    config: ModelConfig
    state: dict[str, Tensor]
    tokenizer: Tokenizer
    label_names: list[str] | None  # the classes its head was trained on, if any
    run_config: dict | None = None  # a run dir source's config.json (its data and split)


def load_source(spec: str) -> InitSource:
    """Read ``train.init_from``: a run dir, a Hugging Face model dir or ``all-MiniLM-L6-v2``.

    Raises:
        MissingFileError: the path does not exist.
        RunError: a folder that is neither a run dir with a checkpoint nor a model directory
            :func:`attnlab.interop.load_pretrained` converts.
    """
    path = Path(spec)
    if path.is_dir() and RunDir(path).has_checkpoint():
        run = load_run(path, "best")
        if run.tokenizer is None:
            raise RunError(f"train.init_from={spec}: that run has no tokenizer (a synthetic "
                           "task); fine-tuning starts from runs trained on text")
        names = run.data.get("label_names")
        return InitSource(spec, run.model.config, run.model.state_dict(), run.tokenizer,
                          list(names) if isinstance(names, list) else None, run.config)
    if not path.exists() and spec != MINILM:
        raise MissingFileError(f"train.init_from={spec} does not exist: give a run dir (the "
                               f"--out of a training), a Hugging Face model directory, or the "
                               f"name {MINILM}")
    from ..interop import load_pretrained

    try:
        pre = load_pretrained(spec)
    except (FileNotFoundError, InputError) as e:
        kind = MissingFileError if isinstance(e, FileNotFoundError) else RunError
        raise kind(f"train.init_from={spec} is no run dir with a checkpoint, nor a model "
                   f"attnlab converts: {e}") from None
    return InitSource(spec, pre.model.config, pre.model.state_dict(), pre.tokenizer,
                      pre.label_names)


def init_config(rc: RunConfig, base: ModelConfig, where: str) -> RunConfig:
    """``rc`` with its model section taken from ``base`` (the source's, or on resume the
    run's own) where the recipe leaves keys out.

    Every key of ``base`` is marked explicit so that the task keeps it rather than filling it
    in from the data, except ``n_classes`` and ``head`` (the recipe's classes and objective
    decide: a masked LM's run fine-tunes into a classifier with a fresh head).

    Raises:
        ConfigError: the data trains another family than ``base``'s, or the recipe sets a key
            outside :data:`TUNABLE` to another value than ``base``'s.
    """
    # data.name and files left out: the source's family picks the task (files decide first)
    named = rc.data.name or names_files(rc.data)
    family = task_class(rc, family=None if named else base.family).family
    if base.family != family:
        raise ConfigError(f"train.init_from={where} holds {FAMILY_WORDS[base.family]} model, "
                          f"but {data_words(rc.data)} trains {FAMILY_WORDS[family]} model; start "
                          f"from {FAMILY_WORDS[family]} run")
    changes = {}
    for f in dataclasses.fields(ModelConfig):
        key = f.name
        if f"model.{key}" not in rc.explicit:
            continue
        mine, theirs = getattr(rc.model, key), getattr(base, key)
        if mine != theirs and key not in TUNABLE:
            raise ConfigError(f"model.{key}={mine!r} in the recipe contradicts "
                              f"train.init_from={where}, whose model.{key} is {theirs!r}; "
                              f"leave model.{key} out (the source's value is used) or train "
                              "from scratch")
        changes[key] = mine
    changes["head"] = rc.model.head
    taken = {f"model.{f.name}" for f in dataclasses.fields(ModelConfig)} - {"model.n_classes",
                                                                           "model.head"}
    return dataclasses.replace(rc, model=base.replace(**changes), explicit=rc.explicit | taken)


def keeps_head(rc: RunConfig, src: InitSource) -> bool:
    """Whether the model keeps the source's ``head``: always a language model's output layer;
    an encoder's masked-LM head when it goes on as a masked LM, its classifier only when the
    source was trained on the same, named classes."""
    if rc.model.family != "encoder":
        return True
    if src.config.head != rc.model.head:
        return False
    return rc.model.head == "mlm" or (src.label_names is not None
                                      and rc.data.label_names == src.label_names
                                      and src.config.n_classes == len(src.label_names))


def load_init_weights(model: nn.Module, src: InitSource, fresh_head: bool) -> None:
    """Copy the source's weights into ``model`` (built from :func:`init_config`'s config);
    with ``fresh_head`` the classification head keeps its new initialisation.

    Raises:
        RunError: a tensor of the model that the source lacks (besides the head), or one
            whose shape differs.
    """
    own = model.state_dict()
    state = {k: v for k, v in src.state.items() if not (fresh_head and k.startswith(HEAD))}
    # pooling="pooler" on a source without BERT's pooler (e.g. mean-pooled): a fresh pooler
    fresh = (HEAD,) if fresh_head else ()
    if not any(k.startswith(POOLER) for k in state):
        fresh += (POOLER,)
    missing = sorted(k for k in own if k not in state and not k.startswith(fresh))
    wrong = sorted(k for k in state if k in own and state[k].shape != own[k].shape)
    if missing or wrong:
        what = f"missing {missing[:3]}" if missing else \
            f"{wrong[0]} is {tuple(state[wrong[0]].shape)} there, {tuple(own[wrong[0]].shape)} here"
        raise RunError(f"the weights of train.init_from={src.spec} do not fit this model: "
                       f"{what}")
    with torch.no_grad():
        for key, value in state.items():
            if key in own:
                own[key].copy_(value)
    log.info("initialised from %s (%d tensors%s)", src.spec, len(state),
             ", a fresh classification head" if fresh_head and src.config.family == "encoder"
             else "")


SPLIT_KEYS = ("holdout", "holdout_unit", "split_seed")


def _split_of(data: dict, train_seed: int) -> dict:
    """The held-out split a classification run makes: its fraction, unit and seed."""
    seed = data.get("split_seed")
    return {"holdout": data.get("holdout"), "holdout_unit": data.get("holdout_unit"),
            "split_seed": train_seed if seed is None else seed}


def keep_split(rc: RunConfig, src_rc: dict | None, where: str) -> RunConfig:
    """``rc`` holding out the same sentences as the run whose config is ``src_rc`` (the source
    of ``train.init_from``, or on resume the run itself) when both train on the same labelled
    file (e.g. ``sst2_mlm``, then ``sst2 --init-from``): with another split, the validation
    sentences would be ones the source's weights were trained on.

    Split settings the recipe leaves out are the source's (so ``train.seed`` may vary the
    fine-tuning alone); one set to another value is refused.

    Raises:
        ConfigError: ``data.holdout``, ``data.holdout_unit`` or ``data.split_seed`` set to
            another split than the source's.
    """
    d = rc.data
    if not src_rc or rc.model.family != "encoder" or d.val_path:
        return rc
    theirs_d = upgrade(src_rc).get("data") or {}
    if theirs_d.get("val_path") or (theirs_d.get("name"), theirs_d.get("path") or "") != (
            d.name, d.path or ""):
        return rc  # the source held out nothing, or trained on other data
    theirs = _split_of(theirs_d, (src_rc.get("train") or {}).get("seed"))
    mine = _split_of(dataclasses.asdict(d), rc.train.seed)
    changes = {}
    for key in SPLIT_KEYS:
        if mine[key] == theirs[key]:
            continue
        if f"data.{key}" in rc.explicit:
            raise ConfigError(
                f"data.{key}={mine[key]!r} holds out other sentences than "
                f"train.init_from={where}, which trained on the same data with "
                f"data.{key}={theirs[key]!r}: some validation sentences would be ones its "
                f"weights have read; leave data.{key} out (the source's split is used)")
        changes[key] = theirs[key]
    if changes:
        log.info("holding out the sentences %s held out (%s)", where,
                 ", ".join(f"data.{k}={v!r}" for k, v in changes.items()))
        rc = dataclasses.replace(rc, data=dataclasses.replace(d, **changes))
    return rc
