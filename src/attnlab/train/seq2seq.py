"""Sequence-to-sequence tasks for the encoder-decoder: translation and synthetic copy/reverse/sort.

Both feed the trainer ``(src, tgt_in, tgt_out)`` batches (``tgt_in = <bos> y1 ..``, ``tgt_out
= y1 .. <eos>``, right-padded with ``pad_id``) and evaluate with greedy decoding
(:func:`attnlab.decoding.translate.translate`, KV cache): corpus BLEU (sacrebleu) for
translation, exact-match accuracy for the synthetic tasks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import ConfigError
from ..data import Seq2SeqBatches, read_parallel
from ..data import SyntheticTask as SyntheticData
from ..decoding.translate import translate
from ..evaluate import bleu
from ..models import token_loss
from ..tokenizers import Tokenizer
from .config import RunConfig
from .tasks import Amp, Task, data_file, resolve_model, train_tokenizer

log = logging.getLogger(__name__)


class Seq2SeqTask(Task):
    """Shared loss and teacher-forced validation loss of the seq2seq tasks."""

    def loss_sum(self, model: nn.Module, batch, label_smoothing: float = 0.0) -> Tensor:
        src, tgt_in, tgt_out = batch
        logits, _ = model(src, tgt_in)  # (B, T, V); source pads masked from src != pad_id
        return token_loss(logits, tgt_out, self.model_config.pad_id, label_smoothing, "sum")

    def _val_loss(self, model: nn.Module, batches, device: torch.device, amp: Amp) -> float:
        total, n = 0.0, 0.0
        for batch in batches:
            batch = tuple(t.to(device) for t in batch)
            with amp():
                total += float(self.loss_sum(model, batch))
            n += float(self.count(batch))
        return total / max(n, 1.0)

    def decode_limit(self, src_len: int) -> int:
        """Most target tokens greedy decoding may produce for a source of ``src_len``."""
        return min(self.model_config.max_len, int(1.5 * src_len) + 10)


class TranslationTask(Seq2SeqTask):
    """Parallel text (Multi30k de->en): one joint BPE vocabulary, shared embeddings."""

    metric_names = ("bleu",)
    default_metric = "bleu"

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        self._pairs: dict[str, list[tuple[str, str]]] = {}
        if tokenizer is None:
            train = self.pairs("train")
            tokenizer = train_tokenizer(rc, [s for s, _ in train] + [t for _, t in train])
        tok = self.tokenizer = tokenizer
        if tok.pad_id is None or tok.bos_id is None or tok.eos_id is None:
            raise ConfigError("translation needs a tokenizer with <pad>, <bos> and <eos>")
        self.model_config = resolve_model(rc, vocab_size=tok.vocab_size, pad_id=tok.pad_id)
        self._batches: Seq2SeqBatches | None = None
        self._iter = None

    def pairs(self, name: str) -> list[tuple[str, str]]:
        if name not in self._pairs:
            d = self.rc.data
            fetched = d.name == "multi30k"
            if name == "train":
                files = (data_file(self.rc, "src_path", "train.de" if fetched else None),
                         data_file(self.rc, "tgt_path", "train.en" if fetched else None))
            elif name == "val":
                files = (data_file(self.rc, "val_src_path", "val.de" if fetched else None),
                         data_file(self.rc, "val_tgt_path", "val.en" if fetched else None))
            elif name == "test":
                if not (d.test_src_path and d.test_tgt_path):
                    raise ConfigError("this run has no test split: pass --data SRC TGT (or set "
                                      "data.test_src_path and data.test_tgt_path)")
                files = (Path(d.test_src_path), Path(d.test_tgt_path))
            else:
                raise ConfigError(f"unknown split {name!r}; allowed: train, val, test")
            self._pairs[name] = read_parallel(*files)
        return self._pairs[name]

    def encode(self, name: str) -> list[tuple[list[int], list[int]]]:
        tok, add = self.tokenizer, self.rc.data.src_add_special
        return [(tok.encode(s, add), tok.encode(t, True)) for s, t in self.pairs(name)]

    def _train_batches(self) -> Seq2SeqBatches:
        if self._batches is None:
            limit = min(self.rc.data.max_len or self.model_config.max_len,
                        self.model_config.max_len)
            pairs = self.encode("train")
            kept = [(s, t) for s, t in pairs if len(s) <= limit and len(t) <= limit]
            if len(kept) < len(pairs):
                log.info("dropped %d of %d training pairs longer than %d tokens",
                         len(pairs) - len(kept), len(pairs), limit)
            if not kept:
                raise ConfigError(f"every training pair is longer than {limit} tokens; raise "
                                  "model.max_len (or data.max_len)")
            self._batches = Seq2SeqBatches(kept, self.rc.train.max_tokens, self.tokenizer.pad_id,
                                           self.rc.train.seed)
        return self._batches

    def next_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        if self._iter is None:
            self._iter = iter(self._train_batches())
        try:
            return next(self._iter)
        except StopIteration:
            self._iter = iter(self._train_batches())
            return next(self._iter)

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self._train_batches().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._train_batches().load_state_dict(state["batches"])
        self._iter = None

    def translate(self, model: nn.Module, sources: list[str], device: torch.device,
                  amp: Amp, batch_size: int = 128) -> list[str]:
        """Greedy translations of ``sources`` (sorted by length into batches)."""
        tok, add = self.tokenizer, self.rc.data.src_add_special
        cap = self.model_config.max_len
        ids = [tok.encode(s, add)[:cap] for s in sources]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[str] = [""] * len(ids)
        for i in range(0, len(order), batch_size):
            chunk = order[i:i + batch_size]
            src = [ids[j] for j in chunk]
            with amp():
                hyps = translate(model, src, max_len=self.decode_limit(max(map(len, src))),
                                 bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
            for j, h in zip(chunk, hyps):
                out[j] = tok.decode(h)
        return out

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0) -> dict[str, float]:
        cap = self.model_config.max_len
        pairs = [(s[:cap], t[:cap + 1]) for s, t in self.encode(split)]
        budget = max(self.rc.train.max_tokens, max(max(len(s), len(t)) for s, t in pairs))
        batches = Seq2SeqBatches(pairs, budget, self.tokenizer.pad_id, shuffle=False)
        metrics = {"val_loss": self._val_loss(model, batches, device, amp)}
        refs = [t for _, t in self.pairs(split)]
        hyps = self.translate(model, [s for s, _ in self.pairs(split)], device, amp)
        metrics["bleu"] = bleu(hyps, refs)
        return metrics


class SyntheticTask(Seq2SeqTask):
    """copy / reverse / sort, generated on the fly; metric: exact-match greedy accuracy."""

    metric_names = ("accuracy",)
    default_metric = "accuracy"

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        d = rc.data
        self.data = SyntheticData(d.name, d.synth_vocab, d.seq_min, d.seq_max)
        self.model_config = resolve_model(rc, vocab_size=d.synth_vocab, pad_id=self.data.pad_id)
        if self.model_config.max_len < d.seq_max + 2:
            raise ConfigError(f"model.max_len={self.model_config.max_len} is too short for "
                              f"data.seq_max={d.seq_max}; allowed: >= seq_max + 2")

    def next_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        src, tgt = self.data.sample(self.rc.train.batch_size, self.generator)
        return src, tgt[:, :-1], tgt[:, 1:]

    def examples(self, split: str) -> list[tuple[Tensor, Tensor, Tensor]]:
        """A fixed set of ``data.val_size`` examples per split, in eval-sized batches."""
        gen = torch.Generator().manual_seed(self.rc.train.seed + {"val": 1, "test": 2}.get(
            split, 0))
        if split not in ("val", "test"):
            raise ConfigError(f"unknown split {split!r}; allowed: val, test")
        n, bs, out = self.rc.data.val_size, self.eval_batch_size(), []
        for i in range(0, n, bs):
            src, tgt = self.data.sample(min(bs, n - i), gen)
            out.append((src, tgt[:, :-1], tgt[:, 1:]))
        return out

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0) -> dict[str, float]:
        batches = self.examples(split)
        metrics = {"val_loss": self._val_loss(model, batches, device, amp)}
        right = total = 0
        for src, _, _ in batches:
            rows = [[t for t in row if t != self.data.pad_id] for row in src.tolist()]
            with amp():
                hyps = translate(model, rows, max_len=self.data.max_len + 1,
                                 bos_id=self.data.bos_id, eos_id=self.data.eos_id,
                                 pad_id=self.data.pad_id)
            for row, hyp in zip(rows, hyps):
                right += hyp == self.data.answer(row)
                total += 1
        metrics["accuracy"] = right / total
        return metrics
