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


def run_command(func: Callable[[argparse.Namespace], int | None],
                args: argparse.Namespace) -> int:
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"attnlab {args.command}: error: {msg}", file=sys.stderr)
        if getattr(args, "verbose", False):
            log.exception("details")
        return 2
