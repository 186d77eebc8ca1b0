"""The statements of an append on SQLite (issue 26), traced on the backend's connection.

An append moves the session row's counters and reads it back in one ``UPDATE ... RETURNING``
(no separate read of the row), and looks the batch's ids up only where the caller gave ids
(ids the manager made for the append cannot be stored). A second update runs only where the
pending calls change. Where the backend knows the session's state (it made the session or
wrote it last), the append is one compare-and-set ``UPDATE`` (counters, pending calls and
access time at once) and the insert; a row in another state (another writer came first) takes
the path above in the same transaction. Whatever the statements, a refused append changes
nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ctxkeep import MemoryConfig, open_memory
from ctxkeep.errors import (
    ConfigError,
    CorruptRecordError,
    MissingToolResultError,
    OrphanToolResultError,
)
from ctxkeep.integrations._items import owned_from_responses
from ctxkeep.messages import Message
from ctxkeep.sessions.base import MemoryManager
from ctxkeep.sessions.records import SessionInfo


@pytest.fixture
def mem(tmp_path: Path) -> Iterator[MemoryManager]:
    with open_memory(f"sqlite:///{tmp_path}/s.db") as manager:
        yield manager


@contextmanager
def traced(mem: MemoryManager) -> Iterator[list[str]]:
    """The statements this thread's connection runs inside the block."""
    conn: Any = mem.backend.client.conn()  # type: ignore[attr-defined]
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


def _info(mem: MemoryManager, sid: str) -> SessionInfo:
    info = mem.backend.info(sid, touch=None, ttl=None)
    assert info is not None
    return info


def _rows(mem: MemoryManager, sid: str) -> list[tuple[int, Any]]:
    """The session's messages as stored: (seq, content)."""
    snap = mem.backend.read(sid)
    assert snap is not None
    return [(seq, record["content"]) for seq, record in snap[1]]


def _verbs(statements: list[str]) -> list[str]:
    return [s.split()[0].upper() for s in statements]


def test_an_append_of_messages_without_ids_reads_nothing_apart(mem: MemoryManager) -> None:
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    with traced(mem) as statements:
        mem.add_messages(sid, [Message("assistant", "hello"), Message("user", "again")])
    verbs = _verbs(statements)  # (an INSERT per message: executemany)
    assert verbs == ["BEGIN", "UPDATE", "INSERT", "INSERT", "COMMIT"]
    assert "next_seq = 2 AND revision = 0" in statements[1]  # the state known, compared
    assert [m.content for m in mem.get_messages(sid)] == ["hi", "hello", "again"]
    info = _info(mem, sid)
    assert (info.message_count, info.next_seq) == (3, 4)


def test_an_append_of_a_session_another_process_wrote_reads_its_row_back(
    mem: MemoryManager, tmp_path: Path
) -> None:
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    with open_memory(f"sqlite:///{tmp_path}/s.db") as other:
        other.add_message(sid, "assistant", "from elsewhere")
    with traced(mem) as statements:
        mem.add_message(sid, "user", "again")
    # the compare-and-set finds another state: the row read back in the same transaction
    assert _verbs(statements) == ["BEGIN", "UPDATE", "UPDATE", "INSERT", "COMMIT"]
    assert "RETURNING" in statements[2]
    assert _rows(mem, sid) == [(1, "hi"), (2, "from elsewhere"), (3, "again")]
    with traced(mem) as statements:  # known again: one update
        mem.add_message(sid, "assistant", "ok")
    assert _verbs(statements) == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    info = _info(mem, sid)
    assert (info.message_count, info.next_seq) == (4, 5)


def test_a_known_state_is_no_reason_to_refuse_or_to_store(
    mem: MemoryManager, tmp_path: Path
) -> None:
    """The check runs on the state known, but the row decides: a call answered elsewhere
    lets a message in; a call made elsewhere keeps one out.
    """
    sid = mem.create_session("a")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    mem.add_messages(sid, [Message("assistant", None, tool_calls=[call])])
    with open_memory(f"sqlite:///{tmp_path}/s.db") as other:
        other.add_messages(sid, [Message("tool", "ok", tool_call_id="c1")])
        mem.add_message(sid, "user", "next")  # c1 waits in the state known, not in the row
        assert _info(mem, sid).pending == ()
        call2 = {**call, "id": "c2"}
        other.add_messages(sid, [Message("assistant", None, tool_calls=[call2])])
    with pytest.raises(MissingToolResultError):
        mem.add_message(sid, "user", "too early")  # nothing waits in the state known
    assert _info(mem, sid).pending == ("c2",)
    assert [m.content for m in mem.get_messages(sid)][-2:] == ["next", None]


