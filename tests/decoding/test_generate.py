"""Decoder-only generation: KV cache, left padding, the sliding window, sampling, stopping."""

from __future__ import annotations

import platform
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from _runs import char_tokenizer, tiny_classifier, tiny_lm, tiny_seq2seq
from attnlab.data.batching import pad
from attnlab.decoding import (
    FINISHED,
    PackedLinear,
    Sampler,
    TextStream,
    decoding_kernels,
    direct_attributes,
    filter_logits,
    generate,
    generate_text,
    inference_layout,
    stream,
    stream_text,
    to_inference_dtype,
    window_keep,
)
from attnlab.decoding.quant import check_inference_dtype, reduce_range
from attnlab.decoding.translate import translate

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [20], [1, 2, 3, 4]]


def last_logits(model, prompts):
    """Next-token logits (B, V) of left-padded prompts, with mask and per-row positions."""
    ids, mask = pad(prompts, 0, left=True)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits, _ = model(ids, mask=mask, positions=positions)
    return logits[:, -1]


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_left_padded_batch_equals_each_prompt_alone(pos):
    model = tiny_lm(pos=pos)
    batched = generate(model, PROMPTS, 12, temperature=0)
    alone = [generate(model, p, 12, temperature=0)[0] for p in PROMPTS]
    assert batched == alone
    assert len({tuple(r) for r in batched}) > 1  # the rows really differ
    # Logits of every prefix of the generated text: batched (padded) vs one at a time.
    for k in (0, 5, 12):
        rows = [p + g[:k] for p, g in zip(PROMPTS, batched)]
        together = last_logits(model, rows)
        for i, row in enumerate(rows):
            torch.testing.assert_close(together[i], last_logits(model, [row])[0],
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_kv_cache_logits_equal_full_recomputation(pos):
    model = tiny_lm(pos=pos)
    ids, mask = pad(PROMPTS, 0, left=True)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = model.decoder.new_cache(len(PROMPTS))
    with torch.no_grad():
        step_logits = [model(ids, mask=mask, positions=positions, cache=cache,
                             last_only=True)[0][:, -1]]
        seq, m, pos_next = ids, mask, positions[:, -1:] + 1
        for _ in range(6):
            nxt = step_logits[-1].argmax(-1, keepdim=True)  # (B, 1)
            seq = torch.cat([seq, nxt], 1)
            m = torch.cat([m, torch.ones_like(nxt, dtype=torch.bool)], 1)
            step_logits.append(model(nxt, mask=m, positions=pos_next, cache=cache)[0][:, -1])
            pos_next = pos_next + 1
        full, _ = model(seq, mask=m, positions=(m.long().cumsum(-1) - 1).clamp(min=0))
    p = ids.size(1)
    for t, logits in enumerate(step_logits):
        torch.testing.assert_close(logits, full[:, p - 1 + t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_cache_derives_positions_of_left_padded_rows(pos):
    """A cache told each row's left padding (``KVCache.pad``) gives the same logits as explicit
    per-row positions, also after its rows are reordered (no positions tensor per step)."""
    model = tiny_lm(pos=pos)
    ids, mask = pad(PROMPTS, 0, left=True)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    explicit, derived = model.decoder.new_cache(len(PROMPTS)), model.decoder.new_cache(len(PROMPTS))
    derived.pad = (~mask).sum(-1)
    rows = torch.tensor([3, 1, 1])
    with torch.no_grad():
        want, _ = model(ids, mask=mask, positions=positions, cache=explicit)
        got, _ = model(ids, mask=mask, cache=derived)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        explicit.reorder(rows)
        derived.reorder(rows)
        nxt = want[rows, -1:].argmax(-1)  # (3, 1)
        m = torch.cat([mask[rows], torch.ones_like(nxt, dtype=torch.bool)], 1)
        want, _ = model(nxt, mask=m, positions=positions[rows, -1:] + 1, cache=explicit)
        got, _ = model(nxt, mask=m, cache=derived)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert derived.positions(2).tolist() == [[5, 6], [8, 9], [8, 9]]  # 4 + 1 tokens; 7 + 1


def test_cached_and_recomputed_generation_agree_also_when_the_window_slides():
    model = tiny_lm(max_len=10)
    for kwargs in (dict(temperature=0), dict(temperature=1.0, top_k=8, seed=3)):
        cached = generate(model, PROMPTS, 30, use_cache=True, **kwargs)
        full = generate(model, PROMPTS, 30, use_cache=False, **kwargs)
        assert cached == full
        assert all(len(r) == 30 for r in cached)


@pytest.mark.parametrize("site", ["blocks.0.resid_post", "blocks.1.attn.z"])
def test_generation_inside_hooks_applies_the_edit_at_every_step(site):
    """Steering: an edit held by ``hooks`` (a vector added to the residual stream, a head
    scaled) acts on every forward of generation, the cached steps included: the tokens equal
    a naive loop that recomputes the whole sequence under the same edit each step."""
    from attnlab.interpret import hooks

    model = tiny_lm(pos="rope")
    shift = torch.randn(32, generator=torch.Generator().manual_seed(1)) * 2

    def edit(x, name):
        return x + shift if name.endswith("resid_post") else x * torch.tensor(
            [1.0, -2.0, 1.0, 3.0])[:, None, None]
    plain = generate(model, PROMPTS, 12, temperature=0)
    with hooks(model, {site: edit}):
        steered = generate(model, PROMPTS, 12, temperature=0)
        recomputed = generate(model, PROMPTS, 12, temperature=0, use_cache=False)
        tokens = list(PROMPTS[1])
        with torch.no_grad():
            for _ in range(12):
                logits, _ = model(torch.tensor([tokens]))
                tokens.append(int(logits[0, -1].argmax()))
    assert steered == recomputed and steered[1] == tokens[len(PROMPTS[1]):]
    assert steered != plain  # the edit changes what is generated
    assert generate(model, PROMPTS, 12, temperature=0) == plain  # and is gone after


def reference_window_greedy(model, prompt, n):
    """The documented sliding window, written naively: full recomputation of the window."""
    max_len = model.config.max_len
    keep = max(1, max_len - max(1, max_len // 4))
    tokens, start, out = list(prompt), 0, []
    for _ in range(n):
        if len(tokens) - start > max_len:
            start = len(tokens) - keep
        with torch.no_grad():
            logits, _ = model(torch.tensor([tokens[start:]]))
        out.append(int(logits[0, -1].argmax()))
        tokens.append(out[-1])
    return out


@pytest.mark.parametrize("prompt_len", [1, 3, 9])
def test_sliding_window_keeps_generating_with_a_tiny_context(prompt_len):
    model = tiny_lm(max_len=4)
    assert window_keep(4) == 3 and window_keep(1) == 1 and window_keep(1024) == 768
    prompt = list(range(1, 1 + prompt_len))
    out = generate(model, prompt, 25, temperature=0)[0]
    assert len(out) == 25
    assert out == reference_window_greedy(model, prompt, 25)


@pytest.mark.parametrize("use_cache", [True, False])
def test_each_row_of_a_batch_slides_its_window_as_it_would_alone(use_cache):
    """Prompts of 3, 7 and 13 tokens (max_len 10) in one left-padded batch: every row gives
    the tokens of the naive one-prompt reference, through several slides of its window."""
    model = tiny_lm(max_len=10)
    prompts = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], list(range(14, 27))]
    batched = generate(model, prompts, 30, temperature=0, use_cache=use_cache)
    for prompt, row in zip(prompts, batched):
        assert row == reference_window_greedy(model, prompt, 30)


def test_padded_batches_copy_no_host_data_per_step(monkeypatch):
    """Between window slides, a padded batch's step makes no tensor from host data (on a GPU
    each such copy waits for the device)."""
    model = tiny_lm(max_len=64)
    real = torch.tensor
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    counts = {}
    for name, prompts in (("same", [[3, 4, 5], [6, 7, 8]]), ("padded", [[3, 4, 5], [6, 7]])):
        calls.clear()
        monkeypatch.setattr(torch, "tensor", counting)
        generate(model, prompts, 20, temperature=0)
        monkeypatch.setattr(torch, "tensor", real)
        counts[name] = len(calls)
    assert counts["padded"] <= counts["same"] + 1  # once, when the window starts


def test_memory_does_not_grow_with_max_new_tokens():
    """Buffers hold the window, not every token to come: asking for 10^12 tokens and taking
    a few costs what taking them from a short request does."""
    model = tiny_lm(max_len=10)
    steps = stream(model, PROMPTS, 10**12, temperature=0)
    first = [next(steps).tolist() for _ in range(25)]
    want = generate(model, PROMPTS, 25, temperature=0)
    assert [list(r) for r in zip(*first)] == want


def test_same_seed_same_tokens_and_generator_argument():
    model = tiny_lm()
    a = generate(model, PROMPTS, 20, temperature=1.0, seed=7, num_samples=2)
    b = generate(model, PROMPTS, 20, temperature=1.0, seed=7, num_samples=2)
    c = generate(model, PROMPTS, 20, temperature=1.0, seed=8, num_samples=2)
    d = generate(model, PROMPTS, 20, temperature=1.0, num_samples=2,
                 generator=torch.Generator().manual_seed(7))
    assert a == b == d and a != c
    assert len(a) == 2 * len(PROMPTS)
    assert a[0] != a[1]  # two samples of one prompt differ
    with pytest.raises(ValueError, match="either seed or generator"):
        generate(model, PROMPTS, 2, seed=1, generator=torch.Generator())


def test_greedy_equals_temperature_zero_and_top_k_one():
    model = tiny_lm()
    greedy = generate(model, PROMPTS, 15, temperature=0)
    assert generate(model, PROMPTS, 15, temperature=1.3, top_k=1, seed=0) == greedy
    with torch.no_grad():  # greedy really is the argmax of the model
        first = model(torch.tensor([PROMPTS[0]]))[0][0, -1].argmax().item()
    assert greedy[0][0] == first


def test_bad_sampling_arguments_are_value_errors():
    model = tiny_lm()
    for kwargs, field in ((dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"),
                          (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k")):
        with pytest.raises(ValueError, match=field):
            generate(model, PROMPTS, 3, **kwargs)
    with pytest.raises(ValueError, match="empty"):
        generate(model, [[1, 2], []], 3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, [1, 99], 3)
    with pytest.raises(ValueError, match="decoder-only"):
        generate(tiny_classifier(), [1, 2], 3)
    assert len(generate(model, [1], 3, top_p=1.0, seed=0)[0]) == 3  # 1 is allowed


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda out: torch.isfinite(out[0]).nonzero().squeeze(1).tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [0, 1]
    assert kept(filter_logits(logits, top_p=0.5)) == [0]
    assert kept(filter_logits(logits, top_p=0.6)) == [0, 1]
    assert kept(filter_logits(logits, top_p=0.81)) == [0, 1, 2]
    assert kept(filter_logits(logits, top_p=0.01)) == [0]
    shuffled = logits[:, [2, 0, 3, 1]]
    assert kept(filter_logits(shuffled, top_p=0.6)) == [1, 3]
    draws = Sampler(1.0, top_k=2)(logits.expand(4000, 4), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=4).tolist()
    assert counts[2] == counts[3] == 0
    assert abs(counts[0] / 4000 - 0.5 / 0.8) < 0.03  # renormalised over the top 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_on_low_precision_logits_is_their_argmax_ties_included(dtype):
    logits = torch.randn(4, 300).to(dtype)
    logits[1, [7, 200]] = logits[1].max() + 1  # a tie: the first index wins
    assert torch.equal(Sampler(0.0)(logits), logits.argmax(-1))
    assert Sampler(0.0)(logits)[1] == 7


def test_a_tiny_temperature_samples_the_argmax_instead_of_failing():
    logits = torch.tensor([[2.0, 9.0, -1.0, 8.5], [0.0, -3.0, 4.0, float("-inf")]])
    for t in (1e-39, 1e-300, 1e-6):
        draws = Sampler(t)(logits, torch.Generator().manual_seed(0))
        assert draws.tolist() == [1, 2]


def test_eos_stops_a_row_and_is_left_out():
    model = tiny_lm()
    free = generate(model, PROMPTS, 20, temperature=0)
    eos = free[0][4]
    out = generate(model, PROMPTS, 20, temperature=0, eos_id=eos)
    for row, full in zip(out, free):
        assert row == (full[:full.index(eos)] if eos in full else full)
    steps = list(stream(model, PROMPTS[:1], 20, temperature=0, eos_id=eos))
    assert len(steps) == 4  # the eos step reports nothing new, and the loop ends there


def test_stream_yields_what_generate_returns():
    model = tiny_lm()
    kwargs = dict(temperature=0.9, top_p=0.9, seed=5, eos_id=3)
    steps = list(stream(model, PROMPTS, 16, **kwargs))
    table = torch.stack(steps, 1).tolist()
    assert [[t for t in row if t != FINISHED] for row in table] == generate(
        model, PROMPTS, 16, **kwargs)
    for row in table:  # once finished, a row stays finished
        if FINISHED in row:
            assert set(row[row.index(FINISHED):]) == {FINISHED}


def test_stop_strings_text_and_streaming():
    tok = char_tokenizer()
    model = tiny_lm(vocab_size=tok.vocab_size)
    prompt = "the lazy "
    free = generate_text(model, tok, prompt, 30, temperature=0)[0]
    stop = free[8:10]
    cut = free[:free.index(stop)]
    assert generate_text(model, tok, prompt, 30, temperature=0, stop=[stop])[0] == cut
    pieces = list(stream_text(model, tok, prompt, 30, temperature=0, stop=[stop]))
    assert "".join(pieces) == cut and len(pieces) > 1
    assert "".join(stream_text(model, tok, prompt, 30, temperature=0)) == free
    ids = generate(model, tok.encode(prompt), 30, temperature=0, stop=[stop], tokenizer=tok)[0]
    assert tok.decode(ids).endswith(stop) and len(ids) == len(cut) + len(stop)
    with pytest.raises(ValueError, match="tokenizer"):
        generate(model, [1, 2], 5, stop=["x"])
    with pytest.raises(ValueError, match="empty"):
        generate_text(model, tok, "", 5)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        generate_text(model, tok, "QQ", 5)


def test_zero_new_tokens_and_tensor_prompts():
    model = tiny_lm()
    assert generate(model, PROMPTS, 0) == [[], [], [], []]
    assert generate(model, torch.tensor([[1, 2, 3]]), 4, temperature=0) == generate(
        model, [1, 2, 3], 4, temperature=0)


def test_inference_layout_changes_memory_order_only():
    model = tiny_lm(tie_embeddings=True)
    before = generate(model, PROMPTS, 12, temperature=0)
    logits = last_logits(model, PROMPTS)
    weight = model.head.weight.detach().clone()
    assert inference_layout(model) is model
    assert model.head.weight.stride() == (1, model.config.vocab_size)
    assert model.head.weight is model.emb.tok.weight  # still tied
    # a narrowing (D, 4D) matrix keeps the row-major order, faster for it
    assert model.decoder.layers[0].ffn.w2.weight.stride() == (4 * 32, 1)
    torch.testing.assert_close(model.head.weight, weight, rtol=0, atol=0)
    torch.testing.assert_close(last_logits(model, PROMPTS), logits, atol=1e-5, rtol=1e-5)
    assert generate(model, PROMPTS, 12, temperature=0) == before


X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _onednn_during_forwards(model) -> list[bool]:
    """torch's oneDNN switch as each forward of ``model`` starts (a pre-hook records it)."""
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.mkldnn.enabled))
    return seen


def _direct_entries(model) -> dict:
    """Parameters and submodules found in their module's own ``__dict__``, by qualified name."""
    return {f"{prefix}.{name}": module.__dict__[name]
            for prefix, module in model.named_modules()
            for name in (*module._parameters, *module._modules) if name in module.__dict__}


def test_decoding_finds_parameters_and_submodules_directly_and_leaves_no_trace():
    """`direct_attributes`: during generation and translation (greedy and beam), every
    parameter and submodule is in its module's ``__dict__`` (the same objects: no
    ``nn.Module.__getattr__`` per lookup); nothing is left after, also when a step fails or a
    stream is closed early; nested uses remove only what they added; an assignment inside is
    seen. The tokens are those of the same model outside it (full forwards, no cache).
    (Closing early matters on Python 3.12 (3.12.3): there close() of a generator paused outside
    try/with keeps its locals, and the steps inside, until the generator is freed.)"""
    model = tiny_lm()
    named = dict(model.named_parameters(remove_duplicate=False))
    seen = []
    model.decoder.layers[0].register_forward_pre_hook(
        lambda *_: seen.append(_direct_entries(model)))
    out = generate(model, PROMPTS, 5, temperature=0)
    assert seen and all(len(s) == len(seen[0]) for s in seen)
    inside = seen[0]
    assert set(named) <= set(inside) and all(inside[k] is named[k] for k in named)
    assert inside["decoder.layers"] is model.decoder.layers
    assert _direct_entries(model) == {}
    assert out == generate(model, PROMPTS, 5, temperature=0, use_cache=False)

    steps = stream(model, PROMPTS[:1], 10, temperature=0)
    next(steps)
    assert _direct_entries(model)  # held while the stream is open
    steps.close()
    assert _direct_entries(model) == {}
    tok = char_tokenizer()
    lm = tiny_lm(vocab_size=tok.vocab_size).eval()
    pieces = stream_text(lm, tok, "to be", 10, temperature=0, stop_at_eos=False)
    assert next(pieces) and _direct_entries(lm)
    pieces.close()  # (Python 3.12.3 kept the entries here while `pieces` was referenced)
    assert _direct_entries(lm) == {}

    with direct_attributes(model):
        with direct_attributes(model):
            pass
        assert _direct_entries(model)  # the inner use added nothing, so removed nothing
        norm = model.decoder.norm
        norm.weight = torch.nn.Parameter(torch.full_like(norm.weight, 2.0))
        assert norm.weight is norm._parameters["weight"]  # torch's __setattr__ dropped the copy
        with pytest.raises(RuntimeError, match="boom"):
            with direct_attributes(model):
                raise RuntimeError("boom")
    assert _direct_entries(model) == {}

    class Shadowed(torch.nn.Module):  # a class attribute hides the submodule (torch's lookup)
        extra = None

        def __init__(self):
            super().__init__()
            self.extra = torch.nn.Linear(2, 2)

    odd = Shadowed()
    with direct_attributes(odd):
        assert odd.extra is None  # as outside: nothing put in front of the class attribute

    seq2seq = tiny_seq2seq()
    seen.clear()
    seq2seq.decoder.register_forward_pre_hook(lambda *_: seen.append(_direct_entries(seq2seq)))
    for beam in (1, 3):
        translate(seq2seq, [[3, 4, 5, 6]], beam=beam, max_len=5, bos_id=1, eos_id=2, pad_id=0)
        assert seen and all(seen) and _direct_entries(seq2seq) == {}
        seen.clear()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no "
                    "oneDNN (mkldnn), so there is nothing to switch")
def test_decoding_steps_run_without_onednn_on_fp32_cpu_models_only():
    """`decoding_kernels`: oneDNN off during each step of an fp32 model on a CPU (its exact
    GELU has a fixed cost of microseconds a call), on again between the steps (the caller's
    code) and after; unchanged for bf16 parameters at steps of several rows. The tokens are
    those of greedy decoding by full forwards with oneDNN on."""
    assert torch.backends.mkldnn.enabled
    model = tiny_lm(ffn="gelu")
    seen = _onednn_during_forwards(model)
    steps = stream(model, PROMPTS[:2], 6, temperature=0)
    for _ in steps:
        assert torch.backends.mkldnn.enabled  # between steps: the caller's setting
    assert seen and not any(seen) if X86 else all(seen)  # (ARM: fp32 products may use it)
    assert torch.backends.mkldnn.enabled
    rows = [list(p) for p in PROMPTS]
    for _ in range(8):
        nxt = last_logits(model, rows).argmax(-1).tolist()  # oneDNN on
        rows = [r + [t] for r, t in zip(rows, nxt)]
    assert generate(model, PROMPTS, 8, temperature=0) == [r[len(p):] for r, p in
                                                           zip(rows, PROMPTS)]

    bf16 = tiny_lm(ffn="gelu").to(torch.bfloat16)
    assert decoding_kernels(bf16) is nullcontext  # steps of any size: oneDNN's products

    seq2seq = tiny_seq2seq(ffn="gelu")
    seen = []
    seq2seq.decoder.register_forward_pre_hook(
        lambda *_: seen.append(torch.backends.mkldnn.enabled))
    for beam in (1, 3):
        translate(seq2seq, [[3, 4, 5, 6]], beam=beam, max_len=5, bos_id=1, eos_id=2, pad_id=0)
        assert seen and (not any(seen) if X86 else all(seen))
        assert torch.backends.mkldnn.enabled
        seen.clear()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no "
                    "oneDNN (mkldnn), so there is nothing to choose")
@pytest.mark.parametrize("faster", ["onednn", "native"])
def test_low_precision_one_row_steps_take_the_kernels_measured_faster(faster, monkeypatch):
    """bf16 weights, one row: the prompt (several tokens) runs with oneDNN, each one-token
    step with what the probe measured faster here, asked once per generation and answered
    from its cache after that; the tokens are the same either way (up to rounding: compared
    on a model where no logit is near a tie)."""
    from attnlab.speed import probe

    asked = []

    def fake_fastest(step, key, candidates, **kw):
        for c in candidates:
            step(c)  # the probe's step runs with either setting
        asked.append((key, kw["field"]))
        return faster

    monkeypatch.setattr("attnlab.speed.decoding.fastest", fake_fastest)
    model = tiny_lm(ffn="gelu").to(torch.bfloat16)
    seen = _onednn_during_forwards(model)
    out = generate(model, PROMPTS[:1], 5, temperature=0)
    assert len(asked) == 1 and asked[0][1] == "kernels"
    assert seen[0] and seen[1:] == [faster == "onednn"] * 4  # the prompt, then 4 one-row steps
    assert torch.backends.mkldnn.enabled
    two_rows = generate(model, PROMPTS[:2], 5, temperature=0)  # no one-row step: not asked
    assert len(asked) == 1 and two_rows[0] == out[0]
    # the probe's key names the machine and the weights' shapes, dtypes and memory order
    monkeypatch.undo()
    key = asked[0][0]
    assert key == probe.machine_key(
        "decoding kernels, one row", ["torch.bfloat16"],
        sorted((m.out_features, m.in_features, str(m.weight.dtype), m.weight.stride())
               for m in model.modules() if isinstance(m, torch.nn.Linear)))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no "
                    "oneDNN (mkldnn), so there is nothing to choose")
def test_the_one_row_kernel_probe_measures_once_and_caches_its_answer(monkeypatch, tmp_path):
    from attnlab.speed import probe

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))  # this test's answers only
    model = tiny_lm().to(torch.bfloat16)
    first = decoding_kernels(model, 1)
    entries = [e for e in probe._read_cache(probe.cache_file()).values() if "kernels" in e]
    assert len(entries) == 1 and entries[0]["kernels"] in ("onednn", "native")
    assert set(entries[0]["ms"]) == {"onednn", "native"}
    from attnlab.speed.decoding import _OneDNNOff

    assert first is (nullcontext if entries[0]["kernels"] == "onednn" else _OneDNNOff)
    monkeypatch.setattr(probe, "_write_cache", lambda *a: pytest.fail("measured again"))
    assert decoding_kernels(model, 1) is first  # answered from the cache


