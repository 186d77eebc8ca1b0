"""Estimated counts never overrun: ``run_agent`` with a ``ChatClient`` for a model with no
local tokenizer, against a local OpenAI-compatible server on 127.0.0.1 that counts prompts with
its own tokenizer (``_usage_server``), 50 steps of ~6 kB tool outputs in a 16,000-token window
with ``max_tokens`` 1,000. No request may be over ``window - max_tokens`` as the server counts
it (a vLLM server refuses ``prompt + max_tokens > max_model_len``), whether the server reports
its counts truthfully or absurdly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from _llm_servers import Reply, openai_completion, running
from _usage_server import UsageModel, read_chunk
from ctxkeep import CalibratedCounter, PromptTooLongError, open_memory
from ctxkeep.agent import run_agent
from ctxkeep.llm import ChatClient
from ctxkeep.llm._common import tools_text
from ctxkeep.tokens import estimate_margin

WINDOW = 16_000
MAX_TOKENS = 1_000
STEPS = 50


def local_client(url: str, **more: Any) -> ChatClient:
    """A client for a model with no local tokenizer, served at ``url`` (OpenAI's API)."""
    return ChatClient(
        "local-model",
        provider="openai",
        api_key="test",
        base_url=url + "/v1",
        context_window=WINDOW,
        **more,
    )


def run(report: Callable[[int], int]) -> tuple[UsageModel, ChatClient]:
    """A 50-step run against a server that reports ``report(its count)``."""
    model = UsageModel(STEPS + 10, report)
    with running(model) as server:
        client = local_client(server.url, memory=open_memory("memory://"))
        assert isinstance(client.counter, CalibratedCounter)
        result = run_agent(
            None,
            "read every chunk of the file and summarise it",
            [read_chunk],
            client=client,
            max_steps=STEPS,
            max_tokens=MAX_TOKENS,
        )
    assert result.steps == STEPS
    assert len(model.truths) == STEPS
    return model, client


def over(model: UsageModel) -> list[int]:
    """The requests over the window less the output, as the server counted them."""
    return [t for t in model.truths if t > WINDOW - MAX_TOKENS]


def test_a_truthful_server_with_another_tokenizer_gets_no_request_over_the_window() -> None:
    model, client = run(lambda truth: truth)
    assert max(model.truths) > 0.7 * (WINDOW - MAX_TOKENS)  # the window did fill
    assert over(model) == []
    counter = client.counter
    assert isinstance(counter, CalibratedCounter)
    assert counter.observations == STEPS and counter.ignored == 0


@pytest.mark.parametrize(
    "report",
    [lambda truth: 10, lambda truth: 10 * truth],
    ids=["ten tokens", "ten times the truth"],
)
def test_a_server_reporting_absurd_usage_gets_no_request_over_the_window(
    report: Callable[[int], int], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ctxkeep.tokens"):
        model, client = run(report)
    assert max(model.truths) > 0.7 * (WINDOW - MAX_TOKENS)
    assert over(model) == []
    counter = client.counter
    assert isinstance(counter, CalibratedCounter)
    assert counter.ignored == STEPS and counter.observations == 0
    ignored = [r for r in caplog.records if "ignored a report" in r.getMessage()]
    assert len(ignored) == STEPS


def test_the_client_gate_keeps_the_margin_with_tools_before_anything_is_sent() -> None:
    with running(lambda body: Reply(body=openai_completion())) as server:
        client = local_client(server.url)
        gate = client.gate_for(MAX_TOKENS)
        assert gate.max_prompt_tokens == WINDOW - MAX_TOKENS
        tools = [
            {
                "type": "function",
                "function": {"name": "read", "description": "Read. " * 200, "parameters": {}},
            }
        ]
        counter = client.counter
        tools_tokens = counter.count_text(tools_text(tools))
        # Kept on the limit less the tools, as the chat builder, which reserves them, keeps it.
        margin = estimate_margin(counter, WINDOW - MAX_TOKENS - tools_tokens)
        assert margin > 0
        text = "word "
        while counter.count_messages([{"role": "user", "content": text + "word " * 100}]) <= (
            WINDOW - MAX_TOKENS - gate.margin
        ):
            text += "word " * 100
        prompt_tokens = counter.count_messages([{"role": "user", "content": text}])
        # The messages alone fit the limit less its margin; with the tools and the margin on
        # the limit less the tools, they do not; without a margin they would.
        assert prompt_tokens + gate.margin <= WINDOW - MAX_TOKENS
        assert prompt_tokens + tools_tokens + margin > WINDOW - MAX_TOKENS
        assert prompt_tokens + tools_tokens < WINDOW - MAX_TOKENS
        with pytest.raises(PromptTooLongError) as info:
            client.complete([{"role": "user", "content": text}], tools=tools, max_tokens=MAX_TOKENS)
        assert info.value.breakdown["estimate_margin"] == margin
        assert info.value.breakdown["tools"] == tools_tokens
        assert server.requests == []
