"""Reading message files for the CLI: JSON lists, trajectory objects, JSONL, plain text."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

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


def parse_messages(name: str, text: str, *, allow_text: bool) -> Loaded:
    """Messages from a JSON list, ``{"messages": [...]}``, or JSONL; else plain text.

    Raises:
        InvalidMessageError: JSON that is not messages (or truncated), when text is not allowed.

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
                if not allow_text:
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
