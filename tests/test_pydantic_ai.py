"""ctxkeep as a pydantic-ai history processor: real agents, random histories, round trips."""

from __future__ import annotations

import asyncio
import copy
import random
import re
import subprocess
import sys
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import (
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ctxkeep import TokenPruner, get_counter
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
)
from ctxkeep.integrations.pydantic_ai import (
    ProcessHistory,
    count_tokens,
    from_messages,
    to_messages,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REF = re.compile(r"sha256:[0-9a-f]{64}")
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def check_well_formed(messages: list[ModelMessage]) -> None:
    """Every ToolCallPart is answered in the request right after its response, and every tool
    answer answers a call of the response right before it.
    """
    assert messages, "empty history"
    assert isinstance(messages[-1], ModelRequest), "history must end with a ModelRequest"
    pending: set[str] = set()
    for i, m in enumerate(messages):
        if isinstance(m, ModelResponse):
            assert not pending, f"message {i}: calls {pending} unanswered before a response"
            pending = {p.tool_call_id for p in m.parts if isinstance(p, ToolCallPart)}
            continue
        answers = {
            p.tool_call_id
            for p in m.parts
            if isinstance(p, ToolReturnPart)
            or (isinstance(p, RetryPromptPart) and p.tool_name is not None)
        }
        assert answers <= pending, f"message {i}: orphan tool returns {answers - pending}"
        assert pending <= answers, f"message {i}: calls {pending - answers} unanswered"
        pending = set()


def log_text(n: int, chars: int) -> str:
    line = f"tests/test_{n}.py::test_case PASSED\n"
    return (line * (chars // len(line) + 1))[:chars]


# -- a real agent ------------------------------------------------------------------------------


def test_agent_keeps_every_request_within_budget_and_well_formed() -> None:
    budget = 6000
    counter = get_counter("o200k_base")
    keep = ProcessHistory(max_tokens=budget, preserve_last_n=4, counter=counter)
    rng = random.Random(7)
    sizes = {n: rng.randint(5_000, 20_000) for n in range(200)}
    seen: list[int] = []
    step = made = 0

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal step, made
        check_well_formed(messages)
        seen.append(count_tokens(messages, counter))
        step += 1
        if step > 30:
            return ModelResponse(parts=[TextPart("All logs read.")])
        calls = [ToolCallPart("read_log", {"n": 2 * step})]
        if step % 3 == 0:  # parallel calls, one of them retried by the tool
            calls.append(ToolCallPart("read_log", {"n": 2 * step + 1}))
        if step % 5 == 0:
            calls.append(ToolCallPart("flaky", {"n": step}))
        made += len(calls)
        return ModelResponse(parts=[ThinkingPart(f"step {step}"), TextPart("Reading."), *calls])

    agent = Agent(
        FunctionModel(model),
        system_prompt="You read CI logs.",
        capabilities=[keep.as_capability()],
    )

    @agent.tool_plain
    def read_log(n: int) -> str:
        return log_text(n, sizes[n])

    tries: dict[int, int] = {}

    @agent.tool_plain(retries=10)
    def flaky(n: int) -> str:
        tries[n] = tries.get(n, 0) + 1
        if tries[n] == 1:
            raise ModelRetry("try again")
        return "ok"

    # asyncio.run, not run_sync: run_sync leaves its event loop open as the current loop.
    result = asyncio.run(agent.run("Read the logs."))
    assert result.output == "All logs read."
    assert made >= 30
    assert len(seen) == 31
    assert max(seen) <= budget
    outputs = sum(counter.count_text(log_text(2 * s, sizes[2 * s])) for s in range(1, 31))
    assert outputs > 5 * budget  # the tool outputs alone were many budgets
    assert keep.last_report is not None
    assert REF.search(str(result.all_messages())), "some tool return was compressed"


def log_history(calls: int = 4, chars: int = 9000) -> list[ModelMessage]:
    """A system and user prompt, then ``calls`` tool calls each returning ``chars`` of log."""
    history: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart("sys"), UserPromptPart("go")]),
    ]
    for n in range(calls):
        history += [
            ModelResponse(parts=[ToolCallPart("read_log", {"n": n}, tool_call_id=f"c{n}")]),
            ModelRequest(parts=[ToolReturnPart("read_log", log_text(n, chars), f"c{n}")]),
        ]
    return history


def test_compressed_tool_return_reads_back_in_full() -> None:
    keep = ProcessHistory(max_tokens=2500, preserve_last_n=2, cache_stable=False)
    history = log_history()
    outputs = {f"c{n}": log_text(n, 9000) for n in range(4)}
    out, report = keep.process_with_report(history)
    compressed = [
        p
        for m in out
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.content != outputs[p.tool_call_id]
    ]
    assert compressed
    for part in compressed:
        ref = REF.search(str(part.content))
        assert ref is not None
        assert keep.artifacts.get(ref.group(0)) == outputs[part.tool_call_id]
        original = next(
            p
            for m in history
            for p in m.parts
            if isinstance(p, ToolReturnPart) and p.tool_call_id == part.tool_call_id
        )
        assert (part.tool_name, part.timestamp) == (original.tool_name, original.timestamp)
    refs = {d.artifact_ref for d in report.decisions if d.action == "compressed"}
    assert refs == {REF.search(str(p.content)).group(0) for p in compressed}  # type: ignore[union-attr]


