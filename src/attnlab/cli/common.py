"""Shared CLI plumbing: how a command's errors reach the user.

Bad input (:class:`attnlab.errors.InputError`, a file-system error on a path the user gave, or
running out of memory for the sizes asked for) is one line on stderr, exit code 2; ``-v`` adds
its details. Any other exception is an internal error of attnlab, never the user's: its
traceback is printed, then a line that says so and asks for a report, exit code 1.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError, RunError, UsageError

log = logging.getLogger("attnlab")

BAD_INPUT = 2
INTERNAL_ERROR = 1
INTERRUPTED = 130
# a full disk or quota: to fix on the machine, not in attnlab, whether or not it names a file
NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (what was wrong, where the allowed
    arguments are listed), exit code 2; ``--help`` still prints the full help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = f"; allowed arguments: `{self.prog} --help`"
        self.exit(BAD_INPUT, f"{self.prog}: error: {message}{hint}\n")


def _os_error_line(e: OSError) -> str:
    """One line for a file-system error: which path, what went wrong, what to do."""
    where = e.filename or "a file"
    what = e.strerror or str(e)
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write {where} ({what}): its folder cannot be written by this user; "
                "choose a path in a folder you can write to")
    if e.errno in NO_SPACE:
        return f"cannot write {where} ({what}): free some space, then run the command again"
    return (f"cannot use {where} ({what}): check the path (an output must go into a folder "
            "you can write to)")


def _out_of_memory_line(e: BaseException) -> str | None:
    """One line when ``e`` is the machine running out of memory (the host's allocator, a
    GPU's, or the system's): the sizes asked for are the user's to make smaller; else None."""
    gpu = getattr(sys.modules.get("torch"), "OutOfMemoryError", MemoryError)  # (if imported)
    text = " ".join(str(e).split())
    if not (isinstance(e, (MemoryError, gpu)) or (
            isinstance(e, RuntimeError) and "can't allocate memory" in text) or (
            isinstance(e, OSError) and e.errno == errno.ENOMEM)):
        return None
    asked = text.partition("you tried to allocate ")[2].partition(" bytes")[0]
    if asked.isdigit():  # (the host's allocator says how much)
        from ..info import human_bytes

        asked = f"{human_bytes(int(asked))} asked for at once"
    return (f"out of memory{f' ({asked})' if asked else ''}: what this command was asked for "
            "does not fit this machine's memory; allowed: smaller sizes (the model's, "
            "train.batch_size, train.grad_accum, train.eval_batches, the tokens asked for; "
            "`attnlab info` estimates a model's memory)")


def is_bad_input(e: BaseException) -> bool:
    """Whether ``e`` is the user's to fix: an :class:`InputError`, a file-system error that
    names a path (one the user gave: a missing file, a folder that cannot be written), a
    full disk, or memory too small for the sizes asked for."""
    if isinstance(e, InputError) or _out_of_memory_line(e) is not None:
        return True
    if not isinstance(e, OSError) or e.errno is None:
        return False
    return e.filename is not None or e.errno in NO_SPACE


def run_command(func: Callable[[argparse.Namespace], int | None],
                args: argparse.Namespace) -> int:
    """Run a command's function and turn what it raises into what the user sees.

    Returns:
        The command's exit code: ``BAD_INPUT`` (one line on stderr), ``INTERNAL_ERROR``
        (the traceback, then a line that asks for a report), ``INTERRUPTED`` (Ctrl-C).
    """
    name = " ".join(["attnlab", args.command, *(  # as argparse names it: "attnlab viz attention"
        str(getattr(args, k)) for k in ("what", "action") if getattr(args, k, None))])
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt as e:  # a command may say what it kept and how to go on
        if e.args and e.args[0] is None:  # another process of the command says it
            return INTERRUPTED
        said = " ".join(str(e.args[0]).split()) if e.args else "interrupted"
        print(f"{name}: {said}", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:
        if not is_bad_input(e):
            traceback.print_exc(file=sys.stderr)
            print(f"{name}: internal error: this is a bug in attnlab, not in "
                  "your input; please report it with the traceback above", file=sys.stderr)
            return INTERNAL_ERROR
        msg = e if isinstance(e, InputError) else _out_of_memory_line(e) or _os_error_line(e)
        msg = " ".join(str(msg).split())  # one line, always
        print(f"{name}: error: {msg}", file=sys.stderr)
        if getattr(args, "verbose", False):
            log.exception("details")
        return BAD_INPUT


# ---- runs read with a text (viz attention, interpret) --------------------------------------
def load_text_run(run_dir: str, checkpoint: str):
    """A run whose commands read ``--text`` (``viz attention``, ``interpret``); it needs a
    tokenizer to turn ``--text`` into ids."""
    from ..runs import RunDir, load_run

    run = load_run(run_dir, checkpoint)
    if run.tokenizer is None:
        raise RunError(f"{run_dir} has no {RunDir(run_dir).tokenizer_file.name}: cannot turn "
                       "--text into tokens")
    return run


# what errors call the text and the target of these commands
TEXT_FLAGS = ("--text", "--target")


def check_target(run, args: argparse.Namespace) -> None:
    """Refuse ``--target`` for a run that reads no target (all but encoder-decoders)."""
    family = run.model.config.family
    if args.target is not None and family != "encoder_decoder":
        raise UsageError(f"--target is for encoder-decoder runs; {args.run_dir} is a "
                         f"{family} run: drop --target")


def check_layers_heads(cfg, layers: list[int] | None, heads: list[int] | None) -> None:
    """Each ``--layer`` and ``--head`` in range of the model (an encoder-decoder's stacks
    may differ in depth: a layer one lacks is the other's only)."""
    depth = max(cfg.n_layers, cfg.n_decoder_layers or 0)
    for values, n, what in ((layers, depth, "layer"), (heads, cfg.n_heads, "head")):
        for v in values or []:
            if not 0 <= v < n:
                raise UsageError(f"--{what} {v} is out of range: the model has {n} {what}s "
                                 f"(0..{n - 1})")


def check_out_path(path: str, flag: str, example: str) -> None:
    """Refuse, before anything is computed or written, an output path that cannot be written:
    a folder, a path under a file, or a place this user cannot write to."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{flag} {path} is a folder: give a file path, e.g. {out / example}")
    parent = next(p for p in out.parents if p.exists())
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, not a folder; choose a "
                         "path in a folder (missing folders are created)")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and
                                                     not os.access(out, os.W_OK)):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
