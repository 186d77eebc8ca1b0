"""The newest messages are read by themselves: ``get_messages(limit=N)`` and ``replace_newest``
(a pop, a retried answer, the Agents SDK's ``pop_item``) cost O(N), not O(session) (issue 26).

Each backend's whole-session read (``Backend.read``) is watched: these calls never make it, at
any session length, with ``max_history`` on or off, and they give what the whole read gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest_services import (
    STORES,
    fresh_store_url,
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep import open_memory
from ctxkeep.messages import Message
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]


@pytest.fixture(params=STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_store_url(request, tmp_path, "newest")


@pytest.fixture(params=[None, 50], ids=["no-max-history", "max-history-50"])
def mem(url: str, request: pytest.FixtureRequest) -> Iterator[MemoryManager]:
    config = MemoryConfig(max_history=request.param, session_ttl=None, max_sessions=None)
    with open_memory(url, config) as m:
        yield m


def _watch_whole_reads(mem: MemoryManager, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    whole = mem.backend.read

    def read(session_id: str, after_seq: int = 0) -> Any:
        if after_seq == 0:
            calls.append(session_id)
        return whole(session_id, after_seq)

    monkeypatch.setattr(mem.backend, "read", read)
    return calls


def test_newest_reads_and_pops_never_read_the_whole_session(
    mem: MemoryManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = mem.create_session("agent")
    mem.add_messages(
        sid, [Message("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(40)]
    )
    whole = [m.content for m in mem.get_messages(sid)]
    calls = _watch_whole_reads(mem, monkeypatch)
    assert [m.content for m in mem.get_messages(sid, limit=3)] == whole[-3:]
    assert [m.content for m in mem.get_messages(sid, limit=100)] == whole
    assert mem.get_messages(sid, limit=0) == []
    for _ in range(5):  # pops, as the Agents SDK's pop_item makes them
        newest = mem.get_messages(sid, limit=1)[0]
        assert mem.replace_newest(sid, [], newest_id=newest.id or "") == []
        whole.pop()
    newest = mem.get_messages(sid, limit=1)[0]
    mem.replace_newest(sid, [Message("assistant", "again")], newest_id=newest.id or "")
    whole[-1] = "again"
    assert calls == []
    monkeypatch.undo()
    assert [m.content for m in mem.get_messages(sid)] == whole


def test_a_replace_past_max_history_still_trims(tmp_path: Path) -> None:
    config = MemoryConfig(max_history=10, session_ttl=None, max_sessions=None)
    with open_memory(f"sqlite:///{tmp_path}/trim.db", config) as mem:
        sid = mem.create_session("agent")
        mem.add_messages(sid, [Message("user", f"m{i}") for i in range(10)])
        newest = mem.get_messages(sid, limit=1)[0]
        more = [Message("user", "a"), Message("user", "b"), Message("user", "c")]
        mem.replace_newest(sid, more, newest_id=newest.id or "")
        kept = [f"m{i}" for i in range(2, 9)] + ["a", "b", "c"]  # 12 held, 10 kept
        assert [m.content for m in mem.get_messages(sid)] == kept
        assert [m.content for m in mem.archived_messages(sid)] == ["m0", "m1"]
