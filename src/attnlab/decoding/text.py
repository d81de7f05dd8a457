"""Text around decoding: stop strings, incremental detokenisation, and the run-level helpers
``translate_texts`` / ``classify_texts`` that the CLI and the evaluation code call.

Shapes: B batch, S length, C classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .translate import translate


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
    stop string even at 4 tokens per character), so checking costs O(1) per token.
    """

    def __init__(self, stop: Sequence[str], tokenizer: Any, n_rows: int):
        self.stops = _check_stops(stop)
        if tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the generated tokens")
        self.tokenizer = tokenizer
        self.tail = 4 * max(len(s) for s in self.stops) + 4
        self.rows: list[list[int]] = [[] for _ in range(n_rows)]

    def update(self, tokens: list[int]) -> list[bool]:
        """Append this step's token of each row (negative = row finished); return the hits."""
        hits = []
        for row, t in zip(self.rows, tokens):
            if t < 0:
                hits.append(False)
                continue
            row.append(t)
            text = self.tokenizer.decode(row[-self.tail:])
            hits.append(any(s in text for s in self.stops))
        return hits


class TextStream:
    """Turns tokens into text pieces as soon as they decode cleanly (incremental detokenising,
    as in Hugging Face text-generation-inference) and holds back text that may begin a stop
    string. ``stopped`` turns True once a stop string has appeared."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()):
        self.tokenizer, self.stops = tokenizer, _check_stops(stop)
        self.ids: list[int] = []
        self.prefix, self.read = 0, 0  # token offsets: context start, start of unread tokens
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
        """The text held back so far (the stream is over)."""
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


# ---- run-level helpers (CLI and evaluation) --------------------------------------------------
def _data(run: Any) -> dict[str, Any]:
    return run.config.get("data") or {}


def run_tokenizers(run: Any) -> tuple[Any, Any]:
    """Source and target tokenizers of a translation run: ``src_tokenizer.json`` and
    ``tgt_tokenizer.json`` when the run has them, else its one shared ``tokenizer.json``."""
    from ..tokenizers import load_tokenizer

    run_dir = Path(run.run_dir)
    src_path, tgt_path = run_dir / "src_tokenizer.json", run_dir / "tgt_tokenizer.json"
    src = load_tokenizer(src_path) if src_path.is_file() else run.tokenizer
    tgt = load_tokenizer(tgt_path) if tgt_path.is_file() else run.tokenizer
    if src is None or tgt is None:
        raise ValueError(f"run dir {run_dir} has no tokenizer.json: cannot turn text into ids")
    return src, tgt


def _check_family(run: Any, family: str, command: str) -> None:
    got = run.model.config.family
    if got != family:
        raise ValueError(f"{command} needs a run of family {family!r}, but {run.run_dir} holds "
                         f"a {got!r} model")


def decode_limit(model: nn.Module, src_len: int) -> int:
    """Default most target tokens for sources of up to ``src_len`` tokens: 1.5 x + 10, at most
    the model's ``max_len`` (what the training code's BLEU evaluation uses)."""
    return min(model.config.max_len, int(1.5 * src_len) + 10)


def translate_texts(run: Any, texts: Sequence[str], beam: int = 1, length_penalty: float = 0.6,
                    max_len: int | None = None, batch_size: int = 64) -> list[str]:
    """Translate sentences with a trained encoder-decoder run (``attnlab.runs.load_run``).

    Sources are encoded as in training (``data.src_add_special``; cut to the model's
    ``max_len``), sorted by length into batches of ``batch_size``, translated greedily
    (``beam=1``) or with beam search (see :mod:`attnlab.decoding.translate`) and decoded.
    ``max_len`` caps the target tokens; by default :func:`decode_limit` of the batch's longest
    source. Returns one string per input sentence, in input order.
    """
    _check_family(run, "encoder_decoder", "translate")
    src_tok, tgt_tok = run_tokenizers(run)
    if tgt_tok.bos_id is None or tgt_tok.eos_id is None:
        raise ValueError("the run's target tokenizer has no bos/eos tokens: cannot translate")
    add_special = bool(_data(run).get("src_add_special", False))
    cap = run.model.config.max_len
    ids = []
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"sentence {i + 1} is empty")
        ids.append(src_tok.encode(text.strip(), add_special)[:cap])
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [""] * len(ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = [ids[i] for i in chunk]
        limit = max_len or decode_limit(run.model, max(map(len, src)))
        hyps = translate(run.model, src, beam=beam, length_penalty=length_penalty,
                         max_len=limit, bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id,
                         pad_id=src_tok.pad_id)
        for i, hyp in zip(chunk, hyps):
            out[i] = tgt_tok.decode(hyp)
    return out


class Classification(NamedTuple):
    """Predicted class of each row (B,) and the class probabilities (B, C)."""

    labels: list[int]
    probs: Tensor


@torch.inference_mode()
def classify(model: nn.Module, ids: Tensor | Sequence[Sequence[int]], *,
             mask: Tensor | None = None, pad_id: int | None = None) -> Classification:
    """Classify a batch with an :class:`~attnlab.models.EncoderClassifier`.

    ``ids``: a (B, S) tensor (``mask`` default: ``ids != pad_id``) or a list of id lists of any
    lengths (right-padded here; sequences longer than the model's ``max_len`` are cut).
    """
    cfg = model.config
    if cfg.family != "encoder":
        raise ValueError(f"classify needs an encoder (classifier) model, got {cfg.family!r}")
    pad = cfg.pad_id if pad_id is None else pad_id
    device = next(model.parameters()).device
    if not isinstance(ids, Tensor):
        seqs = [list(s)[:cfg.max_len] for s in ids]
        if not seqs or any(not s for s in seqs):
            raise ValueError("classify needs at least one non-empty sequence of ids")
        longest = max(len(s) for s in seqs)
        t = torch.full((len(seqs), longest), 0 if pad is None else pad, dtype=torch.long)
        m = torch.zeros(len(seqs), longest, dtype=torch.bool)
        for row, s in enumerate(seqs):
            t[row, :len(s)], m[row, :len(s)] = torch.tensor(s, dtype=torch.long), True
        ids, mask = t, (m if mask is None else mask)
    ids = ids.to(device)
    mask = mask.to(device) if mask is not None else (None if pad is None else ids != pad)
    logits, _ = model(ids, mask=mask)  # (B, C)
    probs = torch.softmax(logits.float(), dim=-1)
    return Classification(probs.argmax(dim=-1).tolist(), probs)


def label_names(run: Any) -> list[str]:
    """Names of the classes: the data section's ``label_names`` (or ``labels``) if it lists
    them, else "0", "1", ..."""
    n = run.model.config.n_classes
    names = _data(run).get("label_names") or _data(run).get("labels")
    if isinstance(names, (list, tuple)) and len(names) == n:
        return [str(x) for x in names]
    return [str(i) for i in range(n)]


def classify_texts(run: Any, texts: Sequence[str],
                   batch_size: int = 64) -> list[tuple[str, float]]:
    """``(label name, probability)`` of each text, with a trained classifier run; texts are
    encoded as in training: ``[CLS]`` (the tokenizer's bos) first for ``cls`` pooling, cut to
    ``data.max_len`` (or the model's ``max_len``)."""
    _check_family(run, "encoder", "classify")
    tok = run.tokenizer
    if tok is None:
        raise ValueError(f"run dir {run.run_dir} has no tokenizer.json: cannot turn text into ids")
    names = label_names(run)
    cfg = run.model.config
    cls_id = tok.bos_id if cfg.pooling == "cls" else None
    limit = min(_data(run).get("max_len") or cfg.max_len, cfg.max_len)
    seqs = []
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"text {i + 1} is empty")
        seqs.append(([] if cls_id is None else [cls_id]) + tok.encode(text.strip()))
    out: list[tuple[str, float]] = []
    for start in range(0, len(seqs), batch_size):
        result = classify(run.model, [s[:limit] for s in seqs[start:start + batch_size]],
                          pad_id=tok.pad_id)
        for label, p in zip(result.labels, result.probs.tolist()):
            out.append((names[label], p[label]))
    return out


__all__ = [
    "Classification",
    "StopChecker",
    "TextStream",
    "classify",
    "classify_texts",
    "cut_at_stop",
    "decode_limit",
    "label_names",
    "run_tokenizers",
    "translate_texts",
]
