"""A user's own files: folders of text of any name (code, notes), glob patterns, --include and
--exclude, binary files skipped; a folder of raw text as ``data.path``; bad raw input to
``train`` stopped before anything is said or written to the cache."""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import pytest

from attnlab.cli import main
from attnlab.data import DataError
from attnlab.data.pipeline import file_lock
from attnlab.data.prepare import prepare, prepare_cached
from attnlab.data.shards import TokenShards, read_manifest
from attnlab.data.sources import scan
from attnlab.tokenizers import load_tokenizer

CODE = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(40))
NOTES = "".join(f"# Note {i}\n\nRemember the milk, day {i}.\n\n" for i in range(40))
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
TINY = ["--set", "model.d_model=16", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
        "--set", "model.max_len=16", "--set", "train.precision=fp32", "--set",
        "train.progress=false", "--set", "train.tensorboard=false", "--set",
        "train.batch_size=2", "--set", "train.max_steps=2", "--set", "train.eval_every=2",
        "--set", "train.eval_batches=1", "--set", "train.final_eval_batches=1", "--set",
        "train.samples=0", "--set", "train.device=cpu"]


@pytest.fixture(autouse=True)
def _data_cache(tmp_path, monkeypatch):
    """Raw files are prepared into a cache of the test's own."""
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "cache"))


def project(root):
    """A newcomer's folder: code, notes, a picture, bytecode, an empty file, a .git folder."""
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "main.py").write_text(CODE)
    (root / "README.md").write_text(NOTES)
    (root / "pkg" / "util.py").write_text(CODE.replace("def", "async def"))
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\xa7\r\r\n\0\0" * 9)
    (root / "logo.png").write_bytes(PNG)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".env").write_text("SECRET=1\n")
    return root


def names(out, folder="mytext"):
    """The files ``out`` was prepared from, below ``out``'s sibling ``folder``."""
    return [os.path.relpath(s["path"], out.parent / folder) for s in read_manifest(out)[
        "sources"]]


def text_of(out):
    tok = load_tokenizer(out / "tokenizer.json")
    return tok.decode(TokenShards(out, "train").ids().tolist())


# ---- 1. folders, patterns, --include / --exclude ---------------------------------------------
def test_a_folder_reads_every_text_file_of_any_name_and_skips_binary_and_hidden_ones(
        tmp_path, caplog):
    folder = project(tmp_path / "mytext")
    with caplog.at_level(logging.INFO):
        out = prepare([folder], tmp_path / "p", "char", val_fraction=0.0, workers=1)
    # sorted, below the folder; no .git, no .env, no bytecode, no picture, no empty file
    assert names(out) == ["README.md", "main.py", "pkg/util.py"]
    assert text_of(out) == NOTES + CODE + CODE.replace("def", "async def")  # <eos> between
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert said == ["skipped 2 binary files (not UTF-8 text: "
                    f"{folder / 'logo.png'}, {folder / 'pkg/__pycache__/util.cpython-311.pyc'}) "
                    f"and 1 empty file ({folder / 'pkg/__init__.py'}); reading 3 files"]


def test_a_folder_is_read_the_same_whatever_order_its_files_were_made_in(tmp_path):
    a, b = tmp_path / "a" / "mytext", tmp_path / "b" / "mytext"
    for root, order in ((a, "xyz"), (b, "zyx")):
        root.mkdir(parents=True)
        for n in order:
            (root / f"{n}.py").write_text(f"# {n}\n" + CODE)
    pa = prepare([a], tmp_path / "pa", "char", workers=1)
    pb = prepare([b], tmp_path / "pb", "char", workers=1)
    assert names(pa, "a/mytext") == names(pb, "b/mytext") == ["x.py", "y.py", "z.py"]
    assert TokenShards(pa, "train").ids().tolist() == TokenShards(pb, "train").ids().tolist()


