"""Padding and resumable, seeded batch iterators for seq2seq and classification data.

Each epoch is planned from a generator seeded with ``(seed, epoch)`` only, so
``load_state_dict(state_dict())`` on a fresh iterator over the same data continues with
exactly the batches an uninterrupted run would have produced next.

Example::

    for epoch in range(n_epochs):
        for src, tgt_in, tgt_out in batches:  # the rest of the current epoch
            ...
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from attnlab.config import check_int
from attnlab.data.errors import DataError

log = logging.getLogger(__name__)


def pad(seqs: Sequence[Sequence[int]], pad_id: int | None, *,
        left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack sequences of ids of any lengths into one padded batch.

    Args:
        seqs: B sequences of token ids (lists, or 1-D tensors); empty ones are allowed.
        pad_id: the id to pad with (0 when None: the mask then tells pads apart).
        left: put the pads first (right-aligned rows), as generation from prompts needs;
            by default the pads go last.

    Returns:
        ``ids`` (B, L) long, L the longest length, and ``mask`` (B, L) bool, True at real
        tokens.
    """
    if len(seqs) == 0:
        raise DataError("pad needs at least one sequence")
    if isinstance(seqs, str) or (isinstance(seqs, torch.Tensor) and seqs.dim() != 2):
        raise DataError("pad takes a list of id sequences (one sequence: [ids]), got "
                        f"{str(seqs)[:40]}")
    rows = [s.tolist() if isinstance(s, torch.Tensor) else list(s) for s in seqs]
    lengths = torch.tensor([len(r) for r in rows])  # (B,)
    longest = int(lengths.max())
    fill = 0 if pad_id is None else pad_id
    # Padding the Python lists and converting once is cheaper than one copy per row.
    if left:
        rows = [[fill] * (longest - len(r)) + r for r in rows]
    else:
        rows = [r + [fill] * (longest - len(r)) for r in rows]
    try:
        ids = torch.tensor(rows)  # (its dtype first: dtype=long would truncate 2.7 to 2)
    except (TypeError, ValueError):
        raise DataError("pad takes sequences of integer token ids (encode text first), got "
                        f"{str(rows)[:60]}") from None
    if ids.numel() and ids.dtype.is_floating_point:
        raise DataError(f"pad takes integer token ids and pad_id, got {ids.dtype} values")
    ids = ids.long().view(len(rows), longest)  # (B, L); L may be 0
    cols = torch.arange(longest)[None, :]  # (1, L)
    mask = cols >= (longest - lengths)[:, None] if left else cols < lengths[:, None]  # (B, L)
    return ids, mask


def with_cls(ids: Sequence[int], cls_id: int | None) -> list[int]:
    """``ids`` with ``cls_id`` ([CLS]) first, once: prepended unless ``cls_id`` is None or
    already the first id (``WordPieceTokenizer.encode(text, add_special=True)`` adds it)."""
    ids = list(ids)
    return ids if cls_id is None or ids[:1] == [cls_id] else [cls_id, *ids]


def truncate(ids: Sequence[int], max_len: int | None, end_id: int | None = None) -> list[int]:
    """The first ``max_len`` of ``ids``; a sequence that ends in ``end_id`` (WordPiece's
    ``[SEP]``) keeps it last, as Hugging Face's truncation does."""
    ids = list(ids)
    if max_len is None or len(ids) <= max_len:
        return ids
    if end_id is not None and ids[-1] == end_id and max_len > 1:
        return ids[:max_len - 1] + [end_id]
    return ids[:max_len]


def check_texts(texts: Any, what: str) -> None:
    """``texts`` must be a sequence of strings (one string alone would be read character by
    character); ``what`` names them in the message ("sentences")."""
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        got = "one string" if isinstance(texts, str) else "items that are not strings"
        raise TypeError(f"{what} must be a list of strings, got {got}; wrap a single text in "
                        "a list")


def warn_if_cut(lengths: Sequence[int], limit: int, what: str, last: int | None = None) -> None:
    """One warning when some of the inputs of ``lengths`` tokens are longer than ``limit``
    (they are then cut to it, as in training): the user sees that part of a text was not
    read. ``what``: the inputs, plural ("sentences"); ``last``: the inputs keep their last
    this many tokens (a prompt, whose continuation follows its end), not their first
    ``limit``."""
    n = sum(length > limit for length in lengths)
    if n:
        log.warning("%d of %d %s have more than %d tokens (max_len): only their %s %d are "
                    "read", n, len(lengths), what, limit, "first" if last is None else "last",
                    limit if last is None else last)


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A generator determined by ``(seed, epoch)`` alone."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))


