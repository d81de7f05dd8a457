"""Sentence classification from a labelled TSV (SST-2): [CLS] + tokens -> class; and BERT's
masked-language-model pretraining on the same sentences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import ConfigError, LossOptions, ModelConfig
from ..data import (
    ClassificationBatches,
    DatasetInfo,
    RemoteFile,
    read_labelled_tsv,
    split_holdout,
    split_sentences,
    whole_sentences,
)
from ..decoding.classify import cls_id
from ..interpret import Batch
from ..metrics import accuracy, f1, macro_f1
from ..nn import IGNORE_INDEX
from ..run_config import DataConfig, RunConfig
from ..tokenizers import Tokenizer
from .base import Amp, DataSet, EpochTask, Progress, no_progress, train_tokenizer
from .registry import register

# GLUE publishes no checksum of SST-2's train.tsv, and the copies that can be hashed have
# another layout (label first, CRLF): the file is checked by parsing it instead (tsv_rows;
# either layout passes)
SST2 = DatasetInfo(
    "sst2", "SST-2 (GLUE) sentiment training sentences, 67,349 rows",
    (RemoteFile("train.tsv", "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip", None,
                "zip", "SST-2/train.tsv", tsv_rows=67_349),),
    "sst2", "--set data.path=/path/to/train.tsv")

SUM = LossOptions(reduction="sum")  # evaluation: sums over the targets, divided at the end


@register
class ClassifyTask(EpochTask):
    """Sentence classification: cross-entropy over the classes; accuracy and F1."""

    family = "encoder"
    kind = "classification"
    datasets = (DataSet.fetched(SST2, path="train.tsv"),)
    own_files = True  # a labelled .tsv in data.path
    eval_data_keys = ("path",)
    data_keys = ("name", "path", "val_path", "test_path", "cache_dir", "tokenizer", "vocab_size",
                 "pre_tokenizer", "holdout", "holdout_unit", "split_seed", "max_len", "bucket",
                 "label_names")
    train_keys = ("batch_size",)
    metric_names = ("accuracy", "f1")
    default_metric = "accuracy"
    head = "classify"  # the model's ModelConfig.head

    @classmethod
    def claims_files(cls, d: DataConfig) -> bool:
        return Path(d.path).suffix.lower() == ".tsv"

    @classmethod
    def model_from_config(cls, rc: RunConfig) -> tuple[ModelConfig, str]:
        cfg, why = super().model_from_config(rc)
        if rc.data.label_names and "model.n_classes" not in rc.explicit:
            cfg = cfg.replace(n_classes=len(rc.data.label_names))
        return cfg, why

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        d = rc.data
        n_classes = rc.model.n_classes
        if d.label_names and "model.n_classes" not in rc.explicit:
            n_classes = len(d.label_names)
        elif d.label_names and len(d.label_names) != n_classes:
            raise ConfigError(f"data.label_names has {len(d.label_names)} names but "
                              f"model.n_classes={n_classes}: give one name per class (or leave "
                              "model.n_classes out: the names set it)")
        self.n_classes = n_classes
        self._items: dict[str, list[tuple[str, int]]] = {}
        mlm = self.head == "mlm"
        self.tokenizer = tokenizer or train_tokenizer(rc, [s for s, _ in self.items("train")],
                                                      mask=mlm)
        tok = self.tokenizer
        if tok.pad_id is None or tok.bos_id is None or (mlm and tok.mask_id is None):
            raise ConfigError(f"{self.kind} needs a tokenizer with <pad> and <bos> ([CLS])"
                              + (" and <mask> ([MASK])" if mlm else ""))
        self.model_config = self.resolve_model(vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                                               n_classes=n_classes, head=self.head)
        self.max_len = min(d.max_len or self.model_config.max_len, self.model_config.max_len)
        if self.max_len < 2:  # [CLS] alone: every sentence the same input, one answer for all
            key = "data.max_len" if self.max_len == d.max_len else "model.max_len"
            raise ConfigError(f"{key}={self.max_len} is not allowed for {self.kind}: at least 2 "
                              "(the [CLS] token and one token of the sentence)")

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
                items = self._read(self.data_file("path"))
                if d.val_path:
                    self._items["train"] = items
                else:
                    split = split_sentences if d.holdout_unit == "sentence" else split_holdout
                    seed = self.rc.train.seed if d.split_seed is None else d.split_seed
                    self._items["train"], self._items["val"] = split(items, d.holdout, seed)
            else:
                raise ConfigError(f"unknown split {name!r}; allowed: train, val, test")
        return self._items[name]

    def check_data(self) -> None:
        self._train_batches()
        self.batches("val", 1, False)  # (encoded too: a text the tokenizer refuses fails now)
        if self.rc.data.test_path:  # as `attnlab eval --split test` reads it
            self.batches("test", 1, False)

    def batches(self, name: str, batch_size: int, shuffle: bool) -> ClassificationBatches:
        """The labelled sentences of split ``name``, encoded, in padded batches."""
        tok = self.tokenizer
        examples = [(tok.encode(s), y) for s, y in self.items(name)]
        return ClassificationBatches(examples, batch_size, tok.pad_id,
                                     cls_id(tok, self.model_config), self.max_len,
                                     self.rc.train.seed, shuffle, bucket=self.rc.data.bucket,
                                     end_id=tok.eos_id)

    def _make_train_batches(self) -> ClassificationBatches:
        return self.batches("train", self.rc.train.batch_size, True)

    def ablation_batch(self, split: str, batches: int) -> Batch:
        """The first ``batches`` evaluation batches' sentences of ``split`` and their labels."""
        ids, labels = next(iter(self.batches(split, batches * self.eval_batch_size(), False)))
        return Batch((ids,), labels)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0, progress: Progress | None = None) -> dict[str, float]:
        """Mean loss, accuracy and F1 (macro F1 over more than two classes) of the whole
        split (see :meth:`Task.evaluate`)."""
        progress = progress or no_progress
        total, preds, labels = 0.0, [], []
        for ids, y in self.batches(split, self.eval_batch_size(), shuffle=False):
            ids, y = ids.to(device), y.to(device)
            with amp():
                logits, loss = model(ids, y, loss=SUM)  # (B, C); the mask is ids != pad_id
            total += float(loss)
            preds += logits.argmax(-1).tolist()
            labels += y.tolist()
            progress(1)
        score = f1(preds, labels) if self.n_classes == 2 else macro_f1(preds, labels)
        return {"val_loss": total / len(labels), "accuracy": accuracy(preds, labels), "f1": score}


