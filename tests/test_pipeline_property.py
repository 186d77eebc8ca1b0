"""The prompt pipeline's public entry points give the replay's prompt, on every backend.

Hypothesis builds sessions by random operation sequences: user, assistant and system messages,
tool calls with their results (outputs of 1-30 kB now and then), an agent loop's steps, a call
left waiting for its results, ``pop_message``, ``replace_newest``, trims by ``max_history``
(some examples bound the session), the session deleted and made again under its id, writes by
another manager (another process's, whose caches are its own), builds (which leave fold
snapshots and warm caches behind) and cold starts (a new ``MemoryManager`` opened on the same
store URL: a new process's view), on two sessions taken in turns (``switch``: the pruners and
builders serve both). At every build, with or without the prompt's own system message:

1. ``mem.build_prompt_messages(sid, pruner=...)``, through a pruner kept across builds (as an
   agent loop keeps one), cache-stable and ``cache_stable=False``, equals a fresh
   ``TokenPruner`` of the same settings pruning ``get_messages(sid)`` (read by a manager with
   nothing cached, without a call still waiting at its end): the replay, the reference;
2. ``ContextBuilder(memory=mem, ...).build(sid)``, a builder kept across builds, equals the same
   builder configuration's build on a manager with nothing cached and a fresh builder
   (warm == cold), and, the builder having no episodic store or fabric, its messages equal a
   fresh pruner's prune of the system prompt and the history with the builder's history budget
   (``max_prompt_tokens - reserve_output_tokens``).

Prompts are compared as ``(id, to_openai())`` pairs; an error is compared by its type and
message (both sides must refuse alike). Examples the property found run first (``FOUND``), and
as plain tests at the end.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep import ContextBuilder, Message, TokenPruner, ToolCall, open_memory
from ctxkeep.errors import CtxkeepError
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.records import record_to_message

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

RESERVE = 256
WORDS = (
    *("the", "invoice", "total", "rounds", "once", "per", "line", "while", "tax", "is"),
    *("applied", "after", "discount", "so", "cents", "drift", "across", "currencies"),
    *("when", "tests", "compare", "fixtures", "def", "class", "return", "import", "assert"),
    *("error", "traceback", "file", "module", "function", "value", "None", "True", "self"),
)

Op = tuple[Any, ...]

# -- operations -------------------------------------------------------------------------------

KINDS = (
    # appends weighted up (sampled_from picks by position), so sessions outgrow their budgets
    *("user", "user", "assistant", "tools", "tools", "tools", "steps", "steps", "call"),
    *("result", "system", "pop", "replace", "recreate", "cold", "elsewhere", "switch"),
    *("build", "build"),
)
WRITES = (
    *("user", "assistant", "system", "tools", "steps", "call", "result", "pop", "replace"),
    "recreate",
)
output_size = st.one_of(st.integers(20, 400), st.integers(20, 400), st.integers(1000, 30_000))
text_size = st.one_of(st.integers(0, 400), st.integers(1, 400), st.integers(1000, 30_000))


@st.composite
def ops(draw: st.DrawFn) -> Op:
    """One operation: ``(kind, *its arguments)``."""
    kind = draw(st.sampled_from(KINDS))
    if kind in ("user", "assistant", "system"):  # empty now and then, or 1-30 kB
        return (kind, draw(st.integers(0, 2**16)), draw(text_size))
    if kind == "tools":  # one step: a call (or parallel calls) and its results
        sizes = draw(st.lists(output_size, min_size=1, max_size=3))
        return (kind, draw(st.integers(0, 2**16)), tuple(sizes))
    if kind == "steps":  # an agent loop's steps, one batch each
        return (kind, draw(st.integers(0, 2**16)), draw(st.integers(2, 30)))
    if kind == "call":  # calls left waiting for their results
        return (kind, draw(st.integers(0, 2**16)), draw(st.integers(1, 3)))
    if kind == "result":  # one waiting call answered
        return (kind, draw(st.integers(0, 2**16)), draw(output_size))
    if kind == "replace":
        return (kind, draw(st.integers(0, 2**16)))
    if kind == "elsewhere":  # a write by another process (a manager with its own caches)
        inner = draw(ops().filter(lambda op: op[0] in WRITES))
        return (kind, inner)
    return (kind,)


setups = st.tuples(
    st.sampled_from([None, 6, 12, 30]),  # max_history
    st.sampled_from([300, 1200, 4000]),  # the pruner's budget
    st.sampled_from([0, 2, 6]),  # preserve_last_n
    st.sampled_from([None, "You are a careful coding agent."]),  # the prompt's own system
)


def text(seed: int, chars: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def pending_calls(history: list[Message]) -> tuple[int, list[str]]:
    """Where the call still waiting for results starts, and its unanswered ids (-1, [])."""
    calls = [i for i, m in enumerate(history) if m.tool_calls]
    if not calls:
        return -1, []
    at = calls[-1]
    answered = {m.tool_call_id for m in history[at + 1 :] if m.role == "tool"}
    waiting = [c.id for c in history[at].tool_calls if c.id not in answered]
    return (at, waiting) if waiting else (-1, [])


def outcome(make: Callable[..., list[Message]], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``make(*args, **kwargs)``'s prompt as ``(id, OpenAI form)`` pairs, or its error."""
    try:
        messages = make(*args, **kwargs)
    except CtxkeepError as exc:
        return ("error", type(exc).__name__, str(exc))
    return ("ok", [(m.id, m.to_openai()) for m in messages])


