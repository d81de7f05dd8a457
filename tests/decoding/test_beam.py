"""Translation (greedy and beam search with the decoder's KV cache) and classification."""

from __future__ import annotations

import itertools

import pytest
import torch

from _runs import tiny_classifier, tiny_lm, tiny_seq2seq
from attnlab.config import ConfigError
from attnlab.data.batching import pad
from attnlab.decoding import beam_search, classify, greedy_search, translate
from attnlab.decoding.translate import length_penalty_of

BOS, EOS = 1, 2
SOURCES = [[3, 4, 5, 6], [7, 8, 9], [5, 5], [9, 9, 8, 7, 6], [4, 4, 4, 4, 4, 4], [10, 11, 12],
           [13], [3, 14, 15, 3, 14]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_equals_greedy_exactly(seed):
    model = tiny_seq2seq(seed)
    ids, mask = pad(SOURCES, 0)
    greedy = greedy_search(model, ids, mask, max_len=12, bos_id=BOS, eos_id=EOS)
    for alpha in (0.0, 0.6, 2.0):
        assert beam_search(model, ids, mask, beam=1, length_penalty=alpha, max_len=12,
                           bos_id=BOS, eos_id=EOS) == greedy
    assert translate(model, SOURCES, beam=1, bos_id=BOS, eos_id=EOS) == greedy


def test_greedy_is_the_argmax_of_teacher_forced_logits():
    model = tiny_seq2seq(0)
    out = translate(model, SOURCES, bos_id=BOS, eos_id=EOS, max_len=12)
    lengths = {len(o) for o in out}
    assert len(lengths) > 1  # some sentences end early, others do not
    for src, hyp in zip(SOURCES, out):
        tgt = torch.tensor([[BOS, *hyp][:12]])
        with torch.no_grad():
            logits, _ = model(torch.tensor([src]), tgt)
        expected = logits[0].argmax(-1).tolist()  # the next token after each prefix
        assert expected[:len(hyp)] == hyp
        if len(hyp) < 12:
            assert expected[len(hyp)] == EOS


@pytest.mark.parametrize("beam", [1, 4])
def test_batched_translation_equals_one_sentence_at_a_time(beam):
    model = tiny_seq2seq(2)
    batched = translate(model, SOURCES, beam=beam, bos_id=BOS, eos_id=EOS)
    alone = [translate(model, [s], beam=beam, bos_id=BOS, eos_id=EOS)[0] for s in SOURCES]
    assert batched == alone
    assert len({tuple(b) for b in batched}) > 2


def sequence_score(model, src, hyp, finished, alpha):
    """Length-normalised log-probability of ``hyp`` (+ eos if finished), teacher-forced."""
    nxt = [*hyp, EOS] if finished else hyp
    tgt = [BOS, *hyp][:len(nxt)]  # the inputs that predict the tokens of nxt
    with torch.no_grad():
        logits, _ = model(torch.tensor([src]), torch.tensor([tgt]))
    logp = torch.log_softmax(logits[0].double(), -1)
    total = sum(float(logp[i, t]) for i, t in enumerate(nxt))
    return total / length_penalty_of(len(nxt), alpha)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_beam_wide_enough_finds_the_exact_best_sequence(alpha):
    """With K >= every live hypothesis, beam search is exhaustive: compare with brute force
    over all target sequences of up to N tokens (V=5, N=4)."""
    model = tiny_seq2seq(3, vocab_size=5, std=0.4, max_len=4)
    vocab, n = range(5), 4
    for src in ([3, 4], [4, 4, 3], [0, 3]):
        best, best_score = None, float("-inf")
        for length in range(n + 1):
            for hyp in itertools.product([t for t in vocab if t != EOS], repeat=length):
                finished = length < n
                score = sequence_score(model, src, list(hyp), finished, alpha)
                if score > best_score:
                    best, best_score = list(hyp), score
        found = translate(model, [src], beam=256, length_penalty=alpha, bos_id=BOS, eos_id=EOS,
                          max_len=n)[0]
        assert found == best, (src, found, best)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_scores_match_teacher_forcing(alpha):
    """The score beam search reports for its answer (computed step by step through the
    reordered KV cache) equals the teacher-forced score of that answer."""
    model = tiny_seq2seq(1)
    ids, mask = pad(SOURCES, 0)
    out = beam_search(model, ids, mask, beam=4, length_penalty=alpha, max_len=12, bos_id=BOS,
                      eos_id=EOS, return_scores=True)
    assert any(len(hyp) > 2 for hyp, _ in out)
    for src, (hyp, score) in zip(SOURCES, out):
        expected = sequence_score(model, src, hyp, len(hyp) < 12, alpha)
        assert score == pytest.approx(expected, abs=1e-4)


def test_beam_search_scores_at_least_greedy_on_average_and_respects_max_len():
    model = tiny_seq2seq(0)
    greedy = translate(model, SOURCES, beam=1, bos_id=BOS, eos_id=EOS, max_len=6)
    beam = translate(model, SOURCES, beam=4, length_penalty=0.0, bos_id=BOS, eos_id=EOS,
                     max_len=6)
    assert all(len(b) <= 6 and EOS not in b for b in beam)

    def score(s, h):
        return sequence_score(model, s, h, len(h) < 6, 0.0)

    gains = [score(s, b) - score(s, g) for s, b, g in zip(SOURCES, beam, greedy)]
    assert sum(gains) > 0  # (per sentence it is not guaranteed: the greedy path can drop out)


def test_translate_input_checks():
    model = tiny_seq2seq(0)
    with pytest.raises(ConfigError, match=r"beam=0 is not allowed.*an integer >= 1"):
        translate(model, SOURCES, beam=0, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ConfigError, match=r"beam=0 is not allowed.*an integer >= 1"):
        beam_search(model, pad(SOURCES, 0)[0], None, beam=0, length_penalty=0.6, max_len=8,
                    bos_id=BOS, eos_id=EOS)  # the same check, the same message
    with pytest.raises(ValueError, match="max_len"):
        translate(model, SOURCES, max_len=100, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="empty"):
        translate(model, [[3], []], bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="encoder-decoder"):
        translate(tiny_lm(), SOURCES, bos_id=BOS, eos_id=EOS)
    padded, _ = pad(SOURCES, 0)  # a padded tensor works like the lists
    assert translate(model, padded, beam=3, bos_id=BOS, eos_id=EOS) == translate(
        model, SOURCES, beam=3, bos_id=BOS, eos_id=EOS)


def test_classify_labels_probabilities_and_padding():
    model = tiny_classifier(0, pooling="mean")
    seqs = [[1, 5, 6, 7], [1, 8], [1, 9, 9, 9, 9, 9, 9], [1, 4, 3]]
    result = classify(model, seqs)
    assert result.probs.shape == (4, 3)
    torch.testing.assert_close(result.probs.sum(-1), torch.ones(4))
    assert result.labels == result.probs.argmax(-1).tolist()
    # no autograd graph: prediction runs in inference mode (a helper placed between the
    # decorator and the function once took it away)
    assert result.probs.is_inference() and not result.probs.requires_grad
    for i, s in enumerate(seqs):  # padding does not change a row's answer
        alone = classify(model, [s])
        torch.testing.assert_close(alone.probs[0], result.probs[i], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(result.probs[0], result.probs[1], atol=1e-3)
    with pytest.raises(ValueError, match="encoder"):
        classify(tiny_lm(), seqs)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "int8"])
