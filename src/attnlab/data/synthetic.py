"""Synthetic sequence-to-sequence tasks generated on the fly: ``copy``, ``reverse``, ``sort``.

Token ids: ``pad=0``, ``bos=1``, ``eos=2``; content tokens are drawn uniformly from
``[3, vocab_size)``. ``src`` holds only the content tokens, right-padded (the encoder needs
no bos/eos); ``tgt`` is ``[bos] + answer + [eos]``, right-padded, so the decoder input is
``tgt[:, :-1]`` and the label ``tgt[:, 1:]``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from attnlab.data.errors import DataError

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_CONTENT_ID = 3
SYNTHETIC_NAMES = ("copy", "reverse", "sort")  # the data sets this module makes


class SyntheticData:
    """A toy seq2seq data set with sequences of ``min_len..max_len`` content tokens."""

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, name: str, vocab_size: int, min_len: int, max_len: int) -> None:
        if name not in SYNTHETIC_NAMES:
            raise DataError(f"unknown synthetic task {name!r}; allowed: "
                            f"{', '.join(SYNTHETIC_NAMES)}")
        if vocab_size <= FIRST_CONTENT_ID:
            raise DataError(f"synthetic vocab_size must be > {FIRST_CONTENT_ID} (ids 0-2 are "
                            f"pad/bos/eos), got {vocab_size}")
        if not 1 <= min_len <= max_len:
            raise DataError(f"synthetic lengths need 1 <= min_len <= max_len, got "
                            f"min_len={min_len}, max_len={max_len}")
        self.name, self.vocab_size = name, vocab_size
        self.min_len, self.max_len = min_len, max_len

    def answer(self, src_tokens: Sequence[int] | torch.Tensor) -> list[int]:
        """The correct output (without bos/eos) for one source sequence; pads are ignored."""
        if isinstance(src_tokens, torch.Tensor):
            src_tokens = src_tokens.tolist()
        # (int() would read 3.7 as 3, and the string "345" as ids 3, 4, 5)
        if isinstance(src_tokens, str) or not all(isinstance(t, numbers.Integral)
                                                  for t in src_tokens):
            raise DataError("answer takes one source sequence of integer token ids, got "
                            f"{str(src_tokens)[:40]}")
        content = [int(t) for t in src_tokens if t != PAD_ID]
        bad = [t for t in content if not FIRST_CONTENT_ID <= t < self.vocab_size]
        if bad:
            raise DataError(f"source tokens {bad[:5]} are not content tokens of task "
                            f"{self.name!r} (expected ids in {FIRST_CONTENT_ID}.."
                            f"{self.vocab_size - 1}, or pad {PAD_ID})")
        if self.name == "reverse":
            return content[::-1]
        if self.name == "sort":
            return sorted(content)
        return content

    def sample(self, batch_size: int,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch ``(src [B, S], tgt [B, T])`` of padded long tensors; T = S + 2 at most."""
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        lengths = torch.randint(self.min_len, self.max_len + 1, (batch_size,),
                                generator=generator)
        longest = int(lengths.max())
        tokens = torch.randint(FIRST_CONTENT_ID, self.vocab_size, (batch_size, longest),
                               generator=generator)
        src = torch.full((batch_size, longest), PAD_ID, dtype=torch.long)
        tgt = torch.full((batch_size, longest + 2), PAD_ID, dtype=torch.long)
        for b, n in enumerate(lengths.tolist()):
            src[b, :n] = tokens[b, :n]
            answer = [BOS_ID, *self.answer(tokens[b, :n]), EOS_ID]
            tgt[b, : n + 2] = torch.tensor(answer, dtype=torch.long)
        return src, tgt