def test_layout_pays_is_measured_per_row_count_once_and_cached(monkeypatch, tmp_path):
    from attnlab.decoding import layout_pays
    from attnlab.speed import probe

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    model = tiny_lm(tie_embeddings=True)
    answers = {rows: layout_pays(model, rows) for rows in (1, 8)}
    entries = [e for e in probe._read_cache(probe.cache_file()).values() if "layout" in e]
    assert len(entries) == 2  # one answer per row count
    assert all(set(e["ms"]) == {"row-major", "column-major"} for e in entries)
    assert model.head.weight.stride() == (32, 1)  # the probe copies, the model is untouched
    monkeypatch.setattr(probe, "_write_cache", lambda *a: pytest.fail("measured again"))
    assert {rows: layout_pays(model, rows) for rows in (1, 8)} == answers


@pytest.mark.parametrize("pays", [True, False])
def test_the_cli_takes_the_layout_where_it_pays(pays, monkeypatch):
    from attnlab.cli.use import _fast_layout

    asked = []
    monkeypatch.setattr("attnlab.decoding.layout_pays",
                        lambda model, rows: asked.append(rows) or pays)
    model = tiny_lm(tie_embeddings=True)
    _fast_layout(model, 3)
    assert asked == [3]
    assert model.head.weight.stride() == ((1, 40) if pays else (32, 1))


