"""The run config: ``[model]`` + ``[data]`` + ``[train]`` sections, each a frozen dataclass.

A recipe is a TOML file with those three tables; ``--set section.key=value`` overrides any
field (the value is read as a TOML value, so ``--set train.lr=3e-4``, ``--set
model.norm=pre`` and ``--set data.path=/tmp/x.txt`` all work without quotes). Unknown keys and
wrong types raise :class:`~attnlab.config.ConfigError` (a ``ValueError``) naming the key, the
value and what is allowed. ``RunConfig.explicit`` remembers which keys the user set, so values
such as ``model.vocab_size`` can be filled in from the data unless they were given.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from .config import ConfigError, ModelConfig, check, check_keys, check_literal, check_types
from .errors import MissingFileError
from .recipes import not_a_folder, recipe_text
from .runs import RunDir

TokenizerKind = Literal["char", "bpe", "gpt2"]
PreTokenizer = Literal["byte_level", "whitespace"]
HoldoutUnit = Literal["sentence", "row"]
Schedule = Literal["cosine", "inverse_sqrt", "constant"]
OptimizerKind = Literal["adamw", "muon"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
SdpaBackend = Literal["auto", "default", "math", "flash", "efficient"]
Parallel = Literal["ddp", "fsdp"]

SECTIONS = ("model", "data", "train")
# data.name of the user's own files before data.name named data sets only, with the model
# family each trained: a run dir's config.json may hold them, and --set takes them. Each is
# read as data.name = "" (the paths decide the task) with that model.family (upgrade()).
OLD_OWN_FILES = {"text": "decoder", "tsv": "encoder", "parallel": "encoder_decoder"}
METRICS = ("auto", "val_loss", "ppl", "bleu", "accuracy", "f1")
# The [train] keys only some tasks read (each task's Task.train_keys names those it reads);
# every other [train] key applies to every run.
TASK_TRAIN_KEYS = ("batch_size", "max_tokens", "block_size", "eval_batches",
                   "final_eval_batches", "samples", "sample_tokens", "temperature", "top_k")
# The [data] keys that only one kind of data.tokenizer reads.
TOKENIZER_ONLY_KEYS = {"vocab_size": "bpe", "pre_tokenizer": "bpe", "unk": "char"}


@dataclass(frozen=True)
class DataConfig:
    """Where the data comes from and how it is tokenized.

    ``name`` picks a data set (``attnlab data list``; the tasks of :mod:`attnlab.tasks`
    declare them and check the name): ``embedded`` (the pydoc topics every Python has), a
    fetchable one (``shakespeare``, ``multi30k``, ``sst2``: read from ``attnlab data fetch``'s
    cache, downloaded if missing), or a synthetic task (``copy``, ``reverse``, ``sort``).
    Left out (``""``), your files decide: ``src_path`` + ``tgt_path`` (or a prepared pairs
    DIR in ``path``) train a translation model, a ``.tsv`` in ``path`` a classifier, any other
    text in ``path`` or ``mix`` (a file, a folder, a prepared DIR) a language model, and no
    file at all the embedded default; ``model.family``, where set, picks the task of that
    family. Local paths always win over the cache.
    """

    name: str = ""  # a data set (attnlab data list), or "": your files, or the embedded default
    # LM: a text file (tokenized once into the cache's prepared/) or a prepared token dir
    # (`attnlab data prepare`); classification: a TSV (label and sentence columns)
    path: str = ""
    # LM: several corpora instead of path, [{path = "a_dir", weight = 0.7}, ...]: each
    # training row picks one by weight; val_loss is the weighted mean of their val losses
    mix: list[dict[str, Any]] | None = None
    val_path: str = ""  # a separate validation file (default: held out from path)
    test_path: str = ""
    src_path: str = ""  # translation: line-aligned source / target files
    tgt_path: str = ""
    val_src_path: str = ""
    val_tgt_path: str = ""
    test_src_path: str = ""
    test_tgt_path: str = ""
    cache_dir: str = ""  # data cache (default $ATTNLAB_DATA or ~/.cache/attnlab/data)
    tokenizer: TokenizerKind = "char"  # gpt2: GPT-2's byte-level BPE, as it is (no training)
    # char, language model: a <unk> token, which every character the training text lacks maps
    # to (a prompt or val text may then hold any character); false: such a character is an error
    unk: bool = False
    vocab_size: int = 8000  # BPE vocabulary to train
    pre_tokenizer: PreTokenizer = "whitespace"  # BPE pre-tokenizer
    train_frac: float = 0.9  # LM: first part train, rest val (nanoGPT)
    # LM: this fraction of the training windows (each row drawn apart) is a passage of the text
    # read over and over: the window's first p tokens (p from block/8 to block/2) repeated to
    # fill it, so copying from earlier in the context pays (induction heads form)
    repeat_frac: float = 0.0
    repeat_steps: int = 0  # LM: every window repeats in the first N optimizer steps
    holdout: float = 0.1  # classification: fraction of the training file held out as val
    # sentence: hold out whole sentences and drop their phrases from training
    # (attnlab.data.labelled.split_sentences); row: a random fraction of the rows
    holdout_unit: HoldoutUnit = "sentence"
    # seed of that split (default: train.seed); fix it to vary train.seed over one held-out set
    split_seed: int | None = None
    max_len: int = 0  # cut classification inputs / drop longer translation pairs; 0 = model's
    bucket: bool = False  # classification: batch sentences of similar length (less padding)
    src_add_special: bool = False  # wrap source sentences in bos ... eos
    label_names: list[str] | None = None  # classification: names of the classes
    synth_vocab: int = 16  # synthetic tasks: ids 0-2 are pad/bos/eos
    seq_min: int = 3
    seq_max: int = 10
    val_size: int = 512  # synthetic validation examples

    def __post_init__(self) -> None:
        check_types(self)
        for name, lit in (("tokenizer", TokenizerKind), ("pre_tokenizer", PreTokenizer),
                          ("holdout_unit", HoldoutUnit)):
            check_literal(self, name, lit)
        check(self.vocab_size >= 8, "vocab_size", self.vocab_size, "an integer >= 8")
        check(not self.unk or self.tokenizer == "char", "unk", self.unk,
              f"true only with tokenizer='char' (tokenizer={self.tokenizer!r}: a 'bpe' "
              "vocabulary has <unk> already, 'gpt2' reads every byte)")
        for name in ("train_frac", "holdout"):
            v = getattr(self, name)
            check(0.0 < v < 1.0, name, v, "a fraction strictly between 0 and 1")
        check(0.0 <= self.repeat_frac <= 1.0, "repeat_frac", self.repeat_frac,
              "a fraction from 0 to 1")
        check(self.repeat_steps >= 0, "repeat_steps", self.repeat_steps,
              "an integer >= 0")
        check(self.max_len >= 0, "max_len", self.max_len, "0 (the model's) or a positive int")
        check(self.synth_vocab > 3, "synth_vocab", self.synth_vocab, "an integer > 3")
        check(1 <= self.seq_min <= self.seq_max, "seq_min", self.seq_min,
              f"1 <= seq_min <= seq_max (seq_max={self.seq_max})")
        check(self.val_size >= 1, "val_size", self.val_size, "a positive integer")
        check(self.split_seed is None or 0 <= self.split_seed < 2**63, "split_seed",
              self.split_seed, "an integer in 0..2**63-1")
        names = self.label_names
        check(names is None or (isinstance(names, list) and len(names) >= 2
                                and all(isinstance(n, str) for n in names)
                                and len(set(names)) == len(names)),
              "label_names", names, "a list of at least two distinct strings")
        self._check_mix()

    def _check_mix(self) -> None:
        """A mix is a list of tables {path = str, weight = number > 0}, of a language model's
        corpora, in place of data.path."""
        mix = self.mix
        if mix is None:
            return
        allowed = 'a list of tables {path = "file or prepared dir", weight = number > 0}'
        check(isinstance(mix, list) and len(mix) >= 1, "mix", mix, allowed)
        for i, entry in enumerate(mix):
            check(isinstance(entry, dict), f"mix[{i}]", entry, allowed)
            extra = sorted(set(entry) - {"path", "weight"})
            check(not extra, f"mix[{i}]", entry, f"keys path and weight only, not {extra}")
            path, weight = entry.get("path"), entry.get("weight")
            check(isinstance(path, str) and path != "", f"mix[{i}].path", path,
                  "a non-empty string (a text file or a prepared data dir)")
            check(isinstance(weight, (int, float)) and not isinstance(weight, bool)
                  and math.isfinite(weight) and weight > 0, f"mix[{i}].weight", weight,
                  "a finite number > 0")
        check(not self.path, "mix", mix,
              f"mix or path, not both (data.path={self.path!r}): move it into the mix")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, precision, evaluation, logging and checkpointing."""

    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: Precision = "auto"  # auto: bf16 on CUDA; on a CPU the faster of fp32/bf16, measured
    compile: bool = False  # torch.compile the model (falls back to eager with a warning)
    threads: int = 0  # CPU threads for torch (torch.set_num_threads); 0 = torch's default
    # under torchrun: seconds a process waits for the others, to form the process group (the
    # other machines) and at each collective operation, before it fails
    dist_timeout_s: int = 1800
    sdpa_backend: SdpaBackend = "auto"  # auto = torch's choice (short bf16 sequences on a CPU:
    # attnlab.nn.fused_attention's own two matmuls or fp32 flash, where they are faster)
    # under torchrun: ddp, every process holds the whole model; fsdp, each holds a 1/K shard of
    # the weights, gradients and optimizer moments (FSDP2's fully_shard, sharded checkpoints)
    parallel: Parallel = "ddp"
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    max_steps: int = 2000
    batch_size: int = 12  # sequences / sentences per optimizer micro-step, over all processes
    block_size: int = 0  # LM context; 0 = model.max_len
    max_tokens: int = 4096  # translation: padded tokens per micro-batch (replaces batch_size)
    grad_accum: int = 1  # micro-batches per optimizer step
    # muon: Muon (momentum orthogonalised by Newton-Schulz) for the matrices inside the layers,
    # AdamW for the rest (embeddings, head, norms, biases); both at lr, Muon's step scaled to
    # AdamW's size (attnlab.train.optim.MuonAdamW)
    optimizer: OptimizerKind = "adamw"
    lr: float = 1e-3  # peak learning rate (after warmup)
    min_lr: float = 1e-4  # cosine: the final learning rate
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices only (biases, norms and positions are not decayed)
    layer_decay: float = 1.0  # < 1: each layer's lr is this times the one above (fine-tuning)
    schedule: Schedule = "cosine"
    warmup_steps: int = 100
    decay_steps: int = 0  # cosine: steps until min_lr; 0 = max_steps
    grad_clip: float = 1.0  # max global gradient norm; 0 = off
    label_smoothing: float = 0.0
    eval_every: int = 250  # steps between evaluations (and checkpoints); 0 = only at the end
    eval_batches: int = 20  # LM: val batches per evaluation; 0 = the whole split
    eval_batch_size: int = 0  # 0 = batch_size
    final_eval_batches: int = 0  # LM: batches of the final evaluation; 0 = the whole split
    log_every: int = 10  # steps between train-loss log rows (one host sync each)
    patience: int = 0  # stop after this many evaluations without improvement; 0 = never
    # also keep the weights of the last N evaluations (steps/ in the run dir), for
    # `attnlab average RUN --last N`; 0 = only best/ and last/
    keep_checkpoints: int = 0
    # > 0: also an exponential moving average of the weights, updated after every step with
    # this decay (kept in last/'s training state; `attnlab average RUN --ema` makes it a run dir)
    ema_decay: float = 0.0
    best_metric: str = "auto"  # auto | val_loss | ppl | bleu | accuracy | f1
    progress: bool = True  # tqdm progress bar
    tensorboard: bool = True
    samples: int = 0  # LM: samples printed after training
    sample_tokens: int = 300
    temperature: float = 0.8
    top_k: int = 40
    # start from trained weights: a run dir, a Hugging Face model dir or "all-MiniLM-L6-v2"
    # (attnlab.train.finetune); its tokenizer is used and no new one is trained
    init_from: str = ""

    def __post_init__(self) -> None:
        check_types(self)
        check_literal(self, "precision", Precision)
        check_literal(self, "schedule", Schedule)
        check_literal(self, "optimizer", OptimizerKind)
        check_literal(self, "sdpa_backend", SdpaBackend)
        check_literal(self, "parallel", Parallel)
        dev = self.device
        check(dev in ("auto", "cpu", "cuda", "mps") or (dev.startswith("cuda:")
                                                        and dev[5:].isdigit()),
              "device", dev, "one of 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'")
        for name in ("max_steps", "batch_size", "max_tokens", "grad_accum", "log_every",
                     "sample_tokens", "dist_timeout_s"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "a positive integer")
        for name in ("threads", "block_size", "warmup_steps", "decay_steps", "eval_every",
                     "eval_batches", "eval_batch_size", "final_eval_batches", "patience",
                     "keep_checkpoints", "samples", "top_k"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "an integer >= 0")
        for name in ("lr", "eps"):
            v = getattr(self, name)
            check(math.isfinite(v) and v > 0, name, v, "a finite positive float")
        for name in ("min_lr", "weight_decay", "grad_clip", "temperature"):
            v = getattr(self, name)
            check(math.isfinite(v) and v >= 0, name, v, "a finite float >= 0")
        check(0 <= self.seed < 2**63, "seed", self.seed, "an integer in 0..2**63-1")
        for name in ("beta1", "beta2"):
            check(0 <= getattr(self, name) < 1, name, getattr(self, name), "a float in [0, 1)")
        check(0 <= self.label_smoothing < 1, "label_smoothing", self.label_smoothing,
              "a float in [0, 1)")
        check(0 <= self.ema_decay < 1, "ema_decay", self.ema_decay,
              "a float in [0, 1) (0 = no moving average; 0.999 averages over about the last "
              "1,000 steps)")
        check(0 < self.layer_decay <= 1, "layer_decay", self.layer_decay,
              "a float in (0, 1] (1 = the same rate for every layer)")
        check(self.best_metric in METRICS, "best_metric", self.best_metric,
              "one of " + ", ".join(repr(m) for m in METRICS))
        check(self.threads <= 4096, "threads", self.threads, "an integer in 0..4096 (0 = torch's "
              "default)")
        if self.parallel == "fsdp":  # each needs the whole of a tensor that fsdp shards
            for name, value, needs in (("optimizer", self.optimizer, "adamw"),
                                       ("ema_decay", self.ema_decay, 0.0),
                                       ("keep_checkpoints", self.keep_checkpoints, 0)):
                check(value == needs, name, value, f"{needs!r} with parallel='fsdp' (the "
                      "weights are sharded over the processes); or parallel='ddp'")
        if self.schedule == "cosine":
            check(self.min_lr <= self.lr, "min_lr", self.min_lr,
                  f"a float <= lr={self.lr} (cosine decays from lr down to min_lr)")