MASK_RATE = 0.15  # BERT's share of masked tokens


def mask_tokens(ids: Tensor, mask_id: int, vocab_size: int, generator: torch.Generator,
                keep: tuple[int | None, ...] = ()) -> tuple[Tensor, Tensor]:
    """BERT's masking (Devlin et al. 2019, 3.1) of a padded batch: ``(inputs, targets)``.

    Each token whose id is not in ``keep`` (padding and the other special tokens) is picked
    with probability :data:`MASK_RATE`, and at least one per row; a picked token becomes
    ``mask_id`` (probability 0.8), a random id (0.1: drawn above every id of ``keep`` and
    ``mask_id``, the special tokens that come first in a vocabulary, so never padding) or
    stays (0.1). ``targets`` holds the original id at the picked positions and
    ``IGNORE_INDEX`` (-100) elsewhere. Every draw comes from ``generator``, so a saved
    generator state replays the same masks.

    Shape: ids, inputs, targets (B, S).
    """
    real = torch.ones_like(ids, dtype=torch.bool)
    for special in keep:
        if special is not None:
            real &= ids != special
    score = torch.rand(ids.shape, generator=generator)  # (B, S)
    picked = (score < MASK_RATE) & real
    first = score.masked_fill(~real, 2.0).argmin(dim=1)  # (B,): each row's lowest real score
    picked[torch.arange(ids.size(0)), first] |= real.any(dim=1)
    how = torch.rand(ids.shape, generator=generator)
    low = 1 + max(k for k in (*keep, mask_id) if k is not None)
    random_ids = torch.randint(low if low < vocab_size else 0, vocab_size, ids.shape,
                               generator=generator)
    inputs = torch.where(picked & (how < 0.8), mask_id, ids)
    inputs = torch.where(picked & (how >= 0.8) & (how < 0.9), random_ids, inputs)
    return inputs, ids.masked_fill(~picked, IGNORE_INDEX)