def test_text_stream_holds_back_what_may_become_a_stop_string():
    tok = char_tokenizer()
    stream_ = TextStream(tok, ["fox", "zz"])
    shown = [stream_.push(t) for t in tok.encode("the fo")]
    assert "".join(shown) == "the "  # "fo" may still become "fox"
    assert stream_.push(tok.encode("g")[0]) == "fog"
    shown = [stream_.push(t) for t in tok.encode(" fox jumps")]
    assert "".join(shown) == " " and stream_.stopped
    assert stream_.push(tok.encode("a")[0]) == "" and stream_.flush() == ""
    tail = TextStream(tok, ["fox"])
    assert "".join(tail.push(t) for t in tok.encode("a f")) + tail.flush() == "a f"


def test_text_stream_shows_what_a_decode_of_all_the_tokens_shows():
    """Byte-level BPE tokens can end inside a character: the stream, flushed at the end, gives
    exactly the text of generate_text (decode everything, cut at the first stop string), for
    random token sequences and stop strings, also when the stopping token ends mid-character."""
    from attnlab.decoding.stream import cut_at_stop
    from attnlab.tokenizers import BPETokenizer

    tok = BPETokenizer.train(["Q: où est-il? A: déjà été, naïve café. " * 30], vocab_size=300)
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        ids = torch.randint(5, tok.vocab_size, (int(torch.randint(1, 12, ())),),
                            generator=gen).tolist()
        text = tok.decode(ids)
        a = int(torch.randint(0, len(text), ()))
        stops = [text[a:a + 1 + trial % 3]] if trial % 4 else ["zzz"]
        stream_ = TextStream(tok, stops)
        shown = ""
        for t in ids:
            shown += stream_.push(t)
            if stream_.stopped:
                break
        shown += stream_.flush()
        assert shown == cut_at_stop(text, stops), (ids, stops)


