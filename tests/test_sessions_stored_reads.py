"""Whole reads one message at a time (issue 26): ``Backend.read_stored`` gives a session's rows
as stored, ``HistoryReads.decoding`` decodes them only as it is iterated, and the LangChain
history converts each decoded message and drops it, so a long read never holds every record
and message at once.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
from ctxkeep.errors import CorruptRecordError, SessionNotFoundError
from ctxkeep.messages import Message, ToolCall
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.records import record_to_message

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]


@pytest.fixture(params=STORES)
def mem(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryManager]:
    url = fresh_store_url(request, tmp_path, "stored")
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory(url, config) as m:
        yield m


@contextmanager
def young_only() -> Iterator[None]:
    """``gc.collect()`` walks only what is made from here on: the worker's older heap (hundreds
    of MB late in a run) is frozen, so a collection per message costs microseconds, not the
    seconds that made these tests take minutes."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _history(n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        if i % 3 == 1:
            call = ToolCall(f"c{i}", "run", '{"cmd": "ls"}')
            out += [Message("assistant", None, tool_calls=[call])]
            out += [Message("tool", f"out {i}", tool_call_id=f"c{i}")]
        else:
            out.append(Message("user", [{"type": "text", "text": f"hi {i}"}], metadata={"k": i}))
    return out


def test_read_stored_is_read_unparsed(mem: MemoryManager) -> None:
    sid = mem.create_session("a")
    mem.add_messages(sid, _history(12))
    info, rows = mem.backend.read(sid) or (None, [])
    stored = mem.backend.read_stored(sid)
    assert stored is not None and stored[0] == info
    assert [s for s, _ in stored[1]] == [s for s, _ in rows]
    assert [record_to_message(r) for _, r in stored[1]] == [record_to_message(r) for _, r in rows]
    after = rows[4][0]
    tail = mem.backend.read_stored(sid, after)
    assert tail is not None and [s for s, _ in tail[1]] == [s for s, _ in rows[5:]]
    assert mem.backend.read_stored("nobody") is None


def test_decoding_gives_the_messages_and_raises_at_once(mem: MemoryManager) -> None:
    sid = mem.create_session("a")
    mem.add_messages(sid, _history(9))
    assert list(mem.reads.decoding(sid)) == mem.get_messages(sid) == mem.reads.decoded(sid)
    mem.pop_message(sid)
    assert list(mem.reads.decoding(sid)) == mem.get_messages(sid)
    with pytest.raises(SessionNotFoundError):
        mem.reads.decoding("nobody")  # not only once iterated


def test_decoding_holds_one_message_at_a_time(mem: MemoryManager) -> None:
    sid = mem.create_session("a")
    mem.add_messages(sid, _history(30))
    alive: list[weakref.ref[Message]] = []
    held = 0
    with young_only():
        for m in mem.reads.decoding(sid):
            gc.collect()
            held = max(held, sum(r() is not None for r in alive))
            alive.append(weakref.ref(m))
            del m
    assert len(alive) == len(mem.get_messages(sid)) and held == 0


def test_decoding_reads_before_it_is_iterated(tmp_path: Path) -> None:
    with open_memory(f"sqlite:///{tmp_path}/s.db") as mem:
        sid = mem.create_session("a")
        mem.add_messages(sid, _history(6))
        messages = mem.reads.decoding(sid)
        mem.add_message(sid, "user", "after the read")
        assert len(list(messages)) == len(mem.get_messages(sid)) - 1  # one snapshot


def test_a_corrupt_row_fails_when_reached(tmp_path: Path) -> None:
    with open_memory(f"sqlite:///{tmp_path}/s.db") as mem:
        sid = mem.create_session("a")
        mem.add_messages(sid, [Message("user", f"m{i}") for i in range(4)])
        conn = mem.backend.db.conn()  # type: ignore[attr-defined]
        conn.execute("UPDATE ctxkeep_messages SET record = 'nope' WHERE seq = 3")
        messages = mem.reads.decoding(sid)
        assert [next(messages).content, next(messages).content] == ["m0", "m1"]
        with pytest.raises(CorruptRecordError, match="seq 3"):
            next(messages)


def test_history_read_converts_one_message_at_a_time(mem: MemoryManager) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from ctxkeep.integrations.langchain import CtxkeepChatMessageHistory
    from ctxkeep.integrations.langchain.convert import _from_ctxkeep

    given = []
    for i in range(20):
        call = {"name": "run", "args": {"i": i}, "id": f"c{i}", "type": "tool_call"}
        given += [HumanMessage(f"q{i}"), AIMessage("", tool_calls=[call])]
        given += [ToolMessage(f"r{i}", tool_call_id=f"c{i}")]
    history = CtxkeepChatMessageHistory("h", memory=mem)
    history.add_messages(given)
    assert history.messages == given

    alive: list[weakref.ref[Message]] = []
    held: list[int] = []

    def watched() -> Iterator[Message]:
        for m in mem.reads.decoding("h"):
            gc.collect()
            held.append(sum(r() is not None for r in alive))
            alive.append(weakref.ref(m))
            yield m

    with young_only():
        assert _from_ctxkeep(watched(), owned=True) == given
    # The conversion still names the message before (its loop variable) while it asks for
    # the next: one alive, not every one so far.
    assert len(held) == len(given) and max(held) <= 1
