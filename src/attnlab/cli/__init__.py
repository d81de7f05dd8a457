"""The ``attnlab`` command line: thin glue over the library.

Each sub-command lives in its own module with ``register(subparsers)``. Bad input (an
:class:`attnlab.errors.InputError`) prints one line and exits 2; any other exception is an
internal error and prints its traceback (:mod:`attnlab.cli.common`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import inspect, interop, interpret, train, use
from .common import Parser, run_command

COMMAND_MODULES = (train, use, inspect, interpret, interop)
# third-party loggers that flood debug output (matplotlib alone logs ~270 font lines)
NOISY_LOGGERS = ("matplotlib", "PIL", "urllib3", "fsspec", "filelock", "h5py", "torch._dynamo",
                 "torch._inductor", "asyncio", "torch.onnx", "onnxscript", "onnx_ir")


def build_parser() -> argparse.ArgumentParser:
    """The ``attnlab`` parser: every command module's sub-commands, ``-v`` before or after a
    command."""
    parser = Parser(
        prog="attnlab",
        description="Train, sample from, evaluate and look inside Transformers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"attnlab {version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    parser.commands = list(sub.choices)
    _verbose_everywhere(parser)
    return parser


def version() -> str:
    """The installed distribution's version (what pip installed), else the package's own."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("attnlab")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from .. import __version__

        return __version__


def _verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """``-v`` after a command (``attnlab sample RUN -v``) as well as before it; left out, it
    keeps the value given before the command (SUPPRESS: no default that would overwrite it)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in {id(p): p for p in action.choices.values()}.values():
                if "-v" not in sub._option_string_actions:
                    sub.add_argument("-v", "--verbose", action="store_true",
                                     default=argparse.SUPPRESS, help="debug logging")
                _verbose_everywhere(sub)


def main(argv: list[str] | None = None) -> int:
    """Run ``attnlab`` with ``argv`` (default: the process's); returns the exit code (no
    command: ``train``, the demo)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:  # `attnlab` alone runs the main job: train the default model, then sample
        argv = ["train"]
    if argv[0] == "launch" and argv[1:2] not in (["-h"], ["--help"]):
        # torchrun's options, then a command: words argparse must not read as its own options
        from attnlab.cli.train import cmd_launch

        logging.basicConfig(level=logging.INFO, format="%(message)s")
        return run_command(cmd_launch, argparse.Namespace(
            command="launch", argv=argv[1:], commands=parser.commands, parser=parser))
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # named with the command they were given to
            words = [w for w in (getattr(args, "command", None), getattr(args, "action", None))
                     if isinstance(w, str)]
            Parser(prog=" ".join(["attnlab", *words])).error(
                f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help (0) or a one-line argument error (2)
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(message)s")
    for noisy in NOISY_LOGGERS:  # -v is attnlab's debug output, not its libraries'
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Under torchrun every process runs this; the others' progress lines would repeat the
    # first one's, so they say only what went wrong (warnings and errors), unless -v.
    quiet = os.environ.get("RANK", "0") != "0" and not args.verbose
    logging.getLogger("attnlab").setLevel(logging.WARNING if quiet else logging.NOTSET)
    if not getattr(args, "func", None):
        commands = ", ".join(parser.commands)
        print(f"attnlab: error: choose a command: {commands} (see `attnlab --help`)",
              file=sys.stderr)
        return 2
    return run_command(args.func, args)


__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
