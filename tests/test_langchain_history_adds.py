"""A LangChain history's add stores the messages it converts without copying them (issue 26):
the converted messages are made for the add alone and given up to the store, so neither the
conversion nor the store's stamping deep-copies them (the copies were about a third of an
add's client time on Redis)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxkeep.messages import Message
from ctxkeep.sessions import MemoryConfig, MemoryManager, open_memory

pytest.importorskip("langchain_core")

from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from ctxkeep.integrations.langchain import CtxkeepChatMessageHistory


@pytest.fixture(params=["memory", "sqlite"])
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'h.db'}"
    with open_memory(url, MemoryConfig(max_history=None, max_sessions=None)) as mem:
        yield mem


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every deep copy and ``Message.copy`` made from now on."""
    made: list[str] = []
    deepcopy, message_copy = copy.deepcopy, Message.copy

    def counting_deepcopy(value: Any, memo: Any = None) -> Any:
        made.append(f"deepcopy {type(value).__name__}")
        return deepcopy(value, memo)

    def counting_copy(self: Message) -> Message:
        made.append("Message.copy")
        return message_copy(self)

    monkeypatch.setattr(copy, "deepcopy", counting_deepcopy)
    monkeypatch.setattr(Message, "copy", counting_copy)
    return made


def _conversation() -> list[Any]:
    call = {"name": "now", "args": {"tz": "UTC"}, "id": "c1", "type": "tool_call"}
    return [
        SystemMessage("be brief"),
        HumanMessage([{"type": "text", "text": "what time is it?"}]),
        AIMessage("", tool_calls=[call]),
        ToolMessage("12:00", tool_call_id="c1"),
        AIMessage("noon", name="bot", additional_kwargs={"k": [1, 2]}),
    ]


def test_a_history_add_copies_no_message(memory: MemoryManager, copies: list[str]) -> None:
    history = CtxkeepChatMessageHistory("chat", memory=memory)
    given = _conversation()
    for message in given:
        history.add_message(message)
    history.add_messages([HumanMessage("and tomorrow?"), AIMessage("noon too")])
    assert copies == []
    assert history.messages == [*given, HumanMessage("and tomorrow?"), AIMessage("noon too")]


def test_a_message_added_then_changed_by_its_caller_reads_back_as_it_was_added(
    memory: MemoryManager,
) -> None:
    history = CtxkeepChatMessageHistory("chat", memory=memory)
    parts = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    message = HumanMessage(parts, additional_kwargs={"tags": ["a"]})
    history.add_message(message)
    message.content[0]["image_url"]["url"] = "changed"  # type: ignore[index]
    message.additional_kwargs["tags"].append("b")
    (stored,) = history.messages
    assert stored.content == [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    ]
    assert stored.additional_kwargs == {"tags": ["a"]}
