"""Test oracles: the simple in-memory implementations that attnlab's streaming code once was,
kept here to check it against (not part of the library).

:class:`LMData` splits a token stream held in memory into train/val and samples nanoGPT's
``(x, y)`` windows, ``y`` being ``x`` shifted by one token: what a language model trained on
before prepared token dirs (:mod:`attnlab.data.shards`), so runs and resumes are compared with
it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.data import DataError
from attnlab.tokenizers import Tokenizer

SPLITS = ("train", "val")


class LMData:
    """A token stream split into ``train`` (first part) and ``val`` (last part) tensors.

    Args:
        ids: the whole corpus as token ids (a list or 1-D tensor).
        train_frac: fraction of tokens that go to ``train`` (default 0.9, as in nanoGPT).
    """

    def __init__(self, ids: Sequence[int] | torch.Tensor, train_frac: float = 0.9) -> None:
        try:
            data = torch.as_tensor(ids)  # (its dtype first: dtype=long would truncate 2.7)
        except (TypeError, ValueError, RuntimeError):
            raise DataError("LMData needs token ids (encode the text first, or use "
                            f"LMData.from_text), got {str(ids)[:40]}") from None
        if data.dim() != 1:
            raise DataError(f"LMData needs a 1-D sequence of token ids, got shape "
                            f"{tuple(data.shape)}")
        if data.dtype.is_floating_point:
            raise DataError(f"LMData needs integer token ids, got {data.dtype} values")
        if len(data) and int(data.min()) < 0:
            raise DataError(f"LMData needs token ids >= 0, got {int(data.min())}")
        data = data.long()
        if not 0.0 < train_frac < 1.0:
            raise DataError(f"train_frac must be between 0 and 1 (exclusive), got {train_frac}")
        n = int(train_frac * len(data))
        if n < 1 or n >= len(data):
            raise DataError(f"a corpus of {len(data)} tokens is too short to split with "
                            f"train_frac={train_frac}: both train and val need tokens")
        self.train, self.val = data[:n], data[n:]

    @classmethod
    def from_text(cls, text: str, tokenizer: Tokenizer, train_frac: float = 0.9) -> LMData:
        """Encode ``text`` with any :class:`attnlab.tokenizers.Tokenizer` and split it."""
        return cls(tokenizer.encode(text), train_frac)

    def split(self, name: str) -> torch.Tensor:
        """The token tensor of split ``name`` (``"train"`` or ``"val"``)."""
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r}; allowed: {', '.join(SPLITS)}")
        return self.train if name == "train" else self.val

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: torch.Generator,
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``batch_size`` random windows of ``block_size`` tokens, as nanoGPT does.

        Returns ``(x, y)``, both ``[batch_size, block_size]`` long tensors with
        ``y[:, t] == x[:, t + 1]`` inside the window (``y`` is the next token of each position).
        """
        data = self.split(split)
        if batch_size < 1 or block_size < 1:
            raise DataError(f"batch_size and block_size must be >= 1, got {batch_size} and "
                            f"{block_size}")
        if block_size + 1 > len(data):
            raise DataError(f"block_size {block_size} is too long for the {split} split of "
                            f"{len(data)} tokens (need block_size + 1 <= {len(data)}); use a "
                            "smaller block_size or more data")
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
        x = torch.stack([data[i: i + block_size] for i in ix.tolist()])
        y = torch.stack([data[i + 1: i + 1 + block_size] for i in ix.tolist()])
        if device is not None:
            x, y = x.to(device), y.to(device)
        return x, y
