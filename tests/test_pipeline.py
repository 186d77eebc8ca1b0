"""The one prompt pipeline: every caller reads a session the way its pruner needs, and builds
within one budget rule and one recall policy.

Real parts: sessions on memory://, SQLite, Redis and PostgreSQL (a new ``MemoryManager`` over
the same store stands for a new process), the real pruner, counter and builder.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep import (
    CalibratedCounter,
    ConfigError,
    ContextBuilder,
    InvalidSettingError,
    MemoryConfig,
    MemoryManager,
    Message,
    TokenPruner,
    ToolCall,
    get_counter,
    open_memory,
)
from ctxkeep.builder.compose import (
    RecallPolicy,
    must_keep_tokens,
    prompt_budget,
    recall_room,
    recall_then_fit,
)
from ctxkeep.errors import BudgetExceededError

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

COUNTER = get_counter("o200k_base")
UNBOUNDED = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store two managers can share (a new manager over it is a new process's view)."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sessions.db'}"
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix_factory")()
        yield f"{url}?{urlencode({'prefix': prefix})}"
    else:
        yield request.getfixturevalue("postgres_schema_factory")()


def _grow(mem: MemoryManager, sid: str, steps: int, *, start: int = 0) -> None:
    """A coding agent's steps: a question, a tool call, a 2-3 kB output, an answer."""
    for i in range(start, start + steps):
        mem.add_message(sid, "user", f"step {i}: what does file {i} hold?")
        call = ToolCall(id=f"call_{i}", name="read", arguments=json.dumps({"n": i}))
        mem.add_message(sid, "assistant", None, tool_calls=[call])
        mem.add_message(sid, "tool", f"{i} line of output\n" * (120 + i % 40), tool_call_id=call.id)
        mem.add_message(sid, "assistant", f"file {i} holds lines")


def _openai(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_openai() for m in messages]


def _manager(url: str, shared: MemoryManager) -> MemoryManager:
    """A second manager over the same store (a new process); memory:// shares the backend."""
    if url == "memory://":
        return MemoryManager(shared.backend, shared.config)
    return open_memory(url, UNBOUNDED)


@pytest.mark.parametrize("cache_stable", [True, False])
def test_a_new_process_builds_from_what_the_pruner_needs_not_the_whole_session(
    store_url: str, cache_stable: bool
) -> None:
    with open_memory(store_url, UNBOUNDED) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "system", "You are a careful coding agent.")
        _grow(mem, sid, 60)
        for turn in range(3):  # an agent loop's earlier turns (they leave a fold snapshot)
            ContextBuilder(mem, max_prompt_tokens=4000, cache_stable=cache_stable).build(sid)
            _grow(mem, sid, 2, start=60 + 2 * turn)
        warm = ContextBuilder(mem, max_prompt_tokens=4000, cache_stable=cache_stable).build(sid)
        cold_mem = _manager(store_url, mem)
        try:
            cold = ContextBuilder(cold_mem, max_prompt_tokens=4000, cache_stable=cache_stable)
            built = cold.build(sid)
        finally:
            if cold_mem is not mem and store_url != "memory://":
                cold_mem.close()
        assert _openai(built.messages) == _openai(warm.messages)
        held = mem.get_session(sid).message_count
        report = built.report.prune
        assert 0 < report.unread < held  # read from the snapshot or the newest pages
        # The decisions name the session's own positions: each kept message is the stored one.
        stored = mem.get_messages(sid)
        kept = {m.id for m in built.messages}
        for d in report.decisions:
            if d.action == "kept":
                assert stored[d.index].id in kept
        assert report.count("dropped") >= report.unread


def test_the_pruners_report_counts_every_message_read_or_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_memory(url, UNBOUNDED) as mem:
        sid = mem.create_session("agent")
        _grow(mem, sid, 40)
        pruner = TokenPruner(3000, 4, counter=COUNTER, cache_stable=False)
        whole = pruner.prune_with_report(mem.get_messages(sid))[1]
    with open_memory(url, UNBOUNDED) as cold:
        read = cold.build_prompt(
            sid, pruner=TokenPruner(3000, 4, counter=COUNTER, cache_stable=False)
        )
    assert read.report is not None
    report = read.report
    assert report.unread > 0
    assert len(report.decisions) + report.unread == len(whole.decisions)
    by_index = {d.index: d for d in whole.decisions}
    for d in report.decisions:
        assert by_index[d.index] == d
    for action in ("kept", "compressed", "dropped"):
        assert report.count(action) == whole.count(action)