# -- round trips -------------------------------------------------------------------------------


def rich_history() -> list[ModelMessage]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # RetryPromptPart is deprecated; old histories hold it
        retry = RetryPromptPart("bad args", tool_name="search", tool_call_id="c2", timestamp=T0)
    return [
        ModelRequest(
            parts=[
                SystemPromptPart("You are terse.", timestamp=T0, dynamic_ref="sp"),
                UserPromptPart(["Look at", ImageUrl("https://example.com/a.png")], timestamp=T0),
            ],
            instructions="Answer briefly.",
            timestamp=T0,
            run_id="run-1",
            metadata={"app": 1},
        ),
        ModelResponse(
            parts=[
                ThinkingPart("hmm", signature="sig", provider_name="anthropic"),
                TextPart("Searching.", provider_details={"x": 1}, provider_name="anthropic"),
                ToolCallPart("search", {"q": "a"}, tool_call_id="c1"),
                ToolCallPart("search", '{"q": "b"}', tool_call_id="c2"),
            ],
            model_name="m",
            timestamp=T0,
            provider_response_id="resp-1",
        ),
        ModelRequest(
            parts=[
                ToolReturnPart("search", {"hits": [1, 2]}, "c1", timestamp=T0, metadata="m"),
                retry,
                UserPromptPart("also this", timestamp=T0),
            ],
            timestamp=T0,
        ),
        ModelResponse(parts=[TextPart("Done.")], timestamp=T0),
        ModelRequest(parts=[UserPromptPart("thanks", timestamp=T0)], timestamp=T0),
    ]


def test_round_trip_gives_back_the_same_objects() -> None:
    history = rich_history()
    back = from_messages(to_messages(history))
    assert len(back) == len(history)
    assert all(a is b for a, b in zip(back, history, strict=True))


def test_round_trip_survives_ctxkeep_copies() -> None:
    history = rich_history()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # copying the deprecated RetryPromptPart warns
        snapshot = copy.deepcopy(history)
    copied = [m.copy() for m in to_messages(history)]
    back = from_messages(copied)
    assert back == snapshot
    assert all(a is b for a, b in zip(back, history, strict=True))


def test_a_request_of_several_parts_maps_to_one_message_per_part_tool_answers_first() -> None:
    msgs = to_messages(rich_history())
    roles = [m.role for m in msgs]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "assistant", "user"]
    assert [m.tool_call_id for m in msgs[3:5]] == ["c1", "c2"]
    assert [c.id for c in msgs[2].tool_calls] == ["c1", "c2"]
    assert msgs[3].content == '{"hits":[1,2]}'


def test_a_request_that_loses_a_part_keeps_its_other_fields() -> None:
    history = rich_history()
    msgs = to_messages(history)
    kept = [m for m in msgs if m.role != "system" and m.text != "also this"]
    back = from_messages(kept)
    req = back[2]
    assert isinstance(req, ModelRequest)
    assert req is not history[2]
    assert req.parts == [history[2].parts[0], history[2].parts[1]]
    assert (req.timestamp, req.instructions, req.run_id) == (T0, None, None)
    first = back[0]
    assert isinstance(first, ModelRequest) and first.parts == [history[0].parts[1]]
    assert first.instructions == "Answer briefly." and first.metadata == {"app": 1}


def test_count_tokens_counts_what_the_budget_counts() -> None:
    counter = get_counter("cl100k_base")
    history = rich_history()
    assert count_tokens(history, counter) == counter.count_messages(to_messages(history))
    keep = ProcessHistory(max_tokens=10_000, counter="cl100k_base")
    assert keep.count_tokens(history) == count_tokens(history, counter)