# -- the harness ------------------------------------------------------------------------------


class Harness:
    """One session driven by operations, checked at every build."""

    def __init__(self, url: str, setup: tuple[Any, ...]) -> None:
        max_history, self.budget, self.last_n, self.system = setup
        self.config = MemoryConfig(max_history=max_history, session_ttl=None, max_sessions=None)
        self.url = url
        self.mem: MemoryManager = open_memory(url, self.config)
        # Two sessions, one at a time: the pruners and builders serve both (as one agent
        # process's builder serves its sessions).
        self.sids = [
            self.mem.create_session("agent", session_id=f"s-{uuid.uuid4().hex[:12]}")
            for _ in range(2)
        ]
        self.sid = self.sids[0]
        self.calls = 0
        self.warm()

    def warm(self) -> None:
        """A process's pruners and builders, kept across its builds."""
        self.pruners = {s: self.pruner(s) for s in (True, False)}
        self.builders = {s: self.builder(self.mem, s) for s in (True, False)}

    def pruner(self, stable: bool) -> TokenPruner:
        return TokenPruner(self.budget, self.last_n, cache_stable=stable)

    def builder(self, mem: MemoryManager, stable: bool) -> ContextBuilder:
        return ContextBuilder(
            memory=mem,
            max_prompt_tokens=self.budget + RESERVE,
            reserve_output_tokens=RESERVE,
            cache_stable=stable,
        )

    def new_manager(self) -> MemoryManager:
        """A new manager opened on the store's URL: a new process's view (a cold start)."""
        if self.url == "memory://":  # the store lives in the backend object
            return self.view()
        return open_memory(self.url, self.config)

    def view(self) -> MemoryManager:
        """A new manager over the same backend: nothing cached, the connections shared."""
        return MemoryManager(self.mem.backend, self.config)

    def close(self) -> None:
        if self.url != "memory://":
            self.mem.close()

    def stored(self) -> list[Message]:
        """The session as stored, read through the backend (no manager's cache touched)."""
        snap = self.mem.backend.read(self.sid)
        assert snap is not None
        return [record_to_message(r) for _, r in snap[1]]

    # -- operations ---------------------------------------------------------------------

    def results_for(self, history: list[Message], seed: int) -> list[Message]:
        _, waiting = pending_calls(history)
        return [Message("tool", text(seed + i, 80), tool_call_id=c) for i, c in enumerate(waiting)]

    def new_call(self, seed: int, sizes: tuple[int, ...]) -> tuple[Message, list[Message]]:
        calls = []
        for _ in sizes:
            self.calls += 1
            calls.append(ToolCall(f"call_{self.calls}", "read_file", f'{{"n": {self.calls}}}'))
        # OpenAI sends a call's content as None, often
        call = Message("assistant", text(seed, 40) if seed % 3 else None, tool_calls=calls)
        results = [
            Message("tool", text(seed + 7 * i, size), tool_call_id=c.id)
            for i, (c, size) in enumerate(zip(calls, sizes, strict=True))
        ]
        return call, results

    def apply(self, op: Op, via: MemoryManager | None = None) -> None:
        """Do ``op``; its writes go through ``via`` (default: the process's own manager)."""
        kind = op[0]
        mem = via or self.mem
        if kind == "build":
            self.check()
        elif kind == "cold":
            old, self.mem = self.mem, self.new_manager()
            if self.url != "memory://":
                old.close()
            self.warm()
        elif kind == "elsewhere":
            self.apply(op[1], via=self.view())
        elif kind == "pop":
            mem.pop_message(self.sid)
        elif kind == "replace":
            self.replace(mem, op[1])
        elif kind == "switch":  # the other session from now on
            self.sid = self.sids[1] if self.sid == self.sids[0] else self.sids[0]
        elif kind == "recreate":  # deleted and made again under the same id
            mem.delete_session(self.sid)
            mem.create_session("agent", session_id=self.sid)
        else:
            history = self.stored()
            batch = self.results_for(history, op[1])
            if kind == "user":
                batch.append(Message("user", text(op[1], op[2])))
            elif kind == "assistant":
                batch.append(Message("assistant", text(op[1], op[2])))
            elif kind == "system":  # a system message stored in the session (pinned)
                batch.append(Message("system", text(op[1], op[2])))
            elif kind == "tools":
                call, results = self.new_call(op[1], op[2])
                batch += [call, *results]
            elif kind == "steps":
                if batch:
                    mem.add_messages(self.sid, batch)
                for step in range(op[2]):
                    call, results = self.new_call(op[1] + step, (60 + 37 * step % 300,))
                    mem.add_messages(self.sid, [call, *results])
                return
            elif kind == "result":
                _, waiting = pending_calls(history)
                batch = [Message("tool", text(op[1], op[2]), tool_call_id=c) for c in waiting[:1]]
            else:  # calls left waiting for their results
                batch.append(self.new_call(op[1], (100,) * op[2])[0])
            if batch:
                mem.add_messages(self.sid, batch)

    def replace(self, mem: MemoryManager, seed: int) -> None:
        history = self.stored()
        if not history:
            return
        newest = history[-1]
        if seed % 4 == 0:
            replacement: list[Message] = []  # a conditional pop
        elif newest.role == "tool":
            replacement = [Message("tool", text(seed, 200), tool_call_id=newest.tool_call_id)]
        elif newest.role == "user":
            replacement = [Message("user", text(seed, 120))]
        else:  # an answer regenerated (an assistant's calls taken back with it)
            replacement = [Message("assistant", text(seed, 120))]
        assert newest.id is not None
        mem.replace_newest(self.sid, replacement, newest_id=newest.id)

    # -- the property -------------------------------------------------------------------

    def reference(self) -> list[Message]:
        """``get_messages`` of a fresh manager, without a call still waiting at its end."""
        history = self.view().get_messages(self.sid)
        at, _ = pending_calls(history)
        return history[:at] if at >= 0 else history

    def check(self) -> None:
        history = self.reference()
        for stable in (True, False):
            self.check_manager(stable, history)
        for stable in (True, False):
            self.check_builder(stable, history)

    def prefix(self) -> list[Message]:
        """The prompt's own system message, as the pruner's input starts with it."""
        return [] if self.system is None else [Message("system", self.system)]

    def check_manager(self, stable: bool, history: list[Message]) -> None:
        warm = outcome(
            self.mem.build_prompt_messages,
            self.sid,
            system=self.system,
            pruner=self.pruners[stable],
        )
        replay = outcome(self.pruner(stable).prune, self.prefix() + history)
        assert warm == replay, f"build_prompt_messages != replay, cache_stable={stable}"

    def check_builder(self, stable: bool, history: list[Message]) -> None:
        warm = outcome(lambda: self.builders[stable].build(self.sid, system=self.system).messages)
        cold = outcome(
            lambda: self.builder(self.view(), stable).build(self.sid, system=self.system).messages
        )
        assert warm == cold, f"ContextBuilder.build warm != cold, cache_stable={stable}"
        # No fabric or recall: the prompt is the system prompt and the history, pruned to the
        # builder's history budget (max_prompt_tokens - reserve_output_tokens).
        pruner = TokenPruner(self.budget, cache_stable=stable)
        replay = outcome(pruner.prune, self.prefix() + history)
        assert warm == replay, f"ContextBuilder.build != replay, cache_stable={stable}"


