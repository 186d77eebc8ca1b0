"""Reading message files for the CLI: JSON lists, trajectory objects, JSONL, plain text."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ctxkeep.errors import InvalidMessageError
from ctxkeep.messages import Message, coerce_messages


@dataclass
class Loaded:
    """What a file held: messages, or plain text."""

    name: str
    messages: list[Message] | None
    text: str | None


def read_source(path: str) -> tuple[str, str]:
    """The name and text of a file, or of standard input for ``-``."""
    if path == "-":
        return "<stdin>", sys.stdin.read()
    p = Path(path)
    try:
        return p.name, p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidMessageError(f"no such file: {path}") from None
    except UnicodeDecodeError as exc:
        raise InvalidMessageError(f"{path} is not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise InvalidMessageError(f"cannot read {path}: {exc.strerror or exc}") from exc


# Text that opens like a JSON array or object of messages (``[{``, ``{"``, ``[]``...), as
# opposed to prose or code that merely starts with a bracket.
_JSON_OPENING = re.compile(r'\s*[\[{]\s*(["{\[\]}]|$)')


def _meant_as_json(name: str, text: str) -> bool:
    return name.endswith((".json", ".jsonl")) or _JSON_OPENING.match(text) is not None


def parse_messages(name: str, text: str, *, allow_text: bool) -> Loaded:
    """Messages from a JSON list, ``{"messages": [...]}``, or JSONL; else plain text.

    Raises:
        InvalidMessageError: JSON that is not messages, when text is not allowed; JSON that
            does not parse (truncated, say) when the file is named ``*.json``/``*.jsonl`` or
            its text opens like JSON, even when text is allowed.

    """
    stripped = text.lstrip()
    data: object = None
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            try:
                data = [json.loads(ln) for ln in lines]
            except json.JSONDecodeError:
                if not allow_text or _meant_as_json(name, text):
                    raise InvalidMessageError(f"{name}: invalid JSON: {exc}") from exc
                return Loaded(name, None, text)
    elif not allow_text:
        raise InvalidMessageError(f"{name}: expected JSON messages (a list, or JSONL)")
    if isinstance(data, dict):
        if "messages" not in data:
            if allow_text:
                return Loaded(name, None, text)
            raise InvalidMessageError(f"{name}: a JSON object needs a 'messages' list")
        data = data["messages"]
    if data is None:
        return Loaded(name, None, text)
    return Loaded(name, coerce_messages(data), None)  # type: ignore[arg-type]


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Leave a closed pipe to :func:`ctxkeep.cli.main`, which exits quietly for every
        command alike (rich's own handler would exit with 1).
        """
        self.quiet = True
        raise BrokenPipeError


def console(*, stderr: bool = False) -> Console:
    """A rich console; wide when output is not a terminal, so tables are not squeezed."""
    c = _Console(stderr=stderr)
    if not c.is_terminal:
        c = _Console(stderr=stderr, width=160)
    return c
