"""Schema 8 on SQLite (issue 26): ``ctxkeep_messages`` a rowid table, its ``(session_id, seq)``
key in an index beside it, instead of a WITHOUT ROWID table whose leaves held the records.

A file written at schema 7 (by this code with the migrations it had then) keeps every session,
message (seq, record, role, id), fold snapshot and archived message; the role and id indexes
come back and every message query still reads by an index; the id index still makes a retried
append store nothing. A 20,000-message file migrates in seconds.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from _sqlite_schemas import as_schema
from ctxkeep import MemoryConfig, Message, open_memory
from ctxkeep.sessions.sql import SQLITE
from ctxkeep.sessions.sqlite import MIGRATIONS, SQLiteBackend

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


def _write_at_schema_7(path: Path, sessions: dict[str, list[Message]]) -> None:
    """``sessions`` in the layout of schema 7 (:func:`_sqlite_schemas.as_schema`), with a fold
    snapshot per session and the first session's oldest message trimmed into the archive.
    """
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        for sid, msgs in sessions.items():
            mem.create_session("agent", session_id=sid)
            mem.add_messages(sid, msgs)
            gen = mem.get_session(sid).generation
            mem.backend.put_fold(sid, gen, "k", f"fold of {sid}")
        first = next(iter(sessions))
        gen = mem.get_session(first).generation
        mem.backend.remove_oldest(first, mem.get_session(first).first_seq, gen, archive=True)
    as_schema(path, 7)
    with sqlite3.connect(path) as conn:
        assert _version(conn) == 7
        assert "WITHOUT ROWID" in _table_sql(conn)


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT value FROM ctxkeep_meta WHERE key = 'sessions'").fetchone()[0])


def _table_sql(conn: sqlite3.Connection) -> str:
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'ctxkeep_messages'"
    ).fetchone()
    return str(row[0])


def _rows(path: Path) -> list[tuple[object, ...]]:
    """The messages' columns that every schema since 6 has."""
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT session_id, seq, record, role, message_id FROM ctxkeep_messages "
            "ORDER BY session_id, seq"
        ).fetchall()


def test_a_schema_7_file_keeps_every_message_session_fold_and_archived_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    roles = ["system", "user", "assistant", "user", "assistant"]
    sessions = {
        sid: [Message(roles[i % 5], f"{sid} {i} " + "x" * (i * 300)) for i in range(40)]
        for sid in ("s1", "s2", "s3")
    }
    _write_at_schema_7(path, sessions)
    before_rows = _rows(path)
    with open_memory(f"sqlite:///{path}", CONFIG) as old:
        before = {sid: (old.get_session(sid), old.get_messages(sid)) for sid in sessions}
        archived = old.archived_messages("s1")

    with open_memory(f"sqlite:///{path}", CONFIG) as mem:  # migrates
        assert _rows(path) == before_rows
        for sid, (info, msgs) in before.items():
            assert mem.get_session(sid) == info
            assert mem.get_messages(sid) == msgs
            assert mem.backend.get_fold(sid, "k") == f"fold of {sid}"
        assert mem.archived_messages("s1") == archived and len(archived) == 1
        # The newest messages and the older system ones, by the role index.
        tail = mem.backend.read_tail("s2", limit=3, roles={"system"}, newest_role="user")
        assert tail is not None
        assert [seq for seq, _ in tail.rows] == [38, 39, 40]
        assert [r["role"] for _, r in tail.marks] == ["system"] * 8 + ["user"]
        # A retried id stores nothing (the unique id index is back); a new one appends.
        again = mem.add_messages("s3", [before["s3"][1][7]])
        assert [m.id for m in again] == [before["s3"][1][7].id]
        assert mem.get_session("s3").message_count == 40
        mem.add_message("s3", "user", "new")
        assert mem.get_messages("s3")[-1].content == "new"

    with sqlite3.connect(path) as conn:
        assert _version(conn) == len(MIGRATIONS) >= 8
        assert "WITHOUT ROWID" not in _table_sql(conn)
        indexes = {
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' "
                "AND tbl_name = 'ctxkeep_messages'"
            )
        }
        assert {"ctxkeep_messages_role", "ctxkeep_messages_id"} <= indexes
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_every_message_query_reads_by_an_index(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    backend = SQLiteBackend(path)
    span, span_args = backend._span("s", 1, above=3, below=9)
    at, at_args = backend._at("s", 1, [4, 5])
    backend.close()
    order = SQLITE.seq_order
    queries = [
        (f"SELECT seq, record FROM ctxkeep_messages WHERE {span} ORDER BY {order}", span_args),
        (
            f"SELECT seq, record FROM ctxkeep_messages WHERE {span} ORDER BY {order} DESC LIMIT 3",
            span_args,
        ),
        (f"SELECT seq, record FROM ctxkeep_messages WHERE {at}", at_args),
        (
            "SELECT seq, record FROM ctxkeep_messages WHERE session_id = ? "
            "AND message_id IN (?, ?)",
            ("s", "a", "b"),
        ),
        (SQLITE.take_newest, ("s",)),
        (SQLITE.newer, (3, "s")),
        (f"DELETE FROM ctxkeep_messages WHERE {span}", span_args),
    ]
    with sqlite3.connect(path) as conn:
        for sql, params in queries:
            plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
            assert plan and all("SCAN" not in step for step in plan), (sql, plan)
            assert all("TEMP B-TREE" not in step for step in plan), (sql, plan)
            assert any("INDEX" in step or "PRIMARY KEY" in step for step in plan), (sql, plan)


def test_a_20000_message_file_migrates_in_seconds(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    msgs = [
        Message("user" if i % 2 else "assistant", f"m{i} " + "y" * (i % 50 * 40))
        for i in range(20_000)
    ]
    _write_at_schema_7(path, {"big": msgs})
    before_rows = _rows(path)
    start = time.perf_counter()
    SQLiteBackend(path).close()
    took = time.perf_counter() - start
    assert _rows(path) == before_rows
    assert took < 20, f"the migration took {took:.1f} s"
