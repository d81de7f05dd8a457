"""Sequence-to-sequence tasks for the encoder-decoder: the shared loss, and translation.

Seq2seq tasks feed the trainer ``(src, tgt_in, tgt_out)`` batches (``tgt_in = <bos> y1 ..``,
``tgt_out = y1 .. <eos>``, right-padded with ``pad_id``). Translation trains from a prepared
pairs DIR (:mod:`attnlab.data.pairs`, read a batch at a time): ``data.path``, or the one the
raw ``data.src_path`` / ``data.tgt_path`` are prepared into once, in the data cache. It is
evaluated with greedy or beam-search decoding and corpus BLEU; val and test pairs are read
whole.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config import ConfigError
from ..data import (
    DataError,
    DatasetInfo,
    RemoteFile,
    Seq2SeqBatches,
    default_cache_dir,
    read_parallel,
)
from ..data.pairs import (
    TOKENIZER_KINDS,
    PairShards,
    cached_pairs_dir,
    is_prepared_pairs,
    prepare_pairs_cached,
    read_pairs_manifest,
)
from ..data.shards import MANIFEST, TOKENIZER
from ..decoding import translate_texts
from ..metrics import bleu
from ..run_config import DataConfig, RunConfig
from ..tokenizers import Tokenizer, load_tokenizer
from .base import Amp, DataSet, EpochTask, Progress, Task, no_progress
from .registry import register

log = logging.getLogger(__name__)
TRANSLATE_BATCH = 128  # sentences decoded at once by evaluation

_MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
_MULTI30K_SHA256 = (
    ("train", "de", "695df46f6fd14567e69970408a2c129a50e778a910ecb1585a92eb25b2c7accc"),
    ("train", "en", "4b4d37e774976ef44fecca1738cdeb3b3ba384851a59a755b9c5e6aa7d87b13c"),
    ("val", "de", "fd0fc009db2446cfc12d96a382aff0d3122cb47577b352d0f7e0bb3a38e2e552"),
    ("val", "en", "40cd20974079d9afb0e3d27c659a8e059cc2fcf850b4bc23ede13fc36dd8a865"),
)
MULTI30K = DatasetInfo(
    "multi30k", "Multi30k task 1 German-English captions (29,000 train / 1,014 val pairs)",
    tuple(RemoteFile(f"{split}.{lang}", f"{_MULTI30K}/{split}.{lang}.gz", sha, "gzip")
          for split, lang, sha in _MULTI30K_SHA256),
    "multi30k", "--set data.src_path=/path/to/train.de --set data.tgt_path=/path/to/train.en")
PAIR_KEYS = ("src_path", "tgt_path", "val_src_path", "val_tgt_path", "test_src_path",
             "test_tgt_path")


class Seq2SeqTask(Task):
    """Shared loss, teacher-forced validation loss and decoding of the seq2seq tasks."""

    family = "encoder_decoder"
    beam_search = True
    # How evaluate() decodes: greedy (beam 1, as in training) unless set otherwise
    # (``attnlab eval --beam 4``): a wider search can find what greedy decoding misses.
    beam = 1
    length_penalty = 0.6

    def set_eval_options(self, beam: int = 1, length_penalty: float | None = None,
                         stride: int | None = None) -> dict[str, str]:
        self.check_eval_options(beam, stride, length_penalty)
        self.beam = beam
        if length_penalty is not None:
            self.length_penalty = length_penalty
        return {"decoding": self.decoding()}

    def decoding(self) -> str:
        """How evaluate() decodes, in words."""
        if self.beam == 1:
            return "greedy"
        return f"beam search, beam {self.beam}, length penalty {self.length_penalty:g}"

    def _val_loss(self, model: nn.Module, batches, device: torch.device, amp: Amp,
                  progress: Progress) -> float:
        """Teacher-forced mean loss per target token over ``batches``."""
        total, n = 0.0, 0.0
        for batch in batches:
            batch = tuple(t.to(device) for t in batch)
            with amp():
                total += float(self.loss_sum(model, batch))  # (the head: counted targets only)
            n += float(self.count(batch))
            progress(1)
        return total / max(n, 1.0)


@register
class TranslationTask(Seq2SeqTask, EpochTask):
    """Parallel text (Multi30k de->en): one joint BPE vocabulary, shared embeddings; the
    training pairs from a prepared pairs DIR (``data.path``, or the cache's of the raw files)."""

    kind = "translation"
    datasets = (DataSet.fetched(MULTI30K, src_path="train.de", tgt_path="train.en",
                                val_src_path="val.de", val_tgt_path="val.en"),)
    own_files = True  # line-aligned files (data.src_path + data.tgt_path) or a pairs DIR
    eval_data_keys = ("src_path", "tgt_path")
    data_keys = ("name", "path", "src_path", "tgt_path", "val_src_path", "val_tgt_path",
                 "test_src_path", "test_tgt_path", "cache_dir", "tokenizer", "vocab_size",
                 "pre_tokenizer", "max_len", "src_add_special")
    train_keys = ("max_tokens",)
    metric_names = ("bleu",)
    default_metric = "bleu"

    @classmethod
    def claims_files(cls, d: DataConfig) -> bool:
        return any(getattr(d, k) for k in PAIR_KEYS) or bool(
            d.path and is_prepared_pairs(d.path))

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        d = rc.data
        for src, tgt in (("src_path", "tgt_path"), ("val_src_path", "val_tgt_path"),
                         ("test_src_path", "test_tgt_path")):
            # one file of a pair alone would fetch (or ask for) the other side's file
            if bool(getattr(d, src)) != bool(getattr(d, tgt)):
                given, missing = (src, tgt) if getattr(d, src) else (tgt, src)
                fetched = self.dataset is not None and src in self.dataset.files
                neither = (f" (or neither, to use the downloaded {self.dataset.name})"
                           if fetched else "")
                raise ConfigError(f"data.{given} is set but data.{missing} is not: give "
                                  f"both{neither}")
        if d.path and (d.src_path or d.tgt_path):
            raise ConfigError(f"data.path={d.path!r} (a prepared pairs dir) and data.src_path / "
                              "data.tgt_path both name the training pairs; allowed: one of them")
        self._pairs: dict[str, list[tuple[str, str]]] = {}
        self._val_ids: list[tuple[list[int], list[int]]] | None = None  # data.path's val split
        self._dir: Path | None = None  # the prepared pairs DIR of the training split
        if d.path:
            self._dir = self._given_dir(tokenizer)
            tokenizer = tokenizer or self._dir_tokenizer(self._dir)
        elif tokenizer is None:
            if d.tokenizer not in TOKENIZER_KINDS:
                raise ConfigError(f"translation needs a tokenizer with <pad>, <bos> and <eos>: "
                                  f"data.tokenizer={d.tokenizer!r} is not allowed: one of "
                                  + ", ".join(repr(k) for k in TOKENIZER_KINDS))
            self._dir = self._cached(d.tokenizer)  # its tokenizer trained on the training pairs
            tokenizer = self._dir_tokenizer(self._dir)
        tok = self.tokenizer = tokenizer
        if tok.pad_id is None or tok.bos_id is None or tok.eos_id is None:
            raise ConfigError("translation needs a tokenizer with <pad>, <bos> and <eos>")
        self.model_config = self.resolve_model(vocab_size=tok.vocab_size, pad_id=tok.pad_id)

    # ---- where the training pairs come from --------------------------------------------------
    def _cache(self) -> Path:
        d = self.rc.data
        return Path(d.cache_dir).expanduser() if d.cache_dir else default_cache_dir()

    @staticmethod
    def _dir_tokenizer(path: Path) -> Tokenizer:
        read_pairs_manifest(path)  # one line when it is no prepared pairs DIR
        try:
            return load_tokenizer(path / TOKENIZER)
        except (OSError, ValueError) as e:
            raise DataError(f"prepared pairs dir {path}: {e}; prepare the pairs again") from None

    def _given_dir(self, given: Tokenizer | None) -> Path:
        """``data.path``, checked: a prepared pairs DIR whose tokenizer and source specials
        are this run's."""
        d = self.rc.data
        path = Path(d.path)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"data.path={d.path!r} is a file; for translation it names a "
                              "prepared pairs dir (attnlab.data.pairs.prepare_pairs); raw "
                              "line-aligned files go in data.src_path and data.tgt_path")
        own = self._dir_tokenizer(path)
        about = f"a {own.kind} tokenizer of {own.vocab_size} ids"
        if given is not None and given.to_dict() != own.to_dict():
            origin = (f"train.init_from={self.rc.train.init_from}" if self.rc.train.init_from
                      else "the run's own tokenizer")
            raise ConfigError(f"data.path: {path} was prepared with {about}, but this run reads "
                              f"{origin} ({given.kind}, another vocabulary); allowed: pairs "
                              "prepared with that tokenizer (prepare_pairs(..., tokenizer=it))")
        if given is None and "data.tokenizer" in self.rc.explicit and d.tokenizer != own.kind:
            raise ConfigError(f"data.tokenizer={d.tokenizer!r} does not fit data.path: {path} "
                              f"was prepared with {about}; allowed: {own.kind!r} (or leave "
                              "data.tokenizer out: a prepared dir brings its tokenizer)")
        special = bool(read_pairs_manifest(path)["src_add_special"])
        if special != d.src_add_special:
            raise ConfigError(f"data.src_add_special={d.src_add_special} does not fit data.path: "
                              f"the sources of {path} were encoded with src_add_special="
                              f"{special}; allowed: {special} (or prepare the pairs again)")
        return path

    def _cached(self, tokenizer: str | Tokenizer) -> Path:
        """The cache's prepared DIR of the raw training files (made on first use), tokenized by
        ``tokenizer`` or by the one a kind (``data.tokenizer``) trains on the pairs."""
        d = self.rc.data
        return prepare_pairs_cached(*self._files("train"), self._cache(), tokenizer,
                                    vocab_size=d.vocab_size, pre_tokenizer=d.pre_tokenizer,
                                    src_add_special=d.src_add_special)

    def _train_dir(self) -> Path:
        if self._dir is None:  # a given tokenizer (a resumed or evaluated run, init_from)
            d = self.rc.data
            # what the first run of these settings prepared, when its tokenizer is this one
            first = cached_pairs_dir(*self._files("train"), self._cache(), d.tokenizer,
                                     vocab_size=d.vocab_size, pre_tokenizer=d.pre_tokenizer,
                                     src_add_special=d.src_add_special)
            self._dir = first if self._fits(first) else self._cached(self.tokenizer)
        return self._dir

    def _fits(self, path: Path) -> bool:
        """Is ``path`` a finished DIR of this run's tokenizer?"""
        if not (path / MANIFEST).is_file():
            return False
        try:
            return self._dir_tokenizer(path).to_dict() == self.tokenizer.to_dict()
        except DataError:
            return False

    def _files(self, name: str) -> tuple[Path, Path]:
        d = self.rc.data
        if name == "train":
            return self.data_file("src_path"), self.data_file("tgt_path")
        if name == "val":
            if not d.val_src_path and (d.src_path or d.path):
                # a download's val pairs score only a model of its own training pairs
                given = "data.src_path and data.tgt_path" if d.src_path else \
                    f"data.path={d.path!r} (a prepared DIR without a val split)"
                raise ConfigError(f"the training pairs are your own ({given}) but no validation "
                                  "pairs are: set data.val_src_path and data.val_tgt_path")
            return self.data_file("val_src_path"), self.data_file("val_tgt_path")
        if name == "test":
            if not (d.test_src_path and d.test_tgt_path):
                raise ConfigError("this run has no test split: pass --data SRC TGT (or set "
                                  "data.test_src_path and data.test_tgt_path)")
            return Path(d.test_src_path), Path(d.test_tgt_path)
        raise ConfigError(f"unknown split {name!r}; allowed: train, val, test")

    # ---- val and test pairs, in memory ------------------------------------------------------
    def _dir_val(self, name: str) -> bool:
        """Is split ``name`` the val split of ``data.path`` (when no val files are named)?"""
        d = self.rc.data
        if name != "val" or not d.path or d.val_src_path:
            return False
        if self._val_ids is None:
            val = PairShards(self._dir, "val")
            self._val_ids = [(s.tolist(), t.tolist()) for s, t in val.pairs(range(len(val)))]
        return bool(self._val_ids)

    def pairs(self, name: str) -> list[tuple[str, str]]:
        """The ``(source, target)`` sentences of a split (of ``data.path``'s val split: its
        ids decoded)."""
        if name not in self._pairs:
            if self._dir_val(name):
                tok = self.tokenizer
                self._pairs[name] = [(tok.decode(s), tok.decode(t)) for s, t in self._val_ids]
            else:
                self._pairs[name] = read_parallel(*self._files(name))
        return self._pairs[name]

    def encode(self, name: str) -> list[tuple[list[int], list[int]]]:
        """The ``(source, target)`` ids of split ``name``, encoded as in training."""
        if self._dir_val(name):
            return self._val_ids
        tok, add = self.tokenizer, self.rc.data.src_add_special
        return [(tok.encode(s, add), tok.encode(t, True)) for s, t in self.pairs(name)]

    def check_data(self) -> None:
        self._train_batches()
        self.encode("val")
        if self.rc.data.test_src_path or self.rc.data.test_tgt_path:  # as `eval --split test`
            self.encode("test")

    def _make_train_batches(self) -> Seq2SeqBatches:
        limit = min(self.rc.data.max_len or self.model_config.max_len, self.model_config.max_len)
        pairs = PairShards(self._train_dir(), "train")
        src_len, tgt_len = pairs.lengths()  # (N,) each
        keep = np.flatnonzero((src_len <= limit) & (tgt_len <= limit))
        if len(keep) < len(pairs):
            log.info("dropped %d of %d training pairs longer than %d tokens",
                     len(pairs) - len(keep), len(pairs), limit)
        if not len(keep):
            raise ConfigError(f"every training pair is longer than {limit} tokens; raise "
                              "model.max_len (or data.max_len)")
        if len(keep) < len(pairs):
            pairs = pairs.select(keep)
        return Seq2SeqBatches(pairs, self.rc.train.max_tokens, self.tokenizer.pad_id,
                              self.rc.train.seed)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0, progress: Progress | None = None) -> dict[str, float]:
        """Teacher-forced loss and the BLEU of the split's translations, decoded as
        :meth:`decoding` says (see :meth:`Task.evaluate`)."""
        progress = progress or no_progress
        cap = self.model_config.max_len
        pairs = [(s[:cap], t[:cap + 1]) for s, t in self.encode(split)]
        budget = max(self.rc.train.max_tokens, max(max(len(s), len(t)) for s, t in pairs))
        batches = Seq2SeqBatches(pairs, budget, self.tokenizer.pad_id, shuffle=False)
        metrics = {"val_loss": self._val_loss(model, batches, device, amp, progress)}
        sources = [s for s, _ in self.pairs(split)]
        with amp():
            hyps = translate_texts(model, sources, self.tokenizer,
                                   add_special=self.rc.data.src_add_special,
                                   batch_size=TRANSLATE_BATCH, beam=self.beam,
                                   length_penalty=self.length_penalty)
        progress(math.ceil(len(sources) / TRANSLATE_BATCH))
        # References pass through the tokenizer as the translations did: nothing changes for
        # byte-level BPE (it round-trips text), and a whitespace pre-tokenizer's spacing
        # ("man ' s") is then on both sides instead of capping BLEU below 100.
        tok = self.tokenizer
        refs = [tok.decode(tok.encode(t)) for _, t in self.pairs(split)]
        metrics["bleu"] = bleu(hyps, refs)
        return metrics
