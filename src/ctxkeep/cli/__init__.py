"""The ``ctxkeep`` command line: one module per command group.

Each module defines ``register(subparsers)`` which adds its command and sets ``func``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ctxkeep._version import __version__
from ctxkeep.cli import count, memory, replay, sessions
from ctxkeep.errors import CtxkeepError

_GROUPS = (count, replay, sessions, memory)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command registered."""
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
    for group in _GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for usage and input errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CtxkeepError as exc:
        print(f"ctxkeep: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