# -- properties on random histories ------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[ModelMessage]:
    first: list[Any] = [UserPromptPart("Start.")]
    if draw(st.booleans()):
        first.insert(0, SystemPromptPart("System prompt."))
    out: list[ModelMessage] = [ModelRequest(parts=first)]
    n_calls = 0
    for _ in range(draw(st.integers(0, 14))):
        k = draw(st.integers(0, 3))
        parts: list[Any] = []
        if draw(st.booleans()):
            parts.append(TextPart("Thinking about it." * draw(st.integers(1, 5))))
        calls = []
        for _ in range(k):
            n_calls += 1
            calls.append(ToolCallPart("tool", {"n": n_calls}, tool_call_id=f"call{n_calls}"))
        out.append(ModelResponse(parts=parts + calls or [TextPart("ok")]))
        req: list[Any] = [
            ToolReturnPart("tool", log_text(n_calls, draw(st.integers(0, 6000))), c.tool_call_id)
            for c in calls
        ]
        if not calls or draw(st.booleans()):
            req.append(UserPromptPart("Next."))
        draw(st.randoms()).shuffle(req)
        out.append(ModelRequest(parts=req))
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    history=histories(),
    budget=st.integers(150, 4000),
    preserve=st.integers(0, 8),
    stable=st.booleans(),
)
def test_processed_history_is_valid_within_budget_and_input_untouched(
    history: list[ModelMessage], budget: int, preserve: int, stable: bool
) -> None:
    snapshot = copy.deepcopy(history)
    ids = [id(m) for m in history]
    keep = ProcessHistory(max_tokens=budget, preserve_last_n=preserve, cache_stable=stable)
    out = keep(history)
    check_well_formed(out)
    assert keep.count_tokens(out) <= budget
    assert history == snapshot and [id(m) for m in history] == ids
    # The newest user prompt is never dropped.
    newest = next(p for m in reversed(history) for p in m.parts if isinstance(p, UserPromptPart))
    assert any(p is newest for m in out for p in m.parts)
    # Responses come back as the very objects they were; a request's parts are its original
    # parts, or a tool return compressed to a text that names where its full output is.
    parts = {id(p) for m in history for p in m.parts}
    for m in out:
        if isinstance(m, ModelResponse):
            assert any(m is h for h in history)
            continue
        for p in m.parts:
            if id(p) not in parts:
                assert isinstance(p, ToolReturnPart) and REF.search(str(p.content))
                ref = REF.search(str(p.content))
                assert ref is not None and keep.artifacts.get(ref.group(0))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_round_trip_of_random_histories_is_exact(history: list[ModelMessage]) -> None:
    back = from_messages(to_messages(history))
    assert len(back) == len(history)
    assert all(a is b for a, b in zip(back, history, strict=True))


# -- repairs and edges -------------------------------------------------------------------------


def test_unanswered_call_in_the_middle_gets_a_result_with_its_tool_name() -> None:
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("go")]),
        ModelResponse(parts=[ToolCallPart("lost", {}, tool_call_id="c1")]),
        ModelRequest(parts=[UserPromptPart("where is it?")]),
    ]
    out = ProcessHistory(max_tokens=1000)(history)
    check_well_formed(out)
    ret = next(p for m in out for p in m.parts if isinstance(p, ToolReturnPart))
    assert (ret.tool_name, ret.tool_call_id) == ("lost", "c1")
    last = out[-1]
    assert isinstance(last, ModelRequest) and last.parts[-1] is history[2].parts[0]


def test_history_ending_with_a_response_keeps_it_last_within_budget() -> None:
    history = log_history()
    history.append(ModelResponse(parts=[TextPart("To be continued " * 50)], state="suspended"))
    keep = ProcessHistory(max_tokens=2500)
    out = keep(history)
    assert out[-1] is history[-1]
    assert keep.count_tokens(out) <= 2500
    check_well_formed(out[:-1])


def test_bad_input_gets_typed_errors() -> None:
    keep = ProcessHistory(max_tokens=1000)
    with pytest.raises(InvalidTypeError, match="list of pydantic-ai ModelMessage"):
        keep("hello")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="message 1: expected a pydantic-ai"):
        keep([ModelRequest(parts=[UserPromptPart("hi")]), {"role": "user"}])  # type: ignore[list-item]
    with pytest.raises(InvalidMessageError, match="history is empty"):
        keep([])
    with pytest.raises(InvalidMessageError, match=r"message 0: .*tool_call_id"):
        to_messages([ModelRequest(parts=[ToolReturnPart("t", "x", "")])])


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="either pruner or"):
        ProcessHistory(max_tokens=100, pruner=TokenPruner(100))
    with pytest.raises(ConfigError, match="TokenPruner"):
        ProcessHistory(pruner="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ProcessHistory(max_tokens=0)
    assert ProcessHistory(pruner=TokenPruner(123)).max_tokens == 123


def test_a_system_prompt_over_the_budget_is_refused() -> None:
    history: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart("rule " * 500), UserPromptPart("hi")])
    ]
    with pytest.raises(BudgetExceededError, match="cannot fit the prompt in 100 tokens"):
        ProcessHistory(max_tokens=100)(history)


def test_a_history_of_only_tool_returns_that_cannot_fit_is_refused() -> None:
    history: list[ModelMessage] = [
        ModelResponse(parts=[ToolCallPart("t", {}, tool_call_id="c")]),
        ModelRequest(parts=[ToolReturnPart("t", "x " * 5000, "c")]),
    ]
    with pytest.raises(BudgetExceededError, match="last request's tool message"):
        ProcessHistory(max_tokens=20)(history)


# -- the example -------------------------------------------------------------------------------


def test_pydantic_ai_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "pydantic_ai_agent.py"), "--steps", "12"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"(\d+) requests, largest (\d+) tokens \(budget (\d+)\)", proc.stdout)
    assert m is not None, proc.stdout
    requests, largest, budget = map(int, m.groups())
    assert requests == 13 and largest <= budget
    assert re.search(r"read back in full: [1-9]\d* chars", proc.stdout)
