"""The cache-stable pruner: prompts of a growing history share their prefix between cuts.

Its other promises are the default mode's: a hard budget, whole tool units, the system
messages and the newest user message kept, lossless compression, a report for every message.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep import (
    BudgetExceededError,
    ConfigError,
    Message,
    PruneReport,
    TokenPruner,
    ToolCall,
    get_counter,
    validate_sequence,
)
from ctxkeep.anthropic_cache import place_cache_breakpoints
from test_prune import histories

COUNTER = get_counter("o200k_base")


def _wire(msgs: list[Message]) -> list[str]:
    """A prompt as the provider sees it: each message's serialised form."""
    return [json.dumps(m.to_openai(), sort_keys=True) for m in msgs]


def _steps(history: list[Message]) -> list[int]:
    """Where an agent loop would prune: before every assistant message, and at the end."""
    return [k for k in range(1, len(history)) if history[k].role == "assistant"] + [len(history)]


def _stable(budget: int, last_n: int = 2, **kw: object) -> TokenPruner:
    return TokenPruner(budget, last_n, counter=COUNTER, cache_stable=True, **kw)  # type: ignore[arg-type]


def _agent_run(steps: int = 30, size: int = 120) -> list[Message]:
    msgs = [Message("system", "You are an agent."), Message("user", "Do the task.")]
    for i in range(steps):
        tc = ToolCall(id=f"call_{i}", name="bash", arguments=json.dumps({"command": f"ls {i}"}))
        msgs.append(Message("assistant", f"step {i}", tool_calls=[tc]))
        msgs.append(Message("tool", f"line {i} of output\n" * size, tool_call_id=tc.id))
    return msgs


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(40, 3000), last_n=st.integers(0, 8))
def test_between_cuts_each_prompt_starts_with_the_previous_one(
    history: list[Message], budget: int, last_n: int
) -> None:
    pruner = _stable(budget, last_n, compress_oversized_user=False)
    prev: list[str] | None = None
    prev_cut: list[str] = []
    for k in _steps(history):
        try:
            out, report = pruner.prune_with_report(history[:k])
        except BudgetExceededError:
            prev = None
            continue
        wire = _wire(out)
        cut = [n for n in report.notes if n.startswith("cache-stable: cut")]
        assert report.stable_prefix_messages is not None
        if prev is not None and wire[: len(prev)] != prev:
            assert cut and cut != prev_cut  # only a new cut changes the prefix
        prev, prev_cut = wire, cut


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(40, 3000), last_n=st.integers(0, 8))
def test_cache_stable_keeps_every_guarantee_of_the_default_mode(
    history: list[Message], budget: int, last_n: int
) -> None:
    before = [m.copy() for m in history]
    pruner = _stable(budget, last_n, compress_oversized_user=False)
    for k in _steps(history):
        prompt = history[:k]
        try:
            out, report = pruner.prune_with_report(prompt)
        except BudgetExceededError as exc:
            assert exc.required > budget
            continue
        validate_sequence(out)
        assert COUNTER.count_messages(out) == report.tokens_after <= budget
        assert sum(report.sections.values()) == report.tokens_after
        for m in prompt:
            if m.is_system:
                assert m in out
        users = [m for m in prompt if m.role == "user"]
        if users:
            assert users[-1] in out
        positions = [int(m.id[1:]) for m in out if m.id is not None]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        decisions = report.decisions
        assert [d.index for d in decisions] == list(range(len(prompt)))
        assert sum(1 for d in decisions if d.action in ("kept", "compressed")) == len(out)
        for d in decisions:
            if d.action == "compressed":
                assert d.artifact_ref is not None
                assert pruner.artifacts.get(d.artifact_ref) == prompt[d.index].text
    assert history == before


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(40, 3000), last_n=st.integers(0, 8))
def test_the_prompt_is_a_function_of_the_history_alone(
    history: list[Message], budget: int, last_n: int
) -> None:
    # One pruner that saw every step, one that saw only the last, and one that pruned an
    # unrelated history in between: the same prompt.
    warm, other = _stable(budget, last_n), _stable(budget, last_n)
    results = []
    for k in _steps(history):
        for pruner in (warm, other):
            try:
                pruner.prune(history[:k])
                pruner.prune(_agent_run(3, 5))
            except BudgetExceededError:
                pass
    for pruner in (warm, other, _stable(budget, last_n)):
        try:
            results.append(_wire(pruner.prune(history)))
        except BudgetExceededError as exc:
            results.append([str(exc)])
    assert results[0] == results[1] == results[2]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(40, 3000), last_n=st.integers(0, 8))
def test_a_report_stays_as_it_was_while_the_pruner_goes_on(
    history: list[Message], budget: int, last_n: int
) -> None:
    # The fold shares its lists with the plans it returns while nothing is added: a later
    # prune (the same input, or a longer one) must never change an earlier report.
    pruner = _stable(budget, last_n)
    dicts = [m.to_openai() for m in history]
    reports = []
    for k in _steps(history):
        for _ in range(2):
            with contextlib.suppress(BudgetExceededError):
                _, report = pruner.prune_with_report(dicts[:k])
                reports.append((report, _decided(report)))
    for report, seen in reports:
        assert _decided(report) == seen


