"""GPT-NeoX (``GPTNeoXForCausalLM``) <-> attnlab :class:`~attnlab.models.DecoderLM`.

A GPT-NeoX decoder with sequential residuals (``use_parallel_residual=False``) and rotary
positions on every head dimension (``partial_rotary_factor`` 1.0) is attnlab's pre-norm
decoder with LayerNorm and RoPE. Both pair RoPE dimension i with i + Dh/2 ("rotate half").
NeoX's fused ``query_key_value`` is laid out per head, (H, 3, Dh) rows (its forward views the
output as (..., H, 3*Dh) and splits the last dimension into q, k, v), where attnlab's
``qkv_proj`` stacks all queries, then all keys, then all values, (3, H, Dh) rows. NeoX's MLP
always has biases: an attnlab model without them (``bias=False``) exports zero biases there
and in the LayerNorms, and such a checkpoint imports back only while those are zeros.
"""

from __future__ import annotations

import os
from typing import Any

from torch import Tensor

from ..config import ModelConfig
from ..errors import RunError
from ..models import DecoderLM
from .hf import (
    FROM_HF_ACTIVATION,
    TO_HF_ACTIVATION,
    attnlab_activation,
    check_model_type,
    exportable,
    import_transformers,
    layernorm_decoder_problems,
    load_hf_model,
    read_hf_config,
    read_hf_weights,
    tied_head,
    with_zero_ffn,
)
from .weight_map import layer_norm_weights, layer_weights, load_mapped

# One decoder layer, attnlab name -> GPT-NeoX name, both directions; q/k/v are mapped apart
LINEAR_NAMES = {"self_attn.out_proj": "attention.dense", "ffn.w1": "mlp.dense_h_to_4h",
                "ffn.w2": "mlp.dense_4h_to_h"}
NORM_NAMES = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}


