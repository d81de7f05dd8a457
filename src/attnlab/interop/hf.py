"""Convert Hugging Face ``transformers`` GPT-2 and BERT checkpoints to and from attnlab.

``transformers`` is imported lazily (``pip install attnlab[hf]``). The converted models
compute the same function as the originals in eval mode (tested to 1e-4 in fp32, on random
weights and on the real all-MiniLM-L6-v2 checkpoint).

What attnlab does not have, and how the converters deal with it:

* BERT segment ids: ``token_type_embeddings[0]`` is folded into the learned position table,
  so attnlab reproduces BERT for single-segment inputs (``token_type_ids`` all 0, the
  default). Sentence pairs with segment 1 are not reproduced.
* BERT's pooler (dense + tanh on [CLS]) and task heads: not converted. ``bert_from_hf``
  returns an :class:`~attnlab.models.EncoderClassifier` whose classification head is freshly
  initialised; use :meth:`~attnlab.models.EncoderClassifier.hidden_states` for features.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..models import DecoderLM, EncoderClassifier
from ._load import load_mapped

_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh formula, written differently
    "gelu": "gelu",
    "relu": "relu",
}
_TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "Hugging Face interop needs transformers: pip install attnlab[hf]"
        ) from e
    return transformers


def _load(model_or_dir: Any, cls_name: str) -> nn.Module:
    """``model_or_dir`` itself, or ``transformers.<cls_name>`` loaded from a local directory."""
    if not isinstance(model_or_dir, (str, os.PathLike)):
        return model_or_dir
    path = Path(model_or_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory: no config.json")
    return getattr(_transformers(), cls_name).from_pretrained(path, local_files_only=True)


def _activation(name: str, allowed: tuple[str, ...]) -> str:
    if name not in allowed:
        raise ValueError(f"activation {name!r} is not supported: one of {', '.join(allowed)}")
    return _ACTIVATIONS[name]


def _linear(sd: dict[str, Tensor], src: str, dst: str, conv1d: bool = False) -> dict[str, Tensor]:
    """nn.Linear ``src`` -> ``dst``; GPT-2's Conv1D stores the weight (in, out): transpose."""
    w = sd[f"{src}.weight"]
    return {f"{dst}.weight": w.t() if conv1d else w, f"{dst}.bias": sd[f"{src}.bias"]}


def _norm(sd: dict[str, Tensor], src: str, dst: str) -> dict[str, Tensor]:
    return {f"{dst}.weight": sd[f"{src}.weight"], f"{dst}.bias": sd[f"{src}.bias"]}


# ---- GPT-2 ----------------------------------------------------------------------------------
def gpt2_config(hf_config: Any, dropout: float = 0.0) -> ModelConfig:
    """attnlab :class:`ModelConfig` of a ``transformers.GPT2Config``.

    Raises:
        ValueError: settings attnlab cannot reproduce (no or layer-dependent attention scaling,
            reordered/upcast attention, cross-attention, an unsupported activation).
    """
    if getattr(hf_config, "model_type", None) != "gpt2":
        raise ValueError(f"expected a GPT-2 config, got model_type={hf_config.model_type!r}")
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


def gpt2_to_hf(model: DecoderLM) -> Any:
    """A ``transformers.GPT2LMHeadModel`` with the weights of an attnlab :class:`DecoderLM`
    (in eval mode, same dtype and device) — e.g. to benchmark HF on identical weights.

    Raises:
        ValueError: the model is not GPT-2 shaped (pre-norm layernorm with a final norm,
            learned positions, biases, unscaled embeddings, no embedding norm, Dh = D / H,
            relu/gelu/gelu_tanh feed-forward).
    """
    cfg = model.config
    problems = [
        what for what, ok in (
            ("norm='pre'", cfg.norm == "pre"),
            ("norm_type='layernorm'", cfg.norm_type == "layernorm"),
            ("a final norm", cfg.use_final_norm), ("pos='learned'", cfg.pos == "learned"),
            ("bias=True", cfg.bias), ("scale_embeddings=False", not cfg.scale_embeddings),
            ("embed_norm=False", not cfg.embed_norm),
            ("head_dim=d_model/n_heads", cfg.dh * cfg.n_heads == cfg.d_model),
            ("ffn relu/gelu/gelu_tanh", cfg.ffn in _TO_HF_ACTIVATION),
        ) if not ok
    ]
    if problems:
        raise ValueError(f"this DecoderLM cannot be expressed as GPT-2: it needs {problems}")
    tf = _transformers()
    hf_config = tf.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model,
        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.ff_dim,
        activation_function=_TO_HF_ACTIVATION[cfg.ffn], resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout, attn_pdrop=cfg.p_attn, layer_norm_epsilon=cfg.norm_eps,
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