_CLASSES = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs; ``to_dict`` is what ``config.json`` stores."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    explicit: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The three sections as plain dicts (what a run dir's config.json holds)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """Build from ``{"model": {...}, "data": {...}, "train": {...}}`` (sections optional)."""
        if not isinstance(d, dict):
            raise ConfigError(f"a run config must be a table of sections, got {type(d).__name__}")
        unknown = sorted(set(d) - set(SECTIONS))
        if unknown:
            raise ConfigError(f"unknown config section {unknown[0]!r}; allowed sections: "
                              f"{', '.join(SECTIONS)}")
        d = upgrade(d)
        parts, explicit = {}, set()
        for name in SECTIONS:
            section = d.get(name, {})
            if not isinstance(section, dict):
                raise ConfigError(f"config section {name!r} must be a table, got {section!r}")
            try:
                parts[name] = _build(_CLASSES[name], section, name)
            except ConfigError as e:
                source = (d.get("train") or {}).get("init_from")
                if name != "model" or not source:
                    raise
                # the recipe's [model] keys are checked on their own, before the source fills
                # in the rest: model.n_heads = 12 alone is no divisor of the default d_model
                raise ConfigError(f"{e} (with train.init_from={source}, leave out the [model] "
                                  "keys of the source's shape: they come from the source)"
                                  ) from None
            explicit.update(f"{name}.{k}" for k in section)
        return cls(**parts, explicit=frozenset(explicit))

    @classmethod
    def of_run(cls, run: RunDir) -> RunConfig:
        """The config ``run`` was trained with (its config.json); a value the file should not
        hold is one line that names the file (``runs/lm/config.json: model.d_model=-3 ...``)."""
        try:
            return cls.from_dict(run.read_config())
        except ConfigError as e:
            raise ConfigError(f"{run.config_file}: {e}") from None

    def replace(self, section: str, **changes: Any) -> RunConfig:
        """A copy with some fields of one section changed (not marked explicit)."""
        old = getattr(self, section)
        new = old.replace(**changes) if section == "model" else dataclasses.replace(old, **changes)
        return dataclasses.replace(self, **{section: new})


def upgrade(d: dict[str, Any]) -> dict[str, Any]:
    """Run config dict ``d`` in today's spelling: an old own-files ``data.name``
    (:data:`OLD_OWN_FILES`) becomes ``""``, with the model family it trained where ``d`` sets
    none (a new dict; ``d`` is unchanged)."""
    data, model = d.get("data"), d.get("model", {})
    if not isinstance(data, dict) or data.get("name") not in OLD_OWN_FILES:
        return d
    family = OLD_OWN_FILES[data["name"]]
    out = {**d, "data": {**data, "name": ""}}
    if isinstance(model, dict) and "family" not in model:
        out["model"] = {**model, "family": family}
    return out


def _build(cls: type, values: dict[str, Any], section: str) -> Any:
    """``cls(**values)`` with the keys checked and the section's name in front of the field
    in every error message (``model.d_model=...``)."""
    check_keys(cls, values, section)
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{section}.{e}") from None


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML value (``3``, ``1e-3``, ``true``, ``"x"``, ``[1, 2]``), else
    the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``d`` with ``section.key=value`` assignments applied (a new dict; ``d`` is unchanged)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"--set {item!r} is not allowed: use section.key=value with "
                              f"section one of {', '.join(SECTIONS)} (e.g. train.lr=3e-4)")
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section {section!r} in --set {item!r}; allowed "
                              f"sections: {', '.join(SECTIONS)}")
        check_keys(_CLASSES[section], [name], section)
        out.setdefault(section, {})[name] = parse_value(value.strip())
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    """The tables of a TOML recipe file, with clear errors for a missing or broken file."""
    path = Path(path)
    not_a_folder(path)
    if not path.is_file():
        raise MissingFileError(f"config file {path} does not exist (give a .toml recipe, e.g. "
                               "configs/shakespeare_char.toml, or no config for the demo)")
    try:
        return tomllib.loads(recipe_text(path))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


# The comments of a recipe: (section, key) -> (the comment lines above the key, the comment
# at the end of its line); ("", "") holds the lines above the first table, (section, "") those
# of a table that no key follows.
Comments = dict[tuple[str, str], tuple[list[str], str]]


def config_toml(config: dict[str, dict[str, Any]], comments: Comments | None = None,
                unset: dict[str, str] | None = None) -> str:
    """A run config (``RunConfig.to_dict()``, or some of its keys) as a TOML recipe that
    ``attnlab train FILE`` reads back to the same config, written by tomli_w, with a recipe's
    ``comments`` (:func:`recipe_comments`) beside their keys. TOML has no null: an unset value
    is a comment (``# key = (unset)``), and so left at its default; inside a table it is left
    out. ``unset`` names more keys (``section.key``) written as such a comment, with why."""
    comments, unset = comments or {}, unset or {}
    parts = comments.get(("", ""), ([], ""))[0][:]
    parts = ["\n".join(parts)] if parts else []
    for section, values in config.items():
        lines, tables = [f"[{section}]", *comments.get((section, ""), ([], ""))[0]], {}
        for key, value in values.items():
            above, after = comments.get((section, key), ([], ""))
            lines += above
            if f"{section}.{key}" in unset:
                line = f"# {key} = ({unset[f'{section}.{key}']})"
            elif value is None:
                line = f"# {key} = (unset)"
            elif isinstance(value, dict):  # a sub-table, [section.key]: after the plain keys
                tables[key] = _without_none(value)
                continue
            else:
                line = tomli_w.dumps({key: _without_none(value)}).rstrip("\n")
            lines.append(f"{line}  {after}" if after else line)
        if tables:
            lines += ["", tomli_w.dumps({section: tables}).rstrip("\n")]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def recipe_comments(text: str) -> Comments:
    """The comments of recipe ``text`` by the key they stand beside (:data:`Comments`): a
    block of comment lines belongs to the key below it in the same table (none below: to the
    table), a comment after a value to that key."""
    out: Comments = {}
    section, block = "", []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped)
        elif stripped.startswith("["):
            if block:
                out.setdefault((section, ""), ([], ""))[0].extend(block)
            section, block = stripped.strip("[] ").split("]")[0].strip(), []
        elif "=" in stripped and stripped[0].isalnum():
            key = stripped.partition("=")[0].strip()
            out[(section, key)] = (block, _end_comment(stripped))
            block = []
        elif not stripped and block and section == "":
            out.setdefault(("", ""), ([], ""))[0].extend([*block, ""])
            block = []
    if block:
        out.setdefault((section, ""), ([], ""))[0].extend(block)
    if ("", "") in out:  # the file's own comments: no blank line at their end
        lines = out[("", "")][0]
        while lines and not lines[-1]:
            lines.pop()
    return out


def _end_comment(line: str) -> str:
    """The comment at the end of TOML ``line`` (``# ...``; a ``#`` inside a string is none),
    or ``""``."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == "\\" and quote == '"':
                continue
            if ch == quote and line[i - 1] != "\\":
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[i:].strip()
    return ""


def toml_value(value: Any) -> str:
    """``value`` (not a table) as a TOML value, which :func:`parse_value` (``--set``) reads
    back."""
    return tomli_w.dumps({"v": _without_none(value)}).removeprefix("v = ").rstrip("\n")


def _without_none(value: Any) -> Any:
    """``value`` with the None entries of its tables (at any depth) left out."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(v) for v in value]
    return value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> RunConfig:
    """A recipe file (or ``base``, or the built-in demo when both are None) plus overrides."""
    d = read_toml(path) if path is not None else (DEMO if base is None else base)
    return RunConfig.from_dict(apply_overrides(d, overrides or []))


# `attnlab train` with no config: a small character-level LM on the pydoc topics that every
# Python install has, minutes on 2 CPU cores (docs/recipes.md), then a few samples.
DEMO: dict[str, dict[str, Any]] = {
    "model": {"d_model": 128, "n_heads": 4, "n_layers": 4, "max_len": 128,
              "dropout": 0.0, "norm": "pre", "ffn": "gelu", "pos": "learned", "bias": False,
              "scale_embeddings": False, "init_std": 0.06, "init_residual_scale": False},
    # no data.name: the embedded corpus, or the files --set names (data.path, ...); char, the
    # default tokenizer (a prepared data.path brings its own)
    "data": {},
    "train": {"max_steps": 1200, "batch_size": 32, "lr": 2e-3, "min_lr": 2e-4,
              "warmup_steps": 100, "eval_every": 400, "eval_batches": 20, "samples": 3,
              "sample_tokens": 300},
}