def test_a_session_made_again_elsewhere_is_not_written_as_the_one_known(
    mem: MemoryManager, tmp_path: Path
) -> None:
    sid = mem.create_session("a", session_id="conv")
    mem.add_message(sid, "user", "hi")
    with open_memory(f"sqlite:///{tmp_path}/s.db") as other:
        other.delete_session(sid)
        other.create_session("a", session_id=sid)
    mem.add_message(sid, "user", "again")
    assert _rows(mem, sid) == [(1, "again")]


def test_an_append_of_given_ids_looks_them_up_and_a_retry_stores_once(
    mem: MemoryManager,
) -> None:
    sid = mem.create_session("a")
    message = Message("user", "hi", id="m-1")
    first = mem.add_messages(sid, [message])
    with traced(mem) as statements:
        again = mem.add_messages(sid, [message])
    assert any(v == "SELECT" for v in _verbs(statements))
    assert [m.id for m in again] == [m.id for m in first] == ["m-1"]
    assert len(mem.get_messages(sid)) == 1
    assert _info(mem, sid).message_count == 1


def test_a_tool_call_updates_the_pending_calls(mem: MemoryManager) -> None:
    sid = mem.create_session("a")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with traced(mem) as statements:
        mem.add_messages(sid, [Message("assistant", None, tool_calls=[call])])
    assert _verbs(statements) == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    assert "pending = '[\"c1\"]'" in statements[1]  # in the compare-and-set
    assert _info(mem, sid).pending == ("c1",)
    mem.add_messages(sid, [Message("tool", "ok", tool_call_id="c1")])
    assert _info(mem, sid).pending == ()


def test_a_refused_append_moves_no_counter(mem: MemoryManager) -> None:
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    before = _info(mem, sid)
    with pytest.raises(OrphanToolResultError):
        mem.add_messages(sid, [Message("tool", "ok", tool_call_id="nobody")])
    after = _info(mem, sid)
    assert (after.message_count, after.next_seq) == (before.message_count, before.next_seq)
    assert [m.content for m in mem.get_messages(sid)] == ["hi"]
    mem.add_message(sid, "user", "next")
    assert [m.content for m in mem.get_messages(sid)] == ["hi", "next"]
    assert _info(mem, sid).next_seq == before.next_seq + 1


