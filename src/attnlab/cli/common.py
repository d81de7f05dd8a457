"""Shared CLI plumbing: one-line errors with exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

log = logging.getLogger("attnlab")


class UserError(Exception):
    """A problem with what the user asked for; printed as one line, exit code 2."""


# Exceptions that mean "bad input": printed as one line. Anything else is a bug and keeps its
# traceback (with --verbose) so it can be reported.
USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
    PermissionError, KeyError, ImportError,
)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (what was wrong, where the allowed
    arguments are listed), exit code 2; ``--help`` still prints the full help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = f"; allowed arguments: `{self.prog} --help`"
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def _os_error_line(e: OSError) -> str:
    """One line for a file-system error: which path, what went wrong, what to do."""
    import errno

    where = e.filename or "a file"
    what = e.strerror or str(e)
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write {where} ({what}): its folder cannot be written by this user; "
                "choose a path in a folder you can write to")
    return (f"cannot use {where} ({what}): check the path (an output must go into a folder "
            "you can write to)")


def run_command(func: Callable[[argparse.Namespace], int | None],
                args: argparse.Namespace) -> int:
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt as e:  # a command may say what it kept and how to go on
        said = " ".join(str(e.args[0]).split()) if e.args else "interrupted"
        print(f"attnlab {args.command}: {said}", file=sys.stderr)
        return 130
    except (*USER_ERRORS, OSError) as e:
        if isinstance(e, KeyError):
            msg = e.args[0] if e.args else e
        elif isinstance(e, OSError) and e.errno is not None:
            msg = _os_error_line(e)
        else:
            msg = e
        msg = " ".join(str(msg).split())  # one line, always
        print(f"attnlab {args.command}: error: {msg}", file=sys.stderr)
        if getattr(args, "verbose", False):
            log.exception("details")
        return 2
