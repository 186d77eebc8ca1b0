"""Helpers the conformance suites share: a settable clock and message factories."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from ctxkeep.messages import Message, ToolCall
from ctxkeep.sessions.base import MemoryManager

MakeMemory = Callable[..., MemoryManager]


class Clock:
    """A settable clock for TTL and LRU tests."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


def full_message(i: int) -> Message:
    """A message with every field set."""
    return Message(
        "assistant",
        [{"type": "text", "text": f"step {i} ünïcode 日本"}],
        name="planner",
        turn_id=f"turn-{i}",
        tool_calls=[ToolCall(id=f"call-{i}", name="search", arguments='{"q": "x", "n": 1}')],
        event_kind="action",
        parent_id=f"parent-{i}",
        id=f"msg-{i}",
        artifact_refs=["sha256:" + "a" * 64],
        metadata={"k": [1, 2.5, None, True, "s"], "nested": {"a": {"b": "c"}}},
        extra={"refusal": None},
        created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    )


def tool_unit(i: int, n: int = 1) -> list[Message]:
    """An assistant call with ``n`` parallel calls and their results."""
    calls = [ToolCall(id=f"u{i}-{k}", name="f", arguments="{}") for k in range(n)]
    return [
        Message("assistant", None, tool_calls=calls),
        *[Message("tool", f"result {i}-{k}", tool_call_id=c.id) for k, c in enumerate(calls)],
    ]
