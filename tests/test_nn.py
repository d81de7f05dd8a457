"""Building blocks: masks, the two attention paths, multi-head attention, positions, norms."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab import numpy_ref
from attnlab.nn import (
    FeedForward,
    KVCache,
    LayerNorm,
    LearnedPositions,
    MultiHeadAttention,
    RMSNorm,
    RotaryEmbedding,
    SinusoidalPositions,
    attention,
    causal_mask,
    combine_masks,
    fused_attention,
    left_padding_mask,
    pad_mask_from_ids,
    padding_mask,
    reference_attention,
    sinusoidal_table,
)
from attnlab.nn.masks import as_4d

torch.manual_seed(0)


# ---- masks ------------------------------------------------------------------------------------
def test_causal_mask_lower_triangular_and_offset():
    m = causal_mask(3)
    assert m.dtype == torch.bool
    assert m.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # 2 new queries after 3 cached keys: query 0 is position 3.
    assert causal_mask(2, 5).tolist() == [[True] * 4 + [False], [True] * 5]


def test_padding_masks():
    lengths = torch.tensor([2, 4])
    m = padding_mask(lengths, 4)
    assert m.shape == (2, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [True] * 4]
    ids = torch.tensor([[5, 6, 0, 0], [1, 2, 3, 4]])
    assert torch.equal(pad_mask_from_ids(ids, 0), m)
    left = left_padding_mask(lengths, 4)
    assert left[:, 0, 0].tolist() == [[False, False, True, True], [True] * 4]
    both = combine_masks(causal_mask(4), m, None)
    assert both.shape == (2, 1, 4, 4)
    assert both[0, 0].tolist()[3] == [True, True, False, False]
    assert combine_masks(None, None) is None
    with pytest.raises(TypeError, match="bool"):
        combine_masks(torch.zeros(2, 2))


# ---- the two attention paths ------------------------------------------------------------------
def _qkv(b=2, h=3, t=5, s=7, dh=8, dtype=torch.float32):
    return (torch.randn(b, h, t, dh, dtype=dtype), torch.randn(b, h, s, dh, dtype=dtype),
            torch.randn(b, h, s, dh, dtype=dtype))


MASKS = {
    "none": lambda t, s: None,
    "padding": lambda t, s: padding_mask(torch.tensor([s, s - 3]), s),
    "causal": lambda t, s: causal_mask(t, s),
    "causal+padding": lambda t, s: combine_masks(causal_mask(t, s),
                                                 padding_mask(torch.tensor([s, s - 1]), s)),
    "per-query (B,T,S)": lambda t, s: torch.rand(2, t, s) > 0.3,
    "fully masked rows": lambda t, s: (torch.rand(2, 1, t, s) > 0.3).index_fill(
        2, torch.tensor([t - 1]), False),
}


@pytest.mark.parametrize("kind", list(MASKS))
@pytest.mark.parametrize("ts", [(5, 7), (6, 6), (1, 9)])
def test_reference_equals_fused(kind, ts):
    t, s = ts
    q, k, v = _qkv(t=t, s=s)
    mask = MASKS[kind](t, s)
    ref, weights = reference_attention(q, k, v, mask)
    fused = fused_attention(q, k, v, mask)
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)
    assert not torch.isnan(ref).any() and not torch.isnan(fused).any()
    sums = weights.sum(-1)
    assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0))


def test_fused_attention_refuses_keys_and_values_of_different_lengths():
    """torch's CPU kernel returns a result for 5 keys and 3 values (reading past v); the
    written-out path fails in its matmul."""
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="k and v must have the same length S, got 5 and 3"):
        fused_attention(q, k, v)


def test_is_causal_flag_matches_explicit_mask_and_aligns_to_the_end():
    q, k, v = _qkv(t=3, s=7)
    for fn in (lambda *a, **kw: reference_attention(*a, **kw)[0], fused_attention):
        a = fn(q, k, v, is_causal=True)
        b = fn(q, k, v, causal_mask(3, 7))
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_fully_masked_row_gives_zeros_and_finite_gradients():
    q, k, v = (x.requires_grad_() for x in _qkv(t=3, s=4))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    for fn in (lambda *a: reference_attention(*a)[0], fused_attention):
        out = fn(q, k, v, mask)
        assert torch.all(out[:, :, 1] == 0)
        out.sum().backward()
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
        for x in (q, k, v):
            x.grad = None


@pytest.mark.parametrize("kind", ["causal+padding", "fully masked rows"])
def test_low_precision_cpu_attention_with_a_mask_is_computed_in_fp32(kind):
    # bf16 on a CPU, whole short sequences with a mask: the fused path computes in fp32 even
    # under autocast (which would cast the inputs back down), so it equals torch's fp32 SDPA on
    # the same inputs rounded once, and the reference in float64 up to that one rounding.
    q, k, v = (x.bfloat16().requires_grad_() for x in _qkv(t=6, s=6))
    mask = MASKS[kind](6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_attention(q, k, v, mask)
    assert out.dtype == torch.bfloat16
    m = F.scaled_dot_product_attention(*(x.detach().float() for x in (q, k, v)),
                                       attn_mask=as_4d(mask))
    assert torch.equal(out, m.bfloat16())
    ref, _ = reference_attention(*(x.detach().double() for x in (q, k, v)), mask)
    torch.testing.assert_close(out.double(), ref, atol=8e-3, rtol=8e-3)  # one bf16 rounding
    out.float().sum().backward()
    assert all(x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("in_fp32", [True, False])
@pytest.mark.parametrize("s, masked", [(40, False), (300, False), (300, True)])
def test_low_precision_cpu_attention_of_one_query_takes_the_measured_kernel(
        s, masked, in_fp32, monkeypatch):
    # One bf16 query against s cached keys (a decoding step; s beyond the short-sequence
    # limit too): where the probe measured it faster, fp32 flash on the upcast inputs,
    # rounded once (equal to torch's fp32 SDPA on the same inputs), else torch's bf16 kernel
    # itself; both are the float64 reference up to bf16 rounding.
    monkeypatch.setattr(attention, "one_query_in_fp32", lambda dtype: in_fp32)
    q, k, v = (x.bfloat16() for x in _qkv(t=1, s=s))
    mask = torch.rand(1, s) > 0.3 if masked else None
    out = fused_attention(q, k, v, mask, is_causal=True)
    assert out.dtype == torch.bfloat16
    if in_fp32:
        m = F.scaled_dot_product_attention(*(x.float() for x in (q, k, v)),
                                           attn_mask=as_4d(mask)).bfloat16()
    else:
        m = F.scaled_dot_product_attention(q, k, v, attn_mask=as_4d(mask))
    assert torch.equal(out, m)
    ref, _ = reference_attention(*(x.double() for x in (q, k, v)), mask, is_causal=True)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_the_one_query_attention_probe_measures_once_per_machine(monkeypatch, tmp_path):
    from attnlab import probe

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    probe.one_query_in_fp32.cache_clear()
    try:
        answer = probe.one_query_in_fp32(torch.bfloat16)
        entry = probe._read_cache(probe.cache_file())[
            probe.machine_key("one-query attention", str(torch.bfloat16))]
        assert entry["kernels"] == ("fp32" if answer else "own dtype")
        assert set(entry["ms"]) == {"fp32", "own dtype"}
        probe.one_query_in_fp32.cache_clear()  # a new process: answered from the file
        monkeypatch.setattr(probe, "_write_cache", lambda *a: pytest.fail("measured again"))
        assert probe.one_query_in_fp32(torch.bfloat16) is answer
    finally:
        probe.one_query_in_fp32.cache_clear()


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("autocast", [True, False])
def test_low_precision_cpu_attention_without_a_mask_is_two_matmuls_in_bf16(is_causal, autocast):
    # Unmasked short bf16 sequences on a CPU (a decoder's training step) run as two batched
    # matmuls in bf16 with the scale and the causal mask fused into the first: output and
    # gradients equal the float64 reference up to bf16 roundings of the scores, weights and
    # output, and come out in bf16. q, k, v are views of one projection, as in the model.
    qkv = torch.randn(2, 64, 3, 4, 16).bfloat16().requires_grad_()
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, T, Dh), not contiguous
    grad = torch.randn(2, 4, 64, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = fused_attention(q, k, v, is_causal=is_causal)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 64, 16)
    (out.float() * grad).sum().backward()
    x64 = qkv.detach().double().requires_grad_()
    ref, _ = reference_attention(*x64.permute(2, 0, 3, 1, 4).unbind(0), is_causal=is_causal)
    (ref * grad.double()).sum().backward()
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(qkv.grad.double(), x64.grad, atol=6e-2, rtol=3e-2)
    assert (out.double() - ref).abs().mean() < 3e-3  # typical error: a bf16 rounding or two


def test_low_precision_cpu_attention_drops_weights_and_serves_training_after_inference():
    q, k, v = (x.bfloat16() for x in _qkv(t=8, s=8))
    with torch.inference_mode():  # the first call of a length (e.g. sampling) builds its mask
        first = fused_attention(q, k, v, is_causal=True)
    q.requires_grad_()
    again = fused_attention(q, k, v, is_causal=True)  # a training step reuses the mask
    assert torch.equal(first, again)
    again.float().sum().backward()
    assert torch.isfinite(q.grad).all()
    assert torch.all(fused_attention(q, k, v, dropout_p=1.0, is_causal=True) == 0)
    kept = fused_attention(q, k, v, dropout_p=0.5, is_causal=True)
    assert not torch.equal(kept, again) and torch.isfinite(kept).all()


def test_attention_matches_the_formula_written_with_loops():
    q, k, v = _qkv(b=1, h=1, t=2, s=3, dh=4)
    _, w = reference_attention(q, k, v)
    for i in range(2):
        scores = [float(q[0, 0, i] @ k[0, 0, j]) / math.sqrt(4) for j in range(3)]
        expected = torch.softmax(torch.tensor(scores), 0)
        torch.testing.assert_close(w[0, 0, i], expected, atol=1e-6, rtol=1e-6)


def test_batched_3d_input_works():
    """A common bug uses ``K.T``, which on (B, S, D) input transposes the batch axis too."""
    q, k, v = torch.randn(4, 5, 8), torch.randn(4, 6, 8), torch.randn(4, 6, 8)
    out, w = reference_attention(q, k, v)
    assert out.shape == (4, 5, 8) and w.shape == (4, 5, 6)
    expected = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(8), -1) @ v
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


# ---- multi-head attention -----------------------------------------------------------------
def test_heads_must_divide_d_model_unless_head_dim_given():
    with pytest.raises(ValueError, match=r"n_heads=4 does not divide d_model=30"):
        MultiHeadAttention(30, 4)
    mha = MultiHeadAttention(30, 4, head_dim=8)  # 4 * 8 = 32 != 30: projected back to 30
    x = torch.randn(2, 5, 30)
    out, w = mha(x, need_weights=True)
    assert out.shape == (2, 5, 30) and w.shape == (2, 4, 5, 5)


def test_mha_cross_attention_lengths_differ():
    mha = MultiHeadAttention(16, 4).eval()
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 9, 16)
    out, w = mha(x, mem, mask=padding_mask(torch.tensor([9, 4]), 9), need_weights=True)
    assert out.shape == (2, 3, 16) and w.shape == (2, 4, 3, 9)
    assert torch.all(w[1, :, :, 4:] == 0)
    fused, none = mha(x, mem, mask=padding_mask(torch.tensor([9, 4]), 9))
    assert none is None
    torch.testing.assert_close(fused, out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rope", [False, True])
def test_mha_kv_cache_equals_full_recomputation(rope):
    mha = MultiHeadAttention(16, 4, rope=RotaryEmbedding(4, 32) if rope else None).eval()
    x = torch.randn(2, 6, 16)
    full, _ = mha(x, is_causal=True, positions=torch.arange(6))
    cache = KVCache(1, 2, 4, 4, max_len=8)
    steps = []
    for t0, t1 in [(0, 3), (3, 4), (4, 5), (5, 6)]:  # a prefill of 3, then one at a time
        out, _ = mha(x[:, t0:t1], is_causal=True, positions=torch.arange(t0, t1), cache=cache)
        cache.advance(t1 - t0)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="KV cache is full"):
        mha(torch.randn(2, 3, 16), positions=torch.arange(6, 9), cache=cache)


def test_mha_dropout_only_in_training():
    mha = MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(1, 4, 16)
    mha.eval()
    torch.testing.assert_close(mha(x).output, mha(x).output)
    mha.train()
    assert not torch.allclose(mha(x).output, mha(x).output)


def test_numpy_reference_equals_torch_mha():
    mha = MultiHeadAttention(12, 3).eval().double()
    x, ctx = torch.randn(5, 12, dtype=torch.float64), torch.randn(7, 12, dtype=torch.float64)
    mask = torch.rand(5, 7) > 0.3
    out, w = mha(x[None], ctx[None], mask=mask, need_weights=True)
    p = {n: t.detach().numpy() for n, t in mha.named_parameters()}
    wq, wk, wv = np.split(p["qkv_proj.weight"], 3)
    bq, bk, bv = np.split(p["qkv_proj.bias"], 3)
    np_out, np_w = numpy_ref.multi_head_attention(
        x.numpy(), ctx.numpy(), wq, wk, wv, p["out_proj.weight"], 3, bq, bk, bv,
        p["out_proj.bias"], mask=mask.numpy())
    np.testing.assert_allclose(out[0].detach().numpy(), np_out, atol=1e-10)
    np.testing.assert_allclose(w[0].detach().numpy(), np_w, atol=1e-10)


def test_numpy_scaled_dot_product_equals_torch():
    q, k, v = (np.random.default_rng(0).standard_normal((n, 4)) for n in (3, 5, 5))
    out, w = numpy_ref.scaled_dot_product_attention(q, k, v)
    t_out, t_w = reference_attention(*(torch.from_numpy(a) for a in (q, k, v)))
    np.testing.assert_allclose(out, t_out.numpy(), atol=1e-12)
    np.testing.assert_allclose(w, t_w.numpy(), atol=1e-12)


def test_numpy_attention_batched_and_its_refusals():
    """Leading batch dimensions broadcast (``k.T`` reversed every axis of a 3-D k: a result of
    the right shape and wrong values); an additive float mask, whose -inf np.where reads as
    True, and heads that do not divide the width are refused."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((4, 3, 8)), rng.standard_normal((4, 5, 8)), \
        rng.standard_normal((4, 5, 8))
    out, w = numpy_ref.scaled_dot_product_attention(q, k, v)
    t_out, t_w = reference_attention(*(torch.from_numpy(a) for a in (q, k, v)))
    np.testing.assert_allclose(out, t_out.numpy(), atol=1e-12)
    np.testing.assert_allclose(w, t_w.numpy(), atol=1e-12)
    allowed = np.tril(np.ones((3, 5), dtype=bool))
    with pytest.raises(ValueError, match="mask must be bool .* got dtype float64"):
        numpy_ref.scaled_dot_product_attention(q[0], k[0], v[0],
                                               np.where(allowed, 0.0, -np.inf))
    x, weight = rng.standard_normal((3, 6)), rng.standard_normal((6, 6))
    for heads in (0, 4, -1):
        with pytest.raises(ValueError, match=f"n_heads={heads} must be a positive divisor of "
                                             "the projections' width H\\*Dh=6"):
            numpy_ref.multi_head_attention(x, None, weight, weight, weight, weight, heads)


