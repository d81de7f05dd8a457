"""Ablation and activation patching (attnlab.interpret.ablation, .patching): the grids equal
TransformerLens's on the same GPT-2 weights, the batched runs equal one forward per ablation,
every family works, and bad input is one clear error."""

from __future__ import annotations

import pytest
import torch

from _runs import scramble
from attnlab import ModelConfig
from attnlab.errors import UsageError
from attnlab.interpret.ablation import (
    Batch,
    ablate,
    batch_loss,
    lm_batch,
    row_loss,
    seq2seq_batch,
)
from attnlab.interpret.hooks import hooks, zero_heads
from attnlab.interpret.patching import patch
from attnlab.models import build_model

TOL = 1e-4


def model_of(seed: int = 0, **overrides):
    """A small scrambled model (weights large enough that every head matters)."""
    cfg = dict(family="decoder", vocab_size=40, d_model=32, n_heads=4, n_layers=3, max_len=64,
               dropout=0.0, norm="pre", pos="learned", tie_embeddings=False, pad_id=None)
    torch.manual_seed(seed)
    return scramble(build_model(ModelConfig(**(cfg | overrides))), seed=seed)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from _tl import gpt2_pair
    return gpt2_pair(tmp_path_factory.mktemp("gpt2"), n_layer=2, n_head=4, n_embd=64)


# ---- TransformerLens as the oracle ----------------------------------------------------------
def tl_set(h, value):
    """A TransformerLens hook setting head h of hook_z (B, T, H, Dh) to ``value``."""
    def fn(z, hook):
        z = z.clone()
        z[:, :, h] = value
        return z
    return fn


@pytest.mark.parametrize("kind", ["zero", "mean"])
@torch.no_grad()
def test_ablation_equals_transformerlens(gpt2, kind):
    model, bridge = gpt2
    ids = torch.randint(1, 50257, (2, 10), generator=torch.Generator().manual_seed(1))
    ours = ablate(model, lm_batch(ids), kind=kind)
    base = float(bridge(ids, return_type="loss"))  # TransformerLens's loss of ids (B, T + 1)
    assert ours.base_loss == pytest.approx(base, abs=TOL)
    _, cache = bridge.run_with_cache(ids[:, :-1])  # the means: inputs only
    heads = torch.zeros(2, 4)
    ffn = torch.zeros(2)
    for layer in range(2):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # (B, T, H, Dh)
        for h in range(4):
            value = 0.0 if kind == "zero" else z[:, :, h].mean((0, 1))
            loss = bridge.run_with_hooks(ids, return_type="loss", fwd_hooks=[
                (f"blocks.{layer}.attn.hook_z", tl_set(h, value))])
            heads[layer, h] = float(loss) - base
        mlp = cache[f"blocks.{layer}.hook_mlp_out"]
        value = 0.0 if kind == "zero" else mlp.mean((0, 1))
        loss = bridge.run_with_hooks(ids, return_type="loss", fwd_hooks=[
            (f"blocks.{layer}.hook_mlp_out", lambda x, hook, v=value: torch.zeros_like(x) + v)])
        ffn[layer] = float(loss) - base
    assert heads.abs().max() > 1e-2  # the heads matter: the comparison can fail
    torch.testing.assert_close(ours.heads, heads, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.ffn, ffn, atol=TOL, rtol=0)


@torch.no_grad()
def test_patching_equals_transformerlens(gpt2):
    tl_patching = pytest.importorskip("transformer_lens.patching")
    model, bridge = gpt2
    gen = torch.Generator().manual_seed(2)
    clean = torch.randint(1, 50257, (2, 8), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(1, 50257, (2,), generator=gen)
    answer, wrong = 11, 12
    ours = patch(model, clean, corrupted, answer=answer, wrong=wrong)

    def metric(logits):
        return (logits[:, -1, answer] - logits[:, -1, wrong]).mean()
    clean_logits, cache = bridge.run_with_cache(clean)
    assert ours.clean == pytest.approx(float(metric(clean_logits)), abs=TOL)
    assert ours.corrupted == pytest.approx(float(metric(bridge(corrupted))), abs=TOL)
    resid = tl_patching.get_act_patch_resid_pre(bridge, corrupted, cache, metric)
    heads = tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupted, cache, metric)
    assert (resid - ours.corrupted).abs().max() > 1e-2  # patches change the metric
    torch.testing.assert_close(ours.resid, resid.float(), atol=TOL, rtol=0)
    torch.testing.assert_close(ours.heads, heads.float(), atol=TOL, rtol=0)


