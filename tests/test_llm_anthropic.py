"""ChatClient on Anthropic's Messages API: the official SDK against a local server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from pydantic import TypeAdapter

from _llm_servers import (
    Reply,
    ScriptedServer,
    anthropic_default,
    anthropic_error,
    anthropic_events,
    anthropic_message,
    assert_valid_body,
    running,
)
from ctxkeep import CalibratedCounter, Message, PromptTooLongError, to_anthropic
from ctxkeep.errors import ContextWindowExceededError
from ctxkeep.llm import AsyncChatClient, ChatClient

NON_STREAMING: TypeAdapter[Any] = TypeAdapter(MessageCreateParamsNonStreaming)
STREAMING: TypeAdapter[Any] = TypeAdapter(MessageCreateParamsStreaming)

THINKING = {
    "type": "thinking",
    "thinking": "The user wants a.txt.",
    "signature": "EqQBCkYIARgCKkBz==",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a=="}
TOOL_USE = {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "a.txt"}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def assert_valid_request(body: dict[str, Any]) -> None:
    """The body validates against the SDK's own params type and has no key it lacks."""
    assert_valid_body(body, streaming=STREAMING, non_streaming=NON_STREAMING)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with running(anthropic_default) as s:
        yield s


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[ChatClient]:
    c = ChatClient("claude-sonnet-4-5", api_key="test", base_url=server.url)
    yield c
    c.close()


def test_complete_sends_system_blocks_and_the_output_limit(
    client: ChatClient, server: ScriptedServer
) -> None:
    assert client.provider == "anthropic"
    result = client.complete([{"role": "user", "content": "Hello"}], system="Be brief.")
    assert result.message == Message("assistant", "ok")
    assert result.model == "claude-sonnet-4-5-20250929"
    assert result.stop_reason == "end_turn"
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert request.body["system"] == [{"type": "text", "text": "Be brief."}]
    assert request.body["messages"] == [{"role": "user", "content": "Hello"}]
    assert request.body["max_tokens"] == client.max_output_tokens == 8192
    assert_valid_request(request.body)


def test_a_reply_with_thinking_and_tool_use_keeps_both(
    client: ChatClient, server: ScriptedServer
) -> None:
    blocks = [THINKING, REDACTED, {"type": "text", "text": "Let me look."}, TOOL_USE]
    server.push(Reply(body=anthropic_message(blocks)))
    result = client.complete([{"role": "user", "content": "What is in a.txt?"}], tools=TOOLS)
    m = result.message
    assert m.content == [THINKING, REDACTED, {"type": "text", "text": "Let me look."}]
    assert [(c.id, c.name, c.parsed_arguments()) for c in m.tool_calls] == [
        ("toolu_01", "read_file", {"path": "a.txt"})
    ]
    assert result.stop_reason == "tool_use"


def test_thinking_blocks_go_back_unchanged(client: ChatClient, server: ScriptedServer) -> None:
    blocks = [THINKING, {"type": "text", "text": "Let me look."}, TOOL_USE]
    server.push(Reply(body=anthropic_message(blocks)))
    history: list[Any] = [{"role": "user", "content": "What is in a.txt?"}]
    reply = client.complete(history, tools=TOOLS).message
    history += [reply, Message("tool", "hello", tool_call_id="toolu_01")]
    client.complete(history, tools=TOOLS)
    sent = server.requests[1].body["messages"]
    assert sent[1] == {"role": "assistant", "content": blocks}
    assert sent[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "hello"}],
    }


def test_every_request_body_validates_against_the_sdk_params(
    client: ChatClient, server: ScriptedServer
) -> None:
    blocks = [THINKING, {"type": "text", "text": "Let me look."}, TOOL_USE]
    server.push(Reply(body=anthropic_message(blocks)))
    history: list[Any] = [{"role": "system", "content": "You read files."}]
    history.append({"role": "user", "content": "What is in a.txt?"})
    reply = client.complete(history, tools=TOOLS, tool_choice="auto").message
    history += [reply, Message("tool", "hello", tool_call_id="toolu_01")]
    client.complete(history, tools=TOOLS, tool_choice="read_file")
    client.complete(history, tools=TOOLS, tool_choice="required", max_tokens=100)
    client.complete(
        history,
        tools=[{"name": "ls", "input_schema": {"type": "object"}}],
        options={"thinking": {"type": "enabled", "budget_tokens": 1024}},
    )
    with client.stream(history, tools=TOOLS) as stream:
        stream.final_result()
    assert len(server.requests) == 5
    for request in server.requests:
        assert_valid_request(request.body)
    assert server.requests[1].body["tool_choice"] == {"type": "tool", "name": "read_file"}
    assert server.requests[2].body["tool_choice"] == {"type": "any"}
    assert server.requests[2].body["max_tokens"] == 100
    assert server.requests[1].body["tools"][0]["input_schema"]["properties"]


def test_a_prompt_over_the_gate_never_reaches_the_server(server: ScriptedServer) -> None:
    client = ChatClient(
        "claude-sonnet-4-5", api_key="test", base_url=server.url, context_window=2000
    )
    assert client.max_output_tokens == 500  # a quarter of a small explicit window
    with pytest.raises(PromptTooLongError) as info:
        client.complete([{"role": "user", "content": "word " * 2000}])
    assert info.value.limit == 1500
    with pytest.raises(PromptTooLongError):
        client.stream([{"role": "user", "content": "word " * 2000}])
    assert server.requests == []


