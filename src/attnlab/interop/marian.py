"""attnlab encoder-decoder :class:`~attnlab.models.Transformer` -> ``transformers.MarianMTModel``.

MarianMT is the paper's model as Hugging Face ships it. Its sinusoid table puts the sines of
all frequencies in the first half of D and the cosines in the second, where attnlab's puts
sin and cos of one frequency side by side (paper, section 3.5); Marian rebuilds the table on
loading, so instead every weight that reads or writes the residual stream is permuted along D
(:func:`residual_order`): LayerNorm, attention and feed-forward all commute with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..config import ModelConfig, check_int
from ..models import Transformer
from .hf import TO_HF_ACTIVATION, exportable, import_transformers, unmet
from .weight_map import load_mapped


def marian_problems(cfg: ModelConfig) -> list[str]:
    """The settings a MarianMT model needs that ``cfg`` lacks, each with the value it has
    (empty: it exports): pre-norm, learned or rotary positions, RMSNorm, an embedding norm
    or no biases have no MarianMT counterpart."""
    return unmet((
        ("family='encoder_decoder'", cfg.family == "encoder_decoder", cfg.family),
        ("norm='post'", cfg.norm == "post", cfg.norm),
        ("norm_type='layernorm'", cfg.norm_type == "layernorm", cfg.norm_type),
        ("final_norm=False", not cfg.final_norm, cfg.final_norm),
        ("embed_norm=False", not cfg.embed_norm, cfg.embed_norm),
        ("pos='sinusoidal'", cfg.pos == "sinusoidal", cfg.pos),
        ("bias=True", cfg.bias, cfg.bias),
        ("head_dim=d_model/n_heads", cfg.head_dim * cfg.n_heads == cfg.d_model, cfg.head_dim),
        ("ffn relu/gelu/gelu_tanh", cfg.ffn in TO_HF_ACTIVATION, cfg.ffn),
        # MarianMT's LayerNorms have torch's default eps (its config has no field for it)
        ("norm_eps=1e-5", cfg.norm_eps == 1e-5, cfg.norm_eps),
    ))


def residual_order(d_model: int) -> Tensor:
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
    cfg = exportable(model, marian_problems, "MarianMT")
    for name, value in (("decoder_start_id", decoder_start_id), ("eos_id", eos_id)):
        if value is not None:
            check_int(name, value, 0, cfg.tgt_vocab_size - 1)  # (else generate() fails far later)
    hf = import_transformers().MarianMTModel(_marian_config(cfg, decoder_start_id, eos_id))
    load_mapped(hf, _ResidualPermuted(model).marian_weights())
    return hf.to(model.head.weight).eval()


def _marian_config(cfg: ModelConfig, decoder_start_id: int | None, eos_id: int | None) -> Any:
    """The ``transformers.MarianConfig`` of an exportable ``cfg`` (see :func:`marian_to_hf`)."""
    pad = 0 if cfg.pad_id is None else cfg.pad_id
    return import_transformers().MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.tgt_vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_layers, decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function=TO_HF_ACTIVATION[cfg.ffn], dropout=cfg.dropout,
        attention_dropout=cfg.attn_dropout, activation_dropout=cfg.dropout,
        max_position_embeddings=cfg.max_len, scale_embedding=cfg.scale_embeddings,
        share_encoder_decoder_embeddings=cfg.share_embeddings,
        tie_word_embeddings=cfg.tie_embeddings, pad_token_id=pad,
        decoder_start_token_id=pad if decoder_start_id is None else decoder_start_id,
        eos_token_id=eos_id, forced_eos_token_id=eos_id, bos_token_id=None,
    )


# the sublayers of a layer, attnlab name -> Marian name: attention, then its norm
SELF_ATTN = ("self_attn", "self_attn", "norm1", "self_attn_layer_norm")
CROSS_ATTN = ("cross_attn", "encoder_attn", "norm_cross", "encoder_attn_layer_norm")


class _ResidualPermuted:
    """The weights of an attnlab :class:`Transformer` under Marian's names, each permuted
    along D by :func:`residual_order` where it reads or writes the residual stream."""

    def __init__(self, model: Transformer):
        self.model = model
        self.cfg = model.config
        self.sd = model.state_dict()
        self.order = residual_order(self.cfg.d_model)

    def reads(self, name: str) -> Tensor:
        """An (out, D) weight applied to the residual stream: its columns permuted."""
        return self.sd[name][:, self.order]

    def writes(self, name: str) -> Tensor:
        """A (D, in) weight, a (D,) bias or norm, writing into the stream: its rows permuted."""
        return self.sd[name][self.order]

    def marian_weights(self) -> dict[str, Tensor]:
        """Every parameter of the MarianMTModel, by name."""
        cfg = self.cfg
        src_tok, tgt_tok = self.reads("src_emb.tok.weight"), self.reads("tgt_emb.tok.weight")
        table = self.model.src_emb.pos.table[: cfg.max_len, self.order]  # (sin | cos) layout
        mapped = {
            "final_logits_bias": src_tok.new_zeros(1, cfg.tgt_vocab_size),  # attnlab: no bias
            "model.encoder.embed_tokens.weight": src_tok,
            "model.decoder.embed_tokens.weight": tgt_tok,
            "model.encoder.embed_positions.weight": table,
            "model.decoder.embed_positions.weight": table,
            "lm_head.weight": self.reads("head.weight"),
        }
        if cfg.share_embeddings:
            mapped["model.shared.weight"] = src_tok
        for stack, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
            sublayers = (SELF_ATTN, CROSS_ATTN) if stack == "decoder" else (SELF_ATTN,)
            for i in range(n_layers):
                src, dst = f"{stack}.layers.{i}.", f"model.{stack}.layers.{i}."
                for names in sublayers:
                    mapped |= self.attention(src, dst, *names)
                mapped |= self.feed_forward(src, dst)
        return mapped

    def attention(self, src: str, dst: str, ours: str, theirs: str, norm: str,
                  their_norm: str) -> dict[str, Tensor]:
        """One attention sublayer and the LayerNorm after it."""
        w = self.reads(f"{src}{ours}.qkv_proj.weight").chunk(3)  # (3*H*Dh, D) -> q, k, v
        bias = self.sd[f"{src}{ours}.qkv_proj.bias"].chunk(3)
        out: dict[str, Tensor] = {}
        for name, wi, bi in zip(("q_proj", "k_proj", "v_proj"), w, bias):
            out[f"{dst}{theirs}.{name}.weight"], out[f"{dst}{theirs}.{name}.bias"] = wi, bi
        for p in ("weight", "bias"):
            out[f"{dst}{theirs}.out_proj.{p}"] = self.writes(f"{src}{ours}.out_proj.{p}")
            out[f"{dst}{their_norm}.{p}"] = self.writes(f"{src}{norm}.{p}")
        return out

    def feed_forward(self, src: str, dst: str) -> dict[str, Tensor]:
        """The feed-forward sublayer and the LayerNorm after it."""
        return {
            f"{dst}fc1.weight": self.reads(f"{src}ffn.w1.weight"),
            f"{dst}fc1.bias": self.sd[f"{src}ffn.w1.bias"],
            f"{dst}fc2.weight": self.writes(f"{src}ffn.w2.weight"),
            f"{dst}fc2.bias": self.writes(f"{src}ffn.w2.bias"),
            f"{dst}final_layer_norm.weight": self.writes(f"{src}norm2.weight"),
            f"{dst}final_layer_norm.bias": self.writes(f"{src}norm2.bias"),
        }