# Examples the property found, run first on every backend.
FOUND: list[tuple[tuple[Any, ...], list[Op]]] = [
    # A session longer than the first page the paged read takes (64 messages), whose first
    # user messages are identical: the paged prompt (cache_stable=False, a cold manager, and
    # the builder through it) kept the second user message as the task instead of the first
    # (keep_first before the paged read's proof knew the head).
    (
        (None, 300, 0, None),
        [
            ("user", 0, 1),
            ("tools", 0, (20,)),
            ("user", 0, 1),
            ("tools", 0, (20,)),
            ("steps", 0, 26),
            ("user", 0, 1),
            ("tools", 0, (20, 20, 20)),
            ("user", 0, 1),
            ("call", 0, 1),
        ],
    ),
]


def run_property(url: str, examples: int) -> None:
    """Run the property on the store at ``url`` (each example a session of its own)."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(setup=setups, sequence=st.lists(ops(), min_size=4, max_size=40))
    def prop(setup: tuple[Any, ...], sequence: list[Op]) -> None:
        replay(url, setup, sequence)

    for setup, sequence in FOUND:
        prop = example(setup=setup, sequence=sequence)(prop)
    prop()


def replay(url: str, setup: tuple[Any, ...], sequence: list[Op]) -> None:
    """Apply ``sequence`` to a new session of ``url``; check at every build and at the end."""
    harness = Harness(url, setup)
    try:
        for op in sequence:
            harness.apply(op)
        harness.check()
    finally:
        harness.close()


# -- the stores -------------------------------------------------------------------------------


def test_memory_prompts_equal_the_replay() -> None:
    run_property("memory://", 60)


def test_sqlite_prompts_equal_the_replay(tmp_path: Path) -> None:
    run_property(f"sqlite:///{tmp_path / 'sessions.db'}", 40)


@pytest.mark.redis
def test_redis_prompts_equal_the_replay(
    redis_url: str, redis_prefix_factory: Callable[[], str]
) -> None:
    sep = "&" if "?" in redis_url else "?"
    run_property(redis_url + sep + urlencode({"prefix": redis_prefix_factory()}), 30)


@pytest.mark.postgres
def test_postgres_prompts_equal_the_replay(postgres_schema_factory: Callable[[], str]) -> None:
    run_property(postgres_schema_factory(), 30)


# -- what the property found --------------------------------------------------------------------


def _long_session(mem: MemoryManager, steps: int) -> str:
    """The task, a step, a second user message, ``steps`` more steps, the newest question."""
    sid = mem.create_session("agent")
    mem.add_message(sid, "user", "TASK: fix the rounding bug")
    for n in range(steps + 1):
        call = ToolCall(f"call_{n}", "read_file", "{}")
        step = [
            Message("assistant", f"step {n}", tool_calls=[call]),
            Message("tool", "x " * 60, tool_call_id=call.id),
        ]
        mem.add_messages(sid, step)
        if n == 0:
            mem.add_message(sid, "user", "second user message")
    mem.add_message(sid, "user", "newest question")
    return sid


@pytest.mark.parametrize("steps", [30, 40, 80])
def test_a_prompt_read_past_the_first_page_keeps_what_the_replay_keeps(
    tmp_path: Path, steps: int
) -> None:
    # Found by the property: past the paged read's first page (64 messages) the prompt of a
    # fresh manager held the second user message (30 steps) or no early user message at all
    # (40, 80) where the replay keeps the first one, the task (keep_first).
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    with open_memory(url, config) as mem:
        sid = _long_session(mem, steps)
        history = mem.get_messages(sid)
    for stable in (False, True):
        replay = outcome(TokenPruner(300, 0, cache_stable=stable).prune, history)
        with open_memory(url, config) as mem:
            pruner = TokenPruner(300, 0, cache_stable=stable)
            assert outcome(mem.build_prompt_messages, sid, pruner=pruner) == replay
        with open_memory(url, config) as mem:
            builder = ContextBuilder(
                memory=mem,
                max_prompt_tokens=300 + RESERVE,
                reserve_output_tokens=RESERVE,
                pruner=TokenPruner(300, 0, cache_stable=stable),
            )
            assert outcome(lambda: builder.build(sid).messages) == replay  # noqa: B023
