"""A run's attention views on a text (attnlab.viz.views) and the inputs they stand on
(attnlab.runs.Run.inputs), for each family, against attention_maps and translate called by
hand."""

from __future__ import annotations

import re

import pytest
import torch

from _runs import classifier_run, lm_run, seq2seq_run
from attnlab.decoding import translate
from attnlab.decoding.translate import decode_limit
from attnlab.errors import UsageError
from attnlab.interpret import attention_maps
from attnlab.runs import load_run
from attnlab.viz import attention_views, view_names

MAKERS = {"decoder": lm_run, "encoder": classifier_run, "encoder_decoder": seq2seq_run}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("views")
    return {family: load_run(make(base / family)) for family, make in MAKERS.items()}


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_a_one_stack_model_has_one_view_over_its_text(runs, family):
    run = runs[family]
    ids, src = run.inputs("the fox")
    assert src is None and ids.shape == (1, len(run.encode("the fox")))
    if family == "encoder":  # [CLS] (the tokenizer's bos) first, as the classifier trained
        assert ids[0, 0] == run.tokenizer.bos_id
    (view,) = attention_views(run, "the fox", layers=[1], heads=[2, 0])
    assert view.name == f"{family} self-attention" and view_names(run.model) == {
        family: view.name}
    tokens = run.tokenizer.token_strings(ids[0].tolist())
    assert view.query_tokens == view.key_tokens == tokens
    assert view.query_label is None and view.key_label is None
    assert view.layer_ids == [1] and view.head_ids == [0, 2]
    maps = attention_maps(run.model, ids, layers=[1], heads=[0, 2])
    torch.testing.assert_close(view.weights, maps.stacked(family)[:, 0])


def test_an_encoder_decoder_has_three_views_on_its_greedy_translation(runs):
    run = runs["encoder_decoder"]
    src = run.encode("the fox")
    limit = min(decode_limit(run.model, len(src)), 48 - 1)  # as `attnlab translate`, in max_len
    greedy = translate(run.model, [src], beam=1, max_len=limit, bos_id=run.tokenizer.bos_id,
                       eos_id=run.tokenizer.eos_id, pad_id=run.tokenizer.pad_id)[0]
    ids, source = run.inputs("the fox")
    assert source[0].tolist() == src
    assert ids[0].tolist() == [run.tokenizer.bos_id, *greedy, run.tokenizer.eos_id]
    views = attention_views(run, "the fox")
    assert [v.name for v in views] == list(view_names(run.model).values()) == [
        "encoder self-attention (source)", "decoder self-attention (target)",
        "cross-attention (target x source)"]
    s = run.tokenizer.token_strings(src)
    t = run.tokenizer.token_strings(ids[0, :-1].tolist())  # the decoder reads no <eos>
    assert [(v.query_tokens, v.key_tokens) for v in views] == [(s, s), (t, t), (t, s)]
    assert [(v.query_label, v.key_label) for v in views] == [
        ("source", "source"), ("target", "target"), ("target", "source")]
    maps = attention_maps(run.model, source, ids[:, :-1])
    for view, stack in zip(views, ("encoder", "decoder", "cross")):
        torch.testing.assert_close(view.weights, maps.stacked(stack)[:, 0])


def test_a_given_target_is_read_as_bos_text_eos(runs):
    run = runs["encoder_decoder"]
    ids, _ = run.inputs("the fox", target="a dog")
    tok = run.tokenizer
    assert ids[0].tolist() == tok.encode("a dog", add_special=True)
    assert ids[0, 0] == tok.bos_id and ids[0, -1] == tok.eos_id


@pytest.mark.parametrize("text, target, error", [
    ("", None, "words is empty"),
    ("x" * 60, None, "words is 60 tokens long as the model reads it, but it attends to at "
                     "most 48 (max_len)"),
    ("the fox", " ", "goal is empty"),
    ("the fox", "y" * 60, "goal is 61 tokens long as the model reads it"),
])
def test_errors_name_the_text_as_the_caller_calls_it(runs, text, target, error):
    with pytest.raises(UsageError, match=re.escape(error)):
        attention_views(runs["encoder_decoder"], text, target, names=("words", "goal"))