class _EpochBatches:
    """Shared epoch/position bookkeeping; subclasses plan epochs and collate batches."""

    def __init__(self, num_examples: int, seed: int) -> None:
        if num_examples == 0:
            raise DataError(f"{type(self).__name__} needs at least one example")
        check_int("seed", seed, 0)
        self.num_examples, self.seed = num_examples, seed
        self.epoch, self.position = 0, 0

    def _plan(self, epoch: int) -> list[list[int]]:
        """Example indices of every batch of ``epoch``, in order."""
        raise NotImplementedError

    def _collate(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        """Tensors of one batch."""
        raise NotImplementedError

    def __len__(self) -> int:
        """Number of batches in one epoch."""
        return len(self._plan(self.epoch))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        plan = self._plan(self.epoch)
        if self.position >= len(plan):  # the last epoch was used up but not closed
            self.epoch, self.position = self.epoch + 1, 0
            plan = self._plan(self.epoch)
        while self.position < len(plan):
            indices = plan[self.position]
            self.position += 1  # counted as handed out before the caller sees it
            yield self._collate(indices)
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands: ``epoch`` and ``position``, plus checks on the data."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "num_examples": self.num_examples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict()`` taken on an iterator over the same data and seed."""
        for key in ("seed", "num_examples"):
            if state.get(key) != getattr(self, key):
                raise DataError(f"cannot resume batches: saved {key}={state.get(key)!r} but this "
                                f"iterator has {key}={getattr(self, key)!r} (resume with the "
                                "same data and seed)")
        if "epoch" not in state or "position" not in state:
            raise DataError("cannot resume batches: the state has no epoch and position (a "
                            "state_dict() of these batches is needed)")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self._plan(epoch)):
            raise DataError(f"cannot resume batches: invalid epoch {epoch} / position {position}")
        self.epoch, self.position = epoch, position