# --- reduced-precision inference (attnlab.decoding.quant) -------------------------------------

def fake_int8_linear(x, weight, bias, top=255):
    """Dynamic int8 linear written out: weights symmetric per output row (max|w| -> 127),
    the input asymmetric over 0..top (uint8: 255; 7 bits: 127) spanning its min..max (0
    included), products summed in float."""
    w_scale = weight.abs().amax(dim=1, keepdim=True) / 127  # (out, 1)
    w_q = torch.clamp(torch.round(weight / w_scale), -127, 127)
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    x_scale = (hi - lo) / top
    zero = round(-lo / x_scale)
    x_q = torch.clamp(torch.round(x / x_scale) + zero, 0, top)
    return F.linear((x_q - zero) * x_scale, w_q * w_scale, bias)


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines,
                    reason="FBGEMM kernels (x86) are not in this PyTorch build")
def test_packed_linear_equals_written_out_fp16_and_int8():
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(48, 40)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 48, generator=gen) * 0.2)
    x = torch.randn(3, 5, 48, generator=gen)  # (B, T, in): any leading dims
    exact = lin(x).detach()
    # fp16: the weights rounded to float16, the product in fp32.
    half = F.linear(x, lin.weight.detach().half().float(), lin.bias.detach())
    torch.testing.assert_close(PackedLinear(lin, "fp16")(x), half, atol=1e-4, rtol=1e-4)
    assert (half - exact).abs().max() > 1e-6  # the rounding is real, and visible
    # int8: FBGEMM's integer kernel against the same quantization done in float (7-bit
    # activations on CPUs without AVX-512 VNNI: attnlab.decoding.quant.reduce_range)
    ref = fake_int8_linear(x, lin.weight.detach(), lin.bias.detach(),
                           top=127 if reduce_range() else 255)
    got = PackedLinear(lin, "int8")(x)
    torch.testing.assert_close(got, ref, atol=2e-3, rtol=1e-3)
    assert (ref - exact).abs().max() > 1e-3
    assert (got - exact).norm() / exact.norm() < 0.02


