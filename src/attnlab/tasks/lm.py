"""Language modelling: next-token prediction on a text, nanoGPT-style random windows.

The training text is read through the memory maps of a prepared token dir
(:mod:`attnlab.data.shards`), a window at a time, so a corpus of any size trains without being
held in memory: ``data.path`` is such a DIR (``attnlab data prepare``), or a text file that is
prepared once into the data cache (:func:`attnlab.data.prepare.prepare_cached`) and read from
there by every later run, ``--resume`` and ``eval``. ``data.mix`` trains on several corpora at
once: each row of a batch comes from one of them, drawn by weight.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..config import ConfigError
from ..data import (
    DataError,
    DatasetInfo,
    RemoteFile,
    corpora,
    default_cache_dir,
    read_text,
)
from ..data.corpora import describe
from ..data.shards import TokenShards, is_token_dir
from ..errors import UsageError, VocabularyError
from ..info import check_held
from ..interpret import Batch, lm_batch
from ..metrics import perplexity
from ..nn import IGNORE_INDEX
from ..run_config import RunConfig
from ..tokenizers import Tokenizer
from .base import Amp, DataSet, Progress, Task, no_progress
from .registry import register

log = logging.getLogger(__name__)

SHAKESPEARE = DatasetInfo(
    "shakespeare", "Tiny Shakespeare, 1,115,394 characters (char-level LM)",
    (RemoteFile("input.txt", "https://raw.githubusercontent.com/karpathy/char-rnn/master/"
                "data/tinyshakespeare/input.txt",
                "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),),
    "tinyshakespeare", "--set data.path=/path/to/input.txt")
# the bytes of one window's start while sampled_starts draws them: an int64, then a Python int
# in a list (its object, 32 bytes as allocated, and the list's pointer to it)
WINDOW_START_BYTES = 8 + 32 + 8
# the default data set: what data.name = "" trains when the config names no file
EMBEDDED = DataSet("embedded", "the pydoc topics every Python install has (no download)",
                   default=True)


class Tokens(Protocol):
    """A token stream read a window at a time (:class:`~attnlab.data.shards.TokenShards`)."""

    def __len__(self) -> int: ...

    def window(self, start: int, n: int) -> Tensor:
        """The ``n`` ids from ``start``: (n,)."""
        ...

    def windows(self, starts: list[int], n: int) -> Tensor:
        """The ``n`` ids from each of ``starts``, stacked: (len(starts), n)."""
        ...


class MemoryTokens:
    """A token stream held in memory, read as a prepared split is: a separate val/test file,
    small enough to encode whole."""

    def __init__(self, ids: Tensor) -> None:
        self.data = ids  # (N,) int64

    def __len__(self) -> int:
        return len(self.data)

    def window(self, start: int, n: int) -> Tensor:
        return self.data[start:start + n]  # (n,)

    def windows(self, starts: list[int], n: int) -> Tensor:
        return torch.stack([self.data[s:s + n] for s in starts])  # (len(starts), n)


class JoinedTokens:
    """Token streams read one after another as one: a corpus's train and val parts when
    ``data.val_path`` takes the held-out part's place (the whole corpus trains)."""

    def __init__(self, parts: list[Tokens]) -> None:
        self.parts = [p for p in parts if len(p)]
        self.starts = [0]
        for p in self.parts:
            self.starts.append(self.starts[-1] + len(p))

    def __len__(self) -> int:
        return self.starts[-1]

    def window(self, start: int, n: int) -> Tensor:
        end, pieces = start + n, []
        for part, lo, hi in zip(self.parts, self.starts, self.starts[1:]):
            a, b = max(start, lo), min(end, hi)
            if a < b:
                pieces.append(part.window(a - lo, b - a))
        return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)  # (n,)

    def windows(self, starts: list[int], n: int) -> Tensor:
        return torch.stack([self.window(s, n) for s in starts])  # (len(starts), n)


