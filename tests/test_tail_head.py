"""The paged-read proof with the conversation's head (``keep_first``): a prompt from a
session's newest messages, its marks and its head is the prompt of the whole session, or None.

The marks are made here as the contract of :func:`~ctxkeep.prune.tail.prompt_from_tail`
says a session store makes them; the store's own reads are tested in ``test_sessions_tail``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep.messages import SYSTEM_ROLES, Message, ToolCall, missing_content
from ctxkeep.prune import TokenPruner
from ctxkeep.prune.tail import prompt_from_tail
from ctxkeep.tokens import get_counter

COUNTER = get_counter("o200k_base")
WORDS = ["alpha", "beta", "fix", "the", "bug", "in", "parser", "42", "\n"]


def _text(draw: Any, most: int) -> str:
    return " ".join(draw(st.sampled_from(WORDS)) for _ in range(draw(st.integers(1, most))))


@st.composite
def sessions(draw: Any) -> list[Message]:
    """Valid sessions: a task first (or after a greeting), tool units, users, systems."""
    out: list[Message] = []
    if draw(st.booleans()):
        out.append(Message("system", _text(draw, 20)))
    if draw(st.booleans()):
        out.append(Message("assistant", "How can I help?"))
    out.append(Message("user", _text(draw, draw(st.sampled_from([20, 400])))))
    calls = 0
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["user", "assistant", "tool", "tool", "tool", "system"]))
        if kind == "tool":
            ids = [f"c{calls + k}" for k in range(draw(st.integers(1, 2)))]
            calls += len(ids)
            out.append(
                Message("assistant", None, tool_calls=[ToolCall(i, "run", "{}") for i in ids])
            )
            big = draw(st.integers(0, 3)) == 0
            out += [Message("tool", _text(draw, 500 if big else 30), tool_call_id=i) for i in ids]
        else:
            out.append(Message(kind, _text(draw, 80)))
    return out


def _marks(history: list[Message], at: int, keep_first: int) -> list[Message]:
    """What a store passes for a suffix from ``at``: the older system messages, the head's
    older messages and the newest user message older than ``at``.
    """
    first = next(
        (i for i, m in enumerate(history) if m.role == "user" and not missing_content(m)), -1
    )
    head: set[int] = set()
    if keep_first and first >= 0:
        starts = 0
        for j in range(first, len(history)):
            m = history[j]
            if m.role not in SYSTEM_ROLES | {"tool"} and (m.tool_calls or not missing_content(m)):
                starts += 1
                if starts > keep_first:
                    break
            head.add(j)
    users = [i for i in range(at) if history[i].role == "user"]
    newest = users[-1:] if users else []
    return [
        m for i, m in enumerate(history[:at]) if m.role in SYSTEM_ROLES or i in head or i in newest
    ]


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=sessions(),
    split=st.floats(0.0, 1.0),
    budget=st.sampled_from([300, 600, 1500, 4000]),
    preserve=st.integers(0, 6),
    keep_first=st.integers(0, 3),
    system=st.booleans(),
)
def test_a_proved_prompt_is_the_whole_prompt(
    history: list[Message],
    split: float,
    budget: int,
    preserve: int,
    keep_first: int,
    system: bool,
) -> None:
    pruner = TokenPruner(budget, preserve, COUNTER, cache_stable=False, keep_first=keep_first)
    prefix = [Message("system", "Be brief.")] if system else []
    at = int(len(history) * split)
    got = prompt_from_tail(pruner, prefix, _marks(history, at, keep_first), history[at:])
    if got is None:
        return
    assert got[0] == TokenPruner(
        budget, preserve, COUNTER, cache_stable=False, keep_first=keep_first
    ).prune(prefix + history)


def _long_session(steps: int) -> list[Message]:
    out = [Message("system", "You fix bugs."), Message("user", "Fix the parser bug in 42.")]
    for i in range(steps):
        out.append(Message("assistant", None, tool_calls=[ToolCall(f"c{i}", "run", "{}")]))
        out.append(Message("tool", f"output {i} " * 60, tool_call_id=f"c{i}"))
        out.append(Message("user", f"observation {i}"))
    return out


def test_the_newest_pages_and_the_head_prove_a_long_sessions_prompt() -> None:
    history = _long_session(300)
    pruner = TokenPruner(2000, 6, COUNTER, cache_stable=False)
    at = len(history) - 60
    got = prompt_from_tail(pruner, [], _marks(history, at, 1), history[at:])
    assert got is not None
    assert got[0] == pruner.prune(history)
    assert Message("user", "Fix the parser bug in 42.") in got[0]  # the task stays
    assert got[1].sections["task"] > 0


def test_a_head_the_suffix_cuts_is_read_on() -> None:
    # keep_first=2: the head's second unit is a tool call whose result is in the suffix.
    history = _long_session(300)
    pruner = TokenPruner(2000, 6, COUNTER, cache_stable=False, keep_first=2)
    marks = [*history[:3]]  # system, task, the call without its result
    assert prompt_from_tail(pruner, [], marks, history[3:]) is None
    marks = [*history[:4]]  # the whole head
    got = prompt_from_tail(pruner, [], marks, history[60:])
    assert got is not None and got[0] == pruner.prune(history)


def test_a_head_dropped_at_the_pages_oldest_unit_reads_on() -> None:
    """Found by the paged-read property: the head (the first user message) is the oldest unit
    of the pages read and too long to keep even compressed, so the head rule drops it; the
    walk goes on past it, and the older tool-call unit fits. The pages must not take the head's
    fate for the walk's stop."""
    from ctxkeep import MemoryConfig, open_memory

    call = ToolCall("c0", "run", "{}")
    history = [
        Message("system", " ".join(["alpha"] * 100)),
        Message("assistant", None, tool_calls=[call]),
        Message("tool", "ok", tool_call_id="c0"),
        Message("user", " ".join(["alpha"] * 78)),
        Message("user", "ok"),
        Message("user", "ok"),
    ]
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    pruner_args: dict[str, Any] = {"max_token_budget": 200, "preserve_last_n": 0}
    for page in (1, 2, 4):
        with open_memory("memory://", config) as mem:
            mem.prompt_page = page
            sid = mem.create_session("agent")
            mem.add_messages(sid, history)
            got = mem.build_prompt_messages(
                sid, system="Be brief.", pruner=TokenPruner(**pruner_args, cache_stable=False)
            )
            whole = TokenPruner(**pruner_args, cache_stable=False).prune(
                [Message("system", "Be brief."), *mem.get_messages(sid)]
            )
        assert any(m.tool_calls for m in whole)  # the unit older than the dropped head
        assert got == whole
