"""The ``ctxkeep`` command line: one module per command group.

Each module defines ``register(subparsers)`` which adds its command and sets ``func``. A
module is imported only when its command runs (or for ``--help``): ``ctxkeep count`` does not
pay for the server's, the store's and the evaluation's imports.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from ctxkeep._version import __version__
from ctxkeep.errors import CtxkeepError

_GROUPS = ("count", "replay", "sessions", "memory", "keys", "serve", "mcp", "eval")
"""The command modules, in the order ``--help`` lists their commands."""

_COMMANDS = {**{g: g for g in _GROUPS}, "demo": "replay"}
"""The module that registers each command."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every command registered (only ``command``'s module, when
    it names a command).
    """
    parser = argparse.ArgumentParser(
        prog="ctxkeep",
        description="Keep an LLM agent's context inside its window: count, prune, store, recall.",
        epilog=(
            "examples:\n  ctxkeep demo\n"
            "  ctxkeep count examples/data/session.json --encoding o200k_base\n"
            "  ctxkeep replay examples/data/session.json --budget 2000"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ctxkeep {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups = [_COMMANDS[command]] if command in _COMMANDS else _GROUPS
    for group in groups:
        importlib.import_module(f"ctxkeep.cli.{group}").register(sub)
    return parser


# What a shell reports for a process killed by SIGPIPE (128 + 13), as `yes | head` gives.
EXIT_BROKEN_PIPE = 128 + getattr(signal, "SIGPIPE", 13)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code.

    0 on success; 2 for usage and input errors (one line on stderr, no traceback; argparse
    exits with 2 itself for a malformed command line); 141, quietly, when the reader of the
    output went away (``ctxkeep sessions list --json | head``), as Unix tools do.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list[0] if args_list else None)
    args = parser.parse_args(args_list)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        # Output to a pipe is block-buffered: a reader that left shows up here at the latest.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except CtxkeepError as exc:
        print(f"ctxkeep: error: {exc}", file=sys.stderr)
        return 2


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (tests capture it)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
