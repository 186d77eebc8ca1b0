"""ChatClient on OpenAI's Chat Completions: the official SDK against a local server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter

from _llm_servers import (
    Reply,
    ScriptedServer,
    assert_valid_body,
    openai_chunks,
    openai_completion,
    openai_default,
    openai_error,
    running,
)
from ctxkeep import CalibratedCounter, Message, PromptTooLongError
from ctxkeep.errors import ConfigError, ContextWindowExceededError
from ctxkeep.llm import AsyncChatClient, ChatClient

NON_STREAMING: TypeAdapter[Any] = TypeAdapter(CompletionCreateParamsNonStreaming)
STREAMING: TypeAdapter[Any] = TypeAdapter(CompletionCreateParamsStreaming)

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
TOOL_HISTORY = [
    {"role": "system", "content": "You read files."},
    {"role": "user", "content": "What is in a.txt?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
]


def assert_valid_request(body: dict[str, Any]) -> None:
    """The body validates against the SDK's own params type and has no key it lacks."""
    assert_valid_body(body, streaming=STREAMING, non_streaming=NON_STREAMING)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with running(openai_default) as s:
        yield s


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[ChatClient]:
    c = ChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1")
    yield c
    c.close()


def test_complete_returns_the_reply_with_its_usage_and_model(
    client: ChatClient, server: ScriptedServer
) -> None:
    server.push(Reply(body=openai_completion("Hi there", prompt_tokens=12, cached_tokens=4)))
    result = client.complete([{"role": "user", "content": "Hello"}])
    assert result.message == Message("assistant", "Hi there")
    assert result.text == "Hi there"
    assert result.model == "gpt-4o-2024-08-06"
    assert result.provider == "openai"
    assert result.stop_reason == "stop"
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (12, 5)
    assert result.usage.cached_input_tokens == 4
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"] == [{"role": "user", "content": "Hello"}]


def test_a_reply_with_tool_calls_carries_them(client: ChatClient, server: ScriptedServer) -> None:
    server.push(Reply(body=openai_completion(None, tool_calls=[("call_1", "read_file", "{}")])))
    result = client.complete(TOOL_HISTORY[:2], tools=TOOLS)
    assert result.message.content is None
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_1", "read_file", "{}")
    ]
    assert result.stop_reason == "tool_calls"


def test_every_request_body_validates_against_the_sdk_params(
    client: ChatClient, server: ScriptedServer
) -> None:
    client.complete([{"role": "user", "content": "plain"}])
    client.complete(
        [{"role": "user", "content": "hi"}], system="Be brief.", options={"temperature": 0.2}
    )
    client.complete(TOOL_HISTORY, tools=TOOLS, tool_choice="read_file", max_tokens=50)
    client.complete(TOOL_HISTORY, tools=TOOLS, tool_choice="required")
    anthropic_tool = {"name": "ls", "input_schema": {"type": "object", "properties": {}}}
    client.complete(TOOL_HISTORY, tools=[anthropic_tool], options={"reasoning_effort": "low"})
    with client.stream(TOOL_HISTORY, tools=TOOLS) as stream:
        stream.final_result()
    assert len(server.requests) == 6
    for request in server.requests:
        assert_valid_request(request.body)
    assert server.requests[2].body["tool_choice"] == {
        "type": "function",
        "function": {"name": "read_file"},
    }
    assert server.requests[4].body["tools"][0]["function"]["name"] == "ls"
    assert server.requests[5].body["stream_options"] == {"include_usage": True}


def test_the_output_limit_is_sent_only_when_one_is_set(
    client: ChatClient, server: ScriptedServer
) -> None:
    client.complete([{"role": "user", "content": "a"}])
    client.complete([{"role": "user", "content": "b"}], max_tokens=64)
    assert "max_completion_tokens" not in server.requests[0].body
    assert server.requests[1].body["max_completion_tokens"] == 64


def test_a_prompt_over_the_gate_never_reaches_the_server(server: ScriptedServer) -> None:
    client = ChatClient(
        "gpt-4o",
        api_key="test",
        base_url=server.url + "/v1",
        context_window=1000,
        max_output_tokens=200,
    )
    assert client.gate.max_prompt_tokens == 800
    with pytest.raises(PromptTooLongError) as info:
        client.complete([{"role": "user", "content": "word " * 2000}])
    assert info.value.unit == "tokens"
    assert info.value.limit == 800
    with (
        pytest.raises(PromptTooLongError),
        client.stream([{"role": "user", "content": "x " * 2000}]),
    ):
        pass
    assert server.requests == []


