"""SQLite session files as an older ctxkeep left them, for the migration tests.

The statements of today's code need today's layout (migration 10 keys messages by a session
number the older layouts lack), so an older file is not written by today's code run with
fewer migrations. It is rebuilt instead: the tables the first ``version`` migrations make
(the DDL those releases ran), with every row of a file written at the newest schema copied
in (the columns both layouts have; the archive in its order).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ctxkeep._sqlite import META_TABLE, statements
from ctxkeep.sessions.sqlite import MIGRATIONS

_TABLES = ("ctxkeep_sessions", "ctxkeep_messages", "ctxkeep_folds", "ctxkeep_archive")


def _columns(conn: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def as_schema(path: Path, version: int) -> None:
    """Rewrite the sessions file at ``path`` (at the newest schema) in the layout of schema
    ``version``, its rows kept.
    """
    path = Path(path)
    older = path.with_name(path.name + f".schema{version}")
    conn = sqlite3.connect(older, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for step in MIGRATIONS[:version]:
            assert isinstance(step, str)
            for stmt in statements(step):
                conn.execute(stmt)
        conn.execute(META_TABLE)
        conn.execute("INSERT INTO ctxkeep_meta (key, value) VALUES ('sessions', ?)", (version,))
        conn.execute("ATTACH DATABASE ? AS newest", (str(path),))
        for table in _TABLES:
            if not _columns(conn, table):
                continue
            shared = [c for c in _columns(conn, table) if c in _columns(conn, table, "newest")]
            names = ", ".join(shared)
            order = " ORDER BY rowid" if table == "ctxkeep_archive" else ""
            conn.execute(
                f"INSERT INTO main.{table} ({names}) SELECT {names} FROM newest.{table}{order}"
            )
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE newest")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
        Path(str(older) + suffix).unlink(missing_ok=True)
    os.replace(older, path)