# ---- batched == one forward per ablation ----------------------------------------------------
@pytest.mark.parametrize("pos", ["learned", "rope"])
@pytest.mark.parametrize("kind", ["zero", "mean"])
def test_batched_ablation_equals_one_forward_each(pos, kind):
    model = model_of(pos=pos)
    batch = lm_batch(torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(3)))
    batched = ablate(model, batch, kind=kind)  # every ablation in one forward
    one_each = ablate(model, batch, kind=kind, rows_per_forward=3)
    torch.testing.assert_close(batched.heads, one_each.heads, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched.ffn, one_each.ffn, atol=1e-5, rtol=0)
    if kind == "zero":  # and both equal the plain hooks API, one head at a time
        base = batch_loss(model, batch).mean()  # (no gradient)
        for layer in range(3):
            for h in range(4):
                with hooks(model, {f"blocks.{layer}.attn.z": zero_heads([h])}):
                    delta = batch_loss(model, batch).mean() - base
                assert float(delta) == pytest.approx(float(batched.heads[layer, h]), abs=1e-5)
    assert batched.heads.abs().max() > 1e-3


@torch.no_grad()
def test_batched_patching_equals_one_forward_each():
    model = model_of(seed=1)
    gen = torch.Generator().manual_seed(4)
    clean = torch.randint(0, 40, (2, 7), generator=gen)
    corrupted = torch.randint(0, 40, (2, 7), generator=gen)
    batched = patch(model, clean, corrupted, answer=3, wrong=[4, 5], position=4)
    one_each = patch(model, clean, corrupted, answer=3, wrong=[4, 5], position=4,
                     rows_per_forward=2)
    torch.testing.assert_close(batched.resid, one_each.resid, atol=1e-5, rtol=0)
    torch.testing.assert_close(batched.heads, one_each.heads, atol=1e-5, rtol=0)
    heads_only = patch(model, clean, corrupted, answer=3, wrong=[4, 5], position=4,
                       grids=["heads"])
    assert heads_only.resid.isnan().all()
    torch.testing.assert_close(heads_only.heads, batched.heads, atol=1e-5, rtol=0)
    # by hand: head 1.2's z from the clean run, in the corrupted run
    with hooks(model, cache="blocks.1.attn.z") as cache:
        model(clean)
    z = cache["blocks.1.attn.z"]

    def put(x, name):
        x = x.clone()
        x[:, 2] = z[:, 2]
        return x
    with hooks(model, {"blocks.1.attn.z": put}):
        logits = model(corrupted)[0][:, 4]
    want = (logits[:, 3] - logits[[0, 1], [4, 5]]).mean()
    assert float(want) == pytest.approx(float(batched.heads[1, 2]), abs=1e-5)
    assert batched.heads.isfinite().all() and batched.resid.isfinite().all()


def test_resid_patch_at_layer_0_of_every_position_restores_clean():
    model = model_of(seed=2)
    gen = torch.Generator().manual_seed(5)
    clean = torch.randint(0, 40, (1, 6), generator=gen)
    corrupted = clean.clone()
    corrupted[0, 5] = (clean[0, 5] + 1) % 40  # only the last token differs
    result = patch(model, clean, corrupted, answer=1, wrong=2)
    assert float(result.resid[0, 5]) == pytest.approx(result.clean, abs=1e-5)
    torch.testing.assert_close(result.resid[:, :5], torch.full((3, 5), result.corrupted),
                               atol=1e-5, rtol=0)
    assert result.normalized(result.resid)[0, 5] == pytest.approx(1.0, abs=1e-4)


# ---- every family ---------------------------------------------------------------------------
def test_families_shapes_and_batched_equals_one_each():
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(1, 40, (2, 9), generator=gen)
    cases = {
        "classifier": (model_of(family="encoder", n_classes=3, ffn="gelu"),
                       Batch((ids,), torch.tensor([0, 2])), {"encoder": (3, 4)}),
        "mlm": (model_of(family="encoder", head="mlm"),
                Batch((ids,), torch.where(ids % 3 == 0, ids, -100)), {"encoder": (3, 4)}),
        "seq2seq": (model_of(family="encoder_decoder", n_decoder_layers=2),
                    seq2seq_batch(ids, torch.randint(1, 40, (2, 6), generator=gen)),
                    {"encoder": (3, 4), "decoder": (2, 4), "cross": (2, 4)}),
        "attention-only": (model_of(ffn="none"), lm_batch(ids), {"decoder": (3, 4)}),
    }
    for name, (model, batch, grids) in cases.items():
        result = ablate(model, batch, kind="mean")
        assert {k: tuple(v.shape) for k, v in result.grids.items()} == grids, name
        ffn_len = {k: (0 if k == "cross" or name == "attention-only" else v[0])
                   for k, v in grids.items()}
        assert {k: len(v) for k, v in result.ffns.items()} == ffn_len, name
        assert all(g.isfinite().all() for g in result.grids.values()), name
        one_each = ablate(model, batch, kind="mean", rows_per_forward=batch.rows)
        for k in grids:
            torch.testing.assert_close(result.grids[k], one_each.grids[k], atol=1e-5, rtol=0)
            torch.testing.assert_close(result.ffns[k], one_each.ffns[k], atol=1e-5, rtol=0)
    assert result.ffn.shape == (0,)  # the attention-only model, last
    corrupted = ids.flip(1)
    for name in ("classifier", "mlm"):  # patching an encoder: its one stack
        model = cases[name][0]
        patched = patch(model, ids, corrupted, answer=1, wrong=2, position=3)
        assert patched.resid.shape == (3, 9) and patched.heads.shape == (3, 4), name
        one_each = patch(model, ids, corrupted, answer=1, wrong=2, position=3,
                         rows_per_forward=2)
        torch.testing.assert_close(patched.heads, one_each.heads, atol=1e-5, rtol=0)
        torch.testing.assert_close(patched.resid, one_each.resid, atol=1e-5, rtol=0)
        assert patched.clean != patched.corrupted, name
    with pytest.raises(UsageError, match="answer 3 is not in the vocabulary: token ids are 0..2"):
        patch(cases["classifier"][0], ids, corrupted, answer=3, wrong=2)


