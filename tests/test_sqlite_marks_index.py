"""Schema 9 on SQLite (issue 26): the ``(session_id, role, seq)`` index holds only the rows a
prompt finds by role (``MARK_ROLES``: the system roles and ``user``) and those of no role, so
an append or pop of an assistant or tool message writes no page of it.

A file written at schema 8 keeps every message and reads the same marks after the migration;
the marks of the prompt's roles are read by the narrowed index, those of any other role by
the session's messages in seq order, and both give what a read of every message gives.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from _sqlite_schemas import as_schema
from ctxkeep import MemoryConfig, MemoryManager, Message, ToolCall, open_memory
from ctxkeep.messages import SYSTEM_ROLES
from ctxkeep.sessions.backend import tail_of
from ctxkeep.sessions.sql import MARK_ROLES
from ctxkeep.sessions.sqlite import MIGRATIONS, SQLiteBackend

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
_MESSAGE = "session_id, seq, record, role, message_id"


def _history(n: int) -> list[list[Message]]:
    """Batches of a valid session of every role: system and developer messages among user
    turns, each answered by a tool call, its output and a reply.
    """
    out = [[Message("system", "rules")]]
    for i in range(n):
        if i % 7 == 3:
            out.append([Message("developer", f"more rules {i}")])
        out.append([Message("user", f"task {i}")])
        out.append(
            [
                Message("assistant", None, tool_calls=[ToolCall(f"c{i}", "run", "{}")]),
                Message("tool", f"output {i} " + "x" * (i % 5 * 900), tool_call_id=f"c{i}"),
            ]
        )
        out.append([Message("assistant", f"reply {i}")])
    return out


def _index_sql(conn: sqlite3.Connection) -> str:
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'ctxkeep_messages_role'"
    ).fetchone()
    return str(row[0])


def _expected_marks(
    mem: MemoryManager, sid: str, limit: int, roles: set[str], newest_role: str
) -> list[tuple[int, dict[str, Any]]]:
    snap = mem.backend.read(sid)
    assert snap is not None
    return tail_of(snap, limit=limit, before_seq=None, roles=roles, newest_role=newest_role).marks


def test_the_prompts_roles_are_in_the_index() -> None:
    # MemoryManager._tail asks for the system roles and the newest user message: both must
    # be rows of the narrowed index, or the prompt's reads would not use it.
    assert set(SYSTEM_ROLES) | {"user"} <= set(MARK_ROLES)


def test_a_schema_8_file_migrates_and_reads_the_same_marks(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        mem.create_session("agent", session_id="s")
        for batch in _history(30):
            mem.add_messages("s", batch)
    as_schema(path, 8)
    with sqlite3.connect(path) as conn:  # a record stored before roles were kept: no role
        conn.execute("UPDATE ctxkeep_messages SET role = NULL WHERE seq = 20")
        assert "WHERE" not in _index_sql(conn)
        before = conn.execute(
            f"SELECT {_MESSAGE} FROM ctxkeep_messages ORDER BY session_id, seq"
        ).fetchall()

    with open_memory(f"sqlite:///{path}", CONFIG) as mem:  # migrates
        for roles, newest in (
            ({"system", "developer"}, "user"),
            (set(), "user"),
            ({"assistant"}, "tool"),  # roles outside the index: read by seq
            ({"system", "tool"}, "assistant"),
        ):
            tail = mem.backend.read_tail("s", limit=6, roles=roles, newest_role=newest)
            assert tail is not None
            got = [(seq, r) for seq, r in tail.marks]
            want = _expected_marks(mem, "s", 6, roles, newest)
            # The row of no role is a mark of every query (its role is not known).
            assert [s for s, _ in got] == sorted({s for s, _ in want} | {20})
        prompt = mem.build_prompt_messages("s")
        assert prompt[0].content == "rules"

    with sqlite3.connect(path) as conn:
        assert int(
            conn.execute("SELECT value FROM ctxkeep_meta WHERE key = 'sessions'").fetchone()[0]
        ) == len(MIGRATIONS)
        sql = _index_sql(conn)
        assert "WHERE" in sql and "'assistant'" not in sql and "'tool'" not in sql
        assert all(f"'{r}'" in sql for r in MARK_ROLES) and "IS NULL" in sql
        assert conn.execute(
            f"SELECT {_MESSAGE} FROM ctxkeep_messages ORDER BY session_id, seq"
        ).fetchall() == (before)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_marks_of_the_prompts_roles_read_by_the_index_and_others_by_seq(tmp_path: Path) -> None:
    backend = SQLiteBackend(tmp_path / "s.db")
    sql, params = backend._marks_sql("s", 10, ("developer", "system", "assistant"), "user", 1)
    backend.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    searches = [step for step in plan if step.startswith(("SEARCH", "SCAN ctxkeep_messages"))]
    assert all(step.startswith("SEARCH") for step in searches), plan
    by_role = [s for s in searches if "ctxkeep_messages_role" in s]
    by_seq = [s for s in searches if "INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in s]
    # no role, developer, system, the newest user: the index; assistant: the session's run of
    # the table's keys (seq order; schema 10)
    assert (len(by_role), len(by_seq)) == (4, 1), plan
