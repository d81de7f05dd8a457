"""Every config key, through the CLI: a value of the wrong type and (where the key has a range)
one out of range each give one line on stderr, exit code 2 and no run dir.

The cases are generated from the config dataclasses (ModelConfig, DataConfig, TrainConfig), so a
new key is covered without writing a test: its annotation picks the values (a Literal: a name
outside it; an int or a float: a negative number; a path: a file that is not there). A key whose
type the rules do not cover must be added to ``SPECIAL`` (its out-of-range value) or
``NO_RANGE`` (why none exists), or the coverage test fails.
"""

from __future__ import annotations

import typing
from dataclasses import fields
from pathlib import Path
from typing import Literal, get_args

import pytest

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.run_config import DataConfig, TrainConfig

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
TINY = ["--set", "model.d_model=16", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
        "--set", "train.precision='fp32'", "--set", "train.progress=false",
        "--set", "train.tensorboard=false", "--set", "train.batch_size=4",
        "--set", "train.max_steps=1", "--set", "train.eval_every=0",
        "--set", "train.device='cpu'"]
TEXT = "".join(f"to be or not to be, line {i}; that is the question.\n" for i in range(40))
MISSING = "'/nonexistent/attnlab/x'"

# Which data a key needs to be read at all (the rest: a synthetic task, no files).
BASE_OF = {
    **dict.fromkeys(("path", "val_path", "test_path", "cache_dir", "tokenizer", "vocab_size",
                     "pre_tokenizer", "train_frac", "repeat_frac", "repeat_steps", "mix"),
                  "lm"),
    **dict.fromkeys(("src_path", "tgt_path", "val_src_path", "val_tgt_path", "test_src_path",
                     "test_tgt_path", "src_add_special"), "pairs"),
    **dict.fromkeys(("holdout", "holdout_unit", "split_seed", "label_names", "bucket"), "tsv"),
}
# Out-of-range values the type rules cannot make (key -> value as given to --set).
SPECIAL = {
    "data.name": "'nope'",
    "data.cache_dir": "FILE",  # a file where the cache folder should be
    "data.mix": "[{path = 'x.txt', weight = -1}]",
    "data.label_names": "['only']",
    "train.device": "'gpu7'",
    "train.best_metric": "'speed'",
    "model.vocab_size": "1",
}
# Keys with no value out of range: why.
NO_RANGE = {
    "train.seed": "any integer seeds the generators",
    "model.rope_base": "checked as a positive float (the float rule covers it)",
}


def _base(hint) -> type:
    args = get_args(hint) if typing.get_origin(hint) in (typing.Union, type(int | None)) \
        else (hint,)
    return next(a for a in args if a is not type(None))


def _cases():
    """(key, kind, value) for every field of every section."""
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            key, base = f"{section}.{f.name}", _base(hints[f.name])
            literal = typing.get_origin(base) is Literal
            yield key, "type", "'x'" if base in (int, float, bool) or not (
                literal or base is str) else "3"
            if key in SPECIAL:
                yield key, "range", SPECIAL[key]
            elif literal:
                yield key, "range", "'nope'"
            elif base in (int, float) and key not in NO_RANGE:
                yield key, "range", "-1" if base is int else "-1.0"
            elif base is str and (f.name.endswith("path") or f.name == "init_from"):
                yield key, "range", MISSING


CASES = list(_cases())


def test_every_key_has_a_wrong_type_and_an_out_of_range_case_or_a_reason():
    covered = {k for k, kind, _ in CASES if kind == "range"}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            key = f"{section}.{f.name}"
            if _base(hints[f.name]) is bool:
                continue  # true or false: only a wrong type is wrong
            assert key in covered or key in NO_RANGE, (
                f"{key}: no out-of-range value; add it to SPECIAL or NO_RANGE")


def _data(kind: str, tmp: Path) -> list[str]:
    if kind == "lm":
        (tmp / "t.txt").write_text(TEXT)
        return ["--set", f"data.path='{tmp / 't.txt'}'"]
    if kind == "pairs":
        (tmp / "a.de").write_text("ein haus\nzwei hunde\n" * 20)
        (tmp / "a.en").write_text("a house\ntwo dogs\n" * 20)
        de, en = tmp / "a.de", tmp / "a.en"
        return ["--set", f"data.src_path='{de}'", "--set", f"data.tgt_path='{en}'",
                "--set", f"data.val_src_path='{de}'", "--set", f"data.val_tgt_path='{en}'"]
    if kind == "tsv":
        (tmp / "s.tsv").write_text("sentence\tlabel\n" + "good film\t1\nbad film\t0\n" * 20)
        return ["--set", f"data.path='{tmp / 's.tsv'}'"]
    return ["--set", "data.name='reverse'", "--set", "data.val_size=8"]


@pytest.mark.parametrize(("key", "kind", "value"), CASES,
                         ids=[f"{k}-{kind}" for k, kind, _ in CASES])
def test_a_bad_value_is_one_line_exit_2_and_no_run(key, kind, value, tmp_path, capsys):
    section, name = key.split(".")
    data = _data(BASE_OF.get(name, "synthetic") if section == "data" else "synthetic",
                 tmp_path)
    if value == "FILE":
        (tmp_path / "a_file").write_text("not a folder")
        value = f"'{tmp_path / 'a_file'}'"
    out = tmp_path / "run"
    code = main(["train", *TINY, *data, "--set", f"{key}={value}", "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2, (key, value, code, err[-3:])
    assert len(err) == 1 and "internal error" not in err[0], (key, value, err[-3:])
    assert not out.exists(), (key, value, sorted(p.name for p in out.iterdir()))