class Seq2SeqBatches(_EpochBatches):
    """Length-bucketed batches of ``(src, tgt_in, tgt_out)`` under a token budget.

    Each epoch the examples are shuffled, stably sorted by ``(len(src), len(tgt))`` (so
    examples of equal length come in random order), cut greedily into batches whose padded
    size ``batch_size * max(longest src, longest tgt)`` stays within ``max_tokens`` (as in
    fairseq and the Annotated Transformer), and the batches are shuffled.

    Args:
        pairs: encoded ``(src_ids, tgt_ids)``; each ``tgt_ids`` must be ``[bos] ... [eos]``.
            Or a reader of them (:class:`~attnlab.data.pairs.PairShards`): the epochs are then
            planned from its ``lengths()`` alone, the same plan as for a list of the same
            pairs, and a batch reads only its own rows (``pairs(indices)``).
        max_tokens: padded-token budget per batch.
        pad_id: padding id (use it as ``ignore_index`` of the loss).
        seed: seeds the per-epoch shuffles.
        shuffle: if False, batches come in length order and examples are not shuffled.

    Yields ``src [B, S]``, ``tgt_in = tgt[:, :-1]`` and ``tgt_out = tgt[:, 1:]`` (both
    ``[B, T-1]``), long tensors padded with ``pad_id``.
    """

    def __init__(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]] | Any,
                 max_tokens: int, pad_id: int, seed: int = 0, shuffle: bool = True) -> None:
        super().__init__(len(pairs), seed)
        check_int("max_tokens", max_tokens, 1)
        self.reader = hasattr(pairs, "lengths") and hasattr(pairs, "pairs")
        if self.reader:
            src_len, tgt_len = (np.asarray(n, dtype=np.int64) for n in pairs.lengths())
        else:
            src_len = np.fromiter((len(s) for s, _ in pairs), np.int64, len(pairs))
            tgt_len = np.fromiter((len(t) for _, t in pairs), np.int64, len(pairs))
        self.src_len, self.tgt_len = src_len.astype(np.int32), tgt_len.astype(np.int32)  # (N,)
        short = np.flatnonzero((src_len < 1) | (tgt_len < 2))
        if short.size:
            raise DataError(f"{short.size} seq2seq pairs (first: index {int(short[0])}) have an "
                            "empty source or a target shorter than 2 ids (targets need [bos] ... "
                            "[eos])")
        sizes = np.maximum(src_len, tgt_len)  # (N,)
        too_long = int((sizes > max_tokens).sum())
        if too_long:
            raise DataError(f"max_tokens={max_tokens} is smaller than {too_long} examples "
                            f"(the longest has {int(sizes.max())} tokens); raise max_tokens or "
                            "drop long sentences")
        self.pairs, self.max_tokens, self.pad_id, self.shuffle = pairs, max_tokens, pad_id, shuffle
        self._planned: tuple[int, list[np.ndarray]] | None = None  # the last epoch's plan

    def _plan(self, epoch: int) -> list[np.ndarray]:
        """Example indices of every batch of ``epoch`` (int64 arrays: a plan of millions of
        pairs stays small), made once per epoch."""
        if self._planned is None or self._planned[0] != epoch:
            self._planned = (epoch, self._make_plan(epoch))
        return self._planned[1]

    def _make_plan(self, epoch: int) -> list[np.ndarray]:
        generator = _epoch_generator(self.seed, epoch)
        n = self.num_examples
        if self.shuffle:
            order = torch.randperm(n, generator=generator).numpy()  # (N,)
        else:
            order = np.arange(n)
        # a stable sort by (len(src), len(tgt)): one key, the target length below the source's
        src, tgt = self.src_len.astype(np.int64), self.tgt_len.astype(np.int64)
        key = src[order] * (int(tgt.max()) + 1) + tgt[order]
        order = order[np.argsort(key, kind="stable")]
        sizes = np.maximum(src, tgt)[order].tolist()
        batches: list[np.ndarray] = []
        current: list[int] = []
        longest = 0
        for i, size in zip(order.tolist(), sizes):
            if current and (len(current) + 1) * max(longest, size) > self.max_tokens:
                batches.append(np.array(current, dtype=np.int64))
                current, longest = [], 0
            current.append(i)
            longest = max(longest, size)
        batches.append(np.array(current, dtype=np.int64))
        if self.shuffle:
            batches = [batches[j] for j in torch.randperm(len(batches), generator=generator)]
        return batches

    def _collate(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.reader:  # only this batch's rows are read
            rows = [(s.tolist(), t.tolist()) for s, t in self.pairs.pairs(indices)]
        else:
            rows = [self.pairs[i] for i in indices]
        src = pad([s for s, _ in rows], self.pad_id)[0]  # (B, S)
        tgt = pad([t for _, t in rows], self.pad_id)[0]  # (B, T)
        return src, tgt[:, :-1], tgt[:, 1:]


BUCKET_WINDOW = 50  # batches per length-sorted window of ClassificationBatches(bucket=True)


class ClassificationBatches(_EpochBatches):
    """Shuffled fixed-size batches of ``(ids [B, T], labels [B])`` for sentence classification.

    Args:
        examples: ``(token_ids, label)`` pairs.
        batch_size: examples per batch (the last batch of an epoch may be smaller).
        pad_id: padding id; pads are on the right.
        cls_id: if given, prepended to every sequence that does not already start with it
            (``WordPieceTokenizer.encode(text, add_special=True)`` adds ``[CLS]`` itself).
        max_len: if given, sequences (including the prepended ``cls_id``) are cut to this many
            ids.
        seed: seeds the per-epoch shuffles; ``shuffle=False`` keeps the input order.
        bucket: group examples of similar length: each shuffled window of
            ``BUCKET_WINDOW * batch_size`` examples is sorted by length before it is cut into
            batches, and the batches are shuffled (as HF's ``group_by_length``), so a batch
            pads little.
    """

    def __init__(self, examples: Sequence[tuple[Sequence[int], int]], batch_size: int,
                 pad_id: int, cls_id: int | None = None, max_len: int | None = None,
                 seed: int = 0, shuffle: bool = True, bucket: bool = False,
                 end_id: int | None = None) -> None:
        super().__init__(len(examples), seed)
        check_int("batch_size", batch_size, 1)
        if max_len is not None:
            check_int("max_len", max_len, 1)
        self.ids = [truncate(with_cls(ids, cls_id), max_len, end_id) for ids, _ in examples]
        if any(len(ids) == 0 for ids in self.ids):
            raise DataError("ClassificationBatches got an example with no token ids")
        self.labels = []
        for i, (_, label) in enumerate(examples):
            try:  # (int() would read 1.7 as 1)
                y = operator.index(label)
            except TypeError:
                y = -1
            if y < 0:
                raise DataError(f"example {i}: label {label!r} is not a class id (an integer "
                                ">= 0)")
            self.labels.append(y)
        self.batch_size, self.pad_id, self.shuffle = batch_size, pad_id, shuffle
        self.bucket = bucket

    def _plan(self, epoch: int) -> list[list[int]]:
        def cut(order: list[int]) -> list[list[int]]:
            return [order[i: i + self.batch_size] for i in range(0, len(order), self.batch_size)]

        if not self.shuffle:
            return cut(list(range(self.num_examples)))
        generator = _epoch_generator(self.seed, epoch)
        order = torch.randperm(self.num_examples, generator=generator).tolist()
        if not self.bucket:
            return cut(order)
        window = BUCKET_WINDOW * self.batch_size
        length = [len(ids) for ids in self.ids]
        batches = [b for start in range(0, len(order), window)
                   for b in cut(sorted(order[start: start + window], key=length.__getitem__))]
        return [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]

    def _collate(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = pad([self.ids[i] for i in indices], self.pad_id)[0]
        return ids, torch.tensor([self.labels[i] for i in indices], dtype=torch.long)
