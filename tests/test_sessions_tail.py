"""A prompt built from a session's newest pages is the prompt of the whole session.

:meth:`MemoryManager.build_prompt_messages` reads a long session newest first when the pruner
reads only what it keeps (``TokenPruner(cache_stable=False)``); a pruner of another type makes
it read every message. On random sessions (system messages anywhere, parallel tool calls, long
tool outputs that get compressed, user messages far back, calls still waiting, trims), cold and
turn after turn, both prompts are the same.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep.messages import Message, ToolCall
from ctxkeep.prune import TokenPruner
from ctxkeep.prune.tail import pages_suffice
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

WORDS = ["alpha", "beta", "gamma", "delta", "fix", "the", "bug", "in", "parser", "42", "\n"]


class WholePruner(TokenPruner):
    """The same pruner under another type: the manager reads every message for it."""


def _text(draw: Any, most: int) -> str:
    n = draw(st.integers(0, most))
    return " ".join(draw(st.sampled_from(WORDS)) for _ in range(n)) or "ok"


@st.composite
def steps(draw: Any) -> list[list[Message]]:
    """Batches to append, in order: a valid session (the last call may still wait)."""
    out: list[list[Message]] = []
    if draw(st.booleans()):
        out.append([Message("system", _text(draw, 30))])
    calls = 0
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["user", "user", "assistant", "tool", "tool", "system"]))
        if kind == "tool":
            n = draw(st.integers(1, 3))
            ids = [f"c{calls + k}" for k in range(n)]
            calls += n
            big = draw(st.integers(0, 3)) == 0
            out.append(
                [
                    Message(
                        "assistant",
                        draw(st.sampled_from([None, "calling"])),
                        tool_calls=[ToolCall(i, "run", "{}") for i in ids],
                    ),
                    *[
                        Message("tool", _text(draw, 600 if big else 40), tool_call_id=i)
                        for i in ids
                    ],
                ]
            )
        else:
            out.append([Message(kind, _text(draw, 120))])
    if draw(st.booleans()):
        out.append([Message("assistant", None, tool_calls=[ToolCall(f"c{calls}", "run", "{}")])])
    return out


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches=steps(),
    budget=st.sampled_from([200, 400, 900, 3000]),
    preserve=st.integers(0, 8),
    page=st.integers(1, 9),
    split=st.floats(0.3, 1.0),
    system=st.sampled_from([None, "Be brief."]),
    max_history=st.sampled_from([None, None, 40]),
    backend=st.sampled_from(["memory", "sqlite"]),
)
def test_paged_prompt_is_the_whole_prompt(
    batches: list[list[Message]],
    budget: int,
    preserve: int,
    page: int,
    split: float,
    system: str | None,
    max_history: int | None,
    backend: str,
) -> None:
    args: dict[str, Any] = {
        "max_token_budget": budget,
        "preserve_last_n": preserve,
        "cache_stable": False,
    }
    assert pages_suffice(TokenPruner(**args)) and not pages_suffice(WholePruner(**args))
    config = MemoryConfig(max_history=max_history, session_ttl=None, max_sessions=None)
    with tempfile.TemporaryDirectory() as tmp:
        url = "memory://" if backend == "memory" else f"sqlite:///{Path(tmp) / 's.db'}"
        with open_memory(url, config) as mem:
            mem.prompt_page = page
            sid = mem.create_session("agent")
            cut = max(1, int(len(batches) * split))
            for batch in batches[:cut]:
                mem.add_messages(sid, batch)
            paged, whole = _errors_or_prompts(mem, sid, args, system)
            assert paged == whole  # cold: the first prompt of a process
            for batch in batches[cut:]:  # turns on the paged cache
                mem.add_messages(sid, batch)
                paged, whole = _errors_or_prompts(mem, sid, args, system)
                assert paged == whole
            cold = open_memory(url, config) if backend == "sqlite" else None
            if cold is not None:  # another process, cold, on what the turns left
                with cold:
                    cold.prompt_page = page
                    assert _errors_or_prompts(cold, sid, args, system) == (whole, whole)


def _errors_or_prompts(
    mem: MemoryManager, sid: str, args: dict[str, Any], system: str | None
) -> tuple[Any, Any]:
    """Both prompts, or both errors' types and texts (a budget the system messages exceed)."""
    try:
        paged: Any = mem.build_prompt_messages(sid, system=system, pruner=TokenPruner(**args))
    except Exception as exc:  # compared below
        paged = (type(exc), str(exc))
    try:
        whole: Any = MemoryManager(mem.backend, mem.config).build_prompt_messages(
            sid, system=system, pruner=WholePruner(**args)
        )
    except Exception as exc:  # compared above
        whole = (type(exc), str(exc))
    return paged, whole


def test_a_cache_stable_pruner_or_a_summarizer_reads_every_message() -> None:
    assert not pages_suffice(TokenPruner())  # cache-stable by default: a replay of it all

    class Summarizer:
        def summarize(self, messages: Any) -> str:
            return "earlier"

    assert not pages_suffice(TokenPruner(cache_stable=False, summarizer=Summarizer()))
    assert not pages_suffice(None)
    assert pages_suffice(TokenPruner(cache_stable=False))
