"""BERT (``BertModel``) -> attnlab :class:`~attnlab.models.EncoderClassifier`.

What attnlab does not have, and how the converters deal with it:

* BERT segment ids: ``token_type_embeddings[0]`` is folded into the learned position table,
  so attnlab reproduces BERT for single-segment inputs (``token_type_ids`` all 0, the
  default). Sentence pairs with segment 1 are not reproduced.
* BERT's pooler (dense + tanh on [CLS]) and task heads: not converted. ``bert_from_hf``
  returns an :class:`~attnlab.models.EncoderClassifier` whose classification head is freshly
  initialised; use :meth:`~attnlab.models.EncoderClassifier.hidden_states` for features.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig
from ..models import EncoderClassifier
from ._load import load_mapped
from .hf import _activation, _linear, _load, _norm


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
