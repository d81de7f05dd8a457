"""Tests for attnlab.metrics: perplexity, BLEU, accuracy, F1, macro F1."""

from __future__ import annotations

import builtins
import math

import numpy as np
import pytest
import torch

from attnlab.metrics import accuracy, bleu, f1, macro_f1, perplexity


def test_perplexity() -> None:
    assert perplexity(0.0) == 1.0
    assert perplexity(math.log(65)) == pytest.approx(65.0)
    assert perplexity(torch.tensor(2.0)) == pytest.approx(math.e**2)
    assert perplexity(1e6) == math.inf
    with pytest.raises(ValueError, match=">= 0"):
        perplexity(-0.5)
    with pytest.raises(ValueError, match=">= 0"):
        perplexity(float("nan"))


def test_bleu_identical_corpus_is_100() -> None:
    corpus = ["the cat sat on the mat .", "a man rides a horse through the field ."]
    assert bleu(corpus, corpus) == pytest.approx(100.0)


def test_bleu_hand_computed() -> None:
    # Precisions 5/6, 3/5, 2/4, 1/3; equal lengths so no brevity penalty.
    expected = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert bleu(["the cat sat on the mat"], ["the cat sat on a mat"]) == pytest.approx(expected)


def test_bleu_matches_sacrebleu() -> None:
    sacrebleu = pytest.importorskip("sacrebleu",
                                    reason="the BLEU cross-check needs sacrebleu (dev extra)")
    hyps = ["Two young men are outside.", "A girl climbs into a wooden playhouse.", "Dogs run"]
    refs = ["Two young white men are outside near bushes.", "A little girl climbing into a "
            "wooden playhouse.", "Two dogs are running in the snow."]
    assert bleu(hyps, refs) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert 0.0 < bleu(hyps, refs) < 100.0


def test_bleu_errors(monkeypatch) -> None:
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="at least one"):
        bleu([], [])
    with pytest.raises(ValueError, match="not a single string"):
        bleu("a cat", "a cat")
    real_import = builtins.__import__

    def no_sacrebleu(name, *args, **kwargs):
        if name == "sacrebleu":
            raise ImportError("No module named 'sacrebleu'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_sacrebleu)
    with pytest.raises(ImportError, match="pip install sacrebleu.*eval"):
        bleu(["a"], ["a"])


def test_accuracy_and_f1_hand_computed() -> None:
    preds = [1, 1, 0, 0, 1, 0, 1, 1]
    labels = [1, 0, 0, 1, 1, 0, 0, 1]
    # tp=3 fp=2 fn=1 tn=2
    assert accuracy(preds, labels) == pytest.approx(5 / 8)
    assert f1(preds, labels) == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))  # 6/9
    # class 0: tp=2 fp=1 fn=2 -> 4/7
    assert f1(preds, labels, positive=0) == pytest.approx(4 / 7)
    assert macro_f1(preds, labels) == pytest.approx((6 / 9 + 4 / 7) / 2)


def test_metrics_accept_tensors_and_arrays() -> None:
    assert accuracy(torch.tensor([0, 1, 2]), np.array([0, 1, 1])) == pytest.approx(2 / 3)
    # three classes: F1 of 0 = 1, of 1 = 2/3, of 2 = 0
    assert macro_f1(torch.tensor([0, 1, 2]), [0, 1, 1]) == pytest.approx((1 + 2 / 3 + 0) / 3)


def test_f1_edge_cases_and_errors() -> None:
    assert f1([0, 0], [0, 0]) == 0.0  # positive class never predicted nor present
    assert f1([1, 1], [1, 1]) == 1.0
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="at least one"):
        f1([], [])
    with pytest.raises(ValueError, match="1-D"):
        accuracy(torch.zeros(2, 2), torch.zeros(2, 2))


def test_metrics_take_lists_of_tensor_scalars_as_numbers() -> None:
    """`list(tensor)` holds 0-d tensors, which hash by identity: each counted as a class of its
    own gave macro F1 0.7755 (and tensors back) where it is 0.7619."""
    preds, labels = list(torch.tensor([1, 1, 0, 0, 0])), torch.tensor([1, 0, 0, 0, 0])
    # class 1: 2 * 1 / (2 * 1 + 1 + 0) = 2/3; class 0: 2 * 3 / (2 * 3 + 0 + 1) = 6/7
    value = macro_f1(preds, labels)
    assert type(value) is float and value == pytest.approx((2 / 3 + 6 / 7) / 2)
    assert type(accuracy(preds, list(np.array([1, 0, 0, 0, 0])))) is float
    assert f1(preds, labels) == pytest.approx(2 / 3)


def test_metrics_refuse_what_would_compare_wrongly() -> None:
    with pytest.raises(ValueError, match="preds must be a sequence of labels, one per example, "
                                         "not the string 'abc'"):
        accuracy("abc", "abd")  # (was 2/3: characters compared)
    with pytest.raises(ValueError, match="mix strings and numbers"):
        accuracy(["1", "0"], [1, 0])  # (was 0.0)
    with pytest.raises(ValueError, match=r"positive=1 is not of the labels' kind \(strings"):
        f1(["pos", "neg"], ["pos", "neg"])  # (was 0.0)
    assert f1(["pos", "neg"], ["pos", "pos"], positive="pos") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="one reference string per hypothesis, not sacrebleu's"):
        bleu(["a b", "c d"], [["a b", "c d"]])
    with pytest.raises(ValueError, match="tokenize='bogus' is not allowed: one of .*13a"):
        bleu(["a"], ["a"], tokenize="bogus")
    with pytest.raises(ValueError, match="mean_nll must be one number"):
        perplexity(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"labels\[1\] is NaN, not a label"):
        macro_f1([0.0, 1.0], [0.0, float("nan")])  # (each NaN counted as a class of its own)
