"""The three families: causality, padding invariance, KV cache, attention capture, overfitting,
gradients, parameter counts."""

import json

import pytest
import torch

import attnlab.nn as attention_module
from attnlab import (
    DecoderLM,
    EncoderClassifier,
    ModelConfig,
    Transformer,
    attention_maps,
    build_model,
)
from attnlab.config import ConfigError, LossOptions
from attnlab.info import count_parameters
from attnlab.nn import valid_tokens
from attnlab.speed import linear_cross_entropy, use_fused_loss

V = 23


def cfg(family, **kw):
    base = dict(family=family, vocab_size=V, d_model=32, n_heads=4, n_layers=2, dropout=0.0,
                max_len=32, pad_id=0)
    base.update(kw)
    return ModelConfig(**base)


VARIANTS = [
    dict(norm="post", pos="sinusoidal", ffn="relu"),
    dict(norm="pre", pos="learned", ffn="gelu"),
    dict(norm="pre", pos="rope", ffn="swiglu", norm_type="rmsnorm", bias=False),
]
VARIANT_IDS = ["paper", "gpt", "llama"]


def ids(b, t, low=1):
    return torch.randint(low, V, (b, t))


# ---- causality ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_decoder_lm_is_causal(variant):
    model = DecoderLM(cfg("decoder", **variant)).eval()
    x = ids(2, 10)
    y = x.clone()
    y[:, 6] = (y[:, 6] % (V - 1)) + 1  # change token 6 only
    a, _ = model(x)
    b, _ = model(y)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_transformer_decoder_is_causal_and_reads_the_source(variant):
    model = Transformer(cfg("encoder_decoder", **variant)).eval()
    src, tgt = ids(2, 9), ids(2, 6)
    tgt2 = tgt.clone()
    tgt2[:, 4] = (tgt2[:, 4] % (V - 1)) + 1
    a, _ = model(src, tgt)
    b, _ = model(src, tgt2)
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-5, rtol=1e-5)
    src2 = src.clone()
    src2[:, -1] = (src2[:, -1] % (V - 1)) + 1  # every target position sees the whole source
    c, _ = model(src2, tgt)
    assert not torch.allclose(a[:, 0], c[:, 0])


# ---- padding invariance ---------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
def test_encoder_padding_invariance(variant, pooling):
    model = EncoderClassifier(cfg("encoder", pooling=pooling, **variant)).eval()
    x = ids(2, 7)
    padded = torch.cat([x, torch.zeros(2, 5, dtype=torch.long)], 1)  # pad_id = 0
    a, _ = model(x)
    b, _ = model(padded)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.hidden_states(x), model.hidden_states(padded)[:, :7],
                               atol=1e-5, rtol=1e-5)


def test_max_pooling_is_the_per_feature_maximum_over_real_tokens():
    model = EncoderClassifier(cfg("encoder", pooling="max")).eval()
    x = ids(3, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]).bool()
    h = model.hidden_states(x, mask)
    pooled = model.pool(h, mask)
    torch.testing.assert_close(pooled[0], h[0].max(dim=0).values)
    torch.testing.assert_close(pooled[1], h[1, :2].max(dim=0).values)  # padding never wins
    assert not torch.equal(pooled[1], h[1].max(dim=0).values)
    torch.testing.assert_close(pooled[2], torch.zeros_like(pooled[2]))  # no real token


def test_sentence_transformers_pooling_is_read_from_its_folder(tmp_path):
    from attnlab.interop.pretrained import _pooling

    assert _pooling(tmp_path) == "cls"  # no 1_Pooling folder
    (tmp_path / "1_Pooling").mkdir()
    for key, want in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_max_tokens", "max"),
                      ("pooling_mode_cls_token", "cls")):
        (tmp_path / "1_Pooling" / "config.json").write_text(
            json.dumps({key: True, "word_embedding_dimension": 8}))
        assert _pooling(tmp_path) == want


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_transformer_source_padding_invariance(variant):
    model = Transformer(cfg("encoder_decoder", **variant)).eval()
    src, tgt = ids(1, 6), ids(1, 5)
    a, _ = model(src, tgt)
    b, _ = model(torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], 1), tgt)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # Right-padded targets: real positions are unchanged (the causal mask hides later pads).
    c, _ = model(src, torch.cat([tgt, torch.zeros(1, 3, dtype=torch.long)], 1))
    torch.testing.assert_close(a, c[:, :5], atol=1e-5, rtol=1e-5)


