"""Llama (``LlamaForCausalLM``) <-> attnlab :class:`~attnlab.models.DecoderLM`.

A Llama decoder is attnlab's pre-norm decoder with RMSNorm, RoPE and SwiGLU. Both pair RoPE
dimension i with i + Dh/2 ("rotate half"), so q/k map unpermuted; SwiGLU's
``down(silu(gate(x)) * up(x))`` is attnlab's ``w2(silu(w1(x)) * w3(x))``. Grouped-query
attention imports as ordinary multi-head attention: each key/value head's projection rows
are repeated for the query heads it serves (HF's ``repeat_kv``), with the same outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..config import ModelConfig
from ..errors import RunError
from ..models import DecoderLM
from .hf import (
    check_model_type,
    exportable,
    import_transformers,
    load_hf_model,
    tied_head,
    unmet,
    with_zero_ffn,
)
from .weight_map import load_mapped


def _rope_theta(hf_config: Any) -> float:
    """The RoPE base of a LlamaConfig (``rope_parameters`` in transformers 5, ``rope_theta``
    before); scaled RoPE variants raise ValueError."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise RunError(f"Llama with rope_type={kind!r} is not supported: attnlab has plain "
                       "RoPE only")
    return float(params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0)


def llama_config(hf_config: Any, dropout: float = 0.0) -> ModelConfig:
    """attnlab :class:`ModelConfig` of a ``transformers.LlamaConfig``.

    Raises:
        ValueError: settings attnlab cannot reproduce (scaled RoPE, an activation other than
            silu, bias on attention but not on the MLP or the other way round,
            ``pretraining_tp`` > 1).
    """
    check_model_type(hf_config, "llama", "Llama")
    if hf_config.hidden_act != "silu":
        raise RunError(f"Llama with hidden_act={hf_config.hidden_act!r} is not supported: "
                       "attnlab's swiglu uses silu")
    attn_bias = bool(getattr(hf_config, "attention_bias", False))
    mlp_bias = bool(getattr(hf_config, "mlp_bias", False))
    if attn_bias != mlp_bias:
        raise RunError(f"Llama with attention_bias={attn_bias} and mlp_bias={mlp_bias} is not "
                       "supported: attnlab has one bias setting for both")
    if getattr(hf_config, "pretraining_tp", 1) != 1:
        raise RunError("Llama with pretraining_tp > 1 is not supported")
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return ModelConfig(
        family="decoder",
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        n_heads=heads,
        head_dim=None if head_dim * heads == hf_config.hidden_size else head_dim,
        n_layers=hf_config.num_hidden_layers,
        d_ff=hf_config.intermediate_size,
        dropout=dropout,
        norm="pre",
        norm_type="rmsnorm",
        norm_eps=hf_config.rms_norm_eps,
        final_norm=True,
        ffn="swiglu",
        pos="rope",
        rope_base=_rope_theta(hf_config),
        max_len=hf_config.max_position_embeddings,
        bias=attn_bias,
        scale_embeddings=False,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        pad_id=None,
    )


# One decoder layer, attnlab name -> Llama name, both directions; q/k/v are one stacked
# matrix in attnlab and three in Llama, so they are mapped apart.
LAYER_NAMES = {"self_attn.out_proj": "self_attn.o_proj", "ffn.w1": "mlp.gate_proj",
               "ffn.w3": "mlp.up_proj", "ffn.w2": "mlp.down_proj",
               "norm1": "input_layernorm", "norm2": "post_attention_layernorm"}


def _layer(sd: dict[str, Tensor], src: str, dst: str, bias: bool,
           to_hf: bool) -> dict[str, Tensor]:
    """The weights of :data:`LAYER_NAMES` of one layer, from prefix ``src`` to ``dst``
    (attnlab -> Llama when ``to_hf``, else back); RMSNorm has no bias."""
    out = {}
    for ours, theirs in LAYER_NAMES.items():
        a, b = (ours, theirs) if to_hf else (theirs, ours)
        for p in ("weight", "bias") if bias and not ours.startswith("norm") else ("weight",):
            out[f"{dst}{b}.{p}"] = sd[f"{src}{a}.{p}"]
    return out


def _repeat_heads(w: Tensor, n_kv: int, n_rep: int) -> Tensor:
    """(KV*Dh, ...) projection rows -> (KV*n_rep*Dh, ...): kv head j for query heads
    j*n_rep .. j*n_rep + n_rep - 1, as HF's ``repeat_kv``."""
    return w.reshape(n_kv, -1, *w.shape[1:]).repeat_interleave(n_rep, dim=0).flatten(0, 1)