def test_subset_of_layers_and_heads_and_one_stack():
    model = model_of(family="encoder_decoder", n_decoder_layers=2)
    gen = torch.Generator().manual_seed(7)
    batch = seq2seq_batch(torch.randint(1, 40, (2, 5), generator=gen),
                          torch.randint(1, 40, (2, 6), generator=gen))
    full = ablate(model, batch)
    part = ablate(model, batch, stack="cross", layers=[1], heads=[0, 3])
    assert set(part.grids) == {"cross"} and part.main == "cross"
    assert part.heads[0].isnan().all() and part.heads[1, [1, 2]].isnan().all()
    torch.testing.assert_close(part.heads[1, [0, 3]], full.grids["cross"][1, [0, 3]],
                               atol=1e-5, rtol=0)
    top = full.top(2)
    assert len(top) == 2 and top[0][2] >= top[1][2]


@pytest.mark.parametrize("tgt", [False, True])
def test_patching_a_subset_of_layers_and_heads(tgt):
    """Only the layers and heads asked for are patched, each as in the full run; the residual
    stream (no head axis) is skipped once heads are chosen, as ablate skips feed-forwards."""
    model = model_of(family="encoder_decoder", n_decoder_layers=3) if tgt else model_of()
    gen = torch.Generator().manual_seed(10)
    clean, corrupted = (torch.randint(1, 40, (2, 5), generator=gen) for _ in range(2))
    shared = {"tgt": torch.randint(1, 40, (2, 4), generator=gen)} if tgt else {}
    full = patch(model, clean, corrupted, answer=5, wrong=6, **shared)
    part = patch(model, clean, corrupted, answer=5, wrong=6, layers=[2], **shared)
    assert part.resid[:2].isnan().all()
    torch.testing.assert_close(part.resid[2], full.resid[2], atol=1e-5, rtol=0)
    heads = patch(model, clean, corrupted, answer=5, wrong=6, layers=[0, 2], heads=[1],
                  **shared)
    assert heads.resid.isnan().all()
    for stack, grid in full.grids.items():
        assert part.grids[stack][:2].isnan().all(), stack
        torch.testing.assert_close(part.grids[stack][2], grid[2], atol=1e-5, rtol=0)
        want = torch.full_like(grid, float("nan"))
        want[[0, 2], 1] = grid[[0, 2], 1]
        torch.testing.assert_close(heads.grids[stack], want, atol=1e-5, rtol=0, equal_nan=True)
    with pytest.raises(UsageError, match="head 4 is out of range"):
        patch(model, clean, corrupted, answer=5, wrong=6, heads=[4], **shared)