def test_transformer_loss_only_runs_its_head_on_the_counted_targets_only():
    """Given targets, the logits keep their (B, T, V) shape and the loss is torch's over the
    counted targets; asked for the loss only, the head runs on no target padding."""
    torch.manual_seed(0)
    model = Transformer(cfg("encoder_decoder", norm="pre"))
    src, tgt = ids(3, 6), ids(3, 5)
    src[1, 4:] = 0
    targets = ids(3, 5)
    targets[0, 3:], targets[2, 1:] = 0, 0  # right-padded targets
    targets[1, 2] = -100  # a target left out by hand
    rows = []
    model.head.register_forward_hook(lambda m, inp, out: rows.append(inp[0].shape[:-1]))
    full, none = model(src, tgt)
    picked = (targets != 0) & (targets != -100)
    at, loss = model(src, tgt, targets, loss=LossOptions(label_smoothing=0.1))
    assert none is None and full.shape == at.shape == (3, 5, V)
    assert rows == [(3, 5), (3, 5)]
    torch.testing.assert_close(at, full)
    # torch's own loss over the full pass, pads ignored, and the gradients it gives
    want = torch.nn.functional.cross_entropy(
        full.reshape(-1, V), targets.masked_fill(targets == 0, -100).reshape(-1),
        ignore_index=-100, label_smoothing=0.1)
    torch.testing.assert_close(loss, want)
    total = model(src, tgt, targets, loss=LossOptions(0.1, "sum"))[1]
    torch.testing.assert_close(total, want * picked.sum())
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params)
    for g, w in zip(got, torch.autograd.grad(want, params)):
        torch.testing.assert_close(g, w)
    # the loss only (no logits), through the head_loss slot: as it is, and with the fused loss
    # training puts there (attnlab.speed): the same loss and gradients
    for slot in ("as built", "fused"):
        if slot == "fused":
            use_fused_loss(model)
        none, only = model(src, tgt, targets, loss=LossOptions(0.1, loss_only=True))
        assert none is None and len(rows) == 3  # the head module itself did not run
        torch.testing.assert_close(only, want)
        for g, w in zip(torch.autograd.grad(only, params), got):
            torch.testing.assert_close(g, w)
    assert model.head_loss is linear_cross_entropy
    model.head_loss = lambda h, w, t, **kw: rows.append(h.shape[:-1]) or linear_cross_entropy(
        h, w, t, **kw)
    model(src, tgt, targets, loss=LossOptions(loss_only=True))
    assert rows[-1] == (int(picked.sum()),)  # the projection of the counted targets only


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_decoder_lm_loss_only_through_its_head_loss_slot_is_torchs_loss(smoothing):
    torch.manual_seed(0)
    model = DecoderLM(cfg("decoder", norm="pre"))
    x, targets = ids(3, 7), ids(3, 7)
    targets[0, 5:] = 0  # pads
    targets[2, 1] = -100  # a target left out by hand
    picked = (targets != 0) & (targets != -100)
    logits, loss = model(x, targets, loss=LossOptions(smoothing))
    want = torch.nn.functional.cross_entropy(
        logits.reshape(-1, V), targets.masked_fill(~picked, -100).reshape(-1),
        ignore_index=-100, label_smoothing=smoothing)
    torch.testing.assert_close(loss, want)
    total = model(x, targets, loss=LossOptions(smoothing, "sum"))[1]
    torch.testing.assert_close(total, want * picked.sum())
    params = list(model.parameters())
    got = torch.autograd.grad(want, params)
    for slot in ("as built", "fused"):  # the fused one training puts there: the same
        if slot == "fused":
            use_fused_loss(model)
        none, only = model(x, targets, loss=LossOptions(smoothing, "sum", loss_only=True))
        assert none is None
        torch.testing.assert_close(only, want * picked.sum())
        for g, w in zip(torch.autograd.grad(only / picked.sum(), params), got):
            torch.testing.assert_close(g, w)
    assert model.head_loss is linear_cross_entropy


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_decoder_left_padding_with_positions(variant):
    model = DecoderLM(cfg("decoder", **variant)).eval()
    x = ids(1, 6)
    alone, _ = model(x)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    mask = padded != 0
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out, _ = model(padded, mask=mask, positions=positions)
    torch.testing.assert_close(out[:, 3:], alone, atol=1e-5, rtol=1e-5)
    assert not torch.isnan(out).any()  # pad queries attend to nothing: zeros, not NaN


