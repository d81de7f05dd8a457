"""BERT (``BertModel``, ``BertForSequenceClassification``) <-> attnlab
:class:`~attnlab.models.EncoderClassifier`.

BERT's pooler (dense + tanh on [CLS]) is attnlab's ``pooling="pooler"``, its classifier
attnlab's ``head``. Segment embedding 0 is folded into the learned position table, so
single-segment inputs (``token_type_ids`` all 0) are reproduced and sentence pairs are not;
an export gets zero segment embeddings. Only BERT's own layout exports (:func:`bert_problems`).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..config import ModelConfig
from ..errors import ConfigError, RunError
from ..models import EncoderClassifier
from .hf import (
    TO_HF_ACTIVATION,
    attnlab_activation,
    check_model_type,
    exportable,
    import_transformers,
    load_hf_model,
    read_hf_config,
    read_hf_weights,
    unmet,
)
from .weight_map import layer_norm_weights, layer_weights, linear_weights, load_mapped

CLASSIFIER = "BertForSequenceClassification"
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")  # the hidden_act values read


def bert_config(hf_config: Any, *, n_classes: int = 2, pooling: str = "cls",
                dropout: float = 0.0) -> ModelConfig:
    """attnlab :class:`ModelConfig` (family ``"encoder"``) of a ``transformers.BertConfig``.

    Raises:
        ValueError: relative position embeddings, a decoder BERT, or an unsupported activation.
    """
    check_model_type(hf_config, "bert", "BERT")
    pos_type = getattr(hf_config, "position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise RunError(f"BERT with position_embedding_type={pos_type!r} is not supported: "
                       f"attnlab has absolute learned positions only")
    if getattr(hf_config, "is_decoder", False):
        raise RunError("BERT with is_decoder=True is not supported: convert an encoder BERT")
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
        ffn=attnlab_activation(hf_config.hidden_act, ACTIVATIONS),
        pos="learned",
        max_len=hf_config.max_position_embeddings,
        bias=True,
        scale_embeddings=False,
        tie_embeddings=False,
        pad_id=hf_config.pad_token_id,
        n_classes=n_classes,
        pooling=pooling,  # type: ignore[arg-type]  # validated by ModelConfig
    )


def bert_labels(hf_config: Any) -> list[str]:
    """The class names of a ``BertForSequenceClassification`` config, in id order
    (``config.id2label``; ``transformers`` fills in ``LABEL_0, LABEL_1, ...``)."""
    id2label = getattr(hf_config, "id2label", None) or {}
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}")))
            for i in range(hf_config.num_labels)]


def _bert_model(model_or_dir: Any) -> Any:
    """A ``transformers`` BERT: the model itself, or loaded from a directory as the class its
    ``config.json`` names, or as a classifier where its weights hold one (a config saved
    without ``architectures``): ``BertForSequenceClassification`` keeps its head."""
    if not isinstance(model_or_dir, (str, os.PathLike)):
        return model_or_dir
    archs = read_hf_config(model_or_dir).get("architectures") or []
    sd = read_hf_weights(model_or_dir)
    head = CLASSIFIER in archs or (not archs and "classifier.weight" in sd)
    return load_hf_model(model_or_dir, CLASSIFIER if head else "BertModel", sd)


def bert_classifier_from_hf(model_or_dir: Any, *, n_classes: int | None = None,
                            pooling: str | None = None, dropout: float = 0.0,
                            ) -> tuple[EncoderClassifier, list[str] | None]:
    """An attnlab :class:`EncoderClassifier` (eval mode) from a BERT, and its class names.

    Args:
        model_or_dir: a ``transformers.BertModel`` or ``BertForSequenceClassification``, or a
            local directory saved from one (``config.json`` + weights, read offline).
        n_classes: of the head; default: the checkpoint's labels, or 2 for a ``BertModel``.
        pooling: default ``"pooler"`` for a classifier (its head reads BERT's pooler, so no
            other value is allowed), ``"cls"`` for a ``BertModel`` (``"pooler"`` keeps its
            pooler weights).
        dropout: attnlab's dropout (0 reproduces HF's eval mode).

    Returns:
        The model and, for a ``BertForSequenceClassification``, :func:`bert_labels` (None for
        a ``BertModel``, whose head is freshly initialised). The logits equal HF's for
        ``attention_mask=mask`` and ``token_type_ids`` all 0; ``hidden_states(ids, mask)``
        equals HF's ``last_hidden_state`` at the real positions.

    Raises:
        ValueError: another BERT head (masked LM, ...), a regression head, a ``pooling`` or
            ``n_classes`` that contradicts the checkpoint's head, an unsupported setting.
    """
    model = _bert_model(model_or_dir)
    head = getattr(model, "classifier", None)
    if head is not None and hasattr(model, "bert"):
        labels = bert_labels(model.config)
        if len(labels) < 2 or getattr(model.config, "problem_type", None) == "regression":
            raise RunError(f"{CLASSIFIER} with num_labels={len(labels)} is a regression "
                           "head: attnlab classifies into 2 or more classes")
        if getattr(model.config, "problem_type", None) == "multi_label_classification":
            raise RunError(f"{CLASSIFIER} with problem_type='multi_label_classification' "
                           "scores each label on its own (sigmoid): attnlab's classifier "
                           "picks one class of several (softmax)")
        if pooling not in (None, "pooler"):
            raise ValueError(f"pooling={pooling!r} is not allowed for a {CLASSIFIER}: its "
                             "head reads BERT's pooler; allowed: 'pooler'")
        if n_classes not in (None, len(labels)):
            raise ConfigError(f"n_classes={n_classes} contradicts the checkpoint's head of "
                              f"{len(labels)} labels {labels}")
        clf = _convert(model.bert, len(labels), "pooler", dropout, head)
        return clf, labels
    if hasattr(model, "bert"):
        raise ValueError(f"got {type(model).__name__}: only BertModel and {CLASSIFIER} convert; "
                         f"pass its encoder (`model.bert`) to convert the encoder weights")
    if not (hasattr(model, "embeddings") and hasattr(model, "encoder")):
        raise ValueError(f"expected a BertModel or {CLASSIFIER}, got {type(model).__name__}")
    if n_classes is not None and (not isinstance(n_classes, int) or n_classes < 2):
        raise ValueError(f"n_classes={n_classes!r} is not allowed: an integer >= 2 (or None: 2)")
    return _convert(model, n_classes or 2, pooling or "cls", dropout, None), None


def bert_from_hf(model_or_dir: Any, *, n_classes: int | None = None, pooling: str | None = None,
                 dropout: float = 0.0) -> EncoderClassifier:
    """:func:`bert_classifier_from_hf` without the class names (see there for the arguments):
    a ``BertModel`` gets a fresh head, a ``BertForSequenceClassification`` keeps its own."""
    return bert_classifier_from_hf(model_or_dir, n_classes=n_classes, pooling=pooling,
                                   dropout=dropout)[0]


# One encoder layer, attnlab name -> BERT name, both directions; q/k/v are one stacked
# matrix in attnlab and three in BERT, so they are mapped apart.
LINEAR_NAMES = {"self_attn.out_proj": "attention.output.dense", "ffn.w1": "intermediate.dense",
                "ffn.w2": "output.dense"}
NORM_NAMES = {"norm1": "attention.output.LayerNorm", "norm2": "output.LayerNorm"}


def _convert(bert: Any, n_classes: int, pooling: str, dropout: float,
             head: Any) -> EncoderClassifier:
    """attnlab classifier from a ``BertModel`` (``bert``) and an optional HF ``head``."""
    cfg = bert_config(bert.config, n_classes=n_classes, pooling=pooling, dropout=dropout)
    sd = bert.state_dict()
    tok_type = sd["embeddings.token_type_embeddings.weight"][0]  # segment 0 for every token
    mapped = {
        "emb.tok.weight": sd["embeddings.word_embeddings.weight"],
        "emb.pos.weight": sd["embeddings.position_embeddings.weight"] + tok_type,
        **layer_norm_weights(sd, "embeddings.LayerNorm", "emb.norm"),
    }
    for i in range(cfg.n_layers):
        src, dst = f"encoder.layer.{i}.", f"encoder.layers.{i}."
        qkv = [f"{src}attention.self.{n}" for n in ("query", "key", "value")]
        mapped[dst + "self_attn.qkv_proj.weight"] = torch.cat([sd[n + ".weight"] for n in qkv])
        mapped[dst + "self_attn.qkv_proj.bias"] = torch.cat([sd[n + ".bias"] for n in qkv])
        mapped |= layer_weights(sd, src, dst, linears=LINEAR_NAMES, norms=NORM_NAMES,
                                to_hf=False)
    keep = ["head."]
    if pooling == "pooler":
        if "pooler.dense.weight" in sd:  # a BertModel built without its pooler: a fresh one
            mapped |= linear_weights(sd, "pooler.dense", "pooler")
        else:
            keep.append("pooler.")
    if head is not None:
        mapped |= {"head.weight": head.weight, "head.bias": head.bias}
    clf = EncoderClassifier(cfg)
    load_mapped(clf, mapped, keep=keep)
    return clf.to(sd["embeddings.word_embeddings.weight"]).eval()


def bert_problems(cfg: ModelConfig) -> list[str]:
    """The settings a ``BertForSequenceClassification`` needs that ``cfg`` lacks, each with
    the value it has (empty: it exports)."""
    return unmet((
        ("family='encoder'", cfg.family == "encoder", cfg.family),
        ("head='classify'", cfg.head == "classify", cfg.head),
        ("norm='post'", cfg.norm == "post", cfg.norm),
        ("norm_type='layernorm'", cfg.norm_type == "layernorm", cfg.norm_type),
        ("final_norm=False", not cfg.final_norm, cfg.final_norm),
        ("embed_norm=True", cfg.embed_norm, cfg.embed_norm),
        ("pos='learned'", cfg.pos == "learned", cfg.pos),
        ("scale_embeddings=False", not cfg.scale_embeddings, cfg.scale_embeddings),
        ("bias=True", cfg.bias, cfg.bias),
        ("head_dim=d_model/n_heads", cfg.head_dim * cfg.n_heads == cfg.d_model, cfg.head_dim),
        ("ffn relu/gelu/gelu_tanh", cfg.ffn in TO_HF_ACTIVATION, cfg.ffn),
        ("pooling='pooler'", cfg.pooling == "pooler", cfg.pooling),
    ))


def bert_to_hf(model: EncoderClassifier, label_names: list[str] | None = None) -> Any:
    """A ``transformers.BertForSequenceClassification`` (eval mode, same dtype and device)
    with the weights of a BERT-shaped attnlab :class:`EncoderClassifier`.

    Args:
        model: post-norm, embedding LayerNorm, learned positions, biases, ``pooling="pooler"``
            (as :func:`bert_from_hf` makes them; see :func:`bert_problems`).
        label_names: the class names, stored as ``id2label`` / ``label2id``; default
            ``LABEL_0, LABEL_1, ...``.

    Returns:
        The HF model; its logits for ``attention_mask=mask`` (and ``token_type_ids`` 0)
        equal ``model(ids, mask=mask)[0]``.

    Raises:
        ValueError: one line naming the settings that BERT cannot express, or label names
            that do not match ``n_classes``.
    """
    cfg = exportable(model, bert_problems, CLASSIFIER)
    names = [f"LABEL_{i}" for i in range(cfg.n_classes)] if label_names is None \
        else [str(n) for n in label_names]
    if len(names) != cfg.n_classes or len(set(names)) != len(names):
        raise RunError(f"label_names={names} must be {cfg.n_classes} distinct names, one "
                       "per class")
    tf = import_transformers()
    hf_config = tf.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff,
        hidden_act=TO_HF_ACTIVATION[cfg.ffn], hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attn_dropout, max_position_embeddings=cfg.max_len,
        type_vocab_size=2, layer_norm_eps=cfg.norm_eps,
        pad_token_id=0 if cfg.pad_id is None else cfg.pad_id, num_labels=cfg.n_classes,
        id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
    )
    hf = tf.BertForSequenceClassification(hf_config)
    sd = model.state_dict()
    d = cfg.d_model
    mapped = {
        "bert.embeddings.word_embeddings.weight": sd["emb.tok.weight"],
        "bert.embeddings.position_embeddings.weight": sd["emb.pos.weight"],
        # segment 0 is already inside the position table (see the module docstring)
        "bert.embeddings.token_type_embeddings.weight": sd["emb.tok.weight"].new_zeros(2, d),
        **layer_norm_weights(sd, "emb.norm", "bert.embeddings.LayerNorm"),
        **linear_weights(sd, "pooler", "bert.pooler.dense"),
        **linear_weights(sd, "head", "classifier"),
    }
    for i in range(cfg.n_layers):
        src, dst = f"encoder.layers.{i}.", f"bert.encoder.layer.{i}."
        qkv_w = sd[src + "self_attn.qkv_proj.weight"].split(d)  # (3D, D) -> q, k, v (D, D)
        qkv_b = sd[src + "self_attn.qkv_proj.bias"].split(d)
        for name, w, b in zip(("query", "key", "value"), qkv_w, qkv_b):
            mapped[f"{dst}attention.self.{name}.weight"] = w
            mapped[f"{dst}attention.self.{name}.bias"] = b
        mapped |= layer_weights(sd, src, dst, linears=LINEAR_NAMES, norms=NORM_NAMES,
                                to_hf=True)
    load_mapped(hf, mapped)
    return hf.to(sd["emb.tok.weight"]).eval()
