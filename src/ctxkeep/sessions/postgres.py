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
from ctxkeep.sessions.sql import POSTGRES, SQLBackend, migrations

if TYPE_CHECKING:
    import psycopg

META_KEY = "sessions"

MIGRATIONS = migrations(POSTGRES)
SCHEMA_VERSION = len(MIGRATIONS)


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
            url, name="ctxkeep-sessions", meta_key=META_KEY, migrations=MIGRATIONS,
            min_size=min_size, max_size=max_size, timeout=timeout,
        )  # fmt: skip
        self.where = self._pg.where

    @contextmanager
    def snapshot(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A ``REPEATABLE READ`` transaction: every statement sees one snapshot."""
        with self._pg.tx(doing) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn
