"""Argument helpers shared by the command groups: checked numbers, options around actions.

Every numeric option takes one of the types below, so ``--steps -3`` or ``--top-k 0`` is an
argparse error (usage, one line naming the option, exit 2) rather than a silent no-op.

A group with actions (``ctxkeep sessions list``) declares its shared options once with
:func:`add_shared_options`, and they are accepted before the action (``sessions --db X list``)
and after it (``sessions list --db X``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer of at least 1 (argparse ``type``)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (argparse ``type``)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def finite_float(text: str) -> float:
    """A finite number, negative allowed (argparse ``type``); ``nan`` and ``inf`` are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


@dataclass(frozen=True)
class Option:
    """One option of a command group: ``add_argument``'s flags and keywords."""

    flags: tuple[str, ...]
    """``("--db",)``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """``add_argument`` keywords; ``default`` applies before and after the action alike."""


def add_shared_options(
    group: argparse.ArgumentParser, actions: Any, options: Sequence[Option]
) -> None:
    """Add a command group's ``options``, accepted both before and after its action.

    Args:
        group: the group's parser (``ctxkeep sessions``).
        actions: what ``group.add_subparsers()`` returned, with every action already added.
        options: the options.

    An action's copy defaults to ``argparse.SUPPRESS``: left out after the action, it does
    not overwrite the value (or default) that the group's parser set before it.

    """
    for opt in options:
        group.add_argument(*opt.flags, **opt.kwargs)
        for parser in actions.choices.values():
            parser.add_argument(*opt.flags, **{**opt.kwargs, "default": argparse.SUPPRESS})


def add_action(actions: Any, name: str, help: str, *examples: str) -> argparse.ArgumentParser:
    """An action of a command group whose ``--help`` says what it does and shows examples."""
    lines = "\n".join(f"  {e}" for e in examples)
    return actions.add_parser(  # type: ignore[no-any-return]
        name,
        help=help,
        description=f"{help[0].upper()}{help[1:]}.\n\nexamples:\n{lines}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
