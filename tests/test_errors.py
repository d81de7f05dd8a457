"""One error hierarchy: bad input is one line and exit code 2; anything else is a bug, printed
with its traceback and a line that says so, exit code 1."""

from __future__ import annotations

import argparse
import errno
import inspect

import pytest

import attnlab.errors as errors
from attnlab.cli import main
from attnlab.cli import train as cli_train
from attnlab.cli.common import run_command

BUG_LINE = ("attnlab recipes: internal error: this is a bug in attnlab, not in your input; "
            "please report it with the traceback above")


def _raise(exc: BaseException):
    def command(args: argparse.Namespace) -> int:
        raise exc
    return command


def _run(func, capsys, verbose: bool = False) -> tuple[int, str]:
    code = run_command(func, argparse.Namespace(command="recipes", verbose=verbose))
    return code, capsys.readouterr().err


def test_every_error_class_is_bad_input_and_a_value_error():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if c.__module__ == errors.__name__]
    assert sorted(c.__name__ for c in classes) == sorted(errors.__all__)
    for cls in classes:
        assert issubclass(cls, errors.InputError) and issubclass(cls, ValueError), cls
    # the ones that stand for a missing file or package stay what `except` clauses expect
    assert issubclass(errors.MissingFileError, FileNotFoundError)
    assert issubclass(errors.DataFileNotFoundError, FileNotFoundError)
    assert issubclass(errors.MissingDependencyError, ImportError)


@pytest.mark.parametrize("exc", [KeyError("vocab_size"), ValueError("shapes (2, 3) and (4,)"),
                                 TypeError("unsupported operand"), RuntimeError("CUDA error"),
                                 ImportError("cannot import name 'x'"), OSError("no errno")])
def test_an_internal_error_is_a_bug_with_its_traceback(exc, capsys):
    code, err = _run(_raise(exc), capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):", err
    assert f"{type(exc).__name__}: " in err and "in command" in err  # where it was raised
    assert lines[-1] == BUG_LINE


def test_a_command_that_hits_an_internal_key_error_shows_it_through_main(monkeypatch, capsys):
    """The whole CLI, as a user runs it: a bug inside a command reaches stderr whole."""
    def broken(args: argparse.Namespace) -> int:
        return {"shipped": 1}["local"]

    monkeypatch.setattr(cli_train, "cmd_recipes", broken)
    assert main(["recipes"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err
    assert "KeyError: 'local'" in err and "in broken" in err
    assert err.strip().splitlines()[-1] == BUG_LINE


@pytest.mark.parametrize("cls", [errors.InputError, errors.ConfigError, errors.DataError,
                                 errors.RunError, errors.UsageError, errors.MissingFileError,
                                 errors.MissingDependencyError, errors.VocabularyError])
def test_bad_input_is_one_line_exit_2_without_a_traceback(cls, capsys):
    code, err = _run(_raise(cls("model.n_heads=3 is not allowed:\n  a divisor of d_model")),
                     capsys)
    assert code == 2
    assert err == ("attnlab recipes: error: model.n_heads=3 is not allowed: a divisor of "
                   "d_model\n")


def test_verbose_adds_the_details_of_bad_input(capsys, caplog):
    code, err = _run(_raise(errors.ConfigError("train.lr=-1 is not allowed")), capsys,
                     verbose=True)
    assert code == 2 and err.startswith("attnlab recipes: error: train.lr=-1 is not allowed")
    assert "ConfigError" in caplog.text  # the traceback, as debug details


def test_a_file_system_error_on_a_named_path_is_bad_input(capsys):
    exc = PermissionError(errno.EACCES, "Permission denied", "/root/out.png")
    code, err = _run(_raise(exc), capsys)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("attnlab recipes: error: cannot write /root/out.png (Permission "
                          "denied)") and len(err.strip().splitlines()) == 1


def test_a_full_disk_is_one_line_even_without_a_file_name(capsys):
    code, err = _run(_raise(OSError(errno.ENOSPC, "No space left on device")), capsys)
    assert code == 2 and err == ("attnlab recipes: error: cannot write a file (No space left on "
                                 "device): free some space, then run the command again\n")


def test_ctrl_c_says_what_the_command_kept(capsys):
    code, err = _run(_raise(KeyboardInterrupt("interrupted; resume with: attnlab train")),
                     capsys)
    assert code == 130 and err == "attnlab recipes: interrupted; resume with: attnlab train\n"


def test_a_real_process_prints_the_traceback_and_exits_1():
    """As a user's shell sees it: stderr holds the traceback, then the line; exit code 1."""
    import subprocess
    import sys

    code = ("import sys; import attnlab.cli.train as t; from attnlab.cli import main\n"
            "def cmd_recipes(args):\n    return {}['local']\n"
            "t.cmd_recipes = cmd_recipes; sys.exit(main(['recipes']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("Traceback (most recent call last):"), p.stderr
    assert "KeyError: 'local'" in p.stderr and p.stderr.strip().splitlines()[-1] == BUG_LINE
