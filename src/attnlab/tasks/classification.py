"""Sentence classification from a labelled TSV (SST-2): [CLS] + tokens -> class."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ConfigError
from ..data import ClassificationBatches, read_labelled_tsv, split_holdout, split_sentences
from ..metrics import accuracy, f1, macro_f1
from ..tokenizers import Tokenizer
from .base import Amp, Task, data_file, resolve_model, train_tokenizer

if TYPE_CHECKING:  # annotations only: the training config imports the task table
    from ..train.config import RunConfig


class ClassifyTask(Task):
    """Sentence classification: cross-entropy over the classes; accuracy and F1."""

    family = "encoder"
    kind = "classification"
    eval_data_keys = ("path",)
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
                    split = split_sentences if d.holdout_unit == "sentence" else split_holdout
                    self._items["train"], self._items["val"] = split(
                        items, d.holdout, self.rc.train.seed)
            else:
                raise ConfigError(f"unknown split {name!r}; allowed: train, val, test")
        return self._items[name]

    def batches(self, name: str, batch_size: int, shuffle: bool) -> ClassificationBatches:
        tok = self.tokenizer
        cls_id = tok.bos_id if self.model_config.pools_first_token else None
        examples = [(tok.encode(s), y) for s, y in self.items(name)]
        return ClassificationBatches(examples, batch_size, tok.pad_id, cls_id, self.max_len,
                                     self.rc.train.seed, shuffle, bucket=self.rc.data.bucket)

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
                logits, _ = model(ids)  # (B, C)
            total += float(F.cross_entropy(logits.float(), y, reduction="sum"))
            preds += logits.argmax(-1).tolist()
            labels += y.tolist()
        score = f1(preds, labels) if self.n_classes == 2 else macro_f1(preds, labels)
        return {"val_loss": total / len(labels), "accuracy": accuracy(preds, labels), "f1": score}
