"""Sequence-to-sequence tasks for the encoder-decoder: the shared loss, and translation.

Seq2seq tasks feed the trainer ``(src, tgt_in, tgt_out)`` batches (``tgt_in = <bos> y1 ..``,
``tgt_out = y1 .. <eos>``, right-padded with ``pad_id``). Translation is evaluated with greedy
(or beam-search) decoding (:func:`attnlab.decoding.translate_texts`, KV cache) and corpus
BLEU (sacrebleu).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config import ConfigError
from ..data import Seq2SeqBatches, read_parallel
from ..decoding import translate_texts
from ..metrics import bleu
from ..models import token_loss
from ..tokenizers import Tokenizer
from .base import Amp, EpochTask, Task, data_file, resolve_model, train_tokenizer

if TYPE_CHECKING:  # annotations only: the training config imports the task table
    from ..train.config import RunConfig

log = logging.getLogger(__name__)


class Seq2SeqTask(Task):
    """Shared loss and teacher-forced validation loss of the seq2seq tasks."""

    family = "encoder_decoder"

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


class TranslationTask(Seq2SeqTask, EpochTask):
    """Parallel text (Multi30k de->en): one joint BPE vocabulary, shared embeddings."""

    kind = "translation"
    eval_data_keys = ("src_path", "tgt_path")
    metric_names = ("bleu",)
    default_metric = "bleu"
    # How evaluate() decodes for BLEU: greedy (beam 1, as in training) unless set otherwise
    # (``attnlab eval --beam 4``).
    beam = 1
    length_penalty = 0.6

    def decoding(self) -> str:
        """How BLEU's translations are decoded, in words."""
        if self.beam == 1:
            return "greedy"
        return f"beam search, beam {self.beam}, length penalty {self.length_penalty:g}"

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        d = rc.data
        for src, tgt in (("src_path", "tgt_path"), ("val_src_path", "val_tgt_path"),
                         ("test_src_path", "test_tgt_path")):
            # one file of a pair alone would fetch (or ask for) the other side's file
            if bool(getattr(d, src)) != bool(getattr(d, tgt)):
                given, missing = (src, tgt) if getattr(d, src) else (tgt, src)
                fetched = d.name == "multi30k" and not src.startswith("test_")
                neither = " (or neither, to use the downloaded Multi30k)" if fetched else ""
                raise ConfigError(f"data.{given} is set but data.{missing} is not: give "
                                  f"both{neither}")
        self._pairs: dict[str, list[tuple[str, str]]] = {}
        if tokenizer is None:
            train = self.pairs("train")
            tokenizer = train_tokenizer(rc, [s for s, _ in train] + [t for _, t in train])
        tok = self.tokenizer = tokenizer
        if tok.pad_id is None or tok.bos_id is None or tok.eos_id is None:
            raise ConfigError("translation needs a tokenizer with <pad>, <bos> and <eos>")
        self.model_config = resolve_model(rc, vocab_size=tok.vocab_size, pad_id=tok.pad_id)

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

    def check_data(self) -> None:
        self._train_batches()
        self.encode("val")

    def _make_train_batches(self) -> Seq2SeqBatches:
        limit = min(self.rc.data.max_len or self.model_config.max_len, self.model_config.max_len)
        pairs = self.encode("train")
        kept = [(s, t) for s, t in pairs if len(s) <= limit and len(t) <= limit]
        if len(kept) < len(pairs):
            log.info("dropped %d of %d training pairs longer than %d tokens",
                     len(pairs) - len(kept), len(pairs), limit)
        if not kept:
            raise ConfigError(f"every training pair is longer than {limit} tokens; raise "
                              "model.max_len (or data.max_len)")
        return Seq2SeqBatches(kept, self.rc.train.max_tokens, self.tokenizer.pad_id,
                              self.rc.train.seed)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0) -> dict[str, float]:
        cap = self.model_config.max_len
        pairs = [(s[:cap], t[:cap + 1]) for s, t in self.encode(split)]
        budget = max(self.rc.train.max_tokens, max(max(len(s), len(t)) for s, t in pairs))
        batches = Seq2SeqBatches(pairs, budget, self.tokenizer.pad_id, shuffle=False)
        metrics = {"val_loss": self._val_loss(model, batches, device, amp)}
        sources = [s for s, _ in self.pairs(split)]
        with amp():
            hyps = translate_texts(model, sources, self.tokenizer,
                                   add_special=self.rc.data.src_add_special, batch_size=128,
                                   beam=self.beam, length_penalty=self.length_penalty)
        # References pass through the tokenizer as the translations did: nothing changes for
        # byte-level BPE (it round-trips text), and a whitespace pre-tokenizer's spacing
        # ("man ' s") is then on both sides instead of capping BLEU below 100.
        tok = self.tokenizer
        refs = [tok.decode(tok.encode(t)) for _, t in self.pairs(split)]
        metrics["bleu"] = bleu(hyps, refs)
        return metrics