def test_the_builder_reports_the_newest_user_message_of_a_partial_read(tmp_path: Path) -> None:
    with open_memory(f"sqlite:///{tmp_path / 's.db'}", UNBOUNDED) as mem:
        sid = mem.create_session("agent")
        _grow(mem, sid, 30)
        for i in range(70):  # a long tool loop: the newest user message is pages back
            c = ToolCall(id=f"loop_{i}", name="read", arguments="{}")
            mem.add_message(sid, "assistant", None, tool_calls=[c])
            mem.add_message(sid, "tool", f"out {i} " * 40, tool_call_id=c.id)
        builder = ContextBuilder(mem, episodic=_store(), max_prompt_tokens=3000, cache_stable=False)
        built = builder.build(sid)
    assert built.report.query == "step 29: what does file 29 hold?"
    assert any(m.text == "step 29: what does file 29 hold?" for m in built.messages)


# -- one budget rule ---------------------------------------------------------------------------


def test_the_budget_rule_keeps_a_margin_only_for_an_estimate() -> None:
    assert prompt_budget(16_000, 1_000, tools=500, counter=COUNTER) == 14_500
    estimate = CalibratedCounter("local-model")
    budget = prompt_budget(16_000, 1_000, tools=500, counter=estimate)
    assert budget < 14_500 * 0.95  # at least the floor, more before calibration
    assert prompt_budget(100, 200) == -100  # nothing fits: the caller says what is in the way


def test_the_builder_budget_keeps_the_estimates_margin_and_the_gate_the_window() -> None:
    estimate = CalibratedCounter("local-model")
    with open_memory("memory://") as mem:
        builder = ContextBuilder(
            mem, counter=estimate, max_prompt_tokens=16_000, reserve_output_tokens=1_000
        )
        assert builder.prompt_limit == 15_000
        assert builder.prompt_budget == prompt_budget(16_000, 1_000, counter=estimate) < 15_000
        assert builder.gate.max_prompt_tokens == 15_000
        exact = ContextBuilder(mem, max_prompt_tokens=16_000, reserve_output_tokens=1_000)
        assert exact.prompt_budget == exact.prompt_limit == 15_000


# -- one recall policy -------------------------------------------------------------------------


def _store() -> Any:
    from ctxkeep import open_episodic

    store = open_episodic("memory://", embedder="hash")
    for i in range(6):
        store.save_episode(
            f"old-{i}",
            f"fix the flaky timezone test number {i}",
            "pinned TZ=UTC in conftest; the test passed after " + "the retry " * 60,
        )
    return store


def test_recall_never_takes_the_room_of_what_the_pruner_keeps() -> None:
    system = Message("system", "You are a coding agent. " * 20)
    user = Message("user", "Why does the timezone test fail? " * 30)
    must = must_keep_tokens(COUNTER, [system], user)
    budget = must + 150
    room = recall_room(budget, must, 1500)
    assert room == 150
    store = _store()
    calls: list[str] = []

    def fit(prior: str) -> int:
        calls.append(prior)
        text = system.text + ("\n\n" + prior if prior else "")
        return COUNTER.count_messages([Message("system", text), user])

    tokens, hits, prior = recall_then_fit(
        fit,
        query=user.text,
        room=room,
        recall=RecallPolicy(store, max_tokens=1500),
        counter=COUNTER,
    )
    assert hits and prior  # something fit
    assert COUNTER.count_text(prior) <= room
    assert tokens <= budget + 8  # the block joined counts within a few tokens of itself


def test_recall_yields_when_the_joined_block_tips_the_budget() -> None:
    store = _store()
    seen: list[str] = []

    def fit(prior: str) -> str:
        seen.append(prior)
        if prior:
            raise BudgetExceededError(budget=10, required=11, blocking=["the block"])
        return "fitted"

    got, hits, prior = recall_then_fit(
        fit, query="timezone test", room=1000, recall=RecallPolicy(store), counter=COUNTER
    )
    assert (got, hits, prior) == ("fitted", [], "")
    assert seen[0] and seen[1] == ""


# -- one error for one mistake -----------------------------------------------------------------


def test_a_bad_cache_stable_is_the_same_error_everywhere() -> None:
    from ctxkeep.integrations.langchain import ContextMiddleware
    from ctxkeep.integrations.openai_agents import ctxkeep_input_filter

    makers: list[Callable[[], Any]] = [
        lambda: ContextBuilder(open_memory("memory://"), cache_stable=1),  # type: ignore[arg-type]
        lambda: ctxkeep_input_filter(max_tokens=1000, cache_stable=1),  # type: ignore[arg-type]
        lambda: ContextMiddleware(max_tokens=1000, cache_stable=1),  # type: ignore[arg-type]
    ]
    makers.append(lambda: TokenPruner(cache_stable=1))  # type: ignore[arg-type]
    for make in makers:
        with pytest.raises(InvalidSettingError, match="cache_stable must be True"):
            make()
    assert issubclass(InvalidSettingError, ConfigError) and issubclass(
        InvalidSettingError, TypeError
    )
