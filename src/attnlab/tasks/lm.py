"""Language modelling: next-token prediction on a text, nanoGPT-style random windows."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config import ConfigError
from ..data import DataError, LMData, embedded_corpus, read_text
from ..metrics import perplexity
from ..models import token_loss
from ..models.common import IGNORE_INDEX
from ..tokenizers import Tokenizer
from .base import Amp, Task, data_file, resolve_model, train_tokenizer

if TYPE_CHECKING:  # annotations only: the training config imports the task table
    from ..train.config import RunConfig


class LMTask(Task):
    """Next-token prediction on a text: random windows of ``block_size`` tokens."""

    family = "decoder"
    kind = "language-model"
    eval_data_keys = ("path",)
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

    def _encode_file(self, path: str, what: str) -> list[int]:
        """The ids of a val/test text; one error naming the file and the first line this
        run's tokenizer cannot encode (a character tokenizer knows only the characters of
        the training text)."""
        text = read_text(path, what)
        try:
            return self.tokenizer.encode(text)
        except ValueError as first:
            n, err = 1, first  # (a newline the vocabulary lacks fails no single line)
            for i, line in enumerate(text.splitlines(), start=1):
                try:
                    self.tokenizer.encode(line)
                except ValueError as bad:
                    n, err = i, bad
                    break
            raise DataError(f"{what} {path} line {n}: {str(err).split('. ')[0]}; this run's "
                            "tokenizer was built from its training text, so a val/test text "
                            "may use only what occurs there") from None

    def split(self, name: str) -> Tensor:
        if name not in self._splits:
            d, tok = self.rc.data, self.tokenizer
            if name == "test" and not d.test_path:
                raise ConfigError("this run has no test split: pass --data FILE (or set "
                                  "data.test_path)")
            if name in ("val", "test") and getattr(d, f"{name}_path"):
                ids = self._encode_file(getattr(d, f"{name}_path"), f"{name} text file")
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

    def check_data(self) -> None:
        for name in ("train", "val"):
            self.split(name)

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
        every target of the split when ``max_batches`` is 0: its non-overlapping windows, and
        one more ending at the last token for the targets they leave over (the earlier ones
        ignored there)."""
        data, bs = self.split(split), self.eval_batch_size()
        if max_batches:
            gen = torch.Generator().manual_seed(self.rc.train.seed + 7919)
            starts = torch.randint(len(data) - self.block, (max_batches * bs,),
                                   generator=gen).tolist()
        else:
            starts = list(range(0, len(data) - self.block, self.block))
        batches = [self._windows(data, starts[i:i + bs]) for i in range(0, len(starts), bs)]
        left = 0 if max_batches else len(data) - 1 - len(starts) * self.block  # (whole split)
        if left:  # targets after the last window: one more window, ending at the last token
            x, y = self._windows(data, [len(data) - 1 - self.block])
            y[:, :self.block - left] = IGNORE_INDEX  # scored by the windows before
            batches.append((x, y))
        total = torch.zeros((), dtype=torch.float64, device=device)
        n = 0.0
        for batch in batches:
            x, y = (t.to(device) for t in batch)
            with amp():
                total += self.loss_sum(model, (x, y)).double()
            n += float(self.count((x, y)))
        loss = float(total) / max(n, 1)
        # a diverged model's loss is nan: reported as such, not an error that ends the run
        return {"val_loss": loss, "ppl": loss if math.isnan(loss) else perplexity(loss)}
