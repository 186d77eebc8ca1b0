"""Schema 6 (each message's id in a column, unique per session) over sessions stored before it:
a session that holds an id twice (an append retried before appends were idempotent) keeps it on
its oldest copy, every message still reads back, and a retry of that id stores nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from _sqlite_schemas import as_schema
from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep import MemoryConfig, Message, open_memory

__all__ = ["postgres_schema_factory", "postgres_url"]

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
N = 3000


@contextmanager
def _sql(url: str) -> Iterator[Callable[[str], Any]]:
    """Raw SQL on the store behind ``url`` (autocommit), for making it look older."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            yield conn.execute
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:  # the URL sets the search_path
        yield conn.execute


def _as_schema_5(url: str, sid: str, duplicate_seqs: list[int]) -> None:
    """The store as schema 5 left it, with the messages at ``duplicate_seqs`` stored twice
    (a copy appended at the end under the same id, as a retried append did). A SQLite file
    is put in schema 9's layout first (its messages keyed by (session_id, seq)).
    """
    if url.startswith("sqlite:"):
        as_schema(Path(url.removeprefix("sqlite:///")), 9)
    with _sql(url) as sql:
        sql("DROP INDEX ctxkeep_messages_id")
        sql("ALTER TABLE ctxkeep_messages DROP COLUMN message_id")
        sql("UPDATE ctxkeep_meta SET value = '5' WHERE key = 'sessions'")
        param = "?" if url.startswith("sqlite:") else "%s"
        top = sql(f"SELECT max(seq) FROM ctxkeep_messages WHERE session_id = {param}", (sid,))
        seq = top.fetchone()[0]
        for n, dup in enumerate(duplicate_seqs, 1):
            sql(
                "INSERT INTO ctxkeep_messages (session_id, seq, record, role) "
                f"SELECT session_id, {param}, record, role FROM ctxkeep_messages "
                f"WHERE session_id = {param} AND seq = {param}",
                (seq + n, sid, dup),
            )
        sql(
            f"UPDATE ctxkeep_sessions SET next_seq = {param}, message_count = message_count + "
            f"{param} WHERE session_id = {param}",
            (seq + len(duplicate_seqs) + 1, len(duplicate_seqs), sid),
        )


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sessions.db'}"
    factory: Callable[[], str] = request.getfixturevalue("postgres_schema_factory")
    return factory()


def test_an_id_stored_twice_before_schema_6_stays_on_its_oldest_copy(url: str) -> None:
    msgs = [Message("user" if i % 2 else "assistant", f"message {i}") for i in range(N)]
    with open_memory(url, CONFIG) as mem:
        sid = mem.create_session("agent")
        mem.add_messages(sid, msgs)
        before = mem.get_messages(sid)
        info = mem.get_session(sid)
    _as_schema_5(url, sid, [info.first_seq + 3, info.first_seq + 10])
    with open_memory(url, CONFIG) as mem:  # migrates
        after = mem.get_messages(sid)
        assert after[:N] == before
        assert [m.id for m in after[N:]] == [before[3].id, before[10].id]
        # A retry of a stored id is answered with the stored message and stores nothing.
        again = mem.add_messages(sid, [before[10]])
        assert [m.id for m in again] == [before[10].id]
        assert mem.get_session(sid).message_count == N + 2
        # A new id appends as ever.
        mem.add_messages(sid, [Message("user", "new")])
        assert mem.get_session(sid).message_count == N + 3
