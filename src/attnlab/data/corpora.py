"""A language model's corpora: the prepared DIR each one is read from and the one tokenizer
they share.

A corpus is a prepared DIR (``attnlab data prepare``), which brings its tokenizer, or a text
file or folder, prepared once into the data cache (:func:`attnlab.data.prepare.prepare_cached`)
with the tokenizer it is given or one built from the settings. Several text files of a mix
share one tokenizer built from all of them (:func:`mix_tokenizer`), kept in the cache too.
:class:`attnlab.tasks.lm.LMTask` reads its config and asks here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from attnlab.config import ConfigError
from attnlab.data.errors import DataError, DataFileNotFoundError
from attnlab.data.fetch import sha256_of
from attnlab.data.pipeline import cache_key
from attnlab.data.prepare import build_tokenizer, check_raw, prepare_cached
from attnlab.data.shards import TOKENIZER, is_token_dir, read_manifest
from attnlab.data.sources import find_sources
from attnlab.data.text import embedded_corpus
from attnlab.files import atomic_write_bytes
from attnlab.tokenizers import FORMAT, Tokenizer, load_tokenizer


def describe(tok: Tokenizer) -> str:
    return f"{tok.kind} tokenizer of {tok.vocab_size} ids"


def dir_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer that made the ids of the prepared DIR ``path``; one line when it is no
    prepared DIR or its tokenizer cannot be read."""
    read_manifest(path)  # one line when it is no prepared DIR
    try:
        return load_tokenizer(path / TOKENIZER)
    except (OSError, ValueError) as e:
        raise DataError(f"prepared data dir {path}: {e}; prepare the data again") from None


def shared_tokenizer(paths: Sequence[str], key: str) -> tuple[str, Tokenizer] | None:
    """The first prepared DIR of ``paths`` and its tokenizer, which every other prepared DIR
    of them must share (a :class:`ConfigError` naming the config ``key`` when one does not);
    None when none is a prepared DIR (text files and folders bring no tokenizer). A path that
    does not exist is one line, in the order given."""
    fixed: tuple[str, Tokenizer] | None = None
    for path in paths:
        if not Path(path).exists():
            raise DataFileNotFoundError(f"{key}: {path} does not exist; allowed: a UTF-8 "
                                        "text file, a folder of them or a prepared data dir")
        if not is_token_dir(path):  # a text file or folder: prepared into the cache
            continue
        tok = dir_tokenizer(Path(path))
        if fixed is None:
            fixed = (path, tok)
        elif tok.to_dict() != fixed[1].to_dict():
            raise ConfigError(
                f"{key}: {fixed[0]} was prepared with a {describe(fixed[1])} and {path} "
                f"with a {describe(tok)}; allowed: corpora of one tokenizer (prepare them "
                f"with attnlab data prepare --tokenizer {fixed[0]})")
    return fixed


def mix_tokenizer(paths: Sequence[str], cache_dir: Path, kind: str, *, vocab_size: int,
                  pre_tokenizer: str) -> Tokenizer:
    """One tokenizer of ``kind`` for the text files of a mix (each prepared alone would get
    its own vocabulary), made once from all of them and kept in the cache under a key of
    their contents and the settings."""
    found = [str(s.path) for s in find_sources(paths)]
    settings = {"files": [sha256_of(Path(f)) for f in found], "tokenizer": kind,
                "vocab_size": vocab_size, "pre_tokenizer": pre_tokenizer}
    path = cache_dir / "prepared" / "mix-tokenizers" / f"{cache_key(settings, 16)}.json"
    if path.is_file():
        return load_tokenizer(path)
    for p in paths:  # bad text is one line with what to do, as when each is prepared
        check_raw(p)
    tok = build_tokenizer(found, kind, vocab_size=vocab_size, pre_tokenizer=pre_tokenizer)
    atomic_write_bytes(path, json.dumps({"format": FORMAT, **tok.to_dict()}).encode())
    return load_tokenizer(path)  # (as a later run reads it: the same cache keys)


def embedded_file(cache_dir: Path) -> Path:
    """The embedded corpus as a file in the cache, so it is prepared like any other (it is
    rewritten only when another Python's topics differ)."""
    path = cache_dir / "prepared" / "embedded.txt"
    data = embedded_corpus().encode()
    if not path.is_file() or path.stat().st_size != len(data) or path.read_bytes() != data:
        atomic_write_bytes(path, data)
    return path


def corpus_dir(path: str, cache_dir: Path, tokenizer: Tokenizer | None, *, kind: str,
               vocab_size: int, pre_tokenizer: str, val_fraction: float,
               settings_first: bool = False) -> Path:
    """The prepared DIR of the text file or folder ``path`` in the cache (made on first use):
    tokenized by ``tokenizer``, or by the one ``kind`` (``vocab_size``, ``pre_tokenizer``)
    builds when it is None. With ``settings_first`` the DIR of the settings serves when its
    tokenizer is ``tokenizer`` (a resumed or evaluated run finds what its first run
    prepared). A ``tokenizer`` that cannot encode the text raises its ``VocabularyError``."""

    def cached(tok: str | Tokenizer) -> Path:
        return prepare_cached(path, cache_dir, tok, vocab_size=vocab_size,
                              pre_tokenizer=pre_tokenizer, val_fraction=val_fraction)

    if tokenizer is None:
        return cached(kind)
    if settings_first:
        folder = cached(kind)
        if dir_tokenizer(folder).to_dict() == tokenizer.to_dict():
            return folder
    return cached(tokenizer)
