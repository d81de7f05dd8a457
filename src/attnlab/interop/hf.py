"""What the Hugging Face ``transformers`` converters share: the lazy import, reading a local
model directory safely, and the activation names.

A directory is read here, never by ``from_pretrained``: ``config.json``, then the weights
through safetensors or ``torch.load(weights_only=True)`` (a pickle that holds code is refused,
never run), loaded strictly, so a missing or misshapen tensor is an error, not a random weight.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..errors import MissingDependencyError, MissingFileError, RunError, UsageError

log = logging.getLogger(__name__)
CONFIG_FILE = "config.json"  # a Hugging Face model directory's, not a run dir's
# weight files of a model directory, in the order they are looked for
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")

# transformers' activation names -> attnlab's ffn, and back
FROM_HF_ACTIVATION = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh formula, written differently
    "gelu": "gelu",
    "relu": "relu",
}
TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def unmet(checks: Iterable[tuple[str, bool, Any]]) -> list[str]:
    """The settings an export needs that a config lacks: ``"what (got value)"`` for each
    ``(what, ok, value)`` of ``checks`` whose ``ok`` is False (empty: it exports)."""
    return [f"{what} (got {got!r})" for what, ok, got in checks if not ok]


def exportable(model: nn.Module, problems: Callable[[ModelConfig], list[str]],
               target: str) -> ModelConfig:
    """The config of ``model``, once ``problems`` (a format's ``*_problems``) finds nothing it
    lacks for ``target``; else one line naming every setting the format needs."""
    cfg = attnlab_config(model)
    missing = problems(cfg)
    if missing:
        kind = cfg.family.replace("_", "-")
        raise UsageError(f"this {kind} cannot be exported as {target}: it needs "
                         f"{', '.join(missing)}")
    return cfg


def layernorm_decoder_problems(cfg: ModelConfig, pos: str) -> list[str]:
    """The settings a pre-norm LayerNorm decoder checkpoint with ``pos`` positions (GPT-2:
    ``"learned"``, GPT-NeoX: ``"rope"``) needs that ``cfg`` lacks (empty: it exports)."""
    return unmet((
        ("family='decoder'", cfg.family == "decoder", cfg.family),
        ("norm='pre'", cfg.norm == "pre", cfg.norm),
        ("norm_type='layernorm'", cfg.norm_type == "layernorm", cfg.norm_type),
        ("final_norm=True", cfg.final_norm, cfg.final_norm),
        (f"pos={pos!r}", cfg.pos == pos, cfg.pos),
        ("scale_embeddings=False", not cfg.scale_embeddings, cfg.scale_embeddings),
        ("embed_norm=False", not cfg.embed_norm, cfg.embed_norm),
        ("head_dim=d_model/n_heads", cfg.head_dim * cfg.n_heads == cfg.d_model, cfg.head_dim),
        ("ffn relu/gelu/gelu_tanh/none", cfg.ffn in TO_HF_ACTIVATION or cfg.ffn == "none",
         cfg.ffn),
    ))


def with_zero_ffn(model: nn.Module, ffn: str) -> nn.Module:
    """An attention-only model (``ffn="none"``) as one with a feed-forward block of width 1
    (``ffn``) whose weights are all zero: it adds exactly 0 to the residual stream, so the
    outputs are the same, and a format that has no attention-only blocks (GPT-2, Llama,
    GPT-NeoX) can hold it. Any other model is returned as it is."""
    cfg = model.config
    if cfg.ffn != "none":
        return model
    wider = type(model)(cfg.replace(ffn=ffn, d_ff=1)).to(next(model.parameters()))
    missing, unexpected = wider.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(".ffn." in k or ".norm2." in k for k in missing), missing
    with torch.no_grad():
        for layer in wider.decoder.layers:
            for p in layer.ffn.parameters():
                p.zero_()
    return wider.eval()


def attnlab_config(model: Any) -> ModelConfig:
    """The :class:`ModelConfig` of an attnlab model, or a TypeError naming what was passed
    instead (a ``transformers`` model goes the other way: ``*_from_hf``)."""
    cfg = getattr(model, "config", None)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"expected an attnlab model (DecoderLM, EncoderClassifier, MaskedLM, "
                        f"Transformer), got {type(model).__name__}")
    return cfg


def check_model_type(hf_config: Any, model_type: str, what: str) -> None:
    """Raise a ValueError unless ``hf_config`` is a ``transformers`` config of ``model_type``
    (``what`` names the architecture in the message)."""
    got = getattr(hf_config, "model_type", None)
    if got != model_type:
        shown = f"model_type={got!r}" if got is not None else (
            f"a {type(hf_config).__name__} (a transformers config is needed, e.g. "
            "transformers.AutoConfig.from_pretrained(folder))")
        raise ValueError(f"expected a {what} config, got {shown}")


def import_transformers() -> Any:
    """The ``transformers`` module, imported on first use (an optional extra)."""
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError(
            "Hugging Face interop needs transformers: pip install 'attnlab[hf]'"
        ) from e
    return transformers


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face model directory, as a dict.

    Raises:
        FileNotFoundError: ``path`` is not a directory, or has no ``config.json``.
        ValueError: the file is not a JSON object.
    """
    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(f"{path} is not a directory (give a Hugging Face model folder "
                               f"with {CONFIG_FILE} and weights)")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise MissingFileError(f"{path} is not a Hugging Face model directory: no {CONFIG_FILE}")
    cfg = _read_json(file)
    if not isinstance(cfg, dict):
        raise RunError(f"{file} must hold a JSON object, got {type(cfg).__name__}")
    return cfg


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{file} is not valid JSON ({e})") from None


def read_optional_json(file: Path) -> dict[str, Any]:
    """A JSON object file of a model directory that may be absent (then ``{}``).

    Raises:
        ValueError: the file exists but is not valid JSON.
    """
    d = _read_json(file) if file.is_file() else {}
    return d if isinstance(d, dict) else {}


def _read_file(file: Path) -> dict[str, Tensor]:
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(file))
        except (SafetensorError, OSError) as e:
            raise RunError(f"{file} is not a readable safetensors file ({e})") from None
    try:  # never an unrestricted unpickle: tensors and plain containers only
        with warnings.catch_warnings():  # torch warns about pickle protocols: the error says it
            warnings.simplefilter("ignore")
            sd = torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, TypeError, KeyError,
            IndexError, ValueError) as e:  # (KeyError, IndexError: junk read as pickle opcodes)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "Unsupported" in ln), lines[0] if lines else "")
        raise RunError(f"{file} is refused: torch.load(weights_only=True) reads tensors only, "
                       f"and this file holds more ({why[:200]}); convert it to "
                       "model.safetensors with a tool you trust") from None
    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise RunError(f"{file} does not hold a dict of tensors (a state dict)")
    return sd