# ---- positions ------------------------------------------------------------------------------
def test_sinusoidal_table_equals_the_papers_formula():
    table = sinusoidal_table(50, 16)
    np.testing.assert_allclose(table.numpy(), numpy_ref.sinusoidal_table(50, 16), atol=1e-6)
    # A common bug (exponent `dim // d_model`, always 0) gives every position the same
    # encoding; ours are all distinct.
    assert torch.cdist(table, table).add(torch.eye(50)).min() > 0.1
    assert table[0, 0::2].abs().max() == 0 and torch.all(table[0, 1::2] == 1)


@pytest.mark.parametrize("cls", [SinusoidalPositions, LearnedPositions])
def test_absolute_positions_any_length_up_to_max_len(cls):
    pos = cls(8, 10)
    for t in (1, 4, 10):
        assert pos(torch.arange(t)).shape == (t, 8)
    assert pos(torch.arange(6).view(2, 3)).shape == (2, 3, 8)


def test_rope_depends_only_on_relative_position():
    rope = RotaryEmbedding(8, 64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        return float(rope(q, torch.tensor([i])) @ rope(k, torch.tensor([j])).transpose(-1, -2))

    assert score(3, 1) == pytest.approx(score(12, 10), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    with pytest.raises(ValueError, match="exceeds max_len=64"):
        rope(torch.randn(1, 1, 65, 8))
    # Per-row positions (B, T) give the same as shared positions row by row.
    x = torch.randn(2, 2, 3, 8)
    rows = rope(x, torch.tensor([[0, 1, 2], [5, 6, 7]]))
    torch.testing.assert_close(rows[1], rope(x[1:], torch.arange(5, 8))[0])


# ---- feed-forward and norms -------------------------------------------------------------------
def test_layer_norm_equals_torch_and_written_out_formula():
    ln, ref = LayerNorm(10, eps=1e-5), torch.nn.LayerNorm(10, eps=1e-5)
    with torch.no_grad():
        ln.weight.normal_(), ln.bias.normal_()
        ref.weight.copy_(ln.weight), ref.bias.copy_(ln.bias)
    x = torch.randn(3, 4, 10) * 5 + 2
    torch.testing.assert_close(ln(x), ref(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ln.reference(x), ref(x), atol=1e-5, rtol=1e-5)
    out = ln.reference(x)
    assert out.shape == x.shape


def test_rms_norm_formula():
    n = RMSNorm(6, eps=0.5)  # an eps and a gain large enough to matter
    with torch.no_grad():
        n.weight.normal_()
    x = torch.randn(2, 6)
    want = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 0.5) * n.weight
    torch.testing.assert_close(n(x), want)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_feed_forward_variants(act):
    ff = FeedForward(8, 32, act).eval()
    x = torch.randn(2, 3, 8)
    h = ff.w1(x)
    expected = {"relu": F.relu(h), "gelu": F.gelu(h), "gelu_tanh": F.gelu(h, approximate="tanh"),
                "swiglu": F.silu(h) * (ff.w3(x) if ff.w3 is not None else h)}[act]
    torch.testing.assert_close(ff(x), ff.w2(expected))
    with pytest.raises(ValueError, match="activation='tanh' is not allowed"):
        FeedForward(8, 32, "tanh")


def test_low_precision_cpu_attention_keeps_a_kernel_the_user_chose():
    # train.sdpa_backend = "math" / "flash" (torch's sdpa_kernel): SDPA with that kernel, in fp32
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (x.bfloat16() for x in _qkv(t=8, s=8))
    with sdpa_kernel([SDPBackend.MATH]):
        out = fused_attention(q, k, v, is_causal=True)
    with sdpa_kernel([SDPBackend.MATH]):
        m = F.scaled_dot_product_attention(*(x.float() for x in (q, k, v)), is_causal=True)
    assert torch.equal(out, m.bfloat16())