def test_an_agents_sdk_pop_after_its_own_add_reads_no_newest_message_first(
    mem: MemoryManager,
) -> None:
    """The Runner's session only writes between reads: its pop takes back the message it
    wrote last in one transaction (the newest compared by seq inside it), no read before.
    """
    pytest.importorskip("agents")
    import asyncio

    from ctxkeep.integrations.openai_agents import CtxkeepSession

    session = CtxkeepSession("conv", memory=mem)
    items = [{"role": "user", "content": f"item {i}"} for i in range(5)]
    for item in items:
        asyncio.run(session.add_items([item]))
    with traced(mem) as statements:
        popped = session._pop_item()  # (in this thread: its connection is the one traced)
    assert popped == items[-1]
    verbs = _verbs(statements)
    assert verbs.count("BEGIN") == 1 and "SELECT" not in verbs, statements
    # a message of two items: replaced by the first, in one transaction again
    calls = [
        {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        for i in range(2)
    ]
    asyncio.run(session.add_items(calls))
    with traced(mem) as statements:
        assert session._pop_item() == calls[1]
    assert _verbs(statements).count("BEGIN") == 1 and "SELECT" not in _verbs(statements)
    assert asyncio.run(session.get_items()) == [*items[:-1], calls[0]]


def test_a_call_added_while_its_run_waits_joins_it_in_one_transaction(
    mem: MemoryManager,
) -> None:
    """The Runner adds a run's calls one at a time: each continues the newest message,
    which this session wrote (or holds), in one write with no refused append before it.
    """
    pytest.importorskip("agents")
    import asyncio

    from ctxkeep.integrations.openai_agents import CtxkeepSession

    session = CtxkeepSession("conv", memory=mem)
    calls = [
        {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        for i in range(3)
    ]
    asyncio.run(session.add_items([{"role": "user", "content": "go"}, calls[0]]))
    for call in calls[1:]:
        with traced(mem) as statements:
            session._add([dict(call)], owned_from_responses([dict(call)]))
        verbs = _verbs(statements)
        assert verbs.count("BEGIN") == 1 and "ROLLBACK" not in verbs, statements
        assert "SELECT" not in verbs, statements
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "go"}, *calls]
    # held now: the next call joins through the items held, as one write again
    more = {**calls[0], "call_id": "c3"}
    with traced(mem) as statements:
        session._add([dict(more)], owned_from_responses([dict(more)]))
    assert _verbs(statements).count("BEGIN") == 1 and "ROLLBACK" not in _verbs(statements)
    # a message while the calls wait is refused, and changes nothing
    with pytest.raises(MissingToolResultError):
        asyncio.run(session.add_items([{"role": "user", "content": "too early"}]))
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "go"}, *calls, more]
    outputs = [
        {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"}
        for c in [*calls, more]
    ]
    asyncio.run(session.add_items(outputs))
    asyncio.run(session.add_items([{"role": "user", "content": "thanks"}]))
    assert len(asyncio.run(session.get_items())) == 10


def test_a_pop_of_a_known_session_is_one_delete_and_one_update(
    mem: MemoryManager, tmp_path: Path
) -> None:
    """A take-back on the state known: the newest message deleted and read back, then one
    compare-and-set update (the pending calls it leaves included); on a state moved on
    elsewhere, rolled back and decided on the row.
    """
    pytest.importorskip("agents")
    import asyncio

    from ctxkeep.integrations.openai_agents import CtxkeepSession

    session = CtxkeepSession("conv", memory=mem)
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    asyncio.run(session.add_items([{"role": "user", "content": "go"}, call, output]))
    with traced(mem) as statements:
        assert session._pop_item() == output  # c1 waits again
    assert _verbs(statements) == ["BEGIN", "DELETE", "UPDATE", "COMMIT"], statements
    assert "RETURNING" not in statements[2] and "pending = '[\"c1\"]'" in statements[2]
    assert "next_seq" not in statements[2].split(" WHERE ")[0]  # nothing appended: not moved
    assert _info(mem, "conv").pending == ("c1",)
    with open_memory(f"sqlite:///{tmp_path}/s.db") as other:
        other.add_messages("conv", [Message("tool", "elsewhere", tool_call_id="c1")])
    with traced(mem) as statements:
        popped = session._pop_item()  # the newest is another process's now
    assert "ROLLBACK" in _verbs(statements)
    assert popped == {"type": "function_call_output", "call_id": "c1", "output": "elsewhere"}
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "go"}, call]
    assert _info(mem, "conv").pending == ("c1",)
    assert _info(mem, "conv").message_count == 2


def test_a_first_add_makes_the_session_in_its_own_transaction(mem: MemoryManager) -> None:
    """``add_messages_creating`` on a session there is none of: one transaction makes the row
    and appends (three before: the append refused, the session made, the append again), and
    the owned messages' ids, made for it, are not looked up.
    """
    given = [Message("system", "be brief"), Message("user", "hi")]
    with traced(mem) as statements:
        mem._add_creating("s", "agent", given, owned=True)
    verbs = _verbs(statements)
    assert verbs.count("BEGIN") == 1 and verbs.count("COMMIT") == 1
    assert "ROLLBACK" not in verbs
    assert not [s for s in statements if "message_id IN" in s]  # fresh ids: no lookup
    info = _info(mem, "s")
    assert (info.agent_id, info.message_count, info.next_seq) == ("agent", 2, 3)
    assert [(m.role, m.content, m.id) for m in mem.get_messages("s")] == [
        (m.role, m.content, m.id) for m in given
    ]
    with traced(mem) as statements:  # the session known now: the compare-and-set append
        mem.add_messages_creating("s", "other-agent", [Message("assistant", "hello")])
    assert _verbs(statements) == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    assert _info(mem, "s").agent_id == "agent"