def llama_from_hf(model_or_dir: Any, *, dropout: float = 0.0) -> DecoderLM:
    """An attnlab :class:`DecoderLM` (in eval mode) with the weights of a ``LlamaForCausalLM``
    (an instance, or a local directory with ``config.json`` and weights)."""
    model = load_hf_model(model_or_dir, "LlamaForCausalLM")
    base = getattr(model, "model", model)
    if not (hasattr(base, "embed_tokens") and hasattr(base, "layers")):
        raise ValueError(f"expected a LlamaForCausalLM, got {type(model).__name__}")
    hf_cfg = model.config
    tied = tied_head(model, base.embed_tokens.weight)
    cfg = llama_config(hf_cfg, dropout).replace(tie_embeddings=tied)
    heads = cfg.n_heads
    n_kv = getattr(hf_cfg, "num_key_value_heads", None) or heads
    if heads % n_kv:
        raise RunError(f"Llama with num_attention_heads={heads} not a multiple of "
                       f"num_key_value_heads={n_kv} is not supported")
    sd = base.state_dict()
    mapped = {
        "emb.tok.weight": sd["embed_tokens.weight"],
        "head.weight": sd["embed_tokens.weight"] if tied else model.lm_head.weight,
        "decoder.norm.weight": sd["norm.weight"],
    }
    for i in range(cfg.n_layers):
        src, dst = f"layers.{i}.", f"decoder.layers.{i}."
        attn = src + "self_attn."
        names = ("weight", "bias") if cfg.bias else ("weight",)
        for p in names:
            q, k, v = (sd[f"{attn}{n}_proj.{p}"] for n in "qkv")
            k, v = (_repeat_heads(t, n_kv, heads // n_kv) for t in (k, v))
            mapped[f"{dst}self_attn.qkv_proj.{p}"] = torch.cat([q, k, v])  # (3*H*Dh, ...)
        mapped |= _layer(sd, src, dst, cfg.bias, to_hf=False)
    lm = DecoderLM(cfg)
    load_mapped(lm, mapped)
    return lm.to(sd["embed_tokens.weight"]).eval()


def llama_problems(cfg: ModelConfig) -> list[str]:
    """The settings a Llama checkpoint needs that ``cfg`` lacks, each with the value it has
    (empty: it exports)."""
    return unmet((
        ("family='decoder'", cfg.family == "decoder", cfg.family),
        ("norm='pre'", cfg.norm == "pre", cfg.norm),
        ("norm_type='rmsnorm'", cfg.norm_type == "rmsnorm", cfg.norm_type),
        ("final_norm=True", cfg.final_norm, cfg.final_norm),
        ("pos='rope'", cfg.pos == "rope", cfg.pos),
        ("ffn='swiglu' or 'none'", cfg.ffn in ("swiglu", "none"), cfg.ffn),
        ("scale_embeddings=False", not cfg.scale_embeddings, cfg.scale_embeddings),
        ("embed_norm=False", not cfg.embed_norm, cfg.embed_norm),
        # transformers' LlamaConfig refuses hidden_size % num_attention_heads != 0, even with
        # head_dim given
        (f"n_heads dividing d_model={cfg.d_model}", cfg.d_model % cfg.n_heads == 0, cfg.n_heads),
    ))


def llama_to_hf(model: DecoderLM) -> Any:
    """A ``transformers.LlamaForCausalLM`` with the weights of an attnlab :class:`DecoderLM`
    (in eval mode, same dtype and device).

    Raises:
        ValueError: the model is not Llama shaped (see :func:`llama_problems`).
    """
    exportable(model, llama_problems, "Llama")
    model = with_zero_ffn(model, "swiglu")  # attention-only: a feed-forward block of zeros
    cfg = model.config
    tf = import_transformers()
    hf_config = tf.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads, head_dim=cfg.head_dim, hidden_act="silu",
        max_position_embeddings=cfg.max_len, rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.bias, mlp_bias=cfg.bias,
        attention_dropout=cfg.attn_dropout, rope_theta=cfg.rope_base,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base},
        bos_token_id=None, eos_token_id=None, pad_token_id=cfg.pad_id,
    )
    hf = tf.LlamaForCausalLM(hf_config)
    sd = model.state_dict()
    mapped = {
        "model.embed_tokens.weight": sd["emb.tok.weight"],
        "lm_head.weight": sd["head.weight"],
        "model.norm.weight": sd["decoder.norm.weight"],
    }
    for i in range(cfg.n_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        names = ("weight", "bias") if cfg.bias else ("weight",)
        for p in names:
            q, k, v = sd[f"{src}self_attn.qkv_proj.{p}"].chunk(3)  # (H*Dh, ...) each
            for n, t in zip("qkv", (q, k, v)):
                mapped[f"{dst}self_attn.{n}_proj.{p}"] = t
        mapped |= _layer(sd, src, dst, cfg.bias, to_hf=True)
    load_mapped(hf, mapped)
    return hf.to(sd["emb.tok.weight"]).eval()