def repeat_passages(w: Tensor, frac: float, generator: torch.Generator) -> Tensor:
    """``w`` (B, n) with each row, with probability ``frac``, made a passage read over and
    over: its first p tokens (p uniform in n // 8 .. n // 2, at least 2) repeated to fill the
    n (the last copy cut short). In place; returns ``w``. Draws nothing from ``generator``
    when ``frac`` is 0 (the batches of a run without repeats are unchanged)."""
    if frac <= 0:
        return w
    b, n = w.shape
    rows = (torch.rand(b, generator=generator) < frac).nonzero().flatten().tolist()
    lo, hi = max(2, n // 8), max(2, n // 2)
    for r in rows:
        p = int(torch.randint(lo, hi + 1, (1,), generator=generator))
        w[r] = w[r, :p].repeat(-(-n // p))[:n]
    return w


@dataclass
class Corpus:
    """One training corpus: its prepared DIR, its splits and its share of the rows."""

    source: str  # as the config names it (a prepared DIR or a text file)
    weight: float
    dir: Path
    train: Tokens
    val: Tokens


@register
class LMTask(Task):
    """Next-token prediction on a text: random windows of ``block_size`` tokens. The text is
    ``data.path`` (a file or a prepared DIR) or ``data.mix``, else the data set's file, or
    the embedded corpus (:data:`EMBEDDED`, the default data set)."""

    family = "decoder"
    kind = "language-model"
    datasets = (EMBEDDED, DataSet.fetched(SHAKESPEARE, path="input.txt"))
    own_files = True  # any text: a file, a folder, a prepared DIR
    reads_mix = True
    strided = True
    eval_data_keys = ("path",)
    data_keys = ("name", "path", "mix", "val_path", "test_path", "cache_dir", "tokenizer", "unk",
                 "vocab_size", "pre_tokenizer", "train_frac", "repeat_frac", "repeat_steps")
    train_keys = ("batch_size", "block_size", "eval_batches", "final_eval_batches", "samples",
                  "sample_tokens", "temperature", "top_k")
    metric_names = ("ppl",)
    sampled_eval = True

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        self._files: dict[str, MemoryTokens] = {}  # val/test files, encoded
        self._given = tokenizer
        self._corpora: list[Corpus] | None = None
        if tokenizer is None:  # made from the data (or a prepared DIR's) now
            self._corpora, tokenizer = self._resolve(None)
            self.rc = self._recorded(tokenizer)
        self.tokenizer = tok = tokenizer
        self.model_config = self.resolve_model(vocab_size=tok.vocab_size, pad_id=tok.lm_pad_id)
        self.block = rc.train.block_size or self.model_config.max_len
        if self.block > self.model_config.max_len:
            raise ConfigError(f"train.block_size={self.block} is longer than model.max_len="
                              f"{self.model_config.max_len}; allowed: <= model.max_len")
        self.stride = self.block  # the whole split's windows start this far apart
        self._drawn = 0  # training batches drawn (data.repeat_steps counts their steps)

    def _recorded(self, tok: Tokenizer) -> RunConfig:
        """The run config with the tokenizer a prepared DIR given as data brings (its kind;
        a BPE's vocabulary and pre-tokenizer): the run's ``config.json`` then says what it was
        trained on, not the settings' defaults. A tokenizer made from raw text here already
        follows the settings."""
        d = self.rc.data
        if tok.kind not in ("char", "bpe", "gpt2") or not any(
                is_token_dir(p) for p, _ in self._sources()):
            return self.rc
        changes: dict[str, Any] = {"tokenizer": tok.kind}
        if tok.kind == "bpe":
            changes["vocab_size"] = tok.vocab_size
            changes["pre_tokenizer"] = "byte_level" if tok.to_dict()["byte_level"] \
                else "whitespace"
        return dataclasses.replace(self.rc, data=dataclasses.replace(d, **changes))

    def set_stride(self, stride: int) -> None:
        """Evaluate the whole split in windows that start ``stride`` tokens apart (1 to the
        block; the block, the default: non-overlapping windows). Each target is still scored
        once, by the first window that holds it, so every target after the first window is
        predicted from at least ``block - stride`` tokens before it: the sliding-window
        perplexity of Hugging Face's "Perplexity of fixed-length models", which comes closer
        to the loss of the text as one stream than windows that start from nothing."""
        if isinstance(stride, bool) or not isinstance(stride, int) \
                or not 1 <= stride <= self.block:
            raise UsageError(f"stride {stride!r}: allowed a whole number from 1 to the run's "
                             f"block of {self.block} tokens")
        self.stride = stride

    def set_eval_options(self, beam: int = 1, length_penalty: float | None = None,
                         stride: int | None = None) -> dict[str, Any]:
        self.check_eval_options(beam, stride, length_penalty)
        if stride is None:
            return {}
        self.set_stride(stride)
        return {"window": self.block, "stride": stride}

    @property
    def corpora(self) -> list[Corpus]:
        """The training corpora, found on first use when the tokenizer was given (a run's
        own: ``eval --data FILE`` reads no training data)."""
        if self._corpora is None:
            self._corpora, _ = self._resolve(self._given)
        return self._corpora

    # ---- where the tokens come from ----------------------------------------------------------
    def _cache(self) -> Path:
        d = self.rc.data
        return Path(d.cache_dir).expanduser() if d.cache_dir else default_cache_dir()

    def _sources(self) -> list[tuple[str, float]]:
        """(path, weight) of each corpus the config names."""
        d = self.rc.data
        if d.mix:
            return [(m["path"], float(m["weight"])) for m in d.mix]
        if d.path or (self.dataset and "path" in self.dataset.files):
            return [(str(self.data_file("path")), 1.0)]
        if self.dataset == EMBEDDED:
            return [(str(corpora.embedded_file(self._cache())), 1.0)]
        raise ConfigError(f"{self.data_words()} needs data.path (a UTF-8 text file or a "
                          "prepared data dir)")

    def _key(self) -> str:
        return "data.mix" if self.rc.data.mix else "data.path"

    def _origin(self) -> str:
        init = self.rc.train.init_from
        return f"train.init_from={init}" if init else "the run's own tokenizer"

    def _resolve(self, given: Tokenizer | None) -> tuple[list[Corpus], Tokenizer]:
        """The corpora and the one tokenizer they share: a prepared DIR's (which the run's
        own or ``init_from``'s must equal), else ``given``, else one made from the text."""
        d, key = self.rc.data, self._key()
        sources = self._sources()
        fixed = corpora.shared_tokenizer([p for p, _ in sources], key)
        if fixed is not None:
            where, tok = fixed
            if given is not None and given.to_dict() != tok.to_dict():
                raise ConfigError(
                    f"{key}: {where} was prepared with a {describe(tok)}, but this run reads "
                    f"{self._origin()} ({describe(given)}, another vocabulary); allowed: data "
                    "prepared with that tokenizer (attnlab data prepare --tokenizer RUN_DIR)")
            if given is None and "data.tokenizer" in self.rc.explicit and d.tokenizer != tok.kind:
                raise ConfigError(
                    f"data.tokenizer={d.tokenizer!r} does not fit {key}: {where} was prepared "
                    f"with a {describe(tok)}; allowed: {tok.kind!r} (or leave data.tokenizer "
                    "out: a prepared dir brings its tokenizer)")
        raw = [p for p, _ in sources if not is_token_dir(p)]
        shared = fixed[1] if fixed else given
        if shared is None and len(raw) > 1:
            shared = corpora.mix_tokenizer(raw, self._cache(), d.tokenizer,
                                           vocab_size=d.vocab_size, pre_tokenizer=d.pre_tokenizer)
        if given is None and fixed is None and d.unk:  # the text's characters, and <unk>
            from ..data.prepare import build_tokenizer

            shared = (shared or build_tokenizer(raw, "char")).with_unk()
        found = []
        for path, weight in sources:
            if is_token_dir(path):
                folder = Path(path)
            else:  # a run's own tokenizer was most likely made by the settings: its cache first
                folder = self._prepare(path, shared, settings_first=given is not None and
                                       not self.rc.train.init_from and len(sources) == 1)
            train, val = TokenShards(folder, "train"), TokenShards(folder, "val")
            if d.val_path:  # the val file takes the held-out part's place
                train = JoinedTokens([train, val])
            found.append(Corpus(path, weight, folder, train, val))
        tok = shared or corpora.dir_tokenizer(found[0].dir)
        return found, tok

    def _prepare(self, path: str, tokenizer: Tokenizer | None, settings_first: bool) -> Path:
        """The prepared DIR of text file ``path`` in the cache (made on first use): tokenized
        by ``tokenizer``, or by the one ``data.tokenizer`` builds when it is None. With
        ``settings_first`` the DIR of the settings serves when its tokenizer is ``tokenizer``
        (a resumed or evaluated run finds what its first run prepared)."""
        d = self.rc.data
        try:
            return corpora.corpus_dir(path, self._cache(), tokenizer, kind=d.tokenizer,
                                      vocab_size=d.vocab_size, pre_tokenizer=d.pre_tokenizer,
                                      val_fraction=1 - d.train_frac,
                                      settings_first=settings_first)
        except VocabularyError as e:  # the given tokenizer cannot encode the text
            why = str(e).split(". ")[0]
            if self.rc.train.init_from:
                raise ConfigError(f"train.init_from={self.rc.train.init_from}: its tokenizer "
                                  f"cannot encode the new training text {path}: {why}") from None
            raise DataError(f"training text {path}: {self._origin()} cannot encode it: {why}; "
                            "a run goes on with the tokenizer it was trained with") from None

    # ---- splits ------------------------------------------------------------------------------
    def _encode_file(self, path: str, what: str) -> list[int]:
        """The ids of a val/test text; one error naming the file and the first line this
        run's tokenizer cannot encode (a character tokenizer knows only the characters of
        the training text)."""
        text = read_text(path, what)
        try:
            return self.tokenizer.encode(text)
        except VocabularyError as first:
            n, err = 1, first  # (a newline the vocabulary lacks fails no single line)
            for i, line in enumerate(text.splitlines(), start=1):
                try:
                    self.tokenizer.encode(line)
                except VocabularyError as bad:
                    n, err = i, bad
                    break
            raise DataError(f"{what} {path} line {n}: {str(err).split('. ')[0]}; this run's "
                            "tokenizer was built from its training text, so a val/test text "
                            "may use only what occurs there") from None

    def _file(self, name: str) -> MemoryTokens:
        if name not in self._files:
            path = getattr(self.rc.data, f"{name}_path")
            ids = self._encode_file(path, f"{name} text file")
            self._files[name] = MemoryTokens(torch.tensor(ids, dtype=torch.long))
        return self._files[name]

    def _checked(self, data: Tokens, name: str, source: str = "") -> Tokens:
        if len(data) < self.block + 1:
            of = f" of {source}" if source else ""
            fix = (f"give at least {self.block + 1} tokens of text (or train with a smaller "
                   "train.block_size)")
            if name == "val" and not self.rc.data.val_path:  # the held-out part of a corpus
                held = ("prepare it again with a larger --val-fraction" if is_token_dir(
                    source or self._sources()[0][0]) else "lower data.train_frac")
                fix = f"give a val text file (data.val_path), {held}, or a smaller block_size"
            raise ConfigError(f"the {name} split{of} has {len(data)} tokens, fewer than "
                              f"train.block_size + 1 = {self.block + 1}; {fix}")
        return data

    def split(self, name: str) -> Tokens:
        """The token stream of split ``name`` (a mix: of its first corpus)."""
        d = self.rc.data
        if name == "test" and not d.test_path:
            raise ConfigError("this run has no test split: pass --data FILE (or set "
                              "data.test_path)")
        if name in ("val", "test") and getattr(d, f"{name}_path"):
            return self._checked(self._file(name), name)
        if name not in ("train", "val"):
            raise ConfigError(f"unknown split {name!r}; allowed: train, val, test")
        return self._checked(getattr(self.corpora[0], name), name)

    def _eval_parts(self, split: str) -> list[tuple[Corpus | None, Tokens]]:
        """What ``split`` evaluates: each corpus's val split (a mix without data.val_path),
        else the one stream of :meth:`split`."""
        if split == "val" and not self.rc.data.val_path and len(self.corpora) > 1:
            return [(c, self._checked(c.val, "val", c.source)) for c in self.corpora]
        data = self.split(split)
        return [(None, MemoryTokens(data) if isinstance(data, Tensor) else data)]

    def check_data(self) -> None:
        for c in self.corpora:
            self._checked(c.train, "train", c.source if len(self.corpora) > 1 else "")
        self._eval_parts("val")
        rows = self.eval_batch_size()  # an evaluation draws where all its windows start at once
        for key in ("eval_batches", "final_eval_batches"):
            check_held(f"train.{key}", getattr(self.rc.train, key), rows * WINDOW_START_BYTES,
                       "an evaluation draws where the windows of that many batches start")
        if self.rc.data.test_path:  # read by `attnlab eval --split test`, as it reads it
            self.split("test")

    # ---- batches -----------------------------------------------------------------------------
    def _windows(self, data: Tokens, starts: list[int]) -> tuple[Tensor, Tensor]:
        w = data.windows(starts, self.block + 1)  # (B, T + 1)
        return w[:, :-1].clone(), w[:, 1:].clone()  # (B, T), (B, T): no shared storage

    def next_batch(self) -> tuple[Tensor, Tensor]:
        """``batch_size`` windows at random places: of the one corpus, or of a mix's corpus
        that each row draws by weight (the same generator: resumable); passages read over
        again (``repeat_passages``): all of them in the first ``data.repeat_steps``
        optimizer steps, then a ``data.repeat_frac`` of them."""
        d, step = self.rc.data, self._drawn // self.rc.train.grad_accum
        self._drawn += 1
        frac = 1.0 if step < d.repeat_steps else d.repeat_frac
        if frac:
            w = repeat_passages(self._rows(), frac, self.generator)
            return w[:, :-1].clone(), w[:, 1:].clone()
        return self._rows(split=True)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "drawn": self._drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._drawn = state.get("drawn", 0)  # (a checkpoint from before repeat_steps: 0)

    def _rows(self, split: bool = False) -> Any:
        """The batch's windows of ``block + 1`` tokens, (B, T + 1), or (``split``) as inputs
        and targets."""
        bs, gen = self.rc.train.batch_size, self.generator
        if len(self.corpora) == 1:
            data = self.corpora[0].train
            ix = torch.randint(len(data) - self.block, (bs,), generator=gen)
            if split:
                return self._windows(data, ix.tolist())
            return data.windows(ix.tolist(), self.block + 1).clone()
        weights = torch.tensor([c.weight for c in self.corpora], dtype=torch.float64)  # (C,)
        which = torch.multinomial(weights, bs, replacement=True, generator=gen)  # (B,)
        starts = torch.zeros(bs, dtype=torch.long)  # (B,)
        for i, c in enumerate(self.corpora):
            rows = (which == i).nonzero().flatten()
            if len(rows):
                starts[rows] = torch.randint(len(c.train) - self.block, (len(rows),),
                                             generator=gen)
        w = torch.stack([self.corpora[i].train.window(s, self.block + 1)
                         for i, s in zip(which.tolist(), starts.tolist())])  # (B, T + 1)
        if not split:
            return w
        return w[:, :-1].clone(), w[:, 1:].clone()  # (B, T), (B, T): no shared storage

    # ---- evaluation --------------------------------------------------------------------------
    def _batches(self, data: Tokens, max_batches: int) -> Iterator[tuple[Tensor, Tensor]]:
        """``max_batches`` batches of random windows (the same ones every time), or every
        target of ``data`` when ``max_batches`` is 0: windows every :attr:`stride` tokens
        (non-overlapping by default), each scoring only the targets the one before left over,
        and one more ending at the last token for the targets they leave over (the earlier
        ones ignored there). Read a batch at a time."""
        bs = self.eval_batch_size()
        if max_batches:
            starts = self.sampled_starts(data, max_batches)
        else:
            starts = list(range(0, len(data) - self.block, self.stride))
        seen = 0 if max_batches else self.block - self.stride  # targets the window before scored
        for i in range(0, len(starts), bs):
            x, y = self._windows(data, starts[i:i + bs])
            y[int(i == 0):, :seen] = IGNORE_INDEX  # (B, T): all but the first window
            yield x, y
        left = 0 if max_batches else len(data) - 1 - starts[-1] - self.block  # (whole split)
        if left:  # targets after the last window: one more window, ending at the last token
            x, y = self._windows(data, [len(data) - 1 - self.block])
            y[:, :self.block - left] = IGNORE_INDEX  # scored by the windows before
            yield x, y

    def ablation_batch(self, split: str, batches: int) -> Batch:
        """The windows of ``split`` that ``batches`` sampled evaluation batches read, with
        their next tokens (``attnlab.interpret.lm_batch``)."""
        data = self.split(split)
        if len(data) <= self.block + 1:
            raise UsageError(f"the {split} split is {len(data)} tokens, shorter than one "
                             f"window of {self.block + 1}")
        return lm_batch(data.windows(self.sampled_starts(data, batches), self.block + 1))

    def sampled_starts(self, data: Tokens, max_batches: int) -> list[int]:
        """Where the windows of ``max_batches`` sampled evaluation batches start in ``data``
        (random, the same ones every time: training's periodic evaluation, ``interpret
        ablate --split``)."""
        gen = torch.Generator().manual_seed(self.rc.train.seed + 7919)
        return torch.randint(len(data) - self.block, (max_batches * self.eval_batch_size(),),
                             generator=gen).tolist()

    def _mean_loss(self, model: nn.Module, data: Tokens, device: torch.device, amp: Amp,
                   max_batches: int, progress: Progress) -> float:
        """Mean loss per target over the batches of :meth:`_batches`."""
        total = torch.zeros((), dtype=torch.float64, device=device)
        n = 0.0
        for batch in self._batches(data, max_batches):
            x, y = (t.to(device) for t in batch)
            with amp():  # the loss of every target from its logits (training: loss_only)
                total += self.loss_sum(model, (x, y), loss_only=False).double()
            n += float(self.count((x, y)))
            progress(1)
        return float(total) / max(n, 1)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0, progress: Progress | None = None) -> dict[str, float]:
        """Mean loss and perplexity over ``max_batches`` random windows (the same ones every
        time), or over every target of the split when ``max_batches`` is 0 (see
        :meth:`Task.evaluate`). A mix reports the mean of its corpora's val losses, weighted
        as their training rows are."""
        parts = self._eval_parts(split)
        losses = [self._mean_loss(model, data, device, amp, max_batches,
                                  progress or no_progress) for _, data in parts]
        if len(parts) == 1:
            loss = losses[0]
        else:
            loss = sum(c.weight * v for (c, _), v in zip(parts, losses)) / sum(
                c.weight for c, _ in parts)
            log.info("%s loss by corpus: %s", split, ", ".join(
                f"{c.source} {v:.4f}" for (c, _), v in zip(parts, losses)))
        # a diverged model's loss is nan: reported as such, not an error that ends the run
        return {"val_loss": loss, "ppl": loss if math.isnan(loss) else perplexity(loss)}