def test_patching_encoder_decoder():
    model = model_of(family="encoder_decoder", n_decoder_layers=2)
    gen = torch.Generator().manual_seed(8)
    src = torch.randint(1, 40, (2, 5), generator=gen)
    clean = torch.randint(1, 40, (2, 4), generator=gen)
    corrupted = torch.randint(1, 40, (2, 4), generator=gen)
    result = patch(model, clean, corrupted, answer=5, wrong=6, src=src)
    assert result.resid.shape == (2, 4) and result.heads.shape == (2, 4)
    assert result.grids["cross"].shape == (2, 4)
    one_each = patch(model, clean, corrupted, answer=5, wrong=6, src=src, rows_per_forward=2)
    torch.testing.assert_close(result.grids["cross"], one_each.grids["cross"], atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(result.resid, one_each.resid, atol=1e-5, rtol=0)
    assert result.resid[0, 0] != result.corrupted  # a patch of the first token changes it


def test_patching_a_corrupted_source():
    """tgt= shared: clean and corrupted are sources. Only source token 2 differs, so patching
    the encoder's residual stream there at layer 0 restores the clean metric, and any other
    position leaves the corrupted one; a cross head's patch equals the written-out one."""
    model = model_of(family="encoder_decoder", n_decoder_layers=2)
    gen = torch.Generator().manual_seed(9)
    clean = torch.randint(1, 40, (2, 5), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 7) % 39 + 1
    tgt = torch.randint(1, 40, (2, 4), generator=gen)
    result = patch(model, clean, corrupted, tgt=tgt, answer=5, wrong=6, position=2)
    assert result.resid.shape == (3, 5)  # the encoder's layers x source positions
    assert set(result.grids) == {"encoder", "decoder", "cross"} and result.main == "cross"
    assert result.clean != pytest.approx(result.corrupted, abs=1e-3)
    assert float(result.resid[0, 2]) == pytest.approx(result.clean, abs=1e-5)
    torch.testing.assert_close(result.resid[0, [0, 1, 3, 4]],
                               torch.full((4,), result.corrupted), atol=1e-5, rtol=0)
    with torch.no_grad(), hooks(model, cache="decoder.blocks.1.cross.z") as cache:
        model(clean, tgt)
    z = cache["decoder.blocks.1.cross.z"]

    def put(x, name):
        x = x.clone()
        x[:, 3] = z[:, 3]
        return x
    with torch.no_grad(), hooks(model, {"decoder.blocks.1.cross.z": put}):
        logits = model(corrupted, tgt)[0][:, 2]
    want = (logits[:, 5] - logits[:, 6]).mean()
    assert float(want) == pytest.approx(float(result.heads[1, 3]), abs=1e-5)
    one_each = patch(model, clean, corrupted, tgt=tgt, answer=5, wrong=6, position=2,
                     rows_per_forward=2)
    for stack in result.grids:
        torch.testing.assert_close(result.grids[stack], one_each.grids[stack], atol=1e-5,
                                   rtol=0)


def test_row_loss_ignores_padding_and_minus_100():
    logits = torch.randn(2, 4, 7)
    targets = torch.tensor([[1, 2, 0, 0], [3, -100, 4, 5]])
    rows = row_loss(logits, targets, pad_id=0)
    first = torch.nn.functional.cross_entropy(logits[0, :2], targets[0, :2])
    second = torch.nn.functional.cross_entropy(logits[1, [0, 2, 3]], targets[1, [0, 2, 3]])
    torch.testing.assert_close(rows, torch.stack([first, second]))


# ---- bad input ------------------------------------------------------------------------------
def test_bad_input_is_one_clear_error():
    model = model_of()
    ids = torch.randint(0, 40, (2, 6))
    batch = lm_batch(ids)
    cases = [
        (lambda: patch(model, ids, ids[:, :5], answer=1, wrong=2), "clean has 6 tokens, corr"),
        (lambda: patch(model, ids, ids, answer=40, wrong=2), "answer 40 is not in the vocab"),
        (lambda: patch(model, ids, ids, answer=1, wrong=-1), "wrong -1 is not in the vocab"),
        (lambda: patch(model, ids, ids, answer=1, wrong=2, position=6), "position 6 is out"),
        (lambda: patch(model, ids, ids, answer=1, wrong=2, src=ids), "src= and tgt= are for"),
        (lambda: patch(model, ids, ids, answer=1, wrong=2, grids=["mlp"]), "grids must be a"),
        (lambda: ablate(model, batch, layers=[3]), "layer 3 is out of range"),
        (lambda: ablate(model, batch, heads=[-1]), "head -1 is out of range"),
        (lambda: ablate(model, batch, kind="resample"), "kind must be one of zero, mean"),
        (lambda: ablate(model, batch, stack="cross"), "stack 'cross' is not in this DecoderLM"),
        (lambda: Batch((ids,), ids[:1]), "the same rows"),
        (lambda: lm_batch(ids[:, :1]), "at least 2 tokens"),
    ]
    for call, message in cases:
        with pytest.raises(UsageError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    seq2seq = model_of(family="encoder_decoder")
    for shared in ({}, {"src": ids, "tgt": ids}):  # one of the two, never none or both
        with pytest.raises(UsageError, match="needs one of src="):
            patch(seq2seq, ids, ids, answer=1, wrong=2, **shared)
    with pytest.raises(UsageError, match="position 6 is out of range"):  # a target position
        patch(seq2seq, ids, ids, answer=1, wrong=2, tgt=ids, position=6)