def _decided(report: PruneReport) -> list[tuple[object, ...]]:
    """Every decision of ``report`` with the input message it is about."""
    return [
        (d.index, d.role, d.action, d.tokens_before, d.tokens_after, json.dumps(m.to_openai()))
        for d, m in zip(report.decisions, report._messages, strict=True)
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(40, 3000), cut=st.integers(1, 20))
def test_a_trimmed_history_is_pruned_as_it_now_is(
    history: list[Message], budget: int, cut: int
) -> None:
    pruner = _stable(budget, 2)
    trimmed = history[min(cut, len(history) - 1) :]
    with contextlib.suppress(BudgetExceededError):
        pruner.prune(history)
    try:
        got = _wire(pruner.prune(trimmed))
    except BudgetExceededError as exc:
        got = [str(exc)]
    try:
        fresh = _wire(_stable(budget, 2).prune(trimmed))
    except BudgetExceededError as exc:
        fresh = [str(exc)]
    assert got == fresh


# -- behaviours ---------------------------------------------------------------------------------


def test_a_growing_agent_run_is_cut_in_jumps_to_the_low_water_mark() -> None:
    run = _agent_run(steps=40, size=60)
    pruner = _stable(3000, 2, low_water=0.6)
    prev: list[str] = []
    cuts = 0
    for k in _steps(run):
        out, report = pruner.prune_with_report(run[:k])
        wire = _wire(out)
        if prev and wire[: len(prev)] != prev:
            cuts += 1
            assert report.tokens_after <= 0.6 * 3000 + 400  # low water plus the newest unit
        prev = wire
    default_changes = 0
    default = TokenPruner(3000, 2, counter=COUNTER, cache_stable=False)
    prev = []
    for k in _steps(run):
        wire = _wire(default.prune(run[:k]))
        default_changes += bool(prev) and wire[: len(prev)] != prev
        prev = wire
    assert 0 < cuts < default_changes / 3


def test_a_compressed_output_stays_compressed_the_same_way() -> None:
    run = _agent_run(steps=30, size=120)
    pruner = _stable(4000, 2)
    compressed: dict[str, str] = {}
    for k in _steps(run):
        for m in pruner.prune(run[:k]):
            if m.role != "tool":
                continue
            key = m.tool_call_id or ""
            if key in compressed:
                assert m.text == compressed[key]
            elif "ctxkeep_compressed" in m.metadata:
                compressed[key] = m.text
    assert compressed


def test_an_older_user_message_before_the_cut_stays_until_the_next_cut() -> None:
    run = _agent_run(steps=12, size=60)
    pruner = _stable(2500, 2, keep_first=0)  # the first user message is no task here
    before = _wire(pruner.prune(run))
    grown = [*run, Message("user", "and also check the tests")]
    assert Message("user", "Do the task.") in pruner.prune(run)  # pinned, before the cut
    out, report = pruner.prune_with_report(grown)
    assert _wire(out)[: len(before)] == before
    assert report.decisions[1].reason.startswith("kept for a stable prompt prefix")
    assert grown[-1] in out


def test_summarizer_and_cache_stable_are_refused_together() -> None:
    class S:
        def summarize(self, messages: list[Message]) -> str:
            return "s"

    with pytest.raises(ConfigError):
        TokenPruner(1000, cache_stable=True, summarizer=S())


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, "0.7", True])
def test_bad_low_water_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError):
        TokenPruner(1000, cache_stable=True, low_water=bad)  # type: ignore[arg-type]


def test_default_mode_reports_no_stable_prefix() -> None:
    pruner = TokenPruner(3000, 2, counter=COUNTER, cache_stable=False)
    _, report = pruner.prune_with_report(_agent_run(5, 5))
    assert report.stable_prefix_messages is None


# -- Anthropic breakpoints ----------------------------------------------------------------------


def _marked(payload: object) -> list[tuple[str, int, int]]:
    out = []
    p = payload  # AnthropicPayload
    for b, block in enumerate(p.system):  # type: ignore[attr-defined]
        if "cache_control" in block:
            out.append(("system", 0, b))
    for i, m in enumerate(p.messages):  # type: ignore[attr-defined]
        if isinstance(m["content"], list):
            for b, block in enumerate(m["content"]):
                if "cache_control" in block:
                    out.append(("messages", i, b))
    return out


def test_breakpoints_go_on_the_system_the_stable_prefix_and_the_end() -> None:
    run = _agent_run(steps=6, size=5)
    out = _stable(100_000, 2).prune(run)
    payload = place_cache_breakpoints(out, stable_prefix=4)
    marks = _marked(payload)
    n = len(payload.messages)
    # system; message 3 of the prompt is the first tool result -> payload message 2; the end
    assert marks == [("system", 0, 0), ("messages", 2, 0), ("messages", n - 1, 0)]
    assert payload.messages[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_breakpoints_never_exceed_the_limit_and_take_a_ttl() -> None:
    run = _agent_run(steps=6, size=5)
    payload = place_cache_breakpoints(run, stable_prefix=4, ttl="1h", max_breakpoints=2)
    marks = _marked(payload)
    assert len(marks) == 2
    assert payload.messages[-1]["content"][-1]["cache_control"] == {
        "type": "ephemeral",
        "ttl": "1h",
    }
    with pytest.raises(ConfigError):
        place_cache_breakpoints(run, max_breakpoints=5)


def test_a_string_message_at_the_end_becomes_a_marked_text_block() -> None:
    payload = place_cache_breakpoints([Message("system", "s"), Message("user", "hello")])
    assert payload.messages[0]["content"] == [
        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}
    ]
    assert payload.system[0]["cache_control"] == {"type": "ephemeral"}


def test_a_failed_cut_does_not_pin_an_older_user_message() -> None:
    # The first user message alone overflows the budget (no prompt for it); once a newer one
    # arrives, the older one is an ordinary recent unit again and is dropped to fit.
    history = [Message("user", "alpha alpha alpha" * 20), Message("user", "alpha")]
    pruner = _stable(60, 6, compress_oversized_user=False)
    with pytest.raises(BudgetExceededError):
        pruner.prune(history[:1])
    assert pruner.prune(history) == history[1:]
