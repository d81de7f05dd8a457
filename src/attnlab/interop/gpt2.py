"""GPT-2 (``GPT2LMHeadModel`` / ``GPT2Model``) <-> attnlab :class:`~attnlab.models.DecoderLM`."""

from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from ..models import DecoderLM
from ._load import load_mapped
from .hf import (
    _ACTIVATIONS,
    _TO_HF_ACTIVATION,
    _activation,
    _linear,
    _load,
    _norm,
    _transformers,
    attnlab_config,
    check_model_type,
    unmet,
)


def gpt2_config(hf_config: Any, dropout: float = 0.0) -> ModelConfig:
    """attnlab :class:`ModelConfig` of a ``transformers.GPT2Config``.

    Raises:
        ValueError: settings attnlab cannot reproduce (no or layer-dependent attention scaling,
            reordered/upcast attention, cross-attention, an unsupported activation).
    """
    check_model_type(hf_config, "gpt2", "GPT-2")
    for flag, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                       ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
        if getattr(hf_config, flag, want) != want:
            raise ValueError(f"GPT-2 with {flag}={not want} is not supported by attnlab")
    return ModelConfig(
        family="decoder",
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.n_embd,
        n_heads=hf_config.n_head,
        n_layers=hf_config.n_layer,
        d_ff=hf_config.n_inner or 4 * hf_config.n_embd,
        dropout=dropout,
        norm="pre",
        norm_eps=hf_config.layer_norm_epsilon,
        final_norm=True,
        ffn=_activation(hf_config.activation_function, tuple(_ACTIVATIONS)),
        pos="learned",
        max_len=hf_config.n_positions,
        bias=True,
        scale_embeddings=False,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        pad_id=None,
    )


def gpt2_from_hf(model_or_dir: Any, *, dropout: float = 0.0) -> DecoderLM:
    """An attnlab :class:`DecoderLM` (in eval mode) with the weights of a GPT-2 model.

    Args:
        model_or_dir: a ``GPT2LMHeadModel`` or ``GPT2Model`` instance, or a local directory
            with ``config.json`` and weights (loaded as ``GPT2LMHeadModel``, offline).
        dropout: attnlab's dropout (0 reproduces HF's eval mode; training is up to you).

    HF's ``attention_mask`` + ``position_ids`` correspond to attnlab's ``mask`` +
    ``positions`` (e.g. for left-padded batches).
    """
    model = _load(model_or_dir, "GPT2LMHeadModel")
    base = getattr(model, "transformer", model)  # GPT2LMHeadModel wraps a GPT2Model
    if not (hasattr(base, "wte") and hasattr(base, "h")):
        raise ValueError(f"expected a GPT2LMHeadModel or GPT2Model, got {type(model).__name__}")
    head = getattr(model, "lm_head", None)
    tied = head is None or head.weight.data_ptr() == base.wte.weight.data_ptr()
    cfg = gpt2_config(model.config, dropout).replace(tie_embeddings=tied)
    sd = base.state_dict()
    mapped = {
        "emb.tok.weight": sd["wte.weight"],
        "emb.pos.weight": sd["wpe.weight"],
        "head.weight": sd["wte.weight"] if tied else head.weight,
        **_norm(sd, "ln_f", "decoder.norm"),
    }
    for i in range(cfg.n_layers):
        src, dst = f"h.{i}.", f"decoder.layers.{i}."
        mapped |= _linear(sd, src + "attn.c_attn", dst + "self_attn.qkv_proj", conv1d=True)
        mapped |= _linear(sd, src + "attn.c_proj", dst + "self_attn.out_proj", conv1d=True)
        mapped |= _linear(sd, src + "mlp.c_fc", dst + "ffn.w1", conv1d=True)
        mapped |= _linear(sd, src + "mlp.c_proj", dst + "ffn.w2", conv1d=True)
        mapped |= _norm(sd, src + "ln_1", dst + "norm1") | _norm(sd, src + "ln_2", dst + "norm2")
    lm = DecoderLM(cfg)
    load_mapped(lm, mapped)
    return lm.to(base.wte.weight).eval()


def gpt2_problems(cfg: ModelConfig) -> list[str]:
    """The settings a GPT-2 checkpoint needs that ``cfg`` lacks, each with the value it has
    (empty: it exports)."""
    return unmet((
        ("family='decoder'", cfg.family == "decoder", cfg.family),
        ("norm='pre'", cfg.norm == "pre", cfg.norm),
        ("norm_type='layernorm'", cfg.norm_type == "layernorm", cfg.norm_type),
        ("final_norm=True", cfg.final_norm, cfg.final_norm),
        ("pos='learned'", cfg.pos == "learned", cfg.pos),
        ("scale_embeddings=False", not cfg.scale_embeddings, cfg.scale_embeddings),
        ("embed_norm=False", not cfg.embed_norm, cfg.embed_norm),
        ("head_dim=d_model/n_heads", cfg.head_dim * cfg.n_heads == cfg.d_model, cfg.head_dim),
        ("ffn relu/gelu/gelu_tanh", cfg.ffn in _TO_HF_ACTIVATION, cfg.ffn),
    ))


def gpt2_to_hf(model: DecoderLM) -> Any:
    """A ``transformers.GPT2LMHeadModel`` with the weights of an attnlab :class:`DecoderLM`
    (in eval mode, same dtype and device) — e.g. to benchmark HF on identical weights.

    Raises:
        ValueError: the model is not GPT-2 shaped (pre-norm layernorm with a final norm,
            learned positions, unscaled embeddings, no embedding norm, Dh = D / H,
            relu/gelu/gelu_tanh feed-forward). Biases that attnlab lacks (``bias=False``)
            are zeros in GPT-2.
    """
    cfg = attnlab_config(model)
    problems = gpt2_problems(cfg)
    if problems:
        raise ValueError("this DecoderLM cannot be expressed as GPT-2: it needs "
                         f"{', '.join(problems)}")
    tf = _transformers()
    hf_config = tf.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model,
        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
        activation_function=_TO_HF_ACTIVATION[cfg.ffn], resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout, attn_pdrop=cfg.attn_dropout, layer_norm_epsilon=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, bos_token_id=None, eos_token_id=None,
        pad_token_id=cfg.pad_id,
    )
    hf = tf.GPT2LMHeadModel(hf_config)
    sd = model.state_dict()
    mapped = {
        "transformer.wte.weight": sd["emb.tok.weight"],
        "transformer.wpe.weight": sd["emb.pos.weight"],
        "lm_head.weight": sd["head.weight"],
        **_norm(sd, "decoder.norm", "transformer.ln_f"),
    }
    for i in range(cfg.n_layers):
        src, dst = f"decoder.layers.{i}.", f"transformer.h.{i}."
        attn = src + "self_attn."
        mapped |= _linear(sd, attn + "qkv_proj", dst + "attn.c_attn", conv1d=True)  # (D, 3D)
        mapped |= _linear(sd, attn + "out_proj", dst + "attn.c_proj", conv1d=True)
        mapped |= _linear(sd, src + "ffn.w1", dst + "mlp.c_fc", conv1d=True)
        mapped |= _linear(sd, src + "ffn.w2", dst + "mlp.c_proj", conv1d=True)
        mapped |= _norm(sd, src + "norm1", dst + "ln_1") | _norm(sd, src + "norm2", dst + "ln_2")
    load_mapped(hf, mapped)
    return hf.to(sd["emb.tok.weight"]).eval()
