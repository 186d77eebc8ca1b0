"""What the PostgreSQL session backend promises beyond the session contract: an append to a
session this process knows is one statement (one round trip, no ping, no ``BEGIN``), a guess
at a session's state that another process has moved on is checked again before it counts, and
a connection is back in the pool when a call returns (no worker thread between two calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from _round_trips import (
    a_session_made_again_is_checked_as_it_now_is,
    appends_in_turn_keep_every_seq,
    known_session_round_trips,
    tool_unit_round_trips,
)
from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.errors import OrphanToolResultError
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

psycopg = pytest.importorskip(
    "psycopg", reason="psycopg is not installed: pip install 'ctxkeep[postgres]'"
)

from ctxkeep import _pg  # noqa: E402

pytestmark = pytest.mark.postgres

__all__ = ["postgres_schema_factory", "postgres_url"]

UNBOUNDED = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


@pytest.fixture
def url(postgres_schema_factory: Callable[[], str]) -> str:
    return postgres_schema_factory()


@pytest.fixture
def mem(url: str) -> Iterator[MemoryManager]:
    with open_memory(url, UNBOUNDED) as manager:
        yield manager


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first word of every statement psycopg sends from now on (``""`` for the pool's
    ping, ``BEGIN`` for a transaction), one entry per statement: the round trips.
    """
    words: list[str] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    transaction = psycopg.Connection.transaction

    def first(query: Any) -> str:
        text = query if isinstance(query, str) else str(query)
        return text.split(None, 1)[0].upper() if text.strip() else ""

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        words.append(first(query))
        return execute(self, query, *args, **kwargs)

    def counting_many(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        words.append(first(query))
        return executemany(self, query, *args, **kwargs)

    def counting_tx(self: Any, *args: Any, **kwargs: Any) -> Any:
        words.append("BEGIN")
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    monkeypatch.setattr(psycopg.Cursor, "executemany", counting_many)
    monkeypatch.setattr(psycopg.Connection, "transaction", counting_tx)
    return words


def test_an_append_to_a_known_session_is_one_statement(mem: MemoryManager, sent: list[str]) -> None:
    assert known_session_round_trips(mem, sent) == ["WITH"] * 3


def test_a_tool_unit_appends_one_message_at_a_time_in_one_statement_each(
    mem: MemoryManager, sent: list[str]
) -> None:
    assert tool_unit_round_trips(mem, sent) == ["WITH"] * 3


def test_a_connection_used_just_now_is_not_pinged_and_an_idle_one_is(
    mem: MemoryManager, sent: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = mem.create_session("agent")
    mem.add_message(sid, "user", "hello")
    monkeypatch.setattr(_pg, "ALIVE_BYPASS", 0.0)  # every connection counts as idle
    sent.clear()
    mem.add_message(sid, "user", "again")
    assert sent == ["", "WITH"]


def test_a_connection_is_back_in_the_pool_when_a_call_returns(mem: MemoryManager) -> None:
    pool = mem.backend._pg.pool  # type: ignore[attr-defined]
    sid = mem.create_session("agent")
    for i in range(20):
        mem.add_message(sid, "user", f"message {i}")
        stats = pool.get_stats()
        assert stats["pool_available"] == stats["pool_size"] == 1
    assert pool.get_stats().get("requests_queued", 0) == 0


def test_a_guess_another_process_moved_on_is_checked_again_on_the_session_as_stored(
    url: str,
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    with open_memory(url, UNBOUNDED) as a, open_memory(url, UNBOUNDED) as b:
        sid = a.create_session("agent")
        a.add_message(sid, "assistant", None, tool_calls=[call])  # a: c1 waits
        b.add_message(sid, "tool", "12:00", tool_call_id="c1")  # b answers it
        # a's guess still has c1 waiting, which would refuse a user message: asked again.
        a.add_message(sid, "user", "thanks")
        # a's guess now has nothing waiting; the stored session agrees, so a result is refused.
        with pytest.raises(OrphanToolResultError):
            a.add_message(sid, "tool", "13:00", tool_call_id="c1")
        assert [m.role for m in b.get_messages(sid)] == ["assistant", "tool", "user"]
        assert a.get_session(sid).pending == ()


def test_appends_from_two_managers_in_turn_keep_every_seq(url: str) -> None:
    with open_memory(url, UNBOUNDED) as a, open_memory(url, UNBOUNDED) as b:
        appends_in_turn_keep_every_seq(a, b)


def test_records_with_quotes_backslashes_and_braces_are_stored_as_given(
    mem: MemoryManager,
) -> None:
    sid = mem.create_session("agent")
    texts = ['say "hi"', "C:\\path\\{x}", "{a,b}", "NULL", "ünïcode 日本", ""]
    mem.add_messages(sid, [{"role": "user", "content": t} for t in texts])
    assert [m.content for m in mem.get_messages(sid)] == texts


def test_an_append_to_a_session_made_again_elsewhere_is_checked_on_the_new_one(url: str) -> None:
    # the compare-and-set compares the generation: a remembered state of the session deleted
    # meanwhile is not taken for the new one (its first seq would let max_history overflow)
    with (
        open_memory(url, replace(UNBOUNDED, max_history=5)) as a,
        open_memory(url, replace(UNBOUNDED, max_history=5)) as b,
    ):
        a_session_made_again_is_checked_as_it_now_is(a, b)
