"""The speed layer: attention kernels for bf16/fp16 on a CPU (the core's ``sdpa`` slot),
dropout for CPUs (the ``drop`` slots), the output projection fused with its loss (the
``head_loss`` slot), and that the core imports none of it. The probes of the decoding steps
are tested with decoding (tests/decoding/test_generate.py), training's precision probe in
tests/train/test_precision.py."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab import DecoderLM, ModelConfig, attention_maps, build_model
from attnlab.nn import (
    MultiHeadAttention,
    as_4d,
    causal_mask,
    dropout,
    fused_attention,
    key_mask,
    reference_attention,
)
from attnlab.speed import attention as speed_attention
from attnlab.speed import (
    cpu_dropout,
    cpu_sdpa,
    cpu_sdpa_in,
    linear_cross_entropy,
    probe,
    use_cpu_dropout,
    use_cpu_sdpa,
)
from attnlab.speed.attention import one_query_in_fp32

torch.manual_seed(0)

# the core's fused path with the speed layer's kernel in its slot, as a model runs it
fast_attention = functools.partial(fused_attention, sdpa=cpu_sdpa)


def _qkv(b=2, h=3, t=5, s=7, dh=8, dtype=torch.float32):
    return (torch.randn(b, h, t, dh, dtype=dtype), torch.randn(b, h, s, dh, dtype=dtype),
            torch.randn(b, h, s, dh, dtype=dtype))


MASKS = {
    "causal+padding": lambda t, s: causal_mask(t, s) & key_mask(
        torch.arange(s) < torch.tensor([s, s - 1])[:, None]),
    "fully masked rows": lambda t, s: (torch.rand(2, 1, t, s) > 0.3).index_fill(
        2, torch.tensor([t - 1]), False),
}


@pytest.mark.parametrize("kind", ["causal+padding", "fully masked rows"])
def test_low_precision_cpu_attention_with_a_mask_is_computed_in_fp32(kind):
    # bf16 on a CPU, whole short sequences with a mask: the fused path computes in fp32 even
    # under autocast (which would cast the inputs back down), so it equals torch's fp32 SDPA on
    # the same inputs rounded once, and the reference in float64 up to that one rounding.
    q, k, v = (x.bfloat16().requires_grad_() for x in _qkv(t=6, s=6))
    mask = MASKS[kind](6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fast_attention(q, k, v, mask)
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
    monkeypatch.setattr(speed_attention, "one_query_in_fp32", lambda dtype: in_fp32)
    q, k, v = (x.bfloat16() for x in _qkv(t=1, s=s))
    mask = torch.rand(1, s) > 0.3 if masked else None
    out = fast_attention(q, k, v, mask, is_causal=True)
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
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    one_query_in_fp32.cache_clear()
    try:
        answer = one_query_in_fp32(torch.bfloat16)
        entry = probe._read_cache(probe.cache_file())[
            probe.machine_key("one-query attention", str(torch.bfloat16))]
        assert entry["kernels"] == ("fp32" if answer else "own dtype")
        assert set(entry["ms"]) == {"fp32", "own dtype"}
        one_query_in_fp32.cache_clear()  # a new process: answered from the file
        monkeypatch.setattr(probe, "_write_cache", lambda *a: pytest.fail("measured again"))
        assert one_query_in_fp32(torch.bfloat16) is answer
    finally:
        one_query_in_fp32.cache_clear()


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
        out = fast_attention(q, k, v, is_causal=is_causal)
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
        first = fast_attention(q, k, v, is_causal=True)
    q.requires_grad_()
    again = fast_attention(q, k, v, is_causal=True)  # a training step reuses the mask
    assert torch.equal(first, again)
    again.float().sum().backward()
    assert torch.isfinite(q.grad).all()
    assert torch.all(fast_attention(q, k, v, dropout_p=1.0, is_causal=True) == 0)
    kept = fast_attention(q, k, v, dropout_p=0.5, is_causal=True)
    assert not torch.equal(kept, again) and torch.isfinite(kept).all()


def test_low_precision_cpu_attention_keeps_a_kernel_the_user_chose():
    # train.sdpa_backend = "math" / "flash" (torch's sdpa_kernel): SDPA with that kernel, in fp32
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (x.bfloat16() for x in _qkv(t=8, s=8))
    with sdpa_kernel([SDPBackend.MATH]):
        out = fast_attention(q, k, v, is_causal=True)
    with sdpa_kernel([SDPBackend.MATH]):
        m = F.scaled_dot_product_attention(*(x.float() for x in (q, k, v)), is_causal=True)
    assert torch.equal(out, m.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cpu_kernel_is_sdpa_itself_outside_low_precision(dtype):
    q, k, v = _qkv(t=6, s=6, dtype=dtype)
    mask = MASKS["causal+padding"](6, 6)
    assert torch.equal(fast_attention(q, k, v, mask), fused_attention(q, k, v, mask))
    assert torch.equal(fast_attention(q, k, v, is_causal=True),
                       fused_attention(q, k, v, is_causal=True))


def test_use_cpu_sdpa_fills_every_attention_slot_and_the_context_restores_them():
    model = DecoderLM(ModelConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, max_len=8))
    slots = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(slots) == 2 and all(m.sdpa is F.scaled_dot_product_attention for m in slots)
    with cpu_sdpa_in(model):
        assert all(m.sdpa is cpu_sdpa for m in slots)
    assert all(m.sdpa is F.scaled_dot_product_attention for m in slots)
    assert use_cpu_sdpa(model) is model and all(m.sdpa is cpu_sdpa for m in slots)


def test_a_bf16_model_on_the_cpu_kernel_equals_the_written_out_attention():
    model = DecoderLM(ModelConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, max_len=8,
                                  dropout=0.0)).eval()
    ids = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        ref = attention_maps(model, ids).logits  # every layer on the written-out path
        with cpu_sdpa_in(model.bfloat16()):
            fast, _ = model(ids)
    torch.testing.assert_close(fast.float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_the_core_imports_no_probe_and_no_cache():
    # attnlab.nn and attnlab.models know nothing of the machine: every speed choice is made
    # here and put in from outside (tests/test_layout.py checks the import graph too)
    import subprocess
    import sys

    code = ("import sys, attnlab.models, attnlab.nn; "
            "print(sorted(m for m in sys.modules if m.startswith('attnlab.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout
    assert "attnlab.speed" not in loaded and "attnlab.models" in loaded


# ---- dropout for CPUs -----------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_cpu_dropout_keeps_each_element_with_probability_1_minus_p_and_rescales(p):
    """The 16-bit masks drop p of the elements (within 5 standard deviations of the binomial),
    in every one of the four columns a 64-bit draw is cut into, and scale the rest by
    1 / (1 - p): the same law as F.dropout."""
    torch.manual_seed(1)
    n = 400_003  # not a multiple of 4: the last draw is cut short
    y = cpu_dropout(torch.ones(n), p)
    dropped = y == 0
    tol = 5 * math.sqrt(p * (1 - p) / n)
    assert abs(dropped.float().mean().item() - p) < tol
    for col in range(4):  # element i comes from bits 16*(i % 4) .. of its draw
        part = dropped[col: n - 3: 4].float()
        assert abs(part.mean().item() - p) < 5 * math.sqrt(p * (1 - p) / part.numel())
    scale = 1 / (1 - round(p * 32768) / 32768)  # of p as rounded to 1/32768: 0.1 -> 0.100006
    torch.testing.assert_close(y[~dropped], torch.full_like(y[~dropped], scale))
    ref = F.dropout(torch.ones(n), p, training=True)
    assert abs(y.mean().item() - ref.mean().item()) < 2 * tol / (1 - p)  # both keep the mean


def test_cpu_dropout_gradient_is_the_mask_and_a_seed_repeats_it():
    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)  # p = 0.25: k = 8192
    torch.manual_seed(3)
    y = cpu_dropout(x, 0.25)
    g = torch.randn_like(y)
    y.backward(g)
    keep = y != 0
    torch.testing.assert_close(x.grad, torch.where(keep, g / 0.75, 0.0))
    torch.testing.assert_close(y, torch.where(keep, x / 0.75, 0.0))
    torch.manual_seed(3)
    assert torch.equal(cpu_dropout(x, 0.25), y)  # same seed, same mask
    assert not torch.equal(cpu_dropout(x, 0.25), y)  # the generator moved on: another mask
    half = cpu_dropout(torch.ones(2, 8, dtype=torch.bfloat16), 0.5)
    assert half.dtype == torch.bfloat16 and half.shape == (2, 8)
    assert cpu_dropout(torch.ones(0, 4), 0.5).shape == (0, 4)
    assert torch.equal(cpu_dropout(torch.ones(9), 1.0), torch.zeros(9))  # as F.dropout(p=1)
    assert torch.equal(cpu_dropout(torch.ones(9), 1e-6), torch.ones(9))  # p rounds to 0


@pytest.mark.parametrize("family, head", [("decoder", "classify"), ("encoder_decoder", "classify"),
                                          ("encoder", "classify"), ("encoder", "mlm")])
def test_use_cpu_dropout_fills_every_drop_slot_and_the_model_then_runs_on_it(family, head):
    """Every module that drops (embeddings, residual connections, feed-forward, the classifier's
    pooled vector) holds the core's dropout until use_cpu_dropout puts the CPU one there;
    then a training forward draws its masks from it (a seed repeats them)."""
    cfg = ModelConfig(family=family, head=head, vocab_size=11, d_model=16, n_heads=2,
                      n_layers=1, max_len=8, dropout=0.3)
    model = build_model(cfg).train()
    slots = [m for m in model.modules() if hasattr(m, "drop")]
    assert len(slots) >= 3 and all(m.drop is dropout for m in slots)
    ids = torch.randint(1, 11, (2, 8))
    inputs = (ids, ids) if family == "encoder_decoder" else (ids,)
    assert use_cpu_dropout(model) is model and all(m.drop is cpu_dropout for m in slots)
    torch.manual_seed(4)
    first, _ = model(*inputs)
    torch.manual_seed(4)
    assert torch.equal(model(*inputs)[0], first)
    calls = []
    for m in slots:
        m.drop = lambda x, p: calls.append(p) or x
    model(*inputs)
    assert calls and set(calls) == {0.3}


# ---- the output projection fused with its loss -----------------------------------------------
def _projection_case(n=37, d=16, v=50, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True)
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 0.3).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::5] = -100  # left out
    return h, w, targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("rows", [None, 8, 1])  # one block; blocks with a remainder; row by row
def test_linear_cross_entropy_equals_torchs_loss_of_the_projection(smoothing, reduction, rows):
    h, w, targets = _projection_case(dtype=torch.float64)
    got = linear_cross_entropy(h, w, targets, label_smoothing=smoothing, reduction=reduction,
                               rows=rows)
    want = F.cross_entropy(h @ w.t(), targets, ignore_index=-100, label_smoothing=smoothing,
                           reduction=reduction)
    torch.testing.assert_close(got, want)
    grads = [torch.autograd.grad(loss * 1.7, (h, w)) for loss in (got, want)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(
        lambda h, w: linear_cross_entropy(h, w, targets, label_smoothing=smoothing, rows=rows),
        (h, w))


def test_linear_cross_entropy_without_gradients_and_with_one_input_needing_them():
    h, w, targets = _projection_case()
    want = F.cross_entropy(h @ w.t(), targets, ignore_index=-100, label_smoothing=0.1)
    with torch.no_grad(), torch.profiler.profile() as prof:
        torch.testing.assert_close(linear_cross_entropy(h, w, targets, label_smoothing=0.1), want)
    products = [e.name for e in prof.events() if e.name in ("aten::mm", "aten::addmm_")]
    assert products == ["aten::mm"]  # no gradients made: the logits' product only
    frozen = w.detach()  # a frozen projection: only h gets a gradient
    got = linear_cross_entropy(h, frozen, targets, label_smoothing=0.1, rows=4)
    (want_h,) = torch.autograd.grad(F.cross_entropy(h @ frozen.t(), targets, label_smoothing=0.1,
                                                    ignore_index=-100), h)
    torch.testing.assert_close(torch.autograd.grad(got, h)[0], want_h)
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'none'"):
        linear_cross_entropy(h, w, targets, reduction="none")


def test_linear_cross_entropy_under_bf16_autocast_as_the_autocast_projection():
    """Matrix products in bf16, the softmax in float32, gradients in the inputs' dtypes: as
    torch's autocast runs the unfused projection and ``F.cross_entropy`` of its upcast."""
    h, w, targets = _projection_case(n=300, d=64, v=1000)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(h, w, targets, label_smoothing=0.1, rows=64)
        want = F.cross_entropy((h @ w.t()).float(), targets, ignore_index=-100,
                               label_smoothing=0.1)
    grads = torch.autograd.grad(got, (h, w)), torch.autograd.grad(want, (h, w))
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    for a, b in zip(*grads):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-2)
