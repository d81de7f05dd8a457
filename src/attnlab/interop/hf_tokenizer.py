"""Tokenizers in and out of Hugging Face files: the one place that knows their names.

:func:`load_hf_tokenizer` reads a model directory's files as ``transformers.AutoTokenizer``
would; :func:`save_hf_tokenizer` writes any attnlab tokenizer as files that
``AutoTokenizer.from_pretrained`` loads and that encode as attnlab does. Truncation and
padding stored in a ``tokenizer.json`` are dropped: attnlab cuts and pads itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tokenizers import Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from ..errors import DataError, MissingFileError, UsageError
from ..tokenizers import (
    GPT2Tokenizer,
    PretrainedTokenizer,
    Tokenizer,
    WordPieceTokenizer,
)
from .hf import read_optional_json

TOKENIZER_JSON = "tokenizer.json"  # a Hugging Face model directory's, not a run dir's
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GPT2_FILES = ("vocab.json", "merges.txt")
WORDPIECE_VOCAB = "vocab.txt"


def _special_tokens(path: Path) -> dict[str, str]:
    """``{"bos_token": "<s>", ...}`` from the tokenizer config files (either spelling: a
    string, or ``{"content": ...}``)."""
    out: dict[str, str] = {}
    for file in (SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG):  # the config wins
        for key, value in read_optional_json(path / file).items():
            if isinstance(value, dict):
                value = value.get("content")
            if key.endswith("_token") and isinstance(value, str) and value:
                out[key] = value
    return out


def _roles(hf: HFTokenizer, names: dict[str, str], bert: bool) -> dict[str, str]:
    """attnlab role -> token, for the tokens of ``names`` that are in the vocabulary."""
    wanted = {"pad": "pad_token", "unk": "unk_token", "bos": "bos_token", "eos": "eos_token",
              "mask": "mask_token"}
    if bert:
        wanted |= {"bos": "cls_token", "eos": "sep_token"}
    roles = {role: names[key] for role, key in wanted.items()
             if key in names and hf.token_to_id(names[key]) is not None}
    if "pad" not in roles and "eos" in roles:  # GPT-2 and Llama have no pad token
        roles["pad"] = roles["eos"]
    return roles


def _from_tokenizer_json(path: Path, names: dict[str, str]) -> Tokenizer:
    file = path / TOKENIZER_JSON
    try:
        hf = HFTokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise DataError(f"{file} is not a Hugging Face tokenizers file ({e})") from None
    hf.no_truncation()
    hf.no_padding()
    spec = json.loads(hf.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") == "WordPiece":
        defaults = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                    "unk_token": "[UNK]", "mask_token": "[MASK]"}
        return WordPieceTokenizer(hf, _roles(hf, defaults | names, bert=True), byte_level=False)
    byte_level = "ByteLevel" in json.dumps(pre)
    if model.get("type") == "BPE" and byte_level:
        eot = GPT2Tokenizer.EOT
        defaults = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
        return GPT2Tokenizer(hf, _roles(hf, defaults | names, bert=False), byte_level=True)
    return PretrainedTokenizer(hf, _roles(hf, names, bert=False), byte_level=byte_level)


def load_hf_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer of a Hugging Face model directory, from the first of these files there,
    in the order ``transformers.AutoTokenizer`` prefers them:

    * ``tokenizer.json``, as it is: a WordPiece model becomes a
      :class:`~attnlab.tokenizers.WordPieceTokenizer`, a byte-level BPE a
      :class:`~attnlab.tokenizers.GPT2Tokenizer`, anything else (Llama's byte-fallback BPE) a
      :class:`~attnlab.tokenizers.PretrainedTokenizer`;
    * ``vocab.json`` + ``merges.txt``: GPT-2's byte-level BPE;
    * ``vocab.txt``: BERT's WordPiece (``do_lower_case`` from ``tokenizer_config.json``).

    The special tokens (bos, eos, pad, unk; BERT's ``[CLS]``/``[SEP]`` as bos/eos) come from
    ``tokenizer_config.json`` / ``special_tokens_map.json``.

    Raises:
        FileNotFoundError: none of ``tokenizer.json``, ``vocab.json`` + ``merges.txt``,
            ``vocab.txt`` is there.
        ValueError: a file that is not what its name says.
    """
    path = Path(path)
    names = _special_tokens(path)
    if (path / TOKENIZER_JSON).is_file():
        return _from_tokenizer_json(path, names)
    if all((path / f).is_file() for f in GPT2_FILES):
        try:
            tok = GPT2Tokenizer.from_files(*(path / f for f in GPT2_FILES))
        except Exception as e:  # tokenizers raises a bare Exception for malformed files
            raise DataError(f"{path}: {' + '.join(GPT2_FILES)} are not GPT-2 BPE files "
                            f"({e})") from None
        hf = tok._hf
        eot = GPT2Tokenizer.EOT
        roles = _roles(hf, {"bos_token": eot, "eos_token": eot} | names, bert=False)
        return GPT2Tokenizer(hf, roles, byte_level=True)
    if (path / WORDPIECE_VOCAB).is_file():
        cfg = read_optional_json(path / TOKENIZER_CONFIG)  # BertTokenizer's options
        strip = cfg.get("strip_accents")
        return WordPieceTokenizer.from_vocab_file(
            path / WORDPIECE_VOCAB, lowercase=bool(cfg.get("do_lower_case", True)),
            strip_accents=None if strip is None else bool(strip),
            chinese_chars=bool(cfg.get("tokenize_chinese_chars", True)))
    raise MissingFileError(
        f"{path} has no tokenizer files: expected {TOKENIZER_JSON}, or "
        f"{' + '.join(GPT2_FILES)} (GPT-2), or {WORDPIECE_VOCAB} (BERT)")


