"""Batch prediction with an encoder classifier: ids -> labels and probabilities, texts -> names.

Shapes: B batch, S length, C classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from ..config import check_int
from ..data.batching import check_texts, pad, truncate, warn_if_cut, with_cls
from ..speed import cpu_sdpa_in

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer


class Classification(NamedTuple):
    """Predicted class of each row (B,) and the class probabilities (B, C)."""

    labels: list[int]
    probs: Tensor


def _check_classifier(cfg) -> None:
    """The model must be an encoder with a class head (not a masked LM's vocabulary head)."""
    if cfg.family != "encoder" or cfg.head != "classify":
        got = f"head={cfg.head!r}" if cfg.family == "encoder" else f"family={cfg.family!r}"
        raise ValueError(f"classify needs an encoder classifier (family='encoder', "
                         f"head='classify'), got {got}")


@torch.inference_mode()
def classify(model: nn.Module, ids: Tensor | Sequence[Sequence[int]], *,
             mask: Tensor | None = None, pad_id: int | None = None) -> Classification:
    """Classify a batch with an :class:`~attnlab.models.EncoderClassifier`.

    Args:
        model: the classifier, in eval mode.
        ids: a (B, S) tensor, or a list of id lists of any lengths (right-padded here;
            sequences longer than the model's ``max_len`` are cut).
        mask: (B, S) bool, True at real tokens; default ``ids != pad_id`` for a tensor, the
            padding for lists.
        pad_id: the padding id (default the model config's ``pad_id``).

    Returns:
        The predicted class of each row and the (B, C) class probabilities.
    """
    cfg = model.config
    _check_classifier(cfg)
    pad_id = cfg.pad_id if pad_id is None else pad_id
    device = next(model.parameters()).device
    if not isinstance(ids, Tensor):
        seqs = [list(s)[:cfg.max_len] for s in ids]
        if not seqs or any(not s for s in seqs):
            raise ValueError("classify needs at least one non-empty sequence of ids")
        ids, padded = pad(seqs, pad_id)  # (B, S) each
        mask = padded if mask is None else mask
    ids = ids.to(device)
    mask = mask.to(device) if mask is not None else (None if pad_id is None else ids != pad_id)
    with cpu_sdpa_in(model):  # bf16 / fp16 weights on a CPU: the faster attention kernels
        logits, _ = model(ids, mask=mask)  # (B, C)
    probs = torch.softmax(logits.float(), dim=-1)
    return Classification(probs.argmax(dim=-1).tolist(), probs)


def cls_id(tokenizer: Tokenizer, config) -> int | None:
    """The [CLS] id (the tokenizer's bos) an encoder reads first: a classifier that pools its
    first token; a masked LM reads none (its pooling is the classifier's that fine-tunes it)."""
    return tokenizer.bos_id if config.pools_first_token and config.head == "classify" else None


def encoder_input(tokenizer: Tokenizer, config, text: str) -> list[int]:
    """The ids of ``text`` as an encoder-only model reads a text in training:
    ``tokenizer.encode`` (``[CLS] ... [SEP]`` for WordPiece, bare tokens for BPE and char),
    with ``[CLS]`` (the tokenizer's bos) first for ``cls`` pooling (``config``: the model's
    :class:`~attnlab.config.ModelConfig`)."""
    return with_cls(tokenizer.encode(text.strip()), cls_id(tokenizer, config))


def classify_texts(model: nn.Module, tokenizer: Tokenizer, texts: Sequence[str], *,
                   label_names: Sequence[str] | None = None, max_len: int | None = None,
                   batch_size: int = 64) -> list[tuple[str, float]]:
    """``(label name, probability)`` of the predicted class of each text.

    Texts are encoded as in training: ``[CLS]`` (the tokenizer's bos) first for ``cls``
    pooling, cut to ``max_len`` (the run's ``data.max_len``; never more than the model's
    ``max_len``).

    Args:
        model: an :class:`~attnlab.models.EncoderClassifier` in eval mode.
        tokenizer: the tokenizer the model was trained with.
        texts: the texts (leading/trailing whitespace is dropped; none may be empty).
        label_names: the name of each class (default "0", "1", ...).
        max_len: most tokens per text; default (None or 0) the model's ``max_len``.
        batch_size: texts per forward pass.
    """
    cfg = model.config
    _check_classifier(cfg)
    check_texts(texts, "texts")
    check_int("batch_size", batch_size, 1)
    if max_len is not None:  # (0 = the model's, as data.max_len = 0)
        check_int("max_len", max_len, 0)
    names = [str(i) for i in range(cfg.n_classes)] if label_names is None else label_names
    if (isinstance(names, str) or len(names) != cfg.n_classes
            or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names)):
        raise ValueError(f"label_names={names!r} is not allowed: {cfg.n_classes} distinct "
                         "strings, one per class of the model")
    names = list(names)
    limit = min(max_len or cfg.max_len, cfg.max_len)
    seqs = []
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"text {i + 1} is empty")
        seqs.append(encoder_input(tokenizer, cfg, text))
    warn_if_cut([len(s) for s in seqs], limit, "texts")
    out: list[tuple[str, float]] = []
    for start in range(0, len(seqs), batch_size):
        result = classify(model, [truncate(s, limit, tokenizer.eos_id)
                                  for s in seqs[start:start + batch_size]],
                          pad_id=tokenizer.pad_id)
        for label, p in zip(result.labels, result.probs.tolist()):
            out.append((names[label], p[label]))
    return out


__all__ = ["Classification", "classify", "classify_texts", "cls_id", "encoder_input"]
