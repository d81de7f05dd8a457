"""Per-family glue between the data and the training loop: tokenizer, batches, loss and metric.

A task turns a :class:`~attnlab.train.config.RunConfig` into what the trainer needs:

* ``tokenizer`` (trained on the training data, or the run's saved one when resuming),
* ``resolve_model()``: the model config with what the data decides filled in (vocabulary
  size, pad id, family, ...) unless the user set it,
* ``next_batch()``: the next global training micro-batch (CPU tensors, rows over processes),
* ``count(batch)`` and ``loss_sum(model, batch, label_smoothing)``: the summed loss and the
  number of targets it sums over, so the trainer can normalise over accumulated micro-batches,
* ``evaluate(model, split, ...)``: ``val_loss`` plus the task metric,
* ``state_dict()`` / ``load_state_dict()``: the position in the training data.

Language modelling and classification live here; translation and the synthetic seq2seq tasks
in :mod:`attnlab.train.seq2seq`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ConfigError, ModelConfig
from ..data import (
    ClassificationBatches,
    LMData,
    embedded_corpus,
    fetch,
    read_labelled_tsv,
    read_text,
    split_holdout,
)
from ..evaluate import accuracy, f1, macro_f1, perplexity
from ..models import token_loss
from ..tokenizers import BPETokenizer, CharTokenizer, Tokenizer
from .config import RunConfig

Amp = Callable[[], contextlib.AbstractContextManager]
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


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


def train_tokenizer(rc: RunConfig, texts: list[str]) -> Tokenizer:
    d = rc.data
    if d.tokenizer == "char":
        specials = () if d.family == "decoder" else SPECIALS
        return CharTokenizer.from_text("".join(texts), specials)
    return BPETokenizer.train(texts, d.vocab_size, d.pre_tokenizer)


class Task:
    """Shared plumbing; subclasses set the class attributes and fill in the methods."""

    metric_names: tuple[str, ...] = ()
    default_metric = "val_loss"
    sampled_eval = False  # True: evaluate() takes max_batches samples (LM), else the whole split
    tokenizer: Tokenizer | None = None

    def __init__(self, rc: RunConfig):
        self.rc = rc
        self.generator = torch.Generator().manual_seed(rc.train.seed)

    def count(self, batch: tuple[Tensor, ...]) -> Tensor:
        """Number of targets ``loss_sum`` sums over (a tensor: no host sync)."""
        target = batch[-1]
        pad = self.model_config.pad_id
        if pad is None or target.dim() == 1:
            return torch.tensor(float(target.numel()), device=target.device)
        return (target != pad).sum().float()

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def eval_batch_size(self) -> int:
        t = self.rc.train
        return t.eval_batch_size or t.batch_size


class LMTask(Task):
    """Next-token prediction on a text: nanoGPT-style random windows of ``block_size`` tokens."""

    metric_names = ("ppl",)
    sampled_eval = True

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        self._text: str | None = None
        self._splits: dict[str, Tensor] = {}
        self.tokenizer = tokenizer or train_tokenizer(rc, [self.text])
        self.model_config = resolve_model(rc, vocab_size=self.tokenizer.vocab_size,
                                          pad_id=self.tokenizer.pad_id)
        self.block = rc.train.block_size or self.model_config.max_len
        if self.block > self.model_config.max_len:
            raise ConfigError(f"train.block_size={self.block} is longer than model.max_len="
                              f"{self.model_config.max_len}; allowed: <= model.max_len")

    @property
    def text(self) -> str:
        if self._text is None:
            d = self.rc.data
            if d.path:
                self._text = read_text(d.path, "training text file")
            elif d.name == "embedded":
                self._text = embedded_corpus()
            elif d.name == "shakespeare":
                self._text = read_text(data_file(self.rc, "path", "input.txt"))
            else:
                raise ConfigError(f"data.name={d.name!r} needs data.path (a UTF-8 text file)")
        return self._text

    def split(self, name: str) -> Tensor:
        if name not in self._splits:
            d, tok = self.rc.data, self.tokenizer
            if name == "test" and not d.test_path:
                raise ConfigError("this run has no test split: pass --data FILE (or set "
                                  "data.test_path)")
            if name in ("val", "test") and getattr(d, f"{name}_path"):
                ids = tok.encode(read_text(getattr(d, f"{name}_path"), f"{name} text file"))
                self._splits[name] = torch.tensor(ids, dtype=torch.long)
            elif name in ("train", "val"):
                ids = torch.tensor(tok.encode(self.text), dtype=torch.long)
                if d.val_path:
                    self._splits["train"] = ids
                else:
                    lm = LMData(ids, d.train_frac)
                    self._splits["train"], self._splits["val"] = lm.train, lm.val
            else:
                raise ConfigError(f"unknown split {name!r}; allowed: train, val, test")
        data = self._splits[name]
        if len(data) < self.block + 1:
            raise ConfigError(f"the {name} split has {len(data)} tokens, fewer than "
                              f"train.block_size + 1 = {self.block + 1}; use more text or a "
                              "smaller block_size")
        return data

    def _windows(self, data: Tensor, starts: list[int]) -> tuple[Tensor, Tensor]:
        x = torch.stack([data[i:i + self.block] for i in starts])  # (B, T)
        y = torch.stack([data[i + 1:i + 1 + self.block] for i in starts])  # (B, T)
        return x, y

    def next_batch(self) -> tuple[Tensor, Tensor]:
        data = self.split("train")
        ix = torch.randint(len(data) - self.block, (self.rc.train.batch_size,),
                           generator=self.generator)
        return self._windows(data, ix.tolist())

    def loss_sum(self, model: nn.Module, batch, label_smoothing: float = 0.0) -> Tensor:
        x, y = batch
        logits, _ = model(x)  # (B, T, V)
        return token_loss(logits, y, self.model_config.pad_id, label_smoothing, "sum")

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0) -> dict[str, float]:
        """Mean loss over ``max_batches`` random windows (the same ones every time), or over
        every non-overlapping window of the split when ``max_batches`` is 0."""
        data, bs = self.split(split), self.eval_batch_size()
        if max_batches:
            gen = torch.Generator().manual_seed(self.rc.train.seed + 7919)
            starts = torch.randint(len(data) - self.block, (max_batches * bs,),
                                   generator=gen).tolist()
        else:
            starts = list(range(0, len(data) - self.block, self.block))
        total = torch.zeros((), dtype=torch.float64, device=device)
        n = 0.0
        for i in range(0, len(starts), bs):
            x, y = (t.to(device) for t in self._windows(data, starts[i:i + bs]))
            with amp():
                total += self.loss_sum(model, (x, y)).double()
            n += float(self.count((x, y)))
        loss = float(total) / max(n, 1)
        return {"val_loss": loss, "ppl": perplexity(loss)}


class ClassifyTask(Task):
    """Sentence classification from a labelled TSV (SST-2): [CLS] + tokens -> class."""

    metric_names = ("accuracy", "f1")
    default_metric = "accuracy"

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        d = rc.data
        n_classes = rc.model.n_classes
        if d.label_names and "model.n_classes" not in rc.explicit:
            n_classes = len(d.label_names)
        self.n_classes = n_classes
        self._items: dict[str, list[tuple[str, int]]] = {}
        self.tokenizer = tokenizer or train_tokenizer(rc, [s for s, _ in self.items("train")])
        tok = self.tokenizer
        if tok.pad_id is None or tok.bos_id is None:
            raise ConfigError("classification needs a tokenizer with <pad> and <bos> ([CLS])")
        self.model_config = resolve_model(rc, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                                          n_classes=n_classes)
        self.max_len = min(d.max_len or self.model_config.max_len, self.model_config.max_len)
        self._batches: ClassificationBatches | None = None
        self._iter = None

    def _read(self, path: Path) -> list[tuple[str, int]]:
        return read_labelled_tsv(path, num_labels=self.n_classes)

    def items(self, name: str) -> list[tuple[str, int]]:
        if name not in self._items:
            d = self.rc.data
            if name == "test":
                if not d.test_path:
                    raise ConfigError("this run has no test split: pass --data FILE.tsv (or set "
                                      "data.test_path)")
                self._items["test"] = self._read(Path(d.test_path))
            elif name == "val" and d.val_path:
                self._items["val"] = self._read(Path(d.val_path))
            elif name in ("train", "val"):
                items = self._read(data_file(self.rc, "path", "train.tsv"))
                if d.val_path:
                    self._items["train"] = items
                else:
                    self._items["train"], self._items["val"] = split_holdout(
                        items, d.holdout, self.rc.train.seed)
            else:
                raise ConfigError(f"unknown split {name!r}; allowed: train, val, test")
        return self._items[name]

    def batches(self, name: str, batch_size: int, shuffle: bool) -> ClassificationBatches:
        tok = self.tokenizer
        cls_id = tok.bos_id if self.model_config.pooling == "cls" else None
        examples = [(tok.encode(s), y) for s, y in self.items(name)]
        return ClassificationBatches(examples, batch_size, tok.pad_id, cls_id, self.max_len,
                                     self.rc.train.seed, shuffle)

    def next_batch(self) -> tuple[Tensor, Tensor]:
        if self._batches is None:
            self._batches = self.batches("train", self.rc.train.batch_size, True)
        if self._iter is None:
            self._iter = iter(self._batches)
        try:
            return next(self._iter)
        except StopIteration:
            self._iter = iter(self._batches)
            return next(self._iter)

    def state_dict(self) -> dict[str, Any]:
        if self._batches is None:
            self._batches = self.batches("train", self.rc.train.batch_size, True)
        return {"batches": self._batches.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._batches = self.batches("train", self.rc.train.batch_size, True)
        self._batches.load_state_dict(state["batches"])
        self._iter = None

    def loss_sum(self, model: nn.Module, batch, label_smoothing: float = 0.0) -> Tensor:
        ids, labels = batch
        logits, _ = model(ids)  # (B, C); the mask is ids != pad_id
        return F.cross_entropy(logits.float(), labels, reduction="sum",
                               label_smoothing=label_smoothing)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0) -> dict[str, float]:
        total, preds, labels = 0.0, [], []
        for ids, y in self.batches(split, self.eval_batch_size(), shuffle=False):
            ids, y = ids.to(device), y.to(device)
            with amp():
                logits, _ = model(ids)
            total += float(F.cross_entropy(logits.float(), y, reduction="sum"))
            preds += logits.argmax(-1).tolist()
            labels += y.tolist()
        score = f1(preds, labels) if self.n_classes == 2 else macro_f1(preds, labels)
        return {"val_loss": total / len(labels), "accuracy": accuracy(preds, labels), "f1": score}


def build_task(rc: RunConfig, tokenizer: Tokenizer | None = None) -> Task:
    """The task for ``rc.data.name``; ``tokenizer`` (a resumed run's) skips training one."""
    family = rc.data.family
    if family == "decoder":
        return LMTask(rc, tokenizer)
    if family == "encoder":
        return ClassifyTask(rc, tokenizer)
    from .seq2seq import SyntheticTask, TranslationTask

    if rc.data.name in ("copy", "reverse", "sort"):
        return SyntheticTask(rc)
    return TranslationTask(rc, tokenizer)
