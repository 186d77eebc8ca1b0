"""Whole reads of a Redis session: one ``MULTI``/``EXEC`` (not a script, whose answer is
copied through Lua), the records handed over as stored for the reader to parse one at a time,
and a damaged member failing alike either way, against a real Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from conftest_services import redis_prefix_factory, redis_url
from ctxkeep.errors import CorruptRecordError
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.records import load_record

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]


@pytest.fixture
def prefix(redis_prefix_factory: Callable[[], str]) -> str:
    return redis_prefix_factory()


@pytest.fixture
def mem(redis_url: str, prefix: str) -> Iterator[MemoryManager]:
    url = f"{redis_url}?{urlencode({'prefix': prefix})}"
    config = MemoryConfig(max_history=None, max_sessions=None, session_ttl=None)
    with open_memory(url, config) as manager:
        yield manager


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _session(mem: MemoryManager, n: int = 3) -> str:
    sid = mem.create_session("agent")
    for i in range(n):
        mem.add_message(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
    return sid


def test_read_stored_hands_over_each_record_as_its_text(mem: MemoryManager) -> None:
    sid = _session(mem)
    backend: Any = mem.backend
    info, rows = backend.read_stored(sid)
    assert info.message_count == 3
    assert all(isinstance(text, str) for _, text in rows)
    _, parsed = backend.read(sid)
    assert [(seq, load_record(sid, seq, text)) for seq, text in rows] == parsed
    assert backend.read_stored(sid, after_seq=rows[0][0])[1] == rows[1:]


def test_read_stored_of_no_session_is_none(mem: MemoryManager) -> None:
    backend: Any = mem.backend
    assert backend.read_stored("nobody") is None
    assert backend.read("nobody") is None


def test_a_member_without_a_seq_fails_both_reads_alike(
    mem: MemoryManager, raw: Any, prefix: str
) -> None:
    sid = _session(mem)
    raw.zadd(f"{prefix}messages:{sid}", {"garbage": 99})
    backend: Any = mem.backend
    with pytest.raises(CorruptRecordError):
        backend.read(sid)
    with pytest.raises(CorruptRecordError):
        backend.read_stored(sid)


def test_a_damaged_record_fails_the_history_read_when_reached(
    mem: MemoryManager, raw: Any, prefix: str
) -> None:
    sid = _session(mem)
    raw.zadd(f"{prefix}messages:{sid}", {"2:{not json": 2})
    messages = mem.reads.decoding(sid)
    with pytest.raises(CorruptRecordError, match="seq 2"):
        list(messages)


def test_the_pop_after_a_whole_read_is_one_script_call(
    mem: MemoryManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = _session(mem)
    list(mem.reads.decoding(sid))  # remembers the newest message for the pop
    backend: Any = mem.backend
    calls: list[Any] = []
    replace = backend._pop_script  # a replacement by nothing: the pop script

    class Counted:  # each run of the pop script, alone or followed by other commands
        def __call__(self, *a: Any) -> Any:
            calls.append(a)
            return replace(*a)

        def followed(self, *a: Any) -> Any:
            calls.append(a)
            return replace.followed(*a)

    monkeypatch.setattr(backend, "_pop_script", Counted())
    newest = mem.get_messages(sid, limit=1)[0]
    mem.replace_newest(sid, [], newest_id=newest.id or "")
    assert len(calls) == 1
    assert [m.content for m in mem.get_messages(sid)] == ["m0", "m1"]
