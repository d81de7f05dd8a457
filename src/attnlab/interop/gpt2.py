"""GPT-2 (``GPT2LMHeadModel`` / ``GPT2Model``) <-> attnlab :class:`~attnlab.models.DecoderLM`."""

from __future__ import annotations

from typing import Any

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
    tied_head,
    with_zero_ffn,
)
from .weight_map import layer_norm_weights, layer_weights, load_mapped


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
            raise RunError(f"GPT-2 with {flag}={not want} is not supported by attnlab")
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
        ffn=attnlab_activation(hf_config.activation_function, tuple(FROM_HF_ACTIVATION)),
        pos="learned",
        max_len=hf_config.n_positions,
        bias=True,
        scale_embeddings=False,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        pad_id=None,
    )


# One decoder layer, attnlab name -> GPT-2 name, both directions. GPT-2's linear layers are
# Conv1D, whose weight is stored (in, out): the fused q/k/v ``c_attn`` is (D, 3D).
LINEAR_NAMES = {"self_attn.qkv_proj": "attn.c_attn", "self_attn.out_proj": "attn.c_proj",
                "ffn.w1": "mlp.c_fc", "ffn.w2": "mlp.c_proj"}
NORM_NAMES = {"norm1": "ln_1", "norm2": "ln_2"}


def gpt2_from_hf(model_or_dir: Any, *, dropout: float = 0.0) -> DecoderLM:
    """An attnlab :class:`DecoderLM` (in eval mode) with the weights of a GPT-2 model.

    Args:
        model_or_dir: a ``GPT2LMHeadModel`` or ``GPT2Model`` instance, or a local directory
            with ``config.json`` and weights (loaded as ``GPT2LMHeadModel``, offline).
        dropout: attnlab's dropout (0 reproduces HF's eval mode; training is up to you).

    HF's ``attention_mask`` + ``position_ids`` correspond to attnlab's ``mask`` +
    ``positions`` (e.g. for left-padded batches).
    """
    model = load_hf_model(model_or_dir, "GPT2LMHeadModel")
    base = getattr(model, "transformer", model)  # GPT2LMHeadModel wraps a GPT2Model
    if not (hasattr(base, "wte") and hasattr(base, "h")):
        raise ValueError(f"expected a GPT2LMHeadModel or GPT2Model, got {type(model).__name__}")
    tied = tied_head(model, base.wte.weight)
    cfg = gpt2_config(model.config, dropout).replace(tie_embeddings=tied)
    sd = base.state_dict()
    mapped = {
        "emb.tok.weight": sd["wte.weight"],
        "emb.pos.weight": sd["wpe.weight"],
        "head.weight": sd["wte.weight"] if tied else model.lm_head.weight,
        **layer_norm_weights(sd, "ln_f", "decoder.norm"),
    }
    for i in range(cfg.n_layers):
        mapped |= layer_weights(sd, f"h.{i}.", f"decoder.layers.{i}.", linears=LINEAR_NAMES,
                                norms=NORM_NAMES, to_hf=False, conv1d=True)
    lm = DecoderLM(cfg)
    load_mapped(lm, mapped)
    return lm.to(base.wte.weight).eval()


def gpt2_problems(cfg: ModelConfig) -> list[str]:
    """The settings a GPT-2 checkpoint needs that ``cfg`` lacks, each with the value it has
    (empty: it exports)."""
    return layernorm_decoder_problems(cfg, "learned")


def gpt2_to_hf(model: DecoderLM) -> Any:
    """A ``transformers.GPT2LMHeadModel`` with the weights of an attnlab :class:`DecoderLM`
    (in eval mode, same dtype and device) — e.g. to benchmark HF on identical weights.

    Raises:
        ValueError: the model is not GPT-2 shaped (pre-norm layernorm with a final norm,
            learned positions, unscaled embeddings, no embedding norm, Dh = D / H,
            relu/gelu/gelu_tanh feed-forward, or none: then one of zero weights). Biases
            that attnlab lacks (``bias=False``) are zeros in GPT-2.
    """
    exportable(model, gpt2_problems, "GPT-2")
    model = with_zero_ffn(model, "gelu_tanh")
    cfg = model.config
    tf = import_transformers()
    hf_config = tf.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model,
        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
        activation_function=TO_HF_ACTIVATION[cfg.ffn], resid_pdrop=cfg.dropout,
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
        **layer_norm_weights(sd, "decoder.norm", "transformer.ln_f"),
    }
    for i in range(cfg.n_layers):
        mapped |= layer_weights(sd, f"decoder.layers.{i}.", f"transformer.h.{i}.",
                                linears=LINEAR_NAMES, norms=NORM_NAMES, to_hf=True, conv1d=True)
    load_mapped(hf, mapped)
    return hf.to(sd["emb.tok.weight"]).eval()
