"""attnlab encoder-decoder :class:`~attnlab.models.Transformer` -> ``transformers.MarianMTModel``.

MarianMT is the paper's model as Hugging Face ships it: post-norm layers, fixed sinusoidal
positions, embeddings optionally times sqrt(D), shared and tied embeddings optional. Two
differences in layout, both handled here:

* Marian's sinusoid table is not interleaved: the sines of all frequencies fill the first half
  of the D dimensions and the cosines the second (``MarianSinusoidalPositionalEmbedding``);
  attnlab's puts sin and cos of one frequency side by side (paper, section 3.5). Marian
  rebuilds its table on loading (it is never saved), so the table cannot be overwritten.
  Instead every weight that reads or writes the residual stream is permuted along D
  (``_RESIDUAL_ORDER``): LayerNorm, attention and feed-forward all commute with a permutation
  of their D features, so the exported model computes the same logits.
* Marian adds ``final_logits_bias`` (zeros here: attnlab's head has no bias).

Other layouts (pre-norm, learned or rotary positions, RMSNorm, an embedding norm, no biases)
have no MarianMT counterpart: :func:`marian_problems` names them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..config import ModelConfig, check_int
from ..models import Transformer
from ._load import load_mapped
from .hf import _TO_HF_ACTIVATION, _transformers, attnlab_config, unmet


def marian_problems(cfg: ModelConfig) -> list[str]:
    """The settings a MarianMT model needs that ``cfg`` lacks, each with the value it has
    (empty: it exports)."""
    return unmet((
        ("family='encoder_decoder'", cfg.family == "encoder_decoder", cfg.family),
        ("norm='post'", cfg.norm == "post", cfg.norm),
        ("norm_type='layernorm'", cfg.norm_type == "layernorm", cfg.norm_type),
        ("final_norm=False", not cfg.final_norm, cfg.final_norm),
        ("embed_norm=False", not cfg.embed_norm, cfg.embed_norm),
        ("pos='sinusoidal'", cfg.pos == "sinusoidal", cfg.pos),
        ("bias=True", cfg.bias, cfg.bias),
        ("head_dim=d_model/n_heads", cfg.head_dim * cfg.n_heads == cfg.d_model, cfg.head_dim),
        ("ffn relu/gelu/gelu_tanh", cfg.ffn in _TO_HF_ACTIVATION, cfg.ffn),
        # MarianMT's LayerNorms have torch's default eps (its config has no field for it)
        ("norm_eps=1e-5", cfg.norm_eps == 1e-5, cfg.norm_eps),
    ))


def _residual_order(d_model: int) -> Tensor:
    """Marian's feature j is attnlab's feature ``order[j]``: the even (sine) features, then the
    odd (cosine) ones."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])  # (D,)


