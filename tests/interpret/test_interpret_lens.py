"""The hook API, the logit lens and direct logit attribution (attnlab.interpret).

TransformerLens is the oracle: the same random GPT-2 weights, imported by attnlab and booted by
TransformerLens's bridge, give the same activations, lens logits and attributions (fp32, 1e-4).
The other families (encoder, encoder-decoder, post-norm, RMSNorm, attention-only) are checked
against the model's own outputs: the lens's last row is the model's logits, the attribution
sums to the model's logit.
"""

from __future__ import annotations

import pytest
import torch

from _runs import scramble
from _tl import as_attnlab, gpt2_pair, tl_name
from attnlab import DecoderLM, ModelConfig
from attnlab.errors import UsageError
from attnlab.interpret import (
    direct_logit_attribution,
    hooks,
    logit_lens,
    run_with_cache,
    select,
    sites_of,
    zero_heads,
)
from attnlab.models import EncoderClassifier, MaskedLM, Transformer
from attnlab.nn import MultiHeadAttention

ATOL = 1e-4
V = 50257


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(attnlab's GPT-2, TransformerLens's bridge of the same weights, token ids (2, 9))."""
    model, bridge = gpt2_pair(tmp_path_factory.mktemp("gpt2-lens"))
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    return model, bridge, ids


@pytest.fixture(scope="module")
def tl_cache(pair):
    """TransformerLens's logits and activation cache of ``ids``."""
    _, bridge, ids = pair
    with torch.no_grad():
        return bridge.run_with_cache(ids)


def tiny(kind: str = "decoder", seed: int = 0, **overrides) -> torch.nn.Module:
    """A small model of ``kind`` with every parameter redrawn (biases and norms too)."""
    base = dict(vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_len=16, dropout=0.0,
                norm="pre", pos="learned", tie_embeddings=False)
    model = {"decoder": (DecoderLM, {"family": "decoder"}),
             "mlm": (MaskedLM, {"family": "encoder", "head": "mlm"}),
             "classifier": (EncoderClassifier, {"family": "encoder", "n_classes": 3}),
             "seq2seq": (Transformer, {"family": "encoder_decoder"})}[kind]
    cls, family = model
    return scramble(cls(ModelConfig(**(base | family | overrides))), seed, std=0.3)


def some_ids(b: int = 2, t: int = 7, seed: int = 0) -> torch.Tensor:
    """(b, t) ids of tiny()'s vocabulary, never the pad id 0."""
    return torch.randint(1, 50, (b, t), generator=torch.Generator().manual_seed(seed))


def inputs_of(model, ids):
    """The forward's positional inputs: (src, tgt) for the encoder-decoder."""
    return (some_ids(ids.size(0), 5, seed=9), ids) if isinstance(model, Transformer) else (ids,)


