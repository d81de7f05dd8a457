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
    causal_mask,
    dropout,
    fused_attention,
    key_mask,
    reference_attention,
    sinusoidal_table,
    valid_tokens,
)

torch.manual_seed(0)


# ---- masks ------------------------------------------------------------------------------------
def test_causal_mask_lower_triangular_and_offset():
    m = causal_mask(3)
    assert m.dtype == torch.bool
    assert m.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # 2 new queries after 3 cached keys: query 0 is position 3.
    assert causal_mask(2, 5).tolist() == [[True] * 4 + [False], [True] * 5]


def padded(lengths: list[int], s: int) -> torch.Tensor:
    """(B, 1, 1, S) mask of right-padded rows of ``lengths`` real tokens."""
    return key_mask(torch.arange(s) < torch.tensor(lengths)[:, None])


def test_valid_tokens_and_key_masks():
    ids = torch.tensor([[5, 6, 0, 0], [1, 2, 3, 4]])
    valid = valid_tokens(ids, pad_id=0)  # (B, S)
    assert valid.tolist() == [[True, True, False, False], [True] * 4]
    assert valid_tokens(ids, None) is None  # no pad id: every token is real
    given = torch.ones(2, 4, dtype=torch.bool)
    assert valid_tokens(ids, 0, given) is given  # a mask the caller gives wins
    m = key_mask(valid)
    assert m.shape == (2, 1, 1, 4) and torch.equal(m, padded([2, 4], 4))
    assert key_mask(None) is None
    both = causal_mask(4) & m  # masks combine with &, broadcasting to (B, 1, T, S)
    assert both.shape == (2, 1, 4, 4)
    assert both[0, 0].tolist()[3] == [True, True, False, False]


# ---- the two attention paths ------------------------------------------------------------------
def _qkv(b=2, h=3, t=5, s=7, dh=8, dtype=torch.float32):
    return (torch.randn(b, h, t, dh, dtype=dtype), torch.randn(b, h, s, dh, dtype=dtype),
            torch.randn(b, h, s, dh, dtype=dtype))


MASKS = {
    "none": lambda t, s: None,
    "padding": lambda t, s: padded([s, s - 3], s),
    "causal": lambda t, s: causal_mask(t, s),
    "causal+padding": lambda t, s: causal_mask(t, s) & padded([s, s - 1], s),
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
    out, w = mha(x, mem, mask=padded([9, 4], 9), need_weights=True)
    assert out.shape == (2, 3, 16) and w.shape == (2, 4, 3, 9)
    assert torch.all(w[1, :, :, 4:] == 0)
    fused, none = mha(x, mem, mask=padded([9, 4], 9))
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


# ---- dropout --------------------------------------------------------------------------------
def test_dropout_is_torchs_and_every_module_that_drops_holds_it_in_its_slot():
    """The core's dropout is F.dropout (a seed gives F.dropout's mask); the faster CPU one
    enters through the ``drop`` slots (tests/speed)."""
    x = torch.randn(4, 6)
    torch.manual_seed(5)
    want = F.dropout(x, 0.3, training=True)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.3), want)
    ffn = FeedForward(8, 16, dropout=0.5).train()
    assert ffn.drop is dropout
    ffn.drop = lambda h, p: h * 0.0  # what the slot holds is what the forward calls
    assert torch.equal(ffn(torch.randn(2, 3, 8)), ffn.w2.bias.expand(2, 3, 8))


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