def test_prompt_is_too_long_becomes_context_window_exceeded(
    client: ChatClient, server: ScriptedServer
) -> None:
    server.push(anthropic_error(400, "prompt is too long: 208310 tokens > 200000 maximum"))
    with pytest.raises(ContextWindowExceededError) as info:
        client.complete([{"role": "user", "content": "hi"}])
    error = info.value
    assert isinstance(error.__cause__, anthropic.BadRequestError)
    assert (error.provider, error.limit, error.actual) == ("anthropic", 200000, 208310)
    assert len(server.requests) == 1


def test_input_plus_max_tokens_over_the_limit_is_recognised(
    client: ChatClient, server: ScriptedServer
) -> None:
    server.push(
        anthropic_error(
            400,
            "input length and `max_tokens` exceed context limit: 195000 + 8192 > 200000, "
            "decrease input length or `max_tokens` and try again",
        )
    )
    with pytest.raises(ContextWindowExceededError) as info:
        client.complete([{"role": "user", "content": "hi"}])
    assert (info.value.actual, info.value.limit) == (195000, 200000 - 8192)


def test_another_400_stays_the_sdks_error(client: ChatClient, server: ScriptedServer) -> None:
    server.push(anthropic_error(400, "messages: roles must alternate"))
    with pytest.raises(anthropic.BadRequestError):
        client.complete([{"role": "user", "content": "hi"}])


def test_429_and_overloaded_are_retried(client: ChatClient, server: ScriptedServer) -> None:
    retry = {"retry-after-ms": "1"}
    server.push(
        Reply(429, anthropic_error(429, "rate", kind="rate_limit_error").body, headers=retry),
        Reply(529, anthropic_error(529, "busy", kind="overloaded_error").body, headers=retry),
    )
    assert client.complete([{"role": "user", "content": "hi"}]).text == "ok"
    assert len(server.requests) == 3


def test_the_reported_usage_calibrates_the_counter(
    client: ChatClient, server: ScriptedServer
) -> None:
    counter = client.counter
    assert isinstance(counter, CalibratedCounter)
    prompt = [{"role": "user", "content": "calibrate me " * 50}]
    base = CalibratedCounter(ratio=1.0).count_messages(prompt)
    server.push(Reply(body=anthropic_message(input_tokens=base, cache_read=base)))
    result = client.complete(prompt)
    assert result.usage is not None
    assert result.usage.input_tokens == 2 * base  # cache reads are prompt tokens too
    assert result.usage.cached_input_tokens == base
    assert counter.observations == 1
    assert counter.ratio == pytest.approx(2.0, rel=0.05)


def test_stream_yields_text_deltas_then_the_same_result(
    client: ChatClient, server: ScriptedServer
) -> None:
    message = anthropic_message(
        [THINKING, {"type": "text", "text": "Let me look."}, TOOL_USE], output_tokens=42
    )
    server.push(Reply(body=message), Reply(events=anthropic_events(message)))
    whole = client.complete([{"role": "user", "content": "a.txt?"}], tools=TOOLS)
    with client.stream([{"role": "user", "content": "a.txt?"}], tools=TOOLS) as stream:
        deltas = list(stream)
    assert "".join(deltas) == "Let me look."
    assert len(deltas) == 2
    streamed = stream.result
    assert streamed is not None
    assert streamed.message == whole.message
    assert streamed.message.content == whole.message.content  # the signature survives
    assert streamed.usage == whole.usage
    assert (streamed.stop_reason, streamed.model, streamed.id) == (
        whole.stop_reason,
        whole.model,
        whole.id,
    )


def test_a_streamed_tool_turn_round_trips_through_to_anthropic(
    client: ChatClient, server: ScriptedServer
) -> None:
    message = anthropic_message([THINKING, TOOL_USE])
    server.push(Reply(events=anthropic_events(message)))
    result = client.stream([{"role": "user", "content": "go"}], tools=TOOLS).final_result()
    assert to_anthropic([result.message]).messages == [
        {"role": "assistant", "content": [THINKING, TOOL_USE]}
    ]


def test_async_complete_and_stream(server: ScriptedServer) -> None:
    message = anthropic_message([THINKING, {"type": "text", "text": "Done here."}])

    async def run() -> tuple[Any, list[str], Any]:
        async with AsyncChatClient("claude-sonnet-4-5", api_key="test", base_url=server.url) as c:
            server.push(Reply(body=message))
            whole = await c.complete([{"role": "user", "content": "hi"}], system="Be brief.")
            server.push(Reply(events=anthropic_events(message)))
            stream = await c.stream([{"role": "user", "content": "hi"}], system="Be brief.")
            deltas = [d async for d in stream]
            return whole, deltas, await stream.final_result()

    whole, deltas, streamed = asyncio.run(run())
    assert "".join(deltas) == "Done here."
    assert streamed.message == whole.message
    assert whole.message.content[0] == THINKING
    for request in server.requests:
        assert_valid_request(request.body)


def test_async_prompt_too_long_is_translated(server: ScriptedServer) -> None:
    server.push(anthropic_error(400, "prompt is too long: 9 tokens > 8 maximum"))

    async def run() -> None:
        c = AsyncChatClient("claude-3-5-haiku-latest", api_key="test", base_url=server.url)
        with pytest.raises(ContextWindowExceededError):
            await c.complete([{"role": "user", "content": "hi"}])
        await c.close()

    asyncio.run(run())