# Logits of this model reach ~9; measured max errors: bf16 0.17, fp16 0.024, int8 0.32.
@pytest.mark.parametrize("dtype, logit_atol, min_agree", [
    ("bf16", 0.3, 0.9), ("fp16", 0.05, 1.0), ("int8", 0.6, 0.9)])
def test_reduced_precision_decoding_stays_close_to_fp32(dtype, logit_atol, min_agree):
    if dtype != "bf16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("FBGEMM kernels (x86) are not in this PyTorch build")
    model = tiny_lm(tie_embeddings=True)
    logits = last_logits(model, PROMPTS)
    greedy = generate(model, PROMPTS, 24, temperature=0)
    assert to_inference_dtype(model, dtype) is model
    if dtype == "bf16":
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    else:
        assert not any(type(m) is torch.nn.Linear for m in model.modules())
        assert sum(isinstance(m, PackedLinear) for m in model.modules()) == 2 * 2 + 2 * 2 + 1
    got = last_logits(model, PROMPTS).float()
    torch.testing.assert_close(got, logits, atol=logit_atol, rtol=0)
    assert (got - logits).abs().max() > 0  # it did change the arithmetic
    low = generate(model, PROMPTS, 24, temperature=0)
    agree = sum(a == b for r, s in zip(greedy, low) for a, b in zip(r, s)) / (24 * len(PROMPTS))
    assert agree >= min_agree
    # the KV cache still equals full recomputation in the new dtype
    assert generate(model, PROMPTS, 24, temperature=0, use_cache=False) == low