def test_translation_runs_in_every_inference_dtype(dtype):
    """The cache takes its dtype from the embeddings, which every mode keeps (fp16 / int8
    replace the output layer with a packed one that has no ``weight``)."""
    from attnlab.decoding import to_inference_dtype

    if dtype != "bf16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("FBGEMM kernels (x86) are not in this PyTorch build")
    from attnlab.decoding.quant import PackedLinear

    model = tiny_seq2seq(0, std=0.2)
    ref = translate(model, SOURCES, beam=3, bos_id=BOS, eos_id=EOS, max_len=12)
    to_inference_dtype(model, dtype)
    assert ({p.dtype for p in model.parameters()} == {torch.bfloat16} if dtype == "bf16"
            else any(isinstance(m, PackedLinear) for m in model.modules()))  # converted
    low = translate(model, SOURCES, beam=3, bos_id=BOS, eos_id=EOS, max_len=12)
    same = sum(a == b for r, s in zip(ref, low) for a, b in zip(r, s))
    assert same >= 0.8 * sum(len(r) for r in ref)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_limit_per_sentence_equals_each_sentence_alone(beam):
    """max_len may differ by sentence; a sentence's output is what it gives alone."""
    model = tiny_seq2seq(1)
    limits = [3, 12, 1, 7, 12, 5, 2, 9]
    together = translate(model, SOURCES, beam=beam, bos_id=BOS, eos_id=EOS, max_len=limits)
    for src, n, got in zip(SOURCES, limits, together):
        assert translate(model, [src], beam=beam, bos_id=BOS, eos_id=EOS, max_len=n)[0] == got
        assert len(got) <= n
    with pytest.raises(ValueError, match="max_len=0 is not allowed: 1..12"):
        translate(model, SOURCES, beam=beam, bos_id=BOS, eos_id=EOS, max_len=[0] * 8)
    with pytest.raises(ValueError, match="3 max_len values for 8 sentences"):
        translate(model, SOURCES, beam=beam, bos_id=BOS, eos_id=EOS, max_len=[4, 4, 4])


@pytest.mark.parametrize("beam", [1, 3])
def test_a_translated_text_does_not_depend_on_its_batch(beam):
    from _runs import char_tokenizer
    from attnlab.decoding import translate_texts

    tok = char_tokenizer(("<pad>", "<bos>", "<eos>"))
    model = tiny_seq2seq(2, vocab_size=tok.vocab_size, max_len=40)
    texts = ["dog", "the quick brown fox jumps", "a", "lazy dog. the"]
    alone = [translate_texts(model, [t], tok, beam=beam)[0] for t in texts]
    assert translate_texts(model, texts, tok, beam=beam, batch_size=64) == alone
    with pytest.raises(ValueError, match="max_len=0 is not allowed"):
        translate_texts(model, texts, tok, beam=beam, max_len=0)