def test_a_quoted_glob_is_expanded_by_attnlab_sorted(tmp_path, monkeypatch):
    project(tmp_path / "mytext")
    monkeypatch.chdir(tmp_path)
    assert [str(s.path) for s in scan(["mytext/*.py"]).sources] == ["mytext/main.py"]
    assert [str(s.path) for s in scan(["mytext/**/*.py"]).sources] == [
        "mytext/main.py", "mytext/pkg/util.py"]  # (an empty __init__.py: skipped)
    found = scan(["mytext/*"])  # a folder it matches is read as a folder
    assert [str(s.path) for s in found.sources] == ["mytext/README.md", "mytext/main.py",
                                                    "mytext/pkg/util.py"]
    assert [str(p) for p in found.binary] == ["mytext/logo.png",
                                              "mytext/pkg/__pycache__/util.cpython-311.pyc"]
    out = prepare(["mytext/*.py"], "p", "char", val_fraction=0.0, workers=1)
    assert text_of(out) == CODE


def test_a_prepared_dir_inside_a_folder_is_not_read_as_its_text(tmp_path, monkeypatch):
    folder = project(tmp_path / "mytext")
    monkeypatch.chdir(folder)
    first = prepare(["."], "prepared", "char", workers=1)  # an --out inside the folder
    again = prepare(["."], "prepared2", "char", workers=1)
    assert names(first, ".") == names(again, ".") == [
        "README.md", "main.py", "pkg/util.py"]
    assert names(prepare(["*"], "p4", "char", workers=1), ".") == names(first, ".")
    with pytest.raises(DataError, match=r"folder prepared is a prepared data dir \(token ids, "
                       r"not text\): train on it with --set data.path=prepared"):
        prepare(["prepared"], "p3", "char", workers=1)


def test_include_and_exclude_choose_among_a_folders_files(tmp_path):
    folder = project(tmp_path / "mytext")
    (folder / "tests").mkdir()
    (folder / "tests" / "test_main.py").write_text(CODE)

    def picked(include=(), exclude=()):
        return [s.path.relative_to(folder).as_posix()
                for s in scan([folder], include, exclude).sources]

    assert picked(include=["*.py"]) == ["main.py", "pkg/util.py", "tests/test_main.py"]
    assert picked(include=["*.py", "*.md"], exclude=["tests"]) == [
        "README.md", "main.py", "pkg/util.py"]
    assert picked(exclude=["pkg/*", "test_*"]) == ["README.md", "main.py"]
    assert picked(include=["pkg/*"]) == ["pkg/util.py"]
    # a file named on its own is read, whatever the filters
    assert [s.path.name for s in scan([folder / "README.md"], include=["*.py"]).sources] == [
        "README.md"]


def test_structured_formats_in_a_folder_are_read_as_rows(tmp_path):
    folder = tmp_path / "mytext"
    folder.mkdir()
    (folder / "rows.jsonl").write_text("".join(f'{{"text": "row {i}"}}\n' for i in range(30)))
    (folder / "notes.md").write_text(NOTES)
    out = prepare([folder], tmp_path / "p", "char", val_fraction=0.0, workers=1)
    assert read_manifest(out)["splits"]["train"]["documents"] == 31  # 30 rows + one text file


def test_text_that_is_not_utf8_is_skipped_as_binary_unless_errors_replace(tmp_path):
    folder = tmp_path / "mytext"
    folder.mkdir()
    (folder / "good.md").write_text(NOTES)
    (folder / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1") * 10)
    assert [s.path.name for s in scan([folder]).sources] == ["good.md"]
    assert [s.path.name for s in scan([folder], errors="replace").sources] == [
        "good.md", "latin1.txt"]


@pytest.mark.parametrize("spec, kw, says", [
    ("mytext/*.zz", {}, r"no file matches the pattern mytext/\*\.zz \(relative to .*\); "
                        "allowed: a pattern that matches files"),
    ("mytext", {"include": ["*.c"]}, r"folder mytext holds no file attnlab can read after "
                                     r"--include '\*\.c'; allowed: UTF-8 text files of any name"),
    ("mytext/*.png", {}, r"the pattern mytext/\*\.png matches no file attnlab can read \("
                         r"skipped 1 binary file .*logo\.png\)\); allowed: UTF-8 text"),
    ("mytext", {"exclude": [""]}, r"--exclude '' is not allowed: a glob pattern"),
])
def test_a_folder_or_pattern_with_nothing_to_read_is_one_error(tmp_path, monkeypatch, spec, kw,
                                                               says):
    project(tmp_path / "mytext")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=says):
        prepare([spec], "p", "char", workers=1, **kw)
    assert not (tmp_path / "p").exists()


