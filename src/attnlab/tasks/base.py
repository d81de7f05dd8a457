"""What every task shares: the :class:`Task` interface, which is what the trainer calls, and
the helpers that read a run config.

Tasks read the run config but never import the training code (the trainer imports them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import ConfigError, LossOptions, ModelConfig
from ..data import fetch
from ..nn import counted
from ..run_config import RunConfig
from ..tokenizers import MASK, SPECIALS, BPETokenizer, CharTokenizer, GPT2Tokenizer, Tokenizer

Amp = Callable[[], contextlib.AbstractContextManager]
# Told, as evaluation goes, how many more batches are done (a progress bar's ``update``; what
# it returns is ignored).
Progress = Callable[[int], object]


def no_progress(batches: int) -> None:
    """The :data:`Progress` of an evaluation that nobody watches."""


def data_file(rc: RunConfig, key: str, fetched: str | None) -> Path:
    """``data.<key>`` if set, else file ``fetched`` of the data set (downloaded if needed)."""
    d = rc.data
    if getattr(d, key):
        return Path(getattr(d, key))
    if fetched is None:
        raise ConfigError(f"data.name={d.name!r} needs data.{key}: set it with --set "
                          f"data.{key}=/path/to/file")
    return fetch(d.name, d.cache_dir or None) / fetched


def resolve_model(rc: RunConfig, **derived: Any) -> ModelConfig:
    """``rc.model`` with the data-derived values filled in where the user gave none."""
    m, changes = rc.model, {}
    family = rc.data.family
    if "model.family" in rc.explicit and m.family != family:
        raise ConfigError(f"model.family={m.family!r} does not fit data.name={rc.data.name!r}, "
                          f"which trains family {family!r}; allowed: {family!r} (or leave "
                          "model.family out)")
    changes["family"] = family
    for key, value in derived.items():
        if f"model.{key}" not in rc.explicit:
            changes[key] = value
        elif key == "vocab_size" and getattr(m, key) < value:
            raise ConfigError(
                f"model.vocab_size={m.vocab_size} is too small for the data: its token ids go "
                f"up to {value - 1}, which would be out of range; allowed: >= {value} (or "
                "leave model.vocab_size out to take the tokenizer's size)")
    try:
        return m.replace(**changes)
    except ConfigError as e:
        raise ConfigError(f"model.{e}") from None


def train_tokenizer(rc: RunConfig, texts: list[str], mask: bool = False) -> Tokenizer:
    """A new tokenizer of kind ``data.tokenizer`` for ``texts``; ``mask`` adds ``<mask>``.
    ``gpt2`` is GPT-2's own vocabulary (nothing trained), for training a model from scratch on
    the tokens GPT-2 reads."""
    d = rc.data
    if d.tokenizer == "gpt2":
        if mask:
            raise ConfigError("data.tokenizer='gpt2' has no <mask> token for masked-LM "
                              "pretraining; allowed: 'char', 'bpe'")
        return GPT2Tokenizer.from_package()
    if d.tokenizer == "char":
        specials = () if d.family == "decoder" else SPECIALS + ((MASK,) if mask else ())
        return CharTokenizer.from_text("".join(texts), specials)
    return BPETokenizer.train(texts, d.vocab_size, d.pre_tokenizer, mask=mask)


class Task:
    """A kind of data turned into what the trainer needs: ``tokenizer`` (trained on the
    training data, or a resumed run's), ``model_config`` (the data's vocabulary size, pad id
    and family filled in where the user set none: :func:`resolve_model`), batches, the loss,
    evaluation and the position in the data. Subclasses set the class attributes and fill in
    the methods."""

    family = ""  # the model family the task trains
    kind = ""  # what the task is, for messages: "language-model", "translation", ...
    # The data keys `attnlab eval --data` points at other files (prefixed with the split);
    # empty for tasks that make their own data.
    eval_data_keys: tuple[str, ...] = ()
    uses_tokenizer = True  # False: the task makes token ids itself (no tokenizer.json)
    metric_names: tuple[str, ...] = ()
    default_metric = "val_loss"
    sampled_eval = False  # True: evaluate() takes max_batches samples (LM), else the whole split
    tokenizer: Tokenizer | None = None
    model_config: ModelConfig

    def __init__(self, rc: RunConfig):
        self.rc = rc
        self.generator = torch.Generator().manual_seed(rc.train.seed)

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