def test_inference_dtype_errors_name_what_is_allowed():
    with pytest.raises(ValueError, match="'int4' is not allowed; allowed: fp32, bf16, fp16"):
        check_inference_dtype("int4", "cpu")
    with pytest.raises(ValueError, match="--dtype 'int8' runs on the CPU only"):
        check_inference_dtype("int8", "cuda", "--dtype")
    model = tiny_lm()
    assert to_inference_dtype(model, "fp32") is model
    assert all(type(m) is not PackedLinear for m in model.modules())


def test_a_continuation_reads_as_it_does_after_the_prompt():
    """Tokenizers that drop a word's leading space at the start of a text (whitespace-split
    BPE here; SentencePiece's "▁" as in Llama) lost the space between the prompt and the first
    new word: prompt + continuation must equal decode(prompt ids + new ids), streamed or not,
    and a stop string may begin with that space."""
    from _runs import TEXT
    from attnlab.tokenizers import BPETokenizer

    tok = BPETokenizer.train([TEXT * 3, "the dog jumps over the fox.", "a quick brown dog."] * 20,
                             60, "whitespace")
    model = tiny_lm(0, vocab_size=tok.vocab_size, max_len=32).eval()
    prompt = "the quick"
    ids = tok.encode(prompt)
    new = generate(model, [ids], 8, temperature=0)[0]
    whole = tok.decode(ids + new)
    assert whole.startswith(prompt + " ") and len(whole) > len(prompt) + 1
    assert prompt + generate_text(model, tok, prompt, 8, temperature=0)[0] == whole
    assert prompt + "".join(stream_text(model, tok, prompt, 8, temperature=0)) == whole
    first = " " + whole[len(prompt):].split()[0]  # the first new word, with its space
    assert generate_text(model, tok, [prompt, prompt], 8, temperature=0, stop=[first]) == ["", ""]
    assert "".join(stream_text(model, tok, prompt, 8, temperature=0, stop=[first])) == ""


