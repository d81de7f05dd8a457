"""Text around LM decoding: stop strings and incremental detokenisation (streaming)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer


# Prompt tokens decoded before a continuation, so that it reads as it does after the prompt:
# tokenizers that drop a word's leading space at the start of a text (SentencePiece's "▁" as
# in Llama, whitespace-split BPE) keep it there.
CONTEXT_TOKENS = 4


def decode_after(tokenizer: Tokenizer, context: Sequence[int], ids: Sequence[int],
                 head: str | None = None) -> str:
    """The text of ``ids`` as it reads after ``context`` (the prompt's last tokens): the part of
    ``decode(context + ids)`` after ``head = decode(context)`` (pass it when known)."""
    if not context:
        return tokenizer.decode(list(ids))
    head = tokenizer.decode(list(context)) if head is None else head
    full = tokenizer.decode([*context, *ids])
    return full[len(head):] if full.startswith(head) else tokenizer.decode(list(ids))


def _check_stops(stop: Sequence[str]) -> list[str]:
    if isinstance(stop, str):
        stop = [stop]
    stops = list(stop)
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
    return stops


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    cut = len(text)
    for s in _check_stops(stop):
        i = text.find(s)
        if i >= 0:
            cut = min(cut, i)
    return text[:cut]


class StopChecker:
    """Tells, token by token, which rows' generated text now contains a stop string.

    Only the last few tokens of a row are decoded at each step (enough to hold the longest
    stop string even at 4 tokens per character), so checking costs O(1) per token; the first
    ones are decoded after the row's ``prompts`` tokens (:func:`decode_after`), as they read.
    """

    def __init__(self, stop: Sequence[str], tokenizer: Tokenizer, n_rows: int,
                 prompts: Sequence[Sequence[int]] = ()):
        self.stops = _check_stops(stop)
        if tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the generated tokens")
        self.tokenizer = tokenizer
        self.tail = 4 * max(len(s) for s in self.stops) + 4
        self.rows: list[list[int]] = [[] for _ in range(n_rows)]
        self.context = [list(p[-CONTEXT_TOKENS:]) for p in prompts] or [[] for _ in self.rows]
        self.heads = [tokenizer.decode(c) if c else "" for c in self.context]  # decoded once

    def update(self, tokens: list[int]) -> list[bool]:
        """Append this step's token of each row (negative = row finished); return the hits."""
        hits = []
        for row, context, head, t in zip(self.rows, self.context, self.heads, tokens):
            if t < 0:
                hits.append(False)
                continue
            row.append(t)
            text = decode_after(self.tokenizer, context if len(row) <= self.tail else (),
                                row[-self.tail:], head)
            hits.append(any(s in text for s in self.stops))
        return hits


class TextStream:
    """Turns tokens into text pieces as soon as they decode cleanly (incremental detokenising,
    as in Hugging Face text-generation-inference) and holds back text that may begin a stop
    string. ``stopped`` turns True once a stop string has appeared. ``prompt``: the prompt's
    ids, whose last tokens the first piece is decoded after (:func:`decode_after`)."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = (),
                 prompt: Sequence[int] = ()):
        self.tokenizer, self.stops = tokenizer, _check_stops(stop)
        self.ids: list[int] = list(prompt[-CONTEXT_TOKENS:])
        # token offsets: context start, start of unread tokens
        self.prefix, self.read = 0, len(self.ids)
        self.text, self.sent = "", 0  # decoded text so far, and how much of it was yielded
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one token; return the text that is now safe to show (maybe "")."""
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):  # a whole character
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
        return self._release(final=False)

    def flush(self) -> str:
        """The text held back so far (the stream is over), with the tokens that end inside a
        character decoded as they are (replacement characters included), as a decode of all
        the tokens would show them."""
        if self.read < len(self.ids):
            before = self.tokenizer.decode(self.ids[self.prefix:self.read])
            self.text += self.tokenizer.decode(self.ids[self.prefix:])[len(before):]
            self.prefix = self.read = len(self.ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        cut = cut_at_stop(self.text, self.stops) if self.stops else self.text
        if len(cut) < len(self.text):
            self.stopped = True
            end = len(cut)
        elif final:
            end = len(self.text)
        else:  # hold back a tail that could still grow into a stop string
            hold = max((n for s in self.stops for n in range(1, len(s))
                        if self.text.endswith(s[:n])), default=0)
            end = len(self.text) - hold
        piece, self.sent = self.text[self.sent:end], max(self.sent, end)
        return piece


__all__ = ["CONTEXT_TOKENS", "StopChecker", "TextStream", "cut_at_stop", "decode_after"]