class MaskedLMTask(ClassifyTask):
    """Masked-language-model pretraining (``model.head = "mlm"``) on the sentences of a
    labelled TSV, labels unread: the same split as classification (held-out sentences and
    their phrases never trained on), each whole training sentence once per epoch (SST-2's
    phrases are runs of words of them), and a tokenizer with ``<mask>``. Masks are drawn per
    batch (:func:`mask_tokens`) from the task's generator, saved with the data position; an
    evaluation masks each sentence the same way every time, whatever the batch size. The run
    fine-tunes into a classifier with ``attnlab train RECIPE --init-from RUN``
    (self-pretraining: no outside data or weights)."""

    kind = "masked-language-model"
    metric_names = ("accuracy",)  # of the masked tokens
    default_metric = "val_loss"
    head = "mlm"

    def _read(self, path: Path) -> list[tuple[str, int]]:
        return read_labelled_tsv(path, num_labels=None)  # the labels are not read: any class

    def batches(self, name: str, batch_size: int, shuffle: bool) -> ClassificationBatches:
        """The sentences of split ``name`` (label 0: unused), encoded, in padded batches; the
        training split's as whole sentences."""
        texts = [s for s, _ in self.items(name)]
        if name == "train":
            texts = whole_sentences(texts)
        examples = [(self.tokenizer.encode(s), 0) for s in texts]
        return ClassificationBatches(examples, batch_size, self.tokenizer.pad_id, None,
                                     self.max_len, self.rc.train.seed, shuffle,
                                     bucket=self.rc.data.bucket, end_id=self.tokenizer.eos_id)

    def _mask(self, ids: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        tok = self.tokenizer
        return mask_tokens(ids, tok.mask_id, tok.vocab_size, generator,
                           keep=(tok.pad_id, tok.bos_id, tok.eos_id))

    def _mask_each(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Evaluation's masks: each (right-padded) row's from a generator seeded by its tokens,
        so a sentence is masked the same way every time, whatever its batch."""
        inputs, targets = ids.clone(), torch.full_like(ids, IGNORE_INDEX)
        for r, row in enumerate(ids):
            n = int((row != self.tokenizer.pad_id).sum())
            seed = hash((self.rc.train.seed, *row[:n].tolist())) % 2**63  # ints hash stably
            got = self._mask(row[None, :n], torch.Generator().manual_seed(seed))
            inputs[r, :n], targets[r, :n] = got[0][0], got[1][0]
        return inputs, targets

    def next_batch(self) -> tuple[Tensor, Tensor]:
        ids, _ = super().next_batch()
        return self._mask(ids, self.generator)

    def ablation_batch(self, split: str, batches: int) -> Batch:
        """The first ``batches`` evaluation batches' sentences of ``split``, masked as
        evaluation masks them, and the masked tokens."""
        ids = super().ablation_batch(split, batches).inputs[0]
        inputs, targets = self._mask_each(ids)
        return Batch((inputs,), targets)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.generator.set_state(state["generator"])

    def count(self, batch: tuple[Tensor, ...]) -> Tensor:
        return (batch[-1] != IGNORE_INDEX).sum().float()

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0, progress: Progress | None = None) -> dict[str, float]:
        """Mean loss and accuracy of the masked tokens of the whole split, masked as in
        training but the same every time (see :meth:`Task.evaluate`)."""
        progress = progress or no_progress
        total, correct, n = 0.0, 0, 0
        for ids, _ in self.batches(split, self.eval_batch_size(), shuffle=False):
            inputs, targets = (t.to(device) for t in self._mask_each(ids))
            with amp():
                logits, loss = model(inputs, targets, loss=SUM)  # (B, S, V)
            picked = targets != IGNORE_INDEX  # (B, S)
            total += float(loss)
            correct += int((logits[picked].argmax(-1) == targets[picked]).sum())
            n += int(picked.sum())
            progress(1)
        return {"val_loss": total / n, "accuracy": correct / n}


# the pretraining of an encoder on classification data (model.head = "mlm"), named on the
# class that trains that data (it is defined after it)
ClassifyTask.masked_lm = MaskedLMTask
