"""Metrics: perplexity, corpus BLEU, accuracy, binary F1 and macro F1.

Predictions and labels may be lists, tuples, numpy arrays or torch tensors (1-D).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .errors import MissingDependencyError


def _as_list(values: Any, what: str) -> list:
    """A 1-D sequence (list, tensor, array) as a Python list of plain values."""
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{what} must be a sequence of labels, one per example, not the "
                         f"string {values[:20]!r}")
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        values = list(values)
    except TypeError:
        raise ValueError(f"{what} must be a sequence of labels, one per example, got "
                         f"{type(values).__name__}") from None
    # tensor / numpy scalars as Python numbers (0-d tensors hash by identity: set() would
    # count one class many times)
    values = [v.item() if hasattr(v, "item") and not isinstance(v, (int, float, str)) else v
              for v in values]
    if any(isinstance(v, list) for v in values):
        raise ValueError(f"{what} must be 1-D (one value per example)")
    return values


def _kind(v: Any) -> str:
    return "strings" if isinstance(v, str) else "numbers"


def _pair(preds: Any, labels: Any) -> tuple[list, list]:
    """Predictions and labels as equally long, non-empty lists, of one kind (strings or
    numbers: "1" never equals 1)."""
    p, y = _as_list(preds, "preds"), _as_list(labels, "labels")
    if len(p) != len(y):
        raise ValueError(f"got {len(p)} predictions but {len(y)} labels; they must pair up")
    if not p:
        raise ValueError("metrics need at least one prediction")
    nan = next((i for i, v in enumerate(p + y) if isinstance(v, float) and math.isnan(v)), None)
    if nan is not None:  # (NaN equals nothing, itself included: each would be a class)
        which, i = ("preds", nan) if nan < len(p) else ("labels", nan - len(p))
        raise ValueError(f"{which}[{i}] is NaN, not a label")
    kinds = {_kind(v) for v in p + y}
    if len(kinds) > 1:
        raise ValueError("preds and labels mix strings and numbers (\"1\" never equals 1): "
                         "give both as class ids or both as label names")
    return p, y


def perplexity(mean_nll: float) -> float:
    """``exp(mean_nll)``: perplexity from the mean negative log-likelihood per token (nats).

    Returns ``inf`` when the value overflows a float.
    """
    try:
        value = float(mean_nll)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"mean_nll must be one number (the mean negative log-likelihood), "
                         f"got {str(mean_nll)[:40]}") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"mean negative log-likelihood must be a number >= 0, got {value}")
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf


def bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> float:
    """Corpus BLEU (0-100) of detokenized ``hypotheses`` against one reference each.

    Computed with sacrebleu's ``corpus_bleu`` (default ``13a`` tokenization), so scores are
    comparable with published sacrebleu numbers.
    """
    try:
        import sacrebleu
    except ImportError as e:
        raise MissingDependencyError("bleu() needs sacrebleu: `pip install sacrebleu` (or "
                                     "install attnlab with the `eval` extra: "
                                     "`pip install 'attnlab[eval]'`)") from e
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise ValueError("bleu() takes lists of sentences, not a single string")
    hyps, refs = list(hypotheses), list(references)
    if any(isinstance(r, (list, tuple)) for r in refs):
        raise ValueError("bleu() takes one reference string per hypothesis, not sacrebleu's "
                         "list of reference streams")
    if len(hyps) != len(refs):
        raise ValueError(f"got {len(hyps)} hypotheses but {len(refs)} references; "
                         "each hypothesis needs one reference")
    if not hyps:
        raise ValueError("bleu() needs at least one hypothesis")
    if not all(isinstance(s, str) for s in hyps + refs):
        raise ValueError("bleu() hypotheses and references must be strings (decode ids first)")
    if tokenize not in sacrebleu.BLEU.TOKENIZERS:
        raise ValueError(f"tokenize={tokenize!r} is not allowed: one of "
                         f"{', '.join(sacrebleu.BLEU.TOKENIZERS)}")
    return float(sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score)


def accuracy(preds: Any, labels: Any) -> float:
    """Fraction of predictions equal to their label (0-1)."""
    p, y = _pair(preds, labels)
    return sum(a == b for a, b in zip(p, y)) / len(p)


def f1(preds: Any, labels: Any, positive: Any = 1) -> float:
    """Binary F1 of class ``positive`` (0-1); 0.0 when it is never predicted nor present.
    ``positive`` is of the labels' kind (a class id, or a label name for string labels)."""
    p, y = _pair(preds, labels)
    if _kind(positive) != _kind(p[0]):
        raise ValueError(f"positive={positive!r} is not of the labels' kind ({_kind(p[0])}, "
                         f"e.g. {p[0]!r})")
    tp = sum(a == positive and b == positive for a, b in zip(p, y))
    fp = sum(a == positive and b != positive for a, b in zip(p, y))
    fn = sum(a != positive and b == positive for a, b in zip(p, y))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def macro_f1(preds: Any, labels: Any) -> float:
    """Unweighted mean of per-class F1 over every class seen in ``labels`` or ``preds``."""
    p, y = _pair(preds, labels)
    classes = sorted(set(p) | set(y))
    return sum(f1(p, y, positive=c) for c in classes) / len(classes)
