"""Attention rollout (attnlab.interpret.rollout) and head scores (attnlab.interpret.heads).

Rollout is checked against its formula written out step by step here, on all three families,
with padding; head scores on models whose attention patterns are forced (a hook edit of
``attn.pattern``) to known shapes: previous-token, induction, duplicate-token, first-token
and uniform heads.
"""

from __future__ import annotations

import pytest
import torch

from _runs import scramble
from attnlab import ModelConfig
from attnlab.errors import UsageError
from attnlab.interpret import HeadScores, attention_maps, attention_rollout, head_scores
from attnlab.models import build_model

TOL = 1e-5


def model_of(family: str, seed: int = 0, **overrides):
    """A small scrambled model of ``family`` (pad id 0)."""
    cfg = dict(family=family, vocab_size=20, d_model=32, n_heads=4, n_layers=2, max_len=32,
               dropout=0.0, norm="pre", pos="learned", pad_id=0)
    torch.manual_seed(seed)
    return scramble(build_model(ModelConfig(**(cfg | overrides))), seed=seed, std=0.4)


def ids_of(b: int, t: int, seed: int, vocab: int = 20) -> torch.Tensor:
    return torch.randint(1, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ---- rollout: the formula written out -------------------------------------------------------
def mix(a: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """0.5 A + 0.5 I with padded rows and columns zeroed, rows renormalised, by loops."""
    b, t, _ = a.shape
    m = 0.5 * a + 0.5 * torch.eye(t)
    out = torch.zeros_like(m)
    for r in range(b):
        for i in range(t):
            row = m[r, i].clone()
            if valid is not None:
                row = row * valid[r].float()
                if not valid[r, i]:
                    row = torch.zeros_like(row)
            out[r, i] = row / row.sum() if row.sum() > 0 else row
    return out


def fused(maps, stack: str) -> list[torch.Tensor]:
    """Per layer, the mean over heads: (B, T, S)."""
    return [maps[stack][i].mean(dim=1) for i in sorted(maps[stack])]


@pytest.mark.parametrize("padded", [False, True])
def test_rollout_decoder_is_the_product_of_the_layers(padded):
    model = model_of("decoder", n_layers=3)
    ids = ids_of(2, 7, seed=1)
    kwargs = {}
    if padded:  # row 1 left-padded by 2
        ids[1, :2] = 0
        kwargs["mask"] = ids != 0
    with torch.no_grad():
        maps = attention_maps(model, ids, **kwargs)
    a0, a1, a2 = fused(maps, "decoder")
    valid = kwargs.get("mask")
    expected = mix(a2, valid) @ (mix(a1, valid) @ mix(a0, valid))
    got = attention_rollout(model, ids, **kwargs)
    assert set(got) == {"decoder"}
    torch.testing.assert_close(got["decoder"], expected, atol=TOL, rtol=0)
    assert torch.allclose(got["decoder"].sum(-1)[0], torch.ones(7), atol=TOL)
    assert torch.all(got["decoder"].triu(1) == 0)  # causal: no future token
    if padded:
        assert torch.all(got["decoder"][1, :, :2] == 0)  # padding gets nothing
        assert torch.all(got["decoder"][1, :2] == 0)
        assert torch.allclose(got["decoder"][1, 2:].sum(-1), torch.ones(5), atol=TOL)


def test_rollout_encoder_pads_get_zero_and_head_fusion_max():
    model = model_of("encoder", head="mlm")
    ids = ids_of(2, 6, seed=2)
    ids[0, 4:] = 0  # right padding: ids == pad_id are masked by default
    with torch.no_grad():
        maps = attention_maps(model, ids)
    valid = ids != 0
    a = [w.amax(dim=1) for _, w in sorted(maps["encoder"].items())]
    m0, m1 = mix(a[0], valid), mix(a[1], valid)
    got = attention_rollout(model, ids, head_fusion="max")["encoder"]  # (B, S, S)
    torch.testing.assert_close(got, m1 @ m0, atol=TOL, rtol=0)
    assert torch.all(got[0, :, 4:] == 0) and torch.all(got[0, 4:] == 0)
    assert torch.allclose(got[0, :4].sum(-1), torch.ones(4), atol=TOL)
    assert torch.allclose(got[1].sum(-1), torch.ones(6), atol=TOL)
    mean = attention_rollout(model, ids)["encoder"]
    assert not torch.allclose(mean, got, atol=1e-3)  # the fusion is used


def test_rollout_encoder_decoder_cross_by_the_written_rule():
    model = model_of("encoder_decoder", n_layers=2, n_decoder_layers=3)
    src, tgt = ids_of(2, 5, seed=3), ids_of(2, 4, seed=4)
    src[1, 3:] = 0  # source padding (src != pad_id by default)
    with torch.no_grad():
        maps = attention_maps(model, src, tgt)
    sv = src != 0
    enc = fused(maps, "encoder")
    r_enc = mix(enc[1], sv) @ mix(enc[0], sv)  # (B, S, S)
    d_t, d_s = torch.eye(4).expand(2, 4, 4), torch.zeros(2, 4, 5)
    for a, c in zip(fused(maps, "decoder"), fused(maps, "cross"), strict=True):
        m = mix(a, None)
        d_t, d_s = m @ d_t, m @ d_s  # self-attention mixes the target positions' states
        c = c * sv[:, None, :]
        c = c / c.sum(-1, keepdim=True)
        d_t, d_s = 0.5 * d_t, 0.5 * d_s + 0.5 * c @ r_enc  # + the memory it reads, 0.5 / 0.5
    got = attention_rollout(model, src, tgt)
    assert set(got) == {"encoder", "decoder", "cross"}
    torch.testing.assert_close(got["encoder"], r_enc, atol=TOL, rtol=0)
    dec = fused(maps, "decoder")
    torch.testing.assert_close(got["decoder"], mix(dec[2], None) @ mix(dec[1], None)
                               @ mix(dec[0], None), atol=TOL, rtol=0)
    torch.testing.assert_close(got["cross"], d_s, atol=TOL, rtol=0)
    assert got["cross"].shape == (2, 4, 5)
    assert torch.all(got["cross"][1, :, 3:] == 0)  # padded source tokens get nothing
    # every final state is target share + source share = 1; three cross layers: 1 - 0.5^3
    torch.testing.assert_close(d_t.sum(-1) + got["cross"].sum(-1), torch.ones(2, 4))
    torch.testing.assert_close(got["cross"].sum(-1), torch.full((2, 4), 1 - 0.5 ** 3))


def test_rollout_bad_input():
    model = model_of("decoder")
    with pytest.raises(UsageError, match="head_fusion='median'.*'mean', 'max', 'min'"):
        attention_rollout(model, ids_of(1, 4, 0), head_fusion="median")
    with pytest.raises(UsageError, match="needs the model's inputs"):
        attention_rollout(model)


# ---- head scores on forced patterns ---------------------------------------------------------
def forced(kind: str, t: int, n: int) -> torch.Tensor:
    """A (T, T) causal pattern of a known head on ``r r`` sequences of two halves of n."""
    w = torch.zeros(t, t)
    for i in range(t):
        if kind == "uniform":
            w[i, :i + 1] = 1.0 / (i + 1)
        elif kind == "previous":
            w[i, max(i - 1, 0)] = 1.0
        elif kind == "first":
            w[i, 0] = 1.0
        elif kind in ("induction", "duplicate") and i >= n:
            w[i, i - n + (1 if kind == "induction" else 0)] = 1.0
        else:
            w[i, i] = 1.0  # the first half: to itself
    return w


def force(heads: list[str], n: int):
    """An ``attn.pattern`` edit: head h's pattern replaced by ``forced(heads[h])``."""
    def edit(x, name):
        out = x.clone()
        for h, kind in enumerate(heads):
            out[:, h] = forced(kind, x.size(-1), n)
        return out
    return edit


def test_head_scores_find_the_forced_heads():
    model = model_of("decoder", max_len=64)
    edits = {"blocks.0.attn.pattern": force(["previous", "uniform", "first", "duplicate"], 20),
             "blocks.1.attn.pattern": force(["uniform", "induction", "previous", "uniform"], 20)}
    scores = head_scores(model, seq_len=40, n_seqs=4, edits=edits)
    assert isinstance(scores, HeadScores) and scores.n == 20
    grids = scores["decoder"]
    assert set(grids) == {"previous_token", "induction", "duplicate_token", "first_token"}
    assert all(g.shape == (2, 4) for g in grids.values())
    assert grids["previous_token"][0, 0] == pytest.approx(1.0)
    assert grids["previous_token"][1, 2] == pytest.approx(1.0)
    assert grids["induction"][1, 1] == pytest.approx(1.0)
    assert grids["duplicate_token"][0, 3] == pytest.approx(1.0)
    assert grids["first_token"][0, 2] == pytest.approx(1.0)
    assert scores.best("induction") == (1, 1, pytest.approx(1.0))
    assert scores.best("previous_token")[2] == pytest.approx(1.0)
    # a uniform head scores about 1/position on each: near 0
    for score in ("previous_token", "induction", "duplicate_token"):
        assert grids[score][0, 1] < 0.1 and grids[score][1, 0] < 0.1
    assert grids["induction"][0, 0] == 0.0  # a previous-token head is no induction head
    assert "decoder induction (layer x head)" in str(scores)


def test_head_scores_with_bos_shift_the_positions():
    model = model_of("decoder", max_len=64)

    def edit(x, name):  # induction shifted by the bos at position 0
        out = x.clone()
        out[:, 0] = 0
        out[:, 0, 0, 0] = 1
        out[:, 0, 1:, 1:] = forced("induction", x.size(-1) - 1, 10)
        return out
    scores = head_scores(model, seq_len=21, n_seqs=2, bos=19, vocab=(1, 19),
                         edits={"blocks.1.attn.pattern": edit})
    assert scores["decoder"]["induction"][1, 0] == pytest.approx(1.0)
    assert scores["decoder"]["induction"][0].max() < 0.9


def test_head_scores_draw_only_from_vocab_never_pad():
    model = model_of("decoder", max_len=64)
    seen = []
    handle = model.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        head_scores(model, seq_len=31, n_seqs=8, vocab=[0, 5, 6])
        head_scores(model, seq_len=31, n_seqs=8, bos=7, vocab=range(0, 8))
    finally:
        handle.remove()
    ids, with_bos = seen
    assert ids.shape == (8, 30)  # an odd remainder is dropped
    assert set(ids.unique().tolist()) == {5, 6}  # pad (0) is never drawn
    torch.testing.assert_close(ids[:, :15], ids[:, 15:])  # the same tokens twice
    assert with_bos.shape == (8, 31) and torch.all(with_bos[:, 0] == 7)
    assert set(with_bos[:, 1:].unique().tolist()) <= set(range(1, 7))


def test_head_scores_encoder_and_encoder_decoder():
    enc = head_scores(model_of("encoder", head="mlm"), seq_len=16, n_seqs=3)
    assert set(enc.scores) == {"encoder"} and enc["encoder"]["induction"].shape == (2, 4)
    model = model_of("encoder_decoder", n_layers=1, n_decoder_layers=3)
    scores = head_scores(model, seq_len=12, n_seqs=3,
                         edits={"decoder.blocks.2.cross.pattern": force(["first"] * 4, 6)})
    assert set(scores.scores) == {"encoder", "decoder", "cross"}
    assert scores["encoder"]["previous_token"].shape == (1, 4)
    assert scores["decoder"]["induction"].shape == (3, 4)
    assert set(scores["cross"]) == {"first_token"}
    assert torch.allclose(scores["cross"]["first_token"][2], torch.ones(4))
    assert scores["cross"]["first_token"][0].max() < 0.9
    same = head_scores(model, seq_len=12, n_seqs=3, src="same")
    assert not torch.equal(same["encoder"]["first_token"], scores["encoder"]["first_token"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(seq_len=65), "seq_len=65 does not fit the model: give an integer up to its max_len=64"),
    (dict(seq_len=3), "seq_len=3 is too short"),
    (dict(n_seqs=0), "n_seqs=0 must be a positive integer"),
    (dict(vocab=(0, 99)), "vocab id 20 is outside the vocabulary: ids are 0..19"),
    (dict(vocab=[0, 3]), "vocab leaves 1 token ids"),
    (dict(bos=20), "bos=20 is outside the vocabulary"),
    (dict(src="same"), "src='same' is for the encoder-decoder only"),
    (dict(src="other"), "src='other' is not known"),
])
def test_head_scores_bad_input(kwargs, match):
    with pytest.raises(UsageError, match=match):
        head_scores(model_of("decoder", max_len=64), **kwargs)


def test_head_scores_best_names_what_there_is():
    scores = head_scores(model_of("decoder", max_len=64), seq_len=10, n_seqs=2)
    with pytest.raises(UsageError, match="no score 'copying' for stack 'decoder'"):
        scores.best("copying")
    with pytest.raises(UsageError, match="no stack 'cross'"):
        scores["cross"]