# ---- writing -------------------------------------------------------------------------------
def _word_level(vocab: list[str], specials: list[str], unk: str | None) -> HFTokenizer:
    hf = HFTokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=unk))
    hf.add_special_tokens(specials)  # they keep their ids: they are in the vocabulary
    return hf


def to_hf_tokenizer(tokenizer: Tokenizer, wrap: str = "") -> tuple[HFTokenizer, dict[str, str]]:
    """A Hugging Face ``tokenizers.Tokenizer`` that encodes as ``tokenizer.encode(text)`` does,
    and the special tokens by role (``{"bos": "<bos>", ...}``).

    char: a word-level vocabulary over single characters (every character its own piece); ids:
    a word-level vocabulary of the decimal ids, split on whitespace; the others: their own
    ``tokenizers`` JSON, WordPiece with BERT's ``[CLS] ... [SEP]`` post-processor.

    Args:
        wrap: what the model reads around a text, added by a post-processor (WordPiece has
            its own): ``"bos"`` (an encoder that pools its first token, ``[CLS]``) or
            ``"bos eos"`` (an encoder-decoder's sources with ``data.src_add_special``).
    """
    if wrap not in ("", "bos", "bos eos"):
        raise ValueError(f"wrap={wrap!r} is not allowed: '', 'bos' or 'bos eos'")
    d = tokenizer.to_dict()
    kind = d["kind"]
    roles = {role: getattr(tokenizer, f"{role}_id")
             for role in ("pad", "bos", "eos", "unk", "mask")}
    if kind == "char":
        specials = list(d.get("specials", ()))
        hf = _word_level(specials + list(d["chars"]), specials,
                         "<unk>" if "<unk>" in specials else None)
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()  # characters join with nothing between them
    elif kind == "ids":
        specials = list(d.get("specials", ()))
        vocab = specials + [str(i) for i in range(len(specials), int(d["vocab_size"]))]
        hf = _word_level(vocab, specials, None)
        hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # decoding joins with spaces
    elif "hf_json" in d:
        hf = HFTokenizer.from_str(d["hf_json"])
        if kind == "wordpiece":
            cls, sep = tokenizer.bos_id, tokenizer.eos_id
            hf.post_processor = processors.BertProcessing(
                (hf.id_to_token(sep), sep), (hf.id_to_token(cls), cls))
    else:
        raise UsageError(f"a {kind} tokenizer cannot be written as Hugging Face files")
    tokens = {role: hf.id_to_token(i) for role, i in roles.items() if i is not None}
    if wrap and kind != "wordpiece":
        around = wrap.split()  # "bos" or "bos eos"
        if any(role not in tokens for role in around):
            raise UsageError(f"the model reads {wrap} around a text, which this tokenizer lacks")
        hf.post_processor = processors.TemplateProcessing(
            single=" ".join([tokens["bos"], "$A", *(tokens[r] for r in around[1:])]),
            special_tokens=[(tokens[r], roles[r]) for r in around])
    return hf, tokens


def save_hf_tokenizer(tokenizer: Tokenizer, out: str | os.PathLike,
                      max_len: int | None = None, wrap: str = "") -> None:
    """Write ``tokenizer`` into model directory ``out`` as ``tokenizer.json`` +
    ``tokenizer_config.json``, which ``transformers.AutoTokenizer.from_pretrained(out)``
    loads: ``tok(text)["input_ids"]`` equals ``tokenizer.encode(text)`` (a special token's
    spelling inside a text stays text, as in attnlab: ``split_special_tokens``), and
    ``tok.decode(ids, skip_special_tokens=True)`` equals ``tokenizer.decode(ids)``.
    An imported ``hf`` tokenizer keeps its own post-processor (e.g. Llama's ``<s>``): there
    ``tok(text, add_special_tokens=False)`` is ``encode(text)``.

    With ``wrap`` (see :func:`to_hf_tokenizer`), ``tok(text)`` is what the model reads:
    ``encode(text)`` with those tokens around it.

    Args:
        max_len: the model's longest input (``model_max_length``); None: unlimited.
    """
    if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len={max_len!r} is not allowed: a positive integer, or None")
    hf, tokens = to_hf_tokenizer(tokenizer, wrap)  # (its checks before anything is written)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf.save(str(out / TOKENIZER_JSON))
    names = {"pad": "pad_token", "unk": "unk_token", "bos": "bos_token", "eos": "eos_token",
             "mask": "mask_token"}
    if tokenizer.kind == "wordpiece":
        names |= {"bos": "cls_token", "eos": "sep_token"}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        **{names[role]: token for role, token in tokens.items()},
    }
    if max_len:
        config["model_max_length"] = max_len
    (out / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
