"""Random operation sequences against every session backend, checked against a plain model.

Two managers share one store (as two processes would), with small limits (2 sessions, 3
messages, a 100 s TTL on a fake clock). Hypothesis runs random sequences of create, add
(messages and whole tool units), build prompt, read, delete, create again, let time pass,
sweep and LRU eviction through either manager. After every prompt the messages it shows must
be exactly the messages the model says the session holds, in order: never a message of an
earlier session under the same id, never one trimmed away.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep.errors import SessionExistsError, SessionNotFoundError
from ctxkeep.messages import Message, ToolCall
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.records import trim_point
from ctxkeep.testing.contract import Clock

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

CONFIG = MemoryConfig(max_history=3, session_ttl=100, max_sessions=2)
IDS = ("s0", "s1", "s2")


@dataclass
class _Session:
    accessed: float
    contents: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)


class SessionModel:
    """What the stores must hold, in plain Python."""

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}

    def live(self, sid: str, now: float) -> bool:
        s = self.sessions.get(sid)
        if s is not None and s.accessed < now - CONFIG.session_ttl:  # type: ignore[operator]
            del self.sessions[sid]  # the manager reclaims it on sight
        return sid in self.sessions

    def create(self, sid: str, now: float) -> None:
        self.live(sid, now)
        self.sessions[sid] = _Session(now)
        over = len(self.sessions) - CONFIG.max_sessions  # type: ignore[operator]
        victims = sorted((s.accessed, k) for k, s in self.sessions.items() if k != sid)
        for _, k in victims[: max(over, 0)]:
            del self.sessions[k]

    def append(self, sid: str, roles: list[str], contents: list[str], now: float) -> None:
        s = self.sessions[sid]
        s.accessed = max(s.accessed, now)
        s.roles += roles
        s.contents += contents
        cut = trim_point(s.roles, CONFIG.max_history)  # type: ignore[arg-type]
        del s.roles[:cut], s.contents[:cut]

    def sweep(self, now: float) -> None:
        for sid in list(self.sessions):
            self.live(sid, now)


def _contents(messages: list[Message]) -> list[str]:
    return [m.content if isinstance(m.content, str) else "" for m in messages]


class SessionMachine(RuleBasedStateMachine):
    def __init__(self, make: Callable[[Clock], MemoryManager]) -> None:
        super().__init__()
        self.clock = Clock()
        self.mem = make(self.clock)
        # A second manager over the same store: another process with its own caches.
        self.other = MemoryManager(self.mem.backend, CONFIG, clock=self.clock)
        # A third that only looks (its lookups must not refresh the others' caches).
        self.probe = MemoryManager(self.mem.backend, CONFIG, clock=self.clock)
        self.model = SessionModel()
        self.counter = 0

    def teardown(self) -> None:
        self.mem.close()

    def _manager(self, which: int) -> MemoryManager:
        return self.mem if which == 0 else self.other

    def _tick(self) -> float:
        self.clock.advance(1)
        return self.clock.now

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1))
    def create(self, sid: str, which: int) -> None:
        now = self._tick()
        if self.model.live(sid, now):
            with pytest.raises(SessionExistsError):
                self._manager(which).create_session("agent", session_id=sid)
            return
        self._manager(which).create_session("agent", session_id=sid)
        self.model.create(sid, now)

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1), n=st.integers(1, 3))
    def add_messages(self, sid: str, which: int, n: int) -> None:
        now = self._tick()
        contents = [f"m{self.counter + i}" for i in range(n)]
        self.counter += n
        batch = [Message("user", c) for c in contents]
        if not self.model.live(sid, now):
            with pytest.raises(SessionNotFoundError):
                self._manager(which).add_messages(sid, batch)
            return
        self._manager(which).add_messages(sid, batch)
        self.model.append(sid, ["user"] * n, contents, now)

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1))
    def add_tool_unit(self, sid: str, which: int) -> None:
        now = self._tick()
        self.counter += 1
        call = ToolCall(f"c{self.counter}", "f", "{}")
        unit = [
            Message("assistant", f"call{self.counter}", tool_calls=[call]),
            Message("tool", f"result{self.counter}", tool_call_id=call.id),
        ]
        if not self.model.live(sid, now):
            with pytest.raises(SessionNotFoundError):
                self._manager(which).add_messages(sid, unit)
            return
        self._manager(which).add_messages(sid, unit)
        self.model.append(sid, ["assistant", "tool"], _contents(unit), now)

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1))
    def build_prompt(self, sid: str, which: int) -> None:
        now = self._tick()
        if not self.model.live(sid, now):
            with pytest.raises(SessionNotFoundError):
                self._manager(which).build_prompt_messages(sid)
            return
        prompt = self._manager(which).build_prompt_messages(sid)
        self.model.sessions[sid].accessed = now
        assert _contents(prompt) == self.model.sessions[sid].contents

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1))
    def read(self, sid: str, which: int) -> None:
        now = self._tick()
        if not self.model.live(sid, now):
            with pytest.raises(SessionNotFoundError):
                self._manager(which).get_messages(sid)
            return
        got = self._manager(which).get_messages(sid)
        self.model.sessions[sid].accessed = now
        assert _contents(got) == self.model.sessions[sid].contents

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1))
    def delete(self, sid: str, which: int) -> None:
        now = self._tick()
        existed = self.model.live(sid, now)
        assert self._manager(which).delete_session(sid) == existed
        self.model.sessions.pop(sid, None)

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1))
    def recreate(self, sid: str, which: int) -> None:
        self.delete(sid, which)
        self.create(sid, which)

    @rule(sid=st.sampled_from(IDS), which=st.integers(0, 1))
    def pop(self, sid: str, which: int) -> None:
        now = self._tick()
        if not self.model.live(sid, now):
            with pytest.raises(SessionNotFoundError):
                self._manager(which).pop_message(sid)
            return
        s = self.model.sessions[sid]
        s.accessed = now
        # A whole unit at a time (a result, then its call), so no call is left waiting.
        for _ in range(2 if s.roles and s.roles[-1] == "tool" else 1):
            popped = self._manager(which).pop_message(sid)
            if not s.contents:
                assert popped is None
                break
            assert popped is not None and popped.content == s.contents[-1]
            del s.contents[-1], s.roles[-1]

    @rule(seconds=st.sampled_from([10, 60, 150]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(which=st.integers(0, 1))
    def sweep(self, which: int) -> None:
        now = self._tick()
        self._manager(which).sweep()
        self.model.sweep(now)

    @invariant()
    def live_sessions_agree(self) -> None:
        now = self.clock.now
        for sid in IDS:
            assert self.probe.has_session(sid) == self.model.live(sid, now)


def _run(make: Callable[[Clock], MemoryManager], examples: int) -> None:
    run_state_machine_as_test(
        lambda: SessionMachine(make),
        settings=settings(
            max_examples=examples,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_memory_store_matches_the_model() -> None:
    _run(lambda clock: open_memory("memory://", CONFIG, clock=clock), 150)


def test_sqlite_store_matches_the_model(tmp_path: Path) -> None:
    paths = (tmp_path / f"s{i}.db" for i in range(10**6))
    _run(lambda clock: open_memory(f"sqlite:///{next(paths)}", CONFIG, clock=clock), 40)


@pytest.mark.redis
def test_redis_store_matches_the_model(
    redis_url: str, redis_prefix_factory: Callable[[], str]
) -> None:
    sep = "&" if "?" in redis_url else "?"

    def make(clock: Clock) -> MemoryManager:
        url = redis_url + sep + urlencode({"prefix": redis_prefix_factory()})
        return open_memory(url, CONFIG, clock=clock)

    _run(make, 30)


@pytest.mark.postgres
def test_postgres_store_matches_the_model(postgres_schema_factory: Callable[[], str]) -> None:
    _run(lambda clock: open_memory(postgres_schema_factory(), CONFIG, clock=clock), 20)