def test_a_larger_output_reserve_shrinks_the_gate(server: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1", context_window=1000)
    prompt = [{"role": "user", "content": "word " * 600}]
    client.complete(prompt, max_tokens=100)
    with pytest.raises(PromptTooLongError):
        client.complete(prompt, max_tokens=500)
    assert len(server.requests) == 1


def test_tool_definitions_count_against_the_gate(server: ScriptedServer) -> None:
    client = ChatClient(
        "gpt-4o", api_key="test", base_url=server.url + "/v1", context_window=300,
        max_output_tokens=100,
    )  # fmt: skip
    prompt = [{"role": "user", "content": "word " * 150}]
    big_tool = {**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "d " * 100}}
    client.complete(prompt)
    with pytest.raises(PromptTooLongError) as info:
        client.complete(prompt, tools=[big_tool])
    assert info.value.breakdown["tools"] > 0
    assert len(server.requests) == 1


def test_the_code_point_limit_applies_when_configured(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    unconfigured = ChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1")
    assert unconfigured.max_prompt_length is None
    unconfigured.complete([{"role": "user", "content": "x" * 10_000}])  # > 8192 code points
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_LENGTH", "100")
    client = ChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1")
    with pytest.raises(PromptTooLongError) as info:
        client.complete([{"role": "user", "content": "日本語" * 50}])
    assert (info.value.unit, info.value.limit, info.value.actual) == ("characters", 100, 150)
    assert len(server.requests) == 1


def test_an_invalid_sequence_never_reaches_the_server(
    client: ChatClient, server: ScriptedServer
) -> None:
    from ctxkeep.errors import MissingToolResultError

    with pytest.raises(MissingToolResultError):
        client.complete(TOOL_HISTORY[:3])
    assert server.requests == []


def test_429_then_200_is_retried(server: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1", max_retries=2)
    server.push(
        Reply(status=429, body={"error": {"message": "slow down"}}, headers={"retry-after-ms": "1"})
    )
    result = client.complete([{"role": "user", "content": "hi"}])
    assert result.text == "ok"
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


def test_a_5xx_is_retried(client: ChatClient, server: ScriptedServer) -> None:
    server.push(
        Reply(status=503, body={"error": {"message": "busy"}}, headers={"retry-after-ms": "1"})
    )
    assert client.complete([{"role": "user", "content": "hi"}]).text == "ok"
    assert len(server.requests) == 2


def test_retries_are_configurable(server: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1", max_retries=0)
    server.push(Reply(status=429, body={"error": {"message": "slow down"}}))
    with pytest.raises(openai.RateLimitError):
        client.complete([{"role": "user", "content": "hi"}])
    assert len(server.requests) == 1


def test_a_context_length_error_becomes_context_window_exceeded(
    client: ChatClient, server: ScriptedServer
) -> None:
    message = (
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130512 tokens. Please reduce the length of the messages."
    )
    server.push(openai_error(400, message, code="context_length_exceeded"))
    with pytest.raises(ContextWindowExceededError) as info:
        client.complete([{"role": "user", "content": "hi"}])
    error = info.value
    assert isinstance(error, ValueError)
    assert isinstance(error.__cause__, openai.BadRequestError)
    assert (error.provider, error.model, error.limit, error.actual) == (
        "openai",
        "gpt-4o",
        128000,
        130512,
    )
    assert "context_window" in str(error)
    assert len(server.requests) == 1  # a 400 is not retried


def test_a_compatible_servers_context_error_is_recognised(
    client: ChatClient, server: ScriptedServer
) -> None:
    server.push(
        openai_error(400, "This model's maximum context length is 4096 tokens. However, you "
                     "requested 5000 tokens (4000 in the messages, 1000 in the completion).")
    )  # fmt: skip
    with pytest.raises(ContextWindowExceededError) as info:
        client.complete([{"role": "user", "content": "hi"}])
    assert (info.value.limit, info.value.actual) == (4096, 5000)


def test_another_400_stays_the_sdks_error(client: ChatClient, server: ScriptedServer) -> None:
    server.push(openai_error(400, "Invalid value for 'temperature'", code="invalid_value"))
    with pytest.raises(openai.BadRequestError):
        client.complete([{"role": "user", "content": "hi"}])


def test_stream_yields_text_deltas_then_the_result(
    client: ChatClient, server: ScriptedServer
) -> None:
    server.push(Reply(events=openai_chunks(["Hel", "lo", "!"], prompt_tokens=9)))
    with client.stream([{"role": "user", "content": "hi"}]) as stream:
        deltas = list(stream)
    assert deltas == ["Hel", "lo", "!"]
    assert stream.result is not None
    assert stream.result.message == Message("assistant", "Hello!")
    assert stream.result.usage is not None
    assert stream.result.usage.input_tokens == 9
    assert stream.result.stop_reason == "stop"
    assert server.requests[0].body["stream"] is True


def test_a_streamed_reply_equals_the_same_reply_not_streamed(
    client: ChatClient, server: ScriptedServer
) -> None:
    calls = [("call_1", "read_file", '{"path": "a.txt"}'), ("call_2", "read_file", '{"path": "b"}')]
    server.push(Reply(body=openai_completion("Reading.", tool_calls=calls)))
    server.push(Reply(events=openai_chunks(["Read", "ing."], tool_calls=calls)))
    whole = client.complete(TOOL_HISTORY[:2], tools=TOOLS)
    streamed = client.stream(TOOL_HISTORY[:2], tools=TOOLS).final_result()
    assert streamed.message == whole.message
    assert streamed.message.tool_calls == whole.message.tool_calls
    assert streamed.stop_reason == whole.stop_reason == "tool_calls"
    assert streamed.usage == whole.usage


def test_an_unknown_model_needs_its_window(server: ScriptedServer) -> None:
    with pytest.raises(ConfigError, match="context_window"):
        ChatClient("qwen3-8b", api_key="test", base_url=server.url + "/v1")


def test_a_model_without_a_tokenizer_is_calibrated_by_the_reported_usage(
    server: ScriptedServer,
) -> None:
    client = ChatClient(
        "qwen3-8b", api_key="test", base_url=server.url + "/v1", context_window=32768
    )
    assert isinstance(client.counter, CalibratedCounter)
    prompt = [{"role": "user", "content": "calibrate me " * 40}]
    estimate = client.counter.count_messages(prompt)
    server.push(Reply(body=openai_completion(prompt_tokens=estimate * 2)))
    client.complete(prompt)
    assert client.counter.observations == 1
    assert client.counter.count_messages(prompt) > estimate * 1.5


def test_an_exact_counter_is_not_recalibrated(client: ChatClient) -> None:
    assert client.counter.exact
    client.complete([{"role": "user", "content": "hi"}])
    assert not isinstance(client.counter, CalibratedCounter)


def test_a_given_sdk_client_is_used(server: ScriptedServer) -> None:
    sdk = openai.OpenAI(api_key="test", base_url=server.url + "/v1")
    client = ChatClient("gpt-4o", client=sdk)
    assert client.provider == "openai"
    client.complete([{"role": "user", "content": "hi"}])
    client.close()  # not ours: left open
    assert len(server.requests) == 1
    sdk.close()


def test_async_complete_and_stream(server: ScriptedServer) -> None:
    async def run() -> tuple[Any, list[str], Any]:
        async with AsyncChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1") as c:
            server.push(Reply(status=429, body={}, headers={"retry-after-ms": "1"}))
            whole = await c.complete(TOOL_HISTORY, tools=TOOLS)
            server.push(Reply(events=openai_chunks(["a", "b"])))
            async with await c.stream([{"role": "user", "content": "hi"}]) as stream:
                deltas = [d async for d in stream]
            return whole, deltas, stream.result

    whole, deltas, streamed = asyncio.run(run())
    assert whole.text == "ok"
    assert deltas == ["a", "b"]
    assert streamed.text == "ab"
    assert len(server.requests) == 3
    for request in server.requests[1:]:
        assert_valid_request(request.body)


def test_async_over_the_gate_sends_nothing(server: ScriptedServer) -> None:
    async def run() -> None:
        c = AsyncChatClient(
            "gpt-4o", api_key="test", base_url=server.url + "/v1", context_window=500
        )
        with pytest.raises(PromptTooLongError):
            await c.complete([{"role": "user", "content": "w " * 1000}])
        with pytest.raises(PromptTooLongError):
            await c.stream([{"role": "user", "content": "w " * 1000}])
        await c.close()

    asyncio.run(run())
    assert server.requests == []


def test_async_context_error_is_translated(server: ScriptedServer) -> None:
    server.push(openai_error(400, "too long", code="context_length_exceeded"))

    async def run() -> None:
        c = AsyncChatClient("gpt-4o", api_key="test", base_url=server.url + "/v1")
        with pytest.raises(ContextWindowExceededError):
            await c.complete([{"role": "user", "content": "hi"}])
        await c.close()

    asyncio.run(run())


def test_the_refusal_field_is_kept(client: ChatClient, server: ScriptedServer) -> None:
    body = openai_completion(None)
    body["choices"][0]["message"]["refusal"] = "I can't help with that."
    server.push(Reply(body=body))
    result = client.complete([{"role": "user", "content": "hi"}])
    assert result.message.extra["refusal"] == "I can't help with that."
    assert result.message.to_openai()["refusal"] == "I can't help with that."
    json.dumps(result.message.to_openai())
