"""The PostgreSQL session backend (``postgresql://...``): shared and durable.

psycopg 3 over a :class:`psycopg_pool.ConnectionPool`. Tables are prefixed ``ctxkeep_`` and
live in the connection's ``search_path`` (``?options=-csearch_path%3Dmyschema`` in the URL
picks a schema). An append is one transaction: ``SELECT ... FOR UPDATE`` locks the session row,
the manager's tool-call check runs, the messages are inserted under the next sequence numbers
and the row is updated; concurrent writers queue on the row lock, so sequence numbers stay
gapless. Once an append returns, its commit is durable by PostgreSQL's own guarantees
(``synchronous_commit``, ``fsync``); a client killed mid-append leaves nothing behind.

Messages are stored as the JSON text of their record (``TEXT``, not ``JSONB``): JSONB would
reorder keys and normalise numbers, and ctxkeep compares messages by equality.

The primitives are the shared SQL ones (:mod:`ctxkeep.sessions.sql`); a read of a session and
its messages is one ``REPEATABLE READ`` transaction, so both come from one snapshot.

The schema version is a row of ``ctxkeep_meta``; :data:`MIGRATIONS` are applied in order under
an advisory lock (so several processes may start at once), and a database written by a newer
ctxkeep is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ctxkeep._pg import PgClient
from ctxkeep.sessions.sql import Dialect, SQLBackend

if TYPE_CHECKING:
    import psycopg

META_KEY = "sessions"

# Position i brings a database from version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_sessions (
        session_id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        task_id TEXT,
        metadata TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        accessed_at DOUBLE PRECISION NOT NULL,
        message_count INTEGER NOT NULL DEFAULT 0,
        next_seq BIGINT NOT NULL DEFAULT 1,
        pending TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_agent
        ON ctxkeep_sessions (agent_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_task ON ctxkeep_sessions (task_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_created ON ctxkeep_sessions (created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_accessed ON ctxkeep_sessions (accessed_at);
    CREATE TABLE IF NOT EXISTS ctxkeep_messages (
        session_id TEXT NOT NULL REFERENCES ctxkeep_sessions ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE IF NOT EXISTS ctxkeep_archive (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        record TEXT NOT NULL,
        archived_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (session_id, message_id)
    );
    """,
    # 2: session identity (a generation per creation) and the oldest seq held.
    """
    ALTER TABLE ctxkeep_sessions ADD COLUMN IF NOT EXISTS generation TEXT NOT NULL DEFAULT '';
    ALTER TABLE ctxkeep_sessions ADD COLUMN IF NOT EXISTS first_seq BIGINT NOT NULL DEFAULT 1;
    UPDATE ctxkeep_sessions s SET generation = md5(random()::text || s.session_id),
        first_seq = coalesce(
            (SELECT min(seq) FROM ctxkeep_messages m WHERE m.session_id = s.session_id),
            s.next_seq);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

POSTGRES = Dialect(param="%s", greatest="GREATEST", for_update=" FOR UPDATE", archive_order="id")


class PostgresBackend(SQLBackend):
    """Sessions in PostgreSQL tables, over a connection pool.

    Args:
        url: a libpq URI (``postgresql://user:password@host:port/dbname?...``).
        min_size: connections kept open.
        max_size: connections at most (callers wait for a free one beyond it).
        timeout: seconds to wait for a connection before giving up.

    Raises:
        StorageError: the server cannot be reached.
        SchemaVersionError: the database was written by a newer ctxkeep.

    """

    name = "postgres"
    dialect = POSTGRES

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0
    ) -> None:
        self.db = self._pg = PgClient(
            url,
            name="ctxkeep-sessions",
            meta_key=META_KEY,
            migrations=MIGRATIONS,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
        )
        self.where = self._pg.where

    @contextmanager
    def snapshot(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A ``REPEATABLE READ`` transaction: every statement sees one snapshot."""
        with self._pg.tx(doing) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn
