"""What every task shares: the :class:`Task` interface, which is what the trainer calls, the
:class:`DataSet` a task declares for each data set it trains, and the helpers that read a run
config.

Everything that varies by data set (its name, its files, the model family, what evaluation
can do) is declared once, on the task class; :mod:`attnlab.tasks.registry` enters the classes
into the one registry. Tasks read the run config but never import the training code (the
trainer imports them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import ConfigError, LossOptions, ModelConfig
from ..data import DatasetInfo, fetch
from ..errors import UsageError
from ..interpret import Batch
from ..nn import counted
from ..run_config import DataConfig, RunConfig
from ..tokenizers import MASK, SPECIALS, BPETokenizer, CharTokenizer, GPT2Tokenizer, Tokenizer

Amp = Callable[[], contextlib.AbstractContextManager]
# Told, as evaluation goes, how many more batches are done (a progress bar's ``update``; what
# it returns is ignored).
Progress = Callable[[int], object]


def no_progress(batches: int) -> None:
    """The :data:`Progress` of an evaluation that nobody watches."""


@dataclass(frozen=True)
class DataSet:
    """A data set that ``data.name`` names, as the task that trains it declares it.

    ``files`` maps a data key to the file of the download that the key reads when the config
    leaves it unset (``{"path": "input.txt"}``): ``data.path`` given, the user's file wins.
    """

    name: str
    about: str  # one line: what it holds
    download: DatasetInfo | None = None  # what `attnlab data fetch NAME` downloads and checks
    files: dict[str, str] = field(default_factory=dict)
    default: bool = False  # the data set of data.name = "" when the config names no file

    @classmethod
    def fetched(cls, info: DatasetInfo, **files: str) -> DataSet:
        """The data set of a download: its name and description, ``files`` as above."""
        return cls(info.name, info.description, info, files)


def train_tokenizer(rc: RunConfig, texts: list[str], mask: bool = False,
                    specials: bool = True) -> Tokenizer:
    """A new tokenizer of kind ``data.tokenizer`` for ``texts``; ``mask`` adds ``<mask>``;
    ``specials`` False: a character vocabulary without ``<pad>``, ``<bos>``, ``<eos>`` (a
    language model's). ``gpt2`` is GPT-2's own vocabulary (nothing trained), for training a
    model from scratch on the tokens GPT-2 reads."""
    d = rc.data
    if d.tokenizer == "gpt2":
        if mask:
            raise ConfigError("data.tokenizer='gpt2' has no <mask> token for masked-LM "
                              "pretraining; allowed: 'char', 'bpe'")
        return GPT2Tokenizer.from_package()
    if d.tokenizer == "char":
        extra = SPECIALS + ((MASK,) if mask else ()) if specials else ()
        return CharTokenizer.from_text("".join(texts), extra)
    return BPETokenizer.train(texts, d.vocab_size, d.pre_tokenizer, mask=mask)


class Task:
    """A kind of data turned into what the trainer needs: ``tokenizer`` (trained on the
    training data, or a resumed run's), ``model_config`` (the data's vocabulary size, pad id
    and family filled in where the user set none: :meth:`resolve_model`), batches, the loss,
    evaluation and the position in the data.

    A task declares, on its class, all that varies with it: the data sets it trains
    (:attr:`datasets`, entered into the registry by :func:`attnlab.tasks.register`), its
    model family, whether it trains on the user's own files and which ones are its kind
    (:meth:`claims_files`), what evaluation can do (:attr:`strided`, :attr:`beam_search`) and
    the model it builds from the config alone (:meth:`model_from_config`). Subclasses set the
    class attributes and fill in the methods."""

    family = ""  # the model family the task trains
    kind = ""  # what the task is, for messages: "language-model", "translation", ...
    datasets: tuple[DataSet, ...] = ()  # the data sets it trains, by data.name
    # True: with data.name left out, it trains on the user's files (the paths decide which
    # task: claims_files; model.family, where set, picks the task of that family)
    own_files = False
    reads_mix = False  # data.mix (several corpora, drawn by weight) is its kind of data
    # the task that pretrains an encoder on this task's data with model.head = "mlm"
    masked_lm: type[Task] | None = None
    # what `attnlab eval` may change (set_eval_options): overlapping windows (--stride) for a
    # perplexity, beam search (--beam) for decoded outputs
    strided = False
    beam_search = False
    # The data keys `attnlab eval --data` points at other files (prefixed with the split);
    # empty for tasks that make their own data.
    eval_data_keys: tuple[str, ...] = ()
    # The [data] keys the task reads (`train --print-config` prints those alone), and of the
    # [train] keys that only some tasks read (run_config.TASK_TRAIN_KEYS), those it reads.
    data_keys: tuple[str, ...] = ("name", "cache_dir")
    train_keys: tuple[str, ...] = ()
    uses_tokenizer = True  # False: the task makes token ids itself (no tokenizer.json)
    metric_names: tuple[str, ...] = ()
    default_metric = "val_loss"
    sampled_eval = False  # True: evaluate() takes max_batches samples (LM), else the whole split
    tokenizer: Tokenizer | None = None
    model_config: ModelConfig

    def __init__(self, rc: RunConfig):
        self.rc = rc
        # the declared data set of data.name; None: the user's own files
        self.dataset = next((s for s in self.datasets if s.name == rc.data.name), None)
        self.generator = torch.Generator().manual_seed(rc.train.seed)

    # ---- what the class declares, read without the data ----------------------------------------
    @classmethod
    def claims_files(cls, d: DataConfig) -> bool:
        """Are the paths of ``d`` this task's kind of file (a labelled .tsv, translation
        pairs)? Asked of the :attr:`own_files` tasks when ``data.name`` is left out; the task
        of the default data set takes the files no task claims."""
        return False

    @classmethod
    def model_from_config(cls, rc: RunConfig) -> tuple[ModelConfig, str]:
        """The model config training would build, from the config alone (no data read), and
        where its vocabulary size comes from, in words (``attnlab info RECIPE``)."""
        d, changes = rc.data, {"family": cls.family}
        if "model.vocab_size" in rc.explicit:
            why = "model.vocab_size of the recipe"
        elif d.tokenizer == "bpe":
            changes["vocab_size"] = d.vocab_size
            why = ("data.vocab_size, the size of the BPE tokenizer training learns; a small "
                   "training text can give a few tokens fewer")
        else:
            why = (f"assumed: a {d.tokenizer} tokenizer takes its size from the training "
                   "text, unknown until training; this is model.vocab_size's default")
        return rc.model.replace(**changes), why

    @classmethod
    def check_eval_options(cls, beam: int = 1, stride: int | None = None,
                           length_penalty: float | None = None) -> None:
        """Refuse, before any data is read, an evaluation option this task cannot do (None:
        the option not given)."""
        if beam != 1 and not cls.beam_search:
            raise UsageError(f"--beam is for translation runs (BLEU); a {cls.kind} run is "
                             "scored without beam search (leave --beam out)")
        if length_penalty is not None and not cls.beam_search:
            raise UsageError(f"--length-penalty is for beam search of translation runs; a "
                             f"{cls.kind} run is scored without it (leave --length-penalty out)")
        if stride is not None and not cls.strided:
            raise UsageError(f"--stride is for language-model runs (perplexity); a {cls.kind} "
                             "run is scored without it (leave --stride out)")

    def set_eval_options(self, beam: int = 1, length_penalty: float | None = None,
                         stride: int | None = None) -> dict[str, Any]:
        """Evaluate with these options (``attnlab eval``; None: not given, the default): beam
        search of width ``beam`` (:attr:`beam_search`), windows every ``stride`` tokens
        (:attr:`strided`); returns what they mean for the results, in words (none here)."""
        self.check_eval_options(beam, stride, length_penalty)
        return {}

    # ---- the config, read for the task ----------------------------------------------------------
    def data_words(self) -> str:
        """The data, as a message names it: ``data.name='sst2'``, or ``your files`` (of this
        kind of task)."""
        d = self.rc.data
        return f"data.name={d.name!r}" if d.name else f"{self.kind} of your own files"

    def data_file(self, key: str) -> Path:
        """``data.<key>`` if set, else the data set's file for ``key`` (downloaded if
        needed)."""
        d = self.rc.data
        if getattr(d, key):
            return Path(getattr(d, key))
        fetched = self.dataset.files.get(key) if self.dataset else None
        if fetched is None or self.dataset.download is None:
            raise ConfigError(f"{self.data_words()} needs data.{key}: set it with --set "
                              f"data.{key}=/path/to/file")
        return fetch(self.dataset.download, d.cache_dir or None) / fetched

    def resolve_model(self, **derived: Any) -> ModelConfig:
        """``rc.model`` with the task's family and the data-derived values filled in where
        the user gave none."""
        rc = self.rc
        m, changes = rc.model, {}
        if "model.family" in rc.explicit and m.family != self.family:
            raise ConfigError(f"model.family={m.family!r} does not fit {self.data_words()}, "
                              f"which trains family {self.family!r}; allowed: {self.family!r} "
                              "(or leave model.family out)")
        changes["family"] = self.family
        for key, value in derived.items():
            if f"model.{key}" not in rc.explicit:
                changes[key] = value
        need = derived.get("vocab_size", 0)  # (the target side reads the same tokenizer)
        for key in ("vocab_size", "tgt_vocab_size"):
            given = getattr(m, key)
            if f"model.{key}" in rc.explicit and given is not None and given < need:
                raise ConfigError(
                    f"model.{key}={given} is too small for the data: its token ids go up to "
                    f"{need - 1}, which would be out of range; allowed: >= {need} (or leave "
                    f"model.{key} out to take the tokenizer's size)")
        try:
            return m.replace(**changes)
        except ConfigError as e:
            raise ConfigError(f"model.{e}") from None

    def next_batch(self) -> tuple[Tensor, ...]:
        """The next global training micro-batch (CPU tensors; its rows are split over the
        processes)."""
        raise NotImplementedError

    def loss_sum(self, model: nn.Module, batch: tuple[Tensor, ...],
                 label_smoothing: float = 0.0, *, loss_only: bool = True) -> Tensor:
        """The loss of ``batch`` summed over its :meth:`count` targets, so the trainer can
        normalise over accumulated micro-batches and processes: the model's own loss of
        ``model(*batch)`` (every task's batch is the forward's inputs, then its targets).

        ``loss_only``: the model's path that does not build the logits (training's: the
        ``head_loss`` slot); False: the loss of the whole logits (an LM's evaluation)."""
        return model(*batch, loss=LossOptions(label_smoothing, "sum", loss_only))[1]

    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0, progress: Progress | None = None) -> dict[str, float]:
        """``val_loss`` and the task's metrics (:attr:`metric_names`) of ``model``.

        Args:
            model: the model, in eval mode.
            split: ``val`` or ``test``.
            device: where the batches go.
            amp: entered around each forward (autocast and attention kernels).
            max_batches: with :attr:`sampled_eval`, that many sampled batches; 0: the whole
                split (tasks without it always take the whole split).
            progress: told after each batch (or group of batches) how many are done.
        """
        raise NotImplementedError

    def ablation_batch(self, split: str, batches: int) -> Batch:
        """``batches`` evaluation batches of ``split`` as one ``attnlab.interpret.Batch``,
        whose loss ``attnlab interpret ablate --split`` measures without each head."""
        raise UsageError(f"--split is for language-model and classifier runs; this is a "
                         f"{self.kind} run: give --text or --file")

    def count(self, batch: tuple[Tensor, ...]) -> Tensor:
        """Number of targets ``loss_sum`` sums over (a tensor: no host sync)."""
        target = batch[-1]
        if target.dim() == 1:
            return torch.tensor(float(target.numel()), device=target.device)
        return counted(target, self.model_config.pad_id).sum().float()

    def state_dict(self) -> dict[str, Any]:
        """The position in the training data (a resume goes on from it)."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go back to the position of :meth:`state_dict`."""
        self.generator.set_state(state["generator"])

    def check_data(self) -> None:
        """Read the data and build the training batches now: a wrong file or setting fails
        before anything is written, and a bad validation file before step 1, not at the first
        evaluation (after ``eval_every`` steps). Tasks that read files fill it in."""

    def eval_batch_size(self) -> int:
        """Rows per evaluation batch: ``train.eval_batch_size``, else the training one."""
        t = self.rc.train
        return t.eval_batch_size or t.batch_size


class EpochTask(Task):
    """A task that trains through epochs of a resumable batch iterator over its data
    (classification, translation): built on first use by ``_make_train_batches``, a new epoch
    started when one ends, and its position (epoch, batch) the task's training state."""

    def __init__(self, rc: RunConfig):
        super().__init__(rc)
        self._batches = None  # the iterator (the data's _EpochBatches), made on first use
        self._iter = None

    def _make_train_batches(self):
        raise NotImplementedError

    def _train_batches(self):
        if self._batches is None:
            self._batches = self._make_train_batches()
        return self._batches

    def next_batch(self) -> tuple[Tensor, ...]:
        if self._iter is None:
            self._iter = iter(self._train_batches())
        try:
            return next(self._iter)
        except StopIteration:  # the epoch is over: the next one
            self._iter = iter(self._train_batches())
            return next(self._iter)

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self._train_batches().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._train_batches().load_state_dict(state["batches"])
        self._iter = None