def test_the_command_line_reads_a_folder_and_a_glob(tmp_path, monkeypatch, capsys, caplog):
    project(tmp_path / "mytext")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO):
        assert main(["data", "prepare", "mytext", "--out", "p", "--workers", "1",
                     "--exclude", "README.md", "--exclude", "pkg"]) == 0
    assert capsys.readouterr().out.startswith("p: char tokenizer")
    assert names(tmp_path / "p") == ["main.py"]
    assert "skipped 1 binary file (not UTF-8 text: mytext/logo.png)" in caplog.text
    assert main(["data", "prepare", "mytext/*.py", "mytext/**/*.md", "--out", "q",
                 "--workers", "1", "--include", "*.py", "--include", "*.md"]) == 0
    assert names(tmp_path / "q") == ["main.py", "README.md"]  # in the order given
    capsys.readouterr()
    assert main(["data", "prepare", "mytext/*.rs", "--out", "r"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "attnlab data prepare: error: no file matches the pattern mytext/*.rs")
    assert main(["data", "prepare", "mytext/main.py", "--target", "mytext/README.md",
                 "--include", "*.py", "--out", "r"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--include and --exclude choose among the files of folders" in err[0]
    assert not (tmp_path / "r").exists()


# ---- 2. a folder of raw text as data.path ----------------------------------------------------
def test_a_folder_of_raw_text_trains_prepared_once_into_the_cache(tmp_path, monkeypatch,
                                                                  capsys):
    folder = tmp_path / "txtdir"
    folder.mkdir()
    (folder / "a.txt").write_text(NOTES)
    (folder / "b.txt").write_text(CODE)
    cache = tmp_path / "cache" / "prepared"
    run = ["train", "--set", "data.name=text", "--set", f"data.path={folder}", *TINY]
    assert main([*run, "--out", str(tmp_path / "r1")]) == 0
    made = sorted(os.listdir(cache))
    assert len(made) == 1 and made[0].startswith("txtdir-")  # and no lock file left
    assert [os.path.basename(s["path"]) for s in read_manifest(cache / made[0])["sources"]] == [
        "a.txt", "b.txt"]
    from attnlab.data import prepare as prepare_module

    def refuse(*a, **k):
        raise AssertionError("prepared again")

    monkeypatch.setattr(prepare_module, "prepare", refuse)
    assert main([*run, "--out", str(tmp_path / "r2")]) == 0  # read from the cache
    assert main(["eval", str(tmp_path / "r2")]) == 0
    (folder / "c.txt").write_text("one more file\n")  # a changed folder: prepared anew
    with pytest.raises(AssertionError, match="prepared again"):
        prepare_cached(folder, tmp_path / "cache")


def test_an_empty_folder_as_data_path_says_what_a_folder_may_be(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", "--set", f"data.path={tmp_path / 'empty'}", *TINY, "--out",
                 str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "holds no file attnlab can read" in err[0]
    assert "or a prepared data dir, which `attnlab data prepare SRC... --out DIR` makes" in err[0]
    assert not (tmp_path / "cache").exists()


def test_an_unfinished_prepared_dir_says_to_run_prepare_again(tmp_path, capsys):
    (tmp_path / "a.txt").write_text(NOTES)
    out = prepare([tmp_path / "a.txt"], tmp_path / "p", "char", workers=1)
    (out / "prepared.json").unlink()
    (out / ".plan.json").write_text("{}")  # as a killed prepare leaves it
    assert main(["train", "--set", f"data.path={out}", *TINY, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is an unfinished prepared data dir" in err and "run the same command again" in err


# ---- 3. bad raw input to train: checked first, nothing left behind ---------------------------
def left_in_cache(tmp_path):
    root = tmp_path / "cache" / "prepared"
    return sorted(os.listdir(root)) if root.is_dir() else []


@pytest.mark.parametrize("content, says", [
    (b"", r"source .*empty\.txt is empty \(or only whitespace\); expected UTF-8 text"),
    (b"  \n\n ", r"is empty \(or only whitespace\)"),
])
def test_an_empty_file_is_refused_before_anything_is_said_or_written(tmp_path, capsys, caplog,
                                                                     content, says):
    (tmp_path / "empty.txt").write_bytes(content)
    with caplog.at_level(logging.INFO):
        assert main(["train", "--set", f"data.path={tmp_path / 'empty.txt'}", *TINY, "--out",
                     str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(says, err[0])
    assert "preparing" not in caplog.text
    assert left_in_cache(tmp_path) == []


def test_a_binary_file_names_what_train_can_run(tmp_path, capsys, caplog):
    data = tmp_path / "data.bin"
    data.write_bytes(PNG * 4)
    with caplog.at_level(logging.INFO):
        assert main(["train", "--set", f"data.path={data}", *TINY, "--out",
                     str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"attnlab train: error: {data} is not UTF-8 text: undecodable byte 0x89 at byte offset "
        f"0; convert it to UTF-8, or prepare {data} with `attnlab data prepare {data} --errors "
        "replace --out DIR` (U+FFFD in its place) and give DIR in its place"]
    assert "preparing" not in caplog.text and left_in_cache(tmp_path) == []
    # ... and what it names works
    assert main(["data", "prepare", str(data), "--errors", "replace", "--out",
                 str(tmp_path / "d"), "--workers", "1"]) == 0
    assert main(["train", "--set", f"data.path={tmp_path / 'd'}", *TINY, "--out",
                 str(tmp_path / "r")]) == 0


@pytest.mark.parametrize("src, tgt, says", [
    (b"a\nb\nc\n", b"x\ny\n", "parallel files are not aligned: source .* has 3 lines but "
                              "target .* has 2 lines"),
    (b"a\nb\n", b"x\xff\ny\n", r"tgt\.txt is not UTF-8 text: undecodable byte 0xff at byte "
                               r"offset 1; convert it to UTF-8, or prepare the pairs with "
                               r"`attnlab data prepare .*src\.txt --target .*tgt\.txt --errors "
                               r"replace --out DIR` .* and give DIR as data\.path"),
    (b"", b"", "parallel files .* are empty"),
])
def test_bad_translation_files_are_refused_before_anything_is_said_or_written(
        tmp_path, capsys, caplog, src, tgt, says):
    (tmp_path / "src.txt").write_bytes(src)
    (tmp_path / "tgt.txt").write_bytes(tgt)
    with caplog.at_level(logging.INFO):
        assert main(["train", "--set", "data.name=parallel", "--set",
                     f"data.src_path={tmp_path / 'src.txt'}", "--set",
                     f"data.tgt_path={tmp_path / 'tgt.txt'}", *TINY, "--out",
                     str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(says, err[0]), err
    assert "preparing" not in caplog.text
    assert left_in_cache(tmp_path) == []


def test_a_prepare_that_fails_midway_leaves_no_lock_and_no_partial_dir(tmp_path, monkeypatch):
    from attnlab.data import prepare as prepare_module

    (tmp_path / "a.txt").write_text(NOTES)

    def fail(sources, out, *a, **k):  # as a bad row found late: after the DIR was begun
        (out / "train").mkdir(parents=True)
        raise DataError("the text went bad while it was read")

    monkeypatch.setattr(prepare_module, "_prepare", fail)
    with pytest.raises(DataError, match="went bad"):
        prepare_cached(tmp_path / "a.txt", tmp_path / "cache")
    assert left_in_cache(tmp_path) == []


def test_the_cache_lock_admits_one_holder_at_a_time_and_is_removed(tmp_path):
    lock = tmp_path / "x.lock"
    inside, most, errors = [0], [0], []

    def hold():
        try:
            for _ in range(5):
                with file_lock(lock):
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    time.sleep(0.002)
                    inside[0] -= 1
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and most[0] == 1
    assert not lock.exists()
