"""The ``attnlab`` command line: thin glue over the library.

Each sub-command lives in its own module with ``register(subparsers)``; a ``UserError`` (or
any ``ValueError``/``FileNotFoundError`` raised on bad input) prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import inspect, train, use
from .common import UserError, run_command

COMMAND_MODULES = (train, use, inspect)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="Train, sample from, evaluate and look inside Transformers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:  # `attnlab` alone runs the main job: train the default model, then sample
        argv = ["train"]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(args.func, args)


__all__ = ["UserError", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