# ---- (a) the hook sites against TransformerLens -----------------------------------------------
def test_every_cached_site_equals_transformer_lens(pair, tl_cache) -> None:
    model, _, ids = pair
    tl_logits, theirs = tl_cache
    (logits, _), ours = run_with_cache(model, ids)
    torch.testing.assert_close(logits, tl_logits, atol=ATOL, rtol=0)
    kinds = set()
    for name, x in ours.items():
        want = as_attnlab(name, theirs[tl_name(name)])
        if name == "pos_embed":  # attnlab's is (T, D), shared by the batch; TL's (B, T, D)
            x = x.expand_as(want)
        torch.testing.assert_close(x, want, atol=ATOL, rtol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")
        kinds.add(name.split(".", 2)[-1] if name.startswith("blocks.") else name)
    assert kinds == {"embed", "pos_embed", "resid_pre", "attn.q", "attn.k", "attn.v",
                     "attn.pattern", "attn.z", "attn_out", "resid_mid", "ffn_out", "resid_post",
                     "final_norm"}
    assert ours["blocks.1.attn.z"].shape == (2, 4, 9, 16)  # (B, H, T, Dh)


def test_tl_name_maps_site_names() -> None:
    assert tl_name("blocks.1.attn.pattern") == "blocks.1.attn.hook_pattern"
    assert tl_name("blocks.0.resid_pre") == "blocks.0.hook_resid_pre"
    assert tl_name("blocks.0.attn.z") == "blocks.0.attn.hook_z"
    assert tl_name("blocks.0.ffn_out") == "blocks.0.hook_mlp_out"
    assert tl_name("final_norm") == "ln_final.hook_out"
    with pytest.raises(KeyError):
        tl_name("blocks.0.cross.z")


# ---- (b) the logit lens -----------------------------------------------------------------------
def test_logit_lens_equals_transformer_lens_accumulated_resid(pair, tl_cache) -> None:
    model, bridge, ids = pair
    _, theirs = tl_cache
    lens = logit_lens(model, ids, k=3)
    with torch.no_grad():
        resid, labels = theirs.accumulated_resid(apply_ln=True, return_labels=True)
        want = resid @ bridge.W_U + bridge.b_U  # (R, B, T, V)
    assert labels == ["0_pre", "1_pre", "final_post"]
    assert lens.layers == ["blocks.0.resid_pre", "blocks.0.resid_post", "blocks.1.resid_post"]
    torch.testing.assert_close(lens.logits, want, atol=ATOL, rtol=0)


def test_logit_lens_fields_agree_with_its_logits_and_the_model(pair) -> None:
    model, _, ids = pair
    lens = logit_lens(model, ids, k=4)
    r, (b, t) = 3, ids.shape
    assert lens.top_ids.shape == lens.top_probs.shape == (r, b, t, 4)
    assert lens.target_prob.shape == lens.target_rank.shape == (r, b, t)
    probs = lens.logits.softmax(-1)
    assert torch.equal(lens.top_ids[..., 0], lens.logits.argmax(-1))
    torch.testing.assert_close(lens.top_probs, probs.gather(-1, lens.top_ids))
    # default targets: the next token; the last position has none
    assert torch.equal(lens.targets[:, :-1], ids[:, 1:]) and (lens.targets[:, -1] == -100).all()
    assert lens.target_prob[:, :, -1].isnan().all() and (lens.target_rank[:, :, -1] == -1).all()
    index = ids[None, :, 1:, None].expand(r, -1, -1, 1)  # (R, B, T-1, 1): the next tokens
    torch.testing.assert_close(lens.target_prob[:, :, :-1],
                               probs[:, :, :-1].gather(-1, index).squeeze(-1))
    target_logit = lens.logits[:, :, :-1].gather(-1, index)
    assert torch.equal(lens.target_rank[:, :, :-1],
                       (lens.logits[:, :, :-1] > target_logit).sum(-1))
    with torch.no_grad():  # the last row is the model itself
        logits, loss = model(ids, lens.targets)
    torch.testing.assert_close(lens.logits[-1], model(ids)[0].detach(), atol=ATOL, rtol=0)
    torch.testing.assert_close(lens.loss[-1], loss, atol=ATOL, rtol=0)
    assert lens.loss.shape == (r,)


def test_logit_lens_without_targets_and_with_given_ones(pair) -> None:
    model, _, ids = pair
    lens = logit_lens(model, ids, targets=False, k=1)
    assert lens.targets is None and lens.target_prob is None and lens.loss is None
    same = torch.full_like(ids, -100)
    same[0, 2] = 7
    lens = logit_lens(model, ids, targets=same)
    assert (~lens.target_prob.isnan()).sum() == 3  # one counted target per row
    torch.testing.assert_close(lens.loss, -lens.logits[:, 0, 2].log_softmax(-1)[:, 7])


@pytest.mark.parametrize("kind, overrides", [
    ("decoder", {}), ("decoder", {"norm": "post"}), ("decoder", {"norm_type": "rmsnorm"}),
    ("mlm", {}), ("mlm", {"norm": "post", "embed_norm": True}), ("seq2seq", {})])
def test_logit_lens_last_row_is_the_model_on_every_family(kind, overrides) -> None:
    model = tiny(kind, **overrides)
    ids = some_ids()
    src = inputs_of(model, ids)[0] if kind == "seq2seq" else None
    lens = logit_lens(model, ids, src=src)
    prefix = "decoder." if kind == "seq2seq" else ""
    assert lens.layers == [f"{prefix}blocks.0.resid_pre", f"{prefix}blocks.0.resid_post",
                           f"{prefix}blocks.1.resid_post"]
    with torch.no_grad():
        want = model(*inputs_of(model, ids))[0]
    torch.testing.assert_close(lens.logits[-1], want, atol=ATOL, rtol=0)
    assert lens.logits.shape == (3, 2, 7, 50)
    if kind == "mlm":  # the default target is the token itself
        assert torch.equal(lens.targets, ids)


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_logit_lens_of_chosen_layers_reads_only_their_outputs(kind) -> None:
    model, ids = tiny(kind, n_layers=3), some_ids()
    src = inputs_of(model, ids)[0] if kind == "seq2seq" else None
    full = logit_lens(model, ids, src=src, k=2)
    part = logit_lens(model, ids, src=src, k=2, layers=[2, 0])
    prefix = "decoder." if kind == "seq2seq" else ""
    assert part.layers == [f"{prefix}blocks.0.resid_post", f"{prefix}blocks.2.resid_post"]
    for name in ("logits", "top_ids", "top_probs", "target_prob", "target_rank", "loss"):
        torch.testing.assert_close(getattr(part, name), getattr(full, name)[[1, 3]],
                                   atol=ATOL, rtol=0, equal_nan=True)
    with pytest.raises(UsageError, match="layer 3 is out of range .*: there are 3 layers"):
        logit_lens(model, ids, src=src, layers=[3])


def test_logit_lens_leaves_the_model_as_it_was() -> None:
    model = tiny().train()
    logit_lens(model, some_ids())
    assert model.training and not any(m.hooks for m in model.modules() if hasattr(m, "hooks"))


# ---- (c) direct logit attribution -------------------------------------------------------------
def test_direct_logit_attribution_equals_transformer_lens(pair, tl_cache) -> None:
    model, bridge, ids = pair
    tl_logits, theirs = tl_cache
    token, other, pos = 11, 4242, 5
    attr = direct_logit_attribution(model, ids, token=token, other=other, position=pos)
    with torch.no_grad():
        direction = (bridge.W_U[:, token] - bridge.W_U[:, other]) * model.decoder.norm.weight
        heads = theirs.stack_head_results(apply_ln=True)[:, :, pos] @ direction  # (L*H, B)
        parts, labels = theirs.decompose_resid(apply_ln=True, return_labels=True)
        parts = parts[:, :, pos] @ direction  # (components, B)
    torch.testing.assert_close(attr.heads, heads.view(2, 4, 2), atol=ATOL, rtol=0)
    mlp = [i for i, label in enumerate(labels) if label.endswith("mlp_out")]
    torch.testing.assert_close(attr.ffn, parts[mlp], atol=ATOL, rtol=0)
    embed = [labels.index("embed"), labels.index("pos_embed")]
    torch.testing.assert_close(attr.embed, parts[embed].sum(0), atol=ATOL, rtol=0)
    assert attr.cross_heads is None and attr.position == pos
    with torch.no_grad():
        want = model(ids)[0][:, pos]
    torch.testing.assert_close(attr.logit, want[:, token] - want[:, other], atol=ATOL, rtol=0)
    torch.testing.assert_close(attr.logit, tl_logits[:, pos, token] - tl_logits[:, pos, other],
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(attr.total(), attr.logit, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind, overrides", [
    ("decoder", {}), ("decoder", {"norm_type": "rmsnorm"}), ("decoder", {"ffn": "none"}),
    ("decoder", {"bias": False, "pos": "rope"}), ("mlm", {}), ("seq2seq", {})])
@pytest.mark.parametrize("other", [None, 3])
def test_direct_logit_attribution_sums_to_the_logit(kind, overrides, other) -> None:
    model = tiny(kind, seed=2, **overrides)
    ids = some_ids(t=6, seed=3)
    src = inputs_of(model, ids)[0] if kind == "seq2seq" else None
    attr = direct_logit_attribution(model, ids, token=17, other=other, position=-2, src=src)
    with torch.no_grad():
        want = model(*inputs_of(model, ids))[0][:, 4]
    torch.testing.assert_close(attr.logit, want[:, 17] - (0 if other is None else want[:, 3]),
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(attr.total(), attr.logit, atol=ATOL, rtol=0)
    assert attr.heads.shape == (2, 4, 2) and attr.ffn.shape == (2, 2) and attr.position == 4
    assert (attr.cross_heads is not None) == (kind == "seq2seq")
    if overrides.get("ffn") == "none":
        assert not attr.ffn.any()
    else:  # every part matters: none of them is all zero
        assert attr.ffn.abs().min() > 0 and attr.heads.abs().min() > 0


def test_direct_logit_attribution_of_a_head_is_what_ablating_it_removes() -> None:
    """With the final norm's scale frozen, zeroing head 1.2's z takes exactly its share off
    the logit: checked on a model without a final norm (the scale then cannot move)."""
    model = tiny(final_norm=False, ffn="none", n_layers=1)
    ids = some_ids()
    attr = direct_logit_attribution(model, ids, token=5)
    with hooks(model, {"blocks.0.attn.z": zero_heads([2])}), torch.no_grad():
        ablated = model(ids)[0][:, -1, 5]
    torch.testing.assert_close(attr.logit - ablated, attr.heads[0, 2], atol=ATOL, rtol=0)


# ---- (d) the hook API -------------------------------------------------------------------------
def test_a_forward_with_no_hook_is_the_plain_forward() -> None:
    model, ids = tiny(), some_ids()
    with torch.no_grad():
        plain = model(ids)[0]
        with hooks(model) as cache:
            assert torch.equal(model(ids)[0], plain) and not cache
        (cached, _), cache = run_with_cache(model, ids, names="blocks.*.resid_post")
    assert torch.equal(cached, plain)
    assert list(cache) == ["blocks.0.resid_post", "blocks.1.resid_post"]


def test_hooks_restores_the_model_even_after_an_error() -> None:
    model, ids = tiny(), some_ids()
    with pytest.raises(RuntimeError, match="inside"):
        with hooks(model, {"blocks.*.attn.z": zero_heads([0])}, cache="*"):
            model(ids)
            raise RuntimeError("inside")
    assert not any(m.hooks for m in model.modules() if hasattr(m, "hooks"))
    with torch.no_grad():
        _, cache = run_with_cache(model, ids, names=["embed", "blocks.1.attn.pattern"])
    assert set(cache) == {"embed", "blocks.1.attn.pattern"}


@pytest.mark.parametrize("bad", ["blocks.9.resid_pre", "blocks.*.mlp_out", "resid"])
def test_unknown_site_lists_the_valid_names(bad) -> None:
    model = tiny()
    with pytest.raises(UsageError, match=r"no hook site matches .*resid_pre.*attn\.pattern") as e:
        run_with_cache(model, some_ids(), names=bad)
    assert "\n" not in str(e.value) and "i in 0..1" in str(e.value)
    with pytest.raises(UsageError, match="no hook site matches"):
        with hooks(model, {bad: zero_heads([0])}):
            pass


def count_sdpa(model, monkeypatch) -> list[int]:
    """Replace every attention's fused kernel with a counting wrapper; returns the counter."""
    calls = [0]
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            def counting(*args, kernel=module.sdpa, **kwargs):
                calls[0] += 1
                return kernel(*args, **kwargs)
            monkeypatch.setattr(module, "sdpa", counting)
    return calls


def test_pattern_edit_changes_the_output_and_only_its_layer_leaves_the_fused_path(
        monkeypatch) -> None:
    model, ids = tiny(), some_ids()
    calls = count_sdpa(model, monkeypatch)
    with torch.no_grad():
        plain = model(ids)[0]
        assert calls[0] == 2  # both layers fused
        run_with_cache(model, ids, names="blocks.*.resid_post")
        assert calls[0] == 4  # no pattern asked for: still fused
        uniform = {"blocks.1.attn.pattern": lambda p, name: torch.ones_like(p) / p.size(-1)}
        (edited, _), cache = run_with_cache(model, ids, names="blocks.1.attn.pattern",
                                            edits=uniform)
        assert calls[0] == 5  # layer 0 fused, layer 1 written out
    assert not torch.allclose(edited, plain, atol=1e-3)
    assert torch.equal(cache["blocks.1.attn.pattern"], torch.full((2, 4, 7, 7), 1 / 7))


def test_zero_heads_on_z_equals_zeroing_out_proj_columns() -> None:
    model, ids = tiny(), some_ids()
    with torch.no_grad():
        with hooks(model, {"blocks.1.attn.z": zero_heads([1, 3])}):
            ablated = model(ids)[0]
        w = model.decoder.layers[1].self_attn.out_proj.weight  # (D, H*Dh), Dh = 8
        w[:, 8:16] = 0
        w[:, 24:32] = 0
        assert not torch.allclose(ablated, tiny()(ids)[0], atol=1e-3)
        torch.testing.assert_close(model(ids)[0], ablated, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["decoder", "mlm", "classifier", "seq2seq"])
def test_hook_sites_of_every_family(kind) -> None:
    model, ids = tiny(kind), some_ids(t=7)
    names = list(sites_of(model))
    stacks = ["encoder.", "decoder."] if kind == "seq2seq" else [""]
    for stack in stacks:
        for i in range(2):
            for site in ("resid_pre", "attn.q", "attn.k", "attn.v", "attn.pattern", "attn.z",
                         "attn_out", "resid_mid", "ffn_out", "resid_post"):
                assert f"{stack}blocks.{i}.{site}" in names
        assert f"{stack}embed" in names and f"{stack}final_norm" in names
    if kind == "seq2seq":
        assert select(names, "*.cross_out") == ["decoder.blocks.0.cross_out",
                                                "decoder.blocks.1.cross_out"]
    with torch.no_grad():
        _, cache = run_with_cache(model, *inputs_of(model, ids))
    assert set(cache) == set(names)  # each site met in the forward
    first = "decoder." if kind == "seq2seq" else ""
    assert cache[f"{first}blocks.0.resid_pre"].shape == (2, 7, 32)
    assert cache[f"{first}blocks.1.attn.z"].shape == (2, 4, 7, 8)
    assert cache[f"{first}blocks.1.attn.pattern"].shape == (2, 4, 7, 7)
    if kind == "seq2seq":  # cross-attention: 7 decoder queries over 5 source keys
        assert cache["decoder.blocks.0.cross.pattern"].shape == (2, 4, 7, 5)
        assert cache["encoder.blocks.0.attn.pattern"].shape == (2, 4, 5, 5)


# ---- (e) bad input ----------------------------------------------------------------------------
def test_the_lens_needs_a_language_model_head() -> None:
    model = tiny("classifier")
    with pytest.raises(UsageError, match="needs a language-model head.*EncoderClassifier"):
        logit_lens(model, some_ids())
    with pytest.raises(UsageError, match="needs a language-model head"):
        direct_logit_attribution(model, some_ids(), token=1)


def test_direct_logit_attribution_needs_a_pre_norm_model() -> None:
    with pytest.raises(UsageError, match="needs a pre-norm model.*norm='post'"):
        direct_logit_attribution(tiny(norm="post"), some_ids(), token=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"token": 50}, r"token=50 is out of the vocabulary: token ids are 0\.\.49"),
    ({"token": -1}, r"token=-1 is out of the vocabulary"),
    ({"token": 1, "other": 99}, r"other=99 is out of the vocabulary"),
    ({"token": 1.5}, r"token must be one token id"),
    ({"token": 1, "position": 7}, r"position=7 is out of range: ids have 7 positions \(-7\.\.6\)"),
    ({"token": 1, "position": -8}, r"position=-8 is out of range"),
])
def test_direct_logit_attribution_bad_token_or_position(kwargs, message) -> None:
    with pytest.raises(UsageError, match=message) as e:
        direct_logit_attribution(tiny(), some_ids(), **kwargs)
    assert "\n" not in str(e.value)


def test_bad_ids_targets_k_and_src() -> None:
    model, ids = tiny(), some_ids()
    with pytest.raises(UsageError, match=r"ids holds token id 50, out of the vocabulary"):
        logit_lens(model, ids.masked_fill(ids == ids[0, 0], 50))
    with pytest.raises(UsageError, match=r"ids must be a \(B, T\) tensor"):
        logit_lens(model, ids[0])
    with pytest.raises(UsageError, match=r"k=0 must be an int in 1\.\.50"):
        logit_lens(model, ids, k=0)
    with pytest.raises(UsageError, match=r"targets must be a tensor shaped like ids"):
        logit_lens(model, ids, targets=ids[:, 1:])
    with pytest.raises(UsageError, match=r"ids has 17 positions; .* max_len=16"):
        logit_lens(model, some_ids(t=17))
    with pytest.raises(UsageError, match=r"src has 17 positions; .* max_len=16"):
        logit_lens(tiny("seq2seq"), ids, src=some_ids(t=17))
    with pytest.raises(UsageError, match="src= is for the encoder-decoder only"):
        logit_lens(model, ids, src=ids)
    with pytest.raises(UsageError, match="needs src="):
        logit_lens(tiny("seq2seq"), ids)