def test_a_first_add_that_is_refused_makes_no_session(mem: MemoryManager) -> None:
    with pytest.raises(OrphanToolResultError):
        mem.add_messages_creating("s", "agent", [Message("tool", "x", tool_call_id="c")])
    assert mem.backend.info("s", touch=None, ttl=None) is None
    with pytest.raises(ConfigError):  # a bad agent id (as create_session says): nothing made
        mem.add_messages_creating("s", "bad\x00agent", [Message("user", "x")])
    assert mem.backend.info("s", touch=None, ttl=None) is None
    assert mem.session_count() == 0


def test_a_session_a_first_add_makes_counts_against_max_sessions(tmp_path: Path) -> None:
    config = MemoryConfig(max_sessions=2)
    now = [1_000.0]
    with open_memory(f"sqlite:///{tmp_path}/m.db", config, clock=lambda: now[0]) as m:
        for sid in ("a", "b", "c"):
            now[0] += 10
            m.add_messages_creating(sid, "agent", [Message("user", sid)])  # (made by the append)
        assert m.session_count() == 2
        assert not m.has_session("a")  # the least recently used, evicted
        assert [x.content for x in m.get_messages("c")] == ["c"]


def test_a_first_add_made_in_two_steps_keeps_its_ids_fresh() -> None:
    """A backend that does not make the session in the append (here the in-memory one): the
    append is refused, the session made, the append sent again; the ids stamped in place on
    the owned messages by the first attempt were made for this call, and the second attempt
    says so (:attr:`Append.fresh_ids`: no lookup of them).
    """
    with open_memory("memory://") as m:
        fresh: list[bool] = []
        real = m.backend.append

        def append(session_id: str, batch: Any) -> list[int]:
            fresh.append(batch.fresh_ids)
            return real(session_id, batch)

        m.backend.append = append  # type: ignore[method-assign]
        m._add_creating("s", "agent", [Message("user", "hi")], owned=True)
        assert fresh == [True, True]
        m._add_creating("s", "agent", [Message("user", "again", id="given")], owned=True)
        assert fresh == [True, True, False]  # an id the caller gave is looked up
        assert [x.content for x in m.get_messages("s")] == ["hi", "again"]


def test_a_take_back_reads_the_session_row_once(mem: MemoryManager) -> None:
    """The newest message is found from the session's row read once (its number gives the
    range of its messages' keys), where a subquery for each end of the range read it twice.
    """
    sid = mem.create_session("a")
    mem.add_messages(sid, [Message("user", "go"), Message("assistant", "one")])
    newest = mem.get_messages(sid)[-1]
    with traced(mem) as statements:
        mem.replace_newest(sid, [], newest_id=newest.id or "")
    deletes = [s for s in statements if s.upper().startswith("DELETE")]
    assert len(deletes) == 1, statements
    conn: Any = mem.backend.client.conn()  # type: ignore[attr-defined]
    plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + deletes[0])]
    assert sum("sqlite_autoindex_ctxkeep_sessions_1" in step for step in plan) == 1, plan
    assert all("SCAN" not in step for step in plan), plan
    assert [m.content for m in mem.get_messages(sid)] == ["go"]
    assert newest.content == "one"


def test_a_take_back_of_a_damaged_newest_record_raises_and_keeps_it(
    mem: MemoryManager, tmp_path: Path
) -> None:
    """The newest message is deleted and read back by one statement: where its record
    cannot be read, the transaction puts it back (on the state known and on the row alike).
    """
    sid = mem.create_session("a")
    stored = mem.add_messages(sid, [Message("user", "go"), Message("assistant", "one")])
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute("UPDATE ctxkeep_messages SET record = '{\"v\": 1' WHERE seq = 2")
    with pytest.raises(CorruptRecordError):
        mem.replace_newest(sid, [], newest_id=stored[1].id or "")
    with pytest.raises(CorruptRecordError):
        mem.pop_message(sid)
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert [r[0] for r in conn.execute("SELECT seq FROM ctxkeep_messages ORDER BY seq")] == [
            1,
            2,
        ]
    assert _info(mem, sid).message_count == 2