def test_text_generation_draws_only_ids_its_tokenizer_has():
    """A model with more embedding rows than tokenizer ids (a vocabulary padded to a multiple
    of 64, as nanoGPT's 50304): sampling drew ids the tokenizer cannot decode and stopped
    mid-output with an error."""
    from attnlab.decoding import Sampler

    tok = char_tokenizer()
    model = tiny_lm(0, vocab_size=tok.vocab_size + 40, max_len=32).eval()
    with torch.no_grad():  # the extra rows the most likely, so an unlimited draw takes them
        model.head.weight[tok.vocab_size:] *= 50
    ids = generate(model, [tok.encode("the ")], 20, temperature=0)[0]
    assert max(ids) >= tok.vocab_size  # the model itself prefers the extra ids
    for temperature in (0, 1.0):
        text = generate_text(model, tok, ["the ", "a"], 20, temperature=temperature, seed=0)
        assert all(len(t) == 20 for t in text)
        assert len("".join(stream_text(model, tok, "the ", 20, temperature=temperature,
                                       seed=0))) == 20
    assert Sampler(0, vocab=3)(torch.tensor([[0.0, 1.0, 2.0, 9.0]])).tolist() == [2]
    with pytest.raises(ValueError, match="vocab=0 is not allowed"):
        Sampler(vocab=0)