def marian_to_hf(model: Transformer, *, decoder_start_id: int | None = None,
                 eos_id: int | None = None) -> Any:
    """A ``transformers.MarianMTModel`` (eval mode, same dtype and device) with the weights of
    an attnlab :class:`Transformer` of the paper's configuration.

    Args:
        model: post-norm LayerNorm, sinusoidal positions, biases, no final or embedding norm
            (:func:`marian_problems`); shared / tied embeddings and the sqrt(D) embedding
            scale may be on or off.
        decoder_start_id: the token ``generate()`` starts the target with (attnlab's
            tokenizers: ``bos_id``); default the pad id, Marian's convention.
        eos_id: the token that ends a translation, for ``generate()``.

    Returns:
        The HF model: ``model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)``
        has the logits of ``model(src, tgt, src_mask=mask)[0]``.

    Raises:
        ValueError: one line naming the settings that MarianMT cannot express.
    """
    cfg = attnlab_config(model)
    problems = marian_problems(cfg)
    if problems:
        raise ValueError(f"this encoder-decoder cannot be exported as MarianMT: it needs "
                         f"{', '.join(problems)}")
    for name, value in (("decoder_start_id", decoder_start_id), ("eos_id", eos_id)):
        if value is not None:
            check_int(name, value, 0, cfg.tgt_vocab_size - 1)  # (else generate() fails far later)
    pad = 0 if cfg.pad_id is None else cfg.pad_id
    tf = _transformers()
    hf_config = tf.MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.tgt_vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_layers, decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function=_TO_HF_ACTIVATION[cfg.ffn], dropout=cfg.dropout,
        attention_dropout=cfg.attn_dropout, activation_dropout=cfg.dropout,
        max_position_embeddings=cfg.max_len, scale_embedding=cfg.scale_embeddings,
        share_encoder_decoder_embeddings=cfg.share_embeddings,
        tie_word_embeddings=cfg.tie_embeddings, pad_token_id=pad,
        decoder_start_token_id=pad if decoder_start_id is None else decoder_start_id,
        eos_token_id=eos_id, forced_eos_token_id=eos_id, bos_token_id=None,
    )
    hf = tf.MarianMTModel(hf_config)
    order = _residual_order(cfg.d_model)
    sd = model.state_dict()

    def reads(name: str) -> Tensor:  # (out, D) weights applied to the residual stream
        return sd[name][:, order]

    def writes(name: str) -> Tensor:  # (D, in) weights, (D,) biases and norms: into it
        return sd[name][order]

    src_tok, tgt_tok = reads("src_emb.tok.weight"), reads("tgt_emb.tok.weight")
    table = model.src_emb.pos.table[: cfg.max_len, order]  # Marian's (sin | cos) layout
    mapped = {
        "final_logits_bias": src_tok.new_zeros(1, cfg.tgt_vocab_size),
        "model.encoder.embed_tokens.weight": src_tok,
        "model.decoder.embed_tokens.weight": tgt_tok,
        "model.encoder.embed_positions.weight": table,
        "model.decoder.embed_positions.weight": table,
        "lm_head.weight": reads("head.weight"),
    }
    if cfg.share_embeddings:
        mapped["model.shared.weight"] = src_tok
    for stack, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n_layers):
            src, dst = f"{stack}.layers.{i}.", f"model.{stack}.layers.{i}."
            attns = [("self_attn", "self_attn", "norm1", "self_attn_layer_norm")]
            if stack == "decoder":
                attns.append(("cross_attn", "encoder_attn", "norm_cross",
                              "encoder_attn_layer_norm"))
            ffn_norm = "norm2"
            for a, b, norm, hf_norm in attns:
                w = reads(f"{src}{a}.qkv_proj.weight").chunk(3)  # 3 x (H*Dh, D): q, k, v
                bias = sd[f"{src}{a}.qkv_proj.bias"].chunk(3)
                for name, wi, bi in zip(("q_proj", "k_proj", "v_proj"), w, bias):
                    mapped[f"{dst}{b}.{name}.weight"], mapped[f"{dst}{b}.{name}.bias"] = wi, bi
                mapped[f"{dst}{b}.out_proj.weight"] = writes(f"{src}{a}.out_proj.weight")
                mapped[f"{dst}{b}.out_proj.bias"] = writes(f"{src}{a}.out_proj.bias")
                mapped[f"{dst}{hf_norm}.weight"] = writes(f"{src}{norm}.weight")
                mapped[f"{dst}{hf_norm}.bias"] = writes(f"{src}{norm}.bias")
            mapped[f"{dst}fc1.weight"] = reads(f"{src}ffn.w1.weight")
            mapped[f"{dst}fc1.bias"] = sd[f"{src}ffn.w1.bias"]
            mapped[f"{dst}fc2.weight"] = writes(f"{src}ffn.w2.weight")
            mapped[f"{dst}fc2.bias"] = writes(f"{src}ffn.w2.bias")
            mapped[f"{dst}final_layer_norm.weight"] = writes(f"{src}{ffn_norm}.weight")
            mapped[f"{dst}final_layer_norm.bias"] = writes(f"{src}{ffn_norm}.bias")
    load_mapped(hf, mapped)
    return hf.to(sd["head.weight"]).eval()
