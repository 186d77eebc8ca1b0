"""The SQLite session backend (``sqlite:///path.db``): the embedded default.

One file in WAL mode, safe for several processes on one machine, on the shared engine client
(:mod:`ctxkeep._sqlite`); the primitives are the shared SQL ones (:mod:`ctxkeep.sessions.sql`).
An append is one ``BEGIN IMMEDIATE`` transaction (the file's write lock is taken up front), a
read of a session and its messages one deferred transaction (a WAL snapshot).

Durability: WAL with ``synchronous=NORMAL`` by default. A committed append survives the
process being killed at any moment (tested with SIGKILL); after a power loss or OS crash the
newest commits may roll back, but the file is never corrupt. ``?synchronous=full`` in the URL
fsyncs every commit, surviving power loss too, at about a fifth of the append rate.

The schema version is the ``sessions`` row of ``ctxkeep_meta``; :data:`MIGRATIONS` are applied
in order, and a file written by a newer ctxkeep is refused. Files of the first release kept
their version in ``PRAGMA user_version``; it is adopted.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path

from ctxkeep._sqlite import SQLiteClient
from ctxkeep.errors import ConfigError
from ctxkeep.sessions.sql import Dialect, SQLBackend

# Position i brings a database from version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_sessions (
        session_id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        task_id TEXT,
        metadata TEXT NOT NULL,
        created_at REAL NOT NULL,
        accessed_at REAL NOT NULL,
        message_count INTEGER NOT NULL DEFAULT 0,
        next_seq INTEGER NOT NULL DEFAULT 1,
        pending TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_agent
        ON ctxkeep_sessions (agent_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_task ON ctxkeep_sessions (task_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_accessed ON ctxkeep_sessions (accessed_at);
    CREATE TABLE IF NOT EXISTS ctxkeep_messages (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS ctxkeep_archive (
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        record TEXT NOT NULL,
        archived_at REAL NOT NULL DEFAULT (julianday('now')),
        PRIMARY KEY (session_id, message_id)
    );
    """,
    # 2: session identity (a generation per creation) and the oldest seq held.
    """
    ALTER TABLE ctxkeep_sessions ADD COLUMN generation TEXT NOT NULL DEFAULT '';
    ALTER TABLE ctxkeep_sessions ADD COLUMN first_seq INTEGER NOT NULL DEFAULT 1;
    UPDATE ctxkeep_sessions SET generation = lower(hex(randomblob(16))),
        first_seq = coalesce(
            (SELECT min(seq) FROM ctxkeep_messages m
             WHERE m.session_id = ctxkeep_sessions.session_id),
            next_seq);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

SQLITE = Dialect(param="?", greatest="max", for_update="", archive_order="rowid")


def _legacy_version(conn: sqlite3.Connection) -> int:
    """The version a file of the first release kept in ``user_version``."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


class SQLiteBackend(SQLBackend):
    """Sessions in one SQLite file.

    Args:
        path: the database file (its folder is created).
        synchronous: ``normal`` (default), ``full`` or ``extra``: see the module docstring.

    Raises:
        ConfigError: a bad ``synchronous``.
        StorageError: the file cannot be opened.
        SchemaVersionError: the file was written by a newer ctxkeep.

    """

    name = "sqlite"
    dialect = SQLITE

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        if synchronous.lower() not in ("full", "normal", "extra"):
            raise ConfigError(f"synchronous must be full, normal or extra, got {synchronous!r}")
        self.db = self.client = SQLiteClient(
            path,
            meta_key="sessions",
            migrations=MIGRATIONS,
            synchronous=synchronous,
            legacy_version=_legacy_version,
        )
        self.path = self.db.path
        self.synchronous = self.db.synchronous

    def snapshot(self, doing: str) -> AbstractContextManager[sqlite3.Connection]:
        """A deferred transaction: its first read fixes the WAL snapshot it sees."""
        return self.client.tx(doing, immediate=False)