# ---- BERT -----------------------------------------------------------------------------------
def bert_config(hf_config: Any, *, n_classes: int = 2, pooling: str = "cls",
                dropout: float = 0.0) -> ModelConfig:
    """attnlab :class:`ModelConfig` (family ``"encoder"``) of a ``transformers.BertConfig``.

    Raises:
        ValueError: relative position embeddings, a decoder BERT, or an unsupported activation.
    """
    if getattr(hf_config, "model_type", None) != "bert":
        raise ValueError(f"expected a BERT config, got model_type={hf_config.model_type!r}")
    pos_type = getattr(hf_config, "position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ValueError(f"BERT with position_embedding_type={pos_type!r} is not supported: "
                         f"attnlab has absolute learned positions only")
    if getattr(hf_config, "is_decoder", False):
        raise ValueError("BERT with is_decoder=True is not supported: convert an encoder BERT")
    return ModelConfig(
        family="encoder",
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        n_heads=hf_config.num_attention_heads,
        n_layers=hf_config.num_hidden_layers,
        d_ff=hf_config.intermediate_size,
        dropout=dropout,
        norm="post",
        norm_eps=hf_config.layer_norm_eps,
        final_norm=False,
        embed_norm=True,
        ffn=_activation(hf_config.hidden_act, ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")),
        pos="learned",
        max_len=hf_config.max_position_embeddings,
        bias=True,
        scale_embeddings=False,
        tie_embeddings=False,
        pad_id=hf_config.pad_token_id,
        n_classes=n_classes,
        pooling=pooling,  # type: ignore[arg-type]  # validated by ModelConfig
    )


def bert_from_hf(model_or_dir: Any, *, n_classes: int = 2, pooling: str = "cls",
                 dropout: float = 0.0) -> EncoderClassifier:
    """An attnlab :class:`EncoderClassifier` (in eval mode) with the encoder weights of a
    ``BertModel``.

    Args:
        model_or_dir: a ``transformers.BertModel`` or a local directory with ``config.json``
            and weights (loaded as ``BertModel``, offline; task heads in the checkpoint are
            dropped by ``transformers``).
        n_classes, pooling: of the attnlab classification head, which is freshly initialised.
        dropout: attnlab's dropout (0 reproduces HF's eval mode).

    ``hidden_states(ids, mask)`` equals HF's ``last_hidden_state`` for ``attention_mask=mask``
    and ``token_type_ids`` all 0, at the real (unmasked) positions.
    """
    model = _load(model_or_dir, "BertModel")
    if hasattr(model, "bert"):
        raise ValueError(
            f"got {type(model).__name__}: BERT's tanh pooler and task heads have no attnlab "
            f"counterpart; pass its encoder (`model.bert`) to convert the encoder weights"
        )
    if not (hasattr(model, "embeddings") and hasattr(model, "encoder")):
        raise ValueError(f"expected a BertModel, got {type(model).__name__}")
    cfg = bert_config(model.config, n_classes=n_classes, pooling=pooling, dropout=dropout)
    sd = model.state_dict()
    tok_type = sd["embeddings.token_type_embeddings.weight"][0]  # segment 0 for every token
    mapped = {
        "emb.tok.weight": sd["embeddings.word_embeddings.weight"],
        "emb.pos.weight": sd["embeddings.position_embeddings.weight"] + tok_type,
        **_norm(sd, "embeddings.LayerNorm", "emb.norm"),
    }
    for i in range(cfg.n_layers):
        src, dst = f"encoder.layer.{i}.", f"encoder.layers.{i}."
        qkv = [f"{src}attention.self.{n}" for n in ("query", "key", "value")]
        mapped[dst + "self_attn.qkv_proj.weight"] = torch.cat([sd[n + ".weight"] for n in qkv])
        mapped[dst + "self_attn.qkv_proj.bias"] = torch.cat([sd[n + ".bias"] for n in qkv])
        mapped |= _linear(sd, src + "attention.output.dense", dst + "self_attn.out_proj")
        mapped |= _norm(sd, src + "attention.output.LayerNorm", dst + "norm1")
        mapped |= _linear(sd, src + "intermediate.dense", dst + "ffn.w1")
        mapped |= _linear(sd, src + "output.dense", dst + "ffn.w2")
        mapped |= _norm(sd, src + "output.LayerNorm", dst + "norm2")
    clf = EncoderClassifier(cfg)
    load_mapped(clf, mapped, keep=("head.",))
    return clf.to(sd["embeddings.word_embeddings.weight"]).eval()
