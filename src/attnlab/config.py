"""Frozen, validated configuration dataclasses.

Every field is checked in ``__post_init__``; a bad value raises ``ValueError`` naming the
field, the value and what is allowed. Configs round-trip through plain dicts (JSON / TOML),
which is how checkpoints store them and how models are rebuilt.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import typing
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from .errors import ConfigError

Family = Literal["encoder_decoder", "encoder", "decoder"]
NormPlacement = Literal["post", "pre"]
NormType = Literal["layernorm", "rmsnorm"]
FFNKind = Literal["relu", "gelu", "gelu_tanh", "swiglu", "none"]
PosKind = Literal["sinusoidal", "learned", "rope"]
Pooling = Literal["cls", "mean", "max", "pooler"]
EncoderHead = Literal["classify", "mlm"]
Reduction = Literal["mean", "sum"]


MAX_LAYERS = 10_000  # a stack this deep builds in minutes; DeepNet (2022) has 1,000 layers
MAX_ELEMENTS = 2**63 - 1  # torch counts a tensor's elements in a signed 64-bit integer


def check(cond: bool, name: str, value: Any, allowed: str) -> None:
    """Raise :class:`ConfigError` ``name=value is not allowed: allowed`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{name}={value!r} is not allowed: {allowed}")


def check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an integer (not a bool) in
    ``low..high`` (``high`` None: no upper bound)."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and (
        low <= value and (high is None or value <= high))
    check(ok, name, value, f"an integer >= {low}" if high is None else
          f"an integer in {low}..{high}")


def check_literal(obj: Any, name: str, lit: Any) -> None:
    """Check that field ``name`` of ``obj`` is one of the values of Literal type ``lit``."""
    allowed = get_args(lit)
    value = getattr(obj, name)
    check(value in allowed, name, value, "one of " + ", ".join(repr(a) for a in allowed))


_type_hints = functools.cache(typing.get_type_hints)  # (each class's, evaluated once)


def check_types(obj: Any) -> None:
    """Check each field of a dataclass against its annotation (int, float, bool, str, Literal,
    ``X | None``), so a TOML typo like ``d_model = "128"`` fails with a clear message."""
    hints = _type_hints(type(obj))
    for f in fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        is_union = typing.get_origin(hint) in (typing.Union, _UnionType)
        options = get_args(hint) if is_union else (hint,)
        if value is None and type(None) in options:
            continue
        ok = False
        for opt in options:
            if typing.get_origin(opt) is Literal:  # membership is checked with a clearer message
                ok = ok or isinstance(value, type(get_args(opt)[0]))
            elif opt is float:
                ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool))
            elif opt is int:
                ok = ok or (isinstance(value, int) and not isinstance(value, bool))
            elif opt in (bool, str):
                ok = ok or isinstance(value, opt)
            elif opt is not type(None):
                ok = True  # containers etc.: validated by the owning class
        if not ok:
            names = ["str" if typing.get_origin(o) is Literal else getattr(o, "__name__", str(o))
                     for o in options]
            raise ConfigError(
                f"{f.name}={value!r} has the wrong type: expected {' or '.join(names)}"
            )


_UnionType = type(int | None)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of any of the three families.

    ``family`` picks the model: ``"encoder_decoder"`` (Vaswani et al. 2017, :class:`Transformer`),
    ``"encoder"`` (BERT-like, :class:`EncoderClassifier`, or :class:`MaskedLM` with
    ``head="mlm"``) or ``"decoder"`` (GPT-like,
    :class:`DecoderLM`). ``n_layers`` is the depth of the encoder (or of the only stack);
    ``n_decoder_layers`` that of the encoder-decoder's decoder (defaults to ``n_layers``).
    """

    family: Family = "decoder"
    vocab_size: int = 256
    tgt_vocab_size: int | None = None  # encoder-decoder only; None = same vocab as the source
    d_model: int = 128
    n_heads: int = 4
    head_dim: int | None = None  # None = d_model // n_heads
    n_layers: int = 2
    n_decoder_layers: int | None = None
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.1
    attn_dropout: float | None = None  # None = dropout
    norm: NormPlacement = "post"
    norm_type: NormType = "layernorm"
    norm_eps: float = 1e-5
    final_norm: bool | None = None  # None = True for pre-norm (needed there), False for post-norm
    embed_norm: bool = False  # LayerNorm after the embeddings (BERT)
    ffn: FFNKind = "relu"  # "none": attention-only blocks (no feed-forward sub-layer)
    pos: PosKind = "sinusoidal"
    rope_base: float = 10000.0
    max_len: int = 512
    bias: bool = True
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper, 3.4)
    tie_embeddings: bool = True  # output projection shares the (target) embedding matrix
    share_embeddings: bool = False  # encoder-decoder: source and target share one embedding
    pad_id: int | None = 0
    n_classes: int = 2  # encoder classifier
    # encoder classifier input to the head: "cls" the first token's hidden state, "mean" the
    # mean over real tokens, "max" their maximum per feature (max-over-time, as in Kim's CNN),
    # "pooler" BERT's pooler (first token -> dense D x D -> tanh)
    pooling: Pooling = "cls"
    # encoder output: "classify" (EncoderClassifier: pooling + a class head) or "mlm" (MaskedLM:
    # every token's logits over the vocabulary, BERT's masked-language-model pretraining)
    head: EncoderHead = "classify"
    init_std: float = 0.02
    init_residual_scale: bool = True  # residual output projections start at init_std/sqrt(2L)

    def __post_init__(self) -> None:
        check_types(self)
        for name, kind in (("family", Family), ("norm", NormPlacement), ("norm_type", NormType),
                           ("ffn", FFNKind), ("pos", PosKind), ("pooling", Pooling),
                           ("head", EncoderHead)):
            check_literal(self, name, kind)
        self._check_numbers()
        if self.family != "encoder_decoder":  # set there, they would be silently ignored
            for name in ("n_decoder_layers", "tgt_vocab_size"):
                v = getattr(self, name)
                check(v is None, name, v, f"None for family={self.family!r}: only an "
                      "encoder-decoder (family='encoder_decoder') has a separate decoder "
                      "stack and target vocabulary; use n_layers / vocab_size")
        if self.head_dim is None:
            check(self.d_model % self.n_heads == 0, "n_heads", self.n_heads,
                  f"a divisor of d_model={self.d_model} (or set head_dim explicitly)")
        self._resolve_defaults()
        self._check_shapes()

    def _check_numbers(self) -> None:
        """Each number in its range (sizes positive, probabilities in [0, 1), ...)."""
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_len"):
            check(getattr(self, name) > 0, name, getattr(self, name), "a positive integer")
        for name in ("tgt_vocab_size", "head_dim", "n_decoder_layers", "d_ff"):
            v = getattr(self, name)
            check(v is None or v > 0, name, v, "a positive integer or None")
        for name in ("n_layers", "n_decoder_layers"):
            check((getattr(self, name) or 0) <= MAX_LAYERS, name, getattr(self, name),
                  f"at most {MAX_LAYERS:,} layers")
        for name in ("dropout", "attn_dropout"):
            v = getattr(self, name)
            check(v is None or 0.0 <= v < 1.0, name, v, "a probability in [0, 1)")
        for name in ("norm_eps", "init_std"):
            v = getattr(self, name)
            check(math.isfinite(v) and v > 0, name, v, "a finite positive float")
        check(math.isfinite(self.rope_base) and self.rope_base > 1, "rope_base", self.rope_base,
              "a finite float > 1 (10000 in RoFormer and Llama)")
        check(self.n_classes >= 2, "n_classes", self.n_classes, "an integer >= 2")

    def _check_shapes(self) -> None:
        """What the chosen parts need of the sizes (after the derived values are set)."""
        if self.pos == "rope":
            check(self.head_dim % 2 == 0, "head_dim", self.head_dim,
                  "an even number for rope positions")
        if self.pos == "sinusoidal":
            check(self.d_model % 2 == 0, "d_model", self.d_model, "even for sinusoidal positions")
        if self.pad_id is not None:
            check(0 <= self.pad_id < min(self.vocab_size, self.tgt_vocab_size or self.vocab_size),
                  "pad_id", self.pad_id, "None or a token id inside the vocabulary")
        if self.share_embeddings:
            check(self.tgt_vocab_size in (None, self.vocab_size), "share_embeddings", True,
                  "only when tgt_vocab_size equals vocab_size")
        sides = {"vocab_size": self.vocab_size, "tgt_vocab_size": self.tgt_vocab_size or 0,
                 "d_ff": self.d_ff, "n_heads * head_dim": self.n_heads * self.head_dim,
                 "n_classes": self.n_classes, "max_len": self.max_len * (self.pos == "learned")}
        side = max(sides, key=sides.__getitem__)
        check(sides[side] * self.d_model <= MAX_ELEMENTS, side, sides[side], "sizes whose "
              f"weights a tensor holds: with d_model={self.d_model} it makes a weight of "
              f"{sides[side] * self.d_model:,} elements, more than torch counts")

    @property
    def pools_first_token(self) -> bool:
        """Whether the classifier reads the first token ([CLS]), which the data must supply."""
        return self.pooling in ("cls", "pooler")

    def _resolve_defaults(self) -> None:
        """Give every ``None = derived`` field its value, so each value has one name
        (``cfg.head_dim``, ``cfg.d_ff``, ...); :meth:`to_dict` and :meth:`replace` still treat
        those fields as unset, so a replaced ``d_model`` re-derives ``head_dim``."""
        derived = {
            "head_dim": self.d_model // self.n_heads,
            "d_ff": int(2 * 4 * self.d_model / 3) if self.ffn == "swiglu" else 4 * self.d_model,
            "attn_dropout": self.dropout,
            "final_norm": self.norm == "pre",
        }
        if self.family == "encoder_decoder":
            derived |= {"n_decoder_layers": self.n_layers, "tgt_vocab_size": self.vocab_size}
        unset = frozenset(k for k in derived if getattr(self, k) is None)
        for k in unset:
            object.__setattr__(self, k, derived[k])
        object.__setattr__(self, "_unset", unset)

    # ---- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict; derived fields that were not set stay None."""
        return {**dataclasses.asdict(self), **dict.fromkeys(self._unset)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        check_keys(cls, d, "model")
        return cls(**d)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes``; fields derived before are derived again."""
        return dataclasses.replace(self, **{**dict.fromkeys(self._unset), **changes})


# The model keys only some families read (any other family ignores them); every other key
# applies to all three. family_keys() reads this table: `train --print-config` prints a run's
# family's keys only.
FAMILY_ONLY_KEYS: dict[str, tuple[str, ...]] = {
    "encoder_decoder": ("tgt_vocab_size", "n_decoder_layers", "share_embeddings"),
    "encoder": ("n_classes", "pooling", "head"),
    "decoder": (),
}
# The model keys training fills in from the data (the tokenizer's size and pad id, the number
# of labels) unless the config gives them (Task.resolve_model).
FROM_DATA_KEYS = ("vocab_size", "tgt_vocab_size", "pad_id", "n_classes")


def family_keys(family: str) -> tuple[str, ...]:
    """The :class:`ModelConfig` keys a model of ``family`` reads, in field order."""
    others = {k for f, keys in FAMILY_ONLY_KEYS.items() if f != family for k in keys}
    return tuple(f.name for f in fields(ModelConfig) if f.name not in others)


@dataclass(frozen=True)
class LossOptions:
    """How a model's forward computes its loss: the one ``loss=`` keyword of every family.

    ``label_smoothing``: of the cross-entropy (Szegedy et al. 2016; the paper's 0.1).
    ``reduction``: ``"mean"`` over the counted targets, or ``"sum"`` (the trainer normalises
    over several micro-batches). ``loss_only``: return None for the logits and the loss
    without building them, through the model's ``head_loss`` slot where it has one (training:
    GPT-2's (B, T, 50,257) logits are never made whole, and the encoder-decoder's head never
    runs on target padding); needs targets.
    """

    label_smoothing: float = 0.0
    reduction: Reduction = "mean"
    loss_only: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        check_literal(self, "reduction", Reduction)
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", self.label_smoothing,
              "a float in [0, 1)")


DEFAULT_LOSS = LossOptions()  # the mean cross-entropy, and the logits


def check_keys(cls: type, keys: Iterable[str], section: str) -> None:
    """The one check of a config section's keys (a recipe, ``--set``, a run dir's config.json):
    :class:`ConfigError` naming the first that is no field of ``cls``, and the allowed ones."""
    allowed = sorted(f.name for f in fields(cls))
    unknown = sorted(set(keys) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown config key '{section}.{unknown[0]}'; allowed keys in "
                          f"[{section}]: {', '.join(allowed)}")