def _rope(hf_config: Any) -> tuple[float, float]:
    """(rope base, rotary fraction) of a GPTNeoXConfig; scaled RoPE raises."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    kind = params.get("rope_type") or "default"
    if kind != "default":
        raise RunError(f"GPT-NeoX with rope_type={kind!r} is not supported: attnlab has plain "
                       "RoPE only")
    base = params.get("rope_theta") or getattr(hf_config, "rotary_emb_base", None) or 10000.0
    pct = params.get("partial_rotary_factor", getattr(hf_config, "rotary_pct", 1.0))
    return float(base), float(pct)


def neox_config(hf_config: Any, dropout: float = 0.0) -> ModelConfig:
    """attnlab :class:`ModelConfig` of a ``transformers.GPTNeoXConfig``.

    Raises:
        ValueError: settings attnlab cannot reproduce (parallel residuals, rotary on part of
            the head dimensions, scaled RoPE, an unsupported activation).
    """
    check_model_type(hf_config, "gpt_neox", "GPT-NeoX")
    if getattr(hf_config, "use_parallel_residual", True):
        raise RunError("GPT-NeoX with use_parallel_residual=True is not supported: attnlab's "
                       "blocks add attention, then the feed-forward, one after the other")
    base, pct = _rope(hf_config)
    if pct != 1.0:
        raise RunError(f"GPT-NeoX with rotary_pct={pct} is not supported: attnlab rotates "
                       "every head dimension (rotary_pct=1.0)")
    return ModelConfig(
        family="decoder",
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        n_heads=hf_config.num_attention_heads,
        n_layers=hf_config.num_hidden_layers,
        d_ff=hf_config.intermediate_size,
        dropout=dropout,
        norm="pre",
        norm_type="layernorm",
        norm_eps=hf_config.layer_norm_eps,
        final_norm=True,
        ffn=attnlab_activation(hf_config.hidden_act, tuple(FROM_HF_ACTIVATION)),
        pos="rope",
        rope_base=base,
        max_len=hf_config.max_position_embeddings,
        bias=bool(getattr(hf_config, "attention_bias", True)),
        scale_embeddings=False,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        pad_id=None,
    )


def _qkv_to_neox(w: Tensor, heads: int) -> Tensor:
    """attnlab's (3*H*Dh, ...) q/k/v rows -> NeoX's per-head (H*3*Dh, ...)."""
    return w.reshape(3, heads, -1, *w.shape[1:]).transpose(0, 1).flatten(0, 2)


def _qkv_from_neox(w: Tensor, heads: int) -> Tensor:
    """NeoX's per-head (H*3*Dh, ...) q/k/v rows -> attnlab's (3*H*Dh, ...)."""
    return w.reshape(heads, 3, -1, *w.shape[1:]).transpose(0, 1).flatten(0, 2)


def neox_from_hf(model_or_dir: Any, *, dropout: float = 0.0) -> DecoderLM:
    """An attnlab :class:`DecoderLM` (in eval mode) with the weights of a
    ``GPTNeoXForCausalLM`` (an instance, or a local directory with ``config.json`` and
    weights; an older checkpoint's ``embed_out`` is its ``lm_head``).

    Raises:
        ValueError: see :func:`neox_config`; also a checkpoint without attention biases
            whose MLP or LayerNorm biases are not zero (attnlab has one bias setting).
    """
    sd = None
    if isinstance(model_or_dir, (str, os.PathLike)):
        read_hf_config(model_or_dir)  # the clear errors for a folder that is not a model
        sd = {("lm_head." + k[len("embed_out."):] if k.startswith("embed_out.") else k): v
              for k, v in read_hf_weights(model_or_dir).items()}
    model = load_hf_model(model_or_dir, "GPTNeoXForCausalLM", sd)
    base = getattr(model, "gpt_neox", model)
    if not (hasattr(base, "embed_in") and hasattr(base, "layers")):
        raise ValueError(f"expected a GPTNeoXForCausalLM, got {type(model).__name__}")
    tied = tied_head(model, base.embed_in.weight)
    cfg = neox_config(model.config, dropout).replace(tie_embeddings=tied)
    sd = base.state_dict()
    if not cfg.bias:
        nonzero = [k for k, v in sd.items() if k.endswith(".bias") and v.count_nonzero()]
        if nonzero:
            raise RunError(f"GPT-NeoX with attention_bias=False but a nonzero {nonzero[0]} is "
                           "not supported: attnlab has one bias setting for all layers")
    mapped = {
        "emb.tok.weight": sd["embed_in.weight"],
        "head.weight": sd["embed_in.weight"] if tied else model.lm_head.weight,
        **layer_norm_weights(sd, "final_layer_norm", "decoder.norm"),
    }
    for i in range(cfg.n_layers):
        src, dst = f"layers.{i}.", f"decoder.layers.{i}."
        qkv = src + "attention.query_key_value."
        mapped[f"{dst}self_attn.qkv_proj.weight"] = _qkv_from_neox(sd[qkv + "weight"],
                                                                   cfg.n_heads)
        if cfg.bias:
            mapped[f"{dst}self_attn.qkv_proj.bias"] = _qkv_from_neox(sd[qkv + "bias"],
                                                                     cfg.n_heads)
        mapped |= layer_weights(sd, src, dst, linears=LINEAR_NAMES, norms=NORM_NAMES,
                                to_hf=False)
    if not cfg.bias:  # all zeros (checked above): attnlab has none
        mapped = {k: v for k, v in mapped.items() if not k.endswith(".bias")}
    lm = DecoderLM(cfg)
    load_mapped(lm, mapped)
    return lm.to(sd["embed_in.weight"]).eval()


def neox_problems(cfg: ModelConfig) -> list[str]:
    """The settings a GPT-NeoX checkpoint needs that ``cfg`` lacks, each with the value it
    has (empty: it exports)."""
    return layernorm_decoder_problems(cfg, "rope")


def neox_to_hf(model: DecoderLM) -> Any:
    """A ``transformers.GPTNeoXForCausalLM`` (sequential residuals, rotary on all head
    dimensions) with the weights of an attnlab :class:`DecoderLM` (in eval mode, same dtype
    and device). Biases that attnlab lacks are zeros; ``ffn="none"`` is a feed-forward block
    of zero weights.

    Raises:
        ValueError: the model is not GPT-NeoX shaped (see :func:`neox_problems`).
    """
    exportable(model, neox_problems, "GPT-NeoX")
    model = with_zero_ffn(model, "gelu")
    cfg = model.config
    tf = import_transformers()
    hf_config = tf.GPTNeoXConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff,
        hidden_act=TO_HF_ACTIVATION[cfg.ffn], attention_dropout=cfg.attn_dropout,
        hidden_dropout=cfg.dropout, max_position_embeddings=cfg.max_len,
        layer_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        use_parallel_residual=False, attention_bias=cfg.bias,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base,
                         "partial_rotary_factor": 1.0},
        bos_token_id=None, eos_token_id=None, pad_token_id=cfg.pad_id,
    )
    hf = tf.GPTNeoXForCausalLM(hf_config)
    sd = model.state_dict()
    mapped = {
        "gpt_neox.embed_in.weight": sd["emb.tok.weight"],
        "lm_head.weight": sd["head.weight"],
        **layer_norm_weights(sd, "decoder.norm", "gpt_neox.final_layer_norm"),
    }
    for i in range(cfg.n_layers):
        src, dst = f"decoder.layers.{i}.", f"gpt_neox.layers.{i}."
        w = sd[f"{src}self_attn.qkv_proj.weight"]
        qkv = dst + "attention.query_key_value."
        mapped[qkv + "weight"] = _qkv_to_neox(w, cfg.n_heads)
        if cfg.bias:
            mapped[qkv + "bias"] = _qkv_to_neox(sd[f"{src}self_attn.qkv_proj.bias"], cfg.n_heads)
        linears = LINEAR_NAMES
        if not cfg.bias:  # NeoX's attention has no bias then; its MLP keeps zero ones
            linears = {k: v for k, v in LINEAR_NAMES.items() if not k.startswith("self_attn")}
            mapped[f"{dst}attention.dense.weight"] = sd[f"{src}self_attn.out_proj.weight"]
        mapped |= layer_weights(sd, src, dst, linears=linears, norms=NORM_NAMES, to_hf=True)
    load_mapped(hf, mapped)
    return hf.to(sd["emb.tok.weight"]).eval()