def _bad_library_calls():
    """(id, call, error type, what the message must say) of arguments the decoding functions
    refuse before any work (each used to run on, give garbage, or fail deep inside torch)."""
    from attnlab import MaskedLM, ModelConfig
    from attnlab.decoding import classify, classify_texts, translate_texts

    lm, mt = tiny_lm(), tiny_seq2seq()
    tok = char_tokenizer(("<pad>", "<bos>", "<eos>"))
    small = tiny_classifier(vocab_size=tok.vocab_size, n_classes=2)
    mlm = MaskedLM(ModelConfig(family="encoder", head="mlm", vocab_size=30, d_model=16,
                               n_heads=2, n_layers=1, max_len=16))
    return [
        ("max_new_tokens_float", lambda: generate(lm, [[1, 2]], 2.5), ValueError,
         "max_new_tokens=2.5 is not allowed: an integer >= 0"),
        ("num_samples_float", lambda: generate(lm, [[1, 2]], 2, num_samples=2.0), ValueError,
         "num_samples=2.0 is not allowed"),
        ("eos_outside_vocab", lambda: generate(lm, [[1, 2]], 2, eos_id=99), ValueError,
         "eos_id=99 is not allowed: an integer in 0..39"),
        ("eos_is_finished_marker", lambda: generate(lm, [[1, 2]], 2, eos_id=FINISHED),
         ValueError, "eos_id=-1 is not allowed"),
        ("stream_text_several", lambda: list(stream_text(lm, tok, ["to", "be"], 2)), TypeError,
         "stream_text streams one prompt, a string, got list"),
        ("beam_float", lambda: translate(mt, [[3, 4]], beam=2.5, bos_id=1, eos_id=2),
         ValueError, "beam=2.5 is not allowed: an integer >= 1"),
        ("bos_outside_vocab", lambda: translate(mt, [[3, 4]], bos_id=99, eos_id=2), ValueError,
         "bos_id=99 is not allowed: an integer in 0..19"),
        ("translate_texts_one_string", lambda: translate_texts(mt, "to be", tok), TypeError,
         "sentences must be a list of strings, got one string"),
        ("translate_texts_batch_0", lambda: translate_texts(mt, ["to be"], tok, batch_size=0),
         ValueError, "batch_size=0 is not allowed"),
        ("classify_texts_one_string", lambda: classify_texts(small, tok, "to be"), TypeError,
         "texts must be a list of strings, got one string"),
        ("classify_texts_batch_negative",
         lambda: classify_texts(small, tok, ["to be"], batch_size=-1), ValueError,
         "batch_size=-1 is not allowed"),
        ("classify_texts_max_len_negative",
         lambda: classify_texts(small, tok, ["to be"], max_len=-2), ValueError,
         "max_len=-2 is not allowed"),
        ("classify_texts_label_string",
         lambda: classify_texts(small, tok, ["to be"], label_names="ab"), ValueError,
         "label_names='ab' is not allowed: 2 distinct strings"),
        ("classify_texts_label_twice",
         lambda: classify_texts(small, tok, ["to be"], label_names=["a", "a"]), ValueError,
         "2 distinct strings"),
        ("classify_a_masked_lm", lambda: classify(mlm, [[4, 5, 6]]), ValueError,
         "got head='mlm'"),
        ("classify_a_decoder", lambda: classify(lm, [[4, 5, 6]]), ValueError,
         "got family='decoder'"),
        ("convert_twice", lambda: to_inference_dtype(to_inference_dtype(
            tiny_lm().eval(), "bf16"), "fp16"), ValueError, "converted already (torch.bfloat16)"),
    ]


@pytest.mark.parametrize("case", [c[0] for c in _bad_library_calls()])
def test_bad_arguments_of_the_decoding_functions_are_named(case):
    (call, error, message), = [c[1:] for c in _bad_library_calls() if c[0] == case]
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value), str(e.value)
