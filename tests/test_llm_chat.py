"""ChatClient.chat: one stored turn (store, build, call, store) against local servers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import ctxkeep
from _llm_servers import (
    Reply,
    ScriptedServer,
    anthropic_default,
    anthropic_message,
    openai_completion,
    openai_default,
    running,
)
from ctxkeep import MemoryManager, Message, PromptTooLongError
from ctxkeep.errors import ConfigError, InvalidTypeError
from ctxkeep.llm import AsyncChatClient, ChatClient

THINKING = {"type": "thinking", "thinking": "Check the file.", "signature": "c2lnbmF0dXJl"}
TOOL_USE = {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "a"}}
TOOLS = [{"name": "read_file", "input_schema": {"type": "object", "properties": {}}}]


@pytest.fixture
def memory() -> Iterator[MemoryManager]:
    mem = ctxkeep.open_memory("memory://")
    mem.create_session("agent", session_id="s")
    yield mem
    mem.close()


@pytest.fixture
def oai() -> Iterator[ScriptedServer]:
    with running(openai_default) as s:
        yield s


@pytest.fixture
def ant() -> Iterator[ScriptedServer]:
    with running(anthropic_default) as s:
        yield s


def test_chat_stores_both_turns(memory: MemoryManager, oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1", memory=memory)
    oai.push(Reply(body=openai_completion("Hello, Ada.", prompt_tokens=30, completion_tokens=4)))
    result = client.chat("s", "Hi, I am Ada.", system="Be brief.")
    user, reply = memory.get_messages("s")
    assert (user.role, user.content) == ("user", "Hi, I am Ada.")
    assert (reply.role, reply.content) == ("assistant", "Hello, Ada.")
    assert reply.turn_id == user.turn_id is not None
    assert reply.parent_id == user.id
    assert reply.metadata["model"] == "gpt-4o-2024-08-06"
    assert reply.metadata["provider"] == "openai"
    assert reply.metadata["usage"] == {
        "input_tokens": 30,
        "output_tokens": 4,
        "cached_input_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert reply.metadata["stop_reason"] == "stop"
    # the window the prompt was built in, as the inspector reads it
    assert reply.metadata["max_prompt_tokens"] == client.context_window
    assert reply.metadata["reserve_output_tokens"] == client.max_output_tokens
    assert result.message.id == reply.id
    (request,) = oai.requests
    assert request.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi, I am Ada."},
    ]


def test_the_next_turn_sends_the_stored_history(memory: MemoryManager, oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1", memory=memory)
    client.chat("s", "one")
    client.chat("s", "two")
    assert [m["content"] for m in oai.requests[1].body["messages"]] == ["one", "ok", "two"]
    assert len(memory.get_messages("s")) == 4


def test_a_tool_turn_is_stored_and_continued(memory: MemoryManager, ant: ScriptedServer) -> None:
    client = ChatClient("claude-sonnet-4-5", api_key="t", base_url=ant.url, memory=memory)
    ant.push(Reply(body=anthropic_message([THINKING, TOOL_USE], input_tokens=50)))
    first = client.chat("s", "What is in a?", tools=TOOLS)
    assert [c.id for c in first.tool_calls] == ["toolu_01"]
    stored = memory.get_messages("s")[-1]
    assert stored.tool_calls == first.tool_calls
    assert stored.content == [THINKING]
    memory.add_message("s", "tool", "hello", tool_call_id="toolu_01")
    second = client.chat("s", None, tools=TOOLS)
    assert second.text == "ok"
    sent = ant.requests[1].body["messages"]
    assert sent[1] == {"role": "assistant", "content": [THINKING, TOOL_USE]}
    assert sent[2]["content"][0]["type"] == "tool_result"
    assert [m.role for m in memory.get_messages("s")] == ["user", "assistant", "tool", "assistant"]


def test_chat_uses_a_given_builder(memory: MemoryManager, oai: ScriptedServer) -> None:
    builder = ctxkeep.ContextBuilder(memory=memory, max_prompt_tokens=10_000)
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1", builder=builder)
    assert client.memory is memory
    client.chat("s", "hello")
    assert len(memory.get_messages("s")) == 2


def test_an_oversized_turn_is_fitted_to_the_window_before_the_call(
    memory: MemoryManager, oai: ScriptedServer
) -> None:
    client = ChatClient(
        "gpt-4o",
        api_key="t",
        base_url=oai.url + "/v1",
        memory=memory,
        context_window=600,
        max_output_tokens=100,
    )
    client.chat("s", "word " * 3000)
    (request,) = oai.requests
    assert client.counter.count_messages(request.body["messages"]) <= 500


def test_a_system_prompt_over_the_window_is_refused_before_the_call(
    memory: MemoryManager, oai: ScriptedServer
) -> None:
    client = ChatClient(
        "gpt-4o", api_key="t", base_url=oai.url + "/v1", memory=memory, context_window=600,
        max_output_tokens=100,
    )  # fmt: skip
    with pytest.raises((ctxkeep.BudgetExceededError, PromptTooLongError)):
        client.chat("s", "hi", system="rule " * 1000)
    assert oai.requests == []


def test_bad_arguments_store_nothing(memory: MemoryManager, oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1", memory=memory)
    with pytest.raises(ConfigError):
        client.chat("s", "hi", options={"model": "other"})
    with pytest.raises(InvalidTypeError):
        client.chat("s", "hi", tools="read_file")
    with pytest.raises(ConfigError):
        client.chat("s", "hi", max_tokens=0)
    assert memory.get_messages("s") == []
    assert oai.requests == []


def test_chat_without_a_store_says_what_to_pass(oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1")
    with pytest.raises(ConfigError, match="memory="):
        client.chat("s", "hi")


def test_tool_definitions_leave_room_in_the_default_builder(
    memory: MemoryManager, oai: ScriptedServer
) -> None:
    client = ChatClient(
        "gpt-4o", api_key="t", base_url=oai.url + "/v1", memory=memory, context_window=4000,
        max_output_tokens=500,
    )  # fmt: skip
    tool = {"name": "t", "description": "d " * 800, "input_schema": {"type": "object"}}
    for i in range(12):
        memory.add_message("s", "user", f"question {i} " + "filler " * 60)
        memory.add_message("s", "assistant", "answer " * 60)
    result = client.chat("s", "and now?", tools=[tool])
    assert result.text == "ok"  # the builder pruned for the tools, the gate let it through
    assert len(oai.requests) == 1


def test_async_chat_stores_both_turns(memory: MemoryManager, ant: ScriptedServer) -> None:
    async def run() -> Any:
        amem = ctxkeep.AsyncMemoryManager(memory)
        async with AsyncChatClient(
            "claude-sonnet-4-5", api_key="t", base_url=ant.url, memory=amem
        ) as client:
            return await client.chat("s", "Hi there", system="Be brief.")

    result = asyncio.run(run())
    user, reply = memory.get_messages("s")
    assert (user.content, reply.content) == ("Hi there", "ok")
    assert reply.metadata["provider"] == "anthropic"
    assert result.message.id == reply.id
    assert ant.requests[0].body["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]


def test_a_user_message_object_keeps_its_fields(memory: MemoryManager, oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1", memory=memory)
    client.chat("s", Message("user", "hi", metadata={"source": "cli"}))
    assert memory.get_messages("s")[0].metadata == {"source": "cli"}
    with pytest.raises(ConfigError):
        client.chat("s", Message("assistant", "not a user"))
