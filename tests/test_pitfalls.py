"""Common pitfalls of hand-written Transformers, one test each: attnlab does not have them.

(Also covered elsewhere: a positional encoding that is the same at every position in
test_nn, an in-place ``src +=`` on the caller's embeddings in test_models, ``K.T`` on batched
input and the heads-not-dividing error in test_nn.)
"""

import math
from functools import partial

import pytest
import torch

from attnlab import DecoderLM, ModelConfig, Transformer
from attnlab.nn import DecoderLayer, LayerNorm, MultiHeadAttention, sinusoidal_table


def test_positional_encoding_varies_with_position():
    table = sinusoidal_table(10, 8)
    assert not torch.allclose(table[1], table[2])
    assert table[3, 2] == pytest.approx(math.sin(3 / 10000 ** (2 / 8)), abs=1e-6)
    assert table[3, 3] == pytest.approx(math.cos(3 / 10000 ** (2 / 8)), abs=1e-6)


def test_decoder_is_causal_and_cross_attention_queries_come_from_the_target():
    cfg = ModelConfig(family="encoder_decoder", d_model=16, n_heads=4, d_ff=32, dropout=0.0)
    layer = DecoderLayer(cfg).eval()
    tgt, memory = torch.randn(2, 3, 16), torch.randn(2, 7, 16)  # T != S
    w = {}  # the two attention patterns, read at their hook sites
    layer.self_attn.hooks["pattern"] = partial(w.__setitem__, "self")
    layer.cross_attn.hooks["pattern"] = partial(w.__setitem__, "cross")
    out = layer(tgt, memory)
    w_self, w_cross = w["self"], w["cross"]
    assert out.shape == (2, 3, 16)  # one output per target position
    assert w_cross.shape == (2, 4, 3, 7)  # target queries over source keys
    assert torch.all(w_self.triu(1) == 0)  # no peeking at later target positions


def test_output_is_a_projection_to_the_vocabulary():
    cfg = ModelConfig(family="encoder_decoder", vocab_size=11, tgt_vocab_size=13, d_model=16,
                      n_heads=2, n_layers=1, dropout=0.0)
    logits, _ = Transformer(cfg)(torch.randint(0, 11, (2, 5)), torch.randint(0, 13, (2, 4)))
    assert logits.shape == (2, 4, 13)
    assert not torch.allclose(logits.sum(-1), torch.ones(2, 4))  # logits, not a softmax


def test_layer_norm_divides_by_sqrt_of_var_plus_eps():
    ln = LayerNorm(2, eps=0.0)
    x = torch.tensor([[1.0, 5.0]])  # mean 3, var 4 -> (x - 3) / 2
    torch.testing.assert_close(ln(x), torch.tensor([[-1.0, 1.0]]))
    torch.testing.assert_close(ln.reference(x), torch.tensor([[-1.0, 1.0]]))


def test_attention_scales_by_sqrt_head_dim_and_sums_over_keys():
    mha = MultiHeadAttention(16, 4).eval()  # head dim 4, not 16
    x = torch.randn(1, 5, 16)
    out, w = mha(x, need_weights=True)
    w_q, w_k, w_v = mha.qkv_proj.weight.chunk(3)  # stacked W^Q, W^K, W^V
    b_q, b_k, b_v = mha.qkv_proj.bias.chunk(3)
    q, k, v = ((x @ w.T + b).view(1, 5, 4, 4).transpose(1, 2)
               for w, b in ((w_q, b_q), (w_k, b_k), (w_v, b_v)))
    expected_w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(4), -1)
    torch.testing.assert_close(w, expected_w, atol=1e-6, rtol=1e-5)
    heads = torch.einsum("bhts,bhsd->bhtd", expected_w, v)  # contract over keys s, not queries
    torch.testing.assert_close(out, mha.out_proj(heads.transpose(1, 2).reshape(1, 5, 16)),
                               atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("t", [1, 3, 16])
def test_shorter_inputs_than_the_context_work(t):
    model = DecoderLM(ModelConfig(vocab_size=10, d_model=16, n_heads=2, n_layers=1, max_len=16,
                                  pos="learned", norm="pre"))
    logits, loss = model(torch.randint(0, 10, (2, t)), torch.randint(0, 10, (2, t)))
    assert logits.shape == (2, t, 10) and torch.isfinite(loss)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_blocks_return_the_residual_stream(norm):
    cfg = ModelConfig(d_model=8, n_heads=2, d_ff=16, norm=norm, dropout=0.0)
    layer = DecoderLayer(cfg, cross=False)
    with torch.no_grad():  # silence both sub-layers: the block must pass its input through
        layer.self_attn.out_proj.weight.zero_(), layer.self_attn.out_proj.bias.zero_()
        layer.ffn.w2.weight.zero_(), layer.ffn.w2.bias.zero_()
    x = torch.randn(2, 4, 8)
    out = layer(x)
    expected = x if norm == "pre" else layer.norm2(layer.norm1(x))
    torch.testing.assert_close(out, expected)


def test_heads_not_dividing_d_model_get_a_clear_error():
    with pytest.raises(ValueError, match="does not divide d_model"):
        MultiHeadAttention(768, 10)
    assert MultiHeadAttention(768, 12)(torch.randn(1, 3, 768)).output.shape == (1, 3, 768)
