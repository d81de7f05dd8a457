"""Prepared token dirs: a corpus tokenized once into flat token shards, read through memory maps.

A split is the concatenation of its shards (layout: :func:`attnlab.data.prepare.prepare`).
:class:`TokenShards` reads any window of it, across shard boundaries, so training sees one
long token stream as if the corpus had been tokenized in memory. Each read maps the shard,
copies the window and unmaps it again (as nanoGPT re-creates its ``np.memmap`` every batch):
pages of a large corpus never pile up in the process's resident memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.data.errors import DataError, DataFileNotFoundError

MANIFEST = "prepared.json"
TOKENIZER = "tokenizer.json"
PLAN = ".plan.json"  # the settings of an unfinished prepare, to resume only the same one
FORMAT = "attnlab-tokens/1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def token_dtype(vocab_size: int) -> str:
    """The smallest shard dtype that holds every id of a ``vocab_size`` vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def is_prepared(path: str | Path) -> bool:
    """True when ``path`` is a directory holding a prepared corpus's manifest."""
    return (Path(path) / MANIFEST).is_file()


def is_token_dir(path: str | Path) -> bool:
    """True when ``path`` is a prepared DIR, finished or not (a folder of raw text files is
    not one: it is prepared into the cache)."""
    path = Path(path)
    return path.is_dir() and ((path / MANIFEST).is_file() or (path / PLAN).is_file())


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the prepared DIR ``path``; one :class:`DataError` when it is not one."""
    path = Path(path)
    if not path.exists():
        raise DataFileNotFoundError(f"prepared data dir {path} does not exist")
    if (path / PLAN).is_file() and not (path / MANIFEST).is_file():
        raise DataError(f"{path} is an unfinished prepared data dir: it has no {MANIFEST} yet "
                        "(`attnlab data prepare` was stopped): run the same command again to "
                        "finish it")
    if not (path / MANIFEST).is_file():
        raise DataError(f"{path} is not a prepared data dir: it has no {MANIFEST}; make one "
                        "with `attnlab data prepare SRC... --out DIR` (translation pairs: "
                        "`attnlab data prepare SRC --target TGT --out DIR`) and give DIR")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path / MANIFEST} cannot be read ({e}); prepare the data again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path / MANIFEST} is not an attnlab prepared-data manifest (expected "
                        f"format {FORMAT!r}); prepare the data again")
    return manifest


class TokenShards:
    """One split of a prepared DIR as a single token stream of ``len(self)`` ids.

    Args:
        path: the prepared DIR.
        split: ``"train"`` or ``"val"``.

    ``window(start, n)`` returns ids ``[start, start + n)`` as an int64 tensor; ``windows``
    stacks several (language-model batches); ``ids()`` reads the whole split (small splits
    only: evaluation of a val split, tests).
    """

    def __init__(self, path: str | Path, split: str) -> None:
        self.path = Path(path)
        manifest = read_manifest(self.path)
        if manifest.get("kind", "tokens") != "tokens":
            raise DataError(f"{self.path} holds sentence pairs (a translation corpus, prepared "
                            "with --target); a language model reads a corpus prepared without "
                            "--target")
        if split not in manifest["splits"]:
            raise DataError(f"unknown split {split!r} of {self.path}; it has "
                            + ", ".join(manifest["splits"]))
        self.split, self.dtype = split, DTYPES[manifest["dtype"]]
        shards = manifest["splits"][split]["shards"]
        self.files = [self.path / s["file"] for s in shards]
        sizes = [int(s["tokens"]) for s in shards]
        for f, n in zip(self.files, sizes):
            if not f.is_file() or f.stat().st_size != n * np.dtype(self.dtype).itemsize:
                raise DataError(f"shard {f} is missing or not the size its manifest records "
                                f"({n} tokens); prepare the data again")
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])  # (n_shards + 1,)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _window(self, start: int, n: int, maps: dict[int, np.memmap]) -> np.ndarray:
        """Ids ``[start, start + n)`` (crossing shard boundaries as needed), read through the
        maps in ``maps`` (opened here when missing; the caller drops them)."""
        if start < 0 or n < 0 or start + n > len(self):
            raise DataError(f"window [{start}, {start + n}) is outside the {self.split} split "
                            f"of {len(self)} tokens")
        parts, pos, end = [], start, start + n
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while pos < end:
            base = int(self.starts[shard])
            hi = min(end, int(self.starts[shard + 1]))
            if hi > pos:
                if shard not in maps:
                    maps[shard] = np.memmap(self.files[shard], dtype=self.dtype, mode="r")
                parts.append(np.array(maps[shard][pos - base:hi - base], dtype=np.int64))
            pos, shard = hi, shard + 1
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def window(self, start: int, n: int) -> torch.Tensor:
        """Ids ``[start, start + n)`` of the split: (n,) int64."""
        return torch.from_numpy(self._window(start, n, {}))

    def windows(self, starts: list[int], n: int) -> torch.Tensor:
        """``len(starts)`` windows of ``n`` ids, stacked: (len(starts), n) int64. Each shard
        is mapped once for the call and unmapped after it, so no page of the corpus stays in
        the process."""
        maps: dict[int, np.memmap] = {}
        return torch.from_numpy(np.stack([self._window(s, n, maps) for s in starts]))

    def ids(self) -> torch.Tensor:
        """The whole split as one int64 tensor."""
        return self.window(0, len(self))