# ---- KV cache ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_a_left_padded_prefill_through_a_cache_counts_positions_from_the_real_tokens(pos):
    """model(padded, mask=..., cache=fresh) gave the real tokens positions 3..7 (the padding
    counted) where the call without a cache gives 0..4; then every cached step went on from
    there. Both families, and the next cached step too."""
    x, nxt = ids(1, 5), ids(1, 1)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    mask = torch.cat([padded != 0, torch.ones(1, 1, dtype=torch.bool)], 1)
    lm = DecoderLM(cfg("decoder", pos=pos)).eval()
    cache = lm.decoder.new_cache(1)
    first = lm(padded, mask=mask[:, :-1], cache=cache)[0][:, 3:]
    torch.testing.assert_close(first, lm(x)[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(lm(nxt, mask=mask, cache=cache)[0],  # (the mask of every key)
                               lm(torch.cat([x, nxt], 1))[0][:, -1:], atol=1e-5, rtol=0)
    mt = Transformer(cfg("encoder_decoder", pos=pos)).eval()
    memory = mt.encode(ids(1, 4))
    cached = mt.decode(padded, memory, tgt_mask=mask[:, :-1], cache=mt.decoder.new_cache(1))[:, 3:]
    torch.testing.assert_close(cached, mt.decode(x, memory), atol=1e-5, rtol=0)


def test_a_bf16_cache_serves_an_fp32_model():
    """decoder.new_cache(dtype=bf16) halves the cache of an fp32 model: keys and values are
    stored in bf16 and read back in the model's dtype (it failed with a dtype mismatch in
    attention)."""
    model = DecoderLM(cfg("decoder")).eval()
    x = ids(2, 9)
    full, _ = model(x)
    cache = model.decoder.new_cache(2, dtype=torch.bfloat16)
    parts = [model(x[:, :4], cache=cache)[0]]
    for t in range(4, 9):
        parts.append(model(x[:, t:t + 1], cache=cache)[0])
    out = torch.cat(parts, 1)
    assert out.dtype == torch.float32 and {c.dtype for c in cache.k + cache.v} == {torch.bfloat16}
    torch.testing.assert_close(out, full, atol=0.05, rtol=0.0)  # bf16 keys: ~3 digits
    assert not torch.equal(out, full)  # the cache really held rounded values


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_decoder_kv_cache_equals_full(variant):
    model = DecoderLM(cfg("decoder", **variant)).eval()
    x = ids(2, 9)
    full, _ = model(x)
    cache = model.decoder.new_cache(2)
    parts = [model(x[:, :4], cache=cache)[0]]
    for t in range(4, 9):
        parts.append(model(x[:, t:t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 9
    last, _ = model(x, last_only=True)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_transformer_kv_cache_equals_full(variant):
    model = Transformer(cfg("encoder_decoder", **variant)).eval()
    src, tgt = torch.cat([ids(2, 7), torch.zeros(2, 2, dtype=torch.long)], 1), ids(2, 6)
    full, _ = model(src, tgt)
    src_mask = valid_tokens(src, model.config.pad_id)
    memory = model.encode(src)
    cache = model.decoder.new_cache(2)
    steps = [model.decode(tgt[:, t:t + 1], memory, src_mask, cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [[2, 2, 0], [1, 0], [2, 0, 1, 1]])
def test_cache_reorder_selects_rows(rows):
    """Same, fewer (sentences leaving the batch) or more rows, then two more steps."""
    model = DecoderLM(cfg("decoder")).eval()
    x = ids(3, 4)
    cache = model.decoder.new_cache(3)
    model(x, cache=cache)
    cache.reorder(torch.tensor(rows))
    nxt = ids(len(rows), 2)
    out1, _ = model(nxt[:, :1], cache=cache)
    out2, _ = model(nxt[:, 1:], cache=cache)
    ref, _ = model(torch.cat([x[rows], nxt], 1))
    torch.testing.assert_close(out1[:, 0], ref[:, -2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out2[:, 0], ref[:, -1], atol=1e-5, rtol=1e-5)


# ---- attention capture -------------------------------------------------------------------------
def _count_reference_calls(monkeypatch):
    calls = []
    original = attention_module.reference_attention

    def counting(*a, **kw):
        calls.append(1)
        return original(*a, **kw)

    monkeypatch.setattr(attention_module, "reference_attention", counting)
    return calls


def test_attention_capture_chosen_layers_only_and_outputs_unchanged(monkeypatch):
    model = DecoderLM(cfg("decoder", n_layers=3)).eval()
    x = ids(2, 8)
    logits, _ = model(x)
    calls = _count_reference_calls(monkeypatch)
    maps = attention_maps(model, x, layers=[1], heads=[0, 3])
    assert len(calls) == 1  # layers 0 and 2 stayed on the fused path
    assert set(maps["decoder"]) == {1} and maps["decoder"][1].shape == (2, 2, 8, 8)
    torch.testing.assert_close(maps.logits, logits, atol=1e-5, rtol=1e-5)
    w = maps["decoder"][1]
    assert torch.all(w.triu(1) == 0)  # causal
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 8))
    with pytest.raises(ValueError, match="layer index 5 is out of range"):
        attention_maps(model, x, layers=[5])
    with pytest.raises(ValueError, match=r"head index 7 is out of range: there are 4 heads"):
        attention_maps(model, x, heads=[7])


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
@pytest.mark.parametrize("bad", [torch.tensor([1, 2, 3]), torch.ones(1, 3, 2, dtype=torch.long),
                                 torch.ones(1, 3)])
def test_ids_of_the_wrong_shape_or_type_are_named(family, bad):
    """One sequence without its batch dimension, a 3-D tensor or float ids: one message naming
    the shape and dtype (they failed inside torch: "Dimension out of range", an embedding's
    dtype error)."""
    model = build_model(cfg(family)).eval()
    call = (lambda: model(bad, bad)) if family == "encoder_decoder" else (lambda: model(bad))
    with pytest.raises(ValueError, match=r"ids must be \(B, T\) integer ids, got \("):
        call()


def test_attention_capture_encoder_decoder_on_padded_batch(monkeypatch):
    model = Transformer(cfg("encoder_decoder")).eval()
    src = torch.cat([ids(2, 5), torch.zeros(2, 2, dtype=torch.long)], 1)
    src[0, 5:] = ids(1, 2)
    tgt = ids(2, 4)
    logits, _ = model(src, tgt)
    calls = _count_reference_calls(monkeypatch)
    maps = attention_maps(model, src, tgt, layers=[0])
    assert len(calls) == 3  # encoder self, decoder self, cross of layer 0 only
    assert maps["encoder"][0].shape == (2, 4, 7, 7)
    assert maps["decoder"][0].shape == (2, 4, 4, 4)
    assert maps["cross"][0].shape == (2, 4, 4, 7)
    assert torch.all(maps["cross"][0][1, :, :, 5:] == 0)  # pads get no attention
    torch.testing.assert_close(maps.logits, logits, atol=1e-5, rtol=1e-5)
    assert maps.stacked("cross").shape == (1, 2, 4, 4, 7)


def test_encoder_capture():
    model = EncoderClassifier(cfg("encoder")).eval()
    x = ids(2, 6)
    maps = attention_maps(model, x, layers=True)
    assert set(maps["encoder"]) == {0, 1}
    torch.testing.assert_close(maps.logits, model(x)[0], atol=1e-5, rtol=1e-5)


# ---- learning ---------------------------------------------------------------------------------
def _overfit(model, batch, steps=150, lr=3e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        _, loss = model(*batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_each_family_overfits_one_batch(family):
    torch.manual_seed(0)
    model = build_model(cfg(family, norm="pre"))
    x = ids(4, 8)
    if family == "decoder":
        batch = (x[:, :-1], x[:, 1:])
    elif family == "encoder":
        batch = (x, torch.tensor([0, 1, 1, 0]))
    else:
        batch = (x, x[:, :-1], x[:, 1:])
    assert _overfit(model, batch) < 0.05


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_gradients_pass_finite_difference_check(family):
    torch.manual_seed(0)
    small = cfg(family, d_model=8, n_heads=2, n_layers=1, max_len=8, norm="pre", pos="rope")
    model = build_model(small).double().eval()
    x = ids(2, 4)
    args = {"decoder": (x, x), "encoder": (x, torch.tensor([0, 1])),
            "encoder_decoder": (x, x[:, :3], x[:, 1:])}[family]
    names = [n for n, _ in model.named_parameters()
             if n.endswith(("qkv_proj.weight", "w1.weight", "norm1.weight"))]
    params = dict(model.named_parameters())
    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)

    def loss(*ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), args)[1]

    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-5)


# ---- dropout --------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_dropout_acts_in_training_only(family):
    """Embedding, residual and FFN dropout (attention dropout off) change the output in training
    mode only; with dropout 0 training mode is deterministic."""
    model = build_model(cfg(family, dropout=0.5, attn_dropout=0.0))
    no_drop = build_model(cfg(family, dropout=0.0)).train()
    x = ids(2, 8)
    args = (x, x) if family == "encoder_decoder" else (x,)
    torch.testing.assert_close(no_drop(*args)[0], no_drop(*args)[0])
    model.eval()
    torch.testing.assert_close(model(*args)[0], model(*args)[0])
    model.train()
    assert not torch.allclose(model(*args)[0], model(*args)[0])


# ---- one model API: forward(ids..., targets) -> (logits, loss) -----------------------------------
FAMILY_CALLS = {  # family, head -> (the forward's inputs, targets, the logits' shape)
    ("decoder", "classify"): lambda: ((ids(2, 6),), ids(2, 6), (2, 6, V)),
    ("encoder_decoder", "classify"): lambda: ((ids(2, 7), ids(2, 6)), ids(2, 6), (2, 6, V)),
    ("encoder", "classify"): lambda: ((ids(2, 7),), torch.tensor([1, 0]), (2, 2)),
    ("encoder", "mlm"): lambda: ((ids(2, 7),), torch.full((2, 7), -100).index_fill(1, torch.tensor(
        [2, 5]), 3), (2, 7, V)),
}


@pytest.mark.parametrize("family, head", list(FAMILY_CALLS))
def test_every_family_returns_its_logits_and_its_own_loss_under_one_set_of_loss_options(
        family, head):
    """The logits keep their shape with or without targets; the loss is torch's cross-entropy
    of them (label smoothing, sum); loss_only gives None and the same loss, and needs targets."""
    torch.manual_seed(0)
    model = build_model(cfg(family, head=head)).eval()
    inputs, targets, shape = FAMILY_CALLS[family, head]()
    alone, none = model(*inputs)
    logits, loss = model(*inputs, targets, loss=LossOptions(0.1, "sum"))
    assert none is None and alone.shape == logits.shape == shape
    torch.testing.assert_close(logits, alone)
    pads = family != "encoder" or head == "mlm"  # (a class 0 is not a pad)
    flat = targets.masked_fill(pads & (targets == 0), -100).reshape(-1)  # pads do not count
    want = torch.nn.functional.cross_entropy(logits.reshape(flat.numel(), -1), flat,
                                             label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, want)
    nothing, only = model(*inputs, targets, loss=LossOptions(0.1, "sum", loss_only=True))
    assert nothing is None
    torch.testing.assert_close(only, want)
    with pytest.raises(ValueError, match="loss_only=True\\) needs targets"):
        model(*inputs, loss=LossOptions(loss_only=True))


def test_loss_options_are_checked_and_last_only_is_for_decoding():
    with pytest.raises(ConfigError, match="reduction='none' is not allowed"):
        LossOptions(reduction="none")
    with pytest.raises(ConfigError, match="label_smoothing=1.0 is not allowed"):
        LossOptions(label_smoothing=1.0)
    with pytest.raises(ConfigError, match="loss_only=1 has the wrong type"):
        LossOptions(loss_only=1)
    model = DecoderLM(cfg("decoder"))
    with pytest.raises(ValueError, match="last_only=True is for decoding and takes no targets"):
        model(ids(1, 4), ids(1, 4), last_only=True)


# ---- bookkeeping ------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_parameter_counts_by_component(family):
    model = build_model(cfg(family, tie_embeddings=False))
    parts = count_parameters(model, by_component=True)
    assert sum(parts.values()) == count_parameters(model) == sum(
        p.numel() for p in model.parameters())
    stack = "decoder" if family == "decoder" else "encoder"
    assert parts[f"{stack}.0.attention"] == 4 * (32 * 32 + 32)
    assert parts[f"{stack}.1.ffn"] == 32 * 128 + 128 + 128 * 32 + 32
    assert parts["embeddings"] > 0 and parts["head"] > 0 and parts["norms"] > 0
    names = list(parts)  # reading order: embeddings, blocks in order, norms, head
    assert names[0] == "embeddings" and names[-2:] == ["norms", "head"]
    assert names.index(f"{stack}.0.attention") < names.index(f"{stack}.1.attention")
    if family == "encoder_decoder":
        assert parts["decoder.0.cross_attention"] == 4 * (32 * 32 + 32)


def test_tied_embeddings_share_one_matrix():
    model = DecoderLM(cfg("decoder"))
    assert model.head.weight is model.emb.tok.weight
    t = Transformer(cfg("encoder_decoder", share_embeddings=True))
    assert t.src_emb.tok.weight is t.tgt_emb.tok.weight is t.head.weight


def test_too_long_input_says_so():
    model = DecoderLM(cfg("decoder", max_len=8))
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_len=8"):
        model(ids(1, 9))


def test_inputs_are_not_modified_in_place():
    """A common bug adds the positions in place (``src += pos``), changing the caller's tensor."""
    model = Transformer(cfg("encoder_decoder")).eval()
    src, tgt = ids(2, 5), ids(2, 4)
    src0, tgt0 = src.clone(), tgt.clone()
    model(src, tgt)
    assert torch.equal(src, src0) and torch.equal(tgt, tgt0)
    mem = model.encode(src)
    mem0 = mem.clone()
    model.decode(tgt, mem)
    assert torch.equal(mem, mem0)


@pytest.mark.parametrize("scaled", [True, False])
def test_init_std_and_residual_scaling(scaled):
    """Weights start N(0, init_std); attention out_proj and FFN w2 (which write into the
    residual stream) at init_std / sqrt(2L) only with init_residual_scale (GPT-2's rule)."""
    torch.manual_seed(0)
    c = cfg("decoder", d_model=64, n_heads=4, n_layers=8, init_std=0.05,
            init_residual_scale=scaled, scale_embeddings=False, pos="learned")
    model = build_model(c)
    std = {n: p.std().item() for n, p in model.named_parameters() if p.dim() == 2}
    residual = 0.05 / (2 * 8) ** 0.5 if scaled else 0.05
    for name, s in std.items():
        want = residual if name.endswith(("out_proj.weight", "w2.weight")) else 0.05
        assert s == pytest.approx(want, rel=0.1), name


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("positions, error, pattern", [
    (torch.tensor([0, 1, 2, 32]), ValueError, r"positions must be in 0\.\.31 .*from 0 to 32"),
    (torch.tensor([[0, 1, 2, -1]]), ValueError, r"positions must be in 0\.\.31 .*from -1 to 2"),
    (torch.tensor([0, 1, 2]), ValueError, r"shape \(T,\) or \(B, T\) with T=4, got \(3,\)"),
    (torch.tensor([0.0, 1.0, 2.0, 3.0]), TypeError, r"integer token positions"),
])
def test_explicit_positions_are_checked(family, positions, error, pattern):
    model = build_model(cfg(family, pos="learned")).eval()
    x = ids(1, 4)
    with pytest.raises(error, match=pattern):
        if family == "decoder":
            model(x, positions=positions)
        else:
            model.decode(x, model.encode(x), positions=positions)


def test_explicit_positions_in_range_are_used():
    model = build_model(cfg("decoder", pos="learned")).eval()
    x = ids(2, 4)
    shifted, _ = model(x, positions=torch.arange(3, 7))
    default, _ = model(x)
    explicit, _ = model(x, positions=torch.arange(4).expand(2, 4))
    torch.testing.assert_close(explicit, default)
    assert not torch.allclose(shifted, default)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_a_padded_row_given_its_mask_equals_the_row_alone(pos, family, side):
    """Without a cache or explicit positions, a decoder's mask (DecoderLM's ``mask``, the
    Transformer's ``tgt_mask``) also sets each row's positions: real tokens from 0, whichever
    side the padding is on."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(family=family, vocab_size=30, d_model=16, n_heads=2,
                                    n_layers=2, max_len=16, pos=pos, dropout=0.0)).eval()
    ids = torch.randint(3, 30, (1, 5))
    pad = torch.zeros(1, 3, dtype=torch.long)
    padded = torch.cat([pad, ids] if side == "left" else [ids, pad], 1)
    mask = padded != 0
    real = slice(3, 8) if side == "left" else slice(0, 5)
    with torch.no_grad():
        if family == "decoder":
            alone, got = model(ids)[0], model(padded, mask=mask)[0][:, real]
            maps = attention_maps(model, padded, mask=mask)
            torch.testing.assert_close(maps.logits[:, real], alone, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(maps["decoder"][0][:, :, real, real],
                                       attention_maps(model, ids)["decoder"][0],
                                       atol=1e-5, rtol=1e-5)
        else:
            src = torch.randint(3, 30, (1, 6))
            alone, got = model(src, ids)[0], model(src, padded, tgt_mask=mask)[0][:, real]
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)
