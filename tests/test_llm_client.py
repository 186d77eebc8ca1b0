"""ChatClient's construction, model table, lazy imports, sync/async parity and summarizer."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from collections.abc import Iterator

import pytest

import ctxkeep
from _llm_servers import (
    Reply,
    ScriptedServer,
    anthropic_default,
    openai_completion,
    openai_default,
    running,
)
from ctxkeep import Message, TokenPruner
from ctxkeep.errors import ConfigError, InvalidTypeError, MissingDependencyError
from ctxkeep.llm import (
    AsyncChatClient,
    AsyncChatStream,
    AsyncLLMSummarizer,
    ChatClient,
    ChatStream,
    LLMSummarizer,
    known_limits,
)


@pytest.fixture
def oai() -> Iterator[ScriptedServer]:
    with running(openai_default) as s:
        yield s


def test_known_models_are_matched_by_their_longest_prefix() -> None:
    assert known_limits("claude-sonnet-4-5-20250929") == known_limits("claude-sonnet-4-5")
    assert known_limits("gpt-4o-mini-2024-07-18") == known_limits("gpt-4o-mini")
    assert known_limits("openai/gpt-4o") == known_limits("gpt-4o")
    assert known_limits("llama3") is None


def test_the_gate_is_the_window_less_the_output_reserve() -> None:
    client = ChatClient("claude-sonnet-4-5", api_key="t")
    assert (client.context_window, client.max_output_tokens) == (200_000, 8_192)
    assert client.gate.max_prompt_tokens == 200_000 - 8_192
    custom = ChatClient("gpt-4o", api_key="t", context_window=50_000, max_output_tokens=2_000)
    assert custom.gate.max_prompt_tokens == 48_000


def test_a_configured_token_limit_lowers_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_TOKENS", "1000")
    assert ChatClient("gpt-4o", api_key="t").gate.max_prompt_tokens == 1000


def test_the_provider_follows_the_model_or_the_client() -> None:
    assert ChatClient("claude-3-5-haiku-latest", api_key="t").provider == "anthropic"
    assert ChatClient("gpt-4o", api_key="t").provider == "openai"
    import anthropic

    sdk = anthropic.Anthropic(api_key="t")
    assert ChatClient("my-proxy-model", client=sdk, context_window=9000).provider == "anthropic"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"model": ""}, ConfigError),
        ({"model": 3}, InvalidTypeError),
        ({"model": "gpt-4o", "provider": "azure"}, ConfigError),
        ({"model": "gpt-4o", "max_output_tokens": 128_000}, ConfigError),
        ({"model": "gpt-4o", "timeout": -1}, ConfigError),
        ({"model": "gpt-4o", "max_retries": -1}, ConfigError),
        ({"model": "gpt-4o", "counter": "o200k_base"}, InvalidTypeError),
        ({"model": "gpt-4o", "client": object()}, InvalidTypeError),
        ({"model": "gpt-4o", "memory": object()}, InvalidTypeError),
        ({"model": "gpt-4o", "base_url": "http://x\x00"}, ConfigError),
    ],
)
def test_bad_settings_are_typed_errors(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        ChatClient(api_key="t", **kwargs)  # type: ignore[arg-type]


def test_a_missing_api_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="api_key"):
        ChatClient("gpt-4o")


@pytest.mark.parametrize(
    ("blocked", "model"), [("openai", "gpt-4o"), ("anthropic", "claude-3-opus")]
)
def test_a_missing_sdk_names_the_extra(
    blocked: str, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, blocked, None)  # import <blocked> -> ImportError
    with pytest.raises(MissingDependencyError) as info:
        ChatClient(model, api_key="t")
    assert info.value.extra == blocked
    assert f"ctxkeep[{blocked}]" in str(info.value)


def test_importing_ctxkeep_and_its_llm_package_imports_no_sdk() -> None:
    program = (
        "import sys, ctxkeep, ctxkeep.llm\n"
        "assert ctxkeep.ChatClient is ctxkeep.llm.ChatClient\n"
        "print(sorted(m for m in ('openai', 'anthropic', 'httpx', 'httpx2') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if callable(fn) and not name.startswith("_")
    }


def test_the_async_client_mirrors_the_sync_one() -> None:
    sync, aio = _public(ChatClient), _public(AsyncChatClient)
    assert set(sync) == set(aio) == {"complete", "stream", "chat", "close"}
    for name in sync:
        assert [p.name for p in sync[name].parameters.values()] == [
            p.name for p in aio[name].parameters.values()
        ], name
        assert inspect.iscoroutinefunction(getattr(AsyncChatClient, name)), name
    assert set(_public(ChatStream)) == set(_public(AsyncChatStream)) == {"close", "final_result"}
    assert inspect.iscoroutinefunction(AsyncChatStream.final_result)


def test_options_may_not_set_what_the_client_sets(oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1")
    with pytest.raises(ConfigError, match="model"):
        client.complete([{"role": "user", "content": "x"}], options={"model": "gpt-5"})
    with pytest.raises(ConfigError, match="takes no 'tempreature'"):
        client.complete([{"role": "user", "content": "x"}], options={"tempreature": 0})
    with pytest.raises(ConfigError, match="not JSON"):
        client.complete([{"role": "user", "content": "x"}], options={"seed": float("nan")})
    assert oai.requests == []


def test_a_closed_stream_has_no_result(oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1")
    stream = client.stream([{"role": "user", "content": "x"}])
    stream.close()
    with pytest.raises(ctxkeep.CtxkeepError, match="closed"):
        stream.final_result()


# -- the summarizer -------------------------------------------------------------------------


HISTORY = [
    Message("user", "Find the config file."),
    Message(
        "assistant",
        None,
        tool_calls=[ctxkeep.ToolCall(id="c1", name="ls", arguments='{"path": "/etc"}')],
    ),
    Message("tool", "ctxkeep.toml\n" + "noise " * 5000, tool_call_id="c1"),
    Message("assistant", "It is /etc/ctxkeep.toml."),
]


def test_the_summarizer_sends_one_valid_fitted_prompt(oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1", context_window=3000)
    oai.push(Reply(body=openai_completion("  The config is /etc/ctxkeep.toml.  ")))
    summary = LLMSummarizer(client, max_tokens=200, max_message_chars=500).summarize(HISTORY)
    assert summary == "The config is /etc/ctxkeep.toml."
    (request,) = oai.requests
    system, user = request.body["messages"]
    assert system["role"] == "system"
    assert "-> calls ls" in user["content"] and "[tool result (c1)]" in user["content"]
    assert "characters cut" in user["content"]
    assert request.body["max_completion_tokens"] == 200


def test_a_transcript_over_the_window_keeps_the_newest_messages(oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1", context_window=1200)
    history = [Message("user", f"fact {i}: " + "detail " * 50) for i in range(40)]
    LLMSummarizer(client, max_tokens=100).summarize(history)
    content = oai.requests[0].body["messages"][1]["content"]
    assert "earlier messages omitted" in content
    assert "fact 39:" in content and "fact 0:" not in content


def test_the_pruner_uses_the_llm_summary(oai: ScriptedServer) -> None:
    client = ChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1")
    oai.push(Reply(body=openai_completion("Earlier: the user asked about configs.")))
    pruner = TokenPruner(
        600,
        preserve_last_n=1,
        summarizer=LLMSummarizer(client, max_tokens=100),
        summary_max_tokens=150,
    )
    history = [Message("user", f"q{i} " + "word " * 40) for i in range(20)]
    pruned, report = pruner.prune_with_report(history)
    assert any(m.event_kind == "summary" for m in pruned)
    assert "the user asked about configs" in " ".join(m.text for m in pruned)
    assert report.summary_error is None


def test_the_async_summarizer(oai: ScriptedServer) -> None:
    async def run() -> str:
        async with AsyncChatClient("gpt-4o", api_key="t", base_url=oai.url + "/v1") as client:
            return await AsyncLLMSummarizer(client).asummarize(HISTORY)

    assert asyncio.run(run()) == "ok"


def test_the_summarizer_needs_the_matching_client() -> None:
    with pytest.raises(InvalidTypeError, match="AsyncLLMSummarizer"):
        LLMSummarizer(AsyncChatClient("gpt-4o", api_key="t"))  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="LLMSummarizer"):
        AsyncLLMSummarizer(ChatClient("gpt-4o", api_key="t"))  # type: ignore[arg-type]


def test_anthropic_server_default_is_reachable() -> None:
    with running(anthropic_default) as server:
        client = ChatClient("claude-3-opus", api_key="t", base_url=server.url)
        assert client.complete([{"role": "user", "content": "hi"}]).text == "ok"
