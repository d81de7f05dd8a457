"""Labelled sentences for classification (SST-2 style tab-separated files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import torch

from attnlab.data.errors import DataError
from attnlab.data.parallel import read_lines

T = TypeVar("T")


def _expected(num_labels: int | None) -> str:
    """Human description of the allowed labels."""
    if num_labels is None:
        return "a non-negative integer"
    if num_labels == 2:
        return "0 or 1"
    return f"an integer in 0..{num_labels - 1}"


def read_labelled_tsv(path: str | Path, num_labels: int | None = 2,
                      text_column: str = "sentence",
                      label_column: str = "label") -> list[tuple[str, int]]:
    """Read ``(sentence, label)`` pairs from a tab-separated file with a header row.

    The header names the columns, in any order (GLUE's SST-2 has ``sentence<TAB>label``,
    other copies ``label<TAB>sentence``); extra columns are allowed and ignored. Lines may end
    in LF or CRLF; blank lines are skipped; sentences are stripped. No quoting is used (a
    ``"`` is an ordinary character). Labels must be integers in ``0..num_labels-1`` (any
    non-negative integer when ``num_labels`` is None).

    Raises:
        DataFileNotFoundError: the file is missing.
        DataError: naming the file and line for a missing column, a row with the wrong number
            of fields, a non-integer or out-of-range label, or an empty sentence.
    """
    if text_column == label_column:
        raise DataError(f"text_column and label_column are both {text_column!r}: they name two "
                        "columns")
    if num_labels is not None and (not isinstance(num_labels, int) or num_labels < 2):
        raise DataError(f"num_labels must be an integer >= 2, or None, got {num_labels!r}")
    lines = read_lines(path, "labelled TSV file")
    header = [h.strip() for h in lines[0].split("\t")]
    for column in (text_column, label_column):
        if header.count(column) > 1:
            raise DataError(f"labelled TSV file {path} line 1: the header names {column!r} "
                            f"{header.count(column)} times (found columns {header})")
    for column in (text_column, label_column):
        if column not in header:
            raise DataError(f"labelled TSV file {path} line 1: header has no {column!r} column "
                            f"(found columns {header}; need {text_column!r} and "
                            f"{label_column!r}, tab-separated, in any order)")
    text_at, label_at = header.index(text_column), header.index(label_column)
    items: list[tuple[str, int]] = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.rstrip("\r").split("\t")
        where = f"labelled TSV file {path} line {lineno}"
        if len(fields) != len(header):
            raise DataError(f"{where}: has {len(fields)} tab-separated fields, expected "
                            f"{len(header)} like the header {header}")
        raw_label, text = fields[label_at].strip(), fields[text_at].strip()
        try:
            label = int(raw_label)
        except ValueError:
            raise DataError(f"{where}: label {raw_label!r} is not an integer (expected "
                            f"{_expected(num_labels)})") from None
        if label < 0 or (num_labels is not None and label >= num_labels):
            raise DataError(f"{where}: label {label} is out of range (expected "
                            f"{_expected(num_labels)}; for more classes set "
                            "data.label_names or model.n_classes)")
        if not text:
            raise DataError(f"{where}: the {text_column!r} field is empty")
        items.append((text, label))
    if not items:
        raise DataError(f"labelled TSV file {path} has a header but no data rows")
    return items


def split_holdout(items: Sequence[T], frac: float, seed: int) -> tuple[list[T], list[T]]:
    """Deterministically split ``items`` into ``(kept, held_out)``.

    ``round(frac * len(items))`` items, chosen at random with a generator seeded by ``seed``,
    go to ``held_out``; both lists keep the original order of the items.
    """
    if not 0.0 < frac < 1.0:
        raise DataError(f"holdout fraction must be between 0 and 1 (exclusive), got {frac}")
    n_held = round(frac * len(items))
    if n_held < 1 or n_held >= len(items):
        raise DataError(f"cannot hold out {frac:.0%} of {len(items)} items: both parts need at "
                        "least one item")
    generator = torch.Generator().manual_seed(seed)
    held = set(torch.randperm(len(items), generator=generator)[:n_held].tolist())
    kept = [x for i, x in enumerate(items) if i not in held]
    held_out = [x for i, x in enumerate(items) if i in held]
    return kept, held_out


def whole_sentences(texts: Sequence[str]) -> list[str]:
    """The texts that are not a run of words inside another (longer) text, longest first.

    SST-2's ``train.tsv`` holds every phrase of its parse trees as a row of its own; the rows
    that no other row contains are the whole sentences the phrases were cut from. Containment
    is by whole words: ``a b`` is inside ``x a b y`` but ``he`` is not inside ``the``. Texts are
    compared with their whitespace collapsed to single spaces.
    """
    # Longest first: whatever contains a text is longer, and (containment being transitive)
    # inside some whole sentence already found, so only those need checking. Each word maps
    # to the sentences holding it; a text is looked up under its rarest word.
    if isinstance(texts, str):
        raise DataError("whole_sentences takes a list of texts, not one string")
    unique = sorted({" ".join(t.split()) for t in texts}, key=lambda t: (-len(t), t))
    if "" in unique:
        raise DataError("whole_sentences got an empty text (no words)")
    found: list[str] = []
    padded: list[str] = []  # " " + sentence + " ": containment by whole words is ``in``
    holding: dict[str, list[int]] = {}
    for text in unique:
        words = set(text.split())
        rarest = min(words, key=lambda w: len(holding.get(w, ())))
        if any(f" {text} " in padded[i] for i in holding.get(rarest, ())):
            continue
        for w in words:
            holding.setdefault(w, []).append(len(found))
        found.append(text)
        padded.append(f" {text} ")
    return found


def split_sentences(items: Sequence[tuple[str, int]], frac: float,
                    seed: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Hold out whole sentences, and every phrase cut from them: ``(kept, held_out)``.

    A random share of SST-2's rows is no test of unseen text: most held-out rows are phrases
    of sentences whose other phrases were trained on. Here ``held_out`` is ``round(frac * n)`` of
    the ``n`` whole sentences (:func:`whole_sentences`), chosen at random with a generator
    seeded by ``seed``, one row each; ``kept`` is every row that is not a run of words of a
    held-out sentence (so no held-out sentence, nor any of its phrases, is trained on). Both
    keep the original order of the rows. On data without phrases (no row inside another) this
    is a random split of the distinct texts.

    Raises:
        DataError: ``frac`` outside (0, 1), or too few sentences for both parts.
    """
    if not 0.0 < frac < 1.0:
        raise DataError(f"holdout fraction must be between 0 and 1 (exclusive), got {frac}")
    sentences = whole_sentences([text for text, _ in items])
    n_held = round(frac * len(sentences))
    if n_held < 1 or n_held >= len(sentences):
        raise DataError(f"cannot hold out {frac:.0%} of {len(sentences)} whole sentences: both "
                        "parts need at least one (hold out a larger fraction, or use "
                        "data.holdout_unit='row')")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(sentences), generator=generator)[:n_held].tolist()
    held_texts = {sentences[i] for i in order}
    # one line per held-out sentence: a phrase is inside one exactly when its padded text is
    # inside the padded lines joined ("\n" never occurs in a row, so no match spans two)
    joined = "\n".join(f" {t} " for t in sorted(held_texts))
    kept, held_out, seen = [], [], set()
    for text, label in items:
        norm = " ".join(text.split())
        if norm in held_texts:
            if norm not in seen:
                seen.add(norm)
                held_out.append((text, label))
        elif f" {norm} " not in joined:
            kept.append((text, label))
    return kept, held_out
