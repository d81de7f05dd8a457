"""attnlab.files, the one home of atomic writes: a failed write leaves the old file (or
nothing) and no temporary file; what it writes gets the mode the umask gives."""

from __future__ import annotations

import os
import stat

import pytest

from attnlab.files import atomic_write, atomic_write_json, check_writable, write_files_atomic


def test_atomic_write_replaces_the_file_and_a_failed_write_keeps_the_old(tmp_path):
    path = tmp_path / "sub" / "a.bin"
    old = os.umask(0o022)
    try:
        atomic_write(path, lambda tmp: tmp.write_bytes(b"old"))
    finally:
        os.umask(old)
    assert path.read_bytes() == b"old" and stat.S_IMODE(path.stat().st_mode) == 0o644

    def half(tmp):
        tmp.write_bytes(b"ne")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, half)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.bin"]  # no temporary file
    atomic_write_json(path, {"b": 1, "a": [2]}, indent=1)
    assert path.read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}\n'


def test_write_files_atomic_moves_the_companions_in_and_the_file_last(tmp_path):
    dest = tmp_path / "out" / "model.onnx"
    seen = []

    def write(path):
        assert path.name == "model.onnx" and path.parent != dest.parent
        (path.parent / "model.onnx.data").write_bytes(b"weights")
        path.write_bytes(b"graph")
        seen.append(path.parent)

    write_files_atomic(dest, write)
    assert dest.read_bytes() == b"graph" and (dest.parent / "model.onnx.data").is_file()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert not seen[0].exists()  # the temporary folder is gone

    def fail(path):
        (path.parent / "other.onnx.data").write_bytes(b"x")
        raise RuntimeError("the export failed")

    with pytest.raises(RuntimeError):
        write_files_atomic(dest.with_name("other.onnx"), fail)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_check_writable_makes_the_folder_and_leaves_nothing(tmp_path):
    check_writable(tmp_path / "a" / "b")
    assert list((tmp_path / "a" / "b").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        check_writable(tmp_path / "file")
