"""Configs: validated at construction, with messages naming field, value and what is allowed."""

import json

import pytest

from attnlab import ConfigError, ModelConfig, build_model


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(d_model=30, n_heads=4), r"n_heads=4 .*divisor of d_model=30"),
    (dict(n_layers=0), r"n_layers=0 .*positive integer"),
    (dict(rope_base=0.0), r"rope_base=0.0 .*float > 1"),
    (dict(rope_base=float("nan")), r"rope_base=nan .*float > 1"),
    (dict(init_std=float("inf")), r"init_std=inf .*finite positive float"),
    (dict(dropout=1.0), r"dropout=1.0 .*\[0, 1\)"),
    (dict(dropout=-0.1), r"dropout=-0.1 .*\[0, 1\)"),
    (dict(attn_dropout=1.5), r"attn_dropout=1.5"),
    (dict(norm="middle"), r"norm='middle' .*'post', 'pre'"),
    (dict(pos="alibi"), r"pos='alibi' .*'sinusoidal', 'learned', 'rope'"),
    (dict(ffn="tanh"), r"ffn='tanh' .*'relu'"),
    (dict(family="rnn"), r"family='rnn'"),
    (dict(vocab_size=0), r"vocab_size=0 .*positive integer"),
    (dict(d_model="128"), r"d_model='128' has the wrong type: expected int"),
    (dict(dropout=True), r"dropout=True has the wrong type"),
    (dict(pad_id=300, vocab_size=256), r"pad_id=300"),
    (dict(pos="rope", d_model=20, n_heads=4), r"head_dim=5 .*even"),
    (dict(norm=3), r"norm=3 has the wrong type: expected str"),
    (dict(pos="rope", head_dim=5), r"head_dim=5 .*even"),
    (dict(init_std=0.0), r"init_std=0.0 .*positive float"),
    # encoder-decoder settings on another family were silently ignored
    (dict(n_decoder_layers=3), r"n_decoder_layers=3 .*None for family='decoder'"),
    (dict(family="encoder", tgt_vocab_size=50), r"tgt_vocab_size=50 .*family='encoder'"),
    (dict(init_residual_scale="yes"), r"init_residual_scale='yes' has the wrong type"),
])
def test_bad_configs_raise_clear_value_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ModelConfig(**kwargs)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_heads_not_dividing_is_fine_with_explicit_head_dim():
    c = ModelConfig(d_model=30, n_heads=4, head_dim=8, pos="learned")
    assert c.head_dim == 8
    build_model(c)


def test_json_round_trip_and_unknown_keys():
    c = ModelConfig(family="encoder_decoder", vocab_size=100, tgt_vocab_size=120, norm="pre")
    again = ModelConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c
    unknown = r"unknown config key 'model.n_head'; allowed keys in \[model\]: .*n_heads"
    with pytest.raises(ValueError, match=unknown):
        ModelConfig.from_dict({"n_head": 4})


def test_frozen_and_derived_values():
    c = ModelConfig(d_model=64, n_heads=8)
    with pytest.raises(AttributeError):
        c.d_model = 32
    assert c.head_dim == 8 and c.d_ff == 256 and c.final_norm is False
    assert ModelConfig(norm="pre").final_norm is True
    assert ModelConfig(ffn="swiglu", d_model=96, n_heads=4).d_ff == 256


def test_sizes_beyond_what_can_be_built_are_refused_by_name():
    """A stack deeper than MAX_LAYERS (building it would run for hours), and a weight with
    more elements than a tensor counts, name the key and the limit; the limits themselves
    pass (only the config is made here)."""
    from attnlab.config import MAX_ELEMENTS, MAX_LAYERS

    ModelConfig(n_layers=MAX_LAYERS, n_heads=4)
    with pytest.raises(ConfigError, match=r"n_layers=10001 is not allowed: at most 10,000"):
        ModelConfig(n_layers=MAX_LAYERS + 1, n_heads=4)
    with pytest.raises(ConfigError, match=r"n_decoder_layers=10001 is not allowed"):
        ModelConfig(family="encoder_decoder", n_decoder_layers=MAX_LAYERS + 1, n_heads=4)
    ModelConfig(vocab_size=MAX_ELEMENTS // 8, d_model=8, n_heads=4, d_ff=8)
    with pytest.raises(ConfigError, match=r"vocab_size=\d+ is not allowed: sizes whose weights "
                       r"a tensor holds: with d_model=8 it makes a weight of"):
        ModelConfig(vocab_size=MAX_ELEMENTS // 8 + 1, d_model=8, n_heads=4, d_ff=8)
    with pytest.raises(ConfigError, match=r"max_len=\d+ is not allowed"):
        ModelConfig(pos="learned", max_len=2**62, d_model=8, n_heads=4, d_ff=8)