def read_hf_weights(path: str | os.PathLike) -> dict[str, Tensor]:
    """All weights of a Hugging Face model directory: name -> tensor (CPU).

    Raises:
        FileNotFoundError: none of the weight files (``model.safetensors``,
            ``pytorch_model.bin`` or their sharded ``.index.json`` forms) is there.
        ValueError: a file that cannot be read safely (a pickle holding more than tensors,
            a damaged file).
    """
    path = Path(path)
    for name in WEIGHT_FILES:
        file = path / name
        if not file.is_file():
            continue
        if not name.endswith(".index.json"):
            return _read_file(file)
        try:  # sharded: {"weight_map": {tensor name: shard file}}
            shards = sorted(set(_read_json(file)["weight_map"].values()))
            bad = [s for s in shards if not isinstance(s, str) or Path(s).name != s]
            if bad:
                raise ValueError(f"shard names must be file names in the folder, got {bad[:3]}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RunError(f"{file} is not a valid shard index ({e})") from None
        sd: dict[str, Tensor] = {}
        for shard in shards:
            if not (path / shard).is_file():
                raise MissingFileError(f"{file} lists shard {shard}, which is missing")
            sd |= _read_file(path / shard)
        return sd
    raise MissingFileError(f"{path} has no weights: expected one of {', '.join(WEIGHT_FILES)}")


# tensors of checkpoints that no current model has (old fixed buffers): skipped silently
_STALE = (".attn.bias", ".attn.masked_bias", "position_ids", "rotary_emb.inv_freq")


def load_hf_state(model: nn.Module, sd: dict[str, Tensor], where: str = "the checkpoint",
                  optional: tuple[str, ...] = ()) -> None:
    """Load a checkpoint's ``sd`` into a freshly built ``transformers`` ``model``, strictly.

    Names may carry the base-model prefix or not (``transformer.h.0...`` or ``h.0...``).
    Tensors the model does not have (another task's head) are skipped with a log line;
    parameters under an ``optional`` prefix (that no converter reads) may be absent.

    Raises:
        ValueError: a parameter of the model is missing from ``sd``, or a shape differs from
            what the model's config implies.
    """
    own = model.state_dict()
    base = getattr(model, "base_model_prefix", "")

    def own_name(key: str) -> str | None:  # with or without the base-model prefix
        if key in own:
            return key
        if base and f"{base}.{key}" in own:
            return f"{base}.{key}"
        if base and key.startswith(base + ".") and key[len(base) + 1:] in own:
            return key[len(base) + 1:]
        return None

    mapped: dict[str, Tensor] = {}
    skipped = []
    for key, tensor in sd.items():
        name = own_name(key)
        if name is None:
            if own_name(re.sub(r"\.\d+\.", ".0.", key, count=1)) is not None:
                raise RunError(f"{where} has weight {key!r} of a layer that config.json does "
                               "not have: does its layer count belong to these weights?")
            if not key.endswith(_STALE):
                skipped.append(key)
            continue
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise RunError(f"{where}: weight {key!r} has shape {tuple(tensor.shape)}, but the "
                           f"config implies {tuple(own[name].shape)} (do the weights belong "
                           "to this config.json?)")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise RunError(f"{where}: weight {key!r} holds NaN or inf values (a damaged or "
                           "diverged checkpoint)")
        mapped[name] = tensor
    params = dict(model.named_parameters())  # tied parameters appear once
    missing = sorted(n for n in params if n not in mapped and not n.startswith(optional))
    if missing:
        raise RunError(f"{where} lacks weight {missing[0]!r} ({len(missing)} missing of "
                       f"{len(params)}): is it a checkpoint of another architecture?")
    if skipped:
        log.info("%s: skipped %d tensors this model does not use (e.g. %s)", where,
                 len(skipped), skipped[0])
    model.load_state_dict(mapped, strict=False)


def _untied(sd: dict[str, Tensor]) -> bool:
    """Whether ``sd`` holds an output matrix ``lm_head.weight`` that is not its input
    embedding (GPT-2's ``wte``, Llama's ``embed_tokens``, GPT-NeoX's ``embed_in``)."""
    head = next((v for k, v in sd.items() if k.split(".")[-2:] == ["lm_head", "weight"]), None)
    emb = next((v for k, v in sd.items()
                if k.endswith(("wte.weight", "embed_tokens.weight", "embed_in.weight"))), None)
    return head is not None and emb is not None and not torch.equal(head, emb)


def tied_head(model: nn.Module, embedding: Tensor) -> bool:
    """Whether a loaded causal LM's output matrix is its input ``embedding``: it has no
    ``lm_head``, or one that is the same tensor. Read from the tensors, not from
    ``config.tie_word_embeddings``: transformers loads a checkpoint whose ``lm_head`` differs
    from its embedding untied and leaves the config saying tied."""
    head = getattr(model, "lm_head", None)
    return head is None or head.weight.data_ptr() == embedding.data_ptr()


# parameters that no converter reads, so a checkpoint may lack them: BertModel's pooler
_UNUSED = {"BertModel": ("pooler.",)}


def load_hf_model(model_or_dir: Any, cls_name: str,
                  sd: dict[str, Tensor] | None = None) -> nn.Module:
    """``model_or_dir`` itself, or ``transformers.<cls_name>`` built from the ``config.json``
    of a local directory and loaded with its weights (``sd`` if already read, else
    :func:`read_hf_weights`), in eval mode."""
    if not isinstance(model_or_dir, (str, os.PathLike)):
        return model_or_dir
    path = Path(model_or_dir)
    read_hf_config(path)  # the clear errors for a folder that is not a model
    sd = read_hf_weights(path) if sd is None else sd
    tf = import_transformers()
    try:
        config = tf.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers' field checks raise their own types
        raise RunError(f"{path / 'config.json'} is not a configuration transformers accepts "
                       f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    cls = getattr(tf, cls_name)
    wanted = getattr(cls.config_class, "model_type", None)
    if wanted and config.model_type != wanted:
        raise RunError(f"{path / 'config.json'}: {cls_name} (model_type {wanted!r}) is "
                       f"what is being loaded, but model_type is {config.model_type!r}: a "
                       "checkpoint of another architecture, or an architectures entry that "
                       "contradicts model_type")
    if getattr(config, "tie_word_embeddings", False) and _untied(sd):
        # as transformers does: a checkpoint whose output matrix differs from its input
        # embedding is loaded untied, whatever config.json says
        log.info("%s: lm_head.weight differs from the input embedding: loaded untied", path)
        config.tie_word_embeddings = False
    try:
        model = cls(config)
    except Exception as e:  # noqa: BLE001 - transformers' code, fed the folder's values: torch's
        # "Padding_idx must be within num_embeddings" (a pad_token_id outside the vocabulary),
        # a negative size, n_head = 0 (ZeroDivisionError), an unknown activation (KeyError)
        why = ": " + str(e).splitlines()[0][:200] if str(e) else ""
        raise RunError(f"{path / 'config.json'}: transformers cannot build {cls_name} from "
                       f"it ({type(e).__name__}{why})") from None
    load_hf_state(model, sd, str(path), _UNUSED.get(cls_name, ()))
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()


def attnlab_activation(name: str, allowed: tuple[str, ...]) -> str:
    """attnlab's ``ffn`` for transformers' activation ``name``, or a ValueError naming the
    ``allowed`` ones."""
    if name not in allowed:
        raise RunError(f"activation {name!r} is not supported: one of {', '.join(allowed)}")
    return FROM_HF_ACTIVATION[name]
